// GEMM throughput: y[M x N] = x[M x K] * W[N x K]^T for each weight type and layout, at the
// shapes of issue 3, with 1 and 2 OpenMP threads.
//
// Quantised types time GemmQ8A on pre-quantised activations (the fused expert operator
// quantises X once for gate and up); `+quant` rows time MatMul (quantisation included). Float
// types time MatMul. Counters: Gops = 2*M*N*K / time / 1e9 (1 op = a multiply or an add),
// pct_peak = Gops / (threads x the per-core peak): int8 1050 Gop/s (vpdpbusd, bench/peak_bench)
// for quantised types, fp32 FMA 267.5 Gflop/s for float types; override the per-core peaks with
// ESTREAM_PEAK_INT8_GOPS / ESTREAM_PEAK_FP32_GOPS.
// pct_peak_cpu: ops per CPU-second of all threads against one core's peak, i.e. the per-core
// efficiency, an estimate of pct_peak on an idle machine (the machine of record is shared; see
// docs/PERFORMANCE.md).
// Weights are random (scales kept small and normal: no inf/NaN/denormal slow paths) and 64-byte
// aligned.
// gemm/<type>_cold/...: the same calls, each on another copy of the weights (256 MiB of copies in
// all): the weights come from DRAM as in a model, not from the caches.
// proj/...: the attention block's projections, separate calls against Gemm's fused forms.
// Filter with --benchmark_filter, e.g. 'gemm/q4_0_packed/.*/M(64|256)/' ; see docs/PERFORMANCE.md.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "base/memory.h"
#include "kernels/kernels.h"
#if defined(__x86_64__)
#include "kernels/x86_avx512/gemm_avx512.h"
#endif
#include "quant/quant.h"

namespace estream::kernels {
namespace {

// CPU time of the whole process (all OpenMP threads).
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double PeakPerCore(bool int8) {
  const char* env = std::getenv(int8 ? "ESTREAM_PEAK_INT8_GOPS" : "ESTREAM_PEAK_FP32_GOPS");
  if (env != nullptr && *env != '\0') return std::atof(env);
  return int8 ? 1050.0 : 267.5;
}

uint64_t Next(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

// GGUF rows of random bytes with sane scales.
std::vector<uint8_t> RandomWeights(QuantType t, int64_t n, int64_t k) {
  const size_t rb = RowBytes(t, k);
  std::vector<uint8_t> w(rb * static_cast<size_t>(n));
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i + 8 <= w.size(); i += 8) {
    const uint64_t v = Next(&s);
    std::memcpy(&w[i], &v, 8);
  }
  const uint16_t h = Fp32ToFp16(1e-3f), hb = Fp32ToBf16(1e-2f);
  auto set = [&](size_t stride, size_t off) {
    for (size_t i = off; i + 2 <= w.size(); i += stride) std::memcpy(&w[i], &h, 2);
  };
  switch (t) {
    case QuantType::kQ4_0: set(sizeof(BlockQ4_0), 0); break;
    case QuantType::kQ8_0: set(sizeof(BlockQ8_0), 0); break;
    case QuantType::kQ4_K: set(sizeof(BlockQ4_K), 0); set(sizeof(BlockQ4_K), 2); break;
    case QuantType::kQ6_K: set(sizeof(BlockQ6_K), offsetof(BlockQ6_K, d)); break;
    case QuantType::kF16: set(2, 0); break;
    case QuantType::kQ4_1: case QuantType::kQ5_0: case QuantType::kQ5_1: case QuantType::kQ5_K:
    case QuantType::kQ3_K: case QuantType::kQ2_K: case QuantType::kIQ4_NL: case QuantType::kIQ4_XS:
    case QuantType::kMXFP4: {
      // The other types: quantised random values (their scale fields take every form: f16,
      // packed 6-bit, E8M0), which the speed does not depend on.
      std::vector<float> row(static_cast<size_t>(k));
      for (int64_t r = 0; r < n; ++r) {
        for (float& v : row) v = static_cast<float>(static_cast<int64_t>(Next(&s) % 2001) - 1000) * 1e-5f;
        QuantizeRow(t, row.data(), w.data() + r * rb, k);
      }
      break;
    }
    case QuantType::kBF16:
      for (size_t i = 0; i + 2 <= w.size(); i += 2) std::memcpy(&w[i], &hb, 2);
      break;
    case QuantType::kF32:
      for (size_t i = 0; i + 4 <= w.size(); i += 4) {
        const float f = static_cast<float>(Next(&s) % 1000) * 1e-5f;
        std::memcpy(&w[i], &f, 4);
      }
      break;
    default: break;
  }
  return w;
}

// The most recent weight matrix (benchmarks are registered grouped by weights).
// Held 64-byte aligned, as the engine holds weights (mmap'd tensors and arena slots are).
struct WeightCache {
  QuantType type = QuantType::kF32;
  bool packed = false;
  int64_t n = 0, k = 0;
  AlignedPtr<uint8_t> data;
};

// Cold rows ("_cold" labels) cycle through copies of the matrix filling kColdBytes, more than any
// L3 here: every call reads its weights from DRAM, as a model's layers and experts do.
constexpr size_t kColdBytes = size_t{256} << 20;

// The matrix, `copies` times over (one buffer; copy c at c x bytes(t, n, k)).
std::span<const WeightView> GetWeights(QuantType t, bool packed, int64_t n, int64_t k, bool cold) {
  static WeightCache cache;
  static std::vector<WeightView> views;
  const size_t bytes = packed ? PackedWeightBytes(t, n, k) : RowBytes(t, k) * static_cast<size_t>(n);
  const size_t copies = cold ? std::max<size_t>(1, kColdBytes / bytes) : 1;
  if (cache.data == nullptr || cache.type != t || cache.packed != packed || cache.n != n || cache.k != k ||
      views.size() != copies) {
    cache.data.reset();
    std::vector<uint8_t> gguf = RandomWeights(t, n, k);
    cache.data = AllocAligned<uint8_t>(bytes * copies);
    if (packed) {
      RepackWeights(t, gguf.data(), n, k, cache.data.get());
    } else {
      std::memcpy(cache.data.get(), gguf.data(), bytes);
    }
    for (size_t c = 1; c < copies; ++c) std::memcpy(cache.data.get() + c * bytes, cache.data.get(), bytes);
    cache.type = t;
    cache.packed = packed;
    cache.n = n;
    cache.k = k;
    views.clear();
    for (size_t c = 0; c < copies; ++c)
      views.push_back(WeightView{t, packed ? WeightLayout::kPacked : WeightLayout::kGguf, n, k,
                                 cache.data.get() + c * bytes});
  }
  return views;
}

enum class Mode { kGemmQ8A, kMatMul };

void BM_Gemm(benchmark::State& state, QuantType t, bool packed, Mode mode, int64_t m, int64_t k, int64_t n,
             int threads, bool cold) {
  const std::span<const WeightView> ws = GetWeights(t, packed, n, k, cold);
  size_t next = 0;
  AlignedPtr<float> xbuf = AllocAligned<float>(static_cast<size_t>(m * k));
  float* x = xbuf.get();
  uint64_t s = 12345;
  for (int64_t i = 0; i < m * k; ++i) x[i] = static_cast<float>(static_cast<int64_t>(Next(&s) % 2001) - 1000) * 1e-3f;
  std::vector<BlockQ8A> xq;
  const bool quant = !(t == QuantType::kF32 || t == QuantType::kF16 || t == QuantType::kBF16);
  if (quant) {
    xq.resize(ActivationBytes(m, k) / sizeof(BlockQ8A));
    QuantizeActivations(x, k, m, k, xq.data());
  }
  AlignedPtr<float> ybuf = AllocAligned<float>(static_cast<size_t>(m * n));
  float* y = ybuf.get();
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  double seconds = 0, cpu_seconds = 0;
  for (auto _ : state) {
    const WeightView& w = ws[next];
    next = (next + 1) % ws.size();
    const double c0 = ProcessCpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    if (mode == Mode::kGemmQ8A)
      GemmQ8A(w, xq.data(), m, y, n);
    else
      MatMul(w, x, k, m, y, n);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cpu_seconds += ProcessCpuSeconds() - c0;
    benchmark::DoNotOptimize(y);
  }
  omp_set_num_threads(saved);
  const double gops = 2.0 * m * n * k * static_cast<double>(state.iterations()) / seconds / 1e9;
  state.counters["Gops"] = gops;
  state.counters["pct_peak"] = 100.0 * gops / (threads * PeakPerCore(quant));
  // Per-core efficiency, for a shared machine: ops per second of CPU time of all threads, against
  // one core's peak. Not inflated by time slices lost to other processes; includes threads'
  // spin-waiting at barriers (run with OMP_WAIT_POLICY=passive to exclude it).
  const double gops_cpu = 2.0 * m * n * k * static_cast<double>(state.iterations()) / cpu_seconds / 1e9;
  state.counters["pct_peak_cpu"] = 100.0 * gops_cpu / PeakPerCore(quant);
}

struct KN {
  int64_t k, n;
};
constexpr KN kShapes[] = {{2048, 1024}, {1024, 2048}, {2048, 768}, {768, 2048}, {4096, 14336}, {2048, 4096}};
constexpr int64_t kMs[] = {1, 16, 64, 256, 1024};

// Float weights are small tensors: the routers of OLMoE (64 x 2048) and Qwen3-30B (128 x 2048).
constexpr KN kFloatShapes[] = {{2048, 64}, {2048, 128}};

void Register(QuantType t, bool packed, Mode mode, const std::string& label, bool cold = false) {
  const bool fl = t == QuantType::kF32 || t == QuantType::kF16 || t == QuantType::kBF16;
  for (const KN& s : fl ? std::span<const KN>(kFloatShapes) : std::span<const KN>(kShapes))
    for (int64_t m : kMs)
      for (int threads : {1, 2}) {
        const std::string name = "gemm/" + label + (cold ? "_cold" : "") + "/K" + std::to_string(s.k) + "xN" +
                                 std::to_string(s.n) + "/M" + std::to_string(m) + "/t" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, t, packed, mode, m, s.k, s.n, threads, cold)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
}

// The attention block's projections as the engine runs them (Q4_0 packed, k = n_embd = 2048,
// 2 threads): Q/K/V as three GemmQ8A calls against one Gemm call, and the output projection as
// MatMul into a buffer plus a row-parallel Add against Gemm's add epilogue (GemmOut::add).
// Same work, same bits; names: proj/<model>/<qkv|o>/<variant>/M<m>.
enum class ProjVariant { kSeparate, kFused };

void BM_Projections(benchmark::State& state, bool qkv, ProjVariant v, int64_t m, int64_t q_dim, int64_t kv_dim) {
  constexpr int64_t d = 2048;
  const QuantType t = QuantType::kQ4_0;
  auto packed = [&](int64_t n, int64_t k) {
    std::vector<uint8_t> gguf = RandomWeights(t, n, k);
    AlignedPtr<uint8_t> p = AllocAligned<uint8_t>(PackedWeightBytes(t, n, k));
    RepackWeights(t, gguf.data(), n, k, p.get());
    return p;
  };
  const int64_t k = qkv ? d : q_dim;
  AlignedPtr<uint8_t> wq = packed(qkv ? q_dim : d, k), wk = packed(qkv ? kv_dim : 16, k),
                      wv = packed(qkv ? kv_dim : 16, k);
  const WeightView vq{t, WeightLayout::kPacked, qkv ? q_dim : d, k, wq.get()};
  const WeightView vk{t, WeightLayout::kPacked, qkv ? kv_dim : 16, k, wk.get()};
  const WeightView vv{t, WeightLayout::kPacked, qkv ? kv_dim : 16, k, wv.get()};
  AlignedPtr<float> x = AllocAligned<float>(static_cast<size_t>(m * k));
  uint64_t s = 12345;
  for (int64_t i = 0; i < m * k; ++i) x[i] = static_cast<float>(static_cast<int64_t>(Next(&s) % 2001) - 1000) * 1e-3f;
  std::vector<BlockQ8A> xq(ActivationBytes(m, k) / sizeof(BlockQ8A));
  QuantizeActivations(x.get(), k, m, k, xq.data());
  AlignedPtr<float> yq = AllocAligned<float>(static_cast<size_t>(m * std::max(q_dim, d)));
  AlignedPtr<float> yk = AllocAligned<float>(static_cast<size_t>(m * std::max(kv_dim, d)));
  AlignedPtr<float> yv = AllocAligned<float>(static_cast<size_t>(m * kv_dim));
  for (int64_t i = 0; i < m * d; ++i) yk[i] = 1.0f;  // the residual stream of the O variants
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  for (auto _ : state) {
    if (qkv && v == ProjVariant::kSeparate) {
      GemmQ8A(vq, xq.data(), m, yq.get(), q_dim);
      GemmQ8A(vk, xq.data(), m, yk.get(), kv_dim);
      GemmQ8A(vv, xq.data(), m, yv.get(), kv_dim);
    } else if (qkv) {
      const GemmOut outs[] = {{.w = &vq, .y = yq.get(), .ldy = q_dim},
                              {.w = &vk, .y = yk.get(), .ldy = kv_dim},
                              {.w = &vv, .y = yv.get(), .ldy = kv_dim}};
      Gemm(outs, nullptr, 0, xq.data(), m);
    } else if (v == ProjVariant::kSeparate) {
      MatMul(vq, x.get(), k, m, yq.get(), d);
      float* res = yk.get();
      const float* p = yq.get();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < m; ++i) Add(res + i * d, p + i * d, d);
    } else {
      const GemmOut out{.w = &vq, .y = yk.get(), .ldy = d, .add = true};
      Gemm(std::span(&out, 1), x.get(), k, nullptr, m);
    }
    benchmark::DoNotOptimize(yq.get());
    benchmark::ClobberMemory();
  }
  omp_set_num_threads(saved);
  const double ops = 2.0 * m * k * (qkv ? q_dim + 2 * kv_dim : d);
  state.counters["Gops"] = benchmark::Counter(ops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void RegisterProjections() {
  struct Model {
    const char* name;
    int64_t q_dim, kv_dim;
  };
  for (const Model& md : {Model{"olmoe", 2048, 2048}, Model{"qwen3", 4096, 512}})
    for (bool qkv : {true, false})
      for (ProjVariant v : {ProjVariant::kSeparate, ProjVariant::kFused})
        for (int64_t m : {512, 1024}) {
          const std::string name = std::string("proj/") + md.name + (qkv ? "/qkv/" : "/o/") +
                                   (v == ProjVariant::kSeparate ? (qkv ? "three_calls" : "matmul_then_add")
                                                                : (qkv ? "one_gemm" : "add_epilogue")) +
                                   "/M" + std::to_string(m);
          benchmark::RegisterBenchmark(name.c_str(), BM_Projections, qkv, v, m, md.q_dim, md.kv_dim)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
}

#if defined(__x86_64__)
// micro/q4_0_packed/4x3/blocks:B: the AVX-512 Q4_0 micro-kernel alone on one tile (4 rows x 48
// weight rows over B blocks: ~24 KiB of weights at B = 28, the GEMM's k chunk for Q4_0), in L1,
// one thread: the kernel's own rate, to set beside gemm/... (the loop nest and memory around it)
// and peak/vpdpbusd_epilogue_mix_zmm (bench/peak_bench: the bound of its instruction mix).
void BM_Micro(benchmark::State& state, int64_t blocks) {
  if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw")) {
    state.SkipWithError("this CPU lacks AVX-512 VNNI");
    return;
  }
  constexpr int64_t kK = 2048, kReps = 1000;
  const WeightView& w = GetWeights(QuantType::kQ4_0, true, 48, kK, false)[0];
  std::vector<float> x(4 * kK);
  uint64_t s = 777;
  for (float& v : x) v = static_cast<float>(static_cast<int64_t>(Next(&s) % 2001) - 1000) * 1e-3f;
  std::vector<BlockQ8A> xq(ActivationBytes(4, kK) / sizeof(BlockQ8A));
  QuantizeActivations(x.data(), kK, 4, kK, xq.data());
  alignas(64) float y[4 * 48];
  for (auto _ : state) {
    RunQ4_0MicroForBench(static_cast<const uint8_t*>(w.data), kK, xq.data(), blocks, kReps, y);
    benchmark::DoNotOptimize(y);
  }
  const double ops = 2.0 * 4 * 48 * 32 * blocks * kReps * static_cast<double>(state.iterations());
  state.counters["Gops"] = benchmark::Counter(ops / 1e9, benchmark::Counter::kIsRate);
  state.counters["pct_peak"] = benchmark::Counter(100.0 * ops / 1e9 / PeakPerCore(true), benchmark::Counter::kIsRate);
}
#endif

}  // namespace
}  // namespace estream::kernels

int main(int argc, char** argv) {
  using estream::QuantType;
  using namespace estream::kernels;
  Register(QuantType::kQ4_0, true, Mode::kGemmQ8A, "q4_0_packed");
  Register(QuantType::kQ4_0, true, Mode::kGemmQ8A, "q4_0_packed", /*cold=*/true);
  Register(QuantType::kQ8_0, true, Mode::kGemmQ8A, "q8_0_packed");
  Register(QuantType::kQ4_K, true, Mode::kGemmQ8A, "q4_K_packed");
  Register(QuantType::kQ6_K, true, Mode::kGemmQ8A, "q6_K_packed");
  Register(QuantType::kQ4_0, false, Mode::kGemmQ8A, "q4_0_gguf");
  Register(QuantType::kQ8_0, false, Mode::kGemmQ8A, "q8_0_gguf");
  Register(QuantType::kQ4_K, false, Mode::kGemmQ8A, "q4_K_gguf");
  Register(QuantType::kQ6_K, false, Mode::kGemmQ8A, "q6_K_gguf");
  Register(QuantType::kQ4_1, true, Mode::kGemmQ8A, "q4_1_packed");
  Register(QuantType::kQ5_0, true, Mode::kGemmQ8A, "q5_0_packed");
  Register(QuantType::kQ5_1, true, Mode::kGemmQ8A, "q5_1_packed");
  Register(QuantType::kQ5_K, true, Mode::kGemmQ8A, "q5_K_packed");
  Register(QuantType::kQ3_K, true, Mode::kGemmQ8A, "q3_K_packed");
  Register(QuantType::kQ2_K, true, Mode::kGemmQ8A, "q2_K_packed");
  Register(QuantType::kIQ4_NL, true, Mode::kGemmQ8A, "iq4_nl_packed");
  Register(QuantType::kIQ4_XS, true, Mode::kGemmQ8A, "iq4_xs_packed");
  Register(QuantType::kMXFP4, true, Mode::kGemmQ8A, "mxfp4_packed");
  Register(QuantType::kQ4_0, true, Mode::kMatMul, "q4_0_packed+quant");
  Register(QuantType::kF32, false, Mode::kMatMul, "f32");
  Register(QuantType::kF16, false, Mode::kMatMul, "f16");
  Register(QuantType::kBF16, false, Mode::kMatMul, "bf16");
  RegisterProjections();
#if defined(__x86_64__)
  for (int64_t blocks : {8, 28})
    benchmark::RegisterBenchmark(("micro/q4_0_packed/4x3/blocks:" + std::to_string(blocks)).c_str(), BM_Micro, blocks);
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
