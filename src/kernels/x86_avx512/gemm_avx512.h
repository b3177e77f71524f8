// Internal to the AVX-512 GEMM translation units (gemm_avx512.cc, gemm_amx.cc) and the GEMM
// tests: the per-row activation data the kernels share, and the AMX-INT8 tile path.
//
// AMX path (Sapphire Rapids and later): 16 rows of X x 16 weight rows per tile multiply, K = 32
// (one block) per multiply so that every block's int32 dot can be scaled by its own d_w * d_x;
// the int32 tile is stored to L1 and scaled into fp32 sums with AVX-512, exactly the fp32
// operations of the vpdpbusd micro-kernel in the same order, so both paths give bit-identical
// results and the split between them (by row tiles) never changes the output.
// The per-block tile store and fp32 scaling (which do not overlap with the tile multiply) bound
// the path, not the tile unit (figures: docs/PERFORMANCE.md). The X rows are relaid once per pass
// into contiguous A tiles (AmxPackX) and the 16 fp32 row sums stay in registers.
// Weights are first unpacked, per panel group and k chunk, into signed B tiles (value - Z, so no
// zero-point term is left): 8 rows (k-steps) x 64 bytes (16 weight rows x 4 values) per block.
// Thread safety: AmxUsable() is computed once; the tile configuration is per thread.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/dispatch.h"
#include "quant/types.h"

namespace estream::kernels {

// Per activation row and block: what the micro-kernels broadcast besides the int8 values.
struct XAux {
  float dx;     // activation scale
  int32_t b0;   // int32 accumulator start: -Z * sum (two-half formats: of values 0..15)
  int32_t b1;   // two-half formats (Q6_K, Q3_K, Q2_K): -Z * sum of values 16..31
  float dxs;    // formats with mins: dx * sum (multiplies the weights' min; Q2_K: of values 0..15)
  float dxs1;   // Q2_K: dx * sum of values 16..31
};

// True if the CPU has AMX-INT8, the OS enabled the tile state and granted this process its use
// (arch_prctl ARCH_REQ_XCOMP_PERM), and ESTREAM_AMX is not "0". Computed once.
bool AmxUsable();
// The AVX-512 GEMM entries with (where AmxUsable) or without the AMX tile path; FillAvx512Gemm
// uses AmxUsable(). Tests fill both.
void FillAvx512GemmWith(KernelTable* t, bool use_amx);

// bench/gemm_bench only: `reps` calls of the Q4_0 vpdpbusd micro-kernel on one tile (4 rows of x
// by the first 3 panels of the packed weights w of k values, blocks [0, blocks)), its scales and
// row data prepared once: data that small stays in L1, so this is the kernel's own rate without
// the loop nest and the memory hierarchy around it (its bound: peak/vpdpbusd_epilogue_mix_zmm).
// x: 4 rows of k / 32 blocks; y: 4 x 48 floats. REQUIRES: AVX-512 VNNI, blocks <= k / 32.
void RunQ4_0MicroForBench(const uint8_t* w, int64_t k, const BlockQ8A* x, int64_t blocks, int64_t reps, float* y);

// Types the AMX path handles (Q4_0, Q8_0, Q4_K; Q6_K's 16-value scales stay on vpdpbusd).
constexpr bool AmxHandles(QuantType t) {
  return t == QuantType::kQ4_0 || t == QuantType::kQ8_0 || t == QuantType::kQ4_K;
}
// Loads this thread's tile configuration / releases the tile state.
void AmxBegin();
void AmxEnd();
// Unpacks blocks [b0, b1) of nv (<= 2) packed panels (panel j at w + j * panel_stride) into
// signed B tiles at dst: block b of panel j at dst + (j * (b1 - b0) + b - b0) * 512.
// kb: blocks per panel row (the scale section's size depends on it).
void AmxUnpack(QuantType t, const uint8_t* w, int64_t panel_stride, int64_t kb, int nv, int64_t b0, int64_t b1,
               int8_t* dst);
// The X rows of a pass in the A-tile layout of the AMX path, built once per pass and read by every
// panel group: row tile t (rows 16t..16t+15) and block b hold 16 rows x 32 int8 at
// q + (t * kb + b) * 512 (contiguous, 64-byte aligned when q is: an A tile load touches 8 cache
// lines instead of 16 strided, partly split ones), the 16 rows' d_x at dx + (t * kb + b) * 16 and
// (Q4_K) their d_x * sum at dxs likewise (one cache line per block instead of 16).
struct AmxX {
  const int8_t* q = nullptr;
  const float* dx = nullptr;
  const float* dxs = nullptr;
};
// Writes `rows` rows of x (row i at x + i * kb) in the AmxX layout at q, dx, dxs as ceil(rows /
// 16) row tiles, the last one padded with zero rows (q, d_x and d_x * sum all 0) (dxs may be null
// when the type has no min term; else d_x * (sum[0] + sum[1]) in fp32, as XAux::dxs).
void AmxPackX(const BlockQ8A* x, int64_t kb, int64_t rows, int8_t* q, float* dx, float* dxs);
// x_tiles row tiles of xa (starting at its row tile 0) x nv panels, blocks [b0, b1) of the
// unpacked tiles `bt`, with the panels' scale vectors ws of those blocks (PanelScales,
// gemm_avx512_scales.h). Writes or, with accumulate, adds to y[i * ldy + 16 * j + r] for the
// lanes of mask[j], for the 16 rows of each tile but the last, of which only the first last_rows
// (a padded tile's real rows). REQUIRES: AmxBegin() on this thread.
void AmxTiles(QuantType t, const int8_t* bt, const float* ws, int nv, const AmxX& xa, int64_t kb, int64_t b0,
              int64_t b1, int x_tiles, int last_rows, float* y, int64_t ldy, const __mmask16* mask,
              bool accumulate);

}  // namespace estream::kernels
