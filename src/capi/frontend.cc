#include "capi/frontend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

namespace estream::frontend {

Result<EngineOptions::Schedule> ParseSchedule(std::string_view name) {
  std::string n(name);
  std::replace(n.begin(), n.end(), '_', '-');
  if (n == "early") return EngineOptions::Schedule::kEarly;
  if (n == "after-routing") return EngineOptions::Schedule::kAfterRouting;
  if (n == "on-demand") return EngineOptions::Schedule::kOnDemand;
  return Status::InvalidArgument("unknown schedule '" + std::string(name) +
                                 "'; use \"early\" (default), \"after-routing\" or \"on-demand\"");
}

namespace {

void AddPass(const Response& r, CallStats* s) {
  s->seconds += r.seconds;
  s->passes += 1;
  s->tokens += r.pass_tokens > 0 ? r.pass_tokens : r.n_tokens;
  s->timing.embed += r.timing.embed;
  s->timing.attention += r.timing.attention;
  s->timing.attention_projections += r.timing.attention_projections;
  s->timing.attention_kernel += r.timing.attention_kernel;
  s->timing.router += r.timing.router;
  s->timing.experts += r.timing.experts;
  s->timing.dense_ffn += r.timing.dense_ffn;
  s->timing.head += r.timing.head;
  s->expert_seconds += r.expert_seconds;
  s->nonexpert_seconds += r.nonexpert_seconds;
  s->bubble_seconds += r.bubble_seconds;
  s->bytes_read += r.bytes_read;
  s->peak_rss_bytes = std::max(s->peak_rss_bytes, r.peak_rss_bytes);
  s->streamed = s->streamed || r.config.streamed;
  s->group_size = r.config.group_size;
  s->banks = r.config.banks;
  s->queue_depth = r.config.queue_depth;
  s->schedule = r.config.schedule;
  s->io_backend = r.config.io_backend;
  s->arena_bytes = r.config.arena_bytes;
  s->budget_bytes = r.config.budget_bytes;
  s->groups_read += r.config.groups_read;
  s->groups_skipped += r.config.groups_skipped;
  s->groups_cancelled += r.config.groups_cancelled;
}

}  // namespace

CallStats StatsOf(const Response& r) {
  CallStats s;
  s.requests = 1;
  AddPass(r, &s);
  s.wall_seconds = r.seconds;
  s.bubble_rate = r.bubble_rate;
  s.read_gbps = r.read_gbps;
  return s;
}

CallStats Summarize(std::span<const Result<Response>> results, double wall_seconds) {
  CallStats s;
  s.wall_seconds = wall_seconds;
  s.requests = static_cast<int>(results.size());
  std::set<int> seen;
  double busy = 0;  // loader busy time, recovered from each pass's bytes / rate
  for (const Result<Response>& r : results) {
    if (!r.ok() || !seen.insert(r->pass).second) continue;
    AddPass(*r, &s);
    if (r->read_gbps > 0) busy += static_cast<double>(r->bytes_read) / (r->read_gbps * 1e9);
  }
  s.bubble_rate = s.seconds > 0 ? s.bubble_seconds / s.seconds : 0;
  s.read_gbps = busy > 0 ? static_cast<double>(s.bytes_read) / busy / 1e9 : 0;
  return s;
}

Status FirstError(std::span<const Result<Response>> results, const char* what) {
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].ok()) continue;
    const Status& st = results[i].status();
    if (results.size() == 1) return st;
    return Status(st.code(), std::string(what) + " " + std::to_string(i) + ": " + st.message());
  }
  return Status::Ok();
}

}  // namespace estream::frontend
