// estream's public C++ API: load a mixture-of-experts model from GGUF once, then run prefill
// requests on it.
//
//   auto engine = estream::Engine::Load("model.gguf", {.n_threads = 2});
//   if (!engine.ok()) { ... engine.status().message() ... }
//   estream::Request req{.tokens = {1, 2, 3}, .top_k = 5, .prompt_logprobs = true};
//   auto resp = (*engine)->Run(req);
//   // resp->top[0].token, resp->top[0].logprob, resp->perplexity, ...
//
// A request is one prompt of T tokens at positions 0..T-1. The engine runs one causal forward
// pass over all T tokens, layer by layer (no KV cache outlives its layer), and reads the answer
// from the final hidden states: the next-token distribution after the last token, the prompt's
// own log-likelihood, an embedding. Nothing is decoded.
//
// Batches: RunBatch packs many requests into one forward pass (each sequence keeps its own
// positions and its own causal attention; no padding), so the experts of a layer are read once
// and multiplied with the routes of every request together. A request may also carry
// continuations that share its prompt as context (multiple choice, label scoring, reranking):
// the context is computed once and each continuation attends to the context and to itself only.
//
// Architectures: `olmoe` (OLMoE), `qwen3moe` (Qwen3-MoE), `llama` with experts (Mixtral), with
// merged `*_exps` expert tensors or Mixtral's older per-expert tensors. Weight types: whatever the
// kernels' GEMM supports (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K, IQ4_NL, IQ4_XS, MXFP4); other types are refused at load with an error naming the tensor
// and the nearest supported llama-quantize mix to convert to.
//
// Errors: expected failures (file, model, request) come back as a Status with a one-line message
// naming the field at fault. A failed Run leaves the engine fully usable for the next request.
//
// Threading: every Engine has its own thread count (EngineOptions::n_threads); Run uses exactly
// that many OpenMP threads, whatever the caller's OpenMP settings, and restores them on return.
// Run calls on one Engine are serialised by an internal mutex (the engine owns one set of
// activation buffers); distinct Engines may run concurrently (their thread counts add up).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "estream/options.h"
#include "estream/status.h"

namespace estream {

// estream's internal hooks (tests' fault-injecting files and delays, the calibration's trace
// recorder); defined in src/model/engine_hooks.h. Applications leave EngineOptions::hooks null.
struct EngineHooks;

// The most threads an Engine takes (EngineOptions::n_threads; the CLI's -t range too).
inline constexpr int kMaxThreads = 1024;

struct EngineOptions {
  // OpenMP threads used by Run: 0 (one per available CPU, omp_get_num_procs()) to kMaxThreads.
  int n_threads = 0;
  // Repack quantised weights at load into the kernels' native layout (kernels::RepackWeights).
  // kAuto repacks when the kernels have a packed path for the type; the GGUF pages of a repacked
  // tensor are released right after, so the model is never held twice.
  enum class Repack { kAuto, kNever, kAlways } repack = Repack::kAuto;
  // Touch every weight page at load (all resident before the first request) instead of letting
  // the first request fault them in. Makes the first request's time representative.
  bool prefault = true;

  // ---- packed models (`estream pack`): expert virtualization (docs/DESIGN.md sections 4-6) ----
  // With budget_bytes == 0 and no group_size/banks, the experts are read once into memory (the
  // resident baseline). Otherwise they are streamed from the file into a bounded arena of
  // banks x group_size expert slots, and the process's peak RSS stays within budget_bytes (dense
  // weights, arena, activations of prompts up to budget_tokens, scratch). Ignored for GGUF files.
  uint64_t budget_bytes = 0;  // 0: no budget
  int group_size = 0;         // G; 0: solved from the budget (8 without one)
  int banks = 0;              // B; 0: solved from the budget (2 without one)
  int queue_depth = 0;        // Q reads in flight; 0: 8
  using Schedule = estream::Schedule;  // options.h
  using Io = estream::IoBackend;       // options.h
  Schedule schedule = Schedule::kEarly;
  Io io = Io::kAuto;  // kAuto: io_uring, else pread
  // Longest prompt (batch pass) the budget plans for; 0: the longest of 16384, 12288 and 8192 (at
  // most the context) whose activations the budget holds beside the default rule's full streaming
  // arena, else min(context, 4096); a budget too small for 4096 tokens beside two banks of
  // min(8, experts) experts gets the longest of 2048, 1024, 512, 256 and 128 that fits (Load fails
  // only when not even 128 tokens fit). Engine::pass_tokens() reports the pass length chosen.
  int64_t budget_tokens = 0;
  // Expert cache (streamed only; docs/DESIGN.md section 4, "Expert cache"): extra arena banks
  // that keep the most-routed expert groups resident from one request (or RunBatch pass) to the
  // next, so repeated traffic reads fewer expert bytes. -1 (auto): with a budget and banks solved
  // from it (banks == 0), every whole bank of the budget left over after the streaming banks,
  // the dense part and the activations; 0: none; > 0: at most this many bytes (within the budget
  // if there is one). Results do not depend on it.
  int64_t expert_cache_bytes = -1;
  // Most tokens of one forward pass of RunBatch (all sequences of the pass together, the tokens
  // of every continuation included). 0: budget_tokens' planned length for a streamed model (a
  // larger value is lowered to it: the activation memory of the budget is planned for that many
  // tokens), else max(context length, 8192).
  int64_t batch_tokens = 0;
  // Check each expert record's XXH3 before its experts run: the first time this engine reads the
  // record (default), or on every read (verify_every_read), or never. A record on disk that is
  // corrupt fails the request that first reads it; re-checking every read costs one extra pass
  // over the streamed bytes (docs/DESIGN.md, "When a checksum fails").
  bool verify_checksums = true;
  bool verify_every_read = false;
  // Chrome/Perfetto trace (JSON) of the last request's reads and compute steps; empty: none.
  // Packed models only, and a path that can be created: Load refuses anything else.
  std::string trace_path = {};
  // estream's own tests and tools only (not owned; must outlive the Engine); null in normal use.
  const EngineHooks* hooks = nullptr;
};

// What a Run computes. Every output is opt-in except `top` (k = top_k, may be 0).
struct Request {
  std::vector<int32_t> tokens;  // the prompt, 1 <= size <= context length, ids < n_vocab

  // Next-token distribution after the last prompt token: the top_k tokens with log-probabilities.
  int top_k = 5;

  enum class Logits {
    kNone,
    kLast,  // Response::logits = the n_vocab logits after the last token
    kAll,   // Response::logits = [n_tokens][n_vocab] logits of every position (n_tokens x n_vocab
            // floats: 2 GiB at T = 4096 and n_vocab = 131072; prefer logits_sink for big prompts)
  };
  Logits logits = Logits::kNone;
  // When set, the logits of every position are streamed here instead of stored in the
  // Response (Request::logits is then ignored): called in position order with rows
  // [first_pos, first_pos + n_rows) of n_vocab floats each (row-major). Runs on the calling
  // thread. A non-OK Status aborts the request with that Status.
  std::function<Status(int64_t first_pos, int64_t n_rows, const float* logits)> logits_sink = {};

  // Response::prompt_logprobs / log_likelihood / perplexity.
  bool prompt_logprobs = false;

  // Response::embedding: the final hidden state (after the final RMSNorm) of the last token, or
  // the mean over all tokens.
  enum class Pooling { kNone, kLast, kMean };
  Pooling embedding = Pooling::kNone;

  // Response::routing / routing_weights: the experts the router chose, per layer and token.
  bool return_routing = false;

  // Shared-prefix candidates (lm-eval's `loglikelihood(context, continuation)` for each one).
  // When non-empty, `tokens` is the context and each continuation (1 or more ids each) is scored
  // after it: Response::continuations[i] holds log p(continuation i | context). The context is
  // computed once; continuation i's tokens take positions |context| .. and attend to the whole
  // context and causally to continuation i only (a tree mask), all in the same forward pass, so the
  // scores equal those of running context ++ continuation i alone. Every other output (top,
  // logits, prompt_logprobs, embedding, routing) is about the context alone, as without
  // continuations. REQUIRES (else an error for this request): |context| + |continuation i| <=
  // context length for every i, and |context| + sum |continuation i| <= the pass length
  // (EngineOptions::batch_tokens).
  std::vector<std::vector<int32_t>> continuations = {};
};

// The score of one continuation (Request::continuations).
struct ContinuationScore {
  // logprobs[j] = log p(continuation[j] | context, continuation[0..j-1]), natural log.
  std::vector<float> logprobs;
  double log_likelihood = 0;  // sum of logprobs (in double)
  // Every continuation token is the most likely token at its position (ties: lower id), i.e.
  // greedy decoding from the context would produce the continuation (lm-eval's is_greedy).
  bool is_greedy = false;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;  // natural log
};

struct Response {
  int64_t n_tokens = 0;
  // The top_k most likely next tokens after the prompt, most likely first (ties: lower id).
  std::vector<TokenLogprob> top;
  // See Request::logits: [n_vocab] or [n_tokens][n_vocab], row-major; empty otherwise.
  std::vector<float> logits;
  // prompt_logprobs[t] = log p(tokens[t + 1] | tokens[0..t]), t = 0..n_tokens-2 (the first token
  // is not scored). log_likelihood is their sum; perplexity = exp(-log_likelihood / (n_tokens-1)),
  // NaN when n_tokens == 1.
  std::vector<float> prompt_logprobs;
  double log_likelihood = 0;
  double perplexity = 0;
  // [n_embd] when requested.
  std::vector<float> embedding;
  // With Request::return_routing: [n_layer][n_tokens][n_expert_used] expert ids (-1, weight 0,
  // for the blocks of a leading dense FFN, which have no router), in the router's
  // order (descending probability), and their weights as applied (after renormalisation when
  // the architecture renormalises).
  std::vector<int32_t> routing;
  std::vector<float> routing_weights;
  // Request::continuations, in order.
  std::vector<ContinuationScore> continuations;
  // Wall time of the forward pass and the outputs (model load excluded). RunBatch: `seconds`,
  // `timing` and the streaming figures below (bytes_read, bubble, groups, ...) are those of the
  // whole pass that ran this request, shared by every request of that pass.
  double seconds = 0;
  // RunBatch: the pass that ran this request (0-based), its requests and its tokens.
  int pass = 0;
  int pass_requests = 1;
  int64_t pass_tokens = 0;
  // Where `seconds` went (wall time, summed over layers).
  struct Timing {
    double embed = 0;      // token embeddings
    double attention = 0;  // norms, Q/K/V, q/k norm, RoPE, attention, output projection, residual
    // Of `attention`: the projections (the Q/K/V or MLA's projection GEMMs, the output
    // projection) and the attention kernel (scores, softmax, weighted V). The rest of
    // `attention` is the norms with the activations' Q8A quantisation, RoPE, copies and the
    // residual add.
    double attention_projections = 0;
    double attention_kernel = 0;
    double router = 0;     // MoE norm, router GEMM, softmax/top-k, grouping routes by expert
    double experts = 0;    // expert GEMMs, SwiGLU, scatter-add
    double dense_ffn = 0;  // FFNs of leading dense blocks and shared experts (not streamed)
    double head = 0;       // final norm, LM head, log-softmax, top-k, pooling
  } timing;
  // Where the time went from the expert streaming point of view (seconds = total): expert time
  // is the expert part including waits for expert data (bubble); non-expert is the rest.
  double expert_seconds = 0;
  double nonexpert_seconds = 0;
  double bubble_seconds = 0;   // compute threads waiting for expert data (streamed runs)
  double bubble_rate = 0;      // bubble_seconds / seconds
  uint64_t bytes_read = 0;     // expert bytes read from the file during the request
  // Expert records of the groups the pass ran (needed) and, of those, the ones found resident in
  // the expert cache (no read; EngineOptions::expert_cache_bytes). Streamed runs only.
  int64_t experts_needed = 0;
  int64_t experts_cached = 0;
  double read_gbps = 0;        // bytes_read / loader busy time, GB/s (1e9)
  uint64_t peak_rss_bytes = 0; // the process's peak RSS (VmHWM) at the end of the request
  struct StreamConfig {
    bool streamed = false;     // experts streamed through the arena
    int group_size = 0, banks = 0, queue_depth = 0;
    std::string schedule;      // ScheduleName: "on-demand", "after-routing", "early"
    std::string io_backend;    // IoBackendName of the backend in use: "io_uring", "pread"
    uint64_t arena_bytes = 0, expert_bytes = 0, budget_bytes = 0;
    // Of the arena, the banks (and bytes) of the expert cache; `banks` are the streaming ones.
    int cache_banks = 0;
    uint64_t cache_bytes = 0;
    int64_t groups_read = 0, groups_skipped = 0, groups_cancelled = 0;
    // What the engine counts as non-arena memory when it checks the budget: RSS after load +
    // activation bound + margin (streamed only).
    uint64_t other_bytes = 0;
    // How G, B and Q were chosen (streamed only; ConfigSource in options.h), and a note when
    // the choice was adjusted or a stored one ignored (empty otherwise). `source` is both as one
    // string: ConfigSourceString(source_kind, source_note), e.g. "stored" or "rule (...)".
    ConfigSource source_kind = ConfigSource::kExplicit;
    std::string source_note;
    std::string source;
  } config;
};

// Read-only facts about the loaded model.
struct ModelInfo {
  std::string path;
  std::string architecture;  // "olmoe", "qwen3moe", "llama", "deepseek2"
  std::string name;          // general.name, or empty
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_expert = 0;
  int n_vocab = 0;
  int n_ctx = 0;  // context length: the longest prompt accepted
  uint64_t weight_bytes = 0;  // bytes of all weights as held in memory
  // Multiply-adds of a prefill, for op rates: every weight matrix one token meets, summed over
  // the layers (routed experts: n_expert_used of them; LM head excluded), and the attention's
  // q.k and p.v per (query, key) pair of the causal prefix, summed over the layers.
  double weight_macs_per_token = 0;
  double attention_macs_per_pair = 0;
};

class Engine {
 public:
  // Loads `path` (mmaps it, validates metadata and every tensor's presence, type and shape,
  // optionally repacks and prefaults). Errors: IOError (open/map), Corruption (malformed GGUF,
  // missing tensor, wrong shape, inconsistent hyper-parameters), NotSupported (architecture,
  // tensor type, feature such as partial RoPE), InvalidArgument (options).
  static Result<std::unique_ptr<Engine>> Load(const std::string& path, EngineOptions options = {});

  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs one prefill. Errors: InvalidArgument (empty prompt, token id out of range, negative
  // top_k, a request longer than one forward pass: pass_tokens()), OutOfRange (prompt longer
  // than the context length), ResourceExhausted (activation buffers cannot be allocated),
  // Corruption when the logits (or the embedding asked for) hold NaN or infinity (a damaged
  // model file: they are checked, never returned), or the Status of logits_sink. Thread safety:
  // see above.
  Result<Response> Run(const Request& request);

  // Runs a batch: results[i] is requests[i]'s Response, or its error; a request with bad input
  // (the errors of Run, an empty continuation, a request longer than one pass) fails alone and
  // the others complete. Valid requests are packed, longest first, into forward passes of at most
  // EngineOptions::batch_tokens tokens; each pass runs every layer once over all its sequences
  // (per-sequence positions and causal attention, routes of all sequences grouped per expert: a
  // streamed model reads each active expert once per layer and pass). Every output equals the
  // single-request Run of the same request, to rounding (the kernels are row-wise, so in practice
  // bit for bit). An error of a whole pass (an I/O error reading experts, activation buffers
  // that cannot be allocated) fails the requests of that pass, and later passes still run; a
  // logits_sink's Status fails its own request only. Sinks are called on the calling thread after
  // their pass, request by request. Thread safety: as Run.
  // pack_tokens > 0 packs requests into passes of at most min(pack_tokens, pass_tokens()) tokens
  // instead, a longer request (up to pass_tokens()) running in a pass of its own: the activation
  // memory then follows max(pack_tokens, the longest request) rather than pass_tokens(), which
  // without a budget is the whole context (163840 tokens for DeepSeek-V2). estream score and
  // eval pack 8192 tokens by default.
  // interrupted (optional) is called on the calling thread before each pass and before each
  // layer of a pass; once it returns true, the pass stops (a streamed one cancels its reads), no
  // further pass runs, and the requests not finished fail with Cancelled (those of the passes
  // finished keep their results). A front end's Ctrl-C: the Python module checks for signals.
  std::vector<Result<Response>> RunBatch(std::span<const Request> requests, int64_t pack_tokens = 0,
                                         const std::function<bool()>& interrupted = nullptr);

  const ModelInfo& info() const;
  int n_threads() const;
  // Most tokens of one RunBatch forward pass (EngineOptions::batch_tokens as resolved at load).
  int64_t pass_tokens() const;

 private:
  Engine();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// log(sum_i exp(logits[i])) over n values: the normaliser that Run uses for prompt_logprobs and
// for the logprobs of top-k and continuations (the same value, bit for bit), so that a caller
// computing other log-probabilities from a logits_sink row agrees with them. n <= 0 gives -inf,
// a null row with n > 0 NaN; a row holding NaN or infinities gives what the scalar reference
// gives, on every ISA.
double LogSumExp(const float* logits, int64_t n);

}  // namespace estream
