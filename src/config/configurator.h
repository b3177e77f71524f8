// Configurator: chooses group size G, queue depth Q and bank count B under a memory budget from
// a stored Profile (profile.h), with the max-plus model of maxplus.h (docs/DESIGN.md section 7).
//
// ---- Service-time models --------------------------------------------------------------------
// For candidate group size g at queue depth Q (ServiceModel):
//   read      L(g, Q) = lat(g) + s(g) * bytes / bw(g, Q),   T(g, Q) = s(g) * bytes / bw(g, Q)
//             bytes = (experts in the group) x record_bytes[w]; bw and lat from the disk table
//             (DiskProfile::Bandwidth: nearest measured g, linear in Q); s(g) = median of the
//             calibration run's pooled load samples / (g * mean record_bytes / bw(g, Q_calib)),
//             the ratio of what the real run's reads took to what the disk table predicts at the
//             depth they ran at (1 when the run has no load samples). L is non-increasing in Q
//             wherever the table's bandwidth is non-decreasing in Q.
//   exec      X(g, rho) = max(0, c0(g) + c1(g) * rho): an affine least-squares fit of the
//             calibration run's (rows, seconds) samples with c0, c1 >= 0 (FitAffine).
//   per layer T_ne_w = profile.nonexpert_seconds[w]; T_other = profile.other_seconds.
// Route vectors: group k of layer w holds physical experts [k*g, min(k*g + g, E)); its routed
// rows rho_{w,k} = sum of expert_routes[w*E + e] over them; the group is ACTIVE iff rho > 0.
// Only active groups enter the PipelineInput (BuildPipelineInput), in order k = 0, 1, ...
// The evaluator gets q = GroupsInFlight(Q, chunk, g * the largest record): the loader keeps Q
// chunk reads in flight, and a group read of c chunks takes c of them.
//
// ---- Selection (SelectConfig) ---------------------------------------------------------------
// Memory: a configuration (g, b) needs M(g, b) = M_other(g) + b * g * W_e bytes (W_e = the
// arena slot, profile.expert_bytes). For each candidate g:
//   b_max(g) = floor((M_max - M_other(g)) / (g * W_e))      (g infeasible when < 1)
// capped by SelectParams::max_banks and by the useful maximum (maxplus.h: N active groups with
// cross-layer early reads, else the largest per-layer K_w; more banks change nothing). For each
// depth Q (every measured depth >= Q0(g) of the disk table, or SelectParams::queue_depths) the
// predicted latency is non-increasing in b (maxplus.h, Properties), so the SMALLEST b whose
// prediction is within (1 + tolerance) of the prediction at the cap is found by bisection:
// O(log b_max) evaluations, identical to scanning every b in 1..b_max (SelectParams::exhaustive
// does that; tests check both agree). Then the best (g, Q): least predicted latency, ties (within
// SelectParams::choice_tolerance, default 2%) broken by less memory, then smaller g, then the
// DEEPER Q. Choosing the smallest b that reaches the minimum keeps the footprint below the budget
// when extra banks would buy nothing.
// Why depths beyond Q0(g), and deeper on a tie: Q costs no memory (reads land in bank slots), and
// in a prefill the loader's thread shares the cores with the compute team, so a completed read
// may wait before the next is issued; a deeper queue leaves the device work meanwhile. The disk
// table, measured with idle cores, does not show this; the sweeps do (shallow Q slower than deep
// Q of the same (G, B): docs/PERFORMANCE.md, "Configurator"). With the bandwidth envelope
// (DiskProfile::Bandwidth) and groups in flight from Q, the prediction is non-increasing in Q as
// well, so the deepest measured depth within the band wins.
// Why a 2% tie band between (g, q): the model ranks group sizes less finely than that (the
// measured cases: docs/PERFORMANCE.md, "Configurator").
// Read-ahead headroom (SelectParams::read_ahead_layers, default 2): the model's service times are
// medians, while real reads and executions jitter and the loader's and feeder's threads compete
// with the compute team, which the model does not see: the smallest b the model finds can run
// with a bubble it predicts to be 0 (docs/PERFORMANCE.md, "Configurator"). So once the model's b is found it is raised
// to read_ahead_layers x ceil(E / g) where the budget allows (never above b_max(g) nor
// max_banks): memory the user granted buys tolerance to jitter, and the prediction cannot get
// worse (monotone in b). Ties between g are then broken as above.
// Infeasible budget: when no candidate g fits one bank, ResourceExhausted naming the minimum
// budget min_g (M_other(g) + g * W_e) and the g that achieves it (MinimumBudget).
// Cost: (candidate g) x (depths) x (~log2 b_max + 1) evaluations of O(N): well under a
// millisecond for 48 layers x 128 experts (bench/config_bench.cc, docs/PERFORMANCE.md).
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "config/maxplus.h"
#include "config/profile.h"

namespace estream::config {

// X(rho) = max(0, intercept_s + slope_s * rho).
struct AffineFit {
  double intercept_s = 0;
  double slope_s = 0;  // seconds per routed row
  double At(double rows) const {
    const double x = intercept_s + slope_s * rows;
    return x > 0 ? x : 0;
  }
};
// Least squares with both coefficients >= 0: the unconstrained fit when it satisfies that;
// else a fit through the origin (intercept 0) when the slope is positive; else the mean as a
// constant. One sample, or all at the same rows: the constant mean. InvalidArgument for no
// samples, unequal lengths, or a negative or non-finite value.
Result<AffineFit> FitAffine(const std::vector<float>& rows, const std::vector<float>& seconds);

struct ServiceModel {
  int group_size = 0;
  int queue_depth = 0;       // Q: chunk reads in flight (the loader's depth)
  int groups_in_flight = 0;  // q of the recurrence: GroupsInFlight(Q, chunk, group bytes)
  double bandwidth = 0;   // bytes/s: bw(g, Q)
  double latency_s = 0;   // lat(g)
  double load_scale = 1;  // s(g)
  AffineFit exec;

  double TransferSeconds(uint64_t bytes) const { return load_scale * static_cast<double>(bytes) / bandwidth; }
  double ReadSeconds(uint64_t bytes) const { return latency_s + TransferSeconds(bytes); }
};
// Whole group reads of `group_bytes` that Q chunk reads of `chunk_bytes` keep in flight, at least
// one: max(1, floor(Q / ceil(group_bytes / chunk_bytes))). The loader keeps Q CHUNK reads in
// flight, oldest job first (io/loader.h), so a group of c chunks occupies c of them: with Q < 2c
// the next group's read starts only as the previous one drains, and its latency is exposed.
// (Conservative: the next group's first chunks may start a little earlier.)
int GroupsInFlight(int queue_depth, uint64_t chunk_bytes, uint64_t group_bytes);
// REQUIRES: profile.Validate() is OK. InvalidArgument when g was not calibrated or q < 1.
Result<ServiceModel> MakeServiceModel(const Profile& profile, int group_size, int queue_depth);

// The active groups' service times for `model` (see the top of this file). Overwrites *out,
// reusing its capacity. REQUIRES: profile.Validate() is OK.
void BuildPipelineInput(const Profile& profile, const ServiceModel& model, PipelineInput* out);

// Predicted latency of one configuration, with its memory.
struct CandidatePrediction {
  int group_size = 0;
  int queue_depth = 0;
  int banks = 0;
  uint64_t arena_bytes = 0;  // banks * group_size * W_e
  uint64_t total_bytes = 0;  // arena_bytes + M_other(g)
  double predicted_s = 0;
  double wait_s = 0;  // predicted compute idle time waiting for expert data (bubble)
};

struct SelectParams {
  uint64_t budget_bytes = 0;  // M_max: the whole process (arena + M_other)
  Schedule schedule = Schedule::kEarly;
  bool cross_layer = true;           // kEarly only (maxplus.h)
  std::vector<int> group_sizes{};    // candidates; empty: every calibrated g
  std::vector<int> queue_depths{};   // empty: the disk table's depths >= Q0(g), per g
  double tolerance = 0;              // relative, the bank search; see "Selection" above
  double choice_tolerance = 0.02;    // relative, ties between (g, q); see "Selection" above
  int max_banks = 0;                 // > 0: never more banks than this
  bool exhaustive = false;           // scan every b (same answer as bisection; slower)
  // Read-ahead headroom (see "Selection" above): > 0 raises each (g, q)'s b to this many layers'
  // groups, read_ahead_layers * ceil(E / g), where the budget allows; 0 keeps the model's
  // smallest b. Default 2: the streamer's plan window under kEarly (layer l and l + 1).
  int read_ahead_layers = 2;
};

struct Selection {
  CandidatePrediction best;
  // The best b for every (g, q) evaluated, ascending g then q; infeasible g are absent.
  std::vector<CandidatePrediction> per_group;
  // For `estream profile --report`: (G*, Q*, B* - 1) and (G*, Q*, B* + 1) where they exist and
  // fit the budget, and (G*, q', B*) for the disk table's depths adjacent to Q*.
  std::vector<CandidatePrediction> neighbours;
  int evaluations = 0;  // recurrence evaluations spent
};

// The smallest budget any candidate fits (one bank): min_g M_other(g) + g * W_e, with its g.
struct MinimumBudgetInfo {
  uint64_t bytes = 0;
  int group_size = 0;
};
MinimumBudgetInfo MinimumBudget(const Profile& profile, const std::vector<int>& group_sizes = {});

// Validates the profile, then selects. Errors: the profile's InvalidArgument; InvalidArgument
// for a requested g that was not calibrated, a depth < 1 or a negative tolerance;
// ResourceExhausted when the budget fits no candidate (message: the minimum budget).
Result<Selection> SelectConfig(const Profile& profile, const SelectParams& params);

// Prediction for one given configuration (the sweep's points, --report). InvalidArgument for an
// uncalibrated g or b, q < 1. Does not check the budget.
Result<CandidatePrediction> PredictConfig(const Profile& profile, int group_size, int queue_depth, int banks,
                                          Schedule schedule = Schedule::kEarly, bool cross_layer = true);

// The configuration to store (profile.h ConfigKvs).
ConfigChoice ToConfigChoice(const Selection& selection, const SelectParams& params);

}  // namespace estream::config
