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

// The contribution of one decoded weight block to one output, given activation block xb; lut:
// the format's code table (PackedLut) or nullptr.
inline float BlockDot(const Block32& w, int zero_point, const uint8_t* lut, const BlockQ8A& xb) {
  int i0 = 0, i1 = 0;
  for (int v = 0; v < 16; ++v) i0 += static_cast<int>(lut ? lut[w.q[v]] : w.q[v]) * xb.qs[v];
  for (int v = 16; v < 32; ++v) i1 += static_cast<int>(lut ? lut[w.q[v]] : w.q[v]) * xb.qs[v];
  i0 -= zero_point * xb.sum[0];
  i1 -= zero_point * xb.sum[1];
  float r;
  if (w.d[0] == w.d[1]) {
    r = static_cast<float>(i0 + i1) * (w.d[0] * xb.d);
  } else {
    r = static_cast<float>(i0) * (w.d[0] * xb.d) + static_cast<float>(i1) * (w.d[1] * xb.d);
  }
  if (w.m[0] != w.m[1]) {
    r += w.m[0] * (xb.d * static_cast<float>(xb.sum[0])) + w.m[1] * (xb.d * static_cast<float>(xb.sum[1]));
  } else if (w.m[0] != 0.0f) {
    r += w.m[0] * (xb.d * static_cast<float>(xb.sum[0] + xb.sum[1]));
  }
  return r;
}

inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFp32(h);
}

// Decodes row r of block b of a packed panel (the inverse of PackPanel for one row): the scales
// are formed in fp32 as the fast kernels form them (exact products).
void DecodePacked(QuantType t, const uint8_t* panel, int64_t kb, int64_t b, int r, Block32* out) {
  const uint8_t* sup = panel + (b / 8) * PackedSuperBytes(t);
  const uint8_t* sc = panel + PackedBlockScaleOffset(t, kb) + b * PackedScaleBytes(t);
  const uint8_t* q = panel + PackedScaleSection(t, kb) + b * PackedQuantBytes(t);
  out->m[0] = out->m[1] = 0.0f;
  auto i8 = [](uint8_t v) { return static_cast<float>(static_cast<int8_t>(v)); };
  switch (PackedFormat(t)) {
    case QuantType::kQ4_0:
    case QuantType::kQ8_0:
    case QuantType::kIQ4_NL:
      out->d[0] = out->d[1] = Half(sc + 2 * r);
      break;
    case QuantType::kQ4_1:
    case QuantType::kQ5_1:
      out->d[0] = out->d[1] = Half(sc + 2 * r);
      out->m[0] = out->m[1] = Half(sc + 32 + 2 * r);
      break;
    case QuantType::kQ4_K:
    case QuantType::kQ5_K:
      out->d[0] = out->d[1] = Half(sup + 2 * r) * static_cast<float>(sc[r]);
      out->m[0] = out->m[1] = Half(sup + 32 + 2 * r) * static_cast<float>(sc[16 + r]);
      break;
    case QuantType::kQ6_K:
    case QuantType::kQ3_K:
      out->d[0] = Half(sup + 2 * r) * i8(sc[r]);
      out->d[1] = Half(sup + 2 * r) * i8(sc[16 + r]);
      break;
    case QuantType::kQ2_K:
      for (int h = 0; h < 2; ++h) {
        out->d[h] = Half(sup + 2 * r) * static_cast<float>(sc[16 * h + r]);
        out->m[h] = Half(sup + 32 + 2 * r) * static_cast<float>(sc[32 + 16 * h + r]);
      }
      break;
    case QuantType::kIQ4_XS:
      out->d[0] = out->d[1] = Half(sup + 2 * r) * i8(sc[r]);
      break;
    case QuantType::kMXFP4:
      out->d[0] = out->d[1] = E8M0HalfToFp32(sc[r]);
      break;
    default:
      break;
  }
  if (!PackedNibbles(t)) {
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
  const uint8_t* lut = PackedLut(kType);
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
      for (int64_t i = 0; i < m; ++i) y[i * ldy + n] += BlockDot(blk, zp, lut, xq[i * kb + b]);
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

template <QuantType kType>
void SetScalar(KernelTable* t) {
  t->SetQuant(kType, false, GemmScalar<kType, false>);
  t->SetQuant(kType, true, GemmScalar<kType, true>);
}

template <QuantType... kTypes>
void SetScalarAll(KernelTable* t) {
  (SetScalar<kTypes>(t), ...);
}

}  // namespace

void FillScalarGemm(KernelTable* t) {
  SetScalarAll<QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ6_K, QuantType::kQ4_1,
               QuantType::kQ5_0, QuantType::kQ5_1, QuantType::kQ5_K, QuantType::kQ3_K, QuantType::kQ2_K,
               QuantType::kIQ4_NL, QuantType::kIQ4_XS, QuantType::kMXFP4>(t);
  t->gemm_f32 = GemmFloatScalar<QuantType::kF32>;
  t->gemm_f16 = GemmFloatScalar<QuantType::kF16>;
  t->gemm_bf16 = GemmFloatScalar<QuantType::kBF16>;
  t->quantize_q8a = QuantizeRowQ8A;
}

}  // namespace estream::kernels
