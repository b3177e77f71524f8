// Public wrappers of the non-GEMM kernels (kernels.h): argument checks, OpenMP work split, and
// dispatch through Kernels(). The per-ISA work lives in ref/ops_ref.cc, x86_avx2/ops_avx2.cc,
// x86_avx512/ops_avx512.cc.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "base/check.h"
#include "base/memory.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/ops_internal.h"
#include "kernels/phase_timer.h"

namespace estream::kernels {
namespace {

// Below this many elements a row kernel runs on the calling thread: a parallel region costs a
// few microseconds, more than normalising a handful of rows.
constexpr int64_t kMinParallelElements = 1 << 15;

// A thread's buffer of converted K/V, grown to the largest request and kept (thread_local users).
class GrownBuffer {
 public:
  uint16_t* Get(size_t elems) {
    if (elems > capacity_) {
      data_.reset();
      data_ = AllocAligned<uint16_t>(elems);
      ESTREAM_CHECK(data_ != nullptr, "AttentionPrefill: out of memory for the converted K/V");
      capacity_ = elems;
    }
    return data_.get();
  }

 private:
  AlignedPtr<uint16_t> data_;
  size_t capacity_ = 0;
};

// Attention work items hold at most this many (head, row tile) tiles. The AMX-BF16 kernel's items
// are larger: when it converted each key block of K and V per item, 32 tiles measured 1.26-1.3x
// faster than 8 at T = 4096 (64 no faster); with K and V converted once per call (below), 8, 16 and
// 32 measure within noise, and 32 keeps the fewest phases (docs/PERFORMANCE.md, Attention).
constexpr int kMaxTilesPerItemF32 = 8;
constexpr int kMaxTilesPerItemBf16 = 32;

// How AttentionPrefillWith splits a call. Work items: (chunk of up to heads_per_item query heads
// sharing one kv head) x (range of rows_per_item query rows). One call streams each K/V block once
// for all its heads and row tiles, so the more tiles per item, the less K/V traffic; but there must
// be enough items to balance the threads (8 per thread). Items are ordered kv head by kv head, and
// within a kv head from the last rows (most keys) to the first, so consecutive items also share
// K/V prefixes in the core's L2. Causal: an item of rows ending at t costs about t; items are
// handed out dynamically, and the last ones of each kv head and of the whole list are the
// cheapest, so the threads finish within a small item.
// The bf16 path runs in phases of phase_heads kv heads: their K and V are converted to bf16 (in
// parallel), then their items run. phase_heads is the fewest kv heads whose items reach the
// 8 per thread (so the converted buffer stays small); items shrink only when all kv heads together
// have too few. Where the kv heads alone reach 8 per thread, there are no phases: each thread
// takes whole kv heads, converting each into its own slot of the same buffer before its items.
// The fp32 path is one phase of every kv head.
struct AttentionPlan {
  int heads_per_item = 0;
  int head_chunks = 0;     // item chunks per kv head's query heads
  int rows_per_item = 0;
  int n_row_blocks = 0;
  int64_t per_kv = 0;      // items per kv head
  int phase_heads = 0;
};

AttentionPlan PlanAttention(bool bf16, int tile_rows, int n_tokens, int n_head, int n_head_kv, int threads) {
  AttentionPlan p;
  const int max_tiles = bf16 ? kMaxTilesPerItemBf16 : kMaxTilesPerItemF32;
  const int rep = n_head / n_head_kv;
  p.heads_per_item = std::min(rep, max_tiles);
  p.head_chunks = (rep + p.heads_per_item - 1) / p.heads_per_item;
  const int row_tiles = (n_tokens + tile_rows - 1) / tile_rows;
  const int64_t want = 8 * static_cast<int64_t>(std::max(1, threads));
  auto per_head = [&](int tpi) { return static_cast<int64_t>(p.head_chunks) * ((row_tiles + tpi - 1) / tpi); };
  int tiles_per_item = std::max(1, max_tiles / p.heads_per_item);
  p.phase_heads = bf16 ? static_cast<int>(std::min<int64_t>(n_head_kv, (want + per_head(tiles_per_item) - 1) /
                                                                           per_head(tiles_per_item)))
                       : n_head_kv;
  while (tiles_per_item > 1 && p.phase_heads * per_head(tiles_per_item) < want) tiles_per_item /= 2;
  p.rows_per_item = tiles_per_item * tile_rows;
  p.n_row_blocks = (n_tokens + p.rows_per_item - 1) / p.rows_per_item;
  p.per_kv = static_cast<int64_t>(p.n_row_blocks) * p.head_chunks;
  return p;
}

}  // namespace

void AttentionPrefill(const AttentionArgs& a) { AttentionPrefillWith(Kernels(), a); }

void AttentionPrefillWith(const KernelTable& kt, const AttentionArgs& a) {
  ESTREAM_CHECK(a.n_tokens >= 0 && a.n_head > 0 && a.n_head_kv > 0 && a.head_dim > 0, "AttentionPrefill: bad shape");
  ESTREAM_CHECK(a.n_head % a.n_head_kv == 0, "AttentionPrefill: n_head must be a multiple of n_head_kv");
  ESTREAM_CHECK(a.q_begin >= 0 && a.q_begin <= a.n_tokens, "AttentionPrefill: need 0 <= q_begin <= n_tokens");
  if (a.n_tokens == a.q_begin) return;
  const int n_rows = a.n_tokens - a.q_begin;  // query rows [q_begin, n_tokens)
  const bool bf16 = a.allow_bf16 && kt.attention_block_bf16 != nullptr;
  if (a.out_q8 != nullptr) {
    const int64_t width = static_cast<int64_t>(a.n_head) * a.head_dim;
    ESTREAM_CHECK(width % kQK8A == 0 && a.ldo_q8 >= width / kQK8A,
                  "AttentionPrefill: out_q8 needs rows of a multiple of 32 values and ldo_q8 >= their blocks");
    if (!bf16 || !kt.attention_q8_bf16 || a.head_dim % kQK8A != 0) {
      AttentionArgs f = a;
      f.out_q8 = nullptr;
      AttentionPrefillWith(kt, f);
#pragma omp parallel for schedule(static) if (n_rows * width >= kMinParallelElements)
      for (int t = a.q_begin; t < a.n_tokens; ++t)
        kt.quantize_q8a(a.out + t * a.ldo, a.out_q8 + t * a.ldo_q8, width);
      return;
    }
  }
  const int threads_wanted = omp_get_max_threads();
  const AttentionPlan p = PlanAttention(bf16, bf16 ? kt.attention_rows_bf16 : kt.attention_rows, n_rows,
                                        a.n_head, a.n_head_kv, threads_wanted);
  const int rep = a.n_head / a.n_head_kv;
  struct ItemRange {
    int kv_head, head_begin, head_end, t_begin, t_end;
  };
  // Item in_kv of kv head kv_head when its rows go in items of rows_per_item (n_row_blocks of
  // them), the last rows first; item_at: the plan's items, kv head by kv head.
  auto item_of = [&](int kv_head, int64_t in_kv, int rows_per_item, int n_row_blocks) {
    ItemRange r;
    r.kv_head = kv_head;
    const int block = n_row_blocks - 1 - static_cast<int>(in_kv / p.head_chunks);
    r.head_begin = kv_head * rep + static_cast<int>(in_kv % p.head_chunks) * p.heads_per_item;
    r.head_end = std::min(r.head_begin + p.heads_per_item, (kv_head + 1) * rep);
    r.t_begin = a.q_begin + block * rows_per_item;
    r.t_end = std::min(a.n_tokens, r.t_begin + rows_per_item);
    return r;
  };
  auto item_at = [&](int64_t item) {
    return item_of(static_cast<int>(item / p.per_kv), item % p.per_kv, p.rows_per_item, p.n_row_blocks);
  };
  const int threads = static_cast<int>(std::min<int64_t>(threads_wanted, p.per_kv * p.phase_heads));
  if (!bf16) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t item = 0; item < p.per_kv * a.n_head_kv; ++item) {
      const ItemRange r = item_at(item);
      kt.attention_block(a, r.head_begin, r.head_end, r.t_begin, r.t_end);
    }
    return;
  }
  // The converted K/V of one phase belongs to the calling thread and grows to the largest call.
  const size_t head_elems = kt.attention_kv_bytes_bf16(a.head_dim, a.n_tokens) / sizeof(uint16_t);
  const size_t elems = head_elems * static_cast<size_t>(p.phase_heads);
  thread_local GrownBuffer kv16;
  uint16_t* const kv = kv16.Get(elems);
  const int kv_blocks = (a.n_tokens + kt.attention_kv_block_bf16 - 1) / kt.attention_kv_block_bf16;
  // One item: the bf16 entry on the converted K/V of the item's kv head (kvh), except that the
  // first rows read key block 0 converted once more for them (KernelTable::
  // attention_first_rows_bf16), into the thread's one-block buffer, with only the keys they see.
  auto run_item = [&](ItemRange r, const uint16_t* kvh, PhaseClock& clock) {
    const int split = kt.attention_first_split_bf16;
    const struct {
      int end, mean_keys;
    } firsts[] = {{split, 1}, {kt.attention_first_rows_bf16, split}};
    for (const auto& g : firsts) {
      const int end = std::min(r.t_end, g.end);
      if (r.t_begin >= end) continue;
      thread_local GrownBuffer block0;
      uint16_t* const blk = block0.Get(kt.attention_kv_bytes_bf16(a.head_dim, kt.attention_kv_block_bf16) / 2);
      AttentionArgs f = a;
      f.n_tokens = std::min(a.n_tokens, g.end);
      f.lowp_mean_keys = g.mean_keys;
      kt.attention_convert_bf16(f, r.kv_head, 0, 1, blk);
      clock.Mark(kPhaseFirstRows);
      kt.attention_block_bf16(a, blk, r.head_begin, r.head_end, r.t_begin, end);
      r.t_begin = end;
    }
    if (r.t_begin < r.t_end) kt.attention_block_bf16(a, kvh, r.head_begin, r.head_end, r.t_begin, r.t_end);
    clock.Skip();
  };
  // Kv heads enough to balance the threads by themselves (8 a thread, as the items; the OLMoE
  // shape's 16 on 1 or 2 threads): a thread takes a whole kv head, converts its K/V into the
  // thread's own slot of the buffer (threads <= phase_heads slots) and runs the head's items
  // at once. No barrier between the conversion and the tiles, and the converted blocks are still
  // in L2 when the tiles read them (docs/PERFORMANCE.md, "seventeenth session").
  // The last `threads` kv heads are shared where the buffer has a slot for each beside the
  // threads' own (phase_heads >= 2 threads): the thread that takes one converts it into its slot,
  // publishes it, and runs its rows in items of kTailTiles tiles, as does every thread that has
  // run out of heads; whole heads left the threads up to a head apart at the end (the wait was
  // 3-4% of the call, OLMoE shape, T = 1024, 2 threads; docs/PERFORMANCE.md, twentieth session).
  if (a.n_head_kv >= 8 * threads && threads <= p.phase_heads) {
    constexpr int kTailTiles = 4;
    const int shared = threads > 1 && p.phase_heads >= 2 * threads ? threads : 0;
    const int first_shared = a.n_head_kv - shared;
    const int tail_rows = kTailTiles * kt.attention_rows_bf16;
    const int tail_blocks = (n_rows + tail_rows - 1) / tail_rows;
    const int tail_items = tail_blocks * p.head_chunks;
    struct Tail {
      std::atomic<bool> ready{false};
      std::atomic<int> next{0};
    };
    const std::unique_ptr<Tail[]> tail(new Tail[std::max(shared, 1)]);
    std::atomic<int> next_head{0};
    // Shared head t's slot, after the threads' own.
    auto tail_slot = [&](int t) { return kv + static_cast<size_t>(threads + t) * head_elems; };
    // Items of shared head t (the last rows first) until none is left.
    auto run_tail = [&](int t, PhaseClock& clock) {
      for (int i; (i = tail[t].next.fetch_add(1, std::memory_order_relaxed)) < tail_items;) {
        run_item(item_of(first_shared + t, i, tail_rows, tail_blocks), tail_slot(t), clock);
        clock.Mark(kPhaseOther);
      }
    };
#pragma omp parallel num_threads(threads)
    {
      PhaseClock clock;  // ESTREAM_PHASE_TIMERS (phase_timer.h); the block kernel times its own phases
      uint16_t* const own = kv + static_cast<size_t>(omp_get_thread_num()) * head_elems;
      for (int h; (h = next_head.fetch_add(1, std::memory_order_relaxed)) < a.n_head_kv;) {
        clock.Mark(kPhaseOther);
        if (h < first_shared) {
          kt.attention_convert_bf16(a, h, 0, kv_blocks, own);
          clock.Mark(kPhaseConvert);
          for (int64_t i = 0; i < p.per_kv; ++i) run_item(item_at(h * p.per_kv + i), own, clock);
          continue;
        }
        const int t = h - first_shared;
        kt.attention_convert_bf16(a, h, 0, kv_blocks, tail_slot(t));
        clock.Mark(kPhaseConvert);
        tail[t].ready.store(true, std::memory_order_release);
        run_tail(t, clock);
      }
      // Out of heads: every shared head's items left, once its owner (who has taken it: every
      // head is taken by now) has published its conversion.
      for (bool left = shared > 0; left;) {
        left = false;
        bool ran = false;
        for (int t = 0; t < shared; ++t) {
          if (tail[t].next.load(std::memory_order_relaxed) >= tail_items) continue;
          left = true;
          if (tail[t].ready.load(std::memory_order_acquire)) {
            run_tail(t, clock);
            ran = true;
          }
        }
        if (left && !ran) std::this_thread::yield();  // the owners still converting (more threads than cores)
      }
      clock.Mark(kPhaseOther);
    }
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    PhaseClock clock;  // ESTREAM_PHASE_TIMERS (phase_timer.h); the block kernel times its own phases
    for (int h0 = 0; h0 < a.n_head_kv; h0 += p.phase_heads) {
      const int nh = std::min(p.phase_heads, a.n_head_kv - h0);
      // The (head, block) pairs in equal contiguous shares (as a static schedule), each thread's
      // share as one block range per head: what a head's blocks share is computed once a range.
      {
        const int64_t n = static_cast<int64_t>(nh) * kv_blocks, nt = omp_get_num_threads(), id = omp_get_thread_num();
        for (int64_t i = n * id / nt, end = n * (id + 1) / nt; i < end;) {
          const int h = static_cast<int>(i / kv_blocks), b0 = static_cast<int>(i % kv_blocks);
          const int b1 = static_cast<int>(std::min<int64_t>(kv_blocks, b0 + (end - i)));
          kt.attention_convert_bf16(a, h0 + h, b0, b1, kv + h * head_elems);
          i += b1 - b0;
        }
        clock.Mark(kPhaseConvert);
      }
#pragma omp barrier
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < p.per_kv * nh; ++i) {
        clock.Mark(kPhaseOther);
        const ItemRange r = item_at(h0 * p.per_kv + i);
        run_item(r, kv + (r.kv_head - h0) * head_elems, clock);
      }
    }
    clock.Mark(kPhaseOther);
  }
}

size_t AttentionKvBytes(int head_dim, int n_head, int n_head_kv, int64_t max_tokens, int threads) {
  const KernelTable& kt = Kernels();
  if (kt.attention_kv_bytes_bf16 == nullptr || max_tokens <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0) return 0;
  // phase_heads x T is not monotonic in T (phase_heads drops in steps as T grows): the maximum
  // over every length (a few operations each; called once per engine).
  size_t most = 0;
  const int t_max = static_cast<int>(std::min<int64_t>(max_tokens, INT_MAX));
  for (int t = 1; t <= t_max; ++t) {
    const AttentionPlan p = PlanAttention(true, kt.attention_rows_bf16, t, n_head, n_head_kv, threads);
    most = std::max(most, static_cast<size_t>(p.phase_heads) * kt.attention_kv_bytes_bf16(head_dim, t));
  }
  return most;
}

size_t AttentionScratchBytes(int head_dim) {
  const KernelTable& kt = Kernels();
  size_t bytes = 0;
  if (kt.attention_scratch_bytes != nullptr)
    bytes = std::max(bytes, kt.attention_scratch_bytes(head_dim, kMaxTilesPerItemF32));
  if (kt.attention_scratch_bytes_bf16 != nullptr)
    bytes = std::max(bytes, kt.attention_scratch_bytes_bf16(head_dim, kMaxTilesPerItemBf16));
  // The first rows' key block 0 (AttentionPrefillWith's run_item), beside the bf16 scratch.
  if (kt.attention_first_rows_bf16 > 0)
    bytes += kt.attention_kv_bytes_bf16(head_dim, kt.attention_kv_block_bf16);
  return bytes;
}

void RmsNorm(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t rows, int64_t n,
             float eps) {
  const auto fn = Kernels().rms_norm_row;
#pragma omp parallel for schedule(static) if (rows > 1 && rows * n >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) fn(x + r * ldx, w, y + r * ldy, n, eps);
}

void RmsNormQuantize(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, BlockQ8A* xq, int64_t rows,
                     int64_t n, float eps) {
  ESTREAM_CHECK(n % kQK8A == 0, "RmsNormQuantize: n must be a multiple of 32");
  const KernelTable& kt = Kernels();
  const int64_t kb = n / kQK8A;
#pragma omp parallel for schedule(static) if (rows > 1 && rows * n >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    kt.rms_norm_row(x + r * ldx, w, y + r * ldy, n, eps);
    kt.quantize_q8a(y + r * ldy, xq + r * kb, n);
  }
}

// inv_freq[p] = freq_base^(-2p/head_dim) for p < head_dim / 2, in fp64 (not by repeated float
// multiplication as ggml does), so that pos * inv_freq stays accurate to ~1e-16 relative at
// positions in the thousands. The calling thread's table, valid until its next call.
static const double* RopeInvFreq(float freq_base, int head_dim) {
  ESTREAM_CHECK(head_dim % 2 == 0, "Rope: head_dim must be even");
  const int half = head_dim / 2;
  thread_local std::vector<double> inv_freq;
  inv_freq.resize(static_cast<size_t>(half));
  for (int p = 0; p < half; ++p)
    inv_freq[p] = std::pow(static_cast<double>(freq_base), -2.0 * p / static_cast<double>(head_dim));
  return inv_freq.data();
}

void Rope(float* x, int64_t ldx, int n_tokens, int n_heads, int head_dim, int pos0, float freq_base,
          RopeMode mode) {
  const double* freq = RopeInvFreq(freq_base, head_dim);
  const auto fn = Kernels().rope_row;
#pragma omp parallel for schedule(static) \
    if (n_tokens > 1 && static_cast<int64_t>(n_tokens) * n_heads * head_dim >= kMinParallelElements)
  for (int t = 0; t < n_tokens; ++t) fn(x + t * ldx, n_heads, head_dim, pos0 + t, freq, mode);
}

void NormRope(float* x, int64_t ldx, int64_t rows, const int32_t* pos, int n_heads, int head_dim, float freq_base,
              RopeMode mode, const float* norm_w, int64_t norm_n, float eps) {
  const int64_t width = static_cast<int64_t>(n_heads) * head_dim;
  ESTREAM_CHECK(norm_w == nullptr || (norm_n > 0 && width % norm_n == 0), "NormRope: norm_n must divide the row");
  const double* freq = RopeInvFreq(freq_base, head_dim);
  const KernelTable& kt = Kernels();
#pragma omp parallel for schedule(static) if (rows > 1 && rows * width >= kMinParallelElements)
  for (int64_t t = 0; t < rows; ++t) {
    float* row = x + t * ldx;
    if (norm_w != nullptr)
      for (int64_t j = 0; j < width; j += norm_n) kt.rms_norm_row(row + j, norm_w, row + j, norm_n, eps);
    kt.rope_row(row, n_heads, head_dim, pos[t], freq, mode);
  }
}

void SwiGlu(const float* g, const float* u, float* h, int64_t n) { Kernels().swiglu(g, u, h, n); }

void SoftmaxTopK(const float* logits, int n_expert, int k, bool renormalize, int32_t* idx, float* w) {
  ESTREAM_CHECK(k >= 1 && k <= n_expert, "SoftmaxTopK: need 1 <= k <= n_expert");
  Kernels().softmax_topk(logits, n_expert, k, renormalize, idx, w);
}

double LogSumExp(const float* row, int64_t n) { return Kernels().log_sum_exp(row, n); }

void Add(float* y, const float* x, int64_t n) { Kernels().add(y, x, n); }

}  // namespace estream::kernels
