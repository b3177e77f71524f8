#include "moe/expert_op.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "base/check.h"
#include "kernels/dispatch.h"
#include "moe/scatter_add.h"

namespace estream::moe {
namespace {

bool IsFloat(QuantType t) { return t == QuantType::kF32 || t == QuantType::kF16 || t == QuantType::kBF16; }


// Asks for the n doubles at p in the cache ahead of their scatter-add (for writing; into L2).
inline void PrefetchForAdd(const double* p, int64_t n) {
  const char* b = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(double)); off += 64) __builtin_prefetch(b + off, 1, 2);
}


bool Matches(const kernels::WeightView& w, QuantType t, kernels::WeightLayout layout, int64_t n, int64_t k) {
  return w.type == t && w.n == n && w.k == k && w.data != nullptr &&
         (IsFloat(t) || w.layout == layout);
}

}  // namespace

ExpertShape ExpertShape::Of(const kernels::WeightView& gate, const kernels::WeightView& up,
                            const kernels::WeightView& down) {
  return ExpertShape{.n_embd = gate.k,
                     .n_ff_expert = gate.n,
                     .gate_type = gate.type,
                     .up_type = up.type,
                     .down_type = down.type,
                     .layout = IsFloat(gate.type) ? (IsFloat(up.type) ? down.layout : up.layout) : gate.layout};
}

Result<ExpertPlan> ExpertPlan::Create(const ExpertShape& shape, int64_t capacity_routes, int64_t max_tokens,
                                      int n_threads) {
  if (shape.n_embd <= 0 || shape.n_ff_expert <= 0 || shape.n_embd % kQK8A != 0 || shape.n_ff_expert % kQK8A != 0)
    return Status::InvalidArgument(fmt::format(
        "ExpertPlan: n_embd = {} and n_ff = {} must be positive multiples of {}", shape.n_embd, shape.n_ff_expert, kQK8A));
  for (QuantType t : {shape.gate_type, shape.up_type, shape.down_type})
    if (!kernels::GemmSupports(t))
      return Status::InvalidArgument(
          fmt::format("ExpertPlan: expert weight type {} has no GEMM kernel", TypeName(t)));
  if (max_tokens <= 0 || n_threads <= 0)
    return Status::InvalidArgument(
        fmt::format("ExpertPlan: max_tokens = {} and n_threads = {} must be positive", max_tokens, n_threads));
  ExpertPlan p;
  p.shape_ = shape;
  p.max_tokens_ = max_tokens;
  p.n_threads_ = n_threads;
  p.capacity_ = capacity_routes > 0 ? capacity_routes : std::min(kDefaultCapacity, max_tokens * 64);
  p.float_in_ = IsFloat(shape.gate_type) || IsFloat(shape.up_type);
  p.quant_in_ = !IsFloat(shape.gate_type) || !IsFloat(shape.up_type);
  p.float_hidden_ = IsFloat(shape.down_type);
  p.quant_hidden_ = !p.float_hidden_;
  // Row tile: the routes of one gate/up or down item. Its tiles (gate, up: row tile x ff_tile_;
  // down: row tile x embd_tile_, fp32; 1.25 MiB at most) stay in L2 beside the weight columns of
  // the item; 128 rows also matches the GEMM's own pass for k = 2048 (kernels: RowsPerPass).
  // Measured (moe_bench layer, Qwen3-30B shapes, T = 1024, 2 threads): tiles of 768 x 512 columns
  // instead of 256 x 128 took the fused layer from 107 to 100 ms (the GEMM calls' X preparation).
  p.row_tile_ = std::min(kRowTile, p.capacity_);
  p.ff_tile_ = std::min(kMaxFfTile, shape.n_ff_expert);
  p.embd_tile_ = std::min(kMaxEmbdTile, shape.n_embd);
  p.tile_elems_ = p.row_tile_ * (2 * p.ff_tile_ + p.embd_tile_);
  const int64_t C = p.capacity_, d = shape.n_embd, ff = shape.n_ff_expert;
  // A pass's units: at most one partial unit per slot plus the full ones.
  p.max_units_ = C + C / p.row_tile_ + 2;

  bool ok = true;
  auto alloc = [&](auto& ptr, int64_t n) {
    using T = std::remove_reference_t<decltype(ptr[0])>;
    ptr = AllocAligned<T>(static_cast<size_t>(n));
    ok = ok && ptr != nullptr;
    ++p.allocations_;
  };
  if (p.quant_in_) alloc(p.gxq_, n_threads * p.row_tile_ * (d / kQK8A));
  if (p.float_in_) alloc(p.gx_, n_threads * p.row_tile_ * d);
  if (p.quant_hidden_) alloc(p.hq_, C * (ff / kQK8A));
  if (p.float_hidden_) alloc(p.hf_, C * ff);
  alloc(p.tiles_, n_threads * p.tile_elems_);
  alloc(p.units_, p.max_units_);
  if (!ok)
    return Status::ResourceExhausted(fmt::format(
        "ExpertPlan: cannot allocate the buffers for {} routes of n_embd = {}, n_ff = {} on {} threads", C, d, ff,
        n_threads));
  return p;
}

Status ExpertPlan::Invoke(const ExpertInvocation& inv) {
  if (inv.n_slots < 0 || (inv.n_slots > 0 && (inv.slot_begin == nullptr || inv.bindings == nullptr)))
    return Status::InvalidArgument("ExpertPlan::Invoke: slot_begin and bindings are required for n_slots > 0");
  if (inv.n_tokens > max_tokens_)
    return Status::InvalidArgument(fmt::format("ExpertPlan::Invoke: n_tokens = {} exceeds the plan's max_tokens = {}",
                                               inv.n_tokens, max_tokens_));
  if (inv.n_slots == 0 || inv.slot_begin[inv.n_slots] == inv.slot_begin[0]) return Status::Ok();
  if (inv.route_token == nullptr || inv.route_weight == nullptr || inv.acc == nullptr ||
      (quant_in_ && inv.xq == nullptr) || (float_in_ && inv.xn == nullptr))
    return Status::InvalidArgument(
        "ExpertPlan::Invoke: route_token, route_weight, acc and the activations the weight types need are required");
  const ExpertShape& s = shape_;
  for (int i = 0; i < inv.n_slots; ++i) {
    if (inv.slot_begin[i + 1] < inv.slot_begin[i])
      return Status::InvalidArgument(fmt::format("ExpertPlan::Invoke: slot_begin is not ascending at slot {}", i));
    if (inv.slot_begin[i + 1] == inv.slot_begin[i]) continue;
    const SlotBinding& b = inv.bindings[i];
    if (!Matches(b.gate, s.gate_type, s.layout, s.n_ff_expert, s.n_embd) ||
        !Matches(b.up, s.up_type, s.layout, s.n_ff_expert, s.n_embd) ||
        !Matches(b.down, s.down_type, s.layout, s.n_embd, s.n_ff_expert))
      return Status::InvalidArgument(fmt::format(
          "ExpertPlan::Invoke: the binding of slot {} is not of the plan's shape class (n_embd {}, n_ff {}, types {}/{}/{})",
          i, s.n_embd, s.n_ff_expert, TypeName(s.gate_type), TypeName(s.up_type), TypeName(s.down_type)));
  }
  InvokeUnchecked(inv);
  return Status::Ok();
}

void ExpertPlan::InvokeUnchecked(const ExpertInvocation& inv) {
  last_passes_ = 0;
  if (inv.n_slots <= 0) return;
  const int64_t d = shape_.n_embd, ff = shape_.n_ff_expert;
  const int64_t d_blocks = d / kQK8A, ff_blocks = ff / kQK8A;
  const int64_t C = capacity_, rt = row_tile_, tile_elems = tile_elems_;
  const int64_t r_begin = inv.slot_begin[0], r_end = inv.slot_begin[inv.n_slots];
  const kernels::KernelTable& kt = kernels::Kernels();
  const ScaledAddF64Fn scaled_add = ScaledAddF64For(kt.isa);  // the epilogue (scatter_add.h)
  const int nth = std::min(omp_get_max_threads(), n_threads_);
  Unit* units = units_.get();
  BlockQ8A* gxq = gxq_.get();
  float* gx = gx_.get();
  BlockQ8A* hq = hq_.get();
  float* hf = hf_.get();
  const bool quant_in = quant_in_, float_in = float_in_, quant_hidden = quant_hidden_;
  const int32_t* route_token = inv.route_token;
  const float* route_weight = inv.route_weight;
  double* acc = inv.acc;

  int slot = 0;  // cursor: the slot holding route r0 (advances across passes: O(P + R) in all)
  for (int64_t r0 = r_begin; r0 < r_end; r0 += C) {
    const int64_t r1 = std::min(r_end, r0 + C);
    ++last_passes_;
    // Units of this pass: (slot, up to rt routes), in route order; empty slots skipped.
    int64_t n_units = 0;
    while (inv.slot_begin[slot + 1] <= r0) ++slot;
    for (int s = slot; s < inv.n_slots && inv.slot_begin[s] < r1; ++s) {
      const int64_t a = std::max(r0, inv.slot_begin[s]), b = std::min(r1, inv.slot_begin[s + 1]);
      for (int64_t u = a; u < b; u += rt) units[n_units++] = {s, u, std::min(rt, b - u), u - r0};
    }
    ESTREAM_DCHECK(n_units <= max_units_, "ExpertPlan: unit list overflow");
    // Column tiles of this pass (see kMaxFfTile), multiples of 32 between kMin*Tile and the
    // widest the buffers hold. Taking items as equal, a tile's makespan on the team is
    // ceil(items / threads) x tile; the widest tile within 10% of the smallest makespan wins
    // (wider tiles mean fewer calls, each of which prepares its rows of X again). Many units: the
    // widest tile. One unit of Qwen3-30B's n_ff = 768 on 2 threads: 2 items of 384 columns (the
    // previous halving rule gave 3 items of 256: one thread idle for a third of the phase).
    auto items = [](int64_t n, int64_t tile) { return (n + tile - 1) / tile; };
    auto balanced_tile = [&](int64_t n, int64_t widest, int64_t narrowest, int64_t units_per_tile) {
      narrowest = std::min(narrowest, widest);
      auto makespan = [&](int64_t tile) { return (units_per_tile * items(n, tile) + nth - 1) / nth * tile; };
      int64_t least = INT64_MAX;
      for (int64_t tile = widest; tile >= narrowest; tile -= 32) least = std::min(least, makespan(tile));
      int64_t tile = widest;
      while (tile - 32 >= narrowest && makespan(tile) * 10 > least * 11) tile -= 32;
      return tile;
    };
    const int64_t ff_tile = balanced_tile(ff, ff_tile_, kMinFfTile, n_units);
    const int64_t embd_tile = balanced_tile(d, embd_tile_, kMinEmbdTile, 1);
    const int64_t n_ff_items = items(ff, ff_tile), n_d_items = items(d, embd_tile);

#pragma omp parallel num_threads(nth)
    {
      const int me = omp_get_thread_num();
      float* tg = tiles_.get() + me * tile_elems;
      float* tu = tg + rt * ff_tile_;
      float* td = tu + rt * ff_tile_;
      BlockQ8A* my_xq = quant_in ? gxq + me * rt * d_blocks : nullptr;
      float* my_x = float_in ? gx + me * rt * d : nullptr;
      int64_t gathered = -1;  // the unit whose rows my_xq / my_x hold

      // 1. (unit, n_ff column tile): the unit's routed rows (gathered once per run of items of
      // one unit on this thread), gate and up as a pair, SwiGLU, H.
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < n_units * n_ff_items; ++item) {
        const int64_t ui = item / n_ff_items;
        const Unit& u = units[ui];
        if (ui != gathered) {
          for (int64_t r = 0; r < u.rows; ++r) {
            const int64_t t = route_token[u.route0 + r];
            ESTREAM_DCHECK(t >= 0 && t < inv.n_tokens, "ExpertPlan: route token out of range");
            if (quant_in) std::memcpy(my_xq + r * d_blocks, inv.xq + t * d_blocks, d_blocks * sizeof(BlockQ8A));
            if (float_in) std::memcpy(my_x + r * d, inv.xn + t * d, d * sizeof(float));
          }
          gathered = ui;
        }
        const SlotBinding& bind = inv.bindings[u.slot];
        const int64_t n0 = (item % n_ff_items) * ff_tile, n1 = std::min(ff, n0 + ff_tile), nb = n1 - n0;
        kernels::GemmColumns(kt, bind.gate, my_xq, my_x, d, u.rows, n0, n1, tg, nb);
        kernels::GemmColumns(kt, bind.up, my_xq, my_x, d, u.rows, n0, n1, tu, nb);
        for (int64_t r = 0; r < u.rows; ++r) {
          float* h = tg + r * nb;
          kt.swiglu(h, tu + r * nb, h, nb);
          if (quant_hidden) {
            kt.quantize_q8a(h, hq + (u.prow + r) * ff_blocks + n0 / kQK8A, nb);
          } else {
            std::memcpy(hf + (u.prow + r) * ff + n0, h, nb * sizeof(float));
          }
        }
      }
      // (implicit barrier)

      // 2. (n_embd column tile): every unit in route order: down, a_i, scatter-add.
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < n_d_items; ++item) {
        const int64_t c0 = item * embd_tile, c1 = std::min(d, c0 + embd_tile), nb = c1 - c0;
        for (int64_t i = 0; i < n_units; ++i) {
          const Unit& u = units[i];
          const int32_t* tok = route_token + u.route0;
          const float* aw = route_weight + u.route0;
          // The unit's rows of acc (scattered tokens: the hardware prefetcher does not guess
          // them) arrive during the down GEMM instead of stalling the scatter-add after it.
          // fp64 rows are twice the bytes of fp32 ones and mostly miss L2 (the pass's H and
          // weights stream through it between two touches of a row). Measured with moe_bench
          // layer (OLMoE, T = 1024, 2 threads, shared machine): the fused layer took +10% over
          // the fp32 scatter without this prefetch, +3% with it.
          for (int64_t r = 0; r < u.rows; ++r) PrefetchForAdd(acc + static_cast<int64_t>(tok[r]) * d + c0, nb);
          kernels::GemmColumns(kt, inv.bindings[u.slot].down, hq + u.prow * ff_blocks, hf + u.prow * ff, ff, u.rows, c0, c1,
                      td, nb);
          for (int64_t r = 0; r < u.rows; ++r)
            scaled_add(acc + static_cast<int64_t>(tok[r]) * d + c0, td + r * nb, aw[r], nb);
        }
      }
    }
  }
}

void BeginExpertSum(const float* x, int64_t n_tokens, int64_t n_embd, double* acc) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* __restrict src = x + t * n_embd;
    double* __restrict dst = acc + t * n_embd;
#pragma omp simd
    for (int64_t j = 0; j < n_embd; ++j) dst[j] = static_cast<double>(src[j]);
  }
}

void EndExpertSum(const double* acc, int64_t n_tokens, int64_t n_embd, float* x) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const double* __restrict src = acc + t * n_embd;
    float* __restrict dst = x + t * n_embd;
#pragma omp simd
    for (int64_t j = 0; j < n_embd; ++j) dst[j] = static_cast<float>(src[j]);
  }
}

}  // namespace estream::moe
