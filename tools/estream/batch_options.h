// Options shared by the batch subcommands (score, eval): the engine's threads, memory budget and
// pass length, bound to one struct and turned into EngineOptions (and the pass size to pack to).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "estream/engine.h"
#include "tools/estream/command.h"
#include "tools/estream/common_flags.h"

namespace estream::cli {

struct BatchEngineFlags {
  int threads = 0;
  std::string budget;
  int64_t budget_tokens = 0;
  int64_t batch_tokens = 0;
  std::string schedule = "early";
  std::string expert_cache = "auto";

  // pass_default: what --batch-tokens defaults to without a budget (score and eval: PassTokens()).
  void Setup(CLI::App* sub, const std::string& pass_default =
                                "8192, a longer request, up to the context length, running in a pass of its own") {
    AddThreadsFlag(sub, &threads);
    AddBudgetFlag(sub, &budget,
                  "packed models: run within this memory budget (bytes, or with a K/M/G suffix: 3G); experts are "
                  "streamed and each pass reads every active expert once for all the requests in it");
    sub->add_option("--budget-tokens", budget_tokens,
                    "packed models with --budget: tokens of one pass the budget plans activations for (default: "
                    "the longest of 16384, 12288 and 8192, at most the context, whose activations the budget "
                    "holds beside the full streaming arena, else min(context, 4096), or for a smaller budget the "
                    "longest of 2048, 1024, 512, 256 and 128 that fits beside two banks of experts); with a budget it "
                    "bounds --batch-tokens")
        ->check(PositiveInt());
    sub->add_option("--batch-tokens", batch_tokens,
                    "most tokens of one forward pass, all packed requests together (default: the budget's "
                    "--budget-tokens when streamed, else " + pass_default + ")")
        ->check(PositiveInt());
    AddScheduleFlag(sub, &schedule, "packed models with --budget: on-demand, after-routing, early (default)");
    AddExpertCacheFlag(sub, &expert_cache, "auto");
  }

  // The pass size requests are packed to (ScoreOptions / EvalOptions::pass_tokens): 0 (the
  // engine's pass_tokens()) when --batch-tokens or --budget sets it, else kDefaultPassTokens.
  // Without it the engine's pass would be the whole context (163840 tokens for DeepSeek-V2):
  // a task file in one pass, its activations sized for all of it.
  static constexpr int64_t kDefaultPassTokens = 8192;
  int64_t PassTokens() const { return batch_tokens > 0 || !budget.empty() ? 0 : kDefaultPassTokens; }

  Result<EngineOptions> Options() const {
    EngineOptions o;
    o.n_threads = threads;
    if (!budget.empty()) {
      ESTREAM_ASSIGN_OR_RETURN(o.budget_bytes, ParseBudget(budget));
    }
    o.budget_tokens = budget_tokens;
    o.batch_tokens = batch_tokens;
    ESTREAM_ASSIGN_OR_RETURN(o.schedule, ParseSchedule(schedule));
    ESTREAM_ASSIGN_OR_RETURN(o.expert_cache_bytes, ParseExpertCache(expert_cache));
    return o;
  }
};

}  // namespace estream::cli
