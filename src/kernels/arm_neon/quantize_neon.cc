// NEON quantiser of activations to Q8A (quant/types.h), bit-exact with the scalar QuantizeRowQ8A:
// the same fp32 divisions for d and id, one fp32 product per value and round-half-to-even
// (fcvtns), 8 values per step. Compiled for the ARMv8-A baseline.
#include <arm_neon.h>

#include <cstdint>

#include "kernels/dispatch.h"
#include "quant/types.h"

namespace estream::kernels {
namespace {

void QuantizeQ8ANeon(const float* x, BlockQ8A* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK8A; ++b) {
    const float* xb = x + b * kQK8A;
    float32x4_t v[8];
    for (int i = 0; i < 8; ++i) v[i] = vld1q_f32(xb + 4 * i);
    float32x4_t a = vabsq_f32(v[0]);
    for (int i = 1; i < 8; ++i) a = vmaxq_f32(a, vabsq_f32(v[i]));
    const float amax = vmaxvq_f32(a);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32x4_t q[8];
    for (int i = 0; i < 8; ++i) q[i] = vcvtnq_s32_f32(vmulq_f32(v[i], vdupq_n_f32(id)));
    // |q| <= 127: the narrowing moves are exact.
    int16x8_t h[4];
    for (int i = 0; i < 4; ++i) h[i] = vcombine_s16(vmovn_s32(q[2 * i]), vmovn_s32(q[2 * i + 1]));
    vst1q_s8(y[b].qs, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
    vst1q_s8(y[b].qs + 16, vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
    y[b].d = d;
    y[b].sum[0] = static_cast<int16_t>(vaddvq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3]))));
    y[b].sum[1] = static_cast<int16_t>(vaddvq_s32(vaddq_s32(vaddq_s32(q[4], q[5]), vaddq_s32(q[6], q[7]))));
  }
}

}  // namespace

void FillNeonQuantize(KernelTable* t) { t->quantize_q8a = QuantizeQ8ANeon; }

}  // namespace estream::kernels
