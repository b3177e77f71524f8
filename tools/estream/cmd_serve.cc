// estream serve: an OpenAI-compatible HTTP server for prefill-only requests (completions with
// echo/logprobs, embeddings, classification, reranking), batched, within one memory budget.
//
//   estream serve -m MODEL [--budget SIZE] [--host 127.0.0.1] [--port 8080] [--api-key KEY] [-t N]
//                 [--max-batch-tokens N] [--max-queue N] [--timeout S] [--max-body SIZE]
//
// The model file's header is read first (a path that cannot be opened fails before anything
// listens); then the server (src/server/) listens, so /health answers 503 ("loading model") while
// the model loads, then 200. SIGINT / SIGTERM: stop accepting, let queued work finish for
// --shutdown-grace seconds (the rest, and a batch still running then, is answered 503), close
// connections still sending a request 2 s after the signal or not reading a reply 2 s after the
// queued work ended, exit 0. A second signal exits at once (status 1).
//
// One budget: --budget covers the whole process. The server keeps a reserve for HTTP buffers
// (http threads x kMemoryPerBodyByte x --max-body, for the bodies and the prompts; --reply-memory for the
// parsed JSON and the replies of the requests in flight, all together; + 16 MiB) and gives
// the rest to the engine (EngineOptions::budget_bytes: arena, dense weights, activations of the
// largest batch, which --max-batch-tokens bounds). /metrics reports both and the peak RSS.
#include <malloc.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "estream/engine.h"
#include "gguf/gguf.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "tools/estream/command.h"
#include "tools/estream/common_flags.h"

namespace estream::cli {
namespace {

// The memory the server keeps for itself out of --budget (request bodies and prompts per HTTP
// thread, the reply memory, a fixed part); the engine gets the rest.
constexpr char kReserveFormula[] = "HTTP threads x 4 x --max-body + --reply-memory + 16 MiB";
static_assert(server::kMemoryPerBodyByte == 4, "kReserveFormula names the bytes held per body byte");
uint64_t ServerReserve(int http_threads, uint64_t max_body, uint64_t reply_memory) {
  return static_cast<uint64_t>(http_threads) * server::kMemoryPerBodyByte * max_body + reply_memory + (16ull << 20);
}

class ServeCommand : public Command {
 public:
  void Setup(CLI::App* sub) override {
    sub->add_option("-m,--model", model_, "GGUF model file (packed for --budget)")->required();
    sub->add_option("--host", o_.host, "address to listen on (default 127.0.0.1)");
    sub->add_option("--port", o_.port, "port (default 8080; 0: any free port, printed at start)")->check(CLI::Range(0, 65535));
    sub->add_option("--api-key", o_.api_key, "require \"Authorization: Bearer KEY\" on every route but /health");
    AddThreadsFlag(sub, &threads_, "engine compute threads (default: one per CPU)");
    const uint64_t default_reserve =
        ServerReserve(o_.scheduler.max_queue + 8, *ParseSize(max_body_), *ParseSize(reply_memory_));
    AddBudgetFlag(sub, &budget_, "memory budget of the whole process, in bytes or with a K/M/G/T suffix (powers of "
                  "1024: 3G); packed models only (experts are streamed). It must cover the server's reserve, " +
                  std::string(kReserveFormula) + " (" + FormatBytes(default_reserve) + " with the defaults); the "
                  "engine gets the rest");
    AddExpertCacheFlag(sub, &expert_cache_, "auto");
    sub->add_option("--budget-tokens", budget_tokens_, "packed models with --budget: tokens of one batch the budget "
                    "plans activations for (default the longest of 16384, 12288 and 8192, at most the context, whose "
                    "activations the budget holds beside the full streaming arena, else min(context, 4096), or for a "
                    "smaller budget the longest of 2048, 1024, 512, 256 and 128 that fits beside two banks of experts; "
                    "a smaller value leaves more for the expert cache)")->check(PositiveInt());
    sub->add_option("--max-batch-tokens", max_batch_tokens_, "most tokens of one batch (all requests packed "
                    "together); a request over it gets 413 (default: the engine's pass length)")->check(PositiveInt());
    sub->add_option("--max-queue", o_.scheduler.max_queue, "most requests waiting; more get 429 (default 64)")
        ->check(PositiveInt());
    sub->add_option("--aging", o_.scheduler.aging_seconds, "seconds of waiting that make up for the largest "
                    "request's size in the shortest-first queue (default 2): a request is never overtaken by one that "
                    "arrived more than this later")->check(SecondsCheck());
    sub->add_option("--batch-linger", o_.scheduler.linger_seconds, "after a batch of N requests, with M waiting when "
                    "it ended, seconds to wait (from its end) for N + M requests to be queued before the next batch "
                    "starts, so that clients answered together are batched together and with those that waited "
                    "(default 0.02, or --batch-linger-share of that batch's run time if longer; a batch of one "
                    "request never lingers)")
        ->check(SecondsCheck());
    sub->add_option("--batch-linger-share", o_.scheduler.linger_share, "the linger is at least this share of the last "
                    "batch's run time (default 0.01: a 60 s batch waits up to 0.6 s for the clients it answered, each "
                    "of whom would otherwise cost a pass of its own). It also bounds the wait for a burst: with the "
                    "server idle, a batch starts once requests stop arriving for 2 ms, at most this share of the last "
                    "batch's run time after the first (a lone client waits those 2 ms), so that requests sent together "
                    "share one pass. --batch-linger 0 --batch-linger-share 0: never wait")
        ->check(ShareCheck());
    sub->add_option("--timeout", o_.timeout_seconds, "seconds a request may take before it gets 504 (default 0: none)")
        ->check(SecondsCheck());
    sub->add_option("--max-body", max_body_, "largest request body (default 256K); larger: 413");
    sub->add_option("--reply-memory", reply_memory_, "memory for the parsed request bodies and the replies of the "
                    "requests in flight, all together (default 32M): a request whose body or reply needs more gets "
                    "413, others wait for room");
    sub->add_option("--http-threads", o_.http_threads, "HTTP worker threads (default --max-queue + 8)")
        ->check(CLI::Range(0, kMaxThreads));
    sub->add_option("--shutdown-grace", o_.shutdown_grace_seconds, "on SIGTERM/SIGINT, seconds queued work may "
                    "still run (default 10); then the running batch stops at its next layer (503)")
        ->check(SecondsCheck());
    sub->add_option("--alias", alias_, "model id in replies and /v1/models (default: the file name)");
    sub->add_option("--rerank-template", o_.rerank_template, "rerank prompt with {query} and {document}; the "
                    "answer scored is \" yes\" vs \" no\"");
  }

  Result<int> Run() override {
    // Signals go to one thread (sigwait): block them before any thread starts.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    signal(SIGPIPE, SIG_IGN);

    // glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB), after
    // which blocks that size come from the heaps of its per-thread arenas and stay resident once
    // freed: every HTTP thread that built a multi-megabyte reply kept its pages, and the peak RSS
    // grew with the number of threads that ever did (12 replies of 10 MB one after another: +110
    // MiB). A fixed threshold (glibc's default, 128 KiB) hands large blocks back when freed.
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    ESTREAM_ASSIGN_OR_RETURN(uint64_t max_body, ParseSize(max_body_));
    if (max_body == 0) return Status::InvalidArgument("--max-body must be positive");
    o_.max_body_bytes = max_body;
    ESTREAM_ASSIGN_OR_RETURN(o_.reply_memory_bytes, ParseSize(reply_memory_));
    if (o_.reply_memory_bytes == 0) return Status::InvalidArgument("--reply-memory must be positive");
    const int http_threads = o_.http_threads > 0 ? o_.http_threads : o_.scheduler.max_queue + 8;
    o_.server_reserve_bytes = ServerReserve(http_threads, max_body, o_.reply_memory_bytes);
    EngineOptions eo;
    eo.n_threads = threads_;
    eo.budget_tokens = budget_tokens_;
    eo.batch_tokens = max_batch_tokens_;
    ESTREAM_ASSIGN_OR_RETURN(eo.expert_cache_bytes, ParseExpertCache(expert_cache_));
    if (!budget_.empty()) {
      ESTREAM_ASSIGN_OR_RETURN(o_.budget_bytes, ParseBudget(budget_));
      if (o_.budget_bytes <= o_.server_reserve_bytes)
        return Status::InvalidArgument("--budget " + budget_ + " does not cover the server's own reserve of " +
                                       FormatBytes(o_.server_reserve_bytes) + " (" + kReserveFormula +
                                       "): raise it or lower --max-body, --max-queue or --reply-memory");
      eo.budget_bytes = o_.budget_bytes - o_.server_reserve_bytes;
    }
    o_.scheduler.max_batch_tokens = max_batch_tokens_ > 0 ? max_batch_tokens_ : (int64_t{1} << 40);

    o_.compute_threads = threads_ > 0 ? threads_ : omp_get_num_procs();  // as the engine's
    // The model file is opened and its header read before the server listens: a path that cannot
    // be opened, or a file that is not a GGUF, fails at once instead of after "listening".
    std::unique_ptr<Tokenizer> tokenizer;
    {
      ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_, {.mmap = false}));
      auto t = Tokenizer::FromGguf(*gguf);
      if (t.ok()) tokenizer = std::move(t).value();
      else std::fprintf(stderr, "estream serve: no tokenizer (%s): token ids only\n", t.status().message().c_str());
    }
    server::Server server(o_);
    ESTREAM_RETURN_IF_ERROR(server.Start());
    std::fprintf(stderr, "estream serve: listening on http://%s:%d (loading %s)\n", o_.host.c_str(), server.port(),
                 model_.c_str());

    enum State { kLoading, kLoaded, kFailed, kStopped };
    std::atomic<int> state{kLoading};
    std::thread signals([&] {
      int sig = 0;
      sigwait(&set, &sig);
      if (state == kFailed || state == kStopped) return;  // woken by ourselves
      std::fprintf(stderr, "estream serve: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      if (state == kLoading) std::_Exit(0);  // nothing served yet; the load cannot be interrupted
      server.RequestStop();                  // the main thread's Wait() shuts the server down
      sigwait(&set, &sig);
      if (state == kStopped) return;
      std::fprintf(stderr, "estream serve: second %s: exiting now, without waiting for queued work\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
      std::_Exit(1);
    });

    auto engine_or = Engine::Load(model_, eo);
    if (!engine_or.ok()) {
      state = kFailed;
      pthread_kill(signals.native_handle(), SIGTERM);
      signals.join();
      if (engine_or.status().code() == StatusCode::kResourceExhausted && o_.budget_bytes > 0)
        return Status::ResourceExhausted(engine_or.status().message() + " (the figures are the engine's share: --budget " +
                                         budget_ + " less the server's reserve of " +
                                         FormatBytes(o_.server_reserve_bytes) + ", " + kReserveFormula +
                                         "; add the reserve to the figure)");
      return engine_or.status();
    }
    std::unique_ptr<Engine> engine = std::move(engine_or).value();
    std::string id = alias_;
    if (id.empty()) id = model_.substr(model_.find_last_of('/') == std::string::npos ? 0 : model_.find_last_of('/') + 1);
    server.SetBackend(estream::server::EngineRunner(engine.get()), engine->info(), tokenizer.get(), id,
                      engine->pass_tokens());
    state = kLoaded;
    std::fprintf(stderr, "estream serve: ready: %s, %d threads, batches of up to %lld tokens, queue %d%s\n", id.c_str(),
                 engine->n_threads(), static_cast<long long>(server.options().scheduler.max_batch_tokens),
                 o_.scheduler.max_queue, o_.budget_bytes ? (", budget " + FormatBytes(o_.budget_bytes)).c_str() : "");
    server.Wait();
    state = kStopped;
    pthread_kill(signals.native_handle(), SIGTERM);  // wakes it if no second signal came
    signals.join();
    if (const int n = server.connections_cut_off())
      std::fprintf(stderr, "estream serve: closed %d connection%s still sending a request or not reading a reply\n", n,
                   n == 1 ? "" : "s");
    std::fprintf(stderr, "estream serve: stopped\n");
    return 0;
  }

 private:
  std::string model_, budget_, alias_, max_body_ = "256K", reply_memory_ = "32M", expert_cache_ = "auto";
  int threads_ = 0;
  int64_t budget_tokens_ = 0, max_batch_tokens_ = 0;
  server::ServerOptions o_;
};

}  // namespace

ESTREAM_REGISTER_COMMAND(ServeCommand, "serve",
                         "HTTP server (OpenAI-style /v1/completions with echo+logprobs, /v1/embeddings, /v1/classify, /v1/rerank; "
                         "/tokenize, /detokenize, /health, /v1/models, /metrics)");

}  // namespace estream::cli
