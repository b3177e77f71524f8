// CPU feature detection and the instruction-set level estream runs its kernels at.
//
// One x86-64 binary serves every machine: kernels for each level are compiled in their own
// translation units and the dispatch table (kernels/dispatch.h) is filled once, at first use,
// for ActiveIsa(). The environment variable ESTREAM_ISA=scalar|avx2|avx512 forces a lower level
// (never a higher one than the CPU has), so tests can exercise every path on one machine.
// Thread safety: all functions are safe to call from any thread; results are computed once.
#pragma once

#include <string>

namespace estream {

struct CpuFeatures {
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
  bool neon = false;         // room for ARM: aarch64 with NEON / dotprod
  bool neon_dotprod = false;
};

// Ordered: a higher level implies every lower one is available.
enum class Isa {
  kScalar = 0,  // plain C++, the reference
  kAvx2 = 1,    // AVX2 + FMA + F16C (AVX-VNNI used where present)
  kAvx512 = 2,  // AVX-512 F/BW/VL/DQ + VNNI (+BF16 where present)
  kNeon = 3,    // reserved for aarch64; never selected on x86
};

const CpuFeatures& HostCpuFeatures();
// The best level the host supports.
Isa HostIsa();
// The level kernels run at: HostIsa(), lowered by ESTREAM_ISA if set. An unknown or
// unsupported ESTREAM_ISA value prints one warning to stderr and is ignored (or clamped).
Isa ActiveIsa();
const char* IsaName(Isa isa);
// Parses "scalar", "avx2", "avx512", "neon". Returns false for anything else.
bool ParseIsa(const std::string& name, Isa* out);

}  // namespace estream
