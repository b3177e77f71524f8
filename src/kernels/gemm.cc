// Public GEMM entry points (kernels.h): type checks, activation quantisation, and the split of
// one multiply over the OpenMP team.
//
// Work split (ParallelSplit): one rectangle of the output per thread of the team. Every
// output element is computed by exactly one thread with the same arithmetic in the same order
// whatever the split (the kernels' reductions depend only on k), so results are bit-identical
// for every thread count.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "base/check.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/repack.h"
#include "quant/quant.h"

namespace estream::kernels {
namespace {

// Calls fn(m_begin, m_end, n_begin, n_end) over rectangles covering the m x n output, in parallel:
// one piece per thread, cut by columns (in multiples of 2 packed panels of 16 weight rows, the AMX
// path's panel group and the float kernel's 32-column panel) or, when there are too few panels, by
// rows of X (in multiples of 32, the AMX row tile pair). Every piece prepares its rows of X for the
// kernel again (AMX tile layout, activation sums; float: the transposed weight panel), and equal
// pieces keep both cores busy to the end, preparing X once per thread (the measurements against
// dynamically taken smaller pieces: docs/PERFORMANCE.md). A thread that the OS deschedules delays
// the multiply by its whole piece; the engine's hot loops (the fused expert operator) schedule
// their own work items dynamically and call this with one thread.
template <typename Fn>
void ParallelSplit(int64_t m, int64_t n, Fn&& fn) {
  const int64_t panels = PackedPanels(n);
  int nth = omp_get_max_threads();
  if (omp_in_parallel()) nth = 1;
  const bool by_cols = panels >= 2 * nth || m < 8 * nth;
  const int64_t units = by_cols ? panels : m;
  const int64_t align = by_cols ? 2 : 32;
  int64_t piece = (units + nth - 1) / nth;
  piece = (piece + align - 1) / align * align;
  const int64_t pieces = (units + piece - 1) / piece;
  nth = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nth, pieces)));
  auto run = [&](int64_t p) {
    const int64_t u0 = p * piece, u1 = std::min(units, u0 + piece);
    if (by_cols) fn(int64_t{0}, m, std::min(n, u0 * kPackRows), std::min(n, u1 * kPackRows));
    else fn(u0, u1, int64_t{0}, n);
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

}  // namespace

bool GemmSupports(QuantType t) {
  return t == QuantType::kF32 || t == QuantType::kF16 || t == QuantType::kBF16 || GemmQuantSlot(t) >= 0;
}

size_t ActivationBytes(int64_t m, int64_t k) {
  return static_cast<size_t>(m) * static_cast<size_t>(k / kQK8A) * sizeof(BlockQ8A);
}

void QuantizeActivations(const float* x, int64_t ldx, int64_t m, int64_t k, BlockQ8A* xq) {
  ESTREAM_CHECK(k % kQK8A == 0, "QuantizeActivations: k must be a multiple of 32");
  const auto fn = Kernels().quantize_q8a;
  const int64_t kb = k / kQK8A;
  // Rows are independent; small jobs stay on the calling thread.
#pragma omp parallel for schedule(static) if (m * k >= (int64_t{1} << 16) && !omp_in_parallel())
  for (int64_t i = 0; i < m; ++i) fn(x + i * ldx, xq + i * kb, k);
}

void GemmQ8A(const WeightView& w, const BlockQ8A* xq, int64_t m, float* y, int64_t ldy) {
  const KernelTable& kt = Kernels();
  const KernelTable::GemmFn fn = QuantFn(kt, w);
  ESTREAM_CHECK(fn != nullptr, "GemmQ8A: weight type is not a quantised GEMM type");
  ESTREAM_CHECK(w.k % 32 == 0 && RowBytes(w.type, w.k) > 0, "GemmQ8A: k is not a multiple of the block size");
  if (m <= 0 || w.n <= 0) return;
  const int64_t kb = w.k / kQK8A;
  ParallelSplit(m, w.n, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    fn(w, xq + m0 * kb, m1 - m0, n0, n1, y + m0 * ldy, ldy);
  });
}

void MatMul(const WeightView& w, const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy) {
  if (m <= 0 || w.n <= 0) return;
  const KernelTable& kt = Kernels();
  KernelTable::GemmFloatFn ffn = nullptr;
  switch (w.type) {
    case QuantType::kF32: ffn = kt.gemm_f32; break;
    case QuantType::kF16: ffn = kt.gemm_f16; break;
    case QuantType::kBF16: ffn = kt.gemm_bf16; break;
    default: break;
  }
  if (ffn != nullptr) {
    ParallelSplit(m, w.n, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      ffn(w, x + m0 * ldx, ldx, m1 - m0, n0, n1, y + m0 * ldy, ldy);
    });
    return;
  }
  ESTREAM_CHECK(QuantFn(kt, w) != nullptr, "MatMul: weight type not supported (check GemmSupports)");
  // Per calling thread (an Engine may run several), grown once to the largest request.
  thread_local std::vector<BlockQ8A> scratch;
  const size_t blocks = static_cast<size_t>(m) * static_cast<size_t>(w.k / kQK8A);
  if (scratch.size() < blocks) scratch.resize(blocks);
  QuantizeActivations(x, ldx, m, w.k, scratch.data());
  GemmQ8A(w, scratch.data(), m, y, ldy);
}

}  // namespace estream::kernels
