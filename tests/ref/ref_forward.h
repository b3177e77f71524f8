// An independent, naive fp64 forward pass of the three MoE architectures, for tests only.
//
// Written separately from src/model: it shares only the GGUF reader and DequantizeRow with the
// engine. Every weight is dequantised to double once, then the forward pass is plain loops in
// double precision (no kernels, no OpenMP, no quantised activations). It is slow and meant for tiny
// models (a few layers, n_embd of a few hundred).
//
// Besides logits it reports, per token and layer, the router's margin: the gap between the k-th
// and the (k+1)-th largest router probabilities. An implementation whose router inputs carry a
// small error (e.g. 8-bit activations) may pick a different expert set only where that gap is
// smaller than its error; tests use the gaps to tell such near-ties from real bugs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace estream::ref {

struct RefOutputs {
  int n_tokens = 0;
  int n_vocab = 0;
  int n_embd = 0;
  int n_layer = 0;
  std::vector<double> logits;      // [n_tokens][n_vocab]
  std::vector<double> hidden;      // [n_tokens][n_embd] after the final RMSNorm
  std::vector<double> router_gap;  // [n_tokens][n_layer]: p_(k) - p_(k+1) of the sorted softmax
};

// Runs the prompt through the model at `path`. Errors: whatever GgufFile::Open returns, and
// NotSupported/Corruption for a model it cannot run.
Result<RefOutputs> RefForward(const std::string& path, const std::vector<int32_t>& tokens);

}  // namespace estream::ref
