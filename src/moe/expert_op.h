// The expert plan and the fused expert operator (docs/DESIGN.md section 3).
//
// What it computes. For every slot s with routes i in [slot_begin[s], slot_begin[s + 1]):
//     acc[t_i] += (double) a_i * (double) v_i,   v_i = Wd_s^T ( silu(Wg_s^T x_i) * (Wu_s^T x_i) ) (fp32)
// where x_i = xn[t_i], t_i = route_token[i], a_i = route_weight[i], (Wg_s, Wu_s, Wd_s) the slot's
// bindings and acc an fp64 accumulator of the layer (see "Order of the experts" below).
// A "slot" is whatever the caller groups routes by: an expert id (resident engine), or an arena
// slot holding one expert of the group being run (virtualised engine, src/vmem). Routes of one
// slot name distinct tokens (an expert is picked at most once per token).
//
// How. An ExpertPlan is built once per expert shape class (n_embd, n_ff, weight types, layout)
// and reused by every expert of every MoE layer of that class. Create() chooses the tiles for
// the L2 budget and allocates every buffer the operator needs for a capacity of C routes per
// pass: per-thread gathered Q8A activation rows (one row tile), per-thread gate/up tile pairs,
// the SwiGLU output of the pass (Q8A, C x n_ff / 32 blocks: 40 bytes per 32 elements), per-thread
// down accumulator tiles, and the work-item list. Invoke() allocates nothing and never rebuilds.
// One Invoke with R routes runs ceil(R / C) passes of at most C routes each (a slot may straddle
// two passes); each pass is one OpenMP parallel region:
//   1. items (slot, row tile, n_ff column tile), dynamically scheduled: the routed Q8A rows of xq
//      (quantised once per layer by the caller) into the thread's row buffer (once per run of
//      items of one unit on that thread), gate and up of the tile as a pair into per-thread
//      tiles, SwiGLU, Q8A of the result into the pass's H buffer;
//   2. items (n_embd column tile), dynamically scheduled: for every slot in CSR order, the down
//      projection of that slot's H rows for the columns of the tile into a per-thread tile, then
//      acc[t_i][cols] += (double) a_i * (double) tile[i][cols]. An item owns its columns of acc,
//      and adds the slots into each element in CSR (slot) order, passes in route order, so:
// Determinism: the same inputs give a bit-identical acc for any thread count and any run (every
// output element is one fixed sequence of operations; no atomics, no reduction races).
// With slots = expert ids in ascending order this is also bit-identical to
// the per-expert baselines of tests/ref/experts_baseline.h (same GEMM per element, same SwiGLU,
// same Q8A blocks, same fp64 scatter-adds in the same order).
//
// Order of the experts. A token's experts may reach acc in any order: slot order (a permuted
// packed file), group order (a streamed layer runs in several invocations), pass order. With
// fp32 adds into the residual stream the order changes x by an ulp here and there, and the next
// layer's Q8A quantisation turns such an ulp at a rounding boundary into a whole quantisation
// step (measured: up to 2% of the largest logit). So the caller keeps one fp64 accumulator per
// layer: BeginExpertSum (acc = x), any number of invocations, EndExpertSum (x = float(acc), once
// per element). Each term a_i * v_i is exact in fp64 (24-bit x 24-bit mantissas), so the only
// order-dependent rounding is that of the k + 1 fp64 adds (k = n_expert_used): |difference| <=
// ~k * 2^-53 * sum|terms|, i.e. about k * 2^-29 of an fp32 ulp of the sum unless the terms
// cancel. The final rounding to fp32 therefore gives the same float for any order except when
// the fp64 sum lies within that distance of an fp32 rounding midpoint (probability ~k * 2^-29
// ~ 1e-8 per element; tests/pipeline_engine_test counts bit-identical runs).
//
// Weight types: any kernels::GemmSupports type, packed or GGUF layout. Float gate/up (F32, F16,
// BF16) read the float rows xn; a float down reads the float SwiGLU output; the plan allocates
// those float buffers only if its shape class has such matrices.
//
// Threading: Invoke is called from outside any parallel region and uses
// min(omp_get_max_threads(), n_threads given to Create) threads. A plan is not re-entrant: one
// Invoke at a time per plan (it owns its buffers). Distinct plans may run concurrently.
#pragma once

#include <cstdint>
#include <vector>

#include "base/memory.h"
#include "base/status.h"
#include "kernels/kernels.h"
#include "quant/types.h"

namespace estream::moe {

// The shape class of an expert: every expert the plan runs must match it exactly.
struct ExpertShape {
  int64_t n_embd = 0;  // d: k of gate/up, n of down; a multiple of 32
  int64_t n_ff_expert = 0;  // k of down, n of gate/up; a multiple of 32
  QuantType gate_type = QuantType::kQ4_0;
  QuantType up_type = QuantType::kQ4_0;
  QuantType down_type = QuantType::kQ4_0;
  kernels::WeightLayout layout = kernels::WeightLayout::kPacked;  // of all three matrices

  // The shape class of a (gate, up, down) triple of views (layout taken from gate).
  static ExpertShape Of(const kernels::WeightView& gate, const kernels::WeightView& up,
                        const kernels::WeightView& down);
  friend bool operator==(const ExpertShape&, const ExpertShape&) = default;
};

// The parameters of one slot: views of the expert's matrices (in the arena, or in the mapped /
// resident model). Not owned; valid for the duration of the Invoke.
struct SlotBinding {
  kernels::WeightView gate;  // n_ff x n_embd
  kernels::WeightView up;    // n_ff x n_embd
  kernels::WeightView down;  // n_embd x n_ff
};

// One call of the operator. Nothing is owned; all pointers must stay valid during Invoke.
struct ExpertInvocation {
  const int64_t* slot_begin = nullptr;   // [n_slots + 1] CSR offsets into route_token/route_weight
  int n_slots = 0;                       // P
  const int32_t* route_token = nullptr;  // [slot_begin[n_slots]] token row of each route, < n_tokens
  const float* route_weight = nullptr;   // [slot_begin[n_slots]] a_i
  const SlotBinding* bindings = nullptr; // [n_slots]; entries of empty slots are not read
  const float* xn = nullptr;     // [n_tokens x n_embd] normed input (read only for float gate/up)
  const BlockQ8A* xq = nullptr;  // [n_tokens x n_embd/32] its Q8A form (read for quantised gate/up)
  double* acc = nullptr;         // [n_tokens x n_embd] fp64 accumulator of the layer, += only
                                 // (BeginExpertSum / EndExpertSum below)
  int64_t n_tokens = 0;
};

class ExpertPlan {
 public:
  // Builds the plan for `shape`, with buffers for passes of up to `capacity_routes` routes,
  // prompts of up to `max_tokens` tokens and up to `n_threads` threads. capacity_routes <= 0
  // picks the default (kDefaultCapacity, clamped to max_tokens x 64). Errors: InvalidArgument
  // (shape not a multiple of 32, type without a GEMM, non-positive sizes), ResourceExhausted.
  [[nodiscard]] static Result<ExpertPlan> Create(const ExpertShape& shape, int64_t capacity_routes,
                                                 int64_t max_tokens, int n_threads);

  // Runs the operator (see the file comment). Errors (InvalidArgument, acc untouched): a binding
  // of a non-empty slot not of the plan's shape class, n_tokens > max_tokens, a null pointer
  // that is needed. Route tokens are DCHECKed in range.
  [[nodiscard]] Status Invoke(const ExpertInvocation& inv);

  // As Invoke but without any validation (the engine's hot path; REQUIRES what Invoke checks).
  void InvokeUnchecked(const ExpertInvocation& inv);

  const ExpertShape& shape() const { return shape_; }
  int64_t capacity() const { return capacity_; }
  int64_t max_tokens() const { return max_tokens_; }
  int n_threads() const { return n_threads_; }
  // Buffer allocations made by this plan since Create (constant after Create: tests check it).
  int64_t allocations() const { return allocations_; }
  // Passes run by the last Invoke (ceil(R / capacity)); for tests of the R > C split.
  int64_t last_passes() const { return last_passes_; }

  static constexpr int64_t kDefaultCapacity = 1024;
  // Routes of one unit (a gate/up work item's rows, the per-thread gathered rows): at most this.
  static constexpr int64_t kRowTile = 128;
  // Column tiles of the work items (multiples of 32 and of the kernels' 16-row panels): as wide as
  // kMax*Tile (every GEMM call prepares its rows of X again: AMX tile layout, activation sums), or
  // narrower, down to kMin*Tile, when that balances the pass's items over the threads better
  // (expert_op.cc). Chosen per pass; the results do not depend on them.
  static constexpr int64_t kMaxFfTile = 1024, kMinFfTile = 256;
  static constexpr int64_t kMaxEmbdTile = 512, kMinEmbdTile = 128;

  ExpertPlan(ExpertPlan&&) noexcept = default;
  ExpertPlan& operator=(ExpertPlan&&) noexcept = default;

 private:
  ExpertPlan() = default;

  struct Unit {
    int32_t slot;
    int64_t route0;  // first route of the unit (index into route_token / route_weight)
    int64_t rows;    // routes in the unit (<= row tile)
    int64_t prow;    // first row of the unit in the pass buffers
  };

  ExpertShape shape_;
  int64_t capacity_ = 0;
  int64_t max_tokens_ = 0;
  int n_threads_ = 0;
  int64_t row_tile_ = 0;     // routes per unit (gate/up items)
  int64_t ff_tile_ = 0;      // widest gate/up column tile, <= kMaxFfTile
  int64_t embd_tile_ = 0;    // widest down column tile, <= kMaxEmbdTile
  int64_t tile_elems_ = 0;   // floats of one thread's tiles: gate, up (row tile x ff_tile_), down
  bool float_in_ = false;    // some gate/up is a float type
  bool float_hidden_ = false;// down is a float type
  bool quant_in_ = false;    // some gate/up is quantised
  bool quant_hidden_ = false;// down is quantised

  AlignedPtr<BlockQ8A> gxq_;   // per thread [row tile x d/32]: the gathered Q8A rows of one unit
  AlignedPtr<float> gx_;       // per thread [row tile x d]: its float rows (float gate/up only)
  AlignedPtr<BlockQ8A> hq_;    // [C x ff/32] SwiGLU output of the pass, Q8A (quantised down)
  AlignedPtr<float> hf_;       // [C x ff] SwiGLU output, float (float down only)
  AlignedPtr<float> tiles_;    // per thread: gate, up, down tiles (tile_elems_ floats)
  AlignedPtr<Unit> units_;     // [max units of a pass]
  int64_t max_units_ = 0;
  int64_t allocations_ = 0;
  int64_t last_passes_ = 0;
};

// The fp64 sum of one MoE layer (see "Order of the experts" in the file comment), both over rows
// [0, n_tokens) of n_embd elements, parallel over rows (call outside any parallel region):
//   BeginExpertSum: acc = (double) x, before the layer's first invocation;
//   EndExpertSum:   x = (float) acc, after its last one (one rounding per element).
// Thread-count independent (one conversion per element).
void BeginExpertSum(const float* x, int64_t n_tokens, int64_t n_embd, double* acc);
void EndExpertSum(const double* acc, int64_t n_tokens, int64_t n_embd, float* x);

}  // namespace estream::moe
