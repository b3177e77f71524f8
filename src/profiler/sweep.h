// Sweep: the exhaustive oracle of the auto-configurator (docs/DESIGN.md section 7). Runs the
// calibration request end to end for every supported (G, B, Q) that fits the budget and returns
// the measured constrained minimum, against which the configurator's choice (`estream profile`)
// is judged (regret). `estream sweep` is this call plus printing.
//
// Grid (kSweepGridHelp): G in {1, 2, 4, 8, 16} capped at the experts per layer E; Q in
// {1, 2, 4, 8, 16, 32}; B in the powers of two up to the useful maximum U(G) = 2 * ceil(E / G)
// (two layers' worth of groups: more banks change nothing), U(G) itself, and b_max(G), the most
// banks the engine accepts under the budget, when that is smaller than U(G). b_max(G) is found by
// asking the engine itself (Engine::Load, which measures the dense part and refuses what does
// not fit) by bisection over B, a handful of loads per G; points with B > b_max(G) are skipped
// without running. SweepParams::groups / queue_depths / banks restrict the grid (with banks no
// b_max is added). A point the engine refuses at load (ResourceExhausted) is skipped and counted.
//
// Every run: a fresh engine in this process (MeasureRun: the process's peak RSS reset before
// the load), schedule early, budget_bytes = the budget, activations planned for the calibration
// prompt's length (budget_tokens), top-1 only. A point whose peak RSS exceeds the budget is kept
// but marked over_budget (and a warning goes to the progress callback); the best is the fastest
// point within the budget.
//
// Peak RSS where the reset is refused (no /proc/self/clear_refs: measure.h): each point's figure
// is then the process's peak since it started, reported as such (peak_rss_exact = false) after a
// one-line warning. Such a figure within the budget proves the point was within it; one above it
// proves nothing, so an inexact point is never marked over_budget (the engine's own budget check
// at load still applies to it).
//
// Thread safety: as MeasureRun (process-wide peak RSS): one Sweep at a time, nothing else big.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "estream/options.h"
#include "profiler/calibration.h"
#include "profiler/disk.h"

namespace estream::profiler {

inline constexpr char kSweepGridHelp[] =
    "Grid: G in {1,2,4,8,16} (capped at the experts per layer E), Q in {1,2,4,8,16,32}, B in the powers of two up "
    "to U = 2*ceil(E/G) (more banks change nothing), U itself, and b_max(G) (the most banks that fit the budget, "
    "found by asking the engine) when smaller than U. Points that do not fit the budget are skipped and counted. "
    "Every point runs the calibration request end to end in a fresh engine (schedule early, top-1); the table is "
    "sorted by time and the best is the fastest point whose peak RSS is within the budget.";

struct SweepParams {
  std::string model_path;          // a packed model (estream pack)
  uint64_t budget_bytes = 0;       // > 0
  std::vector<int> groups;         // restrict G (each <= E); empty: the grid's
  std::vector<int> queue_depths;   // restrict Q; empty: the grid's
  std::vector<int> banks;          // restrict B (no b_max search); empty: the grid's
  std::string calib_path;          // calibration text; empty: the built-in text (calibration.h)
  int calib_tokens = kDefaultCalibrationTokens;
  int64_t budget_tokens = 0;       // 0: the calibration request's length (never shorter)
  int n_threads = 0;               // EngineOptions::n_threads
  int repeat = 1;                  // runs per point; the median is reported
  IoBackend io = IoBackend::kAuto;
  ProgressFn progress{};           // one line per probe and point (may be empty)
};

struct SweepPoint {
  int group_size = 0, banks = 0, queue_depth = 0;
  double seconds = 0, load_seconds = 0, bubble_rate = 0, read_gbps = 0;
  // Of `seconds`, the part outside the expert steps (Response::nonexpert_seconds: attention,
  // router, dense FFN, embeddings, head): the same work at every (G, B, Q), so its changes from
  // run to run measure the machine's speed at the time (scripts/config_figures.py divides by it).
  double nonexpert_seconds = 0;
  uint64_t peak_rss_bytes = 0;
  bool peak_rss_exact = true;  // false: the process's peak since it started (see the top)
  bool over_budget = false;
};

struct SweepResult {
  std::string model_path;
  uint64_t budget_bytes = 0;
  int64_t calib_tokens = 0, budget_tokens = 0;
  int repeat = 1;
  double sweep_seconds = 0, probe_seconds = 0;
  int probe_loads = 0;
  std::vector<SweepPoint> results;  // every point that ran, fastest first
  int best = -1;                    // index into results of the fastest point within the budget; -1: none
  int skipped = 0;                  // points that do not fit the budget
  bool peak_rss_exact = true;       // every point's peak is its own
};

// Errors: InvalidArgument (not a packed model, a group size above E, budget_tokens shorter than
// the calibration request, budget 0, repeat < 1), ResourceExhausted when no point of the grid
// fits (naming the engine's refusal, which gives the minimum), the errors of MeasureRun. A
// result with best == -1 (every point over the budget) is returned as is: the caller reports it.
Result<SweepResult> Sweep(const SweepParams& params);

// The JSON of `estream sweep --json` (one object, two-space indent, no trailing newline).
std::string SweepJson(const SweepResult& r);

}  // namespace estream::profiler
