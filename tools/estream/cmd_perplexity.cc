// estream perplexity: how well the model predicts a text file.
//
//   estream perplexity -m model.gguf -f text.txt [--ctx N] [--json [--no-progress]] [-t THREADS]
//                      [--max-windows K]
//
// The file is tokenized once with the model's vocabulary (no BOS/EOS), then cut into consecutive,
// non-overlapping windows. Each window is one prefill request of at most N tokens: when the
// vocabulary adds a BOS token (tokenizer.ggml.add_bos_token, unless --no-bos) the window is BOS
// followed by N-1 text tokens and every text token in it is scored; otherwise it is N text tokens
// and all but the first are scored (the first has no context). A last, shorter window is run
// too when it scores at least one token.
//
// --llama-cpp scores as llama-perplexity does, so that the figure equals its "Final estimate":
// the file less one final newline (its -f reader drops it), tokenized with the vocabulary's
// BOS/EOS (at least 2N tokens, else refused as llama-perplexity refuses it; its -f text is not
// escape-processed either: the tool turns llama.cpp's escape option off), cut into whole windows
// of exactly N tokens (a shorter rest is not run), the first token of each replaced by BOS when
// the vocabulary adds one, and only each window's second half scored: tokens N/2 + 1 .. N - 1,
// every one with at least N/2 tokens of context. --no-bos then means no BOS anywhere (not at the
// text's start either), as llama-perplexity with the vocabulary's add_bos_token overridden to
// false.
//
// Reported: per window the tokens, the log-likelihood and perplexity; overall the perplexity
// exp(-sum log p / n_scored) over all scored tokens, tokens/s (all window tokens over the summed
// forward-pass time), the wall time and the process's peak RSS.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/json_text.h"
#include "base/memory.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tools/estream/command.h"
#include "tools/estream/common_flags.h"
#include "tools/estream/progress.h"

namespace estream::cli {
namespace {

struct WindowResult {
  int64_t first_text_token = 0;  // index into the tokenized file
  int64_t n_tokens = 0;          // tokens in the request (BOS included)
  int64_t n_scored = 0;
  double log_likelihood = 0;
  double seconds = 0;
  double Perplexity() const { return n_scored > 0 ? std::exp(-log_likelihood / n_scored) : NAN; }
};

class PerplexityCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("-m,--model", model_, "GGUF model file (with a tokenizer)")->required();
    sub->add_option("-f,--file", file_, "text file to score")->required();
    sub->add_option("--ctx", ctx_, "tokens per window (default: 512, or the context length if smaller)")
        ->check(CLI::Range(2, 1 << 30));
    AddThreadsFlag(sub, &threads_);
    sub->add_option("--max-windows", max_windows_, "score at most this many windows (default: all)")
        ->check(PositiveInt());
    sub->add_flag("--no-bos", no_bos_,
                  "no BOS token anywhere, though the vocabulary asks for one (with --llama-cpp: as llama-perplexity "
                  "with --override-kv tokenizer.ggml.add_bos_token=bool:false)");
    sub->add_flag("--llama-cpp", llama_cpp_,
                  "score as llama-perplexity does (whole windows of --ctx tokens, BOS first, only each window's "
                  "second half scored): the same figure as its final estimate");
    sub->add_flag("--json", json_, "print one JSON object");
    sub->add_flag("--no-progress", no_progress_,
                  "with --json, no progress on stderr (default: a line redrawn on a terminal, else a line per "
                  "tenth of the windows)");
  }

  Result<int> Run() override {
    const auto wall_start = std::chrono::steady_clock::now();
    ESTREAM_ASSIGN_OR_RETURN(const std::string text, ReadFileText(file_));
    std::unique_ptr<Tokenizer> tok;
    {
      // Metadata only (no mapping of the weights); the engine opens the file itself.
      ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_, {.mmap = false}));
      auto t = Tokenizer::FromGguf(*gguf);
      if (!t.ok())
        return Status(t.status().code(), t.status().message() + " (perplexity needs the model's tokenizer)");
      tok = std::move(t).value();
    }
    size_t bad = 0;
    if (!Tokenizer::IsValidUtf8(text, &bad))
      std::fprintf(stderr,
                   "estream perplexity: warning: %s is not valid UTF-8 (first bad byte at offset %zu); "
                   "each ill-formed sequence is scored as U+FFFD\n", file_.c_str(), bad);
    const auto tok_start = std::chrono::steady_clock::now();
    std::vector<int32_t> ids =
        llama_cpp_ ? tok->Encode(text.ends_with('\n') ? text.substr(0, text.size() - 1) : text, /*add_special=*/true,
                                 /*parse_special=*/false)
                   : tok->Encode(text, /*add_special=*/false, /*parse_special=*/false);
    // --llama-cpp --no-bos: llama-perplexity with its vocabulary's add_bos_token overridden to false
    // (--override-kv; it has no flag of its own): no BOS at the text's start nor at any window's.
    if (llama_cpp_ && no_bos_ && tok->add_bos() && !ids.empty() && ids.front() == tok->bos_id())
      ids.erase(ids.begin());
    const double tokenize_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - tok_start).count();

    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(model_, {.n_threads = threads_}));
    const ModelInfo& info = engine->info();
    if (tok->n_vocab() > info.n_vocab)
      return Status::InvalidArgument(model_ + ": the tokenizer has " + std::to_string(tok->n_vocab()) +
                                     " tokens but the model's output has " + std::to_string(info.n_vocab));
    const int64_t ctx = ctx_ > 0 ? ctx_ : std::min<int64_t>(512, info.n_ctx);
    if (ctx > info.n_ctx)
      return Status::OutOfRange("--ctx " + std::to_string(ctx) + " is longer than the model's context length " +
                                std::to_string(info.n_ctx));
    const bool bos = tok->add_bos() && !no_bos_;
    if (llama_cpp_ && ctx < 3)
      return Status::InvalidArgument("--llama-cpp scores the second half of each window: give --ctx 3 or more");
    const int64_t text_per_window = llama_cpp_ || !bos ? ctx : ctx - 1;
    // A window must score at least one token; --llama-cpp runs whole windows only.
    const int64_t min_text = llama_cpp_ ? ctx : bos ? 1 : 2;
    // llama-perplexity refuses a text of fewer than 2 x ctx tokens ("you need at least ... tokens
    // to evaluate perplexity with a context of ..."); so does --llama-cpp, whose figure is its.
    if (llama_cpp_ && static_cast<int64_t>(ids.size()) < 2 * ctx)
      return Status::InvalidArgument(file_ + ": the text is " + std::to_string(ids.size()) +
                                     " tokens long; --llama-cpp needs at least 2 x --ctx = " + std::to_string(2 * ctx) +
                                     " tokens, as llama-perplexity does; give a longer text or a smaller --ctx");
    if (static_cast<int64_t>(ids.size()) < min_text)
      return Status::InvalidArgument(file_ + ": the text is " + std::to_string(ids.size()) +
                                     " tokens long; perplexity needs at least " + std::to_string(min_text));

    // The windows: [begin, begin + n) of the text, in order.
    std::vector<std::pair<size_t, size_t>> spans;
    int64_t text_total = 0;
    for (int64_t begin = 0; begin < static_cast<int64_t>(ids.size()); begin += text_per_window) {
      if (max_windows_ > 0 && static_cast<int64_t>(spans.size()) >= max_windows_) break;
      const int64_t n_text = std::min<int64_t>(text_per_window, static_cast<int64_t>(ids.size()) - begin);
      if (n_text < min_text) break;
      spans.emplace_back(static_cast<size_t>(begin), static_cast<size_t>(n_text));
      text_total += n_text;
    }
    // With --json stdout is silent until the end: progress on stderr instead of the window lines.
    ProgressReporter progress(name(), "windows", json_ && !no_progress_);
    std::vector<WindowResult> windows;
    int64_t text_done = 0;
    for (const auto& [begin, n_text] : spans) {
      Request req;
      req.top_k = 0;
      req.prompt_logprobs = true;
      if (bos && !llama_cpp_) req.tokens.push_back(tok->bos_id());
      req.tokens.insert(req.tokens.end(), ids.begin() + begin, ids.begin() + begin + n_text);
      if (bos && llama_cpp_) req.tokens[0] = tok->bos_id();
      ESTREAM_ASSIGN_OR_RETURN(Response resp, engine->Run(req));
      WindowResult w;
      w.first_text_token = static_cast<int64_t>(begin);
      w.n_tokens = static_cast<int64_t>(req.tokens.size());
      // prompt_logprobs[p - 1] is token p's; --llama-cpp scores tokens ctx / 2 + 1 .. ctx - 1.
      const size_t first = llama_cpp_ ? static_cast<size_t>(ctx / 2) : 0;
      for (size_t p = first; p < resp.prompt_logprobs.size(); ++p) w.log_likelihood += resp.prompt_logprobs[p];
      w.n_scored = static_cast<int64_t>(resp.prompt_logprobs.size() - first);
      w.seconds = resp.seconds;
      windows.push_back(w);
      text_done += static_cast<int64_t>(n_text);
      progress.Update(static_cast<int64_t>(windows.size()), static_cast<int64_t>(spans.size()), text_done, text_total);
      if (!json_)
        std::printf("window %4zu  tokens %6lld  scored %6lld  log-likelihood %12.4f  perplexity %10.4f  %.3f s\n",
                    windows.size() - 1, static_cast<long long>(w.n_tokens), static_cast<long long>(w.n_scored),
                    w.log_likelihood, w.Perplexity(), w.seconds);
    }
    progress.Finish();

    WindowResult total;
    for (const WindowResult& w : windows) {
      total.n_tokens += w.n_tokens;
      total.n_scored += w.n_scored;
      total.log_likelihood += w.log_likelihood;
      total.seconds += w.seconds;
    }
    const double tps = total.seconds > 0 ? static_cast<double>(total.n_tokens) / total.seconds : 0;
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    const uint64_t peak = PeakRssBytes();

    if (json_) {
      nlohmann::json j;
      j["model"] = model_;
      j["file"] = file_;
      j["ctx"] = ctx;
      j["bos"] = bos;
      j["llama_cpp"] = llama_cpp_;
      j["n_text_tokens"] = ids.size();
      j["tokenize_seconds"] = tokenize_seconds;
      j["n_windows"] = windows.size();
      j["n_tokens"] = total.n_tokens;
      j["n_scored"] = total.n_scored;
      j["log_likelihood"] = total.log_likelihood;
      j["perplexity"] = total.Perplexity();
      j["forward_seconds"] = total.seconds;
      j["tokens_per_second"] = tps;
      j["wall_seconds"] = wall;
      j["threads"] = engine->n_threads();
      j["peak_rss_bytes"] = peak;
      nlohmann::json arr = nlohmann::json::array();
      for (const WindowResult& w : windows)
        arr.push_back({{"first_text_token", w.first_text_token}, {"n_tokens", w.n_tokens},
                       {"n_scored", w.n_scored}, {"log_likelihood", w.log_likelihood},
                       {"perplexity", w.Perplexity()}, {"seconds", w.seconds}});
      j["windows"] = std::move(arr);
      std::printf("%s\n", DumpJson(j, 2).c_str());
      return 0;
    }
    std::printf("text: %zu tokens (tokenized in %.3f s), %zu windows of up to %lld tokens%s\n", ids.size(),
                tokenize_seconds, windows.size(), static_cast<long long>(ctx), bos ? " (BOS first)" : "");
    std::printf("perplexity: %.4f over %lld scored tokens (log-likelihood %.4f)\n", total.Perplexity(),
                static_cast<long long>(total.n_scored), total.log_likelihood);
    std::printf("prefill: %.1f tokens/s (%lld tokens in %.3f s of forward passes, %d threads); wall %.3f s\n", tps,
                static_cast<long long>(total.n_tokens), total.seconds, engine->n_threads(), wall);
    std::printf("peak RSS: %s\n", FormatBytes(peak).c_str());
    return 0;
  }

 private:
  std::string model_, file_;
  int64_t ctx_ = 0;
  int threads_ = 0;
  int64_t max_windows_ = 0;
  bool no_bos_ = false, json_ = false, llama_cpp_ = false, no_progress_ = false;
};

}  // namespace

ESTREAM_REGISTER_COMMAND(PerplexityCommand, "perplexity",
                         "Perplexity of the model on a text file, in windows of --ctx tokens");

}  // namespace estream::cli
