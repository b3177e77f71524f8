// The compute kernels of estream: quantised GEMM, causal attention for prefill, norms, RoPE,
// SwiGLU, router softmax/top-k, residual add, LFM2's short convolution.
//
// Each function here dispatches through the table of ActiveIsa() (dispatch.h): AVX-512 VNNI,
// AVX2 or the scalar reference, chosen once at start (ESTREAM_ISA forces a lower level).
// Tests call KernelsFor(isa) directly to compare every path with the scalar reference.
//
// Threading: functions marked [parallel] open an OpenMP parallel region with the calling
// thread's team size (omp_get_max_threads(), which an Engine sets per thread); call them from
// outside a parallel region. Unmarked functions are single-threaded and re-entrant.
// Shapes use one vocabulary: m = rows of X (tokens or routes), k = input features,
// n = output features (rows of W). Leading dimensions (ld*) are in elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "quant/packed_format.h"
#include "quant/types.h"

namespace estream::kernels {

// ---- quantised matrix multiply --------------------------------------------------------------

// The weight description (WeightLayout, WeightView) and the packed layout's sizes (CanRepack,
// PackedWeightBytes, kPackLayoutVersion) are the format of quant/packed_format.h, which code
// that stores packed weights uses without the kernels; the kernels implement that format.
using ::estream::CanRepack;
using ::estream::kPackLayoutVersion;
using ::estream::PackedWeightBytes;
using ::estream::WeightLayout;
using ::estream::WeightView;

// True if GEMM supports weights of type t: F32, F16, BF16 and the quantised types Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4 (dispatch.h
// kGemmQuantTypes).
bool GemmSupports(QuantType t);
// Converts n GGUF rows at `src` into the packed layout at `dst` (PackedWeightBytes long).
// Pure function of its input; the pack step and the engine's load call it.
void RepackWeights(QuantType t, const void* src, int64_t n, int64_t k, void* dst);

// Upper bound of the attention kernels' scratch per thread (both paths of the active table, any
// prompt length) for heads of head_dim: per-thread buffers grown once, which the activation memory
// plan counts. Each kernel states its own size (KernelTable::attention_scratch_bytes*).
size_t AttentionScratchBytes(int head_dim);
// Bytes of the converted K/V buffer that AttentionPrefill's calling thread keeps (grown once) for
// prompts of up to max_tokens on `threads` threads: non-zero where the active table has a bf16
// attention (KernelTable::attention_kv_bytes_bf16), which converts K and V once per call, a few kv
// heads at a time (enough for 8 work items per thread; ops.cc).
size_t AttentionKvBytes(int head_dim, int n_head, int n_head_kv, int64_t max_tokens, int threads);

// Bytes of the quantised form of an m x k activation matrix (k a multiple of kQK8A).
size_t ActivationBytes(int64_t m, int64_t k);
// xq = Q8A(x), row by row (row r at xq + r * k / kQK8A). [parallel]
void QuantizeActivations(const float* x, int64_t ldx, int64_t m, int64_t k, BlockQ8A* xq);

// y[m x n] = Q8A activations x W^T, for quantised W (any quantised GemmSupports type): every type
// multiplies the same 8-bit activation format. [parallel]
void GemmQ8A(const WeightView& w, const BlockQ8A* xq, int64_t m, float* y, int64_t ldy);

// y[m x n] = x[m x k] * W^T for any GemmSupports type: float types are multiplied in fp32,
// quantised types quantise x to Q8A internally (per-thread scratch, grown once). [parallel]
void MatMul(const WeightView& w, const float* x, int64_t ldx, int64_t m, float* y, int64_t ldy);

// One product of a multi-output GEMM: y[m x w->n] (row i at y + i * ldy) = X W^T, or with `add`
// y += X W^T (each element y + p, p the product exactly as the plain call computes it: the result
// is bit-identical to the product into a buffer followed by Add, without the buffer's pass over
// memory). Not owned.
struct GemmOut {
  const WeightView* w = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  bool add = false;
};
// The products of several weights of the same k with the same activations (Q/K/V, gate/up), or
// one product added into a residual stream. Quantised weights multiply xq, the Q8A rows of x
// (quantised here into per-thread scratch when xq is null); float weights multiply x (REQUIRES: x
// non-null then). Outputs of the same type and layout run in one parallel region: their columns
// form one range that ParallelSplit cuts (one fork/join, both threads busy to the end, the
// activations quantised once); outputs of another type get a region of their own. Every output
// element is bit-identical to what GemmQ8A / MatMul give for its weight alone, whatever the
// grouping and thread count. `add` outputs pass through a per-thread tile of at most
// GemmAddTileBytes(n) bytes (grown once) that the thread adds into y while it is in cache.
// REQUIRES: at most 8 outputs; all w->k equal; no y overlaps another y, x or xq. [parallel]
void Gemm(std::span<const GemmOut> outs, const float* x, int64_t ldx, const BlockQ8A* xq, int64_t m);
// Bytes of the per-thread tile of Gemm's `add` outputs of up to n columns.
size_t GemmAddTileBytes(int64_t n);

// ---- attention ------------------------------------------------------------------------------

// Causal grouped-query attention over one prompt of n_tokens at positions 0..n_tokens-1.
// Head h of token t lives at q + t * ldq + h * head_dim (k, v likewise with n_head_kv heads);
// query head h uses kv head h / (n_head / n_head_kv). out[t * ldo + h * head_dim ..] receives
// softmax(scale * q k^T, causal) v. Never materialises an n_tokens x n_tokens matrix. [parallel]
struct AttentionArgs {
  int n_tokens = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  float scale = 1.0f;
  const float* q = nullptr;
  int64_t ldq = 0;
  const float* k = nullptr;
  int64_t ldk = 0;
  const float* v = nullptr;
  int64_t ldv = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  // The caller accepts bf16 operands with fp32 accumulation (relative error ~2^-8 per operand
  // instead of fp32's ~2^-24): the AMX-BF16 kernel runs where the host has one
  // (KernelTable::attention_block_bf16), else the fp32 kernel. The engine sets it for layers whose
  // Q/K/V/O projections are quantised: their activations are already rounded to 8 bits per 32
  // values (relative error up to 2^-8), so bf16 attention does not change the precision class.
  bool allow_bf16 = false;
  // Only query rows [q_begin, n_tokens) are computed (each still against keys 0..t): rows before
  // q_begin of q and out are neither read nor written, so q and out may point q_begin rows before
  // the caller's first query row. The engine's tree attention (shared-prefix candidates) passes
  // the context's and one continuation's keys (n_tokens of them) with q_begin = context length.
  int q_begin = 0;
  // Where set (the engine's layers whose output projection is quantised), AttentionPrefill writes
  // rows [q_begin, n_tokens) of the output as that projection's Q8A input instead: row t at
  // out_q8 + t * ldo_q8 (blocks), what QuantizeRowQ8A makes of the row's n_head * head_dim fp32
  // values (a multiple of 32). out's rows are then scratch, left unwritten by the AVX-512
  // low-precision kernel, which quantises its O tiles itself (KernelTable::attention_q8_bf16).
  BlockQ8A* out_q8 = nullptr;
  int64_t ldo_q8 = 0;
  // Internal to the low-precision kernels (attention_lowp.h); callers leave it 0. Their K/V
  // conversion smooths K by the mean of its first min(lowp_mean_keys, n_tokens) keys (0:
  // kLowpKeys); AttentionPrefill converts key block 0 again with fewer for the first query rows,
  // which may depend on no key after them (KernelTable::attention_first_rows_bf16).
  int lowp_mean_keys = 0;
};
void AttentionPrefill(const AttentionArgs& args);

// ---- element-wise and row kernels -----------------------------------------------------------

// y = x / sqrt(mean(x^2) + eps) * w, for each of `rows` rows of n. y may alias x. [parallel]
void RmsNorm(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, int64_t rows, int64_t n,
             float eps);

enum class RopeMode {
  kNorm,  // rotates adjacent pairs (2i, 2i+1)            (llama / Mixtral)
  kNeox,  // rotates (i, i + head_dim/2)                   (OLMoE, Qwen3-MoE)
};
// Rotates, in place, n_heads heads of head_dim for each of n_tokens rows (row t at x + t * ldx),
// token t at position pos0 + t, theta_i = pos * freq_base^(-2i/head_dim). [parallel]
// Precision: freq_base^(-2i/head_dim) and pos * that are computed in fp64 and reduced modulo pi/2
// in fp64, so cos/sin are correct to fp32 rounding at any position (ggml builds theta by repeated
// fp32 multiplication: relative errors of 1e-7..1e-6, i.e. up to ~1e-3 rad at pos 8192).
void Rope(float* x, int64_t ldx, int n_tokens, int n_heads, int head_dim, int pos0, float freq_base,
          RopeMode mode);

// The two passes of a block's input in one: for each row, y = RmsNorm(x) as RmsNorm, then
// xq = its Q8A quantisation as QuantizeActivations (the row is still in cache). Bit-identical to
// RmsNorm followed by QuantizeActivations. y may alias x. REQUIRES: n % 32 == 0. [parallel]
void RmsNormQuantize(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy, BlockQ8A* xq, int64_t rows,
                     int64_t n, float eps);

// q/k norm and RoPE in one pass: for each of `rows` rows of x (row t at x + t * ldx, rotated at
// position pos[t]), in place, first the RMS norm of each run of norm_n values with weights
// norm_w (skipped when norm_w is null; norm_n = n_heads * head_dim normalises the whole row,
// norm_n = head_dim each head), then RoPE as Rope. Bit-identical to RmsNorm then Rope. [parallel]
void NormRope(float* x, int64_t ldx, int64_t rows, const int32_t* pos, int n_heads, int head_dim, float freq_base,
              RopeMode mode, const float* norm_w, int64_t norm_n, float eps);

// h = silu(g) * u, n values. h may alias g or u.
void SwiGlu(const float* g, const float* u, float* h, int64_t n);

// Router: p = softmax(logits[0..n_expert)); picks the top `k` (ties: lower index first; selected
// on the logits, which orders exactly as p does, so every ISA picks the same experts), in
// descending order of p, into idx[0..k) and their weights into w[0..k); with `renormalize` the
// k weights are divided by their sum.
void SoftmaxTopK(const float* logits, int n_expert, int k, bool renormalize, int32_t* idx, float* w);

// log(sum_i e^row[i]) over n >= 1 values, the max subtracted first (the LM head's log-softmax
// normaliser: prompt logprobs, top alternatives). The reference sums e^(x - max) in double; the
// vector paths are within (15 + ln n) u absolute of it (ops_simd_impl.h LogSumExpT); a row
// holding NaN or +-inf gets the reference's result on every ISA.
double LogSumExp(const float* row, int64_t n);

// y += x, n values.
void Add(float* y, const float* x, int64_t n);

// ---- short convolution (LFM2) ---------------------------------------------------------------

// The middle of an LFM2 short-convolution block over one prompt at positions 0..n_tokens-1 (the
// projections around it are ordinary GEMMs). Row t of bcx holds the input projection of token t,
// [B | C | x], three runs of d values at bcx + t * ldb; w is the depthwise causal kernel of L taps,
// TAP-major: w[j * d + c] (GGUF stores it channel-major [d][L]; the loader transposes), tap L - 1
// weighting the current token. For every token t and channel c:
//   y[t * ldy + c] = C[t][c] * sum_{j=0}^{L-1} w[j * d + c] * B[s][c] * x[s][c],  s = t - (L - 1) + j,
// with the terms of s < 0 zero (the prompt starts from an empty conv state, as a KV cache does).
// REQUIRES: L >= 1; y does not overlap bcx. [parallel]
void ShortConv(const float* bcx, int64_t ldb, const float* w, int L, int64_t d, int64_t n_tokens, float* y,
               int64_t ldy);

}  // namespace estream::kernels
