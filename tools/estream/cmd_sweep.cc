// estream sweep MODEL --budget M: the exhaustive oracle of the auto-configurator
// (profiler::Sweep, src/profiler/sweep.h, which documents the grid and the measurements).
// Flags -> profiler::Sweep -> the table or the JSON (profiler::SweepJson).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "profiler/sweep.h"
#include "tools/estream/command.h"
#include "tools/estream/common_flags.h"

namespace estream::cli {
namespace {

class SweepCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    model_.Setup(sub, "packed model (estream pack)");
    AddBudgetFlag(sub, &budget_, "memory budget of the whole process (bytes, or K/M/G suffix: 1500M)")->required();
    sub->add_option("--groups", p_.groups, "restrict G to these group sizes, e.g. 2,4")
        ->delimiter(',')->check(PositiveInt());
    sub->add_option("--queue-depths", p_.queue_depths, "restrict Q to these queue depths, e.g. 4,8")
        ->delimiter(',')->check(PositiveInt());
    sub->add_option("--banks", p_.banks, "restrict B to these bank counts, e.g. 2,4,8 (no b_max search)")
        ->delimiter(',')->check(PositiveInt());
    sub->add_option("--calib", p_.calib_path, "calibration text file (default: built-in text of about 1K tokens)");
    sub->add_option("--calib-tokens", p_.calib_tokens, "tokens of the calibration request (default 1024)")
        ->check(PositiveInt());
    sub->add_option("--budget-tokens", p_.budget_tokens,
                    "longest prompt the budget plans activations for (default: the calibration request's length)")
        ->check(PositiveInt());
    AddThreadsFlag(sub, &p_.n_threads);
    sub->add_option("--repeat", p_.repeat, "runs per point (model loaded once); the median is reported (default 1)")
        ->check(PositiveInt());
    AddIoFlag(sub, &io_);
    sub->add_flag("--json", json_, "print one JSON object");
    sub->footer(profiler::kSweepGridHelp);
  }

  Result<int> Run() override {
    ESTREAM_ASSIGN_OR_RETURN(p_.model_path, model_.Resolve());
    ESTREAM_ASSIGN_OR_RETURN(p_.budget_bytes, ParseBudget(budget_));
    ESTREAM_ASSIGN_OR_RETURN(p_.io, ParseIoBackend(io_));
    p_.progress = ProgressPrinter(name());
    ESTREAM_ASSIGN_OR_RETURN(profiler::SweepResult r, profiler::Sweep(p_));
    if (json_) {
      std::printf("%s\n", profiler::SweepJson(r).c_str());
    } else {
      PrintTable(r);
    }
    if (r.best < 0)
      return Status::ResourceExhausted("every point that ran peaked above the budget " + FormatBytes(r.budget_bytes) +
                                       ": no measured minimum within it");
    return 0;
  }

 private:
  static void PrintTable(const profiler::SweepResult& r) {
    const bool all_exact = r.peak_rss_exact;
    std::printf("%s: budget %s, %lld calibration tokens, %zu points run, %d skipped (do not fit), sweep %.1f s "
                "(b_max search %.1f s, %d loads)\n",
                r.model_path.c_str(), FormatBytes(r.budget_bytes).c_str(), static_cast<long long>(r.calib_tokens),
                r.results.size(), r.skipped, r.sweep_seconds, r.probe_seconds, r.probe_loads);
    std::printf("    %3s %5s %4s %10s %8s %12s%s %7s %9s\n", "G", "B", "Q", "seconds", "load s", "peak RSS",
                all_exact ? "" : "             ", "bubble", "read GB/s");
    for (size_t i = 0; i < r.results.size(); ++i) {
      const profiler::SweepPoint& m = r.results[i];
      const char* mark = static_cast<int>(i) == r.best ? "*" : m.over_budget ? "!" : " ";
      // Inexact peaks carry the mark right after the figure (padded where others do not).
      const char* cumulative = m.peak_rss_exact ? (all_exact ? "" : "             ") : " (cumulative)";
      std::printf("  %s %3d %5d %4d %10.4f %8.2f %12s%s %6.1f%% %9.2f\n", mark, m.group_size, m.banks, m.queue_depth,
                  m.seconds, m.load_seconds, FormatBytes(m.peak_rss_bytes).c_str(), cumulative, 100 * m.bubble_rate,
                  m.read_gbps);
    }
    if (r.best >= 0) {
      const profiler::SweepPoint& b = r.results[r.best];
      std::printf("best (*): G=%d B=%d Q=%d, %.4f s, peak RSS %s%s%s\n", b.group_size, b.banks, b.queue_depth,
                  b.seconds, FormatBytes(b.peak_rss_bytes).c_str(), b.peak_rss_exact ? "" : " (cumulative)",
                  std::any_of(r.results.begin(), r.results.end(),
                              [](const profiler::SweepPoint& m) { return m.over_budget; })
                      ? "; ! = peak RSS over the budget"
                      : "");
    }
  }

  ModelArg model_;
  profiler::SweepParams p_;
  std::string budget_, io_ = "uring";
  bool json_ = false;
};

}  // namespace

ESTREAM_REGISTER_COMMAND(SweepCommand, "sweep",
                         "Exhaustive oracle of the configurator: run the calibration request end to end for every group size, "
                         "bank count and queue depth that fits --budget and report the measured fastest");

}  // namespace estream::cli
