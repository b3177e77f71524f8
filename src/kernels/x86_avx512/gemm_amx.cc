// AMX-INT8 tile path of the quantised GEMM (see gemm_avx512.h).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "base/cpu.h"
#include "kernels/repack.h"
#include "kernels/x86_avx512/gemm_avx512.h"
#include "kernels/x86_avx512/gemm_avx512_scales.h"

#pragma GCC target("amx-tile,amx-int8")
// GCC 12 reports the _mm512_undefined_* operand inside some intrinsics as uninitialised (a false
// positive, as in gemm_avx512.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace estream::kernels {
namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: request permission for a state component
constexpr long kXfeatureXtiledata = 18;

// Tile registers: C = tmm0, tmm1 (16 x 16 int32, alternating blocks), A = tmm4 (16 rows x 32
// bytes of X), B = tmm6 (8 rows x 64 bytes of W).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

bool ComputeAmxUsable() {
  const char* env = std::getenv("ESTREAM_AMX");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  if (!HostCpuFeatures().amx_int8) return false;
  unsigned int eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  if ((eax & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA enabled by the OS
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

template <QuantType kT>
void Unpack(const uint8_t* w, int64_t panel_stride, int64_t kb, int nv, int64_t b0, int64_t b1, int8_t* dst) {
  constexpr int kQB = PackedQuantBytes(kT);
  const int64_t sect = PackedScaleSection(kT, kb);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i z = _mm512_set1_epi8(static_cast<char>(ZeroPoint(kT)));
  for (int j = 0; j < nv; ++j)
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* q = w + j * panel_stride + sect + b * kQB;
      int8_t* out = dst + (j * (b1 - b0) + (b - b0)) * 512;
      if constexpr (kT == QuantType::kQ8_0) {
        for (int s = 0; s < 8; ++s)
          _mm512_store_si512(out + 64 * s, _mm512_sub_epi8(_mm512_loadu_si512(q + 64 * s), z));
      } else {
        for (int s = 0; s < 4; ++s) {
          const __m512i v = _mm512_loadu_si512(q + 64 * s);
          _mm512_store_si512(out + 64 * s, _mm512_sub_epi8(_mm512_and_si512(v, low4), z));
          _mm512_store_si512(out + 64 * (s + 4),
                             _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), z));
        }
      }
    }
}

// One X tile (16 rows) x one panel over blocks [b0, b1), software-pipelined in three stages:
// in step t the tile unit multiplies block t (into C tile tmm(t % 2)), the tile of block t - 1
// is stored to the L1 buffer c[(t - 1) % 2], and the vector units scale the tile of block t - 2
// (stored one step earlier, so its loads never wait for the tile store) into the 16 fp32 row
// sums f, kept in registers. Per block and row: f = fma(float(I), d_w * d_x, f) (+ Q4_K:
// fma(mneg, d_x * sum, f)), the operations of the vpdpbusd kernel in the same order.
// The fp32 scaling of one stored C tile (block b) into the 16 row sums f (see Tiles). Force-inlined
// into a loop whose f is a local array it fully unrolls, so that f stays in 16 zmm registers
// (captured by a lambda, GCC kept f on the stack: a load and a store per row and block, which made
// the store port, not the vector units, the bound).
// ws: the panel's scale vectors of block b (PanelScales).
template <QuantType kT>
__attribute__((always_inline)) inline void ScaleTile(const int32_t* ct, const float* ws, const float* dxa,
                                                     const float* dxsa, int64_t b, __m512* f) {
  const float* dx = dxa + b * 16;
  const __m512 vdw = _mm512_load_ps(ws);
  __m512 mneg;
  if constexpr (kT == QuantType::kQ4_K) mneg = _mm512_load_ps(ws + 16);
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {
    const __m512 ti = _mm512_cvtepi32_ps(_mm512_load_si512(ct + 16 * r));
    f[r] = _mm512_fmadd_ps(ti, _mm512_mul_ps(vdw, _mm512_set1_ps(dx[r])), f[r]);
    if constexpr (kT == QuantType::kQ4_K) f[r] = _mm512_fmadd_ps(mneg, _mm512_set1_ps(dxsa[b * 16 + r]), f[r]);
  }
}

// One X tile (16 rows) x one panel over blocks [b0, b1), software-pipelined in three stages:
// in step t the tile unit multiplies block t (into C tile tmm(t % 2)), the tile of block t - 1
// is stored to the L1 buffer c[(t - 1) % 2], and the vector units scale the tile of block t - 2
// (stored one step earlier, so its loads never wait for the tile store) into the 16 fp32 row
// sums f, kept in registers. Per block and row: f = fma(float(I), d_w * d_x, f) (+ Q4_K:
// fma(mneg, d_x * sum, f)), the operations of the vpdpbusd kernel in the same order.
template <QuantType kT>
void Tiles(const int8_t* bt, const float* ws, const int8_t* xq, const float* dxa, const float* dxsa, int64_t b0,
           int64_t b1, float* y, int64_t ldy, __mmask16 mask, bool accumulate, int rows) {
  constexpr int kV = kScaleVecs<kT>;
  alignas(64) int32_t c[2][16 * 16];
  __m512 f[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) f[r] = _mm512_setzero_ps();
  const int64_t nb = b1 - b0;
  const int8_t* xb = xq + b0 * 512;
  // Steps in pairs so that the tile register numbers are constants: step t uses C tile t % 2.
  int64_t t = 0;
  for (; t + 1 < nb; t += 2) {
    _tile_zero(0);
    _tile_loadd(4, xb + t * 512, 32);
    _tile_loadd(6, bt + t * 512, 64);
    _tile_dpbssd(0, 4, 6);
    if (t >= 1) _tile_stored(1, c[1], 64);
    if (t >= 2) ScaleTile<kT>(c[0], ws + (t - 2) * kV * 16, dxa, dxsa, b0 + t - 2, f);
    _tile_zero(1);
    _tile_loadd(5, xb + (t + 1) * 512, 32);
    _tile_loadd(7, bt + (t + 1) * 512, 64);
    _tile_dpbssd(1, 5, 7);
    _tile_stored(0, c[0], 64);
    if (t >= 1) ScaleTile<kT>(c[1], ws + (t - 1) * kV * 16, dxa, dxsa, b0 + t - 1, f);
  }
  // Drain: t == nb (even nb) or t == nb - 1 (odd nb: one more block into C tile 0).
  if (t < nb) {
    _tile_zero(0);
    _tile_loadd(4, xb + t * 512, 32);
    _tile_loadd(6, bt + t * 512, 64);
    _tile_dpbssd(0, 4, 6);
    if (t >= 1) _tile_stored(1, c[1], 64);
    if (t >= 2) ScaleTile<kT>(c[0], ws + (t - 2) * kV * 16, dxa, dxsa, b0 + t - 2, f);
    _tile_stored(0, c[0], 64);
    if (t >= 1) ScaleTile<kT>(c[1], ws + (t - 1) * kV * 16, dxa, dxsa, b0 + t - 1, f);
    ScaleTile<kT>(c[0], ws + t * kV * 16, dxa, dxsa, b0 + t, f);
  } else {
    _tile_stored(1, c[1], 64);
    if (nb >= 2) ScaleTile<kT>(c[0], ws + (nb - 2) * kV * 16, dxa, dxsa, b0 + nb - 2, f);
    ScaleTile<kT>(c[1], ws + (nb - 1) * kV * 16, dxa, dxsa, b0 + nb - 1, f);
  }
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {
    if (r >= rows) break;
    float* out = y + r * ldy;
    __m512 v = f[r];
    if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), v);
    _mm512_mask_storeu_ps(out, mask, v);
  }
}

template <QuantType kT>
void TilesAny(int x_tiles, int last_rows, int nv, const int8_t* bt, const float* ws, const AmxX& xa, int64_t kb,
              int64_t b0, int64_t b1, float* y, int64_t ldy, const __mmask16* mask, bool acc) {
  const int64_t nb = b1 - b0;
  for (int j = 0; j < nv; ++j)
    for (int xt = 0; xt < x_tiles; ++xt) {
      Tiles<kT>(bt + j * nb * 512, ws + j * nb * kScaleVecs<kT> * 16, xa.q + xt * kb * 512, xa.dx + xt * kb * 16,
                xa.dxs == nullptr ? nullptr : xa.dxs + xt * kb * 16, b0, b1, y + 16 * xt * ldy + 16 * j, ldy, mask[j],
                acc, xt == x_tiles - 1 ? last_rows : 16);
    }
}

}  // namespace

bool AmxUsable() {
  static const bool usable = ComputeAmxUsable();
  return usable;
}

void AmxBegin() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 4; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  for (int t = 4; t < 6; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 32;
  }
  for (int t = 6; t < 8; ++t) {
    cfg.rows[t] = 8;
    cfg.colsb[t] = 64;
  }
  // GCC 12 does not see ldtilecfg read the whole struct and drops the stores above without this
  // compiler barrier.
  __asm__ volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

void AmxEnd() { _tile_release(); }

void AmxUnpack(QuantType t, const uint8_t* w, int64_t panel_stride, int64_t kb, int nv, int64_t b0, int64_t b1,
               int8_t* dst) {
  switch (t) {
    case QuantType::kQ4_0: return Unpack<QuantType::kQ4_0>(w, panel_stride, kb, nv, b0, b1, dst);
    case QuantType::kQ8_0: return Unpack<QuantType::kQ8_0>(w, panel_stride, kb, nv, b0, b1, dst);
    default: return Unpack<QuantType::kQ4_K>(w, panel_stride, kb, nv, b0, b1, dst);
  }
}

void AmxPackX(const BlockQ8A* x, int64_t kb, int64_t rows, int8_t* q, float* dx, float* dxs) {
  // Row by row (sequential reads of x); the writes of one row tile (kb * 576 bytes) stay in L1.
  const int64_t tiles = (rows + 15) / 16;
  for (int64_t t = 0; t < tiles; ++t)
    for (int r = 0; r < 16; ++r) {
      int8_t* qo = q + t * kb * 512 + 32 * r;
      float* dxo = dx + t * kb * 16 + r;
      if (16 * t + r >= rows) {  // padding row of the last tile
        for (int64_t b = 0; b < kb; ++b) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(qo + b * 512), _mm256_setzero_si256());
          dxo[b * 16] = 0.0f;
          if (dxs != nullptr) dxs[t * kb * 16 + r + b * 16] = 0.0f;
        }
        continue;
      }
      const BlockQ8A* xr = x + (16 * t + r) * kb;
      for (int64_t b = 0; b < kb; ++b) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(qo + b * 512),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr[b].qs)));
        dxo[b * 16] = xr[b].d;
      }
      if (dxs != nullptr) {
        float* dso = dxs + t * kb * 16 + r;
        for (int64_t b = 0; b < kb; ++b) dso[b * 16] = xr[b].d * static_cast<float>(xr[b].sum[0] + xr[b].sum[1]);
      }
    }
}

void AmxTiles(QuantType t, const int8_t* bt, const float* ws, int nv, const AmxX& xa, int64_t kb, int64_t b0,
              int64_t b1, int x_tiles, int last_rows, float* y, int64_t ldy, const __mmask16* mask,
              bool accumulate) {
  switch (t) {
    case QuantType::kQ4_0:
      return TilesAny<QuantType::kQ4_0>(x_tiles, last_rows, nv, bt, ws, xa, kb, b0, b1, y, ldy, mask, accumulate);
    case QuantType::kQ8_0:
      return TilesAny<QuantType::kQ8_0>(x_tiles, last_rows, nv, bt, ws, xa, kb, b0, b1, y, ldy, mask, accumulate);
    default:
      return TilesAny<QuantType::kQ4_K>(x_tiles, last_rows, nv, bt, ws, xa, kb, b0, b1, y, ldy, mask, accumulate);
  }
}

}  // namespace estream::kernels
