// ScaledAddF64 with AArch64 Advanced SIMD (every AArch64 CPU; see src/moe/CMakeLists.txt): fp32
// values widened to fp64 two at a time (fcvtl/fcvtl2), then one fma per pair, four pairs per
// iteration. fma(a, v, acc) rounds once, like the scalar a * v + acc whose product is exact.
#include <arm_neon.h>

#include "moe/scatter_add.h"

namespace estream::moe {

void ScaledAddF64Neon(double* acc, const float* v, float a, int64_t n) {
  const float64x2_t ad = vdupq_n_f64(a);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const float32x4_t v0 = vld1q_f32(v + j), v1 = vld1q_f32(v + j + 4);
    vst1q_f64(acc + j, vfmaq_f64(vld1q_f64(acc + j), ad, vcvt_f64_f32(vget_low_f32(v0))));
    vst1q_f64(acc + j + 2, vfmaq_f64(vld1q_f64(acc + j + 2), ad, vcvt_high_f64_f32(v0)));
    vst1q_f64(acc + j + 4, vfmaq_f64(vld1q_f64(acc + j + 4), ad, vcvt_f64_f32(vget_low_f32(v1))));
    vst1q_f64(acc + j + 6, vfmaq_f64(vld1q_f64(acc + j + 6), ad, vcvt_high_f64_f32(v1)));
  }
  const double as = a;
  for (; j < n; ++j) acc[j] += as * static_cast<double>(v[j]);
}

}  // namespace estream::moe
