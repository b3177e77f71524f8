#include "model/mla.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "kernels/kernels.h"
#include "model/blocks.h"

namespace estream::model {

int64_t MlaScratchFloats(const ModelConfig& c) {
  if (c.arch == nullptr || c.arch->attention != AttentionKind::kMla) return 0;
  // compressed kv + k_pe | decompressed k_nope and v | q_a
  return (c.kv_lora_rank + c.qk_rope) + int64_t{c.n_head} * (c.qk_nope + c.v_head_dim) + c.q_lora_rank;
}

void MlaRopeTable(const ModelConfig& c, int64_t n_tokens, double* cs) {
  const int rope = c.qk_rope, half = rope / 2;
  const double base = c.rope_freq_base, f = c.yarn_factor;
  const bool yarn = f > 1.0;
  double lo = 0, hi = 0;
  if (yarn) {
    auto dim = [&](double b) {
      return rope * std::log(c.yarn_orig_ctx / (b * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    lo = std::max(0.0, std::floor(dim(c.yarn_beta_fast)));
    hi = std::min(static_cast<double>(rope - 1), std::ceil(dim(c.yarn_beta_slow)));
  }
  const double mag = c.yarn_rope_mscale;
  std::vector<double> inv_freq(half), ramp(half, 1.0);
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(base, -2.0 * i / rope);
    if (yarn) ramp[i] = 1.0 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
  }
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int i = 0; i < half; ++i) {
      const double te = static_cast<double>(t) * inv_freq[i];
      const double theta = yarn ? te / f * (1.0 - ramp[i]) + te * ramp[i] : te;
      cs[t * rope + 2 * i] = std::cos(theta) * mag;
      cs[t * rope + 2 * i + 1] = std::sin(theta) * mag;
    }
}

namespace {

// Rotates adjacent pairs of the rope dims at x by the table row cs.
inline void RotateNorm(float* x, const double* cs, int rope) {
  for (int i = 0; i < rope; i += 2) {
    const double c = cs[i], s = cs[i + 1], x0 = x[i], x1 = x[i + 1];
    x[i] = static_cast<float>(x0 * c - x1 * s);
    x[i + 1] = static_cast<float>(x0 * s + x1 * c);
  }
}

}  // namespace

void MlaAttentionBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws, std::span<const SeqSpan> seqs) {
  const ModelConfig& c = model.config();
  const LayerWeights& L = model.layers()[il];
  const MlaWeights& w = L.mla;
  const int64_t T = n_tokens, d = c.n_embd, H = c.n_head, hd = c.head_dim, nope = c.qk_nope, rope = c.qk_rope,
                vd = c.v_head_dim, r = c.kv_lora_rank, ckv_ld = r + rope, qd = H * hd;

  const kernels::WeightView& wq_in = c.q_lora_rank > 0 ? w.wq_a : w.wq;
  const BlockQ8A* xq = NormAndQuantize(ws->x.get(), L.attn_norm, T, d, c.rms_eps,
                                       IsQuantized(wq_in.type) || IsQuantized(w.wkv_a.type), ws);
  float* ckv = ws->mla.get();                       // [T x (r + rope)]
  float* kvb = ckv + T * ckv_ld;                    // [T x H*(nope + vd)] (or k_nope | v below)
  float* qa = kvb + T * H * (nope + vd);            // [T x q_lora_rank]
  float* q = ws->q.get();
  // Projections (q, compressed kv).
  AddTime(&ws->attention_time.projections, [&] {
    // The two projections of the normed rows in one GEMM (q's, or q's low-rank half, and kv's).
    const kernels::GemmOut in[] = {
        {.w = &wq_in, .y = c.q_lora_rank > 0 ? qa : q, .ldy = c.q_lora_rank > 0 ? c.q_lora_rank : qd},
        {.w = &w.wkv_a, .y = ckv, .ldy = ckv_ld}};
    kernels::Gemm(in, ws->xn.get(), d, xq, T);
    if (c.q_lora_rank > 0) {
      kernels::RmsNorm(qa, c.q_lora_rank, w.q_a_norm, qa, c.q_lora_rank, T, c.q_lora_rank, c.rms_eps);
      Linear(w.wq_b, qa, c.q_lora_rank, nullptr, T, q, qd);
    }
  });
  kernels::RmsNorm(ckv, ckv_ld, w.kv_a_norm, ckv, ckv_ld, T, r, c.rms_eps);
  // Decompression: per head, k_nope then v (ld_kv floats per token, head stride nope + vd), or
  // k_nope [T x H*nope] and v [T x H*vd] in two blocks.
  const float* k_nope;
  const float* v_src;
  int64_t k_ld, k_hs, v_ld, v_hs;
  if (c.kv_b_split) {
    float* kn = kvb;
    float* vv = kvb + T * H * nope;
    const kernels::GemmOut kv[] = {{.w = &w.wk_b, .y = kn, .ldy = H * nope}, {.w = &w.wv_b, .y = vv, .ldy = H * vd}};
    AddTime(&ws->attention_time.projections, [&] { kernels::Gemm(kv, ckv, ckv_ld, nullptr, T); });
    k_nope = kn, k_ld = H * nope, k_hs = nope;
    v_src = vv, v_ld = H * vd, v_hs = vd;
  } else {
    AddTime(&ws->attention_time.projections, [&] { Linear(w.wkv_b, ckv, ckv_ld, nullptr, T, kvb, H * (nope + vd)); });
    k_nope = kvb, k_ld = H * (nope + vd), k_hs = nope + vd;
    v_src = kvb + nope, v_ld = k_ld, v_hs = nope + vd;
  }

  // RoPE on q's rope dims and on k_pe; then K = (k_nope, k_pe) per head and V padded to hd.
  // Row t is at position pos[t] of its sequence (SeqSpan: a continuation continues its context).
  const SeqSpan whole{.row = 0, .len = T};
  if (seqs.empty()) seqs = std::span<const SeqSpan>(&whole, 1);
  std::vector<int64_t> pos(static_cast<size_t>(T));
  int64_t n_pos = 0;
  for (const SeqSpan& s : seqs) {
    for (int64_t i = 0; i < s.len; ++i) pos[s.row + i] = s.ctx_len + i;
    n_pos = std::max(n_pos, s.ctx_len + s.len);
  }
  std::vector<double> cs(static_cast<size_t>(n_pos * rope));
  MlaRopeTable(c, n_pos, cs.data());
  float* k = ws->k.get();
  float* v = ws->v.get();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const double* row = cs.data() + pos[t] * rope;
    float* kpe = ckv + t * ckv_ld + r;
    RotateNorm(kpe, row, static_cast<int>(rope));
    for (int64_t h = 0; h < H; ++h) {
      RotateNorm(q + t * qd + h * hd + nope, row, static_cast<int>(rope));
      float* kh = k + t * qd + h * hd;
      std::memcpy(kh, k_nope + t * k_ld + h * k_hs, nope * sizeof(float));
      std::memcpy(kh + nope, kpe, rope * sizeof(float));
      float* vh = v + t * qd + h * hd;
      std::memcpy(vh, v_src + t * v_ld + h * v_hs, vd * sizeof(float));
      std::fill(vh + vd, vh + hd, 0.0f);
    }
  }

  kernels::AttentionArgs a;
  a.n_head = static_cast<int>(H);
  a.n_head_kv = static_cast<int>(H);
  a.head_dim = static_cast<int>(hd);
  a.scale = c.attn_scale;
  a.q = q;
  a.ldq = qd;
  a.k = k;
  a.ldk = qd;
  a.v = v;
  a.ldv = qd;
  a.out = ws->att.get();
  a.ldo = qd;
  a.allow_bf16 = IsQuantized(wq_in.type) && IsQuantized(w.wkv_a.type) && IsQuantized(L.wo.type);
  AttendSequences(a, seqs, ws);

  // Drop the padding: head h's vd outputs move to h * vd (left shifts, so in increasing h).
  float* att = ws->att.get();
  if (vd != hd) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 1; h < H; ++h) std::memmove(att + t * qd + h * vd, att + t * qd + h * hd, vd * sizeof(float));
  }
  AddTime(&ws->attention_time.projections, [&] { LinearAdd(L.wo, att, qd, nullptr, T, ws->x.get(), d); });
}

}  // namespace estream::model
