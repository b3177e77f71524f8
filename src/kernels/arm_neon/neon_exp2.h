// 2^x on 4 fp32 lanes for the AArch64 attention kernels (attention_neon.cc, fp32, and
// attention_neon_bf16.cc): one definition, internal linkage in every translation unit that
// includes it (each is compiled with its own -march, so nothing may be shared across them at link
// time). Include only from arm_neon/ translation units.
#pragma once

#include <arm_neon.h>

namespace estream::kernels {
namespace {

// 2^f for f in [-0.5, 0.5]: Taylor polynomial of degree 7 in f ln2 (truncation < 6e-9 relative;
// with Horner rounding within ~1.5u), as the x86 paths.
inline float32x4_t Exp2Poly(float32x4_t f) {
  float32x4_t p = vdupq_n_f32(1.5252733804059840e-05f);
  p = vfmaq_f32(vdupq_n_f32(1.5403530393381609e-04f), p, f);
  p = vfmaq_f32(vdupq_n_f32(1.3333558146428443e-03f), p, f);
  p = vfmaq_f32(vdupq_n_f32(9.6181291076284772e-03f), p, f);
  p = vfmaq_f32(vdupq_n_f32(5.5504108664821580e-02f), p, f);
  p = vfmaq_f32(vdupq_n_f32(2.4022650695910071e-01f), p, f);
  p = vfmaq_f32(vdupq_n_f32(6.9314718055994531e-01f), p, f);
  return vfmaq_f32(vdupq_n_f32(1.0f), p, f);
}

// 2^x for x <= 0 (or -inf); results below 2^-125 become exactly 0 (no denormals, masked keys 0).
inline float32x4_t Exp2NonPositive(float32x4_t x) {
  x = vmaxq_f32(x, vdupq_n_f32(-126.0f));  // -inf -> -126 (then zeroed below)
  const uint32x4_t keep = vcgeq_f32(x, vdupq_n_f32(-125.0f));
  const float32x4_t n = vrndnq_f32(x);
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t r = vmulq_f32(Exp2Poly(vsubq_f32(x, n)), vreinterpretq_f32_s32(e));
  return vreinterpretq_f32_u32(vandq_u32(keep, vreinterpretq_u32_f32(r)));
}

}  // namespace
}  // namespace estream::kernels
