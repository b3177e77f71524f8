// The architectures estream runs, as data: what differs between OLMoE, Qwen3-MoE and Mixtral is
// small enough to be a handful of flags read by the shared blocks (blocks.h). DeepSeek-V2 adds an
// attention kind (multi-head latent attention, mla.h) and the MoE variants of ffn.h (leading dense
// blocks, shared experts, gating), whose parameters are per-model data (ModelConfig); LFM2 adds
// short-convolution layers (shortconv_block.h). Each architecture's conventions are described,
// with the reasons, in its own file (arch_olmoe.cc, arch_qwen3moe.cc, arch_llama.cc,
// arch_deepseek2.cc, arch_lfm2moe.cc). docs/DESIGN.md section 8 is the summary table.
//
// Thread safety: the traits are immutable statics.
#pragma once

#include <string>
#include <string_view>

#include "kernels/kernels.h"

namespace estream::model {

// Where RMSNorm is applied to queries and keys (after the projection, before RoPE).
enum class QkNorm {
  kNone,     // no q/k norm (llama / Mixtral)
  kWhole,    // over the whole projected vector: q of n_head * head_dim, k of n_head_kv * head_dim
             // (OLMoE); weights attn_q_norm [n_head * head_dim], attn_k_norm [n_head_kv * head_dim]
  kPerHead,  // over each head separately (Qwen3); weights attn_q_norm, attn_k_norm [head_dim]
};

// The attention block of a family.
enum class AttentionKind {
  kGqa,  // q/k/v projections, optional q/k norm, RoPE over the whole head (blocks.cc)
  kMla,  // DeepSeek multi-head latent attention (mla.h)
};

struct ArchTraits {
  const char* gguf_name;  // value of general.architecture, also the metadata key prefix
  const char* family;     // human name for messages ("OLMoE")
  QkNorm qk_norm;
  kernels::RopeMode rope_mode;
  // Router: softmax over all experts, top-k; with `renormalize_routes` the k weights are divided
  // by their sum, otherwise they are used as they come out of the softmax.
  bool renormalize_routes;
  // Whether the older per-expert tensor naming (blk.N.ffn_gate.E.weight, ...) may appear.
  bool per_expert_tensors;
  // The attention block: standard GQA with attn_q/attn_k/attn_v (kGqa), or DeepSeek's
  // multi-head latent attention (kMla, mla.h).
  AttentionKind attention = AttentionKind::kGqa;
  // Whether the family's MoE metadata (leading_dense_block_count, expert_shared_count,
  // expert_gating_func, expert_weights_norm / _scale, exp_probs_b) is read. The three original
  // families never carry it; their routing is the softmax of `renormalize_routes` above.
  bool moe_extensions = false;
  // LFM2: layers are short-convolution or attention blocks, per attention.head_count_kv given per
  // layer (0 = short convolution; arch_lfm2moe.cc, shortconv_block.h).
  bool shortconv = false;
  // The final norm's tensor (LFM2 names it token_embd_norm).
  const char* output_norm_tensor = "output_norm.weight";
};

const ArchTraits& OlmoeArch();
const ArchTraits& Qwen3MoeArch();
const ArchTraits& LlamaMoeArch();
const ArchTraits& Deepseek2Arch();
const ArchTraits& Lfm2MoeArch();

// The traits for a general.architecture value, or nullptr if estream does not run it.
const ArchTraits* FindArch(std::string_view gguf_name);
// "olmoe, qwen3moe, llama, lfm2moe" for error messages.
std::string SupportedArchNames();

}  // namespace estream::model
