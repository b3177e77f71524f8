// Sharding a JSONL batch (`estream score --shard I/N`) and the keys that tie each input line to its
// result line, shared by the scorer, the shard merge (merge.h) and the Slurm array script
// (scripts/slurm/score_array.sbatch; docs/GUIDE.md "Scale-out with Slurm").
//
// Shards. Shard I of N (0 <= I < N) holds the input lines whose shard number is I:
//   by line (default): shard = (physical line index, 0-based, blank lines counted) mod N, i.e.
//     round robin, so shards of a file with mixed prompt lengths carry about the same work;
//   by id:             shard = XXH64(IdHashText(id), seed 0) mod N, where IdHashText is the id's
//     UTF-8 bytes for a JSON string ("q7" hashes the 2 bytes q7), the decimal text for an integer
//     (17 hashes "17"), and nlohmann::json's compact dump for any other value (1.5, true, [1,2]).
//     The shard of a line then depends only on its id (not on where the line is, so a file that
//     is re-ordered or appended to keeps every id in its shard, and equal ids share a shard).
//     A line whose id cannot be read (not JSON, no "id", "id": null) is placed by line index.
// Every input line is in exactly one shard for either rule; every shard reads the whole input (it
// must know every line's id to find duplicates, as a single process does) but tokenizes and scores
// only its own lines.
//
// Keys. The result of input line L (1-based, physical) is keyed by:
//   the id's compact JSON text (id.dump(): "\"q7\"", "17") for the first line with that id;
//   "line:L" for a line without a usable id, and for a later line repeating an earlier line's id
//   (that line's result is an error line carrying "line": L).
// ResultKey reads the same key back from a result line ("line" when present, else "id"), so
// resume and merge match results to input lines even when an input repeats an id. A JSON string id
// "line:3" keys as "\"line:3\"" (with the quotes), so the two kinds never collide.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>

#include "base/status.h"

namespace estream::batch {

struct ShardSpec {
  enum class By { kLine, kId };
  int64_t index = 0;  // I: 0 <= index < count
  int64_t count = 1;  // N >= 1; 1 = the whole file
  By by = By::kLine;
};

// Parses "I/N" (decimal, 0 <= I < N, N <= 2^31) and `by` ("line" or "id"). The error names the
// text and the rule ("shard 4/4 is out of range: I must be 0..3 for N = 4").
Result<ShardSpec> ParseShardSpec(std::string_view spec, std::string_view by = "line");
// "2/4 (by line)".
std::string ShardName(const ShardSpec& spec);

// The bytes an id hashes as (see above), and its XXH64 (seed 0).
std::string IdHashText(const nlohmann::json& id);
uint64_t IdHash(const nlohmann::json& id);

// The shard number (0..count-1) of the input line at 0-based physical index `line_index` whose
// id is `id` (null when the line has none that can be read).
int64_t ShardOf(const ShardSpec& spec, int64_t line_index, const nlohmann::json& id);
inline bool InShard(const ShardSpec& spec, int64_t line_index, const nlohmann::json& id) {
  return ShardOf(spec, line_index, id) == spec.index;
}

// A blank line (only spaces, tabs, a trailing CR) has no result; the scorer skips it.
bool IsBlankLine(std::string_view text);
// The id of a parsed input line: j["id"] for an object with an "id", else null.
nlohmann::json IdOfLine(const nlohmann::json& j);

// Assigns keys to input lines in file order (each line once, blank lines not at all).
class LineKeys {
 public:
  // The key of line `line` (1-based) with id `id` (null: none). *duplicate: an earlier line had
  // the same non-null id (the key is then "line:L").
  std::string Add(const nlohmann::json& id, int64_t line, bool* duplicate);
  size_t size() const { return ids_.size(); }

 private:
  std::unordered_set<std::string> ids_;
};

// "line:L".
std::string LineKey(int64_t line);
// The key of one result line (an object): "line:L" when it has an integer "line", else the
// compact JSON text of its "id". InvalidArgument when it has neither.
Result<std::string> ResultKey(const nlohmann::json& result);

}  // namespace estream::batch
