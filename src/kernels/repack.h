// The scalar helpers that build the kernel-native ("packed") weight layout, whose format, sizes
// and version are documented in quant/packed_format.h. Internal to src/kernels (the public entry
// points are in kernels.h: CanRepack, PackedWeightBytes, RepackWeights).
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/packed_format.h"
#include "quant/types.h"

namespace estream::kernels {

// One 32-value block of one row, decoded to its stored values: the row's value at v is
// d[v / 16] * (Q(q[v]) - ZeroPoint) + m[v / 16], where Q is the identity, or for the table types
// (PackedLut) the table entry of the 4-bit code q[v].
struct Block32 {
  uint8_t q[32];
  float d[2];
  float m[2];
};

// The 16 u8 values of the codes of a table type (its int8 table + 128); nullptr otherwise.
const uint8_t* PackedLut(QuantType t);
// The zero point Z of the format's unsigned values (Q4_0 8, Q8_0 and the table types 128,
// Q6_K 32, Q3_K 4, the formats with mins 0).
int ZeroPoint(QuantType t);

// Decodes block b (values 32b..32b+31) of the GGUF row at `row` (k values of GGUF type t) into
// the stored values of its packed format (Q5_0: value + 128).
void DecodeBlock32(QuantType t, const void* row, int64_t b, Block32* out);

// Writes one packed panel of k values from `rows` valid GGUF rows (rows <= 16; missing rows are
// zero) starting at `src` with `src_stride` bytes between rows.
void PackPanel(QuantType t, const void* src, size_t src_stride, int rows, int64_t k, void* dst);

// This thread's buffer for panels packed on the fly from GGUF rows (the GEMMs' unpacked-weights
// path): at least `bytes`, 64-byte aligned (a load straddling two cache lines costs two), grown
// and never shrunk, valid until this thread's next call. Aborts when the memory cannot be had.
uint8_t* PanelPackBuffer(size_t bytes);

// This thread's buffer for the float GEMMs' transposed weight panels (k x 16 or k x 32 fp32): at
// least `floats` values, 64-byte aligned, grown and never shrunk, valid until this thread's next
// call. Aborts when the memory cannot be had.
float* FloatPanelBuffer(size_t floats);

}  // namespace estream::kernels
