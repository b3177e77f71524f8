// The engine's API on the shared tiny models: loader checks (one case per defect: missing tensor,
// wrong shape, unsupported architecture, inconsistent hyper-parameters), request checks (empty,
// too long, ids out of range) with the engine serving the next request, Mixtral's per-expert
// tensors, consistency of the outputs with each other, and independence from the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "estream/engine.h"
#include "model/model.h"
#include "model_test_util.h"

namespace estream {
namespace {

using model_test::OutTensor;
using model_test::RewriteGguf;
using model_test::GgufContents;
using model_test::ScratchDir;
using model_test::ExpectError;
using model_test::LoadEdited;

const std::string kModels = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/";
const std::string kOlmoe = kModels + "olmoe-tiny-f32.gguf";
const std::string kQwen = kModels + "qwen3moe-tiny-f32.gguf";
const std::string kMixtral = kModels + "mixtral-tiny-f32.gguf";

std::vector<int32_t> Prompt(int n, int salt = 0) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 37 + salt * 11 + 5) % 512;
  return ids;
}

std::unique_ptr<Engine> LoadOk(const std::string& path, int threads = 2) {
  auto e = Engine::Load(path, {.n_threads = threads});
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

std::vector<float> AllLogits(Engine& e, const std::vector<int32_t>& ids) {
  auto r = e.Run({.tokens = ids, .top_k = 0, .logits = Request::Logits::kAll});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->logits : std::vector<float>{};
}

TEST(ModelLoad, Info) {
  auto e = LoadOk(kQwen);
  ASSERT_TRUE(e);
  const ModelInfo& i = e->info();
  EXPECT_EQ(i.architecture, "qwen3moe");
  EXPECT_EQ(i.n_layer, 2);
  EXPECT_EQ(i.n_embd, 256);
  EXPECT_EQ(i.n_head, 8);
  EXPECT_EQ(i.n_head_kv, 2);
  EXPECT_EQ(i.head_dim, 64);
  EXPECT_EQ(i.n_expert, 8);
  EXPECT_EQ(i.n_expert_used, 2);
  EXPECT_EQ(i.n_ff_expert, 128);
  EXPECT_EQ(i.n_vocab, 512);
  EXPECT_EQ(i.n_ctx, 4096);
  EXPECT_EQ(e->n_threads(), 2);
}

TEST(ModelLoad, MissingFile) {
  auto e = Engine::Load("/nonexistent/model.gguf");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kIOError);
}

TEST(ModelLoad, BudgetNeedsPackedModel) {
  for (EngineOptions o : {EngineOptions{.budget_bytes = 1ull << 30}, EngineOptions{.group_size = 2},
                          EngineOptions{.banks = 2}}) {
    auto e = Engine::Load(kOlmoe, o);
    ASSERT_FALSE(e.ok());
    ExpectError(e.status(), StatusCode::kInvalidArgument, {"olmoe-tiny-f32.gguf", "packed", "estream pack"});
  }
}

TEST(ModelLoad, MissingTensor) {
  ExpectError(LoadEdited(kOlmoe, [](GgufContents* c) { c->EraseTensor("blk.1.attn_k.weight"); }),
              StatusCode::kCorruption, {"blk.1.attn_k.weight", "missing", "[256, 256]"});
  ExpectError(LoadEdited(kQwen, [](GgufContents* c) { c->EraseTensor("blk.0.ffn_down_exps.weight"); }),
              StatusCode::kCorruption, {"blk.0.ffn_down_exps.weight", "missing", "[128, 256, 8]"});
  ExpectError(LoadEdited(kQwen, [](GgufContents* c) { c->EraseTensor("blk.1.attn_q_norm.weight"); }),
              StatusCode::kCorruption, {"blk.1.attn_q_norm.weight", "missing", "[64]"});
  ExpectError(LoadEdited(kMixtral, [](GgufContents* c) { c->EraseTensor("output_norm.weight"); }),
              StatusCode::kCorruption, {"output_norm.weight", "missing"});
}

TEST(ModelLoad, WrongShape) {
  // Same bytes, other dims: the loader must name both shapes.
  ExpectError(LoadEdited(kOlmoe, [](GgufContents* c) { c->FindTensor("blk.0.attn_q.weight")->dims = {128, 512}; }),
              StatusCode::kCorruption, {"blk.0.attn_q.weight", "[128, 512]", "expected [256, 256]"});
  ExpectError(LoadEdited(kQwen, [](GgufContents* c) { c->FindTensor("blk.1.ffn_gate_exps.weight")->dims = {256, 256, 4}; }),
              StatusCode::kCorruption, {"blk.1.ffn_gate_exps.weight", "[256, 256, 4]", "expected [256, 128, 8]"});
  ExpectError(LoadEdited(kQwen, [](GgufContents* c) { c->FindTensor("blk.0.attn_k_norm.weight")->dims = {32, 2}; }),
              StatusCode::kCorruption, {"blk.0.attn_k_norm.weight", "[32, 2]", "expected [64]"});
}

TEST(ModelLoad, UnsupportedArchitecture) {
  ExpectError(LoadEdited(kOlmoe, [](GgufContents* c) {
                c->FindKv("general.architecture")->value = GgufValue::String("gpt2");
              }),
              StatusCode::kNotSupported, {"gpt2", "olmoe", "qwen3moe", "llama"});
}

TEST(ModelLoad, DenseLlamaRefused) {
  ExpectError(LoadEdited(kMixtral, [](GgufContents* c) {
                std::erase_if(c->kvs, [](const GgufKv& kv) { return kv.key == "llama.expert_count"; });
              }),
              StatusCode::kNotSupported, {"no experts"});
}

TEST(ModelLoad, InconsistentHyperParameters) {
  ExpectError(LoadEdited(kOlmoe, [](GgufContents* c) { c->FindKv("olmoe.expert_used_count")->value = GgufValue::U32(9); }),
              StatusCode::kCorruption, {"olmoe.expert_used_count", "9"});
  ExpectError(LoadEdited(kQwen, [](GgufContents* c) {
                c->FindKv("qwen3moe.attention.head_count_kv")->value = GgufValue::U32(3);
              }),
              StatusCode::kCorruption, {"qwen3moe.attention.head_count", "head_count_kv = 3"});
  // head_dim that does not match the projections shows up as a shape error.
  ExpectError(LoadEdited(kQwen, [](GgufContents* c) {
                c->FindKv("qwen3moe.attention.key_length")->value = GgufValue::U32(32);
                c->FindKv("qwen3moe.attention.value_length")->value = GgufValue::U32(32);
                c->FindKv("qwen3moe.rope.dimension_count")->value = GgufValue::U32(32);
              }),
              StatusCode::kCorruption, {"blk.0.attn_q.weight", "expected [256, 256]"});
  ExpectError(LoadEdited(kMixtral, [](GgufContents* c) { c->FindKv("llama.rope.dimension_count")->value = GgufValue::U32(32); }),
              StatusCode::kNotSupported, {"partial RoPE"});
  ExpectError(LoadEdited(kMixtral, [](GgufContents* c) {
                std::erase_if(c->kvs, [](const GgufKv& kv) { return kv.key == "llama.block_count"; });
              }),
              StatusCode::kCorruption, {"llama.block_count"});
  ExpectError(LoadEdited(kOlmoe, [](GgufContents* c) { c->FindKv("olmoe.vocab_size")->value = GgufValue::U32(1000); }),
              StatusCode::kCorruption, {"olmoe.vocab_size", "512"});
}

TEST(ModelLoad, UnsupportedTensorType) {
  // An I32 tensor where a matrix belongs: same byte count as the F32 original.
  ExpectError(LoadEdited(kOlmoe, [](GgufContents* c) { c->FindTensor("blk.0.attn_v.weight")->type = QuantType::kI32; }),
              StatusCode::kNotSupported, {"blk.0.attn_v.weight", "i32"});
}

// Tensors of a block past block_count would be ignored, running a shallower model: refused.
TEST(ModelLoad, TensorsBeyondBlockCountRefused) {
  ExpectError(LoadEdited(kOlmoe, [](GgufContents* c) { c->FindKv("olmoe.block_count")->value = GgufValue::U32(1); }),
              StatusCode::kCorruption, {"the file has tensors for layer 1 ('blk.1.", "olmoe.block_count is 1"});
}

// Model::Validate (what `estream pack` runs on its source) refuses exactly what Load refuses, with
// the same message, on a file opened without a mapping (no tensor byte is read).
TEST(ModelLoad, ValidateAgreesWithLoad) {
  static std::vector<uint8_t> q8k_bytes;  // a matrix relabelled as q8_K needs bytes of its size
  const std::vector<std::pair<std::string, std::function<void(GgufContents*)>>> edits = {
      {"unchanged", [](GgufContents*) {}},
      {"head_count 0", [](GgufContents* c) { c->FindKv("olmoe.attention.head_count")->value = GgufValue::U32(0); }},
      {"epsilon NaN",
       [](GgufContents* c) {
         c->FindKv("olmoe.attention.layer_norm_rms_epsilon")->value = GgufValue::F32(std::nanf(""));
       }},
      {"no output_norm", [](GgufContents* c) { c->EraseTensor("output_norm.weight"); }},
      {"attn_q reshaped", [](GgufContents* c) { c->FindTensor("blk.0.attn_q.weight")->dims = {128, 512}; }},
      {"block_count 1", [](GgufContents* c) { c->FindKv("olmoe.block_count")->value = GgufValue::U32(1); }},
      {"block_count 2^32-1",
       [](GgufContents* c) { c->FindKv("olmoe.block_count")->value = GgufValue::U32(0xFFFFFFFFu); }},
      {"q8_K weight",
       [](GgufContents* c) {
         OutTensor* t = c->FindTensor("blk.0.attn_q.weight");
         t->type = QuantType::kQ8_K;
         q8k_bytes.assign(RowBytes(QuantType::kQ8_K, t->dims[0]) * t->dims[1], 0);
         t->data = q8k_bytes.data();
         t->size = q8k_bytes.size();
       }},
  };
  for (const std::string& src : {kOlmoe, kQwen, kMixtral}) {
    for (const auto& [label, edit] : edits) {
      if (src != kOlmoe && label != "unchanged") continue;  // the edits name olmoe's keys
      SCOPED_TRACE(src + ": " + label);
      ScratchDir dir;
      const std::string path = dir.File("edited.gguf");
      ASSERT_TRUE(RewriteGguf(src, path, edit).ok());
      auto file = GgufFile::Open(path, {.mmap = false});
      ASSERT_TRUE(file.ok()) << file.status().ToString();
      const Status validated = model::Model::Validate(**file);
      auto loaded = model::Model::Load(path);
      EXPECT_EQ(validated.ToString(), loaded.status().ToString());
      EXPECT_EQ(validated.ok(), label == "unchanged");
    }
  }
}

// NaN weights (here a NaN in output_norm, as a relabelled or shifted tensor gives) are an error of
// the request naming the file, never NaN logits or embeddings returned as a result; the engine
// then serves the next request.
TEST(Request, NonFiniteOutputsAreAnError) {
  ScratchDir dir;
  const std::string path = dir.File("nan.gguf");
  std::vector<float> norm;
  ASSERT_TRUE(RewriteGguf(kOlmoe, path, [&](GgufContents* c) {
                OutTensor* t = c->FindTensor("output_norm.weight");
                norm.assign(t->size / sizeof(float), 1.0f);
                norm[7] = std::nanf("");
                t->data = reinterpret_cast<const uint8_t*>(norm.data());
              }).ok());
  std::unique_ptr<Engine> e = LoadOk(path);
  ASSERT_NE(e, nullptr);
  for (const Request& r : {Request{.tokens = Prompt(5), .top_k = 3}, Request{.tokens = Prompt(5), .top_k = 0,
                                                                            .logits = Request::Logits::kAll},
                           Request{.tokens = Prompt(5), .top_k = 0, .embedding = Request::Pooling::kMean}}) {
    auto out = e->Run(r);
    ASSERT_FALSE(out.ok());
    ExpectError(out.status(), StatusCode::kCorruption, {"nan.gguf", "non-finite values (NaN/inf)", "corrupt"});
  }
  // The engine stays usable: a request that needs neither logits nor the embedding still runs.
  EXPECT_TRUE(e->Run({.tokens = Prompt(5), .top_k = 0}).ok());
}

// Mixtral's older per-expert tensors give exactly the merged model's results (same bytes, same
// kernels, same order).
TEST(ModelLoad, MixtralPerExpertTensors) {
  ScratchDir dir;
  const std::string split = dir.File("mixtral-split.gguf");
  ASSERT_TRUE(RewriteGguf(kMixtral, split, model_test::SplitExperts).ok());
  {
    auto f = GgufFile::Open(split);
    ASSERT_TRUE(f.ok());
    EXPECT_TRUE((*f)->FindTensor("blk.1.ffn_down.7.weight"));
    EXPECT_FALSE((*f)->FindTensor("blk.1.ffn_down_exps.weight"));
  }
  auto merged = LoadOk(kMixtral), per_expert = LoadOk(split);
  ASSERT_TRUE(merged && per_expert);
  const auto ids = Prompt(40);
  EXPECT_EQ(AllLogits(*merged, ids), AllLogits(*per_expert, ids));
}

TEST(Request, BadRequestsThenServes) {
  auto e = LoadOk(kOlmoe);
  ASSERT_TRUE(e);
  const auto ids = Prompt(17);
  const std::vector<float> before = AllLogits(*e, ids);

  auto r = e->Run({.tokens = {}});
  ASSERT_FALSE(r.ok());
  ExpectError(r.status(), StatusCode::kInvalidArgument, {"empty prompt"});

  r = e->Run({.tokens = std::vector<int32_t>(4097, 1)});
  ASSERT_FALSE(r.ok());
  ExpectError(r.status(), StatusCode::kOutOfRange, {"4097", "4096"});

  r = e->Run({.tokens = {1, 2, 512}});
  ASSERT_FALSE(r.ok());
  ExpectError(r.status(), StatusCode::kInvalidArgument, {"512", "position 2"});

  r = e->Run({.tokens = {-1}});
  ASSERT_FALSE(r.ok());
  ExpectError(r.status(), StatusCode::kInvalidArgument, {"-1", "position 0"});

  r = e->Run({.tokens = {1}, .top_k = 513});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  // A sink that fails aborts the request with its Status.
  r = e->Run({.tokens = ids, .logits_sink = [](int64_t, int64_t, const float*) {
                return Status::IOError("disk full");
              }});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "disk full");

  // The engine still serves, with the same results as before.
  EXPECT_EQ(AllLogits(*e, ids), before);
}

TEST(Request, OutputsAgree) {
  auto e = LoadOk(kQwen);
  ASSERT_TRUE(e);
  const auto ids = Prompt(29, 3);
  const int64_t T = ids.size(), V = 512;
  const std::vector<float> all = AllLogits(*e, ids);
  ASSERT_EQ(all.size(), static_cast<size_t>(T * V));

  auto r = e->Run({.tokens = ids, .top_k = 7, .logits = Request::Logits::kLast, .prompt_logprobs = true,
                   .embedding = Request::Pooling::kLast});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->n_tokens, T);
  // Last-position logits are the last row of the full matrix (same rows, same kernels).
  ASSERT_EQ(r->logits.size(), static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) EXPECT_EQ(r->logits[i], all[(T - 1) * V + i]);
  // Prompt log-probabilities: log-softmax of row t at token t+1.
  ASSERT_EQ(r->prompt_logprobs.size(), static_cast<size_t>(T - 1));
  double ll = 0;
  for (int64_t t = 0; t + 1 < T; ++t) {
    const float* row = all.data() + t * V;
    double mx = row[0], z = 0;
    for (int64_t i = 0; i < V; ++i) mx = std::max<double>(mx, row[i]);
    for (int64_t i = 0; i < V; ++i) z += std::exp(row[i] - mx);
    const double want = row[ids[t + 1]] - mx - std::log(z);
    EXPECT_NEAR(r->prompt_logprobs[t], want, 1e-5) << t;
    // The public LogSumExp is the engine's normaliser, bit for bit.
    EXPECT_EQ(r->prompt_logprobs[t], static_cast<float>(row[ids[t + 1]] - LogSumExp(row, V))) << t;
    ll += want;
  }
  EXPECT_EQ(LogSumExp(all.data(), 0), -INFINITY);
  EXPECT_TRUE(std::isnan(LogSumExp(nullptr, V)));
  EXPECT_NEAR(r->log_likelihood, ll, 1e-4);
  EXPECT_NEAR(r->perplexity, std::exp(-ll / (T - 1)), 1e-6 * r->perplexity);
  // Top-k: sorted, consistent with the last row, and the true top 7.
  ASSERT_EQ(r->top.size(), 7u);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  const float* last = all.data() + (T - 1) * V;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return last[a] > last[b]; });
  for (int j = 0; j < 7; ++j) EXPECT_EQ(r->top[j].token, order[j]);
  EXPECT_NEAR(std::exp(r->top[0].logprob) / std::exp(r->top[1].logprob), std::exp(last[order[0]] - last[order[1]]),
              1e-4);
  // Embedding: the final hidden state of the last token (unit RMS up to the norm weights).
  ASSERT_EQ(r->embedding.size(), 256u);

  // Mean pooling is the mean of the per-token last-pooled embeddings of every prefix? No: of the
  // final hidden states of one pass. Check it against prefixes: the hidden state of position t
  // does not depend on later tokens (causal), so it equals the last-pooled embedding of the
  // prefix ids[0..t].
  auto mean = e->Run({.tokens = ids, .top_k = 0, .embedding = Request::Pooling::kMean});
  ASSERT_TRUE(mean.ok());
  std::vector<double> acc(256, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    auto p = e->Run({.tokens = std::vector<int32_t>(ids.begin(), ids.begin() + t + 1), .top_k = 0,
                     .embedding = Request::Pooling::kLast});
    ASSERT_TRUE(p.ok());
    for (int i = 0; i < 256; ++i) acc[i] += p->embedding[i];
  }
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(mean->embedding[i], acc[i] / T, 1e-4 * (1 + std::fabs(acc[i] / T))) << i;

  // The sink sees every row, in order, equal to the stored logits.
  std::vector<float> sunk;
  int64_t next = 0;
  auto s = e->Run({.tokens = ids, .top_k = 0, .logits_sink = [&](int64_t first, int64_t n, const float* l) {
                     EXPECT_EQ(first, next);
                     next += n;
                     sunk.insert(sunk.end(), l, l + n * V);
                     return Status::Ok();
                   }});
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->logits.empty());
  EXPECT_EQ(sunk, all);

  // A one-token prompt has no scored tokens.
  auto one = e->Run({.tokens = {7}, .prompt_logprobs = true});
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->prompt_logprobs.empty());
  EXPECT_TRUE(std::isnan(one->perplexity));
}

// Every split the engine makes is by output element or by row, with fixed reduction order, so the
// results are bit-identical for any thread count; and a later, shorter request is unaffected by
// what an earlier, longer one left in the buffers.
TEST(Request, ThreadCountAndReuseInvariant) {
  for (const std::string& path : {kOlmoe, kQwen, kMixtral}) {
    auto e1 = LoadOk(path, 1), e3 = LoadOk(path, 3);
    ASSERT_TRUE(e1 && e3);
    const auto long_ids = Prompt(100, 1), ids = Prompt(23, 2);
    const std::vector<float> a = AllLogits(*e1, ids);
    (void)AllLogits(*e3, long_ids);
    EXPECT_EQ(AllLogits(*e3, ids), a) << path;
  }
}

}  // namespace
}  // namespace estream
