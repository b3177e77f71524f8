// Naive fp64 forward pass (see ref_forward.h). Deliberately plain: one function per step, loops
// over explicit indices, everything in double.
#include "ref/ref_forward.h"
#include "ref/ref_math.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "gguf/gguf.h"
#include "quant/quant.h"

namespace estream::ref {
namespace {

using Vec = std::vector<double>;

struct Tensor {
  std::vector<int64_t> shape;  // fastest first
  Vec data;
};

class Weights {
 public:
  explicit Weights(const GgufFile& f) : f_(f) {}

  // The whole tensor as doubles; Corruption if it is missing or not of `shape`.
  Result<Vec> Get(const std::string& name, std::vector<int64_t> shape) const { return ReadTensor(f_, name, shape); }
  bool Has(const std::string& name) const { return f_.FindTensor(name) != nullptr; }

 private:
  const GgufFile& f_;
};


}  // namespace

Result<RefOutputs> RefForward(const std::string& path, const std::vector<int32_t>& tokens,
                              const RefOptions& options) {
  ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  const GgufFile& f = *file;
  ESTREAM_ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
  if (arch == "deepseek2") return RefForwardDeepseek2(f, tokens, options);
  if (arch == "lfm2moe") return RefForwardLfm2moe(f, tokens, options);
  const bool olmoe = arch == "olmoe", qwen = arch == "qwen3moe", llama = arch == "llama";
  if (!olmoe && !qwen && !llama) return Status::NotSupported("ref: architecture " + arch);
  auto u32 = [&](const char* k) { return f.GetU32(arch + "." + k); };

  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_layer, u32("block_count"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t d, u32("embedding_length"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_head, u32("attention.head_count"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_kv, f.GetU32Or(arch + ".attention.head_count_kv", n_head));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t hd, f.GetU32Or(arch + ".attention.key_length", d / n_head));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_exp, u32("expert_count"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t k_used, u32("expert_used_count"));
  ESTREAM_ASSIGN_OR_RETURN(const float eps_f, f.GetF32(arch + ".attention.layer_norm_rms_epsilon"));
  ESTREAM_ASSIGN_OR_RETURN(const float base_f, f.GetF32Or(arch + ".rope.freq_base", 10000.0f));
  uint32_t ff = 0;
  if (f.Find(arch + ".expert_feed_forward_length")) {
    ESTREAM_ASSIGN_OR_RETURN(ff, u32("expert_feed_forward_length"));
  } else {
    ESTREAM_ASSIGN_OR_RETURN(ff, u32("feed_forward_length"));
  }
  const double eps = eps_f, base = base_f;
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t qd = int64_t{n_head} * hd, kvd = int64_t{n_kv} * hd;
  const int64_t group = n_head / n_kv;
  const bool neox = !llama;
  const bool renorm = !olmoe;

  Weights W(f);
  const GgufTensorInfo* emb_info = f.FindTensor("token_embd.weight");
  if (!emb_info) return Status::Corruption("ref: missing token_embd.weight");
  const int64_t V = emb_info->ne(1);
  ESTREAM_ASSIGN_OR_RETURN(Vec emb, W.Get("token_embd.weight", {d, V}));

  RefOutputs out;
  out.n_tokens = static_cast<int>(T);
  out.n_vocab = static_cast<int>(V);
  out.n_embd = static_cast<int>(d);
  out.n_layer = static_cast<int>(n_layer);
  out.n_expert_used = static_cast<int>(k_used);
  out.router_gap.assign(T * n_layer, 0.0);
  out.routing.assign(int64_t{n_layer} * T * k_used, -1);
  out.route_deficit.assign(T * n_layer, 0.0);
  if (options.routing && options.routing->size() != out.routing.size())
    return Status::InvalidArgument("ref: forced routing has the wrong size");

  // Residual stream x[t][i].
  Vec x(T * d);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i) x[t * d + i] = emb[int64_t{tokens[t]} * d + i];

  for (uint32_t il = 0; il < n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    // ---- attention ----
    ESTREAM_ASSIGN_OR_RETURN(Vec attn_norm, W.Get(p + "attn_norm.weight", {d}));
    ESTREAM_ASSIGN_OR_RETURN(Vec wq, W.Get(p + "attn_q.weight", {d, qd}));
    ESTREAM_ASSIGN_OR_RETURN(Vec wk, W.Get(p + "attn_k.weight", {d, kvd}));
    ESTREAM_ASSIGN_OR_RETURN(Vec wv, W.Get(p + "attn_v.weight", {d, kvd}));
    ESTREAM_ASSIGN_OR_RETURN(Vec wo, W.Get(p + "attn_output.weight", {qd, d}));
    Vec qn, kn;
    if (olmoe) {
      ESTREAM_ASSIGN_OR_RETURN(qn, W.Get(p + "attn_q_norm.weight", {qd}));
      ESTREAM_ASSIGN_OR_RETURN(kn, W.Get(p + "attn_k_norm.weight", {kvd}));
    } else if (qwen) {
      ESTREAM_ASSIGN_OR_RETURN(qn, W.Get(p + "attn_q_norm.weight", {hd}));
      ESTREAM_ASSIGN_OR_RETURN(kn, W.Get(p + "attn_k_norm.weight", {hd}));
    }
    Vec Q(T * qd), K(T * kvd), Vv(T * kvd);
    for (int64_t t = 0; t < T; ++t) {
      Vec h(x.begin() + t * d, x.begin() + (t + 1) * d);
      RmsNormInPlace(h.data(), attn_norm.data(), d, eps);
      MatVec(wq, h.data(), d, qd, &Q[t * qd]);
      MatVec(wk, h.data(), d, kvd, &K[t * kvd]);
      MatVec(wv, h.data(), d, kvd, &Vv[t * kvd]);
      if (olmoe) {
        RmsNormInPlace(&Q[t * qd], qn.data(), qd, eps);
        RmsNormInPlace(&K[t * kvd], kn.data(), kvd, eps);
      } else if (qwen) {
        for (uint32_t h2 = 0; h2 < n_head; ++h2) RmsNormInPlace(&Q[t * qd + h2 * hd], qn.data(), hd, eps);
        for (uint32_t h2 = 0; h2 < n_kv; ++h2) RmsNormInPlace(&K[t * kvd + h2 * hd], kn.data(), hd, eps);
      }
      for (uint32_t h2 = 0; h2 < n_head; ++h2) RotateHead(&Q[t * qd + h2 * hd], hd, static_cast<int>(t), base, neox);
      for (uint32_t h2 = 0; h2 < n_kv; ++h2) RotateHead(&K[t * kvd + h2 * hd], hd, static_cast<int>(t), base, neox);
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    Vec att(T * qd, 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (uint32_t h2 = 0; h2 < n_head; ++h2) {
        const int64_t kvh = h2 / group;
        Vec s(t + 1);
        double mx = -1e300;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (uint32_t i = 0; i < hd; ++i) dot += Q[t * qd + h2 * hd + i] * K[u * kvd + kvh * hd + i];
          s[u] = dot * scale;
          mx = std::max(mx, s[u]);
        }
        double z = 0;
        for (int64_t u = 0; u <= t; ++u) z += (s[u] = std::exp(s[u] - mx));
        for (int64_t u = 0; u <= t; ++u)
          for (uint32_t i = 0; i < hd; ++i) att[t * qd + h2 * hd + i] += s[u] / z * Vv[u * kvd + kvh * hd + i];
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec o(d);
      MatVec(wo, &att[t * qd], qd, d, o.data());
      for (int64_t i = 0; i < d; ++i) x[t * d + i] += o[i];
    }

    // ---- mixture of experts ----
    ESTREAM_ASSIGN_OR_RETURN(Vec ffn_norm, W.Get(p + "ffn_norm.weight", {d}));
    ESTREAM_ASSIGN_OR_RETURN(Vec router, W.Get(p + "ffn_gate_inp.weight", {d, n_exp}));
    Vec gate, up, down;  // [E][ff][d], [E][ff][d], [E][d][ff]
    if (W.Has(p + "ffn_gate_exps.weight")) {
      ESTREAM_ASSIGN_OR_RETURN(gate, W.Get(p + "ffn_gate_exps.weight", {d, ff, n_exp}));
      ESTREAM_ASSIGN_OR_RETURN(up, W.Get(p + "ffn_up_exps.weight", {d, ff, n_exp}));
      ESTREAM_ASSIGN_OR_RETURN(down, W.Get(p + "ffn_down_exps.weight", {ff, d, n_exp}));
    } else {
      for (uint32_t e = 0; e < n_exp; ++e) {
        const std::string s = "." + std::to_string(e) + ".weight";
        ESTREAM_ASSIGN_OR_RETURN(Vec g, W.Get(p + "ffn_gate" + s, {d, ff}));
        ESTREAM_ASSIGN_OR_RETURN(Vec u, W.Get(p + "ffn_up" + s, {d, ff}));
        ESTREAM_ASSIGN_OR_RETURN(Vec dn, W.Get(p + "ffn_down" + s, {ff, d}));
        gate.insert(gate.end(), g.begin(), g.end());
        up.insert(up.end(), u.begin(), u.end());
        down.insert(down.end(), dn.begin(), dn.end());
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec h(x.begin() + t * d, x.begin() + (t + 1) * d);
      RmsNormInPlace(h.data(), ffn_norm.data(), d, eps);
      Vec logit(n_exp);
      MatVec(router, h.data(), d, n_exp, logit.data());
      const double mx = *std::max_element(logit.begin(), logit.end());
      Vec prob(n_exp);
      double z = 0;
      for (uint32_t e = 0; e < n_exp; ++e) z += (prob[e] = std::exp(logit[e] - mx));
      for (uint32_t e = 0; e < n_exp; ++e) prob[e] /= z;
      std::vector<int> order(n_exp);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
      out.router_gap[t * n_layer + il] = k_used < n_exp ? logit[order[k_used - 1]] - logit[order[k_used]] : 1e30;
      for (uint32_t j = 0; j < k_used; ++j) out.routing[(int64_t{il} * T + t) * k_used + j] = order[j];
      if (options.routing) {
        // Use the forced experts; record how far the weakest of them is below our own k-th logit.
        double weakest = 1e300;
        for (uint32_t j = 0; j < k_used; ++j) {
          const int32_t e = (*options.routing)[(int64_t{il} * T + t) * k_used + j];
          if (e < 0 || e >= static_cast<int32_t>(n_exp)) return Status::InvalidArgument("ref: forced expert id");
          order[j] = e;
          weakest = std::min(weakest, logit[e]);
        }
        out.route_deficit[t * n_layer + il] = std::max(0.0, logit[out.routing[(int64_t{il} * T + t) * k_used + k_used - 1]] - weakest);
      }
      double wsum = 0;
      for (uint32_t j = 0; j < k_used; ++j) wsum += prob[order[j]];
      Vec moe(d, 0.0), g(ff), u(ff), dn(d);
      for (uint32_t j = 0; j < k_used; ++j) {
        const int e = order[j];
        const double a = renorm ? prob[e] / wsum : prob[e];
        MatVec(gate, h.data(), d, ff, g.data(), int64_t{e} * ff * d);
        MatVec(up, h.data(), d, ff, u.data(), int64_t{e} * ff * d);
        for (uint32_t i = 0; i < ff; ++i) g[i] = Silu(g[i]) * u[i];
        MatVec(down, g.data(), ff, d, dn.data(), int64_t{e} * d * ff);
        for (int64_t i = 0; i < d; ++i) moe[i] += a * dn[i];
      }
      for (int64_t i = 0; i < d; ++i) x[t * d + i] += moe[i];
    }
  }

  ESTREAM_ASSIGN_OR_RETURN(Vec out_norm, W.Get("output_norm.weight", {d}));
  Vec head;
  if (W.Has("output.weight")) {
    ESTREAM_ASSIGN_OR_RETURN(head, W.Get("output.weight", {d, V}));
  } else {
    head = emb;
  }
  out.hidden.resize(T * d);
  out.logits.resize(T * V);
  for (int64_t t = 0; t < T; ++t) {
    double* h = &out.hidden[t * d];
    std::copy(x.begin() + t * d, x.begin() + (t + 1) * d, h);
    RmsNormInPlace(h, out_norm.data(), d, eps);
    MatVec(head, h, d, V, &out.logits[t * V]);
  }
  return out;
}

}  // namespace estream::ref
