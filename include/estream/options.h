// The words of estream's configuration, defined once: the expert read schedule, the read
// backend, and where a streamed model's configuration came from. The engine options
// (engine.h), the pipeline, the configurator, the profiler and the tools all use these types
// and these names (the names are also the CLI's flag values and the JSON fields' values).
#pragma once

#include <string>
#include <string_view>

#include "estream/status.h"

namespace estream {

// When the expert groups of a packed model are read (docs/DESIGN.md, "Schedules"):
//   kOnDemand      a group is read when the compute thread needs it (every read on the critical path);
//   kAfterRouting  a layer's active groups are read once its router has run;
//   kEarly         all of a layer's groups are planned when the layer starts, the inactive ones
//                  dropped after routing, and reading runs on into the next layer.
enum class Schedule : int { kOnDemand = 0, kAfterRouting = 1, kEarly = 2 };
inline constexpr Schedule kAllSchedules[] = {Schedule::kOnDemand, Schedule::kAfterRouting, Schedule::kEarly};
// "on-demand", "after-routing", "early".
const char* ScheduleName(Schedule s);
// Inverse of ScheduleName; InvalidArgument listing the three names otherwise.
Result<Schedule> ParseSchedule(std::string_view name);

// How expert records are read: io_uring, or pread on a thread; kAuto: io_uring when the kernel
// allows it, else pread (kIoUring: an error when unavailable).
enum class IoBackend { kAuto, kIoUring, kPread };
// "auto", "io_uring", "pread".
const char* IoBackendName(IoBackend b);
// "auto" or "uring" (the CLI's --io value: io_uring, pread when unavailable): kAuto; "io_uring":
// kIoUring (an error when unavailable); "pread": kPread. InvalidArgument otherwise.
Result<IoBackend> ParseIoBackend(std::string_view name);

// Where the group size G, the bank count B and the queue depth Q of a streamed model came from:
//   kExplicit  the options (EngineOptions::group_size / banks / queue_depth, or no budget);
//   kStored    the configurator's choice stored in the file by `estream profile` for this budget
//              and schedule;
//   kProfile   re-solved from the profile stored in the file for this budget;
//   kRule      no usable stored profile: the default rule (largest G <= 8 with two banks).
enum class ConfigSource { kExplicit, kStored, kProfile, kRule };
// "explicit", "stored", "profile", "rule".
const char* ConfigSourceName(ConfigSource s);
// "<name>" or "<name> (<note>)" when the note is not empty (Response::StreamConfig::source).
std::string ConfigSourceString(ConfigSource s, std::string_view note);

}  // namespace estream
