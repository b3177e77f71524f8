// The AArch64 fill functions whose kernels are not written yet: each leaves the table's entries
// as the level below set them (the scalar reference, or the neon level's). Delete a stub here when
// its translation unit (arm_neon/gemm_neon.cc, gemm_dotprod.cc, gemm_i8mm.cc, attention_neon.cc)
// defines the function.
#include "kernels/dispatch.h"

namespace estream::kernels {

void FillNeonGemm(KernelTable*) {}
void FillNeonAttention(KernelTable*) {}
void FillDotprodGemm(KernelTable*) {}
void FillI8mmGemm(KernelTable*) {}

}  // namespace estream::kernels
