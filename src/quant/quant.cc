// Scalar reference quantisation and dequantisation (see quant.h).
//
// Every formula follows the GGUF block definitions in the order ggml's reference evaluates them
// (e.g. Q6_K is (d * scale) * q, Q4_K is d1 * q - m1), because float arithmetic is not
// associative and the shared test vectors demand bit-exact results. This file is compiled
// without FMA contraction (ISO C++ mode: -ffp-contract=off), which the exactness relies on.
// QuantizeRowQ8A/DequantizeRowQ8A live in q8a.cc (owned by the kernels).
#include "quant/quant.h"

#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/fp16.h"

namespace estream {
namespace {

// ---- dequantisation, one block at a time -------------------------------------------------

void DequantQ4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const int x0 = (x[i].qs[j] & 0x0F) - 8;
      const int x1 = (x[i].qs[j] >> 4) - 8;
      y[i * kQK4_0 + j] = x0 * d;
      y[i * kQK4_0 + j + kQK4_0 / 2] = x1 * d;
    }
  }
}

void DequantQ4_1(const BlockQ4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const float m = Fp16ToFp32(x[i].m);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      const int x0 = x[i].qs[j] & 0x0F;
      const int x1 = x[i].qs[j] >> 4;
      y[i * kQK4_1 + j] = x0 * d + m;
      y[i * kQK4_1 + j + kQK4_1 / 2] = x1 * d + m;
    }
  }
}

void DequantQ5_0(const BlockQ5_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof(qh));
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      // Bit j of qh is the 5th bit of value j; bit j + 16 that of value j + 16.
      const uint8_t xh0 = static_cast<uint8_t>(((qh >> j) << 4) & 0x10);
      const uint8_t xh1 = static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
      const int x0 = ((x[i].qs[j] & 0x0F) | xh0) - 16;
      const int x1 = ((x[i].qs[j] >> 4) | xh1) - 16;
      y[i * kQK5_0 + j] = x0 * d;
      y[i * kQK5_0 + j + kQK5_0 / 2] = x1 * d;
    }
  }
}

void DequantQ5_1(const BlockQ5_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const float m = Fp16ToFp32(x[i].m);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, sizeof(qh));
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const uint8_t xh0 = static_cast<uint8_t>(((qh >> j) << 4) & 0x10);
      const uint8_t xh1 = static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
      const int x0 = (x[i].qs[j] & 0x0F) | xh0;
      const int x1 = (x[i].qs[j] >> 4) | xh1;
      y[i * kQK5_1 + j] = x0 * d + m;
      y[i * kQK5_1 + j + kQK5_1 / 2] = x1 * d + m;
    }
  }
}

void DequantQ8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[i * kQK8_0 + j] = x[i].qs[j] * d;
  }
}

// The 12 scale bytes of Q4_K/Q5_K pack 8 (scale, min) pairs of 6 bits: pairs 0..3 sit in the
// low 6 bits of bytes 0..3 (scales) and 4..7 (mins); pairs 4..7 keep their low 4 bits in bytes
// 8..11 and their top 2 bits in the spare top bits of bytes 0..7.
inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void DequantQ4_K(const BlockQ4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q = x[i].qs;
    const float d = Fp16ToFp32(x[i].d);
    const float dmin = Fp16ToFp32(x[i].dmin);
    int is = 0;
    for (int j = 0; j < kQK_K; j += 64) {
      uint8_t sc, m;
      ScaleMinK4(is + 0, x[i].scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = dmin * m;
      ScaleMinK4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

void DequantQ5_K(const BlockQ5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    const float d = Fp16ToFp32(x[i].d);
    const float dmin = Fp16ToFp32(x[i].dmin);
    int is = 0;
    uint8_t u1 = 1, u2 = 2;  // the qh bits of the low and high nibble of this 64-value group
    for (int j = 0; j < kQK_K; j += 64) {
      uint8_t sc, m;
      ScaleMinK4(is + 0, x[i].scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = dmin * m;
      ScaleMinK4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0x0F) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      is += 2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

void DequantQ6_K(const BlockQ6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    // Each 128-value half: 64 ql bytes (two nibbles each) and 32 qh bytes (four 2-bit fields).
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int8_t>((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int8_t>((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// roundf (half away from zero) without the libm call: |x| <= 127.5 here, so x + 0.5 is exact in
// double and truncation gives the same integer as roundf for every float input.
inline int RoundHalfAway(float x) {
  const double d = x;
  return d >= 0 ? static_cast<int>(d + 0.5) : -static_cast<int>(0.5 - d);
}

int64_t Blocks(QuantType t, int64_t n) {
  const TypeTraits* tr = GetTypeTraits(t);
  ESTREAM_CHECK(tr != nullptr, "unknown quant type");
  ESTREAM_CHECK(n >= 0 && n % tr->block_size == 0, "row length is not a multiple of the block size");
  return n / tr->block_size;
}

}  // namespace

bool CanDequantize(QuantType t) {
  switch (t) {
    case QuantType::kF32: case QuantType::kF16: case QuantType::kBF16:
    case QuantType::kQ4_0: case QuantType::kQ4_1: case QuantType::kQ5_0: case QuantType::kQ5_1:
    case QuantType::kQ8_0: case QuantType::kQ4_K: case QuantType::kQ5_K: case QuantType::kQ6_K:
      return true;
    default:
      return false;
  }
}

bool CanQuantize(QuantType t) {
  switch (t) {
    case QuantType::kF32: case QuantType::kF16: case QuantType::kBF16:
    case QuantType::kQ4_0: case QuantType::kQ8_0:
      return true;
    default:
      return false;
  }
}

void DequantizeRow(QuantType t, const void* src, float* dst, int64_t n) {
  const int64_t nb = Blocks(t, n);
  switch (t) {
    case QuantType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case QuantType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(s[i]);
      return;
    }
    case QuantType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(s[i]);
      return;
    }
    case QuantType::kQ4_0: return DequantQ4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case QuantType::kQ4_1: return DequantQ4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case QuantType::kQ5_0: return DequantQ5_0(static_cast<const BlockQ5_0*>(src), dst, nb);
    case QuantType::kQ5_1: return DequantQ5_1(static_cast<const BlockQ5_1*>(src), dst, nb);
    case QuantType::kQ8_0: return DequantQ8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case QuantType::kQ4_K: return DequantQ4_K(static_cast<const BlockQ4_K*>(src), dst, nb);
    case QuantType::kQ5_K: return DequantQ5_K(static_cast<const BlockQ5_K*>(src), dst, nb);
    case QuantType::kQ6_K: return DequantQ6_K(static_cast<const BlockQ6_K*>(src), dst, nb);
    default:
      ESTREAM_CHECK(false, "DequantizeRow: type not supported (check CanDequantize first)");
  }
}

void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n) {
  ESTREAM_CHECK(n % kQK8_0 == 0, "QuantizeRowQ8_0: n must be a multiple of 32");
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float* xb = x + i * kQK8_0;
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) {
      const float a = std::fabs(xb[j]);
      amax = amax > a ? amax : a;  // not fmax: a NaN propagates as in the reference
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK8_0; ++j) y[i].qs[j] = static_cast<int8_t>(RoundHalfAway(xb[j] * id));
  }
}

void QuantizeRowQ4_0(const float* x, BlockQ4_0* y, int64_t n) {
  ESTREAM_CHECK(n % kQK4_0 == 0, "QuantizeRowQ4_0: n must be a multiple of 32");
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const float* xb = x + i * kQK4_0;
    // The signed value of largest magnitude maps to -8, so the full range [-8, 7] is used on
    // the side where it matters (ties keep the first such value, as the reference does).
    float amax = 0.0f, vmax = 0.0f;
    for (int j = 0; j < kQK4_0; ++j) {
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        vmax = xb[j];
      }
    }
    const float d = vmax / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const float x0 = xb[j] * id;
      const float x1 = xb[j + kQK4_0 / 2] * id;
      // Truncation of x + 8.5 rounds half up; the value is >= 0 since |x * id| <= 8.
      int q0 = static_cast<int8_t>(x0 + 8.5f);
      int q1 = static_cast<int8_t>(x1 + 8.5f);
      if (q0 > 15) q0 = 15;
      if (q1 > 15) q1 = 15;
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeRow(QuantType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case QuantType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case QuantType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToFp16(src[i]);
      return;
    }
    case QuantType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToBf16(src[i]);
      return;
    }
    case QuantType::kQ8_0: return QuantizeRowQ8_0(src, static_cast<BlockQ8_0*>(dst), n);
    case QuantType::kQ4_0: return QuantizeRowQ4_0(src, static_cast<BlockQ4_0*>(dst), n);
    default:
      ESTREAM_CHECK(false, "QuantizeRow: type not supported (check CanQuantize first)");
  }
}

}  // namespace estream
