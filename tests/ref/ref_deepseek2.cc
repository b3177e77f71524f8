// Naive fp64 forward pass of DeepSeek-V2 (GGUF architecture deepseek2), for tests only. Written
// from the architecture's definition (multi-head latent attention with a decoupled RoPE key,
// YaRN, leading dense FFN blocks, routed + shared experts), separately from src/model: only the
// GGUF reader and DequantizeRow are shared. Plain loops, everything in double.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "ref/ref_forward.h"
#include "ref/ref_math.h"

namespace estream::ref {
namespace {

// y[o] = sum_i W[o][i] x[i], W row-major n_out x n_in (GGUF [n_in, n_out]).
Vec Mv(const Vec& w, const double* x, int64_t n_in, int64_t n_out, int64_t off = 0) {
  Vec y(n_out);
  MatVec(w, x, n_in, n_out, y.data(), off);
  return y;
}

}  // namespace

Result<RefOutputs> RefForwardDeepseek2(const GgufFile& f, const std::vector<int32_t>& tokens,
                                       const RefOptions& options) {
  const std::string A = "deepseek2.";
  auto u32 = [&](const char* k) { return f.GetU32(A + k); };
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_layer, u32("block_count"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t d, u32("embedding_length"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t H, u32("attention.head_count"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_exp, u32("expert_count"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t k_used, u32("expert_used_count"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t ff_exp, u32("expert_feed_forward_length"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t ff_dense, f.GetU32Or(A + "feed_forward_length", 0));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_dense, f.GetU32Or(A + "leading_dense_block_count", 0));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t n_shared, f.GetU32Or(A + "expert_shared_count", 0));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t gating, f.GetU32Or(A + "expert_gating_func", 1));
  ESTREAM_ASSIGN_OR_RETURN(const bool wnorm, f.GetBoolOr(A + "expert_weights_norm", false));
  ESTREAM_ASSIGN_OR_RETURN(float wscale, f.GetF32Or(A + "expert_weights_scale", 1.0f));
  if (wscale == 0) wscale = 1;
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t q_lora, f.GetU32Or(A + "attention.q_lora_rank", 0));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t r, u32("attention.kv_lora_rank"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t rope, u32("rope.dimension_count"));
  const bool has_mla_keys = f.Find(A + "attention.key_length_mla") != nullptr;
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t hd, u32(has_mla_keys ? "attention.key_length_mla" : "attention.key_length"));
  ESTREAM_ASSIGN_OR_RETURN(const uint32_t vd,
                           u32(has_mla_keys ? "attention.value_length_mla" : "attention.value_length"));
  ESTREAM_ASSIGN_OR_RETURN(const float eps_f, f.GetF32(A + "attention.layer_norm_rms_epsilon"));
  ESTREAM_ASSIGN_OR_RETURN(const float base_f, f.GetF32Or(A + "rope.freq_base", 10000.0f));
  const double eps = eps_f, base = base_f;
  const uint32_t nope = hd - rope;
  // YaRN.
  double factor = 1, beta_fast = 32, beta_slow = 1, log_mul = 0;
  double n_orig = 0;
  if (const GgufValue* v = f.Find(A + "rope.scaling.type"); v && v->str == "yarn") {
    ESTREAM_ASSIGN_OR_RETURN(const float fa, f.GetF32(A + "rope.scaling.factor"));
    ESTREAM_ASSIGN_OR_RETURN(const uint32_t oc, u32("rope.scaling.original_context_length"));
    ESTREAM_ASSIGN_OR_RETURN(const float bf, f.GetF32Or(A + "rope.scaling.yarn_beta_fast", 32.0f));
    ESTREAM_ASSIGN_OR_RETURN(const float bs, f.GetF32Or(A + "rope.scaling.yarn_beta_slow", 1.0f));
    ESTREAM_ASSIGN_OR_RETURN(const float lm, f.GetF32Or(A + "rope.scaling.yarn_log_multiplier", 0.0f));
    factor = fa, n_orig = oc, beta_fast = bf, beta_slow = bs, log_mul = static_cast<double>(lm) / 0.1;
  }
  // Per rope pair i: angle per position (YaRN-blended), and the magnitude.
  const int half = static_cast<int>(rope / 2);
  Vec freq(half);
  for (int i = 0; i < half; ++i) {
    const double extrap = std::pow(base, -2.0 * i / rope);
    double ramp = 1;
    if (factor > 1) {
      auto corr = [&](double b) { return rope * std::log(n_orig / (b * 2 * std::numbers::pi)) / (2 * std::log(base)); };
      const double lo = std::max(0.0, std::floor(corr(beta_fast)));
      const double hi = std::min(rope - 1.0, std::ceil(corr(beta_slow)));
      ramp = 1 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
    }
    freq[i] = extrap / factor * (1 - ramp) + extrap * ramp;
  }
  const double rope_mag = factor > 1 && log_mul == 0 ? 1 + 0.1 * std::log(factor) : 1.0;
  const double mscale = rope_mag * (1 + 0.1 * log_mul * std::log(factor));
  const double scale = mscale * mscale / std::sqrt(static_cast<double>(hd));

  const GgufTensorInfo* emb_info = f.FindTensor("token_embd.weight");
  if (!emb_info) return Status::Corruption("ref: missing token_embd.weight");
  const int64_t V = emb_info->ne(1), T = static_cast<int64_t>(tokens.size());
  ESTREAM_ASSIGN_OR_RETURN(Vec emb, ReadTensor(f, "token_embd.weight", {d, V}));
  RefOutputs out;
  ESTREAM_RETURN_IF_ERROR(InitOutputs(T, V, d, n_layer, k_used, 1e30, options, &out));
  Vec x = Embed(emb, tokens, d);  // the residual stream [T][d]

  for (uint32_t il = 0; il < n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    ESTREAM_ASSIGN_OR_RETURN(Vec attn_norm, ReadTensor(f, p + "attn_norm.weight", {d}));
    Vec wq, wqa, wqan, wqb;
    if (q_lora > 0) {
      ESTREAM_ASSIGN_OR_RETURN(wqa, ReadTensor(f, p + "attn_q_a.weight", {d, q_lora}));
      ESTREAM_ASSIGN_OR_RETURN(wqan, ReadTensor(f, p + "attn_q_a_norm.weight", {q_lora}));
      ESTREAM_ASSIGN_OR_RETURN(wqb, ReadTensor(f, p + "attn_q_b.weight", {q_lora, H * hd}));
    } else {
      ESTREAM_ASSIGN_OR_RETURN(wq, ReadTensor(f, p + "attn_q.weight", {d, H * hd}));
    }
    ESTREAM_ASSIGN_OR_RETURN(Vec wkva, ReadTensor(f, p + "attn_kv_a_mqa.weight", {d, r + rope}));
    ESTREAM_ASSIGN_OR_RETURN(Vec kvan, ReadTensor(f, p + "attn_kv_a_norm.weight", {r}));
    // Per head h: knope[h][i][c] (nope x r) and vb[h][j][c] (vd x r).
    Vec knope(int64_t{H} * nope * r), vb(int64_t{H} * vd * r);
    if (f.FindTensor(p + "attn_kv_b.weight")) {
      ESTREAM_ASSIGN_OR_RETURN(Vec kvb, ReadTensor(f, p + "attn_kv_b.weight", {r, H * (nope + vd)}));
      for (uint32_t h = 0; h < H; ++h)
        for (uint32_t c = 0; c < r; ++c) {
          for (uint32_t i = 0; i < nope; ++i)
            knope[(int64_t{h} * nope + i) * r + c] = kvb[(int64_t{h} * (nope + vd) + i) * r + c];
          for (uint32_t j = 0; j < vd; ++j)
            vb[(int64_t{h} * vd + j) * r + c] = kvb[(int64_t{h} * (nope + vd) + nope + j) * r + c];
        }
    } else {
      ESTREAM_ASSIGN_OR_RETURN(Vec kb, ReadTensor(f, p + "attn_k_b.weight", {nope, r, H}));  // [h][c][i]
      ESTREAM_ASSIGN_OR_RETURN(vb, ReadTensor(f, p + "attn_v_b.weight", {r, vd, H}));       // [h][j][c]
      for (uint32_t h = 0; h < H; ++h)
        for (uint32_t c = 0; c < r; ++c)
          for (uint32_t i = 0; i < nope; ++i)
            knope[(int64_t{h} * nope + i) * r + c] = kb[(int64_t{h} * r + c) * nope + i];
    }
    ESTREAM_ASSIGN_OR_RETURN(Vec wo, ReadTensor(f, p + "attn_output.weight", {H * vd, d}));

    // q[t][h][hd], k[t][h][hd], v[t][h][vd]
    Vec Q(T * H * hd), K(T * H * hd), Vv(T * H * vd);
    for (int64_t t = 0; t < T; ++t) {
      const Vec h = NormedRow(x, t, d, attn_norm.data(), eps);
      Vec q;
      if (q_lora > 0) {
        Vec qa = Mv(wqa, h.data(), d, q_lora);
        RmsNormInPlace(qa.data(), wqan.data(), q_lora, eps);
        q = Mv(wqb, qa.data(), q_lora, H * hd);
      } else {
        q = Mv(wq, h.data(), d, H * hd);
      }
      Vec kv = Mv(wkva, h.data(), d, r + rope);
      RmsNormInPlace(kv.data(), kvan.data(), r, eps);
      // RoPE (adjacent pairs) on the rope dims of q and of the shared k_pe.
      auto rotate = [&](double* z) {
        for (int i = 0; i < half; ++i) {
          const double th = static_cast<double>(t) * freq[i];
          const double c = std::cos(th) * rope_mag, s = std::sin(th) * rope_mag;
          const double a = z[2 * i], b = z[2 * i + 1];
          z[2 * i] = a * c - b * s;
          z[2 * i + 1] = a * s + b * c;
        }
      };
      rotate(&kv[r]);
      for (uint32_t hh = 0; hh < H; ++hh) {
        double* qh = &Q[(t * H + hh) * hd];
        std::copy(q.begin() + hh * hd, q.begin() + (hh + 1) * hd, qh);
        rotate(qh + nope);
        double* kh = &K[(t * H + hh) * hd];
        Vec kn = Mv(knope, kv.data(), r, nope, int64_t{hh} * nope * r);
        std::copy(kn.begin(), kn.end(), kh);
        std::copy(kv.begin() + r, kv.end(), kh + nope);
        Vec vh = Mv(vb, kv.data(), r, vd, int64_t{hh} * vd * r);
        std::copy(vh.begin(), vh.end(), &Vv[(t * H + hh) * vd]);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec o(int64_t{H} * vd, 0.0);
      for (uint32_t hh = 0; hh < H; ++hh)
        CausalHead(&Q[(t * H + hh) * hd], &K[int64_t{hh} * hd], int64_t{H} * hd, &Vv[int64_t{hh} * vd],
                   int64_t{H} * vd, t, hd, vd, scale, &o[hh * vd]);
      Vec y = Mv(wo, o.data(), int64_t{H} * vd, d);
      AddInPlace(&x[t * d], y.data(), d);
    }

    // ---- FFN: dense, or routed + shared experts ----
    ESTREAM_ASSIGN_OR_RETURN(Vec ffn_norm, ReadTensor(f, p + "ffn_norm.weight", {d}));
    if (il < n_dense) {
      ESTREAM_ASSIGN_OR_RETURN(Vec g, ReadTensor(f, p + "ffn_gate.weight", {d, ff_dense}));
      ESTREAM_ASSIGN_OR_RETURN(Vec u, ReadTensor(f, p + "ffn_up.weight", {d, ff_dense}));
      ESTREAM_ASSIGN_OR_RETURN(Vec dn, ReadTensor(f, p + "ffn_down.weight", {ff_dense, d}));
      Vec y(d);
      for (int64_t t = 0; t < T; ++t) {
        const Vec h = NormedRow(x, t, d, ffn_norm.data(), eps);
        SwiGlu(g, u, dn, h.data(), d, ff_dense, y.data());
        AddInPlace(&x[t * d], y.data(), d);
      }
      continue;
    }
    ESTREAM_ASSIGN_OR_RETURN(Vec router, ReadTensor(f, p + "ffn_gate_inp.weight", {d, n_exp}));
    Vec bias(n_exp, 0.0);
    const bool has_bias = f.FindTensor(p + "exp_probs_b.bias") != nullptr;
    if (has_bias) {
      ESTREAM_ASSIGN_OR_RETURN(bias, ReadTensor(f, p + "exp_probs_b.bias", {n_exp}));
    }
    ESTREAM_ASSIGN_OR_RETURN(Vec gate, ReadTensor(f, p + "ffn_gate_exps.weight", {d, ff_exp, n_exp}));
    ESTREAM_ASSIGN_OR_RETURN(Vec up, ReadTensor(f, p + "ffn_up_exps.weight", {d, ff_exp, n_exp}));
    ESTREAM_ASSIGN_OR_RETURN(Vec down, ReadTensor(f, p + "ffn_down_exps.weight", {ff_exp, d, n_exp}));
    const int64_t ffs = int64_t{ff_exp} * n_shared;
    Vec sg, su, sd;
    if (n_shared > 0) {
      ESTREAM_ASSIGN_OR_RETURN(sg, ReadTensor(f, p + "ffn_gate_shexp.weight", {d, ffs}));
      ESTREAM_ASSIGN_OR_RETURN(su, ReadTensor(f, p + "ffn_up_shexp.weight", {d, ffs}));
      ESTREAM_ASSIGN_OR_RETURN(sd, ReadTensor(f, p + "ffn_down_shexp.weight", {ffs, d}));
    }
    std::vector<int> order;
    Vec moe(d), y(d);
    for (int64_t t = 0; t < T; ++t) {
      const Vec h = NormedRow(x, t, d, ffn_norm.data(), eps);
      Vec logit = Mv(router, h.data(), d, n_exp);
      Vec prob(n_exp);
      if (gating == 2) {
        for (uint32_t e = 0; e < n_exp; ++e) prob[e] = 1 / (1 + std::exp(-logit[e]));
      } else {
        prob = Softmax(logit);
      }
      Vec key(n_exp);
      for (uint32_t e = 0; e < n_exp; ++e) key[e] = prob[e] + bias[e];
      // Margins in logit units for plain softmax (monotonic in the logit); else in key units.
      const Vec& m = gating == 2 || has_bias ? key : logit;
      ESTREAM_RETURN_IF_ERROR(ChooseExperts(key, m, il, t, options, &out, &order));
      double wsum = 0;
      for (uint32_t j = 0; j < k_used; ++j) wsum += prob[order[j]];
      Vec weight(k_used);
      for (uint32_t j = 0; j < k_used; ++j) weight[j] = (wnorm ? prob[order[j]] / wsum : prob[order[j]]) * wscale;
      std::fill(moe.begin(), moe.end(), 0.0);
      AddExperts(gate, up, down, h.data(), d, ff_exp, order, weight, moe.data());
      if (n_shared > 0) {
        SwiGlu(sg, su, sd, h.data(), d, ffs, y.data());
        AddInPlace(moe.data(), y.data(), d);
      }
      AddInPlace(&x[t * d], moe.data(), d);
    }
  }

  ESTREAM_ASSIGN_OR_RETURN(Vec out_norm, ReadTensor(f, "output_norm.weight", {d}));
  ESTREAM_ASSIGN_OR_RETURN(Vec head, ReadHead(f, emb, d, V));
  OutputHead(x, out_norm, head, eps, &out);
  return out;
}

}  // namespace estream::ref
