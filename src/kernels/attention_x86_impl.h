// The blocked causal attention of the x86 paths, written once over a vector-traits class `S` and
// instantiated by x86_avx2/ops_avx2.cc, x86_avx512/ops_avx512.cc and arm_neon/attention_neon.cc
// (each compiled with its own ISA flags; the template itself is ISA-neutral). Everything here has internal linkage (anonymous namespace), so the two
// instantiations can never be merged by the linker across ISAs. Internal to src/kernels.
//
// Algorithm (flash-attention style online softmax). A call covers query heads [h0, h1) that share
// one kv head, over query rows [t0, t1); it is cut into tiles of kQ = S::kLanes * S::kVecs rows of
// one head. Every tile keeps its own state, and all tiles walk the key blocks in lockstep, so each
// K/V block is fetched from memory once per call and reused from cache by every tile:
//   per tile:  QT[d][i] = q[t_i][d] * scale * log2(e)  (queries transposed: lanes = queries)
//   for each key block of kKeys keys, for each tile that sees any of its keys:
//       ST[j][i] = sum_d K[j][d] QT[d][i]                (scores in log2 units, lanes = queries)
//       ST[j][i] = -inf where key j > query i             (causal mask, diagonal blocks only)
//       m' = max(m, max_j ST[j]);  alpha = 2^(m - m');   P[j] = 2^(ST[j] - m')
//       l  = l alpha + sum_j P[j];  OT[d] = OT[d] alpha + sum_j V[j][d] P[j]   (lanes = queries)
//   per tile:  out[t_i][d] = OT[d][i] / l[i]
// Putting queries in the vector lanes makes every softmax step a vertical vector operation (no
// horizontal reductions), lets head_dim and the number of rows be anything (no lane tails: unused
// query lanes hold zeros and are never stored), and turns both products into broadcast-FMA
// micro-kernels of R rows x kVecs vectors held in registers. All arithmetic is fp32 FMA; the
// T x T score matrix is never formed (ST is kKeys x kQ).
//
// Traits S provide: V (vector type), kLanes, kVecs (vectors of queries per tile), kKeys (keys per
// block, <= kAttnMaxKeys), kQkRows and kPvRows (register-tile heights), Zero, Set1, Load, Store
// (unaligned), Fma(a, b, c) = a * b + c, Mul, Add, Sub, Div, Max, MaskBelow(s, lane0, limit)
// (lanes with index lane0 + lane < limit get -inf), Exp2(x) for x <= 0 or -inf (relative error
// <= 3u; results below 2^-125 are flushed to 0, so masked keys get exactly 0 and no denormals
// enter the products), and Transpose(src, lds, scale, dst, ldd) of one kLanes x kLanes block.
// Thread safety: the scratch is thread_local; calls on different threads are independent.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "base/memory.h"
#include "kernels/kernels.h"

// Register tiles are small arrays indexed by compile-time loops; -O2 does not always unroll them
// fully, and then the accumulators live on the stack. Force it.
#define ESTREAM_UNROLL _Pragma("GCC unroll 16")

namespace estream::kernels {
namespace {

constexpr int kAttnMaxKeys = 128;  // upper bound of S::kKeys (scratch sizing)

// Per-thread scratch, grown to the largest (head_dim, tiles) seen; owned by the calling thread.
// Per tile: QT and OT (d x kQ each) and the softmax state m, l (kQ each).
struct AttnScratch {
  AlignedPtr<float> qt, ot, ml, st, vb;
  size_t tile_floats = 0;  // d * kQ
  int capacity_tiles = 0;
  int capacity_d = 0;
  int capacity_q = 0;

  // Bytes held after Reserve(d, q, tiles) from empty.
  static size_t Bytes(int d, int q, int tiles) {
    const size_t per_tile = static_cast<size_t>(d) * q;
    return sizeof(float) * (2 * per_tile * tiles + static_cast<size_t>(2) * q * tiles +
                            static_cast<size_t>(kAttnMaxKeys) * q + static_cast<size_t>(kAttnMaxKeys) * d);
  }

  void Reserve(int d, int q, int tiles) {
    if (d <= capacity_d && q <= capacity_q && tiles <= capacity_tiles) {
      tile_floats = static_cast<size_t>(d) * q;
      return;
    }
    capacity_d = std::max(d, capacity_d);
    capacity_q = std::max(q, capacity_q);
    capacity_tiles = std::max(tiles, capacity_tiles);
    const size_t per_tile = static_cast<size_t>(capacity_d) * capacity_q;
    qt = AllocAligned<float>(per_tile * capacity_tiles);
    ot = AllocAligned<float>(per_tile * capacity_tiles);
    ml = AllocAligned<float>(static_cast<size_t>(2) * capacity_q * capacity_tiles);
    st = AllocAligned<float>(static_cast<size_t>(kAttnMaxKeys) * capacity_q);
    vb = AllocAligned<float>(static_cast<size_t>(kAttnMaxKeys) * capacity_d);
    tile_floats = static_cast<size_t>(d) * q;
  }
};

// ST[j][.] for R keys (rows k, k + ldk, ...) against all kQ query lanes; d terms each.
// Riding along in the spare load/store slots of this FMA-bound loop: the same keys' V rows are
// copied to vb (rows d apart; see the PV step) unless vb is null, and the next n_prefetch keys'
// K and V rows are prefetched, so that K/V misses overlap with arithmetic instead of stalling.
template <class S, int R>
inline void QkTile(const float* k, int64_t ldk, const float* v, int64_t ldv, const float* qt, int d, float* st,
                   float* vb, int n_prefetch) {
  constexpr int kQ = S::kLanes * S::kVecs;
  typename S::V acc[R][S::kVecs];
  ESTREAM_UNROLL
  for (int r = 0; r < R; ++r)
    ESTREAM_UNROLL
    for (int c = 0; c < S::kVecs; ++c) acc[r][c] = S::Zero();
  // Copy and prefetch first, as independent work the out-of-order core overlaps with the FMA loop
  // below (interleaving them into that loop cut it into short trips and cost more than it saved).
  if (vb != nullptr) {
    const int full = d / S::kLanes * S::kLanes;
    for (int r = 0; r < R; ++r) {
      for (int i = 0; i < full; i += S::kLanes) S::Store(vb + r * d + i, S::Load(v + r * ldv + i));
      for (int i = full; i < d; ++i) vb[r * d + i] = v[r * ldv + i];
    }
  }
  for (int r = R; r < R + n_prefetch; ++r)
    for (int i = 0; i < d; i += 16) {
      __builtin_prefetch(k + r * ldk + i, 0, 3);  // prefetcht0 / prfm pldl1keep
      __builtin_prefetch(v + r * ldv + i, 0, 3);
    }
  for (int i = 0; i < d; ++i) {
    typename S::V q[S::kVecs];
    ESTREAM_UNROLL
    for (int c = 0; c < S::kVecs; ++c) q[c] = S::Load(qt + i * kQ + c * S::kLanes);
    ESTREAM_UNROLL
    for (int r = 0; r < R; ++r) {
      const typename S::V kb = S::Set1(k[r * ldk + i]);
      ESTREAM_UNROLL
      for (int c = 0; c < S::kVecs; ++c) acc[r][c] = S::Fma(kb, q[c], acc[r][c]);
    }
  }
  ESTREAM_UNROLL
  for (int r = 0; r < R; ++r)
    ESTREAM_UNROLL
    for (int c = 0; c < S::kVecs; ++c) S::Store(st + r * kQ + c * S::kLanes, acc[r][c]);
}

// OT[dd .. dd + R)[.] = OT * alpha + sum_j V[j][dd + r] P[j][.], for nk keys; v points at V[0][dd].
template <class S, int R>
inline void PvTile(const float* v, int64_t ldv, const float* pt, int nk, const typename S::V* alpha, float* ot) {
  constexpr int kQ = S::kLanes * S::kVecs;
  typename S::V acc[R][S::kVecs];
  ESTREAM_UNROLL
  for (int r = 0; r < R; ++r)
    ESTREAM_UNROLL
    for (int c = 0; c < S::kVecs; ++c) acc[r][c] = S::Mul(S::Load(ot + r * kQ + c * S::kLanes), alpha[c]);
  for (int j = 0; j < nk; ++j) {
    typename S::V p[S::kVecs];
    ESTREAM_UNROLL
    for (int c = 0; c < S::kVecs; ++c) p[c] = S::Load(pt + j * kQ + c * S::kLanes);
    ESTREAM_UNROLL
    for (int r = 0; r < R; ++r) {
      const typename S::V vb = S::Set1(v[j * ldv + r]);
      ESTREAM_UNROLL
      for (int c = 0; c < S::kVecs; ++c) acc[r][c] = S::Fma(vb, p[c], acc[r][c]);
    }
  }
  ESTREAM_UNROLL
  for (int r = 0; r < R; ++r)
    ESTREAM_UNROLL
    for (int c = 0; c < S::kVecs; ++c) S::Store(ot + r * kQ + c * S::kLanes, acc[r][c]);
}

// Runs Tile<R> over n rows in steps of kRows, then the remainder with one smaller instantiation.
template <int kRows, class F>
inline void ForTiles(int n, F&& tile) {
  int r = 0;
  for (; r + kRows <= n; r += kRows) tile.template operator()<kRows>(r);
  const int rest = n - r;
  if constexpr (kRows > 1) {
    if (rest > 0) {
      if constexpr (kRows > 4) {
        if (rest >= 4) {
          tile.template operator()<4>(r);
          r += 4;
        }
      }
      for (; r + 2 <= n; r += 2) tile.template operator()<2>(r);
      if (r < n) tile.template operator()<1>(r);
    }
  }
}

// dst[c][r] = src[r][c] * scale for r < rows, c < cols: whole kLanes x kLanes blocks in
// registers (S::Transpose), the ragged edges element by element.
template <class S>
void TransposeBlock(const float* src, int64_t lds, int rows, int cols, float scale, float* dst, int64_t ldd) {
  constexpr int L = S::kLanes;
  const int full_rows = rows / L * L, full_cols = cols / L * L;
  for (int r = 0; r < full_rows; r += L)
    for (int c = 0; c < full_cols; c += L) S::Transpose(src + r * lds + c, lds, scale, dst + c * ldd + r, ldd);
  for (int r = 0; r < rows; ++r) {
    const int c_begin = r < full_rows ? full_cols : 0;
    for (int c = c_begin; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c] * scale;
  }
}

// KernelTable::attention_scratch_bytes for these traits.
template <class S>
size_t AttentionScratchBytesX86(int head_dim, int tiles) {
  return AttnScratch::Bytes(head_dim, S::kLanes * S::kVecs, tiles);
}

template <class S>
void AttentionBlockX86(const AttentionArgs& a, int head_begin, int head_end, int t_begin, int t_end) {
  using V = typename S::V;
  constexpr int kQ = S::kLanes * S::kVecs;
  constexpr float kLog2e = 1.44269504088896340736f;
  const int d = a.head_dim;
  const int kv_head = head_begin / (a.n_head / a.n_head_kv);
  const float* k_head = a.k + static_cast<int64_t>(kv_head) * d;
  const float* v_head = a.v + static_cast<int64_t>(kv_head) * d;
  const int row_tiles = (t_end - t_begin + kQ - 1) / kQ;
  const int n_tiles = row_tiles * (head_end - head_begin);
  thread_local AttnScratch scratch;
  scratch.Reserve(d, kQ, n_tiles);
  float* st = scratch.st.get();
  float* vb = scratch.vb.get();
  const float q_scale = a.scale * kLog2e;
  // Tile x covers head head_begin + x % n_heads, rows from the last row tile backwards (x / n_heads
  // = 0 is the last), so the first tiles visited in a key block see the most keys and copy V.
  const int n_heads = head_end - head_begin;
  auto tile_head = [&](int x) { return head_begin + x % n_heads; };
  auto tile_q0 = [&](int x) { return t_begin + (row_tiles - 1 - x / n_heads) * kQ; };
  auto tile_qt = [&](int x) { return scratch.qt.get() + x * scratch.tile_floats; };
  auto tile_ot = [&](int x) { return scratch.ot.get() + x * scratch.tile_floats; };
  auto tile_m = [&](int x) { return scratch.ml.get() + static_cast<size_t>(2 * x) * kQ; };
  auto tile_l = [&](int x) { return scratch.ml.get() + static_cast<size_t>(2 * x + 1) * kQ; };

  // Tile x starts (queries transposed in, state reset) when key block 0 reaches it and finishes
  // (out stored) right after its last key block, so the loads of Q and the stores of out can
  // overlap with the arithmetic of neighbouring tiles instead of forming phases of their own.
  // (Software prefetch of the next tile's Q rows measured slower: it floods the fill buffers.)
  auto q_rows_of = [&](int x) {
    return a.q + static_cast<int64_t>(tile_q0(x)) * a.ldq + static_cast<int64_t>(tile_head(x)) * d;
  };
  auto start_tile = [&](int x) {
    const int nq = std::min(kQ, t_end - tile_q0(x));
    float* qt = tile_qt(x);
    TransposeBlock<S>(q_rows_of(x), a.ldq, nq, d, q_scale, qt, kQ);
    if (nq < kQ)
      for (int c = 0; c < d; ++c) std::memset(qt + c * kQ + nq, 0, sizeof(float) * (kQ - nq));
    std::memset(tile_ot(x), 0, sizeof(float) * scratch.tile_floats);
    std::fill(tile_m(x), tile_m(x) + kQ, -std::numeric_limits<float>::infinity());
    std::fill(tile_l(x), tile_l(x) + kQ, 0.0f);
  };
  // out[q0 + i][c] = OT[c][i] / l[i]: scale the rows of OT, then store them transposed.
  auto finish_tile = [&](int x) {
    const int q0 = tile_q0(x);
    const int nq = std::min(kQ, t_end - q0);
    float* ot = tile_ot(x);
    V inv_l[S::kVecs];
    ESTREAM_UNROLL
    for (int c = 0; c < S::kVecs; ++c) inv_l[c] = S::Div(S::Set1(1.0f), S::Load(tile_l(x) + c * S::kLanes));
    for (int r = 0; r < d; ++r)
      ESTREAM_UNROLL
      for (int c = 0; c < S::kVecs; ++c)
        S::Store(ot + r * kQ + c * S::kLanes, S::Mul(S::Load(ot + r * kQ + c * S::kLanes), inv_l[c]));
    float* out_rows = a.out + static_cast<int64_t>(q0) * a.ldo + static_cast<int64_t>(tile_head(x)) * d;
    TransposeBlock<S>(ot, kQ, d, nq, 1.0f, out_rows, a.ldo);
  };

  for (int kb = 0; kb < t_end; kb += S::kKeys) {
    const float* kblk = k_head + static_cast<int64_t>(kb) * a.ldk;
    const float* vblk = v_head + static_cast<int64_t>(kb) * a.ldv;
    bool v_copied = false;
    for (int x = 0; x < n_tiles; ++x) {
      const int q0 = tile_q0(x);
      const int q1 = std::min(t_end, q0 + kQ);
      if (kb >= q1) continue;
      const int nk = std::min(S::kKeys, q1 - kb);
      if (kb == 0) start_tile(x);
      const float* qt = tile_qt(x);
      float* ot = tile_ot(x);
      // Tiles are visited with q1 non-increasing, so the first one copies the most V rows.
      float* v_copy = v_copied ? nullptr : vb;
      ForTiles<S::kQkRows>(nk, [&]<int R>(int j) {
        const int n_prefetch = v_copy ? std::clamp(t_end - (kb + j + R), 0, R) : 0;
        QkTile<S, R>(kblk + j * a.ldk, a.ldk, vblk + j * a.ldv, a.ldv, qt, d, st + j * kQ,
                     v_copy ? v_copy + j * d : nullptr, n_prefetch);
      });
      v_copied = true;
      // Causal mask: key kb + j is visible to query q0 + i iff kb + j <= q0 + i, i.e. lanes
      // i < kb + j - q0 are masked; only rows with kb + j > q0 have any.
      for (int j = std::max(0, q0 - kb + 1); j < nk; ++j)
        ESTREAM_UNROLL
        for (int c = 0; c < S::kVecs; ++c) {
          float* s = st + j * kQ + c * S::kLanes;
          S::Store(s, S::MaskBelow(S::Load(s), c * S::kLanes, kb + j - q0));
        }
      V m[S::kVecs], alpha[S::kVecs], sum[S::kVecs];
      ESTREAM_UNROLL
      for (int c = 0; c < S::kVecs; ++c) m[c] = S::Load(tile_m(x) + c * S::kLanes);
      V bm[S::kVecs];
      ESTREAM_UNROLL
      for (int c = 0; c < S::kVecs; ++c) bm[c] = m[c];
      for (int j = 0; j < nk; ++j)
        ESTREAM_UNROLL
        for (int c = 0; c < S::kVecs; ++c) bm[c] = S::Max(bm[c], S::Load(st + j * kQ + c * S::kLanes));
      ESTREAM_UNROLL
      for (int c = 0; c < S::kVecs; ++c) {
        alpha[c] = S::Exp2(S::Sub(m[c], bm[c]));
        S::Store(tile_m(x) + c * S::kLanes, bm[c]);
        sum[c] = S::Zero();
      }
      for (int j = 0; j < nk; ++j)
        ESTREAM_UNROLL
        for (int c = 0; c < S::kVecs; ++c) {
          float* s = st + j * kQ + c * S::kLanes;
          const V p = S::Exp2(S::Sub(S::Load(s), bm[c]));
          S::Store(s, p);
          sum[c] = S::Add(sum[c], p);
        }
      ESTREAM_UNROLL
      for (int c = 0; c < S::kVecs; ++c)
        S::Store(tile_l(x) + c * S::kLanes, S::Fma(S::Load(tile_l(x) + c * S::kLanes), alpha[c], sum[c]));
      // The PV tiles read a few values of every key's V row per pass; rows of V sit ld apart (often
      // a power of two such as 2 KiB), which folds them onto a few L1 sets. So they read the
      // contiguous copy vb (nk x d) made by the first tile's QK pass.
      ForTiles<S::kPvRows>(d, [&]<int R>(int c0) { PvTile<S, R>(vb + c0, d, st, nk, alpha, ot + c0 * kQ); });
      if (kb + S::kKeys >= q1) finish_tile(x);
    }
  }
}

}  // namespace
}  // namespace estream::kernels

#undef ESTREAM_UNROLL
