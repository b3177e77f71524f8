// Calibration runs of the configurator (docs/DESIGN.md section 7, step 2) and storing the result
// in the packed model.
//
// One request per candidate group size g, on the calibration tokens (calibration.h): the packed
// model is loaded streamed with group size g, a small bank count (below) and queue depth Q0(g)
// of the disk table, schedule early; the request runs once with the engine recording its typed
// trace events into a recorder of ours (EngineHooks::trace), and from the events and the
// Response the run yields:
//   - per MoE layer w the non-expert seconds T_ne_w: the kAttentionRouter step (from the
//     layer's start to its experts); pooled over the runs by the median, per layer;
//   - load samples: per completed read of a FULL group (kRead, ok), its completion minus
//     max(its first chunk's issue, the previous read's completion), in completion order: the
//     device time this read alone accounts for (config::CalibrationRun);
//   - exec samples (routed rows, seconds) per group: the engine runs every group already loaded
//     together in one operator invocation (kExperts with {groups, routes}); such a step
//     is split evenly: each of its n groups gets (routes / n rows, seconds / n), n copies. For
//     the affine model X = c0 + c1 * rho the split is exact (n X(mean rho) = sum X(rho_k)). The
//     step includes the first-read checksum check of its records, as every measured run does;
//   - T_other = embeddings + LM head (Response::timing), pooled by the median;
//   - M_other(g) = peak RSS of the load + run (reset first: ResetPeakRssForMeasurement; where
//     that is refused the figure is the process's lifetime peak, an over-estimate, and a
//     warning goes to the progress callback once) minus the arena,
//     but at least the engine's own non-arena figure (Response::config.other_bytes: RSS after
//     load + activation bound + margin, VirtualExperts::Solve), so a configuration the
//     configurator picks always passes the engine's own budget check;
//   - the compute threads of the runs (Engine::n_threads), stored as Profile::n_threads;
//   - the route counts per PHYSICAL expert (first run only; the routing does not depend on g):
//     Request::return_routing gives logical ids, mapped through the layout's permutation.
// Execution samples are thinned for storage (config::CompactExecSamples, kMaxExecSamples).
//
// Bank count of a calibration run: 4 (at most the layer's group count, at least 1), lowered to
// what fits the budget (when one is given) next to the largest M_other measured so far, but
// never below 2 (the pipeline needs a second bank to overlap at all); the run itself has no
// engine budget (it measures, it does not serve).
//
// Thread safety: Calibrate runs engines in this process one after another and resets the
// process's peak RSS: run nothing else big at the same time.
#pragma once

#include <cstdint>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "config/profile.h"
#include "estream/engine.h"
#include "pack/packed_layout.h"
#include "pipeline/trace.h"
#include "profiler/disk.h"

namespace estream::profiler {

constexpr size_t kMaxExecSamples = 256;  // per g, after CompactExecSamples

struct CalibrateParams {
  std::vector<int32_t> tokens;    // the calibration request (>= 1 token)
  std::vector<int> group_sizes;   // empty: {1, 2, 4, 8, 16} capped by n_expert
  int n_threads = 0;              // EngineOptions::n_threads
  uint64_t budget_bytes = 0;      // only to choose the runs' bank count (above); 0: none
  EngineOptions::Io io = EngineOptions::Io::kAuto;
  ProgressFn progress{};
};

// What one calibration run did (for the report and the CLI's progress).
struct CalibrationRunInfo {
  int group_size = 0, banks = 0, queue_depth = 0;
  double seconds = 0;       // the request
  double load_seconds = 0;  // Engine::Load
  uint64_t peak_rss_bytes = 0, arena_bytes = 0, other_bytes = 0;
  size_t load_samples = 0, exec_samples = 0;
  double bubble_rate = 0;
};

struct CalibrationResult {
  config::Profile profile;  // validated
  std::vector<CalibrationRunInfo> runs;
  double seconds = 0;       // wall time of Calibrate
};

// The compute threads an engine with EngineOptions::n_threads = n_threads runs with: n_threads
// when > 0, else one per CPU the process may run on (omp_get_num_procs, as Engine::Load). The
// profile records it (config::Profile::n_threads); `estream profile` compares a re-solve's -t.
int ResolveThreadCount(int n_threads);

// The default candidates {1, 2, 4, 8, 16} capped by n_expert (at least {1}).
std::vector<int> DefaultGroupSizes(int n_expert);

// Runs the calibration (see the top of this file) for the packed model at `model_path`.
// REQUIRES: disk.Validate() is OK. Errors: InvalidArgument (not a packed model: "run estream
// pack"; no tokens; a group size outside [1, n_expert]), the errors of Engine::Load / Run,
// Internal when a run's trace lacks a layer's steps.
Result<CalibrationResult> Calibrate(const std::string& model_path, const config::DiskProfile& disk,
                                    const CalibrateParams& params);

// ---- Pieces of Calibrate, public for tests ----

// What one run's trace events (the engine's pipeline::TraceRecorder, by TraceStep kind) hold,
// by MoE layer ordinal w of `layout` (layout.layers[w]); times in seconds. `group_size` is the
// run's G (full groups only enter load_seconds). Internal for a kExperts event without its
// "groups"/"routes" arguments (the recorder's contract broken).
struct RunTrace {
  std::vector<double> nonexpert_s;        // [W]; -1 where the trace has no step for the layer
  std::vector<float> load_seconds;        // completed reads of full groups
  std::vector<float> exec_rows, exec_seconds;
};
Result<RunTrace> RunTraceFromEvents(std::span<const pipeline::TraceEvent> events, const io::PackedModelInfo& layout,
                                    int group_size);

// Route counts per physical expert, [W * E] at w * E + p, from Response::routing
// ([n_block][n_tokens][n_used] logical ids over all blocks). InvalidArgument when the sizes
// disagree or an id is out of range.
Result<std::vector<uint32_t>> PhysicalRouteCounts(const std::vector<int32_t>& routing, int64_t n_tokens, int n_used,
                                                  int n_block, const io::PackedModelInfo& layout);

// Stores the profile (when not null) and the configuration (when not null) in the packed model
// in place (io::UpdateMetadata), replacing every estream.profile.* key when a profile is given
// and every estream.config.* key either way. Progress only for a whole-file rewrite.
Status StoreInModel(const std::string& model_path, const config::Profile* profile, const config::ConfigChoice* choice,
                    const ProgressFn& progress = {});

}  // namespace estream::profiler
