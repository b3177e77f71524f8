// The 4-lane NEON vector traits of the row ops template (ops_simd_impl.h: the member list and each
// member's contract are there). Include only from arm_neon/ translation units (compiled for
// AArch64, where NEON is part of the base architecture); everything has internal linkage.
// An attention instantiation (attention_x86_impl.h's contract) can derive from NeonTraits and add
// its tile constants, MaskBelow and Transpose.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

namespace estream::kernels {
namespace {

struct NeonTraits {
  using V = float32x4_t;
  static constexpr int kLanes = 4;
  static V Zero() { return vdupq_n_f32(0.0f); }
  static V Set1(float x) { return vdupq_n_f32(x); }
  static V Load(const float* p) { return vld1q_f32(p); }
  static void Store(float* p, V v) { vst1q_f32(p, v); }
  // Tails go through a small buffer: NEON has no masked loads, and reading past p + n could cross
  // into an unmapped page.
  static V LoadN(const float* p, int64_t n) { return LoadN(p, n, Zero()); }
  static V LoadN(const float* p, int64_t n, V fill) {
    if (n >= kLanes) return vld1q_f32(p);
    float buf[kLanes];
    vst1q_f32(buf, fill);
    std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(float));
    return vld1q_f32(buf);
  }
  static void StoreN(float* p, V v, int64_t n) {
    if (n >= kLanes) {
      vst1q_f32(p, v);
      return;
    }
    float buf[kLanes];
    vst1q_f32(buf, v);
    std::memcpy(p, buf, static_cast<size_t>(n) * sizeof(float));
  }
  static V ZeroFrom(V v, int64_t n) {
    if (n >= kLanes) return v;
    static const uint32_t kLane[kLanes] = {0, 1, 2, 3};
    const uint32x4_t keep = vcltq_u32(vld1q_u32(kLane), vdupq_n_u32(static_cast<uint32_t>(n)));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), keep));
  }
  static V Add(V a, V b) { return vaddq_f32(a, b); }
  static V Sub(V a, V b) { return vsubq_f32(a, b); }
  static V Mul(V a, V b) { return vmulq_f32(a, b); }
  static V Div(V a, V b) { return vdivq_f32(a, b); }
  static V Max(V a, V b) { return vmaxq_f32(a, b); }
  static V Min(V a, V b) { return vminq_f32(a, b); }
  static V Fma(V a, V b, V c) { return vfmaq_f32(c, a, b); }
  static V Fnma(V a, V b, V c) { return vfmsq_f32(c, a, b); }
  // a b - c = -(c - a b): one rounding, and the negation is exact.
  static V Fms(V a, V b, V c) { return vnegq_f32(vfmsq_f32(c, a, b)); }
  static float ReduceAdd(V v) { return vaddvq_f32(v); }
  static float ReduceMax(V v) { return vmaxvq_f32(v); }
  static V Round(V v) { return vrndnq_f32(v); }
  // 2^n for integral n in [-126, 127], built in the exponent field.
  static V Pow2i(int32x4_t n) { return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n, vdupq_n_s32(127)), 23)); }
  static V Pow2Keep(V p, V n, V x, float lim) {
    const uint32x4_t keep = vcgeq_f32(x, vdupq_n_f32(lim));
    const V r = vmulq_f32(p, Pow2i(vcvtnq_s32_f32(n)));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(r), keep));
  }
  // 2^n applied as 2^(n/2) 2^(n - n/2), so that overflow to inf and gradual underflow round once.
  static V Pow2Scale(V p, V n) {
    const int32x4_t ni = vcvtnq_s32_f32(n);
    const int32x4_t n1 = vshrq_n_s32(ni, 1);
    return vmulq_f32(vmulq_f32(p, Pow2i(n1)), Pow2i(vsubq_s32(ni, n1)));
  }
  static V SwapPairs(V v) { return vrev64q_f32(v); }

  using D = float64x2_t;
  static constexpr int kDLanes = 2;
  static D DSet1(double x) { return vdupq_n_f64(x); }
  static D DLoadN(const double* p, int64_t n) {
    if (n >= kDLanes) return vld1q_f64(p);
    return vsetq_lane_f64(p[0], vdupq_n_f64(0.0), 0);
  }
  static D DMul(D a, D b) { return vmulq_f64(a, b); }
  static D DFma(D a, D b, D c) { return vfmaq_f64(c, a, b); }
  static D DFnma(D a, D b, D c) { return vfmsq_f64(c, a, b); }
  static D DRound(D v) { return vrndnq_f64(v); }
  static void DCosSinStore(D k, D c, D s, float* cos_out, float* sin_out) {
    const int64x2_t q = vcvtnq_s64_f64(k);
    const int64x2_t one = vdupq_n_s64(1), two = vdupq_n_s64(2);
    const uint64x2_t odd = vtstq_s64(q, one);
    const uint64x2_t neg_cos = vtstq_s64(vaddq_s64(q, one), two);
    const uint64x2_t neg_sin = vtstq_s64(q, two);
    const uint64x2_t sign = vdupq_n_u64(0x8000000000000000ull);
    const uint64x2_t cos_t = vreinterpretq_u64_f64(vbslq_f64(odd, s, c));
    const uint64x2_t sin_t = vreinterpretq_u64_f64(vbslq_f64(odd, c, s));
    vst1_f32(cos_out, vcvt_f32_f64(vreinterpretq_f64_u64(veorq_u64(cos_t, vandq_u64(neg_cos, sign)))));
    vst1_f32(sin_out, vcvt_f32_f64(vreinterpretq_f64_u64(veorq_u64(sin_t, vandq_u64(neg_sin, sign)))));
  }
};

}  // namespace
}  // namespace estream::kernels
