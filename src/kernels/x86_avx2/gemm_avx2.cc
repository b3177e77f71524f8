// AVX2 GEMM kernels: quantised weights x Q8A activations on ymm (AVX-VNNI vpdpbusd where the
// CPU has it, else vpmaddubsw + vpmaddwd), float weights with fp32 FMA, and the Q8A quantiser.
//
// Same structure as the AVX-512 kernels (see gemm_avx512.cc): packed layout of repack.h (GGUF
// rows are packed on the fly), per 32-value block an exact int32 dot per output, scaled by
// d_w * d_x into fp32 sums. A packed panel's 64-byte k-step line is two ymm: rows 0..7 and
// rows 8..15. The micro-tile is kMr rows of X x one panel (two ymm halves): 8 int32
// accumulators; the fp32 sums live in an L1 buffer (16 ymm registers do not hold both sets).
// vpmaddubsw saturates at +-32767: the 2- to 6-bit formats (u6 x s8, pairs <= 2 * 63 * 128)
// cannot reach it; Q8_0 (and Q5_0, packed as Q8_0) and the table types take the signed weights
// (stored value xor 0x80 = value - 128) through the sign trick |w| * sign(x, w) (<= 2 * 128 * 127)
// and need no zero-point bias. Without VNNI the unsigned formats also sum several vpmaddubsw
// results in int16 (vpaddw) before one vpmaddwd widens them (kI16Group: 8 for nibbles, 4 for
// 5-bit, 2 for 6-bit values, each within int16 for any int8 x), so a 32-value block of Q4_0 costs 8
// vpmaddubsw + 1 vpmaddwd per accumulator instead of 8 + 8 on the two multiply pipes.
#include "kernels/x86_avx2/gemm_avx2.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/cpu.h"
#include "base/fp16.h"
#include "kernels/repack.h"
#include "quant/quant.h"

namespace estream::kernels {
namespace {

constexpr int kMr = 4;
constexpr int kKcBytes = 24 * 1024;

struct XAux {
  float dx;
  int32_t b0;
  int32_t b1;
  float dxs;
  float dxs1;
};

// Formats whose weights go through vpmaddubsw as signed bytes (the stored value xor 0x80).
template <QuantType kT, bool kVnni>
constexpr bool kSignedWeights = (kT == QuantType::kQ8_0 || PackedIsLut(kT)) && !kVnni;

template <QuantType kT, bool kVnni>
void BuildAux(const BlockQ8A* xq, int64_t count, XAux* aux) {
  // Signed weights (kSignedWeights) have no zero point to remove.
  const int z = kSignedWeights<kT, kVnni> ? 0 : ZeroPoint(kT);
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

inline int32_t Load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline __m256 LoadHalf8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256i U8x8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline __m256i I8x8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }

// d of block b, half h, for rows 8hh..8hh+7 of the panel at p (layout: repack.h); exact fp32
// products as in DequantizeRow. kT is a packed format.
template <QuantType kT>
inline __m256 PanelScale8(const uint8_t* p, int64_t kb, int64_t b, int h, int hh) {
  const uint8_t* blk = p + PackedBlockScaleOffset(kT, kb) + b * PackedScaleBytes(kT);
  const uint8_t* sup = p + (b / 8) * PackedSuperBytes(kT);
  if constexpr (kT == QuantType::kQ4_0 || kT == QuantType::kQ8_0 || kT == QuantType::kIQ4_NL ||
                kT == QuantType::kQ4_1 || kT == QuantType::kQ5_1) {
    return LoadHalf8(blk + 16 * hh);
  } else if constexpr (kT == QuantType::kMXFP4) {
    const __m256i e = U8x8(blk + 8 * hh);
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small));
  } else if constexpr (kT == QuantType::kQ4_K || kT == QuantType::kQ5_K) {
    return _mm256_mul_ps(LoadHalf8(sup + 16 * hh), _mm256_cvtepi32_ps(U8x8(blk + 8 * hh)));
  } else if constexpr (kT == QuantType::kQ2_K) {
    return _mm256_mul_ps(LoadHalf8(sup + 16 * hh), _mm256_cvtepi32_ps(U8x8(blk + 16 * h + 8 * hh)));
  } else if constexpr (kT == QuantType::kIQ4_XS) {
    return _mm256_mul_ps(LoadHalf8(sup + 16 * hh), _mm256_cvtepi32_ps(I8x8(blk + 8 * hh)));
  } else {  // Q6_K, Q3_K
    return _mm256_mul_ps(LoadHalf8(sup + 16 * hh), _mm256_cvtepi32_ps(I8x8(blk + 16 * h + 8 * hh)));
  }
}

// The additive min of block b, half h, rows 8hh..8hh+7 (PackedHasMin formats).
template <QuantType kT>
inline __m256 PanelMin8(const uint8_t* p, int64_t kb, int64_t b, int h, int hh) {
  const uint8_t* blk = p + PackedBlockScaleOffset(kT, kb) + b * PackedScaleBytes(kT);
  const uint8_t* sup = p + (b / 8) * PackedSuperBytes(kT);
  if constexpr (kT == QuantType::kQ4_1 || kT == QuantType::kQ5_1) {
    return LoadHalf8(blk + 32 + 16 * hh);
  } else {
    const uint8_t* m = kT == QuantType::kQ2_K ? blk + 32 + 16 * h : blk + 16;
    return _mm256_mul_ps(LoadHalf8(sup + 32 + 16 * hh), _mm256_cvtepi32_ps(U8x8(m + 8 * hh)));
  }
}

// The largest stored value of an unsigned packed format (vpmaddubsw's u8 operand).
template <QuantType kT>
constexpr int kMaxStored = PackedNibbles(kT)                                   ? 15
                           : kT == QuantType::kQ6_K                            ? 63
                           : kT == QuantType::kQ5_1 || kT == QuantType::kQ5_K ? 31
                                                                               : 255;
// vpmaddubsw results summed in int16 before one vpmaddwd (1: none). Each pair sum is at most
// 2 x kMaxStored x 128 in magnitude (x = -128 included), so kI16Group of them stay within int16.
template <QuantType kT, bool kVnni>
constexpr int kI16Group =
    kVnni || kSignedWeights<kT, kVnni> ? 1 : std::max(1, 32767 / (2 * kMaxStored<kT> * 128));

// acc += dot4(w u8, x s8) per int32 lane.
template <bool kVnni, bool kSignedW>
inline __m256i Dot(__m256i acc, __m256i w, __m256i x) {
  if constexpr (kVnni) {
    return _mm256_dpbusd_avx_epi32(acc, w, x);
  } else {
    __m256i p;
    if constexpr (kSignedW) {
      p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    } else {
      p = _mm256_maddubs_epi16(w, x);
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
}

// Dot number `idx` of `n` into one accumulator (idx and n are constants once the loops unroll):
// with kGroup > 1 the vpmaddubsw results gather in p16 and widen into acc every kGroup dots and
// after the last one.
template <bool kVnni, bool kSignedW, int kGroup>
inline void DotStep(__m256i& acc, __m256i& p16, __m256i w, __m256i x, int idx, int n) {
  if constexpr (kGroup == 1) {
    acc = Dot<kVnni, kSignedW>(acc, w, x);
  } else {
    const __m256i p = _mm256_maddubs_epi16(w, x);
    p16 = idx % kGroup == 0 ? p : _mm256_add_epi16(p16, p);
    // Keeps the sum a chain: GCC's reassociation would otherwise rebalance the kGroup adds into a
    // tree, holding every product of the block at once and spilling most of them to the stack.
    __asm__("" : "+x"(p16));
    if (idx % kGroup == kGroup - 1 || idx == n - 1)
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
  }
}

// MR rows of x x one packed panel at w, blocks [b0, b1); see the AVX-512 Micro.
template <QuantType kT, int MR, bool kVnni>
void Micro(const uint8_t* w, const BlockQ8A* x, const XAux* aux, int64_t kb, int64_t b0, int64_t b1, float* y,
           int64_t ldy, int valid_lo, int valid_hi, bool accumulate) {
  constexpr int kQB = PackedQuantBytes(kT);
  const int64_t sect = PackedScaleSection(kT, kb);
  constexpr bool kSignedW = kSignedWeights<kT, kVnni>;
  constexpr int kHalves = PackedHalves(kT);
  constexpr bool kLut = PackedIsLut(kT);
  constexpr int kGroup = kI16Group<kT, kVnni>;
  alignas(32) float fsum[MR][2][8];
  for (int i = 0; i < MR; ++i)
    for (int hh = 0; hh < 2; ++hh) _mm256_store_ps(fsum[i][hh], _mm256_setzero_ps());
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  // The table types' 16 u8 values in both 128-bit lanes (xor 0x80 when the weights go in signed).
  __m256i lut = _mm256_setzero_si256();
  if constexpr (kLut) {
    lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(PackedLut(kT))));
    if constexpr (kSignedW) lut = _mm256_xor_si256(lut, flip);
  }

  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* wq = w + sect + b * kQB;
    for (int h = 0; h < kHalves; ++h) {
      __m256i iacc[MR][2], p16[MR][2];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m256i bias = _mm256_set1_epi32(h == 0 ? aux[i * kb + b].b0 : aux[i * kb + b].b1);
        iacc[i][0] = bias;
        iacc[i][1] = bias;
      }
      if constexpr (PackedNibbles(kT) && kHalves == 1) {
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
          __m256i lo[2], hi[2];
#pragma GCC unroll 2
          for (int hh = 0; hh < 2; ++hh) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 64 * s + 32 * hh));
            lo[hh] = _mm256_and_si256(v, low4);
            hi[hh] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            if constexpr (kLut) {
              lo[hh] = _mm256_shuffle_epi8(lut, lo[hh]);
              hi[hh] = _mm256_shuffle_epi8(lut, hi[hh]);
            }
          }
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const __m256i xl = _mm256_set1_epi32(Load4(x[i * kb + b].qs + 4 * s));
            const __m256i xh = _mm256_set1_epi32(Load4(x[i * kb + b].qs + 16 + 4 * s));
#pragma GCC unroll 2
            for (int hh = 0; hh < 2; ++hh) {
              DotStep<kVnni, kSignedW, kGroup>(iacc[i][hh], p16[i][hh], lo[hh], xl, 2 * s, 8);
              DotStep<kVnni, kSignedW, kGroup>(iacc[i][hh], p16[i][hh], hi[hh], xh, 2 * s + 1, 8);
            }
          }
        }
      } else if constexpr (PackedNibbles(kT)) {
        // Two halves in nibbles (Q3_K, Q2_K): low nibbles = values 0..15, high = 16..31.
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
          __m256i wv[2];
#pragma GCC unroll 2
          for (int hh = 0; hh < 2; ++hh) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 64 * s + 32 * hh));
            wv[hh] = _mm256_and_si256(h == 0 ? v : _mm256_srli_epi16(v, 4), low4);
          }
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const __m256i xv = _mm256_set1_epi32(Load4(x[i * kb + b].qs + 16 * h + 4 * s));
#pragma GCC unroll 2
            for (int hh = 0; hh < 2; ++hh) DotStep<kVnni, false, kGroup>(iacc[i][hh], p16[i][hh], wv[hh], xv, s, 4);
          }
        }
      } else {
        constexpr int kSteps = kHalves == 2 ? 4 : 8;
#pragma GCC unroll 8
        for (int s0 = 0; s0 < kSteps; ++s0) {
          const int s = h * 4 + s0;
          __m256i wv[2];
#pragma GCC unroll 2
          for (int hh = 0; hh < 2; ++hh) {
            wv[hh] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 64 * s + 32 * hh));
            if constexpr (kSignedW) wv[hh] = _mm256_xor_si256(wv[hh], flip);
          }
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const __m256i xv = _mm256_set1_epi32(Load4(x[i * kb + b].qs + 4 * s));
#pragma GCC unroll 2
            for (int hh = 0; hh < 2; ++hh)
              DotStep<kVnni, kSignedW, kGroup>(iacc[i][hh], p16[i][hh], wv[hh], xv, s0, kSteps);
          }
        }
      }
#pragma GCC unroll 2
      for (int hh = 0; hh < 2; ++hh) {
        const __m256 dw = PanelScale8<kT>(w, kb, b, h, hh);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(aux[i * kb + b].dx));
          _mm256_store_ps(fsum[i][hh],
                          _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[i][hh]), sc, _mm256_load_ps(fsum[i][hh])));
        }
      }
    }
    if constexpr (PackedHasMin(kT)) {
      for (int h = 0; h < kHalves; ++h) {
#pragma GCC unroll 2
        for (int hh = 0; hh < 2; ++hh) {
          const __m256 mv = PanelMin8<kT>(w, kb, b, h, hh);
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const float dxs = h == 0 ? aux[i * kb + b].dxs : aux[i * kb + b].dxs1;
            _mm256_store_ps(fsum[i][hh], _mm256_fmadd_ps(mv, _mm256_set1_ps(dxs), _mm256_load_ps(fsum[i][hh])));
          }
        }
      }
    }
  }
  // A whole panel (the usual case) as two vectors; a matrix's last, partial panel element by element.
  const bool full = valid_lo == 0 && valid_hi == kPackRows;
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* yi = y + i * ldy;
    if (full) {
#pragma GCC unroll 2
      for (int hh = 0; hh < 2; ++hh) {
        const __m256 v = _mm256_load_ps(fsum[i][hh]);
        _mm256_storeu_ps(yi + 8 * hh, accumulate ? _mm256_add_ps(_mm256_loadu_ps(yi + 8 * hh), v) : v);
      }
    } else {
      for (int r = valid_lo; r < valid_hi; ++r) {
        const float v = fsum[i][r / 8][r % 8];
        yi[r] = accumulate ? yi[r] + v : v;
      }
    }
  }
}

template <QuantType kT, bool kVnni, int MR = kMr>
void MicroAny(int mr, const uint8_t* w, const BlockQ8A* x, const XAux* aux, int64_t kb, int64_t b0, int64_t b1,
              float* y, int64_t ldy, int lo, int hi, bool acc) {
  if constexpr (MR > 1) {
    if (mr < MR) return MicroAny<kT, kVnni, MR - 1>(mr, w, x, aux, kb, b0, b1, y, ldy, lo, hi, acc);
  }
  return Micro<kT, MR, kVnni>(w, x, aux, kb, b0, b1, y, ldy, lo, hi, acc);
}

// Columns [n_begin, n_end) of y from `count` packed panels at w, the first holding columns
// [16 * p0, 16 * p0 + 16). Loop order as on AVX-512: panel > k chunk > X row tiles.
template <QuantType kT, bool kVnni>
void Drive(const uint8_t* w, int64_t p0, int64_t count, int64_t panel_stride, const BlockQ8A* xq, const XAux* aux,
           int64_t m, int64_t kb, float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  const int64_t kc = std::max<int64_t>(1, kKcBytes / (PackedScaleBytes(kT) + PackedQuantBytes(kT)));
  for (int64_t g = 0; g < count; ++g) {
    const int64_t col0 = (p0 + g) * kPackRows;
    const int lo = static_cast<int>(std::max<int64_t>(0, n_begin - col0));
    const int hi = static_cast<int>(std::min<int64_t>(kPackRows, n_end - col0));
    for (int64_t c0 = 0; c0 < kb; c0 += kc) {
      const int64_t c1 = std::min(kb, c0 + kc);
      for (int64_t i = 0; i < m; i += kMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, m - i));
        MicroAny<kT, kVnni>(mr, w + g * panel_stride, xq + i * kb, aux + i * kb, kb, c0, c1, y + i * ldy + col0, ldy,
                            lo, hi, c0 > 0);
      }
    }
  }
}

// Rows of X per pass over the weights. A pass's X rows and their XAux (60 bytes per 32 values) are
// re-read for every panel, so they should stay in L2 while the weights stream past them: half of
// this core's L2 (AVX2 hosts have 256 KiB to 1 MiB; Zen 3 512 KiB: 68 rows at k = 2048), or all of
// it when the call's weights exceed 12 MiB (every pass streams all of them once; as the AVX-512
// kernels' RowsPerPass). A fixed 512 rows (the AVX-512 kernels' 2 MiB L2) spilled to L3 at k = 2048:
// OLMoE's expert shapes at M = 1024 took 14-20% longer than with 64 (gemm_bench, Zen 3, 2 threads).
// A multiple of kMr, 32 to 512 rows. Rows are independent: any split gives the same outputs.
int64_t RowsPerPass(int64_t kb, int64_t weight_bytes) {
  static const int64_t l2 = [] {
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? static_cast<int64_t>(v) : int64_t{512} << 10;
  }();
  const int64_t x_bytes = weight_bytes > (int64_t{12} << 20) ? l2 : l2 / 2;
  const int64_t rows = x_bytes / (kb * static_cast<int64_t>(sizeof(BlockQ8A) + sizeof(XAux)));
  return std::clamp<int64_t>(rows / kMr * kMr, 32, 512);
}

// kSrc: the GGUF type of the weights (the kernels run its packed format, PackedFormat(kSrc)).
template <QuantType kSrc, bool kPacked, bool kVnni>
void GemmAvx2(const WeightView& w, const BlockQ8A* xq, int64_t m, int64_t n_begin, int64_t n_end, float* y,
              int64_t ldy) {
  constexpr QuantType kT = PackedFormat(kSrc);
  if (m <= 0 || n_begin >= n_end) return;
  const int64_t kb = w.k / 32;
  const int64_t panel_stride = PackedPanelBytes(kT, w.k);
  const int64_t p_first = n_begin / kPackRows, p_last = (n_end - 1) / kPackRows;
  const int64_t kMc = RowsPerPass(kb, (p_last - p_first + 1) * panel_stride);
  const int64_t mc = std::min(m, kMc);
  thread_local std::vector<XAux> aux;
  if (aux.size() < static_cast<size_t>(mc * kb)) aux.resize(static_cast<size_t>(mc * kb));
  auto rows_pass = [&](const uint8_t* wp, int64_t p, int64_t count, int64_t i0, int64_t rows) {
    BuildAux<kT, kVnni>(xq + i0 * kb, rows * kb, aux.data());
    Drive<kT, kVnni>(wp, p, count, panel_stride, xq + i0 * kb, aux.data(), rows, kb, y + i0 * ldy, ldy, n_begin,
                     n_end);
  };
  if (kPacked) {
    for (int64_t i0 = 0; i0 < m; i0 += kMc)
      rows_pass(static_cast<const uint8_t*>(w.data) + p_first * panel_stride, p_first, p_last - p_first + 1, i0,
                std::min(kMc, m - i0));
    return;
  }
  uint8_t* const buf = PanelPackBuffer(static_cast<size_t>(panel_stride));
  const size_t row_bytes = RowBytes(kSrc, w.k);
  for (int64_t p = p_first; p <= p_last; ++p) {
    const int64_t r0 = p * kPackRows;
    const int rows = static_cast<int>(std::min<int64_t>(kPackRows, w.n - r0));
    PackPanel(kSrc, static_cast<const uint8_t*>(w.data) + r0 * row_bytes, row_bytes, rows, w.k, buf);
    for (int64_t i0 = 0; i0 < m; i0 += kMc) rows_pass(buf, p, 1, i0, std::min(kMc, m - i0));
  }
}

// ---- float weights ---------------------------------------------------------------------------

template <QuantType kT>
inline float LoadW1(const void* row, int64_t j) {
  if constexpr (kT == QuantType::kF32) return static_cast<const float*>(row)[j];
  else if constexpr (kT == QuantType::kF16) return Fp16ToFp32(static_cast<const uint16_t*>(row)[j]);
  else return Bf16ToFp32(static_cast<const uint16_t*>(row)[j]);
}

// MR rows of x times the 16 columns of a transposed weight panel wt (k x 16 fp32): per k, two
// weight vectors and MR broadcasts feed 2 MR FMAs into 2 MR accumulators (12 at MR = 6; with the
// two weights and a broadcast, 15 of the 16 ymm registers). Columns >= nr are not stored.
template <int MR>
void FloatPanelTile(const float* wt, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy, int nr) {
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m256 w0 = _mm256_load_ps(wt + 16 * kk), w1 = _mm256_load_ps(wt + 16 * kk + 8);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 xb = _mm256_broadcast_ss(x + i * ldx + kk);
      acc[i][0] = _mm256_fmadd_ps(xb, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xb, w1, acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (nr == 16) {
      _mm256_storeu_ps(y + i * ldy, acc[i][0]);
      _mm256_storeu_ps(y + i * ldy + 8, acc[i][1]);
    } else {
      alignas(32) float t[16];
      _mm256_store_ps(t, acc[i][0]);
      _mm256_store_ps(t + 8, acc[i][1]);
      std::memcpy(y + i * ldy, t, static_cast<size_t>(nr) * sizeof(float));
    }
  }
}

template <int MR = 6>
void FloatPanelTileAny(int mr, const float* wt, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
                       int nr) {
  if constexpr (MR > 1) {
    if (mr < MR) return FloatPanelTileAny<MR - 1>(mr, wt, x, ldx, k, y, ldy, nr);
  }
  FloatPanelTile<MR>(wt, x, ldx, k, y, ldy, nr);
}

// Float weights (small tensors: routers), as the AVX-512 kernel: fp32 FMA, each output summed in
// k order from zero (so results do not depend on how rows and columns are split over threads, and
// equal the AVX-512 kernel's bit for bit). Each panel of 16 weight rows is first transposed to
// k x 16 fp32 (F16/BF16 converted once) in a per-thread buffer, then every 6 rows of x are
// multiplied by it with broadcast FMAs. The previous dot-product form (2 x 4 tiles, lanes along
// k) re-read x from memory for every 4 weight rows: 4.5x slower at 256 rows (gemm_bench, Zen 3),
// 3.6x on the Qwen3 router in a pass of 8192 rows.
template <QuantType kT>
void GemmFloatAvx2(const WeightView& w, const float* x, int64_t ldx, int64_t m, int64_t n_begin, int64_t n_end,
                   float* y, int64_t ldy) {
  const int64_t k = w.k;
  const size_t row_bytes = static_cast<size_t>(k) * (kT == QuantType::kF32 ? 4 : 2);
  const uint8_t* wd = static_cast<const uint8_t*>(w.data);
  float* const wt = FloatPanelBuffer(static_cast<size_t>(k) * 16);
  for (int64_t n0 = n_begin; n0 < n_end; n0 += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, n_end - n0));
    for (int j = 0; j < 16; ++j) {
      const void* row = wd + (n0 + std::min(j, nr - 1)) * row_bytes;
      for (int64_t kk = 0; kk < k; ++kk) wt[kk * 16 + j] = j < nr ? LoadW1<kT>(row, kk) : 0.0f;
    }
    for (int64_t i0 = 0; i0 < m; i0 += 6)
      FloatPanelTileAny(static_cast<int>(std::min<int64_t>(6, m - i0)), wt, x + i0 * ldx, ldx, k, y + i0 * ldy + n0,
                        ldy, nr);
  }
}

// ---- Q8A quantiser (bit-exact with QuantizeRowQ8A) --------------------------------------------

void QuantizeQ8AAvx2(const float* x, BlockQ8A* y, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / kQK8A; ++b) {
    __m256 v[4];
    for (int q = 0; q < 4; ++q) v[q] = _mm256_loadu_ps(x + 32 * b + 8 * q);
    __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));  // round half to even
    // Pack 32 int32 to int8 (values are within [-127, 127], no saturation), restoring order.
    const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), p);
    const __m256i s01 = _mm256_add_epi32(q[0], q[1]), s23 = _mm256_add_epi32(q[2], q[3]);
    auto hsum = [](__m256i s) {
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
      return _mm_cvtsi128_si32(t);
    };
    y[b].d = d;
    y[b].sum[0] = static_cast<int16_t>(hsum(s01));
    y[b].sum[1] = static_cast<int16_t>(hsum(s23));
  }
}

template <bool kVnni, QuantType... kSrc>
void FillQuantTypes(KernelTable* t) {
  ((t->SetQuant(kSrc, false, GemmAvx2<kSrc, false, kVnni>), t->SetQuant(kSrc, true, GemmAvx2<kSrc, true, kVnni>)),
   ...);
}

template <bool kVnni>
void FillQuant(KernelTable* t) {
  FillQuantTypes<kVnni, QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ6_K, QuantType::kQ4_1,
                 QuantType::kQ5_0, QuantType::kQ5_1, QuantType::kQ5_K, QuantType::kQ3_K, QuantType::kQ2_K,
                 QuantType::kIQ4_NL, QuantType::kIQ4_XS, QuantType::kMXFP4>(t);
}

}  // namespace

void FillAvx2GemmWith(KernelTable* t, bool use_avx_vnni) {
  if (use_avx_vnni) FillQuant<true>(t);
  else FillQuant<false>(t);
  t->gemm_f32 = GemmFloatAvx2<QuantType::kF32>;
  t->gemm_f16 = GemmFloatAvx2<QuantType::kF16>;
  t->gemm_bf16 = GemmFloatAvx2<QuantType::kBF16>;
  t->quantize_q8a = QuantizeQ8AAvx2;
}

void FillAvx2Gemm(KernelTable* t) { FillAvx2GemmWith(t, HostCpuFeatures().avx_vnni); }

}  // namespace estream::kernels
