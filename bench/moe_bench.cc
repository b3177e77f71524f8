// The fused expert operator (src/moe, issue 6): numbers for docs/PERFORMANCE.md.
//
//   moe_bench expert [--shapes olmoe,qwen3,mixtral] [--routes 1,8,...] [--reps N]
//     Per-expert throughput: one expert of the shape (random Q4_0 weights, packed), R routes
//     (R distinct tokens, all to that expert), ExpertPlan::Invoke timed (its scatter-adds go to an
//     fp64 accumulator; BeginExpertSum / EndExpertSum are not in it); median of --reps runs of
//     at least 0.2 s each. Gops = 6 n_embd n_ff R / time (gate, up, down; 1 op = a multiply or an
//     add), pct_peak = Gops / (threads x 1050 Gop/s, the per-core vpdpbusd int8 peak;
//     ESTREAM_PEAK_INT8_GOPS overrides), pct_peak_cpu = ops per CPU-second of all threads against
//     one core's peak (the per-core efficiency, robust to time slices lost on a shared machine).
//   moe_bench layer [--preset olmoe-1b-7b|qwen3-30b-a3b] [--tokens 512,1024] [--reps N]
//     One MoE layer of a synthetic 1-layer model of the preset (Q4_0, repacked): routes from its
//     router on a fixed prompt; the previous path (ref::ExpertsBatched) and the fused one
//     (model::FusedExperts) alternated in the same run, median wall time of each; --baseline 0
//     skips the previous path (its column then reads 0). --window W also times the fused path
//     with passes of W routes (model::FusedExperts(W); the default path's window is
//     model::kFusedRouteWindow), alternated with the others: columns window, window_ms.
// Threads: OMP_NUM_THREADS (default: all CPUs).
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/memory.h"
#include "base/stats.h"
#include "kernels/kernels.h"
#include "model/blocks.h"
#include "model/experts.h"
#include "model/model.h"
#include "model/synth.h"
#include "moe/expert_op.h"
#include "quant/quant.h"
#include "ref/experts_baseline.h"

namespace estream {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double PeakPerCore() {
  const char* env = std::getenv("ESTREAM_PEAK_INT8_GOPS");
  return env != nullptr && *env != '\0' ? std::atof(env) : 1050.0;
}
std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
  return out;
}

// Q4_0 rows of an n x k matrix (random normal values, quantised), repacked.
AlignedPtr<uint8_t> RandomPacked(int64_t n, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(k)));
  std::vector<float> row(k);
  std::vector<uint8_t> gguf(RowBytes(QuantType::kQ4_0, k) * n);
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : row) v = nd(rng);
    QuantizeRow(QuantType::kQ4_0, row.data(), gguf.data() + r * RowBytes(QuantType::kQ4_0, k), k);
  }
  AlignedPtr<uint8_t> p = AllocAligned<uint8_t>(kernels::PackedWeightBytes(QuantType::kQ4_0, n, k));
  kernels::RepackWeights(QuantType::kQ4_0, gguf.data(), n, k, p.get());
  return p;
}

int Expert(const std::vector<std::string>& shapes, const std::vector<int64_t>& routes, int reps) {
  const int nth = omp_get_max_threads();
  std::printf("shape,n_embd,n_ff,R,threads,ms,gops,pct_peak,pct_peak_cpu\n");
  for (const std::string& name : shapes) {
    int64_t d = 0, ff = 0;
    if (name == "olmoe") d = 2048, ff = 1024;
    else if (name == "qwen3") d = 2048, ff = 768;
    else if (name == "mixtral") d = 4096, ff = 14336;
    else {
      std::fprintf(stderr, "moe_bench: unknown shape %s (olmoe, qwen3, mixtral)\n", name.c_str());
      return 2;
    }
    std::mt19937 rng(7);
    AlignedPtr<uint8_t> g = RandomPacked(ff, d, rng), u = RandomPacked(ff, d, rng), dn = RandomPacked(d, ff, rng);
    const kernels::WeightLayout P = kernels::WeightLayout::kPacked;
    const moe::SlotBinding b{{QuantType::kQ4_0, P, ff, d, g.get()}, {QuantType::kQ4_0, P, ff, d, u.get()},
                             {QuantType::kQ4_0, P, d, ff, dn.get()}};
    const int64_t T = *std::max_element(routes.begin(), routes.end());
    std::vector<float> xn(T * d);
    std::vector<double> acc(T * d, 0.0);  // the layer's fp64 sum (expert_op.h)
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& v : xn) v = nd(rng);
    AlignedPtr<BlockQ8A> xq = AllocAligned<BlockQ8A>(T * d / kQK8A);
    kernels::QuantizeActivations(xn.data(), d, T, d, xq.get());
    auto plan = moe::ExpertPlan::Create(moe::ExpertShape::Of(b.gate, b.up, b.down), 0, T, nth);
    if (!plan.ok()) {
      std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
      return 1;
    }
    std::vector<int32_t> tok(T);
    std::vector<float> w(T, 0.001f);
    for (int64_t t = 0; t < T; ++t) tok[t] = static_cast<int32_t>(t);
    for (int64_t R : routes) {
      const int64_t begin[2] = {0, R};
      const moe::ExpertInvocation inv{.slot_begin = begin, .n_slots = 1, .route_token = tok.data(),
                                      .route_weight = w.data(), .bindings = &b, .xn = xn.data(), .xq = xq.get(),
                                      .acc = acc.data(), .n_tokens = T};
      plan->InvokeUnchecked(inv);  // warm-up
      std::vector<double> wall, cpu;
      for (int r = 0; r < reps; ++r) {
        int n = 0;
        const double t0 = Now(), c0 = CpuNow();
        do {
          plan->InvokeUnchecked(inv);
          ++n;
        } while (Now() - t0 < 0.2);
        wall.push_back((Now() - t0) / n);
        cpu.push_back((CpuNow() - c0) / n);
      }
      const double ops = 6.0 * d * ff * R, tw = Median(wall), tc = Median(cpu);
      std::printf("%s,%lld,%lld,%lld,%d,%.3f,%.1f,%.1f,%.1f\n", name.c_str(), (long long)d, (long long)ff,
                  (long long)R, nth, tw * 1e3, ops / tw / 1e9, 100 * ops / tw / 1e9 / (nth * PeakPerCore()),
                  100 * ops / tc / 1e9 / PeakPerCore());
      std::fflush(stdout);
    }
  }
  return 0;
}

int Layer(const std::string& preset, const std::vector<int64_t>& tokens, int reps, bool baseline, int64_t window) {
  const int nth = omp_get_max_threads();
  const std::string path = "/tmp/moe_bench_" + preset + ".gguf";
  auto synth = synth::SynthModel::Create({.preset = preset, .layers = 1, .vocab = 512, .type = QuantType::kQ4_0});
  if (!synth.ok() || !(*synth)->Write(path, {.threads = nth}).ok()) {
    std::fprintf(stderr, "moe_bench: cannot write the synthetic model %s\n", path.c_str());
    return 1;
  }
  auto model = model::Model::Load(path, {.repack_experts = true, .repack_dense = true, .prefault = true});
  std::remove(path.c_str());
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const model::ModelConfig& c = (*model)->config();
  std::printf("preset,T,threads,routes,batched_ms,fused_ms,speedup,fused_gops,fused_pct_peak,window,window_ms\n");
  for (int64_t T : tokens) {
    std::vector<int32_t> ids(T);
    for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * 131 + 7) % c.n_vocab);
    model::Workspace ws;
    model::FusedExperts fused, windowed(window > 0 ? window : model::kFusedRouteWindow);
    if (!ws.Reserve(**model, T, nth).ok() || !fused.Reserve(**model, T, nth).ok() ||
        (window > 0 && !windowed.Reserve(**model, T, nth).ok()))
      return 1;
    model::EmbedTokens(**model, ids.data(), T, ws.x.get());
    model::AttentionBlock(**model, 0, T, &ws);
    model::RouteBlock(**model, 0, T, &ws);
    std::vector<float> x0(ws.x.get(), ws.x.get() + T * c.n_embd);
    std::vector<double> tb, tf, tw;
    for (int r = 0; r < reps + 1; ++r) {
      std::copy(x0.begin(), x0.end(), ws.x.get());
      double t0 = Now();
      if (baseline) ref::ExpertsBatched((*model)->layers()[0].experts, c, T, &ws);
      const double b = Now() - t0;
      std::copy(x0.begin(), x0.end(), ws.x.get());
      t0 = Now();
      if (!fused.Run(**model, 0, T, &ws).ok()) return 1;
      const double f = Now() - t0;
      std::copy(x0.begin(), x0.end(), ws.x.get());
      t0 = Now();
      if (window > 0 && !windowed.Run(**model, 0, T, &ws).ok()) return 1;
      const double w = Now() - t0;
      if (r > 0) tb.push_back(b), tf.push_back(f), tw.push_back(w);  // the first round warms up
    }
    const double ops = 6.0 * c.n_embd * c.n_ff_expert * T * c.n_expert_used;
    const double mb = Median(tb), mf = Median(tf);
    std::printf("%s,%lld,%d,%lld,%.2f,%.2f,%.3f,%.1f,%.1f,%lld,%.2f\n", preset.c_str(), (long long)T, nth,
                (long long)(T * c.n_expert_used), mb * 1e3, mf * 1e3, mb / mf, ops / mf / 1e9,
                100 * ops / mf / 1e9 / (nth * PeakPerCore()), (long long)window, Median(tw) * 1e3);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace estream

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "expert";
  std::string shapes = "olmoe,qwen3,mixtral", routes = "1,8,32,64,128,256,1024", preset = "olmoe-1b-7b",
              tokens = "512,1024";
  int reps = 5;
  bool baseline = true;
  int64_t window = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--shapes") shapes = v;
    else if (k == "--routes") routes = v;
    else if (k == "--reps") reps = std::atoi(v.c_str());
    else if (k == "--preset") preset = v;
    else if (k == "--tokens") tokens = v;
    else if (k == "--baseline") baseline = v != "0";
    else if (k == "--window") window = std::atoll(v.c_str());
    else {
      std::fprintf(stderr, "moe_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  auto ints = [](const std::string& s) {
    std::vector<int64_t> v;
    for (const std::string& x : estream::Split(s)) v.push_back(std::atoll(x.c_str()));
    return v;
  };
  if (mode == "expert") return estream::Expert(estream::Split(shapes), ints(routes), std::max(1, reps));
  if (mode == "layer") return estream::Layer(preset, ints(tokens), std::max(1, reps), baseline, window);
  std::fprintf(stderr, "usage: moe_bench expert|layer [options] (see the file comment)\n");
  return 2;
}
