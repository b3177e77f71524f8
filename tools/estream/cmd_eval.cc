// estream eval: multiple-choice benchmarks from the files llama.cpp's llama-perplexity reads
// (--hellaswag, --winogrande, --multiple-choice), scored with shared-prefix candidates.
//
//   estream eval --task hellaswag|winogrande|multiple-choice -m MODEL FILE [--tasks N] [--json]
//                [--no-progress]
//
// Flags -> batch::LoadTasks and batch::Evaluate (src/batch/eval.h: the formats and the scoring,
// as llama.cpp's) -> batch::EvalText or batch::EvalJson. Exit status 1 when a task failed.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "batch/eval.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tools/estream/batch_options.h"
#include "tools/estream/command.h"
#include "tools/estream/progress.h"

namespace estream::cli {
namespace {

class EvalCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("--task", task_, "hellaswag, winogrande or multiple-choice")
        ->required()
        ->check(CLI::IsMember({"hellaswag", "winogrande", "multiple-choice"}));
    sub->add_option("-m,--model", model_, "GGUF model file with a tokenizer (packed for --budget)")->required();
    sub->add_option("file", file_, "task file, as read by llama-perplexity --hellaswag / --winogrande / "
                    "--multiple-choice")->required();
    sub->add_option("--tasks", n_tasks_, "use N tasks, chosen as llama-perplexity's --hellaswag-tasks / "
                    "--winogrande-tasks / --multiple-choice-tasks choose them (default: all)")
        ->check(PositiveInt());
    sub->add_flag("--json", json_, "print one JSON object with the accuracy and every item's scores");
    flags_.Setup(sub);
    sub->add_flag("--no-progress", no_progress_,
                  "no progress on stderr (default: a line redrawn on a terminal, else a line per tenth of the work)");
  }

 private:
  Result<int> Run() override {
    ESTREAM_ASSIGN_OR_RETURN(const batch::EvalKind kind, batch::ParseEvalKind(task_));
    ESTREAM_ASSIGN_OR_RETURN(std::string data, ReadFileText(file_));
    std::unique_ptr<Tokenizer> tok;
    {
      ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_, {.mmap = false}));
      auto t = Tokenizer::FromGguf(*gguf);
      if (!t.ok()) return Status(t.status().code(), t.status().message() + " (eval needs the model's tokenizer)");
      tok = std::move(t).value();
    }
    ESTREAM_ASSIGN_OR_RETURN(std::vector<batch::EvalTask> tasks,
                             batch::LoadTasks(kind, data, *tok,
                                              {.n_tasks = n_tasks_, .name = file_, .warn = ProgressPrinter(name())}));
    ESTREAM_ASSIGN_OR_RETURN(EngineOptions eo, flags_.Options());
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(model_, eo));
    ProgressReporter progress(name(), "tasks", !no_progress_);
    ESTREAM_ASSIGN_OR_RETURN(
        batch::EvalResult r,
        batch::Evaluate(*engine, kind, tasks,
                        {.pass_tokens = flags_.PassTokens(), .progress = [&](const batch::EvalProgress& p) {
                           progress.Update(p.tasks_done, p.tasks_total, p.tokens_done, p.tokens_total);
                         }}));
    progress.Finish();
    r.model = model_;
    r.file = file_;
    // The first kMaxErrorLines failed tasks (a pass that fails fails all its tasks alike), then
    // how many more; --json lists every one.
    constexpr int64_t kMaxErrorLines = 10;
    int64_t shown = 0;
    for (const batch::EvalItem& it : r.items) {
      if (it.error.empty() || ++shown > kMaxErrorLines) continue;
      const std::string line = it.line > 0 ? " (" + file_ + " line " + std::to_string(it.line) + ")" : "";
      std::fprintf(stderr, "estream eval: task %lld%s: %s\n", static_cast<long long>(it.index), line.c_str(),
                   it.error.c_str());
    }
    if (r.n_failed > kMaxErrorLines)
      std::fprintf(stderr, "estream eval: %lld more tasks failed (not shown; --json gives every task's error)\n",
                   static_cast<long long>(r.n_failed - kMaxErrorLines));
    if (json_) std::printf("%s\n", batch::EvalJson(r).c_str());
    else std::fputs(batch::EvalText(r).c_str(), stdout);
    return r.n_failed > 0 ? 1 : 0;
  }

  std::string task_, model_, file_;
  int64_t n_tasks_ = 0;
  bool json_ = false, no_progress_ = false;
  BatchEngineFlags flags_;
};

}  // namespace

ESTREAM_REGISTER_COMMAND(EvalCommand, "eval",
                         "Accuracy on HellaSwag / Winogrande / multiple-choice files (llama-perplexity's formats), with "
                         "shared-prefix candidates");

}  // namespace estream::cli
