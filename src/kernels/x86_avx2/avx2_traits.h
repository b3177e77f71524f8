// The 8-lane AVX2 vector traits of the row ops template (ops_simd_impl.h) and of the fp32
// attention template (attention_x86_impl.h): the member list and each member's contract are there.
// Include only from x86_avx2/ translation units (compiled with the AVX2 flags); everything has
// internal linkage, so no instantiation is ever shared with another ISA's.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "kernels/ops_simd_impl.h"

namespace estream::kernels {
namespace {

// Lanes [0, rest) set (rest clamped to 8), for maskload/maskstore of row tails.
inline __m256i TailMask(int64_t rest) {
  const int r = rest >= 8 ? 8 : static_cast<int>(rest);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HorizontalMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

struct Avx2Traits {
  using V = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kVecs = 2;     // 16 query rows per tile
  static constexpr int kQkRows = 6;   // 6 keys x 2 vectors = 12 accumulators (of 16 registers)
  static constexpr int kKeys = 64;    // keys per block (ST is kKeys x kQ floats)
  static constexpr int kPvRows = 6;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Div(V a, V b) { return _mm256_div_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V MaskBelow(V s, int lane0, int limit) {
    const __m256i lane = _mm256_add_epi32(_mm256_set1_epi32(lane0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 below = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(limit), lane));
    return _mm256_blendv_ps(s, _mm256_set1_ps(-std::numeric_limits<float>::infinity()), below);
  }
  static V Exp2(V x) { return Exp2NonPositive<Avx2Traits>(x); }
  // dst[c][r] = src[r][c] * scale for an 8 x 8 block (rows at stride lds / ldd).
  static void Transpose(const float* src, int64_t lds, float scale, float* dst, int64_t ldd) {
    const __m256 sc = _mm256_set1_ps(scale);
    __m256 r[8], t[8];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 8; ++i) r[i] = _mm256_mul_ps(_mm256_loadu_ps(src + i * lds), sc);
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 8; i += 4) {
      r[i] = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t[i]), _mm256_castps_pd(t[i + 2])));
      r[i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t[i]), _mm256_castps_pd(t[i + 2])));
      r[i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t[i + 1]), _mm256_castps_pd(t[i + 3])));
      r[i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t[i + 1]), _mm256_castps_pd(t[i + 3])));
    }
    // r[4b + j] holds, in 128-bit lane L, (rows 4b..4b+3, column 4L + j).
    _Pragma("GCC unroll 16")
    for (int j = 0; j < 4; ++j) {
      _mm256_storeu_ps(dst + j * ldd, _mm256_permute2f128_ps(r[j], r[4 + j], 0x20));
      _mm256_storeu_ps(dst + (j + 4) * ldd, _mm256_permute2f128_ps(r[j], r[4 + j], 0x31));
    }
  }
  // ---- the row ops' members (ops_simd_impl.h) ----
  static V LoadN(const float* p, int64_t n) { return _mm256_maskload_ps(p, TailMask(n)); }
  static V LoadN(const float* p, int64_t n, V fill) {
    const __m256i m = TailMask(n);
    return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static void StoreN(float* p, V v, int64_t n) { _mm256_maskstore_ps(p, TailMask(n), v); }
  static V ZeroFrom(V v, int64_t n) { return _mm256_and_ps(v, _mm256_castsi256_ps(TailMask(n))); }
  static V Min(V a, V b) { return _mm256_min_ps(a, b); }
  static V Fms(V a, V b, V c) { return _mm256_fmsub_ps(a, b, c); }
  static V Fnma(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  static float ReduceAdd(V v) { return HorizontalSum(v); }
  static float ReduceMax(V v) { return HorizontalMax(v); }
  static V Round(V v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^n for integral n in [-126, 127], built in the exponent field.
  static V Pow2i(V n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static V Pow2Keep(V p, V n, V x, float lim) {
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(lim), _CMP_GE_OQ);
    return _mm256_and_ps(keep, _mm256_mul_ps(p, Pow2i(n)));
  }
  // 2^n applied as 2^(n/2) 2^(n - n/2), so that overflow to inf and gradual underflow round once.
  static V Pow2Scale(V p, V n) {
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  }
  static V SwapPairs(V v) { return _mm256_permute_ps(v, 0xB1); }

  using D = __m256d;
  static constexpr int kDLanes = 4;
  static D DSet1(double x) { return _mm256_set1_pd(x); }
  static D DLoadN(const double* p, int64_t n) {
    const int r = n >= 4 ? 4 : static_cast<int>(n);
    const __m256i m = _mm256_cmpgt_epi64(_mm256_set1_epi64x(r), _mm256_setr_epi64x(0, 1, 2, 3));
    return _mm256_maskload_pd(p, m);
  }
  static D DMul(D a, D b) { return _mm256_mul_pd(a, b); }
  static D DFma(D a, D b, D c) { return _mm256_fmadd_pd(a, b, c); }
  static D DFnma(D a, D b, D c) { return _mm256_fnmadd_pd(a, b, c); }
  static D DRound(D v) { return _mm256_round_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static void DCosSinStore(D k, D c, D s, float* cos_out, float* sin_out) {
    const __m128i q = _mm256_cvtpd_epi32(k);
    const __m128i one = _mm_set1_epi32(1), two = _mm_set1_epi32(2);
    auto widen = [](__m128i m32) { return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(m32)); };
    const __m256d odd = widen(_mm_cmpeq_epi32(_mm_and_si128(q, one), one));
    const __m256d neg_cos = widen(_mm_cmpeq_epi32(_mm_and_si128(_mm_add_epi32(q, one), two), two));
    const __m256d neg_sin = widen(_mm_cmpeq_epi32(_mm_and_si128(q, two), two));
    const __m256d sign = _mm256_set1_pd(-0.0);
    __m256d cos_t = _mm256_blendv_pd(c, s, odd);
    __m256d sin_t = _mm256_blendv_pd(s, c, odd);
    cos_t = _mm256_xor_pd(cos_t, _mm256_and_pd(neg_cos, sign));
    sin_t = _mm256_xor_pd(sin_t, _mm256_and_pd(neg_sin, sign));
    _mm_storeu_ps(cos_out, _mm256_cvtpd_ps(cos_t));
    _mm_storeu_ps(sin_out, _mm256_cvtpd_ps(sin_t));
  }
};

}  // namespace
}  // namespace estream::kernels
