// The quantised GEMM with sdot (Armv8.2-A dotprod; gemm_neon_impl.h): every kGemmQuantTypes type,
// GGUF and packed layouts. Compiled with +dotprod; reached through the dispatch table only where
// the CPU has it (Isa::kDotprod and above).
#include "kernels/arm_neon/gemm_neon_impl.h"

#if !defined(__ARM_FEATURE_DOTPROD)
#error "gemm_neon_dotprod.cc must be compiled with +dotprod (see src/kernels/CMakeLists.txt)"
#endif

namespace estream::kernels {

void FillDotprodGemm(KernelTable* t) { NeonFillQuant<NeonLevel::kDotprod>(t); }

}  // namespace estream::kernels
