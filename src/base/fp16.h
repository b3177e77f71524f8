// IEEE half (fp16) and bfloat16 conversions, bit-exact with ggml's scalar reference:
// fp16->fp32 exact; fp32->fp16 round-to-nearest-even with overflow to inf and NaN kept NaN;
// fp32->bf16 round-to-nearest-even with NaN quietened.
#pragma once

#include <cstdint>
#include <cstring>

namespace estream {

inline float BitsToFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t FloatToBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float Fp16ToFp32(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = BitsToFloat(0x7800000u);  // 2^-112
  const float normalized = BitsToFloat((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = BitsToFloat((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result =
      sign | (two_w < denormalized_cutoff ? FloatToBits(denormalized) : FloatToBits(normalized));
  return BitsToFloat(result);
}

inline uint16_t Fp32ToFp16(float f) {
  const float scale_to_inf = BitsToFloat(0x77800000u);   // 2^112
  const float scale_to_zero = BitsToFloat(0x08800000u);  // 2^-110
  float base = (f < 0 ? -f : f) * scale_to_inf;
  base *= scale_to_zero;
  const uint32_t w = FloatToBits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = BitsToFloat((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = FloatToBits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

inline float Bf16ToFp32(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t Fp32ToBf16(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

}  // namespace estream
