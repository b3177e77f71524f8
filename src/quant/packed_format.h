// The kernel-native ("packed") weight layout of the quantised GEMM: the format, its sizes and
// version. The kernels implement it (src/kernels/repack.h: the scalar packer, RepackWeights;
// the GEMM drivers read it); the packed model layout (src/pack) sizes its parts with it. It is a
// format description only, so that code which stores or sizes packed weights does not depend on
// the kernels.
//
// Layout (version 3; the formats after Q4_0, Q8_0, Q4_K and Q6_K were added without changing
// those), for an n x k weight matrix of any quantised GEMM type:
//   rows are grouped into panels of kPackRows = 16 consecutive rows (the last panel is padded
//   with all-zero rows: zero scales, so padded outputs are 0 and never stored); panel p holds
//   rows [16p, 16p + 16) and is PackedPanelBytes(t, k) long, panels follow each other.
//   A panel is a scale section followed by a quant section. The scale section holds, for the
//   256-value types, k/256 super-block entries of PackedSuperBytes(t), then (all types) k/32 block
//   entries of PackedScaleBytes(t), zero-padded to a multiple of 64 bytes; the quant section holds
//   k/32 quant blocks of PackedQuantBytes(t), so every quant block starts 64-byte aligned when the
//   panel does. A quant block interleaves the 16 rows so that one 64-byte load is 16 rows x 4
//   consecutive values (the operand shape of vpdpbusd and of an AMX B tile row): for k-step s
//   (values 4s..4s+3 of the block) and row r, byte j of lane r is value 4s + j of row r. Values
//   are stored unsigned, offset by the format's zero point Z (the kernels subtract Z * sum(x)
//   through the activation sums), either as bytes (8 k-steps, 512 B) or as nibbles (4 k-steps,
//   256 B: k-step s in the low nibble and k-step s + 4 in the high nibble of q[s][r][j], i.e.
//   value v and value v + 16). The non-linear types store their 4-bit codes, which the kernels map
//   through a 16-entry table of u8 values (PackedLut: the format's int8 value + 128, Z = 128) with
//   one vpshufb per register. Per packed format (16 rows each; "f16" = the GGUF fp16 bits):
//     Q8_0:   block f16 d[16] (32 B)                          bytes (value + 128, Z = 128)
//     Q4_0:   block f16 d[16] (32 B)                          nibbles (Z = 8)
//     Q4_1:   block f16 d[16], f16 m[16] (64 B)               nibbles (Z = 0)
//     Q5_1:   block f16 d[16], f16 m[16] (64 B)               bytes (5-bit values, Z = 0)
//     Q4_K:   super f16 d[16], f16 -dmin[16] (64 B)
//             block u8 sc[16], u8 m[16] (32 B)                nibbles (Z = 0)
//     Q5_K:   as Q4_K                                         bytes (5-bit values, Z = 0)
//     Q6_K:   super f16 d[16] (32 B); block i8 sc[2][16] (32 B)     bytes (6-bit values, Z = 32)
//     Q3_K:   super f16 d[16] (32 B); block i8 sc[2][16] (32 B)     nibbles (3-bit values, Z = 4)
//     Q2_K:   super f16 d[16], f16 -dmin[16] (64 B)
//             block u8 sc[2][16], u8 m[2][16] (64 B)          nibbles (2-bit values, Z = 0)
//     IQ4_NL: block f16 d[16] (32 B)                          nibble codes, table kIq4NlValues
//     IQ4_XS: super f16 d[16] (32 B); block i8 sc[16] (16 B)  nibble codes, table kIq4NlValues
//     MXFP4:  block u8 e[16] (E8M0 exponent bytes, 16 B)      nibble codes, table kMxfp4Values
//   Q5_0 has no format of its own: its values -16..15 times an f16 d are exactly a Q8_0 block
//   (byte = value + 128), so it is packed as Q8_0 (PackedFormat) and runs the Q8_0 kernels,
//   AMX included. The value of row r at 4s + j of 32-value block b is
//     d_{b,h} * (Q - Z) + m_{b,h}      (h = the 16-value half, for the formats with two halves)
//   with Q the stored value (or table entry), d = the f16 scale (Q4_0, Q8_0, Q4_1, Q5_1, IQ4_NL),
//   d * sc (Q4_K, Q5_K, IQ4_XS, and per half Q6_K, Q3_K, Q2_K), 2^(e - 128) (MXFP4, whose table
//   holds twice the E2M1 values); m = the f16 min (Q4_1, Q5_1), -dmin * m (Q4_K, Q5_K, and per
//   half Q2_K), else 0. The kernels form these products in fp32, where they are exact, so they
//   equal DequantizeRow's scales. Bits per weight packed (GGUF): Q4_0 4.5 (4.5), Q8_0 8.5 (8.5),
//   Q5_0 8.5 (5.5), Q4_1 5.0 (5.0), Q5_1 9.0 (6.0), Q4_K 4.625 (4.5), Q5_K 8.625 (5.5), Q6_K 8.56
//   (6.56), Q3_K 4.56 (3.44), Q2_K 5.125 (2.625), IQ4_NL 4.5 (4.5), IQ4_XS 4.31 (4.25), MXFP4 4.25
//   (4.25). The 5- and 6-bit types are kept in bytes (their kernels are the 8-bit ones; a nibble +
//   bit-plane form would save ~3 bits per weight at some decode cost), the 2- and 3-bit types in
//   nibbles (the 4-bit kernels with a per-half epilogue).
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace estream {

constexpr int kPackRows = 16;
constexpr int kPackLayoutVersion = 3;

// How the bytes of a weight matrix are arranged.
enum class WeightLayout {
  kGguf,    // rows exactly as in a GGUF tensor: n rows of RowBytes(type, k)
  kPacked,  // the kernel-native layout below (see PackedWeightBytes); keep it 64-byte aligned: the
            // kernels load 64-byte vectors, and split loads run at half speed
};

// A weight matrix W of n rows (output features) by k columns (input features).
struct WeightView {
  QuantType type = QuantType::kF32;
  WeightLayout layout = WeightLayout::kGguf;
  int64_t n = 0;               // rows
  int64_t k = 0;               // columns
  const void* data = nullptr;  // not owned
};

// The packed format of GGUF type t (the table above): t itself, or Q8_0 for Q5_0.
// Every function below takes a GGUF type or a packed format and answers for the format.
constexpr QuantType PackedFormat(QuantType t) { return t == QuantType::kQ5_0 ? QuantType::kQ8_0 : t; }
// Bytes of one block scale entry / one quant block (16 rows x 32 values), and of one
// super-block scale entry (16 rows x 256 values; 256-value types only); 0 if t has none.
constexpr int PackedScaleBytes(QuantType t) {
  switch (PackedFormat(t)) {
    case QuantType::kQ4_0: case QuantType::kQ8_0: case QuantType::kQ4_K: case QuantType::kQ5_K:
    case QuantType::kQ6_K: case QuantType::kQ3_K: case QuantType::kIQ4_NL:
      return 32;
    case QuantType::kQ4_1: case QuantType::kQ5_1: case QuantType::kQ2_K:
      return 64;
    case QuantType::kIQ4_XS: case QuantType::kMXFP4:
      return 16;
    default:
      return 0;
  }
}
constexpr int PackedSuperBytes(QuantType t) {
  switch (PackedFormat(t)) {
    case QuantType::kQ4_K: case QuantType::kQ5_K: case QuantType::kQ2_K: return 64;
    case QuantType::kQ6_K: case QuantType::kQ3_K: case QuantType::kIQ4_XS: return 32;
    default: return 0;
  }
}
// True if the format stores nibbles (256-byte quant blocks), false for bytes (512).
constexpr bool PackedNibbles(QuantType t) {
  switch (PackedFormat(t)) {
    case QuantType::kQ8_0: case QuantType::kQ5_1: case QuantType::kQ5_K: case QuantType::kQ6_K: return false;
    default: return true;
  }
}
constexpr int PackedQuantBytes(QuantType t) { return PackedScaleBytes(t) == 0 ? 0 : PackedNibbles(t) ? 256 : 512; }
// 2 if each 16-value half of a block has its own scale (and min), else 1.
constexpr int PackedHalves(QuantType t) {
  const QuantType f = PackedFormat(t);
  return f == QuantType::kQ6_K || f == QuantType::kQ3_K || f == QuantType::kQ2_K ? 2 : 1;
}
// True if values have an additive per-block (per-half) min term m.
constexpr bool PackedHasMin(QuantType t) {
  const QuantType f = PackedFormat(t);
  return f == QuantType::kQ4_1 || f == QuantType::kQ5_1 || f == QuantType::kQ4_K || f == QuantType::kQ5_K ||
         f == QuantType::kQ2_K;
}
// True for the table types (IQ4_NL, IQ4_XS, MXFP4): stored codes map through a 16-entry table
// (the kernels' PackedLut).
constexpr bool PackedIsLut(QuantType t) {
  const QuantType f = PackedFormat(t);
  return f == QuantType::kIQ4_NL || f == QuantType::kIQ4_XS || f == QuantType::kMXFP4;
}
// Offset of the block scale entries in a panel of kb blocks (after the super-block entries), and
// bytes of the whole scale section (the quant section starts there).
constexpr int64_t PackedBlockScaleOffset(QuantType t, int64_t kb) { return kb / 8 * PackedSuperBytes(t); }
constexpr int64_t PackedScaleSection(QuantType t, int64_t kb) {
  return (PackedBlockScaleOffset(t, kb) + kb * PackedScaleBytes(t) + 63) / 64 * 64;
}
inline int64_t PackedPanelBytes(QuantType t, int64_t k) {
  return PackedScaleSection(t, k / 32) + k / 32 * PackedQuantBytes(t);
}
inline int64_t PackedPanels(int64_t n) { return (n + kPackRows - 1) / kPackRows; }

// True if t has a kernel-native packed layout (every quantised GEMM type).
bool CanRepack(QuantType t);
// Bytes of the packed layout of an n x k matrix of type t (0 if t has none).
size_t PackedWeightBytes(QuantType t, int64_t n, int64_t k);

}  // namespace estream
