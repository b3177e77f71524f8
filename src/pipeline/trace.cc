#include "pipeline/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace estream::pipeline {

void TraceRecorder::Add(TraceEvent event) {
  MutexLock lock(&mutex_);
  events_.push_back(std::move(event));
}

void TraceRecorder::Clear() {
  MutexLock lock(&mutex_);
  events_.clear();
}

size_t TraceRecorder::size() const {
  MutexLock lock(&mutex_);
  return events_.size();
}

std::vector<TraceEvent> TraceRecorder::Events() const {
  MutexLock lock(&mutex_);
  return events_;
}

namespace {
// Event names are ours ("layer 3 group 5", "attention"): escape only what JSON requires.
std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(ch));
    } else {
      out += ch;
    }
  }
  return out;
}
}  // namespace

Status TraceRecorder::WriteJson(const std::string& path) const {
  std::vector<TraceEvent> events;
  {
    MutexLock lock(&mutex_);
    events = events_;
  }
  std::sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.start_s < b.start_s; });
  const double t0 = events.empty() ? 0 : events.front().start_s;
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return Status::IOError(path + ": cannot create the trace file: " + std::strerror(errno));
  std::string out = "{\"traceEvents\": [\n";
  // A lane is named only when it has events: the engine checks checksums on the compute threads,
  // so its traces have two lanes; the feeder's lane appears where the streamer verifies reads
  // itself (StreamParams::verify_checksums).
  const char* lanes[] = {"", "compute", "loader (reads)", "feeder (checksums)"};
  const bool feeder_used =
      std::any_of(events.begin(), events.end(), [](const TraceEvent& e) { return e.tid == kFeederTid; });
  for (int tid = 1; tid <= 3; ++tid) {
    if (tid == kFeederTid && !feeder_used) continue;
    out += fmt::format("{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": {}, \"args\": {{\"name\": \"{}\"}}}},\n",
                       tid, lanes[tid]);
  }
  for (size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    out += fmt::format("{{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"X\", \"pid\": 1, \"tid\": {}, \"ts\": {:.3f}, "
                       "\"dur\": {:.3f}, \"args\": {{",
                       JsonEscape(e.name), e.category, e.tid, (e.start_s - t0) * 1e6, std::max(0.0, e.dur_s) * 1e6);
    for (size_t a = 0; a < e.args.size(); ++a)
      out += fmt::format("{}\"{}\": {}", a ? ", " : "", e.args[a].first, e.args[a].second);
    out += i + 1 < events.size() ? "}},\n" : "}}\n";
  }
  out += "], \"displayTimeUnit\": \"ms\"}\n";
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !ok) return Status::IOError(path + ": cannot write the trace file: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace estream::pipeline
