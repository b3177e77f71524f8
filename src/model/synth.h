// Synthetic MoE models in GGUF: what `estream synth` writes.
//
// A SynthModel is the full description of a model (shape, tensor list, metadata) with weights
// that are generated on demand, row by row, from (seed, tensor name, row): any row range of any
// tensor can be regenerated independently and always gives the same bytes, whatever the thread
// count. Write() streams the model to disk tensor by tensor through GgufWriter (bounded memory:
// two chunks of about 16 MiB), generating with OpenMP threads while the previous chunk is
// written; the file appears atomically (temporary name + rename).
//
// ---- Tensors (GGUF conventions, docs/DESIGN.md section 8; dims fastest first) -------------
//   token_embd.weight             [n_embd, n_vocab]                    weight type
//   blk.N.attn_norm.weight        [n_embd]                             F32
//   blk.N.attn_q.weight           [n_embd, n_head*head_dim]            weight type
//   blk.N.attn_k.weight           [n_embd, n_head_kv*head_dim]         weight type
//   blk.N.attn_v.weight           [n_embd, n_head_kv*head_dim]         weight type
//   blk.N.attn_output.weight      [n_head*head_dim, n_embd]            weight type
//   blk.N.attn_q_norm.weight      olmoe [n_head*head_dim], qwen3moe [head_dim]   F32
//   blk.N.attn_k_norm.weight      olmoe [n_head_kv*head_dim], qwen3moe [head_dim] F32
//   blk.N.ffn_norm.weight         [n_embd]                             F32
//   blk.N.ffn_gate_inp.weight     [n_embd, n_expert]  (router)         F32, as llama.cpp's
//                                 quantiser keeps it (small, and routing is sensitive to it)
//   blk.N.ffn_gate_exps.weight    [n_embd, n_ff_expert, n_expert]         weight type
//   blk.N.ffn_up_exps.weight      [n_embd, n_ff_expert, n_expert]         weight type
//   blk.N.ffn_down_exps.weight    [n_ff_expert, n_embd, n_expert]         weight type
//   output_norm.weight            [n_embd]                             F32
//   output.weight                 [n_embd, n_vocab]                    weight type
// With a mix (SynthOptions::mix) every "weight type" tensor gets MixTensorType's type instead.
// Metadata: general.*, {arch}.* hyper-parameters (the key set of the reference tiny models in
// shared/testdata/models), synthetic.* (generator, preset, seed, router skew, weight type) and
// tokenizer.* (the built-in byte-level BPE of bpe_builder.h, or copied with vocab_from).
//
// ---- Weight scales (why activations stay finite and every layer matters) ------------------
// Every branch is pre-normed, so what a layer adds to the residual stream does not depend on the
// stream's size. Embedding rows are N(0,1) plus a common component alpha*sqrt(n_embd)*u along a
// fixed unit vector u (alpha = 1; trained models' hidden states share such a mean direction too),
// so the stream starts at rms r0 = sqrt(2). Each of the 2L branches (attention, MoE) is scaled to
// add rms b = r0 * sqrt(gamma / 2L) (gamma = 1.5): the stream ends near sqrt(1 + gamma) * r0,
// and each branch changes it by about sqrt(gamma / 2L) (12% per branch at 48 layers).
//   attn_q, attn_k, attn_v, ffn_gate/up_exps: N(0, 1/n_in) (unit-variance outputs for unit
//   inputs); for llama (no q/k norm) attn_q/attn_k carry a gain 1.6, for olmoe/qwen3moe the q/k
//   norm weights do (1.6): attention scores have std ~2.6, neither flat nor one-hot.
//   attn_output: N(0, (b / (0.75 sqrt(n_head*head_dim)))^2) (0.75: rms of an attention average).
//   ffn_down_exps: N(0, (b / (0.596 * sqrt(E[sum w^2]) * sqrt(n_ff_expert)))^2), where 0.596^2 =
//   E[silu(z)^2] for z ~ N(0,1) and E[sum w^2] is the mean squared routing weight mass of the
//   arch's router (computed by Monte Carlo over the router model below).
//   norms: 1 + 0.02 N(0,1); output: N(0, 4/n_embd) (logits of std ~2).
// Router and skew: row e of ffn_gate_inp is N(0, 1/n_embd) noise orthogonal to u, plus
// beta_e / c_l * u with beta_e = -S ln(1 + rank_e): for a normed hidden state whose component
// along u is c_l * sqrt(n_embd) (c_l = 1/sqrt(2) shrunk by the stream's expected growth at layer
// l) the logits are N(0,1) + beta_e, so top-k popularity falls off roughly as 1/rank^S (S =
// router_skew; 0 = uniform). The popularity ranks are a fresh permutation per layer.
//
// ---- Value generation ----------------------------------------------------------------------
// Each row has its own xoshiro256** stream seeded from (seed, tensor name, row). Normal values
// are approximate (sum of four 16-bit uniforms, |z| <= 3.46). Gaussian tensors of type Q4_0 and
// Q8_0 are generated directly as codes (an inverse-CDF table per format, indexed by random bits:
// quantised N(0,1) on a step of 0.3 with codes -7..7 (Q4_0, 8-bit index) or on a step of 3.2/127
// (Q8_0, 16-bit index)) with a per-block scale sigma * step * m, m in [0.9, 1.1]: the same kind
// of values as quantising normal ones, at a fraction of the cost (~0.6 ns per value on one core).
// Everything else is generated as floats and quantised with QuantizeRow.
//
// Thread safety: a SynthModel is immutable after Create; GenerateRows may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "model/presets.h"
#include "quant/types.h"

namespace estream::synth {

struct SynthOptions {
  std::string preset = "tiny";
  std::string arch = {};          // architecture of `tiny` (empty: olmoe)
  // Overrides; 0 keeps the preset's value.
  int layers = 0;
  int experts = 0;
  int top_k = 0;
  int ctx = 0;
  int vocab = 0;                  // vocabulary size of the built-in BPE (tests use small ones)
  QuantType type = QuantType::kQ4_0;  // weight type of the matrices (q4_0, q8_0, f16, bf16, f32)
  // A llama-quantize mix (q2_K, q3_K_S/M/L, q4_K_S/M, q5_K_S/M, q6_K, q4_1, q5_0, q5_1, iq4_nl,
  // iq4_xs, mxfp4_moe; see ApplySynthType): per-tensor types as llama-quantize chooses them
  // (without an importance matrix). Empty: every matrix is `type`.
  std::string mix = {};
  float router_skew = 0.5f;       // S >= 0: expert popularity ~ 1/rank^S
  uint64_t seed = 1;
  std::string vocab_from = {};    // copy tokenizer.* from this GGUF (n_vocab follows it)
};

// The weight types and mixes synth writes, for --help and errors.
std::string SupportedSynthTypeNames();
// Parses --type as a single type (f32, f16, bf16, q8_0, q4_0: every matrix that type, the
// historical meaning; llama-quantize would give q4_0 files a q6_K output.weight). InvalidArgument
// listing the supported names otherwise (mixes included: use ApplySynthType for those).
Result<QuantType> ParseSynthType(const std::string& name);
// Sets o->type (single types) or o->mix (the llama-quantize mixes, case-insensitive; q3_K, q4_K,
// q5_K are q3_K_M, q4_K_M, q5_K_M as in llama-quantize; mxfp4 is mxfp4_moe) from --type.
// InvalidArgument listing the supported names.
Status ApplySynthType(const std::string& name, SynthOptions* o);
// The type llama-quantize's rules give tensor `name` ([ncols, rows, n_mat]: dims fastest first)
// of a model of `shape` under `mix` (llama_tensor_get_type without importance matrix, for the
// tensors synth writes; the ncols fallback included: e.g. q4_K tensors whose rows are not a
// multiple of 256 become q5_0). REQUIRES: mix is a name ApplySynthType accepts.
QuantType MixTensorType(const std::string& mix, const ModelShape& shape, const std::string& name,
                        const std::vector<int64_t>& dims);

enum class InitKind {
  kGaussian,   // N(0, scale^2) i.i.d.
  kNorm,       // scale * (1 + 0.02 N(0,1)): RMSNorm weights
  kEmbedding,  // N(0,1) + alpha * sqrt(n_embd) * u
  kRouter,     // noise orthogonal to u + beta_e / c_l * u (row e = expert e)
};

struct SynthTensor {
  std::string name;
  QuantType type = QuantType::kF32;
  std::vector<int64_t> dims;  // fastest first
  int64_t row_len = 0;        // dims[0]
  int64_t n_rows = 0;         // product of dims[1..]
  size_t row_bytes = 0;       // RowBytes(type, row_len)
  InitKind init = InitKind::kGaussian;
  float scale = 0;            // std (kGaussian), mean (kNorm)
  int layer = -1;             // block index, -1 for global tensors
  uint64_t stream = 0;        // seed of this tensor's random streams

  uint64_t n_bytes() const { return static_cast<uint64_t>(n_rows) * row_bytes; }
};

struct SynthWriteOptions {
  int threads = 0;            // generator threads, 0..kMaxThreads (InvalidArgument beyond); 0: all
  bool progress = false;      // percent and MB/s on stderr, about twice a second
  size_t chunk_bytes = 16u << 20;
};

struct SynthWriteStats {
  uint64_t file_bytes = 0;
  double seconds = 0;
};

class SynthModel {
 public:
  // Resolves the preset and overrides, builds (or copies) the tokenizer and the tensor list.
  // InvalidArgument for unknown preset/arch/type or inconsistent overrides (one line, listing
  // what is supported); IOError/Corruption from reading vocab_from.
  static Result<std::unique_ptr<SynthModel>> Create(const SynthOptions& options);

  const SynthOptions& options() const { return options_; }
  const ModelShape& shape() const { return shape_; }
  const std::vector<SynthTensor>& tensors() const { return tensors_; }
  const std::vector<GgufKv>& metadata() const { return kvs_; }
  // nullptr if absent.
  const SynthTensor* FindTensor(std::string_view name) const;
  // Intended popularity rank of each expert of `layer` (0 = the most popular).
  const std::vector<int>& ExpertRanks(int layer) const { return expert_ranks_[layer]; }
  // The unit vector u of the common hidden-state direction ([n_embd]).
  const std::vector<float>& common_direction() const { return u_; }
  // Sum of all tensors' bytes.
  uint64_t TensorBytes() const;

  // Writes rows [row0, row0 + n_rows) of `t` (one of tensors()) to dst, n_rows * t.row_bytes bytes.
  void GenerateRows(const SynthTensor& t, int64_t row0, int64_t n_rows, void* dst) const;

  // Writes the GGUF file. IOError naming the path if it cannot be created or written; nothing is
  // left at `path` (or its temporary name) on failure.
  Status Write(const std::string& path, const SynthWriteOptions& write_options = {},
               SynthWriteStats* stats = nullptr) const;

 private:
  SynthModel() = default;
  Status Build();
  void GenerateFloatRow(const SynthTensor& t, int64_t row, float* out) const;

  SynthOptions options_;
  ModelShape shape_;
  std::vector<SynthTensor> tensors_;
  std::vector<GgufKv> kvs_;
  std::vector<std::vector<int>> expert_ranks_;  // [n_layer][n_expert]
  std::vector<float> u_;                        // [n_embd], unit norm
  std::vector<float> router_c_;                 // [n_layer]: expected c_l
  std::vector<float> router_beta_;              // [n_expert]: bias by rank
};

}  // namespace estream::synth
