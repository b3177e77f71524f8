// Max-plus model of the expert pipeline (docs/DESIGN.md sections 6 and 7).
//
// Predicts the latency of one prefill request, for one choice of group size G, queue depth Q,
// bank count B and schedule, from per-group service times. The configurator (configurator.h)
// builds the service times from a stored profile (profile.h) and calls this for every candidate.
// Pure functions: no threads, no I/O, no allocation once a PipelineWorkspace has grown.
//
// ---- The recurrence -------------------------------------------------------------------------
// A request runs the MoE layers w = 0..W-1 in order. Layer w starts at t0_w on the compute
// cores with its non-expert work (attention, norms, router), which ends at
//   e_w = t0_w + T_ne_w.
// Its ACTIVE groups (those with at least one routed row: rho_k > 0; see BuildPipelineInput in
// configurator.h for how the per-expert route counts give rho_k) are numbered k = 1..K_w and
// executed in that order. Inactive groups are neither read nor executed: they do not appear.
// Globally (over all layers) the active groups are numbered j = 1..N, and for each:
//   read start   a_j = max(R_j, d_{j-q}, f_{j-b})
//   read done    d_j = max(a_j + L_j, d_{j-1} + T_j)
//   exec start   s_j = max(d_j, e_w, f_{j-1})
//   exec done    f_j = s_j + X_j
// with d_j = f_j = 0 for j <= 0, and
//   layer end    t0_{w+1} = max(e_w, f_{last j of layer w}),   t0_0 = 0,
//   request      total = t0_W + T_other.
// Symbols: q = queue depth (at most q group reads in flight), b = banks (a group's read needs
// the bank of the group b places earlier, which is free once that group has executed), L_j =
// read service time (latency + transfer), T_j = device occupancy (transfer time, 0 <= T_j <= L_j),
// X_j = execution time of the group's fused expert operator, T_other = compute outside the MoE
// layers (embeddings, dense layers, final norm, LM head), modelled as plain added time.
//
// Relation to the original form of the design (a_j = max(d_{j-q}, f_{j-b}), d_j = a_j + L_j;
// docs/DESIGN.md section 7 gives the form implemented here): with T_j = 0 and per-layer release
// (below) this is that recurrence word for word, with one difference: d_j >= d_{j-1}, i.e. reads
// complete in submission order. The loader serves the oldest job first (io/loader.h) and the
// executor consumes groups in order anyway (s_j >= f_{j-1} >= d_{j-1}), so this changes no exec
// time of the original form; it only makes the model monotone in q (below). The T_j term says
// the device delivers bytes at one bandwidth in FIFO order: a read cannot finish sooner than T_j
// after the read before it, however many are in flight. The configurator sets
// L_j = lat + bytes/bw(Q), T_j = bytes/bw(Q) and q = GroupsInFlight(Q, chunk, group bytes)
// (configurator.h): the loader keeps Q chunk reads in flight, the groups in flight share the
// bandwidth bw(Q) measured at that depth, and the per-read latency of a read issued while the
// device is busy is hidden behind the reads ahead of it.
//
// Schedules (docs/DESIGN.md section 6) only change the release time R_j of group j of layer w:
//   kEarly          R_j = 0 with cross_layer (reads run ahead into later layers as soon as a
//                   bank frees, overlapping non-expert AND expert compute of earlier layers);
//                   R_j = t0_w without it (reads of layer w start when layer w starts, banks
//                   are drained at layer boundaries: the simplest faithful per-layer model).
//   kAfterRouting   R_j = e_w (reads of layer w are issued once its routing is known).
//   kOnDemand       R_j = max(e_w, f_{j-1}) (the executor asks for a group when it needs it:
//                   every read is on the critical path, no prefetch at all).
// cross_layer matters only for kEarly: the other two release no read before e_w >= t0_w, and
// f_{j-b} of an earlier layer is <= t0_w. Not modelled: under kEarly with cross-layer reads a
// real loader does not know a later layer's routing yet and may read a group that turns out
// inactive (wasted bandwidth, or released unread); here inactive groups are never read. For the
// calibration prompts the configurator uses (~1K tokens, top-k routing) every group is active
// and the difference vanishes.
//
// ---- Properties -----------------------------------------------------------------------------
// Every quantity is a max of sums of non-negative terms of earlier quantities, f_j and d_j are
// non-decreasing in j (f_j >= s_j >= f_{j-1}, d_j >= d_{j-1} + T_j), so (max-plus
// monotonicity): more banks (f_{j-b-1} <= f_{j-b}), a larger q (d_{j-q-1} <= d_{j-q}), or
// smaller L, T, X, T_ne never make any time later. Hence the predicted total is non-increasing
// in b and q; the configurator relies on this to find the smallest b reaching the minimum by
// bisection (configurator.h). Banks beyond the number of groups that could ever be in flight
// change nothing: b >= N (cross-layer) or b >= max_w K_w (per layer) gives the minimum.
//
// Bubble (docs/DESIGN.md section 6): wait_s = sum_j max(0, d_j - max(e_w, f_{j-1})), the time the
// compute cores sit idle waiting for expert data; bubble rate = wait_s / total_s.
//
// Cost: O(N) time per evaluation, N = active groups over all layers (6,144 for 48 layers of
// 128 experts at G = 1), with two O(N) double arrays in the workspace.
//
// Thread safety: the functions are pure; a PipelineWorkspace must not be shared between
// threads calling at the same time.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "estream/options.h"

namespace estream::config {

// The service times of one request. Groups are the ACTIVE groups only, layer after layer, in
// execution order; all times in seconds, finite and >= 0.
struct PipelineInput {
  std::vector<double> nonexpert_s;    // [W] T_ne_w
  std::vector<uint32_t> layer_begin;  // [W + 1] layer w's groups are [layer_begin[w], layer_begin[w+1])
  std::vector<double> read_s;         // [N] L_j (latency + transfer)
  std::vector<double> transfer_s;     // [N] T_j <= L_j; all 0 gives the design's pure form
  std::vector<double> exec_s;         // [N] X_j
  double other_s = 0;                 // T_other

  int n_layer() const { return static_cast<int>(nonexpert_s.size()); }
  int n_groups() const { return static_cast<int>(read_s.size()); }
  // Largest K_w (active groups of one layer).
  int MaxLayerGroups() const;
  // Shapes consistent, layer_begin non-decreasing from 0 to N, times finite and >= 0,
  // transfer_s <= read_s. InvalidArgument naming the first bad field otherwise.
  Status Validate() const;
};

struct PipelineParams {
  int banks = 1;        // b >= 1
  int queue_depth = 1;  // q >= 1 group reads in flight at most
  Schedule schedule = Schedule::kEarly;
  bool cross_layer = true;  // kEarly only: reads may run ahead into later layers (see above)
};

struct PipelinePrediction {
  double total_s = 0;        // t0_W + T_other: the predicted request latency
  double wait_s = 0;         // compute idle waiting for expert data (bubble)
  double expert_exec_s = 0;  // sum of X_j
  double nonexpert_s = 0;    // sum of T_ne_w
  double BubbleRate() const { return total_s > 0 ? wait_s / total_s : 0; }
};

// Scratch arrays reused across evaluations (grow to N doubles each, never shrink).
struct PipelineWorkspace {
  std::vector<double> d, f;
};

// Evaluates the recurrence. REQUIRES: input.Validate() is OK (checked in debug builds only; the
// configurator validates once per input, not per evaluation), banks >= 1, queue_depth >= 1.
PipelinePrediction EvaluatePipeline(const PipelineInput& input, const PipelineParams& params,
                                    PipelineWorkspace* workspace);

// Every intermediate of one evaluation, for tests and `estream profile --report`: per group
// j (0-based here: j = 0 is the design's k = 1), and per layer.
struct PipelineTrace {
  std::vector<double> a, d, s, f;          // [N]
  std::vector<double> layer_start, layer_end;  // [W] t0_w and t0_{w+1}
  PipelinePrediction prediction;
};
PipelineTrace TracePipeline(const PipelineInput& input, const PipelineParams& params);

}  // namespace estream::config
