// estream bench-batch: what batching buys, in one process (the model loaded once).
//
//   estream bench-batch -m MODEL [--batch-sizes 1,4,16,64] [--prompt-length 128] [--repeat 5]
//                       [--mc CONTEXT,ENDINGS,ENDING_LEN] [--budget SIZE ...] [--json FILE]
//
// For each batch size B: B prompts of --prompt-length random token ids (fixed seed), run one by one
// (B calls of Engine::Run) and as one Engine::RunBatch, alternately, --repeat times; reported: the
// median wall time of each, tokens/s, the speed-up, and (streamed models) expert bytes read.
// With --mc C,N,L: one multiple-choice item, a C-token context and N endings of L tokens, scored
// as N separate requests (context ++ ending, prompt log-probabilities) and as one request with N
// continuations (shared-prefix candidates), alternately: the median times and their ratio.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "base/json_text.h"
#include "base/memory.h"
#include "base/stats.h"
#include "estream/engine.h"
#include "tools/estream/batch_options.h"
#include "tools/estream/command.h"

namespace estream::cli {
namespace {


double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

class BenchBatchCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("-m,--model", model_, "GGUF or packed model")->required();
    sub->add_option("--batch-sizes", sizes_, "prompts per batch (default 1,4,16,64)")
        ->delimiter(',')
        ->check(PositiveInt());
    sub->add_option("--prompt-length", length_, "tokens per prompt (default 128)")->check(PositiveInt());
    sub->add_option("--repeat", repeat_, "alternated runs of each variant (median reported; default 5)")
        ->check(PositiveInt());
    sub->add_option("--mc", mc_, "multiple choice instead: CONTEXT,ENDINGS,ENDING_LEN tokens (e.g. 100,4,20)")
        ->delimiter(',')
        ->expected(3)
        ->check(PositiveInt());
    sub->add_option("--json", json_, "write the results as JSON to FILE");
    sub->add_flag("-v,--verbose", verbose_, "print each batch pass's time split");
    sub->add_flag("--batch-only", batch_only_,
                  "time the batches only (no one-by-one runs; the one-by-one and speed-up columns read 0)");
    flags_.Setup(sub, "max(context length, 8192): each batch in one pass");
  }
 private:
  std::vector<int32_t> RandomIds(std::mt19937* rng, int64_t n, int vocab) {
    std::vector<int32_t> ids(n);
    std::uniform_int_distribution<int32_t> d(0, vocab - 1);
    for (auto& x : ids) x = d(*rng);
    return ids;
  }

  Result<int> Run() override {
    if (sizes_.empty()) sizes_ = {1, 4, 16, 64};
    ESTREAM_RETURN_IF_ERROR(CheckWritableOutput(json_, "--json"));
    ESTREAM_ASSIGN_OR_RETURN(EngineOptions eo, flags_.Options());
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(model_, eo));
    const int V = engine->info().n_vocab;
    std::mt19937 rng(42);
    nlohmann::json out;
    out["model"] = model_;
    out["threads"] = engine->n_threads();
    out["pass_tokens"] = engine->pass_tokens();
    if (!mc_.empty()) {
      const int64_t C = mc_[0], N = mc_[1], L = mc_[2];
      Request tree;
      tree.top_k = 0;
      tree.tokens = RandomIds(&rng, C, V);
      std::vector<Request> separate;
      for (int64_t i = 0; i < N; ++i) {
        tree.continuations.push_back(RandomIds(&rng, L, V));
        Request r;
        r.top_k = 0;
        r.prompt_logprobs = true;
        r.tokens = tree.tokens;
        r.tokens.insert(r.tokens.end(), tree.continuations.back().begin(), tree.continuations.back().end());
        separate.push_back(std::move(r));
      }
      std::vector<double> t_sep, t_tree, t_sep_batch;
      for (int rep = 0; rep < repeat_; ++rep) {
        double t0 = Now();
        for (const Request& r : separate) ESTREAM_RETURN_IF_ERROR(engine->Run(r).status());
        t_sep.push_back(Now() - t0);
        t0 = Now();
        for (auto& r : engine->RunBatch(separate)) ESTREAM_RETURN_IF_ERROR(r.status());
        t_sep_batch.push_back(Now() - t0);
        t0 = Now();
        ESTREAM_RETURN_IF_ERROR(engine->Run(tree).status());
        t_tree.push_back(Now() - t0);
      }
      const double s = Median(t_sep), b = Median(t_sep_batch), t = Median(t_tree);
      std::printf("multiple choice: context %lld + %lld endings x %lld tokens (%lld tokens; %lld scored separately)\n",
                  static_cast<long long>(C), static_cast<long long>(N), static_cast<long long>(L),
                  static_cast<long long>(C + N * L), static_cast<long long>(N * (C + L)));
      std::printf("  separate (%lld requests, one by one): %.3f s\n", static_cast<long long>(N), s);
      std::printf("  separate, one RunBatch:               %.3f s\n", b);
      std::printf("  shared prefix (one request):          %.3f s   -> %.2fx faster than one by one, %.2fx than "
                  "the batch\n", t, s / t, b / t);
      out["mc"] = {{"context", C}, {"endings", N}, {"ending_len", L}, {"separate_s", s}, {"separate_batch_s", b},
                   {"tree_s", t}, {"speedup", s / t}, {"runs", repeat_}};
    } else {
      std::printf("%8s %12s %12s %12s %12s %8s %14s %14s\n", "prompts", "tokens", "one-by-one s", "batch s",
                  "tok/s 1x1", "tok/s B", "speed-up", "bytes 1x1/B");
      nlohmann::json rows = nlohmann::json::array();
      for (int B : sizes_) {
        std::vector<Request> reqs(B);
        for (Request& r : reqs) {
          r.tokens = RandomIds(&rng, length_, V);
          r.top_k = 5;
        }
        std::vector<double> t1, tb;
        uint64_t bytes1 = 0, bytesb = 0;
        int passes = 0;
        for (int rep = 0; rep < repeat_; ++rep) {
          double t0 = Now();
          uint64_t b1 = 0;
          for (const Request& r : batch_only_ ? std::span<const Request>() : std::span<const Request>(reqs)) {
            auto res = engine->Run(r);
            ESTREAM_RETURN_IF_ERROR(res.status());
            b1 += res->bytes_read;
          }
          t1.push_back(Now() - t0);
          t0 = Now();
          auto res = engine->RunBatch(reqs);
          tb.push_back(Now() - t0);
          uint64_t bb = 0;
          std::set<int> seen;  // passes are packed longest first: not in request order
          for (auto& r : res) {
            ESTREAM_RETURN_IF_ERROR(r.status());
            if (!seen.insert(r->pass).second) continue;
            if (verbose_)
              std::printf("    pass %d: %d requests, %lld tokens, %.3f s: embed %.3f attention %.3f [projections %.3f, kernel %.3f] "
                          "router %.3f "
                          "experts %.3f head %.3f (streamed: bubble %.3f, %.2f GB read)\n", r->pass, r->pass_requests,
                          static_cast<long long>(r->pass_tokens), r->seconds, r->timing.embed, r->timing.attention,
                          r->timing.attention_projections, r->timing.attention_kernel, r->timing.router, r->timing.experts, r->timing.head, r->bubble_seconds, r->bytes_read / 1e9);
            bb += r->bytes_read;
            passes = std::max(passes, r->pass + 1);
          }
          bytes1 = b1;
          bytesb = bb;
        }
        const double s1 = batch_only_ ? 0 : Median(t1), sb = Median(tb), tok = static_cast<double>(B) * length_;
        const double tok1 = s1 > 0 ? tok / s1 : 0, speedup = s1 > 0 ? s1 / sb : 0;
        std::printf("%8d %12lld %12.3f %12.3f %12.1f %8.1f %13.2fx %7.2f/%.2f GB\n", B, static_cast<long long>(tok), s1,
                    sb, tok1, tok / sb, speedup, bytes1 / 1e9, bytesb / 1e9);
        rows.push_back({{"prompts", B}, {"tokens", tok}, {"one_by_one_s", s1}, {"batch_s", sb},
                        {"tok_s_one_by_one", tok1}, {"tok_s_batch", tok / sb}, {"speedup", speedup},
                        {"passes", passes}, {"bytes_one_by_one", bytes1}, {"bytes_batch", bytesb},
                        {"runs", repeat_}});
      }
      out["prompt_length"] = length_;
      out["rows"] = rows;
    }
    const uint64_t peak = PeakRssBytes();
    std::printf("peak RSS: %s\n", FormatBytes(peak).c_str());
    out["peak_rss_bytes"] = peak;
    if (!json_.empty()) {
      std::ofstream f(json_);
      f << DumpJson(out, 2) << "\n";
      if (!f) return Status::IOError(json_ + ": write failed");
    }
    return 0;
  }

  std::string model_, json_;
  std::vector<int> sizes_;
  std::vector<int64_t> mc_;
  int64_t length_ = 128;
  int repeat_ = 5;
  bool verbose_ = false;
  bool batch_only_ = false;
  BatchEngineFlags flags_;
};

}  // namespace

ESTREAM_REGISTER_COMMAND(BenchBatchCommand, "bench-batch",
                         "Batched vs one-by-one prefill throughput over batch sizes, and shared-prefix candidates vs separate "
                         "scoring (one process)");

}  // namespace estream::cli
