// AVX-512 VNNI GEMM kernels: quantised weights x Q8A activations with vpdpbusd on zmm (and, for
// row tiles of 16 where the CPU has AMX-INT8, the tile path of gemm_amx.cc), float weights with
// fp32 FMA, and the Q8A quantiser.
//
// Quantised path. Weights are in the packed layout of repack.h (GGUF-layout weights are packed
// on the fly, one group of panels at a time, into a per-thread 64-byte aligned buffer). The
// micro-kernel computes a tile of 4 rows of X x 3 panels (48 weight rows) over a range of
// 32-value blocks: per block, 12 int32 accumulators start at the activation bias -Z * sum(x)
// and take 8 vpdpbusd steps (16 rows x 4 values of W against 4 broadcast bytes of X); the
// block's exact int32 dot is then converted and multiplied into 12 fp32 accumulators by
// d_w * d_x (3 vector ops per 8 vpdpbusd: the bound on this kernel, about 8/11 of the peak).
// Loop nest per thread: passes of up to kMc rows of X > (Drive) panel groups > k chunks (kKcBytes of the group's weights, which
// stay in L1 while every X row tile streams past them from L2; the group's y columns stay in L2
// across chunks) > X row tiles. Partial sums of consecutive k chunks are added to y in chunk
// order; the chunk size depends only on the weight type and both the vpdpbusd and the AMX path
// perform the same fp32 operations per output, so every thread split (and every assignment of
// rows to AMX or vpdpbusd) gives bit-identical results.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/fp16.h"
#include "base/memory.h"
#include "kernels/dispatch.h"
#include "kernels/repack.h"
#include "kernels/x86_avx512/gemm_avx512.h"
#include "kernels/x86_avx512/gemm_avx512_scales.h"
#include "quant/quant.h"

// GCC 12 reports the _mm512_undefined_* operand inside the masked-load intrinsics as
// uninitialised (a false positive: masked-off lanes are zeroed or never read).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace estream::kernels {
namespace {

constexpr int kKcBytes = 24 * 1024;  // bytes of one panel group's k chunk kept in L1

template <QuantType kT>
void BuildAux(const BlockQ8A* xq, int64_t count, XAux* aux) {
  const int z = ZeroPoint(kT);
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

// One micro-tile: rows [0, MR) of x (row i at x + i * kb, aux likewise), NV panels starting at
// w (panel j at w + j * panel_stride, its scale vectors in ws as PanelScales wrote them for
// blocks [b0, b1)), blocks [b0, b1). Writes (or, with accumulate, adds to)
// y[i * ldy + 16 * j + r] for the lanes set in mask[j]. With more than 12 accumulators the fp32
// sums live in an L1 buffer instead of registers, so that the int32 accumulators, the weight
// vectors and the broadcast fit the 32 zmm registers.
template <QuantType kT, int MR, int NV>
void Micro(const uint8_t* w, int64_t panel_stride, const float* ws, const BlockQ8A* x, const XAux* aux, int64_t kb,
           int64_t b0, int64_t b1, float* y, int64_t ldy, const __mmask16* mask, bool accumulate) {
  constexpr int kQB = PackedQuantBytes(kT);
  const int64_t sect = PackedScaleSection(kT, kb);
  constexpr bool kMem = MR * NV > 12;
  __m512 facc[kMem ? 1 : MR][kMem ? 1 : NV];
  alignas(64) float fmem[kMem ? MR : 1][kMem ? NV : 1][16];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      if constexpr (kMem) _mm512_store_ps(fmem[i][j], _mm512_setzero_ps());
      else facc[i][j] = _mm512_setzero_ps();
    }
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  constexpr int kV = kScaleVecs<kT>;
  constexpr int kHalves = PackedHalves(kT);
  constexpr bool kLut = PackedIsLut(kT);
  // The table types' 16 u8 values in every 128-bit lane, for vpshufb on the 4-bit codes.
  const __m512i lut = kLut ? _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(PackedLut(kT))))
                           : _mm512_setzero_si512();
  const int64_t nbc = b1 - b0;

  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* wq = w + sect + b * kQB;  // quant block b (panel 0)
    const float* wsb = ws + (b - b0) * kV * 16;  // its scale vectors (panel 0)
#pragma GCC unroll 2
    for (int h = 0; h < kHalves; ++h) {
      __m512i iacc[MR][NV];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512i bias = _mm512_set1_epi32(h == 0 ? aux[i * kb + b].b0 : aux[i * kb + b].b1);
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) iacc[i][j] = bias;
      }
      if constexpr (PackedNibbles(kT) && kHalves == 1) {
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
          __m512i lo[NV], hi[NV];
#pragma GCC unroll 8
          for (int j = 0; j < NV; ++j) {
            const __m512i v = _mm512_loadu_si512(wq + j * panel_stride + 64 * s);
            lo[j] = _mm512_and_si512(v, low4);
            hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            if constexpr (kLut) {
              lo[j] = _mm512_shuffle_epi8(lut, lo[j]);
              hi[j] = _mm512_shuffle_epi8(lut, hi[j]);
            }
          }
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const __m512i xl = _mm512_set1_epi32(Load4(x[i * kb + b].qs + 4 * s));
            const __m512i xh = _mm512_set1_epi32(Load4(x[i * kb + b].qs + 16 + 4 * s));
#pragma GCC unroll 8
            for (int j = 0; j < NV; ++j) {
              iacc[i][j] = _mm512_dpbusd_epi32(iacc[i][j], lo[j], xl);
              iacc[i][j] = _mm512_dpbusd_epi32(iacc[i][j], hi[j], xh);
            }
          }
        }
      } else if constexpr (PackedNibbles(kT)) {
        // Two halves in nibbles (Q3_K, Q2_K): half 0 is the low nibbles (values 0..15), half 1
        // the high ones (values 16..31), each with its own scale.
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
          __m512i wv[NV];
#pragma GCC unroll 8
          for (int j = 0; j < NV; ++j) {
            const __m512i v = _mm512_loadu_si512(wq + j * panel_stride + 64 * s);
            wv[j] = _mm512_and_si512(h == 0 ? v : _mm512_srli_epi16(v, 4), low4);
          }
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const __m512i xv = _mm512_set1_epi32(Load4(x[i * kb + b].qs + 16 * h + 4 * s));
#pragma GCC unroll 8
            for (int j = 0; j < NV; ++j) iacc[i][j] = _mm512_dpbusd_epi32(iacc[i][j], wv[j], xv);
          }
        }
      } else {
        constexpr int kSteps = kHalves == 2 ? 4 : 8;
#pragma GCC unroll 8
        for (int s0 = 0; s0 < kSteps; ++s0) {
          const int s = h * 4 + s0;
          __m512i wv[NV];
#pragma GCC unroll 8
          for (int j = 0; j < NV; ++j) wv[j] = _mm512_loadu_si512(wq + j * panel_stride + 64 * s);
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const __m512i xv = _mm512_set1_epi32(Load4(x[i * kb + b].qs + 4 * s));
#pragma GCC unroll 8
            for (int j = 0; j < NV; ++j) iacc[i][j] = _mm512_dpbusd_epi32(iacc[i][j], wv[j], xv);
          }
        }
      }
      __m512 dw[NV];
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) dw[j] = _mm512_load_ps(wsb + (j * nbc * kV + h) * 16);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 dx = _mm512_set1_ps(aux[i * kb + b].dx);
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) {
          const __m512 t = _mm512_cvtepi32_ps(iacc[i][j]);
          const __m512 sc = _mm512_mul_ps(dw[j], dx);
          if constexpr (kMem) _mm512_store_ps(fmem[i][j], _mm512_fmadd_ps(t, sc, _mm512_load_ps(fmem[i][j])));
          else facc[i][j] = _mm512_fmadd_ps(t, sc, facc[i][j]);
        }
      }
    }
    if constexpr (PackedHasMin(kT)) {
#pragma GCC unroll 2
      for (int h = 0; h < kHalves; ++h) {
        __m512 mv[NV];
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) mv[j] = _mm512_load_ps(wsb + (j * nbc * kV + kHalves + h) * 16);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512 dxs = _mm512_set1_ps(h == 0 ? aux[i * kb + b].dxs : aux[i * kb + b].dxs1);
#pragma GCC unroll 8
          for (int j = 0; j < NV; ++j) {
            if constexpr (kMem) _mm512_store_ps(fmem[i][j], _mm512_fmadd_ps(mv[j], dxs, _mm512_load_ps(fmem[i][j])));
            else facc[i][j] = _mm512_fmadd_ps(mv[j], dxs, facc[i][j]);
          }
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      float* out = y + i * ldy + 16 * j;
      __m512 v;
      if constexpr (kMem) v = _mm512_load_ps(fmem[i][j]);
      else v = facc[i][j];
      if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask[j], out), v);
      _mm512_mask_storeu_ps(out, mask[j], v);
    }
}

// Tile shape per weight type (rows of X x panels of 16 weight rows). 4 x 3 keeps the 12 int32
// and 12 fp32 accumulators in registers; 12 independent vpdpbusd chains cover its latency at two
// per cycle. Measured alternatives (6x2, 3x4, and 6x3 / 5x4 / 8x3 / 4x4 with fp32 sums in L1)
// were no faster: the per-block epilogue (convert, scale, add: 3 ops per 8 vpdpbusd) bounds
// every shape at about 8/11 of the vpdpbusd peak.
template <QuantType kT>
struct Tile {
  static constexpr int kMr = 4;
  static constexpr int kNv = 3;
};

template <QuantType kT, int MR>
void MicroNv(int nv, const uint8_t* w, int64_t ps, const float* ws, const BlockQ8A* x, const XAux* aux, int64_t kb,
             int64_t b0, int64_t b1, float* y, int64_t ldy, const __mmask16* mask, bool acc) {
  constexpr int kNv = Tile<kT>::kNv;
  if constexpr (kNv >= 4) if (nv == 3) return Micro<kT, MR, 3>(w, ps, ws, x, aux, kb, b0, b1, y, ldy, mask, acc);
  if constexpr (kNv >= 3) if (nv == 2) return Micro<kT, MR, 2>(w, ps, ws, x, aux, kb, b0, b1, y, ldy, mask, acc);
  if constexpr (kNv >= 2) if (nv == 1) return Micro<kT, MR, 1>(w, ps, ws, x, aux, kb, b0, b1, y, ldy, mask, acc);
  return Micro<kT, MR, kNv>(w, ps, ws, x, aux, kb, b0, b1, y, ldy, mask, acc);
}

template <QuantType kT, int MR = Tile<kT>::kMr>
void MicroAny(int mr, int nv, const uint8_t* w, int64_t ps, const float* ws, const BlockQ8A* x, const XAux* aux,
              int64_t kb, int64_t b0, int64_t b1, float* y, int64_t ldy, const __mmask16* mask, bool acc) {
  if constexpr (MR > 1) {
    if (mr < MR) return MicroAny<kT, MR - 1>(mr, nv, w, ps, ws, x, aux, kb, b0, b1, y, ldy, mask, acc);
  }
  return MicroNv<kT, MR>(nv, w, ps, ws, x, aux, kb, b0, b1, y, ldy, mask, acc);
}

inline __mmask16 ColumnMask(int64_t col0, int64_t n_begin, int64_t n_end) {
  uint32_t m = 0;
  for (int r = 0; r < 16; ++r)
    if (col0 + r >= n_begin && col0 + r < n_end) m |= 1u << r;
  return static_cast<__mmask16>(m);
}

// Blocks per k chunk for type kT: a group of kNv panels' chunk is about kKcBytes.
template <QuantType kT>
constexpr int64_t KcBlocks() {
  constexpr int kNv = Tile<kT>::kNv;
  constexpr int64_t bb = PackedScaleBytes(kT) + PackedQuantBytes(kT) + PackedSuperBytes(kT) / 8;
  return std::max<int64_t>(1, kKcBytes / (kNv * bb));
}

// Software prefetch (to L2) of the weights of one k chunk of up to 3 panels: their quant blocks
// and block scale entries, walked a few cache lines per Step.
class NextChunkPrefetch {
 public:
  template <QuantType kT>
  void Set(const uint8_t* w, int64_t nv, int64_t panel_stride, int64_t kb, int64_t b0, int64_t b1) {
    for (int64_t j = 0; j < nv && n_ + 2 <= kMaxRanges; ++j) {
      const uint8_t* p = w + j * panel_stride;
      Add(p + PackedScaleSection(kT, kb) + b0 * PackedQuantBytes(kT), (b1 - b0) * PackedQuantBytes(kT));
      Add(p + PackedBlockScaleOffset(kT, kb) + b0 * PackedScaleBytes(kT), (b1 - b0) * PackedScaleBytes(kT));
    }
  }
  int64_t Lines() const { return total_; }
  void Step(int64_t lines) {
    for (; lines > 0 && r_ < n_; --lines) {
      _mm_prefetch(reinterpret_cast<const char*>(begin_[r_] + 64 * at_), _MM_HINT_T1);
      if (++at_ == lines_[r_]) {
        at_ = 0;
        ++r_;
      }
    }
  }

 private:
  static constexpr int kMaxRanges = 8;
  void Add(const uint8_t* p, int64_t bytes) {
    if (bytes <= 0) return;
    begin_[n_] = p;
    lines_[n_] = (bytes + 63) / 64;
    total_ += lines_[n_];
    ++n_;
  }
  const uint8_t* begin_[kMaxRanges] = {};
  int64_t lines_[kMaxRanges] = {};
  int n_ = 0, r_ = 0;
  int64_t at_ = 0, total_ = 0;
};

// Computes columns [n_begin, n_end) of y (rows [0, m)) from `count` packed panels at `w`, the
// first of which holds columns [16 * p0, 16 * p0 + 16). With kAmx, groups are 2 panels and row
// tiles of 32 (then 16) rows go to the AMX path, the remaining rows to vpdpbusd.
template <QuantType kT, bool kAmx>
void Drive(const uint8_t* w, int64_t p0, int64_t count, int64_t panel_stride, const BlockQ8A* xq, const XAux* aux,
           const AmxX& xa, int64_t amx_rows, int64_t m, int64_t kb, float* y, int64_t ldy, int64_t n_begin,
           int64_t n_end) {
  constexpr int64_t kc = KcBlocks<kT>();
  constexpr int kMr = Tile<kT>::kMr;
  constexpr int kGroup = kAmx ? 2 : Tile<kT>::kNv;
  const bool amx = kAmx && amx_rows > 0;
  const int64_t amx_tiles = (amx_rows + 15) / 16;
  int8_t* bt = nullptr;
  if (amx) {
    thread_local AlignedPtr<int8_t> tiles;
    if (tiles == nullptr) {
      tiles.reset(static_cast<int8_t*>(AlignedAlloc(64, 2 * kc * 512)));
      ESTREAM_CHECK(tiles != nullptr, "GEMM: out of memory for the AMX tile buffer");
    }
    bt = tiles.get();
    AmxBegin();
  }
  thread_local AlignedPtr<float> scales;  // PanelScales of one group's k chunk
  if (scales == nullptr) {
    scales.reset(static_cast<float*>(AlignedAlloc(64, Tile<kT>::kNv * kc * kMaxScaleVecs * 16 * sizeof(float))));
    ESTREAM_CHECK(scales != nullptr, "GEMM: out of memory for the weight scale buffer");
  }
  for (int64_t g = 0; g < count; g += kGroup) {
    const int nv = static_cast<int>(std::min<int64_t>(kGroup, count - g));
    __mmask16 mask[kGroup];
    for (int j = 0; j < nv; ++j) mask[j] = ColumnMask((p0 + g + j) * kPackRows, n_begin, n_end);
    const uint8_t* wg = w + g * panel_stride;
    float* yg = y + (p0 + g) * kPackRows;
    for (int64_t c0 = 0; c0 < kb; c0 += kc) {
      const int64_t c1 = std::min(kb, c0 + kc);
      // The next k chunk of weights (this group's, or the next group's first) is fetched into
      // L2 a slice per row tile, so that its first row tile does not wait on DRAM. (With few
      // rows the loop is a plain stream that the hardware prefetchers follow.)
      NextChunkPrefetch pf;
      if (m < 16) {
      } else if (c1 < kb) pf.Set<kT>(wg, std::min<int64_t>(nv, count - g), panel_stride, kb, c1, std::min(kb, c1 + kc));
      else if (g + kGroup < count)
        pf.Set<kT>(wg + kGroup * panel_stride, std::min<int64_t>(kGroup, count - g - kGroup), panel_stride, kb, 0,
                   std::min(kb, kc));
      const int64_t tiles = (m + kMr - 1) / kMr;
      const int64_t lines_per_tile = (pf.Lines() + tiles - 1) / tiles;
      int64_t i = 0;
      PanelScales<kT>(wg, panel_stride, nv, kb, c0, c1, scales.get());
      if (amx) {
        AmxUnpack(kT, wg, panel_stride, kb, nv, c0, c1, bt);
        for (int64_t tile = 0; tile < amx_tiles; tile += 2) {
          const int xt = static_cast<int>(std::min<int64_t>(2, amx_tiles - tile));
          pf.Step(lines_per_tile * 4 * xt);
          const AmxX xi{xa.q + tile * kb * 512, xa.dx + tile * kb * 16,
                        xa.dxs == nullptr ? nullptr : xa.dxs + tile * kb * 16};
          const int last_rows = static_cast<int>(std::min<int64_t>(16, amx_rows - (tile + xt - 1) * 16));
          AmxTiles(kT, bt, scales.get(), nv, xi, kb, c0, c1, xt, last_rows, yg + tile * 16 * ldy, ldy, mask, c0 > 0);
        }
        i = amx_rows;
      }
      for (; i < m; i += kMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, m - i));
        pf.Step(lines_per_tile);
        MicroAny<kT>(mr, nv, wg, panel_stride, scales.get(), xq + i * kb, aux + i * kb, kb, c0, c1, yg + i * ldy,
                     ldy, mask, c0 > 0);
      }
    }
  }
  if (amx) AmxEnd();
}

// Rows of X per pass over the weights. A pass's X rows (1.25 bytes per value) and their XAux
// (0.5 bytes per value) are re-read for every panel group, so they should stay in L2 (2 MiB per
// core here) while the weights stream through it: about 512 KiB of them (measured better than
// 1 MiB for weights that stay in L2/L3; software prefetch of the next row tile instead was slower),
// or 1 MiB when this call's weights exceed 12 MiB: each pass streams all of them once, and for the
// 4096 x 14336 shapes fewer passes measured 5-25% faster (2 threads, Q4_0 / Q8_0 / Q6_K, M = 256
// and 1024), while 2048 x 4096 (4.5-9 MiB, from L3) measured up to 20% slower with them. At least
// 64 rows, at most 512; multiples of 32 (the AMX row tile pair).
inline int64_t RowsPerPass(int64_t k, int64_t weight_bytes) {
  const int64_t x_bytes = weight_bytes > (int64_t{12} << 20) ? int64_t{1} << 20 : int64_t{512} << 10;
  const int64_t rows = x_bytes * 4 / (7 * k);
  return std::clamp<int64_t>(rows / 32 * 32, 64, 512);
}

// kSrc: the GGUF type of the weights (the kernels run its packed format, PackedFormat(kSrc)).
template <QuantType kSrc, bool kPacked, bool kAmx>
void GemmAvx512(const WeightView& w, const BlockQ8A* xq, int64_t m, int64_t n_begin, int64_t n_end, float* y,
                int64_t ldy) {
  constexpr QuantType kT = PackedFormat(kSrc);
  if (m <= 0 || n_begin >= n_end) return;
  const int64_t kb = w.k / 32;
  const int64_t panel_stride = PackedPanelBytes(kT, w.k);
  const int64_t p_first = n_begin / kPackRows, p_last = (n_end - 1) / kPackRows;
  const int64_t kMc = RowsPerPass(w.k, (p_last - p_first + 1) * panel_stride);
  const int64_t mc = std::min(m, kMc);
  thread_local std::vector<XAux> aux;
  if (aux.size() < static_cast<size_t>(mc * kb)) aux.resize(static_cast<size_t>(mc * kb));
  constexpr int kNv = Tile<kT>::kNv;
  // Rows [i0, i0 + rows) against `count` panels at wp (the first is panel p).
  // AMX: the pass's full row tiles in the A-tile layout (AmxX), per thread, grown once.
  thread_local AlignedPtr<int8_t> amx_q;
  thread_local AlignedPtr<float> amx_d;
  thread_local int64_t amx_blocks = 0;
  if (kAmx && mc >= 16 && amx_blocks < (mc + 15) / 16 * kb) {
    amx_blocks = (mc + 15) / 16 * kb;
    amx_q.reset(static_cast<int8_t*>(AlignedAlloc(64, static_cast<size_t>(amx_blocks) * 512)));
    amx_d.reset(static_cast<float*>(AlignedAlloc(64, static_cast<size_t>(amx_blocks) * 2 * 16 * sizeof(float))));
    ESTREAM_CHECK(amx_q != nullptr && amx_d != nullptr, "GEMM: out of memory for the AMX activation tiles");
  }
  // Rows the AMX path takes get the AmxX layout, the others XAux (Drive indexes aux by the row
  // within the pass). The AMX path takes the full row tiles of passes of at least 16 rows, and
  // the rest too when it is at least kAmxTailRows rows, as one tile padded with zero rows:
  // the padded tile costs about what a full one does, ~100 vector ops per block and panel pair,
  // while vpdpbusd costs ~22 per row (8 int8 dot products and 3 epilogue ops per panel), so the
  // tile is cheaper from 5 rows on. Fused expert operator units (tens of rows each) leave such
  // tails in most calls. Both paths give bit-identical results, so the choice changes nothing else.
  auto rows_pass = [&](const uint8_t* wp, int64_t p, int64_t count, int64_t i0, int64_t rows) {
    constexpr int64_t kAmxTailRows = 5;
    int64_t amx_rows = kAmx && rows >= 16 ? rows / 16 * 16 : 0;
    if (amx_rows > 0 && rows - amx_rows >= kAmxTailRows) amx_rows = rows;
    AmxX xa;
    if (amx_rows > 0) {
      xa = AmxX{amx_q.get(), amx_d.get(), kT == QuantType::kQ4_K ? amx_d.get() + amx_blocks * 16 : nullptr};
      AmxPackX(xq + i0 * kb, kb, amx_rows, amx_q.get(), amx_d.get(), const_cast<float*>(xa.dxs));
    }
    BuildAux<kT>(xq + (i0 + amx_rows) * kb, (rows - amx_rows) * kb, aux.data() + amx_rows * kb);
    Drive<kT, kAmx>(wp, p, count, panel_stride, xq + i0 * kb, aux.data(), xa, amx_rows, rows, kb, y + i0 * ldy, ldy,
                    n_begin, n_end);
  };
  if (kPacked) {
    for (int64_t i0 = 0; i0 < m; i0 += kMc)
      rows_pass(static_cast<const uint8_t*>(w.data) + p_first * panel_stride, p_first, p_last - p_first + 1, i0,
                std::min(kMc, m - i0));
    return;
  }
  // GGUF rows: pack kNv panels at a time into a per-thread buffer, then every row pass.
  uint8_t* const buf = PanelPackBuffer(static_cast<size_t>(kNv * panel_stride));
  const size_t row_bytes = RowBytes(kSrc, w.k);
  for (int64_t p = p_first; p <= p_last; p += kNv) {
    const int64_t count = std::min<int64_t>(kNv, p_last + 1 - p);
    for (int64_t j = 0; j < count; ++j) {
      const int64_t r0 = (p + j) * kPackRows;
      const int rows = static_cast<int>(std::min<int64_t>(kPackRows, w.n - r0));
      PackPanel(kSrc, static_cast<const uint8_t*>(w.data) + r0 * row_bytes, row_bytes, rows, w.k,
                buf + j * panel_stride);
    }
    for (int64_t i0 = 0; i0 < m; i0 += kMc) rows_pass(buf, p, count, i0, std::min(kMc, m - i0));
  }
}

// ---- float weights ---------------------------------------------------------------------------

template <QuantType kT>
inline __m512 LoadW(const void* row, int64_t j, __mmask16 mask) {
  if constexpr (kT == QuantType::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(row) + j);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(row) + j);
    if constexpr (kT == QuantType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// MR rows of x times the 32 columns of a transposed weight panel wt (k x 32 fp32): per k, two
// weight vectors and MR broadcasts feed 2 MR FMAs into 2 MR accumulators (16 at MR = 8).
template <int MR>
void FloatPanelTile(const float* wt, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy, __mmask16 m0,
                    __mmask16 m1) {
  __m512 acc[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m512 w0 = _mm512_load_ps(wt + 32 * kk), w1 = _mm512_load_ps(wt + 32 * kk + 16);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xb = _mm512_set1_ps(x[i * ldx + kk]);
      acc[i][0] = _mm512_fmadd_ps(xb, w0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(xb, w1, acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, m0, acc[i][0]);
    _mm512_mask_storeu_ps(y + i * ldy + 16, m1, acc[i][1]);
  }
}

template <int MR = 8>
void FloatPanelTileAny(int mr, const float* wt, const float* x, int64_t ldx, int64_t k, float* y, int64_t ldy,
                       __mmask16 m0, __mmask16 m1) {
  if constexpr (MR > 1) {
    if (mr < MR) return FloatPanelTileAny<MR - 1>(mr, wt, x, ldx, k, y, ldy, m0, m1);
  }
  FloatPanelTile<MR>(wt, x, ldx, k, y, ldy, m0, m1);
}

// Float weights (small tensors: routers), fp32 FMA throughout, each output summed in k order (so
// results do not depend on how rows and columns are split over threads). Each panel of 32 weight
// rows is first transposed to k x 32 fp32 (F16/BF16 converted once) in a per-thread buffer, then
// every 8 rows of x are multiplied by it with broadcast FMAs (see FloatPanelTile). The previous
// dot-product form (4 x 4 tiles, lanes along k, reduced at the end) re-read x from L3 for every 4
// weight rows: ~4x slower on the Qwen3 router (1024 x 2048 by 128 rows).
template <QuantType kT>
void GemmFloatAvx512(const WeightView& w, const float* x, int64_t ldx, int64_t m, int64_t n_begin, int64_t n_end,
                     float* y, int64_t ldy) {
  const int64_t k = w.k;
  const size_t row_bytes = static_cast<size_t>(k) * (kT == QuantType::kF32 ? 4 : 2);
  const uint8_t* wd = static_cast<const uint8_t*>(w.data);
  float* const wt = FloatPanelBuffer(static_cast<size_t>(k) * 32);
  for (int64_t n0 = n_begin; n0 < n_end; n0 += 32) {
    const int nr = static_cast<int>(std::min<int64_t>(32, n_end - n0));
    // Transpose 16 k-values of 16 rows at a time through an L1 tile (missing rows are zero).
    alignas(64) float tile[16][16];
    for (int j0 = 0; j0 < 32; j0 += 16)
      for (int64_t kk = 0; kk < k; kk += 16) {
        const __mmask16 mask = k - kk >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (k - kk)) - 1);
        for (int j = 0; j < 16; ++j)
          _mm512_store_ps(tile[j], j0 + j < nr ? LoadW<kT>(wd + (n0 + j0 + j) * row_bytes, kk, mask)
                                               : _mm512_setzero_ps());
        const int kn = static_cast<int>(std::min<int64_t>(16, k - kk));
        for (int c = 0; c < kn; ++c) {
          float* dst = wt + (kk + c) * 32 + j0;
          for (int j = 0; j < 16; ++j) dst[j] = tile[j][c];
        }
      }
    const __mmask16 m0 = static_cast<__mmask16>(nr >= 16 ? 0xFFFF : (1u << nr) - 1);
    const __mmask16 m1 = static_cast<__mmask16>(nr <= 16 ? 0 : nr >= 32 ? 0xFFFF : (1u << (nr - 16)) - 1);
    for (int64_t i0 = 0; i0 < m; i0 += 8)
      FloatPanelTileAny(static_cast<int>(std::min<int64_t>(8, m - i0)), wt, x + i0 * ldx, ldx, k,
                        y + i0 * ldy + n0, ldy, m0, m1);
  }
}

// ---- Q8A quantiser (bit-exact with QuantizeRowQ8A) --------------------------------------------

void QuantizeQ8AAvx512(const float* x, BlockQ8A* y, int64_t n) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / kQK8A; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b);
    const __m512 v1 = _mm512_loadu_ps(x + 32 * b + 16);
    const __m512 a = _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1));
    const float amax = _mm512_reduce_max_ps(a);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + 16), _mm512_cvtepi32_epi8(q1));
    y[b].d = d;
    y[b].sum[0] = static_cast<int16_t>(_mm512_reduce_add_epi32(q0));
    y[b].sum[1] = static_cast<int16_t>(_mm512_reduce_add_epi32(q1));
  }
}

// AMX for the formats the tile path handles (AmxHandles: Q4_0, Q8_0 and so Q5_0, Q4_K).
template <bool kAmx, QuantType kSrc>
void SetQuant(KernelTable* t) {
  constexpr bool kA = kAmx && AmxHandles(PackedFormat(kSrc));
  t->SetQuant(kSrc, false, GemmAvx512<kSrc, false, kA>);
  t->SetQuant(kSrc, true, GemmAvx512<kSrc, true, kA>);
}

template <bool kAmx>
void FillQuant(KernelTable* t) {
  SetQuant<kAmx, QuantType::kQ4_0>(t);
  SetQuant<kAmx, QuantType::kQ8_0>(t);
  SetQuant<kAmx, QuantType::kQ4_K>(t);
  SetQuant<kAmx, QuantType::kQ6_K>(t);
  SetQuant<kAmx, QuantType::kQ4_1>(t);
  SetQuant<kAmx, QuantType::kQ5_0>(t);
  SetQuant<kAmx, QuantType::kQ5_1>(t);
  SetQuant<kAmx, QuantType::kQ5_K>(t);
  SetQuant<kAmx, QuantType::kQ3_K>(t);
  SetQuant<kAmx, QuantType::kQ2_K>(t);
  SetQuant<kAmx, QuantType::kIQ4_NL>(t);
  SetQuant<kAmx, QuantType::kIQ4_XS>(t);
  SetQuant<kAmx, QuantType::kMXFP4>(t);
}

}  // namespace

void FillAvx512GemmWith(KernelTable* t, bool use_amx) {
  if (use_amx) FillQuant<true>(t);
  else FillQuant<false>(t);
  t->gemm_f32 = GemmFloatAvx512<QuantType::kF32>;
  t->gemm_f16 = GemmFloatAvx512<QuantType::kF16>;
  t->gemm_bf16 = GemmFloatAvx512<QuantType::kBF16>;
  t->quantize_q8a = QuantizeQ8AAvx512;
}

void FillAvx512Gemm(KernelTable* t) { FillAvx512GemmWith(t, AmxUsable()); }

void RunQ4_0MicroForBench(const uint8_t* w, int64_t k, const BlockQ8A* x, int64_t blocks, int64_t reps, float* y) {
  constexpr QuantType kT = PackedFormat(QuantType::kQ4_0);
  const int64_t kb = k / 32, panel_stride = PackedPanelBytes(kT, k);
  ESTREAM_CHECK(blocks > 0 && blocks <= kb, "RunQ4_0MicroForBench: blocks out of range");
  std::vector<XAux> aux(static_cast<size_t>(4 * kb));
  BuildAux<kT>(x, 4 * kb, aux.data());
  AlignedPtr<float> scales(static_cast<float*>(AlignedAlloc(64, 3 * blocks * kScaleVecs<kT> * 16 * sizeof(float))));
  ESTREAM_CHECK(scales != nullptr, "RunQ4_0MicroForBench: out of memory");
  PanelScales<kT>(w, panel_stride, 3, kb, 0, blocks, scales.get());
  const __mmask16 mask[3] = {0xFFFF, 0xFFFF, 0xFFFF};
  for (int64_t r = 0; r < reps; ++r) {
    Micro<kT, 4, 3>(w, panel_stride, scales.get(), x, aux.data(), kb, 0, blocks, y, 48, mask, false);
    __asm__ volatile("" : : "r"(y) : "memory");  // each call's stores are kept
  }
}

}  // namespace estream::kernels
