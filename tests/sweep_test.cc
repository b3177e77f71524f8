// profiler::Sweep (the library call behind `estream sweep`) on a small synthetic packed model
// (3 layers, 16 experts, top-4) with a tiny grid, in this process (MeasureRun resets the peak
// RSS before each load, so each point's figure is its own):
//   - the JSON (SweepJson): every field present, results sorted by time, best = the fastest
//     point, every point's peak RSS within the budget, the grid's banks (powers of two up to
//     2*ceil(E/G)); progress: one line per point;
//   - a budget just above the minimum: b_max(G) joins the grid, the points above it are skipped
//     and counted, every peak RSS still within the budget;
//   - /proc/self/clear_refs refused (simulated): peaks marked cumulative, one warning;
//   - errors: a budget below the minimum (naming the minimum), an unpacked model, a group size
//     larger than the experts per layer.
// And `estream sweep` itself as a smoke test (the binary: flags, table, exit codes).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cli_test_util.h"
#include "pipeline_test_util.h"
#include "profiler/measure.h"
#include "profiler/sweep.h"

namespace estream {
namespace {

using pipeline_test::TestModels;

using cli_test::CliResult;

CliResult RunCli(const std::string& args) {
  pipeline_test::ScratchDir dir;
  return cli_test::RunCli(args, dir.File("stderr.txt"));
}

// The last line of the CLI's stderr (its error line).
std::string LastLine(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// Sweep parameters of the tests: 2 threads, `calib_tokens` tokens, progress collected.
profiler::SweepParams Params(const std::string& model, uint64_t budget, int calib_tokens, std::string* progress) {
  profiler::SweepParams p;
  p.model_path = model;
  p.budget_bytes = budget;
  p.calib_tokens = calib_tokens;
  p.n_threads = 2;
  if (progress) p.progress = [progress](const std::string& line) { *progress += line + "\n"; };
  return p;
}

// The sweep's minimum budget in MiB for a calibration request of `tokens` tokens, from the error
// of a budget far below it ("... need at least X MiB (N MiB) ...").
long MinimumMib(const std::string& model, int tokens) {
  auto r = profiler::Sweep(Params(model, uint64_t{1} << 20, tokens, nullptr));
  EXPECT_FALSE(r.ok());
  if (r.ok()) return -1;
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  const std::string line = r.status().message();
  EXPECT_NE(line.find("no configuration of the grid fits the budget"), std::string::npos) << line;
  const size_t at = line.find("need at least");
  EXPECT_NE(at, std::string::npos) << line;
  if (at == std::string::npos) return -1;
  const size_t open = line.find('(', at);
  return open == std::string::npos ? -1 : std::strtol(line.c_str() + open + 1, nullptr, 10);
}

// Checks the fields and the invariants of one result's JSON; returns it.
nlohmann::json CheckJson(const Result<profiler::SweepResult>& r, uint64_t budget, int calib_tokens) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return nlohmann::json();
  const std::string out = profiler::SweepJson(*r);
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(j.is_object()) << out;
  if (!j.is_object()) return j;
  for (const char* key : {"model", "budget_bytes", "calib_tokens", "sweep_seconds", "results", "best", "skipped"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["model"], TestModels().packed);
  EXPECT_EQ(j["budget_bytes"].get<uint64_t>(), budget);
  EXPECT_EQ(j["calib_tokens"].get<int>(), calib_tokens);
  EXPECT_GT(j["sweep_seconds"].get<double>(), 0);
  const nlohmann::json& results = j["results"];
  EXPECT_TRUE(results.is_array());
  EXPECT_FALSE(results.empty());
  double prev = 0, sum = 0;
  for (const nlohmann::json& p : results) {
    for (const char* key : {"group_size", "banks", "queue_depth", "seconds", "peak_rss_bytes", "bubble_rate",
                            "read_gbps", "nonexpert_seconds", "peak_rss_exact"})
      EXPECT_TRUE(p.contains(key)) << key << " in " << p.dump();
    EXPECT_GT(p["nonexpert_seconds"].get<double>(), 0) << p.dump();
    EXPECT_LT(p["nonexpert_seconds"].get<double>(), p["seconds"].get<double>()) << p.dump();
    EXPECT_TRUE(p["peak_rss_exact"].get<bool>()) << p.dump();
    const double s = p["seconds"].get<double>();
    EXPECT_GE(s, prev) << "results not sorted by time";
    prev = s;
    sum += s;
    EXPECT_GT(p["peak_rss_bytes"].get<uint64_t>(), 0u);
    EXPECT_LE(p["peak_rss_bytes"].get<uint64_t>(), budget) << "over the budget: " << p.dump();
    EXPECT_FALSE(p.contains("over_budget")) << p.dump();
    EXPECT_GE(p["bubble_rate"].get<double>(), 0);
    EXPECT_LE(p["bubble_rate"].get<double>(), 1);
  }
  // The sweep's wall time covers every run.
  EXPECT_GE(j["sweep_seconds"].get<double>(), sum);
  EXPECT_EQ(j["best"], results.front());
  EXPECT_EQ(j["peak_rss_exact"], true);
  return j;
}

TEST(Sweep, JsonOfATinyGrid) {
  const std::string& model = TestModels().packed;
  const uint64_t budget = uint64_t{512} << 20;  // everything fits
  std::string progress;
  profiler::SweepParams p = Params(model, budget, 64, &progress);
  p.groups = {4, 16};
  p.queue_depths = {1, 8};
  const auto r = profiler::Sweep(p);
  const nlohmann::json j = CheckJson(r, budget, 64);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["skipped"].get<int>(), 0);
  // G=4: B in {1, 2, 4, 8} (U = 2*ceil(16/4) = 8); G=16: B in {1, 2}; each with Q in {1, 8}.
  std::set<std::tuple<int, int, int>> got, want;
  for (const nlohmann::json& p : j["results"])
    got.insert({p["group_size"].get<int>(), p["banks"].get<int>(), p["queue_depth"].get<int>()});
  for (int q : {1, 8}) {
    for (int b : {1, 2, 4, 8}) want.insert({4, b, q});
    for (int b : {1, 2}) want.insert({16, b, q});
  }
  EXPECT_EQ(got, want);
  // Progress: one line per point with its index, the point and the ETA.
  EXPECT_NE(progress.find("point 12/12 G=16 B=2 Q=8"), std::string::npos) << progress;
  EXPECT_NE(progress.find("ETA"), std::string::npos) << progress;
}

// Where /proc/self/clear_refs is refused (simulated with the test-only variable of
// profiler/measure.h), every point reports the process's peak since it started, marked as such
// in the result and the JSON, after one warning line; the sweep still succeeds.
TEST(Sweep, RefusedPeakResetIsMarkedCumulative) {
  const std::string& model = TestModels().packed;
  ASSERT_EQ(setenv(profiler::kRefuseClearRefsEnv, "1", 1), 0);
  std::string progress;
  profiler::SweepParams p = Params(model, uint64_t{512} << 20, 32, &progress);
  p.n_threads = 1;
  p.groups = {4};
  p.banks = {2, 4};
  p.queue_depths = {2};
  const auto r = profiler::Sweep(p);
  unsetenv(profiler::kRefuseClearRefsEnv);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const nlohmann::json j = nlohmann::json::parse(profiler::SweepJson(*r), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["peak_rss_exact"], false);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const nlohmann::json& pt : j["results"]) {
    EXPECT_EQ(pt["peak_rss_exact"], false) << pt.dump();
    EXPECT_GT(pt["peak_rss_bytes"].get<uint64_t>(), 0u);
  }
  EXPECT_EQ(j["best"]["peak_rss_exact"], false);
  size_t warnings = 0;
  for (size_t at = progress.find("clear_refs refused"); at != std::string::npos;
       at = progress.find("clear_refs refused", at + 1))
    ++warnings;
  EXPECT_EQ(warnings, 1u) << progress;
  EXPECT_NE(progress.find("warning: the peak RSS cannot be reset here"), std::string::npos) << progress;
  EXPECT_NE(progress.find("cumulative"), std::string::npos) << progress;
}

TEST(Sweep, NearTheMinimumBudget) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer the RSS includes its shadow memory and quarantine";
#endif
  const std::string& model = TestModels().packed;
  const long min_mib = MinimumMib(model, 64);
  ASSERT_GT(min_mib, 0);
  // One MiB above the minimum: about 18 of the tiny model's 56 KiB expert records fit, fewer
  // than G=1's useful maximum of 32 banks, so b_max(1) is measured and joins the grid.
  const uint64_t budget = static_cast<uint64_t>(min_mib + 1) << 20;
  profiler::SweepParams p = Params(model, budget, 64, nullptr);
  p.groups = {1};
  p.queue_depths = {4};
  const auto r = profiler::Sweep(p);
  const nlohmann::json j = CheckJson(r, budget, 64);
  ASSERT_TRUE(j.is_object());
  int b_max = 0;
  std::set<int> banks;
  for (const nlohmann::json& p : j["results"]) {
    banks.insert(p["banks"].get<int>());
    b_max = std::max(b_max, p["banks"].get<int>());
  }
  ASSERT_LT(b_max, 32) << j.dump();
  EXPECT_GT(j["skipped"].get<int>(), 0) << "points above b_max are skipped and counted";
  for (int b : banks) EXPECT_TRUE(b == b_max || (b & (b - 1)) == 0) << b;
  for (int b = 1; b <= b_max; b *= 2) EXPECT_TRUE(banks.count(b)) << b;
}

TEST(Sweep, Errors) {
  const std::string& model = TestModels().packed;
  // Below the minimum: an error naming the minimum (checked by MinimumMib).
  EXPECT_GT(MinimumMib(model, 1024), 0);

  auto r = profiler::Sweep(Params(TestModels().gguf, uint64_t{1} << 30, 64, nullptr));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("estream pack"), std::string::npos) << r.status().message();

  profiler::SweepParams p = Params(model, uint64_t{1} << 30, 64, nullptr);
  p.groups = {32};
  r = profiler::Sweep(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("larger than the 16 experts"), std::string::npos) << r.status().message();

  p = Params(model, uint64_t{1} << 30, 64, nullptr);
  p.calib_path = "/nonexistent/calib.txt";
  r = profiler::Sweep(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/calib.txt"), std::string::npos) << r.status().message();
}

// The command: flags -> Sweep -> the table (or the JSON); errors are one line and exit 1.
TEST(SweepCli, Smoke) {
  const std::string& model = TestModels().packed;
  CliResult r = RunCli("sweep " + model + " --budget 512M -t 2 --groups 16 --banks 2 --queue-depths 4 "
                       "--calib-tokens 32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("best (*): G=16 B=2 Q=4"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("estream sweep: point 1/1 G=16 B=2 Q=4"), std::string::npos) << r.err;

  r = RunCli("sweep " + model + " --budget 512M -t 2 --groups 16 --banks 2 --queue-depths 4 --calib-tokens 32 "
             "--json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["results"].size(), 1u);

  r = RunCli("sweep " + model + " --budget 1M -t 2 --calib-tokens 64");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(LastLine(r.err).find("estream sweep: error: no configuration of the grid fits the budget"),
            std::string::npos) << r.err;

  r = RunCli("sweep " + TestModels().gguf + " --budget 1G");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(LastLine(r.err).find("estream pack"), std::string::npos) << r.err;

  r = RunCli("sweep " + model + " --budget lots");
  EXPECT_NE(r.exit_code, 0);
}

}  // namespace
}  // namespace estream
