// Naive fp64 forward pass of LFM2-MoE (GGUF architecture "lfm2moe"), the lfm2moe branch of
// RefForward (ref_forward.h). Written from the architecture's definition (Liquid's LFM2 /
// LFM2-MoE as llama.cpp reads it), independently of src/model:
//
//   x = token_embd[tokens]
//   per layer il (pre-norm, residual):
//     h = RMSNorm(x) * attn_norm
//     conv layer (attention.head_count_kv[il] == 0):
//       [B | C | xs] = h in_proj^T (3 x n_embd)
//       y[t][c] = C[t][c] * sum_{j<L} conv[c][j] * B[t-L+1+j][c] * xs[t-L+1+j][c]   (zero before 0)
//       x += y out_proj^T
//     attention layer: GQA with head_count_kv[il] kv heads, per-head q/k RMSNorm, RoPE NEOX,
//       scale 1/sqrt(head_dim); x += att wo^T
//     h = RMSNorm(x) * ffn_norm
//     il < leading_dense_block_count: x += down(silu(gate h) * up h)       (feed_forward_length)
//     else: s = sigmoid(h router^T); experts chosen by top-k of s + exp_probs_b (the bias only
//       selects); weights s_e / sum of the chosen s; x += sum_e w_e down_e(silu(gate_e h) * up_e h)
//   logits = (RMSNorm(x) * token_embd_norm) output^T, output = token_embd when absent (tied).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "ref/ref_forward.h"
#include "ref/ref_math.h"

namespace estream::ref {
namespace {

using Vec = std::vector<double>;

Result<Vec> Get(const GgufFile& f, const std::string& name, std::vector<int64_t> shape) {
  return ReadTensor(f, name, shape);
}

void RmsNorm(double* x, const double* w, int64_t n, double eps) { RmsNormInPlace(x, w, n, eps); }
void RopeNeox(double* x, int hd, int pos, double base) { RotateHead(x, hd, pos, base, /*neox=*/true); }

Result<int64_t> IntOf(const GgufValue& v) {
  switch (v.type) {
    case GgufType::kU8: case GgufType::kU16: case GgufType::kU32: case GgufType::kU64: return static_cast<int64_t>(v.u);
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64: return v.i;
    default: return Status::Corruption("ref: not an integer");
  }
}

}  // namespace

Result<RefOutputs> RefForwardLfm2moe(const GgufFile& f, const std::vector<int32_t>& tokens, const RefOptions& options) {
  const std::string a = "lfm2moe.";
  auto u32 = [&](const char* k) { return f.GetU32(a + k); };
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_layer, u32("block_count"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t d, u32("embedding_length"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_head, u32("attention.head_count"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_exp, u32("expert_count"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t k_used, u32("expert_used_count"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t ff, u32("feed_forward_length"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t ffe, u32("expert_feed_forward_length"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_dense, f.GetU32Or(a + "leading_dense_block_count", 0));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t L, u32("shortconv.l_cache"));
  ESTREAM_ASSIGN_OR_RETURN(const float eps_f, f.GetF32(a + "attention.layer_norm_rms_epsilon"));
  ESTREAM_ASSIGN_OR_RETURN(const float base_f, f.GetF32Or(a + "rope.freq_base", 10000.0f));
  const GgufValue* kv_v = f.Find(a + "attention.head_count_kv");
  if (!kv_v) return Status::Corruption("ref: missing head_count_kv");
  std::vector<int64_t> n_kv(n_layer);
  for (uint32_t il = 0; il < n_layer; ++il) {
    const GgufValue& v = kv_v->type == GgufType::kArray ? kv_v->array.at(il) : *kv_v;
    ESTREAM_ASSIGN_OR_RETURN(n_kv[il], IntOf(v));
  }
  const double eps = eps_f, base = base_f;
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t hd = d / n_head;

  const GgufTensorInfo* emb_info = f.FindTensor("token_embd.weight");
  if (!emb_info) return Status::Corruption("ref: missing token_embd.weight");
  const int64_t V = emb_info->ne(1);
  ESTREAM_ASSIGN_OR_RETURN(Vec emb, Get(f, "token_embd.weight", {d, V}));

  RefOutputs out;
  out.n_tokens = static_cast<int>(T);
  out.n_vocab = static_cast<int>(V);
  out.n_embd = static_cast<int>(d);
  out.n_layer = static_cast<int>(n_layer);
  out.n_expert_used = static_cast<int>(k_used);
  out.router_gap.assign(T * n_layer, 1e30);  // dense layers: no routing decision
  out.routing.assign(int64_t{n_layer} * T * k_used, -1);
  out.route_deficit.assign(T * n_layer, 0.0);
  if (options.routing && options.routing->size() != out.routing.size())
    return Status::InvalidArgument("ref: forced routing has the wrong size");

  Vec x(T * d);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i) x[t * d + i] = emb[int64_t{tokens[t]} * d + i];

  for (uint32_t il = 0; il < n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    ESTREAM_ASSIGN_OR_RETURN(Vec attn_norm, Get(f, p + "attn_norm.weight", {d}));
    Vec hn(T * d);
    for (int64_t t = 0; t < T; ++t) {
      std::copy(x.begin() + t * d, x.begin() + (t + 1) * d, hn.begin() + t * d);
      RmsNorm(&hn[t * d], attn_norm.data(), d, eps);
    }
    Vec mix(T * d, 0.0);  // the operator's output, before the residual add
    if (n_kv[il] == 0) {
      ESTREAM_ASSIGN_OR_RETURN(Vec in_proj, Get(f, p + "shortconv.in_proj.weight", {d, 3 * int64_t{d}}));
      ESTREAM_ASSIGN_OR_RETURN(Vec conv, Get(f, p + "shortconv.conv.weight", {L, d}));  // [c][j]
      ESTREAM_ASSIGN_OR_RETURN(Vec out_proj, Get(f, p + "shortconv.out_proj.weight", {d, d}));
      Vec bcx(T * 3 * d);
      for (int64_t t = 0; t < T; ++t) MatVec(in_proj, &hn[t * d], d, 3 * d, &bcx[t * 3 * d]);
      Vec y(d);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < L; ++j) {
            const int64_t s = t - (L - 1) + j;
            if (s >= 0) acc += conv[c * L + j] * bcx[s * 3 * d + c] * bcx[s * 3 * d + 2 * d + c];
          }
          y[c] = bcx[t * 3 * d + d + c] * acc;
        }
        MatVec(out_proj, y.data(), d, d, &mix[t * d]);
      }
    } else {
      const int64_t kv = n_kv[il], kvd = kv * hd, group = n_head / kv;
      ESTREAM_ASSIGN_OR_RETURN(Vec wq, Get(f, p + "attn_q.weight", {d, d}));
      ESTREAM_ASSIGN_OR_RETURN(Vec wk, Get(f, p + "attn_k.weight", {d, kvd}));
      ESTREAM_ASSIGN_OR_RETURN(Vec wv, Get(f, p + "attn_v.weight", {d, kvd}));
      ESTREAM_ASSIGN_OR_RETURN(Vec wo, Get(f, p + "attn_output.weight", {d, d}));
      ESTREAM_ASSIGN_OR_RETURN(Vec qn, Get(f, p + "attn_q_norm.weight", {hd}));
      ESTREAM_ASSIGN_OR_RETURN(Vec kn, Get(f, p + "attn_k_norm.weight", {hd}));
      Vec Q(T * d), K(T * kvd), Vv(T * kvd);
      for (int64_t t = 0; t < T; ++t) {
        MatVec(wq, &hn[t * d], d, d, &Q[t * d]);
        MatVec(wk, &hn[t * d], d, kvd, &K[t * kvd]);
        MatVec(wv, &hn[t * d], d, kvd, &Vv[t * kvd]);
        for (int64_t h = 0; h < n_head; ++h) {
          RmsNorm(&Q[t * d + h * hd], qn.data(), hd, eps);
          RopeNeox(&Q[t * d + h * hd], static_cast<int>(hd), static_cast<int>(t), base);
        }
        for (int64_t h = 0; h < kv; ++h) {
          RmsNorm(&K[t * kvd + h * hd], kn.data(), hd, eps);
          RopeNeox(&K[t * kvd + h * hd], static_cast<int>(hd), static_cast<int>(t), base);
        }
      }
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
      Vec att(d);
      for (int64_t t = 0; t < T; ++t) {
        std::fill(att.begin(), att.end(), 0.0);
        for (int64_t h = 0; h < n_head; ++h) {
          const int64_t kh = h / group;
          Vec s(t + 1);
          double mx = -1e300;
          for (int64_t u = 0; u <= t; ++u) {
            double dot = 0;
            for (int64_t i = 0; i < hd; ++i) dot += Q[t * d + h * hd + i] * K[u * kvd + kh * hd + i];
            mx = std::max(mx, s[u] = dot * scale);
          }
          double z = 0;
          for (int64_t u = 0; u <= t; ++u) z += (s[u] = std::exp(s[u] - mx));
          for (int64_t u = 0; u <= t; ++u)
            for (int64_t i = 0; i < hd; ++i) att[h * hd + i] += s[u] / z * Vv[u * kvd + kh * hd + i];
        }
        MatVec(wo, att.data(), d, d, &mix[t * d]);
      }
    }
    for (int64_t i = 0; i < T * d; ++i) x[i] += mix[i];

    ESTREAM_ASSIGN_OR_RETURN(Vec ffn_norm, Get(f, p + "ffn_norm.weight", {d}));
    if (il < n_dense) {
      ESTREAM_ASSIGN_OR_RETURN(Vec gate, Get(f, p + "ffn_gate.weight", {d, ff}));
      ESTREAM_ASSIGN_OR_RETURN(Vec up, Get(f, p + "ffn_up.weight", {d, ff}));
      ESTREAM_ASSIGN_OR_RETURN(Vec down, Get(f, p + "ffn_down.weight", {ff, d}));
      Vec h(d), g(ff), u(ff), dn(d);
      for (int64_t t = 0; t < T; ++t) {
        std::copy(x.begin() + t * d, x.begin() + (t + 1) * d, h.begin());
        RmsNorm(h.data(), ffn_norm.data(), d, eps);
        MatVec(gate, h.data(), d, ff, g.data());
        MatVec(up, h.data(), d, ff, u.data());
        for (uint32_t i = 0; i < ff; ++i) g[i] = Silu(g[i]) * u[i];
        MatVec(down, g.data(), ff, d, dn.data());
        for (int64_t i = 0; i < d; ++i) x[t * d + i] += dn[i];
      }
      continue;
    }
    ESTREAM_ASSIGN_OR_RETURN(Vec router, Get(f, p + "ffn_gate_inp.weight", {d, n_exp}));
    ESTREAM_ASSIGN_OR_RETURN(Vec bias, Get(f, p + "exp_probs_b.bias", {n_exp}));
    ESTREAM_ASSIGN_OR_RETURN(Vec gate, Get(f, p + "ffn_gate_exps.weight", {d, ffe, n_exp}));
    ESTREAM_ASSIGN_OR_RETURN(Vec up, Get(f, p + "ffn_up_exps.weight", {d, ffe, n_exp}));
    ESTREAM_ASSIGN_OR_RETURN(Vec down, Get(f, p + "ffn_down_exps.weight", {ffe, d, n_exp}));
    Vec h(d), logit(n_exp), score(n_exp), sel(n_exp), g(ffe), u(ffe), dn(d), moe(d);
    for (int64_t t = 0; t < T; ++t) {
      std::copy(x.begin() + t * d, x.begin() + (t + 1) * d, h.begin());
      RmsNorm(h.data(), ffn_norm.data(), d, eps);
      MatVec(router, h.data(), d, n_exp, logit.data());
      for (uint32_t e = 0; e < n_exp; ++e) {
        score[e] = 1.0 / (1.0 + std::exp(-logit[e]));
        sel[e] = score[e] + bias[e];
      }
      std::vector<int> order(n_exp);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int p1, int p2) { return sel[p1] > sel[p2]; });
      // The margin in selection-score units (what a perturbation must move to change the set).
      out.router_gap[t * n_layer + il] = k_used < n_exp ? sel[order[k_used - 1]] - sel[order[k_used]] : 1e30;
      for (uint32_t j = 0; j < k_used; ++j) out.routing[(int64_t{il} * T + t) * k_used + j] = order[j];
      if (options.routing) {
        double weakest = 1e300;
        for (uint32_t j = 0; j < k_used; ++j) {
          const int32_t e = (*options.routing)[(int64_t{il} * T + t) * k_used + j];
          if (e < 0 || e >= static_cast<int32_t>(n_exp)) return Status::InvalidArgument("ref: forced expert id");
          order[j] = e;
          weakest = std::min(weakest, sel[e]);
        }
        out.route_deficit[t * n_layer + il] =
            std::max(0.0, sel[out.routing[(int64_t{il} * T + t) * k_used + k_used - 1]] - weakest);
      }
      double wsum = 0;
      for (uint32_t j = 0; j < k_used; ++j) wsum += score[order[j]];
      std::fill(moe.begin(), moe.end(), 0.0);
      for (uint32_t j = 0; j < k_used; ++j) {
        const int e = order[j];
        MatVec(gate, h.data(), d, ffe, g.data(), int64_t{e} * ffe * d);
        MatVec(up, h.data(), d, ffe, u.data(), int64_t{e} * ffe * d);
        for (uint32_t i = 0; i < ffe; ++i) g[i] = Silu(g[i]) * u[i];
        MatVec(down, g.data(), ffe, d, dn.data(), int64_t{e} * d * ffe);
        for (int64_t i = 0; i < d; ++i) moe[i] += score[e] / wsum * dn[i];
      }
      for (int64_t i = 0; i < d; ++i) x[t * d + i] += moe[i];
    }
  }

  ESTREAM_ASSIGN_OR_RETURN(Vec out_norm, Get(f, "token_embd_norm.weight", {d}));
  Vec head;
  if (f.FindTensor("output.weight")) {
    ESTREAM_ASSIGN_OR_RETURN(head, Get(f, "output.weight", {d, V}));
  } else {
    head = emb;
  }
  out.hidden.resize(T * d);
  out.logits.resize(T * V);
  for (int64_t t = 0; t < T; ++t) {
    double* hh = &out.hidden[t * d];
    std::copy(x.begin() + t * d, x.begin() + (t + 1) * d, hh);
    RmsNorm(hh, out_norm.data(), d, eps);
    MatVec(head, hh, d, V, &out.logits[t * V]);
  }
  return out;
}

}  // namespace estream::ref
