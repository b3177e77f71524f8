// NEON row ops: placeholder until its kernels land (the entries keep the scalar reference).
#include "kernels/dispatch.h"

namespace estream::kernels {

void FillNeonOps(KernelTable*) {}

}  // namespace estream::kernels
