// NEON short convolution (kernels.h, ShortConv): 4 channels per vector, the L taps accumulated
// with FMA in fp32 (B * x rounded once, then one FMA per tap), the same operations as the AVX2
// path. Compiled for the ARMv8-A baseline.
#include <arm_neon.h>

#include <cmath>
#include <cstdint>

#include "kernels/dispatch.h"

namespace estream::kernels {
namespace {

void ShortConvRowsNeon(const float* bcx, int64_t ldb, const float* w, int L, int64_t d, int64_t t_begin,
                       int64_t t_end, float* y, int64_t ldy) {
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* c_row = bcx + t * ldb + d;
    float* out = y + t * ldy;
    const int j0 = t >= L - 1 ? 0 : static_cast<int>(L - 1 - t);  // first tap with s >= 0
    int64_t c = 0;
    for (; c + 4 <= d; c += 4) {
      float32x4_t acc = vdupq_n_f32(0.0f);
      for (int j = j0; j < L; ++j) {
        const float* row = bcx + (t - (L - 1) + j) * ldb;
        const float32x4_t bx = vmulq_f32(vld1q_f32(row + c), vld1q_f32(row + 2 * d + c));
        acc = vfmaq_f32(acc, vld1q_f32(w + j * d + c), bx);
      }
      vst1q_f32(out + c, vmulq_f32(vld1q_f32(c_row + c), acc));
    }
    for (; c < d; ++c) {  // tail channels, the same operations one lane at a time
      float acc = 0.0f;
      for (int j = j0; j < L; ++j) {
        const float* row = bcx + (t - (L - 1) + j) * ldb;
        acc = std::fma(w[j * d + c], row[c] * row[2 * d + c], acc);
      }
      out[c] = c_row[c] * acc;
    }
  }
}

}  // namespace

void FillNeonShortConv(KernelTable* t) { t->short_conv_rows = ShortConvRowsNeon; }

}  // namespace estream::kernels
