// Llama with experts: Mixtral (mistralai/Mixtral-8x7B; GGUF architecture "llama" with
// llama.expert_count > 0). A plain llama model without experts is refused at load: estream runs
// mixture-of-experts models only.
//
// Block as in OLMoE (arch_olmoe.cc) except:
//   - no q/k norm;
//   - RoPE NORM: adjacent pairs (2i, 2i+1) rotate together (the original llama convention, which
//     GGUF conversion keeps by permuting Wq/Wk rows);
//   - the router renormalises the top-k softmax weights to sum 1 (top-2 of 8 for Mixtral);
//   - expert width is feed_forward_length (there is no separate expert key), and older GGUF files
//     store each expert as its own tensors: blk.N.ffn_gate.E.weight [n_embd, n_ff],
//     blk.N.ffn_up.E.weight [n_embd, n_ff], blk.N.ffn_down.E.weight [n_ff, n_embd], E = 0..n_expert-1,
//     instead of the merged blk.N.ffn_{gate,up,down}_exps.weight.
#include "model/arch.h"

namespace estream::model {

const ArchTraits& LlamaMoeArch() {
  static const ArchTraits kTraits{
      .gguf_name = "llama",
      .family = "Mixtral (llama with experts)",
      .qk_norm = QkNorm::kNone,
      .rope_mode = kernels::RopeMode::kNorm,
      .renormalize_routes = true,
      .per_expert_tensors = true,
  };
  return kTraits;
}

}  // namespace estream::model
