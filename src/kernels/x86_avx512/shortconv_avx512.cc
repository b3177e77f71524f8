// AVX-512 short convolution (kernels.h, ShortConv): 16 channels per vector (masked tail), the L
// taps accumulated with FMA in fp32. Compiled with the AVX-512 flags only.
#include <immintrin.h>

#include <cstdint>

#include "kernels/dispatch.h"

namespace estream::kernels {
namespace {

void ShortConvRowsAvx512(const float* bcx, int64_t ldb, const float* w, int L, int64_t d, int64_t t_begin,
                         int64_t t_end, float* y, int64_t ldy) {
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* c_row = bcx + t * ldb + d;
    float* out = y + t * ldy;
    const int j0 = t >= L - 1 ? 0 : static_cast<int>(L - 1 - t);  // first tap with s >= 0
    for (int64_t c = 0; c < d; c += 16) {
      const __mmask16 m = d - c >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (d - c)) - 1);
      __m512 acc = _mm512_setzero_ps();
      for (int j = j0; j < L; ++j) {
        const float* row = bcx + (t - (L - 1) + j) * ldb;
        const __m512 bx = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + c), _mm512_maskz_loadu_ps(m, row + 2 * d + c));
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + j * d + c), bx, acc);
      }
      _mm512_mask_storeu_ps(out + c, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, c_row + c), acc));
    }
  }
}

}  // namespace

void FillAvx512ShortConv(KernelTable* t) { t->short_conv_rows = ShortConvRowsAvx512; }

}  // namespace estream::kernels
