#include "profiler/disk.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/json_text.h"
#include "base/memory.h"
#include "base/mutex.h"
#include "base/stats.h"
#include "base/timer.h"
#include "io/file.h"

namespace estream::profiler {
namespace {

constexpr int kCacheVersion = 1;

// One group read: a contiguous range of the packed file.
struct Range {
  uint64_t offset = 0;
  size_t length = 0;
};

// Every full group of size g over all layers, in an order that spreads consecutive reads over
// the file: a fixed stride through the list, coprime with its length.
std::vector<Range> GroupRanges(const io::PackedModelInfo& layout, int g) {
  std::vector<Range> all;
  for (const io::PackedLayerInfo& li : layout.layers)
    for (int q = 0; q * g < li.n_expert; ++q)
      if (li.GroupRecords(q, g) == g) all.push_back({li.GroupOffset(q, g), static_cast<size_t>(li.GroupBytes(q, g))});
  const size_t n = all.size();
  if (n <= 2) return all;
  size_t stride = static_cast<size_t>(static_cast<double>(n) * 0.618) | 1;
  while (std::gcd(stride, n) != 1) ++stride;
  std::vector<Range> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = all[(i * stride) % n];
  return out;
}

struct ReadTimes {
  double submit_s = 0, start_s = 0, end_s = 0;
  uint64_t bytes = 0;
};

// Reads `ranges` (in order) through a fresh loader of depth q. one_at_a_time: each read is
// submitted after the previous one completed (latency); else as many are kept submitted as can
// have chunks in flight, plus one (bandwidth). Returns each read's times.
Result<std::vector<ReadTimes>> RunReads(io::File* file, const std::vector<Range>& ranges, int q, size_t chunk_bytes,
                                        IoBackend backend, bool one_at_a_time) {
  ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<io::Loader> loader,
                           io::Loader::Create({.backend = backend, .queue_depth = q, .chunk_bytes = chunk_bytes}));
  size_t longest = 0;
  for (const Range& r : ranges) longest = std::max(longest, r.length);
  const size_t align = std::max<size_t>(file->alignment(), io::kDirectIoAlignment);
  const size_t capacity = (longest + align - 1) / align * align;
  const size_t chunk = loader->chunk_bytes();
  const size_t n_buffers =
      one_at_a_time ? 1 : std::min(ranges.size(), (static_cast<size_t>(q) * chunk + longest - 1) / longest + 1);
  std::vector<AlignedPtr<uint8_t>> buffers;
  for (size_t i = 0; i < n_buffers; ++i) {
    buffers.push_back(AllocAligned<uint8_t>(capacity, io::kDirectIoAlignment));
    if (!buffers.back())
      return Status::ResourceExhausted(fmt::format("disk characterisation: cannot allocate {} read buffers of {} bytes",
                                                   n_buffers, capacity));
  }
  // Shared with the loader's completion callbacks.
  struct State {
    Mutex mutex;
    CondVar cv{&mutex};
    std::vector<size_t> free_buffers ESTREAM_GUARDED_BY(mutex);
    std::vector<ReadTimes> times ESTREAM_GUARDED_BY(mutex);
    size_t done ESTREAM_GUARDED_BY(mutex) = 0;
    Status error ESTREAM_GUARDED_BY(mutex);
  } st;
  {
    MutexLock lock(&st.mutex);
    for (size_t i = 0; i < n_buffers; ++i) st.free_buffers.push_back(i);
    st.times.resize(ranges.size());
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    size_t buf;
    {
      MutexLock lock(&st.mutex);
      while (st.free_buffers.empty()) st.cv.Wait();
      if (!st.error.ok()) break;
      buf = st.free_buffers.back();
      st.free_buffers.pop_back();
    }
    io::ReadRequest req{.file = file,
                        .offset = ranges[i].offset,
                        .length = ranges[i].length,
                        .dst = buffers[buf].get(),
                        .dst_capacity = capacity,
                        .label = fmt::format("disk characterisation read {}", i),
                        .done = [&st, i, buf](const io::ReadResult& r) {
                          MutexLock lock(&st.mutex);
                          st.times[i] = {.submit_s = r.submit_s, .start_s = r.start_s, .end_s = r.end_s,
                                         .bytes = r.bytes_read};
                          if (r.outcome != io::ReadOutcome::kOk && st.error.ok())
                            st.error = r.outcome == io::ReadOutcome::kFailed
                                           ? r.status
                                           : Status::Internal("disk characterisation: a read was cancelled");
                          st.free_buffers.push_back(buf);
                          ++st.done;
                          st.cv.SignalAll();
                        }};
    Result<uint64_t> id = loader->Submit(std::move(req));
    if (!id.ok()) {
      MutexLock lock(&st.mutex);
      st.free_buffers.push_back(buf);
      if (st.error.ok()) st.error = id.status();
      break;
    }
  }
  loader->Drain();
  MutexLock lock(&st.mutex);
  if (!st.error.ok()) return st.error;
  return st.times;
}

std::string Gbps(double bytes_per_s) { return fmt::format("{:.2f}", bytes_per_s / 1e9); }

}  // namespace

Result<config::DiskProfile> MeasureDisk(const io::PackedModelInfo& layout, const DiskParams& params) {
  if (params.queue_depths.empty() || params.group_sizes.empty() || params.min_reads < 1 || params.latency_reads < 1 ||
      params.chunk_bytes == 0)
    return Status::InvalidArgument("disk characterisation: give group sizes, queue depths, chunk bytes and read "
                                   "counts >= 1");
  config::DiskProfile out;
  out.queue_depths = params.queue_depths;
  std::sort(out.queue_depths.begin(), out.queue_depths.end());
  out.queue_depths.erase(std::unique(out.queue_depths.begin(), out.queue_depths.end()), out.queue_depths.end());
  int min_experts = layout.n_expert;
  for (const io::PackedLayerInfo& li : layout.layers) min_experts = std::min(min_experts, li.n_expert);
  std::vector<int> sizes = params.group_sizes;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (int g : sizes)
    if (g >= 1 && g <= min_experts) out.group_sizes.push_back(g);
  if (out.group_sizes.empty() || out.queue_depths.front() < 1)
    return Status::InvalidArgument(fmt::format("{}: no candidate group size fits the model's {} experts per layer",
                                               layout.file, min_experts));
  ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<io::PosixFile> file, io::PosixFile::Open(layout.file, {.direct = true}));
  if (!file->direct() && params.progress)
    params.progress(fmt::format("disk: {}: O_DIRECT refused by the file system: buffered reads (page cache) measured",
                                layout.file));
  // The loader rounds its chunk to the direct-I/O alignment.
  const size_t chunk = (params.chunk_bytes + io::kDirectIoAlignment - 1) / io::kDirectIoAlignment * io::kDirectIoAlignment;
  out.chunk_bytes = chunk;
  const size_t nq = out.queue_depths.size();
  for (int g : out.group_sizes) {
    const std::vector<Range> ranges = GroupRanges(layout, g);
    const size_t bytes = ranges.front().length;
    size_t next = 0;  // position in `ranges`, continued over cells so cells read different groups
    auto take = [&](size_t n) {
      std::vector<Range> r(n);
      for (size_t i = 0; i < n; ++i) r[i] = ranges[next++ % ranges.size()];
      return r;
    };
    // This g's row alone, for Q0 and the interpolated bandwidth.
    config::DiskProfile row{.chunk_bytes = chunk, .queue_depths = out.queue_depths, .group_sizes = {g},
                            .bandwidth = {}, .latency_s = {0}};
    for (int q : out.queue_depths) {
      // Enough reads for the cell's bytes, and to keep q chunks in flight twice over.
      const size_t for_bytes = static_cast<size_t>((params.cell_bytes + bytes - 1) / bytes);
      const size_t for_depth = 2 * ((static_cast<size_t>(q) * chunk + bytes - 1) / bytes);
      const size_t n = std::max({for_bytes, for_depth, static_cast<size_t>(params.min_reads)});
      ESTREAM_ASSIGN_OR_RETURN(std::vector<ReadTimes> t,
                               RunReads(file.get(), take(n), q, chunk, params.backend, /*one_at_a_time=*/false));
      double first = t.front().submit_s, last = 0;
      uint64_t total = 0;
      for (const ReadTimes& r : t) {
        first = std::min(first, r.submit_s);
        last = std::max(last, r.end_s);
        total += r.bytes;
      }
      row.bandwidth.push_back(static_cast<float>(static_cast<double>(total) / std::max(last - first, 1e-9)));
    }
    // Latency at Q0(g): isolated reads.
    const int q0 = row.Q0(g);
    const int n_lat = static_cast<int>(std::clamp<uint64_t>(params.cell_bytes / bytes, 1, params.latency_reads));
    ESTREAM_ASSIGN_OR_RETURN(std::vector<ReadTimes> t,
                             RunReads(file.get(), take(n_lat), q0, chunk, params.backend, /*one_at_a_time=*/true));
    std::vector<double> secs;
    for (const ReadTimes& r : t) secs.push_back(r.end_s - r.submit_s);
    const double transfer = static_cast<double>(bytes) / row.Bandwidth(g, q0);
    const float latency = static_cast<float>(std::max(0.0, Median(secs) - transfer));
    out.bandwidth.insert(out.bandwidth.end(), row.bandwidth.begin(), row.bandwidth.end());
    out.latency_s.push_back(latency);
    if (params.progress) {
      std::string gbps;
      for (float bw : row.bandwidth) gbps += " " + Gbps(bw);
      params.progress(fmt::format("disk: G={} ({:.2f} MiB reads), GB/s at Q={}:{}; Q0 {}, latency {:.0f} us", g,
                                  static_cast<double>(bytes) / (1 << 20), fmt::join(out.queue_depths, ","), gbps, q0,
                                  latency * 1e6));
    }
  }
  ESTREAM_CHECK(out.bandwidth.size() == out.group_sizes.size() * nq, "MeasureDisk: table shape");
  ESTREAM_RETURN_IF_ERROR(out.Validate());
  return out;
}

std::string DiskCacheDir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg != '\0') return (std::filesystem::path(xdg) / "estream").string();
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return (std::filesystem::path(home) / ".cache" / "estream").string();
  return "";
}

Result<DiskCacheKey> DiskKeyOf(const std::string& model_path, uint64_t chunk_bytes, uint64_t record_bytes) {
  struct stat sb {};
  if (::stat(model_path.c_str(), &sb) != 0)
    return Status::IOError(fmt::format("{}: cannot stat: {}", model_path, std::strerror(errno)));
  return DiskCacheKey{.major = static_cast<uint32_t>(major(sb.st_dev)),
                      .minor = static_cast<uint32_t>(minor(sb.st_dev)),
                      .chunk_bytes = chunk_bytes,
                      .record_bytes = record_bytes};
}

std::string DiskCachePath(const std::string& dir, const DiskCacheKey& key) {
  return (std::filesystem::path(dir) / fmt::format("disk-{}:{}.json", key.major, key.minor)).string();
}

namespace {

std::string DeviceName(const DiskCacheKey& key) { return fmt::format("{}:{}", key.major, key.minor); }

// The whole cache file: Corruption naming the path for anything malformed. found = false when
// the file does not exist.
struct CacheFile {
  bool exists = false;
  nlohmann::json doc;
};

Result<CacheFile> ReadCacheFile(const std::string& path) {
  CacheFile out;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return out;
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError(fmt::format("{}: cannot open the disk cache: {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  out.exists = true;
  out.doc = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (out.doc.is_discarded() || !out.doc.is_object())
    return Status::Corruption(fmt::format("{}: the disk cache is not a JSON object", path));
  if (!out.doc.contains("version") || !out.doc["version"].is_number_integer() || out.doc["version"] != kCacheVersion)
    return Status::Corruption(fmt::format("{}: the disk cache has no \"version\": {}", path, kCacheVersion));
  if (!out.doc.contains("entries") || !out.doc["entries"].is_array())
    return Status::Corruption(fmt::format("{}: the disk cache has no \"entries\" array", path));
  return out;
}

// Parses one entry; Corruption naming the field.
Result<config::DiskProfile> ParseEntry(const nlohmann::json& e, const std::string& path, size_t index) {
  const std::string where = fmt::format("{}: entries[{}]", path, index);
  config::DiskProfile p;
  try {
    p.chunk_bytes = e.at("chunk_bytes").get<uint64_t>();
    p.queue_depths = e.at("queue_depths").get<std::vector<int>>();
    p.group_sizes = e.at("group_sizes").get<std::vector<int>>();
    p.bandwidth = e.at("bandwidth").get<std::vector<float>>();
    p.latency_s = e.at("latency_seconds").get<std::vector<float>>();
  } catch (const nlohmann::json::exception& ex) {
    return Status::Corruption(fmt::format("{}: {}", where, ex.what()));
  }
  Status s = p.Validate();
  if (!s.ok()) return Status::Corruption(fmt::format("{}: {}", where, s.message()));
  return p;
}

bool EntryMatches(const nlohmann::json& e, const DiskCacheKey& key) {
  return e.is_object() && e.contains("chunk_bytes") && e["chunk_bytes"].is_number_unsigned() &&
         e["chunk_bytes"].get<uint64_t>() == key.chunk_bytes && e.contains("record_bytes") &&
         e["record_bytes"].is_number_unsigned() && e["record_bytes"].get<uint64_t>() == key.record_bytes;
}

}  // namespace

Result<CachedDisk> LoadDiskCache(const std::string& path, const DiskCacheKey& key, const std::vector<int>& group_sizes,
                                 const std::vector<int>& queue_depths) {
  ESTREAM_ASSIGN_OR_RETURN(CacheFile file, ReadCacheFile(path));
  CachedDisk out;
  if (!file.exists) return out;
  if (!file.doc.contains("device") || file.doc["device"] != DeviceName(key))
    return Status::Corruption(fmt::format("{}: \"device\" is not {} (the file's name)", path, DeviceName(key)));
  const nlohmann::json& entries = file.doc["entries"];
  for (size_t i = 0; i < entries.size(); ++i) {
    ESTREAM_ASSIGN_OR_RETURN(config::DiskProfile p, ParseEntry(entries[i], path, i));
    if (!EntryMatches(entries[i], key)) continue;
    // Cut the table to the requested sizes and depths; absent ones: not found (re-measure).
    std::vector<int> rows, cols;
    for (int g : group_sizes) {
      auto it = std::find(p.group_sizes.begin(), p.group_sizes.end(), g);
      if (it == p.group_sizes.end()) return out;
      rows.push_back(static_cast<int>(it - p.group_sizes.begin()));
    }
    for (int q : queue_depths) {
      auto it = std::find(p.queue_depths.begin(), p.queue_depths.end(), q);
      if (it == p.queue_depths.end()) return out;
      cols.push_back(static_cast<int>(it - p.queue_depths.begin()));
    }
    config::DiskProfile cut;
    cut.chunk_bytes = p.chunk_bytes;
    cut.group_sizes = group_sizes;
    cut.queue_depths = queue_depths;
    for (int r : rows) {
      cut.latency_s.push_back(p.latency_s[r]);
      for (int c : cols) cut.bandwidth.push_back(p.bandwidth[static_cast<size_t>(r) * p.queue_depths.size() + c]);
    }
    Status s = cut.Validate();
    if (!s.ok()) return Status::InvalidArgument(fmt::format("{}: requested table: {}", path, s.message()));
    out.found = true;
    out.profile = std::move(cut);
    return out;
  }
  return out;
}

Status StoreDiskCache(const std::string& path, const DiskCacheKey& key, const config::DiskProfile& profile) {
  nlohmann::json doc;
  Result<CacheFile> old = ReadCacheFile(path);
  if (old.ok() && old->exists && old->doc.contains("device") && old->doc["device"] == DeviceName(key)) {
    doc = std::move(old->doc);
  } else {
    doc = {{"version", kCacheVersion}, {"device", DeviceName(key)}, {"entries", nlohmann::json::array()}};
  }
  nlohmann::json entry{{"chunk_bytes", key.chunk_bytes},
                       {"record_bytes", key.record_bytes},
                       {"measured_unix", static_cast<int64_t>(std::time(nullptr))},
                       {"queue_depths", profile.queue_depths},
                       {"group_sizes", profile.group_sizes},
                       {"bandwidth", profile.bandwidth},
                       {"latency_seconds", profile.latency_s}};
  // Other keys' valid entries stay; this key's entry and anything malformed go.
  nlohmann::json kept = nlohmann::json::array();
  for (size_t i = 0; i < doc["entries"].size(); ++i) {
    const nlohmann::json& e = doc["entries"][i];
    const bool keyed = e.is_object() && e.contains("record_bytes") && e["record_bytes"].is_number_unsigned();
    if (keyed && !EntryMatches(e, key) && ParseEntry(e, path, i).ok()) kept.push_back(e);
  }
  kept.push_back(std::move(entry));
  doc["entries"] = std::move(kept);

  std::error_code ec;
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  if (ec) return Status::IOError(fmt::format("{}: cannot create the cache directory: {}", path, ec.message()));
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << DumpJson(doc, 1) << "\n";
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return Status::IOError(fmt::format("{}: cannot write the disk cache", tmp));
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ec2;
    std::filesystem::remove(tmp, ec2);
    return Status::IOError(fmt::format("{}: cannot rename the disk cache into place: {}", path, ec.message()));
  }
  return Status::Ok();
}

Result<DiskResult> CharacteriseDisk(const io::PackedModelInfo& layout, const DiskParams& params, bool refresh,
                                    const std::string& cache_dir) {
  const Timer timer;
  DiskResult out;
  uint64_t record = 0;
  int min_experts = layout.n_expert;
  for (const io::PackedLayerInfo& li : layout.layers) {
    record = std::max(record, li.record_bytes);
    min_experts = std::min(min_experts, li.n_expert);
  }
  std::vector<int> sizes, depths = params.queue_depths;
  for (int g : params.group_sizes)
    if (g >= 1 && g <= min_experts) sizes.push_back(g);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::sort(depths.begin(), depths.end());
  depths.erase(std::unique(depths.begin(), depths.end()), depths.end());
  const uint64_t chunk = (params.chunk_bytes + io::kDirectIoAlignment - 1) / io::kDirectIoAlignment * io::kDirectIoAlignment;
  const std::string dir = cache_dir.empty() ? DiskCacheDir() : (cache_dir == "-" ? "" : cache_dir);
  DiskCacheKey key;
  if (!dir.empty()) {
    ESTREAM_ASSIGN_OR_RETURN(key, DiskKeyOf(layout.file, chunk, record));
    out.cache_path = DiskCachePath(dir, key);
    if (!refresh && !sizes.empty()) {
      Result<CachedDisk> cached = LoadDiskCache(out.cache_path, key, sizes, depths);
      if (!cached.ok()) {
        out.warning = fmt::format("{}; measuring the disk again", cached.status().message());
      } else if (cached->found) {
        out.profile = std::move(cached->profile);
        out.cached = true;
        out.seconds = timer.Seconds();
        return out;
      }
    }
  }
  ESTREAM_ASSIGN_OR_RETURN(out.profile, MeasureDisk(layout, params));
  if (!out.cache_path.empty()) {
    Status s = StoreDiskCache(out.cache_path, key, out.profile);
    if (!s.ok()) out.warning += (out.warning.empty() ? "" : "; ") + s.message();
  }
  out.seconds = timer.Seconds();
  return out;
}

}  // namespace estream::profiler
