// estream prefill: one prompt through the all-resident engine; prints the next-token distribution,
// the timing and the peak memory (or one JSON object with --json).
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

#include "base/json_text.h"
#include "base/memory.h"
#include "base/stats.h"
#include "config/profile.h"
#include "estream/engine.h"
#include "gguf/gguf.h"
#include "pack/packed_layout.h"
#include "profiler/prompt_lengths.h"
#include "tokenizer/tokenizer.h"
#include "tools/estream/command.h"
#include "tools/estream/common_flags.h"
#include "tools/estream/response_json.h"

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

class PrefillCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("-m,--model", model_, "GGUF model file")->required();
    tokens_opt_ = sub->add_option("--tokens", tokens_, "prompt as token ids: 1,2,3 or @FILE (ids separated by commas or spaces)");
    prompt_opt_ = sub->add_option("-p,--prompt", prompt_, "prompt text (tokenized with the model's vocabulary)");
    file_opt_ = sub->add_option("-f,--file", prompt_file_, "file holding the prompt text");
    sub->add_flag("--no-bos", no_bos_, "with -p/-f: do not add the BOS/EOS tokens the vocabulary asks for");
    sub->add_option("--top-k", top_k_, "how many next tokens to print (default 5)")->check(NonNegativeInt());
    sub->add_flag("--logprobs", logprobs_, "score the prompt: each token's log-probability (a table: position, "
                  "token, logprob, piece; the first and last 32 rows of a longer prompt, all with --json), the "
                  "log-likelihood and the perplexity");
    sub->add_flag("--embedding", embedding_, "output the final hidden state (after the final norm)");
    pool_opt_ = sub->add_option("--pool", pool_, "embedding pooling: last (default) or mean (implies --embedding)")
                    ->check(CLI::IsMember({"last", "mean"}));
    sub->add_flag("--json", json_, "print one JSON object");
    AddThreadsFlag(sub, &threads_);
    sub->add_option("--dump-logits", dump_logits_,
                    "write the logits of every position to FILE: float32 little-endian [n_tokens][n_vocab]");
    sub->add_option("--repack", repack_, "repack quantised weights into the kernels' layout at load: auto (default), "
                    "never")->check(CLI::IsMember({"auto", "never"}));
    sub->add_option("--sweep", sweep_,
                    "benchmark: run the first N tokens of the prompt for each N of this list (e.g. 128,512,1024,2048), "
                    "--repeat times each, and report median times and op rates (as `estream bench --in-process`)")
        ->delimiter(',');
    AddBudgetFlag(sub, &budget_,
                    "packed models: run within this memory budget (bytes, or with a K/M/G suffix: 4G); experts are "
                    "streamed through a bounded arena and peak RSS stays under it; G/B/Q come from the configuration "
                    "'estream profile' stored for this budget, else are re-solved from its stored profile, else a "
                    "default rule");
    sub->add_option("--group-size", group_size_, "packed models: experts per group/bank (G; default: from --budget)")
        ->check(PositiveInt());
    sub->add_option("--banks", banks_, "packed models: banks of the arena (B; default: from --budget)")
        ->check(PositiveInt());
    // The flags that change only a streamed run (a packed model with --budget): named in a warning
    // when given to a run that does not stream.
    streaming_only_ = {
        sub->add_option("--queue-depth", queue_depth_,
                        "packed models: reads in flight (Q; default: from --budget, else 8)")->check(PositiveInt()),
        AddScheduleFlag(sub, &schedule_, "packed models: when expert groups are read: on-demand, after-routing, "
                        "early (default)"),
        AddIoFlag(sub, &io_, "packed models: "),
        sub->add_option("--budget-tokens", budget_tokens_,
                        "packed models: longest prompt the budget plans activations for (default: the prompt's "
                        "length)")->check(PositiveInt()),
        AddExpertCacheFlag(sub, &expert_cache_, "0: each run streams as if it were the first; with --repeat, auto "
                           "measures warm runs")};
    sub->add_flag("--no-verify", no_verify_, "packed models: skip the per-record checksum check of streamed reads");
    streaming_only_.push_back(
        sub->add_flag("--verify-every-read", verify_every_read_,
                      "packed models: check a record's checksum on every read (default: the first read of each "
                      "record)"));
    sub->add_option("--trace", trace_, "packed models: write a Chrome/Perfetto trace (JSON) of the reads and compute "
                    "steps of the (last) request to FILE");
    sub->add_option("--repeat", repeat_, "run the prompt N times (model loaded once) and report the median time")
        ->check(PositiveInt());
  }

 private:
  Result<std::vector<int32_t>> PromptTokens() {
    const size_t given = tokens_opt_->count() + prompt_opt_->count() + file_opt_->count();
    if (given != 1) return Status::InvalidArgument("give exactly one of --tokens, -p/--prompt, -f/--file");
    if (tokens_opt_->count()) {
      if (tokens_[0] == '@') {
        ESTREAM_ASSIGN_OR_RETURN(std::string text, ReadFileText(tokens_.substr(1)));
        return ParseTokenIds(text, tokens_.substr(1));
      }
      return ParseTokenIds(tokens_, "--tokens");
    }
    std::string text = prompt_;
    if (file_opt_->count()) {
      ESTREAM_ASSIGN_OR_RETURN(text, ReadFileText(prompt_file_));
    }
    if (!tokenizer_)
      return Status::InvalidArgument(model_ + ": text prompts need the model's tokenizer: " +
                                     tokenizer_status_.message() + " (pass token ids with --tokens)");
    return tokenizer_->Encode(text, !no_bos_, /*parse_special=*/false);
  }

  Result<int> Run() override {
    // The tokenizer, when the model has one (only needed for text prompts and for printing).
    bool packed = false;
    {
      auto file = GgufFile::Open(model_, {.mmap = false});
      if (file.ok()) {
        packed = io::IsPackedModel(**file);
        stored_threads_ = config::ReadStoredThreads((*file)->kvs());
        auto tok = Tokenizer::FromGguf(**file);
        if (tok.ok()) tokenizer_ = std::move(*tok);
        else tokenizer_status_ = tok.status();
      } else {
        return file.status();  // no model to load either: its own error, not a tokenizer hint
      }
    }
    ESTREAM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, PromptTokens());
    ESTREAM_RETURN_IF_ERROR(CheckWritableOutput(dump_logits_, "--dump-logits"));
    EngineOptions eo{.n_threads = threads_,
                     .repack = repack_ == "never" ? EngineOptions::Repack::kNever : EngineOptions::Repack::kAuto};
    if (!budget_.empty()) {
      ESTREAM_ASSIGN_OR_RETURN(eo.budget_bytes, ParseBudget(budget_));
    }
    eo.group_size = group_size_;
    eo.banks = banks_;
    eo.queue_depth = queue_depth_;
    ESTREAM_ASSIGN_OR_RETURN(eo.schedule, ParseSchedule(schedule_));
    ESTREAM_ASSIGN_OR_RETURN(eo.io, ParseIoBackend(io_));
    ESTREAM_ASSIGN_OR_RETURN(eo.expert_cache_bytes, ParseExpertCache(expert_cache_));
    int64_t longest = static_cast<int64_t>(ids.size());
    for (int n : sweep_) longest = std::max<int64_t>(longest, n);
    eo.budget_tokens = budget_tokens_ > 0 ? budget_tokens_ : longest;
    eo.trace_path = trace_;
    eo.verify_checksums = !no_verify_;
    eo.verify_every_read = verify_every_read_;
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(model_, eo));
    if (eo.budget_bytes == 0 && group_size_ == 0 && banks_ == 0) WarnStreamingOnlyFlags(packed);

    if (!sweep_.empty()) return Sweep(*engine, ids);

    Request req;
    req.tokens = ids;
    req.top_k = std::min(top_k_, engine->info().n_vocab);
    req.prompt_logprobs = logprobs_;
    if (pool_opt_->count()) embedding_ = true;
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
    if (resp.config.streamed && !budget_.empty()) ReportConfigSource(resp.config, engine->n_threads());
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
      j["timing"] = {{"embed", resp.timing.embed}, {"attention", resp.timing.attention},
                     {"attention_projections", resp.timing.attention_projections},
                     {"attention_kernel", resp.timing.attention_kernel}, {"router", resp.timing.router},
                     {"experts", resp.timing.experts}, {"dense_ffn", resp.timing.dense_ffn},
                     {"head", resp.timing.head}};
      j["peak_rss_bytes"] = peak;
      j["expert_seconds"] = resp.expert_seconds;
      j["nonexpert_seconds"] = resp.nonexpert_seconds;
      j["bubble_seconds"] = resp.bubble_seconds;
      j["bubble_rate"] = resp.bubble_rate;
      j["bytes_read"] = resp.bytes_read;
      j["read_gbps"] = resp.read_gbps;
      j["streamed"] = resp.config.streamed;
      if (resp.config.streamed) j["config"] = StreamConfigJson(resp);
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
      std::printf("%s\n", DumpJson(j).c_str());
      return 0;
    }
    std::printf("model: %s (%s, %d layers, %d experts, top-%d, %s of weights)\n", model_.c_str(),
                info.architecture.c_str(), info.n_layer, info.n_expert, info.n_expert_used,
                FormatBytes(info.weight_bytes).c_str());
    std::printf("prompt: %lld tokens\n", static_cast<long long>(resp.n_tokens));
    std::printf("prefill: %.3f s, %.1f tokens/s (%d threads%s)\n", secs, tps, engine->n_threads(),
                repeat_ > 1 ? (", median of " + std::to_string(repeat_) + " runs").c_str() : "");
    std::printf("  attention %.3f s (projections %.3f, kernel %.3f), router %.3f s, experts %.3f s, embeddings + head "
                "%.3f s (last run)\n",
                resp.timing.attention, resp.timing.attention_projections, resp.timing.attention_kernel,
                resp.timing.router, resp.timing.experts, resp.timing.embed + resp.timing.head);
    if (resp.timing.dense_ffn > 0)
      std::printf("  dense FFN blocks and shared experts %.3f s\n", resp.timing.dense_ffn);
    std::printf("peak RSS: %s\n", FormatBytes(peak).c_str());
    if (resp.config.streamed) {
      const Response::StreamConfig& k = resp.config;
      std::printf("streamed experts: G=%d B=%d Q=%d schedule %s (%s), arena %s of %s expert bytes (%.1f%%), %s%s"
                  " (G/B/Q: %s)\n",
                  k.group_size, k.banks, k.queue_depth, k.schedule.c_str(), k.io_backend.c_str(),
                  FormatBytes(k.arena_bytes).c_str(), FormatBytes(k.expert_bytes).c_str(),
                  100.0 * k.arena_bytes / std::max<uint64_t>(k.expert_bytes, 1),
                  k.budget_bytes > 0 ? "budget " : "no budget (explicit sizes)",
                  k.budget_bytes > 0 ? FormatBytes(k.budget_bytes).c_str() : "", k.source.c_str());
      std::printf("  expert %.3f s (bubble %.3f s, %.1f%% of the request), non-expert %.3f s; read %s at %.2f GB/s "
                  "(%lld groups read, %lld skipped, %lld cancelled)\n",
                  resp.expert_seconds, resp.bubble_seconds, 100 * resp.bubble_rate, resp.nonexpert_seconds,
                  FormatBytes(resp.bytes_read).c_str(), resp.read_gbps, static_cast<long long>(k.groups_read),
                  static_cast<long long>(k.groups_skipped), static_cast<long long>(k.groups_cancelled));
      if (k.cache_banks > 0)
        std::printf("  expert cache: %d banks (%s), %lld of %lld expert records found resident (last run)\n",
                    k.cache_banks, FormatBytes(k.cache_bytes).c_str(), static_cast<long long>(resp.experts_cached),
                    static_cast<long long>(resp.experts_needed));
    }
    if (!resp.top.empty()) {
      std::printf("top %zu next tokens:\n", resp.top.size());
      for (const TokenLogprob& t : resp.top) {
        std::printf("  %8d  logprob %9.4f  p %.4f", t.token, t.logprob, std::exp(t.logprob));
        if (tokenizer_) std::printf("  %s", PieceJson(t.token).c_str());
        std::printf("\n");
      }
    }
    if (logprobs_) {
      PrintPromptLogprobs(ids, resp.prompt_logprobs);
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

  // --logprobs in text: one row per scored token (position t + 1, its id, logprobs[t], its piece),
  // the first and last kLogprobRowsShown / 2 rows of a longer prompt (--json has every value).
  static constexpr size_t kLogprobRowsShown = 64;
  void PrintPromptLogprobs(const std::vector<int32_t>& ids, const std::vector<float>& logprobs) const {
    const size_t n = logprobs.size();
    std::printf("prompt log-probabilities (log p(token | the tokens before it); position 0 is not scored):\n");
    std::printf("  %8s  %8s  %9s%s\n", "position", "token", "logprob", tokenizer_ ? "  piece" : "");
    const size_t head = n > kLogprobRowsShown ? kLogprobRowsShown / 2 : n;
    for (size_t t = 0; t < n; ++t) {
      if (t == head && n > kLogprobRowsShown) {
        std::printf("  ... %zu rows left out (--json prints every one)\n", n - kLogprobRowsShown);
        t = n - kLogprobRowsShown / 2;
      }
      std::printf("  %8zu  %8d  %9.4f", t + 1, ids[t + 1], logprobs[t]);
      if (tokenizer_) std::printf("  %s", PieceJson(ids[t + 1]).c_str());
      std::printf("\n");
    }
  }

  // A token's piece as a JSON string (quoted, escapes for control bytes and invalid UTF-8).
  std::string PieceJson(int32_t token) const {
    return DumpJson(nlohmann::json(tokenizer_->TokenPiece(token)));
  }

  // With --budget: says on stderr when G/B/Q did not come from the configurator (estream profile),
  // and when they did but from a profile measured with another thread count than this run's.
  void ReportConfigSource(const Response::StreamConfig& k, int n_threads) const {
    // kStored is the stored choice (solved from the profile's timings: its own count, else the
    // profile's); kProfile a re-solve from the stored profile.
    uint32_t measured_with = 0;
    if (k.source_kind == ConfigSource::kStored)
      measured_with = stored_threads_.choice > 0 ? stored_threads_.choice : stored_threads_.profile;
    else if (k.source_kind == ConfigSource::kProfile)
      measured_with = stored_threads_.profile;
    const std::string note = config::ThreadMismatchNote(measured_with, n_threads, model_, budget_);
    if (!note.empty()) std::fprintf(stderr, "estream prefill: %s\n", note.c_str());
    if (k.source_kind == ConfigSource::kRule) {
      if (k.source_note.empty())
        std::fprintf(stderr, "estream prefill: no stored profile: run estream profile %s --budget %s (G/B/Q from the "
                     "default rule)\n", model_.c_str(), budget_.c_str());
      else
        std::fprintf(stderr, "estream prefill: G/B/Q from the default rule: %s\n", k.source_note.c_str());
    } else if (!k.source_note.empty()) {
      std::fprintf(stderr, "estream prefill: G/B/Q %s\n", k.source.c_str());
    }
  }

  // One warning line on stderr naming the streaming-only flags given to a run that does not
  // stream (an unpacked GGUF, or a packed model without --budget / --group-size / --banks): they
  // would do nothing there.
  void WarnStreamingOnlyFlags(bool packed) const {
    std::string given;
    for (const CLI::Option* o : streaming_only_)
      if (o->count() > 0) given += (given.empty() ? "" : ", ") + o->get_name();
    if (given.empty()) return;
    std::fprintf(stderr, "estream prefill: warning: %s %s nothing here: %s (they apply to a packed model run with "
                 "--budget)\n", given.c_str(), given.find(',') == std::string::npos ? "does" : "do",
                 packed ? "no --budget, so the experts are resident" : (model_ + " is not packed").c_str());
  }

  CLI::Option* tokens_opt_ = nullptr;
  CLI::Option* prompt_opt_ = nullptr;
  CLI::Option* file_opt_ = nullptr;
  // --sweep: the prompt-length benchmark of the library (profiler::BenchPromptLengths).
  Result<int> Sweep(Engine& engine, const std::vector<int32_t>& ids) {
    ESTREAM_ASSIGN_OR_RETURN(profiler::PromptLengthsResult r,
                             profiler::BenchPromptLengths(engine, ids, sweep_, repeat_));
    if (json_) {
      std::printf("%s\n", profiler::PromptLengthsJson(model_, r).c_str());
      return 0;
    }
    for (const profiler::PromptLengthPoint& p : r.points) {
      const double n = static_cast<double>(p.n_tokens);
      std::printf("T=%5lld  median %8.3f s  %8.1f tok/s  %6.1f GOP/s | CPU/thread %.3f s  %.1f tok/s | runs:",
                  static_cast<long long>(p.n_tokens), p.seconds, n / p.seconds, p.gops, p.cpu_seconds_per_thread,
                  n / p.cpu_seconds_per_thread);
      for (double v : p.seconds_all) std::printf(" %.3f", v);
      std::printf("   (last: attention %.3f [projections %.3f, kernel %.3f], router %.3f, experts %.3f, dense FFN %.3f)\n",
                  p.timing.attention, p.timing.attention_projections, p.timing.attention_kernel, p.timing.router,
                  p.timing.experts, p.timing.dense_ffn);
    }
    std::printf("threads %d, peak RSS %s\n", r.threads, FormatBytes(r.peak_rss_bytes).c_str());
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
  CLI::Option* pool_opt_ = nullptr;
  bool json_ = false;
  int threads_ = 0;
  std::string dump_logits_;
  int repeat_ = 1;
  std::vector<int> sweep_;
  std::string repack_ = "auto";
  std::string budget_;
  std::string expert_cache_ = "0";
  int group_size_ = 0;
  int banks_ = 0;
  int queue_depth_ = 0;
  std::string schedule_ = "early";
  std::string io_ = "uring";
  int64_t budget_tokens_ = 0;
  std::string trace_;
  bool no_verify_ = false;
  bool verify_every_read_ = false;
  std::vector<CLI::Option*> streaming_only_;
  std::unique_ptr<Tokenizer> tokenizer_;
  config::StoredThreads stored_threads_;  // n_threads keys of the model's stored profile/choice
  Status tokenizer_status_ = Status::NotSupported("no tokenizer");
};

ESTREAM_REGISTER_COMMAND(PrefillCommand, "prefill",
                         "Run one prompt through the model and print the next-token distribution (all weights resident, or a packed model inside --budget with experts streamed from disk)");

}  // namespace
}  // namespace estream::cli
