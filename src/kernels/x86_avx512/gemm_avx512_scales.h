// Internal to the AVX-512 GEMM translation units: the fp32 scales of one packed block for the 16
// rows of a panel (layout: repack.h), formed as exact fp32 products like DequantizeRow's.
// Include only from translation units compiled with the AVX-512 flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/repack.h"

namespace estream::kernels {

// d_b for block b (Q6_K: of values 16h..16h+15) of the panel at p with kb blocks per row.
template <QuantType kT>
inline __m512 PanelScale(const uint8_t* p, int64_t kb, int64_t b, int h) {
  const uint8_t* blk = p + PackedBlockScaleOffset(kT, kb) + b * PackedScaleBytes(kT);
  if constexpr (kT == QuantType::kQ4_0 || kT == QuantType::kQ8_0) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
  } else {
    const uint8_t* sup = p + (b / 8) * PackedSuperBytes(kT);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup)));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h));
    const __m512i sc = kT == QuantType::kQ6_K ? _mm512_cvtepi8_epi32(raw) : _mm512_cvtepu8_epi32(raw);
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
  }
}

// Q4_K: mneg_b = -dmin * m for block b.
inline __m512 PanelMinNegQ4K(const uint8_t* p, int64_t kb, int64_t b) {
  constexpr QuantType kT = QuantType::kQ4_K;
  const uint8_t* blk = p + PackedBlockScaleOffset(kT, kb) + b * PackedScaleBytes(kT);
  const uint8_t* sup = p + (b / 8) * PackedSuperBytes(kT);
  const __m512 ndmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sup + 32)));
  const __m512i m = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16)));
  return _mm512_mul_ps(ndmin, _mm512_cvtepi32_ps(m));
}

// Per panel and block, the fp32 vectors the epilogue needs (PanelScales): Q4_0/Q8_0 d_b; Q4_K
// d_b, mneg_b; Q6_K the two halves' d_b.
template <QuantType kT>
constexpr int kScaleVecs = kT == QuantType::kQ4_K || kT == QuantType::kQ6_K ? 2 : 1;

// The scale vectors of blocks [b0, b1) of nv panels (panel j at w + j * panel_stride) into ws:
// vector v of block b of panel j at ws + ((j * (b1 - b0) + b - b0) * kScaleVecs + v) * 16. Built
// once per k chunk and read by every row tile of the pass (both kernels): forming them per row
// tile (fp16 and int8 conversions, a product) cost the Q6_K kernel ~6 vector ops per 16 vpdpbusd.
template <QuantType kT>
void PanelScales(const uint8_t* w, int64_t panel_stride, int nv, int64_t kb, int64_t b0, int64_t b1, float* ws) {
  constexpr int kV = kScaleVecs<kT>;
  for (int j = 0; j < nv; ++j)
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* p = w + j * panel_stride;
      float* o = ws + (j * (b1 - b0) + b - b0) * kV * 16;
      _mm512_store_ps(o, PanelScale<kT>(p, kb, b, 0));
      if constexpr (kT == QuantType::kQ6_K) _mm512_store_ps(o + 16, PanelScale<kT>(p, kb, b, 1));
      if constexpr (kT == QuantType::kQ4_K) _mm512_store_ps(o + 16, PanelMinNegQ4K(p, kb, b));
    }
}

}  // namespace estream::kernels
