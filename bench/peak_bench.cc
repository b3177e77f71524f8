// This CPU's compute peaks, the yardsticks of the kernel benchmarks (issue 3).
//
// Each loop body issues 24 independent instructions (one per accumulator register zmm0..23,
// sources in zmm24..25, no memory operands), enough to cover the 4-5 cycle latency at two
// instructions per cycle; a loop with few accumulators is latency-bound and reads ~3x too low.
// Op counts (1 op = one multiply or one add): vpdpbusd zmm = 64 u8 x s8 products + 64 adds
// = 128 ops; vdpbf16ps zmm = 32 bf16 products + 32 adds = 64 flops; vfmadd231ps zmm = 32 flops.
// Run with 1 and 2 threads (one per core); the counter `ops` is the total rate over threads.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>

namespace {

#define ES_REP24(OP)                                                                           \
  OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14) \
  OP(15) OP(16) OP(17) OP(18) OP(19) OP(20) OP(21) OP(22) OP(23)

#define ES_DPBUSD(i) "vpdpbusd %%zmm24, %%zmm25, %%zmm" #i "\n\t"
#define ES_DPBF16(i) "vdpbf16ps %%zmm24, %%zmm25, %%zmm" #i "\n\t"
#define ES_FMA(i) "vfmadd231ps %%zmm24, %%zmm25, %%zmm" #i "\n\t"
#define ES_ZERO(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"

#define ES_CLOBBERS                                                                                     \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
      "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23",     \
      "xmm24", "xmm25", "cc"

// `iters` iterations of 24 instructions each. Both sources hold the 32-bit pattern `src`:
// bytes of 1 for vpdpbusd, bf16 pairs of 1.0 and fp32 1.0 for the float units (normal numbers:
// denormal operands would take microcode assists and measure those instead).
#define ES_PEAK_FN(NAME, BODY)                                                      \
  __attribute__((target("avx512f,avx512bw,avx512vnni,avx512bf16"))) void NAME(int64_t iters, uint32_t src) { \
    __asm__ volatile(                                                               \
        ES_REP24(ES_ZERO)                                                           \
        "vpbroadcastd %1, %%zmm24\n\t"                                              \
        "vmovdqa64 %%zmm24, %%zmm25\n\t"                                            \
        "1:\n\t" ES_REP24(BODY) "dec %0\n\t"                                        \
        "jnz 1b\n\t"                                                                \
        : "+r"(iters)                                                               \
        : "r"(src)                                                                  \
        : ES_CLOBBERS);                                                             \
  }

ES_PEAK_FN(LoopDpbusd, ES_DPBUSD)
ES_PEAK_FN(LoopDpbf16, ES_DPBF16)
ES_PEAK_FN(LoopFma, ES_FMA)

// Counter `ops`: each thread's own rate (its ops / its wall time), summed over the threads.
template <void (*kLoop)(int64_t, uint32_t), int kOpsPerInsn, uint32_t kSrc>
void BM_Peak(benchmark::State& state) {
  constexpr int64_t kIters = 1 << 16;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) kLoop(kIters, kSrc);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.counters["ops"] = static_cast<double>(state.iterations()) * kIters * 24 * kOpsPerInsn / s;
}

BENCHMARK(BM_Peak<LoopDpbusd, 128, 0x01010101u>)->Name("peak/vpdpbusd_zmm")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Peak<LoopDpbf16, 64, 0x3F803F80u>)->Name("peak/vdpbf16ps_zmm")->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Peak<LoopFma, 32, 0x3F800000u>)->Name("peak/vfmadd231ps_zmm")->Threads(1)->Threads(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
