// The flags several commands share, declared once: -t/--threads, --budget, --io, --schedule,
// --expert-cache.
// Each binds to a member of the command; the values are parsed by the library's parsers
// (ParseSize here, ParseIoBackend / ParseSchedule of estream/options.h).
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "estream/engine.h"
#include "estream/options.h"
#include "tools/estream/command.h"

namespace estream::cli {

inline CLI::Option* AddThreadsFlag(CLI::App* sub, int* threads,
                                   const std::string& help = "compute threads (default: one per CPU)") {
  return sub->add_option("-t,--threads", *threads, help)->check(CLI::Range(0, kMaxThreads));
}

// A duration flag's check: a finite number of seconds >= 0, with an error that says so (CLI11's
// NonNegativeNumber prints its range up to DBL_MAX in full).
// The whole of v parsed as a double into *x (false: empty, trailing characters, not a number).
inline bool ParseWholeDouble(const std::string& v, double* x) {
  char* end = nullptr;
  *x = std::strtod(v.c_str(), &end);
  return !v.empty() && end == v.c_str() + v.size();
}

inline CLI::Validator SecondsCheck() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        double x;
        if (!ParseWholeDouble(v, &x) || !std::isfinite(x) || x < 0)
          return "expected a number of seconds >= 0 (e.g. 0.5), got '" + v + "'";
        return {};
      },
      "SECONDS");
}

// Integer flags' checks, with errors that say what is wanted (CLI11's PositiveNumber and
// NonNegativeNumber print their range up to DBL_MAX in full). Every value of a list is checked.
inline CLI::Validator IntCheck(long long least, const std::string& what) {
  return CLI::Validator(
      [least, what](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(v.c_str(), &end, 10);
        if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE || x < least)
          return "expected " + what + ", got '" + v + "'";
        return {};
      },
      "INT");
}
inline CLI::Validator PositiveInt() { return IntCheck(1, "a positive integer"); }
inline CLI::Validator NonNegativeInt() { return IntCheck(0, "an integer >= 0"); }

// A share in [0, 1] (e.g. 0.01).
inline CLI::Validator ShareCheck() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        double x;
        if (!ParseWholeDouble(v, &x) || !(x >= 0 && x <= 1))
          return "expected a share between 0 and 1 (e.g. 0.01), got '" + v + "'";
        return {};
      },
      "SHARE");
}

// The model of a command that takes it as a positional MODEL or as -m MODEL (profile, sweep): two
// options, neither marked required by CLI11 (its help would mark both); Resolve wants exactly one
// path, or the same path twice.
struct ModelArg {
  std::string positional, flag;

  void Setup(CLI::App* sub, const std::string& what) {
    sub->add_option("model", positional, what + ": MODEL or -m MODEL (one of the two is required)");
    sub->add_option("-m,--model", flag, what + ": the same as the positional MODEL (give one of the two)");
  }
  Result<std::string> Resolve() const {
    if (positional.empty() && flag.empty()) return Status::InvalidArgument("give the model: MODEL or -m MODEL");
    if (!positional.empty() && !flag.empty() && positional != flag)
      return Status::InvalidArgument("two models given, '" + positional + "' and -m '" + flag +
                                     "': give one, as MODEL or -m MODEL");
    return positional.empty() ? flag : positional;
  }
};

// --budget SIZE, checked at parse time with ParseBudget: an empty or zero value is an error (it
// would otherwise read as "no budget" and run with every expert resident).
inline CLI::Option* AddBudgetFlag(CLI::App* sub, std::string* budget, const std::string& help) {
  return sub->add_option("--budget", *budget, help)
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            Result<uint64_t> bytes = ParseBudget(v);
            return bytes.ok() ? std::string() : bytes.status().message();
          },
          "SIZE"));
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

// --expert-cache: "auto" (with --budget: the budget left over keeps experts between requests),
// "0" (none) or a size (at most that much); parse with ParseExpertCache
// (EngineOptions::expert_cache_bytes).
inline CLI::Option* AddExpertCacheFlag(CLI::App* sub, std::string* cache, const std::string& default_text) {
  return sub->add_option("--expert-cache", *cache,
                         "packed models with --budget: memory that keeps the most-routed experts resident between "
                         "requests (batches): auto (what the budget leaves over), 0 (none) or a size such as 512M "
                         "(default " + default_text + ")");
}

inline Result<int64_t> ParseExpertCache(const std::string& text) {
  if (text == "auto") return int64_t{-1};
  Result<uint64_t> bytes = ParseSize(text);
  if (!bytes.ok()) return Status::InvalidArgument("--expert-cache: " + bytes.status().message() + ", or auto");
  return static_cast<int64_t>(*bytes);
}

}  // namespace estream::cli
