// The engine against the independent fp64 forward (tests/ref) on synthetic models of every
// architecture (estream synth's `tiny` preset, 3 layers; deepseek2's has a dense first layer, a q
// LoRA, YaRN and shared experts), with F32, Q8_0 and Q4_0 weights; and a
// golden file of the top-5 next tokens of one fixed synthetic model (Q4_0).
//
// ---- Error bound for quantised weights -------------------------------------------------------
// The fp64 forward runs on the dequantised weights, so weight quantisation is not an error here:
// the only difference left is that the engine quantises the INPUT of every quantised GEMM to the
// 8-bit activation format (BlockQ8A: blocks of 32, d = max|x| / 127, q = round(x / d)), and
// accumulates in fp32 (~1e-6, negligible).
//   One GEMM: each input element moves by at most d/2, uniformly, so a block of 32 values whose
//   largest magnitude is m carries noise of variance 32 (m/127)^2 / 12. For Gaussian-like rows the
//   block maximum is about 2.2 rms (E[m^2] ~ 4.7 rms^2 for 32 samples), so the relative noise of
//   the quantised input is eps = sqrt(4.7 / (12 * 127^2)) = 4.9e-3, and for weights independent
//   of that noise the GEMM output carries the same relative noise, eps.
//   Per layer: Q/K/V, attention output, gate/up and down each quantise an input: the attention
//   branch carries ~sqrt(2) eps (more where the softmax sharpens score errors: scores have std
//   ~2.6 here, so a relative error eps on q and k moves a score by ~2.6 * sqrt(2) eps ~ 0.02,
//   which changes softmax weights by ~2% relative), the MoE branch ~sqrt(3) eps. The residual
//   stream adds 2L branches of comparable size to the embedding, so its relative error grows
//   like sqrt(2L) * 2 eps at worst; the final norm keeps it relative, and the LM head quantises
//   its input once more.
//   With L = 3: sqrt(6) * 2 * 4.9e-3 + 4.9e-3 ~ 3e-2 as a pessimistic estimate of the relative
//   error of one row of logits; the tests use kQuantRelBound = 6e-2 (2x, for the heavier tails
//   of the synthetic hidden states, whose common direction makes block maxima larger), and
//   measure and print the actual worst error (about 1e-2) so a regression shows long before the
//   bound trips. Top-1 must agree wherever the fp64 top-2 logits are further apart than 6e-2 x
//   the row's rms (a smaller gap is within the bound and may legitimately swap).
// ---- Near-tie routing -------------------------------------------------------------------------
// Router inputs carry the same stream error (relative ~1e-2, so ~0.03 on router logits of size
// ~3), so where the k-th and (k+1)-th router logits are closer than that the engine may pick
// another expert than the fp64 forward would; in these synthetic models the top-k margin is below
// 0.1 for about a fifth of all (token, layer) pairs, so excluding such tokens (and everything
// downstream of them through attention) would leave almost nothing to check. Instead the engine
// reports its routing (Request::return_routing) and the fp64 forward FOLLOWS it
// (ref::RefOptions::routing), reporting for every (token, layer) the deficit of the engine's
// choice: how far below the reference's own k-th router logit the weakest chosen expert lies.
//   - a deficit >= kTieGap = 0.1 (3x the pessimistic router-logit error above, 10x the worst
//     deficit measured: 0.014) fails: the engine chose an expert that no small error can
//     explain — a bug, not a tie;
//   - with the routing aligned, both sides compute the same function, so the logits of EVERY
//     position are held to the bound above and to the same top-1.
// With F32 weights there is no activation quantisation: the engine is fp32 throughout, the
// bound is 1e-4 and the routing must agree everywhere (ties closer than 1e-4 excepted).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "estream/engine.h"
#include "expect_isa.h"
#include "model/synth.h"
#include "model_test_util.h"
#include "ref/ref_forward.h"

namespace estream {
namespace {

using model_test::ArgMax;
using model_test::RelErr;
using model_test::ScratchDir;

constexpr double kF32RelBound = 1e-4;
constexpr double kQuantRelBound = 6e-2;
constexpr double kTieGap = 0.1;
constexpr int kLayers = 3;
constexpr int kPromptLen = 64;

std::vector<int32_t> Prompt(int n, int n_vocab, uint32_t seed) {
  std::vector<int32_t> ids(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < n; ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    ids[i] = static_cast<int32_t>(s % n_vocab);
  }
  return ids;
}

struct Case {
  const char* arch;
  QuantType type;
  const char* mix = "";  // a llama-quantize mix (synth --type), overriding type
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.arch) + "_" + (*info.param.mix ? info.param.mix : TypeName(info.param.type));
}

class SynthVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(SynthVsReference, LogitsAndRouting) {
  const Case c = GetParam();
  ScratchDir dir;
  const std::string path = dir.File("model.gguf");
  auto synth = synth::SynthModel::Create({.preset = "tiny", .arch = c.arch, .layers = kLayers, .type = c.type,
                                          .mix = c.mix, .router_skew = 0.5f, .seed = 7});
  ASSERT_TRUE(synth.ok()) << synth.status().ToString();
  ASSERT_TRUE((*synth)->Write(path, {.threads = 2}).ok());

  auto engine = Engine::Load(path, {.n_threads = 2});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const ModelInfo& info = (*engine)->info();
  const int64_t T = kPromptLen, V = info.n_vocab, L = info.n_layer, K = info.n_expert_used;
  ASSERT_EQ(L, kLayers);
  const std::vector<int32_t> ids = Prompt(kPromptLen, V, 11);

  auto resp = (*engine)->Run({.tokens = ids, .top_k = 0, .logits = Request::Logits::kAll, .return_routing = true});
  ASSERT_TRUE(resp.ok()) << resp.status().ToString();
  // The fp64 forward, following the engine's expert choices (see "Near-tie routing").
  auto ref = ref::RefForward(path, ids, {.routing = &resp->routing});
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  ASSERT_EQ(ref->logits.size(), resp->logits.size());

  const bool quantised = c.type != QuantType::kF32 || *c.mix;
  const std::string label = *c.mix ? c.mix : TypeName(c.type);
  const double bound = quantised ? kQuantRelBound : kF32RelBound;
  const double tie_gap = quantised ? kTieGap : 1e-4;

  // Routing: every choice of the engine is the reference's own or a near-tie of it.
  int n_diff = 0, n_near_ties = 0;
  double worst_deficit = 0;
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> a(resp->routing.begin() + (l * T + t) * K, resp->routing.begin() + (l * T + t + 1) * K);
      std::vector<int32_t> b(ref->routing.begin() + (l * T + t) * K, ref->routing.begin() + (l * T + t + 1) * K);
      if (a[0] < 0 && b[0] < 0) continue;  // a leading dense block (deepseek2, lfm2moe): no router
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end()) << "expert chosen twice, layer " << l << " token " << t;
      n_near_ties += ref->router_gap[t * L + l] < tie_gap;
      n_diff += a != b;
      const double deficit = ref->route_deficit[t * L + l];
      worst_deficit = std::max(worst_deficit, deficit);
      EXPECT_LT(deficit, tie_gap) << "layer " << l << " token " << t << ": the engine chose an expert "
                                  << deficit << " below the fp64 router's k-th logit (not a near-tie)";
    }
  }

  // Logits at every position.
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* row = resp->logits.data() + t * V;
    const double* want = ref->logits.data() + t * V;
    const double err = RelErr(row, want, V);
    worst = std::max(worst, err);
    EXPECT_LT(err, bound) << c.arch << " " << label << " position " << t;
    // Top-1 must agree unless the fp64 top-2 are closer than the error bound allows.
    std::vector<double> sorted(want, want + V);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    double rms = 0;
    for (int64_t i = 0; i < V; ++i) rms += want[i] * want[i];
    rms = std::sqrt(rms / V);
    if (sorted[0] - sorted[1] > 2 * bound * rms) {
      EXPECT_EQ(ArgMax(row, V), ArgMax(want, V)) << c.arch << " " << label << " position " << t;
    }
  }
  std::printf("%-9s %-6s worst row rel err %.2e; routing differs at %d of %lld token-layers (worst deficit %.3f; "
              "%d near ties)\n",
              c.arch, label.c_str(), worst, n_diff, static_cast<long long>(T * L), worst_deficit, n_near_ties);
}

INSTANTIATE_TEST_SUITE_P(All, SynthVsReference,
                         ::testing::Values(Case{"olmoe", QuantType::kF32}, Case{"olmoe", QuantType::kQ8_0},
                                           Case{"olmoe", QuantType::kQ4_0}, Case{"qwen3moe", QuantType::kF32},
                                           Case{"qwen3moe", QuantType::kQ8_0}, Case{"qwen3moe", QuantType::kQ4_0},
                                           Case{"llama", QuantType::kF32}, Case{"llama", QuantType::kQ8_0},
                                           Case{"llama", QuantType::kQ4_0}, Case{"deepseek2", QuantType::kF32},
                                           Case{"deepseek2", QuantType::kQ8_0}, Case{"deepseek2", QuantType::kQ4_0},
                                           Case{"lfm2moe", QuantType::kF32}, Case{"lfm2moe", QuantType::kQ8_0},
                                           Case{"lfm2moe", QuantType::kQ4_0}),
                         CaseName);

// llama-quantize mixes (synth --type): every new weight type appears in one of them on the tiny
// shapes (n_embd 256, n_ff_expert 128 or 512, 8 experts: attn_k/attn_v become q8_0, attn_output
// q5_K, and 128-wide rows fall back to q4_0/q5_0/q5_1/iq4_nl as in llama-quantize). The fp64
// forward runs on the dequantised weights, so the bound is the activation quantisation's, as above.
INSTANTIATE_TEST_SUITE_P(Mixes, SynthVsReference,
                         ::testing::Values(Case{"olmoe", QuantType::kQ4_0, "q4_K_M"},
                                           Case{"olmoe", QuantType::kQ4_0, "q5_K_M"},
                                           Case{"qwen3moe", QuantType::kQ4_0, "q3_K_M"},
                                           Case{"llama", QuantType::kQ4_0, "q2_K"},
                                           Case{"olmoe", QuantType::kQ4_0, "iq4_xs"},
                                           Case{"qwen3moe", QuantType::kQ4_0, "q4_1"},
                                           Case{"llama", QuantType::kQ4_0, "q5_1"},
                                           Case{"olmoe", QuantType::kQ4_0, "mxfp4_moe"}),
                         CaseName);

// ---- Golden file ------------------------------------------------------------------------------
// tests/data/model_golden_top5.json: the top-5 next tokens and log-probabilities for the shared
// synthetic olmoe-tiny model (shared/testdata/models, generator seed 21), as it is (F32) and with
// its matrices quantised to Q4_0 by the reference quantiser (bit-exact with ggml's; the router
// stays F32), for the 48-token prompt stored beside it. The model is fixed data (it does not move
// when estream synth's generator changes), so the file pins the loader, every kernel and the
// outputs. Regenerate with ESTREAM_UPDATE_GOLDEN=1 only after a deliberate numerical change,
// and check the diff.
// Tolerances: F32 runs in fp32 throughout, so every ISA agrees to ~1e-6 (1e-4 allowed). With
// Q4_0 the activations are rounded to 8 bits before every GEMM, which is discontinuous: an fp32
// difference of 1e-7 between ISAs (summation order) can flip one rounding, and one flipped value
// moves every output of that GEMM by d |w| ~ (2.2 rms / 127) / sqrt(k) relative to its size,
// about 1e-3 at k = 256; flips compound over the layers to ~1e-2 relative on the logits
// (measured: 1.1e-2 between the scalar and AVX-512 paths), i.e. ~0.03 on log-probs of a row
// whose logits have rms ~2. kQ4Tol = 0.1 is 3x that and still far below what any real defect
// does (a convention error moves log-probs by O(1)). Ranks are compared as sorted values (robust
// to swaps of near-equal tokens); each golden token must be in the top 5 with its log-prob
// within the tolerance, or have fallen out only by less than the tolerance.
using model_test::ReadTokens;

TEST(Golden, Top5) {
  const std::string golden_path = std::string(ESTREAM_SOURCE_DIR) + "/tests/data/model_golden_top5.json";
  const std::string shared = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/";
  const std::vector<int32_t> ids = ReadTokens(shared + "olmoe-tiny.tokens.txt");
  const bool update = std::getenv("ESTREAM_UPDATE_GOLDEN") && std::string(std::getenv("ESTREAM_UPDATE_GOLDEN")) == "1";
  nlohmann::json golden;
  if (!update) {
    std::ifstream in(golden_path);
    ASSERT_TRUE(in) << "missing " << golden_path << " (run with ESTREAM_UPDATE_GOLDEN=1 to create it)";
    golden = nlohmann::json::parse(in);
    ASSERT_EQ(golden["prompt"].get<std::vector<int32_t>>(), ids);
  } else {
    golden["model"] = "shared/testdata/models/olmoe-tiny-f32.gguf: as is (f32), and matrices quantised to q4_0 "
                      "(router f32)";
    golden["prompt"] = ids;
  }
  ScratchDir dir;
  for (const auto& [name, type, tol] : {std::tuple{"f32", QuantType::kF32, 1e-4}, {"q4_0", QuantType::kQ4_0, 0.1}}) {
    SCOPED_TRACE(name);
    std::string path = shared + "olmoe-tiny-f32.gguf";
    std::vector<std::vector<uint8_t>> storage;
    if (type != QuantType::kF32) {
      path = dir.File(std::string("olmoe-tiny-") + name + ".gguf");
      ASSERT_TRUE(model_test::RewriteGguf(shared + "olmoe-tiny-f32.gguf", path, [&](model_test::GgufContents* c) {
                    model_test::QuantizeMatrices(c, type, &storage);
                  }).ok());
    }
    auto engine = Engine::Load(path, {.n_threads = 2});
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    auto resp = (*engine)->Run({.tokens = ids, .top_k = 5});
    ASSERT_TRUE(resp.ok()) << resp.status().ToString();
    ASSERT_EQ(resp->top.size(), 5u);
    if (update) {
      for (const TokenLogprob& t : resp->top) golden[name].push_back({{"token", t.token}, {"logprob", t.logprob}});
      continue;
    }
    const nlohmann::json& g = golden[name];
    ASSERT_EQ(g.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(resp->top[i].logprob, double(g[i]["logprob"]), tol) << "rank " << i;
    for (size_t i = 0; i < 5; ++i) {
      const int32_t token = g[i]["token"];
      const double lp = g[i]["logprob"];
      auto it = std::find_if(resp->top.begin(), resp->top.end(), [&](const TokenLogprob& t) { return t.token == token; });
      if (it != resp->top.end()) {
        EXPECT_NEAR(it->logprob, lp, tol) << "token " << token;
      } else {
        EXPECT_LT(lp, resp->top[4].logprob + tol) << "golden token " << token << " (rank " << i << ") is missing";
      }
    }
  }
  if (update) {
    std::ofstream(golden_path) << golden.dump(2) << "\n";
    GTEST_SKIP() << "wrote " << golden_path;
  }
}

}  // namespace
}  // namespace estream
