#include "profiler/profile_model.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/json_text.h"
#include "base/timer.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "pack/metadata_update.h"
#include "pack/packed_layout.h"
#include "profiler/measure.h"

namespace estream::profiler {
namespace {

// Runs the chosen point and its neighbours end to end (MeasureRun).
Status Report(const ProfileModelParams& p, const config::Profile& profile, const config::Selection& sel,
              std::vector<ReportPoint>* out) {
  ESTREAM_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                           CalibrationTokens(p.model_path, p.calib_path, static_cast<int>(profile.calib_tokens)));
  std::vector<std::pair<std::string, config::CandidatePrediction>> points{{"chosen", sel.best}};
  for (const config::CandidatePrediction& n : sel.neighbours) points.emplace_back("neighbour", n);
  bool told_cumulative = false;
  for (size_t i = 0; i < points.size(); ++i) {
    const config::CandidatePrediction& c = points[i].second;
    EngineOptions eo{.n_threads = p.n_threads};
    eo.budget_bytes = p.budget_bytes;
    eo.group_size = c.group_size;
    eo.banks = c.banks;
    eo.queue_depth = c.queue_depth;
    eo.io = p.io;
    eo.budget_tokens = static_cast<int64_t>(tokens.size());
    if (p.progress)
      p.progress(fmt::format("report {}/{}: G={} B={} Q={}", i + 1, points.size(), c.group_size, c.banks,
                             c.queue_depth));
    ReportPoint rp;
    rp.point = points[i].first;
    rp.predicted = c;
    Result<RunResult> run = MeasureRun(p.model_path, eo, tokens, 1);
    if (!run.ok()) {
      // A neighbour (one bank more) may not fit this process's own budget check: report it, do
      // not fail (the choice is already stored).
      if (run.status().code() != StatusCode::kResourceExhausted) return run.status();
      rp.error = run.status().message();
      out->push_back(std::move(rp));
      continue;
    }
    const RunResult& r = *run;
    if (!r.peak_rss_exact && !told_cumulative && p.progress) {
      p.progress(CumulativePeakWarning());
      told_cumulative = true;
    }
    rp.seconds = r.seconds;
    rp.peak_rss_bytes = r.peak_rss_bytes;
    rp.peak_rss_exact = r.peak_rss_exact;
    rp.bubble_rate = r.response.bubble_rate;
    // A cumulative peak within the budget proves the run was; above it, it proves nothing.
    const bool within = r.peak_rss_bytes <= p.budget_bytes;
    if (within || r.peak_rss_exact) rp.within_budget = within;
    out->push_back(std::move(rp));
  }
  return Status::Ok();
}

}  // namespace

Result<ProfileModelResult> ProfileModel(const ProfileModelParams& p) {
  const Timer total;
  if (p.budget_bytes == 0) return Status::InvalidArgument("the budget must be positive");
  const auto progress = [&p](const std::string& line) {
    if (p.progress) p.progress(line);
  };
  ProfileModelResult out;
  out.model_path = p.model_path;
  out.budget_bytes = p.budget_bytes;
  out.threads = ResolveThreadCount(p.n_threads);
  {
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> header, GgufFile::Open(p.model_path, {.mmap = false}));
    if (!io::IsPackedModel(*header))
      return Status::InvalidArgument(p.model_path + ": not a packed model: run 'estream pack " + p.model_path +
                                     " -o MODEL.packed.gguf' and profile that file");
    ESTREAM_ASSIGN_OR_RETURN(io::PackedModelInfo layout, io::ReadPackedLayout(*header));
    // The result is stored in the model: a file that cannot be written (a read-only mount, no
    // permission, a file system without write support) is refused now, not after the measuring.
    if (Status st = io::CheckUpdatable(p.model_path); !st.ok())
      return Status(st.code(), st.message() + "; estream profile stores its result in the model, so give it a copy "
                                              "it can write");
    if (config::HasProfile(header->kvs()) && !p.recalibrate) {
      Result<config::Profile> stored = config::ParseProfile(header->kvs(), p.model_path);
      if (!stored.ok())
        return Status(stored.status().code(), stored.status().message() + " (run with --recalibrate to replace it)");
      out.profile = std::move(*stored);
      const std::string note = config::ThreadMismatchNote(out.profile.n_threads, out.threads, p.model_path,
                                                          p.budget_text);
      if (!note.empty()) progress(note);
      if (!p.calib_path.empty() || p.refresh_disk || p.calib_tokens != kDefaultCalibrationTokens)
        progress("note: the model holds a profile: --calib/--calib-tokens/--refresh-disk apply with --recalibrate");
      for (int g : p.groups)
        if (out.profile.Run(g) == nullptr)
          return Status::InvalidArgument(fmt::format("--groups {}: the stored profile has no run for it; add "
                                                     "--recalibrate to calibrate it", g));
    } else {
      const std::vector<int> sizes = p.groups.empty() ? DefaultGroupSizes(layout.n_expert) : p.groups;
      for (int g : sizes)
        if (g > layout.n_expert)
          return Status::InvalidArgument(fmt::format("--groups {}: the model has only {} experts per layer", g,
                                                     layout.n_expert));
      DiskParams dp;
      dp.group_sizes = sizes;
      dp.backend = p.io == IoBackend::kPread ? IoBackend::kPread : IoBackend::kAuto;
      dp.progress = progress;
      ESTREAM_ASSIGN_OR_RETURN(DiskResult disk, CharacteriseDisk(layout, dp, p.refresh_disk));
      if (!disk.warning.empty()) progress("warning: " + disk.warning);
      out.disk_seconds = disk.seconds;
      out.disk_source = disk.cached ? "cached" : "measured";
      if (disk.cached) progress("disk: from the cache " + disk.cache_path + " (--refresh-disk measures again)");
      ESTREAM_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, CalibrationTokens(p.model_path, p.calib_path,
                                                                             p.calib_tokens));
      CalibrateParams cp;
      cp.tokens = std::move(tokens);
      cp.group_sizes = sizes;
      cp.n_threads = p.n_threads;
      cp.budget_bytes = p.budget_bytes;
      cp.io = p.io;
      cp.progress = progress;
      header.reset();
      ESTREAM_ASSIGN_OR_RETURN(CalibrationResult cal, Calibrate(p.model_path, disk.profile, cp));
      out.calibration_seconds = cal.seconds;
      out.profile = std::move(cal.profile);
      out.runs = std::move(cal.runs);
      out.calibrated = true;
    }
  }

  // Selection.
  const Timer solve_timer;
  const config::SelectParams sp{.budget_bytes = p.budget_bytes, .group_sizes = p.groups};
  Result<config::Selection> sel = config::SelectConfig(out.profile, sp);
  out.solve_seconds = solve_timer.Seconds();
  out.minimum = config::MinimumBudget(out.profile, p.groups);
  const Timer store_timer;
  if (!sel.ok()) {
    if (out.calibrated) {
      // Keep what was measured: the next budget re-solves without running the model.
      ESTREAM_RETURN_IF_ERROR(StoreInModel(p.model_path, &out.profile, nullptr, progress));
      return Status(sel.status().code(), sel.status().message() + " (the profile was stored in the model: another "
                                                                  "--budget re-solves in milliseconds)");
    }
    return sel.status();
  }
  out.selection = std::move(*sel);
  out.choice = config::ToConfigChoice(out.selection, sp);
  out.choice.n_threads = out.profile.n_threads;  // the timings it was solved from
  ESTREAM_RETURN_IF_ERROR(
      StoreInModel(p.model_path, out.calibrated ? &out.profile : nullptr, &out.choice, progress));
  out.store_seconds = store_timer.Seconds();
  out.profile_seconds = total.Seconds();
  if (p.report) {
    out.has_report = true;
    ESTREAM_RETURN_IF_ERROR(Report(p, out.profile, out.selection, &out.report));
  }
  return out;
}

std::string ProfileModelJson(const ProfileModelResult& r) {
  const config::CandidatePrediction& best = r.selection.best;
  nlohmann::json j;
  j["model"] = r.model_path;
  j["group_size"] = best.group_size;
  j["banks"] = best.banks;
  j["queue_depth"] = best.queue_depth;
  j["schedule"] = ScheduleName(r.choice.schedule);
  j["predicted_seconds"] = best.predicted_s;
  j["predicted_bubble_seconds"] = best.wait_s;
  j["arena_bytes"] = best.arena_bytes;
  j["predicted_memory_bytes"] = best.total_bytes;
  j["budget_bytes"] = r.budget_bytes;
  j["minimum_budget_bytes"] = r.minimum.bytes;
  j["minimum_budget_group_size"] = r.minimum.group_size;
  j["profile_seconds"] = r.profile_seconds;
  j["disk"] = r.disk_source;
  j["disk_seconds"] = r.disk_seconds;
  j["calibration_seconds"] = r.calibration_seconds;
  j["solve_seconds"] = r.solve_seconds;
  j["store_seconds"] = r.store_seconds;
  j["source"] = r.calibrated ? "calibrated" : "stored profile";
  j["calib_tokens"] = r.profile.calib_tokens;
  j["threads"] = r.threads;
  if (r.profile.n_threads > 0) j["profile_threads"] = r.profile.n_threads;
  else j["profile_threads"] = nullptr;  // a profile stored before the count was recorded
  j["evaluations"] = r.selection.evaluations;
  nlohmann::json per = nlohmann::json::array();
  for (const config::CandidatePrediction& c : r.selection.per_group)
    per.push_back({{"group_size", c.group_size}, {"queue_depth", c.queue_depth}, {"banks", c.banks},
                   {"predicted_seconds", c.predicted_s}, {"memory_bytes", c.total_bytes}});
  j["per_group"] = per;
  if (r.calibrated) {
    nlohmann::json rj = nlohmann::json::array();
    for (const CalibrationRunInfo& c : r.runs)
      rj.push_back({{"group_size", c.group_size}, {"banks", c.banks}, {"queue_depth", c.queue_depth},
                    {"seconds", c.seconds}, {"load_seconds", c.load_seconds}, {"peak_rss_bytes", c.peak_rss_bytes},
                    {"other_bytes", c.other_bytes}, {"bubble_rate", c.bubble_rate},
                    {"load_samples", c.load_samples}, {"exec_samples", c.exec_samples}});
    j["calibration_runs"] = rj;
  }
  if (r.has_report) {
    nlohmann::json rep = nlohmann::json::array();
    for (const ReportPoint& rp : r.report) {
      const config::CandidatePrediction& c = rp.predicted;
      nlohmann::json e = {{"point", rp.point},           {"group_size", c.group_size},
                          {"banks", c.banks},            {"queue_depth", c.queue_depth},
                          {"predicted_seconds", c.predicted_s}};
      if (!rp.error.empty()) {
        e["predicted_memory_bytes"] = c.total_bytes;
        e["error"] = rp.error;
      } else {
        e["seconds"] = rp.seconds;
        e["peak_rss_bytes"] = rp.peak_rss_bytes;
        e["peak_rss_exact"] = rp.peak_rss_exact;
        e["predicted_memory_bytes"] = c.total_bytes;
        e["bubble_rate"] = rp.bubble_rate;
        e["within_budget"] = rp.within_budget ? nlohmann::json(*rp.within_budget) : nlohmann::json(nullptr);
      }
      rep.push_back(std::move(e));
    }
    j["report"] = rep;
  }
  return DumpJson(j);
}

}  // namespace estream::profiler
