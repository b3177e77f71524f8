// Naive fp64 forward pass (see ref_forward.h). Deliberately plain: one function per step, loops
// over explicit indices, everything in double.
#include "ref/ref_forward.h"
#include "ref/ref_math.h"

#include <algorithm>
#include <cmath>

#include "gguf/gguf.h"
#include "quant/quant.h"

namespace estream::ref {

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

  const GgufTensorInfo* emb_info = f.FindTensor("token_embd.weight");
  if (!emb_info) return Status::Corruption("ref: missing token_embd.weight");
  const int64_t V = emb_info->ne(1);
  ESTREAM_ASSIGN_OR_RETURN(Vec emb, ReadTensor(f, "token_embd.weight", {d, V}));

  RefOutputs out;
  ESTREAM_RETURN_IF_ERROR(InitOutputs(T, V, d, n_layer, k_used, 0.0, options, &out));
  Vec x = Embed(emb, tokens, d);  // the residual stream [T][d]

  for (uint32_t il = 0; il < n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    // ---- attention ----
    ESTREAM_ASSIGN_OR_RETURN(Vec attn_norm, ReadTensor(f, p + "attn_norm.weight", {d}));
    ESTREAM_ASSIGN_OR_RETURN(Vec wq, ReadTensor(f, p + "attn_q.weight", {d, qd}));
    ESTREAM_ASSIGN_OR_RETURN(Vec wk, ReadTensor(f, p + "attn_k.weight", {d, kvd}));
    ESTREAM_ASSIGN_OR_RETURN(Vec wv, ReadTensor(f, p + "attn_v.weight", {d, kvd}));
    ESTREAM_ASSIGN_OR_RETURN(Vec wo, ReadTensor(f, p + "attn_output.weight", {qd, d}));
    Vec qn, kn;
    if (olmoe) {
      ESTREAM_ASSIGN_OR_RETURN(qn, ReadTensor(f, p + "attn_q_norm.weight", {qd}));
      ESTREAM_ASSIGN_OR_RETURN(kn, ReadTensor(f, p + "attn_k_norm.weight", {kvd}));
    } else if (qwen) {
      ESTREAM_ASSIGN_OR_RETURN(qn, ReadTensor(f, p + "attn_q_norm.weight", {hd}));
      ESTREAM_ASSIGN_OR_RETURN(kn, ReadTensor(f, p + "attn_k_norm.weight", {hd}));
    }
    Vec Q(T * qd), K(T * kvd), Vv(T * kvd);
    for (int64_t t = 0; t < T; ++t) {
      const Vec h = NormedRow(x, t, d, attn_norm.data(), eps);
      MatVec(wq, h.data(), d, qd, &Q[t * qd]);
      MatVec(wk, h.data(), d, kvd, &K[t * kvd]);
      MatVec(wv, h.data(), d, kvd, &Vv[t * kvd]);
      if (olmoe) {
        RmsNormInPlace(&Q[t * qd], qn.data(), qd, eps);
        RmsNormInPlace(&K[t * kvd], kn.data(), kvd, eps);
      } else if (qwen) {
        NormHeads(&Q[t * qd], n_head, hd, qn.data(), eps);
        NormHeads(&K[t * kvd], n_kv, hd, kn.data(), eps);
      }
      RotateHeads(&Q[t * qd], n_head, hd, static_cast<int>(t), base, neox);
      RotateHeads(&K[t * kvd], n_kv, hd, static_cast<int>(t), base, neox);
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    Vec att(T * qd, 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (uint32_t h2 = 0; h2 < n_head; ++h2) {
        const int64_t kvh = h2 / group;
        CausalHead(&Q[t * qd + h2 * hd], &K[kvh * hd], kvd, &Vv[kvh * hd], kvd, t, hd, hd, scale,
                   &att[t * qd + h2 * hd]);
      }
    Vec o(d);
    for (int64_t t = 0; t < T; ++t) {
      MatVec(wo, &att[t * qd], qd, d, o.data());
      AddInPlace(&x[t * d], o.data(), d);
    }

    // ---- mixture of experts ----
    ESTREAM_ASSIGN_OR_RETURN(Vec ffn_norm, ReadTensor(f, p + "ffn_norm.weight", {d}));
    ESTREAM_ASSIGN_OR_RETURN(Vec router, ReadTensor(f, p + "ffn_gate_inp.weight", {d, n_exp}));
    Vec gate, up, down;  // [E][ff][d], [E][ff][d], [E][d][ff]
    if (f.FindTensor(p + "ffn_gate_exps.weight")) {
      ESTREAM_ASSIGN_OR_RETURN(gate, ReadTensor(f, p + "ffn_gate_exps.weight", {d, ff, n_exp}));
      ESTREAM_ASSIGN_OR_RETURN(up, ReadTensor(f, p + "ffn_up_exps.weight", {d, ff, n_exp}));
      ESTREAM_ASSIGN_OR_RETURN(down, ReadTensor(f, p + "ffn_down_exps.weight", {ff, d, n_exp}));
    } else {
      for (uint32_t e = 0; e < n_exp; ++e) {
        const std::string s = "." + std::to_string(e) + ".weight";
        ESTREAM_ASSIGN_OR_RETURN(Vec g, ReadTensor(f, p + "ffn_gate" + s, {d, ff}));
        ESTREAM_ASSIGN_OR_RETURN(Vec u, ReadTensor(f, p + "ffn_up" + s, {d, ff}));
        ESTREAM_ASSIGN_OR_RETURN(Vec dn, ReadTensor(f, p + "ffn_down" + s, {ff, d}));
        gate.insert(gate.end(), g.begin(), g.end());
        up.insert(up.end(), u.begin(), u.end());
        down.insert(down.end(), dn.begin(), dn.end());
      }
    }
    std::vector<int> order;
    Vec logit(n_exp), moe(d);
    for (int64_t t = 0; t < T; ++t) {
      const Vec h = NormedRow(x, t, d, ffn_norm.data(), eps);
      MatVec(router, h.data(), d, n_exp, logit.data());
      const Vec prob = Softmax(logit);
      // Chosen by probability; margins in logit units (the softmax is monotonic).
      ESTREAM_RETURN_IF_ERROR(ChooseExperts(prob, logit, il, t, options, &out, &order));
      double wsum = 0;
      for (uint32_t j = 0; j < k_used; ++j) wsum += prob[order[j]];
      Vec weight(k_used);
      for (uint32_t j = 0; j < k_used; ++j) weight[j] = renorm ? prob[order[j]] / wsum : prob[order[j]];
      std::fill(moe.begin(), moe.end(), 0.0);
      AddExperts(gate, up, down, h.data(), d, ff, order, weight, moe.data());
      AddInPlace(&x[t * d], moe.data(), d);
    }
  }

  ESTREAM_ASSIGN_OR_RETURN(Vec out_norm, ReadTensor(f, "output_norm.weight", {d}));
  ESTREAM_ASSIGN_OR_RETURN(Vec head, ReadHead(f, emb, d, V));
  OutputHead(x, out_norm, head, eps, &out);
  return out;
}

}  // namespace estream::ref
