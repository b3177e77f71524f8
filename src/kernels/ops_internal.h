// Helpers shared by the ops kernels of every ISA (attention, norms, RoPE, router); internal to
// src/kernels. Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace estream::kernels {

// Indices of the k largest logits, in descending order; ties keep the lower index first, NaN
// logits are never picked ahead of a number. Selecting on logits equals selecting on softmax
// probabilities (softmax is monotone) but is exact, so every ISA picks the same experts.
// REQUIRES: 1 <= k <= n_expert.
void SelectTopK(const float* logits, int n_expert, int k, int32_t* idx);

// The log-sum-exp reference (the scalar table's log_sum_exp): the max in fp32, then
// sum e^(x - max) in double. The vector paths fall back to it for rows with NaN or +-inf.
double LogSumExpRef(const float* row, int64_t n);

struct KernelTable;
// AttentionPrefill through an explicit table (AttentionPrefill uses Kernels()); tests run every
// ISA's kernel through the same multithreaded work split. [parallel]
void AttentionPrefillWith(const KernelTable& kt, const AttentionArgs& a);

// The AVX-512 ops entries: the fp32 AVX-512 attention, and with use_amx the AMX-BF16 attention
// (x86_avx512/attention_amx.h) as attention_block_bf16; FillAvx512Ops sets use_amx where the CPU
// has it and ESTREAM_ATTN_BF16 is not "0". Tests fill both.
// REQUIRES: HostIsa() == kAvx512; use_amx only where AttentionAmxUsable().
// x86-64 builds only.
#if defined(__x86_64__)
void FillAvx512OpsWith(KernelTable* t, bool use_amx);
// True if the AMX-BF16 attention can run here (CPU, OS permission, ESTREAM_AMX != "0").
bool AttentionAmxUsable();
#endif

}  // namespace estream::kernels
