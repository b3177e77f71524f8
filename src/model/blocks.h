// The building blocks of the forward pass, shared by every architecture (the differences are the
// flags of ArchTraits), and the activation workspace they run in.
//
// Shapes: T = tokens of the prompt, d = n_embd. Activations are row-major, one row per token:
// x is [T x d]. Memory is O(T x d) for the activations (the residual stream, its normed copy,
// q/k/v/attention output of one layer: the keys and values of a layer die with it) plus
// O(C x n_ff_expert) for one expert chunk of at most C = kExpertChunkRows routed rows.
//
// Threading: every block is called from outside any parallel region and parallelises inside
// (kernels' [parallel] functions and `omp parallel for` over rows) with the calling thread's
// OpenMP team size. Ownership: a Workspace owns its buffers; blocks borrow it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/memory.h"
#include "base/status.h"
#include "base/timer.h"
#include "model/model.h"

namespace estream::model {

// Routed rows processed per expert GEMM chunk: bounds the expert scratch whatever the skew.
constexpr int64_t kExpertChunkRows = 512;
// Routes per pass of the fused expert operator (moe::ExpertPlan's capacity) in the resident
// engine (experts.h: one pass a layer up to 8192 tokens x 8 experts) and the streamed one
// (virtual_experts.h: one pass an invocation). Fewer passes mean fewer barriers and each pass's
// down items spread over every route (docs/DESIGN.md section 3, "Pass length"); the cost is the
// pass's SwiGLU output, 40 bytes per 32 of n_ff per route (60 MiB for Qwen3-30B-A3B, 80 MiB for
// OLMoE-1B-7B at 65,536 routes).
constexpr int64_t kFusedRouteWindow = 65536;

// Activation buffers, grown on demand and reused by every request (no allocation per layer).
class Workspace {
 public:
  // Makes room for prompts of up to n_tokens run with up to n_threads threads. ResourceExhausted
  // if an allocation fails (the workspace then keeps its previous capacity and stays usable).
  Status Reserve(const Model& model, int64_t n_tokens, int n_threads);
  int64_t capacity() const { return capacity_; }
  int thread_capacity() const { return thread_capacity_; }
  // Rows of one expert chunk the buffers hold: min(kExpertChunkRows, capacity()).
  int64_t chunk_capacity() const { return chunk_capacity_; }

  // Per token (capacity rows each):
  AlignedPtr<float> x;              // [T x d] residual stream
  AlignedPtr<double> acc;           // [T x d] fp64 sum of one MoE layer: x + its experts' outputs
                                    // (moe::BeginExpertSum / EndExpertSum, expert_op.h)
  AlignedPtr<float> xn;             // [T x d] normed input of a sub-block / projection output
  AlignedPtr<BlockQ8A> xq;          // [T x max(d, q_dim)/32] Q8A of xn; the attention's (blocks.cc)
  AlignedPtr<float> q;              // [T x q_dim]
  AlignedPtr<float> k;              // [T x kv_dim]
  AlignedPtr<float> v;              // [T x kv_dim]
  AlignedPtr<float> att;            // [T x q_dim] attention output
  AlignedPtr<float> router_logits;  // [T x n_expert]
  AlignedPtr<int32_t> route_expert; // [T x n_expert_used] chosen experts per token
  AlignedPtr<float> route_weight;   // [T x n_expert_used] their weights
  // Routes grouped by expert (CSR): routes of expert e are route_token/route_w
  // [expert_begin[e], expert_begin[e + 1]).
  std::vector<int64_t> expert_begin;  // [n_expert + 1]
  AlignedPtr<int32_t> route_token;    // [T x n_expert_used]
  AlignedPtr<float> route_w;          // [T x n_expert_used]
  // One expert chunk (kExpertChunkRows rows):
  AlignedPtr<float> gx;             // [C x d] gathered float rows (float weights only)
  AlignedPtr<BlockQ8A> gxq;         // [C x d/32] gathered Q8A rows
  AlignedPtr<float> gate;           // [C x n_ff] gate, then SwiGLU output
  AlignedPtr<float> up;             // [C x n_ff]
  AlignedPtr<BlockQ8A> hq;          // [C x n_ff/32]
  // Tree attention (SeqSpan::ctx_len > 0): one continuation's context keys then its own keys.
  AlignedPtr<float> tree_k;         // [T x kv_dim]
  AlignedPtr<float> tree_v;         // [T x kv_dim]
  AlignedPtr<float> mla;            // [T x MlaScratchFloats] multi-head latent attention (mla.h)
  AlignedPtr<float> bcx;            // [T x 3d] LFM2 short-conv in-projection (models with conv layers)
  std::vector<int32_t> positions;  // [T] RoPE position of each row of a pass (blocks.cc)
  // Wall time spent in the attention blocks' projection GEMMs (Q/K/V or MLA's, output) and in the
  // attention kernel (AttendSequences) since the engine last cleared it: Response::Timing's
  // attention_projections / attention_kernel.
  struct AttentionTime {
    double projections = 0, kernel = 0;
  } attention_time;

 private:
  int64_t capacity_ = 0;
  int64_t chunk_capacity_ = 0;
  int thread_capacity_ = 0;
  const Model* model_ = nullptr;
};

// One sequence of a packed batch (Engine::RunBatch): activation rows [row, row + len) hold one
// sequence's tokens. Plain sequence (ctx_len == 0): positions 0..len-1, causal attention within
// the rows. Continuation of a shared context (ctx_len > 0; the tree mask of shared-prefix
// candidates): the context is the plain sequence at rows [ctx_row, ctx_row + ctx_len), which
// precedes these rows; the rows take positions ctx_len..ctx_len+len-1 and each attends to the
// whole context and causally to the continuation's own rows, never to other continuations.
// Sequences must not overlap and together cover rows [0, n_tokens).
struct SeqSpan {
  int64_t row = 0, len = 0;
  int64_t ctx_row = 0, ctx_len = 0;
};

// x[t] = dequantised row tokens[t] of token_embd. REQUIRES: ids validated (< n_vocab).
void EmbedTokens(const Model& model, const int32_t* tokens, int64_t n_tokens, float* x);

// x += Attention(RMSNorm(x)) for layer `il` (norm, Q/K/V, q/k norm, RoPE, causal GQA, output
// projection, residual), per the architecture's traits. `seqs`: the sequences of a packed batch
// (RoPE positions and attention confined per sequence, see SeqSpan); empty: one sequence of
// n_tokens. Every row's result is the same as with its sequence run alone (row-wise kernels; the
// attention of a row depends only on its own keys).
void AttentionBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws, std::span<const SeqSpan> seqs = {});

// Causal attention of every sequence in `seqs` (SeqSpan), for any attention whose q, k, v and
// output rows live in row-major buffers: `whole` gives the heads, the scale, the bf16 choice and
// the buffers at row 0 (ldv == ldk, ldo == ldq); n_tokens and q_begin are set per sequence. A
// continuation's keys and values are gathered after its context's into ws->tree_k / tree_v
// (T x ldk floats each), and only its own query rows are computed (AttentionArgs::q_begin).
void AttendSequences(const kernels::AttentionArgs& whole, std::span<const SeqSpan> seqs, Workspace* ws);

// The router half of x += MoE(RMSNorm(x)) for layer `il`: MoE norm into ws->xn (and its Q8A
// form into ws->xq when a matrix is quantised), router logits, softmax / top-k /
// renormalisation per architecture, and the routes grouped by expert (ws->expert_begin,
// route_token, route_w). The experts then run from these (model::FusedExperts, experts.h).
void RouteBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws);

// y[r] = RMSNorm(x[r]) * output_norm for rows [row0, row0 + n_rows).
void FinalNorm(const Model& model, const float* x, int64_t n_rows, float* y);

// y = W x for either representation: GemmQ8A on xq when W is quantised and xq is given,
// otherwise MatMul on the float rows x (which quantises internally for quantised W).
// Several weights on the same rows (Q/K/V, gate/up): kernels::Gemm with one GemmOut each.
void Linear(const kernels::WeightView& w, const float* x, int64_t ldx, const BlockQ8A* xq, int64_t m, float* y,
            int64_t ldy);
// y += W x (the residual adds after an output projection): as Linear into a buffer followed by
// kernels::Add per row, bit for bit, but added by the GEMM's threads while each tile is in cache.
void LinearAdd(const kernels::WeightView& w, const float* x, int64_t ldx, const BlockQ8A* xq, int64_t m, float* y,
               int64_t ldy);

// True for weight types the GEMM multiplies against Q8A activations (not F32/F16/BF16).
bool IsQuantized(QuantType t);

// A block's input: ws->xn = RMSNorm(x) * norm_w for n_tokens rows of d and, with `quantize`,
// ws->xq = its Q8A rows in the same pass over memory (returned; nullptr without `quantize`).
const BlockQ8A* NormAndQuantize(const float* x, const float* norm_w, int64_t n_tokens, int64_t d, float eps,
                                bool quantize, Workspace* ws);

}  // namespace estream::model
