// Engine: Model + Workspace + the request outputs (LM head at the positions asked for, log-softmax,
// top-k, prompt log-probabilities, embeddings).
#include "estream/engine.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>

#include <fmt/format.h>

#include "base/memory.h"
#include "base/timer.h"
#include "gguf/gguf.h"
#include "io/packed_layout.h"
#include "kernels/kernels.h"
#include "model/blocks.h"
#include "model/experts.h"
#include "model/ffn.h"
#include "model/mla.h"
#include "model/model.h"
#include "model/shortconv_block.h"
#include "model/virtual_experts.h"
#include "pipeline/trace.h"

namespace estream {
namespace {

// Sets the calling thread's OpenMP team size for the life of the object, then restores it.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedOmpThreads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

// log(sum(exp(row))) in double, with the max subtracted first.
double LogSumExp(const float* row, int64_t n) {
  float mx = row[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, row[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(row[i]) - mx);
  return mx + std::log(s);
}

// Positions of the LM head rows computed at a time: bounds the logits scratch.
int64_t LogitsChunkRows(int64_t n_vocab) { return std::clamp<int64_t>((int64_t{8} << 20) / n_vocab, 1, 64); }

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
  std::unique_ptr<pipeline::TraceRecorder> trace;
  std::string trace_path;
  std::unique_ptr<model::VirtualExperts> vexp;
  AlignedPtr<float> hidden;  // [T x n_embd] final-normed rows (grown as needed)
  int64_t hidden_rows = 0;
  AlignedPtr<float> logits;  // [chunk x n_vocab]
  int64_t logits_rows = 0;

  Status Validate(const Request& req) const;
  // Response::expert_seconds ... config (streamed or not); writes the trace when asked for.
  void FillStreamStats(Response* resp);
  // The experts of a packed model (virtual_experts.h): resident, or streamed within the budget.
  Status OpenPackedExperts(const EngineOptions& o);
  Result<Response> Run(const Request& req);
};

Engine::Engine() : impl_(std::make_unique<Impl>()) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::Load(const std::string& path, EngineOptions options) {
  if (options.n_threads < 0)
    return Status::InvalidArgument(fmt::format("n_threads = {} must be >= 0 (0 = one per CPU)", options.n_threads));
  if (options.budget_bytes > 0 || options.group_size > 0 || options.banks > 0) {
    // Streaming needs the packed layout; refuse before loading (a resident load of a big plain
    // GGUF would itself exceed the budget the user asked for).
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> header, GgufFile::Open(path));
    if (!io::IsPackedModel(*header))
      return Status::InvalidArgument(fmt::format(
          "{}: a memory budget (or group size / banks) needs a packed model: run 'estream pack {} -o "
          "MODEL.packed.gguf' and use that file",
          path, path));
  }
  model::ModelLoadOptions mo;
  // Repacking is chosen per type inside the loader (kernels::CanRepack); see docs/PERFORMANCE.md
  // for why experts are (or are not) repacked by default.
  mo.repack_experts = options.repack != EngineOptions::Repack::kNever;
  mo.repack_dense = options.repack != EngineOptions::Repack::kNever;
  // A budget is checked against the measured RSS after load: every dense page must be in it.
  mo.prefault = options.prefault || options.budget_bytes > 0;
  std::unique_ptr<Engine> engine(new Engine());
  Impl& im = *engine->impl_;
  {
    ScopedOmpThreads threads(options.n_threads > 0 ? options.n_threads : omp_get_num_procs());
    ESTREAM_ASSIGN_OR_RETURN(im.model, model::Model::Load(path, mo));
  }
  im.n_threads = options.n_threads > 0 ? options.n_threads : omp_get_num_procs();
  if (im.model->experts_packed()) {
    ESTREAM_RETURN_IF_ERROR(im.OpenPackedExperts(options));
  }
  const model::ModelConfig& c = im.model->config();
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

Result<Response> Engine::Run(const Request& request) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  ScopedOmpThreads threads(impl_->n_threads);
  return impl_->Run(request);
}

Status Engine::Impl::Validate(const Request& req) const {
  const model::ModelConfig& c = model->config();
  if (req.tokens.empty()) return Status::InvalidArgument("empty prompt: give at least one token");
  if (static_cast<int64_t>(req.tokens.size()) > c.n_ctx)
    return Status::OutOfRange(fmt::format("prompt of {} tokens is longer than the model's context length {}",
                                          req.tokens.size(), c.n_ctx));
  for (size_t i = 0; i < req.tokens.size(); ++i)
    if (req.tokens[i] < 0 || req.tokens[i] >= c.n_vocab)
      return Status::InvalidArgument(fmt::format("token id {} at position {} is out of range [0, {})", req.tokens[i],
                                                 i, c.n_vocab));
  if (req.top_k < 0 || req.top_k > c.n_vocab)
    return Status::InvalidArgument(fmt::format("top_k = {} must be between 0 and n_vocab = {}", req.top_k, c.n_vocab));
  return Status::Ok();
}

Result<Response> Engine::Impl::Run(const Request& req) {
  ESTREAM_RETURN_IF_ERROR(Validate(req));
  const Timer timer;
  const model::ModelConfig& c = model->config();
  const int64_t T = static_cast<int64_t>(req.tokens.size());
  const int64_t d = c.n_embd, V = c.n_vocab;

  // Which rows need the final norm and the LM head.
  const bool all_logits = req.prompt_logprobs || req.logits_sink || req.logits == Request::Logits::kAll;
  const bool last_logits = req.top_k > 0 || req.logits == Request::Logits::kLast;
  const bool all_hidden = all_logits || req.embedding == Request::Pooling::kMean;
  const int64_t lm_first = all_logits ? 0 : (last_logits ? T - 1 : T);  // LM head rows [lm_first, T)
  const int64_t hidden_first = all_hidden ? 0 : T - 1;                  // normed rows [hidden_first, T)

  // Buffers (grown once, reused by later requests). A failure here leaves the engine as it was.
  ESTREAM_RETURN_IF_ERROR(ws.Reserve(*model, T, n_threads));
  ESTREAM_RETURN_IF_ERROR(experts.Reserve(*model, T, n_threads));
  if (hidden_rows < T) {
    AlignedPtr<float> h = AllocAligned<float>(static_cast<size_t>(T * d));
    if (!h) return Status::ResourceExhausted(fmt::format("cannot allocate the final hidden states ({} x {})", T, d));
    hidden = std::move(h);
    hidden_rows = T;
  }
  const int64_t chunk = LogitsChunkRows(V);
  if (lm_first < T && logits_rows < chunk) {
    AlignedPtr<float> l = AllocAligned<float>(static_cast<size_t>(chunk * V));
    if (!l) return Status::ResourceExhausted(fmt::format("cannot allocate the logits buffer ({} x {})", chunk, V));
    logits = std::move(l);
    logits_rows = chunk;
  }

  Response resp;
  resp.n_tokens = T;
  const int64_t K = c.n_expert_used;
  if (req.return_routing) {
    resp.routing.resize(c.n_layer * T * K);
    resp.routing_weights.resize(c.n_layer * T * K);
  }

  // The forward pass, layer by layer.
  Response::Timing& tm = resp.timing;
  double t0 = NowSeconds(), t1;
  auto lap = [&](double* acc) { t1 = NowSeconds(); *acc += t1 - t0; t0 = t1; };
  model::VirtualExperts* const stream = vexp && vexp->streamed() ? vexp.get() : nullptr;
  if (trace) trace->Clear();
  if (stream) stream->BeginRequest();
  // Ends the request's streaming on every path out of Run (cancels reads, frees banks).
  struct StreamEnd {
    model::VirtualExperts* v;
    ~StreamEnd() { if (v) (void)v->EndRequest(); }
  } stream_end{stream};
  model::EmbedTokens(*model, req.tokens.data(), T, ws.x.get());
  lap(&tm.embed);
  for (int il = 0; il < c.n_layer; ++il) {
    const bool moe = model->layers()[il].moe;
    if (stream && moe) stream->LayerStart(il);
    if (c.is_conv_layer(il)) {
      model::ShortConvBlock(*model, il, T, &ws);
    } else if (c.arch->attention == model::AttentionKind::kMla) {
      model::MlaAttentionBlock(*model, il, T, &ws);
    } else {
      model::AttentionBlock(*model, il, T, &ws);
    }
    lap(&tm.attention);
    if (!moe) {  // a leading dense block (ffn.h): no routes
      model::DenseFfnBlock(*model, il, T, &ws);
      lap(&tm.dense_ffn);
      if (req.return_routing) {
        std::fill_n(resp.routing.begin() + il * T * K, T * K, -1);
        std::fill_n(resp.routing_weights.begin() + il * T * K, T * K, 0.0f);
      }
      continue;
    }
    model::RouteBlock(*model, il, T, &ws);
    lap(&tm.router);
    model::SharedExpertsBlock(*model, il, T, &ws);
    lap(&tm.dense_ffn);
    if (stream) {
      ESTREAM_RETURN_IF_ERROR(stream->RunExperts(il, T, &ws));
    } else {
      ESTREAM_RETURN_IF_ERROR(experts.Run(*model, il, T, &ws));
    }
    lap(&tm.experts);
    if (req.return_routing) {
      std::copy(ws.route_expert.get(), ws.route_expert.get() + T * K, resp.routing.begin() + il * T * K);
      std::copy(ws.route_weight.get(), ws.route_weight.get() + T * K, resp.routing_weights.begin() + il * T * K);
    }
  }
  model::FinalNorm(*model, ws.x.get() + hidden_first * d, T - hidden_first, hidden.get() + hidden_first * d);

  if (req.prompt_logprobs) resp.prompt_logprobs.resize(T - 1);
  if (req.logits == Request::Logits::kAll && !req.logits_sink) resp.logits.reserve(static_cast<size_t>(T * V));
  std::vector<double> lse(chunk);

  // LM head over [lm_first, T) in chunks of rows.
  for (int64_t r0 = lm_first; r0 < T; r0 += chunk) {
    const int64_t n = std::min(chunk, T - r0);
    float* lg = logits.get();
    kernels::MatMul(model->output(), hidden.get() + r0 * d, d, n, lg, V);
    if (req.logits_sink) {
      ESTREAM_RETURN_IF_ERROR(req.logits_sink(r0, n, lg));
    } else if (req.logits == Request::Logits::kAll) {
      resp.logits.insert(resp.logits.end(), lg, lg + n * V);
    }
    if (req.prompt_logprobs) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) lse[i] = LogSumExp(lg + i * V, V);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = r0 + i;
        if (t + 1 < T) resp.prompt_logprobs[t] = static_cast<float>(lg[i * V + req.tokens[t + 1]] - lse[i]);
      }
    }
    if (r0 + n == T) {  // the chunk with the last position
      const float* last = lg + (n - 1) * V;
      if (req.logits == Request::Logits::kLast) resp.logits.assign(last, last + V);
      if (req.top_k > 0) {
        const double l = LogSumExp(last, V);
        std::vector<int32_t> ids(V);
        std::iota(ids.begin(), ids.end(), 0);
        auto better = [last](int32_t a, int32_t b) { return last[a] > last[b] || (last[a] == last[b] && a < b); };
        std::partial_sort(ids.begin(), ids.begin() + req.top_k, ids.end(), better);
        for (int j = 0; j < req.top_k; ++j)
          resp.top.push_back({ids[j], static_cast<float>(last[ids[j]] - l)});
      }
    }
  }
  if (req.prompt_logprobs) {
    double ll = 0;
    for (float lp : resp.prompt_logprobs) ll += lp;
    resp.log_likelihood = ll;
    resp.perplexity = T > 1 ? std::exp(-ll / static_cast<double>(T - 1)) : std::numeric_limits<double>::quiet_NaN();
  }
  if (req.embedding == Request::Pooling::kLast) {
    resp.embedding.assign(hidden.get() + (T - 1) * d, hidden.get() + T * d);
  } else if (req.embedding == Request::Pooling::kMean) {
    std::vector<double> acc(d, 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < d; ++i) acc[i] += hidden[t * d + i];
    resp.embedding.resize(d);
    for (int64_t i = 0; i < d; ++i) resp.embedding[i] = static_cast<float>(acc[i] / static_cast<double>(T));
  }
  lap(&tm.head);
  resp.seconds = timer.Seconds();
  FillStreamStats(&resp);
  return resp;
}

}  // namespace estream

namespace estream {

Status Engine::Impl::OpenPackedExperts(const EngineOptions& o) {
  Engine::Impl* im = this;
  model::VirtualExpertsOptions vo;
  vo.budget_bytes = o.budget_bytes;
  vo.group_size = o.group_size;
  vo.banks = o.banks;
  vo.queue_depth = o.queue_depth;
  vo.schedule = o.schedule == EngineOptions::Schedule::kOnDemand       ? pipeline::Schedule::kOnDemand
                : o.schedule == EngineOptions::Schedule::kAfterRouting ? pipeline::Schedule::kAfterRouting
                                                                       : pipeline::Schedule::kEarly;
  vo.backend = o.io == EngineOptions::Io::kIoUring ? io::IoBackend::kIoUring
               : o.io == EngineOptions::Io::kPread ? io::IoBackend::kPread
                                                   : io::IoBackend::kAuto;
  vo.verify_checksums = o.verify_checksums;
  vo.verify_every_read = o.verify_every_read;
  vo.budget_tokens = o.budget_tokens;
  vo.n_threads = im->n_threads;
  vo.file_for_testing = static_cast<io::File*>(o.expert_file_for_testing);
  vo.max_feeder_delay_s_for_testing = o.max_feeder_delay_s_for_testing;
  vo.max_executor_delay_s_for_testing = o.max_executor_delay_s_for_testing;
  if (!o.trace_path.empty()) {
    im->trace = std::make_unique<pipeline::TraceRecorder>();
    im->trace_path = o.trace_path;
    vo.trace = im->trace.get();
  }
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
      rc.schedule = pipeline::ScheduleName(k.schedule);
      rc.io_backend = k.io_backend;
      rc.arena_bytes = k.arena_bytes;
      rc.budget_bytes = k.budget_bytes;
      rc.other_bytes = k.other_bytes;
      rc.source = k.source;
      const pipeline::StreamStats st = vexp->stream_stats();
      resp->bubble_seconds = st.bubble_s;
      resp->bubble_rate = resp->seconds > 0 ? st.bubble_s / resp->seconds : 0;
      resp->bytes_read = st.bytes_read;
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

}  // namespace estream
