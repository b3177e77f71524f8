// Max-plus pipeline evaluator (config/maxplus.h): hand-computed cases, an independent reference
// implementation on random inputs, and the monotonicity properties the configurator relies on.
#include "config/maxplus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace estream::config {
namespace {

// One layer's groups, as (L, T, X) triples.
struct G {
  double read, transfer, exec;
};

PipelineInput Input(const std::vector<double>& nonexpert, const std::vector<std::vector<G>>& layers, double other = 0) {
  PipelineInput in;
  in.nonexpert_s = nonexpert;
  in.layer_begin.push_back(0);
  for (const auto& layer : layers) {
    for (const G& g : layer) {
      in.read_s.push_back(g.read);
      in.transfer_s.push_back(g.transfer);
      in.exec_s.push_back(g.exec);
    }
    in.layer_begin.push_back(static_cast<uint32_t>(in.read_s.size()));
  }
  in.other_s = other;
  EXPECT_TRUE(in.Validate().ok()) << in.Validate().ToString();
  return in;
}

PipelineParams P(int banks, int q, Schedule s = Schedule::kEarly, bool cross = true) {
  return {.banks = banks, .queue_depth = q, .schedule = s, .cross_layer = cross};
}

double Total(const PipelineInput& in, const PipelineParams& p) {
  PipelineWorkspace ws;
  return EvaluatePipeline(in, p, &ws).total_s;
}

// All values below are small integers: every sum and max is exact in double, so EXPECT_EQ.

TEST(MaxPlus, SingleGroupAllSchedules) {
  // L = 3, X = 2, T_ne = 1.
  const PipelineInput in = Input({1}, {{{3, 0, 2}}});
  // early: a = 0, d = 3, s = max(3, 1) = 3, f = 5.
  PipelineTrace t = TracePipeline(in, P(1, 1));
  EXPECT_EQ(t.a[0], 0);
  EXPECT_EQ(t.d[0], 3);
  EXPECT_EQ(t.s[0], 3);
  EXPECT_EQ(t.f[0], 5);
  EXPECT_EQ(t.prediction.total_s, 5);
  EXPECT_EQ(t.prediction.wait_s, 2);  // cores ready at T_ne = 1, data at 3
  // after-routing: a = 1, d = 4, f = 6. on-demand: the same for one group.
  EXPECT_EQ(Total(in, P(1, 1, Schedule::kAfterRouting)), 6);
  EXPECT_EQ(Total(in, P(1, 1, Schedule::kOnDemand)), 6);
  // Per-layer early (no cross-layer reads) is the same for one layer.
  EXPECT_EQ(Total(in, P(1, 1, Schedule::kEarly, false)), 5);
}

TEST(MaxPlus, NonExpertTimeDominates) {
  // T_ne = 10, three groups L = 1, X = 2, q = b = 3.
  const PipelineInput in = Input({10}, {{{1, 0, 2}, {1, 0, 2}, {1, 0, 2}}});
  // early: every read done at 1, long before the cores are free: 10 + 3 * 2.
  PipelineTrace t = TracePipeline(in, P(3, 3));
  EXPECT_EQ(t.d, (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(t.s, (std::vector<double>{10, 12, 14}));
  EXPECT_EQ(t.prediction.total_s, 16);
  EXPECT_EQ(t.prediction.wait_s, 0);
  // after-routing: reads from 10: d = 11, f = 13, 15, 17.
  EXPECT_EQ(Total(in, P(3, 3, Schedule::kAfterRouting)), 17);
  // on-demand: each read waits for the previous group: 10+1+2, +1+2, +1+2.
  t = TracePipeline(in, P(3, 3, Schedule::kOnDemand));
  EXPECT_EQ(t.a, (std::vector<double>{10, 13, 16}));
  EXPECT_EQ(t.prediction.total_s, 19);
  EXPECT_EQ(t.prediction.wait_s, 3);
}

TEST(MaxPlus, QueueDepthLimitBinds) {
  // Four groups L = 4, X = 1, T_ne = 0, plenty of banks.
  const PipelineInput in = Input({0}, {{{4, 0, 1}, {4, 0, 1}, {4, 0, 1}, {4, 0, 1}}});
  // q = 1: reads back to back: d = 4, 8, 12, 16; f = 5, 9, 13, 17.
  PipelineTrace t = TracePipeline(in, P(8, 1));
  EXPECT_EQ(t.a, (std::vector<double>{0, 4, 8, 12}));
  EXPECT_EQ(t.d, (std::vector<double>{4, 8, 12, 16}));
  EXPECT_EQ(t.f, (std::vector<double>{5, 9, 13, 17}));
  EXPECT_EQ(t.prediction.wait_s, 4 + 3 + 3 + 3);
  // q = 2: d = 4, 4, 8, 8; s = 4, 5, 8, 9; f = 5, 6, 9, 10.
  t = TracePipeline(in, P(8, 2));
  EXPECT_EQ(t.d, (std::vector<double>{4, 4, 8, 8}));
  EXPECT_EQ(t.f, (std::vector<double>{5, 6, 9, 10}));
  // q = 4: all reads at once: f = 5, 6, 7, 8.
  EXPECT_EQ(Total(in, P(8, 4)), 8);
  EXPECT_EQ(Total(in, P(8, 100)), 8);
}

TEST(MaxPlus, BankLimitBinds) {
  // Three groups L = 3, X = 1, deep queue.
  const PipelineInput in = Input({0}, {{{3, 0, 1}, {3, 0, 1}, {3, 0, 1}}});
  // b = 1: a read waits until the previous group executed: 3+1, +3+1, +3+1.
  PipelineTrace t = TracePipeline(in, P(1, 8));
  EXPECT_EQ(t.a, (std::vector<double>{0, 4, 8}));
  EXPECT_EQ(t.f, (std::vector<double>{4, 8, 12}));
  // b = 2: d = 3, 3; f = 4, 5; a_3 = f_1 = 4, d_3 = 7, f_3 = 8.
  t = TracePipeline(in, P(2, 8));
  EXPECT_EQ(t.a, (std::vector<double>{0, 0, 4}));
  EXPECT_EQ(t.f, (std::vector<double>{4, 5, 8}));
  // b = 3: f = 4, 5, 6.
  EXPECT_EQ(Total(in, P(3, 8)), 6);
}

TEST(MaxPlus, DeviceTransferTermSerialisesReads) {
  // L = 3 (1 latency + 2 transfer), X = 1, q = b = 3: d = 3, max(3, 3+2) = 5, 7.
  const PipelineInput in = Input({0}, {{{3, 2, 1}, {3, 2, 1}, {3, 2, 1}}});
  PipelineTrace t = TracePipeline(in, P(3, 3));
  EXPECT_EQ(t.d, (std::vector<double>{3, 5, 7}));
  EXPECT_EQ(t.f, (std::vector<double>{4, 6, 8}));
}

TEST(MaxPlus, TwoLayersCrossLayerReads) {
  // Layer 0: T_ne = 1, one group L = 2, X = 3. Layer 1: T_ne = 1, one group L = 2, X = 1. q = 2.
  const PipelineInput in = Input({1, 1}, {{{2, 0, 3}}, {{2, 0, 1}}}, /*other=*/0.5);
  // Cross-layer early, b = 2: layer 1's read starts at 0 and is done at 2; layer 1 starts at 5,
  // its expert runs at e = 6: total 7 + 0.5.
  PipelineTrace t = TracePipeline(in, P(2, 2));
  EXPECT_EQ(t.a, (std::vector<double>{0, 0}));
  EXPECT_EQ(t.layer_start, (std::vector<double>{0, 5}));
  EXPECT_EQ(t.layer_end, (std::vector<double>{5, 7}));
  EXPECT_EQ(t.prediction.total_s, 7.5);
  EXPECT_EQ(t.prediction.expert_exec_s, 4);
  EXPECT_EQ(t.prediction.nonexpert_s, 2);
  // b = 1: the second read needs the only bank: a = f_1 = 5, d = 7, f = 8.
  EXPECT_EQ(Total(in, P(1, 2)), 8.5);
  // Per-layer early: reads of layer 1 start when it starts (5): d = 7, f = 8.
  EXPECT_EQ(Total(in, P(2, 2, Schedule::kEarly, false)), 8.5);
  // after-routing: a = 1, d = 3, f = 6; layer 1: e = 7, d = 9, f = 10.
  EXPECT_EQ(Total(in, P(2, 2, Schedule::kAfterRouting)), 10.5);
}

TEST(MaxPlus, LayerWithoutActiveGroups) {
  // Layer 1 has no active group: it costs its non-expert time only.
  const PipelineInput in = Input({1, 4, 1}, {{{2, 0, 1}}, {}, {{2, 0, 1}}});
  PipelineTrace t = TracePipeline(in, P(1, 1));
  // Layer 0: d = 2, f = 3. Layer 1: 3 .. 7. Layer 2: read a = f_1 = 3, d = 5, e = 8, f = 9.
  EXPECT_EQ(t.layer_end, (std::vector<double>{3, 7, 9}));
  EXPECT_EQ(t.prediction.total_s, 9);
  EXPECT_EQ(Total(Input({2}, {{}}), P(1, 1)), 2);  // no groups at all
}

TEST(MaxPlus, ValidateRejectsBadInput) {
  PipelineInput in = Input({1}, {{{2, 1, 1}}});
  in.transfer_s[0] = 3;  // transfer > read
  EXPECT_FALSE(in.Validate().ok());
  in = Input({1}, {{{2, 1, 1}}});
  in.exec_s[0] = NAN;
  EXPECT_FALSE(in.Validate().ok());
  in = Input({1}, {{{2, 1, 1}}});
  in.layer_begin = {0, 2};
  EXPECT_FALSE(in.Validate().ok());
  in = Input({1}, {{{2, 1, 1}}});
  in.nonexpert_s[0] = -1;
  EXPECT_FALSE(in.Validate().ok());
  EXPECT_EQ(ParseSchedule("early").value(), Schedule::kEarly);
  EXPECT_EQ(ParseSchedule("after-routing").value(), Schedule::kAfterRouting);
  EXPECT_EQ(ParseSchedule("on-demand").value(), Schedule::kOnDemand);
  EXPECT_EQ(ParseSchedule("eager").status().code(), StatusCode::kInvalidArgument);
}

// ---- Reference: the recurrence written out per layer with 1-based arrays and explicit zero
// ghosts (j <= 0), in global time, straight from the header's equations.
double Reference(const PipelineInput& in, const PipelineParams& p, double* wait) {
  const int n = in.n_groups();
  std::vector<double> a(n + 1, 0), d(n + 1, 0), s(n + 1, 0), f(n + 1, 0);
  auto D = [&](long j) { return j <= 0 ? 0.0 : d[j]; };
  auto F = [&](long j) { return j <= 0 ? 0.0 : f[j]; };
  double t0 = 0;
  *wait = 0;
  for (int w = 0; w < in.n_layer(); ++w) {
    const double e = t0 + in.nonexpert_s[w];
    for (long j = in.layer_begin[w] + 1; j <= in.layer_begin[w + 1]; ++j) {
      double release = 0;
      if (p.schedule == Schedule::kEarly) release = p.cross_layer ? 0 : t0;
      if (p.schedule == Schedule::kAfterRouting) release = e;
      if (p.schedule == Schedule::kOnDemand) release = std::max(e, F(j - 1));
      a[j] = std::max({release, D(j - p.queue_depth), F(j - p.banks)});
      d[j] = std::max(a[j] + in.read_s[j - 1], D(j - 1) + in.transfer_s[j - 1]);
      s[j] = std::max({d[j], e, F(j - 1)});
      f[j] = s[j] + in.exec_s[j - 1];
      *wait += s[j] - std::max(e, F(j - 1));
    }
    t0 = std::max(e, in.layer_begin[w + 1] > 0 ? F(in.layer_begin[w + 1]) : 0.0);
  }
  return t0 + in.other_s;
}

PipelineInput RandomInput(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> layers(1, 6), groups(0, 9);
  std::uniform_real_distribution<double> t(0.01, 3.0), frac(0, 1);
  std::vector<double> ne;
  std::vector<std::vector<G>> all;
  const int n_layer = layers(rng);
  const bool pure = frac(rng) < 0.3;  // the design's form: T = 0
  for (int w = 0; w < n_layer; ++w) {
    ne.push_back(frac(rng) < 0.2 ? 0 : t(rng));
    std::vector<G> layer;
    const int k = groups(rng);
    for (int i = 0; i < k; ++i) {
      const double l = t(rng);
      layer.push_back({l, pure ? 0 : l * frac(rng), t(rng)});
    }
    all.push_back(layer);
  }
  return Input(ne, all, frac(rng));
}

TEST(MaxPlus, MatchesReferenceOnRandomInputs) {
  std::mt19937_64 rng(20251201);
  PipelineWorkspace ws;  // reused across sizes on purpose
  for (int iter = 0; iter < 300; ++iter) {
    const PipelineInput in = RandomInput(rng);
    for (Schedule s : {Schedule::kOnDemand, Schedule::kAfterRouting, Schedule::kEarly}) {
      for (bool cross : {false, true}) {
        for (int b : {1, 2, 3, 7}) {
          for (int q : {1, 2, 5}) {
            const PipelineParams p = P(b, q, s, cross);
            double ref_wait;
            const double ref = Reference(in, p, &ref_wait);
            const PipelinePrediction got = EvaluatePipeline(in, p, &ws);
            // Same operations in the same order: equal up to reassociation of the wait sum.
            ASSERT_EQ(got.total_s, ref) << "iter " << iter << " b " << b << " q " << q;
            ASSERT_NEAR(got.wait_s, ref_wait, 1e-12 * (1 + ref_wait));
            const PipelineTrace t = TracePipeline(in, p);
            ASSERT_EQ(t.prediction.total_s, ref);
          }
        }
      }
    }
  }
}

TEST(MaxPlus, MonotoneInBanksQueueDepthAndSchedule) {
  std::mt19937_64 rng(7);
  PipelineWorkspace ws;
  for (int iter = 0; iter < 200; ++iter) {
    const PipelineInput in = RandomInput(rng);
    double exec = in.other_s;
    for (double x : in.exec_s) exec += x;
    for (double x : in.nonexpert_s) exec += x;
    for (Schedule s : {Schedule::kOnDemand, Schedule::kAfterRouting, Schedule::kEarly}) {
      for (bool cross : {false, true}) {
        for (int q = 1; q <= 6; ++q) {
          double prev_b = INFINITY;
          for (int b = 1; b <= 12; ++b) {
            const double t = EvaluatePipeline(in, P(b, q, s, cross), &ws).total_s;
            EXPECT_LE(t, prev_b) << "more banks slower: b " << b << " q " << q;
            prev_b = t;
            // Compute never overlaps compute: the total is at least all compute.
            EXPECT_GE(t, exec * (1 - 1e-12));
            if (q > 1) {
              EXPECT_LE(t, EvaluatePipeline(in, P(b, q - 1, s, cross), &ws).total_s) << "larger q slower";
            }
          }
        }
      }
    }
    // Earlier release never hurts: early (cross) <= early (per layer) <= after-routing <= on-demand.
    for (int b : {1, 3}) {
      const double e_cross = EvaluatePipeline(in, P(b, 2, Schedule::kEarly, true), &ws).total_s;
      const double e_layer = EvaluatePipeline(in, P(b, 2, Schedule::kEarly, false), &ws).total_s;
      const double after = EvaluatePipeline(in, P(b, 2, Schedule::kAfterRouting), &ws).total_s;
      const double demand = EvaluatePipeline(in, P(b, 2, Schedule::kOnDemand), &ws).total_s;
      EXPECT_LE(e_cross, e_layer);
      EXPECT_LE(e_layer, after);
      EXPECT_LE(after, demand);
    }
    // Banks beyond the number of groups change nothing.
    const int n = std::max(1, in.n_groups());
    EXPECT_EQ(EvaluatePipeline(in, P(n, 3), &ws).total_s, EvaluatePipeline(in, P(n + 5, 3), &ws).total_s);
    const int k = std::max(1, in.MaxLayerGroups());
    EXPECT_EQ(EvaluatePipeline(in, P(k, 3, Schedule::kAfterRouting), &ws).total_s,
              EvaluatePipeline(in, P(k + 5, 3, Schedule::kAfterRouting), &ws).total_s);
  }
}

TEST(MaxPlus, SmallerServiceTimesNeverSlower) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> shrink(0.5, 1.0);
  PipelineWorkspace ws;
  for (int iter = 0; iter < 200; ++iter) {
    const PipelineInput in = RandomInput(rng);
    PipelineInput faster = in;
    for (size_t j = 0; j < faster.read_s.size(); ++j) {
      const double k = shrink(rng);
      faster.read_s[j] *= k;
      faster.transfer_s[j] *= k;  // keeps transfer <= read
      faster.exec_s[j] *= shrink(rng);
    }
    for (double& t : faster.nonexpert_s) t *= shrink(rng);
    for (Schedule s : {Schedule::kOnDemand, Schedule::kAfterRouting, Schedule::kEarly}) {
      EXPECT_LE(EvaluatePipeline(faster, P(2, 2, s), &ws).total_s, EvaluatePipeline(in, P(2, 2, s), &ws).total_s);
    }
  }
}

}  // namespace
}  // namespace estream::config
