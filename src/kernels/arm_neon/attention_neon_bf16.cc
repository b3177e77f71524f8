// AArch64 low-precision causal attention for cores with FEAT_BF16 (HWCAP2_BF16): bf16 operands,
// fp32 accumulation (BFDOT, vbfdotq_f32), fp32 online softmax. Fills the table's bf16 attention
// entries (KernelTable::attention_convert_bf16 / attention_block_bf16 / ..., dispatch.h), so
// AttentionPrefillWith (ops.cc) runs it for AttentionArgs::allow_bf16 calls exactly as it runs the
// x86 AMX / AVX-512 low-precision kernels. Compiled with -march=armv8.2-a+bf16 (file name suffix
// _bf16, estream_arm_source_flags); the table carries it only where the host has bf16 and neither
// ESTREAM_ATTN_BF16 nor ESTREAM_ATTN_LOWP is "0" (NeonBf16AttentionSelected).
//
// Algorithm (plain bf16, no smoothing: a row depends only on keys 0..t, so no exact fp32 rows are
// needed, attention_first_rows_bf16 = 0, as for AMX):
//   convert, per kv head and block of kKeys = 64 keys: kb = bf16(K) [64][d8] (d8 = head_dim
//     rounded up to 8, zero padded; keys past T zero), vb = bf16(V) as key pairs [32][d4] uint32
//     (d4 = head_dim rounded up to 4; V[2p][c] low half, V[2p + 1][c] high half). Round to nearest
//     even.
//   block, per tile of kRows = 8 query rows of one head: qb = bf16(q scale log2(e)); per key block
//     S = qb . kb (BFDOT per 8 dims, fp32 lanes summed), causal mask, running max m,
//     P = 2^(S - m) (fp32, the fp32 kernel's polynomial), l = l alpha + sum P (fp32),
//     O = O alpha + bf16(P) . vb (BFDOT over key pairs, P's pair broadcast), out = O / l.
// Error bound (tests/attention_lowp_test.cc asserts it per query from the data). With u = 2^-9
// (bf16 unit roundoff), the exact score s_ij = scale log2(e) q_i.k_j moves by at most
//   delta_ij <= (2u + u^2) sum_d |qs_id| |k_jd|  (+ the fp32 accumulation of d products),
// so the normalised weights move by a factor within 2^(+-2 delta_i), delta_i = max_j delta_ij;
// P and V rounded to bf16 add a relative 2^-8 each:
//   |out_i - exact_i| <= (2^(2 delta_i) - 1 + 2^-7) max_j |v_j|  + the fp32 kernel's terms,
// the same form (and, for |q|, |k| of the usual sizes, the same class) as the x86 int8/bf16 path
// (attention_lowp.h), whose delta comes from an int8 grid instead of bf16's 8-bit mantissa.
// Thread safety: convert and block write only their outputs and thread_local scratch.
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "base/check.h"
#include "kernels/arm_neon/neon_exp2.h"
#include "kernels/dispatch.h"

namespace estream::kernels {
namespace {

constexpr int kKeys = 64;  // keys per converted block
constexpr int kRows = 8;   // query rows per tile
constexpr float kLog2eF = 1.44269504088896340736f;

inline int D8(int d) { return (d + 7) / 8 * 8; }
inline int D4(int d) { return (d + 3) / 4 * 4; }
inline size_t RoundUp64(size_t x) { return (x + 63) / 64 * 64; }
inline size_t KbBytes(int d) { return RoundUp64(sizeof(uint16_t) * kKeys * static_cast<size_t>(D8(d))); }
inline size_t BlockBytes(int d) {
  return KbBytes(d) + RoundUp64(sizeof(uint32_t) * (kKeys / 2) * static_cast<size_t>(D4(d)));
}

// fp32 -> bf16 bits, round to nearest even (inputs are finite; NaN stays NaN).
inline uint16_t Bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float Exp2Scalar(float x) { return vgetq_lane_f32(Exp2NonPositive(vdupq_n_f32(x)), 0); }

inline bfloat16x8_t LoadBf16(const uint16_t* p) { return vreinterpretq_bf16_u16(vld1q_u16(p)); }

size_t KvBytesNeonBf16(int head_dim, int n_tokens) {
  const size_t blocks = (static_cast<size_t>(std::max(n_tokens, 0)) + kKeys - 1) / kKeys;
  return blocks * BlockBytes(head_dim);
}

void ConvertKvNeonBf16(const AttentionArgs& a, int kv_head, int block, uint16_t* kv) {
  const int d = a.head_dim, d8 = D8(d), d4 = D4(d), T = a.n_tokens;
  uint8_t* blk = reinterpret_cast<uint8_t*>(kv) + static_cast<size_t>(block) * BlockBytes(d);
  uint16_t* kb = reinterpret_cast<uint16_t*>(blk);
  uint32_t* vb = reinterpret_cast<uint32_t*>(blk + KbBytes(d));
  const float* k_head = a.k + static_cast<int64_t>(kv_head) * d;
  const float* v_head = a.v + static_cast<int64_t>(kv_head) * d;
  for (int j = 0; j < kKeys; ++j) {
    const int key = block * kKeys + j;
    uint16_t* row = kb + static_cast<size_t>(j) * d8;
    int c = 0;
    if (key < T) {
      const float* kr = k_head + static_cast<int64_t>(key) * a.ldk;
      for (; c < d; ++c) row[c] = Bf16(kr[c]);
    }
    for (; c < d8; ++c) row[c] = 0;
  }
  for (int p = 0; p < kKeys / 2; ++p) {
    const int key0 = block * kKeys + 2 * p;
    uint32_t* row = vb + static_cast<size_t>(p) * d4;
    const float* r0 = v_head + static_cast<int64_t>(key0) * a.ldv;
    const float* r1 = r0 + a.ldv;
    for (int c = 0; c < d4; ++c) {
      const uint32_t lo = key0 < T && c < d ? Bf16(r0[c]) : 0;
      const uint32_t hi = key0 + 1 < T && c < d ? Bf16(r1[c]) : 0;
      row[c] = lo | (hi << 16);
    }
  }
}

// Per-thread scratch: qb bf16 [kRows][d8], O fp32 [kRows][d4], S fp32 [kRows][kKeys],
// P pairs uint32 [kRows][kKeys / 2].
struct Bf16Scratch {
  std::vector<uint16_t> qb;
  std::vector<float> o, s;
  std::vector<uint32_t> p2;
  static size_t Bytes(int d) {
    return kRows * (sizeof(uint16_t) * D8(d) + sizeof(float) * (D4(d) + kKeys) + sizeof(uint32_t) * kKeys / 2);
  }
  void Reserve(int d) {
    if (qb.size() < static_cast<size_t>(kRows) * D8(d)) qb.resize(static_cast<size_t>(kRows) * D8(d));
    if (o.size() < static_cast<size_t>(kRows) * D4(d)) o.resize(static_cast<size_t>(kRows) * D4(d));
    s.resize(static_cast<size_t>(kRows) * kKeys);
    p2.resize(static_cast<size_t>(kRows) * kKeys / 2);
  }
};

size_t ScratchBytesNeonBf16(int head_dim, int /*tiles*/) { return Bf16Scratch::Bytes(head_dim); }

// Query rows [q0, q0 + nq) (nq <= kRows) of head h over keys 0 .. q0 + nq - 1.
void Tile(const AttentionArgs& a, const uint8_t* kv, int h, int q0, int nq, Bf16Scratch& sc) {
  const int d = a.head_dim, d8 = D8(d), d4 = D4(d);
  const size_t block_bytes = BlockBytes(d), kb_bytes = KbBytes(d);
  const float q_scale = a.scale * kLog2eF;
  uint16_t* qb = sc.qb.data();
  float* o = sc.o.data();
  float* st = sc.s.data();
  uint32_t* p2 = sc.p2.data();
  // Rows past nq repeat the last row (finite scores, results discarded).
  for (int r = 0; r < kRows; ++r) {
    const float* q = a.q + static_cast<int64_t>(q0 + std::min(r, nq - 1)) * a.ldq + static_cast<int64_t>(h) * d;
    uint16_t* row = qb + static_cast<size_t>(r) * d8;
    int c = 0;
    for (; c < d; ++c) row[c] = Bf16(q[c] * q_scale);
    for (; c < d8; ++c) row[c] = 0;
  }
  std::fill(o, o + static_cast<size_t>(kRows) * d4, 0.0f);
  float m[kRows], l[kRows], alpha[kRows];
  for (int r = 0; r < kRows; ++r) {
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
  }
  const int t_last = q0 + nq - 1;
  for (int kb0 = 0; kb0 <= t_last; kb0 += kKeys) {
    const uint8_t* blk = kv + static_cast<size_t>(kb0 / kKeys) * block_bytes;
    const uint16_t* kb = reinterpret_cast<const uint16_t*>(blk);
    const uint32_t* vb = reinterpret_cast<const uint32_t*>(blk + kb_bytes);
    const int nk = std::min(kKeys, t_last + 1 - kb0);
    const int nk4 = (nk + 3) / 4 * 4;
    // S[r][j] = qb_r . kb_j (log2 units).
    for (int j = 0; j < nk; ++j) {
      const uint16_t* kr = kb + static_cast<size_t>(j) * d8;
      float32x4_t acc[kRows];
      for (int r = 0; r < kRows; ++r) acc[r] = vdupq_n_f32(0.0f);
      for (int c = 0; c < d8; c += 8) {
        const bfloat16x8_t kv8 = LoadBf16(kr + c);
        for (int r = 0; r < kRows; ++r) acc[r] = vbfdotq_f32(acc[r], LoadBf16(qb + static_cast<size_t>(r) * d8 + c), kv8);
      }
      for (int r = 0; r < kRows; ++r) {
        // Causal mask: key kb0 + j is visible to query q0 + r iff kb0 + j <= q0 + r.
        st[r * kKeys + j] = kb0 + j <= q0 + r ? vaddvq_f32(acc[r]) : -std::numeric_limits<float>::infinity();
      }
    }
    for (int r = 0; r < kRows; ++r) {
      float* s = st + r * kKeys;
      for (int j = nk; j < nk4; ++j) s[j] = -std::numeric_limits<float>::infinity();
      float bm = m[r];
      for (int j = 0; j < nk; ++j) bm = std::max(bm, s[j]);
      alpha[r] = Exp2Scalar(m[r] - bm);  // m = -inf on the first block: 0
      m[r] = bm;
      const float32x4_t bmv = vdupq_n_f32(bm);
      float32x4_t sum = vdupq_n_f32(0.0f);
      for (int j = 0; j < nk4; j += 4) {
        const float32x4_t p = Exp2NonPositive(vsubq_f32(vld1q_f32(s + j), bmv));
        sum = vaddq_f32(sum, p);
        // bf16 pairs (keys j, j + 1) and (j + 2, j + 3); BFCVTN rounds to nearest even.
        vst1_u16(reinterpret_cast<uint16_t*>(p2 + r * (kKeys / 2) + j / 2),
                 vget_low_u16(vreinterpretq_u16_bf16(vcvtq_low_bf16_f32(p))));
      }
      l[r] = l[r] * alpha[r] + vaddvq_f32(sum);
    }
    // O = O alpha + P . V, 4 head dims x kRows rows per step.
    const int np = nk4 / 2;
    for (int c = 0; c < d4; c += 4) {
      float32x4_t acc[kRows];
      for (int r = 0; r < kRows; ++r) acc[r] = vmulq_n_f32(vld1q_f32(o + static_cast<size_t>(r) * d4 + c), alpha[r]);
      for (int p = 0; p < np; ++p) {
        const bfloat16x8_t v8 = vreinterpretq_bf16_u32(vld1q_u32(vb + static_cast<size_t>(p) * d4 + c));
        for (int r = 0; r < kRows; ++r)
          acc[r] = vbfdotq_f32(acc[r], v8, vreinterpretq_bf16_u32(vld1q_dup_u32(p2 + r * (kKeys / 2) + p)));
      }
      for (int r = 0; r < kRows; ++r) vst1q_f32(o + static_cast<size_t>(r) * d4 + c, acc[r]);
    }
  }
  for (int r = 0; r < nq; ++r) {
    const float inv = 1.0f / l[r];
    float* out = a.out + static_cast<int64_t>(q0 + r) * a.ldo + static_cast<int64_t>(h) * d;
    const float* orow = o + static_cast<size_t>(r) * d4;
    for (int c = 0; c < d; ++c) out[c] = orow[c] * inv;
  }
}

void BlockNeonBf16(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end, int t_begin, int t_end) {
  thread_local Bf16Scratch scratch;
  scratch.Reserve(a.head_dim);
  const uint8_t* kvb = reinterpret_cast<const uint8_t*>(kv);
  for (int h = head_begin; h < head_end; ++h)
    for (int t = t_begin; t < t_end; t += kRows) Tile(a, kvb, h, t, std::min(kRows, t_end - t), scratch);
}

}  // namespace

void FillNeonBf16Attention(KernelTable* t) {
  t->attention_convert_bf16 = ConvertKvBlocks<ConvertKvNeonBf16>;
  t->attention_kv_bytes_bf16 = KvBytesNeonBf16;
  t->attention_kv_block_bf16 = kKeys;
  t->attention_block_bf16 = BlockNeonBf16;
  t->attention_rows_bf16 = kRows;
  t->attention_first_rows_bf16 = 0;
  t->attention_first_split_bf16 = 0;
  t->attention_q8_bf16 = false;
  t->attention_scratch_bytes_bf16 = ScratchBytesNeonBf16;
}

}  // namespace estream::kernels
