#include "kernels/dispatch.h"

namespace estream::kernels {
namespace {

KernelTable Build(Isa isa) {
  KernelTable t;
  FillScalarGemm(&t);
  FillScalarOps(&t);
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx2) && isa != Isa::kNeon) {
    FillAvx2Gemm(&t);
    FillAvx2Ops(&t);
  }
  if (isa == Isa::kAvx512) {
    FillAvx512Gemm(&t);
    FillAvx512Ops(&t);
  }
  t.isa = isa;
  return t;
}

}  // namespace

const KernelTable& KernelsFor(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(HostIsa()) || isa == Isa::kNeon) isa = HostIsa();
  static const KernelTable scalar = Build(Isa::kScalar);
  static const KernelTable avx2 = HostIsa() >= Isa::kAvx2 ? Build(Isa::kAvx2) : scalar;
  static const KernelTable avx512 = HostIsa() >= Isa::kAvx512 ? Build(Isa::kAvx512) : avx2;
  switch (isa) {
    case Isa::kAvx512: return avx512;
    case Isa::kAvx2: return avx2;
    default: return scalar;
  }
}

const KernelTable& Kernels() {
  static const KernelTable& t = KernelsFor(ActiveIsa());
  return t;
}

}  // namespace estream::kernels
