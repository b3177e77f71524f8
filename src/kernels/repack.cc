// Builds the packed weight layout documented in quant/packed_format.h, and the public RepackWeights.
#include "kernels/repack.h"

#include <cstring>

#include "base/check.h"
#include "base/fp16.h"
#include "base/memory.h"
#include "kernels/kernels.h"
#include "quant/quant.h"

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

// The 6-bit scale (stored + 32) of 16-value sub-block j of a Q3_K super-block, minus 32.
int ScaleQ3K(const uint8_t* s, int j) {
  const int lo = j < 8 ? (s[j] & 0x0F) : (s[j - 8] >> 4);
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

int ScaleIQ4XS(const BlockIQ4_XS& x, int ib) {
  return (((x.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F) | (((x.scales_h >> (2 * ib)) & 3) << 4)) - 32;
}

struct Lut {
  uint8_t v[16];
};
constexpr Lut MakeLut(const int8_t* t) {
  Lut l{};
  for (int i = 0; i < 16; ++i) l.v[i] = static_cast<uint8_t>(t[i] + 128);
  return l;
}
constexpr Lut kIq4NlLut = MakeLut(kIq4NlValues);
constexpr Lut kMxfp4Lut = MakeLut(kMxfp4Values);

// Low / high nibbles of qs[0..16) as values 0..15 / 16..31 (the Q4_0-style nibble order).
inline void Nibbles(const uint8_t* qs, uint8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0x0F;
    q[j + 16] = qs[j] >> 4;
  }
}

// For the 2-bit-field types (Q2_K, Q3_K): the 2-bit field of value l (< 32) of 32-value block
// `sub` of a super-block: 128-value half sub / 4, field sub % 4 of qs[32 * half + l].
inline int Field2(const uint8_t* qs, int sub, int l) { return (qs[32 * (sub / 4) + l] >> (2 * (sub % 4))) & 3; }

}  // namespace

const uint8_t* PackedLut(QuantType t) {
  switch (PackedFormat(t)) {
    case QuantType::kIQ4_NL: case QuantType::kIQ4_XS: return kIq4NlLut.v;
    case QuantType::kMXFP4: return kMxfp4Lut.v;
    default: return nullptr;
  }
}

int ZeroPoint(QuantType t) {
  switch (PackedFormat(t)) {
    case QuantType::kQ4_0: return 8;
    case QuantType::kQ8_0: return 128;
    case QuantType::kQ6_K: return 32;
    case QuantType::kQ3_K: return 4;
    case QuantType::kIQ4_NL: case QuantType::kIQ4_XS: case QuantType::kMXFP4: return 128;
    default: return 0;
  }
}

void DecodeBlock32(QuantType t, const void* row, int64_t b, Block32* out) {
  out->m[0] = out->m[1] = 0.0f;
  const int sub = static_cast<int>(b % 8);  // 32-value block of a 256-value super-block
  switch (t) {
    case QuantType::kQ4_0: {
      const BlockQ4_0& x = static_cast<const BlockQ4_0*>(row)[b];
      out->d[0] = out->d[1] = Fp16ToFp32(x.d);
      Nibbles(x.qs, out->q);
      return;
    }
    case QuantType::kQ8_0: {
      const BlockQ8_0& x = static_cast<const BlockQ8_0*>(row)[b];
      out->d[0] = out->d[1] = Fp16ToFp32(x.d);
      for (int j = 0; j < 32; ++j) out->q[j] = static_cast<uint8_t>(x.qs[j] + 128);
      return;
    }
    case QuantType::kQ4_1: {
      const BlockQ4_1& x = static_cast<const BlockQ4_1*>(row)[b];
      out->d[0] = out->d[1] = Fp16ToFp32(x.d);
      out->m[0] = out->m[1] = Fp16ToFp32(x.m);
      Nibbles(x.qs, out->q);
      return;
    }
    case QuantType::kQ5_0:
    case QuantType::kQ5_1: {
      const uint8_t* qs;
      uint32_t qh;
      if (t == QuantType::kQ5_0) {
        const BlockQ5_0& x = static_cast<const BlockQ5_0*>(row)[b];
        out->d[0] = out->d[1] = Fp16ToFp32(x.d);
        std::memcpy(&qh, x.qh, 4);
        qs = x.qs;
      } else {
        const BlockQ5_1& x = static_cast<const BlockQ5_1*>(row)[b];
        out->d[0] = out->d[1] = Fp16ToFp32(x.d);
        out->m[0] = out->m[1] = Fp16ToFp32(x.m);
        std::memcpy(&qh, x.qh, 4);
        qs = x.qs;
      }
      Nibbles(qs, out->q);
      // Q5_0 is packed as Q8_0: value - 16 + 128.
      const int offset = t == QuantType::kQ5_0 ? 112 : 0;
      for (int j = 0; j < 32; ++j) out->q[j] = static_cast<uint8_t>((out->q[j] | (((qh >> j) & 1) << 4)) + offset);
      return;
    }
    case QuantType::kQ4_K:
    case QuantType::kQ5_K: {
      // Q5_K starts with Q4_K's fields (d, dmin, scales); its qs follow the 32 qh bytes.
      const BlockQ4_K& x = *reinterpret_cast<const BlockQ4_K*>(static_cast<const uint8_t*>(row) +
                                                              (b / 8) * (t == QuantType::kQ4_K ? 144 : 176));
      int sc, m;
      ScaleMinK4(sub, x.scales, &sc, &m);
      out->d[0] = out->d[1] = Fp16ToFp32(x.d) * static_cast<float>(sc);
      out->m[0] = out->m[1] = -(Fp16ToFp32(x.dmin) * static_cast<float>(m));
      // Sub-blocks 2c and 2c + 1 are the low and high nibbles of qs[32c .. 32c + 32); Q5_K's fifth
      // bit of value l of sub-block `sub` is bit `sub` of qh[l].
      if (t == QuantType::kQ4_K) {
        const uint8_t* q = x.qs + 32 * (sub / 2);
        for (int j = 0; j < 32; ++j) out->q[j] = (sub % 2 == 0) ? (q[j] & 0x0F) : (q[j] >> 4);
      } else {
        const BlockQ5_K& x5 = static_cast<const BlockQ5_K*>(row)[b / 8];
        const uint8_t* q = x5.qs + 32 * (sub / 2);
        for (int j = 0; j < 32; ++j)
          out->q[j] = static_cast<uint8_t>(((sub % 2 == 0) ? (q[j] & 0x0F) : (q[j] >> 4)) | (((x5.qh[j] >> sub) & 1) << 4));
      }
      return;
    }
    case QuantType::kQ6_K: {
      const BlockQ6_K& x = static_cast<const BlockQ6_K*>(row)[b / 8];
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
    case QuantType::kQ3_K: {
      const BlockQ3_K& x = static_cast<const BlockQ3_K*>(row)[b / 8];
      const float d = Fp16ToFp32(x.d);
      // Stored value = 3-bit value + 4: the 2-bit field, plus 4 where the hmask bit is set.
      for (int l = 0; l < 32; ++l)
        out->q[l] = static_cast<uint8_t>(Field2(x.qs, sub, l) | (((x.hmask[l] >> sub) & 1) << 2));
      out->d[0] = d * static_cast<float>(ScaleQ3K(x.scales, 2 * sub));
      out->d[1] = d * static_cast<float>(ScaleQ3K(x.scales, 2 * sub + 1));
      return;
    }
    case QuantType::kQ2_K: {
      const BlockQ2_K& x = static_cast<const BlockQ2_K*>(row)[b / 8];
      const float d = Fp16ToFp32(x.d), dmin = Fp16ToFp32(x.dmin);
      for (int l = 0; l < 32; ++l) out->q[l] = static_cast<uint8_t>(Field2(x.qs, sub, l));
      for (int h = 0; h < 2; ++h) {
        const uint8_t sc = x.scales[2 * sub + h];
        out->d[h] = d * static_cast<float>(sc & 0x0F);
        out->m[h] = -(dmin * static_cast<float>(sc >> 4));
      }
      return;
    }
    case QuantType::kIQ4_NL: {
      const BlockIQ4_NL& x = static_cast<const BlockIQ4_NL*>(row)[b];
      out->d[0] = out->d[1] = Fp16ToFp32(x.d);
      Nibbles(x.qs, out->q);
      return;
    }
    case QuantType::kIQ4_XS: {
      const BlockIQ4_XS& x = static_cast<const BlockIQ4_XS*>(row)[b / 8];
      out->d[0] = out->d[1] = Fp16ToFp32(x.d) * static_cast<float>(ScaleIQ4XS(x, sub));
      Nibbles(x.qs + 16 * sub, out->q);
      return;
    }
    case QuantType::kMXFP4: {
      const BlockMXFP4& x = static_cast<const BlockMXFP4*>(row)[b];
      out->d[0] = out->d[1] = E8M0HalfToFp32(x.e);
      Nibbles(x.qs, out->q);
      return;
    }
    default:
      ESTREAM_CHECK(false, "DecodeBlock32: type has no packed layout");
  }
}

namespace {

inline void Put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// Writes row r's scale fields of block b (and, at the first block of a super-block, of its
// super-block entry) from the GGUF fields, without rounding.
void PackScales(QuantType t, const uint8_t* row, int64_t b, int r, uint8_t* supers, uint8_t* sc) {
  const int sub = static_cast<int>(b % 8);
  uint8_t* sup = supers + (b / 8) * PackedSuperBytes(t);
  const bool first = sub == 0;
  switch (t) {
    case QuantType::kQ4_0: Put16(sc + 2 * r, reinterpret_cast<const BlockQ4_0*>(row)[b].d); return;
    case QuantType::kQ8_0: Put16(sc + 2 * r, reinterpret_cast<const BlockQ8_0*>(row)[b].d); return;
    case QuantType::kQ5_0: Put16(sc + 2 * r, reinterpret_cast<const BlockQ5_0*>(row)[b].d); return;
    case QuantType::kIQ4_NL: Put16(sc + 2 * r, reinterpret_cast<const BlockIQ4_NL*>(row)[b].d); return;
    case QuantType::kMXFP4: sc[r] = reinterpret_cast<const BlockMXFP4*>(row)[b].e; return;
    case QuantType::kQ4_1: {
      const BlockQ4_1& x = reinterpret_cast<const BlockQ4_1*>(row)[b];
      Put16(sc + 2 * r, x.d);
      Put16(sc + 32 + 2 * r, x.m);
      return;
    }
    case QuantType::kQ5_1: {
      const BlockQ5_1& x = reinterpret_cast<const BlockQ5_1*>(row)[b];
      Put16(sc + 2 * r, x.d);
      Put16(sc + 32 + 2 * r, x.m);
      return;
    }
    case QuantType::kQ4_K:
    case QuantType::kQ5_K: {
      const BlockQ4_K& x =
          *reinterpret_cast<const BlockQ4_K*>(row + (b / 8) * (t == QuantType::kQ4_K ? 144 : 176));
      int s6, m6;
      ScaleMinK4(sub, x.scales, &s6, &m6);
      sc[r] = static_cast<uint8_t>(s6);
      sc[16 + r] = static_cast<uint8_t>(m6);
      if (first) {
        Put16(sup + 2 * r, x.d);
        Put16(sup + 32 + 2 * r, static_cast<uint16_t>(x.dmin ^ 0x8000u));  // sign flip: exact
      }
      return;
    }
    case QuantType::kQ6_K: {
      const BlockQ6_K& x = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
      sc[r] = static_cast<uint8_t>(x.scales[2 * sub]);
      sc[16 + r] = static_cast<uint8_t>(x.scales[2 * sub + 1]);
      if (first) Put16(sup + 2 * r, x.d);
      return;
    }
    case QuantType::kQ3_K: {
      const BlockQ3_K& x = reinterpret_cast<const BlockQ3_K*>(row)[b / 8];
      sc[r] = static_cast<uint8_t>(static_cast<int8_t>(ScaleQ3K(x.scales, 2 * sub)));
      sc[16 + r] = static_cast<uint8_t>(static_cast<int8_t>(ScaleQ3K(x.scales, 2 * sub + 1)));
      if (first) Put16(sup + 2 * r, x.d);
      return;
    }
    case QuantType::kQ2_K: {
      const BlockQ2_K& x = reinterpret_cast<const BlockQ2_K*>(row)[b / 8];
      for (int h = 0; h < 2; ++h) {
        sc[16 * h + r] = x.scales[2 * sub + h] & 0x0F;
        sc[32 + 16 * h + r] = x.scales[2 * sub + h] >> 4;
      }
      if (first) {
        Put16(sup + 2 * r, x.d);
        Put16(sup + 32 + 2 * r, static_cast<uint16_t>(x.dmin ^ 0x8000u));
      }
      return;
    }
    case QuantType::kIQ4_XS: {
      const BlockIQ4_XS& x = reinterpret_cast<const BlockIQ4_XS*>(row)[b / 8];
      sc[r] = static_cast<uint8_t>(static_cast<int8_t>(ScaleIQ4XS(x, sub)));
      if (first) Put16(sup + 2 * r, x.d);
      return;
    }
    default:
      return;
  }
}

// The qs bytes of block b for the types whose 32-value blocks hold Q4_0-order nibbles or int8
// values that the packed form keeps as they are (copied 4 at a time); nullptr for the others.
const uint8_t* CopyableQuants(QuantType t, const uint8_t* row, int64_t b) {
  switch (t) {
    case QuantType::kQ4_0: return reinterpret_cast<const BlockQ4_0*>(row)[b].qs;
    case QuantType::kQ8_0: return reinterpret_cast<const uint8_t*>(reinterpret_cast<const BlockQ8_0*>(row)[b].qs);
    case QuantType::kQ4_1: return reinterpret_cast<const BlockQ4_1*>(row)[b].qs;
    case QuantType::kIQ4_NL: return reinterpret_cast<const BlockIQ4_NL*>(row)[b].qs;
    case QuantType::kMXFP4: return reinterpret_cast<const BlockMXFP4*>(row)[b].qs;
    case QuantType::kIQ4_XS: return reinterpret_cast<const BlockIQ4_XS*>(row)[b / 8].qs + 16 * (b % 8);
    default: return nullptr;
  }
}

}  // namespace

void PackPanel(QuantType t, const void* src, size_t src_stride, int rows, int64_t k, void* dst) {
  const int sb = PackedScaleBytes(t), qb = PackedQuantBytes(t);
  ESTREAM_CHECK(sb > 0 && rows >= 0 && rows <= kPackRows, "PackPanel: bad type or row count");
  const int64_t kb = k / 32;
  uint8_t* supers = static_cast<uint8_t*>(dst);
  uint8_t* scales = supers + PackedBlockScaleOffset(t, kb);
  uint8_t* quants = supers + PackedScaleSection(t, kb);
  std::memset(dst, 0, static_cast<size_t>(PackedPanelBytes(t, k)));
  const bool nibbles = PackedNibbles(t);
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(src) + r * src_stride;
    for (int64_t b = 0; b < kb; ++b) PackScales(t, row, b, r, supers, scales + b * sb);
    if (CopyableQuants(t, row, 0) != nullptr) {
      // The packed quants are the GGUF bytes regrouped 4 at a time: Q4_0's qs[4s + j] already
      // holds value 4s + j in its low nibble and 16 + 4s + j in its high one (so do Q4_1's, and
      // the table types' codes); Q8_0's unsigned value is qs + 128, i.e. the byte with its sign
      // bit flipped. (The generic path below decodes every block: ~10x slower, which the tied LM
      // head pays on every request.)
      const int steps = nibbles ? 4 : 8;
      for (int64_t b = 0; b < kb; ++b) {
        const uint8_t* qs = CopyableQuants(t, row, b);
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
      if (!nibbles) {
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

uint8_t* PanelPackBuffer(size_t bytes) {
  thread_local AlignedPtr<uint8_t> buf;
  thread_local size_t buf_bytes = 0;
  if (buf_bytes < bytes) {
    buf.reset(static_cast<uint8_t*>(AlignedAlloc(64, bytes)));
    ESTREAM_CHECK(buf != nullptr, "GEMM: out of memory for the weight pack buffer");
    buf_bytes = bytes;
  }
  return buf.get();
}

float* FloatPanelBuffer(size_t floats) {
  thread_local AlignedPtr<float> buf;
  thread_local size_t buf_floats = 0;
  if (buf_floats < floats) {
    buf = AllocAligned<float>(floats);
    ESTREAM_CHECK(buf != nullptr, "GEMM: out of memory for the float weight panel");
    buf_floats = floats;
  }
  return buf.get();
}

}  // namespace estream::kernels
