// Model shape presets for `estream synth`: the hyper-parameters of the reference MoE models of
// docs/DESIGN.md section 8 (OLMoE-1B-7B, Qwen3-30B-A3B, Mixtral-8x7B, DeepSeek-V2-Lite, LFM2-8B-A1B) and a
// `tiny` model for tests (`deepseek2-tiny` = `tiny` with --arch deepseek2).
//
// A ModelShape is plain data: everything a synthetic GGUF's tensor shapes and metadata follow
// from. Conventions per architecture (GGUF `general.architecture`):
//   olmoe     q/k RMSNorm over the whole q [n_head*head_dim] and k [n_head_kv*head_dim];
//             router softmax top-k, weights not renormalised; writes expert_feed_forward_length.
//   qwen3moe  q/k RMSNorm per head ([head_dim] weights); router renormalised; writes both
//             feed_forward_length (the dense size of the family) and expert_feed_forward_length.
//   llama     (Mixtral) no q/k norm; router renormalised; feed_forward_length is the expert size
//             and there is no expert_feed_forward_length key, as in real Mixtral files.
//   deepseek2 multi-head latent attention (split attn_k_b / attn_v_b, as newer converters write),
//             YaRN, leading dense blocks, shared experts; router softmax, not renormalised.
//   lfm2moe   (LFM2-MoE) conv and attention layers (head_count_kv per layer, 0 = conv), per-head
//             q/k norm, n_layer_dense_lead dense FFN layers of feed_forward_length, sigmoid router with
//             exp_probs_b, renormalised; token_embd_norm as the final norm, LM head tied.
//
// Thread safety: all functions are pure.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace estream::synth {

struct ModelShape {
  std::string preset;        // preset name it came from ("tiny", "olmoe-1b-7b", ...)
  std::string arch;          // GGUF general.architecture: "olmoe", "qwen3moe" or "llama"
  std::string family;        // human name for general.name ("OLMoE-1B-7B")
  int n_layer = 0;           // block_count
  int n_embd = 0;            // embedding_length (d_model)
  int n_head = 0;            // attention.head_count
  int n_head_kv = 0;         // attention.head_count_kv (GQA)
  int head_dim = 0;          // attention.key_length == value_length == rope.dimension_count
  int n_ff = 0;              // feed_forward_length (dense FFN size of the family; llama: expert)
  int n_ff_expert = 0;          // expert_feed_forward_length (d_ff of one expert)
  int n_expert = 0;          // expert_count
  int n_expert_used = 0;     // expert_used_count (top-k)
  int n_vocab = 0;           // vocab_size (rows of token_embd and output)
  int n_ctx = 0;             // context_length
  float rms_eps = 1e-5f;     // attention.layer_norm_rms_epsilon
  float rope_freq_base = 10000.0f;
  // deepseek2 only (multi-head latent attention, model/mla.h; MoE variants, model/ffn.h).
  // head_dim = qk_nope + qk_rope is the per-head q/k width; n_head_kv = n_head.
  int n_layer_dense_lead = 0;  // leading_dense_block_count (a dense FFN of n_ff)
  int n_expert_shared = 0;     // expert_shared_count (one merged FFN of n_ff_expert * this)
  int q_lora_rank = 0;         // 0: attn_q; else attn_q_a / attn_q_a_norm / attn_q_b
  int kv_lora_rank = 0;
  int qk_rope = 0;             // rope.dimension_count
  int v_head_dim = 0;          // value_length_mla
  float yarn_factor = 0;       // rope.scaling.factor (0: no scaling)
  int yarn_orig_ctx = 0;       // rope.scaling.original_context_length
  float yarn_log_mul = 0;      // rope.scaling.yarn_log_multiplier (the GGUF value)
  // lfm2moe (LFM2-MoE): short-convolution layers, dense leading layers, sigmoid routing with an
  // expert bias, tied LM head (arch_lfm2moe.cc); n_layer_dense_lead (above) dense layers. attn_layers: the attention layers of the preset's
  // own depth (pattern_depth); a deeper override continues with every 4th layer (i % 4 == 2).
  int conv_l = 0;            // shortconv.l_cache (0: no conv layers)
  std::vector<int> attn_layers = {};
  int pattern_depth = 0;     // layers the preset's own pattern covers

  bool lfm2() const { return arch == "lfm2moe"; }
  // Whether layer il is a short-convolution layer (lfm2moe only).
  bool conv_layer(int il) const;

  int n_embd_q() const { return n_head * head_dim; }
  int n_embd_kv() const { return n_head_kv * head_dim; }
  bool qk_norm_whole() const { return arch == "olmoe"; }
  bool qk_norm_per_head() const { return arch == "qwen3moe" || arch == "lfm2moe"; }
  // Router weights divided by their sum after top-k (qwen3moe, llama); olmoe uses them raw.
  bool renormalize_routes() const { return arch != "olmoe" && arch != "deepseek2"; }
  bool mla() const { return arch == "deepseek2"; }
  // Whether the expert_feed_forward_length key is written (not by llama/Mixtral files).
  bool has_expert_ff_key() const { return arch != "llama"; }
  // Value of tokenizer.ggml.pre for the built-in BPE (the pre-tokenizer of the family's files).
  std::string tokenizer_pre() const;

  // Internal consistency: positive sizes, top-k <= experts, head counts dividing, row lengths
  // multiples of 32 (every supported weight type's block). InvalidArgument naming the field.
  Status Validate() const;
};

// "olmoe, qwen3moe, llama, lfm2moe"
std::string SupportedArchNames();
// "tiny, olmoe-1b-7b, qwen3-30b-a3b, mixtral-8x7b, lfm2-8b-a1b"
std::string SupportedPresetNames();
std::vector<std::string> PresetNames();

// The preset `name`. `arch` chooses the architecture of `tiny` (empty: olmoe); for the other
// presets it must be empty or equal to the preset's own. Errors (InvalidArgument) list what is
// supported.
Result<ModelShape> FindPreset(const std::string& name, const std::string& arch = "");

}  // namespace estream::synth
