// Armv8-A baseline (Advanced SIMD) GEMM entries: the quantised GEMM by widening multiplies
// (smull/smlal + sadalp; gemm_neon_impl.h) and the float GEMMs (F32/F16/BF16 weights, fp32 FMA;
// the Q8A quantiser is quantize_neon.cc's). Every AArch64 CPU has them (Isa::kNeon); dotprod/i8mm override the quantised
// entries (gemm_neon_dotprod.cc, gemm_neon_i8mm.cc).
#include <arm_neon.h>

#include <algorithm>
#include <cstdint>

#include "base/fp16.h"
#include "kernels/arm_neon/gemm_neon_impl.h"
#include "kernels/dispatch.h"
#include "kernels/repack.h"
#include "quant/quant.h"

namespace estream::kernels {
namespace {

// ---- float weights ---------------------------------------------------------------------------

// acc + w * x[lane], for a lane that is a constant after unrolling.
inline float32x4_t FmaLane(float32x4_t acc, float32x4_t w, float32x4_t x, int lane) {
  switch (lane & 3) {
    case 0: return vfmaq_laneq_f32(acc, w, x, 0);
    case 1: return vfmaq_laneq_f32(acc, w, x, 1);
    case 2: return vfmaq_laneq_f32(acc, w, x, 2);
    default: return vfmaq_laneq_f32(acc, w, x, 3);
  }
}

// MR rows of x times the 16 columns of a transposed weight panel wt (k x 16 fp32): per k, four
// weight vectors and one lane of each row's x vector feed 4 MR FMAs into 4 MR accumulators
// (16 at MR = 4, plus 4 weight and 4 activation vectors of the 32 registers). Each output is
// summed in k order.
template <int MR>
void FloatPanelTile(const float* wt, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy, int nr) {
  float32x4_t acc[MR][4];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) acc[i][c] = vdupq_n_f32(0.0f);
  int64_t kk = 0;
  for (; kk + 4 <= k; kk += 4) {
    float32x4_t xv[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) xv[i] = vld1q_f32(x + i * ldx + kk);
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) {
      float32x4_t wv[4];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) wv[c] = vld1q_f32(wt + (kk + l) * 16 + 4 * c);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) acc[i][c] = FmaLane(acc[i][c], wv[c], xv[i], l);
    }
  }
  for (; kk < k; ++kk) {
    float32x4_t wv[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) wv[c] = vld1q_f32(wt + kk * 16 + 4 * c);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) acc[i][c] = vfmaq_n_f32(acc[i][c], wv[c], x[i * ldx + kk]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (nr == 16) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) vst1q_f32(y + i * ldy + 4 * c, acc[i][c]);
    } else {
      alignas(16) float tmp[16];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) vst1q_f32(tmp + 4 * c, acc[i][c]);
      for (int j = 0; j < nr; ++j) y[i * ldy + j] = tmp[j];
    }
  }
}

template <int MR = 4>
void FloatPanelTileAny(int mr, const float* wt, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
                       int nr) {
  if constexpr (MR > 1) {
    if (mr < MR) return FloatPanelTileAny<MR - 1>(mr, wt, x, ldx, k, y, ldy, nr);
  }
  FloatPanelTile<MR>(wt, x, ldx, k, y, ldy, nr);
}

// One weight row converted to fp32 into dst[kk * 16] (stride 16: a column of the panel).
template <QuantType kT>
void LoadColumn(const uint8_t* row, int64_t k, float* dst) {
  int64_t kk = 0;
  if constexpr (kT == QuantType::kF32) {
    const float* r = reinterpret_cast<const float*>(row);
    for (; kk < k; ++kk) dst[kk * 16] = r[kk];
  } else {
    const uint16_t* r = reinterpret_cast<const uint16_t*>(row);
    for (; kk + 4 <= k; kk += 4) {
      float32x4_t v;
      if constexpr (kT == QuantType::kF16) {
        v = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(r + kk)));
      } else {
        v = vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(r + kk), 16));
      }
      dst[kk * 16] = vgetq_lane_f32(v, 0);
      dst[(kk + 1) * 16] = vgetq_lane_f32(v, 1);
      dst[(kk + 2) * 16] = vgetq_lane_f32(v, 2);
      dst[(kk + 3) * 16] = vgetq_lane_f32(v, 3);
    }
    for (; kk < k; ++kk) dst[kk * 16] = kT == QuantType::kF16 ? Fp16ToFp32(r[kk]) : Bf16ToFp32(r[kk]);
  }
}

// Float weights (small tensors: routers), fp32 FMA, each output summed in k order (results do not
// depend on how rows and columns are split). Each panel of 16 weight rows is transposed to
// k x 16 fp32 (F16/BF16 converted once) in a per-thread buffer, then every 4 rows of x are
// multiplied by it with by-element FMAs (FloatPanelTile).
template <QuantType kT>
void GemmFloatNeon(const WeightView& w, const float* x, int64_t ldx, int64_t m, int64_t n_begin, int64_t n_end,
                   float* y, int64_t ldy) {
  const int64_t k = w.k;
  const size_t row_bytes = static_cast<size_t>(k) * (kT == QuantType::kF32 ? 4 : 2);
  const uint8_t* wd = static_cast<const uint8_t*>(w.data);
  float* const wt = FloatPanelBuffer(static_cast<size_t>(k) * 16);
  for (int64_t n0 = n_begin; n0 < n_end; n0 += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, n_end - n0));
    for (int j = 0; j < 16; ++j) {
      if (j < nr) {
        LoadColumn<kT>(wd + (n0 + j) * row_bytes, k, wt + j);
      } else {
        for (int64_t kk = 0; kk < k; ++kk) wt[kk * 16 + j] = 0.0f;
      }
    }
    for (int64_t i0 = 0; i0 < m; i0 += 4)
      FloatPanelTileAny(static_cast<int>(std::min<int64_t>(4, m - i0)), wt, x + i0 * ldx, ldx, k,
                        y + i0 * ldy + n0, ldy, nr);
  }
}

}  // namespace

void FillNeonGemm(KernelTable* t) {
  NeonFillQuant<NeonLevel::kNeon>(t);
  t->gemm_f32 = GemmFloatNeon<QuantType::kF32>;
  t->gemm_f16 = GemmFloatNeon<QuantType::kF16>;
  t->gemm_bf16 = GemmFloatNeon<QuantType::kBF16>;
}

}  // namespace estream::kernels
