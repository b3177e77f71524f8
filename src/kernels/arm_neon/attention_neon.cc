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

#include "kernels/arm_neon/neon_exp2.h"
#include "kernels/attention_x86_impl.h"
#include "kernels/dispatch.h"

namespace estream::kernels {
namespace {

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
