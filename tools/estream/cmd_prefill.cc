// estream prefill: one prompt through the all-resident engine; prints the next-token distribution,
// the timing and the peak memory (or one JSON object with --json).
#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cctype>
#include <climits>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/memory.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tools/estream/command.h"

namespace estream::cli {
namespace {

// Token ids separated by commas and/or white space. The source names the input in errors.
Result<std::vector<int32_t>> ParseTokenIds(const std::string& text, const std::string& source) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    const char ch = text[i];
    if (ch == ',' || std::isspace(static_cast<unsigned char>(ch))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && text[j] != ',' && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    const std::string item = text.substr(i, j - i);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (end != item.c_str() + item.size() || errno == ERANGE || v < INT32_MIN || v > INT32_MAX)
      return Status::InvalidArgument(source + ": '" + item + "' is not a token id (give integers separated by "
                                     "commas or spaces)");
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return ids;
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// User + system CPU time of this process (all threads), in seconds.
double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

class PrefillCommand : public Command {
 public:
  const char* name() const override { return "prefill"; }
  const char* help() const override {
    return "Run one prompt through the model (all weights resident) and print the next-token distribution";
  }

  void Setup(CLI::App* sub) override {
    sub->add_option("-m,--model", model_, "GGUF model file")->required();
    tokens_opt_ = sub->add_option("--tokens", tokens_, "prompt as token ids: 1,2,3 or @FILE (ids separated by commas or spaces)");
    prompt_opt_ = sub->add_option("-p,--prompt", prompt_, "prompt text (tokenized with the model's vocabulary)");
    file_opt_ = sub->add_option("-f,--file", prompt_file_, "file holding the prompt text");
    sub->add_flag("--no-bos", no_bos_, "with -p/-f: do not add the BOS/EOS tokens the vocabulary asks for");
    sub->add_option("--top-k", top_k_, "how many next tokens to print (default 5)")->check(CLI::NonNegativeNumber);
    sub->add_flag("--logprobs", logprobs_, "score the prompt: per-token log-probabilities and perplexity");
    sub->add_flag("--embedding", embedding_, "output the final hidden state (after the final norm)");
    sub->add_option("--pool", pool_, "embedding pooling: last (default) or mean")
        ->check(CLI::IsMember({"last", "mean"}));
    sub->add_flag("--json", json_, "print one JSON object");
    sub->add_option("-t,--threads", threads_, "compute threads (default: one per CPU)")->check(CLI::NonNegativeNumber);
    sub->add_option("--dump-logits", dump_logits_,
                    "write the logits of every position to FILE: float32 little-endian [n_tokens][n_vocab]");
    sub->add_option("--repack", repack_, "repack quantised weights into the kernels' layout at load: auto (default), "
                    "never")->check(CLI::IsMember({"auto", "never"}));
    sub->add_option("--sweep", sweep_,
                    "benchmark: run the first N tokens of the prompt for each N of this list (e.g. 128,512,1024,2048), "
                    "--repeat times each, and report median times and the implied share of the int8 peak")
        ->delimiter(',');
    sub->add_option("--repeat", repeat_, "run the prompt N times (model loaded once) and report the median time")
        ->check(CLI::PositiveNumber);
  }

  int Run() override {
    Result<int> r = RunImpl();
    if (!r.ok()) return ReportError(name(), r.status());
    return *r;
  }

 private:
  Result<std::vector<int32_t>> PromptTokens() {
    const size_t given = tokens_opt_->count() + prompt_opt_->count() + file_opt_->count();
    if (given != 1) return Status::InvalidArgument("give exactly one of --tokens, -p/--prompt, -f/--file");
    if (tokens_opt_->count()) {
      if (tokens_[0] == '@') {
        ESTREAM_ASSIGN_OR_RETURN(std::string text, ReadFile(tokens_.substr(1)));
        return ParseTokenIds(text, tokens_.substr(1));
      }
      return ParseTokenIds(tokens_, "--tokens");
    }
    std::string text = prompt_;
    if (file_opt_->count()) {
      ESTREAM_ASSIGN_OR_RETURN(text, ReadFile(prompt_file_));
    }
    if (!tokenizer_)
      return Status::InvalidArgument(model_ + ": text prompts need the model's tokenizer: " +
                                     tokenizer_status_.message() + " (pass token ids with --tokens)");
    return tokenizer_->Encode(text, !no_bos_, /*parse_special=*/false);
  }

  Result<int> RunImpl() {
    // The tokenizer, when the model has one (only needed for text prompts and for printing).
    {
      auto file = GgufFile::Open(model_, {.mmap = false});
      if (file.ok()) {
        auto tok = Tokenizer::FromGguf(**file);
        if (tok.ok()) tokenizer_ = std::move(*tok);
        else tokenizer_status_ = tok.status();
      } else {
        tokenizer_status_ = file.status();
      }
    }
    ESTREAM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, PromptTokens());
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(
        model_, {.n_threads = threads_,
                 .repack = repack_ == "never" ? EngineOptions::Repack::kNever : EngineOptions::Repack::kAuto}));

    if (!sweep_.empty()) return Sweep(*engine, ids);

    Request req;
    req.tokens = ids;
    req.top_k = std::min(top_k_, engine->info().n_vocab);
    req.prompt_logprobs = logprobs_;
    if (embedding_) req.embedding = pool_ == "mean" ? Request::Pooling::kMean : Request::Pooling::kLast;
    std::FILE* dump = nullptr;
    if (!dump_logits_.empty()) {
      dump = std::fopen(dump_logits_.c_str(), "wb");
      if (!dump) return Status::IOError(dump_logits_ + ": cannot create: " + std::strerror(errno));
      const int64_t n_vocab = engine->info().n_vocab;
      req.logits_sink = [dump, n_vocab, this](int64_t, int64_t n_rows, const float* logits) -> Status {
        static_assert(std::endian::native == std::endian::little, "--dump-logits writes the host's float32");
        if (std::fwrite(logits, sizeof(float) * n_vocab, n_rows, dump) != static_cast<size_t>(n_rows))
          return Status::IOError(dump_logits_ + ": write failed: " + std::strerror(errno));
        return Status::Ok();
      };
    }
    std::vector<double> seconds;
    Response resp;
    for (int i = 0; i < repeat_; ++i) {
      if (dump) std::rewind(dump);
      Result<Response> r = engine->Run(req);
      if (!r.ok()) {
        if (dump) std::fclose(dump);
        return r.status();
      }
      seconds.push_back(r->seconds);
      resp = std::move(*r);
    }
    if (dump && std::fclose(dump) != 0) return Status::IOError(dump_logits_ + ": close failed: " + std::strerror(errno));
    const double secs = Median(seconds);
    const double tps = static_cast<double>(resp.n_tokens) / secs;
    const uint64_t peak = PeakRssBytes();
    const ModelInfo& info = engine->info();

    if (json_) {
      nlohmann::json j;
      j["model"] = model_;
      j["architecture"] = info.architecture;
      j["threads"] = engine->n_threads();
      j["n_tokens"] = resp.n_tokens;
      j["seconds"] = secs;
      j["tokens_per_second"] = tps;
      if (repeat_ > 1) j["seconds_all"] = seconds;
      j["timing"] = {{"embed", resp.timing.embed}, {"attention", resp.timing.attention}, {"router", resp.timing.router},
                     {"experts", resp.timing.experts}, {"head", resp.timing.head}};
      j["peak_rss_bytes"] = peak;
      j["top"] = nlohmann::json::array();
      for (const TokenLogprob& t : resp.top) {
        nlohmann::json e{{"token", t.token}, {"logprob", t.logprob}};
        if (tokenizer_) e["text"] = tokenizer_->TokenPiece(t.token);
        j["top"].push_back(e);
      }
      if (logprobs_) {
        j["logprobs"] = resp.prompt_logprobs;
        j["log_likelihood"] = resp.log_likelihood;
        if (std::isfinite(resp.perplexity)) j["perplexity"] = resp.perplexity;
        else j["perplexity"] = nullptr;
      }
      if (embedding_) {
        j["pool"] = pool_;
        j["embedding"] = resp.embedding;
      }
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
      return 0;
    }
    std::printf("model: %s (%s, %d layers, %d experts, top-%d, %s of weights)\n", model_.c_str(),
                info.architecture.c_str(), info.n_layer, info.n_expert, info.n_expert_used,
                FormatBytes(info.weight_bytes).c_str());
    std::printf("prompt: %lld tokens\n", static_cast<long long>(resp.n_tokens));
    std::printf("prefill: %.3f s, %.1f tokens/s (%d threads%s)\n", secs, tps, engine->n_threads(),
                repeat_ > 1 ? (", median of " + std::to_string(repeat_) + " runs").c_str() : "");
    std::printf("  attention %.3f s, router %.3f s, experts %.3f s, embeddings + head %.3f s (last run)\n",
                resp.timing.attention, resp.timing.router, resp.timing.experts, resp.timing.embed + resp.timing.head);
    std::printf("peak RSS: %s\n", FormatBytes(peak).c_str());
    if (!resp.top.empty()) {
      std::printf("top %zu next tokens:\n", resp.top.size());
      for (const TokenLogprob& t : resp.top) {
        std::printf("  %8d  logprob %9.4f  p %.4f", t.token, t.logprob, std::exp(t.logprob));
        if (tokenizer_) std::printf("  %s", nlohmann::json(tokenizer_->TokenPiece(t.token))
                                                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                                                .c_str());
        std::printf("\n");
      }
    }
    if (logprobs_) {
      std::printf("log-likelihood: %.4f over %lld scored tokens, perplexity: %.4f\n", resp.log_likelihood,
                  static_cast<long long>(resp.n_tokens - 1), resp.perplexity);
    }
    if (embedding_) {
      double norm = 0;
      for (float v : resp.embedding) norm += static_cast<double>(v) * v;
      std::printf("embedding (%s, %zu values, L2 norm %.4f):", pool_.c_str(), resp.embedding.size(), std::sqrt(norm));
      for (size_t i = 0; i < std::min<size_t>(8, resp.embedding.size()); ++i) std::printf(" %.5f", resp.embedding[i]);
      std::printf("%s\n", resp.embedding.size() > 8 ? " ..." : "");
    }
    if (!dump_logits_.empty())
      std::printf("logits: %s (%lld x %d float32)\n", dump_logits_.c_str(), static_cast<long long>(resp.n_tokens),
                  info.n_vocab);
    return 0;
  }

  CLI::Option* tokens_opt_ = nullptr;
  CLI::Option* prompt_opt_ = nullptr;
  CLI::Option* file_opt_ = nullptr;
  // Multiply-adds of one prefill of n tokens with the top-1 LM head row: every weight matrix a token
  // meets (Q/K/V/O, router, its experts' gate/up/down) plus the attention scores and the weighted
  // sums over the causal prefix.
  static double PrefillMacs(const ModelInfo& i, int64_t n) {
    const double d = i.n_embd, q = double(i.n_head) * i.head_dim, kv = double(i.n_head_kv) * i.head_dim;
    const double per_token_layer =
        d * (q + 2 * kv) + q * d + d * i.n_expert + double(i.n_expert_used) * 3 * d * i.n_ff_expert;
    const double attention_layer = double(n) * double(n + 1) / 2 * 2 * q;  // q.k and p.v over the prefix
    return i.n_layer * (n * per_token_layer + attention_layer) + d * i.n_vocab;
  }

  Result<int> Sweep(Engine& engine, const std::vector<int32_t>& ids) {
    constexpr double kInt8PeakOps = 2.1e12;  // this machine, 2 threads (docs/PERFORMANCE.md, Peaks)
    nlohmann::json rows = nlohmann::json::array();
    for (int n : sweep_) {
      if (n < 1 || n > static_cast<int>(ids.size()))
        return Status::InvalidArgument("--sweep length " + std::to_string(n) + " is not within the prompt's " +
                                       std::to_string(ids.size()) + " tokens");
      Request req{.tokens = std::vector<int32_t>(ids.begin(), ids.begin() + n), .top_k = 1};
      std::vector<double> secs, cpu;
      Response last;
      for (int r = 0; r < repeat_; ++r) {
        const double c0 = ProcessCpuSeconds();
        ESTREAM_ASSIGN_OR_RETURN(last, engine.Run(req));
        cpu.push_back(ProcessCpuSeconds() - c0);
        secs.push_back(last.seconds);
      }
      const double med = Median(secs);
      // CPU time of all threads, divided by the thread count: the wall time the run would take with
      // its threads never descheduled (the machine is shared; see docs/PERFORMANCE.md). OpenMP's
      // spin-waiting counts as CPU time, so this is an upper bound of that wall time.
      const double cpu_wall = Median(cpu) / engine.n_threads();
      const double macs = PrefillMacs(engine.info(), n);
      const double share = 2 * macs / med / kInt8PeakOps;
      rows.push_back({{"n_tokens", n}, {"seconds", med}, {"tokens_per_second", n / med}, {"seconds_all", secs},
                      {"cpu_seconds_per_thread", cpu_wall}, {"tokens_per_cpu_second_per_thread", n / cpu_wall},
                      {"gops", 2 * macs / med / 1e9}, {"int8_peak_share", share},
                      {"timing", {{"attention", last.timing.attention}, {"router", last.timing.router},
                                  {"experts", last.timing.experts}, {"head", last.timing.embed + last.timing.head}}}});
      if (!json_) {
        std::printf("T=%5d  median %8.3f s  %8.1f tok/s  %6.1f GOP/s  %5.1f%% of int8 peak | CPU/thread %.3f s  %.1f tok/s"
                    "  %.1f%% | runs:",
                    n, med, n / med, 2 * macs / med / 1e9, 100 * share, cpu_wall, n / cpu_wall,
                    100 * 2 * macs / cpu_wall / kInt8PeakOps);
        for (double v : secs) std::printf(" %.3f", v);
        std::printf("   (last: attention %.3f, router %.3f, experts %.3f)\n", last.timing.attention, last.timing.router,
                    last.timing.experts);
        std::fflush(stdout);
      }
    }
    if (json_) {
      nlohmann::json j{{"model", model_}, {"threads", engine.n_threads()}, {"peak_rss_bytes", PeakRssBytes()},
                       {"sweep", rows}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("threads %d, peak RSS %s\n", engine.n_threads(), FormatBytes(PeakRssBytes()).c_str());
    }
    return 0;
  }

  std::string model_;
  std::string tokens_;
  std::string prompt_;
  std::string prompt_file_;
  bool no_bos_ = false;
  int top_k_ = 5;
  bool logprobs_ = false;
  bool embedding_ = false;
  std::string pool_ = "last";
  bool json_ = false;
  int threads_ = 0;
  std::string dump_logits_;
  int repeat_ = 1;
  std::vector<int> sweep_;
  std::string repack_ = "auto";
  std::unique_ptr<Tokenizer> tokenizer_;
  Status tokenizer_status_ = Status::NotSupported("no tokenizer");
};

ESTREAM_REGISTER_COMMAND(PrefillCommand);

}  // namespace
}  // namespace estream::cli
