// Server metrics in the Prometheus text exposition format (GET /metrics).
//
// Counters and histograms are updated from the HTTP threads and the engine worker; every method
// is thread-safe (one mutex: updates are a few additions per request). Render() writes the text
// format version 0.0.4: `# HELP`, `# TYPE`, then the samples; histograms as cumulative `_bucket`
// series with `le` labels, `_sum` and `_count`.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace estream::server {

// A fixed-bucket histogram (upper bounds ascending; +Inf implied). Not thread-safe by itself.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  // Appends the series `name` to `out` (HELP/TYPE lines included).
  void Render(std::string_view name, std::string_view help, std::string* out) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Gauges that belong to other parts of the server, sampled when /metrics is rendered.
struct MetricsSnapshot {
  int64_t queue_jobs = 0;        // jobs waiting
  int64_t in_flight = 0;         // HTTP requests being handled
  uint64_t budget_bytes = 0;     // --budget (0: none)
  uint64_t server_reserve_bytes = 0;  // what the budget keeps for the HTTP side
  uint64_t rss_bytes = 0;        // VmRSS now
  uint64_t peak_rss_bytes = 0;   // VmHWM
  bool ready = false;            // model loaded
};

// What one engine batch did (Scheduler -> Metrics::ObserveBatch). The streaming figures are per
// engine pass, summed over the batch's passes.
struct BatchObservation {
  int jobs = 0;
  int64_t tokens = 0;
  double seconds = 0;
  double bubble_seconds = 0;
  uint64_t expert_bytes_read = 0;
  int64_t experts_needed = 0;   // expert records the passes ran (Response::experts_needed)
  int64_t experts_cached = 0;   // ... found in the expert cache (Response::experts_cached)
  uint64_t expert_cache_bytes = 0;  // the expert cache's size (Response::config.cache_bytes)
};

class Metrics {
 public:
  Metrics();

  // One finished HTTP request (status 499: the client went away first).
  void CountRequest(std::string_view route, int status);
  void AddPromptTokens(int64_t n);
  // Per job: seconds queued and seconds of the batch that ran it.
  void ObserveJob(double queue_seconds, double compute_seconds);
  // Per batch run by the worker.
  void ObserveBatch(const BatchObservation& b);

  std::string Render(const MetricsSnapshot& snap) const;

  // For tests.
  uint64_t requests(std::string_view route, int status) const;
  uint64_t batches() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0;
  uint64_t batches_ = 0;
  double compute_seconds_ = 0, bubble_seconds_ = 0;
  uint64_t expert_bytes_read_ = 0;
  uint64_t experts_needed_ = 0, experts_cached_ = 0, expert_cache_bytes_ = 0;
  Histogram queue_seconds_, compute_seconds_hist_, batch_jobs_, batch_tokens_;
};

}  // namespace estream::server
