// TraceRecorder: Chrome / Perfetto trace events ("X" complete events) of one request.
//
// Every event has a name, a category, a thread lane (tid: kLoaderTid for reads, kFeederTid for
// checksum checks and bank bookkeeping, kComputeTid for the compute threads' steps), a start and
// a duration in seconds (NowSeconds() clock) and optional integer arguments. WriteJson writes
//   {"traceEvents": [{"name": ..., "cat": ..., "ph": "X", "pid": 1, "tid": ..., "ts": µs, "dur": µs,
//                     "args": {...}}, ...], "displayTimeUnit": "ms"}
// with ts relative to the earliest event, which chrome://tracing and ui.perfetto.dev open as is.
//
// Thread safety: Add, Clear and WriteJson may be called from any thread (one mutex).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace estream::pipeline {

constexpr int kComputeTid = 1;
constexpr int kLoaderTid = 2;
constexpr int kFeederTid = 3;

struct TraceEvent {
  std::string name;
  const char* category = "";  // a string literal
  int tid = kComputeTid;
  double start_s = 0;
  double dur_s = 0;
  std::vector<std::pair<const char*, int64_t>> args{};  // keys are string literals
};

class TraceRecorder {
 public:
  void Add(TraceEvent event);
  void Clear();
  size_t size() const;
  // Writes the events (see above). IOError naming the path.
  Status WriteJson(const std::string& path) const;

 private:
  mutable Mutex mutex_;  // guards events_
  std::vector<TraceEvent> events_ ESTREAM_GUARDED_BY(mutex_);
};

}  // namespace estream::pipeline
