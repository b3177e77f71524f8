// Benchmarks of the non-GEMM kernels: causal attention for prefill (the figure of record, in
// docs/PERFORMANCE.md "Attention"), and the row kernels for orientation.
//
// Attention FLOPs are counted as the useful causal work: QK^T and PV each take
// 2 * head_dim flops per (query, visible key) pair, with T^2 / 2 pairs per head:
// 4 * (T^2 / 2) * head_dim * n_head. Counters: GFLOPs (over wall time) and pct_fp32_peak, which
// relates it to the fp32 FMA peak of the threads used (267.5 GFLOP/s per core on the machine of
// record, 2 x 16-lane FMA per cycle; set ESTREAM_FP32_PEAK_PER_CORE, in GFLOP/s, elsewhere).
//
// Run: build/bench/ops_bench --benchmark_filter=Attention --benchmark_repetitions=5
//        --benchmark_report_aggregates_only=true
// With ESTREAM_PHASE_TIMERS=1 the low-precision AVX-512 kernel's runs also report the share of
// the call's thread time each phase took (counters pct_<phase>, kernels/phase_timer.h; the
// timers add ~5% to a call, so take the times from a run without them).
#include <benchmark/benchmark.h>
#include <omp.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/memory.h"
#include "base/timer.h"
#include "kernels/attention_lowp.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/ops_internal.h"
#include "kernels/phase_timer.h"
#if defined(__x86_64__)
#include "kernels/x86_avx512/attention_amx.h"
#endif

namespace estream::kernels {
namespace {

constexpr double kAmxPeakPerCoreDefault = 3330;  // BM_AmxBf16Peak, 1 thread, per CPU-second (PERFORMANCE.md)

double PeakPerCoreGflops() {
  if (const char* s = std::getenv("ESTREAM_FP32_PEAK_PER_CORE")) return std::atof(s);
  return 267.5;
}

std::vector<float> Random(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// A copy of x, 64-byte aligned as the engine's workspace buffers (model/blocks.cc) are: its rows of
// head_dim floats then start on cache lines, as there.
AlignedPtr<float> Aligned(const std::vector<float>& x) {
  AlignedPtr<float> p = AllocAligned<float>(x.size());
  std::copy(x.begin(), x.end(), p.get());
  return p;
}

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The `isa` argument of the benchmarks below: an Isa value of the build's architecture
// (x86-64: 0 scalar, 1 avx2, 2 avx512; AArch64: 0 scalar, 3 neon, 4 dotprod, 5 i8mm).
#if defined(__x86_64__)
#define ESTREAM_BENCH_ISAS {0, 1, 2}
#else
#define ESTREAM_BENCH_ISAS {0, 3, 4, 5}
#endif

#if defined(__x86_64__)
// ---- AMX-BF16 tile peak ---------------------------------------------------------------------
// tdpbf16ps tmm, 16 x 16 fp32 += 16 x 32 bf16 . 32 x 16 bf16: 16 * 16 * 32 multiply-adds = 16384
// flops per instruction. Six independent accumulators (tmm0..5) with A = tmm6, B = tmm7 held in
// registers, so neither latency nor loads bound the loop. Counter: GFLOPs per thread (wall).
struct alignas(64) BenchTileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

__attribute__((target("amx-tile,amx-bf16"))) void AmxBf16Loop(int64_t iters) {
  BenchTileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  __asm__ volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
  alignas(64) static const uint16_t ones[16 * 32] = {};  // bf16 zeros: no denormal assists
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 6, 7);
    _tile_dpbf16ps(1, 6, 7);
    _tile_dpbf16ps(2, 6, 7);
    _tile_dpbf16ps(3, 6, 7);
    _tile_dpbf16ps(4, 6, 7);
    _tile_dpbf16ps(5, 6, 7);
  }
  alignas(64) float sink[256];
  _tile_stored(0, sink, 64);
  benchmark::DoNotOptimize(sink);
  _tile_release();
}

void BM_AmxBf16Peak(benchmark::State& state) {
  if (HostIsa() != Isa::kAvx512 || !AttentionAmxUsable()) {
    state.SkipWithError("no AMX-BF16 (or ESTREAM_AMX=0)");
    return;
  }
  const int threads = static_cast<int>(state.range(0));
  constexpr int64_t kIters = 1 << 16;
  double seconds = 0;
  const double cpu0 = ProcessCpuSeconds();
  for (auto _ : state) {
    const Timer timer;
#pragma omp parallel num_threads(threads)
    AmxBf16Loop(kIters);
    seconds += timer.Seconds();
  }
  const double cpu = ProcessCpuSeconds() - cpu0;
  const double flops = 6.0 * kIters * 16384 * threads * state.iterations();
  state.counters["GFLOPs"] = flops / seconds / 1e9;
  // Per core by CPU time: what a core delivers while it runs (time slices lost to other
  // processes on this shared machine do not count).
  state.counters["GFLOPs_per_core_cpu"] = flops / cpu / 1e9;
}
BENCHMARK(BM_AmxBf16Peak)->ArgNames({"thr"})->Arg(1)->Arg(2)->UseRealTime()->MeasureProcessCPUTime();
#endif  // __x86_64__

// AMX-BF16 tile peak per core in GFLOP/s used for the AMX rows' pct_peak (measured by
// BM_AmxBf16Peak on the machine of record; ESTREAM_AMX_PEAK_PER_CORE overrides).
[[maybe_unused]] double AmxPeakPerCoreGflops() {
  if (const char* s = std::getenv("ESTREAM_AMX_PEAK_PER_CORE")) return std::atof(s);
  return kAmxPeakPerCoreDefault;
}

// int8 vpdpbusd peak per core in G op/s (2 ops per multiply-add) for the low-precision rows'
// pct_int8_peak: 1649 G op/s on 2 threads measured on the 2-vCPU Zen 5 VM (bench/peak_bench.cc,
// 2026-12-02); ESTREAM_INT8_PEAK_PER_CORE overrides.
double Int8PeakPerCoreGops() {
  if (const char* s = std::getenv("ESTREAM_INT8_PEAK_PER_CORE")) return std::atof(s);
  return 1649.0 / 2;
}

// Args: T, n_head, n_head_kv, head_dim, threads, isa (x86-64: 0 scalar, 1 avx2 fp32, 2 avx512 fp32,
// 3 avx512 with the AMX-BF16 attention, 4 avx512 with the int8/bf16 attention of attention_lowp.h,
// 5 avx2 with the low-precision attention, Q.K^T on vpdpbusd (AVX-VNNI), 6 the same on vpmaddubsw,
// 7 the avx512 fp32 kernel writing the Q8A rows as the engine's fp32 path does for a quantised layer
// (the kernel's fp32 rows, then their quantisation in a pass of its own: ESTREAM_ATTN_LOWP=0);
// AArch64: the Isa value, 0 scalar, 3 neon, 4 dotprod, 5 i8mm).
void BM_Attention(benchmark::State& state) {
  const int t = static_cast<int>(state.range(0));
  const int n_head = static_cast<int>(state.range(1));
  const int n_head_kv = static_cast<int>(state.range(2));
  const int d = static_cast<int>(state.range(3));
  const int threads = static_cast<int>(state.range(4));
#if defined(__x86_64__)
  const bool amx = state.range(5) == 3;
  const bool lowp = state.range(5) == 4;
  const bool lowp_avx2 = state.range(5) == 5 || state.range(5) == 6;
  const bool maddubs = state.range(5) == 6;
  const bool fp32_q8 = state.range(5) == 7;
  const Isa isa = amx || lowp || fp32_q8 ? Isa::kAvx512 : lowp_avx2 ? Isa::kAvx2 : static_cast<Isa>(state.range(5));
  if (!IsaAtLeast(HostIsa(), isa) || (amx && !AttentionAmxUsable()) ||
      (state.range(5) == 5 && !HostCpuFeatures().avx_vnni)) {
#else
  const bool amx = false, lowp = false, lowp_avx2 = false, fp32_q8 = false;
  const Isa isa = static_cast<Isa>(state.range(5));
  if (!IsaAtLeast(HostIsa(), isa)) {
#endif
    state.SkipWithError("ISA not available on this host");
    return;
  }
  const AlignedPtr<float> q = Aligned(Random(static_cast<size_t>(t) * n_head * d, -1, 1, 1));
  const AlignedPtr<float> k = Aligned(Random(static_cast<size_t>(t) * n_head_kv * d, -1, 1, 2));
  const AlignedPtr<float> v = Aligned(Random(static_cast<size_t>(t) * n_head_kv * d, -1, 1, 3));
  const AlignedPtr<float> out = Aligned(std::vector<float>(static_cast<size_t>(t) * n_head * d));
  // The bf16 / low-precision variants write the output projection's Q8A rows, as the engine's
  // quantised layers have them do (AttentionArgs::out_q8); the fp32 ones write fp32 rows (which
  // such a layer then quantises in a pass of its own: timed in variant 7 only).
  const size_t q8_blocks = static_cast<size_t>(t) * n_head * d / kQK8A;
  const AlignedPtr<BlockQ8A> out_q8 = AllocAligned<BlockQ8A>(q8_blocks);
  std::memset(out_q8.get(), 0, q8_blocks * sizeof(BlockQ8A));  // its pages mapped before the timing, as out's
  const bool allow_bf16 = amx || lowp || lowp_avx2;
  const AttentionArgs a{.n_tokens = t, .n_head = n_head, .n_head_kv = n_head_kv, .head_dim = d,
                        .scale = 1.0f / std::sqrt(static_cast<float>(d)), .q = q.get(), .ldq = n_head * d,
                        .k = k.get(), .ldk = n_head_kv * d, .v = v.get(), .ldv = n_head_kv * d,
                        .out = out.get(), .ldo = n_head * d, .allow_bf16 = allow_bf16,
                        .out_q8 = allow_bf16 || fp32_q8 ? out_q8.get() : nullptr, .ldo_q8 = n_head * d / kQK8A};
  KernelTable kt = KernelsFor(isa);
#if defined(__x86_64__)
  if (isa == Isa::kAvx512) FillAvx512OpsWith(&kt, amx);
  if (lowp) FillAttentionLowpAvx512(&kt);
  if (lowp_avx2) FillAttentionLowpAvx2(&kt, /*use_avx_vnni=*/!maddubs);
#endif
  omp_set_num_threads(threads);
  uint64_t phases[kPhaseCount];
  TakePhaseTicks(phases);  // cleared: only this run's calls
  double seconds = 0;
  const double cpu0 = ProcessCpuSeconds();
  for (auto _ : state) {
    const Timer timer;
    AttentionPrefillWith(kt, a);
    benchmark::ClobberMemory();
    seconds += timer.Seconds();
  }
  const double cpu = ProcessCpuSeconds() - cpu0;
  // Plain numbers (no rate flags) so that the table prints them without a "/s" suffix.
  const double flops = 4.0 * (static_cast<double>(t) * t / 2) * d * n_head * state.iterations();
  state.counters["GFLOPs"] = flops / seconds / 1e9;
  // % of the peak of the unit used: the fp32 FMA units, or the AMX tile unit (bf16).
  state.counters["pct_peak"] =
      100.0 * flops / seconds / ((amx ? AmxPeakPerCoreGflops() : PeakPerCoreGflops()) * 1e9 * threads);
  // The same by process CPU time (all threads): the rate while the threads run, which a loaded
  // machine does not dilute (spinning OpenMP waits count as CPU time, so it is not inflated).
  state.counters["pct_peak_cpu"] =
      100.0 * flops / cpu / ((amx ? AmxPeakPerCoreGflops() : PeakPerCoreGflops()) * 1e9);
  state.counters["GFLOPs_cpu"] = flops / cpu / 1e9 * threads;
  state.counters["threads"] = threads;
  // Share of the int8 dot-product peak of the threads used (the low-precision kernel's unit).
  state.counters["pct_int8_peak"] = 100.0 * flops / seconds / (Int8PeakPerCoreGops() * 1e9 * threads);
  TakePhaseTicks(phases);
  double total = 0;
  for (const uint64_t ticks : phases) total += static_cast<double>(ticks);
  if (total > 0 && lowp)  // only the AVX-512 kernel times its own phases (the others: none)
    for (int p = 0; p < kPhaseCount; ++p)
      state.counters[std::string("pct_") + AttnPhaseName(p)] = 100.0 * static_cast<double>(phases[p]) / total;
}

void AttentionShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"T", "heads", "kv", "d", "thr", "isa"});
#if defined(__x86_64__)
  for (int isa : {7, 6, 5, 4, 3, 2, 1})
#else
  for (int isa : {5, 3})
#endif
    for (int threads : {1, 2})
      for (int t : {128, 512, 1024, 4096}) {
        b->Args({t, 32, 4, 128, threads, isa});  // Qwen3-30B-A3B
        b->Args({t, 16, 16, 128, threads, isa});  // OLMoE-1B-7B (head_dim 2048 / 16; until 2026-12-02 64)
      }
}
// Real time is the figure of record; the process CPU time (all threads) is reported beside it so
// that runs on a loaded machine can be judged (CPU time excludes time spent descheduled).
BENCHMARK(BM_Attention)->Apply(AttentionShapes)->UseRealTime()->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);

#if defined(__x86_64__)
// The AVX-512 low-precision attention's K/V conversion (AttentionLowpConvertKvBlocksAvx512) alone,
// 1 thread: every kv head of a T-token prompt in turn, as the whole-head schedule converts them.
// Args: T, kv heads (the row stride: kv heads x head_dim floats), head_dim. One kv head of T = 256
// is ~256 KiB of K and V, in L2 from the second iteration on (the conversion's own work); 16 kv
// heads of T = 1024 is 16 MiB, read from L3 or memory as in the kernel (OLMoE's shape). Counter:
// ns per key (its K and V rows).
void BM_AttentionLowpConvert(benchmark::State& state) {
  if (!IsaAtLeast(HostIsa(), Isa::kAvx512)) {
    state.SkipWithError("no AVX-512 on this host");
    return;
  }
  const int t = static_cast<int>(state.range(0)), kv_heads = static_cast<int>(state.range(1));
  const int d = static_cast<int>(state.range(2));
  const AlignedPtr<float> k = Aligned(Random(static_cast<size_t>(t) * kv_heads * d, -1, 1, 2));
  const AlignedPtr<float> v = Aligned(Random(static_cast<size_t>(t) * kv_heads * d, -1, 1, 3));
  const AttentionArgs a{.n_tokens = t, .n_head = kv_heads, .n_head_kv = kv_heads, .head_dim = d,
                        .k = k.get(), .ldk = static_cast<int64_t>(kv_heads) * d, .v = v.get(),
                        .ldv = static_cast<int64_t>(kv_heads) * d};
  const AlignedPtr<uint16_t> kv = AllocAligned<uint16_t>(AttentionLowpKvBytes(d, t) / sizeof(uint16_t));
  const int blocks = (t + kLowpKeys - 1) / kLowpKeys;
  double seconds = 0;
  for (auto _ : state) {
    const Timer timer;
    for (int h = 0; h < kv_heads; ++h) AttentionLowpConvertKvBlocksAvx512(a, h, 0, blocks, kv.get());
    benchmark::ClobberMemory();
    seconds += timer.Seconds();
  }
  state.counters["ns_per_key"] = seconds * 1e9 / (static_cast<double>(t) * kv_heads * state.iterations());
}
BENCHMARK(BM_AttentionLowpConvert)->ArgNames({"T", "kv", "d"})->Args({256, 1, 128})->Args({1024, 16, 128})
    ->Args({256, 1, 64})->Args({256, 1, 120})->Unit(benchmark::kMicrosecond);

// The AMX-BF16 attention kernel's own steps for one 32-query tile and one full 64-key block, in L1,
// 1 thread (AttentionAmxProbeSeconds): the ceiling of the kernel on a long prompt, where almost
// every block is full. Each iteration times the two tile steps alone (Q.K^T and P.V), the online
// softmax alone, and all three in order. Counters: ns per block of each; % of the tile unit's peak
// of the tile steps alone and of the whole step; overlap = the part of the softmax time hidden
// behind the tile steps ((tiles + softmax - all) / softmax; 0 = serial, 1 = hidden).
void BM_AttentionAmxSteps(benchmark::State& state) {
  if (HostIsa() != Isa::kAvx512 || !AttentionAmxUsable()) {
    state.SkipWithError("no AMX-BF16 (or ESTREAM_AMX=0)");
    return;
  }
  const int d = static_cast<int>(state.range(0));
  constexpr int64_t kBlocks = 20000;
  double tiles = 0, softmax = 0, all = 0;
  for (auto _ : state) {
    tiles += AttentionAmxProbeSeconds(d, 1 | 4, kBlocks);
    softmax += AttentionAmxProbeSeconds(d, 2, kBlocks);
    all += AttentionAmxProbeSeconds(d, 1 | 2 | 4, kBlocks);
  }
  const double blocks = static_cast<double>(kBlocks) * state.iterations();
  // Two products of 2 flops per multiply-add (d a multiple of 32: no padding).
  const double flops = 4.0 * kAmxAttnRows * kAmxAttnKeys * d * blocks;
  const double peak = AmxPeakPerCoreGflops() * 1e9;
  state.counters["tiles_ns"] = tiles / blocks * 1e9;
  state.counters["softmax_ns"] = softmax / blocks * 1e9;
  state.counters["all_ns"] = all / blocks * 1e9;
  state.counters["tiles_pct_peak"] = 100.0 * flops / tiles / peak;
  state.counters["all_pct_peak"] = 100.0 * flops / all / peak;
  state.counters["overlap"] = (tiles + softmax - all) / softmax;
}
BENCHMARK(BM_AttentionAmxSteps)->ArgNames({"d"})->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond);
#endif  // __x86_64__

// Row kernels, single thread, one table entry over `rows` rows of n (isa as above).
void BM_RmsNorm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const KernelTable& kt = KernelsFor(static_cast<Isa>(state.range(1)));
  std::vector<float> x = Random(n, -1, 1, 4), w = Random(n, 0.5f, 1.5f, 5), y(n);
  for (auto _ : state) {
    kt.rms_norm_row(x.data(), w.data(), y.data(), n, 1e-6f);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 12);
}
BENCHMARK(BM_RmsNorm)->ArgNames({"n", "isa"})->ArgsProduct({{2048, 4096}, ESTREAM_BENCH_ISAS});

void BM_Rope(benchmark::State& state) {
  const int heads = 32, d = 128;
  const KernelTable& kt = KernelsFor(static_cast<Isa>(state.range(0)));
  std::vector<double> freq(d / 2);
  for (int p = 0; p < d / 2; ++p) freq[p] = std::pow(1e6, -2.0 * p / d);
  std::vector<float> x = Random(heads * d, -1, 1, 6);
  int pos = 0;
  for (auto _ : state) {
    kt.rope_row(x.data(), heads, d, pos++ & 8191, freq.data(), RopeMode::kNeox);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * heads * d);
}
BENCHMARK(BM_Rope)->ArgNames({"isa"})->ArgsProduct({ESTREAM_BENCH_ISAS});

void BM_SwiGlu(benchmark::State& state) {
  const int64_t n = state.range(0);
  const KernelTable& kt = KernelsFor(static_cast<Isa>(state.range(1)));
  std::vector<float> g = Random(n, -8, 8, 7), u = Random(n, -1, 1, 8), h(n);
  for (auto _ : state) {
    kt.swiglu(g.data(), u.data(), h.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_SwiGlu)->ArgNames({"n", "isa"})->ArgsProduct({{768 * 64}, ESTREAM_BENCH_ISAS});

// The LM head's log-softmax normaliser over one row of logits (vocabularies of OLMoE and Qwen3).
void BM_LogSumExp(benchmark::State& state) {
  const int64_t n = state.range(0);
  const KernelTable& kt = KernelsFor(static_cast<Isa>(state.range(1)));
  std::vector<float> row = Random(n, -20, 5, 9);
  for (auto _ : state) benchmark::DoNotOptimize(kt.log_sum_exp(row.data(), n));
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_LogSumExp)->ArgNames({"n", "isa"})->ArgsProduct({{50304, 151936}, ESTREAM_BENCH_ISAS});

// LFM2's short convolution over 256 tokens of LFM2-8B-A1B's width (d 2048, L 3), one thread: reads
// 3 x 2048 floats and writes 2048 per token (the L - 1 earlier rows stay in cache).
void BM_ShortConv(benchmark::State& state) {
  const int64_t T = 256, d = 2048;
  const int L = 3;
  const KernelTable& kt = KernelsFor(static_cast<Isa>(state.range(0)));
  std::vector<float> bcx = Random(T * 3 * d, -1, 1, 9), w = Random(L * d, -1, 1, 10), y(T * d);
  for (auto _ : state) {
    kt.short_conv_rows(bcx.data(), 3 * d, w.data(), L, d, 0, T, y.data(), d);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * T * d * 16);
}
BENCHMARK(BM_ShortConv)->ArgNames({"isa"})->ArgsProduct({ESTREAM_BENCH_ISAS});

}  // namespace
}  // namespace estream::kernels

BENCHMARK_MAIN();
