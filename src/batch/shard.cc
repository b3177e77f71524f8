#include "batch/shard.h"

#include <xxhash.h>

#include <charconv>

namespace estream::batch {
namespace {

// A non-negative decimal integer that fills `s` entirely, or -1.
int64_t ParseCount(std::string_view s) {
  if (s.empty() || s.size() > 18) return -1;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace

Result<ShardSpec> ParseShardSpec(std::string_view spec, std::string_view by) {
  ShardSpec s;
  if (by == "line") {
    s.by = ShardSpec::By::kLine;
  } else if (by == "id") {
    s.by = ShardSpec::By::kId;
  } else {
    return Status::InvalidArgument("--shard-by '" + std::string(by) + "': use line or id");
  }
  const size_t slash = spec.find('/');
  const std::string text(spec);
  if (slash == std::string_view::npos)
    return Status::InvalidArgument("shard '" + text + "' is malformed: give I/N, shard I (0-based) of N, e.g. 0/4");
  const int64_t i = ParseCount(spec.substr(0, slash)), n = ParseCount(spec.substr(slash + 1));
  if (i < 0 || n < 0)
    return Status::InvalidArgument("shard '" + text + "' is malformed: give I/N with decimal integers, shard I "
                                   "(0-based) of N, e.g. 0/4");
  if (n < 1 || n > (int64_t{1} << 31))
    return Status::InvalidArgument("shard '" + text + "' is out of range: N must be between 1 and 2^31");
  if (i >= n)
    return Status::InvalidArgument("shard '" + text + "' is out of range: I must be 0.." + std::to_string(n - 1) +
                                   " for N = " + std::to_string(n) + " (shards are numbered from 0)");
  s.index = i;
  s.count = n;
  return s;
}

std::string ShardName(const ShardSpec& spec) {
  return std::to_string(spec.index) + "/" + std::to_string(spec.count) +
         (spec.by == ShardSpec::By::kId ? " (by id)" : " (by line)");
}

std::string IdHashText(const nlohmann::json& id) {
  if (id.is_string()) return id.get<std::string>();
  return id.dump();  // integers: decimal text; anything else: compact JSON
}

uint64_t IdHash(const nlohmann::json& id) {
  const std::string t = IdHashText(id);
  return XXH64(t.data(), t.size(), 0);
}

int64_t ShardOf(const ShardSpec& spec, int64_t line_index, const nlohmann::json& id) {
  if (spec.count <= 1) return 0;
  if (spec.by == ShardSpec::By::kId && !id.is_null())
    return static_cast<int64_t>(IdHash(id) % static_cast<uint64_t>(spec.count));
  return line_index % spec.count;
}

bool IsBlankLine(std::string_view text) {
  return text.find_first_not_of(" \t\r") == std::string_view::npos;
}

nlohmann::json IdOfLine(const nlohmann::json& j) {
  if (j.is_object()) {
    auto it = j.find("id");
    if (it != j.end()) return *it;
  }
  return nullptr;
}

std::string LineKey(int64_t line) { return "line:" + std::to_string(line); }

std::string LineKeys::Add(const nlohmann::json& id, int64_t line, bool* duplicate) {
  *duplicate = false;
  if (id.is_null()) return LineKey(line);
  std::string key = id.dump();
  if (!ids_.insert(key).second) {
    *duplicate = true;
    return LineKey(line);
  }
  return key;
}

Result<std::string> ResultKey(const nlohmann::json& result) {
  if (!result.is_object()) return Status::InvalidArgument("not a JSON object");
  auto line = result.find("line");
  if (line != result.end() && line->is_number_integer()) return LineKey(line->get<int64_t>());
  auto id = result.find("id");
  if (id == result.end()) return Status::InvalidArgument("no \"id\"");
  if (id->is_null()) return Status::InvalidArgument("\"id\" is null and there is no \"line\"");
  return id->dump();
}

}  // namespace estream::batch
