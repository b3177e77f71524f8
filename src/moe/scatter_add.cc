#include "moe/scatter_add.h"

namespace estream::moe {

void ScaledAddF64Scalar(double* __restrict acc, const float* __restrict v, float a, int64_t n) {
  const double ad = a;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) acc[j] += ad * static_cast<double>(v[j]);
}

ScaledAddF64Fn ScaledAddF64For(Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case Isa::kAvx512: return ScaledAddF64Avx512;
    case Isa::kAvx2: return ScaledAddF64Avx2;
#endif
#if defined(__aarch64__)
    case Isa::kNeon:
    case Isa::kDotprod:
    case Isa::kI8mm: return ScaledAddF64Neon;
#endif
    default: return ScaledAddF64Scalar;
  }
}

}  // namespace estream::moe
