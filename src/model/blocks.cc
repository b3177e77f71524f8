#include "model/blocks.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "kernels/dispatch.h"
#include "model/experts.h"
#include "model/ffn.h"
#include "model/mla.h"
#include "quant/quant.h"

namespace estream::model {
namespace {

template <typename T>
bool Grow(AlignedPtr<T>* p, int64_t n) {
  AlignedPtr<T> fresh = AllocAligned<T>(static_cast<size_t>(n));
  if (!fresh) return false;
  *p = std::move(fresh);
  return true;
}

bool AnyQuantized(std::initializer_list<const kernels::WeightView*> ws) {
  for (const kernels::WeightView* w : ws)
    if (IsQuantized(w->type)) return true;
  return false;
}

// The q/k norm (QkNorm) and RoPE of q and k, one pass over each row (row t at its sequence's
// position), then AttendSequences; with out_q8, the output as the output projection's Q8A rows.
void NormRopeAndAttend(const Model& model, const LayerWeights& L, int64_t T, std::span<const SeqSpan> seqs,
                       bool allow_bf16, BlockQ8A* out_q8, Workspace* ws) {
  const ModelConfig& c = model.config();
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  std::vector<int32_t>& pos = ws->positions;
  pos.resize(static_cast<size_t>(T));
  for (const SeqSpan& s : seqs)
    for (int64_t i = 0; i < s.len; ++i) pos[s.row + i] = static_cast<int32_t>(s.ctx_len + i);
  const float* qn = c.arch->qk_norm == QkNorm::kNone ? nullptr : L.q_norm;
  const float* kn = c.arch->qk_norm == QkNorm::kNone ? nullptr : L.k_norm;
  const bool whole = c.arch->qk_norm == QkNorm::kWhole;
  kernels::NormRope(ws->q.get(), qd, T, pos.data(), c.n_head, c.head_dim, c.rope_freq_base, c.arch->rope_mode, qn,
                    whole ? qd : c.head_dim, c.rms_eps);
  kernels::NormRope(ws->k.get(), kvd, T, pos.data(), c.n_head_kv, c.head_dim, c.rope_freq_base, c.arch->rope_mode,
                    kn, whole ? kvd : c.head_dim, c.rms_eps);
  kernels::AttentionArgs a;
  a.n_head = c.n_head;
  a.n_head_kv = c.n_head_kv;
  a.head_dim = c.head_dim;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  a.q = ws->q.get();
  a.ldq = qd;
  a.k = ws->k.get();
  a.ldk = kvd;
  a.v = ws->v.get();
  a.ldv = kvd;
  a.out = ws->att.get();
  a.ldo = qd;
  a.out_q8 = out_q8;
  a.ldo_q8 = qd / kQK8A;
  a.allow_bf16 = allow_bf16;
  AttendSequences(a, seqs, ws);
}

}  // namespace

void AttendSequences(const kernels::AttentionArgs& whole, std::span<const SeqSpan> seqs, Workspace* ws) {
  const Timer timer;
  const int64_t qd = whole.ldq, kvd = whole.ldk;
  ESTREAM_CHECK(whole.ldv == kvd && whole.ldo == qd, "AttendSequences: v rows as wide as k rows, outputs as q");
  kernels::AttentionArgs a = whole;
  for (const SeqSpan& s : seqs) {
    if (s.ctx_len == 0) {
      a.n_tokens = static_cast<int>(s.len);
      a.q_begin = 0;
      a.q = whole.q + s.row * qd;
      a.k = whole.k + s.row * kvd;
      a.v = whole.v + s.row * kvd;
      a.out = whole.out + s.row * qd;
      if (whole.out_q8 != nullptr) a.out_q8 = whole.out_q8 + s.row * whole.ldo_q8;
    } else {
      // Keys 0..ctx_len-1: the context's; ctx_len..: this continuation's. The continuation's rows
      // follow the context's, so q/out moved back by ctx_len rows stay inside the buffers.
      const int64_t n = s.ctx_len + s.len;
      float* tk = ws->tree_k.get();
      float* tv = ws->tree_v.get();
      std::copy(whole.k + s.ctx_row * kvd, whole.k + (s.ctx_row + s.ctx_len) * kvd, tk);
      std::copy(whole.v + s.ctx_row * kvd, whole.v + (s.ctx_row + s.ctx_len) * kvd, tv);
      std::copy(whole.k + s.row * kvd, whole.k + (s.row + s.len) * kvd, tk + s.ctx_len * kvd);
      std::copy(whole.v + s.row * kvd, whole.v + (s.row + s.len) * kvd, tv + s.ctx_len * kvd);
      a.n_tokens = static_cast<int>(n);
      a.q_begin = static_cast<int>(s.ctx_len);
      a.q = whole.q + (s.row - s.ctx_len) * qd;
      a.k = tk;
      a.v = tv;
      a.out = whole.out + (s.row - s.ctx_len) * qd;
      if (whole.out_q8 != nullptr) a.out_q8 = whole.out_q8 + (s.row - s.ctx_len) * whole.ldo_q8;
    }
    kernels::AttentionPrefill(a);
  }
  ws->attention_time.kernel += timer.Seconds();
}

const BlockQ8A* NormAndQuantize(const float* x, const float* norm_w, int64_t n_tokens, int64_t d, float eps,
                                bool quantize, Workspace* ws) {
  if (!quantize) {
    kernels::RmsNorm(x, d, norm_w, ws->xn.get(), d, n_tokens, d, eps);
    return nullptr;
  }
  kernels::RmsNormQuantize(x, d, norm_w, ws->xn.get(), d, ws->xq.get(), n_tokens, d, eps);
  return ws->xq.get();
}

bool IsQuantized(QuantType t) { return t != QuantType::kF32 && t != QuantType::kF16 && t != QuantType::kBF16; }

Status Workspace::Reserve(const Model& model, int64_t n_tokens, int n_threads) {
  if (n_tokens <= capacity_ && n_threads <= thread_capacity_ && model_ == &model) return Status::Ok();
  const ModelConfig& c = model.config();
  // Round up so that slowly growing prompts do not reallocate every time.
  const int64_t T = std::max<int64_t>(n_tokens, std::min<int64_t>(c.n_ctx, (capacity_ * 3) / 2));
  const int64_t C = std::min<int64_t>(kExpertChunkRows, T);
  const int64_t d = c.n_embd, k = c.n_expert_used, ff = c.n_ff_expert;
  // The chunk buffers also serve the dense FFNs (ffn.h), which may be wider than an expert.
  const int64_t ffw = std::max<int64_t>({ff, c.n_ff, c.n_ff_shexp});
  Workspace w;
  // xq: xn's Q8A rows, and the attention's for the output projection (AttentionBlock).
  const int64_t xq_width = std::max<int64_t>(d, c.q_dim());
  const bool ok = Grow(&w.x, T * d) && Grow(&w.acc, T * d) && Grow(&w.xn, T * d) &&
                  Grow(&w.xq, T * (xq_width / kQK8A)) && Grow(&w.q, T * c.q_dim()) && Grow(&w.k, T * c.kv_dim()) &&
                  Grow(&w.v, T * c.kv_dim()) && Grow(&w.att, T * c.q_dim()) && Grow(&w.router_logits, T * c.n_expert) &&
                  Grow(&w.route_expert, T * k) && Grow(&w.route_weight, T * k) && Grow(&w.route_token, T * k) &&
                  Grow(&w.route_w, T * k) && Grow(&w.gx, C * d) && Grow(&w.gxq, C * (d / kQK8A)) &&
                  Grow(&w.gate, C * ffw) && Grow(&w.up, C * ffw) && Grow(&w.hq, C * (ffw / kQK8A)) &&
                  Grow(&w.mla, std::max<int64_t>(1, T * MlaScratchFloats(c))) &&
                  Grow(&w.tree_k, T * c.kv_dim()) && Grow(&w.tree_v, T * c.kv_dim());
  const bool ok_conv = !c.has_conv_layers() || Grow(&w.bcx, T * 3 * d);
  if (!ok || !ok_conv) {
    return Status::ResourceExhausted(
        "cannot allocate the activation buffers for a prompt of " + std::to_string(n_tokens) +
        " tokens; use a shorter prompt or free memory");
  }
  w.expert_begin.assign(c.n_expert + 1, 0);
  w.capacity_ = T;
  w.chunk_capacity_ = C;
  w.thread_capacity_ = n_threads;
  w.model_ = &model;
  *this = std::move(w);
  return Status::Ok();
}

void Linear(const kernels::WeightView& w, const float* x, int64_t ldx, const BlockQ8A* xq, int64_t m, float* y,
            int64_t ldy) {
  const kernels::GemmOut out{.w = &w, .y = y, .ldy = ldy};
  kernels::Gemm(std::span(&out, 1), x, ldx, xq, m);
}

void LinearAdd(const kernels::WeightView& w, const float* x, int64_t ldx, const BlockQ8A* xq, int64_t m, float* y,
               int64_t ldy) {
  const kernels::GemmOut out{.w = &w, .y = y, .ldy = ldy, .add = true};
  kernels::Gemm(std::span(&out, 1), x, ldx, xq, m);
}

void EmbedTokens(const Model& model, const int32_t* tokens, int64_t n_tokens, float* x) {
  const int64_t d = model.config().n_embd;
  const QuantType t = model.token_embd_type();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n_tokens; ++i) DequantizeRow(t, model.token_embd_row(tokens[i]), x + i * d, d);
}

void AttentionBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws, std::span<const SeqSpan> seqs) {
  const ModelConfig& c = model.config();
  const LayerWeights& L = model.layers()[il];
  const int64_t T = n_tokens, d = c.n_embd, qd = c.q_dim(), kvd = c.kv_dim();

  // The normed rows, quantised once for the three projections, which run as one GEMM (one
  // parallel region over the columns of all three when their types match; kernels.h Gemm).
  const BlockQ8A* xq = NormAndQuantize(ws->x.get(), L.attn_norm, T, d, c.rms_eps,
                                       AnyQuantized({&L.wq, &L.wk, &L.wv}), ws);
  const kernels::GemmOut qkv[] = {{.w = &L.wq, .y = ws->q.get(), .ldy = qd},
                                  {.w = &L.wk, .y = ws->k.get(), .ldy = kvd},
                                  {.w = &L.wv, .y = ws->v.get(), .ldy = kvd}};
  AddTime(&ws->attention_time.projections, [&] { kernels::Gemm(qkv, ws->xn.get(), d, xq, T); });

  // Quantised projections already round the activations to 8 bits: bf16 attention where the host
  // has it (kernels.h, AttentionArgs::allow_bf16).
  const bool allow_bf16 =
      IsQuantized(L.wq.type) && IsQuantized(L.wk.type) && IsQuantized(L.wv.type) && IsQuantized(L.wo.type);
  const SeqSpan whole{.row = 0, .len = T};
  // A quantised output projection reads the attention's rows as Q8A, which the attention writes
  // itself (kernels.h, AttentionArgs::out_q8) into xq: the Q/K/V projections have read it, and
  // Reserve sizes it for q_dim as well.
  BlockQ8A* att_q = IsQuantized(L.wo.type) ? ws->xq.get() : nullptr;
  NormRopeAndAttend(model, L, T, seqs.empty() ? std::span<const SeqSpan>(&whole, 1) : seqs, allow_bf16, att_q, ws);

  // Output projection with the residual add in its epilogue: x += att W_o^T.
  AddTime(&ws->attention_time.projections, [&] { LinearAdd(L.wo, ws->att.get(), qd, att_q, T, ws->x.get(), d); });
}

void RouteBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws) {
  const ModelConfig& c = model.config();
  const LayerWeights& L = model.layers()[il];
  const int64_t T = n_tokens, d = c.n_embd;
  const int E = c.n_expert, K = c.n_expert_used;

  bool need_q = IsQuantized(L.router.type);
  for (int e = 0; e < E && !need_q; ++e)
    need_q = AnyQuantized({&L.experts.gate[e], &L.experts.up[e], &L.experts.down[e]});
  if (L.shexp.present()) need_q = need_q || AnyQuantized({&L.shexp.gate, &L.shexp.up});
  const BlockQ8A* xq = NormAndQuantize(ws->x.get(), L.ffn_norm, T, d, c.rms_eps, need_q, ws);

  // Router: logits, then softmax / top-k / renormalisation per token.
  Linear(L.router, ws->xn.get(), d, xq, T, ws->router_logits.get(), E);
  const float* logits = ws->router_logits.get();
  int32_t* idx = ws->route_expert.get();
  float* wt = ws->route_weight.get();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) RouteToken(c, logits + t * E, L.exp_probs_b, idx + t * K, wt + t * K);

  // Group routes by expert (counting sort; tokens stay in ascending order within an expert).
  std::vector<int64_t>& begin = ws->expert_begin;
  std::fill(begin.begin(), begin.end(), 0);
  for (int64_t r = 0; r < T * K; ++r) ++begin[idx[r] + 1];
  for (int e = 0; e < E; ++e) begin[e + 1] += begin[e];
  std::vector<int64_t> fill(begin.begin(), begin.end() - 1);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) {
      const int64_t pos = fill[idx[t * K + j]]++;
      ws->route_token[pos] = static_cast<int32_t>(t);
      ws->route_w[pos] = wt[t * K + j];
    }
}

void FinalNorm(const Model& model, const float* x, int64_t n_rows, float* y) {
  const ModelConfig& c = model.config();
  kernels::RmsNorm(x, c.n_embd, model.output_norm(), y, c.n_embd, n_rows, c.n_embd, c.rms_eps);
}

}  // namespace estream::model
