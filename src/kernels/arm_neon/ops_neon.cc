// NEON kernels (ARMv8-A baseline): the row ops of ops_simd_impl.h (RMSNorm, RoPE, SwiGLU, router
// softmax, residual add) instantiated with the 4-lane traits of neon_traits.h. Compiled only for
// AArch64; reached through the dispatch table at every ARM level (neon, dotprod, i8mm).
#include "kernels/arm_neon/neon_traits.h"
#include "kernels/dispatch.h"
#include "kernels/ops_simd_impl.h"

namespace estream::kernels {

void FillNeonOps(KernelTable* t) { FillRowOps<NeonTraits>(t); }

}  // namespace estream::kernels
