// The two expert paths of src/model/experts.h compute bit-identical results: ExpertsBatched (one
// parallel region per window, dynamic work items) against ExpertsGrouped (per-expert kernel
// calls), on a prompt long enough that one expert gets more than kExpertChunkRows routes and the
// layer more than kRouteWindow routes, for quantised and float weights and several thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
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

class ExpertPaths : public ::testing::TestWithParam<QuantType> {};

TEST_P(ExpertPaths, BatchedEqualsGrouped) {
  model_test::ScratchDir dir;
  const std::string path = dir.File("m.gguf");
  // 16 experts, top-4, a strongly skewed router: the most popular expert gets far more than its
  // share of the 4 x 700 = 2800 routes.
  auto model = model_test::SkewedQwenLayer(path, GetParam(), 3);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const model::ModelConfig& c = (*model)->config();
  const int64_t T = 700, d = c.n_embd;
  std::vector<int32_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * 131 + 7) % c.n_vocab);

  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(threads);
    omp_set_num_threads(threads);
    model::Workspace a, b;
    ASSERT_TRUE(a.Reserve(**model, T, threads).ok());
    ASSERT_TRUE(b.Reserve(**model, T, threads).ok());
    for (model::Workspace* ws : {&a, &b}) {
      model::EmbedTokens(**model, ids.data(), T, ws->x.get());
      model::AttentionBlock(**model, 0, T, ws);
      model::RouteBlock(**model, 0, T, ws);
    }
    // The case covers chunked experts and several windows.
    int64_t most = 0;
    for (int e = 0; e < c.n_expert; ++e) most = std::max(most, a.expert_begin[e + 1] - a.expert_begin[e]);
    EXPECT_GT(most, model::kExpertChunkRows);
    EXPECT_GT(T * c.n_expert_used, ref::kRouteWindow);

    ref::ExpertsGrouped((*model)->layers()[0].experts, c, T, &a);
    ref::ExpertsBatched((*model)->layers()[0].experts, c, T, &b);
    EXPECT_EQ(std::memcmp(a.x.get(), b.x.get(), T * d * sizeof(float)), 0);
    int64_t first_diff = -1;
    for (int64_t i = 0; i < T * d && first_diff < 0; ++i)
      if (a.x[i] != b.x[i]) first_diff = i;
    EXPECT_EQ(first_diff, -1) << "token " << first_diff / d << " column " << first_diff % d;
  }
  omp_set_num_threads(omp_get_num_procs());
}

INSTANTIATE_TEST_SUITE_P(Types, ExpertPaths, ::testing::Values(QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kF32),
                         [](const auto& info) { return std::string(TypeName(info.param)); });

}  // namespace
}  // namespace estream
