// AMX-BF16 causal attention for prefill (see attention_amx.h for the algorithm).
#include "kernels/x86_avx512/attention_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "base/cpu.h"
#include "base/memory.h"
#include "kernels/x86_avx512/gemm_avx512.h"

#pragma GCC target("amx-tile,amx-bf16")
// GCC 12 reports the _mm512_undefined_* operand inside some intrinsics as uninitialised (a false
// positive, as in gemm_amx.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace estream::kernels {
namespace {

constexpr int kQ = kAmxAttnRows;  // queries per tile: two 16-lane halves
constexpr int kK = kAmxAttnKeys;  // keys per block
// Lazy rescaling: the running max moves only when a block's max exceeds it by more than this
// (log2 units), so P <= 2^8 and l <= 2^8 * T stay far from fp32 overflow.
constexpr float kRescaleThreshold = 8.0f;

// All eight tiles 16 rows x 64 bytes: C = tmm0..3 (16 x 16 fp32), A = tmm4, 5, B = tmm6, 7
// (16 x 32 bf16).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

void LoadTileConfig() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  // ldtilecfg reads the whole struct; without this barrier GCC 12 may drop the stores above.
  __asm__ volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

// 2^f for f in [-0.5, 0.5]: Taylor polynomial of degree 5 in f ln2 (truncation < 5e-6 relative,
// < 2^-17; P is rounded to bf16 (2^-8) right after, so more terms would buy nothing).
inline __m512 Exp2Poly5(__m512 f) {
  __m512 p = _mm512_set1_ps(1.3333558146428443e-03f);                   // ln2^5 / 5!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-03f));  // ln2^4 / 4!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-02f));  // ln2^3 / 3!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-01f));  // ln2^2 / 2!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-01f));  // ln2
  return _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
}

// 2^x for x <= kRescaleThreshold (or -inf); results below 2^-125 become exactly 0 (masked keys
// give 0, no denormals reach the tiles, which would flush them anyway).
inline __m512 Exp2(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.0f));
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_maskz_scalef_ps(keep, Exp2Poly5(_mm512_sub_ps(x, n)), n);
}

inline __mmask16 TailMask(int rest) {
  return rest >= 16 ? static_cast<__mmask16>(0xFFFF) : rest <= 0 ? 0 : static_cast<__mmask16>((1u << rest) - 1);
}

// In-register 16 x 16 transpose: on return r[c] holds column c of the input rows r[0..16).
inline void Transpose16(__m512 r[16]) {
  __m512 t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  // r[4b + j] holds, in each 128-bit lane L, elements (rows 4b..4b+3, column 4L + j).
#pragma GCC unroll 16
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
  }
#pragma GCC unroll 16
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
    r[j + 4] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
    r[j + 12] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD);
  }
}

// 32 fp32 -> 32 bf16 (round to nearest even): lo in elements 0..15, hi in 16..31.
inline __m512i PackBf16(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

// Per-thread scratch, grown to the largest (padded head_dim, tiles) seen. bf16 as uint16_t.
struct AmxAttnScratch {
  AlignedPtr<uint16_t> pt16; // kK / 2 x (2 kQ): row r = keys (2r, 2r + 1) interleaved per query
  AlignedPtr<float> st;      // kK x kQ scores / probabilities, lanes = queries
  AlignedPtr<uint16_t> qt16; // per tile: 2 halves x dp / 2 rows x 32 (dim pairs x 16 queries)
  AlignedPtr<float> ot;      // per tile: dp x kQ
  AlignedPtr<float> ml;      // per tile: m, l (kQ each)
  int capacity_dp = 0;
  int capacity_tiles = 0;

  // Bytes held after Reserve(dp, tiles) from empty.
  static size_t Bytes(int dp, int tiles) {
    const size_t cdp = static_cast<size_t>(dp), t = static_cast<size_t>(tiles);
    return sizeof(uint16_t) * (static_cast<size_t>(kK) * kQ + cdp * kQ * t) +
           sizeof(float) * (static_cast<size_t>(kK) * kQ + cdp * kQ * t + static_cast<size_t>(2) * kQ * t);
  }

  void Reserve(int dp, int tiles) {
    if (dp <= capacity_dp && tiles <= capacity_tiles) return;
    capacity_dp = std::max(dp, capacity_dp);
    capacity_tiles = std::max(tiles, capacity_tiles);
    const size_t cdp = static_cast<size_t>(capacity_dp);
    pt16 = AllocAligned<uint16_t>(static_cast<size_t>(kK) * kQ);
    st = AllocAligned<float>(static_cast<size_t>(kK) * kQ);
    qt16 = AllocAligned<uint16_t>(cdp * kQ * capacity_tiles);
    ot = AllocAligned<float>(cdp * kQ * capacity_tiles);
    ml = AllocAligned<float>(static_cast<size_t>(2) * kQ * capacity_tiles);
  }
};

// Head dims padded to whole tile rows of bf16 pairs (the scratch and the K/V blocks are zero there).
int PaddedDim(int head_dim) { return (head_dim + 31) / 32 * 32; }

// One key block of the converted K/V buffer: K16 (kK keys x dp dims, A operands as stored), then
// VT16 (dp dims x kK keys: V transposed, A operands). Elements (bf16 as uint16_t).
size_t KvBlockElems(int dp) { return static_cast<size_t>(2) * kK * dp; }

// k16 rows [0, n_keys) from K rows (row j at k + j * ldk, d values), rows >= n_valid zero;
// dims zero-padded to dp.
void ConvertK(const float* k, int64_t ldk, int d, int dp, int n_valid, int n_keys, uint16_t* k16) {
  for (int j = 0; j < n_keys; ++j) {
    uint16_t* dst = k16 + static_cast<int64_t>(j) * dp;
    if (j >= n_valid) {
      std::memset(dst, 0, sizeof(uint16_t) * dp);
      continue;
    }
    const float* src = k + j * ldk;
    for (int c = 0; c < dp; c += 32) {
      const __m512 lo = _mm512_maskz_loadu_ps(TailMask(d - c), src + c);
      const __m512 hi = _mm512_maskz_loadu_ps(TailMask(d - c - 16), src + c + 16);
      _mm512_store_si512(dst + c, PackBf16(lo, hi));
    }
  }
}

// vt16[dim][j] = bf16(V[j][dim]) for keys [0, n_keys) (a multiple of 32; keys >= n_valid zero),
// dims [0, dp) (dims >= d zero); row stride kK.
void ConvertVt(const float* v, int64_t ldv, int d, int dp, int n_valid, int n_keys, uint16_t* vt16) {
  for (int j0 = 0; j0 < n_keys; j0 += 32)
    for (int e = 0; e < dp; e += 16) {
      const __mmask16 dm = TailMask(d - e);
      __m512 a[16], b[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        a[r] = j0 + r < n_valid ? _mm512_maskz_loadu_ps(dm, v + (j0 + r) * ldv + e) : _mm512_setzero_ps();
        b[r] = j0 + 16 + r < n_valid ? _mm512_maskz_loadu_ps(dm, v + (j0 + 16 + r) * ldv + e) : _mm512_setzero_ps();
      }
      Transpose16(a);
      Transpose16(b);
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) _mm512_store_si512(vt16 + (e + r) * kK + j0, PackBf16(a[r], b[r]));
    }
}

// Queries of one half tile (n_rows <= 16 rows at q, ldq apart; missing rows zero), scaled by
// `scale` and rounded to bf16, as B operands: qt16[r][2n + e] = q[n][2r + e], r < dp / 2.
void ConvertQt(const float* q, int64_t ldq, int d, int dp, int n_rows, float scale, uint16_t* qt16) {
  const __m512 sc = _mm512_set1_ps(scale);
  for (int c = 0; c < dp; c += 32) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int n = 0; n < 16; ++n) {
      if (n < n_rows) {
        const float* src = q + n * ldq + c;
        const __m512 lo = _mm512_mul_ps(_mm512_maskz_loadu_ps(TailMask(d - c), src), sc);
        const __m512 hi = _mm512_mul_ps(_mm512_maskz_loadu_ps(TailMask(d - c - 16), src + 16), sc);
        r[n] = _mm512_castsi512_ps(PackBf16(lo, hi));
      } else {
        r[n] = _mm512_setzero_ps();
      }
    }
    Transpose16(r);  // dword transpose: row = dim pair c / 2 + i, lane = query
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) _mm512_store_ps(qt16 + (c / 2 + i) * 32, r[i]);
  }
}

}  // namespace

size_t AttentionAmxScratchBytes(int head_dim, int tiles) {
  return AmxAttnScratch::Bytes(PaddedDim(head_dim), tiles);
}

size_t AttentionAmxKvBytes(int head_dim, int n_tokens) {
  const size_t blocks = static_cast<size_t>((n_tokens + kK - 1) / kK);
  return blocks * KvBlockElems(PaddedDim(head_dim)) * sizeof(uint16_t);
}

void AttentionAmxConvertKv(const AttentionArgs& a, int kv_head, int block, uint16_t* kv16) {
  const int d = a.head_dim;
  const int dp = PaddedDim(d);
  const int kb = block * kK;
  const int n_valid = std::min(kK, a.n_tokens - kb);
  uint16_t* k16 = kv16 + static_cast<size_t>(block) * KvBlockElems(dp);
  ConvertK(a.k + kb * a.ldk + static_cast<int64_t>(kv_head) * d, a.ldk, d, dp, n_valid, kK, k16);
  ConvertVt(a.v + kb * a.ldv + static_cast<int64_t>(kv_head) * d, a.ldv, d, dp, n_valid, kK,
            k16 + static_cast<size_t>(kK) * dp);
}

bool AttentionAmxUsable() {
  static const bool usable = HostCpuFeatures().amx_bf16 && AmxUsable();
  return usable;
}

bool AttentionAmxSelected() {
  static const bool selected = [] {
    const char* env = std::getenv("ESTREAM_ATTN_BF16");
    return !(env != nullptr && std::strcmp(env, "0") == 0) && AttentionAmxUsable();
  }();
  return selected;
}

void AttentionBlockAmx(const AttentionArgs& a, const uint16_t* kv16, int head_begin, int head_end, int t_begin,
                       int t_end) {
  constexpr float kLog2e = 1.44269504088896340736f;
  const int d = a.head_dim;
  const int dp = PaddedDim(d);
  const int row_tiles = (t_end - t_begin + kQ - 1) / kQ;
  const int n_heads = head_end - head_begin;
  const int n_tiles = row_tiles * n_heads;
  thread_local AmxAttnScratch scratch;
  scratch.Reserve(dp, n_tiles);
  uint16_t* pt16 = scratch.pt16.get();
  float* st = scratch.st.get();
  const float q_scale = a.scale * kLog2e;
  const size_t tile_elems = static_cast<size_t>(dp) * kQ;
  // Tile x: head head_begin + x % n_heads, rows from the last row tile backwards (the order in
  // which they stop needing key blocks).
  auto tile_head = [&](int x) { return head_begin + x % n_heads; };
  auto tile_q0 = [&](int x) { return t_begin + (row_tiles - 1 - x / n_heads) * kQ; };
  auto tile_qt = [&](int x) { return scratch.qt16.get() + x * tile_elems; };
  auto tile_ot = [&](int x) { return scratch.ot.get() + x * tile_elems; };
  auto tile_m = [&](int x) { return scratch.ml.get() + static_cast<size_t>(2 * x) * kQ; };
  auto tile_l = [&](int x) { return scratch.ml.get() + static_cast<size_t>(2 * x + 1) * kQ; };

  auto start_tile = [&](int x) {
    const int q0 = tile_q0(x);
    const int nq = std::min(kQ, t_end - q0);
    const float* q = a.q + static_cast<int64_t>(q0) * a.ldq + static_cast<int64_t>(tile_head(x)) * d;
    uint16_t* qt = tile_qt(x);
    ConvertQt(q, a.ldq, d, dp, std::min(16, nq), q_scale, qt);
    ConvertQt(nq > 16 ? q + 16 * a.ldq : q, a.ldq, d, dp, nq - 16, q_scale, qt + tile_elems / 2);
    std::memset(tile_ot(x), 0, sizeof(float) * tile_elems);
    std::fill(tile_m(x), tile_m(x) + kQ, -std::numeric_limits<float>::infinity());
    std::fill(tile_l(x), tile_l(x) + kQ, 0.0f);
  };
  // out[q0 + i][c] = OT[c][i] / l[i]: 16 x 16 blocks scaled (lanes = queries), transposed, stored.
  auto finish_tile = [&](int x) {
    const int q0 = tile_q0(x);
    const int nq = std::min(kQ, t_end - q0);
    const float* ot = tile_ot(x);
    float* out = a.out + static_cast<int64_t>(q0) * a.ldo + static_cast<int64_t>(tile_head(x)) * d;
    for (int h = 0; h < 2 && 16 * h < nq; ++h) {
      const __m512 inv_l = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_loadu_ps(tile_l(x) + 16 * h));
      for (int e = 0; e < d; e += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) r[i] = _mm512_mul_ps(_mm512_loadu_ps(ot + (e + i) * kQ + 16 * h), inv_l);
        Transpose16(r);
        const __mmask16 dm = TailMask(d - e);
        for (int n = 0; n < 16 && 16 * h + n < nq; ++n)
          _mm512_mask_storeu_ps(out + (16 * h + n) * a.ldo + e, dm, r[n]);
      }
    }
  };

  LoadTileConfig();
  const __m512i lane_ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // Interleaves two rows of 16 bf16 (elements 0..15 and 16..31) into dword pairs per lane.
  alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                          21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26,
                                                          11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int kb = 0; kb < t_end; kb += kK) {
    const uint16_t* k16 = kv16 + static_cast<size_t>(kb / kK) * KvBlockElems(dp);
    const uint16_t* vt16 = k16 + static_cast<size_t>(kK) * dp;
    for (int x = 0; x < n_tiles; ++x) {
      const int q0 = tile_q0(x);
      const int q1 = std::min(t_end, q0 + kQ);
      if (kb >= q1) continue;
      const int nk = std::min(kK, q1 - kb);
      const int nk32 = (nk + 31) / 32 * 32;
      if (kb == 0) start_tile(x);
      const uint16_t* qt = tile_qt(x);
      float* ot = tile_ot(x);

      // ST[j][i] = K16[j] . QT[i]: per 32 keys, C tiles (keys 0-15 | 16-31) x (queries 0-15 | 16-31).
      for (int kc = 0; kc < nk32; kc += 32) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int c = 0; c < dp; c += 32) {
          _tile_loadd(4, k16 + kc * dp + c, dp * 2);
          _tile_loadd(5, k16 + (kc + 16) * dp + c, dp * 2);
          _tile_loadd(6, qt + (c / 2) * 32, 64);
          _tile_loadd(7, qt + tile_elems / 2 + (c / 2) * 32, 64);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, st + kc * kQ, kQ * 4);
        _tile_stored(1, st + kc * kQ + 16, kQ * 4);
        _tile_stored(2, st + (kc + 16) * kQ, kQ * 4);
        _tile_stored(3, st + (kc + 16) * kQ + 16, kQ * 4);
      }
      // Causal mask: key kb + j is visible to query q0 + i iff kb + j <= q0 + i; rows past the
      // keys of this tile (j >= nk, up to nk32) are masked for every real query the same way.
      for (int j = std::max(0, q0 - kb + 1); j < nk32; ++j)
        for (int h = 0; h < 2; ++h) {
          const __mmask16 below = _mm512_cmplt_epi32_mask(_mm512_add_epi32(lane_ids, _mm512_set1_epi32(16 * h)),
                                                          _mm512_set1_epi32(kb + j - q0));
          float* s = st + j * kQ + 16 * h;
          _mm512_store_ps(s, _mm512_mask_mov_ps(_mm512_load_ps(s), below, neg_inf));
        }
      // Online softmax with lazy rescaling (attention_amx.h).
      float* m_mem = tile_m(x);
      float* l_mem = tile_l(x);
      __m512 m_new[2], alpha[2], sum[2];
      __mmask16 raised[2];
      for (int h = 0; h < 2; ++h) {
        __m512 bm = neg_inf;
        for (int j = 0; j < nk32; ++j) bm = _mm512_max_ps(bm, _mm512_load_ps(st + j * kQ + 16 * h));
        const __m512 m_old = _mm512_loadu_ps(m_mem + 16 * h);
        raised[h] = _mm512_cmp_ps_mask(bm, _mm512_add_ps(m_old, _mm512_set1_ps(kRescaleThreshold)), _CMP_GT_OQ);
        m_new[h] = _mm512_mask_mov_ps(m_old, raised[h], bm);
        alpha[h] = Exp2(_mm512_sub_ps(m_old, m_new[h]));  // 1 where not raised, 0 where m_old = -inf
        _mm512_storeu_ps(m_mem + 16 * h, m_new[h]);
        sum[h] = _mm512_setzero_ps();
      }
      for (int j = 0; j < nk32; j += 2)
        for (int h = 0; h < 2; ++h) {
          const __m512 p0 = Exp2(_mm512_sub_ps(_mm512_load_ps(st + j * kQ + 16 * h), m_new[h]));
          const __m512 p1 = Exp2(_mm512_sub_ps(_mm512_load_ps(st + (j + 1) * kQ + 16 * h), m_new[h]));
          sum[h] = _mm512_add_ps(sum[h], _mm512_add_ps(p0, p1));
          _mm512_store_si512(pt16 + (j / 2) * (2 * kQ) + 32 * h,
                             _mm512_permutexvar_epi16(interleave, PackBf16(p0, p1)));
        }
      for (int h = 0; h < 2; ++h) {
        const __m512 l_old = _mm512_loadu_ps(l_mem + 16 * h);
        _mm512_storeu_ps(l_mem + 16 * h, _mm512_add_ps(_mm512_mul_ps(l_old, alpha[h]), sum[h]));
      }
      if (kb > 0 && (raised[0] | raised[1]) != 0)
        for (int r = 0; r < dp; ++r)
          for (int h = 0; h < 2; ++h) {
            float* o = ot + r * kQ + 16 * h;
            _mm512_store_ps(o, _mm512_mul_ps(_mm512_load_ps(o), alpha[h]));
          }
      // OT += VT16 x PT16: per 32 dims, C tiles (dims 0-15 | 16-31) x (queries 0-15 | 16-31).
      for (int c = 0; c < dp; c += 32) {
        _tile_loadd(0, ot + c * kQ, kQ * 4);
        _tile_loadd(1, ot + c * kQ + 16, kQ * 4);
        _tile_loadd(2, ot + (c + 16) * kQ, kQ * 4);
        _tile_loadd(3, ot + (c + 16) * kQ + 16, kQ * 4);
        for (int kc = 0; kc < nk32; kc += 32) {
          _tile_loadd(4, vt16 + c * kK + kc, kK * 2);
          _tile_loadd(5, vt16 + (c + 16) * kK + kc, kK * 2);
          _tile_loadd(6, pt16 + (kc / 2) * (2 * kQ), 4 * kQ);
          _tile_loadd(7, pt16 + (kc / 2) * (2 * kQ) + 32, 4 * kQ);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, ot + c * kQ, kQ * 4);
        _tile_stored(1, ot + c * kQ + 16, kQ * 4);
        _tile_stored(2, ot + (c + 16) * kQ, kQ * 4);
        _tile_stored(3, ot + (c + 16) * kQ + 16, kQ * 4);
      }
      if (kb + kK >= q1) finish_tile(x);
    }
  }
  _tile_release();
}

}  // namespace estream::kernels
