// TraceRecorder: Chrome / Perfetto trace events ("X" complete events) of one request.
//
// Every event has a step kind (TraceStep: what a reader such as the calibration looks for,
// typed, so that nobody parses names), a name, a category, a thread lane (tid: kLoaderTid for reads, kFeederTid for
// the streamer's own checksum checks (StreamParams::verify_checksums; the engine checks on the
// compute threads instead), kComputeTid for the compute threads' steps), a start and
// a duration in seconds (NowSeconds() clock) and optional integer arguments. WriteJson writes
//   {"traceEvents": [{"name": ..., "cat": ..., "ph": "X", "pid": 1, "tid": ..., "ts": µs, "dur": µs,
//                     "args": {...}}, ...], "displayTimeUnit": "ms"}
// with ts relative to the earliest event, which chrome://tracing and ui.perfetto.dev open as is;
// a thread_name entry names each lane, the feeder's only when it has events.
//
// Thread safety: Add, Clear, Events and WriteJson may be called from any thread (one mutex).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace estream::pipeline {

constexpr int kComputeTid = 1;
constexpr int kLoaderTid = 2;
constexpr int kFeederTid = 3;

// What an event measures. Arguments (TraceEvent::args) by kind:
//   kAttentionRouter  "layer" (block): the compute thread from the layer's start to its routing
//   kRead             "layer" (block), "group", "bytes", "ok" (1: read completed without error)
//   kExperts          "layer" (block), "groups" (consecutive groups run at once), "first_bank",
//                     "routes" (routed rows of those groups)
//   kVerify, kWait    checksum checks; the compute thread waiting for a group ("layer", "group")
enum class TraceStep { kOther, kAttentionRouter, kRead, kExperts, kVerify, kWait };

struct TraceEvent {
  std::string name;
  const char* category = "";  // a string literal
  int tid = kComputeTid;
  double start_s = 0;
  double dur_s = 0;
  std::vector<std::pair<const char*, int64_t>> args{};  // keys are string literals
  TraceStep step = TraceStep::kOther;

  // The argument `key`, or `fallback` when the event has none.
  int64_t Arg(std::string_view key, int64_t fallback) const {
    for (const auto& [k, v] : args)
      if (key == k) return v;
    return fallback;
  }
};

class TraceRecorder {
 public:
  void Add(TraceEvent event);
  void Clear();
  size_t size() const;
  // A copy of the events recorded so far, in the order they were added.
  std::vector<TraceEvent> Events() const;
  // Writes the events (see above). IOError naming the path.
  Status WriteJson(const std::string& path) const;

 private:
  mutable Mutex mutex_;  // guards events_
  std::vector<TraceEvent> events_ ESTREAM_GUARDED_BY(mutex_);
};

}  // namespace estream::pipeline
