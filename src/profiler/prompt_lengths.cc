#include "profiler/prompt_lengths.h"

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "base/json_text.h"
#include "base/memory.h"
#include "base/stats.h"

namespace estream::profiler {
namespace {

// User + system CPU time of this process (all threads), in seconds.
double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

}  // namespace

double PrefillMacs(const ModelInfo& i, int64_t n) {
  const double attention = double(n) * double(n + 1) / 2 * i.attention_macs_per_pair;  // over the prefix
  return n * i.weight_macs_per_token + attention + double(i.n_embd) * i.n_vocab;
}

Result<PromptLengthsResult> BenchPromptLengths(Engine& engine, const std::vector<int32_t>& tokens,
                                               const std::vector<int>& lengths, int repeat) {
  if (repeat < 1) return Status::InvalidArgument("repeat must be >= 1");
  PromptLengthsResult out;
  out.threads = engine.n_threads();
  for (int n : lengths) {
    if (n < 1 || n > static_cast<int>(tokens.size()))
      return Status::InvalidArgument("prompt length " + std::to_string(n) + " is not within the prompt's " +
                                     std::to_string(tokens.size()) + " tokens");
    Request req{.tokens = std::vector<int32_t>(tokens.begin(), tokens.begin() + n), .top_k = 1};
    PromptLengthPoint p;
    p.n_tokens = n;
    std::vector<double> cpu;
    for (int r = 0; r < repeat; ++r) {
      const double c0 = ProcessCpuSeconds();
      ESTREAM_ASSIGN_OR_RETURN(Response last, engine.Run(req));
      cpu.push_back(ProcessCpuSeconds() - c0);
      p.seconds_all.push_back(last.seconds);
      p.timing = last.timing;
      p.last = std::move(last);
    }
    p.seconds = Median(p.seconds_all);
    p.cpu_seconds_per_thread = Median(cpu) / engine.n_threads();
    p.gops = 2 * PrefillMacs(engine.info(), n) / p.seconds / 1e9;
    out.points.push_back(std::move(p));
  }
  out.peak_rss_bytes = PeakRssBytes();
  return out;
}

std::string PromptLengthsJson(const std::string& model_path, const PromptLengthsResult& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const PromptLengthPoint& p : r.points) {
    const double n = static_cast<double>(p.n_tokens);
    rows.push_back({{"n_tokens", p.n_tokens}, {"seconds", p.seconds}, {"tokens_per_second", n / p.seconds},
                    {"seconds_all", p.seconds_all}, {"cpu_seconds_per_thread", p.cpu_seconds_per_thread},
                    {"tokens_per_cpu_second_per_thread", n / p.cpu_seconds_per_thread}, {"gops", p.gops},
                    {"timing", {{"attention", p.timing.attention},
                                {"attention_projections", p.timing.attention_projections},
                                {"attention_kernel", p.timing.attention_kernel}, {"router", p.timing.router},
                                {"experts", p.timing.experts}, {"dense_ffn", p.timing.dense_ffn},
                                {"head", p.timing.embed + p.timing.head}}}});
  }
  nlohmann::json j{{"model", model_path}, {"threads", r.threads}, {"peak_rss_bytes", r.peak_rss_bytes},
                   {"sweep", rows}};
  return DumpJson(j);
}

}  // namespace estream::profiler
