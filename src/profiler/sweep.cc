#include "profiler/sweep.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/json_text.h"
#include "base/stats.h"
#include "base/timer.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "pack/packed_layout.h"
#include "profiler/measure.h"

namespace estream::profiler {
namespace {

constexpr int kGroupSizes[] = {1, 2, 4, 8, 16};
constexpr int kQueueDepths[] = {1, 2, 4, 8, 16, 32};

std::string Duration(double s) {
  if (s < 90) return fmt::format("{} s", std::lround(s));
  if (s < 5400) return fmt::format("{} min", std::lround(s / 60));
  return fmt::format("{} h", std::lround(s / 3600));
}

class Sweeper {
 public:
  explicit Sweeper(const SweepParams& p) : p_(p) {}
  Result<SweepResult> Run();

 private:
  void Progress(const std::string& line) const {
    if (p_.progress) p_.progress(line);
  }

  EngineOptions Options(int g, int b, int q) const {
    EngineOptions o;
    o.n_threads = p_.n_threads;
    o.budget_bytes = p_.budget_bytes;
    o.group_size = g;
    o.banks = b;
    o.queue_depth = q;
    o.schedule = Schedule::kEarly;
    o.io = p_.io;
    o.budget_tokens = budget_tokens_;
    return o;
  }

  // Whether the engine accepts (G, B) under the budget: a load that stops at its budget check
  // (the dense part is loaded and measured first). Queue depth does not enter the check.
  Result<bool> Fits(int g, int b) {
    ++r_.probe_loads;
    ReleaseFreedMemory();  // as MeasureRun does before its load: the same check, the same answer
    // The check compares the load's own peak with the budget (refused: the lifetime peak, as
    // MeasureRun's load will see it too).
    (void)ResetPeakRssForMeasurement();
    auto engine = Engine::Load(p_.model_path, Options(g, b, depths_.front()));
    if (engine.ok()) return true;
    if (engine.status().code() == StatusCode::kResourceExhausted) {
      if (refusal_.empty()) refusal_ = engine.status().message();
      return false;
    }
    return engine.status();
  }

  // b_max(g) in [0, useful]: the largest B the engine accepts (0: none).
  Result<int> MaxBanks(int g, int useful) {
    ESTREAM_ASSIGN_OR_RETURN(bool all, Fits(g, useful));
    if (all) return useful;
    if (useful == 1) return 0;
    ESTREAM_ASSIGN_OR_RETURN(bool one, Fits(g, 1));
    if (!one) return 0;
    int lo = 1, hi = useful;  // fits(lo), !fits(hi)
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      ESTREAM_ASSIGN_OR_RETURN(bool fits, Fits(g, mid));
      (fits ? lo : hi) = mid;
    }
    return lo;
  }

  const SweepParams& p_;
  SweepResult r_;
  std::vector<int> depths_;
  int64_t budget_tokens_ = 0;
  std::string refusal_;  // the engine's first "does not fit" message (names the minimum budget)
};

Result<SweepResult> Sweeper::Run() {
  const Timer sweep_timer;
  if (p_.budget_bytes == 0) return Status::InvalidArgument("the sweep's budget must be positive");
  if (p_.repeat < 1) return Status::InvalidArgument("repeat must be >= 1");
  r_.model_path = p_.model_path;
  r_.budget_bytes = p_.budget_bytes;
  r_.repeat = p_.repeat;

  int n_expert = 0;
  {
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(p_.model_path));
    if (!io::IsPackedModel(*file))
      return Status::InvalidArgument(p_.model_path + ": not a packed model; run `estream pack " + p_.model_path +
                                     " -o MODEL.packed.gguf` first and sweep that");
    ESTREAM_ASSIGN_OR_RETURN(io::PackedModelInfo layout, io::ReadPackedLayout(*file));
    n_expert = layout.n_expert;
  }

  // ---- the grid ----
  std::vector<int> groups = p_.groups;
  if (groups.empty())
    for (int g : kGroupSizes)
      if (g <= n_expert) groups.push_back(g);
  for (int g : groups)
    if (g < 1 || g > n_expert)
      return Status::InvalidArgument(fmt::format("group size {} is larger than the {} experts per layer of {}", g,
                                                 n_expert, p_.model_path));
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  depths_ = p_.queue_depths;
  if (depths_.empty()) depths_.assign(std::begin(kQueueDepths), std::end(kQueueDepths));
  std::sort(depths_.begin(), depths_.end());
  depths_.erase(std::unique(depths_.begin(), depths_.end()), depths_.end());

  ESTREAM_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                           CalibrationTokens(p_.model_path, p_.calib_path, p_.calib_tokens));
  budget_tokens_ = p_.budget_tokens > 0 ? p_.budget_tokens : static_cast<int64_t>(tokens.size());
  if (budget_tokens_ < static_cast<int64_t>(tokens.size()))
    return Status::InvalidArgument(fmt::format("budget tokens {} is shorter than the {}-token calibration request",
                                               budget_tokens_, tokens.size()));
  r_.calib_tokens = static_cast<int64_t>(tokens.size());
  r_.budget_tokens = budget_tokens_;

  struct Point {
    int g, b, q;
  };
  std::vector<Point> points;
  bool none_fit = false;  // some smaller g fits no bank at all
  const Timer probe_timer;
  for (int g : groups) {
    const int useful = 2 * ((n_expert + g - 1) / g);
    std::set<int> banks(p_.banks.begin(), p_.banks.end());
    int b_max = INT32_MAX;
    if (banks.empty()) {
      // One bank of g experts does not fit when one of a smaller g did not: no load needed.
      if (none_fit) {
        b_max = 0;
      } else {
        ESTREAM_ASSIGN_OR_RETURN(b_max, MaxBanks(g, useful));
      }
      none_fit = b_max == 0;
      for (int b = 1; b <= useful; b *= 2) banks.insert(b);
      banks.insert(useful);
      if (b_max >= 1 && b_max < useful) banks.insert(b_max);
      Progress(fmt::format("G={}: b_max = {} (useful maximum {})", g, b_max > 0 ? std::to_string(b_max) : "none",
                           useful));
    }
    for (int b : banks)
      for (int q : depths_) {
        if (b > b_max) {
          ++r_.skipped;  // does not fit: known from the probes, not run
          continue;
        }
        points.push_back({g, b, q});
      }
  }
  r_.probe_seconds = probe_timer.Seconds();

  // ---- the runs ----
  bool told_refusal = false;
  bool told_cumulative = false;
  const Timer run_timer;
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    const std::string label = fmt::format("G={} B={} Q={}", p.g, p.b, p.q);
    auto run = MeasureRun(p_.model_path, Options(p.g, p.b, p.q), tokens, p_.repeat);
    std::string line = fmt::format("point {}/{} {}: ", i + 1, points.size(), label);
    if (!run.ok()) {
      if (run.status().code() != StatusCode::kResourceExhausted)
        return Status(run.status().code(), label + ": " + run.status().message());
      ++r_.skipped;
      if (refusal_.empty()) refusal_ = run.status().message();
      // The engine's reason once (it names what the configuration needs), then only the verdict.
      line += "skipped (does not fit the budget" + (told_refusal ? std::string() : ": " + run.status().message()) + ")";
      told_refusal = true;
    } else {
      SweepPoint m;
      m.group_size = p.g;
      m.banks = p.b;
      m.queue_depth = p.q;
      m.seconds = run->seconds;
      m.load_seconds = run->load_seconds;
      m.peak_rss_bytes = run->peak_rss_bytes;
      m.peak_rss_exact = run->peak_rss_exact;
      m.bubble_rate = run->response.bubble_rate;
      m.read_gbps = run->response.read_gbps;
      m.nonexpert_seconds = run->response.nonexpert_seconds;
      m.over_budget = m.peak_rss_exact && m.peak_rss_bytes > p_.budget_bytes;
      if (!m.peak_rss_exact && !told_cumulative) {
        Progress(CumulativePeakWarning());
        told_cumulative = true;
      }
      if (m.over_budget)
        Progress(fmt::format("warning: {} peaked at {}, over the budget {}", label, FormatBytes(m.peak_rss_bytes),
                             FormatBytes(p_.budget_bytes)));
      r_.results.push_back(m);
      line += fmt::format("{:.3f} s (load {:.2f} s, peak {}{})", m.seconds, m.load_seconds,
                          FormatBytes(m.peak_rss_bytes), m.peak_rss_exact ? "" : " cumulative");
    }
    const double per_point = run_timer.Seconds() / static_cast<double>(i + 1);
    line += ", ETA " + Duration(per_point * static_cast<double>(points.size() - i - 1));
    Progress(line);
  }

  if (r_.results.empty())
    return Status::ResourceExhausted("no configuration of the grid fits the budget " + FormatBytes(p_.budget_bytes) +
                                     (refusal_.empty() ? std::string() : ": " + refusal_));
  std::stable_sort(r_.results.begin(), r_.results.end(),
                   [](const SweepPoint& a, const SweepPoint& b) { return a.seconds < b.seconds; });
  for (size_t i = 0; i < r_.results.size(); ++i)
    if (!r_.results[i].over_budget) {
      r_.best = static_cast<int>(i);
      break;
    }
  r_.sweep_seconds = sweep_timer.Seconds();
  r_.peak_rss_exact = std::all_of(r_.results.begin(), r_.results.end(),
                                  [](const SweepPoint& m) { return m.peak_rss_exact; });
  return std::move(r_);
}

nlohmann::json PointJson(const SweepPoint& m) {
  nlohmann::json j = {{"group_size", m.group_size},     {"banks", m.banks},
                      {"queue_depth", m.queue_depth},   {"seconds", m.seconds},
                      {"load_seconds", m.load_seconds}, {"peak_rss_bytes", m.peak_rss_bytes},
                      {"bubble_rate", m.bubble_rate},   {"read_gbps", m.read_gbps},
                      {"nonexpert_seconds", m.nonexpert_seconds}, {"peak_rss_exact", m.peak_rss_exact}};
  if (m.over_budget) j["over_budget"] = true;
  return j;
}

}  // namespace

Result<SweepResult> Sweep(const SweepParams& params) { return Sweeper(params).Run(); }

std::string SweepJson(const SweepResult& r) {
  nlohmann::json j;
  j["model"] = r.model_path;
  j["budget_bytes"] = r.budget_bytes;
  j["calib_tokens"] = r.calib_tokens;
  j["budget_tokens"] = r.budget_tokens;
  j["repeat"] = r.repeat;
  j["sweep_seconds"] = r.sweep_seconds;
  j["probe_seconds"] = r.probe_seconds;
  j["probe_loads"] = r.probe_loads;
  j["results"] = nlohmann::json::array();
  for (const SweepPoint& m : r.results) j["results"].push_back(PointJson(m));
  j["best"] = r.best >= 0 ? PointJson(r.results[r.best]) : nlohmann::json(nullptr);
  j["skipped"] = r.skipped;
  j["peak_rss_exact"] = r.peak_rss_exact;
  return DumpJson(j, 2);
}

}  // namespace estream::profiler
