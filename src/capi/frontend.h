// Helpers shared by the front ends that embed the engine (the C API in src/capi/estream_c.cc and
// the Python module in python/): option parsing, per-call statistics (the label probabilities of
// classify are batch::CandidateProbabilities, src/batch/candidates.h).
// Built on the public API only (include/estream/engine.h).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/size.h"
#include "estream/engine.h"

namespace estream::frontend {

using estream::ParseSize;  // base/size.h: sizes as the CLI reads them

// "early" | "after-routing" | "on-demand" (also with '_'); InvalidArgument otherwise.
Result<EngineOptions::Schedule> ParseSchedule(std::string_view name);

// The statistics of one request, or of one front-end call (a batch of requests that may have run
// in several forward passes). Times in seconds, sizes in bytes.
struct CallStats {
  double wall_seconds = 0;  // the whole call as the front end saw it (tokenizing included)
  double seconds = 0;       // forward passes (Response::seconds), summed over the passes
  int requests = 0;         // requests of the call (a failed one included)
  int passes = 0;           // forward passes that ran them
  int64_t tokens = 0;       // tokens of those passes (continuations included)
  Response::Timing timing;  // summed over the passes
  double expert_seconds = 0, nonexpert_seconds = 0, bubble_seconds = 0;
  double bubble_rate = 0;     // bubble_seconds / seconds
  uint64_t bytes_read = 0;    // expert bytes read from the file
  double read_gbps = 0;       // bytes_read / loader busy time (GB/s)
  uint64_t peak_rss_bytes = 0;  // the process's peak RSS at the end of the last pass
  bool streamed = false;
  int group_size = 0, banks = 0, queue_depth = 0;
  std::string schedule, io_backend;  // empty when resident
  uint64_t arena_bytes = 0, budget_bytes = 0;
  int64_t groups_read = 0, groups_skipped = 0, groups_cancelled = 0;
};

// The figures of the pass that ran `r` (requests = 1; the pass figures are shared with the other
// requests of that pass, see Response).
CallStats StatsOf(const Response& r);
// One call: every distinct pass of `results` counted once (results[i].value().pass identifies
// it); failed requests count in `requests` only.
CallStats Summarize(std::span<const Result<Response>> results, double wall_seconds);

// The first failed request of a batch as one Status of the same code, its message prefixed by
// "<what> <index>: " when the batch has more than one request; OK when all succeeded.
Status FirstError(std::span<const Result<Response>> results, const char* what = "input");

}  // namespace estream::frontend
