// AMX-BF16 causal attention for prefill (see attention_amx.h for the algorithm).
#include "kernels/x86_avx512/attention_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "base/check.h"
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

constexpr int kQ = kAmxAttnRows;  // queries per tile: two 16-row halves (C tile rows)
constexpr int kK = kAmxAttnKeys;  // keys per block
// Lazy rescaling: the running max moves only when a block's max exceeds it by more than this
// (log2 units); with the fast path's check, P <= kSumCheck = 2^10 and l <= 2^10 * T stay far from
// fp32 overflow.
constexpr float kRescaleThreshold = 8.0f;
constexpr float kSumCheck = 1024.0f;  // 2^(kRescaleThreshold + 2): see TileSteps::Softmax

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

// 2^f for f in [-0.5, 0.5]: degree-3 polynomial fitted for relative error (< 7.5e-5 = 2^-13.7
// with these fp32 coefficients; P is rounded to bf16, 2^-9 relative, right after, and the same
// fp32 value enters numerator and denominator).
inline __m512 Exp2Poly3(__m512 f) {
  __m512 p = _mm512_set1_ps(0.0551716723f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24261117f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693260968f));
  return _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.999928057f));
}

// 2^x in the lanes of `keep` (others 0). Results below 2^-126 (scores more than 126 log2 units
// under the running max) come out denormal or 0; the bf16 rounding of P flushes them.
inline __m512 Exp2(__m512 x, __mmask16 keep = 0xFFFF) {
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);  // x - round(x)
  return _mm512_maskz_scalef_ps(keep, Exp2Poly3(f), _mm512_sub_ps(x, f));
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

// Interleaves two rows of 16 bf16 (elements 0..15 and 16..31) into dword pairs per lane.
alignas(64) constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                  8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// Head dims padded to whole tile rows of bf16 pairs (the scratch and the K/V blocks are zero there).
int PaddedDim(int head_dim) { return (head_dim + 31) / 32 * 32; }

// Per-thread scratch, grown to the largest (padded head_dim, tiles) seen. bf16 as uint16_t.
struct AmxAttnScratch {
  AlignedPtr<float> s;       // kQ x kK scores of the current block, row = query
  AlignedPtr<uint16_t> p16;  // kQ x kK bf16 probabilities, row = query (A operands of P.V)
  AlignedPtr<uint16_t> q16;  // per tile: kQ x dp bf16 scaled queries (A operands of Q.K^T)
  AlignedPtr<float> o;       // per tile: kQ x dp unnormalised outputs
  AlignedPtr<float> ml;      // per tile: m (kQ), then l as 16 partial sums per query (kQ x 16)
  int capacity_dp = 0;
  int capacity_tiles = 0;

  static constexpr size_t kMlFloats = static_cast<size_t>(17) * kQ;

  // Bytes held after Reserve(dp, tiles) from empty.
  static size_t Bytes(int dp, int tiles) {
    const size_t cdp = static_cast<size_t>(dp), t = static_cast<size_t>(tiles), sp = static_cast<size_t>(kQ) * kK;
    return (sizeof(float) + sizeof(uint16_t)) * sp +
           t * (sizeof(uint16_t) * cdp * kQ + sizeof(float) * (cdp * kQ + kMlFloats));
  }

  void Reserve(int dp, int tiles) {
    if (dp <= capacity_dp && tiles <= capacity_tiles) return;
    capacity_dp = std::max(dp, capacity_dp);
    capacity_tiles = std::max(tiles, capacity_tiles);
    const size_t cdp = static_cast<size_t>(capacity_dp), t = static_cast<size_t>(capacity_tiles);
    s = AllocAligned<float>(static_cast<size_t>(kQ) * kK);
    p16 = AllocAligned<uint16_t>(static_cast<size_t>(kQ) * kK);
    q16 = AllocAligned<uint16_t>(cdp * kQ * t);
    o = AllocAligned<float>(cdp * kQ * t);
    ml = AllocAligned<float>(kMlFloats * t);
  }
};

// One key block of the converted K/V buffer, both as tdpbf16ps B operands (bf16 pairs per dword):
// KB16 (dp / 2 rows of dim pairs x kK keys: KB16[r][2j + e] = K[j][2r + e]), then VB16 (kK / 2
// rows of key pairs x dp dims: VB16[r][2c + e] = V[2r + e][c]). Elements (bf16 as uint16_t).
size_t KvBlockElems(int dp) { return static_cast<size_t>(2) * kK * dp; }

// KB16 from K rows [0, kK) (row j at k + j * ldk, d values; rows >= n_valid zero, dims >= d zero):
// per 16 keys and 32 dims, 16 rows of bf16 pairs transposed to dim-pair rows with key lanes.
void ConvertK(const float* k, int64_t ldk, int d, int dp, int n_valid, uint16_t* kb16) {
  for (int j0 = 0; j0 < kK; j0 += 16)
    for (int c = 0; c < dp; c += 32) {
      __m512 r[16];
#pragma GCC unroll 16
      for (int n = 0; n < 16; ++n) {
        if (j0 + n < n_valid) {
          const float* src = k + (j0 + n) * ldk + c;
          r[n] = _mm512_castsi512_ps(PackBf16(_mm512_maskz_loadu_ps(TailMask(d - c), src),
                                              _mm512_maskz_loadu_ps(TailMask(d - c - 16), src + 16)));
        } else {
          r[n] = _mm512_setzero_ps();
        }
      }
      Transpose16(r);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) _mm512_store_ps(kb16 + (c / 2 + i) * (2 * kK) + 2 * j0, r[i]);
    }
}

// VB16 from V rows [0, kK) (row j at v + j * ldv; rows >= n_valid zero, dims >= d zero).
void ConvertV(const float* v, int64_t ldv, int d, int dp, int n_valid, uint16_t* vb16) {
  const __m512i interleave = _mm512_load_si512(kInterleave);
  for (int r = 0; r < kK / 2; ++r)
    for (int c = 0; c < dp; c += 16) {
      const __mmask16 dm = TailMask(d - c);
      const __m512 lo = 2 * r < n_valid ? _mm512_maskz_loadu_ps(dm, v + 2 * r * ldv + c) : _mm512_setzero_ps();
      const __m512 hi = 2 * r + 1 < n_valid ? _mm512_maskz_loadu_ps(dm, v + (2 * r + 1) * ldv + c) : _mm512_setzero_ps();
      _mm512_store_si512(vb16 + r * (2 * dp) + 2 * c, _mm512_permutexvar_epi16(interleave, PackBf16(lo, hi)));
    }
}

// C tiles 0..3 (rows 0-15 | 16-31) x (columns 0-15 | 16-31) += A (tiles 4, 5: the 16-row halves
// at a, lda bytes per row) x B (tiles 6, 7: 16 rows of bf16 pairs at b and b + 32 elements, ldb
// bytes per row): the 2 x 2 step of both products.
inline void Dot2x2(const uint16_t* a, int lda, const uint16_t* b, int ldb) {
  _tile_loadd(4, a, lda);
  _tile_loadd(5, reinterpret_cast<const char*>(a) + 16 * lda, lda);
  _tile_loadd(6, b, ldb);
  _tile_loadd(7, b + 32, ldb);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// Loads / stores C tiles 0..3 as the 32 x 32 fp32 block at c (ldc floats per row).
inline void LoadC2x2(const float* c, int ldc) {
  _tile_loadd(0, c, ldc * 4);
  _tile_loadd(1, c + 16, ldc * 4);
  _tile_loadd(2, c + 16 * ldc, ldc * 4);
  _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
}
inline void StoreC2x2(float* c, int ldc) {
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
  _tile_stored(2, c + 16 * ldc, ldc * 4);
  _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}

// The softmax's fast path for one query row of NV x 16 scores at si, all visible: P = 2^(S - m)
// against the running max m; accepted (P16 row at pi, l row += P) unless a lane's sum exceeds
// kSumCheck. Unrolled over the row, so P stays in registers.
template <int NV>
inline bool FastRow(const float* si, float m, float* li, uint16_t* pi) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 pv[NV], bs = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int z = 0; z < NV; ++z) {
    pv[z] = Exp2(_mm512_sub_ps(_mm512_load_ps(si + 16 * z), mv));
    bs = _mm512_add_ps(bs, pv[z]);
  }
  if (_mm512_cmp_ps_mask(bs, _mm512_set1_ps(kSumCheck), _CMP_NLE_UQ) != 0) return false;
  _mm512_store_ps(li, _mm512_add_ps(_mm512_load_ps(li), bs));
#pragma GCC unroll 2
  for (int z = 0; z < NV; z += 2) _mm512_store_si512(pi + 16 * z, PackBf16(pv[z], pv[z + 1]));
  return true;
}

// One tile of kQ queries (q0 .. q0 + nq - 1 of one head) and the three steps of each key block.
struct TileSteps {
  int d = 0, dp = 0;
  uint16_t* q16 = nullptr;  // kQ x dp, A operands
  float* o = nullptr;       // kQ x dp
  float* m = nullptr;       // kQ running maxima (log2 units)
  float* l = nullptr;       // kQ x 16 partial sums
  float* s = nullptr;       // kQ x kK scores of the block
  uint16_t* p16 = nullptr;  // kQ x kK bf16 probabilities

  // q16[i] = bf16(q[i] * scale) for rows i < nq (rows ldq apart, d values), other rows and dims
  // zero; O, m and l reset.
  void Start(const float* q, int64_t ldq, int nq, float scale) const {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int i = 0; i < kQ; ++i)
      for (int c = 0; c < dp; c += 32) {
        __m512i packed = _mm512_setzero_si512();
        if (i < nq) {
          const float* src = q + i * ldq + c;
          packed = PackBf16(_mm512_mul_ps(_mm512_maskz_loadu_ps(TailMask(d - c), src), sc),
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(TailMask(d - c - 16), src + 16), sc));
        }
        _mm512_store_si512(q16 + i * dp + c, packed);
      }
    std::memset(o, 0, sizeof(float) * kQ * dp);
    std::fill(m, m + kQ, -std::numeric_limits<float>::infinity());
    std::fill(l, l + 16 * kQ, 0.0f);
  }

  // S = Q16 x KB16 for keys [0, nk32) of the block: per 32 keys, C tiles (queries 0-15 | 16-31)
  // x (keys 0-15 | 16-31).
  void Scores(const uint16_t* kb16, int nk32) const {
    for (int kc = 0; kc < nk32; kc += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int c = 0; c < dp; c += 32)
        Dot2x2(q16 + c, dp * 2, kb16 + (c / 2) * (2 * kK) + 2 * kc, 4 * kK);
      StoreC2x2(s + kc, kK);
    }
  }

  // Online softmax of the block, row by row, with lazy rescaling (attention_amx.h): P16 rows of
  // bf16(2^(S - m)) for keys [0, nk32), l += P. Row i sees keys j < visible0 + i of the block
  // (causal mask); rows >= nq get zeros.
  void Softmax(int visible0, int nq, int nk32) const {
    const int nv = nk32 / 16;
    for (int i = 0; i < nq; ++i) {
      const float* si = s + i * kK;
      float* li = l + 16 * i;
      uint16_t* pi = p16 + i * kK;
      const int visible = visible0 + i;
      // Fast path (every key visible, m set): P against the running max. While P <= 2^8 (the
      // lazy-rescaling invariant) a lane's sum over the block's <= 4 vectors is <= kSumCheck, so
      // the row is accepted; a larger sum (some P > 2^8, or inf) sends it to the general path,
      // which redoes it. So accepted rows have P <= kSumCheck.
      if (visible >= nk32 && m[i] != -std::numeric_limits<float>::infinity() &&
          (nv == 4 ? FastRow<4>(si, m[i], li, pi) : FastRow<2>(si, m[i], li, pi)))
        continue;
      // General path: the block's row max over visible keys; m is raised to it where it exceeds
      // m by more than kRescaleThreshold (O and l rescaled by 2^(m_old - m_new)).
      __m512 sv[4];
      __mmask16 vis[4];
      __m512 bm = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (int z = 0; z < nv; ++z) {
        sv[z] = _mm512_load_ps(si + 16 * z);
        vis[z] = TailMask(visible - 16 * z);
        bm = _mm512_mask_max_ps(bm, vis[z], bm, sv[z]);
      }
      if (_mm512_cmp_ps_mask(bm, _mm512_set1_ps(m[i] + kRescaleThreshold), _CMP_GT_OQ) != 0) {
        const float m_new = _mm512_reduce_max_ps(bm);
        if (m[i] != -std::numeric_limits<float>::infinity()) {
          const __m512 alpha = _mm512_set1_ps(std::exp2(m[i] - m_new));
          float* oi = o + i * dp;
          for (int c = 0; c < dp; c += 16) _mm512_store_ps(oi + c, _mm512_mul_ps(_mm512_load_ps(oi + c), alpha));
          _mm512_store_ps(li, _mm512_mul_ps(_mm512_load_ps(li), alpha));
        }
        m[i] = m_new;
      }
      const __m512 mv = _mm512_set1_ps(m[i]);
      __m512 sum = _mm512_load_ps(li);
      for (int z = 0; z < nv; z += 2) {
        const __m512 p0 = Exp2(_mm512_sub_ps(sv[z], mv), vis[z]);
        const __m512 p1 = Exp2(_mm512_sub_ps(sv[z + 1], mv), vis[z + 1]);
        sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
        _mm512_store_si512(pi + 16 * z, PackBf16(p0, p1));
      }
      _mm512_store_ps(li, sum);
    }
    for (int i = nq; i < kQ; ++i)  // rows past the queries: zeros (their O rows are never read)
      for (int z = 0; z < nv; z += 2) _mm512_store_si512(p16 + i * kK + 16 * z, _mm512_setzero_si512());
  }

  // O += P16 x VB16: per 32 dims, C tiles (queries 0-15 | 16-31) x (dims 0-15 | 16-31).
  void Accumulate(const uint16_t* vb16, int nk32) const {
    for (int c = 0; c < dp; c += 32) {
      LoadC2x2(o + c, dp);
      for (int kc = 0; kc < nk32; kc += 32) Dot2x2(p16 + kc, kK * 2, vb16 + (kc / 2) * (2 * dp) + 2 * c, dp * 4);
      StoreC2x2(o + c, dp);
    }
  }

  // out[i] = O[i] / l[i] for rows i < nq (rows ldo apart).
  void Finish(float* out, int64_t ldo, int nq) const {
    for (int i = 0; i < nq; ++i) {
      const __m512 inv_l = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(_mm512_load_ps(l + 16 * i)));
      for (int c = 0; c < d; c += 16)
        _mm512_mask_storeu_ps(out + i * ldo + c, TailMask(d - c), _mm512_mul_ps(_mm512_load_ps(o + i * dp + c), inv_l));
    }
  }
};

constexpr float kLog2e = 1.44269504088896340736f;

// The steps of tile x of the scratch (head_dim d).
TileSteps TileOf(AmxAttnScratch& scratch, int d, int x) {
  TileSteps t;
  t.d = d;
  t.dp = PaddedDim(d);
  const size_t tile_elems = static_cast<size_t>(t.dp) * kQ;
  t.q16 = scratch.q16.get() + x * tile_elems;
  t.o = scratch.o.get() + x * tile_elems;
  t.m = scratch.ml.get() + x * AmxAttnScratch::kMlFloats;
  t.l = t.m + kQ;
  t.s = scratch.s.get();
  t.p16 = scratch.p16.get();
  return t;
}

// A tile of one AttentionBlockAmx call: its steps, query rows [q0, q1), and its head's offset in
// a row of q and out.
struct TileRef {
  TileSteps steps;
  int q0 = 0, q1 = 0;
  int64_t head_offset = 0;
};

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
  ConvertK(a.k + kb * a.ldk + static_cast<int64_t>(kv_head) * d, a.ldk, d, dp, n_valid, k16);
  ConvertV(a.v + kb * a.ldv + static_cast<int64_t>(kv_head) * d, a.ldv, d, dp, n_valid,
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
  const int d = a.head_dim;
  const int dp = PaddedDim(d);
  const int row_tiles = (t_end - t_begin + kQ - 1) / kQ;
  const int n_heads = head_end - head_begin;
  const int n_tiles = row_tiles * n_heads;
  thread_local AmxAttnScratch scratch;
  scratch.Reserve(dp, n_tiles);
  // Tile x: head head_begin + x % n_heads, rows from the last row tile backwards (the order in
  // which they stop needing key blocks). Per-thread table: no allocation per call once grown.
  thread_local std::vector<TileRef> tiles;
  tiles.resize(n_tiles);
  for (int x = 0; x < n_tiles; ++x) {
    tiles[x].steps = TileOf(scratch, d, x);
    tiles[x].q0 = t_begin + (row_tiles - 1 - x / n_heads) * kQ;
    tiles[x].q1 = std::min(t_end, tiles[x].q0 + kQ);
    tiles[x].head_offset = static_cast<int64_t>(head_begin + x % n_heads) * d;
  }

  LoadTileConfig();
  for (int kb = 0; kb < t_end; kb += kK) {
    const uint16_t* kb16 = kv16 + static_cast<size_t>(kb / kK) * KvBlockElems(dp);
    const uint16_t* vb16 = kb16 + static_cast<size_t>(kK) * dp;
    for (const TileRef& x : tiles) {
      if (kb >= x.q1) continue;
      const TileSteps& t = x.steps;
      const int nq = x.q1 - x.q0;
      if (kb == 0) t.Start(a.q + x.q0 * a.ldq + x.head_offset, a.ldq, nq, a.scale * kLog2e);
      const int nk32 = (std::min(kK, x.q1 - kb) + 31) / 32 * 32;
      t.Scores(kb16, nk32);
      t.Softmax(x.q0 - kb + 1, nq, nk32);
      t.Accumulate(vb16, nk32);
      if (kb + kK >= x.q1) t.Finish(a.out + x.q0 * a.ldo + x.head_offset, a.ldo, nq);
    }
  }
  _tile_release();
}

double AttentionAmxProbeSeconds(int head_dim, int steps_mask, int64_t n) {
  ESTREAM_CHECK(head_dim >= 1 && head_dim <= 512 && steps_mask >= 0 && steps_mask <= 7 && n >= 0,
                "AttentionAmxProbeSeconds: head_dim in [1, 512], steps_mask in [0, 7], n >= 0");
  const int dp = PaddedDim(head_dim);
  AmxAttnScratch scratch;
  scratch.Reserve(dp, 1);
  const TileSteps t = TileOf(scratch, head_dim, 0);
  // Inputs like a prompt's: q, k, v uniform in [-1, 1) (fixed seed), scores of sd ~ sqrt(d / 9).
  std::vector<float> q(static_cast<size_t>(kQ) * head_dim), kv(static_cast<size_t>(kK) * head_dim);
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) * 0x1p-23f - 1.0f;
  };
  for (float& x : q) x = next();
  for (float& x : kv) x = next();
  AttentionArgs a;
  a.k = a.v = kv.data();
  a.ldk = a.ldv = head_dim;
  a.head_dim = head_dim;
  a.n_tokens = kK;
  AlignedPtr<uint16_t> block = AllocAligned<uint16_t>(KvBlockElems(dp));
  AttentionAmxConvertKv(a, 0, 0, block.get());
  const uint16_t* vb16 = block.get() + static_cast<size_t>(kK) * dp;
  LoadTileConfig();
  t.Start(q.data(), head_dim, kQ, kLog2e / std::sqrt(static_cast<float>(head_dim)));
  t.Scores(block.get(), kK);   // S and m of a block every query sees whole, as in most of a
  t.Softmax(kK, kQ, kK);       // long prompt's blocks
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < n; ++r) {
    if (steps_mask & 1) t.Scores(block.get(), kK);
    if (steps_mask & 2) t.Softmax(kK, kQ, kK);
    if (steps_mask & 4) t.Accumulate(vb16, kK);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  _tile_release();
  return seconds;
}

}  // namespace estream::kernels
