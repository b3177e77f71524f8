// AVX2 GEMM kernels (placeholder while the ymm kernels are written: the quantiser only; the
// GEMM entries inherit the scalar ones).
#include <immintrin.h>

#include "kernels/dispatch.h"
#include "quant/quant.h"

namespace estream::kernels {

void FillAvx2Gemm(KernelTable* t) { (void)t; }

}  // namespace estream::kernels
