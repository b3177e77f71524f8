#include "profiler/measure.h"

#include <malloc.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <numeric>

#include "base/memory.h"
#include "base/timer.h"

namespace estream::profiler {

void ReleaseFreedMemory() { (void)malloc_trim(0); }

bool ResetPeakRssForMeasurement() {
  const char* refuse = std::getenv(kRefuseClearRefsEnv);
  if (refuse != nullptr && refuse[0] != '\0') return false;
  return ResetPeakRss();
}

std::string CumulativePeakWarning() {
  return "warning: the peak RSS cannot be reset here (/proc/self/clear_refs refused): each peak reported is the "
         "process's since it started, an upper bound of the run's own, marked cumulative";
}

Result<RunResult> MeasureRun(const std::string& model_path, const EngineOptions& options,
                             const std::vector<int32_t>& tokens, int repeat) {
  if (repeat < 1) return Status::InvalidArgument(fmt::format("measure: --repeat must be >= 1 (got {})", repeat));
  if (tokens.empty()) return Status::InvalidArgument("measure: the request has no tokens");

  // Without clear_refs the figure is the lifetime peak, and the result says so (see the header).
  ReleaseFreedMemory();
  RunResult result;
  result.peak_rss_exact = ResetPeakRssForMeasurement();

  Timer load_timer;
  auto engine = Engine::Load(model_path, options);
  if (!engine.ok()) return engine.status();
  result.load_seconds = load_timer.Seconds();

  Request request;
  request.tokens = tokens;
  request.top_k = 1;

  std::vector<Response> responses;
  responses.reserve(static_cast<size_t>(repeat));
  std::vector<double> seconds;
  for (int r = 0; r < repeat; ++r) {
    Timer run_timer;
    auto response = (*engine)->Run(request);
    if (!response.ok()) return response.status();
    seconds.push_back(run_timer.Seconds());
    responses.push_back(std::move(*response));
  }
  result.peak_rss_bytes = PeakRssBytes();
  engine->reset();

  // Median: the middle run (the lower middle for an even count), by wall time.
  std::vector<size_t> order(seconds.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return seconds[a] < seconds[b]; });
  const size_t median = order[(order.size() - 1) / 2];
  result.seconds = seconds[median];
  result.response = std::move(responses[median]);
  return result;
}

}  // namespace estream::profiler
