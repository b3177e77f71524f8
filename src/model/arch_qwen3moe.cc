// Qwen3-MoE (Qwen/Qwen3-30B-A3B, Qwen3-235B-A22B; GGUF architecture "qwen3moe").
//
// Same block as OLMoE (arch_olmoe.cc) with three differences:
//   - head_dim is its own hyper-parameter (attention.key_length = 128 while n_embd / n_head = 64
//     for the 30B model), so q is n_head * head_dim wide and attn_output maps that back to n_embd;
//   - q/k RMSNorm is applied to each head separately, with one weight vector of head_dim shared by
//     all heads (attn_q_norm, attn_k_norm [head_dim]), before RoPE;
//   - the router renormalises the top-k softmax weights to sum 1 (norm_topk_prob = true).
// RoPE is NEOX (i, i + head_dim/2). The dense feed_forward_length key exists but no layer is dense
// in the MoE checkpoints: the experts' width is expert_feed_forward_length.
#include "model/arch.h"

namespace estream::model {

const ArchTraits& Qwen3MoeArch() {
  static const ArchTraits kTraits{
      .gguf_name = "qwen3moe",
      .family = "Qwen3-MoE",
      .qk_norm = QkNorm::kPerHead,
      .rope_mode = kernels::RopeMode::kNeox,
      .renormalize_routes = true,
      .per_expert_tensors = false,
  };
  return kTraits;
}

}  // namespace estream::model
