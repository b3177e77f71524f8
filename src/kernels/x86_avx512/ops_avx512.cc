// AVX-512 (F/DQ/VL) kernels: causal attention (attention_x86_impl.h) and the row ops
// (ops_simd_impl.h: RMSNorm, RoPE, SwiGLU, router softmax, residual add), both instantiated with
// the 16-lane traits below. Compiled with the AVX-512 flags only; reached through the dispatch
// table when the host has AVX-512.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/attention_lowp.h"
#include "kernels/attention_x86_impl.h"
#include "kernels/x86_avx512/attention_amx.h"
#include "kernels/dispatch.h"
#include "kernels/ops_internal.h"
#include "kernels/ops_simd_impl.h"

// GCC 12 reports the _mm512_undefined_* operand inside some intrinsics (_mm512_reduce_add_ps,
// unpack/shuffle) as uninitialised: a false positive, as in gemm_amx.cc.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace estream::kernels {
namespace {

inline __mmask16 TailMask(int64_t rest) { return rest >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << rest) - 1); }

struct Avx512Traits {
  using V = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kVecs = 4;     // 64 query rows per tile
  static constexpr int kQkRows = 6;   // 6 keys x 4 vectors = 24 accumulators
  static constexpr int kKeys = 64;    // keys per block (ST is kKeys x kQ floats)
  static constexpr int kPvRows = 4;   // 4 head dims x 4 vectors (no tail for head_dim % 4 == 0)
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Div(V a, V b) { return _mm512_div_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V MaskBelow(V s, int lane0, int limit) {
    const __m512i lane = _mm512_add_epi32(_mm512_set1_epi32(lane0),
                                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __mmask16 below = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(limit));
    return _mm512_mask_mov_ps(s, below, _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
  }
  static V Exp2(V x) { return Exp2NonPositive<Avx512Traits>(x); }
  // dst[c][r] = src[r][c] * scale for a 16 x 16 block (rows at stride lds / ldd).
  static void Transpose(const float* src, int64_t lds, float scale, float* dst, int64_t ldd) {
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 r[16], t[16];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 16; ++i) r[i] = _mm512_mul_ps(_mm512_loadu_ps(src + i * lds), sc);
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
      r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
      r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
      r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    // r[4b + j] now holds, in each 128-bit lane L, elements (row 4b..4b+3, column 4L + j).
    _Pragma("GCC unroll 16")
    for (int j = 0; j < 4; ++j) {
      t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);       // lanes 0, 2 of rows 0-3 | 4-7
      t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);   // lanes 1, 3
      t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
      t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    }
    _Pragma("GCC unroll 16")
    for (int j = 0; j < 4; ++j) {
      // column j + 4L for L = 0..3: (rows 0-7 | 8-15) from the lane pairs above.
      _mm512_storeu_ps(dst + (j + 0) * ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88));
      _mm512_storeu_ps(dst + (j + 8) * ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD));
      _mm512_storeu_ps(dst + (j + 4) * ldd, _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88));
      _mm512_storeu_ps(dst + (j + 12) * ldd, _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD));
    }
  }
  // ---- the row ops' members (ops_simd_impl.h) ----
  static V LoadN(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(TailMask(n), p); }
  static V LoadN(const float* p, int64_t n, V fill) { return _mm512_mask_loadu_ps(fill, TailMask(n), p); }
  static void StoreN(float* p, V v, int64_t n) { _mm512_mask_storeu_ps(p, TailMask(n), v); }
  static V ZeroFrom(V v, int64_t n) { return _mm512_maskz_mov_ps(TailMask(n), v); }
  static V Min(V a, V b) { return _mm512_min_ps(a, b); }
  static V Fms(V a, V b, V c) { return _mm512_fmsub_ps(a, b, c); }
  static V Fnma(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static float ReduceAdd(V v) { return _mm512_reduce_add_ps(v); }
  static float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
  static V Round(V v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V Pow2Keep(V p, V n, V x, float lim) {
    return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(lim), _CMP_GE_OQ), p, n);
  }
  static V Pow2Scale(V p, V n) { return _mm512_scalef_ps(p, n); }
  static V SwapPairs(V v) { return _mm512_permute_ps(v, 0xB1); }

  using D = __m512d;
  static constexpr int kDLanes = 8;
  static D DSet1(double x) { return _mm512_set1_pd(x); }
  static D DLoadN(const double* p, int64_t n) {
    return _mm512_maskz_loadu_pd(static_cast<__mmask8>(n >= 8 ? 0xFF : (1u << n) - 1), p);
  }
  static D DMul(D a, D b) { return _mm512_mul_pd(a, b); }
  static D DFma(D a, D b, D c) { return _mm512_fmadd_pd(a, b, c); }
  static D DFnma(D a, D b, D c) { return _mm512_fnmadd_pd(a, b, c); }
  static D DRound(D v) { return _mm512_roundscale_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static void DCosSinStore(D k, D c, D s, float* cos_out, float* sin_out) {
    const __m256i q = _mm512_cvtpd_epi32(k);
    const __mmask8 odd = _mm256_test_epi32_mask(q, _mm256_set1_epi32(1));
    const __mmask8 neg_cos = _mm256_test_epi32_mask(_mm256_add_epi32(q, _mm256_set1_epi32(1)), _mm256_set1_epi32(2));
    const __mmask8 neg_sin = _mm256_test_epi32_mask(q, _mm256_set1_epi32(2));
    __m512d cos_t = _mm512_mask_blend_pd(odd, c, s);
    __m512d sin_t = _mm512_mask_blend_pd(odd, s, c);
    const __m512d zero = _mm512_setzero_pd();
    cos_t = _mm512_mask_sub_pd(cos_t, neg_cos, zero, cos_t);
    sin_t = _mm512_mask_sub_pd(sin_t, neg_sin, zero, sin_t);
    _mm256_storeu_ps(cos_out, _mm512_cvtpd_ps(cos_t));
    _mm256_storeu_ps(sin_out, _mm512_cvtpd_ps(sin_t));
  }
};

void AttentionBlockAvx512(const AttentionArgs& a, int head_begin, int head_end, int t_begin, int t_end) {
  AttentionBlockX86<Avx512Traits>(a, head_begin, head_end, t_begin, t_end);
}

}  // namespace

// Without a selected AMX kernel, the bf16 entries carry the int8/bf16 attention
// (attention_lowp.h) unless ESTREAM_ATTN_LOWP is "0".
void FillAvx512Ops(KernelTable* t) {
  FillAvx512OpsWith(t, AttentionAmxSelected());
  if (!AttentionAmxSelected() && AttentionLowpSelected()) FillAttentionLowpAvx512(t);
}

void FillAvx512OpsWith(KernelTable* t, bool use_amx) {
  t->attention_block = AttentionBlockAvx512;
  t->attention_rows = Avx512Traits::kLanes * Avx512Traits::kVecs;
  t->attention_scratch_bytes = AttentionScratchBytesX86<Avx512Traits>;
  t->attention_convert_bf16 = use_amx ? ConvertKvBlocks<AttentionAmxConvertKv> : nullptr;
  t->attention_kv_bytes_bf16 = use_amx ? AttentionAmxKvBytes : nullptr;
  t->attention_kv_block_bf16 = use_amx ? kAmxAttnKeys : 0;
  t->attention_block_bf16 = use_amx ? AttentionBlockAmx : nullptr;
  t->attention_rows_bf16 = use_amx ? kAmxAttnRows : 0;
  t->attention_first_rows_bf16 = 0;
  t->attention_first_split_bf16 = 0;
  t->attention_q8_bf16 = false;
  t->attention_scratch_bytes_bf16 = use_amx ? AttentionAmxScratchBytes : nullptr;
  FillRowOps<Avx512Traits>(t);
}

}  // namespace estream::kernels
