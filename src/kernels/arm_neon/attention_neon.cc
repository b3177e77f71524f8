// AArch64 fp32 causal attention: the blocked online-softmax kernel of attention_x86_impl.h (an
// ISA-neutral template over vector traits) instantiated with 4-lane NEON traits. Every AArch64
// CPU has it (Isa::kNeon and above).
//
// Tile shape for the 32 x 128-bit registers: 4 vectors of queries (16 query rows per tile, as on
// AVX2); the QK step keeps 6 keys x 4 vectors = 24 accumulators, 4 query vectors and a broadcast
// (29 registers), the PV step 6 head-dim rows x 4 vectors likewise.
#include <arm_neon.h>

#include <cstdint>
#include <limits>

#include "kernels/attention_x86_impl.h"
#include "kernels/dispatch.h"

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

struct NeonTraits {
  using V = float32x4_t;
  static constexpr int kLanes = 4;
  static constexpr int kVecs = 4;     // 16 query rows per tile
  static constexpr int kQkRows = 6;   // 6 keys x 4 vectors = 24 accumulators (of 32 registers)
  static constexpr int kKeys = 64;    // keys per block (ST is kKeys x kQ floats)
  static constexpr int kPvRows = 6;
  static V Zero() { return vdupq_n_f32(0.0f); }
  static V Set1(float x) { return vdupq_n_f32(x); }
  static V Load(const float* p) { return vld1q_f32(p); }
  static void Store(float* p, V x) { vst1q_f32(p, x); }
  static V Fma(V a, V b, V c) { return vfmaq_f32(c, a, b); }
  static V Mul(V a, V b) { return vmulq_f32(a, b); }
  static V Add(V a, V b) { return vaddq_f32(a, b); }
  static V Sub(V a, V b) { return vsubq_f32(a, b); }
  static V Div(V a, V b) { return vdivq_f32(a, b); }
  static V Max(V a, V b) { return vmaxq_f32(a, b); }
  static V MaskBelow(V s, int lane0, int limit) {
    static const int32_t kIota[4] = {0, 1, 2, 3};
    const int32x4_t lane = vaddq_s32(vdupq_n_s32(lane0), vld1q_s32(kIota));
    const uint32x4_t below = vcltq_s32(lane, vdupq_n_s32(limit));
    return vbslq_f32(below, vdupq_n_f32(-std::numeric_limits<float>::infinity()), s);
  }
  static V Exp2(V x) { return Exp2NonPositive(x); }
  // dst[c][r] = src[r][c] * scale for a 4 x 4 block (rows at stride lds / ldd).
  static void Transpose(const float* src, int64_t lds, float scale, float* dst, int64_t ldd) {
    const float32x4_t r0 = vmulq_n_f32(vld1q_f32(src), scale);
    const float32x4_t r1 = vmulq_n_f32(vld1q_f32(src + lds), scale);
    const float32x4_t r2 = vmulq_n_f32(vld1q_f32(src + 2 * lds), scale);
    const float32x4_t r3 = vmulq_n_f32(vld1q_f32(src + 3 * lds), scale);
    const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1));  // r0[0] r1[0] r0[2] r1[2]
    const float64x2_t t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));  // r0[1] r1[1] r0[3] r1[3]
    const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3));
    const float64x2_t t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
    vst1q_f32(dst, vreinterpretq_f32_f64(vzip1q_f64(t0, t2)));
    vst1q_f32(dst + ldd, vreinterpretq_f32_f64(vzip1q_f64(t1, t3)));
    vst1q_f32(dst + 2 * ldd, vreinterpretq_f32_f64(vzip2q_f64(t0, t2)));
    vst1q_f32(dst + 3 * ldd, vreinterpretq_f32_f64(vzip2q_f64(t1, t3)));
  }
};

void AttentionBlockNeon(const AttentionArgs& a, int head_begin, int head_end, int t_begin, int t_end) {
  AttentionBlockX86<NeonTraits>(a, head_begin, head_end, t_begin, t_end);
}

}  // namespace

void FillNeonAttention(KernelTable* t) {
  t->attention_block = AttentionBlockNeon;
  t->attention_rows = NeonTraits::kLanes * NeonTraits::kVecs;
  t->attention_scratch_bytes = AttentionScratchBytesX86<NeonTraits>;
}

}  // namespace estream::kernels
