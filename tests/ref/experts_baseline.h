// The expert paths the fused expert operator (src/moe/expert_op.h) replaced, kept as the
// baseline it is checked (tests/model_experts_test, tests/moe_model_test) and measured
// (bench/moe_bench) against. The engine runs model::FusedExperts (src/model/experts.h).
// Both compute results bit-identical to each other and to the fused operator (same GEMM per
// output element, same SwiGLU, same Q8A blocks, same order of the scatter-adds into each element
// of the layer's fp64 sum ws->acc, which is set from x first and rounded back into x once at the
// end: moe::BeginExpertSum / EndExpertSum, expert_op.h):
//   ExpertsGrouped  the straightforward one: per expert, one kernels:: call per step, each its own
//                   OpenMP region (about six regions per expert per layer);
//   ExpertsBatched  one OpenMP region per window of routes with dynamically scheduled work items
//                   (see below), so that threads never wait on each other between the steps of
//                   one expert.
//
// ExpertsGrouped:
// Per expert e with routes (CSR in the Workspace), in chunks of at most kExpertChunkRows rows:
//   gather the routed rows of the normed input (their Q8A blocks for quantised weights, floats
//   otherwise) -> G = X Wg^T, U = X Wu^T  [R x n_ff] -> H = silu(G) * U -> D = H Wd^T [R x d]
//   -> acc[t_r] += (double) a_r * (double) D[r].
// The tokens of one expert's routes are distinct (an expert is picked at most once per token), so
// the scatter-add is parallel over rows without races. The order in which experts add into a row
// is fixed (expert id order), so results do not depend on the thread count (and, the sum being
// in fp64, hardly on the order at all: expert_op.h, "Order of the experts").
#pragma once

#include <cstdint>

#include "model/blocks.h"
#include "moe/expert_op.h"

namespace estream::ref {

// Routes per window of ExpertsBatched, and the column blocks of its work items (multiples of 32:
// Q8A blocks, and of the kernels' 16-row panels).
constexpr int64_t kRouteWindow = 2048;
constexpr int64_t kFfBlock = 256;
constexpr int64_t kEmbdBlock = 128;

// ExpertsBatched: the routes, grouped by expert, are cut into units (one expert, at most
// kExpertChunkRows routes) and the units into windows of at most kRouteWindow routes. Per window,
// inside one parallel region:
//   1. gather: the routed rows of the normed input, unit after unit, into one buffer;
//   2. items (unit, block of kFfBlock columns of n_ff), dynamically scheduled: gate and up for
//      those columns into per-thread tiles, SwiGLU, and the Q8A blocks of those columns of H;
//   3. items (block of kEmbdBlock columns of n_embd), dynamically scheduled: for every unit in
//      order, D = H Wd^T for those columns into a per-thread tile, then acc[t_r] += a_r D[r] on
//      those columns. One item owns its columns of acc, so no two threads add into one element, and
//      every element receives its experts in expert order, as in ExpertsGrouped.
// Barriers: two per window (after 1 and after 2).
//
// REQUIRES (both): ws->xn holds the normed input [T x d]; ws->xq its Q8A form when any expert
// matrix is quantised; ws->expert_begin / route_token / route_w the routes grouped by expert.
// Adds every expert's weighted output into ws->x (through ws->acc, which it overwrites).
// ExpertsBatched keeps its window buffers between calls: one call at a time.
void ExpertsGrouped(const model::ExpertWeights& experts, const model::ModelConfig& c, int64_t n_tokens,
                    model::Workspace* ws);
void ExpertsBatched(const model::ExpertWeights& experts, const model::ModelConfig& c, int64_t n_tokens,
                    model::Workspace* ws);

}  // namespace estream::ref
