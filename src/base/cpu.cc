#include "base/cpu.h"

#include <cstdio>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace estream {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// XCR0 tells which register states the OS saves; without them the instructions fault.
unsigned long long ReadXcr0() {
  unsigned int eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned int eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = (ecx >> 27) & 1;
  const bool avx = (ecx >> 28) & 1;
  f.fma = (ecx >> 12) & 1;
  f.f16c = (ecx >> 29) & 1;
  if (!osxsave || !avx) return CpuFeatures{};
  const unsigned long long xcr0 = ReadXcr0();
  const bool ymm_ok = (xcr0 & 0x6) == 0x6;
  const bool zmm_ok = (xcr0 & 0xe6) == 0xe6;
  if (!ymm_ok) return CpuFeatures{};
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  f.avx2 = (ebx >> 5) & 1;
  f.avx512f = zmm_ok && ((ebx >> 16) & 1);
  f.avx512dq = zmm_ok && ((ebx >> 17) & 1);
  f.avx512bw = zmm_ok && ((ebx >> 30) & 1);
  f.avx512vl = zmm_ok && ((ebx >> 31) & 1);
  f.avx512_vnni = zmm_ok && ((ecx >> 11) & 1);
  f.amx_bf16 = (edx >> 22) & 1;
  f.amx_int8 = (edx >> 25) & 1;
  unsigned int eax1, ebx1, ecx1, edx1;
  __cpuid_count(7, 1, eax1, ebx1, ecx1, edx1);
  f.avx_vnni = (eax1 >> 4) & 1;
  f.avx512_bf16 = zmm_ok && ((eax1 >> 5) & 1);
  return f;
}
#elif defined(__aarch64__)
CpuFeatures Detect() {
  CpuFeatures f;
  f.neon = true;
  return f;
}
#else
CpuFeatures Detect() { return CpuFeatures{}; }
#endif

Isa ComputeHostIsa() {
  const CpuFeatures& f = HostCpuFeatures();
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_vnni && f.avx2 && f.fma &&
      f.f16c)
    return Isa::kAvx512;
  if (f.avx2 && f.fma && f.f16c) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa ComputeActiveIsa() {
  const Isa host = HostIsa();
  const char* env = std::getenv("ESTREAM_ISA");
  if (env == nullptr || *env == '\0') return host;
  Isa wanted;
  if (!ParseIsa(env, &wanted) || wanted == Isa::kNeon) {
    std::fprintf(stderr, "estream: warning: ESTREAM_ISA=%s is not one of scalar, avx2, avx512; using %s\n",
                 env, IsaName(host));
    return host;
  }
  if (static_cast<int>(wanted) > static_cast<int>(host)) {
    std::fprintf(stderr, "estream: warning: ESTREAM_ISA=%s is not supported by this CPU; using %s\n", env,
                 IsaName(host));
    return host;
  }
  return wanted;
}

}  // namespace

const CpuFeatures& HostCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

Isa HostIsa() {
  static const Isa isa = ComputeHostIsa();
  return isa;
}

Isa ActiveIsa() {
  static const Isa isa = ComputeActiveIsa();
  return isa;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kNeon: return "neon";
  }
  return "unknown";
}

bool ParseIsa(const std::string& name, Isa* out) {
  if (name == "scalar") { *out = Isa::kScalar; return true; }
  if (name == "avx2") { *out = Isa::kAvx2; return true; }
  if (name == "avx512") { *out = Isa::kAvx512; return true; }
  if (name == "neon") { *out = Isa::kNeon; return true; }
  return false;
}

}  // namespace estream
