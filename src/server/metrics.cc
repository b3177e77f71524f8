#include "server/metrics.h"

#include <fmt/format.h>

#include <cmath>

namespace estream::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Render(std::string_view name, std::string_view help, std::string* out) const {
  *out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  *out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name, count_);
}

namespace {
std::vector<double> SecondsBounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}
std::vector<double> Pow2Bounds(double first, int n) {
  std::vector<double> b;
  for (int i = 0; i < n; ++i) b.push_back(first * std::ldexp(1.0, i));
  return b;
}
}  // namespace

Metrics::Metrics()
    : queue_seconds_(SecondsBounds()),
      compute_seconds_hist_(SecondsBounds()),
      batch_jobs_(Pow2Bounds(1, 8)),
      batch_tokens_(Pow2Bounds(16, 12)) {}

void Metrics::CountRequest(std::string_view route, int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++requests_[{std::string(route), status}];
}

void Metrics::AddPromptTokens(int64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_tokens_ += static_cast<uint64_t>(n);
}

void Metrics::ObserveJob(double queue_seconds, double compute_seconds) {
  std::lock_guard<std::mutex> l(mu_);
  queue_seconds_.Observe(queue_seconds);
  compute_seconds_hist_.Observe(compute_seconds);
}

void Metrics::ObserveBatch(const BatchObservation& b) {
  std::lock_guard<std::mutex> l(mu_);
  ++batches_;
  batch_jobs_.Observe(b.jobs);
  batch_tokens_.Observe(static_cast<double>(b.tokens));
  compute_seconds_ += b.seconds;
  bubble_seconds_ += b.bubble_seconds;
  expert_bytes_read_ += b.expert_bytes_read;
  experts_needed_ += static_cast<uint64_t>(b.experts_needed);
  experts_cached_ += static_cast<uint64_t>(b.experts_cached);
  if (b.expert_cache_bytes > 0) expert_cache_bytes_ = b.expert_cache_bytes;
}

uint64_t Metrics::requests(std::string_view route, int status) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = requests_.find({std::string(route), status});
  return it == requests_.end() ? 0 : it->second;
}

uint64_t Metrics::batches() const {
  std::lock_guard<std::mutex> l(mu_);
  return batches_;
}

std::string Metrics::Render(const MetricsSnapshot& s) const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out;
  auto scalar = [&](std::string_view name, std::string_view type, std::string_view help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  };
  out += "# HELP estream_requests_total HTTP requests by route and status (499: the client went away first)\n"
         "# TYPE estream_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += fmt::format("estream_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
  scalar("estream_prompt_tokens_total", "counter", "prompt tokens run (continuations included)", prompt_tokens_);
  queue_seconds_.Render("estream_queue_seconds", "seconds a job waited in the queue", &out);
  compute_seconds_hist_.Render("estream_compute_seconds", "seconds of the batch that ran a job", &out);
  batch_jobs_.Render("estream_batch_jobs", "jobs (HTTP requests) per engine batch", &out);
  batch_tokens_.Render("estream_batch_tokens", "tokens per engine batch", &out);
  scalar("estream_batches_total", "counter", "engine batches run", batches_);
  scalar("estream_engine_seconds_total", "counter", "seconds the engine spent running batches", compute_seconds_);
  scalar("estream_bubble_seconds_total", "counter", "seconds compute threads waited for expert data (streamed models)",
         bubble_seconds_);
  scalar("estream_expert_bytes_read_total", "counter", "expert bytes read from the model file (streamed models)",
         expert_bytes_read_);
  scalar("estream_expert_cache_lookups_total", "counter",
         "expert records the engine ran from the arena (streamed models; groups of G experts)", experts_needed_);
  scalar("estream_expert_cache_hits_total", "counter",
         "of those, records found resident in the expert cache, not read (streamed models)", experts_cached_);
  scalar("estream_expert_cache_hit_ratio", "gauge", "expert_cache_hits_total / expert_cache_lookups_total (0 before any)",
         experts_needed_ > 0 ? static_cast<double>(experts_cached_) / static_cast<double>(experts_needed_) : 0.0);
  scalar("estream_expert_cache_bytes", "gauge", "bytes of the arena that keep experts between requests (streamed models)",
         expert_cache_bytes_);
  scalar("estream_queue_jobs", "gauge", "jobs waiting in the queue", s.queue_jobs);
  scalar("estream_requests_in_flight", "gauge", "HTTP requests being handled", s.in_flight);
  scalar("estream_ready", "gauge", "1 once the model is loaded", s.ready ? 1 : 0);
  scalar("estream_budget_bytes", "gauge", "--budget: the process's memory budget (0: none)", s.budget_bytes);
  scalar("estream_server_reserve_bytes", "gauge", "part of the budget kept for HTTP buffers and the queue",
         s.server_reserve_bytes);
  scalar("estream_rss_bytes", "gauge", "resident set size now (VmRSS)", s.rss_bytes);
  scalar("estream_peak_rss_bytes", "gauge", "peak resident set size (VmHWM)", s.peak_rss_bytes);
  return out;
}

}  // namespace estream::server
