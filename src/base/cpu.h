// CPU feature detection and the instruction-set level estream runs its kernels at.
//
// One binary per architecture serves every machine of it: kernels for each level are compiled in
// their own translation units and the dispatch table (kernels/dispatch.h) is filled once, at first
// use, for ActiveIsa(). The levels of one architecture form a chain (a higher level implies every
// lower one); the two chains share only kScalar:
//   x86-64:  scalar < avx2 < avx512          (cpuid + XCR0: the OS must save the register state)
//   AArch64: scalar < neon < dotprod < i8mm   (getauxval(AT_HWCAP / AT_HWCAP2), set by the kernel)
// The environment variable ESTREAM_ISA=scalar|avx2|avx512|neon|dotprod|i8mm forces a lower level
// of the host's chain (never a higher one than the CPU has), so tests exercise every path on one
// machine; a level of the other architecture is refused with a warning.
// Thread safety: all functions are safe to call from any thread; results are computed once.
#pragma once

#include <string>
#include <vector>

namespace estream {

struct CpuFeatures {
  // x86-64
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx_vnni = false;     // VEX-encoded vpdpbusd on ymm
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_vnni = false;  // vpdpbusd on zmm
  bool avx512_bf16 = false;  // vdpbf16ps
  bool amx_int8 = false;
  bool amx_bf16 = false;
  // AArch64 (HWCAP bits of the Linux kernel)
  bool neon = false;         // Advanced SIMD (HWCAP_ASIMD; every ARMv8-A Linux machine)
  bool neon_fp16 = false;    // half-precision arithmetic (HWCAP_FPHP + HWCAP_ASIMDHP)
  bool neon_dotprod = false; // sdot/udot (HWCAP_ASIMDDP; ARMv8.2+, Cortex-A55/A76, Neoverse N1)
  bool neon_i8mm = false;    // smmla/ummla/usdot (HWCAP2_I8MM; ARMv8.6, Neoverse V1/N2, Cortex-A710)
  bool neon_bf16 = false;    // bfdot/bfmmla (HWCAP2_BF16)
  bool sve = false;          // HWCAP_SVE (detected and reported; no SVE kernels yet)
  bool sve2 = false;         // HWCAP2_SVE2
};

// The kernel levels; see the chains above. Compare levels with IsaAtLeast, not with <.
enum class Isa {
  kScalar = 0,   // plain C++, the reference
  kAvx2 = 1,     // AVX2 + FMA + F16C (AVX-VNNI used where present)
  kAvx512 = 2,   // AVX-512 F/BW/VL/DQ + VNNI (+BF16 where present)
  kNeon = 3,     // AArch64 Advanced SIMD (fp32 ops; int8 GEMM by widening multiplies)
  kDotprod = 4,  // + sdot (int8 4-way dot products)
  kI8mm = 5,     // + smmla (int8 2x8 by 8x2 matrix multiply-accumulate)
};

// True if a CPU at level `have` can run kernels of level `want`: want is scalar, or both are of
// the same architecture's chain and want is not above have.
bool IsaAtLeast(Isa have, Isa want);
// Every level from scalar up to `top` along top's chain, lowest first ({scalar, neon, dotprod}
// for dotprod). Tests loop over IsaLevelsUpTo(HostIsa()).
std::vector<Isa> IsaLevelsUpTo(Isa top);

const CpuFeatures& HostCpuFeatures();
// The best level the host supports.
Isa HostIsa();
// The level kernels run at: HostIsa(), lowered by ESTREAM_ISA if set. An unknown or
// unsupported ESTREAM_ISA value prints one warning to stderr and is ignored (or clamped).
Isa ActiveIsa();
const char* IsaName(Isa isa);
// Parses "scalar", "avx2", "avx512", "neon", "dotprod", "i8mm". Returns false for anything else.
bool ParseIsa(const std::string& name, Isa* out);
// The host's features in one line ("avx2 fma f16c avx512f ..." / "neon dotprod i8mm sve ..."),
// for logs and `estream --version`-style reports.
std::string CpuFeatureString(const CpuFeatures& f);

}  // namespace estream
