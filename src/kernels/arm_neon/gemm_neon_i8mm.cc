// The quantised GEMM with smmla (Armv8.6-A i8mm; gemm_neon_impl.h): every kGemmQuantTypes type,
// GGUF and packed layouts. Compiled with +i8mm (and +dotprod); reached through the dispatch table
// only where the CPU has it (Isa::kI8mm).
#include "kernels/arm_neon/gemm_neon_impl.h"

#if !defined(__ARM_FEATURE_MATMUL_INT8)
#error "gemm_neon_i8mm.cc must be compiled with +i8mm (see src/kernels/CMakeLists.txt)"
#endif

namespace estream::kernels {

void FillI8mmGemm(KernelTable* t) { NeonFillQuant<NeonLevel::kI8mm>(t); }

}  // namespace estream::kernels
