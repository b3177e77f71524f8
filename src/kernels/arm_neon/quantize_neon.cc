// NEON Q8A quantiser: placeholder until its kernels land (the entries keep the scalar reference).
#include "kernels/dispatch.h"

namespace estream::kernels {

void FillNeonQuantize(KernelTable*) {}

}  // namespace estream::kernels
