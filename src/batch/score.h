// Batch scoring of a JSONL file, resumable: the workflow of `estream score` as one library call
// (Score), with the parser of one input line (ParseScoreLine) and the writers of one result line
// (ScoreResultJson, ScoreErrorJson) for any other front end that reads or writes the same lines.
//
// Input: one JSON object per line:
//   {"id": ANY, "prompt": "text" | "tokens": [ids...],
//    "continuations": ["text", ...] | [[ids...], ...],   optional: shared-prefix candidates
//    "embedding": "last" | "mean",                        optional
//    "top_k": K,                                          optional (default 5; 0 with continuations
//                                                         or an embedding)
//    "prompt_logprobs": true}                             optional
// A text prompt is tokenized with the model's vocabulary (BOS/EOS as the vocabulary asks); text
// continuations are tokenized without special tokens and appended as they are (so a BPE
// vocabulary wants the leading space: " Paris").
//
// Output: one JSON object per input line, in input order, with the same id:
//   {"id":..., "n_tokens": T, "top": [{"token": id, "logprob": lp, "text": "..."}],
//    "continuations": [{"logprob": sum, "logprobs": [...], "n_tokens": n, "is_greedy": b}],
//    "embedding": [...], "prompt_logprobs": [...], "log_likelihood": ll}
// or, for a line that cannot be run (bad JSON, no id, bad tokens, too long, a repeated id, ...):
//   {"id":..., "error": "one line"}
// A line whose id cannot be read, and a line repeating an earlier line's id (scored as an error),
// also carry "line": N (1-based, physical): that is their key (shard.h).
//
// Batching: consecutive lines are taken in windows of about 4 passes (4 x ScoreOptions::pass_tokens
// tokens); the engine packs each window longest first into passes (Engine::RunBatch). A window's
// lines are appended to the output in input order, then flushed and fsynced, so the output is
// always a prefix of the results in input order (plus at most one torn line after a crash).
//
// Resume: at start the output is read; a torn last line (no newline, or not JSON) is cut off, and
// every id (or line number, for id-less lines) it holds is skipped: a rerun after a crash or
// Ctrl-C completes the file without duplicating or losing a line. The output must be a regular
// file other than the input; it is locked (flock) for the call, so a second run on the same
// output fails instead of duplicating lines; and an output holding JSON objects that are not
// result lines (no "n_tokens", no "error": an input file, say) is refused without being changed.
//
// Shards (ScoreOptions::shard, shard.h): only the lines of that shard are scored, into the
// shard's own output, resumable as above; the whole input is read, so ids repeated across shards
// are found as in one process.
//
// Thread safety: Score uses the engine for the whole call (Engine's own rules apply: one call at
// a time per engine); the tokenizer is only read.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>

#include "base/status.h"
#include "batch/shard.h"
#include "estream/engine.h"

namespace estream {
class Tokenizer;
}

namespace estream::batch {

// Where a Score call stands, after each window written.
struct ScoreProgress {
  int64_t lines_done = 0, lines_total = 0;    // lines of this run (those already in the output excluded)
  int64_t tokens_done = 0, tokens_total = 0;  // their tokens (failed lines count 0 in the total)
  double seconds = 0;                         // since Score started
};

struct ScoreOptions {
  std::string input;   // the JSONL input
  std::string output;  // the results, appended to (resume); created when absent; a regular file
  ShardSpec shard = {};// default: the whole input
  // Most tokens of the lines packed into one forward pass (Engine::RunBatch's pack_tokens): the
  // activations are sized for max(this, the longest line), not for the engine's pass_tokens(),
  // which without a budget is the whole context. 0: pass_tokens(). `estream score`: 8192 unless
  // --batch-tokens or --budget is given.
  int64_t pass_tokens = 0;
  // After each window written (may be empty).
  std::function<void(const ScoreProgress&)> progress = {};
  // One line per problem found in an existing output ("warning: OUT line 3 is not a result;
  // ignored", "OUT ends with a torn line (12 bytes); cutting it and resuming"); may be empty.
  std::function<void(const std::string&)> warn = {};
};

struct ScoreSummary {
  int64_t lines_ok = 0;             // lines scored by this call
  int64_t lines_failed = 0;         // error lines written by this call
  int64_t lines_skipped = 0;        // lines already in the output (not scored again)
  int64_t lines_failed_before = 0;  // of them, error lines
  int64_t tokens = 0;               // tokens of the lines scored (failed lines not counted)
  double seconds = 0;               // the whole call

  // Every line of the input (or shard) has a result without error in the output.
  bool all_ok() const { return lines_failed + lines_failed_before == 0; }
};

// Scores options.input into options.output with `engine`. `tokenizer` (may be null: then only
// "tokens" lines and id continuations can run, and "top" entries carry no "text") must be the
// model's. Errors (the call stops; the output holds every window written so far): IOError when
// the input cannot be read or the output cannot be read, cut, written or fsynced. A line that
// cannot run is not an error of the call: it gets an error line and counts in lines_failed.
Result<ScoreSummary> Score(Engine& engine, const Tokenizer* tokenizer, const ScoreOptions& options);

// One input line, parsed.
struct ScoreLine {
  int64_t line = 0;         // 1-based, physical
  nlohmann::json id;        // null when absent / unreadable
  bool by_line = false;     // keyed by its line number: its result carries "line"
  std::string error;        // non-empty: the line fails with this message
  Request request;          // valid when error is empty
  int64_t tokens = 0;       // prompt + continuation tokens
};

// Parses input line `line` (j: its JSON; discarded when it is not JSON) for a model of n_vocab
// tokens; error is set when the line cannot run. by_line is left false (the caller keys lines).
ScoreLine ParseScoreLine(const nlohmann::json& j, int64_t line, const Tokenizer* tokenizer, int32_t n_vocab);

// The result line of `l` (without the newline): ScoreResultJson for its response (the request
// `l.request` asked for it), ScoreErrorJson for an error (newlines in `error` become spaces).
std::string ScoreResultJson(const ScoreLine& l, const Response& r, const Tokenizer* tokenizer);
std::string ScoreErrorJson(const ScoreLine& l, const std::string& error);

}  // namespace estream::batch
