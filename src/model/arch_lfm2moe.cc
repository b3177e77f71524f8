// LFM2-MoE (LiquidAI/LFM2-8B-A1B; GGUF architecture "lfm2moe", as llama.cpp reads it).
//
// A hybrid: most layers mix tokens with a gated SHORT CONVOLUTION instead of attention.
// The layer pattern is metadata: lfm2moe.attention.head_count_kv is an array with one entry per
// layer, 0 for a short-convolution layer, the kv head count for an attention layer (estream
// requires every attention layer to have the same count). Per layer (pre-norm):
//   h = RMSNorm(x) * attn_norm                       ("operator norm", both kinds of layer)
//   conv layer (shortconv_block.h): [B | C | xs] = h in_proj^T  (blk.N.shortconv.in_proj.weight
//       [n_embd, 3 n_embd]); y = C * causal depthwise conv1d over B * xs of L taps
//       (blk.N.shortconv.conv.weight [L, n_embd], L = lfm2moe.shortconv.l_cache; taps before the
//       first token are zero: a prefill starts from an empty conv state, which dies with the
//       layer like a KV cache); x += y out_proj^T (blk.N.shortconv.out_proj.weight [n_embd, n_embd])
//   attention layer: as Qwen3 (arch_qwen3moe.cc): GQA, per-head q/k RMSNorm [head_dim], RoPE
//       NEOX, scale 1/sqrt(head_dim); q and the output are n_embd wide (head_dim = n_embd / n_head)
//   h = RMSNorm(x) * ffn_norm
//   layers [0, leading_dense_block_count): x += dense SwiGLU FFN (ffn_gate/ffn_up/ffn_down,
//       feed_forward_length)
//   other layers: MoE with SIGMOID scores (expert_gating_func = 2), the experts chosen by the top-k
//       of score + blk.N.exp_probs_b.bias (the bias only selects), weights = chosen scores divided
//       by their sum; experts of expert_feed_forward_length
// then RMSNorm(x) * token_embd_norm (LFM2's final norm has that name) and the LM head, tied to
// token_embd (an `output.weight`, if present, is used).
#include "model/arch.h"

namespace estream::model {

const ArchTraits& Lfm2MoeArch() {
  static const ArchTraits kTraits{
      .gguf_name = "lfm2moe",
      .family = "LFM2-MoE",
      .qk_norm = QkNorm::kPerHead,
      .rope_mode = kernels::RopeMode::kNeox,
      .renormalize_routes = true,
      .per_expert_tensors = false,
      .moe_extensions = true,
      .shortconv = true,
      .output_norm_tensor = "token_embd_norm.weight",
  };
  return kTraits;
}

}  // namespace estream::model
