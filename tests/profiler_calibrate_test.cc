// Calibration and the configurator end to end (src/profiler/calibrate.h, `estream profile`,
// VirtualExperts::Solve from a stored profile):
//   - the trace parser on a hand-written trace (service times, the even split of merged steps,
//     partial groups, layer ordinals), the physical route counts through a permutation;
//   - a calibration of a small packed model (permuted) gives a Profile that validates, with the
//     right shapes and every routed row counted;
//   - profile -> stored in the model -> an engine with that budget uses the stored choice, with
//     another budget re-solves from the profile, without a profile keeps the default rule;
//     explicit sizes override; a longer planned prompt lowers B to fit;
//   - the thread count: recorded by the calibration, stored with the choice, a re-solve or a
//     budgeted prefill with another -t says so in one line and still uses the stored answer;
//     older files without the count work as before;
//   - --report with a refused peak-RSS reset (simulated): peaks marked cumulative, one warning;
//   - the profile workflow (profiler::ProfileModel, in this process): JSON fields, a second
//     budget re-solved from the stored profile without running the model, the chosen
//     configuration's MEASURED peak RSS within the budget (a fresh `estream prefill` process, and
//     --report);
//   - the CLI as smoke tests: one-line errors for a budget below the minimum and for an unpacked
//     model, the notes of a budgeted prefill.
#include <sys/resource.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "config/configurator.h"
#include "config/profile.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "pack/packed_layout.h"
#include "pipeline_test_util.h"
#include "profiler/calibrate.h"
#include "profiler/measure.h"
#include "profiler/profile_model.h"
#include "profiler/calibration.h"

namespace estream {
namespace {

namespace fs = std::filesystem;
using pipeline_test::TestModels;

constexpr int kCalibTokens = 200;

io::PackedModelInfo LayoutOf(const std::string& path) {
  auto f = GgufFile::Open(path, {.mmap = false});
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  auto l = io::ReadPackedLayout(**f);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return *l;
}

std::vector<GgufKv> KvsOf(const std::string& path) {
  auto f = GgufFile::Open(path, {.mmap = false});
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return (*f)->kvs();
}

// A table that makes every g and q usable (the test does not measure the disk).
config::DiskProfile FlatDisk() {
  return {.chunk_bytes = 1 << 20,
          .queue_depths = {1, 2, 4},
          .group_sizes = {1, 2, 4, 8, 16},
          .bandwidth = std::vector<float>(15, 1e9f),
          .latency_s = std::vector<float>(5, 1e-4f)};
}

TEST(ProfilerTrace, ParsesServiceTimesAndSplitsMergedSteps) {
  const io::PackedModelInfo layout = LayoutOf(TestModels().packed);  // blocks 0, 1, 2; 16 experts
  // Group size 3: groups 0..4 full, group 5 holds one expert (partial).
  using pipeline::TraceEvent;
  using pipeline::TraceStep;
  const double us = 1e-6;
  const std::vector<TraceEvent> events = {
      {.name = "attention+router L0", .start_s = 0, .dur_s = 500 * us, .args = {{"layer", 0}},
       .step = TraceStep::kAttentionRouter},
      {.name = "attention+router L2", .start_s = 9000 * us, .dur_s = 250 * us, .args = {{"layer", 2}},
       .step = TraceStep::kAttentionRouter},
      {.name = "read L0 g0", .start_s = 100 * us, .dur_s = 300 * us,
       .args = {{"layer", 0}, {"group", 0}, {"bytes", 10}, {"ok", 1}}, .step = TraceStep::kRead},
      {.name = "read L0 g1", .start_s = 150 * us, .dur_s = 450 * us,
       .args = {{"layer", 0}, {"group", 1}, {"bytes", 10}, {"ok", 1}}, .step = TraceStep::kRead},
      {.name = "read L0 g5", .start_s = 700 * us, .dur_s = 100 * us,
       .args = {{"layer", 0}, {"group", 5}, {"bytes", 10}, {"ok", 1}}, .step = TraceStep::kRead},
      {.name = "read L0 g2", .start_s = 1000 * us, .dur_s = 200 * us,
       .args = {{"layer", 0}, {"group", 2}, {"bytes", 10}, {"ok", 0}}, .step = TraceStep::kRead},
      {.name = "read L0 g3", .start_s = 1100 * us, .dur_s = 300 * us,
       .args = {{"layer", 0}, {"group", 3}, {"bytes", 10}, {"ok", 1}}, .step = TraceStep::kRead},
      {.name = "experts L0 g0-2", .start_s = 600 * us, .dur_s = 900 * us,
       .args = {{"layer", 0}, {"groups", 3}, {"first_bank", 0}, {"routes", 30}}, .step = TraceStep::kExperts},
      {.name = "experts L2 g4-4", .start_s = 9300 * us, .dur_s = 100 * us,
       .args = {{"layer", 2}, {"groups", 1}, {"first_bank", 1}, {"routes", 7}}, .step = TraceStep::kExperts},
      {.name = "wait L0 g3", .start_s = 1500 * us, .dur_s = 10 * us, .args = {{"layer", 0}, {"group", 3}},
       .step = TraceStep::kWait},
      // A step of another kind whose name looks like a read: kinds, not names, decide.
      {.name = "read L0 g4", .start_s = 50 * us, .dur_s = 5000 * us, .args = {{"layer", 0}, {"group", 4}, {"ok", 1}}},
  };
  auto t = profiler::RunTraceFromEvents(events, layout, 3);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->nonexpert_s.size(), 3u);
  EXPECT_NEAR(t->nonexpert_s[0], 500e-6, 1e-12);
  EXPECT_EQ(t->nonexpert_s[1], -1);  // no step for block 1
  EXPECT_NEAR(t->nonexpert_s[2], 250e-6, 1e-12);
  // Completion order: g0 (400), g1 (600), g5 (800), g2 (1200, cancelled), g3 (1400).
  // Service: g0 400 - 100 = 300; g1 600 - max(150, 400) = 200; g5 partial (no sample, but its
  // completion counts); g2 not ok (no sample); g3 1400 - max(1100, 1200) = 200 (us).
  ASSERT_EQ(t->load_seconds.size(), 3u);
  EXPECT_NEAR(t->load_seconds[0], 300e-6, 1e-9);
  EXPECT_NEAR(t->load_seconds[1], 200e-6, 1e-9);
  EXPECT_NEAR(t->load_seconds[2], 200e-6, 1e-9);
  // Exec: 3 groups with 30 routes in 900 us -> 3 x (10 rows, 300 us); then (7 rows, 100 us).
  ASSERT_EQ(t->exec_rows.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FLOAT_EQ(t->exec_rows[i], 10.0f);
    EXPECT_NEAR(t->exec_seconds[i], 300e-6, 1e-9);
  }
  EXPECT_FLOAT_EQ(t->exec_rows[3], 7.0f);
  EXPECT_NEAR(t->exec_seconds[3], 100e-6, 1e-9);

  // An experts step without its arguments breaks the recorder's contract.
  const std::vector<TraceEvent> bad = {{.name = "experts L0 g0-0", .dur_s = 1, .step = TraceStep::kExperts}};
  auto r = profiler::RunTraceFromEvents(bad, layout, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("experts L0 g0-0"), std::string::npos) << r.status().message();
}

TEST(ProfilerTrace, RouteCountsArePerPhysicalExpert) {
  const io::PackedModelInfo layout = LayoutOf(TestModels().permuted);
  const int E = 16, K = 4, T = 5, B = 3;
  std::vector<int32_t> routing(B * T * K);
  for (size_t i = 0; i < routing.size(); ++i) routing[i] = static_cast<int32_t>((i * 7 + i / 13) % E);
  auto c = profiler::PhysicalRouteCounts(routing, T, K, B, layout);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->size(), static_cast<size_t>(B * E));
  for (int w = 0; w < B; ++w) {
    std::vector<uint32_t> logical(E, 0);
    for (int i = 0; i < T * K; ++i) ++logical[routing[w * T * K + i]];
    for (int p = 0; p < E; ++p)
      EXPECT_EQ((*c)[w * E + p], logical[layout.layers[w].permutation[p]]) << "layer " << w << " physical " << p;
  }
  auto bad = profiler::PhysicalRouteCounts(std::vector<int32_t>(10), T, K, B, layout);
  EXPECT_FALSE(bad.ok());
  routing[3] = E;  // out of range
  EXPECT_FALSE(profiler::PhysicalRouteCounts(routing, T, K, B, layout).ok());
}

// One calibrated copy of the permuted test model, shared by the tests below; its directory is
// removed at exit.
struct Calibrated {
  pipeline_test::ScratchDir dir;
  std::string model;
  std::vector<int32_t> tokens;
  profiler::CalibrationResult result;
};

Calibrated& TheCalibration() {
  static const std::unique_ptr<Calibrated> c = [] {
    auto c = std::make_unique<Calibrated>();
    c->model = c->dir.File("calibrated.packed.gguf");
    fs::copy_file(TestModels().permuted, c->model);
    auto tokens = profiler::CalibrationTokens(c->model, "", kCalibTokens);
    EXPECT_TRUE(tokens.ok()) << tokens.status().ToString();
    c->tokens = *tokens;
    profiler::CalibrateParams p;
    p.tokens = c->tokens;
    p.group_sizes = {1, 2, 4};
    p.n_threads = 2;
    auto r = profiler::Calibrate(c->model, FlatDisk(), p);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) c->result = std::move(*r);
    return c;
  }();
  return *c;
}

TEST(ProfilerCalibrate, ProfileValidatesWithTheRightShapes) {
  const Calibrated& c = TheCalibration();
  const config::Profile& p = c.result.profile;
  ASSERT_TRUE(p.Validate().ok()) << p.Validate().message();
  const io::PackedModelInfo layout = LayoutOf(c.model);
  EXPECT_EQ(p.n_layer, 3);
  EXPECT_EQ(p.n_expert, 16);
  EXPECT_EQ(p.calib_tokens, static_cast<uint32_t>(c.tokens.size()));
  EXPECT_EQ(p.n_threads, 2u);  // CalibrateParams::n_threads
  ASSERT_EQ(p.record_bytes.size(), 3u);
  for (int w = 0; w < 3; ++w) EXPECT_EQ(p.record_bytes[w], layout.layers[w].record_bytes);
  EXPECT_EQ(p.expert_bytes, layout.layers[0].record_bytes);
  // Every token routes to top-4 experts in every layer.
  ASSERT_EQ(p.expert_routes.size(), 48u);
  for (int w = 0; w < 3; ++w) {
    const uint64_t sum = std::accumulate(p.expert_routes.begin() + w * 16, p.expert_routes.begin() + w * 16 + 16,
                                         uint64_t{0});
    EXPECT_EQ(sum, c.tokens.size() * 4) << "layer " << w;
  }
  // The counts are the resident run's routing mapped to physical positions.
  auto e = Engine::Load(c.model, {.n_threads = 2});
  ASSERT_TRUE(e.ok());
  auto r = (*e)->Run({.tokens = c.tokens, .top_k = 1, .return_routing = true});
  ASSERT_TRUE(r.ok());
  for (int w = 0; w < 3; ++w) {
    std::vector<uint32_t> logical(16, 0);
    for (size_t i = 0; i < c.tokens.size() * 4; ++i) ++logical[r->routing[w * c.tokens.size() * 4 + i]];
    for (int q = 0; q < 16; ++q)
      EXPECT_EQ(p.expert_routes[w * 16 + q], logical[layout.layers[w].permutation[q]]) << w << " " << q;
  }
  ASSERT_EQ(p.nonexpert_seconds.size(), 3u);
  for (float s : p.nonexpert_seconds) EXPECT_GT(s, 0);
  EXPECT_GE(p.other_seconds, 0);
  ASSERT_EQ(p.runs.size(), 3u);
  ASSERT_EQ(c.result.runs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const config::CalibrationRun& run = p.runs[i];
    EXPECT_EQ(run.group_size, 1 << i);
    EXPECT_EQ(run.load_queue_depth, FlatDisk().Q0(run.group_size));
    EXPECT_FALSE(run.exec_rows.empty());
    EXPECT_EQ(run.exec_rows.size(), run.exec_seconds.size());
    EXPECT_LE(run.exec_rows.size(), profiler::kMaxExecSamples);
    EXPECT_FALSE(run.load_seconds.empty());
    // M_other covers the engine's own non-arena figure and the measured peak minus the arena.
    const profiler::CalibrationRunInfo& info = c.result.runs[i];
    EXPECT_EQ(info.group_size, run.group_size);
    EXPECT_GE(run.other_bytes, info.peak_rss_bytes - info.arena_bytes);
    EXPECT_GE(info.banks, 2);
    EXPECT_LE(info.banks, 4);
  }
  // The profile round-trips through its GGUF keys.
  auto parsed = config::ParseProfile(config::ProfileKvs(p), "kvs");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
}

TEST(ProfilerCalibrate, RefusesAnUnpackedModelAndBadSizes) {
  profiler::CalibrateParams p;
  p.tokens = {1, 2, 3};
  auto r = profiler::Calibrate(TestModels().gguf, FlatDisk(), p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("estream pack"), std::string::npos) << r.status().message();
  p.group_sizes = {32};
  r = profiler::Calibrate(TestModels().packed, FlatDisk(), p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  p.tokens.clear();
  EXPECT_FALSE(profiler::Calibrate(TestModels().packed, FlatDisk(), p).ok());
}

// A budget well above what the configuration needs (64 MiB of slack: the test process's RSS
// after load varies by a few MiB from engine to engine).
uint64_t RoomyBudget(const config::Profile& p, int extra_mib) {
  uint64_t most = 0;
  for (const config::CalibrationRun& r : p.runs) most = std::max(most, r.other_bytes);
  return most + (static_cast<uint64_t>(64 + extra_mib) << 20);
}

TEST(ProfilerCalibrate, StoredChoiceAndProfileDriveTheEngine) {
  Calibrated& c = TheCalibration();
  const config::Profile& p = c.result.profile;
  pipeline_test::ScratchDir dir;
  const std::string model = dir.File("m.packed.gguf");
  fs::copy_file(c.model, model);
  const uint64_t budget = RoomyBudget(p, 0);
  auto sel = config::SelectConfig(p, {.budget_bytes = budget});
  ASSERT_TRUE(sel.ok()) << sel.status().ToString();
  const config::ConfigChoice choice = config::ToConfigChoice(*sel, {.budget_bytes = budget});
  ASSERT_TRUE(profiler::StoreInModel(model, &p, &choice).ok());
  const std::vector<GgufKv> kvs = KvsOf(model);
  ASSERT_TRUE(config::HasProfile(kvs));
  auto stored = config::ParseConfigChoice(kvs, model);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(stored->group_size, choice.group_size);
  EXPECT_EQ(stored->budget_bytes, budget);
  // The tensor data is untouched: the model still loads and its checksums hold (a resident load
  // checks every record).
  ASSERT_TRUE(Engine::Load(model, {.n_threads = 1}).ok());

  const int64_t T = static_cast<int64_t>(c.tokens.size());
  auto run = [&](EngineOptions o) -> Result<Response> {
    o.n_threads = 2;
    o.budget_tokens = T;
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Load(model, o));
    return e->Run({.tokens = c.tokens, .top_k = 1});
  };
  // 1. The budget it was solved for: the stored choice.
  auto r = run({.budget_bytes = budget});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->config.source, "stored");
  EXPECT_EQ(r->config.group_size, choice.group_size);
  EXPECT_EQ(r->config.banks, choice.banks);
  EXPECT_EQ(r->config.queue_depth, choice.queue_depth);
  EXPECT_LE(r->config.arena_bytes + r->config.other_bytes, budget);
  // 2. Another budget: re-solved from the stored profile, the configurator's answer.
  const uint64_t budget2 = RoomyBudget(p, 5);
  auto sel2 = config::SelectConfig(p, {.budget_bytes = budget2});
  ASSERT_TRUE(sel2.ok());
  r = run({.budget_bytes = budget2});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->config.source, "profile");
  EXPECT_EQ(r->config.group_size, sel2->best.group_size);
  EXPECT_EQ(r->config.banks, sel2->best.banks);
  EXPECT_EQ(r->config.queue_depth, sel2->best.queue_depth);
  // Another schedule: re-solved for it, not the stored (early) choice.
  r = run({.budget_bytes = budget, .schedule = EngineOptions::Schedule::kOnDemand});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.source, "profile");
  // 3. Explicit sizes override; an explicit depth overrides only Q.
  r = run({.budget_bytes = budget, .group_size = 2, .banks = 3});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.source, "explicit");
  EXPECT_EQ(r->config.group_size, 2);
  EXPECT_EQ(r->config.banks, 3);
  r = run({.budget_bytes = budget, .queue_depth = 3});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.source, "stored");
  EXPECT_EQ(r->config.queue_depth, 3);
  EXPECT_EQ(r->config.group_size, choice.group_size);
  // 4. No stored profile: the default rule, and it says so.
  auto e = Engine::Load(TestModels().packed, {.n_threads = 2, .budget_bytes = budget, .budget_tokens = T});
  ASSERT_TRUE(e.ok());
  auto rr = (*e)->Run({.tokens = c.tokens, .top_k = 1});
  ASSERT_TRUE(rr.ok());
  EXPECT_EQ(rr->config.source, "rule");
}

// A stored choice with more banks than this process can fit next to its own (measured)
// non-arena memory: B is lowered to fit, never over the budget.
TEST(ProfilerCalibrate, StoredChoiceIsLoweredToFit) {
  pipeline_test::ScratchDir dir;
  const std::string model = dir.File("fit.packed.gguf");
  fs::copy_file(TestModels().packed, model);
  const uint64_t stride = LayoutOf(model).layers[0].record_bytes;
  // This process's non-arena figure for the engine (explicit sizes, no budget check).
  auto probe = Engine::Load(model, {.n_threads = 2, .group_size = 1, .banks = 1, .budget_tokens = 64});
  ASSERT_TRUE(probe.ok());
  auto pr = (*probe)->Run({.tokens = {1, 2, 3}, .top_k = 1});
  ASSERT_TRUE(pr.ok());
  probe->reset();
  const uint64_t budget = pr->config.other_bytes + 40 * stride;
  const config::ConfigChoice choice{.group_size = 1, .banks = 200, .queue_depth = 2, .budget_bytes = budget,
                                    .predicted_seconds = 1};
  ASSERT_TRUE(profiler::StoreInModel(model, nullptr, &choice).ok());
  auto e = Engine::Load(model, {.n_threads = 2, .budget_bytes = budget, .budget_tokens = 64});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto r = (*e)->Run({.tokens = {1, 2, 3}, .top_k = 1});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.group_size, 1);
  EXPECT_LT(r->config.banks, 200);
  EXPECT_GE(r->config.banks, 1);
  EXPECT_EQ(r->config.queue_depth, 2);
  EXPECT_EQ(r->config.source.rfind("stored (banks 200 -> ", 0), 0u) << r->config.source;
  EXPECT_EQ(r->config.source_kind, ConfigSource::kStored);
  EXPECT_EQ(r->config.source_note.rfind("banks 200 -> ", 0), 0u) << r->config.source_note;
  EXPECT_LE(r->config.arena_bytes + r->config.other_bytes, budget);
}

// ---- the profile workflow (profiler::ProfileModel) and the CLI's smoke tests ----

// `estream ARGS` in a fresh process (so VmHWM is that run's): its exit code and stdout, or stdout
// followed by stderr.
struct CliResult {
  int code = -1;
  std::string out;
  std::string err;  // stderr (also in out when asked for)
};

CliResult RunCli(const std::string& args, bool with_stderr = false) {
  pipeline_test::ScratchDir dir;
  const cli_test::CliResult r = cli_test::RunCli(args, dir.File("stderr.txt"));
  return {r.exit_code, with_stderr ? r.out + r.err : r.out, r.err};
}

nlohmann::json ParseJson(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << text;
  return j;
}
nlohmann::json ParseJson(const CliResult& r) { return ParseJson(r.out); }

// profiler::ProfileModel on `threads` threads with its progress lines collected; its result as the
// JSON `estream profile --json` prints (ProfileModelJson), or an error.
struct ProfileRun {
  Status status;
  nlohmann::json json;
  std::string progress;
};
ProfileRun Profile(const std::string& model, uint64_t budget, int threads = 2) {
  ProfileRun run;
  profiler::ProfileModelParams p{.model_path = model, .budget_bytes = budget, .budget_text = std::to_string(budget),
                                 .n_threads = threads};
  p.progress = [&run](const std::string& line) { run.progress += line + "\n"; };
  Result<profiler::ProfileModelResult> r = profiler::ProfileModel(p);
  run.status = r.status();
  if (r.ok()) run.json = ParseJson(profiler::ProfileModelJson(*r));
  return run;
}

TEST(ProfileModel, StoreResolveAndBudgetHolds) {
  pipeline_test::ScratchDir dir;
  const std::string model = dir.File("cli.packed.gguf");
  fs::copy_file(TestModels().packed, model);
  // A first run at a huge budget gives the minimum (the disk measured into a scratch cache). The
  // minimum counts the load peak of the process that measures it, so the runs whose budget is
  // checked against a fresh process's peak RSS run `estream profile` in a fresh process too.
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_xdg = old_xdg ? old_xdg : "";
  ASSERT_EQ(setenv("XDG_CACHE_HOME", dir.File("cache").c_str(), 1), 0);
  CliResult cli = RunCli("profile " + model + " --budget 64G --json --groups 1,2,4 --calib-tokens " +
                         std::to_string(kCalibTokens) + " -t 2");
  if (old_xdg) setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  else unsetenv("XDG_CACHE_HOME");
  ASSERT_EQ(cli.code, 0) << cli.out << cli.err;
  nlohmann::json j = ParseJson(cli);
  for (const char* key : {"group_size", "banks", "queue_depth", "predicted_seconds", "profile_seconds",
                          "disk_seconds", "calibration_seconds", "solve_seconds", "budget_bytes",
                          "minimum_budget_bytes", "per_group", "calibration_runs"})
    EXPECT_TRUE(j.contains(key)) << key << ": " << j.dump();
  EXPECT_EQ(j["source"], "calibrated");
  EXPECT_GT(j["calibration_seconds"].get<double>(), 0);
  EXPECT_EQ(j["calibration_runs"].size(), 3u);
  const uint64_t minimum = j["minimum_budget_bytes"].get<uint64_t>();
  ASSERT_GT(minimum, 0u);

  // A tight budget: re-solved from the stored profile, without running the model (the library
  // call, in this process).
  const uint64_t budget = minimum + (uint64_t{3} << 20);
  ProfileRun run = Profile(model, budget);
  ASSERT_TRUE(run.status.ok()) << run.status.ToString();
  j = run.json;
  EXPECT_EQ(j["source"], "stored profile");
  EXPECT_EQ(j["calibration_seconds"].get<double>(), 0.0);
  EXPECT_EQ(j["disk_seconds"].get<double>(), 0.0);
  EXPECT_EQ(j["budget_bytes"].get<uint64_t>(), budget);
  EXPECT_LE(j["predicted_memory_bytes"].get<uint64_t>(), budget);
  const int G = j["group_size"], B = j["banks"], Q = j["queue_depth"];
  auto stored = config::ParseConfigChoice(KvsOf(model), model);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(stored->group_size, G);
  EXPECT_EQ(stored->banks, B);
  EXPECT_EQ(stored->queue_depth, Q);
  EXPECT_EQ(stored->budget_bytes, budget);

  // The chosen configuration's MEASURED peak RSS is within the budget: a fresh process running
  // the calibration-length prompt with that budget uses the stored choice.
  const std::string tokens_file = dir.File("tokens.txt");
  {
    auto toks = profiler::CalibrationTokens(model, "", kCalibTokens);
    ASSERT_TRUE(toks.ok());
    std::ofstream f(tokens_file);
    for (int32_t t : *toks) f << t << ",";
  }
  CliResult r = RunCli("prefill -m " + model + " --tokens @" + tokens_file + " --budget " + std::to_string(budget) +
                       " --json -t 2 --top-k 1");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  j = ParseJson(r);
  EXPECT_EQ(j["config"]["source"], "stored") << r.out;
  EXPECT_EQ(j["config"]["group_size"], G);
  EXPECT_EQ(j["config"]["banks"], B);
  EXPECT_EQ(j["config"]["queue_depth"], Q);
  EXPECT_LE(j["peak_rss_bytes"].get<uint64_t>(), budget) << r.out;

  // --report: the chosen point and its neighbours, each measured within the budget.
  r = RunCli("profile " + model + " --budget " + std::to_string(budget) + " --json --report -t 2");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  j = ParseJson(r);
  ASSERT_TRUE(j.contains("report"));
  ASSERT_GE(j["report"].size(), 1u);
  EXPECT_EQ(j["report"][0]["point"], "chosen");
  EXPECT_FALSE(j["report"][0].contains("error")) << j["report"][0].dump();
  // A neighbour (one bank more) that does not fit the budget is reported with its error and no
  // timing; every point that ran was within the budget. (`at`, not const `[]`: a missing key is
  // an exception, not undefined behaviour, in a Release build.)
  for (const nlohmann::json& p : j["report"]) {
    if (p.contains("error")) {
      EXPECT_EQ(p.at("point"), "neighbour") << p.dump();
      continue;
    }
    EXPECT_GT(p.at("seconds").get<double>(), 0) << p.dump();
    EXPECT_TRUE(p.at("within_budget").get<bool>()) << p.dump();
  }

  // Another budget in a fresh prefill (no stored choice for it): re-solved at load.
  r = RunCli("prefill -m " + model + " --tokens 1,2,3,4,5 --budget " + std::to_string(budget + (uint64_t{1} << 20)) +
             " --json -t 2 --top-k 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(ParseJson(r)["config"]["source"], "profile") << r.out;
}

size_t Count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

// The stored profile and choice record the thread count of the calibration (2 here). A re-solve
// or a budgeted prefill with another -t uses them all the same and says so in one line on stderr;
// with the same count, or with a file stored before the count was (0: unknown), nothing is said.
TEST(ProfileModel, ThreadCountMismatchIsNoted) {
  pipeline_test::ScratchDir dir;
  const std::string model = dir.File("t.packed.gguf");
  fs::copy_file(TheCalibration().model, model);
  config::Profile p = TheCalibration().result.profile;
  ASSERT_EQ(p.n_threads, 2u);
  ASSERT_TRUE(profiler::StoreInModel(model, &p, nullptr).ok());
  const std::string budget = std::to_string(RoomyBudget(p, 0));
  const std::string note = "note: the stored profile was measured with 2 threads, this run uses 1";

  // Re-solve with the calibration's count: no note; the choice records it.
  ProfileRun run = Profile(model, std::stoull(budget), 2);
  ASSERT_TRUE(run.status.ok()) << run.status.ToString();
  EXPECT_EQ(run.progress.find("note: the stored profile"), std::string::npos) << run.progress;
  auto choice = config::ParseConfigChoice(KvsOf(model), model);
  ASSERT_TRUE(choice.ok()) << choice.status().ToString();
  EXPECT_EQ(choice->n_threads, 2u);
  // With -t 1: one line, and the answer is the same (the stored profile's).
  run = Profile(model, std::stoull(budget), 1);
  ASSERT_TRUE(run.status.ok()) << run.status.ToString();
  EXPECT_EQ(Count(run.progress, note), 1u) << run.progress;
  EXPECT_NE(run.progress.find("estream profile " + model + " --budget " + budget + " -t 1 --recalibrate"),
            std::string::npos) << run.progress;
  auto again = config::ParseConfigChoice(KvsOf(model), model);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->group_size, choice->group_size);
  EXPECT_EQ(again->banks, choice->banks);
  EXPECT_EQ(again->n_threads, 2u);  // the timings it was solved from

  // prefill --budget with the stored choice: -t 1 notes it once and still uses it; -t 2 is quiet.
  const std::string prefill = "prefill -m " + model + " --tokens 1,2,3,4,5 --top-k 1 --budget " + budget;
  CliResult r = RunCli(prefill + " -t 1", /*with_stderr=*/true);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Count(r.out, "estream prefill: " + note), 1u) << r.out;
  EXPECT_NE(r.out.find("(G/B/Q: stored)"), std::string::npos) << r.out;
  r = RunCli(prefill + " -t 2", /*with_stderr=*/true);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("note: the stored profile"), std::string::npos) << r.out;
  // Another budget (re-solved from the profile at load): noted too.
  const std::string budget2 = std::to_string(RoomyBudget(p, 3));
  r = RunCli("prefill -m " + model + " --tokens 1,2,3,4,5 --top-k 1 --budget " + budget2 + " -t 1", true);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Count(r.out, "estream prefill: " + note), 1u) << r.out;
  EXPECT_NE(r.out.find("(G/B/Q: profile)"), std::string::npos) << r.out;

  // A file stored before the count was recorded: used as before, nothing said.
  p.n_threads = 0;
  config::ConfigChoice old_choice = *choice;
  old_choice.n_threads = 0;
  ASSERT_TRUE(profiler::StoreInModel(model, &p, &old_choice).ok());
  const std::vector<GgufKv> kvs = KvsOf(model);
  EXPECT_EQ(config::ReadStoredThreads(kvs).profile, 0u);
  EXPECT_EQ(config::ReadStoredThreads(kvs).choice, 0u);
  r = RunCli(prefill + " -t 1", /*with_stderr=*/true);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("note: the stored profile"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(G/B/Q: stored)"), std::string::npos) << r.out;
  run = Profile(model, std::stoull(budget), 1);
  ASSERT_TRUE(run.status.ok()) << run.status.ToString();
  EXPECT_EQ(run.progress.find("note: the stored profile"), std::string::npos) << run.progress;
}

// --report where the peak RSS cannot be reset (simulated, profiler/measure.h): each point's peak is
// the process's since it started, marked, with one warning; the workflow still succeeds. The
// library call (profiler::ProfileModel) in this process.
TEST(ProfileModel, ReportWithARefusedPeakReset) {
  pipeline_test::ScratchDir dir;
  const std::string model = dir.File("r.packed.gguf");
  fs::copy_file(TheCalibration().model, model);
  const config::Profile& p = TheCalibration().result.profile;
  ASSERT_TRUE(profiler::StoreInModel(model, &p, nullptr).ok());
  const uint64_t budget = RoomyBudget(p, 0);
  std::string progress;
  const profiler::ProfileModelParams params{.model_path = model, .budget_bytes = budget,
                                            .budget_text = std::to_string(budget), .report = true, .n_threads = 2,
                                            .progress = [&progress](const std::string& l) { progress += l + "\n"; }};
  auto r = profiler::ProfileModel(params);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->calibrated);
  ASSERT_GE(r->report.size(), 1u);
  EXPECT_EQ(r->report[0].point, "chosen");
  for (const profiler::ReportPoint& point : r->report)
    if (point.error.empty()) { EXPECT_TRUE(point.peak_rss_exact); }

  ASSERT_EQ(setenv(profiler::kRefuseClearRefsEnv, "1", 1), 0);
  progress.clear();
  r = profiler::ProfileModel(params);
  unsetenv(profiler::kRefuseClearRefsEnv);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const nlohmann::json j = nlohmann::json::parse(profiler::ProfileModelJson(*r), nullptr, false);
  ASSERT_TRUE(j.is_object());
  ASSERT_GE(j["report"].size(), 1u);
  for (const nlohmann::json& point : j["report"]) {
    if (point.contains("error")) continue;  // a neighbour that does not fit this process
    EXPECT_EQ(point["peak_rss_exact"], false) << point.dump();
    // A cumulative peak within the budget still proves the point was; above it: not known.
    if (point["peak_rss_bytes"].get<uint64_t>() <= budget)
      EXPECT_EQ(point["within_budget"], true) << point.dump();
    else
      EXPECT_TRUE(point["within_budget"].is_null()) << point.dump();
  }
  EXPECT_EQ(Count(progress, "warning: the peak RSS cannot be reset here"), 1u) << progress;
}

// A model that cannot be written is refused before the disk and the model are measured (profile
// used to measure for minutes, then fail to store and print nothing). Writes fail here under a
// file size limit (EFBIG), as they do on a read-only mount (EROFS) or a file system without write
// support (ENOSYS).
TEST(ProfileModel, UnwritableModelIsRefusedBeforeMeasuring) {
  pipeline_test::ScratchDir dir;
  const std::string model = dir.File("ro.packed.gguf");
  fs::copy_file(TestModels().packed, model);
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit tiny = old_limit;
  tiny.rlim_cur = 0;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tiny), 0);
  const ProfileRun run = Profile(model, uint64_t{1} << 30);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(run.status.code(), StatusCode::kIOError) << run.status.ToString();
  EXPECT_NE(run.status.message().find("writing to it fails"), std::string::npos) << run.status.ToString();
  EXPECT_NE(run.status.message().find("give it a copy it can write"), std::string::npos) << run.status.ToString();
  EXPECT_EQ(run.progress, "") << "nothing may be measured first";
}

TEST(ProfilerCli, Errors) {
  // Budget below the minimum: one line with the minimum. The stored profile of the calibrated
  // copy answers without running anything.
  pipeline_test::ScratchDir dir;
  const std::string model = dir.File("e.packed.gguf");
  fs::copy_file(TheCalibration().model, model);
  ASSERT_TRUE(profiler::StoreInModel(model, &TheCalibration().result.profile, nullptr).ok());
  CliResult r = RunCli("profile " + model + " --budget 1M", /*with_stderr=*/true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("give a budget of at least"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  // Not a packed model.
  r = RunCli("profile " + TestModels().gguf + " --budget 1G", true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("run 'estream pack"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  // A group size that was not calibrated, without --recalibrate.
  r = RunCli("profile " + model + " --budget 1G --groups 8", true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--recalibrate"), std::string::npos) << r.out;
  // prefill --budget without a profile says so on stderr.
  r = RunCli("prefill -m " + TestModels().packed + " --tokens 1,2,3 --budget 1G -t 1 --top-k 1", true);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("no stored profile: run estream profile"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace estream
