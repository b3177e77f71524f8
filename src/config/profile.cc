#include "config/profile.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include <fmt/format.h>

namespace estream::config {

// ---- DiskProfile ----------------------------------------------------------------------------

int DiskProfile::RowFor(int g) const {
  ESTREAM_CHECK(!group_sizes.empty(), "DiskProfile::RowFor: empty table");
  int best = 0;
  double best_dist = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < group_sizes.size(); ++i) {
    if (group_sizes[i] == g) return static_cast<int>(i);
    const double dist = std::fabs(std::log2(static_cast<double>(group_sizes[i])) - std::log2(static_cast<double>(g)));
    if (dist < best_dist) {  // strict: ties keep the smaller (earlier) size
      best_dist = dist;
      best = static_cast<int>(i);
    }
  }
  return best;
}

double DiskProfile::Bandwidth(int g, int q) const {
  const size_t nq = queue_depths.size();
  const float* row = bandwidth.data() + static_cast<size_t>(RowFor(g)) * nq;
  // The envelope: the running maximum of the row up to each measured depth.
  auto env = [&](size_t j) { return static_cast<double>(*std::max_element(row, row + j + 1)); };
  if (q <= queue_depths.front()) return env(0);
  if (q >= queue_depths.back()) return env(nq - 1);
  size_t hi = 1;
  while (queue_depths[hi] < q) ++hi;
  const double t = static_cast<double>(q - queue_depths[hi - 1]) / (queue_depths[hi] - queue_depths[hi - 1]);
  return env(hi - 1) + t * (env(hi) - env(hi - 1));
}

int DiskProfile::Q0(int g, double fraction) const {
  const size_t nq = queue_depths.size();
  const float* row = bandwidth.data() + static_cast<size_t>(RowFor(g)) * nq;
  const float peak = *std::max_element(row, row + nq);
  for (size_t j = 0; j < nq; ++j) {
    if (row[j] >= fraction * peak) return queue_depths[j];
  }
  return queue_depths.back();  // unreachable: the peak itself qualifies
}

namespace {

bool FinitePositive(double v) { return std::isfinite(v) && v > 0; }
bool FiniteNonNegative(double v) { return std::isfinite(v) && v >= 0; }

template <typename T>
bool StrictlyAscendingPositive(const std::vector<T>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 1 || (i > 0 && v[i] <= v[i - 1])) return false;
  }
  return true;
}

}  // namespace

Status DiskProfile::Validate() const {
  if (queue_depths.empty() || !StrictlyAscendingPositive(queue_depths)) {
    return Status::InvalidArgument("disk profile: queue_depths must be non-empty, >= 1 and strictly ascending");
  }
  if (group_sizes.empty() || !StrictlyAscendingPositive(group_sizes)) {
    return Status::InvalidArgument("disk profile: group_sizes must be non-empty, >= 1 and strictly ascending");
  }
  if (bandwidth.size() != group_sizes.size() * queue_depths.size()) {
    return Status::InvalidArgument(fmt::format("disk profile: bandwidth has {} values, want group_sizes x queue_depths = {}",
                                               bandwidth.size(), group_sizes.size() * queue_depths.size()));
  }
  for (size_t i = 0; i < bandwidth.size(); ++i) {
    if (!FinitePositive(bandwidth[i])) {
      return Status::InvalidArgument(fmt::format("disk profile: bandwidth[{}] = {} is not > 0", i, bandwidth[i]));
    }
  }
  if (latency_s.size() != group_sizes.size()) {
    return Status::InvalidArgument(fmt::format("disk profile: latency_seconds has {} values, want one per group size ({})",
                                               latency_s.size(), group_sizes.size()));
  }
  for (size_t i = 0; i < latency_s.size(); ++i) {
    if (!FiniteNonNegative(latency_s[i])) {
      return Status::InvalidArgument(fmt::format("disk profile: latency_seconds[{}] = {} is not >= 0", i, latency_s[i]));
    }
  }
  if (chunk_bytes == 0) return Status::InvalidArgument("disk profile: chunk_bytes must be >= 1");
  return Status::Ok();
}

// ---- Profile --------------------------------------------------------------------------------

const CalibrationRun* Profile::Run(int g) const {
  for (const CalibrationRun& r : runs) {
    if (r.group_size == g) return &r;
  }
  return nullptr;
}

uint64_t Profile::TotalExpertBytes() const {
  uint64_t sum = 0;
  for (uint64_t b : record_bytes) sum += b;
  return sum * static_cast<uint64_t>(n_expert);
}

Status Profile::Validate() const {
  if (n_layer < 1 || n_expert < 1) {
    return Status::InvalidArgument(fmt::format("profile: n_layer = {} and n_expert = {} must be >= 1", n_layer, n_expert));
  }
  const size_t w = static_cast<size_t>(n_layer);
  if (expert_bytes < 1) return Status::InvalidArgument("profile: expert_bytes must be >= 1");
  if (record_bytes.size() != w) {
    return Status::InvalidArgument(fmt::format("profile: record_bytes has {} values, want n_layer = {}", record_bytes.size(), w));
  }
  for (size_t i = 0; i < w; ++i) {
    if (record_bytes[i] < 1 || record_bytes[i] > expert_bytes) {
      return Status::InvalidArgument(fmt::format("profile: record_bytes[{}] = {} is not in [1, expert_bytes = {}]", i,
                                                 record_bytes[i], expert_bytes));
    }
  }
  if (!FiniteNonNegative(other_seconds)) {
    return Status::InvalidArgument(fmt::format("profile: other_seconds = {} is not >= 0", other_seconds));
  }
  if (nonexpert_seconds.size() != w) {
    return Status::InvalidArgument(
        fmt::format("profile: nonexpert_seconds has {} values, want n_layer = {}", nonexpert_seconds.size(), w));
  }
  for (size_t i = 0; i < w; ++i) {
    if (!FiniteNonNegative(nonexpert_seconds[i])) {
      return Status::InvalidArgument(fmt::format("profile: nonexpert_seconds[{}] = {} is not >= 0", i, nonexpert_seconds[i]));
    }
  }
  if (expert_routes.size() != w * static_cast<size_t>(n_expert)) {
    return Status::InvalidArgument(fmt::format("profile: expert_routes has {} values, want n_layer x n_expert = {}",
                                               expert_routes.size(), w * static_cast<size_t>(n_expert)));
  }
  ESTREAM_RETURN_IF_ERROR(disk.Validate());
  if (runs.empty()) return Status::InvalidArgument("profile: no calibration run");
  for (size_t i = 0; i < runs.size(); ++i) {
    const CalibrationRun& r = runs[i];
    if (r.group_size < 1 || r.group_size > n_expert || (i > 0 && r.group_size <= runs[i - 1].group_size)) {
      return Status::InvalidArgument(fmt::format(
          "profile: calibration group sizes must be strictly ascending in [1, n_expert = {}] (run {} has {})", n_expert,
          i, r.group_size));
    }
    if (!r.load_seconds.empty() && r.load_queue_depth < 1) {
      return Status::InvalidArgument(fmt::format("profile: calib {}: load_queue_depth must be >= 1", r.group_size));
    }
    for (float t : r.load_seconds) {
      if (!FinitePositive(t)) {
        return Status::InvalidArgument(fmt::format("profile: calib {}: load sample {} is not > 0", r.group_size, t));
      }
    }
    if (r.exec_rows.empty() || r.exec_rows.size() != r.exec_seconds.size()) {
      return Status::InvalidArgument(fmt::format("profile: calib {}: exec_rows ({}) and exec_seconds ({}) must be "
                                                 "non-empty and of equal length",
                                                 r.group_size, r.exec_rows.size(), r.exec_seconds.size()));
    }
    for (size_t k = 0; k < r.exec_rows.size(); ++k) {
      if (!FiniteNonNegative(r.exec_rows[k]) || !FiniteNonNegative(r.exec_seconds[k])) {
        return Status::InvalidArgument(fmt::format("profile: calib {}: exec sample {} ({} rows, {} s) is not >= 0",
                                                   r.group_size, k, r.exec_rows[k], r.exec_seconds[k]));
      }
    }
  }
  return Status::Ok();
}

// ---- GGUF key/values ------------------------------------------------------------------------

namespace {

constexpr char kP[] = "estream.profile.";
constexpr char kC[] = "estream.config.";

std::string PKey(std::string_view name) { return std::string(kP) + std::string(name); }
std::string CKey(std::string_view name) { return std::string(kC) + std::string(name); }
std::string CalibKey(int g, std::string_view name) { return fmt::format("{}calib.{}.{}", kP, g, name); }

GgufValue U32Array(const std::vector<uint32_t>& v) {
  std::vector<GgufValue> e;
  e.reserve(v.size());
  for (uint32_t x : v) e.push_back(GgufValue::U32(x));
  return GgufValue::Array(GgufType::kU32, std::move(e));
}
GgufValue U32ArrayOfInts(const std::vector<int>& v) {
  std::vector<uint32_t> u(v.begin(), v.end());
  return U32Array(u);
}
GgufValue U64Array(const std::vector<uint64_t>& v) {
  std::vector<GgufValue> e;
  e.reserve(v.size());
  for (uint64_t x : v) e.push_back(GgufValue::U64(x));
  return GgufValue::Array(GgufType::kU64, std::move(e));
}

bool IsUnsignedType(GgufType t) {
  return t == GgufType::kU8 || t == GgufType::kU16 || t == GgufType::kU32 || t == GgufType::kU64;
}
bool IsSignedType(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}

// Key lookup over a kv list, with typed getters whose errors name the source and the key.
class Reader {
 public:
  Reader(const std::vector<GgufKv>& kvs, std::string_view source, std::string_view prefix) : source_(source) {
    for (const GgufKv& kv : kvs) {
      if (kv.key.compare(0, prefix.size(), prefix) == 0) map_.emplace(kv.key, &kv.value);
    }
  }

  Status Error(std::string_view key, std::string_view what) const {
    return Status::Corruption(fmt::format("{}: key '{}': {}", source_, key, what));
  }
  const GgufValue* Find(const std::string& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }

  // Any integer type whose value lies in [0, max].
  Result<uint64_t> Uint(const std::string& key, uint64_t max) const {
    const GgufValue* v = Find(key);
    if (v == nullptr) return Error(key, "missing (run `estream profile` again to store a complete profile)");
    return ScalarUint(key, *v, max);
  }
  // An optional integer key: `absent` when missing, else checked as Uint.
  Result<uint64_t> OptionalUint(const std::string& key, uint64_t max, uint64_t absent) const {
    const GgufValue* v = Find(key);
    if (v == nullptr) return absent;
    return ScalarUint(key, *v, max);
  }
  Result<float> Float(const std::string& key) const {
    const GgufValue* v = Find(key);
    if (v == nullptr) return Error(key, "missing (run `estream profile` again to store a complete profile)");
    if (v->type != GgufType::kF32 && v->type != GgufType::kF64) {
      return Error(key, fmt::format("expected f32, found {}", GgufTypeName(v->type)));
    }
    return static_cast<float>(v->f);
  }
  Result<std::string> String(const std::string& key) const {
    const GgufValue* v = Find(key);
    if (v == nullptr) return Error(key, "missing (run `estream profile` again to store a complete profile)");
    if (v->type != GgufType::kString) return Error(key, fmt::format("expected string, found {}", GgufTypeName(v->type)));
    return v->str;
  }
  // Array of integers each in [0, max]; `count` < 0: any length.
  Result<std::vector<uint64_t>> UintArray(const std::string& key, int64_t count, uint64_t max) const {
    ESTREAM_ASSIGN_OR_RETURN(const GgufValue* v, Array(key, count));
    std::vector<uint64_t> out;
    out.reserve(v->array.size());
    for (size_t i = 0; i < v->array.size(); ++i) {
      ESTREAM_ASSIGN_OR_RETURN(uint64_t x, ScalarUint(fmt::format("{}[{}]", key, i), v->array[i], max));
      out.push_back(x);
    }
    return out;
  }
  Result<std::vector<float>> FloatArray(const std::string& key, int64_t count) const {
    ESTREAM_ASSIGN_OR_RETURN(const GgufValue* v, Array(key, count));
    if (!v->array.empty() && v->elem_type != GgufType::kF32 && v->elem_type != GgufType::kF64) {
      return Error(key, fmt::format("expected an f32 array, found an array of {}", GgufTypeName(v->elem_type)));
    }
    std::vector<float> out;
    out.reserve(v->array.size());
    for (const GgufValue& e : v->array) out.push_back(static_cast<float>(e.f));
    return out;
  }

 private:
  Result<const GgufValue*> Array(const std::string& key, int64_t count) const {
    const GgufValue* v = Find(key);
    if (v == nullptr) return Error(key, "missing (run `estream profile` again to store a complete profile)");
    if (v->type != GgufType::kArray) return Error(key, fmt::format("expected an array, found {}", GgufTypeName(v->type)));
    if (count >= 0 && v->array.size() != static_cast<uint64_t>(count)) {
      return Error(key, fmt::format("has {} elements, expected {}", v->array.size(), count));
    }
    return v;
  }
  Result<uint64_t> ScalarUint(const std::string& key, const GgufValue& v, uint64_t max) const {
    uint64_t x;
    if (IsUnsignedType(v.type)) {
      x = v.u;
    } else if (IsSignedType(v.type)) {
      if (v.i < 0) return Error(key, fmt::format("value {} is negative", v.i));
      x = static_cast<uint64_t>(v.i);
    } else {
      return Error(key, fmt::format("expected an integer, found {}", GgufTypeName(v.type)));
    }
    if (x > max) return Error(key, fmt::format("value {} is larger than {}", x, max));
    return x;
  }

  std::string source_;
  std::unordered_map<std::string, const GgufValue*> map_;
};

constexpr uint64_t kMaxInt = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
constexpr uint64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();

std::vector<int> ToInts(const std::vector<uint64_t>& v) { return std::vector<int>(v.begin(), v.end()); }

}  // namespace

std::vector<GgufKv> ProfileKvs(const Profile& p) {
  ESTREAM_CHECK(p.Validate().ok(), "ProfileKvs: invalid profile (call Validate first)");
  std::vector<GgufKv> kvs;
  auto add = [&](std::string key, GgufValue v) { kvs.push_back({std::move(key), std::move(v)}); };
  add(PKey("version"), GgufValue::U32(kProfileVersion));
  add(PKey("n_layer"), GgufValue::U32(static_cast<uint32_t>(p.n_layer)));
  add(PKey("n_expert"), GgufValue::U32(static_cast<uint32_t>(p.n_expert)));
  add(PKey("expert_bytes"), GgufValue::U64(p.expert_bytes));
  add(PKey("record_bytes"), U64Array(p.record_bytes));
  add(PKey("calib_tokens"), GgufValue::U32(p.calib_tokens));
  if (p.n_threads > 0) add(PKey("n_threads"), GgufValue::U32(p.n_threads));  // 0: unknown, no key
  add(PKey("other_seconds"), GgufValue::F32(p.other_seconds));
  add(PKey("nonexpert_seconds"), GgufValue::F32Array(p.nonexpert_seconds));
  add(PKey("expert_routes"), U32Array(p.expert_routes));
  add(PKey("disk.chunk_bytes"), GgufValue::U64(p.disk.chunk_bytes));
  add(PKey("disk.queue_depths"), U32ArrayOfInts(p.disk.queue_depths));
  add(PKey("disk.group_sizes"), U32ArrayOfInts(p.disk.group_sizes));
  add(PKey("disk.bandwidth"), GgufValue::F32Array(p.disk.bandwidth));
  add(PKey("disk.latency_seconds"), GgufValue::F32Array(p.disk.latency_s));
  std::vector<int> sizes;
  for (const CalibrationRun& r : p.runs) sizes.push_back(r.group_size);
  add(PKey("calib.group_sizes"), U32ArrayOfInts(sizes));
  for (const CalibrationRun& r : p.runs) {
    add(CalibKey(r.group_size, "other_bytes"), GgufValue::U64(r.other_bytes));
    add(CalibKey(r.group_size, "load_queue_depth"), GgufValue::U32(static_cast<uint32_t>(r.load_queue_depth)));
    add(CalibKey(r.group_size, "load_seconds"), GgufValue::F32Array(r.load_seconds));
    add(CalibKey(r.group_size, "exec_rows"), GgufValue::F32Array(r.exec_rows));
    add(CalibKey(r.group_size, "exec_seconds"), GgufValue::F32Array(r.exec_seconds));
  }
  return kvs;
}

bool HasProfile(const std::vector<GgufKv>& kvs) {
  const std::string key = PKey("version");
  return std::any_of(kvs.begin(), kvs.end(), [&](const GgufKv& kv) { return kv.key == key; });
}

Result<Profile> ParseProfile(const std::vector<GgufKv>& kvs, std::string_view source) {
  Reader r(kvs, source, kP);
  ESTREAM_ASSIGN_OR_RETURN(uint64_t version, r.Uint(PKey("version"), kMaxU32));
  if (version != kProfileVersion) {
    return Status::NotSupported(fmt::format("{}: key '{}': profile version {} is not supported (this build reads "
                                            "version {}); run `estream profile` again",
                                            source, PKey("version"), version, kProfileVersion));
  }
  Profile p;
  ESTREAM_ASSIGN_OR_RETURN(uint64_t n_layer, r.Uint(PKey("n_layer"), 1u << 20));
  ESTREAM_ASSIGN_OR_RETURN(uint64_t n_expert, r.Uint(PKey("n_expert"), 1u << 20));
  p.n_layer = static_cast<int>(n_layer);
  p.n_expert = static_cast<int>(n_expert);
  ESTREAM_ASSIGN_OR_RETURN(p.expert_bytes, r.Uint(PKey("expert_bytes"), kMaxU64));
  ESTREAM_ASSIGN_OR_RETURN(p.record_bytes, r.UintArray(PKey("record_bytes"), static_cast<int64_t>(n_layer), kMaxU64));
  ESTREAM_ASSIGN_OR_RETURN(uint64_t calib_tokens, r.Uint(PKey("calib_tokens"), kMaxU32));
  p.calib_tokens = static_cast<uint32_t>(calib_tokens);
  {
    ESTREAM_ASSIGN_OR_RETURN(uint64_t threads, r.OptionalUint(PKey("n_threads"), kMaxU32, 0));
    p.n_threads = static_cast<uint32_t>(threads);
  }
  ESTREAM_ASSIGN_OR_RETURN(p.other_seconds, r.Float(PKey("other_seconds")));
  ESTREAM_ASSIGN_OR_RETURN(p.nonexpert_seconds, r.FloatArray(PKey("nonexpert_seconds"), static_cast<int64_t>(n_layer)));
  {
    ESTREAM_ASSIGN_OR_RETURN(std::vector<uint64_t> routes,
                             r.UintArray(PKey("expert_routes"), static_cast<int64_t>(n_layer * n_expert), kMaxU32));
    p.expert_routes.assign(routes.begin(), routes.end());
  }
  ESTREAM_ASSIGN_OR_RETURN(p.disk.chunk_bytes, r.Uint(PKey("disk.chunk_bytes"), kMaxU64));
  {
    ESTREAM_ASSIGN_OR_RETURN(std::vector<uint64_t> qs, r.UintArray(PKey("disk.queue_depths"), -1, kMaxInt));
    ESTREAM_ASSIGN_OR_RETURN(std::vector<uint64_t> gs, r.UintArray(PKey("disk.group_sizes"), -1, kMaxInt));
    p.disk.queue_depths = ToInts(qs);
    p.disk.group_sizes = ToInts(gs);
  }
  ESTREAM_ASSIGN_OR_RETURN(
      p.disk.bandwidth,
      r.FloatArray(PKey("disk.bandwidth"), static_cast<int64_t>(p.disk.group_sizes.size() * p.disk.queue_depths.size())));
  ESTREAM_ASSIGN_OR_RETURN(p.disk.latency_s,
                           r.FloatArray(PKey("disk.latency_seconds"), static_cast<int64_t>(p.disk.group_sizes.size())));
  ESTREAM_ASSIGN_OR_RETURN(std::vector<uint64_t> sizes, r.UintArray(PKey("calib.group_sizes"), -1, kMaxInt));
  for (uint64_t g64 : sizes) {
    const int g = static_cast<int>(g64);
    CalibrationRun run;
    run.group_size = g;
    ESTREAM_ASSIGN_OR_RETURN(run.other_bytes, r.Uint(CalibKey(g, "other_bytes"), kMaxU64));
    ESTREAM_ASSIGN_OR_RETURN(uint64_t lq, r.Uint(CalibKey(g, "load_queue_depth"), kMaxInt));
    run.load_queue_depth = static_cast<int>(lq);
    ESTREAM_ASSIGN_OR_RETURN(run.load_seconds, r.FloatArray(CalibKey(g, "load_seconds"), -1));
    ESTREAM_ASSIGN_OR_RETURN(run.exec_rows, r.FloatArray(CalibKey(g, "exec_rows"), -1));
    ESTREAM_ASSIGN_OR_RETURN(run.exec_seconds,
                             r.FloatArray(CalibKey(g, "exec_seconds"), static_cast<int64_t>(run.exec_rows.size())));
    p.runs.push_back(std::move(run));
  }
  if (Status s = p.Validate(); !s.ok()) {
    return Status::Corruption(fmt::format("{}: estream.profile.*: {}", source, s.message()));
  }
  return p;
}

std::vector<GgufKv> ConfigKvs(const ConfigChoice& c) {
  std::vector<GgufKv> kvs;
  auto add = [&](std::string key, GgufValue v) { kvs.push_back({std::move(key), std::move(v)}); };
  add(CKey("version"), GgufValue::U32(kConfigVersion));
  add(CKey("group_size"), GgufValue::U32(static_cast<uint32_t>(c.group_size)));
  add(CKey("banks"), GgufValue::U32(static_cast<uint32_t>(c.banks)));
  add(CKey("queue_depth"), GgufValue::U32(static_cast<uint32_t>(c.queue_depth)));
  add(CKey("budget_bytes"), GgufValue::U64(c.budget_bytes));
  add(CKey("predicted_seconds"), GgufValue::F32(c.predicted_seconds));
  add(CKey("schedule"), GgufValue::String(ScheduleName(c.schedule)));
  if (c.n_threads > 0) add(CKey("n_threads"), GgufValue::U32(c.n_threads));  // 0: unknown, no key
  return kvs;
}

bool HasConfigChoice(const std::vector<GgufKv>& kvs) {
  const std::string key = CKey("version");
  return std::any_of(kvs.begin(), kvs.end(), [&](const GgufKv& kv) { return kv.key == key; });
}

Result<ConfigChoice> ParseConfigChoice(const std::vector<GgufKv>& kvs, std::string_view source) {
  Reader r(kvs, source, kC);
  ESTREAM_ASSIGN_OR_RETURN(uint64_t version, r.Uint(CKey("version"), kMaxU32));
  if (version != kConfigVersion) {
    return Status::NotSupported(fmt::format("{}: key '{}': configuration version {} is not supported (this build "
                                            "reads version {}); run `estream profile` again",
                                            source, CKey("version"), version, kConfigVersion));
  }
  ConfigChoice c;
  ESTREAM_ASSIGN_OR_RETURN(uint64_t g, r.Uint(CKey("group_size"), kMaxInt));
  ESTREAM_ASSIGN_OR_RETURN(uint64_t b, r.Uint(CKey("banks"), kMaxInt));
  ESTREAM_ASSIGN_OR_RETURN(uint64_t q, r.Uint(CKey("queue_depth"), kMaxInt));
  for (auto [name, v] : {std::pair{"group_size", g}, {"banks", b}, {"queue_depth", q}}) {
    if (v < 1) return r.Error(CKey(name), "must be >= 1");
  }
  c.group_size = static_cast<int>(g);
  c.banks = static_cast<int>(b);
  c.queue_depth = static_cast<int>(q);
  ESTREAM_ASSIGN_OR_RETURN(c.budget_bytes, r.Uint(CKey("budget_bytes"), kMaxU64));
  ESTREAM_ASSIGN_OR_RETURN(c.predicted_seconds, r.Float(CKey("predicted_seconds")));
  if (!FiniteNonNegative(c.predicted_seconds)) return r.Error(CKey("predicted_seconds"), "must be a time >= 0");
  ESTREAM_ASSIGN_OR_RETURN(std::string schedule, r.String(CKey("schedule")));
  Result<Schedule> s = ParseSchedule(schedule);
  if (!s.ok()) return r.Error(CKey("schedule"), s.status().message());
  c.schedule = *s;
  ESTREAM_ASSIGN_OR_RETURN(uint64_t threads, r.OptionalUint(CKey("n_threads"), kMaxU32, 0));
  c.n_threads = static_cast<uint32_t>(threads);
  return c;
}

// ---- Thread count of a stored profile/choice -------------------------------------------------

StoredThreads ReadStoredThreads(const std::vector<GgufKv>& kvs) {
  // The parsers' own reading of the key; a value that is not a thread count reads as unknown.
  auto read = [&](const char* prefix, const std::string& key) -> uint32_t {
    const Result<uint64_t> v = Reader(kvs, "", prefix).OptionalUint(key, kMaxU32, 0);
    return v.ok() ? static_cast<uint32_t>(*v) : 0;
  };
  return StoredThreads{.profile = read(kP, PKey("n_threads")), .choice = read(kC, CKey("n_threads"))};
}

std::string ThreadMismatchNote(uint32_t stored_threads, int run_threads, std::string_view model,
                               std::string_view budget) {
  if (stored_threads == 0 || static_cast<int64_t>(stored_threads) == run_threads) return {};
  return fmt::format("note: the stored profile was measured with {} thread{}, this run uses {}; its timings are used "
                     "all the same (run `estream profile {} --budget {} -t {} --recalibrate` for a matching one)",
                     stored_threads, stored_threads == 1 ? "" : "s", run_threads, model, budget, run_threads);
}

// ---- Sample thinning ------------------------------------------------------------------------

void CompactExecSamples(std::vector<float>* rows, std::vector<float>* seconds, size_t max_samples) {
  ESTREAM_CHECK(rows->size() == seconds->size() && max_samples >= 2, "CompactExecSamples: bad arguments");
  const size_t n = rows->size();
  if (n <= max_samples) return;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return (*rows)[a] < (*rows)[b]; });
  std::vector<float> out_rows, out_seconds;
  out_rows.reserve(max_samples);
  out_seconds.reserve(max_samples);
  for (size_t bin = 0; bin < max_samples; ++bin) {
    const size_t lo = bin * n / max_samples, hi = (bin + 1) * n / max_samples;
    double sr = 0, ss = 0;
    for (size_t i = lo; i < hi; ++i) {
      sr += (*rows)[order[i]];
      ss += (*seconds)[order[i]];
    }
    out_rows.push_back(static_cast<float>(sr / static_cast<double>(hi - lo)));
    out_seconds.push_back(static_cast<float>(ss / static_cast<double>(hi - lo)));
  }
  *rows = std::move(out_rows);
  *seconds = std::move(out_seconds);
}

}  // namespace estream::config
