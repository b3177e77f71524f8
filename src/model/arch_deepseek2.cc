// DeepSeek-V2 / V2-Lite (deepseek-ai/DeepSeek-V2-Lite; GGUF architecture "deepseek2"), as
// llama.cpp reads it (src/models/deepseek2.cpp and the deepseek2 hyper-parameters and tensors of
// src/llama-model.cpp).
//
// Per layer (pre-norm):
//   h    = RMSNorm(x) * attn_norm
//   x   += MLA(h) (mla.h: multi-head latent attention with a decoupled RoPE key, YaRN)
//   h    = RMSNorm(x) * ffn_norm
//   blocks il < leading_dense_block_count (the first one of V2-Lite):
//   x   += down(silu(gate h) * up h)            (ffn_gate/ffn_up/ffn_down, feed_forward_length)
//   the others (MoE):
//   p    = softmax(h Wr^T) (expert_gating_func 1; 2 = sigmoid for later checkpoints), top-k of
//          p + exp_probs_b when that bias exists (selection only); the k weights are p of the
//          chosen, divided by their sum if expert_weights_norm, times expert_weights_scale
//          (V2-Lite: no norm, scale 1)
//   x   += sum_k w_k expert_k(h) + shared(h)    (shared: ffn_*_shexp, expert_shared_count
//          experts merged into one FFN of n_ff_expert * expert_shared_count)
// then RMSNorm(x) * output_norm and the LM head `output`.
// RoPE NORM (adjacent pairs rotate together) on the qk_rope part of q and k only.
#include "model/arch.h"

namespace estream::model {

const ArchTraits& Deepseek2Arch() {
  static const ArchTraits kTraits{
      .gguf_name = "deepseek2",
      .family = "DeepSeek-V2",
      .qk_norm = QkNorm::kNone,
      .rope_mode = kernels::RopeMode::kNorm,
      .renormalize_routes = false,
      .per_expert_tensors = false,
      .attention = AttentionKind::kMla,
      .moe_extensions = true,
  };
  return kTraits;
}

}  // namespace estream::model
