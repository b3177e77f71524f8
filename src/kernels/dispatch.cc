#include "kernels/dispatch.h"

#include "base/check.h"

namespace estream::kernels {
namespace {

KernelTable Build(Isa isa) {
  KernelTable t;
  FillScalarGemm(&t);
  FillScalarOps(&t);
  FillScalarShortConv(&t);
  if (static_cast<int>(isa) >= static_cast<int>(Isa::kAvx2) && isa != Isa::kNeon) {
    FillAvx2Gemm(&t);
    FillAvx2Ops(&t);
    FillAvx2ShortConv(&t);
  }
  if (isa == Isa::kAvx512) {
    FillAvx512Gemm(&t);
    FillAvx512Ops(&t);
    FillAvx512ShortConv(&t);
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

void GemmColumns(const KernelTable& kt, const WeightView& w, const BlockQ8A* xq, const float* x, int64_t ldx,
                 int64_t m, int64_t n_begin, int64_t n_end, float* tile, int64_t ld_tile) {
  float* y = tile - n_begin;
  const bool packed = w.layout == WeightLayout::kPacked;
  KernelTable::GemmFn fn = nullptr;
  switch (w.type) {
    case QuantType::kF32: kt.gemm_f32(w, x, ldx, m, n_begin, n_end, y, ld_tile); return;
    case QuantType::kF16: kt.gemm_f16(w, x, ldx, m, n_begin, n_end, y, ld_tile); return;
    case QuantType::kBF16: kt.gemm_bf16(w, x, ldx, m, n_begin, n_end, y, ld_tile); return;
    default: fn = kt.Quant(w.type, packed); break;
  }
  ESTREAM_CHECK(fn != nullptr, "GemmColumns: weight type without a GEMM (callers check GemmSupports)");
  fn(w, xq, m, n_begin, n_end, y, ld_tile);
}

const KernelTable& Kernels() {
  static const KernelTable& t = KernelsFor(ActiveIsa());
  return t;
}

}  // namespace estream::kernels
