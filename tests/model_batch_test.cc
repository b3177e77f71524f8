// Engine::RunBatch (issue 16): many requests in one forward pass, and shared-prefix candidates.
//  - every output kind (top-k, last and all logits, logits sink, prompt log-probabilities,
//    embeddings last/mean, routing) of every request of a batch with mixed lengths (1 included)
//    equals the single-request Run of that request, for every architecture (shared tiny models)
//    and every model kind (GGUF, packed resident, packed streamed under each schedule);
//  - a batch larger than one pass (EngineOptions::batch_tokens) is split into passes;
//  - bad requests (empty, too long, ids out of range, empty continuation, longer than a pass)
//    fail alone, the others complete;
//  - continuations: each one's per-token log-likelihoods, sum and is_greedy equal those of running
//    context ++ continuation alone (prompt_logprobs and the argmax of its logits).
// The kernels split work by rows and output elements with a fixed reduction order and the
// attention of a row sees only its own sequence's keys, so the comparisons are bit for bit where
// the engine promises it and within 1e-5 relative otherwise (the streamed path's fp64 expert sum
// can differ at rounding ties only with a permutation, which is not used here).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "estream/engine.h"
#include "model_test_util.h"
#include "pipeline_test_util.h"

namespace estream {
namespace {

using pipeline_test::TestModels;

const std::string kModels = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/";

std::vector<int32_t> Tokens(int n, int salt, int vocab) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 37 + salt * 101 + 5) % vocab;
  return ids;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

// got == want within 1e-5 of want's largest magnitude (bit-identical passes too).
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double scale = std::max(1e-30, MaxAbs(want));
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]) / scale;
    worst = std::max(worst, e);
    if (!(e <= 1e-5)) ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << ": worst relative error " << worst;
}

// Every output of `got` (a batch response) equals the single-request `want`.
void ExpectSameResponse(const Response& got, const Response& want, const std::string& what) {
  EXPECT_EQ(got.n_tokens, want.n_tokens) << what;
  ASSERT_EQ(got.top.size(), want.top.size()) << what;
  for (size_t i = 0; i < want.top.size(); ++i) {
    EXPECT_EQ(got.top[i].token, want.top[i].token) << what << " top " << i;
    EXPECT_NEAR(got.top[i].logprob, want.top[i].logprob, 1e-5 * (1 + std::fabs(want.top[i].logprob))) << what;
  }
  ExpectClose(got.logits, want.logits, what + " logits");
  ExpectClose(got.prompt_logprobs, want.prompt_logprobs, what + " prompt_logprobs");
  EXPECT_NEAR(got.log_likelihood, want.log_likelihood, 1e-5 * (1 + std::fabs(want.log_likelihood))) << what;
  ExpectClose(got.embedding, want.embedding, what + " embedding");
  EXPECT_EQ(got.routing, want.routing) << what;
  ExpectClose(got.routing_weights, want.routing_weights, what + " routing weights");
  ASSERT_EQ(got.continuations.size(), want.continuations.size()) << what;
  for (size_t j = 0; j < want.continuations.size(); ++j) {
    ExpectClose(got.continuations[j].logprobs, want.continuations[j].logprobs, what + " continuation");
    EXPECT_EQ(got.continuations[j].is_greedy, want.continuations[j].is_greedy) << what;
  }
}

// A batch with mixed lengths (1 included) and every output kind, some requests with candidates.
std::vector<Request> MixedBatch(int vocab) {
  std::vector<Request> b;
  const int lengths[] = {13, 1, 70, 2, 33, 5, 64, 1, 17};
  for (int i = 0; i < 9; ++i) {
    Request r;
    r.tokens = Tokens(lengths[i], i, vocab);
    r.top_k = i % 3 == 0 ? 0 : 3 + i;
    switch (i % 4) {
      case 0: r.logits = Request::Logits::kAll; break;
      case 1: r.logits = Request::Logits::kLast; break;
      default: break;
    }
    r.prompt_logprobs = i % 2 == 0;
    r.embedding = i % 3 == 1 ? Request::Pooling::kMean : (i % 3 == 2 ? Request::Pooling::kLast : Request::Pooling::kNone);
    r.return_routing = i % 2 == 1;
    if (i == 4 || i == 7) r.continuations = {Tokens(4, 50 + i, vocab), Tokens(1, 60 + i, vocab), Tokens(9, 70 + i, vocab)};
    b.push_back(std::move(r));
  }
  return b;
}

// RunBatch(batch, pack_tokens) vs Run of each request alone, and the pass bookkeeping: a pass
// holds at most pack_tokens tokens (when > 0) unless it is one longer request alone.
void CheckBatchMatchesSingles(Engine& e, const std::vector<Request>& batch, const std::string& what,
                              int min_passes = 1, int64_t pack_tokens = 0) {
  std::vector<Result<Response>> got = e.RunBatch(batch, pack_tokens);
  ASSERT_EQ(got.size(), batch.size());
  int passes = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << what << " request " << i << ": " << got[i].status().ToString();
    passes = std::max(passes, got[i]->pass + 1);
    EXPECT_LE(got[i]->pass_tokens, 4096) << what;
    if (pack_tokens > 0) {
      EXPECT_TRUE(got[i]->pass_tokens <= pack_tokens || got[i]->pass_requests == 1)
          << what << " request " << i << ": pass of " << got[i]->pass_tokens << " tokens, "
          << got[i]->pass_requests << " requests";
    }
  }
  EXPECT_GE(passes, min_passes) << what;
  for (size_t i = 0; i < batch.size(); ++i) {
    auto want = e.Run(batch[i]);
    ASSERT_TRUE(want.ok()) << what << ": " << want.status().ToString();
    EXPECT_EQ(want->pass_requests, 1);
    ExpectSameResponse(*got[i], *want, what + " request " + std::to_string(i));
  }
}

TEST(Batch, EveryArchMatchesSingleRequests) {
  for (const char* name : {"olmoe-tiny-f32.gguf", "qwen3moe-tiny-f32.gguf", "mixtral-tiny-f32.gguf", "deepseek2-tiny-f32.gguf",
                           "lfm2moe-tiny-f32.gguf"}) {
    auto e = Engine::Load(kModels + name, {.n_threads = 2});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    CheckBatchMatchesSingles(**e, MixedBatch((*e)->info().n_vocab), name);
  }
}

TEST(Batch, SplitIntoPasses) {
  // 64 tokens per pass: the 70-token request alone would not fit; make the longest 60.
  auto e = Engine::Load(kModels + "qwen3moe-tiny-f32.gguf", {.n_threads = 2, .batch_tokens = 64});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<Request> batch = MixedBatch((*e)->info().n_vocab);
  batch[2].tokens.resize(60);
  batch[6].tokens.resize(40);
  CheckBatchMatchesSingles(**e, batch, "batch_tokens 64", /*min_passes=*/3);
}

// pack_tokens bounds the passes below the engine's pass_tokens() (here 8192: the default for a
// context of 4096); the 70- and 64-token requests, longer than the bound, run alone.
TEST(Batch, PackTokensBoundsThePassesAndLongerRequestsRunAlone) {
  auto e = Engine::Load(kModels + "qwen3moe-tiny-f32.gguf", {.n_threads = 2});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ((*e)->pass_tokens(), 8192);
  CheckBatchMatchesSingles(**e, MixedBatch((*e)->info().n_vocab), "pack_tokens 40", /*min_passes=*/5,
                           /*pack_tokens=*/40);
}

// interrupted is asked before every pass and every layer; once it says true, the pass stops and
// its requests and those of later passes fail with Cancelled, the passes finished keep their
// results (equal to single runs), and the engine stays usable: resident and streamed.
void CheckInterrupted(Engine& e, const std::string& what) {
  const std::vector<Request> batch = MixedBatch(e.info().n_vocab);
  const int per_pass = 1 + e.info().n_layer;  // before the pass, before each layer
  int asked = 0;
  auto got = e.RunBatch(batch, /*pack_tokens=*/40, [&] { return ++asked > 2 * per_pass + 2; });
  EXPECT_EQ(asked, 2 * per_pass + 3) << what;  // passes 0 and 1, then pass 2 up to its layer 1
  int cancelled = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (got[i].ok()) {
      EXPECT_LT(got[i]->pass, 2) << what;
      auto want = e.Run(batch[i]);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      ExpectSameResponse(*got[i], *want, what + ": request " + std::to_string(i) + " of an interrupted batch");
    } else {
      ++cancelled;
      EXPECT_EQ(got[i].status().code(), StatusCode::kCancelled) << got[i].status().ToString();
      const std::string& m = got[i].status().message();
      EXPECT_TRUE(m.find("interrupted at layer 1 of ") != std::string::npos || m.find("(2 of ") != std::string::npos)
          << m;
    }
  }
  EXPECT_GT(cancelled, 0) << what;
  EXPECT_LT(cancelled, static_cast<int>(batch.size())) << what;
  auto none = e.RunBatch(batch, 40, [] { return true; });
  for (const auto& r : none) EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  CheckBatchMatchesSingles(e, batch, what + ", after an interrupted batch", /*min_passes=*/5, /*pack_tokens=*/40);
}

TEST(Batch, InterruptedStopsThePassAndTheBatch) {
  auto e = Engine::Load(kModels + "qwen3moe-tiny-f32.gguf", {.n_threads = 2});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  CheckInterrupted(**e, "resident");
}

TEST(Batch, BadRequestsFailAlone) {
  auto e = Engine::Load(kModels + "olmoe-tiny-f32.gguf", {.n_threads = 2, .batch_tokens = 256});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<Request> batch(7);
  batch[0].tokens = Tokens(10, 1, 512);
  batch[1].tokens = {};                                // empty
  batch[2].tokens = {1, 2, 512};                       // id out of range
  batch[3].tokens = Tokens(5, 2, 512);
  batch[3].continuations = {{3}, {}};                  // empty continuation
  batch[4].tokens = Tokens(300, 3, 512);               // longer than a pass
  batch[5].tokens = std::vector<int32_t>(4097, 1);     // longer than the context
  batch[6].tokens = Tokens(20, 4, 512);
  batch[6].continuations = {{7, 8}, {9}};
  auto got = (*e)->RunBatch(batch);
  ASSERT_EQ(got.size(), 7u);
  EXPECT_TRUE(got[0].ok());
  EXPECT_TRUE(got[6].ok());
  ASSERT_FALSE(got[1].ok());
  EXPECT_NE(got[1].status().message().find("empty prompt"), std::string::npos);
  ASSERT_FALSE(got[2].ok());
  EXPECT_NE(got[2].status().message().find("512"), std::string::npos);
  ASSERT_FALSE(got[3].ok());
  EXPECT_NE(got[3].status().message().find("continuation 1 is empty"), std::string::npos);
  ASSERT_FALSE(got[4].ok());
  EXPECT_EQ(got[4].status().code(), StatusCode::kInvalidArgument);  // input size, not memory
  EXPECT_NE(got[4].status().message().find("300"), std::string::npos);
  EXPECT_NE(got[4].status().message().find("raise batch_tokens (--batch-tokens)"), std::string::npos)
      << got[4].status().message();
  ASSERT_FALSE(got[5].ok());
  EXPECT_EQ(got[5].status().code(), StatusCode::kOutOfRange);
  for (int i : {0, 6}) {
    auto want = (*e)->Run(batch[i]);
    ASSERT_TRUE(want.ok());
    ExpectSameResponse(*got[i], *want, "survivor " + std::to_string(i));
  }
  // A failing sink fails its own request only.
  std::vector<Request> sinks(2);
  sinks[0].tokens = Tokens(8, 5, 512);
  sinks[0].logits_sink = [](int64_t, int64_t, const float*) { return Status::IOError("disk full"); };
  sinks[1].tokens = Tokens(8, 6, 512);
  auto s = (*e)->RunBatch(sinks);
  ASSERT_FALSE(s[0].ok());
  EXPECT_EQ(s[0].status().message(), "disk full");
  EXPECT_TRUE(s[1].ok());
  EXPECT_TRUE((*e)->RunBatch({}).empty());
}

// Continuation scores vs running context ++ continuation alone. A context longer than 64 tokens
// puts rows of both the context and the continuations on the low-precision attention where the
// host has it (quantised projections; kernels/attention_lowp.h), whose rows must not depend on
// the keys after them.
void CheckContinuations(Engine& e, const std::string& what, int context_len = 37) {
  const int V = e.info().n_vocab;
  Request r;
  r.tokens = Tokens(context_len, 9, V);
  r.top_k = 2;
  r.continuations = {Tokens(5, 11, V), Tokens(1, 12, V), Tokens(12, 13, V), Tokens(3, 14, V)};
  // A greedy continuation: the argmax chain, built token by token.
  std::vector<int32_t> greedy;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> ids = r.tokens;
    ids.insert(ids.end(), greedy.begin(), greedy.end());
    auto g = e.Run({.tokens = ids, .top_k = 1});
    ASSERT_TRUE(g.ok());
    greedy.push_back(g->top[0].token);
  }
  r.continuations.push_back(greedy);
  auto got = e.Run(r);
  ASSERT_TRUE(got.ok()) << what << ": " << got.status().ToString();
  ASSERT_EQ(got->continuations.size(), r.continuations.size());
  const int64_t C = static_cast<int64_t>(r.tokens.size());
  for (size_t j = 0; j < r.continuations.size(); ++j) {
    const std::vector<int32_t>& cont = r.continuations[j];
    std::vector<int32_t> ids = r.tokens;
    ids.insert(ids.end(), cont.begin(), cont.end());
    auto alone = e.Run({.tokens = ids, .top_k = 0, .logits = Request::Logits::kAll, .prompt_logprobs = true});
    ASSERT_TRUE(alone.ok());
    std::vector<float> want(alone->prompt_logprobs.begin() + (C - 1), alone->prompt_logprobs.end());
    const ContinuationScore& cs = got->continuations[j];
    ExpectClose(cs.logprobs, want, what + " continuation " + std::to_string(j));
    double ll = 0;
    for (float x : want) ll += x;
    EXPECT_NEAR(cs.log_likelihood, ll, 1e-5 * (1 + std::fabs(ll))) << what;
    bool greedy_want = true;
    for (size_t i = 0; i < cont.size(); ++i) {
      const float* row = alone->logits.data() + (C - 1 + i) * V;
      greedy_want = greedy_want && std::max_element(row, row + V) - row == cont[i];
    }
    EXPECT_EQ(cs.is_greedy, greedy_want) << what << " continuation " << j;
  }
  EXPECT_TRUE(got->continuations.back().is_greedy) << what;
  // The context's own outputs are those of the context alone.
  auto ctx = e.Run({.tokens = r.tokens, .top_k = 2});
  ASSERT_TRUE(ctx.ok());
  ASSERT_EQ(got->top.size(), 2u);
  EXPECT_EQ(got->top[0].token, ctx->top[0].token);
  EXPECT_EQ(got->top[0].logprob, ctx->top[0].logprob);
}

TEST(Candidates, EqualSeparateScoring) {
  for (const char* name : {"olmoe-tiny-f32.gguf", "qwen3moe-tiny-f32.gguf", "mixtral-tiny-f32.gguf", "deepseek2-tiny-f32.gguf",
                           "lfm2moe-tiny-f32.gguf"}) {
    auto e = Engine::Load(kModels + name, {.n_threads = 2});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    CheckContinuations(**e, name);
  }
}

// Packed models: resident, and streamed under each schedule, with a pass split.
TEST(Batch, PackedResidentAndStreamed) {
  std::vector<Request> batch = MixedBatch(256);
  {
    auto e = Engine::Load(TestModels().packed, {.n_threads = 2});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    CheckBatchMatchesSingles(**e, batch, "packed resident");
    CheckContinuations(**e, "packed resident");
    CheckContinuations(**e, "packed resident, long context", 90);
  }
  using S = EngineOptions::Schedule;
  for (S s : {S::kOnDemand, S::kAfterRouting, S::kEarly}) {
    const std::string what = "streamed schedule " + std::to_string(static_cast<int>(s));
    auto e = Engine::Load(TestModels().packed, {.n_threads = 2, .group_size = 3, .banks = 2, .schedule = s,
                                                .budget_tokens = 128});
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    CheckBatchMatchesSingles(**e, batch, what, /*min_passes=*/2);  // 228 tokens, 128 per pass
    CheckContinuations(**e, what);
    CheckContinuations(**e, what + ", long context", 90);
    CheckInterrupted(**e, what);  // a pass stopped with reads in flight leaves the streamer usable
    // One pass reads each active group once per layer: fewer bytes than the requests alone.
    std::vector<Request> small(batch.begin(), batch.begin() + 4);
    auto together = (*e)->RunBatch(small);
    uint64_t alone = 0;
    for (const Request& r : small) {
      auto one = (*e)->Run(r);
      ASSERT_TRUE(one.ok());
      alone += one->bytes_read;
    }
    ASSERT_TRUE(together[0].ok());
    EXPECT_EQ(together[0]->pass_requests, 4);
    EXPECT_LT(together[0]->bytes_read, alone) << what;
  }
}

}  // namespace
}  // namespace estream
