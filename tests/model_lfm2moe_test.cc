// LFM2-MoE (arch "lfm2moe") end to end on the shared tiny reference model (4 layers: conv, conv,
// attention, conv; dense first two layers; sigmoid routing with an expert bias; tied LM head):
//  - packed (`estream pack` at test time) and run resident and streamed under every schedule:
//    bit-identical to the resident GGUF run (the experts of a group are added in expert order
//    into the layer's fp64 sum, as resident), and within the golden tolerance of the golden
//    logits (the plain GGUF run's golden check is model_golden_test's);
//  - bad input: a missing or misshapen conv tensor, a layer pattern that does not fit the model,
//    a missing kernel length or final norm: a one-line error naming the key or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "estream/engine.h"
#include "gguf/gguf.h"
#include "pack/pack_model.h"
#include "expect_isa.h"
#include "model_test_util.h"

namespace estream {
namespace {

using model_test::GgufContents;
using model_test::RewriteGguf;
using model_test::ScratchDir;
using model_test::ExpectError;

const std::string kModels = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/";
const std::string kLfm = kModels + "lfm2moe-tiny-f32.gguf";
constexpr int64_t kVocab = 512;

std::vector<int32_t> Tokens() { return model_test::ReadTokens(kModels + "lfm2moe-tiny.tokens.txt"); }
std::vector<float> Golden() { return model_test::ReadF32(kModels + "lfm2moe-tiny-f32.logits.f32"); }

// Worst ||a - b|| / ||b|| over the rows; counts rows whose arg-max differs.
double WorstRowRelErr(const std::vector<float>& a, const std::vector<float>& b, int* argmax_diff) {
  double worst = 0;
  *argmax_diff = 0;
  for (size_t r = 0; r * kVocab < b.size(); ++r) {
    double num = 0, den = 0;
    int64_t ia = 0, ib = 0;
    for (int64_t i = 0; i < kVocab; ++i) {
      const double x = a[r * kVocab + i], y = b[r * kVocab + i];
      num += (x - y) * (x - y);
      den += y * y;
      if (x > a[r * kVocab + ia]) ia = i;
      if (y > b[r * kVocab + ib]) ib = i;
    }
    worst = std::max(worst, std::sqrt(num / den));
    *argmax_diff += ia != ib;
  }
  return worst;
}

Result<std::vector<float>> RunAll(const std::string& path, const EngineOptions& o) {
  ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Load(path, o));
  ESTREAM_ASSIGN_OR_RETURN(Response r, e->Run({.tokens = Tokens(), .top_k = 0, .logits = Request::Logits::kAll}));
  return r.logits;
}

TEST(Lfm2Moe, PackedResidentAndStreamedMatchGolden) {
  ScratchDir dir;
  const std::string packed = dir.File("lfm2moe.packed.gguf");
  {
    auto in = GgufFile::Open(kLfm, {.mmap = false});
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    auto st = io::PackModel(**in, packed);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
  }
  auto plain = RunAll(kLfm, {.n_threads = 2});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  const std::vector<float> golden = Golden();
  int diff = 0;
  EXPECT_LT(WorstRowRelErr(*plain, golden, &diff), 5e-5);
  EXPECT_EQ(diff, 0);

  auto resident = RunAll(packed, {.n_threads = 2});
  ASSERT_TRUE(resident.ok()) << resident.status().ToString();
  EXPECT_EQ(std::memcmp(resident->data(), plain->data(), plain->size() * sizeof(float)), 0)
      << "resident packed run differs from the GGUF run";

  using S = EngineOptions::Schedule;
  for (S s : {S::kOnDemand, S::kAfterRouting, S::kEarly})
    for (auto [g, b] : {std::pair{1, 1}, {3, 2}, {16, 1}}) {
      const std::string what = "schedule " + std::to_string(static_cast<int>(s)) + " G=" + std::to_string(g) +
                               " B=" + std::to_string(b);
      auto streamed = RunAll(packed, {.n_threads = 2, .group_size = g, .banks = b, .schedule = s, .budget_tokens = 64});
      ASSERT_TRUE(streamed.ok()) << what << ": " << streamed.status().ToString();
      EXPECT_EQ(std::memcmp(streamed->data(), plain->data(), plain->size() * sizeof(float)), 0) << what;
      EXPECT_LT(WorstRowRelErr(*streamed, golden, &diff), 5e-5) << what;
      EXPECT_EQ(diff, 0) << what;
    }
}

// Loads a copy of the tiny model edited by `edit`; returns the load Status.
Status LoadEdited(const std::function<void(GgufContents*)>& edit) { return model_test::LoadEdited(kLfm, edit); }

GgufValue KvArray(std::vector<uint32_t> v) {
  std::vector<GgufValue> e;
  for (uint32_t x : v) e.push_back(GgufValue::U32(x));
  return GgufValue::Array(GgufType::kU32, e);
}

TEST(Lfm2Moe, MissingOrMisshapenTensors) {
  ExpectError(LoadEdited([](GgufContents* c) { c->EraseTensor("blk.1.shortconv.conv.weight"); }),
              StatusCode::kCorruption, {"blk.1.shortconv.conv.weight", "missing", "[3, 256]"});
  ExpectError(LoadEdited([](GgufContents* c) { c->EraseTensor("blk.3.shortconv.in_proj.weight"); }),
              StatusCode::kCorruption, {"blk.3.shortconv.in_proj.weight", "missing", "[256, 768]"});
  ExpectError(LoadEdited([](GgufContents* c) { c->EraseTensor("blk.0.shortconv.out_proj.weight"); }),
              StatusCode::kCorruption, {"blk.0.shortconv.out_proj.weight", "missing"});
  ExpectError(LoadEdited([](GgufContents* c) { c->EraseTensor("blk.2.attn_q_norm.weight"); }),
              StatusCode::kCorruption, {"blk.2.attn_q_norm.weight", "missing", "[64]"});
  ExpectError(LoadEdited([](GgufContents* c) { c->EraseTensor("token_embd_norm.weight"); }),
              StatusCode::kCorruption, {"token_embd_norm.weight", "missing"});
  // The MoE and dense-FFN parts: the expert bias is required (llama.cpp's lfm2moe loader requires it).
  ExpectError(LoadEdited([](GgufContents* c) { c->EraseTensor("blk.3.exp_probs_b.bias"); }),
              StatusCode::kCorruption, {"blk.3.exp_probs_b.bias", "missing", "[16]"});
  ExpectError(LoadEdited([](GgufContents* c) { c->EraseTensor("blk.1.ffn_up.weight"); }),
              StatusCode::kCorruption, {"blk.1.ffn_up.weight", "missing", "[256, 512]"});
  ExpectError(LoadEdited([](GgufContents* c) { c->FindTensor("blk.0.shortconv.conv.weight")->dims = {256, 3}; }),
              StatusCode::kCorruption, {"blk.0.shortconv.conv.weight", "[256, 3]", "expected [3, 256]"});
  ExpectError(LoadEdited([](GgufContents* c) { c->FindTensor("blk.1.shortconv.in_proj.weight")->dims = {768, 256}; }),
              StatusCode::kCorruption, {"blk.1.shortconv.in_proj.weight", "expected [256, 768]"});
}

TEST(Lfm2Moe, BadLayerPatternOrKernelLength) {
  // A pattern of the wrong length.
  ExpectError(LoadEdited([](GgufContents* c) { c->FindKv("lfm2moe.attention.head_count_kv")->value = KvArray({0, 0, 2}); }),
              StatusCode::kCorruption, {"lfm2moe.attention.head_count_kv", "3 entries", "block_count"});
  // Attention layers with different kv head counts.
  ExpectError(LoadEdited([](GgufContents* c) {
                c->FindKv("lfm2moe.attention.head_count_kv")->value = KvArray({2, 0, 4, 0});
              }),
              StatusCode::kNotSupported, {"lfm2moe.attention.head_count_kv", "layer 2"});
  // A pattern that makes layer 0 an attention layer: its tensors are conv tensors.
  ExpectError(LoadEdited([](GgufContents* c) {
                c->FindKv("lfm2moe.attention.head_count_kv")->value = KvArray({2, 0, 2, 0});
              }),
              StatusCode::kCorruption, {"blk.0.attn_q.weight", "missing"});
  // ... and the other way round.
  ExpectError(LoadEdited([](GgufContents* c) {
                c->FindKv("lfm2moe.attention.head_count_kv")->value = KvArray({0, 0, 0, 0});
              }),
              StatusCode::kCorruption, {"blk.2.shortconv.in_proj.weight", "missing"});
  ExpectError(LoadEdited([](GgufContents* c) {
                std::erase_if(c->kvs, [](const GgufKv& kv) { return kv.key == "lfm2moe.shortconv.l_cache"; });
              }),
              StatusCode::kCorruption, {"lfm2moe.shortconv.l_cache", "missing"});
  ExpectError(LoadEdited([](GgufContents* c) { c->FindKv("lfm2moe.shortconv.l_cache")->value = GgufValue::U32(0); }),
              StatusCode::kCorruption, {"lfm2moe.shortconv.l_cache", "0"});
  // A kernel length that does not match the conv tensors.
  ExpectError(LoadEdited([](GgufContents* c) { c->FindKv("lfm2moe.shortconv.l_cache")->value = GgufValue::U32(4); }),
              StatusCode::kCorruption, {"blk.0.shortconv.conv.weight", "expected [4, 256]"});
  // A negative entry.
  ExpectError(LoadEdited([](GgufContents* c) {
                c->FindKv("lfm2moe.attention.head_count_kv")->value =
                    GgufValue::Array(GgufType::kI32, {GgufValue::I32(0), GgufValue::I32(0), GgufValue::I32(-2),
                                                      GgufValue::I32(0)});
              }),
              StatusCode::kCorruption, {"lfm2moe.attention.head_count_kv[2]"});
}

}  // namespace
}  // namespace estream
