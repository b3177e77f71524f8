// NEON short convolution: placeholder until its kernels land (the entries keep the scalar reference).
#include "kernels/dispatch.h"

namespace estream::kernels {

void FillNeonShortConv(KernelTable*) {}

}  // namespace estream::kernels
