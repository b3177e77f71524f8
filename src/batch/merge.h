// Merging the outputs of a sharded `estream score` (`estream score --merge OUT... -o ALL.jsonl
// [--input IN.jsonl]`; shard.h says how lines are sharded and keyed).
//
// Contract:
//   - every line of every shard output must be a whole result line (a JSON object with a key,
//     shard.h ResultKey); a torn last line (a shard stopped mid-write) or any other line is an
//     error naming the file and line (rerun that shard: it resumes and completes its file);
//   - no key may appear twice across the outputs (a shard output given twice, or two shards of
//     different N mixed);
//   - with the input: every non-blank input line's key must appear exactly once, and no other key
//     may appear; the merged file is then in input order, i.e. the file a single `estream score`
//     over the whole input writes. Without the input only the first two checks can be made (a
//     missing line goes unnoticed) and the merged file is the outputs concatenated in the order given.
//   - every problem found is reported in one Status (InvalidArgument, or IOError for a file that
//     cannot be read) listing up to max_listed keys per kind of problem and the total, and then
//     nothing is written. Otherwise OUT is written to OUT.tmp, fsynced and renamed over OUT, so it
//     appears only when complete. OUT must be absent, a regular file, or a symbolic link to one
//     (whose target is then replaced); a device, FIFO or directory is refused (InvalidArgument),
//     as the rename would replace it (base/output_path.h).
// Memory: one entry per result line (the key and where the line is: ~100 bytes plus the id's
// text), the lines themselves are copied from the files. The inputs are read once to index them,
// then each line once more to write it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace estream::batch {

struct MergeOptions {
  std::vector<std::string> shard_outputs;  // one or more result files
  std::string input;                       // the input every shard read; empty: not checked
  std::string output;                      // the merged file (must not be one of shard_outputs)
  size_t max_listed = 10;                  // keys named per kind of problem in an error
};

struct MergeStats {
  int64_t lines = 0;        // result lines written
  int64_t error_lines = 0;  // of them, lines with an "error" (failed input lines)
  std::vector<int64_t> lines_per_file;  // result lines taken from each shard output
};

Result<MergeStats> MergeShardOutputs(const MergeOptions& options);

}  // namespace estream::batch
