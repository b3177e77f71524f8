#include "estream/options.h"

namespace estream {

const char* ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kOnDemand: return "on-demand";
    case Schedule::kAfterRouting: return "after-routing";
    case Schedule::kEarly: return "early";
  }
  return "?";
}

Result<Schedule> ParseSchedule(std::string_view name) {
  for (Schedule s : kAllSchedules) {
    if (name == ScheduleName(s)) return s;
  }
  return Status::InvalidArgument("unknown schedule '" + std::string(name) +
                                 "': use on-demand, after-routing or early");
}

const char* IoBackendName(IoBackend b) {
  switch (b) {
    case IoBackend::kAuto: return "auto";
    case IoBackend::kIoUring: return "io_uring";
    case IoBackend::kPread: return "pread";
  }
  return "?";
}

Result<IoBackend> ParseIoBackend(std::string_view name) {
  if (name == "auto" || name == "uring") return IoBackend::kAuto;
  if (name == "io_uring") return IoBackend::kIoUring;
  if (name == "pread") return IoBackend::kPread;
  return Status::InvalidArgument("unknown I/O backend '" + std::string(name) + "': use uring (io_uring, else pread), io_uring or pread");
}

const char* ConfigSourceName(ConfigSource s) {
  switch (s) {
    case ConfigSource::kExplicit: return "explicit";
    case ConfigSource::kStored: return "stored";
    case ConfigSource::kProfile: return "profile";
    case ConfigSource::kRule: return "rule";
  }
  return "?";
}

std::string ConfigSourceString(ConfigSource s, std::string_view note) {
  std::string out = ConfigSourceName(s);
  if (!note.empty()) out += " (" + std::string(note) + ")";
  return out;
}

}  // namespace estream
