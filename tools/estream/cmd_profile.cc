// estream profile MODEL --budget M: the auto-configurator (docs/DESIGN.md section 7, issue 8).
//
// First time on a packed model: characterise the disk (cached per device), run one calibration
// request per candidate group size, select (G, Q, B) for the budget with the max-plus model, and
// store the profile and the choice in the model (estream.profile.*, estream.config.*; in place).
// When the model already holds a profile (and --recalibrate is not given) it only re-solves for
// the new budget from the stored profile, in milliseconds, and stores the new choice.
// `estream prefill --budget M` then uses the stored choice, or re-solves from the profile.
// The profile and the choice record the compute threads the calibration ran with; a re-solve
// with another -t uses the stored profile all the same and says so in one line on stderr.
// --report: where the peak RSS cannot be reset (profiler/measure.h) each point's peak is the
// process's since it started, marked (JSON "peak_rss_exact": false, "(cumulative)") after a
// one-line warning, and within_budget is then only judged when that figure is within the budget
// (above it: null, not known).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "base/timer.h"
#include "config/configurator.h"
#include "config/profile.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "io/packed_layout.h"
#include "profiler/calibrate.h"
#include "profiler/calibration.h"
#include "profiler/disk.h"
#include "profiler/measure.h"
#include "tools/estream/command.h"

namespace estream::cli {
namespace {

class ProfileCommand : public Command {
 public:
  const char* name() const override { return "profile"; }
  const char* help() const override {
    return "Auto-configure a packed model for a memory budget: measure the disk and the model once (stored in the "
           "model), then choose group size, banks and queue depth (a new budget re-solves in milliseconds)";
  }

  void Setup(CLI::App* sub) override {
    sub->add_option("model,-m,--model", model_, "packed model (estream pack); the profile is stored in it")
        ->required();
    sub->add_option("--budget", budget_, "memory budget of the whole process (bytes, or K/M/G suffix: 1500M)")
        ->required();
    sub->add_option("--calib", calib_, "calibration text file (default: built-in text of about 1K tokens)");
    sub->add_option("--calib-tokens", calib_tokens_, "tokens of the calibration request (default 1024)")
        ->check(CLI::PositiveNumber);
    sub->add_option("--groups", groups_, "candidate group sizes, e.g. 1,2,4 (default 1,2,4,8,16 up to the experts "
                    "per layer)")->delimiter(',')->check(CLI::PositiveNumber);
    sub->add_flag("--refresh-disk", refresh_disk_, "measure the disk again instead of using the per-device cache");
    sub->add_flag("--recalibrate", recalibrate_, "run the calibration again even if the model holds a profile");
    sub->add_flag("--report", report_, "run the chosen configuration and its neighbours end to end and print "
                  "predicted vs measured latency and peak RSS");
    sub->add_flag("--json", json_, "print one JSON object");
    sub->add_option("-t,--threads", threads_, "compute threads (default: one per CPU; use what prefill will use)")
        ->check(CLI::NonNegativeNumber);
    sub->add_option("--io", io_, "read backend: uring (default; pread when unavailable), pread")
        ->check(CLI::IsMember({"uring", "pread"}));
  }

  int Run() override {
    Result<int> r = RunImpl();
    if (!r.ok()) return ReportError(name(), r.status());
    return *r;
  }

 private:
  void Progress(const std::string& line) const {
    std::fprintf(stderr, "estream profile: %s\n", line.c_str());
    std::fflush(stderr);
  }

  Result<int> RunImpl() {
    const Timer total;
    ESTREAM_ASSIGN_OR_RETURN(uint64_t budget, ParseSize(budget_));
    if (budget == 0) return Status::InvalidArgument("--budget must be positive");
    config::Profile profile;
    bool calibrated = false;
    double disk_s = 0, calib_s = 0;
    std::string disk_source = "stored profile";
    std::vector<profiler::CalibrationRunInfo> runs;
    {
      ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> header, GgufFile::Open(model_, {.mmap = false}));
      if (!io::IsPackedModel(*header))
        return Status::InvalidArgument(model_ + ": not a packed model: run 'estream pack " + model_ +
                                       " -o MODEL.packed.gguf' and profile that file");
      ESTREAM_ASSIGN_OR_RETURN(io::PackedModelInfo layout, io::ReadPackedLayout(*header));
      if (config::HasProfile(header->kvs()) && !recalibrate_) {
        Result<config::Profile> stored = config::ParseProfile(header->kvs(), model_);
        if (!stored.ok())
          return Status(stored.status().code(), stored.status().message() + " (run with --recalibrate to replace it)");
        profile = std::move(*stored);
        const std::string note = config::ThreadMismatchNote(profile.n_threads, profiler::ResolveThreadCount(threads_),
                                                            model_, budget_);
        if (!note.empty()) Progress(note);
        if (!calib_.empty() || refresh_disk_ || calib_tokens_ != profiler::kDefaultCalibrationTokens)
          Progress("note: the model holds a profile: --calib/--calib-tokens/--refresh-disk apply with --recalibrate");
        for (int g : groups_)
          if (profile.Run(g) == nullptr)
            return Status::InvalidArgument("--groups " + std::to_string(g) + ": the stored profile has no run for it; "
                                           "add --recalibrate to calibrate it");
      } else {
        const std::vector<int> sizes = groups_.empty() ? profiler::DefaultGroupSizes(layout.n_expert) : groups_;
        for (int g : sizes)
          if (g > layout.n_expert)
            return Status::InvalidArgument("--groups " + std::to_string(g) + ": the model has only " +
                                           std::to_string(layout.n_expert) + " experts per layer");
        profiler::DiskParams dp;
        dp.group_sizes = sizes;
        dp.backend = io_ == "pread" ? io::IoBackend::kPread : io::IoBackend::kAuto;
        dp.progress = [this](const std::string& l) { Progress(l); };
        ESTREAM_ASSIGN_OR_RETURN(profiler::DiskResult disk, profiler::CharacteriseDisk(layout, dp, refresh_disk_));
        if (!disk.warning.empty()) Progress("warning: " + disk.warning);
        disk_s = disk.seconds;
        disk_source = disk.cached ? "cached" : "measured";
        if (disk.cached) Progress("disk: from the cache " + disk.cache_path + " (--refresh-disk measures again)");
        ESTREAM_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                                 profiler::CalibrationTokens(model_, calib_, calib_tokens_));
        profiler::CalibrateParams cp;
        cp.tokens = std::move(tokens);
        cp.group_sizes = sizes;
        cp.n_threads = threads_;
        cp.budget_bytes = budget;
        cp.io = io_ == "pread" ? EngineOptions::Io::kPread : EngineOptions::Io::kAuto;
        cp.progress = dp.progress;
        header.reset();
        ESTREAM_ASSIGN_OR_RETURN(profiler::CalibrationResult cal, profiler::Calibrate(model_, disk.profile, cp));
        calib_s = cal.seconds;
        profile = std::move(cal.profile);
        runs = std::move(cal.runs);
        calibrated = true;
      }
    }

    // Selection.
    const Timer solve_timer;
    config::SelectParams sp{.budget_bytes = budget, .group_sizes = groups_};
    Result<config::Selection> sel = config::SelectConfig(profile, sp);
    const double solve_s = solve_timer.Seconds();
    const config::MinimumBudgetInfo minimum = config::MinimumBudget(profile, groups_);
    const Timer store_timer;
    if (!sel.ok()) {
      if (calibrated) {
        // Keep what was measured: the next budget re-solves without running the model.
        ESTREAM_RETURN_IF_ERROR(profiler::StoreInModel(model_, &profile, nullptr,
                                                       [this](const std::string& l) { Progress(l); }));
        return Status(sel.status().code(), sel.status().message() + " (the profile was stored in the model: another "
                                                                    "--budget re-solves in milliseconds)");
      }
      return sel.status();
    }
    config::ConfigChoice choice = config::ToConfigChoice(*sel, sp);
    choice.n_threads = profile.n_threads;  // the timings it was solved from
    ESTREAM_RETURN_IF_ERROR(profiler::StoreInModel(model_, calibrated ? &profile : nullptr, &choice,
                                                   [this](const std::string& l) { Progress(l); }));
    const double store_s = store_timer.Seconds();
    const double profile_s = total.Seconds();

    nlohmann::json report = nlohmann::json::array();
    if (report_) ESTREAM_RETURN_IF_ERROR(Report(profile, *sel, budget, &report));

    const config::CandidatePrediction& best = sel->best;
    if (json_) {
      nlohmann::json j;
      j["model"] = model_;
      j["group_size"] = best.group_size;
      j["banks"] = best.banks;
      j["queue_depth"] = best.queue_depth;
      j["schedule"] = config::ScheduleName(choice.schedule);
      j["predicted_seconds"] = best.predicted_s;
      j["predicted_bubble_seconds"] = best.wait_s;
      j["arena_bytes"] = best.arena_bytes;
      j["predicted_memory_bytes"] = best.total_bytes;
      j["budget_bytes"] = budget;
      j["minimum_budget_bytes"] = minimum.bytes;
      j["minimum_budget_group_size"] = minimum.group_size;
      j["profile_seconds"] = profile_s;
      j["disk"] = disk_source;
      j["disk_seconds"] = disk_s;
      j["calibration_seconds"] = calib_s;
      j["solve_seconds"] = solve_s;
      j["store_seconds"] = store_s;
      j["source"] = calibrated ? "calibrated" : "stored profile";
      j["calib_tokens"] = profile.calib_tokens;
      j["threads"] = profiler::ResolveThreadCount(threads_);
      if (profile.n_threads > 0) j["profile_threads"] = profile.n_threads;
      else j["profile_threads"] = nullptr;  // a profile stored before the count was recorded
      j["evaluations"] = sel->evaluations;
      nlohmann::json per = nlohmann::json::array();
      for (const config::CandidatePrediction& c : sel->per_group)
        per.push_back({{"group_size", c.group_size}, {"queue_depth", c.queue_depth}, {"banks", c.banks},
                       {"predicted_seconds", c.predicted_s}, {"memory_bytes", c.total_bytes}});
      j["per_group"] = per;
      if (calibrated) {
        nlohmann::json rj = nlohmann::json::array();
        for (const profiler::CalibrationRunInfo& r : runs)
          rj.push_back({{"group_size", r.group_size}, {"banks", r.banks}, {"queue_depth", r.queue_depth},
                        {"seconds", r.seconds}, {"load_seconds", r.load_seconds}, {"peak_rss_bytes", r.peak_rss_bytes},
                        {"other_bytes", r.other_bytes}, {"bubble_rate", r.bubble_rate},
                        {"load_samples", r.load_samples}, {"exec_samples", r.exec_samples}});
        j["calibration_runs"] = rj;
      }
      if (report_) j["report"] = report;
      std::printf("%s\n", j.dump().c_str());
      return 0;
    }
    std::printf("model: %s (%s)\n", model_.c_str(),
                calibrated ? "calibrated now; profile stored in the model" : "re-solved from the stored profile");
    if (calibrated)
      std::printf("  disk: %s in %.3f s; calibration: %zu runs of %u tokens in %.2f s\n", disk_source.c_str(), disk_s,
                  runs.size(), profile.calib_tokens, calib_s);
    std::printf("  solve: %.3f ms (%d evaluations of the max-plus model)\n", solve_s * 1e3, sel->evaluations);
    std::printf("chosen: G=%d B=%d Q=%d (%s): predicted %.3f s for the calibration request (bubble %.3f s)\n",
                best.group_size, best.banks, best.queue_depth, config::ScheduleName(choice.schedule), best.predicted_s,
                best.wait_s);
    std::printf("  memory: arena %s + non-arena %s = %s of the %s budget (minimum budget %s, at G=%d)\n",
                FormatBytes(best.arena_bytes).c_str(), FormatBytes(best.total_bytes - best.arena_bytes).c_str(),
                FormatBytes(best.total_bytes).c_str(), FormatBytes(budget).c_str(), FormatBytes(minimum.bytes).c_str(),
                minimum.group_size);
    std::printf("  best B per (G, Q):");
    for (const config::CandidatePrediction& c : sel->per_group)
      std::printf("  G=%d B=%d Q=%d %.3f s", c.group_size, c.banks, c.queue_depth, c.predicted_s);
    std::printf("\n");
    std::printf("profile_seconds: %.3f (disk %.3f %s, calibration %.3f, solve %.6f, store %.3f)\n", profile_s, disk_s,
                disk_source.c_str(), calib_s, solve_s, store_s);
    if (report_) {
      std::printf("report (one end-to-end run each, this process):\n");
      std::printf("  %-9s %4s %4s %4s %12s %12s %8s %12s\n", "point", "G", "B", "Q", "predicted s", "measured s", "error",
                  "peak RSS");
      for (const nlohmann::json& r : report) {
        if (r.contains("error")) {
          std::printf("  %-9s %4d %4d %4d %12.3f   does not fit here: %s\n", r["point"].get<std::string>().c_str(),
                      r["group_size"].get<int>(), r["banks"].get<int>(), r["queue_depth"].get<int>(),
                      r["predicted_seconds"].get<double>(), r["error"].get<std::string>().c_str());
          continue;
        }
        const bool exact = r["peak_rss_exact"].get<bool>();
        const char* verdict = r["within_budget"].is_null()          ? ""
                              : r["within_budget"].get<bool>() ? ""
                                                               : "  OVER BUDGET";
        std::printf("  %-9s %4d %4d %4d %12.3f %12.3f %+7.1f%% %12s%s%s\n", r["point"].get<std::string>().c_str(),
                    r["group_size"].get<int>(), r["banks"].get<int>(), r["queue_depth"].get<int>(),
                    r["predicted_seconds"].get<double>(), r["seconds"].get<double>(),
                    100 * (r["predicted_seconds"].get<double>() / r["seconds"].get<double>() - 1),
                    FormatBytes(r["peak_rss_bytes"].get<uint64_t>()).c_str(), exact ? "" : " (cumulative)", verdict);
      }
    }
    return 0;
  }

  // Runs the chosen point and its neighbours end to end (profiler::MeasureRun).
  Status Report(const config::Profile& profile, const config::Selection& sel, uint64_t budget, nlohmann::json* out) {
    ESTREAM_ASSIGN_OR_RETURN(std::vector<int32_t>tokens,
                             profiler::CalibrationTokens(model_, calib_, static_cast<int>(profile.calib_tokens)));
    std::vector<std::pair<std::string, config::CandidatePrediction>> points{{"chosen", sel.best}};
    for (const config::CandidatePrediction& n : sel.neighbours) points.emplace_back("neighbour", n);
    bool told_cumulative = false;
    for (size_t i = 0; i < points.size(); ++i) {
      const config::CandidatePrediction& c = points[i].second;
      EngineOptions eo{.n_threads = threads_};
      eo.budget_bytes = budget;
      eo.group_size = c.group_size;
      eo.banks = c.banks;
      eo.queue_depth = c.queue_depth;
      eo.io = io_ == "pread" ? EngineOptions::Io::kPread : EngineOptions::Io::kAuto;
      eo.budget_tokens = static_cast<int64_t>(tokens.size());
      Progress("report " + std::to_string(i + 1) + "/" + std::to_string(points.size()) + ": G=" +
               std::to_string(c.group_size) + " B=" + std::to_string(c.banks) + " Q=" + std::to_string(c.queue_depth));
      Result<profiler::RunResult> run = profiler::MeasureRun(model_, eo, tokens, 1);
      if (!run.ok()) {
        // A neighbour (one bank more) may not fit this process's own budget check: report it, do
        // not fail the command (the choice is already stored).
        if (run.status().code() != StatusCode::kResourceExhausted) return run.status();
        out->push_back({{"point", points[i].first}, {"group_size", c.group_size}, {"banks", c.banks},
                        {"queue_depth", c.queue_depth}, {"predicted_seconds", c.predicted_s},
                        {"predicted_memory_bytes", c.total_bytes}, {"error", run.status().message()}});
        continue;
      }
      const profiler::RunResult& r = *run;
      if (!r.peak_rss_exact && !told_cumulative) {
        Progress(profiler::CumulativePeakWarning());
        told_cumulative = true;
      }
      // A cumulative peak within the budget proves the run was; above it, it proves nothing.
      const bool within = r.peak_rss_bytes <= budget;
      out->push_back({{"point", points[i].first}, {"group_size", c.group_size}, {"banks", c.banks},
                      {"queue_depth", c.queue_depth}, {"predicted_seconds", c.predicted_s}, {"seconds", r.seconds},
                      {"peak_rss_bytes", r.peak_rss_bytes}, {"peak_rss_exact", r.peak_rss_exact},
                      {"predicted_memory_bytes", c.total_bytes}, {"bubble_rate", r.response.bubble_rate},
                      {"within_budget", within || r.peak_rss_exact ? nlohmann::json(within) : nlohmann::json(nullptr)}});
    }
    return Status::Ok();
  }

  std::string model_;
  std::string budget_;
  std::string calib_;
  int calib_tokens_ = profiler::kDefaultCalibrationTokens;
  std::vector<int> groups_;
  bool refresh_disk_ = false;
  bool recalibrate_ = false;
  bool report_ = false;
  bool json_ = false;
  int threads_ = 0;
  std::string io_ = "uring";
};

ESTREAM_REGISTER_COMMAND(ProfileCommand);

}  // namespace
}  // namespace estream::cli
