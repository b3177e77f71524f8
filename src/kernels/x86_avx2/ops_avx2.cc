// AVX2 + FMA kernels: causal attention (attention_x86_impl.h) and the row ops (ops_simd_impl.h:
// RMSNorm, RoPE, SwiGLU, router softmax, residual add), both instantiated with the 8-lane traits
// of avx2_traits.h. Compiled with the AVX2 flags only; reached through the dispatch table when the
// host has AVX2 (and AVX-512 is absent or ESTREAM_ISA=avx2).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "base/cpu.h"
#include "kernels/attention_lowp.h"
#include "kernels/attention_x86_impl.h"
#include "kernels/dispatch.h"
#include "kernels/ops_internal.h"
#include "kernels/ops_simd_impl.h"
#include "kernels/x86_avx2/avx2_traits.h"

namespace estream::kernels {
namespace {

void AttentionBlockAvx2(const AttentionArgs& a, int head_begin, int head_end, int t_begin, int t_end) {
  AttentionBlockX86<Avx2Traits>(a, head_begin, head_end, t_begin, t_end);
}

}  // namespace

void FillAvx2Ops(KernelTable* t) {
  t->attention_block = AttentionBlockAvx2;
  t->attention_rows = Avx2Traits::kLanes * Avx2Traits::kVecs;
  t->attention_scratch_bytes = AttentionScratchBytesX86<Avx2Traits>;
  FillRowOps<Avx2Traits>(t);
  // The bf16 entries carry the int8 attention (attention_lowp.h; Q.K^T on vpdpbusd with AVX-VNNI,
  // vpmaddubsw without) unless ESTREAM_ATTN_LOWP is "0"; the AVX-512 level sets its own.
  if (AttentionLowpSelected()) FillAttentionLowpAvx2(t, HostCpuFeatures().avx_vnni);
}

}  // namespace estream::kernels
