// A loaded mixture-of-experts model: hyper-parameters read and cross-checked from GGUF metadata,
// and views of every weight tensor (in place in the file's read-only mapping, or repacked into
// the kernels' native layout).
//
// Loading validates everything the forward pass relies on, so the forward pass never has to:
//   - the architecture is one of arch.h's (else NotSupported naming general.architecture);
//   - every hyper-parameter is present or has its documented default, and they agree with each
//     other (heads divide, head_dim consistent with the projections, expert_used <= expert_count,
//     RoPE over the whole head, value width = key width; for multi-head latent attention (mla.h)
//     the ranks and the rope / nope / v widths, and YaRN's parameters; for the MoE variants
//     (ffn.h) the leading dense blocks, shared experts and gating);
//   - every tensor the architecture needs exists with exactly the expected shape (a missing tensor
//     or a wrong shape is a Corruption Status naming the tensor, the expected and the actual
//     shape) and a type the kernels support (NotSupported naming tensor and type).
// Experts come either as merged 3-D tensors blk.N.ffn_{gate,up,down}_exps.weight or, for Mixtral,
// as per-expert 2-D tensors blk.N.ffn_{gate,up,down}.E.weight; both end up as one WeightView per
// expert, so the forward pass does not care.
//
// Ownership: Model owns the GgufFile (and so the mapping) and every buffer the views point into.
// Views stay valid for the life of the Model. Thread safety: immutable after Load; every const
// method may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/memory.h"
#include "base/status.h"
#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "model/arch.h"

namespace estream::model {

// How router logits become expert probabilities.
enum class ExpertGating { kSoftmax, kSigmoid };

struct ModelConfig {
  const ArchTraits* arch = nullptr;
  std::string name;     // general.name (may be empty)
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;       // attention.key_length, default n_embd / n_head
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_expert = 0;    // expert_feed_forward_length, else feed_forward_length
  int n_vocab = 0;        // rows of token_embd
  int n_ctx = 0;          // context_length
  float rms_eps = 0;      // attention.layer_norm_rms_epsilon
  float rope_freq_base = 10000.0f;

  // ---- MoE variants (ArchTraits::moe_extensions; defaults = the original three families) ----
  int n_layer_dense_lead = 0;  // leading_dense_block_count: blocks [0, n) have a dense FFN
  int n_ff = 0;                // feed_forward_length: width of the dense FFN (0 if none)
  int n_expert_shared = 0;     // expert_shared_count: shared experts of every MoE block
  int n_ff_shexp = 0;          // width of the merged shared-expert FFN (n_ff_expert * n_expert_shared)
  ExpertGating gating = ExpertGating::kSoftmax;  // expert_gating_func (1 softmax, 2 sigmoid)
  bool expert_weights_norm = false;  // top-k weights divided by their sum (renormalize_routes)
  float expert_weights_scale = 1.0f; // top-k weights multiplied by this
  bool has_exp_probs_b = false;      // blk.N.exp_probs_b.bias present (selection bias)

  // ---- multi-head latent attention (AttentionKind::kMla; mla.h). head_dim = qk_nope + qk_rope
  // (the decompressed q/k head), n_head_kv = n_head; v is v_head_dim wide. ----
  int q_lora_rank = 0;     // 0: q = attn_q x; else attn_q_b(RMSNorm(attn_q_a x) * attn_q_a_norm)
  int kv_lora_rank = 0;    // width of the compressed kv
  int qk_rope = 0;         // rope.dimension_count: the decoupled RoPE part of every q/k head
  int qk_nope = 0;         // head_dim - qk_rope
  int v_head_dim = 0;      // value_length(_mla)
  bool kv_b_split = false; // attn_k_b/attn_v_b (newer converters) instead of attn_kv_b
  // YaRN RoPE (rope.scaling.type = yarn): factor 1 = unscaled.
  float yarn_factor = 1.0f;
  int yarn_orig_ctx = 0;
  float yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
  float yarn_log_mul = 0.0f;  // rope.scaling.yarn_log_multiplier / 0.1 (as llama.cpp undoes it)
  float yarn_rope_mscale = 1.0f;  // magnitude of the rotated values (cos, sin times this)
  float attn_scale = 0.0f;    // softmax scale of the MLA scores (mscale^2 / sqrt(head_dim))

  bool is_moe_layer(int il) const { return il >= n_layer_dense_lead; }
  // LFM2 (ArchTraits::shortconv): kernel length of the short convolutions (shortconv.l_cache) and
  // which layers are short-convolution blocks (attention.head_count_kv[il] == 0); empty: none.
  int shortconv_l = 0;
  std::vector<uint8_t> conv_layer;  // [n_layer] 1 = short convolution, 0 = attention

  bool is_conv_layer(int il) const { return !conv_layer.empty() && conv_layer[il] != 0; }
  bool has_conv_layers() const { return shortconv_l > 0; }
  int q_dim() const { return n_head * head_dim; }      // width of q and of the attention output
  int kv_dim() const { return n_head_kv * head_dim; }  // width of k and v
};

// The experts of one MoE layer. gate[e], up[e]: n_ff_expert x n_embd; down[e]: n_embd x n_ff_expert
// (WeightView rows are output features).
struct ExpertWeights {
  std::vector<kernels::WeightView> gate;  // [n_expert]
  std::vector<kernels::WeightView> up;    // [n_expert]
  std::vector<kernels::WeightView> down;  // [n_expert]
};

// A SwiGLU feed-forward network: x += down(silu(gate x) * up x). gate, up: n x n_embd; down:
// n_embd x n (the dense FFN of leading dense blocks, or the merged shared experts).
struct DenseFfn {
  kernels::WeightView gate, up, down;
  bool present() const { return gate.data != nullptr; }
};

// Multi-head latent attention weights (mla.h). Rows are output features.
struct MlaWeights {
  kernels::WeightView wq;       // n_head*head_dim x n_embd (q_lora_rank == 0)
  kernels::WeightView wq_a;     // q_lora_rank x n_embd
  const float* q_a_norm = nullptr;  // [q_lora_rank]
  kernels::WeightView wq_b;     // n_head*head_dim x q_lora_rank
  kernels::WeightView wkv_a;    // (kv_lora_rank + qk_rope) x n_embd (attn_kv_a_mqa)
  const float* kv_a_norm = nullptr;  // [kv_lora_rank]
  // The decompression of the normed compressed kv, either one matrix (older converters'
  // attn_kv_b: per head h, qk_nope k rows then v_head_dim v rows)
  kernels::WeightView wkv_b;    // n_head*(qk_nope + v_head_dim) x kv_lora_rank
  // or two (newer converters): attn_k_b [qk_nope, kv_lora_rank, n_head] is stored transposed
  // for this use, so it is transposed at load (into f32 for float files, into Q8_0 for quantised
  // ones: a second rounding of 2^-8 relative on top of the file's own); attn_v_b is used as it is.
  kernels::WeightView wk_b;     // n_head*qk_nope x kv_lora_rank (built at load)
  kernels::WeightView wv_b;     // n_head*v_head_dim x kv_lora_rank
};

// An LFM2 short-convolution block (shortconv_block.h). Rows are output features.
struct ShortConvWeights {
  kernels::WeightView in_proj;     // 3 n_embd x n_embd: rows [B; C; x]
  const float* kernel = nullptr;   // [L x n_embd] tap-major (transposed at load from GGUF's [n_embd][L])
  kernels::WeightView out_proj;    // n_embd x n_embd
  bool present() const { return kernel != nullptr; }
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [n_embd]
  kernels::WeightView wq;            // q_dim x n_embd
  kernels::WeightView wk;            // kv_dim x n_embd
  kernels::WeightView wv;            // kv_dim x n_embd
  kernels::WeightView wo;            // n_embd x q_dim
  const float* q_norm = nullptr;     // QkNorm::kWhole: [q_dim]; kPerHead: [head_dim]; else nullptr
  const float* k_norm = nullptr;     // QkNorm::kWhole: [kv_dim]; kPerHead: [head_dim]; else nullptr
  const float* ffn_norm = nullptr;   // [n_embd]
  kernels::WeightView router;        // n_expert x n_embd (ffn_gate_inp)
  ExpertWeights experts;
  bool moe = true;                   // false: a leading dense block (ffn below, no router)
  DenseFfn ffn;                      // dense blocks: ffn_gate/ffn_up/ffn_down
  DenseFfn shexp;                    // MoE blocks with shared experts: ffn_*_shexp
  const float* exp_probs_b = nullptr;  // [n_expert] selection bias, or nullptr
  MlaWeights mla;                    // AttentionKind::kMla only (wq..wo above unused but wo)
  ShortConvWeights conv;             // LFM2 conv layers (then wq..k_norm are unset)
};

struct ModelLoadOptions {
  // Repack quantised matrices into kernels' packed layout (kernels::CanRepack types only).
  bool repack_experts = false;
  bool repack_dense = false;
  // Touch every weight page at load.
  bool prefault = false;
};

class Model {
 public:
  // Opens, validates and maps `path`. See the file comment for the checks and their Status.
  static Result<std::unique_ptr<Model>> Load(const std::string& path, const ModelLoadOptions& options = {});
  // Every check of Load (the same Status for the same defect) on an open file, mapped or not,
  // without reading any tensor data: `estream pack` runs it on its source, so a model that would
  // not load is refused before it is packed.
  static Status Validate(const GgufFile& file);

  const ModelConfig& config() const { return config_; }
  const GgufFile& file() const { return *file_; }
  const std::string& path() const { return file_->path(); }

  // token_embd: n_vocab rows of n_embd in any CanDequantize type (rows dequantised on use).
  QuantType token_embd_type() const { return token_embd_type_; }
  const uint8_t* token_embd_row(int32_t token) const { return token_embd_ + token * token_embd_row_bytes_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const float* output_norm() const { return output_norm_; }  // [n_embd] (ArchTraits::output_norm_tensor)
  const kernels::WeightView& output() const { return output_; }  // n_vocab x n_embd (maybe tied)
  bool output_tied() const { return output_tied_; }
  // Bytes of all weights as held (mapped or repacked).
  uint64_t weight_bytes() const { return weight_bytes_; }
  // A packed model (`estream pack`; io/packed_layout.h): Load leaves every layer's `experts`
  // empty; VirtualExperts (virtual_experts.h) fills them (resident) or binds them per group.
  bool experts_packed() const { return experts_packed_; }

 private:
  friend class ModelLoader;
  friend class VirtualExperts;  // fills the expert views of a packed model
  bool experts_packed_ = false;
  Model() = default;

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  QuantType token_embd_type_ = QuantType::kF32;
  const uint8_t* token_embd_ = nullptr;
  size_t token_embd_row_bytes_ = 0;
  std::vector<LayerWeights> layers_;
  const float* output_norm_ = nullptr;
  kernels::WeightView output_;
  bool output_tied_ = false;
  uint64_t weight_bytes_ = 0;
  // Norm vectors as f32 (copied from whatever type the file has).
  std::vector<std::vector<float>> norms_;
  // Repacked matrices (and matrices built at load: MLA's transposed attn_k_b).
  std::vector<AlignedPtr<uint8_t>> packed_;
};

}  // namespace estream::model
