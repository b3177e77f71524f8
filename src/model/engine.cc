// Engine: Model + Workspace + the request outputs (LM head at the positions asked for, log-softmax,
// top-k, prompt log-probabilities, embeddings).
#include "estream/engine.h"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <numeric>

#include <fmt/format.h>

#include "base/memory.h"
#include "base/omp_threads.h"
#include "base/timer.h"
#include "gguf/gguf.h"
#include "pack/packed_layout.h"
#include "kernels/kernels.h"
#include "model/blocks.h"
#include "model/experts.h"
#include "model/engine_hooks.h"
#include "model/ffn.h"
#include "model/mla.h"
#include "model/model.h"
#include "model/shortconv_block.h"
#include "model/virtual_experts.h"
#include "pipeline/trace.h"

namespace estream {

static_assert(kMaxThreads == kMaxComputeThreads, "one thread bound for the engine and the layers below it");

namespace {

// Index of the largest value (ties: the lowest index), as torch.argmax.
int32_t Argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return static_cast<int32_t>(best);
}

// Positions of the LM head rows computed at a time: bounds the logits scratch.
int64_t LogitsChunkRows(int64_t n_vocab) { return std::clamp<int64_t>((int64_t{8} << 20) / n_vocab, 1, 64); }

// Index of the first value of x[0, n) that is NaN or infinite, or n.
int64_t FirstNonFinite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return n;
}

// What a request gets instead of NaN or infinite outputs. A valid model's activations stay finite
// (load checks epsilon, RoPE base and the like), so these come from damaged weights: a tensor's
// type relabelled, a shifted data section, flipped bytes.
Status NonFiniteOutputs(const std::string& path, const char* what) {
  return Status::Corruption(fmt::format("{}: the model produced non-finite values (NaN/inf) in its {}: the file may "
                                        "be corrupt (damaged weights or metadata); check it against the original or "
                                        "convert it again", path, what));
}

}  // namespace

struct Engine::Impl {
  std::unique_ptr<model::Model> model;
  ModelInfo info;
  int n_threads = 1;
  std::mutex mutex;  // serialises Run: guards ws and logits
  model::Workspace ws;
  model::FusedExperts experts;  // the fused expert operator's plans (src/moe)
  // Packed models: the trace (declared first: the streamer adds to it until it is destroyed)
  // and the experts (resident, or streamed within a memory budget).
  std::unique_ptr<pipeline::TraceRecorder> owned_trace;
  pipeline::TraceRecorder* trace = nullptr;  // owned_trace, or EngineHooks::trace
  std::string trace_path;
  std::unique_ptr<model::VirtualExperts> vexp;
  AlignedPtr<float> hidden;  // [T x n_embd] final-normed rows (grown as needed)
  int64_t hidden_rows = 0;
  AlignedPtr<float> logits;  // [chunk x n_vocab]
  int64_t logits_rows = 0;

  int64_t pass_tokens = 0;   // most tokens of one forward pass (EngineOptions::batch_tokens)

  Status Validate(const Request& req) const;
  static int64_t RequestTokens(const Request& req);  // prompt + continuations
  std::vector<Result<Response>> RunBatch(std::span<const Request> reqs, int64_t pack_tokens,
                                         const std::function<bool()>& interrupted);
  // One forward pass over reqs[ids[...]]; writes their results. interrupted (may be empty) is
  // asked before every layer; true from it ends the pass, its requests failed with Cancelled, and
  // RunPass returns true.
  bool RunPass(std::span<const Request> reqs, const std::vector<int>& ids, int pass_index,
               std::vector<Result<Response>>* results, const std::function<bool()>& interrupted);
  Status ReserveBuffers(int64_t n_tokens);
  // Logits of n_rows final hidden rows h, in chunks of rows: fn(first row, rows, [rows x n_vocab]).
  Status LmHead(const float* h, int64_t n_rows, const std::function<Status(int64_t, int64_t, const float*)>& fn);
  // A request's outputs from its final hidden rows h (context rows, then its continuations').
  Status RequestOutputs(const Request& req, const float* h, Response* resp);
  // Response::expert_seconds ... config (streamed or not); writes the trace when asked for.
  void FillStreamStats(Response* resp);
  // The experts of a packed model (virtual_experts.h): resident, or streamed within the budget.
  // peak_before_load: the process's peak RSS before the model was loaded (the budget check's
  // baseline, virtual_experts.h).
  Status OpenPackedExperts(const EngineOptions& o, uint64_t peak_before_load);
};

Engine::Engine() : impl_(std::make_unique<Impl>()) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::Load(const std::string& path, EngineOptions options) {
  if (path.empty()) return Status::InvalidArgument("empty model path: give the path of a GGUF model file");
  if (options.n_threads < 0 || options.n_threads > kMaxThreads)
    return Status::InvalidArgument(fmt::format("n_threads = {} must be between 0 and {} (0 = one per CPU)",
                                               options.n_threads, kMaxThreads));
  const bool streams = options.budget_bytes > 0 || options.group_size > 0 || options.banks > 0;
  if (streams || !options.trace_path.empty()) {
    // Streaming needs the packed layout, and the trace records a packed model's expert reads;
    // refuse before loading (a resident load of a big plain GGUF would itself exceed the budget
    // the user asked for).
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> header, GgufFile::Open(path));
    if (!io::IsPackedModel(*header))
      return Status::InvalidArgument(fmt::format(
          "{}: {} needs a packed model{}: run 'estream pack {} -o MODEL.packed.gguf' and use that file", path,
          streams ? "a memory budget (or group size / banks)" : "a trace (--trace, trace_path)",
          streams ? "" : " (it records the expert reads), and this one is not packed", path));
  }
  // The trace is written after each request, where a failed write cannot fail it: check the path
  // now.
  if (!options.trace_path.empty() && !std::ofstream(options.trace_path))
    return Status::IOError(fmt::format("--trace {}: cannot create: {}", options.trace_path, std::strerror(errno)));
  model::ModelLoadOptions mo;
  // Repacking is chosen per type inside the loader (kernels::CanRepack); see docs/PERFORMANCE.md
  // for why experts are (or are not) repacked by default.
  mo.repack_experts = options.repack != EngineOptions::Repack::kNever;
  mo.repack_dense = options.repack != EngineOptions::Repack::kNever;
  // A budget is checked against the measured RSS after load: every dense page must be in it.
  mo.prefault = options.prefault || options.budget_bytes > 0;
  std::unique_ptr<Engine> engine(new Engine());
  Impl& im = *engine->impl_;
  const uint64_t peak_before_load = PeakRssBytes();
  {
    ScopedOmpThreads threads(options.n_threads > 0 ? options.n_threads : omp_get_num_procs());
    ESTREAM_ASSIGN_OR_RETURN(im.model, model::Model::Load(path, mo));
  }
  im.n_threads = options.n_threads > 0 ? options.n_threads : omp_get_num_procs();
  if (im.model->experts_packed()) {
    ESTREAM_RETURN_IF_ERROR(im.OpenPackedExperts(options, peak_before_load));
  }
  const model::ModelConfig& c = im.model->config();
  if (options.batch_tokens < 0)
    return Status::InvalidArgument(fmt::format("batch_tokens = {} must be >= 0", options.batch_tokens));
  if (im.vexp && im.vexp->streamed()) {
    im.pass_tokens = im.vexp->config().budget_tokens;
    if (options.batch_tokens > 0) im.pass_tokens = std::min(im.pass_tokens, options.batch_tokens);
  } else {
    im.pass_tokens = options.batch_tokens > 0 ? options.batch_tokens : std::max<int64_t>(c.n_ctx, 8192);
  }
  im.info = ModelInfo{.path = path,
                      .architecture = c.arch->gguf_name,
                      .name = c.name,
                      .n_layer = c.n_layer,
                      .n_embd = c.n_embd,
                      .n_head = c.n_head,
                      .n_head_kv = c.n_head_kv,
                      .head_dim = c.head_dim,
                      .n_expert = c.n_expert,
                      .n_expert_used = c.n_expert_used,
                      .n_ff_expert = c.n_ff_expert,
                      .n_vocab = c.n_vocab,
                      .n_ctx = c.n_ctx,
                      .weight_bytes = im.model->weight_bytes()};
  // Multiply-adds per token and per attention pair (ModelInfo).
  {
    const double d = c.n_embd, H = c.n_head, hd = c.head_dim;
    for (const model::LayerWeights& L : im.model->layers()) {
      double w = 0, pair = 0;
      if (L.conv.present()) {  // LFM2 short convolution: in_proj (3d x d), L taps, out_proj (d x d)
        w += 3 * d * d + double(c.shortconv_l) * d + d * d;
      } else if (c.arch->attention == model::AttentionKind::kMla) {
        const double r = c.kv_lora_rank, ql = c.q_lora_rank, vd = c.v_head_dim;
        w += ql > 0 ? d * ql + ql * H * hd : d * H * hd;
        w += d * (r + c.qk_rope) + r * H * (c.qk_nope + vd) + H * vd * d;
        pair = H * (hd + vd);
      } else {
        const double q = c.q_dim(), kv = c.kv_dim();
        w += d * (q + 2 * kv) + q * d;
        pair = 2 * q;
      }
      if (L.moe) {
        w += d * c.n_expert + double(c.n_expert_used) * 3 * d * c.n_ff_expert + 3 * d * c.n_ff_shexp;
      } else {
        w += 3 * d * c.n_ff;
      }
      im.info.weight_macs_per_token += w;
      im.info.attention_macs_per_pair += pair;
    }
  }
  return engine;
}

const ModelInfo& Engine::info() const { return impl_->info; }
int Engine::n_threads() const { return impl_->n_threads; }
int64_t Engine::pass_tokens() const { return impl_->pass_tokens; }

Result<Response> Engine::Run(const Request& request) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  ScopedOmpThreads threads(impl_->n_threads);
  std::vector<Result<Response>> r = impl_->RunBatch(std::span<const Request>(&request, 1), 0, nullptr);
  return std::move(r[0]);
}

std::vector<Result<Response>> Engine::RunBatch(std::span<const Request> requests, int64_t pack_tokens,
                                               const std::function<bool()>& interrupted) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  ScopedOmpThreads threads(impl_->n_threads);
  return impl_->RunBatch(requests, pack_tokens, interrupted);
}

Status Engine::Impl::Validate(const Request& req) const {
  const model::ModelConfig& c = model->config();
  if (req.tokens.empty()) return Status::InvalidArgument("empty prompt: give at least one token");
  if (static_cast<int64_t>(req.tokens.size()) > c.n_ctx)
    return Status::OutOfRange(fmt::format("prompt of {} tokens is longer than the model's context length {}: "
                                          "shorten it (or split it into windows, as perplexity does)",
                                          req.tokens.size(), c.n_ctx));
  for (size_t i = 0; i < req.tokens.size(); ++i)
    if (req.tokens[i] < 0 || req.tokens[i] >= c.n_vocab)
      return Status::InvalidArgument(fmt::format("token id {} at position {} is out of range [0, {})", req.tokens[i],
                                                 i, c.n_vocab));
  if (req.top_k < 0 || req.top_k > c.n_vocab)
    return Status::InvalidArgument(fmt::format("top_k = {} must be between 0 and n_vocab = {}", req.top_k, c.n_vocab));
  const int64_t C = static_cast<int64_t>(req.tokens.size());
  for (size_t j = 0; j < req.continuations.size(); ++j) {
    const std::vector<int32_t>& cont = req.continuations[j];
    if (cont.empty())
      return Status::InvalidArgument(fmt::format("continuation {} is empty: give at least one token", j));
    if (C + static_cast<int64_t>(cont.size()) > c.n_ctx)
      return Status::OutOfRange(fmt::format("prompt of {} tokens + continuation {} of {} tokens is longer than the "
                                            "model's context length {}", C, j, cont.size(), c.n_ctx));
    for (size_t i = 0; i < cont.size(); ++i)
      if (cont[i] < 0 || cont[i] >= c.n_vocab)
        return Status::InvalidArgument(fmt::format("token id {} at position {} of continuation {} is out of range "
                                                   "[0, {})", cont[i], i, j, c.n_vocab));
  }
  const int64_t n = RequestTokens(req);
  if (n > pass_tokens) {
    // An input-size error like a prompt longer than the context, not a budget too small (the
    // budget was planned for this pass length); the option is named as the C++, C and Python
    // front ends spell it, then the CLI's flag.
    return Status::InvalidArgument(fmt::format(
        "request of {} tokens{} is longer than the {} tokens one forward pass holds{}: shorten it{} or raise {}", n,
        req.continuations.empty() ? "" : " (prompt + continuations)", pass_tokens,
        vexp && vexp->streamed() ? " (the memory budget was planned for that many)" : "",
        req.continuations.empty() ? "" : ", split its continuations",
        vexp && vexp->streamed() ? "budget_tokens (--budget-tokens)" : "batch_tokens (--batch-tokens)"));
  }
  return Status::Ok();
}

// ---- batches (RunBatch) -----------------------------------------------------------------------
//
// A pass lays its requests out one after the other in the activation rows: a request's prompt
// (the context) then each of its continuations. Every sequence is a model::SeqSpan: the prompt is
// a plain causal sequence at positions 0..; a continuation takes positions |context|.. and attends
// to its context's rows and to its own (the tree mask), so the context is computed once. Norms,
// projections, the router and the experts are row-wise: a row's result does not depend on the
// other rows of the pass (the kernels split by rows and output elements with a fixed reduction
// order), which is why a batch reproduces the single-request results.

std::vector<Result<Response>> Engine::Impl::RunBatch(std::span<const Request> reqs, int64_t pack_tokens,
                                                     const std::function<bool()>& interrupted) {
  std::vector<Result<Response>> results;
  results.reserve(reqs.size());
  std::vector<int64_t> length(reqs.size(), 0);
  std::vector<int> valid;
  for (size_t i = 0; i < reqs.size(); ++i) {
    Status st = Validate(reqs[i]);
    results.emplace_back(st.ok() ? Status::Internal("request not run") : st);  // replaced by its pass
    if (!st.ok()) continue;
    length[i] = RequestTokens(reqs[i]);
    valid.push_back(static_cast<int>(i));
  }
  // Longest first, first fit: few passes, each as full as the order allows. A request longer than
  // `limit` (but within pass_tokens: Validate) fits no pass, so it gets one of its own.
  const int64_t limit = pack_tokens > 0 ? std::min(pack_tokens, pass_tokens) : pass_tokens;
  std::stable_sort(valid.begin(), valid.end(), [&](int a, int b) { return length[a] > length[b]; });
  std::vector<std::vector<int>> passes;
  std::vector<int64_t> fill;
  for (int i : valid) {
    size_t p = 0;
    while (p < passes.size() && fill[p] + length[i] > limit) ++p;
    if (p == passes.size()) {
      passes.emplace_back();
      fill.push_back(0);
    }
    passes[p].push_back(i);
    fill[p] += length[i];
  }
  for (size_t p = 0; p < passes.size(); ++p) {
    const bool before = interrupted && interrupted();
    if (before || RunPass(reqs, passes[p], static_cast<int>(p), &results, interrupted)) {
      for (size_t q = before ? p : p + 1; q < passes.size(); ++q)
        for (int i : passes[q])
          results[i] = Status::Cancelled(fmt::format("interrupted before its forward pass ran ({} of {} passes done)",
                                                     p, passes.size()));
      break;
    }
  }
  return results;
}

int64_t Engine::Impl::RequestTokens(const Request& req) {
  int64_t n = static_cast<int64_t>(req.tokens.size());
  for (const std::vector<int32_t>& c : req.continuations) n += static_cast<int64_t>(c.size());
  return n;
}

bool Engine::Impl::RunPass(std::span<const Request> reqs, const std::vector<int>& ids, int pass_index,
                           std::vector<Result<Response>>* results, const std::function<bool()>& interrupted) {
  const Timer timer;
  const model::ModelConfig& c = model->config();
  const int64_t d = c.n_embd, K = c.n_expert_used;
  auto fail_all = [&](const Status& st) {
    for (int i : ids) (*results)[i] = st;
    return st.code() == StatusCode::kCancelled;
  };

  // Layout of the pass: per request its context, then its continuations.
  std::vector<model::SeqSpan> seqs;
  std::vector<int64_t> row0(ids.size());
  std::vector<int32_t> tokens;
  for (size_t j = 0; j < ids.size(); ++j) {
    const Request& req = reqs[ids[j]];
    const int64_t ctx_row = static_cast<int64_t>(tokens.size()), C = static_cast<int64_t>(req.tokens.size());
    row0[j] = ctx_row;
    seqs.push_back({.row = ctx_row, .len = C});
    tokens.insert(tokens.end(), req.tokens.begin(), req.tokens.end());
    for (const std::vector<int32_t>& cont : req.continuations) {
      seqs.push_back({.row = static_cast<int64_t>(tokens.size()), .len = static_cast<int64_t>(cont.size()),
                      .ctx_row = ctx_row, .ctx_len = C});
      tokens.insert(tokens.end(), cont.begin(), cont.end());
    }
  }
  const int64_t T = static_cast<int64_t>(tokens.size());

  // Buffers (grown once, reused by later passes). A failure here leaves the engine as it was.
  // The buffers of several requests packed together: the pass, not one prompt, is too long.
  Status st = ReserveBuffers(T);
  if (!st.ok() && st.code() == StatusCode::kResourceExhausted && ids.size() > 1)
    st = Status::ResourceExhausted(fmt::format(
        "cannot allocate the activation buffers for a pass of {} tokens ({} requests packed together); lower "
        "batch_tokens (--batch-tokens) or free memory", T, ids.size()));
  if (!st.ok()) return fail_all(st);

  std::vector<Response> resps(ids.size());
  for (size_t j = 0; j < ids.size(); ++j) {
    const Request& req = reqs[ids[j]];
    const int64_t C = static_cast<int64_t>(req.tokens.size());
    resps[j].n_tokens = C;
    if (req.return_routing) {
      resps[j].routing.resize(c.n_layer * C * K);
      resps[j].routing_weights.resize(c.n_layer * C * K);
    }
  }

  // The forward pass, layer by layer.
  Response::Timing tm;
  double t0 = NowSeconds(), t1;
  auto lap = [&](double* acc) { t1 = NowSeconds(); *acc += t1 - t0; t0 = t1; };
  model::VirtualExperts* const stream = vexp && vexp->streamed() ? vexp.get() : nullptr;
  if (trace) trace->Clear();
  ws.attention_time = {};
  if (stream) stream->BeginRequest();
  {
    // Ends the pass's streaming on every path out (cancels reads, frees banks).
    struct StreamEnd {
      model::VirtualExperts* v;
      ~StreamEnd() { if (v) (void)v->EndRequest(); }
    } stream_end{stream};
    model::EmbedTokens(*model, tokens.data(), T, ws.x.get());
    lap(&tm.embed);
    for (int il = 0; il < c.n_layer; ++il) {
      if (interrupted && interrupted())
        return fail_all(Status::Cancelled(fmt::format("interrupted at layer {} of {} of its forward pass", il,
                                                      c.n_layer)));
      const bool moe = model->layers()[il].moe;
      if (stream && moe) stream->LayerStart(il);
      if (c.is_conv_layer(il)) {
        model::ShortConvBlock(*model, il, T, &ws, seqs);
      } else if (c.arch->attention == model::AttentionKind::kMla) {
        model::MlaAttentionBlock(*model, il, T, &ws, seqs);
      } else {
        model::AttentionBlock(*model, il, T, &ws, seqs);
      }
      lap(&tm.attention);
      if (!moe) {  // a leading dense block (ffn.h): no routes
        model::DenseFfnBlock(*model, il, T, &ws);
        lap(&tm.dense_ffn);
        for (size_t j = 0; j < ids.size(); ++j) {
          if (!reqs[ids[j]].return_routing) continue;
          const int64_t C = resps[j].n_tokens;
          std::fill_n(resps[j].routing.begin() + il * C * K, C * K, -1);
          std::fill_n(resps[j].routing_weights.begin() + il * C * K, C * K, 0.0f);
        }
        continue;
      }
      model::RouteBlock(*model, il, T, &ws);
      lap(&tm.router);
      model::SharedExpertsBlock(*model, il, T, &ws);
      lap(&tm.dense_ffn);
      st = stream ? stream->RunExperts(il, T, &ws) : experts.Run(*model, il, T, &ws);
      if (!st.ok()) return fail_all(st);
      lap(&tm.experts);
      for (size_t j = 0; j < ids.size(); ++j) {
        if (!reqs[ids[j]].return_routing) continue;
        const int64_t C = resps[j].n_tokens, r0 = row0[j];
        std::copy(ws.route_expert.get() + r0 * K, ws.route_expert.get() + (r0 + C) * K,
                  resps[j].routing.begin() + il * C * K);
        std::copy(ws.route_weight.get() + r0 * K, ws.route_weight.get() + (r0 + C) * K,
                  resps[j].routing_weights.begin() + il * C * K);
      }
    }
  }
  model::FinalNorm(*model, ws.x.get(), T, hidden.get());
  std::vector<Status> out(ids.size());
  for (size_t j = 0; j < ids.size(); ++j) out[j] = RequestOutputs(reqs[ids[j]], hidden.get() + row0[j] * d, &resps[j]);
  lap(&tm.head);
  tm.attention_projections = ws.attention_time.projections;
  tm.attention_kernel = ws.attention_time.kernel;

  // Pass-wide figures, shared by its requests.
  Response pass;
  pass.timing = tm;
  pass.seconds = timer.Seconds();
  FillStreamStats(&pass);
  for (size_t j = 0; j < ids.size(); ++j) {
    Result<Response>& slot = (*results)[ids[j]];
    if (!out[j].ok()) {  // its logits_sink failed, or its outputs were not finite
      slot = out[j];
      continue;
    }
    Response& r = resps[j];
    r.timing = pass.timing;
    r.seconds = pass.seconds;
    r.expert_seconds = pass.expert_seconds;
    r.nonexpert_seconds = pass.nonexpert_seconds;
    r.bubble_seconds = pass.bubble_seconds;
    r.bubble_rate = pass.bubble_rate;
    r.bytes_read = pass.bytes_read;
    r.experts_needed = pass.experts_needed;
    r.experts_cached = pass.experts_cached;
    r.read_gbps = pass.read_gbps;
    r.peak_rss_bytes = pass.peak_rss_bytes;
    r.config = pass.config;
    r.pass = pass_index;
    r.pass_requests = static_cast<int>(ids.size());
    r.pass_tokens = T;
    slot = std::move(r);
  }
  return false;
}

Status Engine::Impl::ReserveBuffers(int64_t T) {
  const int64_t d = model->config().n_embd, V = model->config().n_vocab;
  // Streamed: the budget plans activations for exactly pass_tokens tokens, so reserve that once
  // (Reserve's growth rounding could otherwise go past it as passes of varying lengths arrive).
  if (vexp && vexp->streamed()) T = std::max(T, pass_tokens);
  ESTREAM_RETURN_IF_ERROR(ws.Reserve(*model, T, n_threads));
  ESTREAM_RETURN_IF_ERROR(experts.Reserve(*model, T, n_threads));
  if (hidden_rows < T) {
    AlignedPtr<float> h = AllocAligned<float>(static_cast<size_t>(T * d));
    if (!h) return Status::ResourceExhausted(fmt::format("cannot allocate the final hidden states ({} x {})", T, d));
    hidden = std::move(h);
    hidden_rows = T;
  }
  const int64_t chunk = LogitsChunkRows(V);
  if (logits_rows < chunk) {
    AlignedPtr<float> l = AllocAligned<float>(static_cast<size_t>(chunk * V));
    if (!l) return Status::ResourceExhausted(fmt::format("cannot allocate the logits buffer ({} x {})", chunk, V));
    logits = std::move(l);
    logits_rows = chunk;
  }
  return Status::Ok();
}

Status Engine::Impl::LmHead(const float* h, int64_t n_rows,
                            const std::function<Status(int64_t first, int64_t n, const float* lg)>& fn) {
  const int64_t d = model->config().n_embd, V = model->config().n_vocab, chunk = LogitsChunkRows(V);
  for (int64_t r0 = 0; r0 < n_rows; r0 += chunk) {
    const int64_t n = std::min(chunk, n_rows - r0);
    kernels::MatMul(model->output(), h + r0 * d, d, n, logits.get(), V);
    // Cheap next to the product (1/n_embd of its work): NaN is an error, never printed as a result.
    if (FirstNonFinite(logits.get(), n * V) < n * V) return NonFiniteOutputs(model->path(), "logits");
    ESTREAM_RETURN_IF_ERROR(fn(r0, n, logits.get()));
  }
  return Status::Ok();
}

Status Engine::Impl::RequestOutputs(const Request& req, const float* h, Response* resp) {
  const int64_t T = static_cast<int64_t>(req.tokens.size());
  const int64_t d = model->config().n_embd, V = model->config().n_vocab;
  const bool conts = !req.continuations.empty();
  // Which rows need the LM head: [lm_first, T) of the context.
  const bool all_logits = req.prompt_logprobs || req.logits_sink || req.logits == Request::Logits::kAll;
  const bool last_logits = req.top_k > 0 || req.logits == Request::Logits::kLast || conts;
  const int64_t lm_first = all_logits ? 0 : (last_logits ? T - 1 : T);
  if (req.prompt_logprobs) resp->prompt_logprobs.resize(T - 1);
  if (req.logits == Request::Logits::kAll && !req.logits_sink) resp->logits.reserve(static_cast<size_t>(T * V));
  std::vector<double> lse(LogitsChunkRows(V));
  // Each continuation's first token is scored by the context's last row.
  resp->continuations.resize(req.continuations.size());

  // (Named lambdas: an OpenMP pragma cannot sit inside a macro's arguments.)
  auto context_rows = [&](int64_t first, int64_t n, const float* lg) -> Status {
    const int64_t r0 = lm_first + first;
    if (req.logits_sink) {
      ESTREAM_RETURN_IF_ERROR(req.logits_sink(r0, n, lg));
    } else if (req.logits == Request::Logits::kAll) {
      resp->logits.insert(resp->logits.end(), lg, lg + n * V);
    }
    if (req.prompt_logprobs) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) lse[i] = kernels::LogSumExp(lg + i * V, V);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = r0 + i;
        if (t + 1 < T) resp->prompt_logprobs[t] = static_cast<float>(lg[i * V + req.tokens[t + 1]] - lse[i]);
      }
    }
    if (r0 + n == T) {  // the chunk with the last position
      const float* last = lg + (n - 1) * V;
      if (req.logits == Request::Logits::kLast) resp->logits.assign(last, last + V);
      const double l = req.top_k > 0 || conts ? kernels::LogSumExp(last, V) : 0;
      if (req.top_k > 0) {
        std::vector<int32_t> ids(V);
        std::iota(ids.begin(), ids.end(), 0);
        auto better = [last](int32_t a, int32_t b) { return last[a] > last[b] || (last[a] == last[b] && a < b); };
        std::partial_sort(ids.begin(), ids.begin() + req.top_k, ids.end(), better);
        for (int j = 0; j < req.top_k; ++j)
          resp->top.push_back({ids[j], static_cast<float>(last[ids[j]] - l)});
      }
      if (conts) {
        const int32_t best = Argmax(last, V);
        for (size_t j = 0; j < req.continuations.size(); ++j) {
          const int32_t tok = req.continuations[j][0];
          resp->continuations[j].logprobs.push_back(static_cast<float>(last[tok] - l));
          resp->continuations[j].is_greedy = tok == best;
        }
      }
    }
    return Status::Ok();
  };
  ESTREAM_RETURN_IF_ERROR(LmHead(h + lm_first * d, T - lm_first, context_rows));
  if (req.prompt_logprobs) {
    double ll = 0;
    for (float lp : resp->prompt_logprobs) ll += lp;
    resp->log_likelihood = ll;
    resp->perplexity = T > 1 ? std::exp(-ll / static_cast<double>(T - 1)) : std::numeric_limits<double>::quiet_NaN();
  }
  if (req.embedding != Request::Pooling::kNone && FirstNonFinite(h, T * d) < T * d)
    return NonFiniteOutputs(model->path(), "final hidden states (the embedding)");
  if (req.embedding == Request::Pooling::kLast) {
    resp->embedding.assign(h + (T - 1) * d, h + T * d);
  } else if (req.embedding == Request::Pooling::kMean) {
    std::vector<double> acc(d, 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < d; ++i) acc[i] += h[t * d + i];
    resp->embedding.resize(d);
    for (int64_t i = 0; i < d; ++i) resp->embedding[i] = static_cast<float>(acc[i] / static_cast<double>(T));
  }

  // Continuations: row i of continuation j (after the context's rows) scores its token i + 1.
  int64_t row = T;
  for (size_t j = 0; j < req.continuations.size(); ++j) {
    const std::vector<int32_t>& cont = req.continuations[j];
    const int64_t L = static_cast<int64_t>(cont.size());
    ContinuationScore& cs = resp->continuations[j];
    cs.logprobs.resize(L);
    auto continuation_rows = [&](int64_t first, int64_t n, const float* lg) -> Status {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) lse[i] = kernels::LogSumExp(lg + i * V, V);
      for (int64_t i = 0; i < n; ++i) {
        const int32_t tok = cont[first + i + 1];
        cs.logprobs[first + i + 1] = static_cast<float>(lg[i * V + tok] - lse[i]);
        cs.is_greedy = cs.is_greedy && Argmax(lg + i * V, V) == tok;
      }
      return Status::Ok();
    };
    ESTREAM_RETURN_IF_ERROR(LmHead(h + row * d, L - 1, continuation_rows));
    double ll = 0;
    for (float lp : cs.logprobs) ll += lp;
    cs.log_likelihood = ll;
    row += L;
  }
  return Status::Ok();
}

}  // namespace estream

namespace estream {

Status Engine::Impl::OpenPackedExperts(const EngineOptions& o, uint64_t peak_before_load) {
  Engine::Impl* im = this;
  model::VirtualExpertsOptions vo;
  static_cast<EngineOptions&>(vo) = o;
  vo.n_threads = im->n_threads;
  vo.peak_rss_before_load = peak_before_load;
  if (o.hooks && o.hooks->trace) {
    im->trace = o.hooks->trace;
  } else if (!o.trace_path.empty()) {
    im->owned_trace = std::make_unique<pipeline::TraceRecorder>();
    im->trace = im->owned_trace.get();
  }
  im->trace_path = o.trace_path;
  vo.trace = im->trace;
  ESTREAM_ASSIGN_OR_RETURN(im->vexp, model::VirtualExperts::Open(im->model.get(), vo));
  im->info.weight_bytes = im->model->weight_bytes();
  return Status::Ok();
}

void Engine::Impl::FillStreamStats(Response* resp) {
  resp->expert_seconds = resp->timing.experts;
  resp->nonexpert_seconds = resp->seconds - resp->expert_seconds;
  if (vexp) {
    const model::VirtualExpertsConfig& k = vexp->config();
    Response::StreamConfig& rc = resp->config;
    rc.streamed = k.streamed;
    rc.expert_bytes = k.expert_bytes;
    if (k.streamed) {
      rc.group_size = k.group_size;
      rc.banks = k.banks;
      rc.queue_depth = k.queue_depth;
      rc.schedule = ScheduleName(k.schedule);
      rc.io_backend = k.io_backend;
      rc.arena_bytes = k.arena_bytes;
      rc.cache_banks = k.cache_banks;
      rc.cache_bytes = k.cache_bytes;
      rc.budget_bytes = k.budget_bytes;
      rc.other_bytes = k.other_bytes;
      rc.source_kind = k.source;
      rc.source_note = k.source_note;
      rc.source = ConfigSourceString(k.source, k.source_note);
      const pipeline::StreamStats st = vexp->stream_stats();
      resp->bubble_seconds = st.bubble_s;
      resp->bubble_rate = resp->seconds > 0 ? st.bubble_s / resp->seconds : 0;
      resp->bytes_read = st.bytes_read;
      resp->experts_needed = st.records_used;
      resp->experts_cached = st.records_cached;
      resp->read_gbps = st.read_busy_s > 0 ? static_cast<double>(st.bytes_read) / st.read_busy_s / 1e9 : 0;
      rc.groups_read = st.groups_read;
      rc.groups_skipped = st.groups_skipped;
      rc.groups_cancelled = st.groups_cancelled;
    }
  }
  resp->peak_rss_bytes = PeakRssBytes();
  if (trace && !trace_path.empty()) {
    Status s = trace->WriteJson(trace_path);
    (void)s;  // a trace that cannot be written does not fail the request
  }
}

double LogSumExp(const float* logits, int64_t n) {
  if (n <= 0) return -INFINITY;
  return logits == nullptr ? NAN : kernels::LogSumExp(logits, n);
}

}  // namespace estream
