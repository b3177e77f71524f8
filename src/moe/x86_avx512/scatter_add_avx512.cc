// ScaledAddF64 with AVX-512F (compiled with -mavx512f -mavx512vl; see src/moe/CMakeLists.txt).
#include <immintrin.h>

#include "moe/scatter_add.h"

// GCC 12 reports the undefined source vector inside _mm512_cvtps_pd's own definition
// (avx512fintrin.h) as maybe used uninitialised; the conversion writes every lane.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace estream::moe {

void ScaledAddF64Avx512(double* acc, const float* v, float a, int64_t n) {
  const __m512d ad = _mm512_set1_pd(a);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512d v0 = _mm512_cvtps_pd(_mm256_loadu_ps(v + j));
    const __m512d v1 = _mm512_cvtps_pd(_mm256_loadu_ps(v + j + 8));
    _mm512_storeu_pd(acc + j, _mm512_fmadd_pd(ad, v0, _mm512_loadu_pd(acc + j)));
    _mm512_storeu_pd(acc + j + 8, _mm512_fmadd_pd(ad, v1, _mm512_loadu_pd(acc + j + 8)));
  }
  if (j < n) {  // at most 15 left: one or two masked vectors
    for (; j < n; j += 8) {
      const int64_t left = n - j < 8 ? n - j : 8;
      const __mmask8 m = static_cast<__mmask8>((1u << left) - 1);
      const __m512d vv = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, v + j));
      _mm512_mask_storeu_pd(acc + j, m, _mm512_fmadd_pd(ad, vv, _mm512_maskz_loadu_pd(m, acc + j)));
    }
  }
}

}  // namespace estream::moe
