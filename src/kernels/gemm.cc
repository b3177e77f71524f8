// Public GEMM entry points (kernels.h): type checks, activation quantisation, and the split of
// one multiply over the OpenMP team.
//
// Work split (ParallelSplit): one rectangle of the output per thread of the team (the outputs of
// one Gemm call that share a type: one range of columns). Every output element is computed by
// exactly one thread with the same arithmetic in the same order whatever the split (the kernels'
// reductions depend only on k), so results are bit-identical for every thread count.
#include <omp.h>

#include <algorithm>
#include <array>
#include <span>
#include <vector>

#include "base/check.h"
#include "base/memory.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/repack.h"
#include "quant/quant.h"

namespace estream::kernels {
namespace {

// Calls fn(m_begin, m_end, u_begin, u_end) over rectangles covering the m x `units` output, in
// parallel, where a unit is one packed panel of kPackRows columns (the caller maps units to
// columns; `panels` of the units hold columns, the rest are padding that aligns outputs): one
// piece per thread, cut by units (in multiples of 2 panels of 16 weight rows, the AMX path's
// panel group and the float kernel's 32-column panel) or, when there are too few panels, by rows
// of X (in multiples of 32, the AMX row tile pair; then u covers every unit). Every piece prepares
// its rows of X for the kernel again (AMX tile layout, activation sums; float: the transposed
// weight panel), and equal pieces keep both cores busy to the end, preparing X once per thread
// (the measurements against dynamically taken smaller pieces: docs/PERFORMANCE.md). A thread that
// the OS deschedules delays the multiply by its whole piece; the engine's hot loops (the fused
// expert operator) schedule their own work items dynamically and call this with one thread.
template <typename Fn>
void ParallelSplit(int64_t m, int64_t panels, int64_t units, Fn&& fn) {
  int nth = omp_get_max_threads();
  if (omp_in_parallel()) nth = 1;
  const bool by_cols = panels >= 2 * nth || m < 8 * nth;
  const int64_t cut = by_cols ? units : m;
  const int64_t align = by_cols ? 2 : 32;
  int64_t piece = (cut + nth - 1) / nth;
  piece = (piece + align - 1) / align * align;
  const int64_t pieces = (cut + piece - 1) / piece;
  nth = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nth, pieces)));
  auto run = [&](int64_t p) {
    const int64_t c0 = p * piece, c1 = std::min(cut, c0 + piece);
    if (by_cols) fn(int64_t{0}, m, c0, c1);
    else fn(c0, c1, int64_t{0}, units);
  };
  if (nth == 1) {
    for (int64_t p = 0; p < pieces; ++p) run(p);
    return;
  }
#pragma omp parallel for num_threads(nth) schedule(static, 1)
  for (int64_t p = 0; p < pieces; ++p) run(p);
}

KernelTable::GemmFn QuantFn(const KernelTable& kt, const WeightView& w) {
  return kt.Quant(w.type, w.layout == WeightLayout::kPacked);
}

bool IsFloatWeight(QuantType t) { return t == QuantType::kF32 || t == QuantType::kF16 || t == QuantType::kBF16; }

void QuantizeWith(const KernelTable& kt, const float* x, int64_t ldx, int64_t m, int64_t k, BlockQ8A* xq) {
  ESTREAM_CHECK(k % kQK8A == 0, "QuantizeActivations: k must be a multiple of 32");
  const auto fn = kt.quantize_q8a;
  const int64_t kb = k / kQK8A;
  // Rows are independent; small jobs stay on the calling thread.
#pragma omp parallel for schedule(static) if (m * k >= (int64_t{1} << 16) && !omp_in_parallel())
  for (int64_t i = 0; i < m; ++i) fn(x + i * ldx, xq + i * kb, k);
}

// Gemm's `add` tile: about 512 KiB, so that it stays in L2 beside the kernel's X rows while the
// thread adds it into y; rows in multiples of 32 (the AMX row tile pair; with 1024 columns, 128
// rows: the AVX-512 kernel's row pass at k = 2048, so the weights stream as often as without the
// tile), at least one row.
constexpr int64_t kAddTileFloats = int64_t{128} << 10;
int64_t AddTileRows(int64_t n) {
  const int64_t rows = std::max<int64_t>(1, kAddTileFloats / std::max<int64_t>(1, n));
  return rows >= 32 ? rows / 32 * 32 : rows;
}

// Rows [m0, m1) x columns [n0, n1) of one output, on the calling thread.
void RunPiece(const KernelTable& kt, const GemmOut& o, const BlockQ8A* xq, const float* x, int64_t ldx, int64_t m0,
              int64_t m1, int64_t n0, int64_t n1) {
  if (m0 >= m1 || n0 >= n1) return;
  const WeightView& w = *o.w;
  const int64_t kb = w.k / kQK8A;
  auto xq_at = [&](int64_t r) { return xq == nullptr ? nullptr : xq + r * kb; };
  auto x_at = [&](int64_t r) { return x == nullptr ? nullptr : x + r * ldx; };
  if (!o.add) {
    GemmColumns(kt, w, xq_at(m0), x_at(m0), ldx, m1 - m0, n0, n1, o.y + m0 * o.ldy + n0, o.ldy);
    return;
  }
  // 64-byte aligned, as the engine's buffers are: the kernels' row stores would straddle cache
  // lines otherwise (measured 15% slower with a std::vector's 16-byte alignment).
  const int64_t cols = n1 - n0, rows = std::min(m1 - m0, AddTileRows(cols));
  thread_local AlignedPtr<float> tile;
  thread_local int64_t tile_floats = 0;
  if (tile_floats < rows * cols) {
    tile = AllocAligned<float>(static_cast<size_t>(rows * cols));
    ESTREAM_CHECK(tile != nullptr, "Gemm: out of memory for the add tile");
    tile_floats = rows * cols;
  }
  for (int64_t r0 = m0; r0 < m1; r0 += rows) {
    const int64_t r1 = std::min(m1, r0 + rows);
    GemmColumns(kt, w, xq_at(r0), x_at(r0), ldx, r1 - r0, n0, n1, tile.get(), cols);
    for (int64_t i = r0; i < r1; ++i) kt.add(o.y + i * o.ldy + n0, tile.get() + (i - r0) * cols, cols);
  }
}

// Most outputs of one Gemm call (Q/K/V is three): the grouping below works on the stack, without
// an allocation per call.
constexpr size_t kMaxGemmOuts = 8;

// Outputs of one type and layout in one ParallelSplit: output i's panels are units
// [first[i], first[i] + panels), each output starting at an even unit so that the 2-panel cuts
// stay 2-panel aligned within it (a single output splits exactly as a plain call did).
void RunGroup(const KernelTable& kt, std::span<const GemmOut> outs, const BlockQ8A* xq, const float* x, int64_t ldx,
              int64_t m) {
  std::array<int64_t, kMaxGemmOuts> first;
  int64_t panels = 0, units = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const int64_t p = PackedPanels(outs[i].w->n);
    first[i] = units;
    panels += p;
    units += i + 1 < outs.size() ? (p + 1) / 2 * 2 : p;
  }
  if (panels == 0) return;
  ParallelSplit(m, panels, units, [&](int64_t m0, int64_t m1, int64_t u0, int64_t u1) {
    for (size_t i = 0; i < outs.size(); ++i) {
      const int64_t n = outs[i].w->n;
      const int64_t n0 = std::clamp<int64_t>((u0 - first[i]) * kPackRows, 0, n);
      const int64_t n1 = std::clamp<int64_t>((u1 - first[i]) * kPackRows, 0, n);
      RunPiece(kt, outs[i], xq, x, ldx, m0, m1, n0, n1);
    }
  });
}

}  // namespace

bool GemmSupports(QuantType t) {
  return t == QuantType::kF32 || t == QuantType::kF16 || t == QuantType::kBF16 || GemmQuantSlot(t) >= 0;
}

size_t ActivationBytes(int64_t m, int64_t k) {
  return static_cast<size_t>(m) * static_cast<size_t>(k / kQK8A) * sizeof(BlockQ8A);
}

void QuantizeActivations(const float* x, int64_t ldx, int64_t m, int64_t k, BlockQ8A* xq) {
  QuantizeWith(Kernels(), x, ldx, m, k, xq);
}

size_t GemmAddTileBytes(int64_t n) { return static_cast<size_t>(AddTileRows(n) * n) * sizeof(float); }

void GemmWith(const KernelTable& kt, std::span<const GemmOut> outs, const float* x, int64_t ldx, const BlockQ8A* xq,
              int64_t m) {
  if (outs.empty() || m <= 0) return;
  ESTREAM_CHECK(outs.size() <= kMaxGemmOuts, "Gemm: more outputs than kMaxGemmOuts in one call");
  const int64_t k = outs[0].w->k;
  bool any_quant = false;
  for (const GemmOut& o : outs) {
    const WeightView& w = *o.w;
    ESTREAM_CHECK(w.k == k, "Gemm: the outputs' weights differ in k");
    if (IsFloatWeight(w.type)) {
      ESTREAM_CHECK(x != nullptr, "Gemm: float weights need the float activations");
    } else {
      ESTREAM_CHECK(QuantFn(kt, w) != nullptr, "Gemm: weight type not supported (check GemmSupports)");
      ESTREAM_CHECK(w.k % 32 == 0 && RowBytes(w.type, w.k) > 0, "Gemm: k is not a multiple of the block size");
      any_quant = true;
    }
  }
  if (any_quant && xq == nullptr) {
    // Per calling thread (an Engine may run several), grown once to the largest request.
    thread_local std::vector<BlockQ8A> scratch;
    const size_t blocks = static_cast<size_t>(m) * static_cast<size_t>(k / kQK8A);
    if (scratch.size() < blocks) scratch.resize(blocks);
    QuantizeWith(kt, x, ldx, m, k, scratch.data());
    xq = scratch.data();
  }
  // One region per type and layout, in order of first appearance (a region's pieces are equal in
  // panels, which are equal in cost only within one type).
  auto same_kind = [](const GemmOut& a, const GemmOut& b) {
    return a.w->type == b.w->type && a.w->layout == b.w->layout;
  };
  std::array<GemmOut, kMaxGemmOuts> group;
  std::array<bool, kMaxGemmOuts> done{};
  for (size_t i = 0; i < outs.size(); ++i) {
    if (done[i]) continue;
    size_t n = 0;
    for (size_t j = i; j < outs.size(); ++j)
      if (!done[j] && same_kind(outs[j], outs[i])) {
        group[n++] = outs[j];
        done[j] = true;
      }
    RunGroup(kt, std::span<const GemmOut>(group.data(), n), xq, x, ldx, m);
  }
}

void Gemm(std::span<const GemmOut> outs, const float* x, int64_t ldx, const BlockQ8A* xq, int64_t m) {
  GemmWith(Kernels(), outs, x, ldx, xq, m);
}

void GemmQ8A(const WeightView& w, const BlockQ8A* xq, int64_t m, float* y, int64_t ldy) {
  ESTREAM_CHECK(QuantFn(Kernels(), w) != nullptr, "GemmQ8A: weight type is not a quantised GEMM type");
  const GemmOut out{.w = &w, .y = y, .ldy = ldy};
  GemmWith(Kernels(), std::span<const GemmOut>(&out, 1), nullptr, 0, xq, m);
}

void MatMul(const WeightView& w, const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy) {
  ESTREAM_CHECK(GemmSupports(w.type), "MatMul: weight type not supported (check GemmSupports)");
  const GemmOut out{.w = &w, .y = y, .ldy = ldy};
  GemmWith(Kernels(), std::span<const GemmOut>(&out, 1), x, ldx, nullptr, m);
}

}  // namespace estream::kernels
