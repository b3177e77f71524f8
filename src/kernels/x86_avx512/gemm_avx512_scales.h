// Internal to the AVX-512 GEMM translation units: the fp32 scales (and mins) of one packed block
// for the 16 rows of a panel (layout: repack.h), formed as exact fp32 products like
// DequantizeRow's. Include only from translation units compiled with the AVX-512 flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/repack.h"

// GCC 12 reports the _mm512_undefined_* operand inside the conversion intrinsics as
// uninitialised (a false positive, as in gemm_avx512.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace estream::kernels {

inline __m512 LoadHalf16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// d for block b, half h (0 for the formats with one scale per block) of the panel at p with kb
// blocks per row; kT is a packed format (repack.h).
template <QuantType kT>
inline __m512 PanelScale(const uint8_t* p, int64_t kb, int64_t b, int h) {
  const uint8_t* blk = p + PackedBlockScaleOffset(kT, kb) + b * PackedScaleBytes(kT);
  const uint8_t* sup = p + (b / 8) * PackedSuperBytes(kT);
  auto u8 = [](const uint8_t* q) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))); };
  auto i8 = [](const uint8_t* q) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))); };
  if constexpr (kT == QuantType::kQ4_0 || kT == QuantType::kQ8_0 || kT == QuantType::kIQ4_NL ||
                kT == QuantType::kQ4_1 || kT == QuantType::kQ5_1) {
    return LoadHalf16(blk);
  } else if constexpr (kT == QuantType::kMXFP4) {
    // 2^(e - 128): the exponent field e - 1, or the subnormals 2^-128 / 2^-127 for e = 0 / 1.
    const __m512i e = u8(blk);
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub));
  } else if constexpr (kT == QuantType::kQ4_K || kT == QuantType::kQ5_K) {
    return _mm512_mul_ps(LoadHalf16(sup), _mm512_cvtepi32_ps(u8(blk)));
  } else if constexpr (kT == QuantType::kQ2_K) {
    return _mm512_mul_ps(LoadHalf16(sup), _mm512_cvtepi32_ps(u8(blk + 16 * h)));
  } else if constexpr (kT == QuantType::kIQ4_XS) {
    return _mm512_mul_ps(LoadHalf16(sup), _mm512_cvtepi32_ps(i8(blk)));
  } else {  // Q6_K, Q3_K
    return _mm512_mul_ps(LoadHalf16(sup), _mm512_cvtepi32_ps(i8(blk + 16 * h)));
  }
}

// The additive min m of block b, half h (PackedHasMin formats): Q4_1/Q5_1 the f16 m; Q4_K/Q5_K
// -dmin * m; Q2_K -dmin * m of the half.
template <QuantType kT>
inline __m512 PanelMin(const uint8_t* p, int64_t kb, int64_t b, int h) {
  const uint8_t* blk = p + PackedBlockScaleOffset(kT, kb) + b * PackedScaleBytes(kT);
  const uint8_t* sup = p + (b / 8) * PackedSuperBytes(kT);
  if constexpr (kT == QuantType::kQ4_1 || kT == QuantType::kQ5_1) {
    return LoadHalf16(blk + 32);
  } else {
    const uint8_t* m = kT == QuantType::kQ2_K ? blk + 32 + 16 * h : blk + 16;
    const __m512i mi = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m)));
    return _mm512_mul_ps(LoadHalf16(sup + 32), _mm512_cvtepi32_ps(mi));
  }
}

// Q4_K: mneg_b = -dmin * m for block b.
inline __m512 PanelMinNegQ4K(const uint8_t* p, int64_t kb, int64_t b) { return PanelMin<QuantType::kQ4_K>(p, kb, b, 0); }

// Per panel and block, the fp32 vectors the epilogue needs (PanelScales): d of each half, then
// (PackedHasMin) m of each half. E.g. Q4_0/Q8_0 d; Q4_K d, mneg; Q6_K d0, d1; Q2_K d0, d1, m0, m1.
template <QuantType kT>
constexpr int kScaleVecs = PackedHalves(kT) * (PackedHasMin(kT) ? 2 : 1);
constexpr int kMaxScaleVecs = 4;

// The scale vectors of blocks [b0, b1) of nv panels (panel j at w + j * panel_stride) into ws:
// vector v of block b of panel j at ws + ((j * (b1 - b0) + b - b0) * kScaleVecs + v) * 16. Built
// once per k chunk and read by every row tile of the pass (both kernels): forming them per row
// tile (fp16 and int8 conversions, a product) cost the Q6_K kernel ~6 vector ops per 16 vpdpbusd.
template <QuantType kT>
void PanelScales(const uint8_t* w, int64_t panel_stride, int nv, int64_t kb, int64_t b0, int64_t b1, float* ws) {
  constexpr int kV = kScaleVecs<kT>;
  constexpr int kH = PackedHalves(kT);
  for (int j = 0; j < nv; ++j)
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* p = w + j * panel_stride;
      float* o = ws + (j * (b1 - b0) + b - b0) * kV * 16;
      for (int h = 0; h < kH; ++h) {
        _mm512_store_ps(o + 16 * h, PanelScale<kT>(p, kb, b, h));
        if constexpr (PackedHasMin(kT)) _mm512_store_ps(o + 16 * (kH + h), PanelMin<kT>(p, kb, b, h));
      }
    }
}

}  // namespace estream::kernels
