// ScaledAddF64 with AVX2 + FMA (compiled with -mavx2 -mfma; see src/moe/CMakeLists.txt).
#include <immintrin.h>

#include "moe/scatter_add.h"

namespace estream::moe {

void ScaledAddF64Avx2(double* acc, const float* v, float a, int64_t n) {
  const __m256d ad = _mm256_set1_pd(a);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256d v0 = _mm256_cvtps_pd(_mm_loadu_ps(v + j));
    const __m256d v1 = _mm256_cvtps_pd(_mm_loadu_ps(v + j + 4));
    _mm256_storeu_pd(acc + j, _mm256_fmadd_pd(ad, v0, _mm256_loadu_pd(acc + j)));
    _mm256_storeu_pd(acc + j + 4, _mm256_fmadd_pd(ad, v1, _mm256_loadu_pd(acc + j + 4)));
  }
  ScaledAddF64Scalar(acc + j, v + j, a, n - j);
}

}  // namespace estream::moe
