// BenchPromptLengths: the prompt-length benchmark of one loaded engine (`estream bench
// --in-process`, and `estream prefill --sweep` which is the same call): the first N tokens of a
// prompt for each N, `repeat` runs each, median wall time, tokens/s, op rate, and the process's
// CPU time per thread (the wall time the run would take with its threads never descheduled on a
// shared machine; OpenMP's spin-waiting counts as CPU time, so it is an upper bound of that).
// The op rate counts 2 ops per multiply-add of PrefillMacs; compare it with a peak measured on
// the machine at hand (bench/peak_bench), not with a constant.
//
// Thread safety: runs requests on `engine` (its own serialisation applies); the CPU time is the
// whole process's, so run nothing else meanwhile.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "estream/engine.h"

namespace estream::profiler {

// Multiply-adds of one prefill of n tokens with the top-1 LM head row: every weight matrix a token
// meets (ModelInfo::weight_macs_per_token: per architecture, dense blocks, shared experts and MLA
// included) plus the attention scores and weighted sums over the causal prefix, plus the LM head.
double PrefillMacs(const ModelInfo& info, int64_t n_tokens);

struct PromptLengthPoint {
  int64_t n_tokens = 0;
  double seconds = 0;                   // median wall time of Engine::Run
  std::vector<double> seconds_all;      // every run, in order
  double cpu_seconds_per_thread = 0;    // median process CPU time / threads
  double gops = 0;                      // 2 * PrefillMacs / seconds / 1e9
  Response::Timing timing;              // of the last run
  Response last;                        // the last run (streaming figures, configuration; top-1)
};

struct PromptLengthsResult {
  int threads = 0;
  uint64_t peak_rss_bytes = 0;          // the process's, after the last run
  std::vector<PromptLengthPoint> points;  // in the order of `lengths`
};

// InvalidArgument when a length is outside [1, tokens.size()] or repeat < 1; Run's errors.
Result<PromptLengthsResult> BenchPromptLengths(Engine& engine, const std::vector<int32_t>& tokens,
                                               const std::vector<int>& lengths, int repeat);

// The JSON object of one result (one line): {"model", "threads", "peak_rss_bytes", "sweep": [...]}.
std::string PromptLengthsJson(const std::string& model_path, const PromptLengthsResult& r);

}  // namespace estream::profiler
