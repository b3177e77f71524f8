// `estream synth`: presets, the byte-level BPE builder, determinism (same seed, same bytes, any
// thread count), reload of every preset at reduced depth through the GGUF reader (names, shapes,
// types, keys; and the same tensor table as the shared reference tiny models), a naive float
// forward showing that every layer changes the residual stream without blowing it up, router
// skew, and bad input.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/bpe_builder.h"
#include "model/presets.h"
#include "model/synth.h"
#include "quant/quant.h"

namespace estream::synth {
namespace {

namespace fs = std::filesystem;

const std::string kShared = std::string(ESTREAM_SHARED_DIR) + "/testdata/";

// A scratch directory removed at the end of each test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("estream_synth_test_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string File(const std::string& name) const { return (path_ / name).string(); }
  std::vector<std::string> List() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
    return out;
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::unique_ptr<SynthModel> MustCreate(const SynthOptions& o) {
  auto m = SynthModel::Create(o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

// ---- presets ------------------------------------------------------------------------------

TEST(SynthPresets, ReferenceShapes) {
  auto o = FindPreset("olmoe-1b-7b");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->arch, "olmoe");
  EXPECT_EQ(o->n_layer, 16);
  EXPECT_EQ(o->n_embd, 2048);
  EXPECT_EQ(o->n_head, 16);
  EXPECT_EQ(o->n_expert, 64);
  EXPECT_EQ(o->n_expert_used, 8);
  EXPECT_EQ(o->n_ff_expert, 1024);
  EXPECT_EQ(o->n_vocab, 50304);
  auto q = FindPreset("qwen3-30b-a3b");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->arch, "qwen3moe");
  EXPECT_EQ(q->n_layer, 48);
  EXPECT_EQ(q->n_head, 32);
  EXPECT_EQ(q->n_head_kv, 4);
  EXPECT_EQ(q->head_dim, 128);
  EXPECT_EQ(q->n_expert, 128);
  EXPECT_EQ(q->n_ff_expert, 768);
  EXPECT_EQ(q->n_vocab, 151936);
  auto m = FindPreset("mixtral-8x7b");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->arch, "llama");
  EXPECT_EQ(m->n_layer, 32);
  EXPECT_EQ(m->n_embd, 4096);
  EXPECT_EQ(m->n_head_kv, 8);
  EXPECT_EQ(m->n_expert, 8);
  EXPECT_EQ(m->n_expert_used, 2);
  EXPECT_EQ(m->n_ff_expert, 14336);
  EXPECT_EQ(m->n_vocab, 32000);
  for (const std::string& p : PresetNames()) {
    auto s = FindPreset(p);
    ASSERT_TRUE(s.ok()) << p;
    EXPECT_TRUE(s->Validate().ok()) << p;
  }
  for (const char* a : {"olmoe", "qwen3moe", "llama", "deepseek2"}) {
    auto s = FindPreset("tiny", a);
    ASSERT_TRUE(s.ok()) << a;
    EXPECT_EQ(s->arch, a);
    EXPECT_TRUE(s->Validate().ok());
  }
}

// The full-size qwen3 preset at Q4_0 is the ~17 GB model of the issue; computed, not written.
TEST(SynthPresets, FullSizeBytes) {
  SynthOptions o;
  o.preset = "qwen3-30b-a3b";
  auto m = MustCreate(o);
  ASSERT_NE(m, nullptr);
  EXPECT_GT(m->TensorBytes(), 16.0e9);
  EXPECT_LT(m->TensorBytes(), 18.0e9);
  EXPECT_EQ(m->tensors().size(), 3u + 48u * 12u);  // 12 per block with the q/k norms
}

// DeepSeek-V2-Lite (config.json): 15.7B parameters, about 8.8 GB in Q4_0; every deepseek2
// tensor of a dense first block, 26 MoE blocks with shared experts and MLA without a q LoRA.
TEST(SynthPresets, DeepseekV2Lite) {
  SynthOptions o;
  o.preset = "deepseek-v2-lite";
  auto m = MustCreate(o);
  ASSERT_NE(m, nullptr);
  const ModelShape& s = m->shape();
  EXPECT_EQ(s.arch, "deepseek2");
  EXPECT_EQ(s.n_layer, 27);
  EXPECT_EQ(s.n_layer_dense_lead, 1);
  EXPECT_EQ(s.n_expert, 64);
  EXPECT_EQ(s.n_expert_used, 6);
  EXPECT_EQ(s.n_expert_shared, 2);
  EXPECT_EQ(s.head_dim, 192);
  EXPECT_EQ(s.kv_lora_rank, 512);
  EXPECT_GT(m->TensorBytes(), 8.5e9);
  EXPECT_LT(m->TensorBytes(), 9.2e9);
  // token_embd, output_norm, output; dense block: 11 (2 norms, q, kv_a, kv_a_norm, k_b, v_b, o, ffn
  // x3); MoE blocks: 15 (router, experts x3, shared x3 instead of the dense ffn).
  EXPECT_EQ(m->tensors().size(), 3u + 11u + 26u * 15u);
  EXPECT_NE(m->FindTensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_EQ(m->FindTensor("blk.0.ffn_gate_exps.weight"), nullptr);
  EXPECT_NE(m->FindTensor("blk.1.ffn_down_shexp.weight"), nullptr);
  EXPECT_NE(m->FindTensor("blk.26.attn_k_b.weight"), nullptr);
  EXPECT_EQ(m->FindTensor("blk.1.attn_q_a.weight"), nullptr);
  // The tiny variant has the q LoRA too.
  o.preset = "deepseek2-tiny";
  auto t = MustCreate(o);
  ASSERT_NE(t, nullptr);
  EXPECT_NE(t->FindTensor("blk.1.attn_q_a_norm.weight"), nullptr);
  EXPECT_EQ(t->FindTensor("blk.1.attn_q.weight"), nullptr);
}

TEST(SynthPresets, BadNamesListSupported) {
  auto p = FindPreset("gpt-5");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("tiny, olmoe-1b-7b, qwen3-30b-a3b, mixtral-8x7b"), std::string::npos);
  auto a = FindPreset("tiny", "mamba");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("olmoe, qwen3moe, llama"), std::string::npos);
  auto mismatch = FindPreset("mixtral-8x7b", "olmoe");
  EXPECT_FALSE(mismatch.ok());
  auto t = ParseSynthType("q4_K");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("q4_0, q8_0, f16, bf16, f32"), std::string::npos);
  EXPECT_NE(t.status().message().find("q4_K_M"), std::string::npos);
  for (const char* name : {"q4_0", "Q8_0", "f16", "bf16", "f32"}) EXPECT_TRUE(ParseSynthType(name).ok()) << name;
  for (const std::string& msg : {p.status().message(), a.status().message(), t.status().message()})
    EXPECT_EQ(msg.find('\n'), std::string::npos);
}

// The llama-quantize mixes: names (aliases, case), and the per-tensor rules on the full-size
// shapes (llama.cpp's llama_tensor_get_type without importance matrix).
TEST(SynthMixes, NamesAndRules) {
  SynthOptions o;
  ASSERT_TRUE(ApplySynthType("Q4_K", &o).ok());
  EXPECT_EQ(o.mix, "q4_K_M");
  ASSERT_TRUE(ApplySynthType("mxfp4", &o).ok());
  EXPECT_EQ(o.mix, "mxfp4_moe");
  ASSERT_TRUE(ApplySynthType("q8_0", &o).ok());
  EXPECT_TRUE(o.mix.empty());
  EXPECT_EQ(o.type, QuantType::kQ8_0);
  for (const char* m : {"q2_K", "q3_K_S", "q3_K_M", "q3_K_L", "q4_K_S", "q4_K_M", "q5_K_S", "q5_K_M", "q6_K", "q4_1",
                        "q5_0", "q5_1", "iq4_nl", "iq4_xs", "mxfp4_moe"})
    EXPECT_TRUE(ApplySynthType(m, &o).ok()) << m;
  const Status bad = ApplySynthType("iq2_xxs", &o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("q4_K_M"), std::string::npos);

  auto olmoe = FindPreset("olmoe-1b-7b");  // 16 layers, 64 experts, n_embd 2048, n_ff_expert 1024
  ASSERT_TRUE(olmoe.ok());
  auto T = [&](const char* mix, const std::string& name, std::vector<int64_t> dims) {
    return MixTensorType(mix, *olmoe, name, dims);
  };
  const std::vector<int64_t> attn = {2048, 2048}, down = {1024, 2048, 64}, up = {2048, 1024, 64};
  // Q4_K_M: output q6_K; attn_v and ffn_down q6_K on use_more_bits layers (0, 1, 4, 7, ..., 14, 15).
  EXPECT_EQ(T("q4_K_M", "output.weight", {2048, 50304}), QuantType::kQ6_K);
  EXPECT_EQ(T("q4_K_M", "token_embd.weight", {2048, 50304}), QuantType::kQ4_K);
  EXPECT_EQ(T("q4_K_M", "blk.0.attn_v.weight", attn), QuantType::kQ6_K);
  EXPECT_EQ(T("q4_K_M", "blk.2.attn_v.weight", attn), QuantType::kQ4_K);
  EXPECT_EQ(T("q4_K_M", "blk.4.ffn_down_exps.weight", down), QuantType::kQ6_K);
  EXPECT_EQ(T("q4_K_M", "blk.5.ffn_down_exps.weight", down), QuantType::kQ4_K);
  EXPECT_EQ(T("q4_K_M", "blk.5.ffn_up_exps.weight", up), QuantType::kQ4_K);
  // Q3_K_M: attn_v q5_K for the first two layers then q4_K, ffn_down q5_K below n/16 then q4_K,
  // attn_output q4_K.
  EXPECT_EQ(T("q3_K_M", "blk.1.attn_v.weight", attn), QuantType::kQ5_K);
  EXPECT_EQ(T("q3_K_M", "blk.2.attn_v.weight", attn), QuantType::kQ4_K);
  EXPECT_EQ(T("q3_K_M", "blk.0.ffn_down_exps.weight", down), QuantType::kQ5_K);
  EXPECT_EQ(T("q3_K_M", "blk.3.ffn_down_exps.weight", down), QuantType::kQ4_K);
  EXPECT_EQ(T("q3_K_M", "blk.3.attn_output.weight", attn), QuantType::kQ4_K);
  EXPECT_EQ(T("q3_K_M", "blk.3.attn_q.weight", attn), QuantType::kQ3_K);
  // Q2_K: attn_v q3_K (n_gqa 1), ffn_down q3_K, attn_output q3_K; IQ4_XS: ffn_down q5_K below n/8.
  EXPECT_EQ(T("q2_K", "blk.3.attn_v.weight", attn), QuantType::kQ3_K);
  EXPECT_EQ(T("q2_K", "blk.3.ffn_down_exps.weight", down), QuantType::kQ3_K);
  EXPECT_EQ(T("iq4_xs", "blk.1.ffn_down_exps.weight", down), QuantType::kQ5_K);
  EXPECT_EQ(T("iq4_xs", "blk.2.ffn_down_exps.weight", down), QuantType::kIQ4_XS);
  // MXFP4_MOE: experts mxfp4, everything else q8_0.
  EXPECT_EQ(T("mxfp4_moe", "blk.2.ffn_down_exps.weight", down), QuantType::kMXFP4);
  EXPECT_EQ(T("mxfp4_moe", "blk.2.attn_q.weight", attn), QuantType::kQ8_0);
  EXPECT_EQ(T("mxfp4_moe", "output.weight", {2048, 50304}), QuantType::kQ8_0);
  // Rows not a multiple of 256 fall back: q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, q2_K/q3_K ->
  // q4_0, iq4_xs -> iq4_nl.
  EXPECT_EQ(T("q4_K_M", "blk.5.ffn_down_exps.weight", {1408, 2048, 64}), QuantType::kQ5_0);
  EXPECT_EQ(T("q5_K_S", "blk.5.ffn_down_exps.weight", {1408, 2048, 64}), QuantType::kQ5_1);
  EXPECT_EQ(T("q4_K_M", "blk.4.ffn_down_exps.weight", {1408, 2048, 64}), QuantType::kQ8_0);
  EXPECT_EQ(T("q2_K", "blk.5.ffn_gate_exps.weight", {1408, 2048, 64}), QuantType::kQ4_0);
  EXPECT_EQ(T("iq4_xs", "blk.5.ffn_gate_exps.weight", {1408, 2048, 64}), QuantType::kIQ4_NL);
  // 8 experts (Mixtral): attn_k/attn_v q8_0, attn_output q5_K.
  auto mixtral = FindPreset("mixtral-8x7b");
  ASSERT_TRUE(mixtral.ok());
  EXPECT_EQ(MixTensorType("q4_K_M", *mixtral, "blk.3.attn_v.weight", {4096, 1024}), QuantType::kQ8_0);
  EXPECT_EQ(MixTensorType("q4_K_M", *mixtral, "blk.3.attn_k.weight", {4096, 1024}), QuantType::kQ8_0);
  EXPECT_EQ(MixTensorType("q4_K_M", *mixtral, "blk.3.attn_output.weight", {4096, 4096}), QuantType::kQ5_K);
}

// LFM2-8B-A1B (config.json of LiquidAI/LFM2-8B-A1B): the published shapes and layer pattern,
// 8.3B parameters in total.
TEST(SynthPresets, Lfm2_8bA1b) {
  auto l = FindPreset("lfm2-8b-a1b");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->arch, "lfm2moe");
  EXPECT_EQ(l->n_layer, 24);
  EXPECT_EQ(l->n_embd, 2048);
  EXPECT_EQ(l->n_head, 32);
  EXPECT_EQ(l->n_head_kv, 8);
  EXPECT_EQ(l->head_dim, 64);
  EXPECT_EQ(l->n_ff, 7168);
  EXPECT_EQ(l->n_ff_expert, 1792);
  EXPECT_EQ(l->n_expert, 32);
  EXPECT_EQ(l->n_expert_used, 4);
  EXPECT_EQ(l->n_layer_dense_lead, 2);
  EXPECT_EQ(l->conv_l, 3);
  EXPECT_EQ(l->n_vocab, 65536);
  std::vector<int> attn;
  for (int il = 0; il < l->n_layer; ++il)
    if (!l->conv_layer(il)) attn.push_back(il);
  EXPECT_EQ(attn, (std::vector<int>{2, 6, 10, 14, 18, 21}));
  SynthOptions o;
  o.preset = "lfm2-8b-a1b";
  o.type = QuantType::kF32;
  auto m = MustCreate(o);
  ASSERT_NE(m, nullptr);
  const double params = m->TensorBytes() / 4.0;
  EXPECT_GT(params, 8.2e9);
  EXPECT_LT(params, 8.45e9);
  EXPECT_EQ(m->FindTensor("output.weight"), nullptr);  // tied
  EXPECT_NE(m->FindTensor("token_embd_norm.weight"), nullptr);
  EXPECT_NE(m->FindTensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_NE(m->FindTensor("blk.2.attn_q_norm.weight"), nullptr);
  EXPECT_NE(m->FindTensor("blk.23.exp_probs_b.bias"), nullptr);
  EXPECT_NE(m->FindTensor("blk.3.shortconv.conv.weight"), nullptr);
  auto tiny = FindPreset("tiny", "lfm2moe");
  ASSERT_TRUE(tiny.ok());
  EXPECT_TRUE(tiny->Validate().ok());
  EXPECT_EQ(tiny->tokenizer_pre(), "lfm2");
}

// ---- BPE builder ----------------------------------------------------------------------------

TEST(SynthBpe, ByteToUnicodeIsGpt2Mapping) {
  EXPECT_EQ(ByteToUnicode('!'), "!");
  EXPECT_EQ(ByteToUnicode('a'), "a");
  EXPECT_EQ(ByteToUnicode(' '), "\xC4\xA0");     // U+0120 'Ġ'
  EXPECT_EQ(ByteToUnicode('\n'), "\xC4\x8A");    // U+010A 'Ċ'
  EXPECT_EQ(ByteToUnicode(0), "\xC4\x80");       // U+0100 'Ā'
  EXPECT_EQ(ByteToUnicode(0xAD), "\xC5\x83");    // U+0143 (soft hyphen is not printable)
  EXPECT_EQ(ByteToUnicode(0xE9), "\xC3\xA9");    // U+00E9 'é' maps to itself
  std::set<std::string> all;
  for (int b = 0; b < 256; ++b) all.insert(ByteToUnicode(static_cast<uint8_t>(b)));
  EXPECT_EQ(all.size(), 256u);
}

TEST(SynthBpe, SplitLikeGpt2) {
  const std::vector<std::string> want = {"Hello", ",", " world", "'s", " 42", "  ", " x", "\n", "\n", "y", "!!"};
  EXPECT_EQ(SplitWords("Hello, world's 42   x\n\ny!!"), want);
}

TEST(SynthBpe, VocabularyIsConsistent) {
  for (int size : {300, 512, 1000, 5000}) {
    auto v = BuildByteBpe({.vocab_size = size});
    ASSERT_TRUE(v.ok()) << v.status().message();
    ASSERT_EQ(static_cast<int>(v->tokens.size()), size);
    ASSERT_EQ(v->token_types.size(), v->tokens.size());
    std::map<std::string, int> id;
    for (size_t i = 0; i < v->tokens.size(); ++i) {
      EXPECT_TRUE(id.emplace(v->tokens[i], static_cast<int>(i)).second) << "duplicate token " << v->tokens[i];
    }
    for (int b = 0; b < 256; ++b) EXPECT_EQ(v->tokens[b], ByteToUnicode(static_cast<uint8_t>(b)));
    // Every merge joins two existing tokens into an existing token that comes after both parts.
    for (const std::string& m : v->merges) {
      const size_t sp = m.find(' ');
      ASSERT_NE(sp, std::string::npos);
      const std::string l = m.substr(0, sp), r = m.substr(sp + 1);
      ASSERT_TRUE(id.count(l) && id.count(r) && id.count(l + r)) << m;
      EXPECT_GT(id[l + r], std::max(id[l], id[r]) - 1) << m;
    }
    EXPECT_EQ(v->tokens[v->eos_id], "<|endoftext|>");
    EXPECT_EQ(v->bos_id, v->eos_id);
    EXPECT_EQ(v->token_types[v->eos_id], 3);
    EXPECT_EQ(256 + v->n_learned + 1 + v->n_padding, size);
    if (size >= 1000) {
      EXPECT_TRUE(id.count("\xC4\xA0the")) << "' the' should be learned";
    }
  }
  auto small = BuildByteBpe({.vocab_size = 256});
  EXPECT_FALSE(small.ok());
}

TEST(SynthBpe, Deterministic) {
  auto a = BuildByteBpe({.vocab_size = 700});
  auto b = BuildByteBpe({.vocab_size = 700});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->merges, b->merges);
}

// ---- determinism ---------------------------------------------------------------------------

TEST(SynthDeterminism, SameSeedSameBytes) {
  TempDir dir;
  for (const char* arch : {"olmoe", "qwen3moe", "llama"}) {
    SynthOptions o;
    o.arch = arch;
    o.seed = 7;
    auto m = MustCreate(o);
    ASSERT_NE(m, nullptr);
    ASSERT_TRUE(m->Write(dir.File("a.gguf"), {.threads = 1}).ok());
    auto m2 = MustCreate(o);  // a fresh model object, more threads and small chunks
    ASSERT_TRUE(m2->Write(dir.File("b.gguf"), {.threads = 2, .chunk_bytes = 64 << 10}).ok());
    const auto a = ReadAll(dir.File("a.gguf"));
    const auto b = ReadAll(dir.File("b.gguf"));
    ASSERT_GT(a.size(), 100000u);
    EXPECT_TRUE(a == b) << arch << ": two runs with seed 7 differ";
    if (std::string(arch) != "olmoe") continue;  // one different-seed check is enough
    o.seed = 8;
    auto m3 = MustCreate(o);
    ASSERT_TRUE(m3->Write(dir.File("c.gguf"), {}).ok());
    const auto c = ReadAll(dir.File("c.gguf"));
    ASSERT_EQ(a.size(), c.size());
    EXPECT_FALSE(a == c) << arch << ": seeds 7 and 8 gave the same file";
  }
}

// GenerateRows of any row range equals the corresponding slice of the whole tensor.
TEST(SynthDeterminism, RowRangesAreIndependent) {
  SynthOptions o;
  o.arch = "qwen3moe";
  for (QuantType type : {QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kBF16}) {
    o.type = type;
    auto m = MustCreate(o);
    for (const char* name : {"token_embd.weight", "blk.1.ffn_down_exps.weight", "blk.0.ffn_gate_inp.weight"}) {
      const SynthTensor* t = m->FindTensor(name);
      ASSERT_NE(t, nullptr);
      std::vector<uint8_t> whole(t->n_bytes()), part(3 * t->row_bytes);
      m->GenerateRows(*t, 0, t->n_rows, whole.data());
      m->GenerateRows(*t, 5, 3, part.data());
      EXPECT_EQ(0, std::memcmp(part.data(), whole.data() + 5 * t->row_bytes, part.size())) << name;
    }
  }
}

// ---- reload through the GGUF reader -----------------------------------------------------------

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> dims;
  QuantType type;
};

// The tensor table of docs/DESIGN.md section 8, written out independently of synth.cc.
std::vector<ExpectedTensor> ExpectedTable(const ModelShape& s, QuantType w) {
  const int64_t e = s.n_embd, q = s.n_head * s.head_dim, kv = s.n_head_kv * s.head_dim;
  const QuantType f = QuantType::kF32;
  std::vector<ExpectedTensor> t = {{"token_embd.weight", {e, s.n_vocab}, w}};
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    t.push_back({p + "attn_norm.weight", {e}, f});
    t.push_back({p + "attn_q.weight", {e, q}, w});
    t.push_back({p + "attn_k.weight", {e, kv}, w});
    t.push_back({p + "attn_v.weight", {e, kv}, w});
    t.push_back({p + "attn_output.weight", {q, e}, w});
    if (s.arch == "olmoe") {
      t.push_back({p + "attn_q_norm.weight", {q}, f});
      t.push_back({p + "attn_k_norm.weight", {kv}, f});
    } else if (s.arch == "qwen3moe") {
      t.push_back({p + "attn_q_norm.weight", {s.head_dim}, f});
      t.push_back({p + "attn_k_norm.weight", {s.head_dim}, f});
    }
    t.push_back({p + "ffn_norm.weight", {e}, f});
    t.push_back({p + "ffn_gate_inp.weight", {e, s.n_expert}, f});
    t.push_back({p + "ffn_gate_exps.weight", {e, s.n_ff_expert, s.n_expert}, w});
    t.push_back({p + "ffn_up_exps.weight", {e, s.n_ff_expert, s.n_expert}, w});
    t.push_back({p + "ffn_down_exps.weight", {s.n_ff_expert, e, s.n_expert}, w});
  }
  t.push_back({"output_norm.weight", {e}, f});
  t.push_back({"output.weight", {e, s.n_vocab}, w});
  return t;
}

void CheckTable(const GgufFile& f, const std::vector<ExpectedTensor>& want) {
  ASSERT_EQ(f.tensors().size(), want.size()) << f.path();
  for (size_t i = 0; i < want.size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, want[i].name) << f.path();
    ASSERT_EQ(t.n_dims, static_cast<int>(want[i].dims.size())) << t.name;
    for (int d = 0; d < t.n_dims; ++d) EXPECT_EQ(t.dims[d], want[i].dims[d]) << t.name << " dim " << d;
    EXPECT_EQ(t.type, want[i].type) << t.name;
  }
}

void CheckKeys(const GgufFile& f, const ModelShape& s) {
  const std::string a = s.arch;
  EXPECT_EQ(*f.GetString("general.architecture"), a);
  EXPECT_EQ(*f.GetU32(a + ".block_count"), static_cast<uint32_t>(s.n_layer));
  EXPECT_EQ(*f.GetU32(a + ".context_length"), static_cast<uint32_t>(s.n_ctx));
  EXPECT_EQ(*f.GetU32(a + ".embedding_length"), static_cast<uint32_t>(s.n_embd));
  EXPECT_EQ(*f.GetU32(a + ".feed_forward_length"), static_cast<uint32_t>(s.n_ff));
  if (a == "llama") EXPECT_EQ(f.Find(a + ".expert_feed_forward_length"), nullptr);
  else EXPECT_EQ(*f.GetU32(a + ".expert_feed_forward_length"), static_cast<uint32_t>(s.n_ff_expert));
  EXPECT_EQ(*f.GetU32(a + ".attention.head_count"), static_cast<uint32_t>(s.n_head));
  EXPECT_EQ(*f.GetU32(a + ".attention.head_count_kv"), static_cast<uint32_t>(s.n_head_kv));
  EXPECT_EQ(*f.GetU32(a + ".attention.key_length"), static_cast<uint32_t>(s.head_dim));
  EXPECT_EQ(*f.GetU32(a + ".attention.value_length"), static_cast<uint32_t>(s.head_dim));
  EXPECT_EQ(*f.GetF32(a + ".attention.layer_norm_rms_epsilon"), s.rms_eps);
  EXPECT_EQ(*f.GetF32(a + ".rope.freq_base"), s.rope_freq_base);
  EXPECT_EQ(*f.GetU32(a + ".expert_count"), static_cast<uint32_t>(s.n_expert));
  EXPECT_EQ(*f.GetU32(a + ".expert_used_count"), static_cast<uint32_t>(s.n_expert_used));
  EXPECT_EQ(*f.GetU32(a + ".vocab_size"), static_cast<uint32_t>(s.n_vocab));
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "gpt2");
  const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->array.size(), static_cast<size_t>(s.n_vocab));
  EXPECT_LT(*f.GetU32("tokenizer.ggml.eos_token_id"), static_cast<uint32_t>(s.n_vocab));
}

struct Reduced {
  const char* preset;
  int layers, experts, top_k;
};

// Every preset at reduced depth (and fewer experts and a small vocabulary for the big ones, so
// the file stays small); the shapes that remain are the preset's own.
TEST(SynthReload, EveryPresetAtReducedDepth) {
  TempDir dir;
  const Reduced cases[] = {{"tiny", 2, 0, 0}, {"olmoe-1b-7b", 1, 4, 2}, {"qwen3-30b-a3b", 2, 4, 2}, {"mixtral-8x7b", 1, 1, 1}};
  for (const Reduced& c : cases) {
    SynthOptions o;
    o.preset = c.preset;
    o.layers = c.layers;
    o.experts = c.experts;
    o.top_k = c.top_k;
    if (std::string(c.preset) != "tiny") o.vocab = 512;
    auto m = MustCreate(o);
    ASSERT_NE(m, nullptr);
    const std::string path = dir.File(std::string(c.preset) + ".gguf");
    ASSERT_TRUE(m->Write(path).ok()) << c.preset;
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    ModelShape want = *FindPreset(c.preset);
    want.n_layer = c.layers;
    if (c.experts) want.n_expert = c.experts;
    if (c.top_k) want.n_expert_used = c.top_k;
    if (std::string(c.preset) != "tiny") want.n_vocab = 512;
    CheckKeys(**f, want);
    CheckTable(**f, ExpectedTable(want, QuantType::kQ4_0));
    EXPECT_EQ(*(*f)->GetString("tokenizer.ggml.pre"),
              want.arch == "olmoe" ? "olmo" : want.arch == "qwen3moe" ? "qwen2" : "gpt-2");
    EXPECT_EQ(*(*f)->GetU32("general.file_type"), 2u);
    EXPECT_EQ((*f)->file_size(), std::filesystem::file_size(path));
    // The stored bytes are what GenerateRows makes (spot check of small tensors).
    for (const GgufTensorInfo& t : (*f)->tensors()) {
      if (t.n_bytes > (1u << 20)) continue;
      const SynthTensor* st = m->FindTensor(t.name);
      std::vector<uint8_t> gen(st->n_bytes());
      m->GenerateRows(*st, 0, st->n_rows, gen.data());
      ASSERT_EQ(gen.size(), t.n_bytes);
      EXPECT_EQ(0, std::memcmp(gen.data(), (*f)->TensorData(t), t.n_bytes)) << t.name;
    }
  }
}

// synth tiny --type f32 has exactly the tensor table (names, order, shapes, types) and the
// hyper-parameter keys of the shared reference tiny model of the same architecture.
TEST(SynthReload, MatchesReferenceTinyModels) {
  TempDir dir;
  const std::pair<const char*, const char*> refs[] = {
      {"olmoe", "olmoe-tiny-f32.gguf"}, {"qwen3moe", "qwen3moe-tiny-f32.gguf"}, {"llama", "mixtral-tiny-f32.gguf"},
      {"lfm2moe", "lfm2moe-tiny-f32.gguf"}};
  for (auto [arch, file] : refs) {
    auto ref = GgufFile::Open(kShared + "models/" + file);
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    SynthOptions o;
    o.arch = arch;
    o.type = QuantType::kF32;
    auto m = MustCreate(o);
    const std::string path = dir.File(std::string(arch) + ".gguf");
    ASSERT_TRUE(m->Write(path).ok());
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok());
    ASSERT_EQ((*f)->tensors().size(), (*ref)->tensors().size()) << arch;
    for (size_t i = 0; i < (*ref)->tensors().size(); ++i) {
      const GgufTensorInfo& r = (*ref)->tensors()[i];
      const GgufTensorInfo& t = (*f)->tensors()[i];
      EXPECT_EQ(t.name, r.name);
      EXPECT_EQ(t.ShapeString(), r.ShapeString()) << r.name;
      EXPECT_EQ(t.type, r.type) << r.name;
      EXPECT_EQ(t.n_bytes, r.n_bytes) << r.name;
    }
    for (const GgufKv& kv : (*ref)->kvs()) {
      if (kv.key.rfind("synthetic.", 0) == 0 || kv.key.rfind("tokenizer.", 0) == 0 || kv.key == "general.name")
        continue;
      const GgufValue* v = (*f)->Find(kv.key);
      ASSERT_NE(v, nullptr) << arch << ": missing key " << kv.key;
      EXPECT_EQ(v->type, kv.value.type) << kv.key;
      EXPECT_EQ(v->u, kv.value.u) << kv.key;
      EXPECT_EQ(v->str, kv.value.str) << kv.key;
      EXPECT_FLOAT_EQ(static_cast<float>(v->f), static_cast<float>(kv.value.f)) << kv.key;
    }
    for (const char* key : {"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                            "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
      const GgufValue* rv = (*ref)->Find(key);
      const GgufValue* v = (*f)->Find(key);
      ASSERT_TRUE(rv != nullptr && v != nullptr) << key;
      EXPECT_EQ(v->type, rv->type) << key;
      EXPECT_EQ(v->elem_type, rv->elem_type) << key;
    }
  }
}

TEST(SynthReload, VocabFromCopiesTokenizer) {
  TempDir dir;
  SynthOptions o;
  o.arch = "qwen3moe";
  o.layers = 1;
  o.vocab_from = kShared + "tokenizer/ggml-vocab-gpt-2.gguf";
  auto m = MustCreate(o);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->shape().n_vocab, 50257);
  ASSERT_TRUE(m->Write(dir.File("v.gguf"), {}).ok());
  auto f = GgufFile::Open(dir.File("v.gguf"));
  auto src = GgufFile::Open(o.vocab_from);
  ASSERT_TRUE(f.ok() && src.ok());
  EXPECT_EQ(*(*f)->GetString("tokenizer.ggml.pre"), "gpt-2");
  EXPECT_EQ((*f)->FindTensor("token_embd.weight")->dims[1], 50257);
  EXPECT_EQ(*(*f)->GetU32("qwen3moe.vocab_size"), 50257u);
  const GgufValue* a = (*f)->Find("tokenizer.ggml.merges");
  const GgufValue* b = (*src)->Find("tokenizer.ggml.merges");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->array.size(), b->array.size());
  EXPECT_EQ(a->array[1234].str, b->array[1234].str);

  SynthOptions bad = o;
  bad.vocab_from = dir.File("missing.gguf");
  EXPECT_FALSE(SynthModel::Create(bad).ok());
  bad.vocab_from = kShared + "models/olmoe-tiny-f32.gguf";  // has a tokenizer: fine
  EXPECT_TRUE(SynthModel::Create(bad).ok());
}

// ---- bad input ------------------------------------------------------------------------------

TEST(SynthErrors, BadOptions) {
  SynthOptions o;
  o.preset = "nope";
  EXPECT_FALSE(SynthModel::Create(o).ok());
  o = {};
  o.arch = "gpt2";
  auto r = SynthModel::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("olmoe, qwen3moe, llama"), std::string::npos);
  o = {};
  o.type = QuantType::kQ4_K;
  r = SynthModel::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("q4_0, q8_0"), std::string::npos);
  o = {};
  o.experts = 4;
  o.top_k = 5;
  EXPECT_FALSE(SynthModel::Create(o).ok());
  o = {};
  o.router_skew = -1;
  EXPECT_FALSE(SynthModel::Create(o).ok());
  o = {};
  o.experts = 1;  // top-k follows down to 1 when not given
  auto ok = SynthModel::Create(o);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->shape().n_expert_used, 1);
}

TEST(SynthErrors, UnwritablePathLeavesNothing) {
  TempDir dir;
  auto m = MustCreate({});
  Status s = m->Write(dir.File("no/such/dir/model.gguf"), {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find("no/such/dir"), std::string::npos) << s.message();
  EXPECT_TRUE(dir.List().empty());
  // A directory in place of the file: the rename fails at the end, the temporary is removed.
  fs::create_directories(dir.File("taken.gguf"));
  EXPECT_FALSE(m->Write(dir.File("taken.gguf"), {}).ok());
  EXPECT_EQ(dir.List(), std::vector<std::string>{"taken.gguf"});
}

// ---- numerics: a naive float forward ----------------------------------------------------------

// Weights are generated by the model itself and dequantised with the scalar reference; the
// forward follows docs/DESIGN.md section 8 except RoPE (a rotation of q/k pairs: it changes which
// positions attend where, not the sizes this test measures).
class NaiveForward {
 public:
  explicit NaiveForward(const SynthModel& m) : m_(m), s_(m.shape()) {}

  // Rows [row0, row0 + n) of a tensor as floats.
  std::vector<float> Rows(const std::string& name, int64_t row0, int64_t n) const {
    const SynthTensor* t = m_.FindTensor(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<uint8_t> raw(n * t->row_bytes);
    m_.GenerateRows(*t, row0, n, raw.data());
    std::vector<float> out(n * t->row_len, std::numeric_limits<float>::quiet_NaN());
    for (int64_t r = 0; r < n; ++r)
      DequantizeRow(t->type, raw.data() + r * t->row_bytes, out.data() + r * t->row_len, t->row_len);
    return out;
  }
  std::vector<float> All(const std::string& name) const { return Rows(name, 0, m_.FindTensor(name)->n_rows); }

  static float Dot(const float* a, const float* b, int64_t n) {
    float acc[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    float sum = 0;
    for (; i < n; ++i) sum += a[i] * b[i];
    for (float v : acc) sum += v;
    return sum;
  }
  // y[t][r] = W[r] . x[t] for W of n_out rows of n_in.
  static std::vector<float> MatMul(const std::vector<float>& w, int64_t n_in, int64_t n_out,
                                   const std::vector<float>& x, int n_tok) {
    std::vector<float> y(static_cast<size_t>(n_tok) * n_out);
    for (int t = 0; t < n_tok; ++t)
      for (int64_t r = 0; r < n_out; ++r) y[t * n_out + r] = Dot(&w[r * n_in], &x[t * n_in], n_in);
    return y;
  }
  void RmsNorm(float* x, int64_t n, const float* w) const {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / n + s_.rms_eps));
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] * inv * w[i];
  }

  struct LayerStats {
    double rms_in = 0, attn_change = 0, moe_change = 0, rms_out = 0;
    std::vector<int> expert_counts;
  };

  // Runs the tokens through every layer; returns per-layer statistics (relative changes are
  // |delta| / |x| averaged over tokens). `x` ends as the final residual stream.
  std::vector<LayerStats> Run(const std::vector<int>& tokens, std::vector<float>* x_out) const {
    const int T = static_cast<int>(tokens.size());
    const int64_t e = s_.n_embd, hd = s_.head_dim, nq = s_.n_embd_q(), nkv = s_.n_embd_kv();
    std::vector<float> x(T * e);
    for (int t = 0; t < T; ++t) {
      const auto row = Rows("token_embd.weight", tokens[t], 1);
      std::copy(row.begin(), row.end(), x.begin() + t * e);
    }
    std::vector<LayerStats> stats;
    for (int l = 0; l < s_.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      LayerStats st;
      st.rms_in = Rms(x);
      // Attention.
      std::vector<float> h = x;
      const auto attn_norm = All(p + "attn_norm.weight");
      for (int t = 0; t < T; ++t) RmsNorm(&h[t * e], e, attn_norm.data());
      auto q = MatMul(All(p + "attn_q.weight"), e, nq, h, T);
      auto k = MatMul(All(p + "attn_k.weight"), e, nkv, h, T);
      auto v = MatMul(All(p + "attn_v.weight"), e, nkv, h, T);
      if (s_.qk_norm_whole()) {
        const auto qn = All(p + "attn_q_norm.weight"), kn = All(p + "attn_k_norm.weight");
        for (int t = 0; t < T; ++t) {
          RmsNorm(&q[t * nq], nq, qn.data());
          RmsNorm(&k[t * nkv], nkv, kn.data());
        }
      } else if (s_.qk_norm_per_head()) {
        const auto qn = All(p + "attn_q_norm.weight"), kn = All(p + "attn_k_norm.weight");
        for (int t = 0; t < T; ++t) {
          for (int hh = 0; hh < s_.n_head; ++hh) RmsNorm(&q[t * nq + hh * hd], hd, qn.data());
          for (int hh = 0; hh < s_.n_head_kv; ++hh) RmsNorm(&k[t * nkv + hh * hd], hd, kn.data());
        }
      }
      std::vector<float> o(T * nq, 0.0f);
      const int group = s_.n_head / s_.n_head_kv;
      for (int hh = 0; hh < s_.n_head; ++hh) {
        const int kh = hh / group;
        for (int t = 0; t < T; ++t) {
          std::vector<float> sc(t + 1);
          float mx = -INFINITY;
          for (int u = 0; u <= t; ++u) {
            sc[u] = Dot(&q[t * nq + hh * hd], &k[u * nkv + kh * hd], hd) / std::sqrt(static_cast<float>(hd));
            mx = std::max(mx, sc[u]);
          }
          float z = 0;
          for (float& s : sc) z += (s = std::exp(s - mx));
          for (int u = 0; u <= t; ++u)
            for (int64_t d = 0; d < hd; ++d) o[t * nq + hh * hd + d] += sc[u] / z * v[u * nkv + kh * hd + d];
        }
      }
      const auto attn = MatMul(All(p + "attn_output.weight"), nq, e, o, T);
      st.attn_change = RelChange(x, attn);
      for (size_t i = 0; i < x.size(); ++i) x[i] += attn[i];
      // MoE.
      h = x;
      const auto ffn_norm = All(p + "ffn_norm.weight");
      for (int t = 0; t < T; ++t) RmsNorm(&h[t * e], e, ffn_norm.data());
      const auto logits = MatMul(All(p + "ffn_gate_inp.weight"), e, s_.n_expert, h, T);
      std::vector<float> moe(T * e, 0.0f);
      st.expert_counts.assign(s_.n_expert, 0);
      std::map<int, std::vector<std::pair<int, float>>> routes;  // expert -> (token, weight)
      for (int t = 0; t < T; ++t) {
        std::vector<float> pr(logits.begin() + t * s_.n_expert, logits.begin() + (t + 1) * s_.n_expert);
        const float mx = *std::max_element(pr.begin(), pr.end());
        float z = 0;
        for (float& v2 : pr) z += (v2 = std::exp(v2 - mx));
        for (float& v2 : pr) v2 /= z;
        std::vector<int> idx(s_.n_expert);
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + s_.n_expert_used, idx.end(),
                          [&](int a, int b) { return pr[a] > pr[b]; });
        float sum = 0;
        for (int kk = 0; kk < s_.n_expert_used; ++kk) sum += pr[idx[kk]];
        for (int kk = 0; kk < s_.n_expert_used; ++kk) {
          routes[idx[kk]].push_back({t, s_.renormalize_routes() ? pr[idx[kk]] / sum : pr[idx[kk]]});
          ++st.expert_counts[idx[kk]];
        }
      }
      const int64_t ff = s_.n_ff_expert;
      for (const auto& [ex, list] : routes) {
        const auto wg = Rows(p + "ffn_gate_exps.weight", ex * ff, ff);
        const auto wu = Rows(p + "ffn_up_exps.weight", ex * ff, ff);
        const auto wd = Rows(p + "ffn_down_exps.weight", ex * e, e);
        for (auto [t, weight] : list) {
          std::vector<float> xt(h.begin() + t * e, h.begin() + (t + 1) * e);
          const auto g = MatMul(wg, e, ff, xt, 1);
          const auto u = MatMul(wu, e, ff, xt, 1);
          std::vector<float> act(ff);
          for (int64_t i = 0; i < ff; ++i) act[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
          const auto d = MatMul(wd, ff, e, act, 1);
          for (int64_t i = 0; i < e; ++i) moe[t * e + i] += weight * d[i];
        }
      }
      st.moe_change = RelChange(x, moe);
      for (size_t i = 0; i < x.size(); ++i) x[i] += moe[i];
      st.rms_out = Rms(x);
      stats.push_back(st);
    }
    if (x_out) *x_out = x;
    return stats;
  }

 private:
  static double Rms(const std::vector<float>& x) {
    double ss = 0;
    for (float v : x) ss += static_cast<double>(v) * v;
    return std::sqrt(ss / x.size());
  }
  double RelChange(const std::vector<float>& x, const std::vector<float>& d) const {
    const int64_t e = s_.n_embd;
    const int T = static_cast<int>(x.size() / e);
    double total = 0;
    for (int t = 0; t < T; ++t) {
      double xx = 0, dd = 0;
      for (int64_t i = 0; i < e; ++i) {
        xx += static_cast<double>(x[t * e + i]) * x[t * e + i];
        dd += static_cast<double>(d[t * e + i]) * d[t * e + i];
      }
      total += std::sqrt(dd / xx);
    }
    return total / T;
  }

  const SynthModel& m_;
  const ModelShape& s_;
};

struct ForwardCase {
  const char* preset;
  const char* arch;
  int layers, experts, top_k, n_tokens;
  QuantType type = QuantType::kQ4_0;
};

// Every preset at reduced depth (and fewer experts: Mixtral's are 176M values each, so it keeps
// one): each branch of each layer changes the residual stream by more
// than 1% (relative, per token), the stream stays finite and grows by less than 4x (the design
// aims at sqrt(1 + 1.5) ~ 1.6x over the whole depth), and the final token states stay distinct.
TEST(SynthNumerics, EveryLayerChangesTheStreamAndNoneBlowsItUp) {
  const ForwardCase cases[] = {
      {"tiny", "olmoe", 2, 0, 0, 12}, {"tiny", "qwen3moe", 2, 0, 0, 12}, {"tiny", "llama", 2, 0, 0, 12},
      {"tiny", "qwen3moe", 24, 0, 0, 12},  // deep: per-branch changes shrink as 1/sqrt(L), growth stays bounded
      {"tiny", "olmoe", 2, 0, 0, 12, QuantType::kQ8_0}, {"tiny", "qwen3moe", 2, 0, 0, 12, QuantType::kF16},
      {"tiny", "llama", 2, 0, 0, 12, QuantType::kBF16}, {"tiny", "olmoe", 2, 0, 0, 12, QuantType::kF32},
      {"olmoe-1b-7b", "", 2, 8, 0, 8}, {"qwen3-30b-a3b", "", 2, 8, 0, 8}, {"mixtral-8x7b", "", 2, 1, 0, 4}};
  for (const ForwardCase& c : cases) {
    SynthOptions o;
    o.preset = c.preset;
    o.arch = c.arch;
    o.layers = c.layers;
    o.experts = c.experts;
    o.top_k = c.top_k;
    o.type = c.type;
    if (std::string(c.preset) != "tiny") o.vocab = 512;
    auto m = MustCreate(o);
    ASSERT_NE(m, nullptr);
    std::mt19937 rng(42);
    std::vector<int> tokens(c.n_tokens);
    for (int& t : tokens) t = static_cast<int>(rng() % m->shape().n_vocab);
    NaiveForward fwd(*m);
    std::vector<float> x;
    const auto stats = fwd.Run(tokens, &x);
    const double rms0 = stats[0].rms_in;
    for (size_t l = 0; l < stats.size(); ++l) {
      const auto& s = stats[l];
      SCOPED_TRACE(std::string(c.preset) + "/" + m->shape().arch + "/" + TypeName(c.type) + " layer " + std::to_string(l));
      EXPECT_TRUE(std::isfinite(s.rms_out));
      EXPECT_GT(s.attn_change, 0.01);
      EXPECT_GT(s.moe_change, 0.01);
      EXPECT_LT(s.attn_change, 2.0);
      EXPECT_LT(s.moe_change, 2.0);
      EXPECT_LT(s.rms_out / rms0, 4.0);
      EXPECT_GT(s.rms_out / rms0, 0.5);
      std::printf("  %-14s %-8s %-4s layer %2zu: rms %.3f -> %.3f, attn %.1f%%, moe %.1f%%\n", c.preset,
                  m->shape().arch.c_str(), TypeName(c.type), l, s.rms_in, s.rms_out, 100 * s.attn_change,
                  100 * s.moe_change);
    }
    for (float v : x) ASSERT_TRUE(std::isfinite(v));
    // Distinct tokens keep distinct states (cosine < 0.99 for the last two positions).
    const int64_t e = m->shape().n_embd;
    const float* a = &x[(c.n_tokens - 1) * e];
    const float* b = &x[(c.n_tokens - 2) * e];
    const double cosine = NaiveForward::Dot(a, b, e) / std::sqrt(NaiveForward::Dot(a, a, e) * NaiveForward::Dot(b, b, e));
    EXPECT_LT(cosine, 0.99) << c.preset;
  }
}

// Routing many hidden states through a layer's router: with skew S the intended rank-0 expert is
// chosen several times more often than the mean and popularity falls with the intended rank;
// with S = 0 it is roughly uniform. Hidden states are normed embeddings of random tokens (the
// skew acts through the common direction of the hidden states, see synth.h).
std::vector<int> RouteCounts(const SynthModel& m, int layer, int n_tokens) {
  const ModelShape& s = m.shape();
  NaiveForward fwd(m);
  const auto router = fwd.All("blk." + std::to_string(layer) + ".ffn_gate_inp.weight");
  const auto norm = fwd.All("blk." + std::to_string(layer) + ".ffn_norm.weight");
  const auto embd = fwd.All("token_embd.weight");
  std::vector<int> counts(s.n_expert, 0);
  std::mt19937 rng(3);
  for (int i = 0; i < n_tokens; ++i) {
    const int64_t tok = rng() % s.n_vocab;
    std::vector<float> h(embd.begin() + tok * s.n_embd, embd.begin() + (tok + 1) * s.n_embd);
    fwd.RmsNorm(h.data(), s.n_embd, norm.data());
    const auto logits = NaiveForward::MatMul(router, s.n_embd, s.n_expert, h, 1);
    std::vector<int> idx(s.n_expert);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + s.n_expert_used, idx.end(),
                      [&](int a, int b) { return logits[a] > logits[b]; });
    for (int k = 0; k < s.n_expert_used; ++k) ++counts[idx[k]];
  }
  return counts;
}

TEST(SynthRouter, SkewFollowsRanks) {
  for (float skew : {0.5f, 1.0f}) {
    SynthOptions o;
    o.arch = "qwen3moe";
    o.experts = 32;
    o.top_k = 4;
    o.vocab = 4096;
    o.router_skew = skew;
    auto m = MustCreate(o);
    ASSERT_NE(m, nullptr);
    for (int layer = 0; layer < 2; ++layer) {
      const auto counts = RouteCounts(*m, layer, 4096);
      const auto& ranks = m->ExpertRanks(layer);
      const double mean = 4096.0 * 4 / 32;
      std::vector<double> by_rank(32);
      for (int ex = 0; ex < 32; ++ex) by_rank[ranks[ex]] = counts[ex] / mean;
      std::printf("  skew %.1f layer %d: popularity by rank / mean: %.2f %.2f %.2f %.2f ... %.3f\n", skew, layer,
                  by_rank[0], by_rank[1], by_rank[2], by_rank[3], by_rank[31]);
      // Zipf with S = 0.5 over 32 experts, top-4: the rank-0 expert is picked by ~60% of tokens.
      EXPECT_GT(by_rank[0], skew >= 1.0f ? 4.0 : 2.5);
      EXPECT_LT(by_rank[31], 0.5);
      // Popularity falls with rank: each quarter of the ranks less popular than the one before.
      double q[4] = {};
      for (int r = 0; r < 32; ++r) q[r / 8] += by_rank[r];
      EXPECT_GT(q[0], q[1]);
      EXPECT_GT(q[1], q[2]);
      EXPECT_GT(q[2], q[3]);
    }
  }
  SynthOptions flat;
  flat.arch = "qwen3moe";
  flat.experts = 32;
  flat.top_k = 4;
  flat.vocab = 4096;
  flat.router_skew = 0.0f;
  auto m = MustCreate(flat);
  const auto counts = RouteCounts(*m, 0, 4096);
  const double mean = 4096.0 * 4 / 32;
  // 512 picks per expert on average: binomial noise is ~5%; 1.35x leaves room for the finite
  // sample of router rows.
  EXPECT_LT(*std::max_element(counts.begin(), counts.end()) / mean, 1.35);
  EXPECT_GT(*std::min_element(counts.begin(), counts.end()) / mean, 0.65);
}

// The skew survives depth: routing the hidden states of a real forward pass (256 random tokens,
// 8 layers) still picks the most popular expert several times more often than the mean, at every
// layer, and the intended rank-0 expert is among the three most picked.
TEST(SynthRouter, SkewHoldsThroughTheForwardPass) {
  SynthOptions o;
  o.arch = "qwen3moe";
  o.layers = 8;
  o.experts = 32;
  o.top_k = 4;
  o.router_skew = 1.0f;
  auto m = MustCreate(o);
  ASSERT_NE(m, nullptr);
  std::mt19937 rng(5);
  std::vector<int> tokens(256);
  for (int& t : tokens) t = static_cast<int>(rng() % m->shape().n_vocab);
  NaiveForward fwd(*m);
  const auto stats = fwd.Run(tokens, nullptr);
  const double mean = 256.0 * 4 / 32;
  for (int l = 0; l < 8; ++l) {
    std::vector<int> order(32);
    std::iota(order.begin(), order.end(), 0);
    const auto& counts = stats[l].expert_counts;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return counts[a] > counts[b]; });
    const auto& ranks = m->ExpertRanks(l);
    std::printf("  layer %d: most picked %.2f x mean (intended rank %d), least %.2f\n", l, counts[order[0]] / mean,
                ranks[order[0]], counts[order[31]] / mean);
    EXPECT_GT(counts[order[0]] / mean, 2.5) << "layer " << l;
    EXPECT_LE(std::min({ranks[order[0]], ranks[order[1]], ranks[order[2]]}), 0) << "layer " << l;
  }
}

}  // namespace
}  // namespace estream::synth
