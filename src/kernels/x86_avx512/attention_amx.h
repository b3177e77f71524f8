// AMX-BF16 causal attention for prefill: the attention_block table entry of the AVX-512 level
// where the CPU has AMX-BF16 (Sapphire Rapids and later). Internal to src/kernels and its tests.
//
// Same contract as KernelTable::attention_block (dispatch.h): query heads [head_begin, head_end)
// sharing one kv head, query rows [t_begin, t_end), keys 0 .. t_end - 1; any range works; except
// that K and V are read from the bf16 buffer of their kv head, which AttentionAmxConvertKv filled
// for every key block of the sequence beforehand (KernelTable::attention_convert_bf16).
//
// Algorithm: flash-attention style online softmax, both products on the tile unit in bf16 with
// fp32 accumulation (tdpbf16ps), every operand in its natural row layout:
//   per tile of kAmxAttnRows = 32 queries of one head:
//     Q16 = bf16(q * scale * log2 e), rows = queries (A operands)
//   per key block of 64 keys, converted once per AttentionPrefill call (AttentionAmxConvertKv,
//   in parallel before the work items; converting per work item instead cost 31% of the kernel's
//   time with 8 tiles per item, docs/PERFORMANCE.md "Attention"), both as B operands (bf16 pairs):
//     KB16 = bf16(K)^T (dim pairs x keys), VB16 = bf16(V) (key pairs x dims)
//   per tile and key block:
//     S = Q16 x KB16 (rows = queries)                 tiles: 2 x 2 C tiles per 32 keys
//     per query row: P = 2^(S - m) in fp32 (degree-3 polynomial, relative error < 7.5e-5),
//     causal mask on the diagonal block, l += P (16 partial sums per row), P16 = bf16(P) (the
//     A operands of P.V as stored); lazy rescaling: the running max m is raised only where the
//     block's max exceeds it by more than 8 (log2 units), exact, since numerator and denominator
//     share m; a row whose P against the current m stays small (every lane's block sum <= 2^10)
//     skips the max pass altogether, and O is rescaled in few blocks
//     O (fp32, in memory) is loaded into C tiles, += P16 x VB16, stored back
//   out[t_i] = O[i] / l[i]
// The vector work (softmax) and the tile work do not overlap on the machine of record, and the
// tile steps alone reach ~45-50% of the tile unit's peak: BM_AttentionAmxSteps in bench/ measures
// both on the kernel's own steps (docs/PERFORMANCE.md).
// Head dims are zero-padded to a multiple of 32 inside the scratch, so any head_dim works.
// Error: see the AMX tolerance derivation in tests/kernels_ops_test.cc (bf16 inputs: relative
// 2^-8 per operand; fp32 accumulation).
// Thread safety: per-thread scratch and tile configuration; calls on different threads are
// independent. The call loads its tile configuration and releases the tile state on return.
#pragma once

#include "kernels/kernels.h"

namespace estream::kernels {

// Query rows per tile of the AMX kernel (KernelTable::attention_rows_bf16).
constexpr int kAmxAttnRows = 32;

// True if the CPU has AMX-BF16, the OS granted this process the tile state and ESTREAM_AMX is not
// "0" (the same switch as the AMX GEMM). Computed once.
bool AttentionAmxUsable();

// Whether the AVX-512 table carries this kernel (as attention_block_bf16): AttentionAmxUsable()
// and ESTREAM_ATTN_BF16 is not "0". It runs only for AttentionArgs::allow_bf16 (the engine's
// layers with quantised projections): bf16 operands change the precision class of attention
// (relative errors ~1e-3 instead of ~1e-6), which the whole-model tests of f32 models, whose
// bounds are derived for fp32 arithmetic, do not allow; the quantised-model tests pass with it.
// Computed once.
bool AttentionAmxSelected();

// Per-thread scratch bytes after calls of at most `tiles` tiles (KernelTable::attention_scratch_bytes_bf16).
size_t AttentionAmxScratchBytes(int head_dim, int tiles);

// Bytes of one kv head's converted K/V for a sequence of n_tokens (KernelTable::attention_kv_bytes_bf16).
size_t AttentionAmxKvBytes(int head_dim, int n_tokens);

// Converts key block `block` (keys [64 block, 64 block + 64), those >= n_tokens zero) of kv head
// `kv_head` into kv16, that head's buffer of AttentionAmxKvBytes(head_dim, n_tokens) bytes.
void AttentionAmxConvertKv(const AttentionArgs& a, int kv_head, int block, uint16_t* kv16);

// Keys per block of AttentionAmxConvertKv (KernelTable::attention_kv_block_bf16).
constexpr int kAmxAttnKeys = 64;

// REQUIRES: AttentionAmxUsable(); kv16 holds every block of the kv head of these heads up to t_end.
void AttentionBlockAmx(const AttentionArgs& a, const uint16_t* kv16, int head_begin, int head_end, int t_begin,
                       int t_end);

// For bench/ (BM_AttentionAmxSteps): wall seconds of n repetitions of the kernel's steps of one
// 32-query tile and one full 64-key block, data in L1: steps_mask 1 = Q.K^T (tile unit), 2 = online
// softmax (vector units), 4 = P.V (tile unit), any combination in that order.
// REQUIRES: AttentionAmxUsable(); head_dim in [1, 512], steps_mask in [0, 7], n >= 0 (checked).
double AttentionAmxProbeSeconds(int head_dim, int steps_mask, int64_t n);

}  // namespace estream::kernels
