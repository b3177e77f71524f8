// Multiple-choice benchmarks from the files llama.cpp's llama-perplexity reads (--hellaswag,
// --winogrande, --multiple-choice), scored with shared-prefix candidates: the workflow of
// `estream eval` as library calls. LoadTasks reads a file's tasks, Evaluate scores them with an
// engine, EvalJson / EvalText write the result.
//
// Every task becomes one Request: the tokens its candidate sequences share (the common prefix of
// their token ids) are the context, computed once; each candidate's remaining tokens are one
// continuation (Engine::RunBatch packs many tasks per pass). The scoring follows llama.cpp's
// (tools/perplexity/perplexity.cpp):
//  - hellaswag: text file, 6 lines per task: context, gold ending index (0-3), 4 endings (the
//    file less one final newline, as llama-perplexity's -f reader takes it: one blank last line
//    is accepted).
//    Sequence i = tokenize(context + " " + ending[i]) with the vocabulary's BOS. Score of an ending =
//    mean log-probability of its tokens after the common prefix (acc_norm by token count); the
//    largest score wins (the first on ties). Tasks are taken in llama.cpp's random order
//    (std::mt19937 seeded 1, one uniform pick per task among those left), n_tasks keeping the first N.
//  - winogrande: CSV lines "index,sentence,choice1,choice2,answer" (answer 1 or 2; the sentence
//    has a "_", may be double-quoted; lines that do not parse are skipped with a warning; the
//    file's last line is not scored, as llama-perplexity's reader stops before using it: a note).
//    Sequence i = tokenize(first + choice_i + second). When both sequences have more than 3 tokens
//    after their common prefix, only the tokens after "first + choice_i" are scored (partial
//    scoring), else all tokens after the common prefix; the last token is left out when more than
//    one remains; score = mean log-probability; choice 1 wins only if its score is larger (a "_"
//    that ends the sentence leaves no token to score when partial: NaN scores, choice 2, as in
//    llama-perplexity; a warning names the line). As in llama-perplexity (the reference), when
//    the choice words are scored (short tails) choice 2's first token is scored with the logits
//    after the whole of sequence 1 (its "FIXME": it reads that row instead of the common
//    prefix's last). tests/batch_test.cc and scripts/eval_vs_llamacpp.py check the agreement.
//  - multiple-choice: llama.cpp's binary format: u32 n_tasks, u32 offsets[n_tasks], then per task
//    a string question and two answer sets (mc1, mc2), each u32 n (<= 100, llama-perplexity's
//    limit: a larger n is refused, naming it), n strings and n int32
//    labels; strings are u32 length + bytes. Sequence i = tokenize(question + " " + answer_i) of
//    mc1; score = mean log-probability after the common prefix; correct when the best answer's
//    label is 1. n_tasks picks N tasks at random as llama.cpp does.
// Accuracy is reported with its standard error sqrt(p (1 - p) / (n - 1)) (llama.cpp's "+/-"),
// and the 95% Wilson interval llama.cpp prints for hellaswag. Log-probabilities are those of
// Engine (double log-sum-exp); llama.cpp's differ by float rounding, so only near-tied candidates
// could rank differently.
//
// Thread safety: pure functions, except Evaluate, which uses the engine for the whole call.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "estream/engine.h"

namespace estream {
class Tokenizer;
}

namespace estream::batch {

enum class EvalKind { kHellaswag, kWinogrande, kMultipleChoice };

// "hellaswag", "winogrande", "multiple-choice"; ParseEvalKind: InvalidArgument for other names.
const char* EvalKindName(EvalKind kind);
Result<EvalKind> ParseEvalKind(std::string_view name);

// One multiple-choice item, tokenized.
struct EvalTask {
  // Which task of the file, 0-based: hellaswag the task number (its lines are 6 index + 1 ..
  // 6 index + 6), winogrande the number among the lines that parse (a skipped line has none),
  // multiple-choice the number in the offset table.
  int64_t index = 0;
  int64_t line = 0;                        // 1-based line of the file where it starts (0: multiple-choice)
  std::vector<std::vector<int32_t>> seqs;  // one token sequence per candidate
  std::vector<int> labels;                 // 1 = correct (hellaswag/winogrande: one 1)
  std::vector<int64_t> n_base;             // winogrande: tokens of first + choice_i
};

struct LoadTasksOptions {
  int64_t n_tasks = 0;   // > 0: use N tasks, chosen as llama-perplexity's --*-tasks choose them
  std::string name;      // the file's name in messages
  // Notes and warnings, one line each (may be empty): text that is not valid UTF-8, winogrande
  // lines skipped or scoring no token (the first 10, then how many more), its unscored last line.
  std::function<void(const std::string&)> warn = {};
};

// The tasks of `data` (a whole file's bytes) in the order they are scored, tokenized with
// `tokenizer`. InvalidArgument naming the file (and line or task) for a file that is not of the
// kind's format.
Result<std::vector<EvalTask>> LoadTasks(EvalKind kind, std::string_view data, const Tokenizer& tokenizer,
                                        const LoadTasksOptions& options = {});

// One task, scored.
struct EvalItem {
  int64_t index = 0;           // EvalTask::index
  int64_t line = 0;            // EvalTask::line
  std::string error;           // non-empty: the task failed (the fields below are unset)
  std::vector<double> scores;  // one per candidate
  int predicted = -1;          // the best candidate
  int gold = -1;               // the first candidate labelled 1 (-1: none)
  bool correct = false;        // the predicted candidate is labelled 1
};

struct EvalResult {
  EvalKind kind = EvalKind::kHellaswag;
  std::string model, file;  // labels for the JSON (as the caller gives them)
  int64_t n_tasks = 0;      // tasks scored (failed ones excluded)
  int64_t n_failed = 0;
  int64_t n_correct = 0;
  int64_t n_answers = 0;    // candidates of the scored tasks
  // Undefined figures are NaN (null in the JSON): all four when no task was scored (n_tasks 0),
  // the standard error also for one task.
  double accuracy = NAN;        // p = n_correct / n_tasks (a fraction, as are the next three)
  double standard_error = NAN;  // sqrt(p (1 - p) / (n - 1))
  double wilson_lo = NAN, wilson_hi = NAN;  // 95% Wilson score interval
  int64_t tokens = 0;           // tokens of the forward passes
  int64_t passes = 0;           // forward passes run
  int64_t longest_pass = 0;     // tokens of the longest one (what its activations were sized for)
  int64_t tokens_separate = 0;  // tokens if every candidate of the scored tasks were run alone
  double forward_seconds = 0;   // wall time of the forward passes
  std::vector<EvalItem> items;  // in task order

  // Accuracy by picking a candidate at random: n_tasks / n_answers (a fraction; NaN without tasks).
  double random_chance() const { return n_answers > 0 ? static_cast<double>(n_tasks) / n_answers : NAN; }
};

// Where an Evaluate call stands, after each window of tasks.
struct EvalProgress {
  int64_t tasks_done = 0, tasks_total = 0;    // failed tasks included
  int64_t tokens_done = 0, tokens_total = 0;  // tokens of the tasks' requests (those that can run)
};

struct EvalOptions {
  // Most tokens of the tasks packed into one forward pass (Engine::RunBatch's pack_tokens): the
  // activations are sized for max(this, the longest task), not for the engine's pass_tokens(),
  // which without a budget is the whole context. 0: pass_tokens(). `estream eval`: 8192 unless
  // --batch-tokens or --budget is given.
  int64_t pass_tokens = 0;
  // Called on the calling thread after each window (about 4 passes) is scored; may be empty.
  std::function<void(const EvalProgress&)> progress = {};
};

// Scores `tasks` with `engine` in windows of about 4 passes (4 x the pass size of `options`).
// A task that cannot run (its candidates share no first token; a request the engine refuses)
// is an item with an error, counted in n_failed. The call itself does not fail today; the
// Result leaves room for errors that stop it.
Result<EvalResult> Evaluate(Engine& engine, EvalKind kind, const std::vector<EvalTask>& tasks,
                            const EvalOptions& options = {});

// `estream eval --json`: one object, two-space indent, no trailing newline. Percentages (accuracy,
// stderr, wilson95, random_chance) are in percent, null where undefined (EvalResult). Each item
// has its index, and its line when the file is text.
std::string EvalJson(const EvalResult& r);
// `estream eval`: the accuracy lines (each ending with a newline); with no task scored, one line
// that says so instead, and "+/- undefined" for the standard error of one task.
std::string EvalText(const EvalResult& r);

}  // namespace estream::batch
