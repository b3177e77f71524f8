// An independent, naive fp64 forward pass of the three MoE architectures, for tests only.
//
// Written separately from src/model: it shares only the GGUF reader and DequantizeRow with the
// engine. Every weight is dequantised to double once, then the forward pass is plain loops in
// double precision (no kernels, no OpenMP, no quantised activations). It is slow and meant for tiny
// models (a few layers, n_embd of a few hundred).
//
// Forced routing: given another implementation's expert choices (RefOptions::routing), the
// reference uses them instead of its own top-k and reports, per token and layer, how far the
// forced choice is from a valid one: route_deficit = l_(k) - min over forced experts of l_e, where
// l_(k) is its own k-th largest router logit (0 when the forced set is its own top-k). A forced
// choice with a small deficit is one that a small error in the router's input can produce; with
// it, the reference computes exactly what that implementation should have computed, so logits can
// be compared at every position even after a near-tie.
//
// Besides logits it reports, per token and layer, the experts chosen and the router's margin: the
// gap between the k-th and the (k+1)-th largest router LOGITS (the softmax is monotonic, so this
// is the amount by which a perturbation of the logits must move them to change the chosen set;
// the probability gap is p_(k) (1 - exp(-gap))). An implementation whose router inputs carry a
// small error (e.g. 8-bit activations upstream) may pick a different expert set only where that
// gap is smaller than its error; tests use the gaps to tell such near-ties from real bugs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace estream::ref {

struct RefOutputs {
  int n_tokens = 0;
  int n_vocab = 0;
  int n_embd = 0;
  int n_layer = 0;
  std::vector<double> logits;      // [n_tokens][n_vocab]
  std::vector<double> hidden;      // [n_tokens][n_embd] after the final RMSNorm
  int n_expert_used = 0;
  std::vector<double> router_gap;  // [n_tokens][n_layer]: logit_(k) - logit_(k+1), sorted descending
  std::vector<int32_t> routing;    // [n_layer][n_tokens][n_expert_used]: chosen experts, by probability
  std::vector<double> route_deficit;  // [n_tokens][n_layer], see "Forced routing"
};

struct RefOptions {
  // [n_layer][n_tokens][n_expert_used] expert ids to use instead of the reference's own top-k
  // (order irrelevant); nullptr: its own. Not owned.
  const std::vector<int32_t>* routing = nullptr;
};

// Runs the prompt through the model at `path`. Errors: whatever GgufFile::Open returns, and
// NotSupported/Corruption for a model it cannot run.
Result<RefOutputs> RefForward(const std::string& path, const std::vector<int32_t>& tokens,
                              const RefOptions& options = {});

// DeepSeek-V2 (ref_deepseek2.cc), called by RefForward for general.architecture deepseek2.
Result<RefOutputs> RefForwardDeepseek2(const GgufFile& f, const std::vector<int32_t>& tokens,
                                       const RefOptions& options);

// The lfm2moe branch of RefForward (ref_lfm2moe.cc: short-convolution and attention layers, dense
// leading FFN layers, sigmoid routing with an expert bias). router_gap is in selection-score units
// (sigmoid + bias), 1e30 for dense layers.
Result<RefOutputs> RefForwardLfm2moe(const GgufFile& f, const std::vector<int32_t>& tokens,
                                     const RefOptions& options);

}  // namespace estream::ref
