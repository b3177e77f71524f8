// Public wrappers of the non-GEMM kernels (kernels.h): argument checks, OpenMP work split, and
// dispatch through Kernels(). The per-ISA work lives in ref/ops_ref.cc, x86_avx2/ops_avx2.cc,
// x86_avx512/ops_avx512.cc.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/check.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/ops_internal.h"

namespace estream::kernels {
namespace {

// Below this many elements a row kernel runs on the calling thread: a parallel region costs a
// few microseconds, more than normalising a handful of rows.
constexpr int64_t kMinParallelElements = 1 << 15;

// Attention work items hold at most this many (head, row tile) tiles. The AMX-BF16 kernel converts
// each key block of K and V to bf16 once per item (31% of its samples with 8 tiles, T = 4096), so
// its items are larger: 32 tiles measured 1.26-1.3x faster at T = 4096 and 1.1-1.17x at T = 1024
// than 8, and 64 no faster than 32 (docs/PERFORMANCE.md, Attention).
constexpr int kMaxTilesPerItemF32 = 8;
constexpr int kMaxTilesPerItemBf16 = 32;

}  // namespace

void AttentionPrefill(const AttentionArgs& a) { AttentionPrefillWith(Kernels(), a); }

void AttentionPrefillWith(const KernelTable& kt, const AttentionArgs& a) {
  ESTREAM_CHECK(a.n_tokens >= 0 && a.n_head > 0 && a.n_head_kv > 0 && a.head_dim > 0, "AttentionPrefill: bad shape");
  ESTREAM_CHECK(a.n_head % a.n_head_kv == 0, "AttentionPrefill: n_head must be a multiple of n_head_kv");
  if (a.n_tokens == 0) return;
  // Work items: (chunk of up to kMaxHeads query heads sharing one kv head) x (range of rows_per_item
  // query rows). One call streams each K/V block once for all its heads and row tiles, so the more
  // tiles per item, the less K/V traffic; but there must be enough items to balance the threads.
  // Items are ordered kv head by kv head, and within a kv head from the last rows (most keys) to
  // the first, so consecutive items also share K/V prefixes in the core's L2. Causal: an item of
  // rows ending at t costs about t; items are handed out dynamically, and the last ones of each kv
  // head and of the whole list are the cheapest, so the threads finish within a small item.
  const bool bf16 = a.allow_bf16 && kt.attention_block_bf16 != nullptr;
  const int max_tiles = bf16 ? kMaxTilesPerItemBf16 : kMaxTilesPerItemF32;
  const int rep = a.n_head / a.n_head_kv;
  const int heads_per_item = std::min(rep, max_tiles);
  const int head_chunks = (rep + heads_per_item - 1) / heads_per_item;
  const int threads_wanted = omp_get_max_threads();
  const auto block_fn = bf16 ? kt.attention_block_bf16 : kt.attention_block;
  const int tile_rows = bf16 ? kt.attention_rows_bf16 : kt.attention_rows;
  const int row_tiles = (a.n_tokens + tile_rows - 1) / tile_rows;
  int tiles_per_item = std::max(1, max_tiles / heads_per_item);
  auto count_items = [&](int tpi) {
    return static_cast<int64_t>(a.n_head_kv) * head_chunks * ((row_tiles + tpi - 1) / tpi);
  };
  while (tiles_per_item > 1 && count_items(tiles_per_item) < 8 * threads_wanted) tiles_per_item /= 2;
  const int rows_per_item = tiles_per_item * tile_rows;
  const int n_row_blocks = (a.n_tokens + rows_per_item - 1) / rows_per_item;
  const int64_t per_kv = static_cast<int64_t>(n_row_blocks) * head_chunks;
  const int64_t n_items = per_kv * a.n_head_kv;
  const int threads = static_cast<int>(std::min<int64_t>(threads_wanted, n_items));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t item = 0; item < n_items; ++item) {
    const int kv_head = static_cast<int>(item / per_kv);
    const int64_t in_kv = item % per_kv;
    const int block = n_row_blocks - 1 - static_cast<int>(in_kv / head_chunks);
    const int head_begin = kv_head * rep + static_cast<int>(in_kv % head_chunks) * heads_per_item;
    const int head_end = std::min(head_begin + heads_per_item, (kv_head + 1) * rep);
    const int t_begin = block * rows_per_item;
    const int t_end = std::min(a.n_tokens, t_begin + rows_per_item);
    block_fn(a, head_begin, head_end, t_begin, t_end);
  }
}

size_t AttentionScratchBytes(int head_dim) {
  const KernelTable& kt = Kernels();
  size_t bytes = 0;
  if (kt.attention_scratch_bytes != nullptr)
    bytes = std::max(bytes, kt.attention_scratch_bytes(head_dim, kMaxTilesPerItemF32));
  if (kt.attention_scratch_bytes_bf16 != nullptr)
    bytes = std::max(bytes, kt.attention_scratch_bytes_bf16(head_dim, kMaxTilesPerItemBf16));
  return bytes;
}

void RmsNorm(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t rows, int64_t n,
             float eps) {
  const auto fn = Kernels().rms_norm_row;
#pragma omp parallel for schedule(static) if (rows > 1 && rows * n >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) fn(x + r * ldx, w, y + r * ldy, n, eps);
}

void Rope(float* x, int64_t ldx, int n_tokens, int n_heads, int head_dim, int pos0, float freq_base,
          RopeMode mode) {
  ESTREAM_CHECK(head_dim % 2 == 0, "Rope: head_dim must be even");
  // inv_freq[p] = freq_base^(-2p/head_dim), in fp64 (not by repeated float multiplication as ggml
  // does), so that pos * inv_freq stays accurate to ~1e-16 relative at positions in the thousands.
  const int half = head_dim / 2;
  thread_local std::vector<double> inv_freq;
  inv_freq.resize(static_cast<size_t>(half));
  for (int p = 0; p < half; ++p)
    inv_freq[p] = std::pow(static_cast<double>(freq_base), -2.0 * p / static_cast<double>(head_dim));
  const double* freq = inv_freq.data();
  const auto fn = Kernels().rope_row;
#pragma omp parallel for schedule(static) \
    if (n_tokens > 1 && static_cast<int64_t>(n_tokens) * n_heads * head_dim >= kMinParallelElements)
  for (int t = 0; t < n_tokens; ++t) fn(x + t * ldx, n_heads, head_dim, pos0 + t, freq, mode);
}

void SwiGlu(const float* g, const float* u, float* h, int64_t n) { Kernels().swiglu(g, u, h, n); }

void SoftmaxTopK(const float* logits, int n_expert, int k, bool renormalize, int32_t* idx, float* w) {
  ESTREAM_CHECK(k >= 1 && k <= n_expert, "SoftmaxTopK: need 1 <= k <= n_expert");
  Kernels().softmax_topk(logits, n_expert, k, renormalize, idx, w);
}

void Add(float* y, const float* x, int64_t n) { Kernels().add(y, x, n); }

}  // namespace estream::kernels
