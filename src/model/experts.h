// The grouped expert path: the straightforward implementation of a MoE layer's experts on the
// quantised GEMM. The fused expert operator (src/moe, issue 6) replaces it; this one stays as the
// baseline it is measured and checked against.
//
// Per expert e with routes (CSR in the Workspace), in chunks of at most kExpertChunkRows rows:
//   gather the routed rows of the normed input (their Q8A blocks for quantised weights, floats
//   otherwise) -> G = X Wg^T, U = X Wu^T  [R x n_ff] -> H = silu(G) * U -> D = H Wd^T [R x d]
//   -> x[t_r] += a_r * D[r].
// The tokens of one expert's routes are distinct (an expert is picked at most once per token), so
// the scatter-add is parallel over rows without races. The order in which experts add into a row
// is fixed (expert id order), so results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "model/blocks.h"

namespace estream::model {

// REQUIRES: ws->xn holds the normed input [T x d]; ws->xq its Q8A form when any expert matrix is
// quantised; ws->expert_begin / route_token / route_w the routes grouped by expert.
// Adds every expert's weighted output into ws->x.
void ExpertsGrouped(const ExpertWeights& experts, const ModelConfig& c, int64_t n_tokens, Workspace* ws);

}  // namespace estream::model
