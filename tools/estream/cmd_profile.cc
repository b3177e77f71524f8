// estream profile MODEL --budget M: the auto-configurator (profiler::ProfileModel,
// src/profiler/profile_model.h, which documents the workflow). Flags -> profiler::ProfileModel ->
// the summary or the JSON (profiler::ProfileModelJson).
#include <cstdio>
#include <string>
#include <vector>

#include "profiler/profile_model.h"
#include "tools/estream/command.h"
#include "tools/estream/common_flags.h"

namespace estream::cli {
namespace {

class ProfileCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    model_.Setup(sub, "packed model (estream pack) to profile; the profile is stored in it");
    AddBudgetFlag(sub, &p_.budget_text, "memory budget of the whole process (bytes, or K/M/G suffix: 1500M)")
        ->required();
    sub->add_option("--calib", p_.calib_path, "calibration text file (default: built-in text of about 1K tokens)");
    sub->add_option("--calib-tokens", p_.calib_tokens, "tokens of the calibration request (default 1024)")
        ->check(PositiveInt());
    sub->add_option("--groups", p_.groups, "candidate group sizes, e.g. 1,2,4 (default 1,2,4,8,16 up to the experts "
                    "per layer)")->delimiter(',')->check(PositiveInt());
    sub->add_flag("--refresh-disk", p_.refresh_disk, "measure the disk again instead of using the per-device cache");
    sub->add_flag("--recalibrate", p_.recalibrate, "run the calibration again even if the model holds a profile");
    sub->add_flag("--report", p_.report, "run the chosen configuration and its neighbours end to end and print "
                  "predicted vs measured latency and peak RSS");
    sub->add_flag("--json", json_, "print one JSON object");
    AddThreadsFlag(sub, &p_.n_threads, "compute threads (default: one per CPU; use what prefill will use)");
    AddIoFlag(sub, &io_);
  }

  Result<int> Run() override {
    ESTREAM_ASSIGN_OR_RETURN(p_.model_path, model_.Resolve());
    ESTREAM_ASSIGN_OR_RETURN(p_.budget_bytes, ParseBudget(p_.budget_text));
    ESTREAM_ASSIGN_OR_RETURN(p_.io, ParseIoBackend(io_));
    p_.progress = ProgressPrinter(name());
    ESTREAM_ASSIGN_OR_RETURN(profiler::ProfileModelResult r, profiler::ProfileModel(p_));
    if (json_) {
      std::printf("%s\n", profiler::ProfileModelJson(r).c_str());
    } else {
      Print(r);
    }
    return 0;
  }

 private:
  static void Print(const profiler::ProfileModelResult& r) {
    const config::CandidatePrediction& best = r.selection.best;
    std::printf("model: %s (%s)\n", r.model_path.c_str(),
                r.calibrated ? "calibrated now; profile stored in the model" : "re-solved from the stored profile");
    if (r.calibrated)
      std::printf("  disk: %s in %.3f s; calibration: %zu runs of %u tokens in %.2f s\n", r.disk_source.c_str(),
                  r.disk_seconds, r.runs.size(), r.profile.calib_tokens, r.calibration_seconds);
    std::printf("  solve: %.3f ms (%d evaluations of the max-plus model)\n", r.solve_seconds * 1e3,
                r.selection.evaluations);
    std::printf("chosen: G=%d B=%d Q=%d (%s): predicted %.3f s for the calibration request (bubble %.3f s)\n",
                best.group_size, best.banks, best.queue_depth, ScheduleName(r.choice.schedule), best.predicted_s,
                best.wait_s);
    std::printf("  memory: arena %s + non-arena %s = %s of the %s budget (minimum budget %s, at G=%d)\n",
                FormatBytes(best.arena_bytes).c_str(), FormatBytes(best.total_bytes - best.arena_bytes).c_str(),
                FormatBytes(best.total_bytes).c_str(), FormatBytes(r.budget_bytes).c_str(),
                FormatBytes(r.minimum.bytes).c_str(), r.minimum.group_size);
    std::printf("  best B per (G, Q):");
    for (const config::CandidatePrediction& c : r.selection.per_group)
      std::printf("  G=%d B=%d Q=%d %.3f s", c.group_size, c.banks, c.queue_depth, c.predicted_s);
    std::printf("\n");
    std::printf("profile_seconds: %.3f (disk %.3f %s, calibration %.3f, solve %.6f, store %.3f)\n", r.profile_seconds,
                r.disk_seconds, r.disk_source.c_str(), r.calibration_seconds, r.solve_seconds, r.store_seconds);
    if (!r.has_report) return;
    std::printf("report (one end-to-end run each, this process):\n");
    std::printf("  %-9s %4s %4s %4s %12s %12s %8s %12s\n", "point", "G", "B", "Q", "predicted s", "measured s", "error",
                "peak RSS");
    for (const profiler::ReportPoint& rp : r.report) {
      const config::CandidatePrediction& c = rp.predicted;
      if (!rp.error.empty()) {
        std::printf("  %-9s %4d %4d %4d %12.3f   does not fit here: %s\n", rp.point.c_str(), c.group_size, c.banks,
                    c.queue_depth, c.predicted_s, rp.error.c_str());
        continue;
      }
      const char* verdict = rp.within_budget.value_or(true) ? "" : "  OVER BUDGET";
      std::printf("  %-9s %4d %4d %4d %12.3f %12.3f %+7.1f%% %12s%s%s\n", rp.point.c_str(), c.group_size, c.banks,
                  c.queue_depth, c.predicted_s, rp.seconds, 100 * (c.predicted_s / rp.seconds - 1),
                  FormatBytes(rp.peak_rss_bytes).c_str(), rp.peak_rss_exact ? "" : " (cumulative)", verdict);
    }
  }

  ModelArg model_;
  profiler::ProfileModelParams p_;
  std::string io_ = "uring";
  bool json_ = false;
};

ESTREAM_REGISTER_COMMAND(ProfileCommand, "profile",
                         "Auto-configure a packed model for a memory budget: measure the disk and the model once (stored in the "
                         "model), then choose group size, banks and queue depth (a new budget re-solves in milliseconds)");

}  // namespace
}  // namespace estream::cli
