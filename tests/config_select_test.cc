// Service-time models and (G, Q, B) selection (config/configurator.h): fits, route vectors ->
// active groups, selection against a brute-force scan on synthetic profiles, the budget edge
// cases and the monotonicity the selection relies on.
#include "config/configurator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>

#include "config/synthetic.h"

namespace estream::config {
namespace {

TEST(ConfigFit, AffineRecoversExactLine) {
  // 7 samples of 1.5e-4 + 3.25e-6 * rows at awkward rows: the fit is exact to rounding of the
  // float samples (relative 6e-8 each); 1e-6 relative is ample.
  std::vector<float> rows = {1, 3, 17, 64, 65, 129, 1000}, secs;
  for (float r : rows) secs.push_back(static_cast<float>(1.5e-4 + 3.25e-6 * r));
  auto fit = FitAffine(rows, secs);
  ASSERT_TRUE(fit.ok());
  EXPECT_NEAR(fit->intercept_s, 1.5e-4, 1e-6 * 1.5e-4 + 1e-12);
  EXPECT_NEAR(fit->slope_s, 3.25e-6, 1e-6 * 3.25e-6);
  EXPECT_NEAR(fit->At(500), 1.5e-4 + 3.25e-6 * 500, 1e-9);
}

TEST(ConfigFit, AffineConstraintsAndErrors) {
  // Decreasing times: no positive trend -> the mean, slope 0.
  auto fit = FitAffine({1, 2, 3}, {3, 2, 1});
  ASSERT_TRUE(fit.ok());
  EXPECT_EQ(fit->slope_s, 0);
  EXPECT_DOUBLE_EQ(fit->intercept_s, 2);
  // A steep line with a negative intercept: refit through the origin, slope sum(xy)/sum(xx).
  fit = FitAffine({10, 20}, {1, 3});  // unconstrained: -1 + 0.2 x
  ASSERT_TRUE(fit.ok());
  EXPECT_EQ(fit->intercept_s, 0);
  EXPECT_DOUBLE_EQ(fit->slope_s, (10.0 * 1 + 20.0 * 3) / (100.0 + 400.0));
  // One sample / one distinct x: the constant mean.
  fit = FitAffine({5}, {0.25f});
  EXPECT_EQ(fit->slope_s, 0);
  EXPECT_EQ(fit->intercept_s, 0.25);
  fit = FitAffine({4, 4}, {1, 2});
  EXPECT_EQ(fit->intercept_s, 1.5);
  EXPECT_EQ(FitAffine({}, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FitAffine({1}, {1, 2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FitAffine({1, -2}, {1, 2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FitAffine({1, 2}, {1, NAN}).status().code(), StatusCode::kInvalidArgument);
}

// A tiny hand-made profile: 2 layers of 5 experts, g in {1, 2}.
Profile HandProfile() {
  Profile p;
  p.n_layer = 2;
  p.n_expert = 5;
  p.expert_bytes = 8192;
  p.record_bytes = {8192, 4096};
  p.calib_tokens = 3;
  p.other_seconds = 0.5f;
  p.nonexpert_seconds = {0.25f, 0.125f};
  p.expert_routes = {3, 0, 0, 0, 2,   // layer 0: g = 2 groups {0,1}: 3, {2,3}: 0 (inactive), {4}: 2
                     0, 1, 1, 0, 0};  // layer 1: g = 2 groups {0,1}: 1, {2,3}: 1, {4}: 0
  p.disk = {.chunk_bytes = 4096, .queue_depths = {1, 4}, .group_sizes = {1, 2},
            .bandwidth = {8192, 16384, 8192, 32768}, .latency_s = {0.5f, 0.25f}};
  for (int g : {1, 2}) {
    CalibrationRun run;
    run.group_size = g;
    run.other_bytes = 100000;
    run.exec_rows = {1, 3};
    run.exec_seconds = {0.5f + g, 1.5f + g};  // X = g + 0.5 * rho ... at rho = 1: g + 0.5
    p.runs.push_back(run);
  }
  EXPECT_TRUE(p.Validate().ok()) << p.Validate().ToString();
  return p;
}

TEST(ConfigService, RouteVectorsGiveActiveGroupsAndBytes) {
  const Profile p = HandProfile();
  auto m = MakeServiceModel(p, 2, 4);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->bandwidth, 32768);
  EXPECT_EQ(m->latency_s, 0.25);
  EXPECT_EQ(m->load_scale, 1);  // no load samples
  EXPECT_DOUBLE_EQ(m->exec.intercept_s, 2);
  EXPECT_DOUBLE_EQ(m->exec.slope_s, 0.5);
  PipelineInput in;
  BuildPipelineInput(p, *m, &in);
  ASSERT_TRUE(in.Validate().ok());
  // Layer 0: groups {0,1} (rho 3, 2 x 8192 B) and {4} (rho 2, 8192 B); {2,3} is inactive.
  // Layer 1: groups {0,1} (rho 1, 2 x 4096 B) and {2,3} (rho 1, 2 x 4096 B).
  EXPECT_EQ(in.layer_begin, (std::vector<uint32_t>{0, 2, 4}));
  EXPECT_EQ(in.transfer_s, (std::vector<double>{0.5, 0.25, 0.25, 0.25}));
  EXPECT_EQ(in.read_s, (std::vector<double>{0.75, 0.5, 0.5, 0.5}));
  EXPECT_EQ(in.exec_s, (std::vector<double>{3.5, 3, 2.5, 2.5}));
  EXPECT_EQ(in.nonexpert_s, (std::vector<double>{0.25, 0.125}));
  EXPECT_EQ(in.other_s, 0.5);
  // g = 1 at depth 2: bandwidth interpolated halfway between 8192 and 16384 over depths 1..4.
  m = MakeServiceModel(p, 1, 2);
  ASSERT_TRUE(m.ok());
  EXPECT_DOUBLE_EQ(m->bandwidth, 8192 + (16384 - 8192) / 3.0);
  BuildPipelineInput(p, *m, &in);
  EXPECT_EQ(in.layer_begin, (std::vector<uint32_t>{0, 2, 4}));  // experts 0, 4 | 1, 2
  EXPECT_EQ(MakeServiceModel(p, 3, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeServiceModel(p, 1, 0).status().code(), StatusCode::kInvalidArgument);
}

// The loader's depth counts chunk reads; the recurrence's q counts whole group reads.
TEST(ConfigService, QueueDepthCountsChunksNotGroups) {
  EXPECT_EQ(GroupsInFlight(4, 4096, 16384), 1);  // 4 chunks per group
  EXPECT_EQ(GroupsInFlight(7, 4096, 16384), 1);
  EXPECT_EQ(GroupsInFlight(8, 4096, 16384), 2);
  EXPECT_EQ(GroupsInFlight(16, 4096, 16383), 4);  // a partial chunk is a chunk read
  EXPECT_EQ(GroupsInFlight(16, 4096, 16385), 3);
  EXPECT_EQ(GroupsInFlight(2, 4096, 100), 2);     // groups under a chunk: Q groups
  EXPECT_EQ(GroupsInFlight(1, 1 << 20, 1 << 30), 1);
  // Qwen3-30B-A3B, G = 1: 2,654,208-byte records in 1 MiB chunks (3 chunk reads each).
  EXPECT_EQ(GroupsInFlight(4, 1 << 20, 2654208), 1);
  EXPECT_EQ(GroupsInFlight(8, 1 << 20, 2654208), 2);
  EXPECT_EQ(GroupsInFlight(32, 1 << 20, 2654208), 10);
  // HandProfile: chunks of 4096, the largest record 8192: g = 2 groups take 4 chunk reads.
  const Profile p = HandProfile();
  for (auto [g, q, want] : {std::tuple{2, 4, 1}, {2, 8, 2}, {1, 4, 2}, {1, 1, 1}}) {
    auto m = MakeServiceModel(p, g, q);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->queue_depth, q);
    EXPECT_EQ(m->groups_in_flight, want) << "g " << g << " Q " << q;
    PipelineInput in;
    BuildPipelineInput(p, *m, &in);
    PipelineWorkspace ws;
    for (int b : {1, 3, 8}) {
      const double want_s = EvaluatePipeline(in, {.banks = b, .queue_depth = want}, &ws).total_s;
      EXPECT_EQ(PredictConfig(p, g, q, b)->predicted_s, want_s) << "g " << g << " Q " << q << " b " << b;
    }
  }
}

TEST(ConfigService, LoadSamplesScaleTheDiskTable) {
  Profile p = HandProfile();
  // g = 2 loads measured at depth 1 (bw 8192 B/s), mean record (8192 + 4096) / 2 = 6144 B:
  // the table predicts 2 x 6144 / 8192 = 1.5 s per read; samples with median 3 s -> scale 2.
  p.runs[1].load_queue_depth = 1;
  p.runs[1].load_seconds = {2.5f, 3, 9, 3.5f, 1};  // median 3
  auto m = MakeServiceModel(p, 2, 4);
  ASSERT_TRUE(m.ok());
  EXPECT_DOUBLE_EQ(m->load_scale, 2);
  EXPECT_DOUBLE_EQ(m->TransferSeconds(16384), 1.0);  // 2 x 16384 / 32768
  EXPECT_DOUBLE_EQ(m->ReadSeconds(16384), 1.25);
  p.runs[1].load_seconds = {3, 4};  // even count: mean of the middle two
  m = MakeServiceModel(p, 2, 4);
  EXPECT_DOUBLE_EQ(m->load_scale, 3.5 / 1.5);
}

TEST(ConfigService, PredictionMatchesHandEvaluation) {
  // HandProfile, g = 2, Q = 4, b = 1, early cross-layer. Groups (L, T, X):
  //   layer 0 (T_ne 0.25): j1 (0.75, 0.5, 3.5), j2 (0.5, 0.25, 3)
  //   layer 1 (T_ne 0.125): j3 (0.5, 0.25, 2.5), j4 (0.5, 0.25, 2.5)
  // j1: a 0, d 0.75, s 0.75, f 4.25. j2: a = f1 = 4.25, d 4.75, f 7.75. Layer 1 starts 7.75,
  // e = 7.875. j3: a = 7.75, d 8.25, f 10.75. j4: a 10.75, d 11.25, f 13.75. Total + 0.5 = 14.25.
  auto c = PredictConfig(HandProfile(), 2, 4, 1);
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->predicted_s, 14.25);
  EXPECT_EQ(c->arena_bytes, 2u * 8192);
  EXPECT_EQ(c->total_bytes, 2u * 8192 + 100000);
  // b = 2: j2's read overlaps j1: d2 = max(0.5, 0.75 + 0.25) = 1, f2 = 7.25; j3: a = f1 = 4.25,
  // d = 4.75; layer 1 from 7.25, e = 7.375, f3 = 9.875; j4: a = f2 = 7.25, d = 7.75, f = 12.375.
  c = PredictConfig(HandProfile(), 2, 4, 2);
  EXPECT_DOUBLE_EQ(c->predicted_s, 12.875);
}

// Brute force: every (g, Q >= Q0(g), b) that fits, with PredictConfig; the least latency, then
// the least memory, then the smaller g, then the deeper Q (tolerance 0).
CandidatePrediction BruteForce(const Profile& p, const SelectParams& params, int scan_limit) {
  CandidatePrediction best;
  best.predicted_s = INFINITY;
  for (const CalibrationRun& run : p.runs) {
    const uint64_t bank = static_cast<uint64_t>(run.group_size) * p.expert_bytes;
    if (params.budget_bytes < run.other_bytes + bank) continue;
    const int b_max = static_cast<int>(std::min<uint64_t>((params.budget_bytes - run.other_bytes) / bank, scan_limit));
    for (int q : p.disk.queue_depths) {
      if (q < p.disk.Q0(run.group_size)) continue;
      for (int b = 1; b <= b_max; ++b) {
        auto c = PredictConfig(p, run.group_size, q, b, params.schedule, params.cross_layer);
        EXPECT_TRUE(c.ok());
        if (c->predicted_s < best.predicted_s ||
            (c->predicted_s == best.predicted_s && c->total_bytes < best.total_bytes) ||
            (c->predicted_s == best.predicted_s && c->total_bytes == best.total_bytes &&
             c->group_size == best.group_size && c->queue_depth > best.queue_depth)) {
          best = *c;
        }
      }
    }
  }
  return best;
}

SyntheticProfileParams RandomParams(std::mt19937_64& rng) {
  SyntheticProfileParams sp;
  std::uniform_int_distribution<int> layers(1, 5), tokens(1, 40), pick(0, 2);
  std::uniform_real_distribution<double> u(0, 1);
  sp.n_layer = layers(rng);
  sp.n_expert = std::vector<int>{6, 13, 16}[static_cast<size_t>(pick(rng))];
  sp.n_expert_used = std::min(sp.n_expert, 2 + pick(rng));
  sp.n_tokens = tokens(rng);  // few tokens: some groups inactive
  sp.expert_bytes = 4096 * (1 + static_cast<uint64_t>(pick(rng)) * 5);
  sp.nonexpert_s = 1e-3 * u(rng);
  sp.exec_per_expert_s = 1e-4 * u(rng);
  sp.exec_per_row_s = 1e-5 * u(rng);
  // Disk from I/O bound (10 MB/s per 4 KiB... ) to compute bound.
  sp.peak_bandwidth = std::pow(10.0, 6.5 + 3 * u(rng));
  sp.latency_s = 1e-4 * u(rng);
  sp.group_sizes = pick(rng) == 0 ? std::vector<int>{1, 2, 4} : std::vector<int>{1, 3, 5};
  sp.other_bytes = 1 << 20;
  sp.other_bytes_per_g = static_cast<uint64_t>(pick(rng)) * 1000;
  sp.seed = rng();
  return sp;
}

TEST(ConfigSelect, AgreesWithBruteForceAndExhaustiveScan) {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> extra_banks(0, 60);
  std::uniform_real_distribution<double> u(0, 1);
  for (int iter = 0; iter < 60; ++iter) {
    const Profile p = MakeSyntheticProfile(RandomParams(rng));
    const MinimumBudgetInfo min = MinimumBudget(p);
    EXPECT_EQ(min.group_size, 1);  // M_other grows with g here
    for (Schedule s : {Schedule::kEarly, Schedule::kAfterRouting, Schedule::kOnDemand}) {
      SelectParams params{.budget_bytes = min.bytes + static_cast<uint64_t>(extra_banks(rng)) * p.expert_bytes +
                                          static_cast<uint64_t>(u(rng) * p.expert_bytes),
                          .schedule = s,
                          .cross_layer = u(rng) < 0.7};
      params.read_ahead_layers = 0;  // the model's own smallest b (the headroom is tested below)
      params.choice_tolerance = 0;   // the exact minimum (the tie band is tested below)
      auto sel = SelectConfig(p, params);
      ASSERT_TRUE(sel.ok()) << sel.status().ToString();
      EXPECT_LE(sel->best.total_bytes, params.budget_bytes);
      // Scan far enough to pass the useful maximum (all active groups of the request).
      const CandidatePrediction ref = BruteForce(p, params, p.n_layer * p.n_expert + 2);
      EXPECT_EQ(sel->best.predicted_s, ref.predicted_s) << "iter " << iter;
      EXPECT_EQ(sel->best.total_bytes, ref.total_bytes) << "iter " << iter;
      EXPECT_EQ(sel->best.group_size, ref.group_size);
      EXPECT_EQ(sel->best.queue_depth, ref.queue_depth);
      EXPECT_EQ(sel->best.banks, ref.banks);
      // Bisection and the exhaustive scan agree, with and without a tolerance.
      for (double tol : {0.0, 0.01, 0.2}) {
        SelectParams a = params, b = params;
        a.tolerance = b.tolerance = tol;
        a.choice_tolerance = b.choice_tolerance = tol;
        b.exhaustive = true;
        auto sa = SelectConfig(p, a), sb = SelectConfig(p, b);
        ASSERT_TRUE(sa.ok() && sb.ok());
        ASSERT_EQ(sa->per_group.size(), sb->per_group.size());
        for (size_t i = 0; i < sa->per_group.size(); ++i) {
          EXPECT_EQ(sa->per_group[i].banks, sb->per_group[i].banks);
          EXPECT_EQ(sa->per_group[i].predicted_s, sb->per_group[i].predicted_s);
        }
        // Each g's b is within (1 + tol) of its minimum, the g within (1 + tol) of the best of those.
        EXPECT_LE(sa->best.predicted_s, sel->best.predicted_s * (1 + tol) * (1 + tol));
        EXPECT_LE(sa->best.total_bytes, sel->best.total_bytes);  // a tolerance only saves memory
      }
    }
  }
}

// The default tie band between (g, q) (SelectParams::choice_tolerance, 2%): the choice is within
// it of the least prediction, and among the candidates within it the one with the least memory,
// then the smallest g, then the deepest q; a negative or non-finite band is refused.
TEST(ConfigSelect, TiesWithinTheChoiceToleranceGoToLessMemoryThenSmallerGroups) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> extra_banks(0, 60);
  int ties_seen = 0;
  for (int iter = 0; iter < 60; ++iter) {
    const Profile p = MakeSyntheticProfile(RandomParams(rng));
    const SelectParams params{.budget_bytes = MinimumBudget(p).bytes +
                                              static_cast<uint64_t>(extra_banks(rng)) * p.expert_bytes};
    ASSERT_EQ(params.choice_tolerance, 0.02);
    auto sel = SelectConfig(p, params);
    ASSERT_TRUE(sel.ok()) << sel.status().ToString();
    double least = INFINITY;
    for (const CandidatePrediction& c : sel->per_group) least = std::min(least, c.predicted_s);
    EXPECT_LE(sel->best.predicted_s, least * 1.02);
    int in_band = 0;
    for (const CandidatePrediction& c : sel->per_group) {
      if (c.predicted_s > least * 1.02) continue;
      ++in_band;
      EXPECT_TRUE(sel->best.total_bytes < c.total_bytes ||
                  (sel->best.total_bytes == c.total_bytes &&
                   std::pair(sel->best.group_size, -sel->best.queue_depth) <= std::pair(c.group_size, -c.queue_depth)))
          << "iter " << iter << ": chose g " << sel->best.group_size << " over g " << c.group_size;
    }
    if (in_band > 1) ++ties_seen;
  }
  EXPECT_GT(ties_seen, 0) << "no profile had two candidates within the band: the test checks nothing";
  const Profile p = MakeSyntheticProfile(RandomParams(rng));
  for (double bad : {-0.01, static_cast<double>(NAN), static_cast<double>(INFINITY)})
    EXPECT_EQ(SelectConfig(p, {.budget_bytes = MinimumBudget(p).bytes, .choice_tolerance = bad}).status().code(),
              StatusCode::kInvalidArgument);
}

// A compute-bound profile (fast disk): a few banks already hide every read, more buy nothing.
Profile ComputeBound() {
  SyntheticProfileParams sp;
  sp.n_layer = 4;
  sp.n_expert = 16;
  sp.n_expert_used = 4;
  sp.n_tokens = 64;
  sp.expert_bytes = 1 << 20;
  sp.peak_bandwidth = 20e9;  // 1 MiB in 52 us; executing a group takes >= 150 us
  sp.group_sizes = {1, 2, 4};
  sp.other_bytes = 1 << 24;
  sp.other_bytes_per_g = 0;
  return MakeSyntheticProfile(sp);
}

TEST(ConfigSelect, BestBankCountIsInteriorWhenMoreBanksBuyNothing) {
  const Profile p = ComputeBound();
  const SelectParams params{.budget_bytes = (uint64_t{1} << 24) + 40 * p.expert_bytes, .group_sizes = {2},
                            .read_ahead_layers = 0};
  auto sel = SelectConfig(p, params);
  ASSERT_TRUE(sel.ok()) << sel.status().ToString();
  const CandidatePrediction& best = sel->best;
  const int b_max = 20;  // 40 slots / g = 2
  EXPECT_GT(best.banks, 1);
  EXPECT_LT(best.banks, b_max);
  auto at = [&](int b) { return PredictConfig(p, 2, best.queue_depth, b)->predicted_s; };
  EXPECT_GT(at(best.banks - 1), best.predicted_s);  // one fewer bank is slower
  EXPECT_EQ(at(b_max), best.predicted_s);           // the budget's maximum is no faster
  // Neighbours for --report: b - 1, b + 1, and the adjacent depths of the disk table.
  ASSERT_GE(sel->neighbours.size(), 3u);
  EXPECT_EQ(sel->neighbours[0].banks, best.banks - 1);
  EXPECT_EQ(sel->neighbours[0].predicted_s, at(best.banks - 1));
  EXPECT_EQ(sel->neighbours[1].banks, best.banks + 1);
  EXPECT_EQ(sel->neighbours[1].predicted_s, best.predicted_s);
  for (size_t i = 2; i < sel->neighbours.size(); ++i) {
    EXPECT_EQ(sel->neighbours[i].banks, best.banks);
    EXPECT_NE(sel->neighbours[i].queue_depth, best.queue_depth);
  }
  // Bisection: a handful of evaluations per depth, not b_max.
  EXPECT_LE(sel->evaluations, (2 + 6) * static_cast<int>(sel->per_group.size()) +
                                  static_cast<int>(sel->neighbours.size()));
}

TEST(ConfigSelect, ReadAheadHeadroomRaisesBanksWithinTheBudget) {
  const Profile p = ComputeBound();  // E = 16: two layers' groups = 2 * 16 / g banks
  for (int slots : {40, 12}) {        // room for 20 / 6 banks of g = 2
    const uint64_t budget = (uint64_t{1} << 24) + static_cast<uint64_t>(slots) * p.expert_bytes;
    auto lean = SelectConfig(p, {.budget_bytes = budget, .group_sizes = {2}, .read_ahead_layers = 0});
    auto sel = SelectConfig(p, {.budget_bytes = budget, .group_sizes = {2}});
    ASSERT_TRUE(lean.ok() && sel.ok());
    EXPECT_EQ(sel->best.banks, std::min(16, slots / 2)) << slots;
    EXPECT_GE(sel->best.banks, lean->best.banks);
    EXPECT_LE(sel->best.predicted_s, lean->best.predicted_s);  // monotone in b
    EXPECT_LE(sel->best.total_bytes, budget);
  }
  // max_banks still caps it.
  auto capped = SelectConfig(p, {.budget_bytes = (uint64_t{1} << 24) + 40 * p.expert_bytes, .group_sizes = {2},
                                 .max_banks = 5});
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->best.banks, 5);
}

TEST(ConfigSelect, BudgetForOneBankOnly) {
  const Profile p = ComputeBound();
  // One bank of g = 1 plus half an expert: g = 1 gets b = 1, larger g do not fit at all.
  const uint64_t budget = p.runs[0].other_bytes + p.expert_bytes + p.expert_bytes / 2;
  auto sel = SelectConfig(p, {.budget_bytes = budget});
  ASSERT_TRUE(sel.ok()) << sel.status().ToString();
  EXPECT_EQ(sel->best.group_size, 1);
  EXPECT_EQ(sel->best.banks, 1);
  EXPECT_EQ(sel->best.total_bytes, p.runs[0].other_bytes + p.expert_bytes);
  ASSERT_FALSE(sel->per_group.empty());
  for (const CandidatePrediction& c : sel->per_group) EXPECT_EQ(c.group_size, 1);
  EXPECT_TRUE(sel->neighbours.size() <= 2);  // no b +- 1: only other depths
  for (const CandidatePrediction& n : sel->neighbours) EXPECT_EQ(n.banks, 1);
}

TEST(ConfigSelect, InfeasibleBudgetNamesTheMinimum) {
  Profile p = ComputeBound();
  p.runs[0].other_bytes = 50'000'000;  // g = 1 is no longer the cheapest: g = 2 needs less
  p.runs[1].other_bytes = 40'000'000;
  p.runs[2].other_bytes = 45'000'000;
  const MinimumBudgetInfo min = MinimumBudget(p);
  EXPECT_EQ(min.group_size, 2);
  EXPECT_EQ(min.bytes, 40'000'000u + 2 * p.expert_bytes);
  auto sel = SelectConfig(p, {.budget_bytes = min.bytes - 1});
  ASSERT_EQ(sel.status().code(), StatusCode::kResourceExhausted);
  const std::string& msg = sel.status().message();
  EXPECT_NE(msg.find(std::to_string(min.bytes - 1) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the smallest needs " + std::to_string(min.bytes) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("M_other 40000000 B + one bank of G = 2 experts x W_e = 1048576 B"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  // Exactly the minimum fits: one bank of g = 2.
  sel = SelectConfig(p, {.budget_bytes = min.bytes});
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel->best.group_size, 2);
  EXPECT_EQ(sel->best.banks, 1);
  EXPECT_EQ(sel->best.total_bytes, min.bytes);
  // Restricting the candidates changes the minimum.
  EXPECT_EQ(MinimumBudget(p, {1, 4}).group_size, 4);
  EXPECT_EQ(SelectConfig(p, {.budget_bytes = min.bytes, .group_sizes = {1, 4}}).status().code(),
            StatusCode::kResourceExhausted);
}

TEST(ConfigSelect, MonotoneInQueueDepthAndBudget) {
  std::mt19937_64 rng(5);
  for (int iter = 0; iter < 20; ++iter) {
    const Profile p = MakeSyntheticProfile(RandomParams(rng));  // bw non-decreasing in q
    for (const CalibrationRun& run : p.runs) {
      for (int b : {1, 2, 5}) {
        double prev = INFINITY;
        for (int q = 1; q <= 40; q += 3) {  // measured and interpolated depths
          const double t = PredictConfig(p, run.group_size, q, b)->predicted_s;
          EXPECT_LE(t, prev * (1 + 1e-12)) << "g " << run.group_size << " q " << q;
          prev = t;
        }
      }
    }
    double prev = INFINITY;
    const uint64_t min = MinimumBudget(p).bytes;
    for (int extra = 0; extra < 40; extra += 3) {
      auto sel = SelectConfig(p, {.budget_bytes = min + extra * p.expert_bytes, .choice_tolerance = 0});
      ASSERT_TRUE(sel.ok());
      EXPECT_LE(sel->best.predicted_s, prev) << "a larger budget gave a slower choice";
      prev = sel->best.predicted_s;
    }
  }
}

TEST(ConfigSelect, QueueDepthsSchedulesAndErrors) {
  const Profile p = ComputeBound();
  const uint64_t budget = (uint64_t{1} << 24) + 12 * p.expert_bytes;
  auto sel = SelectConfig(p, {.budget_bytes = budget, .queue_depths = {1, 4, 16}});
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel->per_group.size(), 9u);  // 3 g x 3 depths
  for (const CandidatePrediction& c : sel->per_group) EXPECT_LE(sel->best.predicted_s, c.predicted_s);
  // Schedules: earlier release is never slower, also after selection.
  double prev = 0;
  for (Schedule s : {Schedule::kEarly, Schedule::kAfterRouting, Schedule::kOnDemand}) {
    auto r = SelectConfig(p, {.budget_bytes = budget, .schedule = s});
    ASSERT_TRUE(r.ok());
    EXPECT_GE(r->best.predicted_s, prev) << ScheduleName(s);
    prev = r->best.predicted_s;
    const ConfigChoice c = ToConfigChoice(*r, {.budget_bytes = budget, .schedule = s});
    EXPECT_EQ(c.group_size, r->best.group_size);
    EXPECT_EQ(c.banks, r->best.banks);
    EXPECT_EQ(c.queue_depth, r->best.queue_depth);
    EXPECT_EQ(c.budget_bytes, budget);
    EXPECT_EQ(c.schedule, s);
    EXPECT_FLOAT_EQ(c.predicted_seconds, static_cast<float>(r->best.predicted_s));
  }
  // max_banks caps b.
  sel = SelectConfig(p, {.budget_bytes = budget, .max_banks = 1});
  ASSERT_TRUE(sel.ok());
  for (const CandidatePrediction& c : sel->per_group) EXPECT_EQ(c.banks, 1);
  auto bad = SelectConfig(p, {.budget_bytes = budget, .group_sizes = {3}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("group size 3 was not calibrated; the profile has runs for 1, 2, 4"),
            std::string::npos)
      << bad.status().message();
  EXPECT_EQ(SelectConfig(p, {.budget_bytes = budget, .queue_depths = {0}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SelectConfig(p, {.budget_bytes = budget, .tolerance = -1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PredictConfig(p, 2, 4, 0).status().code(), StatusCode::kInvalidArgument);
  Profile broken = p;
  broken.nonexpert_seconds.pop_back();
  EXPECT_EQ(SelectConfig(broken, {.budget_bytes = budget}).status().code(), StatusCode::kInvalidArgument);
}

TEST(ConfigSelect, RealisticSizeSolves) {
  // Qwen3-30B-A3B shapes: 48 layers x 128 experts, top-8, 1K tokens, W_e = 2.53 MiB; a budget of
  // 1 GiB + 25% of all expert bytes. Reads (1.66 ms per expert at 1.6 GB/s) are slower than
  // executing one (~0.7 ms), so the pipeline is I/O bound: the bubble is real, more banks help
  // only up to the point where the disk is busy all the time.
  const Profile p = MakeSyntheticProfile({});
  const uint64_t budget = (uint64_t{1} << 30) + (uint64_t{2} << 20) * 5 + p.TotalExpertBytes() / 4;
  auto sel = SelectConfig(p, {.budget_bytes = budget});
  ASSERT_TRUE(sel.ok()) << sel.status().ToString();
  EXPECT_LE(sel->best.total_bytes, budget);
  EXPECT_GT(sel->best.wait_s, 0);
  size_t depths = 0;  // every measured depth >= Q0(g), for each of the 5 group sizes
  for (const CalibrationRun& run : p.runs)
    for (int q : p.disk.queue_depths) depths += q >= p.disk.Q0(run.group_size);
  EXPECT_EQ(sel->per_group.size(), depths);
  EXPECT_GT(depths, 5u);
  // Lower bound: all compute, and all reads at peak bandwidth (the disk never idles).
  double compute = p.other_seconds;
  for (float t : p.nonexpert_seconds) compute += t;
  EXPECT_GT(sel->best.predicted_s, compute);
  EXPECT_GT(sel->best.predicted_s, p.TotalExpertBytes() / 1.6e9);
}

}  // namespace
}  // namespace estream::config
