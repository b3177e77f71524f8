// The expert part of a MoE layer as the engine runs it: the fused expert operator of src/moe
// (moe::ExpertPlan, expert_op.h) over the routes of the Workspace's CSR, summed in fp64 into
// ws->acc and rounded into x once per layer (moe::BeginExpertSum / EndExpertSum). The paths it
// replaced (per-expert kernel calls, and one parallel region per route window) live on as the
// test and benchmark baseline in tests/ref/experts_baseline.h, bit-identical to this one.
#pragma once

#include <cstdint>

#include <vector>

#include "base/status.h"
#include "model/blocks.h"
#include "moe/expert_op.h"

namespace estream::model {

// FusedExperts: the fused expert operator of src/moe (moe::ExpertPlan), one plan per
// shape class of the model's MoE layers (n_embd, n_ff, weight types, layout: usually one, two
// for files that keep some ffn_down in another type), slot = expert id, the routes of the
// Workspace's CSR by expert.
// Ownership: owns its plans; borrows the Model and Workspace per call. One call at a time.
class FusedExperts {
 public:
  // route_window: the routes of one operator pass (the plan's capacity; its SwiGLU buffer holds
  // that many rows). The default, kFusedRouteWindow, runs a layer of up to 8192 tokens of 8
  // experts in one pass; tests pass smaller windows to cover the split into passes.
  explicit FusedExperts(int64_t route_window = kFusedRouteWindow) : route_window_(route_window) {}

  // Builds (or keeps) the plans for prompts of up to n_tokens with up to n_threads threads.
  // No allocation when the current plans already cover (n_tokens, n_threads) and every layer's
  // shape class. Layers without expert views (a streamed packed model) are skipped.
  [[nodiscard]] Status Reserve(const Model& model, int64_t n_tokens, int n_threads);
  // x += the experts of layer il, summed in fp64 in ws->acc (BeginExpertSum, one invocation,
  // EndExpertSum). REQUIRES: Reserve covered n_tokens; RouteBlock ran.
  [[nodiscard]] Status Run(const Model& model, int il, int64_t n_tokens, Workspace* ws);

 private:
  moe::ExpertPlan* PlanFor(const moe::ExpertShape& s);
  std::vector<moe::ExpertPlan> plans_;
  std::vector<moe::SlotBinding> bindings_;  // [n_expert], refilled per layer (no allocation)
  int64_t route_window_;
  int64_t max_tokens_ = 0;
  int n_threads_ = 0;
};

}  // namespace estream::model
