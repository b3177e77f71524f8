// Configurator re-solve time (the "Configurator" section of docs/PERFORMANCE.md).
//
// Profile of record: MakeSyntheticProfile defaults = Qwen3-30B-A3B shapes (48 MoE layers x 128
// experts, top-8, 1,024 calibration tokens, W_e = 2,654,208 B), candidate g in {1, 2, 4, 8, 16},
// disk table of 6 depths. Budgets: 1 GiB of non-arena memory + 15% / 30% / 60% of all expert
// bytes (the three budgets). Benchmarks:
//   BM_Evaluate/<g>         one evaluation of the recurrence (all 48 layers) at group size g
//   BM_Resolve/<pct>        SelectConfig from an in-memory Profile (bisection over b)
//   BM_ResolveExhaustive    the same, scanning every b up to the cap (the design's literal form)
//   BM_ResolveFromKvs       ParseProfile from the GGUF key/values + SelectConfig
//   BM_ResolveFromFile      GgufFile::Open of a file holding the profile + parse + select: what
//                           `estream profile MODEL --budget M2` does besides opening the model
// Single-threaded by design (the configurator is pure and sequential).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "config/configurator.h"
#include "config/synthetic.h"
#include "gguf/gguf.h"

namespace estream::config {
namespace {

const Profile& RecordProfile() {
  static const Profile p = MakeSyntheticProfile({});
  return p;
}

uint64_t Budget(int pct) {
  return (uint64_t{1} << 30) + RecordProfile().TotalExpertBytes() * static_cast<uint64_t>(pct) / 100;
}

void BM_Evaluate(benchmark::State& state) {
  const Profile& p = RecordProfile();
  const int g = static_cast<int>(state.range(0));
  auto model = MakeServiceModel(p, g, p.disk.Q0(g));
  PipelineInput in;
  BuildPipelineInput(p, *model, &in);
  PipelineWorkspace ws;
  const PipelineParams params{.banks = 128 / g, .queue_depth = model->queue_depth};
  for (auto _ : state) benchmark::DoNotOptimize(EvaluatePipeline(in, params, &ws).total_s);
  state.counters["groups"] = in.n_groups();
  state.counters["groups_per_s"] =
      benchmark::Counter(static_cast<double>(in.n_groups()), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Evaluate)->Arg(1)->Arg(4)->Arg(16)->Unit(benchmark::kMicrosecond);

void BM_Resolve(benchmark::State& state) {
  const SelectParams params{.budget_bytes = Budget(static_cast<int>(state.range(0)))};
  int evals = 0;
  for (auto _ : state) {
    auto sel = SelectConfig(RecordProfile(), params);
    evals = sel->evaluations;
    benchmark::DoNotOptimize(sel->best.predicted_s);
  }
  state.counters["evaluations"] = evals;
}
BENCHMARK(BM_Resolve)->Arg(15)->Arg(30)->Arg(60)->Unit(benchmark::kMillisecond);

void BM_ResolveExhaustive(benchmark::State& state) {
  const SelectParams params{.budget_bytes = Budget(static_cast<int>(state.range(0))), .exhaustive = true};
  int evals = 0;
  for (auto _ : state) {
    auto sel = SelectConfig(RecordProfile(), params);
    evals = sel->evaluations;
    benchmark::DoNotOptimize(sel->best.predicted_s);
  }
  state.counters["evaluations"] = evals;
}
BENCHMARK(BM_ResolveExhaustive)->Arg(15)->Unit(benchmark::kMillisecond);

void BM_ResolveFromKvs(benchmark::State& state) {
  const std::vector<GgufKv> kvs = ProfileKvs(RecordProfile());
  const SelectParams params{.budget_bytes = Budget(30)};
  for (auto _ : state) {
    auto p = ParseProfile(kvs, "bench");
    auto sel = SelectConfig(*p, params);
    benchmark::DoNotOptimize(sel->best.predicted_s);
  }
}
BENCHMARK(BM_ResolveFromKvs)->Unit(benchmark::kMillisecond);

void BM_ResolveFromFile(benchmark::State& state) {
  const std::string path = "/tmp/config_bench_" + std::to_string(::getpid()) + ".gguf";
  {
    GgufWriter writer;
    for (GgufKv& kv : ProfileKvs(RecordProfile())) writer.AddKv(std::move(kv.key), std::move(kv.value));
    if (!writer.Begin(path).ok() || !writer.Finish().ok()) {
      state.SkipWithError("cannot write the profile file");
      return;
    }
  }
  const SelectParams params{.budget_bytes = Budget(30)};
  for (auto _ : state) {
    auto file = GgufFile::Open(path);
    auto p = ParseProfile((*file)->kvs(), path);
    auto sel = SelectConfig(*p, params);
    benchmark::DoNotOptimize(sel->best.predicted_s);
  }
  std::remove(path.c_str());
}
BENCHMARK(BM_ResolveFromFile)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace estream::config

BENCHMARK_MAIN();
