// One measured end-to-end run of a request: what the exhaustive sweep (`estream sweep`) does at
// every grid point and what `estream profile --report` does for the chosen point and its
// neighbours.
//
// Memory figures are the PROCESS's peak RSS (VmHWM), the figure users see and the one a budget
// bounds. Runs in the calling process: MeasureRun resets the process's peak (base/memory.h
// ResetPeakRss) before loading, after returning the heap's free pages to the OS
// (ReleaseFreedMemory), so the figure covers this load and these runs only, not what the process
// held earlier.
//
// Where the reset is refused (no /proc/self/clear_refs, an older kernel, a sandbox that forbids
// the write), the figure is the process's peak since it STARTED: an upper bound of this run's
// own peak, exact only when this run is the biggest so far. MeasureRun then says so
// (RunResult::peak_rss_exact = false) and callers mark the figure ("cumulative") instead of
// reporting it as the run's own; a cumulative figure within a budget proves the run was within
// it, one above it proves nothing.
//
// Thread safety: not thread-safe against other work in the same process: the peak RSS reset and
// read are process-wide, so run one MeasureRun at a time and nothing else big concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "estream/engine.h"

namespace estream::profiler {

// Returns memory that is free in the allocator's heap to the OS (glibc malloc_trim), so that the
// process's current RSS is what is live. An engine destroyed earlier in the process otherwise
// leaves freed heap pages resident, which the next engine's budget check (RSS after load) would
// count as its own. MeasureRun calls it before each load.
void ReleaseFreedMemory();

// Environment variable for tests only: when set (non-empty), ResetPeakRssForMeasurement reports
// a refusal without trying, so the fallback above can be tested where the reset works.
inline constexpr char kRefuseClearRefsEnv[] = "ESTREAM_TEST_REFUSE_CLEAR_REFS";

// base ResetPeakRss, or false at once when kRefuseClearRefsEnv is set. MeasureRun and `estream
// sweep`'s budget probes use it.
bool ResetPeakRssForMeasurement();

// The one-line warning (no "estream ...:" prefix, no newline) a command prints once when a reset
// was refused: what the peak figures then mean.
std::string CumulativePeakWarning();

struct RunResult {
  double seconds = 0;            // median request wall time (Engine::Run), seconds
  double load_seconds = 0;       // Engine::Load wall time, seconds
  uint64_t peak_rss_bytes = 0;   // process peak RSS over the load and all runs (see above)
  // true: the peak was reset before the load (the figure is this run's own); false: the reset was
  // refused and peak_rss_bytes is the process's peak since it started (an upper bound).
  bool peak_rss_exact = true;
  estream::Response response;    // of the median run (stats: bubble, bytes_read, config, ...)
};

// Loads the model at `model_path` with `options`, runs the request `tokens` (top_k 1, no other
// outputs) `repeat` times, and returns the median request time and that run's Response. The
// engine is destroyed before returning. Errors: InvalidArgument for repeat < 1 or no tokens; the
// Status of Engine::Load (e.g. ResourceExhausted when the budget does not fit: callers such as
// the sweep skip such points) or of Engine::Run. When the peak cannot be reset (above),
// peak_rss_bytes is the process's lifetime peak and peak_rss_exact is false.
Result<RunResult> MeasureRun(const std::string& model_path, const EngineOptions& options,
                             const std::vector<int32_t>& tokens, int repeat = 1);

}  // namespace estream::profiler
