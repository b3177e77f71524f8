// Progress of a long run on stderr, shared by score, eval and perplexity. On a terminal one line
// redrawn in place:
//   [#########.....................] 120/600 tasks  35.2 tasks/s  5400 tok/s  ETA 14 s
// elsewhere (a log file, a pipe) a plain line each time another tenth of the tokens is done:
//   estream eval: 120/600 tasks (30%), 35.2 tasks/s, 5400 tok/s, ETA 14 s
// The bar, the rates and the ETA follow the tokens (the units, tasks or windows, differ in
// length); the rates count from the reporter's construction.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace estream::cli {

class ProgressReporter {
 public:
  // enabled false: Update and Finish print nothing (--no-progress). unit: "tasks", "lines", ...
  ProgressReporter(const char* command, const char* unit, bool enabled)
      : command_(command), unit_(unit), enabled_(enabled), terminal_(isatty(STDERR_FILENO) != 0) {}

  // done of total units, tokens_done of tokens_total tokens.
  void Update(int64_t done, int64_t total, int64_t tokens_done, int64_t tokens_total) {
    if (!enabled_) return;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double share = tokens_total > 0 ? std::min(1.0, static_cast<double>(tokens_done) / tokens_total) : 1.0;
    const double units_per_s = el > 0 ? done / el : 0, tps = el > 0 ? tokens_done / el : 0;
    const double eta = tps > 0 ? static_cast<double>(std::max<int64_t>(0, tokens_total - tokens_done)) / tps : 0;
    if (terminal_) {
      const int width = 30, fill = static_cast<int>(width * share);
      std::fprintf(stderr, "\r[%s%s] %lld/%lld %s  %.1f %s/s  %.0f tok/s  ETA %.0f s   ",
                   std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(),
                   static_cast<long long>(done), static_cast<long long>(total), unit_, units_per_s, unit_, tps, eta);
      drawn_ = true;
    } else {
      const int tenth = static_cast<int>(10 * share);
      if (tenth <= tenths_printed_) return;
      tenths_printed_ = tenth;
      std::fprintf(stderr, "estream %s: %lld/%lld %s (%.0f%%), %.1f %s/s, %.0f tok/s, ETA %.0f s\n", command_,
                   static_cast<long long>(done), static_cast<long long>(total), unit_, 100 * share, units_per_s,
                   unit_, tps, eta);
    }
    std::fflush(stderr);
  }

  // Ends the terminal line, if one was drawn (before the command's own output).
  void Finish() {
    if (drawn_) std::fprintf(stderr, "\n");
    drawn_ = false;
  }

 private:
  const char* command_;
  const char* unit_;
  bool enabled_, terminal_;
  bool drawn_ = false;
  int tenths_printed_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace estream::cli
