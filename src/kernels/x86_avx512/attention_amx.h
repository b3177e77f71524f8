// AMX-BF16 causal attention for prefill: the attention_block table entry of the AVX-512 level
// where the CPU has AMX-BF16 (Sapphire Rapids and later). Internal to src/kernels and its tests.
//
// Same contract as KernelTable::attention_block (dispatch.h): query heads [head_begin, head_end)
// sharing one kv head, query rows [t_begin, t_end), keys 0 .. t_end - 1; any range works; except
// that K and V are read from the bf16 buffer of their kv head, which AttentionAmxConvertKv filled
// for every key block of the sequence beforehand (KernelTable::attention_convert_bf16).
//
// Algorithm: flash-attention style online softmax with queries in the lanes, as the fp32 kernel
// (attention_x86_impl.h), but both products run on the tile unit in bf16 with fp32 accumulation:
//   per tile of kAmxAttnRows = 32 queries (two 16-lane halves) of one head:
//     QT  = bf16(q * scale * log2 e), packed as tdpbf16ps B operands (dim pairs x queries)
//   per key block of 64 keys, converted once per AttentionPrefill call (AttentionAmxConvertKv,
//   in parallel before the work items; converting per work item instead cost 31% of the kernel's
//   time with 8 tiles per item, docs/PERFORMANCE.md "Attention"):
//     K16 = bf16(K) (keys x dims: A operands as stored), VT16 = bf16(V)^T (dims x keys: A operands)
//   per tile and key block:
//     ST[j][i] = K16[j] . QT[i]                       tiles: 2 x 2 C tiles per 32 keys
//     causal mask, row max; the running max m is raised only where the block max exceeds it by
//     more than 8 (log2 units) ("lazy rescaling": exact, since numerator and denominator share m;
//     it keeps P <= 2^8 and spares rescaling O in most blocks)
//     P = 2^(ST - m) in fp32 (degree-5 polynomial, relative error < 2^-17), l += sum_j P
//     PT16 = bf16(P) packed as B operands (key pairs x queries)
//     OT[d][i] (fp32, in memory) is loaded into C tiles, += VT16 x PT16, stored back
//   out[t_i][d] = OT[d][i] / l[i]
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

}  // namespace estream::kernels
