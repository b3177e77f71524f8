// The flags several commands share, declared once: -t/--threads, --budget, --io, --schedule.
// Each binds to a member of the command; the values are parsed by the library's parsers
// (ParseSize here, ParseIoBackend / ParseSchedule of estream/options.h).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "estream/options.h"

namespace estream::cli {

inline CLI::Option* AddThreadsFlag(CLI::App* sub, int* threads,
                                   const std::string& help = "compute threads (default: one per CPU)") {
  return sub->add_option("-t,--threads", *threads, help)->check(CLI::NonNegativeNumber);
}

inline CLI::Option* AddBudgetFlag(CLI::App* sub, std::string* budget, const std::string& help) {
  return sub->add_option("--budget", *budget, help);
}

// --io: "uring" (default; pread when unavailable) or "pread"; parse with ParseIoBackend.
inline CLI::Option* AddIoFlag(CLI::App* sub, std::string* io, const std::string& prefix = "") {
  return sub->add_option("--io", *io, prefix + "read backend: uring (default; pread when unavailable), pread")
      ->check(CLI::IsMember({"uring", "pread"}));
}

// --schedule: on-demand, after-routing or early (ScheduleName); parse with ParseSchedule.
inline CLI::Option* AddScheduleFlag(CLI::App* sub, std::string* schedule, const std::string& help) {
  return sub->add_option("--schedule", *schedule, help)->check(CLI::IsMember({"on-demand", "after-routing", "early"}));
}

}  // namespace estream::cli
