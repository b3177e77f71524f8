// This CPU's compute peaks, the yardsticks of the kernel benchmarks (issue 3).
//
// Each loop body issues many independent instructions (one per accumulator register, sources in
// registers of their own, no memory operands), enough to cover the 4-5 cycle latency at two
// instructions per cycle; a loop with few accumulators is latency-bound and reads ~3x too low.
// x86 with AVX-512: 24 accumulators zmm0..23, sources zmm24..25. Op counts (1 op = one multiply or
// one add): vpdpbusd zmm = 64 u8 x s8 products + 64 adds = 128 ops; vdpbf16ps zmm = 32 bf16
// products + 32 adds = 64 flops; vfmadd231ps zmm = 32 flops.
// peak/vpdpbusd_epilogue_mix_zmm adds the GEMM micro-kernel's per-block float operations to the
// vpdpbusd loop (ES_MIX_BODY below) and counts the vpdpbusd ops only.
// x86 without AVX-512 (16 ymm registers, VEX): 14 accumulators ymm0..13, sources ymm14..15.
// vpdpbusd ymm (AVX-VNNI) = 64 ops; vfmadd231ps ymm = 16 flops; and on AVX2 hosts without
// AVX-VNNI the int8 dot product that the AVX2 kernels use instead (kernels/x86_avx2/gemm_avx2.cc):
// vpmaddubsw (32 u8 x s8 products, 16 pair adds to int16), vpmaddwd by ones (8 adds to int32),
// vpaddd into the accumulator (8 adds) = 64 ops per three instructions; 6 such chains per
// body (6 accumulators, 6 temporaries, sources and the ones in ymm12..15). vpmaddubsw alone (14
// per body, 64 ops each: its 32 products and the 32 adds of a dot product, the int16 pair sums and
// a later widening counted as one) is the bound of any int8 kernel there: the AVX2 GEMM sums up
// to 8 of its results in int16 before one vpmaddwd, and so runs above the chain's rate.
// Run with 1 and 2 threads (one per core); the counter `ops` is the total rate over threads.
// On AArch64 the same loops time sdot, smmla and fmla on 128-bit vectors (24 accumulators
// v0..v23, sources v24, v25): sdot v.4s = 16 s8 x s8 products + 16 adds = 32 ops; smmla v.4s
// (2x8 by 8x2 int8 matrices) = 32 products + 32 adds = 64 ops; fmla v.4s = 8 flops. A loop whose
// extension the CPU lacks (CPUID, HWCAP) reports an error instead of running.
//
// And the memory the loads of the kernels meet (portable C++; the part of a kernel that waits on
// memory grows and shrinks with the host's memory contention, so its state belongs beside the
// compute peaks of the day: docs/PERFORMANCE.md, "Machine B, 2026-12-04 (fifth session)"):
//   mem/read_seq: each thread sums its half of a 256 MiB buffer in order; `bytes` = GB/s summed
//     over the threads (what the hardware prefetchers sustain for a stream such as the weights).
//   mem/page_hop: a chain of dependent loads, each to a new 4 KiB page of a 256 MiB buffer in a
//     random order (beyond the TLBs' reach); `ns` per load: what a strided row costs that no
//     prefetch covered (on a VM with the nested page walk).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <random>
#include <vector>
#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

namespace {

#define ES_REP24(OP)                                                                           \
  OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14) \
  OP(15) OP(16) OP(17) OP(18) OP(19) OP(20) OP(21) OP(22) OP(23)

#if defined(__x86_64__)
#define ES_DPBUSD(i) "vpdpbusd %%zmm24, %%zmm25, %%zmm" #i "\n\t"
#define ES_DPBF16(i) "vdpbf16ps %%zmm24, %%zmm25, %%zmm" #i "\n\t"
#define ES_FMA(i) "vfmadd231ps %%zmm24, %%zmm25, %%zmm" #i "\n\t"
#define ES_ZERO(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"

#define ES_CLOBBERS                                                                                     \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
      "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23",     \
      "xmm24", "xmm25", "xmm26", "xmm27", "k1", "eax", "cc"

// `iters` iterations of LOOP (24 instructions in the single-instruction loops). Both sources
// zmm24, zmm25 hold the 32-bit pattern `src`: bytes of 1 for vpdpbusd, bf16 pairs of 1.0 and fp32
// 1.0 for the float units (normal numbers: denormal operands would take microcode assists and
// measure those instead); zmm26, zmm27 hold fp32 1.0 for the float operations of a mixed loop.
#define ES_PEAK_LOOP(NAME, LOOP)                                                    \
  __attribute__((target("avx512f,avx512bw,avx512vnni,avx512bf16"))) void NAME(int64_t iters, uint32_t src) { \
    __asm__ volatile(                                                               \
        ES_REP24(ES_ZERO)                                                           \
        "vpbroadcastd %1, %%zmm24\n\t"                                              \
        "vmovdqa64 %%zmm24, %%zmm25\n\t"                                            \
        "mov $0x3F800000, %%eax\n\t"                                                \
        "vpbroadcastd %%eax, %%zmm26\n\t"                                           \
        "vmovdqa64 %%zmm26, %%zmm27\n\t"                                            \
        "1:\n\t" LOOP "dec %0\n\t"                                                  \
        "jnz 1b\n\t"                                                                \
        : "+r"(iters)                                                               \
        : "r"(src)                                                                  \
        : ES_CLOBBERS);                                                             \
  }
#define ES_PEAK_FN(NAME, BODY) ES_PEAK_LOOP(NAME, ES_REP24(BODY))

ES_PEAK_FN(LoopDpbusd, ES_DPBUSD)
ES_PEAK_FN(LoopDpbf16, ES_DPBF16)
ES_PEAK_FN(LoopFma, ES_FMA)

// The quantised GEMM micro-kernel's instruction mix (kernels/x86_avx512/gemm_avx512.cc: per
// 32-value block and output vector, 8 vpdpbusd, then the conversion, the scale product and the
// fused add): 16 vpdpbusd into zmm0..15, 2 vcvtdq2ps (zmm20, 21), 2 vmulps (zmm16, 17) and 2
// vfmadd231ps into zmm18, 19, on the fp32 sources zmm26, 27. Its vpdpbusd rate against
// peak/vpdpbusd_zmm is the bound of that kernel on this host: 8/10 where the multiplies share the
// vpdpbusd ports (AMD Zen 5 measured so), 1 where they do not.
#define ES_MIX_DP(i) "vpdpbusd %%zmm24, %%zmm25, %%zmm" #i "\n\t"
#define ES_MIX_BODY                                                                    \
  ES_MIX_DP(0) ES_MIX_DP(1) ES_MIX_DP(2) ES_MIX_DP(3) ES_MIX_DP(4) ES_MIX_DP(5) ES_MIX_DP(6) \
  ES_MIX_DP(7) "vcvtdq2ps %%zmm24, %%zmm20\n\t" "vmulps %%zmm26, %%zmm27, %%zmm16\n\t"  \
  "vfmadd231ps %%zmm26, %%zmm27, %%zmm18\n\t" ES_MIX_DP(8) ES_MIX_DP(9) ES_MIX_DP(10)     \
  ES_MIX_DP(11) ES_MIX_DP(12) ES_MIX_DP(13) ES_MIX_DP(14) ES_MIX_DP(15)                   \
  "vcvtdq2ps %%zmm25, %%zmm21\n\t" "vmulps %%zmm26, %%zmm27, %%zmm17\n\t"               \
  "vfmadd231ps %%zmm26, %%zmm27, %%zmm19\n\t"

ES_PEAK_LOOP(LoopDpbusdEpilogue, ES_MIX_BODY)

// peak/vpdpbusd_beside_<op>_zmm: 16 vpdpbusd into zmm0..15 with 8 independent instructions of
// one kind between them (one after every two), into zmm16..23 from the fp32 sources zmm26, 27
// (vcmpps into k1). A rate equal to peak/vpdpbusd_zmm means the instruction issues beside vpdpbusd
// for free; 2/3 of it, that it takes one of vpdpbusd's two pipes. This is what decides how much of
// a kernel's float work around its dot products costs time: the low-precision attention's
// softmax (docs/PERFORMANCE.md, "Machine B, 2026-12-06"). Measured on Zen 5: vaddps, vmaxps,
// vcvtdq2ps, vcvtps2dq, vrndscaleps and vscalefps free; vmulps and vfmadd231ps on the vpdpbusd
// pipes; vpackusdw, vpshufb and vcmpps in between.
#define ES_BESIDE_LOOP(NAME, OP)                                                                 \
  ES_PEAK_LOOP(NAME, ES_MIX_DP(0) ES_MIX_DP(1) OP(16) ES_MIX_DP(2) ES_MIX_DP(3) OP(17) ES_MIX_DP(4) \
                         ES_MIX_DP(5) OP(18) ES_MIX_DP(6) ES_MIX_DP(7) OP(19) ES_MIX_DP(8)          \
                             ES_MIX_DP(9) OP(20) ES_MIX_DP(10) ES_MIX_DP(11) OP(21) ES_MIX_DP(12)   \
                                 ES_MIX_DP(13) OP(22) ES_MIX_DP(14) ES_MIX_DP(15) OP(23))
// The instruction kinds, once: X(loop suffix, name in the benchmark, the instruction into zmm i).
#define ES_OP3(MNEMONIC, i) #MNEMONIC " %%zmm26, %%zmm27, %%zmm" #i "\n\t"
#define ES_OP_ADD(i) ES_OP3(vaddps, i)
#define ES_OP_MAX(i) ES_OP3(vmaxps, i)
#define ES_OP_CVTI(i) "vcvtdq2ps %%zmm26, %%zmm" #i "\n\t"
#define ES_OP_CVTF(i) "vcvtps2dq %%zmm26, %%zmm" #i "\n\t"
#define ES_OP_ROUND(i) "vrndscaleps $8, %%zmm26, %%zmm" #i "\n\t"
#define ES_OP_SCALEF(i) ES_OP3(vscalefps, i)
#define ES_OP_PACK(i) ES_OP3(vpackusdw, i)
#define ES_OP_SHUF(i) ES_OP3(vpshufb, i)
#define ES_OP_CMP(i) "vcmpps $13, %%zmm26, %%zmm" #i ", %%k1\n\t"
#define ES_OP_MUL(i) ES_OP3(vmulps, i)
#define ES_OP_FMA(i) ES_OP3(vfmadd231ps, i)
#define ES_BESIDE_OPS(X)                                                                          \
  X(Add, "vaddps", ES_OP_ADD) X(Max, "vmaxps", ES_OP_MAX) X(CvtI, "vcvtdq2ps", ES_OP_CVTI)         \
  X(CvtF, "vcvtps2dq", ES_OP_CVTF) X(Round, "vrndscaleps", ES_OP_ROUND)                            \
  X(Scalef, "vscalefps", ES_OP_SCALEF) X(Pack, "vpackusdw", ES_OP_PACK) X(Shuf, "vpshufb", ES_OP_SHUF) \
  X(Cmp, "vcmpps_k", ES_OP_CMP) X(Mul, "vmulps", ES_OP_MUL) X(Fma, "vfmadd231ps", ES_OP_FMA)
#define ES_BESIDE_DEFINE(SUFFIX, NAME, OP) ES_BESIDE_LOOP(LoopBeside##SUFFIX, OP)
ES_BESIDE_OPS(ES_BESIDE_DEFINE)
#define ES_BESIDE_POINTER(SUFFIX, NAME, OP) LoopBeside##SUFFIX,
constexpr void (*kBesideLoops[])(int64_t, uint32_t) = {ES_BESIDE_OPS(ES_BESIDE_POINTER)};

#define ES_REP14(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13)
#define ES_REP6(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5)
#define ES_DPBUSD_Y(i) "%{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define ES_FMA_Y(i) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define ES_MADDUBS_ONLY_Y(i) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define ES_ZERO_Y(i) "vpxor %%ymm" #i ", %%ymm" #i ", %%ymm" #i "\n\t"
// Chain i: ymm(6 + i) = maddubs(ymm12 u8, ymm13 s8); ymm(6 + i) = maddwd(ymm(6 + i), ymm15 ones);
// ymm i += ymm(6 + i). All six vpmaddubsw first, then the vpmaddwd, then the adds.
#define ES_MADDUBS_Y(i) "vpmaddubsw %%ymm13, %%ymm12, %%ymm" ES_T(i) "\n\t"
#define ES_MADDWD_Y(i) "vpmaddwd %%ymm15, %%ymm" ES_T(i) ", %%ymm" ES_T(i) "\n\t"
#define ES_ADD_Y(i) "vpaddd %%ymm" ES_T(i) ", %%ymm" #i ", %%ymm" #i "\n\t"
#define ES_T(i) ES_T_##i
#define ES_T_0 "6"
#define ES_T_1 "7"
#define ES_T_2 "8"
#define ES_T_3 "9"
#define ES_T_4 "10"
#define ES_T_5 "11"

#define ES_CLOBBERS_Y                                                                                  \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
      "xmm13", "xmm14", "xmm15", "cc"

// As ES_PEAK_FN on ymm: every source register (ymm12..15) holds `src` (in the vpmaddubsw chain
// ymm15 stands for the int16 ones; integer instructions take the same time whatever the values).
#define ES_PEAK_FN_Y(NAME, TARGET, BODY)                                            \
  __attribute__((target(TARGET))) void NAME(int64_t iters, uint32_t src) {          \
    __asm__ volatile(                                                               \
        ES_REP14(ES_ZERO_Y)                                                         \
        "vmovd %1, %%xmm14\n\t"                                                     \
        "vpbroadcastd %%xmm14, %%ymm14\n\t"                                         \
        "vmovdqa %%ymm14, %%ymm15\n\t"                                              \
        "vmovdqa %%ymm14, %%ymm12\n\t"                                              \
        "vmovdqa %%ymm14, %%ymm13\n\t"                                              \
        "1:\n\t" BODY "dec %0\n\t"                                                \
        "jnz 1b\n\t"                                                                \
        : "+r"(iters)                                                               \
        : "r"(src)                                                                  \
        : ES_CLOBBERS_Y);                                                           \
  }

ES_PEAK_FN_Y(LoopDpbusdYmm, "avx2,avxvnni", ES_REP14(ES_DPBUSD_Y))
ES_PEAK_FN_Y(LoopFmaYmm, "avx2,fma", ES_REP14(ES_FMA_Y))
ES_PEAK_FN_Y(LoopMaddubsYmm, "avx2", ES_REP6(ES_MADDUBS_Y) ES_REP6(ES_MADDWD_Y) ES_REP6(ES_ADD_Y))
ES_PEAK_FN_Y(LoopMaddubsOnlyYmm, "avx2", ES_REP14(ES_MADDUBS_ONLY_Y))

#elif defined(__aarch64__)
#define ES_SDOT(i) "sdot v" #i ".4s, v24.16b, v25.16b\n\t"
#define ES_SMMLA(i) "smmla v" #i ".4s, v24.16b, v25.16b\n\t"
#define ES_FMLA(i) "fmla v" #i ".4s, v24.4s, v25.4s\n\t"
#define ES_ZERO(i) "movi v" #i ".16b, #0\n\t"

#define ES_CLOBBERS                                                                                  \
  "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v12", "v13", "v14", "v15", \
      "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "cc"

// The .arch directive lets the assembler take the instructions whatever -march the
// file has; BM_Peak checks the CPU before calling a loop.
#define ES_PEAK_FN(NAME, BODY)                                                      \
  void NAME(int64_t iters, uint32_t src) {                                          \
    __asm__ volatile(                                                               \
        ".arch armv8.2-a+dotprod+i8mm\n\t"                                         \
        ES_REP24(ES_ZERO)                                                           \
        "dup v24.4s, %w1\n\t"                                                       \
        "mov v25.16b, v24.16b\n\t"                                                  \
        "1:\n\t" ES_REP24(BODY) "subs %0, %0, #1\n\t"                              \
        "b.ne 1b\n\t"                                                               \
        : "+r"(iters)                                                               \
        : "r"(src)                                                                  \
        : ES_CLOBBERS);                                                             \
  }

ES_PEAK_FN(LoopSdot, ES_SDOT)
ES_PEAK_FN(LoopSmmla, ES_SMMLA)
ES_PEAK_FN(LoopFmla, ES_FMLA)
#endif

// True if the CPU runs kLoop (CPUID with the OS's register-state check on x86; HWCAP_ASIMDDP for
// sdot, HWCAP2_I8MM for smmla on AArch64).
template <void (*kLoop)(int64_t, uint32_t)>
bool Runs() {
#if defined(__x86_64__)
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  if (kLoop == LoopDpbusd || kLoop == LoopDpbusdEpilogue ||
      std::find(std::begin(kBesideLoops), std::end(kBesideLoops), kLoop) != std::end(kBesideLoops))
    return avx512 && __builtin_cpu_supports("avx512vnni");
  if (kLoop == LoopDpbf16) return avx512 && __builtin_cpu_supports("avx512bf16");
  if (kLoop == LoopFma) return avx512;
  if (kLoop == LoopDpbusdYmm) return __builtin_cpu_supports("avxvnni");
  if (kLoop == LoopFmaYmm) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (kLoop == LoopMaddubsYmm || kLoop == LoopMaddubsOnlyYmm) return __builtin_cpu_supports("avx2");
#elif defined(__aarch64__)
  if (kLoop == LoopSdot) return (getauxval(AT_HWCAP) & (1ul << 20)) != 0;
  if (kLoop == LoopSmmla) return (getauxval(AT_HWCAP2) & (1ul << 13)) != 0;
#endif
  return true;
}

// Counter `ops`: each thread's own rate (its ops / its wall time), summed over the threads.
// kOpsPerUnit ops per instruction (per chain for the vpmaddubsw loop), kUnits of them per body.
template <void (*kLoop)(int64_t, uint32_t), int kOpsPerUnit, uint32_t kSrc, int kUnits = 24>
void BM_Peak(benchmark::State& state) {
  if (!Runs<kLoop>()) {
    state.SkipWithError("this CPU lacks the instruction");
    return;
  }
  constexpr int64_t kIters = 1 << 16;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) kLoop(kIters, kSrc);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.counters["ops"] = static_cast<double>(state.iterations()) * kIters * kUnits * kOpsPerUnit / s;
}

#if defined(__x86_64__)
BENCHMARK(BM_Peak<LoopDpbusd, 128, 0x01010101u>)->Name("peak/vpdpbusd_zmm")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Peak<LoopDpbusdEpilogue, 128, 0x01010101u, 16>)
    ->Name("peak/vpdpbusd_epilogue_mix_zmm")
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();
#define ES_BESIDE_BENCH(SUFFIX, NAME, OP)                                                    \
  BENCHMARK(BM_Peak<LoopBeside##SUFFIX, 128, 0x01010101u, 16>)                                \
      ->Name("peak/vpdpbusd_beside_" NAME "_zmm")                                             \
      ->Threads(1)                                                                            \
      ->UseRealTime();
ES_BESIDE_OPS(ES_BESIDE_BENCH)
BENCHMARK(BM_Peak<LoopDpbf16, 64, 0x3F803F80u>)->Name("peak/vdpbf16ps_zmm")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Peak<LoopFma, 32, 0x3F800000u>)->Name("peak/vfmadd231ps_zmm")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Peak<LoopDpbusdYmm, 64, 0x01010101u, 14>)->Name("peak/vpdpbusd_ymm")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Peak<LoopMaddubsYmm, 64, 0x01010101u, 6>)
    ->Name("peak/vpmaddubsw_vpmaddwd_ymm")
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();
BENCHMARK(BM_Peak<LoopMaddubsOnlyYmm, 64, 0x01010101u, 14>)
    ->Name("peak/vpmaddubsw_ymm")
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();
BENCHMARK(BM_Peak<LoopFmaYmm, 16, 0x3F800000u, 14>)->Name("peak/vfmadd231ps_ymm")->Threads(1)->Threads(2)->UseRealTime();
#elif defined(__aarch64__)
BENCHMARK(BM_Peak<LoopSdot, 32, 0x01010101u>)->Name("peak/sdot_4s")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Peak<LoopSmmla, 64, 0x01010101u>)->Name("peak/smmla_4s")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Peak<LoopFmla, 8, 0x3F800000u>)->Name("peak/fmla_4s")->Threads(1)->Threads(2)->UseRealTime();
#endif

constexpr size_t kMemBytes = size_t{256} << 20;

// The buffer of the memory benchmarks, filled once (shared by the threads, read only).
const uint64_t* MemBuffer() {
  static const std::vector<uint64_t> buf = [] {
    std::vector<uint64_t> b(kMemBytes / sizeof(uint64_t));
    std::iota(b.begin(), b.end(), uint64_t{1});
    return b;
  }();
  return buf.data();
}

void BM_MemReadSeq(benchmark::State& state) {
  const size_t words = kMemBytes / sizeof(uint64_t) / static_cast<size_t>(state.threads());
  const uint64_t* part = MemBuffer() + words * static_cast<size_t>(state.thread_index());
  uint64_t sum = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (size_t i = 0; i < words; i += 4) sum += part[i] + part[i + 1] + part[i + 2] + part[i + 3];
    benchmark::DoNotOptimize(sum);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.counters["bytes"] = static_cast<double>(state.iterations()) * words * sizeof(uint64_t) / s;
}
BENCHMARK(BM_MemReadSeq)->Name("mem/read_seq")->Threads(1)->Threads(2)->UseRealTime();

void BM_MemPageHop(benchmark::State& state) {
  constexpr size_t kPage = 4096, kPages = kMemBytes / kPage, kWordsPerPage = kPage / sizeof(uint64_t);
  // The pages in a random cycle (order); each hop reads the word at a random line of its page,
  // which holds the index of the next hop's word.
  std::vector<uint32_t> order(kPages);
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937 rng(12345);
  std::shuffle(order.begin(), order.end(), rng);
  std::uniform_int_distribution<size_t> line(0, kPage / 64 - 1);
  std::vector<size_t> hop(kPages);  // the word read by hop i (page order[i])
  for (size_t i = 0; i < kPages; ++i) hop[i] = order[i] * kWordsPerPage + line(rng) * 8;
  std::vector<uint64_t> buf(kMemBytes / sizeof(uint64_t));
  for (size_t i = 0; i < kPages; ++i) buf[hop[i]] = hop[(i + 1) % kPages];
  constexpr int64_t kHops = 1 << 16;
  size_t at = hop[0];
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (int64_t h = 0; h < kHops; ++h) at = static_cast<size_t>(buf[at]);
    benchmark::DoNotOptimize(at);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.counters["ns"] = s * 1e9 / (static_cast<double>(state.iterations()) * kHops);
}
BENCHMARK(BM_MemPageHop)->Name("mem/page_hop")->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
