#include "profiler/calibrate.h"

#include <malloc.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "base/memory.h"
#include "base/stats.h"
#include "base/timer.h"
#include "gguf/gguf.h"
#include "model/engine_hooks.h"
#include "pack/metadata_update.h"
#include "profiler/measure.h"

namespace estream::profiler {
namespace {
}  // namespace

int ResolveThreadCount(int n_threads) { return n_threads > 0 ? n_threads : omp_get_num_procs(); }

std::vector<int> DefaultGroupSizes(int n_expert) {
  std::vector<int> out;
  for (int g : {1, 2, 4, 8, 16})
    if (g <= n_expert) out.push_back(g);
  if (out.empty()) out.push_back(1);
  return out;
}

Result<RunTrace> RunTraceFromEvents(std::span<const pipeline::TraceEvent> events, const io::PackedModelInfo& layout,
                                    int group_size) {
  using pipeline::TraceStep;
  const int W = static_cast<int>(layout.layers.size());
  int max_block = 0;
  for (const io::PackedLayerInfo& li : layout.layers) max_block = std::max(max_block, li.layer);
  std::vector<int> ordinal(static_cast<size_t>(max_block) + 1, -1);
  for (int w = 0; w < W; ++w) ordinal[layout.layers[w].layer] = w;
  auto ordinal_of = [&](int64_t block) { return block >= 0 && block <= max_block ? ordinal[block] : -1; };

  RunTrace out;
  out.nonexpert_s.assign(W, -1);
  struct Read {
    double start, end;
    bool sample;
  };
  std::vector<Read> reads;
  for (const pipeline::TraceEvent& e : events) {
    const double ts = e.start_s, dur = e.dur_s;
    const int w = ordinal_of(e.Arg("layer", -1));
    if (e.step == TraceStep::kAttentionRouter) {
      if (w >= 0) out.nonexpert_s[w] = dur;
    } else if (e.step == TraceStep::kRead) {
      const int64_t q = e.Arg("group", -1);
      const bool ok = e.Arg("ok", 0) != 0;
      const bool full = w >= 0 && q >= 0 && q * group_size < layout.layers[w].n_expert &&
                        layout.layers[w].GroupRecords(static_cast<int>(q), group_size) == group_size;
      reads.push_back({ts, ts + dur, ok && full});
    } else if (e.step == TraceStep::kExperts) {
      const int64_t groups = e.Arg("groups", 0), routes = e.Arg("routes", -1);
      if (groups < 1 || routes < 0)
        return Status::Internal(fmt::format("trace step '{}' has no groups/routes arguments", e.name));
      const float rows = static_cast<float>(static_cast<double>(routes) / static_cast<double>(groups));
      const float secs = static_cast<float>(dur / static_cast<double>(groups));
      for (int64_t i = 0; i < groups; ++i) {
        out.exec_rows.push_back(rows);
        out.exec_seconds.push_back(secs);
      }
    }
  }
  std::sort(reads.begin(), reads.end(), [](const Read& a, const Read& b) { return a.end < b.end; });
  double prev_end = -INFINITY;
  for (const Read& r : reads) {
    if (r.sample) out.load_seconds.push_back(static_cast<float>(r.end - std::max(r.start, prev_end)));
    prev_end = std::max(prev_end, r.end);
  }
  return out;
}

Result<std::vector<uint32_t>> PhysicalRouteCounts(const std::vector<int32_t>& routing, int64_t n_tokens, int n_used,
                                                  int n_block, const io::PackedModelInfo& layout) {
  const int E = layout.n_expert, W = static_cast<int>(layout.layers.size());
  if (static_cast<int64_t>(routing.size()) != static_cast<int64_t>(n_block) * n_tokens * n_used)
    return Status::InvalidArgument(fmt::format("routing has {} ids, want {} blocks x {} tokens x {} experts",
                                               routing.size(), n_block, n_tokens, n_used));
  std::vector<uint32_t> counts(static_cast<size_t>(W) * E, 0);
  for (int w = 0; w < W; ++w) {
    const io::PackedLayerInfo& li = layout.layers[w];
    if (li.layer < 0 || li.layer >= n_block)
      return Status::InvalidArgument(fmt::format("{}: MoE block {} outside the model's {} blocks", li.file, li.layer,
                                                 n_block));
    const int32_t* ids = routing.data() + static_cast<size_t>(li.layer) * n_tokens * n_used;
    for (int64_t i = 0; i < n_tokens * n_used; ++i) {
      const int32_t e = ids[i];
      if (e < 0 || e >= E || e >= static_cast<int32_t>(li.physical_of.size()))
        return Status::InvalidArgument(fmt::format("routing: expert id {} of block {} is outside [0, {})", e, li.layer, E));
      ++counts[static_cast<size_t>(w) * E + li.physical_of[e]];
    }
  }
  return counts;
}

Result<CalibrationResult> Calibrate(const std::string& model_path, const config::DiskProfile& disk,
                                    const CalibrateParams& params) {
  const Timer timer;
  if (params.tokens.empty()) return Status::InvalidArgument("calibration: no tokens");
  io::PackedModelInfo layout;
  {
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> header, GgufFile::Open(model_path, {.mmap = false}));
    if (!io::IsPackedModel(*header))
      return Status::InvalidArgument(fmt::format("{}: not a packed model: run 'estream pack {} -o MODEL.packed.gguf' "
                                                 "and profile that file", model_path, model_path));
    ESTREAM_ASSIGN_OR_RETURN(layout, io::ReadPackedLayout(*header));
  }
  const int E = layout.n_expert, W = static_cast<int>(layout.layers.size());
  std::vector<int> sizes = params.group_sizes.empty() ? DefaultGroupSizes(E) : params.group_sizes;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (int g : sizes)
    if (g < 1 || g > E)
      return Status::InvalidArgument(fmt::format("group size {} is outside [1, {}] (the model's experts per layer)", g, E));

  CalibrationResult out;
  config::Profile& p = out.profile;
  p.n_layer = W;
  p.n_expert = E;
  for (const io::PackedLayerInfo& li : layout.layers) {
    p.record_bytes.push_back(li.record_bytes);
    p.expert_bytes = std::max(p.expert_bytes, li.record_bytes);
  }
  p.calib_tokens = static_cast<uint32_t>(params.tokens.size());
  p.disk = disk;
  std::vector<std::vector<double>> nonexpert(W);
  std::vector<double> other_s;
  uint64_t most_other = 0;
  bool told_cumulative = false;

  for (size_t i = 0; i < sizes.size(); ++i) {
    const int g = sizes[i];
    const int n_groups = (E + g - 1) / g;
    int banks = std::min(4, n_groups);
    if (params.budget_bytes > 0 && most_other > 0) {
      const uint64_t bank = static_cast<uint64_t>(g) * p.expert_bytes;
      const uint64_t fit = params.budget_bytes > most_other ? (params.budget_bytes - most_other) / bank : 0;
      banks = static_cast<int>(std::clamp<uint64_t>(fit, std::min(2, n_groups), banks));
    }
    const int q0 = disk.Q0(g);
    pipeline::TraceRecorder trace;
    const EngineHooks hooks{.trace = &trace};
    EngineOptions eo{.n_threads = params.n_threads};
    eo.group_size = g;
    eo.banks = banks;
    eo.queue_depth = q0;
    eo.schedule = EngineOptions::Schedule::kEarly;
    eo.io = params.io;
    eo.budget_tokens = static_cast<int64_t>(params.tokens.size());
    eo.hooks = &hooks;
    // What the previous run freed goes back to the kernel first (glibc keeps freed small blocks,
    // e.g. the GGUF reader's metadata values, in its heap): else every run's M_other would carry
    // the earlier runs' leftovers (on OLMoE: a hundred MiB and more from the second run on).
    (void)malloc_trim(0);
    // Refused: the peak is the process's since it started, so M_other(g) of the later runs is an
    // over-estimate (safe: it never lets a configuration exceed the budget); said once.
    if (!ResetPeakRssForMeasurement() && !told_cumulative && params.progress) {
      params.progress(CumulativePeakWarning() + " (M_other of the calibration runs may be over-estimated)");
      told_cumulative = true;
    }
    const Timer load_timer;
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(model_path, eo));
    p.n_threads = static_cast<uint32_t>(engine->n_threads());  // the same for every run
    CalibrationRunInfo info{.group_size = g, .banks = banks, .queue_depth = q0};
    info.load_seconds = load_timer.Seconds();
    Request req{.tokens = params.tokens, .top_k = 1};
    req.return_routing = i == 0;
    ESTREAM_ASSIGN_OR_RETURN(Response resp, engine->Run(req));
    info.peak_rss_bytes = PeakRssBytes();
    info.seconds = resp.seconds;
    info.arena_bytes = resp.config.arena_bytes;
    info.bubble_rate = resp.bubble_rate;
    if (!resp.config.streamed)
      return Status::Internal(fmt::format("{}: the calibration run with G = {} was not streamed", model_path, g));
    if (i == 0) {
      ESTREAM_ASSIGN_OR_RETURN(p.expert_routes, PhysicalRouteCounts(resp.routing, resp.n_tokens,
                                                                    engine->info().n_expert_used,
                                                                    engine->info().n_layer, layout));
    }
    engine.reset();  // the trace is complete (the streamer's threads have stopped)
    const std::vector<pipeline::TraceEvent> events = trace.Events();
    ESTREAM_ASSIGN_OR_RETURN(RunTrace rt, RunTraceFromEvents(events, layout, g));
    for (int w = 0; w < W; ++w) {
      if (rt.nonexpert_s[w] < 0)
        return Status::Internal(fmt::format("{}: the calibration trace (G = {}) has no step for MoE block {}",
                                            model_path, g, layout.layers[w].layer));
      nonexpert[w].push_back(rt.nonexpert_s[w]);
    }
    if (rt.exec_rows.empty())
      return Status::Internal(fmt::format("{}: the calibration trace (G = {}) has no expert steps", model_path, g));
    other_s.push_back(resp.timing.embed + resp.timing.head);
    config::CalibrationRun run;
    run.group_size = g;
    const uint64_t measured = info.peak_rss_bytes > info.arena_bytes ? info.peak_rss_bytes - info.arena_bytes : 0;
    run.other_bytes = std::max(measured, resp.config.other_bytes);
    run.load_queue_depth = q0;
    run.load_seconds = std::move(rt.load_seconds);
    run.exec_rows = std::move(rt.exec_rows);
    run.exec_seconds = std::move(rt.exec_seconds);
    info.load_samples = run.load_seconds.size();
    info.exec_samples = run.exec_rows.size();
    config::CompactExecSamples(&run.exec_rows, &run.exec_seconds, kMaxExecSamples);
    info.other_bytes = run.other_bytes;
    most_other = std::max(most_other, run.other_bytes);
    p.runs.push_back(std::move(run));
    out.runs.push_back(info);
    if (params.progress)
      params.progress(fmt::format("calibration {}/{}: G={} B={} Q={}: request {:.3f} s (load {:.2f} s), bubble {:.1f}%, "
                                  "peak RSS {}, non-arena {}", i + 1, sizes.size(), g, banks, q0, info.seconds,
                                  info.load_seconds, 100 * info.bubble_rate, Mib(info.peak_rss_bytes),
                                  Mib(info.other_bytes)));
  }
  for (int w = 0; w < W; ++w) p.nonexpert_seconds.push_back(static_cast<float>(Median(nonexpert[w])));
  p.other_seconds = static_cast<float>(Median(other_s));
  Status valid = p.Validate();
  if (!valid.ok()) return Status::Internal(fmt::format("{}: the calibration gave an invalid profile: {}", model_path,
                                                       valid.message()));
  out.seconds = timer.Seconds();
  return out;
}

Status StoreInModel(const std::string& model_path, const config::Profile* profile, const config::ConfigChoice* choice,
                    const ProgressFn& progress) {
  std::vector<GgufKv> set;
  std::vector<std::string> remove{"estream.config."};
  if (profile != nullptr) {
    set = config::ProfileKvs(*profile);
    remove.push_back("estream.profile.");
  }
  if (choice != nullptr) {
    std::vector<GgufKv> c = config::ConfigKvs(*choice);
    set.insert(set.end(), c.begin(), c.end());
  }
  io::ProgressFn bytes_progress;
  if (progress) {
    // A whole-file rewrite (a model packed before the header reserve existed) copies every tensor:
    // a line every ~10%.
    bytes_progress = [&progress, next = 0.0](uint64_t done, uint64_t total) mutable {
      const double f = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1;
      if (f < next || done == total) return;
      progress(fmt::format("storing: rewriting the whole model (no header reserve): {:.0f}% of {}", 100 * f, Mib(total)));
      next = f + 0.1;
    };
  }
  io::MetadataUpdateInfo info;
  ESTREAM_RETURN_IF_ERROR(io::UpdateMetadata(model_path, set, remove, bytes_progress, &info));
  if (progress && !info.in_place)
    progress(fmt::format("stored by rewriting the whole model in {:.1f} s (it now has a header reserve: later "
                         "updates are in place)", info.seconds));
  return Status::Ok();
}

}  // namespace estream::profiler
