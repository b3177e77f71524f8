// estream sweep MODEL --budget M: the exhaustive oracle of the auto-configurator (docs/DESIGN.md
// section 7, issue 8). Runs the calibration request end to end for every supported (G, B, Q)
// that fits the budget and reports the measured constrained minimum, against which the
// configurator's choice (`estream profile`) is judged (regret).
//
// Grid (also in --help): G in {1, 2, 4, 8, 16} capped at the experts per layer E; Q in
// {1, 2, 4, 8, 16, 32}; B in the powers of two up to the useful maximum U(G) = 2 * ceil(E / G)
// (two layers' worth of groups: more banks change nothing), U(G) itself, and b_max(G), the most
// banks the engine accepts under the budget, when that is smaller than U(G). b_max(G) is found by
// asking the engine itself (Engine::Load, which measures the dense part and refuses what does
// not fit) by bisection over B, a handful of loads per G; points with B > b_max(G) are skipped
// without running. --groups / --queue-depths / --banks restrict the grid (with --banks no b_max
// is added). A point the engine refuses at load (ResourceExhausted) is skipped and counted.
//
// Every run: a fresh engine in this process (profiler::MeasureRun: the process's peak RSS reset
// before the load), schedule early, budget_bytes = M, activations planned for the calibration
// prompt's length (--budget-tokens), top-1 only. A point whose peak RSS exceeds M is kept but
// marked over_budget (and a warning printed); the reported best is the fastest point within M.
//
// Peak RSS where the reset is refused (no /proc/self/clear_refs: profiler/measure.h): each
// point's figure is then the process's peak since it started, reported as such (JSON
// "peak_rss_exact": false, "(cumulative)" in the table and the progress lines) after a one-line
// warning. Such a figure within M proves the point was within M; one above M proves nothing, so
// an inexact point is never marked over_budget (the engine's own budget check at load still
// applies to it).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "base/memory.h"
#include "base/timer.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "io/packed_layout.h"
#include "profiler/calibration.h"
#include "profiler/measure.h"
#include "tools/estream/command.h"

namespace estream::cli {
namespace {

constexpr int kGroupSizes[] = {1, 2, 4, 8, 16};
constexpr int kQueueDepths[] = {1, 2, 4, 8, 16, 32};

constexpr char kGridHelp[] =
    "Grid: G in {1,2,4,8,16} (capped at the experts per layer E), Q in {1,2,4,8,16,32}, B in the powers of two up "
    "to U = 2*ceil(E/G) (more banks change nothing), U itself, and b_max(G) (the most banks that fit the budget, "
    "found by asking the engine) when smaller than U. Points that do not fit the budget are skipped and counted. "
    "Every point runs the calibration request end to end in a fresh engine (schedule early, top-1); the table is "
    "sorted by time and the best is the fastest point whose peak RSS is within the budget.";

struct Point {
  int g = 0, b = 0, q = 0;
};

struct Measured {
  Point p;
  double seconds = 0, load_seconds = 0, bubble_rate = 0, read_gbps = 0;
  uint64_t peak_rss_bytes = 0;
  bool peak_rss_exact = true;  // false: the process's peak since it started (see the top)
  bool over_budget = false;
};

std::string Mib(uint64_t bytes) { return FormatBytes(bytes); }

std::string Duration(double s) {
  if (s < 90) return std::to_string(static_cast<int>(std::lround(s))) + " s";
  if (s < 5400) return std::to_string(static_cast<int>(std::lround(s / 60))) + " min";
  return std::to_string(static_cast<int>(std::lround(s / 3600))) + " h";
}

class SweepCommand : public Command {
 public:
  const char* name() const override { return "sweep"; }
  const char* help() const override {
    return "Exhaustive oracle of the configurator: run the calibration request end to end for every group size, "
           "bank count and queue depth that fits --budget and report the measured fastest";
  }

  void Setup(CLI::App* sub) override {
    sub->add_option("model,-m,--model", model_, "packed model (estream pack)")->required();
    sub->add_option("--budget", budget_, "memory budget of the whole process (bytes, or K/M/G suffix: 1500M)")
        ->required();
    sub->add_option("--groups", groups_, "restrict G to these group sizes, e.g. 2,4")
        ->delimiter(',')->check(CLI::PositiveNumber);
    sub->add_option("--queue-depths", depths_, "restrict Q to these queue depths, e.g. 4,8")
        ->delimiter(',')->check(CLI::PositiveNumber);
    sub->add_option("--banks", banks_, "restrict B to these bank counts, e.g. 2,4,8 (no b_max search)")
        ->delimiter(',')->check(CLI::PositiveNumber);
    sub->add_option("--calib", calib_, "calibration text file (default: built-in text of about 1K tokens)");
    sub->add_option("--calib-tokens", calib_tokens_, "tokens of the calibration request (default 1024)")
        ->check(CLI::PositiveNumber);
    sub->add_option("--budget-tokens", budget_tokens_,
                    "longest prompt the budget plans activations for (default: the calibration request's length)")
        ->check(CLI::PositiveNumber);
    sub->add_option("-t,--threads", threads_, "compute threads (default: one per CPU)")->check(CLI::NonNegativeNumber);
    sub->add_option("--repeat", repeat_, "runs per point (model loaded once); the median is reported (default 1)")
        ->check(CLI::PositiveNumber);
    sub->add_option("--io", io_, "read backend: uring (default; pread when unavailable), pread")
        ->check(CLI::IsMember({"uring", "pread"}));
    sub->add_flag("--json", json_, "print one JSON object");
    sub->footer(kGridHelp);
  }

  int Run() override {
    Result<int> r = RunImpl();
    if (!r.ok()) return ReportError(name(), r.status());
    return *r;
  }

 private:
  void Progress(const std::string& line) const {
    std::fprintf(stderr, "estream sweep: %s\n", line.c_str());
    std::fflush(stderr);
  }

  EngineOptions Options(const Point& p) const {
    EngineOptions o;
    o.n_threads = threads_;
    o.budget_bytes = budget_bytes_;
    o.group_size = p.g;
    o.banks = p.b;
    o.queue_depth = p.q;
    o.schedule = EngineOptions::Schedule::kEarly;
    o.io = io_ == "pread" ? EngineOptions::Io::kPread : EngineOptions::Io::kAuto;
    o.budget_tokens = budget_tokens_;
    return o;
  }

  // Whether the engine accepts (G, B) under the budget: a load that stops at its budget check
  // (the dense part is loaded and measured first). Queue depth does not enter the check.
  Result<bool> Fits(int g, int b) {
    ++probe_loads_;
    profiler::ReleaseFreedMemory();  // as MeasureRun does before its load: the same check, the same answer
    // The check compares the load's own peak with the budget (refused: the lifetime peak, as
    // MeasureRun's load will see it too).
    (void)profiler::ResetPeakRssForMeasurement();
    auto engine = Engine::Load(model_, Options({g, b, depths_.front()}));
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

  Result<int> RunImpl() {
    const Timer sweep_timer;
    ESTREAM_ASSIGN_OR_RETURN(budget_bytes_, ParseSize(budget_));
    if (budget_bytes_ == 0) return Status::InvalidArgument("--budget must be positive");
    if (repeat_ < 1) return Status::InvalidArgument("--repeat must be >= 1");

    int n_expert = 0;
    {
      auto file = GgufFile::Open(model_);
      if (!file.ok()) return file.status();
      if (!io::IsPackedModel(**file))
        return Status::InvalidArgument(model_ + ": not a packed model; run `estream pack " + model_ +
                                       " -o MODEL.packed.gguf` first and sweep that");
      ESTREAM_ASSIGN_OR_RETURN(io::PackedModelInfo layout, io::ReadPackedLayout(**file));
      n_expert = layout.n_expert;
    }

    // ---- the grid ----
    std::vector<int> groups = groups_;
    if (groups.empty())
      for (int g : kGroupSizes)
        if (g <= n_expert) groups.push_back(g);
    for (int g : groups)
      if (g > n_expert)
        return Status::InvalidArgument("--groups: group size " + std::to_string(g) + " is larger than the " +
                                       std::to_string(n_expert) + " experts per layer of " + model_);
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    if (depths_.empty()) depths_.assign(std::begin(kQueueDepths), std::end(kQueueDepths));
    std::sort(depths_.begin(), depths_.end());
    depths_.erase(std::unique(depths_.begin(), depths_.end()), depths_.end());

    ESTREAM_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, profiler::CalibrationTokens(model_, calib_, calib_tokens_));
    if (budget_tokens_ == 0) budget_tokens_ = static_cast<int64_t>(tokens.size());
    if (budget_tokens_ < static_cast<int64_t>(tokens.size()))
      return Status::InvalidArgument("--budget-tokens " + std::to_string(budget_tokens_) + " is shorter than the " +
                                     std::to_string(tokens.size()) + "-token calibration request");

    std::vector<Point> points;
    int skipped = 0;
    bool none_fit = false;  // some smaller g fits no bank at all
    const Timer probe_timer;
    for (int g : groups) {
      const int useful = 2 * ((n_expert + g - 1) / g);
      std::set<int> banks(banks_.begin(), banks_.end());
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
        Progress("G=" + std::to_string(g) + ": b_max = " + (b_max > 0 ? std::to_string(b_max) : "none") +
                 " (useful maximum " + std::to_string(useful) + ")");
      }
      for (int b : banks)
        for (int q : depths_) {
          if (b > b_max) {
            ++skipped;  // does not fit: known from the probes, not run
            continue;
          }
          points.push_back({g, b, q});
        }
    }
    const double probe_seconds = probe_timer.Seconds();

    // ---- the runs ----
    std::vector<Measured> results;
    bool told_refusal = false;
    bool told_cumulative = false;
    const Timer run_timer;
    for (size_t i = 0; i < points.size(); ++i) {
      const Point& p = points[i];
      const std::string label = "G=" + std::to_string(p.g) + " B=" + std::to_string(p.b) + " Q=" + std::to_string(p.q);
      auto r = profiler::MeasureRun(model_, Options(p), tokens, repeat_);
      std::string line = "point " + std::to_string(i + 1) + "/" + std::to_string(points.size()) + " " + label + ": ";
      if (!r.ok()) {
        if (r.status().code() != StatusCode::kResourceExhausted)
          return Status(r.status().code(), label + ": " + r.status().message());
        ++skipped;
        if (refusal_.empty()) refusal_ = r.status().message();
        // The engine's reason once (it names what the configuration needs), then only the verdict.
        line += "skipped (does not fit the budget" + (told_refusal ? std::string() : ": " + r.status().message()) + ")";
        told_refusal = true;
      } else {
        Measured m;
        m.p = p;
        m.seconds = r->seconds;
        m.load_seconds = r->load_seconds;
        m.peak_rss_bytes = r->peak_rss_bytes;
        m.peak_rss_exact = r->peak_rss_exact;
        m.bubble_rate = r->response.bubble_rate;
        m.read_gbps = r->response.read_gbps;
        m.over_budget = m.peak_rss_exact && m.peak_rss_bytes > budget_bytes_;
        if (!m.peak_rss_exact && !told_cumulative) {
          Progress(profiler::CumulativePeakWarning());
          told_cumulative = true;
        }
        if (m.over_budget)
          std::fprintf(stderr, "estream sweep: warning: %s peaked at %s, over the budget %s\n", label.c_str(),
                       Mib(m.peak_rss_bytes).c_str(), Mib(budget_bytes_).c_str());
        results.push_back(m);
        char buf[128];
        std::snprintf(buf, sizeof(buf), "%.3f s (load %.2f s, peak %s%s)", m.seconds, m.load_seconds,
                      Mib(m.peak_rss_bytes).c_str(), m.peak_rss_exact ? "" : " cumulative");
        line += buf;
      }
      const double per_point = run_timer.Seconds() / static_cast<double>(i + 1);
      line += ", ETA " + Duration(per_point * static_cast<double>(points.size() - i - 1));
      Progress(line);
    }

    if (results.empty())
      return Status::ResourceExhausted("no configuration of the grid fits the budget " + Mib(budget_bytes_) +
                                       (refusal_.empty() ? std::string() : ": " + refusal_));
    std::stable_sort(results.begin(), results.end(),
                     [](const Measured& a, const Measured& b) { return a.seconds < b.seconds; });
    const Measured* best = nullptr;
    for (const Measured& m : results)
      if (!m.over_budget) {
        best = &m;
        break;
      }
    const double sweep_seconds = sweep_timer.Seconds();
    const bool all_exact =
        std::all_of(results.begin(), results.end(), [](const Measured& m) { return m.peak_rss_exact; });

    if (json_) {
      auto point_json = [](const Measured& m) {
        nlohmann::json j = {{"group_size", m.p.g},       {"banks", m.p.b},
                            {"queue_depth", m.p.q},      {"seconds", m.seconds},
                            {"load_seconds", m.load_seconds}, {"peak_rss_bytes", m.peak_rss_bytes},
                            {"bubble_rate", m.bubble_rate},   {"read_gbps", m.read_gbps},
                            {"peak_rss_exact", m.peak_rss_exact}};
        if (m.over_budget) j["over_budget"] = true;
        return j;
      };
      nlohmann::json j;
      j["model"] = model_;
      j["budget_bytes"] = budget_bytes_;
      j["calib_tokens"] = tokens.size();
      j["budget_tokens"] = budget_tokens_;
      j["repeat"] = repeat_;
      j["sweep_seconds"] = sweep_seconds;
      j["probe_seconds"] = probe_seconds;
      j["probe_loads"] = probe_loads_;
      j["results"] = nlohmann::json::array();
      for (const Measured& m : results) j["results"].push_back(point_json(m));
      j["best"] = best != nullptr ? point_json(*best) : nlohmann::json(nullptr);
      j["skipped"] = skipped;
      j["peak_rss_exact"] = all_exact;
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("%s: budget %s, %zu calibration tokens, %zu points run, %d skipped (do not fit), sweep %.1f s "
                  "(b_max search %.1f s, %d loads)\n",
                  model_.c_str(), Mib(budget_bytes_).c_str(), tokens.size(), results.size(), skipped, sweep_seconds,
                  probe_seconds, probe_loads_);
      std::printf("    %3s %5s %4s %10s %8s %12s%s %7s %9s\n", "G", "B", "Q", "seconds", "load s", "peak RSS",
                  all_exact ? "" : "             ", "bubble", "read GB/s");
      for (const Measured& m : results) {
        const char* mark = &m == best ? "*" : m.over_budget ? "!" : " ";
        // Inexact peaks carry the mark right after the figure (padded where others do not).
        const char* cumulative = m.peak_rss_exact ? (all_exact ? "" : "             ") : " (cumulative)";
        std::printf("  %s %3d %5d %4d %10.4f %8.2f %12s%s %6.1f%% %9.2f\n", mark, m.p.g, m.p.b, m.p.q, m.seconds,
                    m.load_seconds, Mib(m.peak_rss_bytes).c_str(), cumulative, 100 * m.bubble_rate, m.read_gbps);
      }
      if (best != nullptr)
        std::printf("best (*): G=%d B=%d Q=%d, %.4f s, peak RSS %s%s%s\n", best->p.g, best->p.b, best->p.q,
                    best->seconds, Mib(best->peak_rss_bytes).c_str(), best->peak_rss_exact ? "" : " (cumulative)",
                    std::any_of(results.begin(), results.end(), [](const Measured& m) { return m.over_budget; })
                        ? "; ! = peak RSS over the budget"
                        : "");
    }
    if (best == nullptr) {
      return Status::ResourceExhausted("every point that ran peaked above the budget " + Mib(budget_bytes_) +
                                       ": no measured minimum within it");
    }
    return 0;
  }

  std::string model_, budget_, calib_, io_ = "uring";
  std::vector<int> groups_, depths_, banks_;
  int calib_tokens_ = profiler::kDefaultCalibrationTokens;
  int64_t budget_tokens_ = 0;
  int threads_ = 0;
  int repeat_ = 1;
  bool json_ = false;
  uint64_t budget_bytes_ = 0;
  int probe_loads_ = 0;
  std::string refusal_;  // the engine's first "does not fit" message (names the minimum budget)
};

}  // namespace

ESTREAM_REGISTER_COMMAND(SweepCommand);

}  // namespace estream::cli
