// AVX-512 VNNI low-precision attention (kernels/attention_lowp.h): Q.K^T and P.V both with
// vpdpbusd on 8-bit operands, fp32 online softmax. Same loop structure as the fp32 x86 kernel
// (attention_x86_impl.h): queries in the vector lanes (16 per vector, 4 vectors = 64 per tile),
// every tile of a group (at most 8 tiles of a call) walks the key spans (kLowpSpanKeys = 128
// keys, two converted blocks) in lockstep so that each converted block is read from memory once
// per group. Per group: every tile's Q quantised first (row by row across the tiles, prefetched
// ahead; the next group's Q rows are prefetched to L2 during this group's last steps), then per
// span and tile the QK steps of its blocks, the online softmax with P quantised to u8, and the PV
// step over the span's keys (the first span's starting from O = 0, the last one's storing O / l),
// then O transposed into the output.
//   QK step, per 4 keys x 4 query vectors: 16 int32 accumulators; per 4 head dims one vpdpbusd
//     each, Q as u8 (qi + 128, 4 dims per lane) and the key's 4 int8 dims broadcast (QkTile).
//   PV step, per 6 head dims x 4 query vectors: 24 int32 accumulators; per 4 keys one vpdpbusd
//     each, P (times the key's V scale) as u8 (keys 4p .. 4p + 3 per lane) and V's s8 quad of
//     the dim broadcast; one conversion and FMA per output and span (PvTile; once per key
//     block, before the spans, the kernel took 1-3% longer on every shape and length).
//   The diagonal block (the tile's last, keys kb = q0 ..): query vector c sees only keys up to
//     16 c + 15, so both steps skip the (key, query vector) pairs after that, ~37% of the block's
//     products (with 64 x 64 blocks 11% of the products at T = 1024, 3% at 4096); the sums are
//     the same (the skipped scores are masked to -inf, the skipped P are 0).
// Compiled with the AVX-512 flags only; the table carries it where the host has AVX-512 (with
// VNNI and BF16: HostIsa() == kAvx512 requires both, base/cpu.h) and no selected AMX kernel.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/check.h"
#include "base/memory.h"
#include "kernels/attention_lowp.h"
#include "kernels/attention_x86_impl.h"
#include "kernels/dispatch.h"
#include "kernels/phase_timer.h"

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define ESTREAM_UNROLL _Pragma("GCC unroll 16")

namespace estream::kernels {
namespace {

constexpr float kLog2eF = 1.44269504088896340736f;
constexpr int kVecs = kLowpRows / 16;  // 4 query vectors per tile
constexpr int kQkKeys = 4;             // keys per QK register tile (6 made GCC 12 spill)
constexpr int kPvDims = 6;             // head dims per PV register tile
constexpr int kGroupTiles = 8;         // tiles per group (AttentionBlockLowpAvx512)

inline __mmask16 Tail16(int rest) { return rest >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << rest) - 1); }

// The largest lane of x, in every lane: a row's max |x| for its int8 scale (Inv127, Scale127).
inline __m512 BroadcastMax(__m512 x) {
  x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E));
  x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1));
  x = _mm512_max_ps(x, _mm512_permute_ps(x, 0x4E));
  return _mm512_max_ps(x, _mm512_permute_ps(x, 0xB1));
}

// 127 / am where am > 0, else 0, broadcast, and am / 127 (am: lane 0 of a BroadcastMax): a row's
// int8 scale and its inverse, the reference's (scalar) divisions.
inline __m512 Inv127(__m512 bm) {
  const float am = _mm512_cvtss_f32(bm);
  return _mm512_set1_ps(am > 0.0f ? 127.0f / am : 0.0f);
}
inline float Scale127(__m512 bm) { return _mm512_cvtss_f32(bm) / 127.0f; }

// The int32 lanes of x0 .. x3 (values in [-127, 127]) as 64 bytes, x0's 16 first: two saturating
// packs put, in each 128-bit lane L, dims 4L .. 4L + 3 of x0, x1, x2, x3 side by side, and a dword
// permutation restores the order (one 64-byte store instead of four vpmovdb and stores).
inline __m512i PackBytes4(__m512i x0, __m512i x1, __m512i x2, __m512i x3) {
  const __m512i b = _mm512_packs_epi16(_mm512_packs_epi32(x0, x1), _mm512_packs_epi32(x2, x3));
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), b);
}

// Bytes [0, n) of b to dst (n <= 64 is the row's remainder; whole 64-byte stores where it allows).
inline void StoreBytes(void* dst, __m512i b, int n) {
  if (n >= 64) _mm512_storeu_si512(dst, b);
  else _mm512_mask_storeu_epi8(dst, (__mmask64{1} << n) - 1, b);
}

// A row of `chunks` x 16 values quantised (x[c] * inv rounded to nearest even, as int8, xor
// `bias`) into dst's first n bytes (n <= 16 chunks: the row's dp), four chunks per store; returns
// the int32 sums of the quantised values by lane. Lanes beyond the row's values must hold 0 in x.
inline __m512i QuantiseBytes(const __m512* x, int chunks, __m512 inv, __m512i bias, int8_t* dst, int n) {
  __m512i sum = _mm512_setzero_si512();
  ESTREAM_UNROLL
  for (int c0 = 0; c0 < chunks; c0 += 4) {
    __m512i xi[4];
    ESTREAM_UNROLL
    for (int k = 0; k < 4; ++k) {
      xi[k] = c0 + k < chunks ? _mm512_cvtps_epi32(_mm512_mul_ps(x[c0 + k], inv)) : _mm512_setzero_si512();
      sum = _mm512_add_epi32(sum, xi[k]);
    }
    StoreBytes(dst + 16 * c0, _mm512_xor_si512(PackBytes4(xi[0], xi[1], xi[2], xi[3]), bias), n - 16 * c0);
  }
  return sum;
}

// 2^x for x <= 0 or -inf (below 2^-125 exactly 0) as the fp32 kernel's (ops_avx512.cc) but with a
// degree-3 polynomial (relative error 1.0e-4; P is rounded to 8 bits after it): its FMAs share
// vpdpbusd's pipes, and a fourth cost the P phase 10% (Qwen3 and OLMoE shapes, T = 1024).
// LowpExp2Short in ref/ gives the same bits: the reference clamps x at -126 first, which changes
// nothing here, where the lanes below -125 (-inf, NaN: the compare is false) are zeroed by the
// mask whatever the polynomial made of them.
inline __m512 Exp2Short(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(5.500895903e-02f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.422113717e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.932829618e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

// One Q8A block (32 values) of each of n <= 16 queries, from the 32 dims' rows of OT (dim r at
// src + r * lds, query i in lane i), into dst[i * ldd]: QuantizeRowQ8A's bits (the same max, the
// same two divisions, products rounded to nearest even), with the block's max, scale and sums as
// per-lane vector operations instead of reductions across a row. The bytes: every 4 dims packed
// into one word per query (packs, then a byte shuffle within each 128-bit lane), then the 8 words
// of a query gathered by a 16 x 8 word transpose.
inline void QuantiseQ8ABlock16(const float* src, int64_t lds, int n, BlockQ8A* dst, int64_t ldd) {
  __m512 amax = _mm512_setzero_ps();
  ESTREAM_UNROLL
  for (int r = 0; r < kQK8A; ++r) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(src + r * lds)));
  const __m512 c127 = _mm512_set1_ps(127.0f);
  const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_NEQ_OQ), c127, amax);
  // Per 128-bit lane, packs leave bytes [dim 4m + k of queries 0..3] at 4 k + j: to 4 j + k.
  const __m512i order = _mm512_set4_epi32(0x0F0B0703, 0x0E0A0602, 0x0D090501, 0x0C080400);
  __m512i w[8], sum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  ESTREAM_UNROLL
  for (int m = 0; m < 8; ++m) {
    __m512i q[4];
    ESTREAM_UNROLL
    for (int k = 0; k < 4; ++k) {
      q[k] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(src + (4 * m + k) * lds), inv));
      sum[m / 4] = _mm512_add_epi32(sum[m / 4], q[k]);
    }
    w[m] = _mm512_shuffle_epi8(
        _mm512_packs_epi16(_mm512_packs_epi32(q[0], q[1]), _mm512_packs_epi32(q[2], q[3])), order);
  }
  // Query 4 L + j (128-bit lane L): words 0-3 in lane L of u[j], words 4-7 in lane L of u[4 + j].
  alignas(64) uint32_t u[8][16];
  ESTREAM_UNROLL
  for (int h = 0; h < 2; ++h) {
    const __m512i* wh = w + 4 * h;
    const __m512i t0 = _mm512_unpacklo_epi32(wh[0], wh[1]), t1 = _mm512_unpackhi_epi32(wh[0], wh[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(wh[2], wh[3]), t3 = _mm512_unpackhi_epi32(wh[2], wh[3]);
    _mm512_store_si512(u[4 * h + 0], _mm512_unpacklo_epi64(t0, t2));
    _mm512_store_si512(u[4 * h + 1], _mm512_unpackhi_epi64(t0, t2));
    _mm512_store_si512(u[4 * h + 2], _mm512_unpacklo_epi64(t1, t3));
    _mm512_store_si512(u[4 * h + 3], _mm512_unpackhi_epi64(t1, t3));
  }
  alignas(64) float scale[16];
  alignas(64) uint32_t sums[16];
  _mm512_store_ps(scale, _mm512_div_ps(amax, c127));
  _mm512_store_si512(sums, _mm512_or_si512(_mm512_and_si512(sum[0], _mm512_set1_epi32(0xFFFF)),
                                           _mm512_slli_epi32(sum[1], 16)));
  for (int i = 0; i < n; ++i) {
    BlockQ8A* y = dst + i * ldd;
    const int lane = 4 * (i / 4), j = i % 4;
    std::memcpy(&y->d, &scale[i], 4);
    std::memcpy(y->sum, &sums[i], 4);
    std::memcpy(y->qs, &u[j][lane], 16);
    std::memcpy(y->qs + 16, &u[4 + j][lane], 16);
  }
}

// 16 x 16 transpose for TransposeBlock (attention_x86_impl.h), as in ops_avx512.cc but without
// the scale (always 1 here: the last PvTile already divided O by l). kStream: each output row's
// 64 bytes as one non-temporal store where the rows are 64-byte aligned (finish_tile says when).
template <bool kStream>
struct TransposeTraits {
  static constexpr int kLanes = 16;
  static void Transpose(const float* src, int64_t lds, float /*scale*/, float* dst, int64_t ldd) {
    __m512 r[16], t[16];
    ESTREAM_UNROLL
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
    ESTREAM_UNROLL
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    ESTREAM_UNROLL
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
      r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
      r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
      r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    ESTREAM_UNROLL
    for (int j = 0; j < 4; ++j) {
      t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
      t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
      t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
      t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    }
    auto store = [](float* p, __m512 x) {
      if constexpr (kStream) _mm512_stream_ps(p, x);
      else _mm512_storeu_ps(p, x);
    };
    ESTREAM_UNROLL
    for (int j = 0; j < 4; ++j) {
      store(dst + (j + 0) * ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88));
      store(dst + (j + 8) * ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD));
      store(dst + (j + 4) * ldd, _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88));
      store(dst + (j + 12) * ldd, _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD));
    }
  }
};

// dst[c * ldd + r] = src[r * lds + c] for 16 rows and n columns of 32-bit words: the bits are
// moved, never computed on (TransposeTraits' shuffles, the ragged columns copied one by one).
void TransposeWords16(const uint32_t* src, int lds, int n, uint32_t* dst, int ldd) {
  int c = 0;
  for (; c + 16 <= n; c += 16)
    TransposeTraits<false>::Transpose(reinterpret_cast<const float*>(src + c), lds, 1.0f,
                                      reinterpret_cast<float*>(dst + static_cast<size_t>(c) * ldd), ldd);
  for (; c < n; ++c)
    for (int r = 0; r < 16; ++r) dst[static_cast<size_t>(c) * ldd + r] = src[static_cast<size_t>(r) * lds + c];
}

// Per-thread scratch, grown to the largest (head_dim, tiles) seen. Per tile: Q4 (u8, [dp/4][64][4]),
// its 16 rows being quantised (u8, [16][dp]), sq, m, l (64 floats each), OT (fp32 [d][64]). Shared
// by the tiles: ST ([64 keys][64] fp32) and P4 ([16 key quads][64] u8 quads).
struct LowpScratch {
  AlignedPtr<uint8_t> q4, q_rows;
  AlignedPtr<float> state, ot, st;
  AlignedPtr<uint32_t> p4;
  int cap_d = 0, cap_tiles = 0;

  static size_t Bytes(int d, int tiles) {
    const size_t dp = (static_cast<size_t>(d) + 3) / 4 * 4;
    return static_cast<size_t>(tiles) *
               ((kLowpRows + 16) * dp + sizeof(float) * (3 * kLowpRows + static_cast<size_t>(d) * kLowpRows)) +
           sizeof(float) * kLowpSpanKeys * kLowpRows + sizeof(uint32_t) * (kLowpSpanKeys / 4) * kLowpRows;
  }
  void Reserve(int d, int tiles) {
    if (d <= cap_d && tiles <= cap_tiles) return;
    cap_d = std::max(d, cap_d);
    cap_tiles = std::max(tiles, cap_tiles);
    const size_t dp = (static_cast<size_t>(cap_d) + 3) / 4 * 4;
    q4 = AllocAligned<uint8_t>(dp * kLowpRows * cap_tiles);
    q_rows = AllocAligned<uint8_t>(dp * 16 * cap_tiles);
    state = AllocAligned<float>(static_cast<size_t>(3) * kLowpRows * cap_tiles);
    ot = AllocAligned<float>(static_cast<size_t>(cap_d) * kLowpRows * cap_tiles);
    if (st == nullptr) {
      st = AllocAligned<float>(static_cast<size_t>(kLowpSpanKeys) * kLowpRows);
      p4 = AllocAligned<uint32_t>(static_cast<size_t>(kLowpSpanKeys / 4) * kLowpRows);
    }
  }
};

// ST rows j .. j + R of a block against the tile's 64 queries. Not inlined, and vpdpbusd as
// inline asm with the accumulator tied ("+v"): GCC 12 emits the intrinsic with an untied
// accumulator and, inlined into the block's loop, copied each accumulator through another register
// (about two vmovdqa per vpdpbusd) and spilled one; as asm inside the inlined loop it kept all 16
// accumulators on the stack (the cause of the slow asm attempt in docs/PERFORMANCE.md). Out of line,
// the asm loop holds them in registers (the result is the same integer sum). Query vectors below
// C0 are skipped (their ST rows keep whatever they held): on the diagonal, the keys come after
// every query of those vectors, and the causal mask sets their scores to -inf.
template <int R, int C0>
__attribute__((noinline)) void QkTile(const int8_t* ki, int dp, const int32_t* corr, const float* sk,
                                      const uint8_t* q4, const __m512* sq, float* st) {
  __m512i acc[R][kVecs];
  ESTREAM_UNROLL
  for (int r = 0; r < R; ++r)
    ESTREAM_UNROLL
    for (int c = C0; c < kVecs; ++c) acc[r][c] = _mm512_setzero_si512();
  for (int d4 = 0; d4 < dp / 4; ++d4) {
    __m512i q[kVecs];
    ESTREAM_UNROLL
    for (int c = C0; c < kVecs; ++c) q[c] = _mm512_loadu_si512(q4 + (d4 * kLowpRows + c * 16) * 4);
    ESTREAM_UNROLL
    for (int r = 0; r < R; ++r) {
      int32_t w;
      std::memcpy(&w, ki + r * dp + 4 * d4, 4);
      const __m512i kb = _mm512_set1_epi32(w);
      ESTREAM_UNROLL
      for (int c = C0; c < kVecs; ++c) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc[r][c]) : "v"(q[c]), "v"(kb));
    }
  }
  ESTREAM_UNROLL
  for (int r = 0; r < R; ++r) {
    const __m512i cr = _mm512_set1_epi32(corr[r]);
    const __m512 skr = _mm512_set1_ps(sk[r]);
    ESTREAM_UNROLL
    for (int c = C0; c < kVecs; ++c)
      _mm512_storeu_ps(st + r * kLowpRows + c * 16,
                       _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][c], cr)), _mm512_mul_ps(sq[c], skr)));
  }
}

// How PvTile combines a span's product with OT: kFirst, the tile's first span: the
// product alone (OT not read: the scratch is never cleared); kAdd: OT + product (no lane of the
// tile rescales: alpha is 1 in all of them, and O * 1 = O exactly); kRescale: OT alpha + product.
enum class PvMode { kFirst, kAdd, kRescale };

// OT rows c0 .. c0 + R (head dims) = OT alpha + float(sum over the span's key quads of P4 . VQ) g:
// P4 u8 (4 keys per lane), VQ the s8 quad of the dim broadcast (block A's quads in vq_a, block
// B's in vq_b; null where the span has one block); per 4 keys one vpdpbusd per
// accumulator (inline asm, out of line, for the reason given at QkTile). Query vector c takes the
// quads below lim[c] (non-decreasing in c): past it, every key comes after the vector's queries
// and its P is 0, so that the skipped products add nothing and the sums are the same. kDiag: lim
// may differ by vector (the span of the diagonal), else every vector takes lim[kVecs - 1] quads in
// one loop (a separate instantiation: the loop in four parts cost the other blocks ~3%). kMode: as
// PvMode says; kLast: the tile's last span, the result stored times inv_l (1 / l): the
// normalisation without a pass of its own.
template <int R, PvMode kMode, bool kLast, bool kDiag>
__attribute__((noinline)) void PvTile(const uint32_t* vq_a, const uint32_t* vq_b, int d, const uint32_t* p4,
                                      const int* lim, const __m512* alpha, const __m512* g, const __m512* inv_l,
                                      float* ot) {
  __m512i acc[R][kVecs];
  ESTREAM_UNROLL
  for (int r = 0; r < R; ++r)
    ESTREAM_UNROLL
    for (int c = 0; c < kVecs; ++c) acc[r][c] = _mm512_setzero_si512();
  // Quads [p_begin, p_end) of the span for the vectors C0 and above, V's quad p from block A's
  // (vq_a) below kBlockQuads and from block B's (vq_b) after (one select per quad: a second loop
  // in a nested lambda put GCC 12's accumulators on the stack).
  constexpr int kBlockQuads = kLowpKeys / 4;
  auto quads = [&]<int C0>(int p_begin, int p_end) __attribute__((always_inline)) {
    for (int p = p_begin; p < p_end; ++p) {
      const uint32_t* vq = p < kBlockQuads ? vq_a + p * d : vq_b + (p - kBlockQuads) * d;
      __m512i pv[kVecs];
      ESTREAM_UNROLL
      for (int c = C0; c < kVecs; ++c) pv[c] = _mm512_loadu_si512(p4 + p * kLowpRows + c * 16);
      ESTREAM_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m512i vv = _mm512_set1_epi32(static_cast<int>(vq[r]));
        ESTREAM_UNROLL
        for (int c = C0; c < kVecs; ++c) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc[r][c]) : "v"(pv[c]), "v"(vv));
      }
    }
  };
  static_assert(kVecs == 4);
  if constexpr (kDiag) {
    quads.template operator()<0>(0, lim[0]);
    quads.template operator()<1>(lim[0], lim[1]);
    quads.template operator()<2>(lim[1], lim[2]);
    quads.template operator()<3>(lim[2], lim[3]);
  } else {
    quads.template operator()<0>(0, lim[3]);
  }
  ESTREAM_UNROLL
  for (int r = 0; r < R; ++r) {
    ESTREAM_UNROLL
    for (int c = 0; c < kVecs; ++c) {
      const __m512 x = _mm512_cvtepi32_ps(acc[r][c]);
      float* o_rc = ot + r * kLowpRows + c * 16;
      __m512 o;
      if constexpr (kMode == PvMode::kFirst) o = _mm512_mul_ps(x, g[c]);
      else if constexpr (kMode == PvMode::kAdd) o = _mm512_fmadd_ps(x, g[c], _mm512_loadu_ps(o_rc));
      else o = _mm512_fmadd_ps(x, g[c], _mm512_mul_ps(_mm512_loadu_ps(o_rc), alpha[c]));
      if (kLast) o = _mm512_mul_ps(o, inv_l[c]);
      _mm512_storeu_ps(o_rc, o);
    }
  }
}

// P of one query vector (16 lanes) over the nk keys of a block, as u8 quads into p4 (one word
// per lane and 4 keys, rows kLowpRows words apart), and the sum of e = 2^(S - bx) over the keys
// (in key order). P_j = rne(e_j f_j) where kFull (every lane sees the whole block: f_j = sv_j 255
// / M, one number per key), else rne(e_j (sv_j inv)) with inv the lanes' 255 / M. One query
// vector at a time, so that a quad's four P vectors stay in registers until they are packed
// (all four query vectors of a quad at once spilled them, and tested kFull per vector).
template <bool kFull>
inline __m512 PQuads(const float* st, int nk, __m512 bx, __m512 inv, const float* f, uint32_t* p4) {
  // Two saturating packs put, in each 128-bit lane, key k's 4 queries at bytes 4k .. 4k + 3, and a
  // byte shuffle turns that 4 x 4 around (query i's key k at byte 4i + k).
  const __m512i quad_order =
      _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  __m512 sum = _mm512_setzero_ps();
  auto p_of = [&](int j) {
    const __m512 e = Exp2Short(_mm512_sub_ps(_mm512_loadu_ps(st + j * kLowpRows), bx));
    sum = _mm512_add_ps(sum, e);
    const __m512 fj = _mm512_set1_ps(f[j]);
    return _mm512_cvtps_epi32(_mm512_mul_ps(e, kFull ? fj : _mm512_mul_ps(fj, inv)));
  };
  auto store = [&](int p, __m512i p0, __m512i p1, __m512i p2, __m512i p3) {
    const __m512i w = _mm512_packus_epi16(_mm512_packus_epi32(p0, p1), _mm512_packus_epi32(p2, p3));
    _mm512_storeu_si512(p4 + p * kLowpRows, _mm512_shuffle_epi8(w, quad_order));
  };
  int p = 0;
  for (; 4 * p + 4 <= nk; ++p) {
    const __m512i p0 = p_of(4 * p), p1 = p_of(4 * p + 1), p2 = p_of(4 * p + 2), p3 = p_of(4 * p + 3);
    store(p, p0, p1, p2, p3);
  }
  if (4 * p < nk) {  // the last, partial quad: keys past nk are 0
    const __m512i zero = _mm512_setzero_si512();
    const int kk = nk - 4 * p;
    const __m512i p0 = p_of(4 * p);
    const __m512i p1 = kk > 1 ? p_of(4 * p + 1) : zero;
    const __m512i p2 = kk > 2 ? p_of(4 * p + 2) : zero;
    store(p, p0, p1, p2, zero);
  }
  return sum;
}

// AttentionLowpConvertKvBlocksAvx512 with kChunks = (head_dim + 15) / 16 as a constant (loops
// unrolled, a key's row in registers), or 0 for any head_dim.
template <int kChunks>
void ConvertKvBlocks(const AttentionArgs& a, int kv_head, int block_begin, int block_end, uint16_t* kv) {
  const LowpLayout L(a.head_dim);
  const int d = a.head_dim, T = a.n_tokens;
  const float* k_head = a.k + static_cast<int64_t>(kv_head) * d;
  const float* v_head = a.v + static_cast<int64_t>(kv_head) * d;
  constexpr int kMaxChunks = 512 / 16;  // head_dim <= 512
  constexpr int kAhead = 32;  // keys
  const int chunks = kChunks > 0 ? kChunks : (d + 15) / 16;
  ESTREAM_CHECK(chunks <= kMaxChunks, "low-precision attention: head_dim above 512");
  // mu, once for the range: per block it re-read the first 64 keys' rows (~17% of the
  // conversion, OLMoE shape, T = 1024; docs/PERFORMANCE.md).
  __m512 mu[kMaxChunks];
  ESTREAM_UNROLL
  for (int c = 0; c < chunks; ++c) mu[c] = _mm512_setzero_ps();
  const int ns = LowpMeanKeys(a);
  for (int s = 0; s < ns; ++s) {
    const float* kr = k_head + static_cast<int64_t>(s) * a.ldk;
    ESTREAM_UNROLL
    for (int c = 0; c < chunks; ++c)
      mu[c] = _mm512_add_ps(mu[c], _mm512_maskz_loadu_ps(Tail16(d - 16 * c), kr + 16 * c));
  }
  const __m512 nsv = _mm512_set1_ps(static_cast<float>(ns));
  ESTREAM_UNROLL
  for (int c = 0; c < chunks; ++c) mu[c] = _mm512_div_ps(mu[c], nsv);
  for (int block = block_begin; block < block_end; ++block) {
    uint8_t* blk = reinterpret_cast<uint8_t*>(kv) + static_cast<size_t>(block) * L.block_bytes;
    int8_t* ki = reinterpret_cast<int8_t*>(blk);
    int32_t* corr = reinterpret_cast<int32_t*>(blk + L.corr);
    float* sk = reinterpret_cast<float*>(blk + L.sk);
    uint32_t* vb = reinterpret_cast<uint32_t*>(blk + L.vb);
    // Key by key: K quantised, and V's scale; after every 4 keys their V quad, while the rows are
    // in L1. Rows are a.ldk / a.ldv floats apart (all heads of a token together: a page or more),
    // which the hardware prefetchers do not follow, so both rows go to L2 kAhead keys ahead (into
    // the next block near the end: a thread converts consecutive blocks of a head). To L2, not L1:
    // rows a multiple of 4 KiB apart share L1 sets, and 64 rows in flight would evict each other.
    // Without it the loads were 75% of the conversion and the conversion 27% of the kernel
    // (OLMoE shape, T = 1024, 1 thread; docs/PERFORMANCE.md).
    float* sv = reinterpret_cast<float*>(blk + L.sv);
    const int nk = std::clamp(T - block * kLowpKeys, 0, kLowpKeys);
    for (int p = 0; p < kLowpKeys / 4; ++p) {
      __m512 vinv[4];
      for (int k = 0; k < 4; ++k) {
        const int j = 4 * p + k, key = block * kLowpKeys + j;
        int8_t* row = ki + static_cast<size_t>(j) * L.dp;
        vinv[k] = _mm512_setzero_ps();
        if (key >= T) {
          std::memset(row, 0, L.dp);
          corr[j] = 0;
          sk[j] = 0.0f;
          sv[j] = 0.0f;
          continue;
        }
        const float* kr = k_head + static_cast<int64_t>(key) * a.ldk;
        const float* vr = v_head + static_cast<int64_t>(key) * a.ldv;
        if (key + kAhead < T)
          ESTREAM_UNROLL
          for (int c = 0; c < chunks; ++c) {
            _mm_prefetch(reinterpret_cast<const char*>(kr + kAhead * a.ldk + 16 * c), _MM_HINT_T1);
            _mm_prefetch(reinterpret_cast<const char*>(vr + kAhead * a.ldv + 16 * c), _MM_HINT_T1);
          }
        __m512 kc[kMaxChunks];
        __m512 amax = _mm512_setzero_ps(), vmax = _mm512_setzero_ps();
        ESTREAM_UNROLL
        for (int c = 0; c < chunks; ++c) {
          const __mmask16 m = Tail16(d - 16 * c);
          kc[c] = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, kr + 16 * c), mu[c]);
          amax = _mm512_max_ps(amax, _mm512_abs_ps(kc[c]));
          vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, vr + 16 * c)));
        }
        const __m512 am = BroadcastMax(amax);
        const __m512i sum = QuantiseBytes(kc, chunks, Inv127(am), _mm512_setzero_si512(), row, L.dp);
        corr[j] = 128 * _mm512_reduce_add_epi32(sum);
        sk[j] = Scale127(am);
        // V as s8 per key: sv = max |v| / 127 over its dims (LowpLayout).
        const __m512 vm = BroadcastMax(vmax);
        vinv[k] = Inv127(vm);
        sv[j] = Scale127(vm);
      }
      // The quad's V, 4 keys per word (keys beyond the sequence 0).
      const int kk = std::clamp(nk - 4 * p, 0, 4);
      const float* v0 = v_head + static_cast<int64_t>(block * kLowpKeys + 4 * p) * a.ldv;
      // Two saturating packs put, in each 128-bit lane, key k's 4 dims at bytes 4k .. 4k + 3, and a
      // byte shuffle turns that 4 x 4 around (dim i's key k at byte 4i + k), as PQuads does for P.
      const __m512i quad_order =
          _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
      // kFull: all four keys in the sequence (every quad but the last, partial one).
      auto quad = [&]<bool kFull>() __attribute__((always_inline)) {
        ESTREAM_UNROLL
        for (int c = 0; c < chunks; ++c) {
          const __mmask16 m = Tail16(d - 16 * c);
          __m512i x[4];
          ESTREAM_UNROLL
          for (int k = 0; k < 4; ++k)
            x[k] = kFull || k < kk ? _mm512_cvtps_epi32(_mm512_mul_ps(
                                         _mm512_maskz_loadu_ps(m, v0 + static_cast<int64_t>(k) * a.ldv + 16 * c),
                                         vinv[k]))
                                   : _mm512_setzero_si512();
          const __m512i w = _mm512_shuffle_epi8(
              _mm512_packs_epi16(_mm512_packs_epi32(x[0], x[1]), _mm512_packs_epi32(x[2], x[3])), quad_order);
          uint32_t* dst = vb + static_cast<size_t>(p) * d + 16 * c;
          if (16 * c + 16 <= d) _mm512_storeu_si512(dst, w);  // masked stores only in the last, partial chunk
          else _mm512_mask_storeu_epi32(dst, m, w);
        }
      };
      if (kk == 4) quad.template operator()<true>();
      else quad.template operator()<false>();
    }
    // pm: the running maximum in a register (through memory, each key waited on the last store).
    float pm = 0.0f;
    for (int j = 0; j < kLowpKeys; ++j) sv[kLowpKeys + j] = pm = std::max(pm, sv[j]);
  }
}

}  // namespace

void AttentionLowpConvertKvBlocksAvx512(const AttentionArgs& a, int kv_head, int block_begin, int block_end,
                                        uint16_t* kv) {
  if ((a.head_dim + 15) / 16 == 8) ConvertKvBlocks<8>(a, kv_head, block_begin, block_end, kv);  // as quantise_row
  else ConvertKvBlocks<0>(a, kv_head, block_begin, block_end, kv);
}

void AttentionLowpConvertKvAvx512(const AttentionArgs& a, int kv_head, int block, uint16_t* kv) {
  AttentionLowpConvertKvBlocksAvx512(a, kv_head, block, block + 1, kv);
}

size_t AttentionLowpScratchBytes(int head_dim, int tiles) { return LowpScratch::Bytes(head_dim, tiles); }

namespace {

// Query rows [t_begin, t_end) of heads [head_begin, head_end): a group of one call.
struct LowpGroup {
  int head_begin, head_end, t_begin, t_end;
};

// One group of at most 8 tiles (AttentionBlockLowpAvx512); `next` (or nullptr) is the group the
// same call runs after it, whose Q rows it prefetches during its last key blocks.
void LowpGroupAvx512(const AttentionArgs& a, const uint16_t* kv, const LowpGroup& g, const LowpGroup* next) {
  constexpr int kQ = kLowpRows;
  const int head_begin = g.head_begin, head_end = g.head_end, t_begin = g.t_begin, t_end = g.t_end;
  const LowpLayout L(a.head_dim);
  const int d = a.head_dim, dp = L.dp;
  const int row_tiles = (t_end - t_begin + kQ - 1) / kQ;
  const int n_heads = head_end - head_begin;
  const int n_tiles = row_tiles * n_heads;
  thread_local LowpScratch scratch;
  scratch.Reserve(d, n_tiles);
  float* st = scratch.st.get();
  uint32_t* p4 = scratch.p4.get();
  const float q_scale = a.scale * kLog2eF;
  const size_t q4_bytes = static_cast<size_t>(dp) * kQ;
  // Tile x: head head_begin + x % n_heads, rows from q0s[x] (the last rows first); looked up, not
  // divided, on every Q row and step.
  ESTREAM_CHECK(n_tiles <= kGroupTiles, "low-precision attention: group of more than 8 tiles");
  int heads[kGroupTiles], q0s[kGroupTiles];
  for (int x = 0; x < n_tiles; ++x) {
    heads[x] = head_begin + x % n_heads;
    q0s[x] = t_begin + (row_tiles - 1 - x / n_heads) * kQ;
  }
  auto tile_head = [&](int x) { return heads[x]; };
  auto tile_q0 = [&](int x) { return q0s[x]; };
  auto tile_q4 = [&](int x) { return scratch.q4.get() + x * q4_bytes; };
  auto tile_sq = [&](int x) { return scratch.state.get() + static_cast<size_t>(3 * x) * kQ; };
  auto tile_m = [&](int x) { return tile_sq(x) + kQ; };
  auto tile_l = [&](int x) { return tile_sq(x) + 2 * kQ; };
  auto tile_ot = [&](int x) { return scratch.ot.get() + static_cast<size_t>(x) * d * kQ; };

  const int chunks = (d + 15) / 16;
  auto q_row = [&](int x, int i) {
    return a.q + static_cast<int64_t>(tile_q0(x) + i) * a.ldq + static_cast<int64_t>(tile_head(x)) * d;
  };
  // Row i of tile x: qi + 128 as u8 (dp bytes) into `row`, and sq_i. This function's lambdas are
  // always_inline: GCC 12 left this one and start_tiles out of line once the function grew (the
  // diagonal block's steps), and Q's quantisation then took ~60% longer.
  // kChunks: chunks as a constant (the head_dim 128 of the models: loops unrolled, Q's row in
  // registers), or 0 for any.
  auto quantise_row = [&]<int kChunks>(int x, int i, uint8_t* row) __attribute__((always_inline)) {
    float* sq = tile_sq(x);
    if (tile_q0(x) + i >= t_end) {
      std::memset(row, 0x80, dp);
      sq[i] = 0.0f;
      return;
    }
    const int nc = kChunks > 0 ? kChunks : chunks;
    const float* q = q_row(x, i);
    __m512 qs[512 / 16];
    __m512 amax = _mm512_setzero_ps();
    ESTREAM_UNROLL
    for (int c = 0; c < nc; ++c) {
      qs[c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(Tail16(d - 16 * c), q + 16 * c), _mm512_set1_ps(q_scale));
      amax = _mm512_max_ps(amax, _mm512_abs_ps(qs[c]));
    }
    const __m512 am = BroadcastMax(amax);
    // qi + 128 as u8: the s8 bytes with the sign bit flipped.
    QuantiseBytes(qs, nc, Inv127(am), _mm512_set1_epi8(static_cast<char>(0x80)), reinterpret_cast<int8_t*>(row), dp);
    sq[i] = Scale127(am);
  };
  // Every tile's Q quantised before the first key block, row by row across the tiles (a GQA
  // group's heads of one row are adjacent in memory), the rows kAhead further on prefetched: the
  // strided Q rows are usually not cached, and loading them on demand tile by tile stalled (~13%
  // of the kernel at T = 1024, Qwen3 shape, 1 thread, with a one-tile-ahead prefetch). Rows are
  // quantised 16 at a time into the tile's q_rows and then turned into Q4's layout (query i's 4
  // dims d4 at word d4 * 64 + i) by 16 x 16 word transposes: written word by word, the layout
  // took ~8% of the group's own time at T = 1024 (Qwen3 shape, 1 thread).
  auto start_tiles = [&]() __attribute__((always_inline)) {
    constexpr int kAhead = 4;
    const size_t rows_bytes = static_cast<size_t>(16) * dp;
    for (int i0 = 0; i0 < kQ; i0 += 16) {
      for (int i = i0; i < i0 + 16; ++i) {
        for (int x = 0; x < n_tiles; ++x) {
          if (i + kAhead < kQ && tile_q0(x) + i + kAhead < t_end) {
            const float* qa = q_row(x, i + kAhead);
            for (int c = 0; c < d; c += 16) _mm_prefetch(reinterpret_cast<const char*>(qa + c), _MM_HINT_T0);
          }
          uint8_t* row = scratch.q_rows.get() + x * rows_bytes + static_cast<size_t>(i - i0) * dp;
          if (chunks == 8) quantise_row.template operator()<8>(x, i, row);
          else quantise_row.template operator()<0>(x, i, row);
        }
      }
      for (int x = 0; x < n_tiles; ++x)
        TransposeWords16(reinterpret_cast<const uint32_t*>(scratch.q_rows.get() + x * rows_bytes), dp / 4, dp / 4,
                         reinterpret_cast<uint32_t*>(tile_q4(x)) + i0, kQ);
    }
    for (int x = 0; x < n_tiles; ++x) {
      std::fill(tile_m(x), tile_m(x) + kQ, -std::numeric_limits<float>::infinity());
      std::fill(tile_l(x), tile_l(x) + kQ, 0.0f);
    }
  };
  // out[q0 + i][c] = OT[c][i], OT already divided by l (the last block's PvTile). Where the
  // output is much larger than L2 (kStreamBytes) and its rows are 64-byte aligned, with
  // non-temporal stores: every 64 bytes written is one whole line of a row that no other store
  // of the call touches, and a plain store would first read the line from memory (5-8% of the
  // kernel at T = 1024, ~2% at 4096, Qwen3 and OLMoE shapes, 2 threads; docs/PERFORMANCE.md).
  // Row block by row block (16 queries, all their head dims): each output row's d floats are
  // written together, not in d / 16 passes over the tile's rows (the output phase 35-40% shorter,
  // T = 1024; interleaving the rows of several tiles finished together was slower).
  constexpr int64_t kStreamBytes = int64_t{8} << 20;
  const bool stream_out = static_cast<int64_t>(a.n_tokens - a.q_begin) * a.ldo * 4 >= kStreamBytes && a.ldo % 16 == 0;
  auto finish_tile = [&](int x) __attribute__((always_inline)) {
    const int q0 = tile_q0(x);
    const int nq = std::min(kQ, t_end - q0);
    float* ot = tile_ot(x);
    if (a.out_q8 != nullptr) {  // AttentionArgs::out_q8 (head_dim a multiple of 32: ops.cc)
      BlockQ8A* rows = a.out_q8 + static_cast<int64_t>(q0) * a.ldo_q8 + static_cast<int64_t>(tile_head(x)) * (d / 32);
      for (int c0 = 0; c0 < nq; c0 += 16)
        for (int b = 0; b < d / 32; ++b)
          QuantiseQ8ABlock16(ot + b * 32 * kQ + c0, kQ, std::min(16, nq - c0), rows + c0 * a.ldo_q8 + b, a.ldo_q8);
      return;
    }
    float* out_rows = a.out + static_cast<int64_t>(q0) * a.ldo + static_cast<int64_t>(tile_head(x)) * d;
    const bool stream = stream_out && reinterpret_cast<uintptr_t>(out_rows) % 64 == 0;
    for (int c0 = 0; c0 < nq; c0 += 16) {
      const int n = std::min(16, nq - c0);
      if (stream) TransposeBlock<TransposeTraits<true>>(ot + c0, kQ, d, n, 1.0f, out_rows + c0 * a.ldo, a.ldo);
      else TransposeBlock<TransposeTraits<false>>(ot + c0, kQ, d, n, 1.0f, out_rows + c0 * a.ldo, a.ldo);
    }
  };

  const __m512i lane_ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  // Per span (kLowpSpanKeys keys: key blocks A and B): pw = sv_j 255 / M of its full tiles (M the
  // span's largest V scale), span_sv / span_pm its V scales and their running maxima over the span
  // (for the tiles that see part of it); built once per span and group, when a tile needs them.
  alignas(64) float pw[kLowpSpanKeys], span_sv[kLowpSpanKeys], span_pm[kLowpSpanKeys];
  int pw_span = -1, arrays_span = -1;
  float pw_pm = 0.0f;  // M of span pw_span
  PhaseClock clock;  // ESTREAM_PHASE_TIMERS (kernels/phase_timer.h)
  start_tiles();
  clock.Mark(kPhaseQuantiseQ);
  // The next group's Q rows (contiguous heads of each row) go to L2 during this group's last
  // (tile, key block) steps, kPrefetchLines lines per step, so that its start_tiles finds them
  // there: without it the strided Q loads were ~7% of the kernel at T = 1024 (perf, 1 thread).
  constexpr int kPrefetchLines = 64;
  int64_t steps = 0, step = 0, next_row = 0, prefetch_from = 0;
  const int64_t next_row_bytes = next ? static_cast<int64_t>(next->head_end - next->head_begin) * d * 4 : 0;
  const int64_t next_rows = next ? next->t_end - next->t_begin : 0;
  const int lines_per_row = static_cast<int>((next_row_bytes + 63) / 64);
  if (next != nullptr) {
    for (int x = 0; x < n_tiles; ++x) steps += (std::min(t_end, tile_q0(x) + kQ) + kLowpSpanKeys - 1) / kLowpSpanKeys;
    const int64_t need = (next_rows * lines_per_row + kPrefetchLines - 1) / kPrefetchLines;
    prefetch_from = std::max<int64_t>(0, steps - need - 1);
  }
  auto prefetch_next = [&]() __attribute__((always_inline)) {
    if (next == nullptr || step++ < prefetch_from) return;
    for (int lines = 0; lines < kPrefetchLines && next_row < next_rows; ++next_row, lines += lines_per_row) {
      const char* r = reinterpret_cast<const char*>(a.q + (next->t_begin + next_row) * a.ldq +
                                                    static_cast<int64_t>(next->head_begin) * d);
      for (int64_t o = 0; o < next_row_bytes; o += 64) _mm_prefetch(r + o, _MM_HINT_T1);
    }
  };
  for (int kb = 0; kb < t_end; kb += kLowpSpanKeys) {
    // The span's key blocks: A (keys kb ..) and, where a row of the group sees key kb + 64, B.
    struct Block {
      const int8_t* ki;
      const int32_t* corr;
      const float *sk, *sv;
      const uint32_t* vb;
    } blocks[2] = {};
    const int n_blocks = kb + kLowpKeys < t_end ? 2 : 1;
    for (int b = 0; b < n_blocks; ++b) {
      const uint8_t* blk =
          reinterpret_cast<const uint8_t*>(kv) + static_cast<size_t>(kb / kLowpKeys + b) * L.block_bytes;
      blocks[b] = {reinterpret_cast<const int8_t*>(blk), reinterpret_cast<const int32_t*>(blk + L.corr),
                   reinterpret_cast<const float*>(blk + L.sk), reinterpret_cast<const float*>(blk + L.sv),
                   reinterpret_cast<const uint32_t*>(blk + L.vb)};
    }
    for (int x = 0; x < n_tiles; ++x) {
      const int q0 = tile_q0(x);
      const int q1 = std::min(t_end, q0 + kQ);
      if (kb >= q1) continue;
      const int nk = std::min(kLowpSpanKeys, q1 - kb);
      prefetch_next();
      clock.Mark(kPhasePrefetch);
      const uint8_t* q4 = tile_q4(x);
      __m512 sq[kVecs];
      ESTREAM_UNROLL
      for (int c = 0; c < kVecs; ++c) sq[c] = _mm512_loadu_ps(tile_sq(x) + c * 16);
      // Q.K^T block by block into ST's rows of the span. The diagonal block (kbb = q0, all 64
      // keys): query vector c sees key kbb + j only if j <= 16 c + 15, so the keys 16 s .. 16 s + 15
      // need the vectors from s on; the vectors below keep whatever ST held, and the causal mask
      // sets their scores to -inf. With fewer vectors a call takes more keys, so that it still
      // holds 12-16 accumulators (fewer wait on their own latency). The same for P.V below, by key
      // quad (lim).
      for (int b = 0; b < n_blocks; ++b) {
        const int kbb = kb + b * kLowpKeys;
        const int nkb = std::min(kLowpKeys, q1 - kbb);
        if (nkb <= 0) break;
        const Block& k = blocks[b];
        float* stb = st + static_cast<size_t>(b) * kLowpKeys * kQ;
        auto qk = [&]<int R, int C0>(int j0, int j1) __attribute__((always_inline)) {
          for (int j = j0; j < j1; j += R)
            QkTile<R, C0>(k.ki + static_cast<size_t>(j) * dp, dp, k.corr + j, k.sk + j, q4, sq, stb + j * kQ);
        };
        if (kbb == q0 && nkb == kLowpKeys) {
          static_assert(kVecs == 4 && kLowpKeys == 64);
          qk.template operator()<4, 0>(0, 16);
          qk.template operator()<4, 1>(16, 32);
          qk.template operator()<8, 2>(32, 48);
          qk.template operator()<16, 3>(48, 64);
        } else {
          ForTiles<kQkKeys>(nkb, [&]<int R>(int j) { qk.template operator()<R, 0>(j, j + R); });
        }
      }
      clock.Mark(kPhaseQk);
      // Causal mask: key kb + j is visible to query q0 + i iff kb + j <= q0 + i.
      for (int j = std::max(0, q0 - kb + 1); j < nk; ++j)
        ESTREAM_UNROLL
        for (int c = 0; c < kVecs; ++c) {
          float* s = st + j * kQ + c * 16;
          const __mmask16 below = _mm512_cmplt_epi32_mask(_mm512_add_epi32(_mm512_set1_epi32(c * 16), lane_ids),
                                                          _mm512_set1_epi32(kb + j - q0));
          _mm512_storeu_ps(s, _mm512_mask_mov_ps(_mm512_loadu_ps(s), below, neg_inf));
        }
      // Online softmax against the span's own maximum bx (per query): e = 2^(S - bx), c = 2^(bx
      // - m) its scale in units of the running max m, l grows by c sum e; m moves to bx only
      // where bx > m + kLowpRescale (alpha = 1 elsewhere: then, in all 64 lanes, the PV step adds
      // to OT without the product by alpha); the key's V scale is folded into P: with M the
      // largest sv the query sees in the span (span_pm of its last visible key), P = rne(e (sv 255
      // / M)) as u8 and g = c M / 255.
      __m512 m[kVecs], bx[kVecs], alpha[kVecs], cb[kVecs], sum[kVecs], g[kVecs], inv[kVecs];
      __mmask16 rescale_any = 0;
      ESTREAM_UNROLL
      for (int c = 0; c < kVecs; ++c) {
        m[c] = _mm512_loadu_ps(tile_m(x) + c * 16);
        bx[c] = neg_inf;
      }
      for (int j = 0; j < nk; ++j)
        ESTREAM_UNROLL
        for (int c = 0; c < kVecs; ++c) bx[c] = _mm512_max_ps(bx[c], _mm512_loadu_ps(st + j * kQ + c * 16));
      // Where every row sees the whole span (both blocks: all but the spans of the diagonal), M is
      // the span's largest V scale in every lane, and sv_j 255 / M is one number per key (pw,
      // computed once per span and group): no per-lane gather, division or product.
      const bool full = kb + kLowpSpanKeys <= q0 + 1;
      if (full && pw_span != kb) {
        // Block pm's last entries: the blocks' largest V scales.
        const float pm = std::max(blocks[0].sv[2 * kLowpKeys - 1], blocks[1].sv[2 * kLowpKeys - 1]);
        const __m512 inv_pm = _mm512_set1_ps(pm > 0.0f ? 255.0f / pm : 0.0f);
        ESTREAM_UNROLL
        for (int b = 0; b < 2; ++b)
          ESTREAM_UNROLL
          for (int j = 0; j < kLowpKeys; j += 16)
            _mm512_store_ps(pw + b * kLowpKeys + j, _mm512_mul_ps(_mm512_loadu_ps(blocks[b].sv + j), inv_pm));
        pw_span = kb;
        pw_pm = pm;
      }
      if (!full && arrays_span != kb) {
        // Block B's scales (0 without it), its running maxima continuing block A's.
        const __m512 a_max = _mm512_set1_ps(blocks[0].sv[2 * kLowpKeys - 1]);
        const bool b = n_blocks == 2;
        ESTREAM_UNROLL
        for (int j = 0; j < kLowpKeys; j += 16) {
          _mm512_store_ps(span_sv + j, _mm512_loadu_ps(blocks[0].sv + j));
          _mm512_store_ps(span_pm + j, _mm512_loadu_ps(blocks[0].sv + kLowpKeys + j));
          _mm512_store_ps(span_sv + kLowpKeys + j, b ? _mm512_loadu_ps(blocks[1].sv + j) : _mm512_setzero_ps());
          _mm512_store_ps(span_pm + kLowpKeys + j,
                          b ? _mm512_max_ps(a_max, _mm512_loadu_ps(blocks[1].sv + kLowpKeys + j)) : a_max);
        }
        arrays_span = kb;
      }
      ESTREAM_UNROLL
      for (int c = 0; c < kVecs; ++c) {
        const __mmask16 resc = _mm512_cmp_ps_mask(bx[c], _mm512_add_ps(m[c], _mm512_set1_ps(kLowpRescale)), _CMP_GT_OQ);
        rescale_any |= resc;
        const __m512 bm = _mm512_mask_mov_ps(m[c], resc, bx[c]);
        alpha[c] = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), resc, Exp2Short(_mm512_sub_ps(m[c], bx[c])));
        cb[c] = Exp2Short(_mm512_sub_ps(bx[c], bm));
        _mm512_storeu_ps(tile_m(x) + c * 16, bm);
        sum[c] = _mm512_setzero_ps();
        __m512 mu;
        if (full) {
          mu = _mm512_set1_ps(pw_pm);
        } else {
          // Lane i's last visible key: min(nk - 1, q0 + 16 c + i - kb); none when negative.
          const __m512i last = _mm512_min_epi32(_mm512_add_epi32(lane_ids, _mm512_set1_epi32(q0 + 16 * c - kb)),
                                                _mm512_set1_epi32(nk - 1));
          const __mmask16 sees = _mm512_cmpge_epi32_mask(last, _mm512_setzero_si512());
          mu = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), sees, last, span_pm, 4);
          const __mmask16 pos = _mm512_cmp_ps_mask(mu, _mm512_setzero_ps(), _CMP_GT_OQ);
          inv[c] = _mm512_maskz_div_ps(pos, _mm512_set1_ps(255.0f), mu);
        }
        g[c] = _mm512_mul_ps(_mm512_mul_ps(cb[c], mu), _mm512_set1_ps(1.0f / 255.0f));
      }
      clock.Mark(kPhaseSoftmax);
      // lim[c]: the key quads that query vector c sees (the last visible key q0 + 16 c + 15).
      // Rounding toward zero can only take a quad more, whose P is 0. Past lim[c] P is not
      // computed (its e would be 0: adding it leaves the sum as it is).
      const int nq4 = (nk + 3) / 4;
      int lim[kVecs];
      ESTREAM_UNROLL
      for (int c = 0; c < kVecs; ++c) lim[c] = std::clamp((q0 + 16 * c + 15 - kb) / 4 + 1, 0, nq4);
      ESTREAM_UNROLL
      for (int c = 0; c < kVecs; ++c) {
        const int nk_c = std::min(nk, 4 * lim[c]);
        sum[c] = full ? PQuads<true>(st + c * 16, nk_c, bx[c], _mm512_setzero_ps(), pw, p4 + c * 16)
                      : PQuads<false>(st + c * 16, nk_c, bx[c], inv[c], span_sv, p4 + c * 16);
      }
      const bool first = kb == 0, last = kb + kLowpSpanKeys >= q1;
      __m512 inv_l[kVecs];  // 1 / l, needed (and computed) in the tile's last key block only
      ESTREAM_UNROLL
      for (int c = 0; c < kVecs; ++c) {
        const __m512 l = _mm512_fmadd_ps(_mm512_loadu_ps(tile_l(x) + c * 16), alpha[c], _mm512_mul_ps(cb[c], sum[c]));
        _mm512_storeu_ps(tile_l(x) + c * 16, l);
        inv_l[c] = last ? _mm512_div_ps(_mm512_set1_ps(1.0f), l) : l;
      }
      clock.Mark(kPhaseP);
      float* ot = tile_ot(x);
      const bool diag = lim[0] < lim[kVecs - 1];
      auto pv = [&]<PvMode kMode, bool kLast>() {
        ForTiles<kPvDims>(d, [&]<int R>(int c0) {
          const uint32_t* vb_b = n_blocks == 2 ? blocks[1].vb + c0 : nullptr;
          if (diag) PvTile<R, kMode, kLast, true>(blocks[0].vb + c0, vb_b, d, p4, lim, alpha, g, inv_l, ot + c0 * kQ);
          else PvTile<R, kMode, kLast, false>(blocks[0].vb + c0, vb_b, d, p4, lim, alpha, g, inv_l, ot + c0 * kQ);
        });
      };
      auto pv_mode = [&]<bool kLast>() {
        if (first) pv.template operator()<PvMode::kFirst, kLast>();
        else if (rescale_any != 0) pv.template operator()<PvMode::kRescale, kLast>();
        else pv.template operator()<PvMode::kAdd, kLast>();
      };
      if (last) pv_mode.template operator()<true>();
      else pv_mode.template operator()<false>();
      clock.Mark(kPhasePv);
      if (last) {
        finish_tile(x);
        clock.Mark(kPhaseOutput);
      }
    }
  }
}

}  // namespace

void AttentionBlockLowpAvx512(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end, int t_begin,
                              int t_end) {
  constexpr int kQ = kLowpRows;
  // At most kGroupTiles tiles walk the key blocks together, so that their O (d x 64 fp32 each)
  // stays in L2; larger calls (the bf16 path's items hold up to 32 tiles) run as several groups.
  const int hs = std::min(head_end - head_begin, kGroupTiles);
  const int rs = std::max(1, kGroupTiles / hs) * kQ;
  LowpGroup groups[2];
  int n = 0;
  for (int h = head_begin; h < head_end; h += hs)
    for (int t = t_begin; t < t_end; t += rs) {
      groups[n % 2] = LowpGroup{h, std::min(head_end, h + hs), t, std::min(t_end, t + rs)};
      if (n > 0) LowpGroupAvx512(a, kv, groups[(n - 1) % 2], &groups[n % 2]);
      ++n;
    }
  if (n > 0) LowpGroupAvx512(a, kv, groups[(n - 1) % 2], nullptr);
  _mm_sfence();  // the streamed output stores (finish_tile) before the caller's barrier
}

void FillAttentionLowpAvx512(KernelTable* t) {
  SetAttentionLowp(t, AttentionLowpConvertKvBlocksAvx512, AttentionBlockLowpAvx512, AttentionLowpScratchBytes);
  t->attention_q8_bf16 = true;
}

}  // namespace estream::kernels

#undef ESTREAM_UNROLL
