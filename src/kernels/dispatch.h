// The kernel dispatch table: one set of function pointers per instruction-set level.
//
// Each ISA's kernels live in their own translation units, compiled with that ISA's flags and only
// on their architecture (src/kernels/CMakeLists.txt): ref/ (scalar, everywhere), x86_avx2/ and
// x86_avx512/ (x86-64), arm_neon/ (AArch64; files named *_dotprod.cc / *_i8mm.cc / *_fp16.cc get
// those extensions). Each provides `Fill<Isa><Family>(KernelTable*)` functions that overwrite the
// entries they implement. KernelsFor(isa) starts from the scalar table and applies every level of
// isa's chain up to isa (base/cpu.h: scalar < avx2 < avx512, scalar < neon < dotprod < i8mm), so a
// level that lacks a kernel inherits the one below.
// Thread safety: tables are built once (function-local statics) and immutable afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "base/cpu.h"
#include "kernels/kernels.h"

namespace estream::kernels {

// The quantised weight types of the GEMM, in table slot order.
inline constexpr QuantType kGemmQuantTypes[] = {
    QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ6_K,  QuantType::kQ4_1,
    QuantType::kQ5_0, QuantType::kQ5_1, QuantType::kQ5_K, QuantType::kQ3_K,  QuantType::kQ2_K,
    QuantType::kIQ4_NL, QuantType::kIQ4_XS, QuantType::kMXFP4};
inline constexpr int kGemmQuantCount = static_cast<int>(sizeof(kGemmQuantTypes) / sizeof(kGemmQuantTypes[0]));
constexpr int GemmQuantSlot(QuantType t) {
  for (int i = 0; i < kGemmQuantCount; ++i)
    if (kGemmQuantTypes[i] == t) return i;
  return -1;
}

// KernelTable::attention_convert_bf16 from a function that converts one key block: the blocks of
// the range in turn.
template <void (*kConvertBlock)(const AttentionArgs& a, int kv_head, int block, uint16_t* kv16)>
void ConvertKvBlocks(const AttentionArgs& a, int kv_head, int block_begin, int block_end, uint16_t* kv16) {
  for (int b = block_begin; b < block_end; ++b) kConvertBlock(a, kv_head, b, kv16);
}

struct KernelTable {
  Isa isa = Isa::kScalar;

  // GEMM over Q8A activations; one entry per weight type and layout (nullptr: unsupported).
  // Computes y rows [0, m) x columns [n_begin, n_end): the caller splits work across threads.
  using GemmFn = void (*)(const WeightView& w, const BlockQ8A* xq, int64_t m, int64_t n_begin, int64_t n_end,
                          float* y, int64_t ldy);
  // The kernel of a quantised type (one of kGemmQuantTypes) and layout; nullptr if none.
  GemmFn Quant(QuantType t, bool packed) const {
    const int slot = GemmQuantSlot(t);
    return slot < 0 ? nullptr : gemm_quant[slot][packed ? 1 : 0];
  }
  void SetQuant(QuantType t, bool packed, GemmFn fn) {
    const int slot = GemmQuantSlot(t);
    if (slot >= 0) gemm_quant[slot][packed ? 1 : 0] = fn;
  }
  GemmFn gemm_quant[kGemmQuantCount][2] = {};  // [GemmQuantSlot(type)][packed]
  // Float weights (F32/F16/BF16) times float activations, same split convention.
  using GemmFloatFn = void (*)(const WeightView& w, const float* x, int64_t ldx, int64_t m, int64_t n_begin,
                               int64_t n_end, float* y, int64_t ldy);
  GemmFloatFn gemm_f32 = nullptr;
  GemmFloatFn gemm_f16 = nullptr;
  GemmFloatFn gemm_bf16 = nullptr;

  void (*quantize_q8a)(const float* x, BlockQ8A* y, int64_t n) = nullptr;

  // Attention for query heads [head_begin, head_end), which must share one kv head, over query
  // rows [t_begin, t_end) (keys 0 .. t_end - 1). Any range works; the fast paths cut it into tiles
  // of attention_rows rows of one head and stream each K/V block once for all of them, so
  // AttentionPrefill passes several heads of a GQA group and/or several tiles per call.
  void (*attention_block)(const AttentionArgs& a, int head_begin, int head_end, int t_begin, int t_end) = nullptr;
  int attention_rows = 64;
  // The bf16 path (AMX-BF16 where the host has it and ESTREAM_ATTN_BF16 is not "0"; else on
  // AVX-512 the int8/bf16 kernel of attention_lowp.h unless ESTREAM_ATTN_LOWP is "0"; on AArch64
  // with FEAT_BF16 the BFDOT kernel unless either switch is "0"; all null elsewhere), used for AttentionArgs::allow_bf16: low-precision operands, fp32 accumulation. K and V
  // are converted once per AttentionPrefill call: attention_convert_bf16 writes key blocks
  // [block_begin, block_end) (attention_kv_block_bf16 keys each) of kv head `kv_head` into kv16,
  // that head's buffer of attention_kv_bytes_bf16(head_dim, n_tokens) bytes (a range, so that what
  // the blocks of a head share is computed once per call: ConvertKvBlocks makes one of a function
  // of one block); attention_block_bf16 then has the contract of attention_block, reading K and V
  // from the buffer of the heads' kv head.
  void (*attention_convert_bf16)(const AttentionArgs& a, int kv_head, int block_begin, int block_end,
                                 uint16_t* kv16) = nullptr;
  size_t (*attention_kv_bytes_bf16)(int head_dim, int n_tokens) = nullptr;
  int attention_kv_block_bf16 = 0;
  void (*attention_block_bf16)(const AttentionArgs& a, const uint16_t* kv16, int head_begin, int head_end,
                               int t_begin, int t_end) = nullptr;
  int attention_rows_bf16 = 0;
  // The low-precision kernel smooths K with the mean of the first f = attention_first_rows_bf16
  // keys, so a row before them would depend on keys after it, and a prompt's result on what
  // follows it (attention_lowp.h). Rows before f read key block 0 converted once more for them,
  // with K smoothed by keys that each of them sees: rows [0, s = attention_first_split_bf16) by
  // key 0 alone, rows [s, f) by the mean of keys [0, s) (AttentionArgs::lowp_mean_keys;
  // 1 <= s <= f). Both 0: no such rows (kernels without smoothing).
  int attention_first_rows_bf16 = 0;
  int attention_first_split_bf16 = 0;
  // attention_block_bf16 writes AttentionArgs::out_q8 itself where it is set (head_dim a multiple
  // of 32); otherwise AttentionPrefill quantises the fp32 rows after the kernels.
  bool attention_q8_bf16 = false;
  // Bytes of per-thread scratch the entries above keep (grown once, thread_local) after calls of
  // at most `tiles` (head, row tile) tiles with heads of head_dim; null: none beyond O(T) rows.
  size_t (*attention_scratch_bytes)(int head_dim, int tiles) = nullptr;
  size_t (*attention_scratch_bytes_bf16)(int head_dim, int tiles) = nullptr;

  void (*rms_norm_row)(const float* x, const float* w, float* y, int64_t n, float eps) = nullptr;
  // Rotates n_heads heads of one token at position `pos`; pair p (of head_dim / 2) turns by
  // theta_p = pos * inv_freq[p], with inv_freq[p] = freq_base^(-2p/head_dim) computed by Rope().
  void (*rope_row)(float* x, int n_heads, int head_dim, int pos, const double* inv_freq, RopeMode mode) = nullptr;
  void (*swiglu)(const float* g, const float* u, float* h, int64_t n) = nullptr;
  void (*softmax_topk)(const float* logits, int n_expert, int k, bool renormalize, int32_t* idx,
                       float* w) = nullptr;
  double (*log_sum_exp)(const float* row, int64_t n) = nullptr;
  void (*add)(float* y, const float* x, int64_t n) = nullptr;
  // ShortConv (kernels.h) for tokens [t_begin, t_end) (each reads the L - 1 rows before it).
  void (*short_conv_rows)(const float* bcx, int64_t ldb, const float* w, int L, int64_t d, int64_t t_begin,
                          int64_t t_end, float* y, int64_t ldy) = nullptr;
};

// Single-threaded GEMM over columns [n_begin, n_end) of W for rows [0, m), through `kt`:
// quantised W multiplies the Q8A rows xq, float W the float rows x (ldx). Writes
// tile[i * ld_tile + (j - n_begin)], i.e. the tile holds only those columns (the table's entries
// address y by absolute column; this shifts the base). REQUIRES: GemmSupports(w.type).
void GemmColumns(const KernelTable& kt, const WeightView& w, const BlockQ8A* xq, const float* x, int64_t ldx,
                 int64_t m, int64_t n_begin, int64_t n_end, float* tile, int64_t ld_tile);

// Gemm (kernels.h) through `kt` instead of the active table (the tests run every ISA's table).
void GemmWith(const KernelTable& kt, std::span<const GemmOut> outs, const float* x, int64_t ldx, const BlockQ8A* xq,
              int64_t m);

// The table for `isa` (clamped to HostIsa()).
const KernelTable& KernelsFor(Isa isa);
// The table for ActiveIsa().
const KernelTable& Kernels();

// Filled by each ISA's translation units: the GEMM family (gemm_*, quantize_q8a) and the
// other ops (attention, norms, RoPE, SwiGLU, router, add). Only the functions of the build's
// architecture exist (x86-64: Scalar, Avx2, Avx512; AArch64: Scalar, Neon, Dotprod, I8mm).
void FillScalarGemm(KernelTable* t);
void FillScalarOps(KernelTable* t);
// LFM2's short convolution, one translation unit per ISA (ref/shortconv_ref.cc, ...).
void FillScalarShortConv(KernelTable* t);
#if defined(__x86_64__)
void FillAvx2Gemm(KernelTable* t);
void FillAvx2Ops(KernelTable* t);
void FillAvx512Gemm(KernelTable* t);
void FillAvx512Ops(KernelTable* t);
void FillAvx2ShortConv(KernelTable* t);
void FillAvx512ShortConv(KernelTable* t);
#endif
#if defined(__aarch64__)
// Level neon: quantize_q8a (arm_neon/quantize_neon.cc), the fp32 ops (ops_neon.cc: norms, RoPE,
// SwiGLU, router, add), attention, the GEMMs without int8 dot products, short convolution.
void FillNeonQuantize(KernelTable* t);
void FillNeonOps(KernelTable* t);
void FillNeonAttention(KernelTable* t);
void FillNeonGemm(KernelTable* t);
void FillNeonShortConv(KernelTable* t);
// Level dotprod: the quantised GEMMs on sdot. Level i8mm: on smmla.
void FillDotprodGemm(KernelTable* t);
void FillI8mmGemm(KernelTable* t);
// The bf16 attention entries on BFDOT (arm_neon/attention_neon_bf16.cc), at every ARM level of a
// host with FEAT_BF16 (not an Isa level of its own: bf16 comes with or without i8mm). Build() fills
// them where NeonBf16AttentionSelected(): the host has bf16 and neither ESTREAM_ATTN_BF16 nor
// ESTREAM_ATTN_LOWP is "0" (the x86 switches). REQUIRES for calling the entries: neon_bf16.
void FillNeonBf16Attention(KernelTable* t);
bool NeonBf16AttentionSelected();
#endif

}  // namespace estream::kernels
