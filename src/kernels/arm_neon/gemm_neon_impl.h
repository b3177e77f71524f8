// The AArch64 quantised GEMM, written once over the instruction level and instantiated by
// gemm_neon.cc (plain NEON: smull/smlal + sadalp), gemm_neon_dotprod.cc (sdot) and
// gemm_neon_i8mm.cc (smmla), each compiled for its own level. Everything here has internal
// linkage (anonymous namespace), so the instantiations never merge across levels in the linker.
// Internal to src/kernels.
//
// Weights: the packed layout of repack.h, unchanged (it is ISA-neutral): a quant block line of
// k-step s is 64 bytes = 16 weight rows x 4 consecutive values, i.e. four 128-bit vectors of
// 4 rows x 4 values, which is exactly the operand shape of sdot by element (vdotq_laneq_s32:
// 4 rows x 4 values against 4 values of one activation row picked by lane). For smmla (2 x 8
// by 8 x 2) the vectors of k-steps s and s + 1 are zipped by 32-bit elements into 2 rows x 8
// values (one zip per weight vector, reused by every pair of activation rows of the tile).
// GGUF-layout weights are packed on the fly, a panel at a time, as on x86.
//
// Signs: ARM's int8 dot products multiply signed by signed (no vpdpbusd-style u8 x s8 before
// i8mm's usdot). Every packed value below 128 (nibbles, 5- and 6-bit values) is already a valid
// int8, and the zero point is removed through the activation sums as on x86 (int32 accumulators
// start at -Z * sum(x)); Q8_0 (so Q5_0) and the table types (whose entries are int8 + 128) are
// turned into signed weights by xor 0x80 (value - 128), and need no bias.
//
// Tiles (32 x 128-bit registers): per 32-value block, exact int32 dots are formed for
// kMr rows of X x 16 weight rows (one panel), then scaled by d_w * d_x (fp32, exact product
// pattern as the scalar reference) into fp32 sums kept in an L1 array (the int32 set and the
// operands use the registers):
//   dotprod: 4 rows x 4 vectors: 16 int32 accumulators + 8 activation vectors (2 per row) +
//            weight vectors; 8 sdot per accumulator and block (16 for the nibble types' pairs).
//   i8mm:    2 row pairs x 8 weight-row pairs: 16 int32 (2 x 2) accumulators + 8 activation pair
//            vectors (rows i, i + 1 interleaved by 8 values) + 4 weight vectors.
//   neon:    2 rows x 4 vectors x 2 halves: 16 int32 accumulators (sadalp of smull/smlal int16
//            pairs: |w x| <= 128 * 127, so two products fit int16), reduced by addp per block.
// Loop nest (as on x86): passes of up to kMc rows of X > panels > k chunks (kKcBytes of a panel's
// weights, in L1 while every row tile streams past) > row tiles. The k chunk size depends only on
// the type and every output is accumulated in block order, so any split over threads gives
// bit-identical results. The fp32 operations per block equal the x86 kernels' (fma of the int32
// dot by d_w * d_x, then fma of the min by d_x * sum), within the tolerance of the tests.
#pragma once

#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/fp16.h"
#include "base/memory.h"
#include "kernels/dispatch.h"
#include "kernels/repack.h"
#include "quant/quant.h"

#define ESTREAM_NEON_UNROLL _Pragma("GCC unroll 16")

namespace estream::kernels {
namespace {

enum class NeonLevel { kNeon, kDotprod, kI8mm };

constexpr int kNeonKcBytes = 16 * 1024;  // bytes of one panel's k chunk kept in L1
constexpr int64_t kNeonMc = 512;         // rows of X per pass over the weights

// Rows of X per micro-tile.
template <NeonLevel L>
constexpr int kNeonMr = L == NeonLevel::kNeon ? 2 : 4;

struct NeonXAux {
  float dx;     // activation scale
  int32_t b0;   // int32 accumulator start: -Z * sum (two-half formats: of values 0..15)
  int32_t b1;   // two-half formats: -Z * sum of values 16..31
  float dxs;    // formats with mins: dx * sum (Q2_K: of values 0..15)
  float dxs1;   // Q2_K: dx * sum of values 16..31
};

// Formats whose stored values go into the dot products as value xor 0x80 (= value - 128).
template <QuantType kT>
constexpr bool kNeonSignedW = kT == QuantType::kQ8_0 || PackedIsLut(kT);

template <QuantType kT>
void NeonBuildAux(const BlockQ8A* xq, int64_t count, NeonXAux* aux) {
  const int z = kNeonSignedW<kT> ? 0 : ZeroPoint(kT);
  constexpr bool kHalfMins = PackedHalves(kT) == 2 && PackedHasMin(kT);
  for (int64_t i = 0; i < count; ++i) {
    const int s0 = xq[i].sum[0], s1 = xq[i].sum[1];
    aux[i].dx = xq[i].d;
    aux[i].dxs = xq[i].d * static_cast<float>(kHalfMins ? s0 : s0 + s1);
    aux[i].dxs1 = kHalfMins ? xq[i].d * static_cast<float>(s1) : 0.0f;
    if (PackedHalves(kT) == 2) {
      aux[i].b0 = -z * s0;
      aux[i].b1 = -z * s1;
    } else {
      aux[i].b0 = -z * (s0 + s1);
      aux[i].b1 = 0;
    }
  }
}

// fp32 vectors per block the epilogue needs: d of each half, then (PackedHasMin) m of each half.
template <QuantType kT>
constexpr int kNeonScaleVecs = PackedHalves(kT) * (PackedHasMin(kT) ? 2 : 1);

inline float NeonHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFp32(h);
}

// The scales (and mins) of blocks [b0, b1) of the panel at p for its 16 rows, as the scalar
// reference's DecodePacked forms them (exact fp32 products): vector v of block b at
// ws + ((b - b0) * kNeonScaleVecs + v) * 16. Built once per k chunk, read by every row tile.
template <QuantType kT>
void NeonPanelScales(const uint8_t* p, int64_t kb, int64_t b0, int64_t b1, float* ws) {
  constexpr int kV = kNeonScaleVecs<kT>;
  constexpr int kH = PackedHalves(kT);
  auto i8 = [](uint8_t v) { return static_cast<float>(static_cast<int8_t>(v)); };
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* sup = p + (b / 8) * PackedSuperBytes(kT);
    const uint8_t* sc = p + PackedBlockScaleOffset(kT, kb) + b * PackedScaleBytes(kT);
    float* o = ws + (b - b0) * kV * 16;
    for (int r = 0; r < kPackRows; ++r) {
      if constexpr (kT == QuantType::kQ4_0 || kT == QuantType::kQ8_0 || kT == QuantType::kIQ4_NL) {
        o[r] = NeonHalf(sc + 2 * r);
      } else if constexpr (kT == QuantType::kQ4_1 || kT == QuantType::kQ5_1) {
        o[r] = NeonHalf(sc + 2 * r);
        o[16 + r] = NeonHalf(sc + 32 + 2 * r);
      } else if constexpr (kT == QuantType::kQ4_K || kT == QuantType::kQ5_K) {
        o[r] = NeonHalf(sup + 2 * r) * static_cast<float>(sc[r]);
        o[16 + r] = NeonHalf(sup + 32 + 2 * r) * static_cast<float>(sc[16 + r]);
      } else if constexpr (kT == QuantType::kQ6_K || kT == QuantType::kQ3_K) {
        o[r] = NeonHalf(sup + 2 * r) * i8(sc[r]);
        o[16 + r] = NeonHalf(sup + 2 * r) * i8(sc[16 + r]);
      } else if constexpr (kT == QuantType::kQ2_K) {
        for (int h = 0; h < kH; ++h) {
          o[16 * h + r] = NeonHalf(sup + 2 * r) * static_cast<float>(sc[16 * h + r]);
          o[16 * (kH + h) + r] = NeonHalf(sup + 32 + 2 * r) * static_cast<float>(sc[32 + 16 * h + r]);
        }
      } else if constexpr (kT == QuantType::kIQ4_XS) {
        o[r] = NeonHalf(sup + 2 * r) * i8(sc[r]);
      } else if constexpr (kT == QuantType::kMXFP4) {
        o[r] = E8M0HalfToFp32(sc[r]);
      }
    }
  }
}

// The weight operands of one packed quant block: Bytes(s, g) the byte formats' vector of k-step s
// (values 4s..4s+3) for rows 4g..4g+3; Lo/Hi the nibble formats' values 4s.. / 16 + 4s.. of the
// same rows. All as signed int8 (see the header comment).
template <QuantType kT>
struct NeonWeights {
  const uint8_t* q;
  uint8x16_t lut;  // table types: the table xor 0x80 (signed entries)
  explicit NeonWeights(const uint8_t* quant_block) : q(quant_block) {
    if constexpr (PackedIsLut(kT)) lut = veorq_u8(vld1q_u8(PackedLut(kT)), vdupq_n_u8(0x80));
    else lut = vdupq_n_u8(0);
  }
  int8x16_t Bytes(int s, int g) const {
    const uint8x16_t v = vld1q_u8(q + 64 * s + 16 * g);
    if constexpr (kNeonSignedW<kT>) return vreinterpretq_s8_u8(veorq_u8(v, vdupq_n_u8(0x80)));
    return vreinterpretq_s8_u8(v);
  }
  int8x16_t Map(uint8x16_t codes) const {
    if constexpr (PackedIsLut(kT)) return vreinterpretq_s8_u8(vqtbl1q_u8(lut, codes));
    return vreinterpretq_s8_u8(codes);
  }
  int8x16_t Lo(int s, int g) const { return Map(vandq_u8(vld1q_u8(q + 64 * s + 16 * g), vdupq_n_u8(0x0F))); }
  int8x16_t Hi(int s, int g) const { return Map(vshrq_n_u8(vld1q_u8(q + 64 * s + 16 * g), 4)); }
};

// The int32 dots of one block half, for each level: Dots(h, wts, x, aux, b, iacc) fills
// iacc[i][g] (row i of X, weight rows 4g..4g+3) with bias + sum over the half's values.
// x[i] points at row i's block b.

#if defined(__ARM_FEATURE_DOTPROD)
// acc += dot4(w rows, x values 4 lane .. 4 lane + 3), for a compile-time lane after unrolling.
inline int32x4_t NeonSdotLane(int32x4_t acc, int8x16_t w, int8x16_t x, int lane) {
  switch (lane & 3) {
    case 0: return vdotq_laneq_s32(acc, w, x, 0);
    case 1: return vdotq_laneq_s32(acc, w, x, 1);
    case 2: return vdotq_laneq_s32(acc, w, x, 2);
    default: return vdotq_laneq_s32(acc, w, x, 3);
  }
}

template <QuantType kT, int MR>
inline void NeonDotsSdot(int h, const NeonWeights<kT>& wt, const int8x16_t (&xv)[MR][2], int32x4_t (&iacc)[MR][4]) {
  constexpr int kHalves = PackedHalves(kT);
  if constexpr (PackedNibbles(kT) && kHalves == 1) {
    ESTREAM_NEON_UNROLL
    for (int s = 0; s < 4; ++s)
      ESTREAM_NEON_UNROLL
      for (int g = 0; g < 4; ++g) {
        const int8x16_t lo = wt.Lo(s, g), hi = wt.Hi(s, g);
        ESTREAM_NEON_UNROLL
        for (int i = 0; i < MR; ++i) {
          iacc[i][g] = NeonSdotLane(iacc[i][g], lo, xv[i][0], s);
          iacc[i][g] = NeonSdotLane(iacc[i][g], hi, xv[i][1], s);
        }
      }
  } else if constexpr (PackedNibbles(kT)) {
    ESTREAM_NEON_UNROLL
    for (int s = 0; s < 4; ++s)
      ESTREAM_NEON_UNROLL
      for (int g = 0; g < 4; ++g) {
        const int8x16_t wv = h == 0 ? wt.Lo(s, g) : wt.Hi(s, g);
        ESTREAM_NEON_UNROLL
        for (int i = 0; i < MR; ++i) iacc[i][g] = NeonSdotLane(iacc[i][g], wv, xv[i][h], s);
      }
  } else {
    constexpr int kSteps = kHalves == 2 ? 4 : 8;
    ESTREAM_NEON_UNROLL
    for (int s0 = 0; s0 < kSteps; ++s0) {
      const int s = h * 4 + s0;
      ESTREAM_NEON_UNROLL
      for (int g = 0; g < 4; ++g) {
        const int8x16_t wv = wt.Bytes(s, g);
        ESTREAM_NEON_UNROLL
        for (int i = 0; i < MR; ++i) iacc[i][g] = NeonSdotLane(iacc[i][g], wv, xv[i][s / 4], s);
      }
    }
  }
}
#endif

// Plain NEON: w (4 rows x 4 values of k-steps s and s + 1) against x values broadcast per row.
// lo/hi accumulate rows {0, 1} / {2, 3} as pairs of int32 partial sums (reduced per half).
template <int MR>
inline void NeonMullPair(int8x16_t w0, int8x16_t w1, const int8x16_t (&x0)[MR], const int8x16_t (&x1)[MR],
                         int32x4_t (&lo)[MR], int32x4_t (&hi)[MR]) {
  ESTREAM_NEON_UNROLL
  for (int i = 0; i < MR; ++i) {
    int16x8_t pl = vmull_s8(vget_low_s8(w0), vget_low_s8(x0[i]));
    pl = vmlal_s8(pl, vget_low_s8(w1), vget_low_s8(x1[i]));
    int16x8_t ph = vmull_high_s8(w0, x0[i]);
    ph = vmlal_high_s8(ph, w1, x1[i]);
    lo[i] = vpadalq_s16(lo[i], pl);
    hi[i] = vpadalq_s16(hi[i], ph);
  }
}

inline int8x16_t NeonDupLane(int8x16_t x, int lane) {
  const int32x4_t v = vreinterpretq_s32_s8(x);
  switch (lane & 3) {
    case 0: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 0));
    case 1: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 1));
    case 2: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 2));
    default: return vreinterpretq_s8_s32(vdupq_laneq_s32(v, 3));
  }
}

template <QuantType kT, int MR>
inline void NeonDotsMull(int h, const NeonWeights<kT>& wt, const int8x16_t (&xv)[MR][2], int32x4_t (&iacc)[MR][4]) {
  constexpr int kHalves = PackedHalves(kT);
  int32x4_t lo[4][MR], hi[4][MR];
  ESTREAM_NEON_UNROLL
  for (int g = 0; g < 4; ++g)
    ESTREAM_NEON_UNROLL
    for (int i = 0; i < MR; ++i) lo[g][i] = hi[g][i] = vdupq_n_s32(0);
  // Steps in pairs (s, s + 1) of the same 4-step activation vector.
  auto pair = [&](int xsel, int s, auto load) {
    int8x16_t x0[MR], x1[MR];
    ESTREAM_NEON_UNROLL
    for (int i = 0; i < MR; ++i) {
      x0[i] = NeonDupLane(xv[i][xsel], s);
      x1[i] = NeonDupLane(xv[i][xsel], s + 1);
    }
    ESTREAM_NEON_UNROLL
    for (int g = 0; g < 4; ++g) NeonMullPair<MR>(load(s, g), load(s + 1, g), x0, x1, lo[g], hi[g]);
  };
  if constexpr (PackedNibbles(kT) && kHalves == 1) {
    ESTREAM_NEON_UNROLL
    for (int s = 0; s < 4; s += 2) {
      pair(0, s, [&](int ss, int g) { return wt.Lo(ss, g); });
      pair(1, s, [&](int ss, int g) { return wt.Hi(ss, g); });
    }
  } else if constexpr (PackedNibbles(kT)) {
    ESTREAM_NEON_UNROLL
    for (int s = 0; s < 4; s += 2) {
      if (h == 0) pair(0, s, [&](int ss, int g) { return wt.Lo(ss, g); });
      else pair(1, s, [&](int ss, int g) { return wt.Hi(ss, g); });
    }
  } else {
    constexpr int kSteps = kHalves == 2 ? 4 : 8;
    ESTREAM_NEON_UNROLL
    for (int s0 = 0; s0 < kSteps; s0 += 2) {
      const int s = h * 4 + s0;
      pair(s / 4, s % 4, [&](int ss, int g) { return wt.Bytes(4 * (s / 4) + ss, g); });
    }
  }
  ESTREAM_NEON_UNROLL
  for (int g = 0; g < 4; ++g)
    ESTREAM_NEON_UNROLL
    for (int i = 0; i < MR; ++i) iacc[i][g] = vaddq_s32(iacc[i][g], vpaddq_s32(lo[g][i], hi[g][i]));
}

// The fp32 epilogue of one half: fsum[i][4g..4g+3] += float(iacc[i][g]) * (d_w * d_x).
template <int MR>
inline void NeonScaleInto(const int32x4_t (&iacc)[MR][4], const float* dw, const NeonXAux* const (&ax)[MR],
                          float (&fsum)[MR][16]) {
  float32x4_t d[4];
  ESTREAM_NEON_UNROLL
  for (int g = 0; g < 4; ++g) d[g] = vld1q_f32(dw + 4 * g);
  ESTREAM_NEON_UNROLL
  for (int i = 0; i < MR; ++i) {
    const float dx = ax[i]->dx;
    ESTREAM_NEON_UNROLL
    for (int g = 0; g < 4; ++g)
      vst1q_f32(fsum[i] + 4 * g,
                vfmaq_f32(vld1q_f32(fsum[i] + 4 * g), vcvtq_f32_s32(iacc[i][g]), vmulq_n_f32(d[g], dx)));
  }
}

template <QuantType kT, int MR>
inline void NeonMinsInto(const float* ws_block, const NeonXAux* const (&ax)[MR], float (&fsum)[MR][16]) {
  constexpr int kHalves = PackedHalves(kT);
  ESTREAM_NEON_UNROLL
  for (int h = 0; h < kHalves; ++h) {
    const float* mv = ws_block + (kHalves + h) * 16;
    ESTREAM_NEON_UNROLL
    for (int i = 0; i < MR; ++i) {
      const float dxs = h == 0 ? ax[i]->dxs : ax[i]->dxs1;
      ESTREAM_NEON_UNROLL
      for (int g = 0; g < 4; ++g)
        vst1q_f32(fsum[i] + 4 * g, vfmaq_n_f32(vld1q_f32(fsum[i] + 4 * g), vld1q_f32(mv + 4 * g), dxs));
    }
  }
}

// A whole panel (the usual case) as four vectors per row; a matrix's last, partial panel element by
// element. (The AVX2 kernel's element-by-element loop was ~7% of its samples; not timed on an ARM
// host.)
template <int MR>
inline void NeonStoreTile(const float (&fsum)[MR][16], int rows, float* y, int64_t ldy, int lo, int hi,
                          bool accumulate) {
  const bool full = lo == 0 && hi == 16;
  for (int i = 0; i < std::min(rows, MR); ++i) {
    float* yi = y + i * ldy;
    if (full) {
      ESTREAM_NEON_UNROLL
      for (int g = 0; g < 4; ++g) {
        const float32x4_t v = vld1q_f32(fsum[i] + 4 * g);
        vst1q_f32(yi + 4 * g, accumulate ? vaddq_f32(vld1q_f32(yi + 4 * g), v) : v);
      }
    } else {
      for (int r = lo; r < hi; ++r) yi[r] = accumulate ? yi[r] + fsum[i][r] : fsum[i][r];
    }
  }
}

// Dotprod / plain NEON micro-tile: MR rows of X (row i at x + i * kb, aux likewise) x one packed
// panel at w, blocks [b0, b1) with their scale vectors ws (NeonPanelScales). Writes or adds
// y[i * ldy + r] for weight rows r in [lo, hi).
template <QuantType kT, int MR, NeonLevel L>
void NeonMicro(const uint8_t* w, const float* ws, const BlockQ8A* x, const NeonXAux* aux, int64_t kb, int64_t b0,
               int64_t b1, float* y, int64_t ldy, int lo, int hi, bool accumulate) {
  constexpr int kQB = PackedQuantBytes(kT);
  constexpr int kV = kNeonScaleVecs<kT>;
  const int64_t sect = PackedScaleSection(kT, kb);
  alignas(16) float fsum[MR][16] = {};
  for (int64_t b = b0; b < b1; ++b) {
    const NeonWeights<kT> wt(w + sect + b * kQB);
    const float* wsb = ws + (b - b0) * kV * 16;
    int8x16_t xv[MR][2];
    const NeonXAux* ax[MR];
    ESTREAM_NEON_UNROLL
    for (int i = 0; i < MR; ++i) {
      xv[i][0] = vld1q_s8(x[i * kb + b].qs);
      xv[i][1] = vld1q_s8(x[i * kb + b].qs + 16);
      ax[i] = aux + i * kb + b;
    }
    // One or two halves: GCC unrolls this constant trip count by itself (with the pragma it warned
    // "ignoring loop annotation" where one half left no loop).
    for (int h = 0; h < PackedHalves(kT); ++h) {
      int32x4_t iacc[MR][4];
      ESTREAM_NEON_UNROLL
      for (int i = 0; i < MR; ++i) {
        const int32x4_t bias = vdupq_n_s32(h == 0 ? ax[i]->b0 : ax[i]->b1);
        ESTREAM_NEON_UNROLL
        for (int g = 0; g < 4; ++g) iacc[i][g] = bias;
      }
#if defined(__ARM_FEATURE_DOTPROD)
      if constexpr (L != NeonLevel::kNeon) NeonDotsSdot<kT, MR>(h, wt, xv, iacc);
      else NeonDotsMull<kT, MR>(h, wt, xv, iacc);
#else
      static_assert(L == NeonLevel::kNeon, "the dotprod kernels need a +dotprod translation unit");
      NeonDotsMull<kT, MR>(h, wt, xv, iacc);
#endif
      NeonScaleInto<MR>(iacc, wsb + h * 16, ax, fsum);
    }
    if constexpr (PackedHasMin(kT)) NeonMinsInto<kT, MR>(wsb, ax, fsum);
  }
  NeonStoreTile<MR>(fsum, MR, y, ldy, lo, hi, accumulate);
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// i8mm micro-tile: MP pairs of X rows (2 MP rows; `rows` of them real: a missing second row of
// the last pair repeats the first and is not stored) x one panel, as NeonMicro.
template <QuantType kT, int MP>
void NeonMicroMmla(const uint8_t* w, const float* ws, const BlockQ8A* x, const NeonXAux* aux, int64_t kb, int64_t b0,
                   int64_t b1, float* y, int64_t ldy, int rows, int lo, int hi, bool accumulate) {
  constexpr int MR = 2 * MP;
  constexpr int kQB = PackedQuantBytes(kT);
  constexpr int kV = kNeonScaleVecs<kT>;
  constexpr int kHalves = PackedHalves(kT);
  const int64_t sect = PackedScaleSection(kT, kb);
  alignas(16) float fsum[MR][16] = {};
  int row_of[MR];
  for (int i = 0; i < MR; ++i) row_of[i] = std::min(i, rows - 1);
  for (int64_t b = b0; b < b1; ++b) {
    const NeonWeights<kT> wt(w + sect + b * kQB);
    const float* wsb = ws + (b - b0) * kV * 16;
    // xp[p][c]: values 8c..8c+7 of rows 2p and 2p + 1 (one smmla operand).
    int8x16_t xp[MP][4];
    const NeonXAux* ax[MR];
    ESTREAM_NEON_UNROLL
    for (int i = 0; i < MR; ++i) ax[i] = aux + row_of[i] * kb + b;
    ESTREAM_NEON_UNROLL
    for (int p = 0; p < MP; ++p) {
      const int8_t* qa = x[row_of[2 * p] * kb + b].qs;
      const int8_t* qb = x[row_of[2 * p + 1] * kb + b].qs;
      ESTREAM_NEON_UNROLL
      for (int c = 0; c < 2; ++c) {
        const int64x2_t a = vreinterpretq_s64_s8(vld1q_s8(qa + 16 * c));
        const int64x2_t bb = vreinterpretq_s64_s8(vld1q_s8(qb + 16 * c));
        xp[p][2 * c] = vreinterpretq_s8_s64(vzip1q_s64(a, bb));
        xp[p][2 * c + 1] = vreinterpretq_s8_s64(vzip2q_s64(a, bb));
      }
    }
    ESTREAM_NEON_UNROLL
    for (int h = 0; h < kHalves; ++h) {
      // acc[p][j]: rows (2p, 2p + 1) of X x weight rows (2j, 2j + 1): [a w0, a w1, b w0, b w1].
      int32x4_t acc[MP][8];
      ESTREAM_NEON_UNROLL
      for (int p = 0; p < MP; ++p) {
        const int32_t ba = h == 0 ? ax[2 * p]->b0 : ax[2 * p]->b1;
        const int32_t bbias = h == 0 ? ax[2 * p + 1]->b0 : ax[2 * p + 1]->b1;
        const int32x4_t bias = vcombine_s32(vdup_n_s32(ba), vdup_n_s32(bbias));
        ESTREAM_NEON_UNROLL
        for (int j = 0; j < 8; ++j) acc[p][j] = bias;
      }
      // One k-step pair: weight vectors of steps s, s + 1 (from `load`), activation chunk c.
      auto step_pair = [&](int s, int c, auto load) {
        ESTREAM_NEON_UNROLL
        for (int g = 0; g < 4; ++g) {
          const int32x4_t v0 = vreinterpretq_s32_s8(load(s, g));
          const int32x4_t v1 = vreinterpretq_s32_s8(load(s + 1, g));
          const int8x16_t w01 = vreinterpretq_s8_s32(vzip1q_s32(v0, v1));  // rows 4g, 4g + 1
          const int8x16_t w23 = vreinterpretq_s8_s32(vzip2q_s32(v0, v1));  // rows 4g + 2, 4g + 3
          ESTREAM_NEON_UNROLL
          for (int p = 0; p < MP; ++p) {
            acc[p][2 * g] = vmmlaq_s32(acc[p][2 * g], xp[p][c], w01);
            acc[p][2 * g + 1] = vmmlaq_s32(acc[p][2 * g + 1], xp[p][c], w23);
          }
        }
      };
      if constexpr (PackedNibbles(kT) && kHalves == 1) {
        ESTREAM_NEON_UNROLL
        for (int s = 0; s < 4; s += 2) {
          step_pair(s, s / 2, [&](int ss, int g) { return wt.Lo(ss, g); });
          step_pair(s, 2 + s / 2, [&](int ss, int g) { return wt.Hi(ss, g); });
        }
      } else if constexpr (PackedNibbles(kT)) {
        ESTREAM_NEON_UNROLL
        for (int s = 0; s < 4; s += 2) {
          if (h == 0) step_pair(s, s / 2, [&](int ss, int g) { return wt.Lo(ss, g); });
          else step_pair(s, 2 + s / 2, [&](int ss, int g) { return wt.Hi(ss, g); });
        }
      } else {
        constexpr int kSteps = kHalves == 2 ? 4 : 8;
        ESTREAM_NEON_UNROLL
        for (int s0 = 0; s0 < kSteps; s0 += 2) {
          const int s = h * 4 + s0;
          step_pair(s, s / 2, [&](int ss, int g) { return wt.Bytes(ss, g); });
        }
      }
      // Back to rows of X x 4 weight rows: [a w4g..a w4g+3] and [b w4g..b w4g+3].
      int32x4_t iacc[MR][4];
      ESTREAM_NEON_UNROLL
      for (int p = 0; p < MP; ++p)
        ESTREAM_NEON_UNROLL
        for (int g = 0; g < 4; ++g) {
          const int64x2_t r0 = vreinterpretq_s64_s32(acc[p][2 * g]);
          const int64x2_t r1 = vreinterpretq_s64_s32(acc[p][2 * g + 1]);
          iacc[2 * p][g] = vreinterpretq_s32_s64(vzip1q_s64(r0, r1));
          iacc[2 * p + 1][g] = vreinterpretq_s32_s64(vzip2q_s64(r0, r1));
        }
      NeonScaleInto<MR>(iacc, wsb + h * 16, ax, fsum);
    }
    if constexpr (PackedHasMin(kT)) NeonMinsInto<kT, MR>(wsb, ax, fsum);
  }
  NeonStoreTile<MR>(fsum, rows, y, ldy, lo, hi, accumulate);
}
#endif

// Rows [0, mr) (mr <= kNeonMr<L>) of a row tile.
template <QuantType kT, NeonLevel L, int MR = kNeonMr<L>>
void NeonMicroAny(int mr, const uint8_t* w, const float* ws, const BlockQ8A* x, const NeonXAux* aux, int64_t kb,
                  int64_t b0, int64_t b1, float* y, int64_t ldy, int lo, int hi, bool acc) {
#if defined(__ARM_FEATURE_MATMUL_INT8)
  if constexpr (L == NeonLevel::kI8mm) {
    if (mr > 2) return NeonMicroMmla<kT, 2>(w, ws, x, aux, kb, b0, b1, y, ldy, mr, lo, hi, acc);
    return NeonMicroMmla<kT, 1>(w, ws, x, aux, kb, b0, b1, y, ldy, mr, lo, hi, acc);
  } else
#endif
  {
    if constexpr (MR > 1) {
      if (mr < MR) return NeonMicroAny<kT, L, MR - 1>(mr, w, ws, x, aux, kb, b0, b1, y, ldy, lo, hi, acc);
    }
    return NeonMicro<kT, MR, L>(w, ws, x, aux, kb, b0, b1, y, ldy, lo, hi, acc);
  }
}

// Columns [n_begin, n_end) of y from `count` packed panels at w, the first holding columns
// [16 p0, 16 p0 + 16).
template <QuantType kT, NeonLevel L>
void NeonDrive(const uint8_t* w, int64_t p0, int64_t count, int64_t panel_stride, const BlockQ8A* xq,
               const NeonXAux* aux, int64_t m, int64_t kb, float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  constexpr int kMr = kNeonMr<L>;
  constexpr int kV = kNeonScaleVecs<kT>;
  constexpr int64_t kc =
      std::max<int64_t>(1, kNeonKcBytes / (PackedScaleBytes(kT) + PackedQuantBytes(kT) + PackedSuperBytes(kT) / 8));
  thread_local std::vector<float> ws_buf;
  if (ws_buf.size() < static_cast<size_t>(kc * kV * 16)) ws_buf.resize(static_cast<size_t>(kc * kV * 16));
  float* ws = ws_buf.data();
  for (int64_t g = 0; g < count; ++g) {
    const int64_t col0 = (p0 + g) * kPackRows;
    const int lo = static_cast<int>(std::max<int64_t>(0, n_begin - col0));
    const int hi = static_cast<int>(std::min<int64_t>(kPackRows, n_end - col0));
    const uint8_t* wp = w + g * panel_stride;
    for (int64_t c0 = 0; c0 < kb; c0 += kc) {
      const int64_t c1 = std::min(kb, c0 + kc);
      NeonPanelScales<kT>(wp, kb, c0, c1, ws);
      for (int64_t i = 0; i < m; i += kMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, m - i));
        NeonMicroAny<kT, L>(mr, wp, ws, xq + i * kb, aux + i * kb, kb, c0, c1, y + i * ldy + col0, ldy, lo, hi,
                            c0 > 0);
      }
    }
  }
}

// kSrc: the GGUF type of the weights (the kernels run its packed format, PackedFormat(kSrc)).
template <QuantType kSrc, bool kPacked, NeonLevel L>
void GemmNeon(const WeightView& w, const BlockQ8A* xq, int64_t m, int64_t n_begin, int64_t n_end, float* y,
              int64_t ldy) {
  constexpr QuantType kT = PackedFormat(kSrc);
  if (m <= 0 || n_begin >= n_end) return;
  const int64_t kb = w.k / 32;
  const int64_t mc = std::min(m, kNeonMc);
  thread_local std::vector<NeonXAux> aux;
  if (aux.size() < static_cast<size_t>(mc * kb)) aux.resize(static_cast<size_t>(mc * kb));
  const int64_t panel_stride = PackedPanelBytes(kT, w.k);
  const int64_t p_first = n_begin / kPackRows, p_last = (n_end - 1) / kPackRows;
  auto rows_pass = [&](const uint8_t* wp, int64_t p, int64_t count, int64_t i0, int64_t rows) {
    NeonBuildAux<kT>(xq + i0 * kb, rows * kb, aux.data());
    NeonDrive<kT, L>(wp, p, count, panel_stride, xq + i0 * kb, aux.data(), rows, kb, y + i0 * ldy, ldy, n_begin,
                     n_end);
  };
  if constexpr (kPacked) {
    for (int64_t i0 = 0; i0 < m; i0 += kNeonMc)
      rows_pass(static_cast<const uint8_t*>(w.data) + p_first * panel_stride, p_first, p_last - p_first + 1, i0,
                std::min(kNeonMc, m - i0));
    return;
  }
  // GGUF rows: pack one panel at a time into a per-thread buffer, then every row pass.
  uint8_t* const buf = PanelPackBuffer(static_cast<size_t>(panel_stride));
  const size_t row_bytes = RowBytes(kSrc, w.k);
  for (int64_t p = p_first; p <= p_last; ++p) {
    const int64_t r0 = p * kPackRows;
    const int rows = static_cast<int>(std::min<int64_t>(kPackRows, w.n - r0));
    PackPanel(kSrc, static_cast<const uint8_t*>(w.data) + r0 * row_bytes, row_bytes, rows, w.k, buf);
    for (int64_t i0 = 0; i0 < m; i0 += kNeonMc) rows_pass(buf, p, 1, i0, std::min(kNeonMc, m - i0));
  }
}

template <NeonLevel L, QuantType... kSrc>
void NeonFillQuantTypes(KernelTable* t) {
  ((t->SetQuant(kSrc, false, GemmNeon<kSrc, false, L>), t->SetQuant(kSrc, true, GemmNeon<kSrc, true, L>)), ...);
}

// Every quantised GEMM type (dispatch.h kGemmQuantTypes) at level L.
template <NeonLevel L>
void NeonFillQuant(KernelTable* t) {
  NeonFillQuantTypes<L, QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ6_K, QuantType::kQ4_1,
                     QuantType::kQ5_0, QuantType::kQ5_1, QuantType::kQ5_K, QuantType::kQ3_K, QuantType::kQ2_K,
                     QuantType::kIQ4_NL, QuantType::kIQ4_XS, QuantType::kMXFP4>(t);
}

}  // namespace
}  // namespace estream::kernels

#undef ESTREAM_NEON_UNROLL
