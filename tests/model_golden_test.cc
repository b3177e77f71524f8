// The reference tiny models of shared/testdata/models (one per architecture, F32 weights) with
// golden logits from two independent implementations (testdata README). Both the fp64 reference
// forward (tests/ref) and the engine must reproduce them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "estream/engine.h"
#include "expect_isa.h"
#include "model_test_util.h"
#include "ref/ref_forward.h"

namespace estream {
namespace {

const std::string kModels = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/";

using model_test::ArgMax;
using model_test::ReadF32;
using model_test::ReadTokens;

class GoldenTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    arch_ = GetParam();
    model_ = kModels + arch_ + "-tiny-f32.gguf";
    tokens_ = ReadTokens(kModels + arch_ + "-tiny.tokens.txt");
    golden_ = ReadF32(kModels + arch_ + "-tiny-f32.logits.f32");
    ASSERT_EQ(tokens_.size(), 48u);
    ASSERT_EQ(golden_.size(), 48u * kVocab);
  }
  // Compares each of the 48 rows of `logits` with the golden row (relative error below `tol`, same
  // arg-max); returns the worst relative error.
  template <typename T>
  double ExpectRowsMatch(const T* logits, double tol) const {
    double worst = 0;
    for (int64_t t = 0; t < 48; ++t) {
      const T* row = logits + t * kVocab;
      const float* gold = golden_.data() + t * kVocab;
      const double err = model_test::RelErr(row, gold, kVocab);
      worst = std::max(worst, err);
      EXPECT_LT(err, tol) << arch_ << " position " << t;
      EXPECT_EQ(ArgMax(row, kVocab), ArgMax(gold, kVocab)) << arch_ << " position " << t;
    }
    return worst;
  }

  static constexpr int64_t kVocab = 512;
  std::string arch_, model_;
  std::vector<int32_t> tokens_;
  std::vector<float> golden_;
};

// The fp64 reference against the golden logits. The golden file is itself the (f32-rounded)
// output of a float64 implementation that agrees with llama.cpp to ~4e-7: an independent fp64
// forward should land within a few f32 ulps of it, so 1e-5 leaves a wide margin while still
// catching any convention error (those move logits by O(1)).
TEST_P(GoldenTest, ReferenceMatchesGolden) {
  auto ref = ref::RefForward(model_, tokens_);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const double worst = ExpectRowsMatch(ref->logits.data(), 1e-5);
  RecordProperty("worst_row_rel_err", std::to_string(worst));
  std::printf("%s: fp64 reference vs golden, worst row relative error %.2e\n", arch_.c_str(), worst);
}

// The engine (f32 weights, so every GEMM runs in fp32) against the golden logits: the README's
// 1e-5 figure is for f32 arithmetic with fp32 accumulation over n_embd = 256 terms (relative
// rounding ~ sqrt(256) * 6e-8 per dot product, compounded over two layers, attention softmax and
// norms); 5e-5 allows for reordered sums in the SIMD kernels.
TEST_P(GoldenTest, EngineMatchesGolden) {
  auto engine = Engine::Load(model_, {.n_threads = 2});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Request req{.tokens = tokens_, .top_k = 5, .logits = Request::Logits::kAll};
  auto resp = (*engine)->Run(req);
  ASSERT_TRUE(resp.ok()) << resp.status().ToString();
  ASSERT_EQ(resp->logits.size(), 48u * kVocab);
  const double worst = ExpectRowsMatch(resp->logits.data(), 5e-5);
  std::printf("%s: engine vs golden, worst row relative error %.2e\n", arch_.c_str(), worst);
  // top[0] is the arg-max of the last row, with its log-softmax.
  const float* last = golden_.data() + 47 * kVocab;
  ASSERT_EQ(resp->top.size(), 5u);
  EXPECT_EQ(resp->top[0].token, ArgMax(last, kVocab));
  double mx = last[0], z = 0;
  for (int64_t i = 0; i < kVocab; ++i) mx = std::max<double>(mx, last[i]);
  for (int64_t i = 0; i < kVocab; ++i) z += std::exp(last[i] - mx);
  EXPECT_NEAR(resp->top[0].logprob, last[resp->top[0].token] - mx - std::log(z), 1e-4);
  for (size_t j = 1; j < resp->top.size(); ++j) EXPECT_LE(resp->top[j].logprob, resp->top[j - 1].logprob);
}

INSTANTIATE_TEST_SUITE_P(Archs, GoldenTest, ::testing::Values("olmoe", "qwen3moe", "mixtral", "deepseek2", "lfm2moe"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace estream
