#include "model/experts.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "kernels/dispatch.h"

namespace estream::model {

moe::ExpertPlan* FusedExperts::PlanFor(const moe::ExpertShape& s) {
  for (moe::ExpertPlan& p : plans_)
    if (p.shape() == s) return &p;
  return nullptr;
}

Status FusedExperts::Reserve(const Model& model, int64_t n_tokens, int n_threads) {
  const ModelConfig& c = model.config();
  const bool grow = n_tokens > max_tokens_ || n_threads > n_threads_;
  if (grow) plans_.clear();
  const int64_t max_tokens = std::max(n_tokens, max_tokens_);
  const int threads = std::max(n_threads, n_threads_);
  // Routes per pass: all of a prompt's routes up to the window (the SwiGLU output of a pass:
  // C x n_ff / 32 Q8A blocks).
  const int64_t capacity = std::min<int64_t>(route_window_, max_tokens * c.n_expert_used);
  for (const LayerWeights& l : model.layers()) {
    const ExpertWeights& e = l.experts;
    if (e.gate.empty() || e.gate[0].data == nullptr) continue;
    const moe::ExpertShape s = moe::ExpertShape::Of(e.gate[0], e.up[0], e.down[0]);
    if (PlanFor(s) != nullptr) continue;
    ESTREAM_ASSIGN_OR_RETURN(moe::ExpertPlan p, moe::ExpertPlan::Create(s, capacity, max_tokens, threads));
    plans_.push_back(std::move(p));
  }
  if (bindings_.size() < static_cast<size_t>(c.n_expert)) bindings_.resize(c.n_expert);
  max_tokens_ = max_tokens;
  n_threads_ = threads;
  return Status::Ok();
}

Status FusedExperts::Run(const Model& model, int il, int64_t n_tokens, Workspace* ws) {
  const ExpertWeights& e = model.layers()[il].experts;
  const int n_expert = model.config().n_expert;
  moe::ExpertPlan* plan = PlanFor(moe::ExpertShape::Of(e.gate[0], e.up[0], e.down[0]));
  if (plan == nullptr)
    return Status::Internal(fmt::format("FusedExperts: no plan for the experts of layer {} (Reserve first)", il));
  for (int x = 0; x < n_expert; ++x) bindings_[x] = {e.gate[x], e.up[x], e.down[x]};
  const moe::ExpertInvocation inv{.slot_begin = ws->expert_begin.data(),
                                  .n_slots = n_expert,
                                  .route_token = ws->route_token.get(),
                                  .route_weight = ws->route_w.get(),
                                  .bindings = bindings_.data(),
                                  .xn = ws->xn.get(),
                                  .xq = ws->xq.get(),
                                  .acc = ws->acc.get(),
                                  .n_tokens = n_tokens};
  moe::BeginExpertSum(ws->x.get(), n_tokens, model.config().n_embd, ws->acc.get());
  ESTREAM_RETURN_IF_ERROR(plan->Invoke(inv));
  moe::EndExpertSum(ws->acc.get(), n_tokens, model.config().n_embd, ws->x.get());
  return Status::Ok();
}

}  // namespace estream::model
