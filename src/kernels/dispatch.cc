#include "kernels/dispatch.h"

#include <cstdlib>
#include <cstring>

#include "base/check.h"

namespace estream::kernels {
namespace {

KernelTable Build(Isa isa) {
  KernelTable t;
  FillScalarGemm(&t);
  FillScalarOps(&t);
  FillScalarShortConv(&t);
#if defined(__x86_64__)
  if (IsaAtLeast(isa, Isa::kAvx2)) {
    FillAvx2Gemm(&t);
    FillAvx2Ops(&t);
    FillAvx2ShortConv(&t);
  }
  if (IsaAtLeast(isa, Isa::kAvx512)) {
    FillAvx512Gemm(&t);
    FillAvx512Ops(&t);
    FillAvx512ShortConv(&t);
  }
#endif
#if defined(__aarch64__)
  if (IsaAtLeast(isa, Isa::kNeon)) {
    FillNeonQuantize(&t);
    FillNeonGemm(&t);
    FillNeonOps(&t);
    FillNeonAttention(&t);
    FillNeonShortConv(&t);
    if (NeonBf16AttentionSelected()) FillNeonBf16Attention(&t);
  }
  if (IsaAtLeast(isa, Isa::kDotprod)) FillDotprodGemm(&t);
  if (IsaAtLeast(isa, Isa::kI8mm)) FillI8mmGemm(&t);
#endif
  t.isa = isa;
  return t;
}

}  // namespace

#if defined(__aarch64__)
bool NeonBf16AttentionSelected() {
  static const bool selected = [] {
    auto off = [](const char* name) {
      const char* env = std::getenv(name);
      return env != nullptr && std::strcmp(env, "0") == 0;
    };
    return HostCpuFeatures().neon_bf16 && !off("ESTREAM_ATTN_BF16") && !off("ESTREAM_ATTN_LOWP");
  }();
  return selected;
}
#endif

const KernelTable& KernelsFor(Isa isa) {
  if (!IsaAtLeast(HostIsa(), isa)) isa = HostIsa();
  // One table per level of the host's chain, built on first use.
  static const KernelTable tables[] = {Build(Isa::kScalar),
                                       IsaAtLeast(HostIsa(), Isa::kAvx2) ? Build(Isa::kAvx2) : KernelTable{},
                                       IsaAtLeast(HostIsa(), Isa::kAvx512) ? Build(Isa::kAvx512) : KernelTable{},
                                       IsaAtLeast(HostIsa(), Isa::kNeon) ? Build(Isa::kNeon) : KernelTable{},
                                       IsaAtLeast(HostIsa(), Isa::kDotprod) ? Build(Isa::kDotprod) : KernelTable{},
                                       IsaAtLeast(HostIsa(), Isa::kI8mm) ? Build(Isa::kI8mm) : KernelTable{}};
  return tables[static_cast<int>(isa)];
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
