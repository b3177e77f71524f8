// The fused expert operator's epilogue (expert_op.h, step 3): one routed row of the down
// projection's output added into the layer's fp64 sum,
//     acc[j] += (double) a * (double) v[j],   j in [0, n).
// The product of two fp32 values is exact in fp64, so each element is rounded once (the add),
// with or without FMA: every ISA below gives the same bits (moe_expert_op_test checks each ISA
// the host has against the scalar one).
//
// One translation unit per ISA (x86_avx2/, x86_avx512/, arm_neon/: compiled with that ISA's flags, as in
// src/kernels), chosen per call site from the kernel table's ISA (so ESTREAM_ISA lowers it too).
// The fp64 rows are twice the bytes of fp32 ones; the baseline x86-64 build of expert_op.cc would
// add two doubles per instruction, which cost ~5-10% of an expert's time at 128-1024 routes.
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "base/cpu.h"

namespace estream::moe {

using ScaledAddF64Fn = void (*)(double* acc, const float* v, float a, int64_t n);

void ScaledAddF64Scalar(double* acc, const float* v, float a, int64_t n);
#if defined(__x86_64__)
void ScaledAddF64Avx2(double* acc, const float* v, float a, int64_t n);
void ScaledAddF64Avx512(double* acc, const float* v, float a, int64_t n);
#endif
#if defined(__aarch64__)
void ScaledAddF64Neon(double* acc, const float* v, float a, int64_t n);  // arm_neon/ (every level)
#endif

// The implementation for `isa` (unknown levels: scalar).
ScaledAddF64Fn ScaledAddF64For(Isa isa);

}  // namespace estream::moe
