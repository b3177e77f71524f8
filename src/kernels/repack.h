// The kernel-native ("packed") weight layout of the quantised GEMM, and the scalar helpers
// that build it. Internal to src/kernels (the public entry points are in kernels.h:
// CanRepack, PackedWeightBytes, RepackWeights).
//
// Layout (version 3), for an n x k weight matrix of type Q4_0, Q8_0, Q4_K or Q6_K:
//   rows are grouped into panels of kPackRows = 16 consecutive rows (the last panel is padded
//   with all-zero rows: zero scales, so padded outputs are 0 and never stored); panel p holds
//   rows [16p, 16p + 16) and is PackedPanelBytes(t, k) long, panels follow each other.
//   A panel is a scale section followed by a quant section. The scale section holds, for the
//   K-quants, k/256 super-block entries of PackedSuperBytes(t), then (all types) k/32 block
//   entries of PackedScaleBytes(t), zero-padded to a multiple of 64 bytes; the quant section holds
//   k/32 quant blocks of PackedQuantBytes(t), so every quant block starts 64-byte aligned when the
//   panel does. A quant block interleaves the 16 rows so that one 64-byte load is 16 rows x 4
//   consecutive values (the operand shape of vpdpbusd and of an AMX B tile row): for k-step s
//   (values 4s..4s+3 of the block) and row r, byte j of lane r is value 4s + j of row r. Values
//   are stored unsigned, offset by the type's zero point Z (the kernels subtract Z * sum(x)
//   through the activation sums). Per type (16 rows each; "f16" = the GGUF fp16 bits):
//     Q8_0: block: f16 d[16] (32 B)                      quants u8 q[8][16][4] (value + 128, Z = 128)
//     Q4_0: block: f16 d[16] (32 B)                      quants u8 q[4][16][4] (nibbles, Z = 8)
//     Q4_K: super: f16 d[16], f16 -dmin[16] (64 B)
//           block: u8 sc[16], u8 m[16] (32 B)            quants u8 q[4][16][4] (nibbles, Z = 0)
//     Q6_K: super: f16 d[16] (32 B)
//           block: i8 sc[2][16] (32 B)                   quants u8 q[8][16][4] (6-bit values, Z = 32)
//   Nibble blocks hold k-step s in the low nibble and k-step s + 4 in the high nibble of
//   q[s][r][j] (s < 4), i.e. value v and value v + 16. The value of row r at 4s + j is
//   d_b * (q - Z) + mneg_b with, per 32-value block b: Q4_0/Q8_0 d_b = d; Q4_K d_b = d * sc,
//   mneg_b = -dmin * m (the 6-bit sub-block scale and min); Q6_K d_b = d * sc[h] for values
//   16h..16h+15 (the int8 sub-block scales). The kernels form these products in fp32, where they
//   are exact, so they equal DequantizeRow's scales. Sizes per weight: Q4_0 4.5 bits, Q8_0 8.5
//   (as GGUF), Q4_K 4.625 (GGUF 4.5), Q6_K 8.56 (GGUF 6.56: 6-bit values are kept in bytes).
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace estream::kernels {

constexpr int kPackRows = 16;
constexpr int kPackLayoutVersion = 3;

// One 32-value block of one row, decoded to unsigned values: the row's value at v is
// d[v / 16] * (q[v] - zero_point) + mneg.
struct Block32 {
  uint8_t q[32];
  float d[2];
  float mneg;
};

// Bytes of one block scale entry / one quant block (16 rows x 32 values), and of one
// super-block scale entry (16 rows x 256 values; K-quants only); 0 if t has none.
constexpr int PackedScaleBytes(QuantType t) {
  return t == QuantType::kQ4_0 || t == QuantType::kQ8_0 || t == QuantType::kQ4_K || t == QuantType::kQ6_K ? 32 : 0;
}
constexpr int PackedSuperBytes(QuantType t) {
  return t == QuantType::kQ4_K ? 64 : t == QuantType::kQ6_K ? 32 : 0;
}
constexpr int PackedQuantBytes(QuantType t) {
  return t == QuantType::kQ4_0 || t == QuantType::kQ4_K ? 256
         : t == QuantType::kQ8_0 || t == QuantType::kQ6_K ? 512
                                                           : 0;
}
// Offset of the block scale entries in a panel of kb blocks (after the super-block entries), and
// bytes of the whole scale section (the quant section starts there).
constexpr int64_t PackedBlockScaleOffset(QuantType t, int64_t kb) { return kb / 8 * PackedSuperBytes(t); }
constexpr int64_t PackedScaleSection(QuantType t, int64_t kb) {
  return (PackedBlockScaleOffset(t, kb) + kb * PackedScaleBytes(t) + 63) / 64 * 64;
}
// The zero point Z of t's unsigned values (Q4_0 8, Q8_0 128, Q4_K 0, Q6_K 32).
int ZeroPoint(QuantType t);
inline int64_t PackedPanelBytes(QuantType t, int64_t k) {
  return PackedScaleSection(t, k / 32) + k / 32 * PackedQuantBytes(t);
}
inline int64_t PackedPanels(int64_t n) { return (n + kPackRows - 1) / kPackRows; }

// Decodes block b (values 32b..32b+31) of the GGUF row at `row` (k values of type t).
void DecodeBlock32(QuantType t, const void* row, int64_t b, Block32* out);

// Writes one packed panel of k values from `rows` valid GGUF rows (rows <= 16; missing rows are
// zero) starting at `src` with `src_stride` bytes between rows.
void PackPanel(QuantType t, const void* src, size_t src_stride, int rows, int64_t k, void* dst);

}  // namespace estream::kernels
