#include "model/presets.h"

namespace estream::synth {
namespace {

const char* const kArchs[] = {"olmoe", "qwen3moe", "llama", "deepseek2", "lfm2moe"};

// The tiny models follow shared/testdata/models (2 layers, n_embd 256, 8 experts top-2, vocab
// 512), so a synthesised tiny model has the same shapes as the reference ones of its arch.
ModelShape Tiny(const std::string& arch) {
  ModelShape s;
  s.preset = "tiny";
  s.arch = arch;
  s.n_layer = 2;
  s.n_embd = 256;
  s.head_dim = 64;
  s.n_expert = 8;
  s.n_expert_used = 2;
  s.n_vocab = 512;
  s.n_ctx = 4096;
  if (arch == "olmoe") {
    s.family = "OLMoE-tiny";
    s.n_head = 4;
    s.n_head_kv = 4;
    s.n_ff = 128;
    s.n_ff_expert = 128;
    s.rms_eps = 1e-5f;
    s.rope_freq_base = 10000.0f;
  } else if (arch == "qwen3moe") {
    s.family = "Qwen3-MoE-tiny";
    s.n_head = 8;
    s.n_head_kv = 2;
    s.n_ff = 512;
    s.n_ff_expert = 128;
    s.rms_eps = 1e-6f;
    s.rope_freq_base = 1000000.0f;
  } else if (arch == "deepseek2") {
    // shared/testdata/models/deepseek2-tiny's shapes (3 layers, the first dense, 16 experts top-6
    // + 2 shared), plus a q LoRA so that every structural part is present.
    s.family = "DeepSeek-V2-tiny";
    s.n_layer = 3;
    s.n_head = 4;
    s.n_head_kv = 4;
    s.head_dim = 96;
    s.qk_rope = 32;
    s.v_head_dim = 64;
    s.kv_lora_rank = 128;
    s.q_lora_rank = 64;
    s.n_ff = 512;
    s.n_ff_expert = 128;
    s.n_expert = 16;
    s.n_expert_used = 6;
    s.n_expert_shared = 2;
    s.n_layer_dense_lead = 1;
    s.n_ctx = 163840;
    s.rms_eps = 1e-6f;
    s.rope_freq_base = 10000.0f;
    s.yarn_factor = 40.0f;
    s.yarn_orig_ctx = 4096;
    s.yarn_log_mul = 0.0707f;
  } else if (arch == "lfm2moe") {
    // As shared/testdata/models/lfm2moe-tiny: conv, conv, attention, conv; two dense layers.
    s.family = "LFM2-MoE-tiny";
    s.n_layer = 4;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 512;
    s.n_ff_expert = 128;
    s.n_expert = 16;
    s.n_expert_used = 4;
    s.n_layer_dense_lead = 2;
    s.conv_l = 3;
    s.attn_layers = {2};
    s.pattern_depth = 4;
    s.n_ctx = 128000;
    s.rms_eps = 1e-5f;
    s.rope_freq_base = 1000000.0f;
  } else {
    s.family = "Mixtral-tiny";
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 512;
    s.n_ff_expert = 512;
    s.rms_eps = 1e-5f;
    s.rope_freq_base = 1000000.0f;
  }
  return s;
}

// OLMoE-1B-7B (allenai/OLMoE-1B-7B-0924): 16 layers, d 2048, 16 heads (no GQA), 64 experts of
// d_ff 1024, top-8, vocab 50304.
ModelShape Olmoe1b7b() {
  return {.preset = "olmoe-1b-7b", .arch = "olmoe", .family = "OLMoE-1B-7B", .n_layer = 16, .n_embd = 2048,
          .n_head = 16, .n_head_kv = 16, .head_dim = 128, .n_ff = 1024, .n_ff_expert = 1024, .n_expert = 64,
          .n_expert_used = 8, .n_vocab = 50304, .n_ctx = 4096, .rms_eps = 1e-5f, .rope_freq_base = 10000.0f};
}

// Qwen3-30B-A3B: 48 layers, d 2048, 32 heads / 4 kv of head_dim 128 (q is 4096 wide), 128
// experts of d_ff 768, top-8, vocab 151936; the family's dense FFN size is 6144.
ModelShape Qwen3_30bA3b() {
  return {.preset = "qwen3-30b-a3b", .arch = "qwen3moe", .family = "Qwen3-30B-A3B", .n_layer = 48, .n_embd = 2048,
          .n_head = 32, .n_head_kv = 4, .head_dim = 128, .n_ff = 6144, .n_ff_expert = 768, .n_expert = 128,
          .n_expert_used = 8, .n_vocab = 151936, .n_ctx = 40960, .rms_eps = 1e-6f, .rope_freq_base = 1000000.0f};
}

// Mixtral-8x7B: 32 layers, d 4096, 32 heads / 8 kv, 8 experts of d_ff 14336, top-2, vocab 32000.
ModelShape Mixtral8x7b() {
  return {.preset = "mixtral-8x7b", .arch = "llama", .family = "Mixtral-8x7B", .n_layer = 32, .n_embd = 4096,
          .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_ff = 14336, .n_ff_expert = 14336, .n_expert = 8,
          .n_expert_used = 2, .n_vocab = 32000, .n_ctx = 32768, .rms_eps = 1e-5f, .rope_freq_base = 1000000.0f};
}

// DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite config.json): 27 layers, d 2048, 16 heads of
// q/k 192 (nope 128 + rope 64) and v 128, kv_lora_rank 512, no q LoRA, the first layer dense
// (d_ff 10944), then 64 routed experts of d_ff 1408 top-6 + 2 shared; YaRN factor 40 over 4096
// (mscale_all_dim 0.707: yarn_log_multiplier 0.0707), rope base 10000, vocab 102400.
ModelShape DeepseekV2Lite() {
  return {.preset = "deepseek-v2-lite", .arch = "deepseek2", .family = "DeepSeek-V2-Lite", .n_layer = 27,
          .n_embd = 2048, .n_head = 16, .n_head_kv = 16, .head_dim = 192, .n_ff = 10944, .n_ff_expert = 1408,
          .n_expert = 64, .n_expert_used = 6, .n_vocab = 102400, .n_ctx = 163840, .rms_eps = 1e-6f,
          .rope_freq_base = 10000.0f, .n_layer_dense_lead = 1, .n_expert_shared = 2, .q_lora_rank = 0,
          .kv_lora_rank = 512, .qk_rope = 64, .v_head_dim = 128, .yarn_factor = 40.0f, .yarn_orig_ctx = 4096,
          .yarn_log_mul = 0.0707f};
}

// LFM2-8B-A1B (LiquidAI/LFM2-8B-A1B, config.json): 24 layers, d 2048, attention at layers 2, 6, 10,
// 14, 18, 21 (32 heads / 8 kv, head_dim 64) and short convolutions (L = 3) elsewhere; the first two
// layers dense (intermediate_size 7168), then 32 experts of d_ff 1792 (moe_intermediate_size),
// top-4, sigmoid router with expert bias, renormalised; vocab 65536, context 128000, rope theta
// 1e6, norm eps 1e-5, tied embeddings.
ModelShape Lfm2_8bA1b() {
  return {.preset = "lfm2-8b-a1b", .arch = "lfm2moe", .family = "LFM2-8B-A1B", .n_layer = 24, .n_embd = 2048,
          .n_head = 32, .n_head_kv = 8, .head_dim = 64, .n_ff = 7168, .n_ff_expert = 1792, .n_expert = 32,
          .n_expert_used = 4, .n_vocab = 65536, .n_ctx = 128000, .rms_eps = 1e-5f, .rope_freq_base = 1000000.0f,
          .n_layer_dense_lead = 2, .conv_l = 3, .attn_layers = {2, 6, 10, 14, 18, 21}, .pattern_depth = 24};
}

bool KnownArch(const std::string& arch) {
  for (const char* a : kArchs)
    if (arch == a) return true;
  return false;
}

}  // namespace

bool ModelShape::conv_layer(int il) const {
  if (!lfm2()) return false;
  for (int a : attn_layers)
    if (a == il) return false;
  // Beyond the preset's own layers (a --layers override): attention every 4th layer.
  return !(il >= pattern_depth && il % 4 == 2);
}

std::string ModelShape::tokenizer_pre() const {
  // OLMoE files say "olmo" (GPT-2's split); Qwen3 files "qwen2". Mixtral's own tokenizer is a
  // SentencePiece one; for the built-in byte-level BPE the GPT-2 split is the natural choice.
  if (arch == "olmoe") return "olmo";
  if (arch == "qwen3moe") return "qwen2";
  if (arch == "deepseek2") return "deepseek-llm";
  if (arch == "lfm2moe") return "lfm2";
  return "gpt-2";
}

Status ModelShape::Validate() const {
  auto bad = [&](const std::string& field, const std::string& why) {
    return Status::InvalidArgument("model shape '" + preset + "' (" + arch + "): " + field + " " + why);
  };
  if (!KnownArch(arch)) return bad("arch", "is not one of " + SupportedArchNames());
  if (n_layer < 1) return bad("n_layer", "must be >= 1");
  if (n_embd < 32 || n_embd % 32 != 0) return bad("n_embd", "must be a positive multiple of 32");
  if (n_head < 1 || n_head_kv < 1 || n_head % n_head_kv != 0)
    return bad("n_head/n_head_kv", "must be positive with n_head a multiple of n_head_kv");
  if (head_dim < 2 || head_dim % 2 != 0) return bad("head_dim", "must be even");
  if (n_embd_q() % 32 != 0) return bad("n_head*head_dim", "must be a multiple of 32");
  if (n_ff_expert < 32 || n_ff_expert % 32 != 0) return bad("n_ff_expert", "must be a positive multiple of 32");
  if (n_ff < 1) return bad("n_ff", "must be >= 1");
  if (n_expert < 1) return bad("--experts", "must be >= 1");
  if (n_expert_used < 1 || n_expert_used > n_expert)
    return bad("--top-k", "must be between 1 and the expert count (" + std::to_string(n_expert) + ")");
  if (n_vocab < 1) return bad("n_vocab", "must be >= 1");
  if (n_ctx < 1) return bad("--ctx", "must be >= 1");
  if (mla()) {
    if (n_head_kv != n_head) return bad("n_head_kv", "must equal n_head (decompressed multi-head latent attention)");
    if (qk_rope < 2 || qk_rope % 2 != 0 || qk_rope >= head_dim) return bad("qk_rope", "must be even and below head_dim");
    if (v_head_dim < 1 || v_head_dim > head_dim || (n_head * v_head_dim) % 32 != 0)
      return bad("v_head_dim", "must be at most head_dim with n_head*v_head_dim a multiple of 32");
    if ((head_dim - qk_rope) % 32 != 0) return bad("qk_nope", "must be a multiple of 32");
    if (kv_lora_rank < 32 || kv_lora_rank % 32 != 0) return bad("kv_lora_rank", "must be a positive multiple of 32");
    if (q_lora_rank < 0 || q_lora_rank % 32 != 0) return bad("q_lora_rank", "must be a multiple of 32 (0: none)");
    if (n_layer_dense_lead < 0 || n_layer_dense_lead >= n_layer)
      return bad("n_layer_dense_lead", "must leave at least one MoE layer (use --layers >= 2)");
    if (n_layer_dense_lead > 0 && n_ff % 32 != 0) return bad("n_ff", "must be a multiple of 32");
  }
  if (lfm2()) {
    if (n_embd_q() != n_embd) return bad("n_head*head_dim", "must equal n_embd for lfm2moe");
    if (conv_l < 1) return bad("conv_l", "must be >= 1");
    if (n_layer_dense_lead >= n_layer) return bad("--layers", "must leave at least one MoE layer after the dense ones");
  }
  return Status::Ok();
}

std::string SupportedArchNames() { return "olmoe, qwen3moe, llama, deepseek2, lfm2moe"; }

std::vector<std::string> PresetNames() {
  return {"tiny", "olmoe-1b-7b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite", "deepseek2-tiny", "lfm2-8b-a1b"};
}

std::string SupportedPresetNames() {
  std::string out;
  for (const std::string& p : PresetNames()) out += (out.empty() ? "" : ", ") + p;
  return out;
}

Result<ModelShape> FindPreset(const std::string& name, const std::string& arch) {
  if (!arch.empty() && !KnownArch(arch))
    return Status::InvalidArgument("unknown architecture '" + arch + "'; supported: " + SupportedArchNames());
  ModelShape s;
  if (name == "tiny") return Tiny(arch.empty() ? "olmoe" : arch);
  if (name == "deepseek2-tiny") {
    if (!arch.empty() && arch != "deepseek2")
      return Status::InvalidArgument("preset 'deepseek2-tiny' is a deepseek2 model; --arch " + arch +
                                     " applies to the tiny preset only");
    s = Tiny("deepseek2");
    s.preset = "deepseek2-tiny";
    return s;
  }
  if (name == "olmoe-1b-7b") s = Olmoe1b7b();
  else if (name == "qwen3-30b-a3b") s = Qwen3_30bA3b();
  else if (name == "mixtral-8x7b") s = Mixtral8x7b();
  else if (name == "deepseek-v2-lite") s = DeepseekV2Lite();
  else if (name == "lfm2-8b-a1b") s = Lfm2_8bA1b();
  else return Status::InvalidArgument("unknown preset '" + name + "'; supported: " + SupportedPresetNames());
  if (!arch.empty() && arch != s.arch)
    return Status::InvalidArgument("preset '" + name + "' is a " + s.arch + " model; --arch " + arch +
                                   " applies to the tiny preset only");
  return s;
}

}  // namespace estream::synth
