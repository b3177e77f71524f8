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

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "ref/ref_forward.h"
#include "ref/ref_math.h"

namespace estream::ref {
namespace {

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
  ESTREAM_ASSIGN_OR_RETURN(Vec emb, ReadTensor(f, "token_embd.weight", {d, V}));

  RefOutputs out;
  // Dense layers keep router_gap = 1e30: no routing decision.
  ESTREAM_RETURN_IF_ERROR(InitOutputs(T, V, d, n_layer, k_used, 1e30, options, &out));
  Vec x = Embed(emb, tokens, d);  // the residual stream [T][d]

  for (uint32_t il = 0; il < n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    ESTREAM_ASSIGN_OR_RETURN(Vec attn_norm, ReadTensor(f, p + "attn_norm.weight", {d}));
    Vec hn(T * d);
    for (int64_t t = 0; t < T; ++t) {
      const Vec h = NormedRow(x, t, d, attn_norm.data(), eps);
      std::copy(h.begin(), h.end(), hn.begin() + t * d);
    }
    Vec mix(T * d, 0.0);  // the operator's output, before the residual add
    if (n_kv[il] == 0) {
      ESTREAM_ASSIGN_OR_RETURN(Vec in_proj, ReadTensor(f, p + "shortconv.in_proj.weight", {d, 3 * int64_t{d}}));
      ESTREAM_ASSIGN_OR_RETURN(Vec conv, ReadTensor(f, p + "shortconv.conv.weight", {L, d}));  // [c][j]
      ESTREAM_ASSIGN_OR_RETURN(Vec out_proj, ReadTensor(f, p + "shortconv.out_proj.weight", {d, d}));
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
      ESTREAM_ASSIGN_OR_RETURN(Vec wq, ReadTensor(f, p + "attn_q.weight", {d, d}));
      ESTREAM_ASSIGN_OR_RETURN(Vec wk, ReadTensor(f, p + "attn_k.weight", {d, kvd}));
      ESTREAM_ASSIGN_OR_RETURN(Vec wv, ReadTensor(f, p + "attn_v.weight", {d, kvd}));
      ESTREAM_ASSIGN_OR_RETURN(Vec wo, ReadTensor(f, p + "attn_output.weight", {d, d}));
      ESTREAM_ASSIGN_OR_RETURN(Vec qn, ReadTensor(f, p + "attn_q_norm.weight", {hd}));
      ESTREAM_ASSIGN_OR_RETURN(Vec kn, ReadTensor(f, p + "attn_k_norm.weight", {hd}));
      Vec Q(T * d), K(T * kvd), Vv(T * kvd);
      for (int64_t t = 0; t < T; ++t) {
        MatVec(wq, &hn[t * d], d, d, &Q[t * d]);
        MatVec(wk, &hn[t * d], d, kvd, &K[t * kvd]);
        MatVec(wv, &hn[t * d], d, kvd, &Vv[t * kvd]);
        NormHeads(&Q[t * d], n_head, hd, qn.data(), eps);
        RotateHeads(&Q[t * d], n_head, static_cast<int>(hd), static_cast<int>(t), base, /*neox=*/true);
        NormHeads(&K[t * kvd], kv, hd, kn.data(), eps);
        RotateHeads(&K[t * kvd], kv, static_cast<int>(hd), static_cast<int>(t), base, /*neox=*/true);
      }
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
      Vec att(d);
      for (int64_t t = 0; t < T; ++t) {
        std::fill(att.begin(), att.end(), 0.0);
        for (int64_t h = 0; h < n_head; ++h) {
          const int64_t kh = h / group;
          CausalHead(&Q[t * d + h * hd], &K[kh * hd], kvd, &Vv[kh * hd], kvd, t, hd, hd, scale, &att[h * hd]);
        }
        MatVec(wo, att.data(), d, d, &mix[t * d]);
      }
    }
    AddInPlace(x.data(), mix.data(), T * d);

    ESTREAM_ASSIGN_OR_RETURN(Vec ffn_norm, ReadTensor(f, p + "ffn_norm.weight", {d}));
    if (il < n_dense) {
      ESTREAM_ASSIGN_OR_RETURN(Vec gate, ReadTensor(f, p + "ffn_gate.weight", {d, ff}));
      ESTREAM_ASSIGN_OR_RETURN(Vec up, ReadTensor(f, p + "ffn_up.weight", {d, ff}));
      ESTREAM_ASSIGN_OR_RETURN(Vec down, ReadTensor(f, p + "ffn_down.weight", {ff, d}));
      Vec y(d);
      for (int64_t t = 0; t < T; ++t) {
        const Vec h = NormedRow(x, t, d, ffn_norm.data(), eps);
        SwiGlu(gate, up, down, h.data(), d, ff, y.data());
        AddInPlace(&x[t * d], y.data(), d);
      }
      continue;
    }
    ESTREAM_ASSIGN_OR_RETURN(Vec router, ReadTensor(f, p + "ffn_gate_inp.weight", {d, n_exp}));
    ESTREAM_ASSIGN_OR_RETURN(Vec bias, ReadTensor(f, p + "exp_probs_b.bias", {n_exp}));
    ESTREAM_ASSIGN_OR_RETURN(Vec gate, ReadTensor(f, p + "ffn_gate_exps.weight", {d, ffe, n_exp}));
    ESTREAM_ASSIGN_OR_RETURN(Vec up, ReadTensor(f, p + "ffn_up_exps.weight", {d, ffe, n_exp}));
    ESTREAM_ASSIGN_OR_RETURN(Vec down, ReadTensor(f, p + "ffn_down_exps.weight", {ffe, d, n_exp}));
    Vec logit(n_exp), score(n_exp), sel(n_exp), moe(d);
    std::vector<int> order;
    for (int64_t t = 0; t < T; ++t) {
      const Vec h = NormedRow(x, t, d, ffn_norm.data(), eps);
      MatVec(router, h.data(), d, n_exp, logit.data());
      for (uint32_t e = 0; e < n_exp; ++e) {
        score[e] = 1.0 / (1.0 + std::exp(-logit[e]));
        sel[e] = score[e] + bias[e];
      }
      // The margin in selection-score units (what a perturbation must move to change the set).
      ESTREAM_RETURN_IF_ERROR(ChooseExperts(sel, sel, il, t, options, &out, &order));
      double wsum = 0;
      for (uint32_t j = 0; j < k_used; ++j) wsum += score[order[j]];
      Vec weight(k_used);
      for (uint32_t j = 0; j < k_used; ++j) weight[j] = score[order[j]] / wsum;
      std::fill(moe.begin(), moe.end(), 0.0);
      AddExperts(gate, up, down, h.data(), d, ffe, order, weight, moe.data());
      AddInPlace(&x[t * d], moe.data(), d);
    }
  }

  ESTREAM_ASSIGN_OR_RETURN(Vec out_norm, ReadTensor(f, "token_embd_norm.weight", {d}));
  ESTREAM_ASSIGN_OR_RETURN(Vec head, ReadHead(f, emb, d, V));
  OutputHead(x, out_norm, head, eps, &out);
  return out;
}

}  // namespace estream::ref
