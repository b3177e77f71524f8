// The instruction-set levels (base/cpu.h): names, the two chains, the forcing rules of ESTREAM_ISA,
// and, where the environment says what the CPU is, the detection itself: scripts/test.sh runs
// this binary under qemu-aarch64 with -cpu cortex-a53 / cortex-a76 / max and
// ESTREAM_EXPECT_HOST_ISA=neon / dotprod / i8mm.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "kernels/dispatch.h"

namespace estream {
namespace {

const Isa kAll[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kNeon, Isa::kDotprod, Isa::kI8mm};

TEST(Cpu, NamesRoundTrip) {
  for (Isa isa : kAll) {
    Isa parsed;
    ASSERT_TRUE(ParseIsa(IsaName(isa), &parsed)) << IsaName(isa);
    EXPECT_EQ(parsed, isa);
  }
  Isa unused;
  EXPECT_FALSE(ParseIsa("sve", &unused));
  EXPECT_FALSE(ParseIsa("", &unused));
  EXPECT_FALSE(ParseIsa("AVX2", &unused));
}

TEST(Cpu, LevelsFormTwoChainsSharingScalar) {
  for (Isa isa : kAll) {
    EXPECT_TRUE(IsaAtLeast(isa, Isa::kScalar));
    EXPECT_TRUE(IsaAtLeast(isa, isa));
  }
  EXPECT_TRUE(IsaAtLeast(Isa::kAvx512, Isa::kAvx2));
  EXPECT_FALSE(IsaAtLeast(Isa::kAvx2, Isa::kAvx512));
  EXPECT_TRUE(IsaAtLeast(Isa::kI8mm, Isa::kDotprod));
  EXPECT_TRUE(IsaAtLeast(Isa::kI8mm, Isa::kNeon));
  EXPECT_FALSE(IsaAtLeast(Isa::kNeon, Isa::kDotprod));
  EXPECT_FALSE(IsaAtLeast(Isa::kScalar, Isa::kNeon));
  // Never across the architectures, whatever the enum's numbers.
  EXPECT_FALSE(IsaAtLeast(Isa::kI8mm, Isa::kAvx2));
  EXPECT_FALSE(IsaAtLeast(Isa::kNeon, Isa::kAvx512));
  EXPECT_FALSE(IsaAtLeast(Isa::kAvx512, Isa::kNeon));
  EXPECT_EQ(IsaLevelsUpTo(Isa::kDotprod), (std::vector<Isa>{Isa::kScalar, Isa::kNeon, Isa::kDotprod}));
  EXPECT_EQ(IsaLevelsUpTo(Isa::kAvx512), (std::vector<Isa>{Isa::kScalar, Isa::kAvx2, Isa::kAvx512}));
  EXPECT_EQ(IsaLevelsUpTo(Isa::kScalar), (std::vector<Isa>{Isa::kScalar}));
}

TEST(Cpu, HostLevelMatchesTheFeaturesAndTheArchitecture) {
  const CpuFeatures& f = HostCpuFeatures();
  const Isa host = HostIsa();
  std::printf("host: %s (%s)\n", IsaName(host), CpuFeatureString(f).c_str());
#if defined(__aarch64__)
  EXPECT_TRUE(f.neon);
  EXPECT_TRUE(IsaAtLeast(host, Isa::kNeon));
  EXPECT_EQ(IsaAtLeast(host, Isa::kDotprod), f.neon_dotprod);
  EXPECT_EQ(IsaAtLeast(host, Isa::kI8mm), f.neon_dotprod && f.neon_i8mm);
#elif defined(__x86_64__)
  EXPECT_FALSE(f.neon);
  EXPECT_FALSE(IsaAtLeast(host, Isa::kNeon));
  EXPECT_EQ(IsaAtLeast(host, Isa::kAvx2), f.avx2 && f.fma && f.f16c);
#endif
  if (const char* want = std::getenv("ESTREAM_EXPECT_HOST_ISA")) { EXPECT_STREQ(IsaName(host), want); }
}

// ESTREAM_ISA lowers the level along the host's chain, never raises it and never leaves it.
TEST(Cpu, ActiveLevelFollowsEstreamIsa) {
  const Isa active = ActiveIsa();
  EXPECT_TRUE(IsaAtLeast(HostIsa(), active));
  Isa wanted;
  const char* env = std::getenv("ESTREAM_ISA");
  if (env != nullptr && ParseIsa(env, &wanted) && IsaAtLeast(HostIsa(), wanted)) { EXPECT_EQ(active, wanted); }
  if (env == nullptr || *env == '\0') { EXPECT_EQ(active, HostIsa()); }
  EXPECT_EQ(kernels::Kernels().isa, active);
}

TEST(Cpu, EveryLevelOfTheHostHasAFullTable) {
  for (Isa isa : IsaLevelsUpTo(HostIsa())) {
    const kernels::KernelTable& t = kernels::KernelsFor(isa);
    EXPECT_EQ(t.isa, isa);
    EXPECT_NE(t.quantize_q8a, nullptr);
    EXPECT_NE(t.attention_block, nullptr);
    EXPECT_NE(t.rms_norm_row, nullptr);
    EXPECT_NE(t.rope_row, nullptr);
    EXPECT_NE(t.swiglu, nullptr);
    EXPECT_NE(t.softmax_topk, nullptr);
    EXPECT_NE(t.add, nullptr);
    EXPECT_NE(t.short_conv_rows, nullptr);
    EXPECT_NE(t.gemm_f32, nullptr);
    for (QuantType q : kernels::kGemmQuantTypes) EXPECT_NE(t.Quant(q, false), nullptr) << IsaName(isa);
  }
  // A level beyond the host's chain falls back to the host's table.
  for (Isa isa : {Isa::kAvx512, Isa::kI8mm})
    if (!IsaAtLeast(HostIsa(), isa)) { EXPECT_EQ(kernels::KernelsFor(isa).isa, HostIsa()); }
}

}  // namespace
}  // namespace estream
