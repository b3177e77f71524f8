// The kernel-native ("packed") weight layout of the quantised GEMM, and the scalar helpers
// that build it. Internal to src/kernels (the public entry points are in kernels.h:
// CanRepack, PackedWeightBytes, RepackWeights).
//
// Layout (version 1), for an n x k weight matrix of type Q4_0, Q8_0, Q4_K or Q6_K:
//   rows are grouped into panels of kPackRows = 16 consecutive rows (the last panel is padded
//   with all-zero rows: zero scales, so padded outputs are 0 and never stored); panel p holds
//   rows [16p, 16p + 16) and is PackedPanelBytes(t, k) long, panels follow each other.
//   A panel is k / 32 "packed blocks", one per 32 input features b, in order. A packed block
//   interleaves the 16 rows so that one 64-byte load is 16 rows x 4 consecutive values (the
//   operand shape of vpdpbusd): for k-step s (values 4s..4s+3 of the block) and row r, byte j of
//   lane r is value 4s + j of row r. Values are stored unsigned, offset by the type's zero point
//   Z (the kernels subtract Z * sum(x) through the activation sums):
//     Q8_0 (576 B): float d[16];                  u8 q[8][16][4]   (q = int8 value + 128, Z = 128)
//     Q4_0 (320 B): float d[16];                  u8 q[4][16][4]   (nibbles, Z = 8)
//     Q4_K (384 B): float d[16]; float mneg[16];  u8 q[4][16][4]   (nibbles, Z = 0)
//     Q6_K (640 B): float d[2][16];               u8 q[8][16][4]   (6-bit values, Z = 32)
//   Nibble blocks hold k-step s in the low nibble and k-step s + 4 in the high nibble of
//   q[s][r][j] (s < 4), i.e. value v and value v + 16. For Q4_K, d = super-block d * 6-bit
//   sub-block scale and mneg = -(dmin * 6-bit min) (both exact in fp32). For Q6_K, d[h] is the
//   scale of values 16h..16h+15 of the block (super-block d * int8 sub-block scale, exact).
//   So the value of row r at 4s + j is d * (q - Z) (+ mneg for Q4_K), as in DequantizeRow
//   up to fp32 rounding of that product.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace estream::kernels {

constexpr int kPackRows = 16;
constexpr int kPackLayoutVersion = 1;

// One 32-value block of one row, decoded to unsigned values: the row's value at v is
// d[v / 16] * (q[v] - zero_point) + mneg.
struct Block32 {
  uint8_t q[32];
  float d[2];
  float mneg;
};

// Bytes of one packed block (16 rows x 32 values); 0 if t has no packed layout.
int PackedBlockBytes(QuantType t);
// The zero point Z of t's unsigned values (Q4_0 8, Q8_0 128, Q4_K 0, Q6_K 32).
int ZeroPoint(QuantType t);
inline int64_t PackedPanelBytes(QuantType t, int64_t k) { return k / 32 * PackedBlockBytes(t); }
inline int64_t PackedPanels(int64_t n) { return (n + kPackRows - 1) / kPackRows; }

// Decodes block b (values 32b..32b+31) of the GGUF row at `row` (k values of type t).
void DecodeBlock32(QuantType t, const void* row, int64_t b, Block32* out);

// Writes one packed panel of k values from `rows` valid GGUF rows (rows <= 16; missing rows are
// zero) starting at `src` with `src_stride` bytes between rows.
void PackPanel(QuantType t, const void* src, size_t src_stride, int rows, int64_t k, void* dst);

}  // namespace estream::kernels
