// Builds the packed weight layout documented in repack.h, and the public RepackWeights.
#include "kernels/repack.h"

#include <cstring>

#include "base/check.h"
#include "base/fp16.h"
#include "kernels/kernels.h"

namespace estream::kernels {
namespace {

// The 6-bit scale and min of sub-block j of a Q4_K super-block (GGUF's packing of 12 bytes).
void ScaleMinK4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace

int ZeroPoint(QuantType t) {
  switch (t) {
    case QuantType::kQ4_0: return 8;
    case QuantType::kQ8_0: return 128;
    case QuantType::kQ6_K: return 32;
    default: return 0;
  }
}

void DecodeBlock32(QuantType t, const void* row, int64_t b, Block32* out) {
  out->mneg = 0.0f;
  switch (t) {
    case QuantType::kQ4_0: {
      const BlockQ4_0& x = static_cast<const BlockQ4_0*>(row)[b];
      out->d[0] = out->d[1] = Fp16ToFp32(x.d);
      for (int j = 0; j < 16; ++j) {
        out->q[j] = x.qs[j] & 0x0F;
        out->q[j + 16] = x.qs[j] >> 4;
      }
      return;
    }
    case QuantType::kQ8_0: {
      const BlockQ8_0& x = static_cast<const BlockQ8_0*>(row)[b];
      out->d[0] = out->d[1] = Fp16ToFp32(x.d);
      for (int j = 0; j < 32; ++j) out->q[j] = static_cast<uint8_t>(x.qs[j] + 128);
      return;
    }
    case QuantType::kQ4_K: {
      const BlockQ4_K& x = static_cast<const BlockQ4_K*>(row)[b / 8];
      const int sub = static_cast<int>(b % 8);  // 32-value sub-block of the super-block
      int sc, m;
      ScaleMinK4(sub, x.scales, &sc, &m);
      out->d[0] = out->d[1] = Fp16ToFp32(x.d) * static_cast<float>(sc);
      out->mneg = -(Fp16ToFp32(x.dmin) * static_cast<float>(m));
      // Sub-blocks 2c and 2c + 1 are the low and high nibbles of qs[32c .. 32c + 32).
      const uint8_t* q = x.qs + 32 * (sub / 2);
      for (int j = 0; j < 32; ++j) out->q[j] = (sub % 2 == 0) ? (q[j] & 0x0F) : (q[j] >> 4);
      return;
    }
    case QuantType::kQ6_K: {
      const BlockQ6_K& x = static_cast<const BlockQ6_K*>(row)[b / 8];
      const int sub = static_cast<int>(b % 8);
      const float d = Fp16ToFp32(x.d);
      // Super-block halves of 128 values: 64 ql bytes and 32 qh bytes each. Within a half,
      // 32-value group g (0..3) uses ql[l + 32 * (g % 2)] (low nibble for g < 2, high for
      // g >= 2) and bits 2g..2g+1 of qh[l].
      const int half = sub / 4, g = sub % 4;
      const uint8_t* ql = x.ql + 64 * half;
      const uint8_t* qh = x.qh + 32 * half;
      for (int l = 0; l < 32; ++l) {
        const uint8_t lo = ql[l + 32 * (g % 2)];
        const int nib = g < 2 ? (lo & 0x0F) : (lo >> 4);
        out->q[l] = static_cast<uint8_t>(nib | (((qh[l] >> (2 * g)) & 3) << 4));
      }
      // 16-value sub-blocks: scales[8 * half + 2 * g + {0, 1}].
      out->d[0] = d * static_cast<float>(x.scales[8 * half + 2 * g]);
      out->d[1] = d * static_cast<float>(x.scales[8 * half + 2 * g + 1]);
      return;
    }
    default:
      ESTREAM_CHECK(false, "DecodeBlock32: type has no packed layout");
  }
}

void PackPanel(QuantType t, const void* src, size_t src_stride, int rows, int64_t k, void* dst) {
  const int sb = PackedScaleBytes(t), qb = PackedQuantBytes(t);
  ESTREAM_CHECK(sb > 0 && rows >= 0 && rows <= kPackRows, "PackPanel: bad type or row count");
  const int64_t kb = k / 32;
  uint8_t* supers = static_cast<uint8_t*>(dst);
  uint8_t* scales = supers + PackedBlockScaleOffset(t, kb);
  uint8_t* quants = supers + PackedScaleSection(t, kb);
  std::memset(dst, 0, static_cast<size_t>(PackedPanelBytes(t, k)));
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(src) + r * src_stride;
    // Scales, copied from the GGUF fields (fp16 bits and small integers) without rounding.
    for (int64_t b = 0; b < kb; ++b) {
      uint8_t* sc = scales + b * sb;
      switch (t) {
        case QuantType::kQ4_0:
          std::memcpy(sc + 2 * r, &reinterpret_cast<const BlockQ4_0*>(row)[b].d, 2);
          break;
        case QuantType::kQ8_0:
          std::memcpy(sc + 2 * r, &reinterpret_cast<const BlockQ8_0*>(row)[b].d, 2);
          break;
        case QuantType::kQ4_K: {
          const BlockQ4_K& x = reinterpret_cast<const BlockQ4_K*>(row)[b / 8];
          int s6, m6;
          ScaleMinK4(static_cast<int>(b % 8), x.scales, &s6, &m6);
          sc[r] = static_cast<uint8_t>(s6);
          sc[16 + r] = static_cast<uint8_t>(m6);
          if (b % 8 == 0) {
            uint8_t* sup = supers + (b / 8) * PackedSuperBytes(t);
            std::memcpy(sup + 2 * r, &x.d, 2);
            const uint16_t ndmin = static_cast<uint16_t>(x.dmin ^ 0x8000u);  // sign flip: exact
            std::memcpy(sup + 32 + 2 * r, &ndmin, 2);
          }
          break;
        }
        case QuantType::kQ6_K: {
          const BlockQ6_K& x = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
          sc[r] = static_cast<uint8_t>(x.scales[2 * (b % 8)]);
          sc[16 + r] = static_cast<uint8_t>(x.scales[2 * (b % 8) + 1]);
          if (b % 8 == 0) std::memcpy(supers + (b / 8) * PackedSuperBytes(t) + 2 * r, &x.d, 2);
          break;
        }
        default:
          break;
      }
    }
    if (t == QuantType::kQ4_0 || t == QuantType::kQ8_0) {
      // The packed quants are the GGUF bytes regrouped 4 at a time: Q4_0's qs[4s + j] already
      // holds value 4s + j in its low nibble and 16 + 4s + j in its high one; Q8_0's unsigned
      // value is qs + 128, i.e. the byte with its sign bit flipped. (The generic path below would
      // decode every block: ~10x slower, which the tied LM head pays on every request.)
      const int steps = t == QuantType::kQ4_0 ? 4 : 8;
      for (int64_t b = 0; b < kb; ++b) {
        const uint8_t* qs = t == QuantType::kQ4_0
                                ? reinterpret_cast<const BlockQ4_0*>(row)[b].qs
                                : reinterpret_cast<const uint8_t*>(reinterpret_cast<const BlockQ8_0*>(row)[b].qs);
        uint8_t* q = quants + b * qb;
        for (int s = 0; s < steps; ++s) {
          uint32_t v;
          std::memcpy(&v, qs + 4 * s, 4);
          if (t == QuantType::kQ8_0) v ^= 0x80808080u;
          std::memcpy(q + (s * 16 + r) * 4, &v, 4);
        }
      }
      continue;
    }
    for (int64_t b = 0; b < kb; ++b) {
      uint8_t* q = quants + b * qb;
      Block32 blk;
      DecodeBlock32(t, row, b, &blk);
      if (t == QuantType::kQ8_0 || t == QuantType::kQ6_K) {
        for (int s = 0; s < 8; ++s)
          for (int j = 0; j < 4; ++j) q[(s * 16 + r) * 4 + j] = blk.q[4 * s + j];
      } else {
        for (int s = 0; s < 4; ++s)
          for (int j = 0; j < 4; ++j)
            q[(s * 16 + r) * 4 + j] = static_cast<uint8_t>(blk.q[4 * s + j] | (blk.q[16 + 4 * s + j] << 4));
      }
    }
  }
}

bool CanRepack(QuantType t) { return PackedScaleBytes(t) > 0; }

size_t PackedWeightBytes(QuantType t, int64_t n, int64_t k) {
  if (!CanRepack(t)) return 0;
  return static_cast<size_t>(PackedPanels(n) * PackedPanelBytes(t, k));
}

void RepackWeights(QuantType t, const void* src, int64_t n, int64_t k, void* dst) {
  ESTREAM_CHECK(CanRepack(t), "RepackWeights: type has no packed layout (check CanRepack)");
  const size_t row_bytes = RowBytes(t, k);
  ESTREAM_CHECK(row_bytes > 0 && k % 32 == 0, "RepackWeights: k is not a multiple of the block size");
  const int64_t panels = PackedPanels(n);
  const int64_t panel_bytes = PackedPanelBytes(t, k);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p) {
    const int rows = static_cast<int>(n - p * kPackRows < kPackRows ? n - p * kPackRows : kPackRows);
    PackPanel(t, static_cast<const uint8_t*>(src) + p * kPackRows * row_bytes, row_bytes, rows, k,
              static_cast<uint8_t*>(dst) + p * panel_bytes);
  }
}

}  // namespace estream::kernels
