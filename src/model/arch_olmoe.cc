// OLMoE (allenai/OLMoE-1B-7B; GGUF architecture "olmoe").
//
// Per layer (pre-norm):
//   h   = RMSNorm(x) * attn_norm
//   q   = RMSNorm(h Wq^T) * attn_q_norm    -- the norm spans the WHOLE q vector (n_head * head_dim),
//   k   = RMSNorm(h Wk^T) * attn_k_norm       not each head: OLMoE's q_norm/k_norm are LayerNorms
//   v   = h Wv^T                              over the full projection width (here RMS flavour)
//   q,k = RoPE NEOX (dimension i pairs with i + head_dim/2), theta = pos * base^(-2i/head_dim)
//   x  += causal GQA attention(q, k, v) Wo^T, scale 1/sqrt(head_dim)
//   h   = RMSNorm(x) * ffn_norm
//   p   = softmax(h Wr^T) over all experts; the top-k weights are used AS IS (no renormalisation:
//         OLMoE was trained with norm_topk_prob = false, so the k weights sum to less than 1)
//   x  += sum over the k chosen experts of p_e * down_e(silu(gate_e(h)) * up_e(h))
// then RMSNorm(x) * output_norm and the LM head `output` (tied to token_embd when absent).
#include "model/arch.h"

namespace estream::model {

const ArchTraits& OlmoeArch() {
  static const ArchTraits kTraits{
      .gguf_name = "olmoe",
      .family = "OLMoE",
      .qk_norm = QkNorm::kWhole,
      .rope_mode = kernels::RopeMode::kNeox,
      .renormalize_routes = false,
      .per_expert_tensors = false,
  };
  return kTraits;
}

}  // namespace estream::model
