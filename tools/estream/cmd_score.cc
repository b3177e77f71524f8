// estream score: batch scoring of a JSONL file, resumable.
//
//   estream score -m MODEL --input IN.jsonl --output OUT.jsonl [--budget SIZE] [--batch-tokens N] [-t N]
//                 [--shard I/N [--shard-by line|id]]
//   estream score --merge OUT1.jsonl OUT2.jsonl ... -o ALL.jsonl [--input IN.jsonl]
//
// Flags -> batch::Score (src/batch/score.h: the input and output formats, the batching, the
// resume) -> a summary line on stderr.
//
// Shards (--shard I/N, src/batch/shard.h): only the lines of shard I are scored, into this
// shard's own OUT, resumable (a re-queued shard continues where it stopped); every
// shard reads the whole input, so ids repeated across shards are found as in one process. Lines
// are dealt round robin by line index, or with --shard-by id by XXH64 of the id. --merge
// (src/batch/merge.h) checks that the shard outputs hold every input line exactly once and writes
// them in input order: the file one process would have written.
//
// Exit status: 0 when every input line (of the shard) has a result without error in OUT, 1
// otherwise (bad lines, a failed request, or a fatal error such as an unreadable model). --merge:
// 0 when merged and no line is an error, 1 otherwise (nothing is written when the check fails).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/memory.h"
#include "batch/merge.h"
#include "batch/score.h"
#include "batch/shard.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tools/estream/batch_options.h"
#include "tools/estream/command.h"
#include "tools/estream/progress.h"

namespace estream::cli {
namespace {

class ScoreCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("-m,--model", model_, "GGUF model file (packed for --budget); required unless --merge");
    sub->add_option("--input", input_, "input JSONL: one {\"id\", \"prompt\" or \"tokens\", optional "
                    "\"continuations\", \"embedding\": \"last\"|\"mean\", \"top_k\", \"prompt_logprobs\"} per line; "
                    "with --merge: optional, checks every input line has exactly one result and gives the order");
    sub->add_option("-o,--output", output_, "output JSONL, one result per input line in input order with the same id; "
                    "if it exists, ids already in it are skipped (resume after a crash); with --merge: the merged file");
    sub->add_option("--shard", shard_, "score only shard I of N (0 <= I < N): the input lines whose index mod N "
                    "(or with --shard-by id, XXH64 of the id mod N) is I, into this shard's own --output; "
                    "resumable per shard");
    sub->add_option("--shard-by", shard_by_, "how --shard deals lines: line (index, round robin; default) or id "
                    "(hash of the id: a line keeps its shard when the file is re-ordered)");
    sub->add_option("--merge", merge_, "merge the outputs of the shards into --output (in input order with --input), "
                    "after checking every line has exactly one result (else an error listing the ids, nothing written)")
        ->expected(1, -1);
    flags_.Setup(sub);
    sub->add_flag("--no-progress", no_progress_, "no progress line on stderr (it is only shown on a terminal)");
    sub->footer(
        "Input lines: {\"id\": 1, \"prompt\": \"The capital of France is\"}\n"
        "             {\"id\": \"q7\", \"prompt\": \"Question: ...\\nAnswer:\", \"continuations\": [\" yes\", \" no\"]}\n"
        "             {\"id\": 3, \"tokens\": [1, 450, 7483], \"embedding\": \"mean\"}\n"
        "Output lines: {\"id\": 1, \"n_tokens\": 6, \"top\": [{\"token\": 3681, \"logprob\": -0.4, \"text\": \" Paris\"}, ...]}\n"
        "              {\"id\": \"q7\", \"continuations\": [{\"logprob\": -1.2, \"logprobs\": [-1.2], \"n_tokens\": 1, "
        "\"is_greedy\": true}, ...]}\n"
        "A bad line gives {\"id\": ..., \"error\": \"...\"} and the run goes on; the exit status is 1 if any line "
        "failed. Rerunning with the same --output resumes: ids already written are skipped (error lines too: delete "
        "them from the output to retry them). The output is a regular file, locked while a run writes it.\n"
        "Sharded: estream score -m M --input IN.jsonl --shard 0/4 --output OUT.0.jsonl   (... 1/4, 2/4, 3/4)\n"
        "         estream score --merge OUT.0.jsonl OUT.1.jsonl OUT.2.jsonl OUT.3.jsonl --input IN.jsonl -o ALL.jsonl\n");
  }

 private:
  Result<int> RunMerge() {
    if (!model_.empty()) return Status::InvalidArgument("--merge takes no --model: it only checks and joins the outputs");
    if (!shard_.empty()) return Status::InvalidArgument("--merge and --shard do not go together");
    if (output_.empty()) return Status::InvalidArgument("--merge needs the merged file: -o ALL.jsonl");
    ESTREAM_ASSIGN_OR_RETURN(batch::MergeStats st,
                             batch::MergeShardOutputs({.shard_outputs = merge_, .input = input_, .output = output_}));
    std::string per_file;
    for (size_t f = 0; f < st.lines_per_file.size(); ++f)
      per_file += (f ? ", " : "") + std::to_string(st.lines_per_file[f]);
    std::fprintf(stderr, "estream score: merged %lld lines (%s from each of the %zu outputs) into %s%s; %lld of them "
                 "are errors\n", static_cast<long long>(st.lines), per_file.c_str(), merge_.size(), output_.c_str(),
                 input_.empty() ? " (no --input: lines missing from every output cannot be detected; order as given)"
                                : ", in input order, every input line exactly once",
                 static_cast<long long>(st.error_lines));
    return st.error_lines > 0 ? 1 : 0;
  }

  Result<int> Run() override {
    if (!merge_.empty()) return RunMerge();
    // Flags first, before any work (CLI11 cannot say "required unless --merge").
    if (model_.empty()) return Status::InvalidArgument("--model is required (the model to score with)");
    if (input_.empty()) return Status::InvalidArgument("--input is required (the JSONL file to score)");
    if (output_.empty()) return Status::InvalidArgument("--output is required (where the results go)");
    if (output_ == "-")
      return Status::InvalidArgument("--output - (standard output) is not supported: the output is a file that a "
                                     "rerun resumes; give a path");
    batch::ScoreOptions so;
    so.input = input_;
    so.output = output_;
    so.pass_tokens = flags_.PassTokens();
    if (!shard_.empty()) {
      ESTREAM_ASSIGN_OR_RETURN(so.shard, batch::ParseShardSpec(shard_, shard_by_));
    } else if (shard_by_ != "line") {
      return Status::InvalidArgument("--shard-by needs --shard I/N");
    }
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    std::unique_ptr<Tokenizer> tokenizer;
    {
      ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_, {.mmap = false}));
      auto t = Tokenizer::FromGguf(*gguf);
      if (t.ok()) tokenizer = std::move(t).value();  // else: "tokens" lines only
    }
    ESTREAM_ASSIGN_OR_RETURN(EngineOptions eo, flags_.Options());
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(model_, eo));

    so.warn = ProgressPrinter(name());
    // On a terminal only: a batch job's log gets the summary line alone.
    ProgressReporter progress(name(), "lines", !no_progress_ && isatty(STDERR_FILENO));
    so.progress = [&](const batch::ScoreProgress& p) {
      progress.Update(p.lines_done, p.lines_total, p.tokens_done, p.tokens_total);
    };
    ESTREAM_ASSIGN_OR_RETURN(batch::ScoreSummary s, batch::Score(*engine, tokenizer.get(), so));
    progress.Finish();
    const double wall = elapsed();
    const std::string shard_text = shard_.empty() ? "" : "shard " + batch::ShardName(so.shard) + ": ";
    std::fprintf(stderr,
                 "estream score: %s%lld lines scored, %lld failed, %lld already in %s (%lld of them failed); "
                 "%lld tokens in %.2f s (%.1f tok/s); peak RSS %s\n",
                 shard_text.c_str(), static_cast<long long>(s.lines_ok), static_cast<long long>(s.lines_failed),
                 static_cast<long long>(s.lines_skipped), output_.c_str(), static_cast<long long>(s.lines_failed_before),
                 static_cast<long long>(s.tokens), wall, wall > 0 ? s.tokens / wall : 0.0,
                 FormatBytes(PeakRssBytes()).c_str());
    return s.all_ok() ? 0 : 1;
  }

  std::string model_, input_, output_;
  std::string shard_, shard_by_ = "line";
  std::vector<std::string> merge_;
  BatchEngineFlags flags_;
  bool no_progress_ = false;
};

}  // namespace

ESTREAM_REGISTER_COMMAND(ScoreCommand, "score",
                         "Score a JSONL file of prompts in batches (next tokens, embeddings, candidate continuations); resumable");

}  // namespace estream::cli
