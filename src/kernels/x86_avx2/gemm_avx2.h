// Internal to src/kernels and its tests: the AVX2 GEMM table entries with or without AVX-VNNI
// (vpdpbusd on ymm). FillAvx2Gemm picks by the host's CPUID; tests fill both variants so that
// the vpmaddubsw path is checked on hosts that have AVX-VNNI as well.
#pragma once

#include "kernels/dispatch.h"

namespace estream::kernels {

void FillAvx2GemmWith(KernelTable* t, bool use_avx_vnni);

}  // namespace estream::kernels
