// AVX2 low-precision attention (kernels/attention_lowp.h) for hosts without AVX-512:
// the same algorithm and the same converted K/V bytes as the AVX-512 kernel and the scalar
// reference, Q.K^T with the VEX vpdpbusd (_mm256_dpbusd_avx_epi32) on the same int8 operands, P.V
// in fp32 FMA on the same bf16-rounded P and V (AVX2 has no bf16 dot product: each bf16 value is
// widened exactly to fp32), fp32 online softmax. Every operation is the scalar reference's in the
// reference's order (P.V per key pair: the odd key, then the even one, as ref/ does; without AVX-VNNI
// Q.K^T on vpmaddubsw, the same int32 sums: LowpQkTile), so the outputs
// equal ref/attention_lowp_ref.cc's bit for bit (tests/attention_lowp_test.cc asserts it) and the
// error bound of attention_lowp.h holds unchanged.
// Loop structure as the AVX-512 kernel (queries in the vector lanes, 8 per ymm, 8 vectors = 64 per
// tile; the tiles of a call walk the key blocks in lockstep). With 16 ymm registers the micro-tiles
// cover 2 query vectors at a time:
//   QK step, per 6 keys x 2 query vectors: 12 int32 accumulators; per 4 head dims one vpdpbusd each,
//     Q as u8 (qi + 128, 4 dims per lane) and the key's 4 int8 dims broadcast.
//   PV step, per 6 head dims x 2 query vectors: 12 fp32 accumulators; per key one FMA each, P (fp32,
//     already rounded to bf16) and V's value for the dim broadcast from an fp32 copy of the block's
//     V (widened once per call and block by the first tile that reaches it).
// Selected (FillAvx2Ops) on every AVX2 host unless ESTREAM_ATTN_LOWP is "0". Without AVX-VNNI the
// int8 dot product takes vpsignb + vpmaddubsw + vpmaddwd + vpaddd per 32 multiply-adds: no more per
// instruction than fp32 FMA, but the multiplies use both integer multiply pipes (Zen 3: 1.22x the
// fp32 kernel at T = 4096 in the engine, equal at T = 1024; docs/PERFORMANCE.md).
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
#include "kernels/x86_avx2/avx2_traits.h"

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define ESTREAM_UNROLL _Pragma("GCC unroll 16")

namespace estream::kernels {
namespace {

constexpr float kLog2eF = 1.44269504088896340736f;
constexpr int kQ = kLowpRows;       // 64 queries per tile
constexpr int kVecs = kQ / 8;       // 8 query vectors per tile
constexpr int kGroup = 2;           // query vectors per register tile
// Keys per QK register tile: 6 x 2 accumulators with vpdpbusd; 4 x 2 without it (the signed and
// absolute Q, the sign-fixed key and the int16 products take four more of the 16 registers).
constexpr int QkKeys(bool vnni) { return vnni ? 6 : 4; }
constexpr int kPvDims = 6;          // head dims per PV register tile (6 x 2 accumulators)
constexpr int kMaxChunks = 512 / 8;  // head_dim <= 512

// fp32 -> bf16 bits in the low 16 bits of each lane, round to nearest even (as Bf16Bits in ref/).
inline __m256i Bf16Round(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
}
// x rounded to bf16 and widened back to fp32 (exact).
inline __m256 RoundToBf16(__m256 x) { return _mm256_castsi256_ps(_mm256_slli_epi32(Bf16Round(x), 16)); }

inline __m256 Abs(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

// 8 floats or int32 at p, of which the first n (>= 1) are in the row: a plain load or store for a
// whole chunk, the masked one only for a row's last, partial chunk (vmaskmov stores are microcoded
// on AMD Zen: a store per chunk of K and V made the conversion ~20% of the kernel at T = 1024).
inline __m256 LoadRow(const float* p, int n) { return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, TailMask(n)); }
inline __m256i LoadRow(const uint32_t* p, int n) {
  return n >= 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                : _mm256_maskload_epi32(reinterpret_cast<const int*>(p), TailMask(n));
}
inline void StoreRow(float* p, __m256 x, int n) {
  if (n >= 8) {
    _mm256_storeu_ps(p, x);
  } else {
    _mm256_maskstore_ps(p, TailMask(n), x);
  }
}
inline void StoreRow(uint32_t* p, __m256i x, int n) { StoreRow(reinterpret_cast<float*>(p), _mm256_castsi256_ps(x), n); }

inline int32_t HorizontalSumI32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// The 8 int32 lanes of x (each within the int8 or uint8 range of `kUnsigned`) as 8 bytes.
template <bool kUnsigned>
inline void Store8Bytes(__m256i x, uint8_t* dst) {
  __m256i b;
  if constexpr (kUnsigned) {
    b = _mm256_packus_epi16(_mm256_packus_epi32(x, x), _mm256_setzero_si256());
  } else {
    b = _mm256_packs_epi16(_mm256_packs_epi32(x, x), _mm256_setzero_si256());
  }
  // Bytes 0..3 of each 128-bit half hold lanes 0..3 and 4..7.
  const __m128i r = _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), r);
}

// Per-thread scratch, grown to the largest (head_dim, tiles) seen. Per tile: Q4 (u8, [dp/4][64][4]),
// sq, m, l (64 floats each), OT (fp32 [d][64]). Shared by the tiles: ST ([64 keys][64] fp32: the
// scores, then P) and VF (the block's V widened to fp32, [64 keys][d]).
struct LowpScratchAvx2 {
  AlignedPtr<uint8_t> q4;
  AlignedPtr<float> state, ot, st, vf;
  int cap_d = 0, cap_tiles = 0;

  static size_t Bytes(int d, int tiles) {
    const size_t dp = (static_cast<size_t>(d) + 3) / 4 * 4;
    return static_cast<size_t>(tiles) * (dp * kQ + sizeof(float) * (3 * kQ + static_cast<size_t>(d) * kQ)) +
           sizeof(float) * kLowpKeys * (kQ + static_cast<size_t>(d));
  }
  void Reserve(int d, int tiles) {
    if (d <= cap_d && tiles <= cap_tiles) return;
    cap_d = std::max(d, cap_d);
    cap_tiles = std::max(tiles, cap_tiles);
    const size_t dp = (static_cast<size_t>(cap_d) + 3) / 4 * 4;
    q4 = AllocAligned<uint8_t>(dp * kQ * cap_tiles);
    state = AllocAligned<float>(static_cast<size_t>(3) * kQ * cap_tiles);
    ot = AllocAligned<float>(static_cast<size_t>(cap_d) * kQ * cap_tiles);
    st = AllocAligned<float>(static_cast<size_t>(kLowpKeys) * kQ);
    vf = AllocAligned<float>(static_cast<size_t>(kLowpKeys) * cap_d);
  }
};

// ST rows j .. j + R of the block against the tile's 64 queries (sq: their 64 scales). Out of line
// with the VEX vpdpbusd as inline asm, accumulator tied ("+x": VEX encodes ymm0-15 only): GCC 12
// compiled the intrinsic's loop with every accumulator copied through another register and stored
// to the stack on each iteration (the same integer sums either way).
// Without AVX-VNNI (kVnni false) the same int32 sums come from vpmaddubsw on |qi| and the key's
// bytes with qi's sign (vpsignb), then vpmaddwd by 1 and vpaddd: |qi| <= 127 and |ki| <= 127, so
// a pair of products (<= 2 * 127 * 127 = 32258) never saturates the int16 lane; the sum is
// sum qi ki itself, without the + 128 that corr removes.
template <int R, bool kVnni>
__attribute__((noinline)) void LowpQkTile(const int8_t* ki, int dp, const int32_t* corr, const float* sk,
                                          const uint8_t* q4, const float* sq, float* st) {
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  for (int g = 0; g < kVecs; g += kGroup) {
    __m256i acc[R][kGroup];
    ESTREAM_UNROLL
    for (int r = 0; r < R; ++r)
      ESTREAM_UNROLL
      for (int c = 0; c < kGroup; ++c) acc[r][c] = _mm256_setzero_si256();
    for (int d4 = 0; d4 < dp / 4; ++d4) {
      __m256i q[kGroup], qa[kGroup];  // u8 qi + 128 (vpdpbusd); or signed qi and |qi|
      ESTREAM_UNROLL
      for (int c = 0; c < kGroup; ++c) {
        q[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q4 + (d4 * kQ + (g + c) * 8) * 4));
        if constexpr (!kVnni) {
          q[c] = _mm256_xor_si256(q[c], bias);
          qa[c] = _mm256_abs_epi8(q[c]);
        }
      }
      ESTREAM_UNROLL
      for (int r = 0; r < R; ++r) {
        int32_t w;
        std::memcpy(&w, ki + r * dp + 4 * d4, 4);
        const __m256i kb = _mm256_set1_epi32(w);
        ESTREAM_UNROLL
        for (int c = 0; c < kGroup; ++c) {
          if constexpr (kVnni) {
            __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc[r][c]) : "x"(q[c]), "x"(kb));
          } else {
            const __m256i prod = _mm256_maddubs_epi16(qa[c], _mm256_sign_epi8(kb, q[c]));
            acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(prod, ones));
          }
        }
      }
    }
    ESTREAM_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256i cr = _mm256_set1_epi32(kVnni ? corr[r] : 0);
      const __m256 skr = _mm256_set1_ps(sk[r]);
      ESTREAM_UNROLL
      for (int c = 0; c < kGroup; ++c)
        _mm256_storeu_ps(st + r * kQ + (g + c) * 8,
                         _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][c], cr)),
                                       _mm256_mul_ps(_mm256_loadu_ps(sq + (g + c) * 8), skr)));
    }
  }
}

// OT rows c0 .. c0 + R (head dims) = OT alpha + sum over the nk keys of P . V, the keys of each
// pair odd first (the reference's order); vf points at VF[0][c0] (rows d apart).
template <int R>
inline void LowpPvTile(const float* vf, int d, const float* pt, int nk, const __m256* alpha, float* ot) {
  for (int g = 0; g < kVecs; g += kGroup) {
    __m256 acc[R][kGroup];
    ESTREAM_UNROLL
    for (int r = 0; r < R; ++r)
      ESTREAM_UNROLL
      for (int c = 0; c < kGroup; ++c)
        acc[r][c] = _mm256_mul_ps(_mm256_loadu_ps(ot + r * kQ + (g + c) * 8), alpha[g + c]);
    auto step = [&](int j) {
      __m256 p[kGroup];
      ESTREAM_UNROLL
      for (int c = 0; c < kGroup; ++c) p[c] = _mm256_loadu_ps(pt + j * kQ + (g + c) * 8);
      ESTREAM_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256 v = _mm256_broadcast_ss(vf + j * d + r);
        ESTREAM_UNROLL
        for (int c = 0; c < kGroup; ++c) acc[r][c] = _mm256_fmadd_ps(p[c], v, acc[r][c]);
      }
    };
    int j = 0;
    for (; j + 2 <= nk; j += 2) {
      step(j + 1);
      step(j);
    }
    if (j < nk) step(j);
    ESTREAM_UNROLL
    for (int r = 0; r < R; ++r)
      ESTREAM_UNROLL
      for (int c = 0; c < kGroup; ++c) _mm256_storeu_ps(ot + r * kQ + (g + c) * 8, acc[r][c]);
  }
}

}  // namespace

void AttentionLowpConvertKvAvx2(const AttentionArgs& a, int kv_head, int block, uint16_t* kv) {
  const LowpLayout L(a.head_dim);
  const int d = a.head_dim, T = a.n_tokens;
  uint8_t* blk = reinterpret_cast<uint8_t*>(kv) + static_cast<size_t>(block) * L.block_bytes;
  int8_t* ki = reinterpret_cast<int8_t*>(blk);
  int32_t* corr = reinterpret_cast<int32_t*>(blk + L.corr);
  float* sk = reinterpret_cast<float*>(blk + L.sk);
  uint32_t* vb = reinterpret_cast<uint32_t*>(blk + L.vb);
  const float* k_head = a.k + static_cast<int64_t>(kv_head) * d;
  const float* v_head = a.v + static_cast<int64_t>(kv_head) * d;
  const int chunks = (d + 7) / 8;
  ESTREAM_CHECK(chunks <= kMaxChunks, "low-precision attention: head_dim above 512");
  __m256 mu[kMaxChunks];
  for (int c = 0; c < chunks; ++c) mu[c] = _mm256_setzero_ps();
  const int ns = LowpMeanKeys(a);
  for (int s = 0; s < ns; ++s) {
    const float* kr = k_head + static_cast<int64_t>(s) * a.ldk;
    for (int c = 0; c < chunks; ++c) mu[c] = _mm256_add_ps(mu[c], LoadRow(kr + 8 * c, d - 8 * c));
  }
  const __m256 nsv = _mm256_set1_ps(static_cast<float>(ns));
  for (int c = 0; c < chunks; ++c) mu[c] = _mm256_div_ps(mu[c], nsv);
  alignas(32) uint8_t bytes[512 + 8];
  for (int j = 0; j < kLowpKeys; ++j) {
    const int key = block * kLowpKeys + j;
    int8_t* row = ki + static_cast<size_t>(j) * L.dp;
    if (key >= T) {
      std::memset(row, 0, L.dp);
      corr[j] = 0;
      sk[j] = 0.0f;
      continue;
    }
    const float* kr = k_head + static_cast<int64_t>(key) * a.ldk;
    // Keys are a.ldk floats apart (all kv heads of a token together): fetch a row 4 keys ahead.
    if (key + 4 < T)
      for (int c = 0; c < d; c += 16) _mm_prefetch(reinterpret_cast<const char*>(kr + 4 * a.ldk + c), _MM_HINT_T0);
    __m256 kc[kMaxChunks];
    __m256 amax = _mm256_setzero_ps();
    for (int c = 0; c < chunks; ++c) {
      kc[c] = _mm256_sub_ps(LoadRow(kr + 8 * c, d - 8 * c), mu[c]);
      amax = _mm256_max_ps(amax, Abs(kc[c]));
    }
    const float am = HorizontalMax(amax);
    const __m256 inv = _mm256_set1_ps(am > 0.0f ? 127.0f / am : 0.0f);
    __m256i sum = _mm256_setzero_si256();
    for (int c = 0; c < chunks; ++c) {
      const __m256i x = _mm256_cvtps_epi32(_mm256_mul_ps(kc[c], inv));
      sum = _mm256_add_epi32(sum, x);
      Store8Bytes<false>(x, bytes + 8 * c);  // lanes >= d hold 0
    }
    std::memcpy(row, bytes, L.dp);
    corr[j] = 128 * HorizontalSumI32(sum);
    sk[j] = am / 127.0f;
  }
  for (int p = 0; p < kLowpKeys / 2; ++p) {
    const int key0 = block * kLowpKeys + 2 * p;
    const float* r0 = v_head + static_cast<int64_t>(key0) * a.ldv;
    const float* r1 = r0 + a.ldv;
    if (key0 + 5 < T)
      for (int c = 0; c < d; c += 16) {
        _mm_prefetch(reinterpret_cast<const char*>(r0 + 4 * a.ldv + c), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(r1 + 4 * a.ldv + c), _MM_HINT_T0);
      }
    for (int c = 0; c < chunks; ++c) {
      const int n = d - 8 * c;
      const __m256i lo = key0 < T ? Bf16Round(LoadRow(r0 + 8 * c, n)) : _mm256_setzero_si256();
      const __m256i hi = key0 + 1 < T ? Bf16Round(LoadRow(r1 + 8 * c, n)) : _mm256_setzero_si256();
      StoreRow(vb + static_cast<size_t>(p) * d + 8 * c, _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16)), n);
    }
  }
}

size_t AttentionLowpScratchBytesAvx2(int head_dim, int tiles) { return LowpScratchAvx2::Bytes(head_dim, tiles); }

namespace {

template <bool kVnni>
void BlockLowpAvx2(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end, int t_begin, int t_end) {
  // At most kMaxTiles tiles walk the key blocks together (their O in L2), as the AVX-512 kernel.
  constexpr int kMaxTiles = 8;
  if (static_cast<int64_t>(head_end - head_begin) * ((t_end - t_begin + kQ - 1) / kQ) > kMaxTiles) {
    const int hs = std::min(head_end - head_begin, kMaxTiles);
    const int rs = std::max(1, kMaxTiles / hs) * kQ;
    for (int h = head_begin; h < head_end; h += hs)
      for (int t = t_begin; t < t_end; t += rs)
        BlockLowpAvx2<kVnni>(a, kv, h, std::min(head_end, h + hs), t, std::min(t_end, t + rs));
    return;
  }
  const LowpLayout L(a.head_dim);
  const int d = a.head_dim, dp = L.dp;
  const int row_tiles = (t_end - t_begin + kQ - 1) / kQ;
  const int n_heads = head_end - head_begin;
  const int n_tiles = row_tiles * n_heads;
  thread_local LowpScratchAvx2 scratch;
  scratch.Reserve(d, n_tiles);
  float* st = scratch.st.get();
  float* vf = scratch.vf.get();
  const float q_scale = a.scale * kLog2eF;
  const size_t q4_bytes = static_cast<size_t>(dp) * kQ;
  auto tile_head = [&](int x) { return head_begin + x % n_heads; };
  auto tile_q0 = [&](int x) { return t_begin + (row_tiles - 1 - x / n_heads) * kQ; };
  auto tile_q4 = [&](int x) { return scratch.q4.get() + x * q4_bytes; };
  auto tile_sq = [&](int x) { return scratch.state.get() + static_cast<size_t>(3 * x) * kQ; };
  auto tile_m = [&](int x) { return tile_sq(x) + kQ; };
  auto tile_l = [&](int x) { return tile_sq(x) + 2 * kQ; };
  auto tile_ot = [&](int x) { return scratch.ot.get() + static_cast<size_t>(x) * d * kQ; };
  const int chunks = (d + 7) / 8;

  auto start_tile = [&](int x) {
    const int q0 = tile_q0(x);
    const int nq = std::min(kQ, t_end - q0);
    uint32_t* q4 = reinterpret_cast<uint32_t*>(tile_q4(x));
    float* sq = tile_sq(x);
    alignas(32) uint8_t row[512 + 8];
    for (int i = 0; i < kQ; ++i) {
      if (i >= nq) {
        for (int d4 = 0; d4 < dp / 4; ++d4) q4[d4 * kQ + i] = 0x80808080u;
        sq[i] = 0.0f;
        continue;
      }
      const float* q = a.q + static_cast<int64_t>(q0 + i) * a.ldq + static_cast<int64_t>(tile_head(x)) * d;
      __m256 qs[kMaxChunks];
      __m256 amax = _mm256_setzero_ps();
      for (int c = 0; c < chunks; ++c) {
        qs[c] = _mm256_mul_ps(LoadRow(q + 8 * c, d - 8 * c), _mm256_set1_ps(q_scale));
        amax = _mm256_max_ps(amax, Abs(qs[c]));
      }
      const float am = HorizontalMax(amax);
      const __m256 inv = _mm256_set1_ps(am > 0.0f ? 127.0f / am : 0.0f);
      for (int c = 0; c < chunks; ++c)  // lanes >= d hold 0 + 128
        Store8Bytes<true>(_mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(qs[c], inv)), _mm256_set1_epi32(128)),
                          row + 8 * c);
      for (int d4 = 0; d4 < dp / 4; ++d4) std::memcpy(q4 + d4 * kQ + i, row + 4 * d4, 4);
      sq[i] = am / 127.0f;
    }
    // The next tile's Q rows arrive while this tile computes its first key block (as AVX-512).
    if (x + 1 < n_tiles) {
      const int nq1 = std::min(kQ, t_end - tile_q0(x + 1));
      for (int i = 0; i < nq1; ++i) {
        const float* q1 = a.q + static_cast<int64_t>(tile_q0(x + 1) + i) * a.ldq + static_cast<int64_t>(tile_head(x + 1)) * d;
        for (int c = 0; c < d; c += 16) _mm_prefetch(reinterpret_cast<const char*>(q1 + c), _MM_HINT_T1);
      }
    }
    std::memset(tile_ot(x), 0, sizeof(float) * d * kQ);
    std::fill(tile_m(x), tile_m(x) + kQ, -std::numeric_limits<float>::infinity());
    std::fill(tile_l(x), tile_l(x) + kQ, 0.0f);
  };
  auto finish_tile = [&](int x) {
    const int q0 = tile_q0(x);
    const int nq = std::min(kQ, t_end - q0);
    float* ot = tile_ot(x);
    __m256 inv_l[kVecs];
    ESTREAM_UNROLL
    for (int c = 0; c < kVecs; ++c) inv_l[c] = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_loadu_ps(tile_l(x) + c * 8));
    for (int r = 0; r < d; ++r)
      ESTREAM_UNROLL
      for (int c = 0; c < kVecs; ++c)
        _mm256_storeu_ps(ot + r * kQ + c * 8, _mm256_mul_ps(_mm256_loadu_ps(ot + r * kQ + c * 8), inv_l[c]));
    float* out_rows = a.out + static_cast<int64_t>(q0) * a.ldo + static_cast<int64_t>(tile_head(x)) * d;
    TransposeBlock<Avx2Traits>(ot, kQ, d, nq, 1.0f, out_rows, a.ldo);
  };

  for (int kb = 0; kb < t_end; kb += kLowpKeys) {
    const uint8_t* blk = reinterpret_cast<const uint8_t*>(kv) + static_cast<size_t>(kb / kLowpKeys) * L.block_bytes;
    const int8_t* ki = reinterpret_cast<const int8_t*>(blk);
    const int32_t* corr = reinterpret_cast<const int32_t*>(blk + L.corr);
    const float* sk = reinterpret_cast<const float*>(blk + L.sk);
    const uint32_t* vb = reinterpret_cast<const uint32_t*>(blk + L.vb);
    bool v_widened = false;
    for (int x = 0; x < n_tiles; ++x) {
      const int q0 = tile_q0(x);
      const int q1 = std::min(t_end, q0 + kQ);
      if (kb >= q1) continue;
      const int nk = std::min(kLowpKeys, q1 - kb);
      if (kb == 0) start_tile(x);
      if (!v_widened) {
        // Tiles are visited with q1 non-increasing: the first one needs the most keys.
        for (int p = 0; p < (nk + 1) / 2; ++p)
          for (int c = 0; c < chunks; ++c) {
            const int n = d - 8 * c;
            const __m256i w = LoadRow(vb + static_cast<size_t>(p) * d + 8 * c, n);
            StoreRow(vf + static_cast<size_t>(2 * p) * d + 8 * c, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), n);
            StoreRow(vf + static_cast<size_t>(2 * p + 1) * d + 8 * c,
                     _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)))), n);
          }
        v_widened = true;
      }
      const uint8_t* q4 = tile_q4(x);
      const float* sq = tile_sq(x);
      ForTiles<QkKeys(kVnni)>(nk, [&]<int R>(int j) {
        LowpQkTile<R, kVnni>(ki + static_cast<size_t>(j) * dp, dp, corr + j, sk + j, q4, sq, st + j * kQ);
      });
      // Causal mask: key kb + j is visible to query q0 + i iff kb + j <= q0 + i.
      for (int j = std::max(0, q0 - kb + 1); j < nk; ++j)
        ESTREAM_UNROLL
        for (int c = 0; c < kVecs; ++c) {
          float* s = st + j * kQ + c * 8;
          _mm256_storeu_ps(s, Avx2Traits::MaskBelow(_mm256_loadu_ps(s), c * 8, kb + j - q0));
        }
      __m256 m[kVecs], bm[kVecs], alpha[kVecs], sum[kVecs];
      ESTREAM_UNROLL
      for (int c = 0; c < kVecs; ++c) bm[c] = m[c] = _mm256_loadu_ps(tile_m(x) + c * 8);
      for (int j = 0; j < nk; ++j)
        ESTREAM_UNROLL
        for (int c = 0; c < kVecs; ++c) bm[c] = _mm256_max_ps(bm[c], _mm256_loadu_ps(st + j * kQ + c * 8));
      ESTREAM_UNROLL
      for (int c = 0; c < kVecs; ++c) {
        alpha[c] = Avx2Traits::Exp2(_mm256_sub_ps(m[c], bm[c]));
        _mm256_storeu_ps(tile_m(x) + c * 8, bm[c]);
        sum[c] = _mm256_setzero_ps();
      }
      // P = 2^(S - m) summed in fp32 in key order, then stored rounded to bf16 (as the reference).
      for (int j = 0; j < nk; ++j)
        ESTREAM_UNROLL
        for (int c = 0; c < kVecs; ++c) {
          float* s = st + j * kQ + c * 8;
          const __m256 p = Avx2Traits::Exp2(_mm256_sub_ps(_mm256_loadu_ps(s), bm[c]));
          sum[c] = _mm256_add_ps(sum[c], p);
          _mm256_storeu_ps(s, RoundToBf16(p));
        }
      ESTREAM_UNROLL
      for (int c = 0; c < kVecs; ++c)
        _mm256_storeu_ps(tile_l(x) + c * 8, _mm256_fmadd_ps(_mm256_loadu_ps(tile_l(x) + c * 8), alpha[c], sum[c]));
      float* ot = tile_ot(x);
      ForTiles<kPvDims>(d, [&]<int R>(int c0) { LowpPvTile<R>(vf + c0, d, st, nk, alpha, ot + c0 * kQ); });
      if (kb + kLowpKeys >= q1) finish_tile(x);
    }
  }
}

}  // namespace

void AttentionBlockLowpAvx2(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end, int t_begin,
                            int t_end) {
  BlockLowpAvx2<true>(a, kv, head_begin, head_end, t_begin, t_end);
}

void AttentionBlockLowpAvx2Maddubs(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end,
                                   int t_begin, int t_end) {
  BlockLowpAvx2<false>(a, kv, head_begin, head_end, t_begin, t_end);
}

void FillAttentionLowpAvx2(KernelTable* t, bool use_avx_vnni) {
  SetAttentionLowp(t, ConvertKvBlocks<AttentionLowpConvertKvAvx2>,
                   use_avx_vnni ? AttentionBlockLowpAvx2 : AttentionBlockLowpAvx2Maddubs,
                   AttentionLowpScratchBytesAvx2);
}

}  // namespace estream::kernels

#undef ESTREAM_UNROLL
