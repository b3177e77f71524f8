// Scalar reference quantisation and dequantisation (see quant.h).
//
// Every formula follows the GGUF block definitions in the order ggml's reference evaluates them
// (e.g. Q6_K is (d * scale) * q, Q4_K is d1 * q - m1), because float arithmetic is not
// associative and the shared test vectors demand bit-exact results. This file is compiled
// without FMA contraction (ISO C++ mode: -ffp-contract=off), which the exactness relies on.
// QuantizeRowQ8A/DequantizeRowQ8A live in q8a.cc (owned by the kernels).
#include "quant/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/fp16.h"

namespace estream {
namespace {

// ---- dequantisation, one block at a time -------------------------------------------------

// One 32-value block of the 4/5-bit formats: value j (j < 16) is the low nibble of qs[j], value
// j + 16 the high one; for the 5-bit formats bit j of qh is the 5th bit of value j and bit j + 16
// that of value j + 16. y = (q - zero) * d, plus m for the formats with a min.
template <bool kFiveBits, bool kMin>
inline void DequantBlock32(const uint8_t* qs, const uint8_t* qh_bytes, float d, float m, int zero, float* y) {
  uint32_t qh = 0;
  if constexpr (kFiveBits) std::memcpy(&qh, qh_bytes, sizeof(qh));
  for (int j = 0; j < 16; ++j) {
    int q0 = qs[j] & 0x0F, q1 = qs[j] >> 4;
    if constexpr (kFiveBits) {
      q0 |= static_cast<uint8_t>(((qh >> j) << 4) & 0x10);
      q1 |= static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
    }
    const int x0 = q0 - zero, x1 = q1 - zero;
    y[j] = kMin ? x0 * d + m : x0 * d;
    y[j + 16] = kMin ? x1 * d + m : x1 * d;
  }
}

void DequantQ4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i)
    DequantBlock32<false, false>(x[i].qs, nullptr, Fp16ToFp32(x[i].d), 0, 8, y + i * kQK4_0);
}

void DequantQ4_1(const BlockQ4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i)
    DequantBlock32<false, true>(x[i].qs, nullptr, Fp16ToFp32(x[i].d), Fp16ToFp32(x[i].m), 0, y + i * kQK4_1);
}

void DequantQ5_0(const BlockQ5_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i)
    DequantBlock32<true, false>(x[i].qs, x[i].qh, Fp16ToFp32(x[i].d), 0, 16, y + i * kQK5_0);
}

void DequantQ5_1(const BlockQ5_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i)
    DequantBlock32<true, true>(x[i].qs, x[i].qh, Fp16ToFp32(x[i].d), Fp16ToFp32(x[i].m), 0, y + i * kQK5_1);
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

// 16-value sub-blocks: 128-value half n, 32-value group j (bits 2j..2j+1 of qs[32n + l]), l < 32.
void DequantQ2_K(const BlockQ2_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const float dmin = Fp16ToFp32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    int is = 0;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = x[i].scales[is++];
          const float dl = d * (sc & 0x0F);
          const float ml = dmin * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
        }
      }
      q += 32;
    }
  }
}

// The 16 6-bit scales of a Q3_K super-block (stored + 32): values 0..7 keep their low 4 bits in
// the low / high nibbles of bytes 0..7 (value j: byte j % 8, nibble j / 8), values 8..15 in the
// high nibbles, and all of them their top 2 bits in bytes 8..11 (value j: byte 8 + j % 4, bits
// 2 (j / 4)).
inline int ScaleQ3K(const uint8_t* s, int j) {
  const int lo = j < 8 ? (s[j] & 0x0F) : (s[j - 8] >> 4);
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

void DequantQ3_K(const BlockQ3_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d_all = Fp16ToFp32(x[i].d);
    const uint8_t* q = x[i].qs;
    const uint8_t* hm = x[i].hmask;
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * static_cast<float>(ScaleQ3K(x[i].scales, is++));
          for (int l = 16 * half; l < 16 * half + 16; ++l)
            *y++ = dl * static_cast<float>(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
        }
        m = static_cast<uint8_t>(m << 1);
      }
      q += 32;
    }
  }
}

void DequantIQ4_NL(const BlockIQ4_NL* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    for (int j = 0; j < kQK4_NL / 2; ++j) {
      y[i * kQK4_NL + j] = d * kIq4NlValues[x[i].qs[j] & 0x0F];
      y[i * kQK4_NL + j + kQK4_NL / 2] = d * kIq4NlValues[x[i].qs[j] >> 4];
    }
  }
}

inline int ScaleIQ4XS(const BlockIQ4_XS& x, int ib) {
  return (((x.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F) | (((x.scales_h >> (2 * ib)) & 3) << 4)) - 32;
}

void DequantIQ4_XS(const BlockIQ4_XS* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const uint8_t* qs = x[i].qs;
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      const float dl = d * static_cast<float>(ScaleIQ4XS(x[i], ib));
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * kIq4NlValues[qs[j] & 0x0F];
        y[j + 16] = dl * kIq4NlValues[qs[j] >> 4];
      }
      y += 32;
      qs += 16;
    }
  }
}

void DequantMXFP4(const BlockMXFP4* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = E8M0HalfToFp32(x[i].e);
    for (int j = 0; j < kQKMxfp4 / 2; ++j) {
      y[i * kQKMxfp4 + j] = kMxfp4Values[x[i].qs[j] & 0x0F] * d;
      y[i * kQKMxfp4 + j + kQKMxfp4 / 2] = kMxfp4Values[x[i].qs[j] >> 4] * d;
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

// ---- quantisers of the other types (round to nearest; see quant.h for how they differ) -------

inline int NearestInt(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int Clamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// The signed value of largest magnitude among x[0..n) (the first one on ties).
inline float SignedMax(const float* x, int n) {
  float amax = 0.0f, vmax = 0.0f;
  for (int j = 0; j < n; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      vmax = x[j];
    }
  return vmax;
}

// Nearest entry of a 16-value table (first on ties).
inline int NearestIndex(const int8_t* table, float v) {
  int best = 0;
  float err = std::fabs(v - table[0]);
  for (int q = 1; q < 16; ++q) {
    const float e = std::fabs(v - table[q]);
    if (e < err) {
      err = e;
      best = q;
    }
  }
  return best;
}

// The smallest and largest of the n values at x.
inline void BlockRange(const float* x, int n, float* mn, float* mx) {
  *mn = *mx = x[0];
  for (int j = 1; j < n; ++j) {
    *mn = std::min(*mn, x[j]);
    *mx = std::max(*mx, x[j]);
  }
}

// Stores the 5-bit values q0 (value j) and q1 (value j + 16) of a Q5_0/Q5_1 block: low nibbles
// in qs[j], high bits at bits j and j + 16 of qh.
inline void PutQ5Pair(int j, int q0, int q1, uint8_t* qs, uint32_t* qh) {
  qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
  *qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
  *qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + 16);
}

void QuantizeRowQ4_1(const float* x, BlockQ4_1* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_1; ++i) {
    const float* xb = x + i * kQK4_1;
    float mn, mx;
    BlockRange(xb, kQK4_1, &mn, &mx);
    const float d = (mx - mn) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    y[i].m = Fp32ToFp16(mn);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((xb[j] - mn) * id + 0.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>((xb[j + 16] - mn) * id + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeRowQ5_0(const float* x, BlockQ5_0* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK5_0; ++i) {
    const float* xb = x + i * kQK5_0;
    const float d = SignedMax(xb, kQK5_0) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const int q0 = std::min(31, static_cast<int>(static_cast<int8_t>(xb[j] * id + 16.5f)));
      const int q1 = std::min(31, static_cast<int>(static_cast<int8_t>(xb[j + 16] * id + 16.5f)));
      PutQ5Pair(j, q0, q1, y[i].qs, &qh);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

void QuantizeRowQ5_1(const float* x, BlockQ5_1* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK5_1; ++i) {
    const float* xb = x + i * kQK5_1;
    float mn, mx;
    BlockRange(xb, kQK5_1, &mn, &mx);
    const float d = (mx - mn) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    y[i].m = Fp32ToFp16(mn);
    uint32_t qh = 0;
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const int q0 = static_cast<uint8_t>((xb[j] - mn) * id + 0.5f);
      const int q1 = static_cast<uint8_t>((xb[j + 16] - mn) * id + 0.5f);
      PutQ5Pair(j, q0, q1, y[i].qs, &qh);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

// Q4_K / Q5_K (nmax = 15 / 31): per 32-value sub-block, min m = min(0, min x) and scale
// (max - m) / nmax; the 8 scales and 8 -m are rounded onto 6-bit grids of d and dmin.
template <int kNmax>
void QuantizeSuperKMin(const float* x, uint16_t* d_out, uint16_t* dmin_out, uint8_t* scales, uint8_t* q) {
  float sc[8], mn[8], max_sc = 0.0f, max_mn = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float lo = 0.0f, hi = x[32 * j];
    for (int l = 0; l < 32; ++l) {
      lo = std::min(lo, x[32 * j + l]);
      hi = std::max(hi, x[32 * j + l]);
    }
    sc[j] = (hi - lo) / kNmax;
    mn[j] = -lo;
    max_sc = std::max(max_sc, sc[j]);
    max_mn = std::max(max_mn, mn[j]);
  }
  const float isc = max_sc > 0 ? 63.0f / max_sc : 0.0f, imn = max_mn > 0 ? 63.0f / max_mn : 0.0f;
  *d_out = Fp32ToFp16(max_sc / 63.0f);
  *dmin_out = Fp32ToFp16(max_mn / 63.0f);
  int ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = Clamp(NearestInt(isc * sc[j]), 0, 63);
    lm[j] = Clamp(NearestInt(imn * mn[j]), 0, 63);
  }
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(ls[j] | ((ls[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<uint8_t>(lm[j] | ((lm[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<uint8_t>((ls[j + 4] & 0x0F) | ((lm[j + 4] & 0x0F) << 4));
  }
  const float d = Fp16ToFp32(*d_out), dmin = Fp16ToFp32(*dmin_out);
  for (int j = 0; j < 8; ++j) {
    const float dl = d * ls[j], ml = dmin * lm[j];
    for (int l = 0; l < 32; ++l)
      q[32 * j + l] = static_cast<uint8_t>(dl > 0 ? Clamp(NearestInt((x[32 * j + l] + ml) / dl), 0, kNmax) : 0);
  }
}

void QuantizeRowQ4_K(const float* x, BlockQ4_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint8_t q[kQK_K];
    QuantizeSuperKMin<15>(x + i * kQK_K, &y[i].d, &y[i].dmin, y[i].scales, q);
    for (int c = 0; c < 4; ++c)  // 64-value group c: sub-block 2c in the low nibbles, 2c+1 high
      for (int l = 0; l < 32; ++l) y[i].qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
  }
}

void QuantizeRowQ5_K(const float* x, BlockQ5_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    uint8_t q[kQK_K];
    QuantizeSuperKMin<31>(x + i * kQK_K, &y[i].d, &y[i].dmin, y[i].scales, q);
    std::memset(y[i].qh, 0, sizeof(y[i].qh));
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const int a = q[64 * c + l], b = q[64 * c + 32 + l];
        y[i].qs[32 * c + l] = static_cast<uint8_t>((a & 0x0F) | ((b & 0x0F) << 4));
        y[i].qh[l] |= static_cast<uint8_t>(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1)));
      }
  }
}

// Signed scales of the 16-value sub-blocks of a super-block (Q3_K, Q6_K): sub-block scale
// s_j = (its signed max) / -qmin, then s_j ~ d * l_j with l_j in [lmin, lmax] (d fp16).
void SignedSubScales(const float* x, int qmin, int lmin, int lmax, uint16_t* d_out, int* l) {
  float s[16], smax = 0.0f, amax = 0.0f;
  for (int j = 0; j < 16; ++j) {
    s[j] = SignedMax(x + 16 * j, 16) / static_cast<float>(qmin);
    if (std::fabs(s[j]) > amax) {
      amax = std::fabs(s[j]);
      smax = s[j];
    }
  }
  const float iscale = smax != 0.0f ? static_cast<float>(lmin) / smax : 0.0f;
  *d_out = Fp32ToFp16(iscale != 0.0f ? 1.0f / iscale : 0.0f);
  for (int j = 0; j < 16; ++j) l[j] = Clamp(NearestInt(iscale * s[j]), lmin, lmax);
}

void QuantizeRowQ6_K(const float* x, BlockQ6_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* xb = x + i * kQK_K;
    int l[16];
    SignedSubScales(xb, -32, -128, 127, &y[i].d, l);
    const float d = Fp16ToFp32(y[i].d);
    uint8_t q[kQK_K];
    for (int j = 0; j < 16; ++j) {
      y[i].scales[j] = static_cast<int8_t>(l[j]);
      const float dl = d * l[j];
      for (int v = 0; v < 16; ++v)
        q[16 * j + v] = static_cast<uint8_t>((dl != 0 ? Clamp(NearestInt(xb[16 * j + v] / dl), -32, 31) : 0) + 32);
    }
    for (int h = 0; h < 2; ++h)
      for (int v = 0; v < 32; ++v) {
        const uint8_t* g = q + 128 * h + v;
        y[i].ql[64 * h + v] = static_cast<uint8_t>((g[0] & 0x0F) | ((g[64] & 0x0F) << 4));
        y[i].ql[64 * h + v + 32] = static_cast<uint8_t>((g[32] & 0x0F) | ((g[96] & 0x0F) << 4));
        y[i].qh[32 * h + v] =
            static_cast<uint8_t>((g[0] >> 4) | ((g[32] >> 4) << 2) | ((g[64] >> 4) << 4) | ((g[96] >> 4) << 6));
      }
  }
}

void QuantizeRowQ3_K(const float* x, BlockQ3_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* xb = x + i * kQK_K;
    int l[16];
    SignedSubScales(xb, -4, -32, 31, &y[i].d, l);
    const float d = Fp16ToFp32(y[i].d);
    std::memset(y[i].scales, 0, 12);
    std::memset(y[i].hmask, 0, sizeof(y[i].hmask));
    std::memset(y[i].qs, 0, sizeof(y[i].qs));
    for (int j = 0; j < 16; ++j) {
      const int ls = l[j] + 32;
      if (j < 8) y[i].scales[j] = static_cast<uint8_t>(ls & 0x0F);
      else y[i].scales[j - 8] |= static_cast<uint8_t>((ls & 0x0F) << 4);
      y[i].scales[8 + j % 4] |= static_cast<uint8_t>((ls >> 4) << (2 * (j / 4)));
    }
    for (int v = 0; v < kQK_K; ++v) {
      const float dl = d * l[v / 16];
      const int q = (dl != 0 ? Clamp(NearestInt(xb[v] / dl), -4, 3) : 0) + 4;  // 0..7
      const int half = v / 128, j = (v % 128) / 32, at = v % 32;
      y[i].qs[32 * half + at] |= static_cast<uint8_t>((q & 3) << (2 * j));
      if (q >= 4) y[i].hmask[at] |= static_cast<uint8_t>(1u << (4 * half + j));
    }
  }
}

void QuantizeRowQ2_K(const float* x, BlockQ2_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* xb = x + i * kQK_K;
    float sc[16], mn[16], max_sc = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 16; ++j) {
      float lo = 0.0f, hi = xb[16 * j];
      for (int v = 0; v < 16; ++v) {
        lo = std::min(lo, xb[16 * j + v]);
        hi = std::max(hi, xb[16 * j + v]);
      }
      sc[j] = (hi - lo) / 3.0f;
      mn[j] = -lo;
      max_sc = std::max(max_sc, sc[j]);
      max_mn = std::max(max_mn, mn[j]);
    }
    y[i].d = Fp32ToFp16(max_sc / 15.0f);
    y[i].dmin = Fp32ToFp16(max_mn / 15.0f);
    const float isc = max_sc > 0 ? 15.0f / max_sc : 0.0f, imn = max_mn > 0 ? 15.0f / max_mn : 0.0f;
    const float d = Fp16ToFp32(y[i].d), dmin = Fp16ToFp32(y[i].dmin);
    std::memset(y[i].qs, 0, sizeof(y[i].qs));
    for (int j = 0; j < 16; ++j) {
      const int ls = Clamp(NearestInt(isc * sc[j]), 0, 15), lm = Clamp(NearestInt(imn * mn[j]), 0, 15);
      y[i].scales[j] = static_cast<uint8_t>(ls | (lm << 4));
      const float dl = d * ls, ml = dmin * lm;
      for (int v = 16 * j; v < 16 * j + 16; ++v) {
        const int q = dl > 0 ? Clamp(NearestInt((xb[v] + ml) / dl), 0, 3) : 0;
        y[i].qs[32 * (v / 128) + v % 32] |= static_cast<uint8_t>(q << (2 * ((v % 128) / 32)));
      }
    }
  }
}

// IQ4 block of 32: the scale that maps the signed max onto the table's -127, the nearest codes,
// then one least-squares refit of the scale (kept if it lowers the error). Returns the scale.
float FitIq4Block(const float* x, uint8_t* codes) {
  float d = SignedMax(x, 32) / -127.0f;
  auto fit = [&](float dd, uint8_t* c) {
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    double err = 0;
    for (int j = 0; j < 32; ++j) {
      c[j] = static_cast<uint8_t>(NearestIndex(kIq4NlValues, x[j] * id));
      const double e = x[j] - static_cast<double>(dd) * kIq4NlValues[c[j]];
      err += e * e;
    }
    return err;
  };
  const double err0 = fit(d, codes);
  double sxq = 0, sqq = 0;
  for (int j = 0; j < 32; ++j) {
    sxq += static_cast<double>(x[j]) * kIq4NlValues[codes[j]];
    sqq += static_cast<double>(kIq4NlValues[codes[j]]) * kIq4NlValues[codes[j]];
  }
  if (sqq > 0) {
    uint8_t c2[32];
    const float d2 = static_cast<float>(sxq / sqq);
    if (fit(d2, c2) < err0) {
      d = d2;
      std::memcpy(codes, c2, 32);
    }
  }
  return d;
}

inline void PackNibbles32(const uint8_t* c, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(c[j] | (c[j + 16] << 4));
}

void QuantizeRowIQ4_NL(const float* x, BlockIQ4_NL* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK4_NL; ++i) {
    uint8_t c[32];
    const float d = FitIq4Block(x + 32 * i, c);
    y[i].d = Fp32ToFp16(d);
    // Codes for the fp16-rounded scale.
    const float dh = Fp16ToFp32(y[i].d), id = dh != 0.0f ? 1.0f / dh : 0.0f;
    for (int j = 0; j < 32; ++j) c[j] = static_cast<uint8_t>(NearestIndex(kIq4NlValues, x[32 * i + j] * id));
    PackNibbles32(c, y[i].qs);
  }
}

void QuantizeRowIQ4_XS(const float* x, BlockIQ4_XS* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* xb = x + i * kQK_K;
    float s[8], smax = 0.0f, amax = 0.0f;
    uint8_t c[32];
    for (int ib = 0; ib < 8; ++ib) {
      s[ib] = FitIq4Block(xb + 32 * ib, c);
      if (std::fabs(s[ib]) > amax) {
        amax = std::fabs(s[ib]);
        smax = s[ib];
      }
    }
    const float d = smax / -32.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    const float dh = Fp16ToFp32(y[i].d);
    y[i].scales_h = 0;
    std::memset(y[i].scales_l, 0, sizeof(y[i].scales_l));
    for (int ib = 0; ib < 8; ++ib) {
      const int l = Clamp(NearestInt(id * s[ib]), -32, 31);
      const int ls = l + 32;
      y[i].scales_l[ib / 2] |= static_cast<uint8_t>((ls & 0x0F) << (4 * (ib % 2)));
      y[i].scales_h = static_cast<uint16_t>(y[i].scales_h | ((ls >> 4) << (2 * ib)));
      const float dl = dh * l, idl = dl != 0.0f ? 1.0f / dl : 0.0f;
      for (int j = 0; j < 32; ++j) c[j] = static_cast<uint8_t>(NearestIndex(kIq4NlValues, xb[32 * ib + j] * idl));
      PackNibbles32(c, y[i].qs + 16 * ib);
    }
  }
}

void QuantizeRowMXFP4(const float* x, BlockMXFP4* y, int64_t n) {
  for (int64_t i = 0; i < n / kQKMxfp4; ++i) {
    const float* xb = x + 32 * i;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const int e = amax > 0.0f ? Clamp(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127, 0, 254) : 0;
    y[i].e = static_cast<uint8_t>(e);
    const float d = E8M0HalfToFp32(y[i].e), id = amax > 0.0f ? 1.0f / d : 0.0f;
    uint8_t c[32];
    for (int j = 0; j < 32; ++j) c[j] = static_cast<uint8_t>(NearestIndex(kMxfp4Values, xb[j] * id));
    PackNibbles32(c, y[i].qs);
  }
}

}  // namespace

bool CanDequantize(QuantType t) {
  switch (t) {
    case QuantType::kF32: case QuantType::kF16: case QuantType::kBF16:
    case QuantType::kQ4_0: case QuantType::kQ4_1: case QuantType::kQ5_0: case QuantType::kQ5_1:
    case QuantType::kQ8_0: case QuantType::kQ4_K: case QuantType::kQ5_K: case QuantType::kQ6_K:
    case QuantType::kQ2_K: case QuantType::kQ3_K: case QuantType::kIQ4_NL: case QuantType::kIQ4_XS:
    case QuantType::kMXFP4:
      return true;
    default:
      return false;
  }
}

bool CanQuantize(QuantType t) { return CanDequantize(t); }

float E8M0HalfToFp32(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
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
    case QuantType::kQ2_K: return DequantQ2_K(static_cast<const BlockQ2_K*>(src), dst, nb);
    case QuantType::kQ3_K: return DequantQ3_K(static_cast<const BlockQ3_K*>(src), dst, nb);
    case QuantType::kIQ4_NL: return DequantIQ4_NL(static_cast<const BlockIQ4_NL*>(src), dst, nb);
    case QuantType::kIQ4_XS: return DequantIQ4_XS(static_cast<const BlockIQ4_XS*>(src), dst, nb);
    case QuantType::kMXFP4: return DequantMXFP4(static_cast<const BlockMXFP4*>(src), dst, nb);
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
    case QuantType::kQ4_1: return QuantizeRowQ4_1(src, static_cast<BlockQ4_1*>(dst), n);
    case QuantType::kQ5_0: return QuantizeRowQ5_0(src, static_cast<BlockQ5_0*>(dst), n);
    case QuantType::kQ5_1: return QuantizeRowQ5_1(src, static_cast<BlockQ5_1*>(dst), n);
    case QuantType::kQ2_K: return QuantizeRowQ2_K(src, static_cast<BlockQ2_K*>(dst), n);
    case QuantType::kQ3_K: return QuantizeRowQ3_K(src, static_cast<BlockQ3_K*>(dst), n);
    case QuantType::kQ4_K: return QuantizeRowQ4_K(src, static_cast<BlockQ4_K*>(dst), n);
    case QuantType::kQ5_K: return QuantizeRowQ5_K(src, static_cast<BlockQ5_K*>(dst), n);
    case QuantType::kQ6_K: return QuantizeRowQ6_K(src, static_cast<BlockQ6_K*>(dst), n);
    case QuantType::kIQ4_NL: return QuantizeRowIQ4_NL(src, static_cast<BlockIQ4_NL*>(dst), n);
    case QuantType::kIQ4_XS: return QuantizeRowIQ4_XS(src, static_cast<BlockIQ4_XS*>(dst), n);
    case QuantType::kMXFP4: return QuantizeRowMXFP4(src, static_cast<BlockMXFP4*>(dst), n);
    default:
      ESTREAM_CHECK(false, "QuantizeRow: type not supported (check CanQuantize first)");
  }
}

}  // namespace estream
