// AVX2 short convolution (kernels.h, ShortConv): 8 channels per vector, the L taps accumulated
// with FMA in fp32 (B * x rounded once, then one FMA per tap). Compiled with the AVX2 flags only.
#include <immintrin.h>

#include <cstdint>

#include "kernels/dispatch.h"

namespace estream::kernels {
namespace {

void ShortConvRowsAvx2(const float* bcx, int64_t ldb, const float* w, int L, int64_t d, int64_t t_begin,
                       int64_t t_end, float* y, int64_t ldy) {
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* c_row = bcx + t * ldb + d;
    float* out = y + t * ldy;
    const int j0 = t >= L - 1 ? 0 : static_cast<int>(L - 1 - t);  // first tap with s >= 0
    int64_t c = 0;
    for (; c + 8 <= d; c += 8) {
      __m256 acc = _mm256_setzero_ps();
      for (int j = j0; j < L; ++j) {
        const float* row = bcx + (t - (L - 1) + j) * ldb;
        const __m256 bx = _mm256_mul_ps(_mm256_loadu_ps(row + c), _mm256_loadu_ps(row + 2 * d + c));
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + j * d + c), bx, acc);
      }
      _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_loadu_ps(c_row + c), acc));
    }
    for (; c < d; ++c) {  // tail channels, the same operations one lane at a time
      float acc = 0.0f;
      for (int j = j0; j < L; ++j) {
        const float* row = bcx + (t - (L - 1) + j) * ldb;
        acc = __builtin_fmaf(w[j * d + c], row[c] * row[2 * d + c], acc);
      }
      out[c] = c_row[c] * acc;
    }
  }
}

}  // namespace

void FillAvx2ShortConv(KernelTable* t) { t->short_conv_rows = ShortConvRowsAvx2; }

}  // namespace estream::kernels
