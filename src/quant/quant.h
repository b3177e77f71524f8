// Scalar (reference) quantisation and dequantisation of GGUF tensor types.
//
// Dequantisation is bit-exact with ggml's reference for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4 (checked against
// shared/testdata/quant). Quantisation is provided for every one of them (what `estream synth`
// writes) and for the kernels' 8-bit activation format (BlockQ8A):
//   Q4_0, Q8_0, Q4_1, Q5_0, Q5_1: round-to-nearest, bit-exact with ggml's reference quantisers.
//   Q2_K..Q6_K: round-to-nearest with the sub-block scales (and mins) taken from each sub-block's
//     range and rounded to the 4/6/8-bit scale grid; ggml searches scales and mins to minimise the
//     squared error, so these give a larger error (on the shared vectors, quant_test: rms error
//     1.10x ggml's for Q4_K, 1.06x Q5_K, 1.08x Q6_K, 1.03x Q3_K, 1.13x Q2_K).
//   IQ4_NL, IQ4_XS: nearest table value for a scale that maps the block's largest value onto the
//     table's end, then one least-squares refit of the scale; ggml tries 15 more scales (rms error
//     0.99x ggml's for IQ4_NL, 1.02x for IQ4_XS on the shared vectors).
//   MXFP4: ggml's rule (shared exponent floor(log2(max|x|)) - 2, nearest E2M1 value).
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

// The value tables of the non-linear 4-bit types: IQ4_NL/IQ4_XS codes map to kIq4NlValues[q]
// (times the block scale); MXFP4 codes to kMxfp4Values[q], which are twice the E2M1 values, times
// E8M0HalfToFp32(e) = 2^(e - 128).
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e - 128) as an fp32 (a subnormal for e < 2; exact for every e).
float E8M0HalfToFp32(uint8_t e);

void QuantizeRowQ4_0(const float* x, BlockQ4_0* y, int64_t n);
void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n);
// The activation format; n a multiple of kQK8A.
void QuantizeRowQ8A(const float* x, BlockQ8A* y, int64_t n);
void DequantizeRowQ8A(const BlockQ8A* x, float* y, int64_t n);

}  // namespace estream
