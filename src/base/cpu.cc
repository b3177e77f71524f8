#include "base/cpu.h"

#include <cstdio>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
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
#elif defined(__aarch64__) && defined(__linux__)
// The bit numbers of <asm/hwcap.h>, spelled out so that older headers (without HWCAP2_I8MM)
// still build; the kernel only sets bits of features it enables for user space.
constexpr unsigned long kHwcapFphp = 1ul << 9, kHwcapAsimd = 1ul << 1, kHwcapAsimdhp = 1ul << 10,
                        kHwcapAsimddp = 1ul << 20, kHwcapSve = 1ul << 22;
constexpr unsigned long kHwcap2Sve2 = 1ul << 1, kHwcap2I8mm = 1ul << 13, kHwcap2Bf16 = 1ul << 14;

CpuFeatures Detect() {
  CpuFeatures f;
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f.neon = (hw & kHwcapAsimd) != 0;
  f.neon_fp16 = (hw & kHwcapFphp) != 0 && (hw & kHwcapAsimdhp) != 0;
  f.neon_dotprod = (hw & kHwcapAsimddp) != 0;
  f.neon_i8mm = (hw2 & kHwcap2I8mm) != 0;
  f.neon_bf16 = (hw2 & kHwcap2Bf16) != 0;
  f.sve = (hw & kHwcapSve) != 0;
  f.sve2 = (hw2 & kHwcap2Sve2) != 0;
  return f;
}
#elif defined(__aarch64__)
// AArch64 without Linux's auxiliary vector: NEON is architectural; the optional extensions are
// not probed (reading ID registers traps on some systems).
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
  if (f.neon) {
    if (f.neon_dotprod && f.neon_i8mm) return Isa::kI8mm;
    if (f.neon_dotprod) return Isa::kDotprod;
    return Isa::kNeon;
  }
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
  if (!ParseIsa(env, &wanted)) {
    std::fprintf(stderr,
                 "estream: warning: ESTREAM_ISA=%s is not one of scalar, avx2, avx512, neon, dotprod, i8mm; "
                 "using %s\n",
                 env, IsaName(host));
    return host;
  }
  if (!IsaAtLeast(host, wanted)) {
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
    case Isa::kDotprod: return "dotprod";
    case Isa::kI8mm: return "i8mm";
  }
  return "unknown";
}

namespace {
bool IsArm(Isa isa) { return isa == Isa::kNeon || isa == Isa::kDotprod || isa == Isa::kI8mm; }
}  // namespace

bool IsaAtLeast(Isa have, Isa want) {
  if (want == Isa::kScalar) return true;
  if (have == Isa::kScalar || IsArm(have) != IsArm(want)) return false;
  return static_cast<int>(want) <= static_cast<int>(have);
}

std::vector<Isa> IsaLevelsUpTo(Isa top) {
  std::vector<Isa> levels = {Isa::kScalar};
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kNeon, Isa::kDotprod, Isa::kI8mm})
    if (IsaAtLeast(top, isa)) levels.push_back(isa);
  return levels;
}

std::string CpuFeatureString(const CpuFeatures& f) {
  std::string s;
  auto add = [&s](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx_vnni, "avx_vnni");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.amx_int8, "amx_int8");
  add(f.amx_bf16, "amx_bf16");
  add(f.neon, "neon");
  add(f.neon_fp16, "fp16");
  add(f.neon_dotprod, "dotprod");
  add(f.neon_i8mm, "i8mm");
  add(f.neon_bf16, "bf16");
  add(f.sve, "sve");
  add(f.sve2, "sve2");
  return s.empty() ? "none" : s;
}

bool ParseIsa(const std::string& name, Isa* out) {
  if (name == "scalar") { *out = Isa::kScalar; return true; }
  if (name == "avx2") { *out = Isa::kAvx2; return true; }
  if (name == "avx512") { *out = Isa::kAvx512; return true; }
  if (name == "neon") { *out = Isa::kNeon; return true; }
  if (name == "dotprod") { *out = Isa::kDotprod; return true; }
  if (name == "i8mm") { *out = Isa::kI8mm; return true; }
  return false;
}

}  // namespace estream
