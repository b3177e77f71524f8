// Scalar reference GEMM kernels (the KernelTable's gemm_* entries at Isa::kScalar) and the
// scalar Q8A quantiser. Plain C++, no intrinsics: the behaviour every fast path must match.
//
// Quantised kernels: per 32-value block b, the integer dot of the unsigned weight values with
// the int8 activations, minus Z * (activation sum) for the type's zero point Z, is exact in
// int32; it is scaled by d_w * d_x in fp32 and summed over the blocks in order (plus, for
// Q4_K, mneg * (d_x * sum)). Float kernels accumulate in fp32 in k order.
#include <cstring>

#include "base/fp16.h"
#include "kernels/dispatch.h"
#include "kernels/repack.h"
#include "quant/quant.h"

namespace estream::kernels {
namespace {

// The contribution of one decoded weight block to one output, given activation block xb.
inline float BlockDot(const Block32& w, int zero_point, const BlockQ8A& xb) {
  int i0 = 0, i1 = 0;
  for (int v = 0; v < 16; ++v) i0 += static_cast<int>(w.q[v]) * xb.qs[v];
  for (int v = 16; v < 32; ++v) i1 += static_cast<int>(w.q[v]) * xb.qs[v];
  i0 -= zero_point * xb.sum[0];
  i1 -= zero_point * xb.sum[1];
  float r;
  if (w.d[0] == w.d[1]) {
    r = static_cast<float>(i0 + i1) * (w.d[0] * xb.d);
  } else {
    r = static_cast<float>(i0) * (w.d[0] * xb.d) + static_cast<float>(i1) * (w.d[1] * xb.d);
  }
  if (w.mneg != 0.0f) r += w.mneg * (xb.d * static_cast<float>(xb.sum[0] + xb.sum[1]));
  return r;
}

// Decodes row r of block b of a packed panel (the inverse of PackPanel for one row): the scales
// are formed in fp32 as the fast kernels form them (exact products).
void DecodePacked(QuantType t, const uint8_t* panel, int64_t kb, int64_t b, int r, Block32* out) {
  const uint8_t* sup = panel + (b / 8) * PackedSuperBytes(t);
  const uint8_t* sc = panel + PackedBlockScaleOffset(t, kb) + b * PackedScaleBytes(t);
  const uint8_t* q = panel + PackedScaleSection(t, kb) + b * PackedQuantBytes(t);
  auto half = [](const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return Fp16ToFp32(h);
  };
  out->mneg = 0.0f;
  switch (t) {
    case QuantType::kQ4_0:
    case QuantType::kQ8_0:
      out->d[0] = out->d[1] = half(sc + 2 * r);
      break;
    case QuantType::kQ4_K:
      out->d[0] = out->d[1] = half(sup + 2 * r) * static_cast<float>(sc[r]);
      out->mneg = half(sup + 32 + 2 * r) * static_cast<float>(sc[16 + r]);
      break;
    default:  // Q6_K
      out->d[0] = half(sup + 2 * r) * static_cast<float>(static_cast<int8_t>(sc[r]));
      out->d[1] = half(sup + 2 * r) * static_cast<float>(static_cast<int8_t>(sc[16 + r]));
      break;
  }
  if (t == QuantType::kQ8_0 || t == QuantType::kQ6_K) {
    for (int s = 0; s < 8; ++s)
      for (int j = 0; j < 4; ++j) out->q[4 * s + j] = q[(s * 16 + r) * 4 + j];
  } else {
    for (int s = 0; s < 4; ++s)
      for (int j = 0; j < 4; ++j) {
        const uint8_t v = q[(s * 16 + r) * 4 + j];
        out->q[4 * s + j] = v & 0x0F;
        out->q[16 + 4 * s + j] = v >> 4;
      }
  }
}

template <QuantType kType, bool kPacked>
void GemmScalar(const WeightView& w, const BlockQ8A* xq, int64_t m, int64_t n_begin, int64_t n_end, float* y,
                int64_t ldy) {
  const int64_t kb = w.k / 32;
  const int zp = ZeroPoint(kType);
  const size_t row_bytes = RowBytes(kType, w.k);
  const int64_t panel_bytes = PackedPanelBytes(kType, w.k);
  for (int64_t n = n_begin; n < n_end; ++n) {
    for (int64_t i = 0; i < m; ++i) y[i * ldy + n] = 0.0f;
    for (int64_t b = 0; b < kb; ++b) {
      Block32 blk;
      if (kPacked) {
        const uint8_t* p = static_cast<const uint8_t*>(w.data) + (n / kPackRows) * panel_bytes;
        DecodePacked(kType, p, kb, b, static_cast<int>(n % kPackRows), &blk);
      } else {
        DecodeBlock32(kType, static_cast<const uint8_t*>(w.data) + n * row_bytes, b, &blk);
      }
      for (int64_t i = 0; i < m; ++i) y[i * ldy + n] += BlockDot(blk, zp, xq[i * kb + b]);
    }
  }
}

inline float LoadF(const float* p, int64_t i) { return p[i]; }
inline float LoadF(const uint16_t* p, int64_t i, bool bf16) { return bf16 ? Bf16ToFp32(p[i]) : Fp16ToFp32(p[i]); }

template <QuantType kType>
void GemmFloatScalar(const WeightView& w, const float* x, int64_t ldx, int64_t m, int64_t n_begin, int64_t n_end,
                     float* y, int64_t ldy) {
  const int64_t k = w.k;
  for (int64_t n = n_begin; n < n_end; ++n) {
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.0f;
      if constexpr (kType == QuantType::kF32) {
        const float* wr = static_cast<const float*>(w.data) + n * k;
        for (int64_t j = 0; j < k; ++j) acc += x[i * ldx + j] * LoadF(wr, j);
      } else {
        const uint16_t* wr = static_cast<const uint16_t*>(w.data) + n * k;
        for (int64_t j = 0; j < k; ++j) acc += x[i * ldx + j] * LoadF(wr, j, kType == QuantType::kBF16);
      }
      y[i * ldy + n] = acc;
    }
  }
}

}  // namespace

void FillScalarGemm(KernelTable* t) {
  t->gemm_q4_0 = GemmScalar<QuantType::kQ4_0, false>;
  t->gemm_q8_0 = GemmScalar<QuantType::kQ8_0, false>;
  t->gemm_q4_k = GemmScalar<QuantType::kQ4_K, false>;
  t->gemm_q6_k = GemmScalar<QuantType::kQ6_K, false>;
  t->gemm_q4_0_packed = GemmScalar<QuantType::kQ4_0, true>;
  t->gemm_q8_0_packed = GemmScalar<QuantType::kQ8_0, true>;
  t->gemm_q4_k_packed = GemmScalar<QuantType::kQ4_K, true>;
  t->gemm_q6_k_packed = GemmScalar<QuantType::kQ6_K, true>;
  t->gemm_f32 = GemmFloatScalar<QuantType::kF32>;
  t->gemm_f16 = GemmFloatScalar<QuantType::kF16>;
  t->gemm_bf16 = GemmFloatScalar<QuantType::kBF16>;
  t->quantize_q8a = QuantizeRowQ8A;
}

}  // namespace estream::kernels
