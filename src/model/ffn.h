// The parts of a transformer block that some MoE families add around the routed experts, as
// data of ModelConfig (model.h; read for ArchTraits::moe_extensions families):
//   - leading dense blocks (leading_dense_block_count): a SwiGLU FFN instead of the MoE;
//   - shared experts (ffn_*_shexp): a SwiGLU FFN every token runs, added to the routed output;
//   - router variants: softmax or sigmoid scores, an optional per-expert selection bias
//     (exp_probs_b: added to the scores for the top-k choice only), optional division of the k
//     weights by their sum (expert_weights_norm) and a scale (expert_weights_scale).
// The original three families use none of them and keep their code paths (and results) exactly.
//
// Shapes as in blocks.h: T tokens, d = n_embd, rows of ws->x / ws->xn. Threading: called outside
// parallel regions; parallel inside.
#pragma once

#include <cstdint>

#include "model/blocks.h"
#include "model/model.h"

namespace estream::model {

// Expert choice of one token: logits [n_expert] -> idx[0..k), w[0..k), per c's gating, `bias`
// (exp_probs_b, or nullptr), expert_weights_norm and expert_weights_scale. Softmax without bias
// and scale 1 is kernels::SoftmaxTopK exactly. Otherwise, in fp64: s = softmax(l) or sigmoid(l);
// the k largest s + bias (ties: lower index first), in descending order of s + bias; w = s of
// those, / their sum if norm, * scale.
void RouteToken(const ModelConfig& c, const float* logits, const float* bias, int32_t* idx, float* w);

// x[t] += down(silu(gate xn[t]) * up xn[t]) for t < T, in chunks of ws->chunk_capacity() rows.
// xq: the Q8A blocks of ws->xn when gate/up are quantised (computed here when nullptr).
// REQUIRES: the Workspace reserved for this model (its chunk buffers cover f's width).
void FfnAdd(const DenseFfn& f, const ModelConfig& c, int64_t n_tokens, const BlockQ8A* xq, Workspace* ws);

// A leading dense block's FFN: x += FFN(RMSNorm(x) * ffn_norm). REQUIRES: !layers()[il].moe.
void DenseFfnBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws);

// The shared experts of MoE block il on the normed input RouteBlock left in ws->xn (and ws->xq):
// x += shexp(xn). No-op without shared experts. REQUIRES: RouteBlock(il) ran.
void SharedExpertsBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws);

}  // namespace estream::model
