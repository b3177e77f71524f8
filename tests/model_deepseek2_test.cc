// DeepSeek-V2 (deepseek2) beyond the golden logits of model_golden_test: both tensor layouts of
// the kv decompression (the split attn_k_b / attn_v_b of newer converters and the older merged
// attn_kv_b), the router variants (sigmoid gating, the exp_probs_b selection bias, top-k weight
// normalisation and scale) against the fp64 reference, the expert routing of a dense first
// block, the packed model streamed under every schedule, and one corrupt-model case per defect
// (each a clear error naming the key or tensor, never a crash).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "estream/engine.h"
#include "gguf/gguf.h"
#include "pack/pack_model.h"
#include "kernels/kernels.h"
#include "model/ffn.h"
#include "model/model.h"
#include "model_test_util.h"
#include "ref/ref_forward.h"

namespace estream {
namespace {

using model_test::ArgMax;
using model_test::GgufContents;
using model_test::OutTensor;
using model_test::RelErr;
using model_test::RewriteGguf;
using model_test::ScratchDir;

const std::string kModels = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/";
const std::string kDs = kModels + "deepseek2-tiny-f32.gguf";
constexpr int64_t kVocab = 512;

std::vector<int32_t> Tokens() { return model_test::ReadTokens(kModels + "deepseek2-tiny.tokens.txt"); }
std::vector<float> Golden() { return model_test::ReadF32(kModels + "deepseek2-tiny-f32.logits.f32"); }

// Every row within 5e-5 of the golden logits (model_golden_test's bound) and the same arg-max.
void ExpectGolden(const std::vector<float>& logits, const std::string& what) {
  const std::vector<float> gold = Golden();
  ASSERT_EQ(logits.size(), gold.size()) << what;
  double worst = 0;
  for (int64_t t = 0; t * kVocab < static_cast<int64_t>(gold.size()); ++t) {
    const double e = RelErr(logits.data() + t * kVocab, gold.data() + t * kVocab, kVocab);
    worst = std::max(worst, e);
    EXPECT_LT(e, 5e-5) << what << " position " << t;
    EXPECT_EQ(ArgMax(logits.data() + t * kVocab, kVocab), ArgMax(gold.data() + t * kVocab, kVocab))
        << what << " position " << t;
  }
  std::printf("%s: worst row relative error vs golden %.2e\n", what.c_str(), worst);
}

Result<std::vector<float>> RunLogits(const std::string& path, EngineOptions o = {.n_threads = 2}) {
  ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Load(path, o));
  ESTREAM_ASSIGN_OR_RETURN(Response r, e->Run({.tokens = Tokens(), .logits = Request::Logits::kAll}));
  return r.logits;
}

void SetU32(GgufContents* c, const std::string& key, uint32_t v) {
  if (GgufKv* kv = c->FindKv(key)) kv->value = GgufValue::U32(v);
  else c->kvs.push_back({key, GgufValue::U32(v)});
}
void EraseKv(GgufContents* c, const std::string& key) {
  std::erase_if(c->kvs, [&](const GgufKv& kv) { return kv.key == key; });
}

// The older converters' layout: attn_kv_b [kv_lora_rank, n_head * (qk_nope + v)] (per head h:
// the k_nope rows, then the v rows) instead of attn_k_b / attn_v_b, and the per-head widths in
// key_length / value_length without the *_mla keys.
TEST(Deepseek2, MergedKvBMatchesGolden) {
  ScratchDir dir;
  const std::string path = dir.File("kvb.gguf");
  std::vector<std::vector<uint8_t>> storage;
  ASSERT_TRUE(RewriteGguf(kDs, path, [&](GgufContents* c) {
                const int64_t H = 4, nope = 64, vd = 64, r = 128;
                for (int il = 0; il < 3; ++il) {
                  const std::string p = "blk." + std::to_string(il) + ".";
                  const float* kb = reinterpret_cast<const float*>(c->FindTensor(p + "attn_k_b.weight")->data);
                  const float* vb = reinterpret_cast<const float*>(c->FindTensor(p + "attn_v_b.weight")->data);
                  storage.emplace_back(H * (nope + vd) * r * sizeof(float));
                  float* out = reinterpret_cast<float*>(storage.back().data());
                  for (int64_t h = 0; h < H; ++h)
                    for (int64_t cc = 0; cc < r; ++cc) {
                      for (int64_t i = 0; i < nope; ++i) out[(h * (nope + vd) + i) * r + cc] = kb[(h * r + cc) * nope + i];
                      for (int64_t j = 0; j < vd; ++j)
                        out[(h * (nope + vd) + nope + j) * r + cc] = vb[(h * vd + j) * r + cc];
                    }
                  c->EraseTensor(p + "attn_k_b.weight");
                  c->EraseTensor(p + "attn_v_b.weight");
                  c->tensors.push_back({p + "attn_kv_b.weight", QuantType::kF32, {r, H * (nope + vd)},
                                        storage.back().data(), storage.back().size()});
                }
                SetU32(c, "deepseek2.attention.key_length", 96);
                SetU32(c, "deepseek2.attention.value_length", 64);
                SetU32(c, "deepseek2.attention.head_count_kv", 4);
                EraseKv(c, "deepseek2.attention.key_length_mla");
                EraseKv(c, "deepseek2.attention.value_length_mla");
              }).ok());
  auto ref = ref::RefForward(path, Tokens());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  std::vector<float> ref_f(ref->logits.begin(), ref->logits.end());
  ExpectGolden(ref_f, "fp64 reference, attn_kv_b");
  auto logits = RunLogits(path);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  ExpectGolden(*logits, "engine, attn_kv_b");
}

// The testdata README: a loader must accept the file with and without attention.q_lora_rank = 0.
TEST(Deepseek2, WithoutQLoraKey) {
  ScratchDir dir;
  const std::string path = dir.File("noq.gguf");
  ASSERT_TRUE(RewriteGguf(kDs, path, [](GgufContents* c) { EraseKv(c, "deepseek2.attention.q_lora_rank"); }).ok());
  auto logits = RunLogits(path);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  ExpectGolden(*logits, "engine, no q_lora_rank key");
}

// Routing of a leading dense block: no experts (-1, weight 0); MoE blocks: the softmax weights of
// six distinct experts, not renormalised (they sum to less than 1).
TEST(Deepseek2, RoutingOfDenseAndMoeBlocks) {
  auto e = Engine::Load(kDs, {.n_threads = 2});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto r = (*e)->Run({.tokens = Tokens(), .top_k = 1, .return_routing = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const int64_t T = 48, K = 6;
  ASSERT_EQ(r->routing.size(), static_cast<size_t>(3 * T * K));
  for (int64_t i = 0; i < T * K; ++i) {
    EXPECT_EQ(r->routing[i], -1);
    EXPECT_EQ(r->routing_weights[i], 0.0f);
  }
  for (int64_t l = 1; l < 3; ++l)
    for (int64_t t = 0; t < T; ++t) {
      double sum = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t x = r->routing[(l * T + t) * K + j];
        EXPECT_GE(x, 0);
        EXPECT_LT(x, 16);
        sum += r->routing_weights[(l * T + t) * K + j];
      }
      EXPECT_LT(sum, 1.0);
      EXPECT_GT(sum, 6.0 / 16);  // the top 6 of 16 probabilities hold at least 6/16 of the mass
    }
}

// Sigmoid gating with an expert bias (selection only), normalised top-k weights and a scale, as
// later DeepSeek-style checkpoints use: the engine against the fp64 reference, F32 weights.
TEST(Deepseek2, SigmoidGatingWithBias) {
  ScratchDir dir;
  const std::string path = dir.File("sigmoid.gguf");
  std::vector<std::vector<uint8_t>> storage;
  ASSERT_TRUE(RewriteGguf(kDs, path, [&](GgufContents* c) {
                SetU32(c, "deepseek2.expert_gating_func", 2);
                c->kvs.push_back({"deepseek2.expert_weights_norm", GgufValue::Bool(true)});
                if (GgufKv* kv = c->FindKv("deepseek2.expert_weights_scale")) kv->value = GgufValue::F32(2.5f);
                for (int il = 1; il < 3; ++il) {
                  storage.emplace_back(16 * sizeof(float));
                  float* b = reinterpret_cast<float*>(storage.back().data());
                  // Large enough to change the choice (sigmoid scores differ by ~0.1), awkward values.
                  for (int e = 0; e < 16; ++e) b[e] = 0.07f * static_cast<float>((e * 7 + il * 3) % 11) - 0.31f;
                  c->tensors.push_back({"blk." + std::to_string(il) + ".exp_probs_b.bias", QuantType::kF32, {16},
                                        storage.back().data(), storage.back().size()});
                }
              }).ok());
  auto e = Engine::Load(path, {.n_threads = 2});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto r = (*e)->Run({.tokens = Tokens(), .logits = Request::Logits::kAll, .return_routing = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto ref = ref::RefForward(path, Tokens());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const int64_t T = 48, K = 6;
  // Same expert sets (F32: no near-ties closer than fp32 noise in this prompt) with weights that
  // sum to the scale.
  for (int64_t l = 1; l < 3; ++l)
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> a(r->routing.begin() + (l * T + t) * K, r->routing.begin() + (l * T + t + 1) * K);
      std::vector<int32_t> b(ref->routing.begin() + (l * T + t) * K, ref->routing.begin() + (l * T + t + 1) * K);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      EXPECT_EQ(a, b) << "layer " << l << " token " << t;
      double sum = 0;
      for (int64_t j = 0; j < K; ++j) sum += r->routing_weights[(l * T + t) * K + j];
      EXPECT_NEAR(sum, 2.5, 1e-5);
    }
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    const double err = RelErr(r->logits.data() + t * kVocab, ref->logits.data() + t * kVocab, kVocab);
    worst = std::max(worst, err);
    EXPECT_LT(err, 5e-5) << "position " << t;
  }
  std::printf("sigmoid + bias + norm + scale: engine vs fp64 worst row relative error %.2e\n", worst);
  // Sigmoid and the bias change the choice: the original model routes differently somewhere.
  auto plain = Engine::Load(kDs, {.n_threads = 2});
  ASSERT_TRUE(plain.ok());
  auto pr = (*plain)->Run({.tokens = Tokens(), .top_k = 1, .return_routing = true});
  ASSERT_TRUE(pr.ok());
  int differ = 0;
  for (int64_t i = T * K; i < 3 * T * K; i += K) {
    std::vector<int32_t> a(r->routing.begin() + i, r->routing.begin() + i + K);
    std::vector<int32_t> b(pr->routing.begin() + i, pr->routing.begin() + i + K);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    differ += a != b;
  }
  EXPECT_GT(differ, 0);
}

// RouteToken: the plain softmax path is kernels::SoftmaxTopK bit for bit; the variants match a
// naive fp64 evaluation.
TEST(Deepseek2, RouteTokenVariants) {
  model::ModelConfig c;
  c.n_expert = 37;
  c.n_expert_used = 5;
  std::vector<float> logits(37), bias(37);
  for (int e = 0; e < 37; ++e) {
    logits[e] = std::sin(1.7f * e + 0.3f) * 2.3f;
    bias[e] = std::cos(0.9f * e) * 0.05f;
  }
  std::vector<int32_t> idx(5), idx2(5);
  std::vector<float> w(5), w2(5);
  for (bool norm : {false, true}) {
    c.expert_weights_norm = norm;
    model::RouteToken(c, logits.data(), nullptr, idx.data(), w.data());
    kernels::SoftmaxTopK(logits.data(), 37, 5, norm, idx2.data(), w2.data());
    EXPECT_EQ(idx, idx2);
    EXPECT_EQ(0, std::memcmp(w.data(), w2.data(), 5 * sizeof(float)));
  }
  for (model::ExpertGating g : {model::ExpertGating::kSoftmax, model::ExpertGating::kSigmoid})
    for (bool norm : {false, true})
      for (const float* b : {static_cast<const float*>(nullptr), static_cast<const float*>(bias.data())}) {
        c.gating = g;
        c.expert_weights_norm = norm;
        c.expert_weights_scale = 1.75f;
        model::RouteToken(c, logits.data(), b, idx.data(), w.data());
        std::vector<double> s(37), key(37);
        double z = 0, mx = *std::max_element(logits.begin(), logits.end());
        for (int e = 0; e < 37; ++e) z += std::exp(static_cast<double>(logits[e]) - mx);
        for (int e = 0; e < 37; ++e) {
          s[e] = g == model::ExpertGating::kSigmoid ? 1 / (1 + std::exp(-static_cast<double>(logits[e])))
                                                    : std::exp(static_cast<double>(logits[e]) - mx) / z;
          key[e] = s[e] + (b ? b[e] : 0.0);
        }
        std::vector<int> order(37);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return key[x] > key[y]; });
        double sum = 0;
        for (int j = 0; j < 5; ++j) sum += s[order[j]];
        for (int j = 0; j < 5; ++j) {
          EXPECT_EQ(idx[j], order[j]);
          EXPECT_NEAR(w[j], s[order[j]] / (norm ? sum : 1.0) * 1.75, 1e-6);
        }
      }
}

// The packed model: routed experts stream (the dense first block, shared experts and MLA weights
// stay in the dense part), under every schedule, and match the golden logits; resident packed
// too.
TEST(Deepseek2, PackedStreamedEverySchedule) {
  ScratchDir dir;
  const std::string packed = dir.File("ds.packed.gguf");
  {
    auto in = GgufFile::Open(kDs, {.mmap = false});
    ASSERT_TRUE(in.ok());
    auto st = io::PackModel(**in, packed);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->layers, 2);  // blocks 1 and 2; block 0 is dense
    auto out = GgufFile::Open(packed);
    ASSERT_TRUE(out.ok());
    EXPECT_NE((*out)->FindTensor("blk.1.ffn_gate_shexp.weight"), nullptr);
    EXPECT_NE((*out)->FindTensor("blk.0.ffn_gate.weight"), nullptr);
    EXPECT_EQ((*out)->FindTensor("blk.1.ffn_gate_exps.weight"), nullptr);
    EXPECT_EQ((*out)->FindTensor("blk.0.ffn_exps.packed"), nullptr);
  }
  auto resident = RunLogits(packed);
  ASSERT_TRUE(resident.ok()) << resident.status().ToString();
  ExpectGolden(*resident, "packed resident");
  for (auto s : {EngineOptions::Schedule::kOnDemand, EngineOptions::Schedule::kAfterRouting,
                 EngineOptions::Schedule::kEarly})
    for (int g : {1, 4}) {
      auto logits = RunLogits(packed, {.n_threads = 2, .group_size = g, .banks = 2, .schedule = s, .budget_tokens = 64});
      ASSERT_TRUE(logits.ok()) << logits.status().ToString();
      ExpectGolden(*logits, "streamed schedule " + std::to_string(static_cast<int>(s)) + " G=" + std::to_string(g));
      EXPECT_EQ(0, std::memcmp(logits->data(), resident->data(), resident->size() * sizeof(float)))
          << "streamed differs from resident (identity permutation: bit-identical)";
    }
}

// ---- bad input ------------------------------------------------------------------------------

struct BadCase {
  const char* what;
  std::function<void(GgufContents*)> edit;
  StatusCode code;
  const char* names;  // the message must contain this
};

TEST(Deepseek2, CorruptModels) {
  const std::vector<BadCase> cases = {
      {"missing kv_a_norm", [](GgufContents* c) { c->EraseTensor("blk.1.attn_kv_a_norm.weight"); },
       StatusCode::kCorruption, "blk.1.attn_kv_a_norm.weight"},
      {"missing k_b", [](GgufContents* c) { c->EraseTensor("blk.2.attn_k_b.weight"); }, StatusCode::kCorruption,
       "blk.2.attn_k_b.weight"},
      {"missing dense ffn_up", [](GgufContents* c) { c->EraseTensor("blk.0.ffn_up.weight"); },
       StatusCode::kCorruption, "blk.0.ffn_up.weight"},
      {"missing shared expert", [](GgufContents* c) { c->EraseTensor("blk.2.ffn_down_shexp.weight"); },
       StatusCode::kCorruption, "blk.2.ffn_down_shexp.weight"},
      {"missing q", [](GgufContents* c) { c->EraseTensor("blk.0.attn_q.weight"); }, StatusCode::kCorruption,
       "blk.0.attn_q.weight"},
      {"q_lora_rank without q_a", [](GgufContents* c) { SetU32(c, "deepseek2.attention.q_lora_rank", 64); },
       StatusCode::kCorruption, "blk.0.attn_q_a.weight"},
      {"kv_lora_rank disagrees with tensors",
       [](GgufContents* c) { SetU32(c, "deepseek2.attention.kv_lora_rank", 96); }, StatusCode::kCorruption,
       "deepseek2.attention.key_length"},
      {"key_length_mla disagrees with attn_q",
       [](GgufContents* c) { SetU32(c, "deepseek2.attention.key_length_mla", 128); }, StatusCode::kCorruption,
       "blk.0.attn_q.weight"},
      {"rope wider than the head", [](GgufContents* c) { SetU32(c, "deepseek2.rope.dimension_count", 96); },
       StatusCode::kCorruption, "deepseek2.rope.dimension_count"},
      {"v wider than q/k", [](GgufContents* c) { SetU32(c, "deepseek2.attention.value_length_mla", 128); },
       StatusCode::kNotSupported, "deepseek2.attention.value_length_mla"},
      {"missing kv_lora_rank", [](GgufContents* c) { EraseKv(c, "deepseek2.attention.kv_lora_rank"); },
       StatusCode::kCorruption, "deepseek2.attention.kv_lora_rank"},
      {"all blocks dense", [](GgufContents* c) { SetU32(c, "deepseek2.leading_dense_block_count", 3); },
       StatusCode::kCorruption, "deepseek2.leading_dense_block_count"},
      {"unknown gating", [](GgufContents* c) { SetU32(c, "deepseek2.expert_gating_func", 7); },
       StatusCode::kNotSupported, "deepseek2.expert_gating_func"},
      {"group-limited routing", [](GgufContents* c) {
         SetU32(c, "deepseek2.expert_group_count", 4);
         SetU32(c, "deepseek2.expert_group_used_count", 2);
       }, StatusCode::kNotSupported, "deepseek2.expert_group_count"},
      {"linear rope scaling", [](GgufContents* c) {
         if (GgufKv* kv = c->FindKv("deepseek2.rope.scaling.type")) kv->value = GgufValue::String("linear");
       }, StatusCode::kNotSupported, "deepseek2.rope.scaling.type"},
      {"dense FFN with the wrong width", [](GgufContents* c) { SetU32(c, "deepseek2.feed_forward_length", 256); },
       StatusCode::kCorruption, "blk.0.ffn_gate.weight"},
  };
  ScratchDir dir;
  for (const BadCase& bc : cases) {
    SCOPED_TRACE(bc.what);
    const std::string path = dir.File("bad.gguf");
    ASSERT_TRUE(RewriteGguf(kDs, path, bc.edit).ok());
    auto e = Engine::Load(path, {.n_threads = 1});
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), bc.code) << e.status().ToString();
    EXPECT_NE(e.status().message().find(bc.names), std::string::npos) << e.status().ToString();
  }
}

}  // namespace
}  // namespace estream
