// Multi-head latent attention (DeepSeek-V2; ArchTraits::attention == kMla), computed in its
// decompressed form: every head gets its own key and value, and the existing causal attention
// kernel runs on them.
//
// Shapes: T tokens, d = n_embd, H = n_head, r = kv_lora_rank, nope = qk_nope, rope = qk_rope,
// hd = nope + rope (= head_dim), vd = v_head_dim <= hd.
//   h        = RMSNorm(x) * attn_norm                                       [T x d]
//   q        = attn_q h, or attn_q_b(RMSNorm(attn_q_a h) * attn_q_a_norm)    [T x H*hd]
//   c, k_pe  = attn_kv_a_mqa h                                              [T x (r + rope)]
//   c        = RMSNorm(c) * attn_kv_a_norm                                  [T x r]
//   k_nope, v = attn_kv_b c (per head: nope k rows, vd v rows), or attn_k_b^T c and attn_v_b c
//   q[h][nope..hd), k_pe = RoPE NORM (adjacent pairs) with YaRN over the rope dims, k_pe shared
//            by all heads: k[h] = (k_nope[h], k_pe)
//   o[h]     = softmax(attn_scale q[h] k[h]^T, causal) v[h]                 [T x H*vd]
//   x       += attn_output o
// The kernel needs v as wide as k: v is padded with zeros to hd (the padding's outputs are zero
// and dropped). attn_scale = mscale^2 / sqrt(hd) (ModelConfig, as llama.cpp computes it).
//
// YaRN (rope.scaling.type = yarn, factor f, original context n0, beta_fast / beta_slow), for pair
// i of the rope dims: theta_e = pos * base^(-2i/rope) (extrapolated), theta_i = theta_e / f
// (interpolated), ramp(i) = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1) with
// lo = max(0, floor(dim(beta_fast))), hi = min(rope - 1, ceil(dim(beta_slow))),
// dim(b) = rope * ln(n0 / (2 pi b)) / (2 ln base); theta = theta_i (1 - ramp) + theta_e ramp;
// the rotated values are multiplied by yarn_rope_mscale. All in fp64 (ggml's rope in fp32).
//
// Memory: Workspace::mla holds T x MlaScratchFloats(c) floats; q/k/v/att are T x H*hd.
#pragma once

#include <cstdint>

#include "model/model.h"

namespace estream::model {

class Workspace;

// Floats per token of the MLA scratch (0 for other attention kinds).
int64_t MlaScratchFloats(const ModelConfig& c);

// x += MLA(RMSNorm(x)) for layer il. REQUIRES: c.arch->attention == kMla, Workspace reserved.
void MlaAttentionBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws);

// cos/sin of the rope dims for positions [0, n_tokens): cs[t * rope + 2i] = cos, [.. + 2i + 1]
// = sin of pair i, magnitude yarn_rope_mscale included (YaRN when c.yarn_factor > 1).
void MlaRopeTable(const ModelConfig& c, int64_t n_tokens, double* cs);

}  // namespace estream::model
