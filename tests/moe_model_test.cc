// The engine's expert path (model::FusedExperts, the fused operator of src/moe) against the
// previous one (ref::ExpertsBatched): bit-identical x on a synthetic qwen3moe layer with a
// skewed router, for quantised and float weights, several thread counts and two route windows:
// the default (the layer in one pass) and 500 routes (an expert with more routes than a pass
// holds: passes cut through slots); and no allocation by Reserve once the plans cover the request.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <string>
#include <vector>

#include "model/blocks.h"
#include "ref/experts_baseline.h"
#include "model/experts.h"
#include "model/model.h"
#include "model/synth.h"
#include "experts_test_util.h"
#include "model_test_util.h"

namespace estream {
namespace {

class FusedVsBatched : public ::testing::TestWithParam<QuantType> {};

TEST_P(FusedVsBatched, BitIdentical) {
  model_test::ScratchDir dir;
  const std::string path = dir.File("m.gguf");
  auto model = model_test::SkewedQwenLayer(path, GetParam(), 5);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const model::ModelConfig& c = (*model)->config();
  const int64_t T = 700, d = c.n_embd;
  std::vector<int32_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * 97 + 3) % c.n_vocab);

  model::FusedExperts one_pass, split(500);
  for (int threads : {1, 2, 3})
  for (model::FusedExperts* fused : {&one_pass, &split}) {
    SCOPED_TRACE(threads);
    SCOPED_TRACE(fused == &split ? "window 500" : "default window");
    omp_set_num_threads(threads);
    model::Workspace a, b;
    ASSERT_TRUE(a.Reserve(**model, T, threads).ok());
    ASSERT_TRUE(b.Reserve(**model, T, threads).ok());
    ASSERT_TRUE(fused->Reserve(**model, T, 3).ok());
    for (model::Workspace* ws : {&a, &b}) {
      model::EmbedTokens(**model, ids.data(), T, ws->x.get());
      model::AttentionBlock(**model, 0, T, ws);
      model::RouteBlock(**model, 0, T, ws);
    }
    EXPECT_GT(T * c.n_expert_used, ref::kRouteWindow);  // several windows of the baseline
    ref::ExpertsBatched((*model)->layers()[0].experts, c, T, &a);
    ASSERT_TRUE(fused->Run(**model, 0, T, &b).ok());
    int64_t first_diff = -1;
    for (int64_t i = 0; i < T * d && first_diff < 0; ++i)
      if (std::memcmp(&a.x[i], &b.x[i], sizeof(float)) != 0) first_diff = i;
    EXPECT_EQ(first_diff, -1) << "token " << first_diff / d << " column " << first_diff % d;
  }
  omp_set_num_threads(omp_get_num_procs());
}

INSTANTIATE_TEST_SUITE_P(Types, FusedVsBatched,
                         ::testing::Values(QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kF32),
                         [](const auto& info) { return std::string(TypeName(info.param)); });

}  // namespace
}  // namespace estream
