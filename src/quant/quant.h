// Scalar (reference) quantisation and dequantisation of GGUF tensor types.
//
// Dequantisation is bit-exact with ggml's reference for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q4_K, Q5_K and Q6_K (checked against shared/testdata/quant). Quantisation is provided
// for the types `estream synth` writes (F32, F16, BF16, Q8_0, Q4_0: round-to-nearest, bit-exact
// with ggml's reference quantiser) and for the kernels' 8-bit activation format (BlockQ8A).
// All functions are pure and thread-safe; n must be a multiple of the type's block size.
#pragma once

#include <cstdint>

#include "quant/types.h"

namespace estream {

// True if DequantizeRow supports t.
bool CanDequantize(QuantType t);
// True if QuantizeRow supports t.
bool CanQuantize(QuantType t);

// dst[0..n) = the values of the n-element row at src. REQUIRES: CanDequantize(t).
void DequantizeRow(QuantType t, const void* src, float* dst, int64_t n);
// Writes RowBytes(t, n) bytes at dst. REQUIRES: CanQuantize(t).
void QuantizeRow(QuantType t, const float* src, void* dst, int64_t n);

void QuantizeRowQ4_0(const float* x, BlockQ4_0* y, int64_t n);
void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n);
// The activation format; n a multiple of kQK8A.
void QuantizeRowQ8A(const float* x, BlockQ8A* y, int64_t n);
void DequantizeRowQ8A(const BlockQ8A* x, float* y, int64_t n);

}  // namespace estream
