// Low-precision causal attention for prefill on hosts without AMX: Q.K^T in int8 (vpdpbusd),
// P.V in int8 on AVX-512 (vpdpbusd; LowpPv::kInt8) and on bf16 operands on AVX2 (LowpPv::kBf16),
// fp32 online softmax. It fills the table's bf16 attention entries
// (KernelTable::attention_convert_bf16 / attention_block_bf16 / ..., dispatch.h) of the AVX-512
// level where the AMX-BF16 kernel is not selected, and of the AVX2 level, unless ESTREAM_ATTN_LOWP
// is "0", so it runs for AttentionArgs::allow_bf16 (layers whose Q/K/V/O projections are
// quantised) exactly where the AMX kernel would. A row's result depends only on the keys it
// attends to (keys 0..t): K is smoothed with the mean of the first kLowpKeys keys, V's scales are
// per key, and the rows before kLowpKeys read key block 0 converted once more for them with K
// smoothed by keys they all see (KernelTable::attention_first_rows_bf16: key 0 for rows before
// kLowpFirstSplit, the mean of keys [0, kLowpFirstSplit) for the rest), so a prompt's outputs do
// not depend on what follows it
// and a shared-prefix continuation (AttentionArgs::q_begin > 0) gives what the same tokens give as
// one sequence (tests/model_batch_test.cc). The scalar references of the two P.V forms
// (quantisation included) are in ref/attention_lowp_ref.cc; x86_avx512/attention_lowp.cc and
// x86_avx2/attention_lowp_avx2.cc are the fast paths, each equal to its reference bit for bit (the
// same int32 sums, the same fp32 operations in the same order). The AVX2 one (AVX-VNNI's VEX
// vpdpbusd on ymm, or vpmaddubsw + vpmaddwd on the same int8 operands without AVX-VNNI; AVX2 has
// no bf16 dot product) computes P.V with fp32 FMAs on bf16-rounded P and V: in int8 there,
// vpmaddubsw's int16 pair sums would saturate on u8 P x s8 V (2 x 255 x 127), so it would need
// 7-bit P or AVX-VNNI (not tried). Without AVX-VNNI the int8 Q.K^T takes four instructions per 32
// multiply-adds (vpsignb, vpmaddubsw, vpmaddwd, vpaddd), but the two multiplies issue on both of
// the integer multiply pipes: on a Zen 3 host the kernel ran 1.22x the fp32 one at T = 4096 inside
// the engine, the same at T = 1024 (docs/PERFORMANCE.md). Internal to src/kernels and its tests.
//
// Algorithm. K and V are converted once per AttentionPrefill call, per kv head and key block of
// kLowpKeys = 64 keys (AttentionLowpConvertKv*; by ranges of blocks of a head, in parallel before
// the work items, or by the thread that then runs the head's items: ops.cc):
//   mu = mean of K over its first n_s = min(64, T) keys, the same vector for every key: softmax
//        is invariant to the per-query constant q.mu, so scores of (k - mu) equal those of k;
//        subtracting it removes the channel outliers common to all keys (offsets of tens in a few
//        dims) before quantising ("smoothing" K). Only the first keys, so that rows from
//        kLowpKeys on depend on no key after them. Rows before kLowpKeys read block 0 converted
//        again (AttentionArgs::lowp_mean_keys) with mu = k_0 (rows before kLowpFirstSplit = 16)
//        or the mean of keys [0, 16) (the rest): before, they took the fp32 kernel, whose
//        64-query tiles made them ~4% of the call at T = 1024 (OLMoE shape; docs/PERFORMANCE.md,
//        nineteenth session); with k_0 for all of them, the whole-model test's log-probs moved
//        twice as far as with these two (tests/model_synth_test.cc, Golden.Top5);
//   per key j: kc = k_j - mu, sk_j = max|kc| / 127, ki_j = rne(kc / sk_j) in [-127, 127] (int8),
//        corr_j = 128 sum_d ki_j[d];
//   V: kBf16 as bf16 (round to nearest even), key pairs interleaved; kInt8 per key j as K without
//        smoothing, sv_j = max|v_j| / 127, vi_j = rne(v_j / sv_j) (int8), key quads interleaved,
//        and pm_j = max_{i <= j} sv_i over the block.
// Per tile of kLowpRows = 64 queries of one head (queries in the vector lanes, as the fp32 x86
// kernel): qs = q scale log2(e); per query sq_i = max|qs| / 127, qi = rne(qs / sq_i) stored as
// u8 qi + 128 (vpdpbusd multiplies u8 by s8; the + 128 is removed exactly by corr_j). Then per
// key block (kBf16) or per span of kLowpSpanKeys = 128 keys, two blocks, at multiples of 128
// (kInt8: O's update, a conversion and FMA per output, once per two blocks: the kernel 1-3%
// faster on every shape and length, docs/PERFORMANCE.md, twentieth session):
//   S[j][i] = float(sum_d (qi + 128) ki_j - corr_j) * (sq_i sk_j)        (log2 units; int32 exact)
//   causal mask; bx_i = the block's (span's) largest S of row i, then
//   kBf16: running max m -> m' = max(m, bx), alpha = 2^(m - m'),
//          P = 2^(S - m') (fp32, the fp32 kernel's degree-7 polynomial), l = l alpha + sum P,
//          O = O alpha + bf16(P) . bf16(V)       (exact products, fp32 sums);
//   kInt8: the running max lags: m' = bx only where bx > m + kLowpRescale (then alpha = 2^(m - bx)),
//          else m' = m and alpha = 1 exactly, so O is rescaled only where the max jumps (after
//          the first span: rarely) and c <= 2^kLowpRescale;
//          e = 2^(S - bx) (a degree-3 polynomial, LowpExp2Short), c = 2^(bx - m'),
//          l = l alpha + c sum_j e_j (fp32, from the unrounded e), M_i = the largest V scale
//          row i sees in the span (its blocks' pm at its last visible keys), P_ij = rne(e_ij sv_j
//          255 / M_i) in [0, 255] (u8: the key's V scale folded into P, so that the int32 sums
//          need no per-key factor),
//          O = O alpha + float(sum_j P_ij vi_j) (c M_i / 255)      (vpdpbusd: int32 exact);
//   out = O / l.
//
// Error bound (derived; asserted by tests/attention_lowp_test.cc). For query i and key j let
// s_ij = scale log2(e) q_i.k_j be the exact score and s^_ij the kernel's. Rounding qs and kc to
// the int8 grid moves each element by at most half a step, dq_i = sq_i / 2 and dk_j = sk_j / 2, so
//   delta_ij = |s^_ij - (s_ij - q_i.mu)| <= dq_i ||kc_j||_1 + dk_j ||q^_i||_1  (+ fp32 rounding)
// (the q_i.mu shift is common to all keys of query i and cancels; mu and kc_j = k_j - mu those of
// the conversion that row i reads, the first rows' own for i < kLowpKeys). Scores off by at most
// delta_i = max_j delta_ij (log2 units) change every normalised weight by a factor within
// 2^(+-2 delta_i). kBf16: P and V rounded to bf16 add a relative 2^-8 each (P only in the
// numerator), so
//   |out_i - exact_i| <= (2^(2 delta_i) - 1 + 2^-7) max_j |v_j|  + the fp32 terms of the fp32 kernel.
// kInt8: with w_j = 2^(s^_ij) the weights of the kernel's scores, a_j = max|v_j|, and per span b
// W_b, A_b the largest w_j and a_j of its keys up to i: vi_j is off by at most a_j / 254 per
// element, and each u_j = e_j sv_j by at most min(u_j, M / 510) (rounded to 0 below half a step),
// i.e. w_j a_j by at most min(w_j a_j, W_b A_b / 510) in V's units, against the exact l, so
//   |out_i - exact_i| <= (2^(2 delta_i) - 1 + 1/254) max_j |v_j|
//                        + sum_j min(w_j a_j, W_b A_b / 510) / sum_j w_j  (+ fp32 terms)
// (the polynomial's relative 1.0e-4 on e and c moves each weight by at most 2.0e-4 of itself, far
// under the 1/254). The last term is at most (128 / 510) max|v| when a span holds one heavy key
// among many light ones, and ~ max|v| / (255 sqrt(12 n)) for n comparable weights. Worst case
// delta_i ~ d |q|max |kc|max scale / 127; the rounding errors are independent and centred, so in
// practice delta is ~ sqrt(d) times smaller. Measured against fp64 with q, k, v ~ N(0, 1), T =
// 512, head_dim 64 and 128 (AttentionLowp.ErrorAgainstFp64ForTheLog): kBf16 rms error
// 1.2e-3..1.3e-3, largest 1.8e-2..3.3e-2; kInt8 rms 1.9e-3..2.0e-3, largest 1.9e-2..2.8e-2
// (max|v| ~ 4.3-4.9; with spans of one block 1.8e-3..1.95e-3 on the same data, the largest the
// same; the degree-3 2^x changed neither), i.e. under 1e-2 of max|v|: the class of
// the Q8 activations the engine's quantised layers already use (8 bits per 32 values), which is
// why the engine only selects it for those layers.
// Thread safety: the convert and block functions only write their own outputs and thread_local
// scratch; calls on different threads are independent.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"

namespace estream::kernels {

struct KernelTable;

constexpr int kLowpKeys = 64;  // keys per converted block (KernelTable::attention_kv_block_bf16)
constexpr int kLowpRows = 64;  // query rows per tile (KernelTable::attention_rows_bf16)
// P.V in int8: keys per softmax span (two key blocks): a row's scores are exponentiated against
// the span's maximum, its P rounded against the span's largest V scale, and O updated once a span.
constexpr int kLowpSpanKeys = 2 * kLowpKeys;
// The first kLowpKeys query rows read key block 0 converted once more, with K smoothed by key 0
// alone before this row and by the mean of the keys before it from it on
// (KernelTable::attention_first_split_bf16).
constexpr int kLowpFirstSplit = 16;
// P.V in int8: how far (log2 units) a key block's max may exceed the running max before O and l
// are rescaled to it; below it they keep their scale (alpha = 1) and the block's weights carry
// a factor of up to 2^8, far inside fp32's range.
constexpr float kLowpRescale = 8.0f;

// How a kernel multiplies P by V: bf16 operands (vdpbf16ps; fp32 FMAs on the same bf16 values
// on AVX2) or u8 P against s8 V (vpdpbusd; the AVX-512 kernel).
enum class LowpPv { kBf16, kInt8 };

// Byte layout of one converted key block of one kv head (head_dim d, dp = d rounded up to 4):
//   ki  int8 [64][dp]   keys (rows of keys beyond the sequence and dims >= d are zero)
//   corr int32[64]      128 * sum_d ki
//   sk  float[64]       per-key scale
//   V, at offset vb, as the kernel's LowpPv says:
//     kBf16: uint32[32][d]  bf16 pairs (V[2p][c] low half, V[2p + 1][c] high half)
//     kInt8: uint32[16][d]  s8 quads (V[4p + k][c] / sv in byte k; keys beyond the sequence 0),
//            then at offset sv float[64], the key's scale (max_c |V[j][c]| / 127; 0 beyond), and
//            float[64] their running maxima over the block (pm_j = max_{i <= j} sv_i)
// The kInt8 fields fit in the kBf16 ones' space (head_dim >= 8): one block size for both.
struct LowpLayout {
  int d = 0, dp = 0;
  size_t corr = 0, sk = 0, vb = 0, sv = 0, block_bytes = 0;
  explicit LowpLayout(int head_dim);
};

// Keys whose mean smooths K: min(n_tokens, AttentionArgs::lowp_mean_keys or kLowpKeys).
inline int LowpMeanKeys(const AttentionArgs& a) {
  return std::min(a.lowp_mean_keys > 0 ? a.lowp_mean_keys : kLowpKeys, a.n_tokens);
}

// False when ESTREAM_ATTN_LOWP is "0" (the fp32 kernel then runs instead). Computed once.
bool AttentionLowpSelected();

// Bytes of one kv head's converted K/V for n_tokens (KernelTable::attention_kv_bytes_bf16).
size_t AttentionLowpKvBytes(int head_dim, int n_tokens);

// Converts key block `block` of kv head `kv_head` into kv (that head's buffer of
// AttentionLowpKvBytes bytes). Each fast version writes the bytes of the reference of its LowpPv:
// ...Ref and ...Avx2 V as bf16, ...RefInt8 and ...Avx512 V as s8.
void AttentionLowpConvertKvRef(const AttentionArgs& a, int kv_head, int block, uint16_t* kv);
void AttentionLowpConvertKvRefInt8(const AttentionArgs& a, int kv_head, int block, uint16_t* kv);
#if defined(__x86_64__)
void AttentionLowpConvertKvAvx512(const AttentionArgs& a, int kv_head, int block, uint16_t* kv);
// Blocks [block_begin, block_end) of the head (KernelTable::attention_convert_bf16): mu once.
void AttentionLowpConvertKvBlocksAvx512(const AttentionArgs& a, int kv_head, int block_begin, int block_end,
                                        uint16_t* kv);
void AttentionLowpConvertKvAvx2(const AttentionArgs& a, int kv_head, int block, uint16_t* kv);
#endif

// Contract of KernelTable::attention_block_bf16: query heads [head_begin, head_end) sharing one kv
// head, rows [t_begin, t_end), K/V from the converted buffer of that kv head (every block up to
// t_end converted).
void AttentionBlockLowpRef(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end, int t_begin,
                           int t_end);
void AttentionBlockLowpRefInt8(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end,
                               int t_begin, int t_end);
#if defined(__x86_64__)
void AttentionBlockLowpAvx512(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end,
                              int t_begin, int t_end);
void AttentionBlockLowpAvx2(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end, int t_begin,
                            int t_end);
// The same without AVX-VNNI: Q.K^T on vpmaddubsw + vpmaddwd (the same int32 sums).
void AttentionBlockLowpAvx2Maddubs(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end,
                                   int t_begin, int t_end);
#endif

// Per-thread scratch of the AVX-512 / AVX2 block after calls of at most `tiles` tiles
// (KernelTable::attention_scratch_bytes_bf16).
size_t AttentionLowpScratchBytes(int head_dim, int tiles);
#if defined(__x86_64__)
size_t AttentionLowpScratchBytesAvx2(int head_dim, int tiles);
#endif

// Set the table's bf16 attention entries to this kernel: the scalar reference of either P.V
// (tests), the AVX-512 one (P.V in int8; REQUIRES HostIsa() == kAvx512) or the AVX2 one (P.V in
// bf16; REQUIRES AVX2, and AVX-VNNI for use_avx_vnni; FillAvx2Ops calls it with the host's
// AVX-VNNI).
void FillAttentionLowpRef(KernelTable* t, LowpPv pv);
// What the three Fill functions share: the format's constants (kLowpKeys, kLowpRows, the exact
// first key block, AttentionLowpKvBytes) and the kernel's own conversion, block and scratch size.
void SetAttentionLowp(KernelTable* t, void (*convert)(const AttentionArgs&, int, int, int, uint16_t*),
                      void (*block)(const AttentionArgs&, const uint16_t*, int, int, int, int),
                      size_t (*scratch_bytes)(int, int));
#if defined(__x86_64__)
void FillAttentionLowpAvx512(KernelTable* t);
void FillAttentionLowpAvx2(KernelTable* t, bool use_avx_vnni);
#endif

// The scalar 2^x of the kernels (x <= 0 or -inf; below 2^-125 exactly 0), the same operations as
// the AVX2 kernel's Avx2Traits::Exp2, so that the reference's P equals the fast path's bit for bit.
float LowpExp2(float x);
// The same with a degree-3 polynomial (relative error <= 1.0e-4 against ~1e-7, and 2^0 = 1
// exactly): the P.V in int8 path's, whose P is rounded to 8 bits after it (the error is 0.026 of
// its last step at most); Exp2Short in x86_avx512/ performs the same operations.
float LowpExp2Short(float x);

}  // namespace estream::kernels
