// Scalar reference of the low-precision attention (kernels/attention_lowp.h): the same
// quantisation, the same fp32 operations in the same order as x86_avx512/attention_lowp.cc, one
// query at a time, for the tests. Also the layout, the env switch and the size functions that both
// versions share.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/attention_lowp.h"
#include "kernels/dispatch.h"

namespace estream::kernels {
namespace {

constexpr float kLog2e = 1.44269504088896340736f;

size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

// fp32 -> bf16, round to nearest even (no NaN inputs here).
uint32_t Bf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}
float Bf16ToFloat(uint32_t b) {
  const uint32_t u = b << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace

LowpLayout::LowpLayout(int head_dim) : d(head_dim), dp((head_dim + 3) / 4 * 4) {
  corr = RoundUp(static_cast<size_t>(kLowpKeys) * dp, 64);
  sk = corr + sizeof(int32_t) * kLowpKeys;
  vb = RoundUp(sk + sizeof(float) * kLowpKeys, 64);
  sv = vb + sizeof(uint32_t) * (kLowpKeys / 4) * static_cast<size_t>(d);
  block_bytes = RoundUp(vb + sizeof(uint32_t) * (kLowpKeys / 2) * static_cast<size_t>(d), 64);
}

bool AttentionLowpSelected() {
  static const bool selected = [] {
    const char* env = std::getenv("ESTREAM_ATTN_LOWP");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return selected;
}

size_t AttentionLowpKvBytes(int head_dim, int n_tokens) {
  const size_t blocks = (static_cast<size_t>(std::max(n_tokens, 0)) + kLowpKeys - 1) / kLowpKeys;
  return blocks * LowpLayout(head_dim).block_bytes;
}

namespace {

// 2^x for x <= 0 or -inf: n = rne(x), p(x - n) by Horner from the highest coefficient, scaled by
// 2^n; below 2^-125 exactly 0.
template <size_t N>
float Exp2Horner(float x, const float (&coef)[N]) {
  x = std::max(x, -126.0f);  // -inf -> -126 (then 0)
  if (!(x >= -125.0f)) return 0.0f;
  const float n = std::nearbyint(x);
  const float f = x - n;
  float p = coef[0];
  for (size_t i = 1; i < N; ++i) p = std::fma(p, f, coef[i]);
  return std::ldexp(p, static_cast<int>(n));
}

}  // namespace

float LowpExp2(float x) {
  static constexpr float kCoef[] = {1.5252733804059840e-05f, 1.5403530393381609e-04f, 1.3333558146428443e-03f,
                                    9.6181291076284772e-03f, 5.5504108664821580e-02f, 2.4022650695910071e-01f,
                                    6.9314718055994531e-01f, 1.0f};
  return Exp2Horner(x, kCoef);
}

float LowpExp2Short(float x) {
  static constexpr float kCoef[] = {5.500895903e-02f, 2.422113717e-01f, 6.932829618e-01f, 1.0f};
  return Exp2Horner(x, kCoef);
}

// K as int8 (both LowpPv), V as `pv` says.
static void ConvertKvRef(const AttentionArgs& a, int kv_head, int block, uint16_t* kv, LowpPv pv) {
  const LowpLayout L(a.head_dim);
  const int d = a.head_dim, T = a.n_tokens;
  uint8_t* blk = reinterpret_cast<uint8_t*>(kv) + static_cast<size_t>(block) * L.block_bytes;
  int8_t* ki = reinterpret_cast<int8_t*>(blk);
  int32_t* corr = reinterpret_cast<int32_t*>(blk + L.corr);
  float* sk = reinterpret_cast<float*>(blk + L.sk);
  uint32_t* vb = reinterpret_cast<uint32_t*>(blk + L.vb);
  const float* k_head = a.k + static_cast<int64_t>(kv_head) * d;
  const float* v_head = a.v + static_cast<int64_t>(kv_head) * d;
  // mu: fp32 sums in sample order, then one division.
  const int ns = LowpMeanKeys(a);
  std::vector<float> mu(d, 0.0f);
  for (int s = 0; s < ns; ++s) {
    const float* kr = k_head + static_cast<int64_t>(s) * a.ldk;
    for (int c = 0; c < d; ++c) mu[c] += kr[c];
  }
  for (int c = 0; c < d; ++c) mu[c] /= static_cast<float>(ns);
  std::vector<float> kc(d);
  for (int j = 0; j < kLowpKeys; ++j) {
    const int key = block * kLowpKeys + j;
    int8_t* row = ki + static_cast<size_t>(j) * L.dp;
    std::memset(row, 0, L.dp);
    corr[j] = 0;
    sk[j] = 0.0f;
    if (key >= T) continue;
    const float* kr = k_head + static_cast<int64_t>(key) * a.ldk;
    float amax = 0.0f;
    for (int c = 0; c < d; ++c) {
      kc[c] = kr[c] - mu[c];
      amax = std::max(amax, std::fabs(kc[c]));
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int c = 0; c < d; ++c) {
      const int32_t x = static_cast<int32_t>(std::nearbyint(kc[c] * inv));
      row[c] = static_cast<int8_t>(x);
      sum += x;
    }
    corr[j] = 128 * sum;
    sk[j] = amax / 127.0f;
  }
  if (pv == LowpPv::kInt8) {
    // Per key: sv = max |v| / 127 over its dims, v rounded to v / sv (as K, without smoothing).
    float* sv = reinterpret_cast<float*>(blk + L.sv);
    std::memset(vb, 0, sizeof(uint32_t) * (kLowpKeys / 4) * d);
    for (int j = 0; j < kLowpKeys; ++j) {
      const int key = block * kLowpKeys + j;
      sv[j] = 0.0f;
      if (key >= T) continue;
      const float* vr = v_head + static_cast<int64_t>(key) * a.ldv;
      float amax = 0.0f;
      for (int c = 0; c < d; ++c) amax = std::max(amax, std::fabs(vr[c]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int c = 0; c < d; ++c) {
        const int32_t x = static_cast<int32_t>(std::nearbyint(vr[c] * inv));
        vb[static_cast<size_t>(j / 4) * d + c] |= (static_cast<uint32_t>(x) & 0xFFu) << (8 * (j % 4));
      }
      sv[j] = amax / 127.0f;
    }
    for (int j = 0; j < kLowpKeys; ++j) sv[kLowpKeys + j] = std::max(j > 0 ? sv[kLowpKeys + j - 1] : 0.0f, sv[j]);
    return;
  }
  for (int p = 0; p < kLowpKeys / 2; ++p) {
    const int key0 = block * kLowpKeys + 2 * p;
    for (int c = 0; c < d; ++c) {
      const uint32_t lo = key0 < T ? Bf16Bits(v_head[static_cast<int64_t>(key0) * a.ldv + c]) : 0;
      const uint32_t hi = key0 + 1 < T ? Bf16Bits(v_head[static_cast<int64_t>(key0 + 1) * a.ldv + c]) : 0;
      vb[static_cast<size_t>(p) * d + c] = lo | (hi << 16);
    }
  }
}

void AttentionLowpConvertKvRef(const AttentionArgs& a, int kv_head, int block, uint16_t* kv) {
  ConvertKvRef(a, kv_head, block, kv, LowpPv::kBf16);
}
void AttentionLowpConvertKvRefInt8(const AttentionArgs& a, int kv_head, int block, uint16_t* kv) {
  ConvertKvRef(a, kv_head, block, kv, LowpPv::kInt8);
}

// One tile of up to kLowpRows queries of one head, rows [t0, t1), the operations of the fast
// kernels per query lane. P.V as `pv` says:
//   kBf16: P = 2^(S - m) rounded to bf16, O = O alpha + sum_j P_j V_j (the AVX2 kernel's order);
//   kInt8: per span of kLowpSpanKeys keys (two blocks), with bx the span's largest score (per
//          query) and c = 2^(bx - m), e_j = 2^(S_j - bx), l = l alpha + c sum_j e_j; the key's V
//          scale folded into P: with M the largest sv the query sees in the span (its blocks' pm
//          at its last visible keys), P_j = rne(e_j (sv_j 255 / M)) as u8, and per dim O =
//          float(sum_j P_j V^_j) g + O alpha with g = c M / 255 (one FMA; the first span O = the
//          product alone): the AVX-512 kernel's operations bit for bit.
static void LowpTileRef(const AttentionArgs& a, const uint16_t* kv, int head, int t0, int t1, LowpPv pv) {
  const LowpLayout L(a.head_dim);
  const int d = a.head_dim, nq = t1 - t0;
  const float q_scale = a.scale * kLog2e;
  std::vector<int32_t> qi(static_cast<size_t>(nq) * L.dp, 0);
  std::vector<float> sq(nq), m(nq, -std::numeric_limits<float>::infinity()), l(nq, 0.0f);
  // Keys per step: a span of two key blocks for P.V in int8 (attention_lowp.h), a block for bf16.
  const int step = pv == LowpPv::kInt8 ? kLowpSpanKeys : kLowpKeys;
  std::vector<float> o(static_cast<size_t>(nq) * d, 0.0f), s(step), p(step);
  std::vector<int32_t> pi(step);
  float (*exp2)(float) = pv == LowpPv::kInt8 ? LowpExp2Short : LowpExp2;
  for (int i = 0; i < nq; ++i) {
    const float* q = a.q + static_cast<int64_t>(t0 + i) * a.ldq + static_cast<int64_t>(head) * d;
    float amax = 0.0f;
    for (int c = 0; c < d; ++c) amax = std::max(amax, std::fabs(q[c] * q_scale));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int c = 0; c < d; ++c)
      qi[static_cast<size_t>(i) * L.dp + c] = static_cast<int32_t>(std::nearbyint(q[c] * q_scale * inv));
    sq[i] = amax / 127.0f;
  }
  // The converted block of a key (its index there: key % kLowpKeys).
  auto block_of = [&](int key) {
    return reinterpret_cast<const uint8_t*>(kv) + static_cast<size_t>(key / kLowpKeys) * L.block_bytes;
  };
  for (int kb = 0; kb < t1; kb += step) {
    const int nk = std::min(step, t1 - kb);
    for (int i = 0; i < nq; ++i) {
      float bx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < nk; ++j) {
        const uint8_t* blk = block_of(kb + j);
        const int jj = (kb + j) % kLowpKeys;
        const int8_t* ki = reinterpret_cast<const int8_t*>(blk) + static_cast<size_t>(jj) * L.dp;
        const int32_t corr = reinterpret_cast<const int32_t*>(blk + L.corr)[jj];
        const float sk = reinterpret_cast<const float*>(blk + L.sk)[jj];
        int32_t acc = 0;
        for (int c = 0; c < L.dp; ++c) acc += (qi[static_cast<size_t>(i) * L.dp + c] + 128) * ki[c];
        s[j] = static_cast<float>(acc - corr) * (sq[i] * sk);
        if (kb + j > t0 + i) s[j] = -std::numeric_limits<float>::infinity();
        bx = std::max(bx, s[j]);
      }
      float* oi = o.data() + static_cast<size_t>(i) * d;
      if (pv == LowpPv::kInt8) {
        // The running max moves only when the span's exceeds it by more than kLowpRescale
        // (attention_lowp.h); alpha is then exactly 1 and O keeps its scale.
        const bool rescale = bx > m[i] + kLowpRescale;
        const float alpha = rescale ? exp2(m[i] - bx) : 1.0f;
        if (rescale) m[i] = bx;
        const float cb = exp2(bx - m[i]);
        // M: the largest V scale of the keys of the span the row sees (the blocks' running maxima).
        const int last = std::min(nk - 1, t0 + i - kb);
        float mu = 0.0f;
        for (int b = kb; b <= kb + last; b += kLowpKeys) {
          const int jj = std::min(kb + last - b, kLowpKeys - 1);
          mu = std::max(mu, reinterpret_cast<const float*>(block_of(b) + L.sv)[kLowpKeys + jj]);
        }
        const float inv = mu > 0.0f ? 255.0f / mu : 0.0f;
        float sum = 0.0f;
        for (int j = 0; j < nk; ++j) {
          const float e = exp2(s[j] - bx);
          sum += e;
          const float svj = reinterpret_cast<const float*>(block_of(kb + j) + L.sv)[(kb + j) % kLowpKeys];
          pi[j] = static_cast<int32_t>(std::nearbyint(e * (svj * inv)));
        }
        l[i] = std::fma(l[i], alpha, cb * sum);
        const float g = (cb * mu) * (1.0f / 255.0f);
        for (int c = 0; c < d; ++c) {
          int32_t acc = 0;
          for (int j = 0; j < nk; ++j) {
            const int jj = (kb + j) % kLowpKeys;
            const uint32_t* vb = reinterpret_cast<const uint32_t*>(block_of(kb + j) + L.vb);
            const uint32_t w = vb[static_cast<size_t>(jj / 4) * d + c];
            acc += pi[j] * static_cast<int8_t>((w >> (8 * (jj % 4))) & 0xFFu);
          }
          oi[c] = kb == 0 ? static_cast<float>(acc) * g : std::fma(static_cast<float>(acc), g, oi[c] * alpha);
        }
        continue;
      }
      const float bm = std::max(m[i], bx);
      const float alpha = exp2(m[i] - bm);
      m[i] = bm;
      float sum = 0.0f;
      for (int j = 0; j < nk; ++j) {
        p[j] = LowpExp2(s[j] - bm);
        sum += p[j];
      }
      l[i] = std::fma(l[i], alpha, sum);
      for (int c = 0; c < d; ++c) {
        float acc = oi[c] * alpha;
        const uint32_t* vb = reinterpret_cast<const uint32_t*>(block_of(kb) + L.vb);
        for (int pp = 0; pp < (nk + 1) / 2; ++pp) {
          const uint32_t w = vb[static_cast<size_t>(pp) * d + c];
          const float p_lo = Bf16ToFloat(Bf16Bits(p[2 * pp]));
          const float p_hi = 2 * pp + 1 < nk ? Bf16ToFloat(Bf16Bits(p[2 * pp + 1])) : 0.0f;
          acc = std::fma(p_hi, Bf16ToFloat(w >> 16), acc);
          acc = std::fma(p_lo, Bf16ToFloat(w & 0xFFFFu), acc);
        }
        oi[c] = acc;
      }
    }
  }
  for (int i = 0; i < nq; ++i) {
    const float inv_l = 1.0f / l[i];
    float* out = a.out + static_cast<int64_t>(t0 + i) * a.ldo + static_cast<int64_t>(head) * d;
    for (int c = 0; c < d; ++c) out[c] = o[static_cast<size_t>(i) * d + c] * inv_l;
  }
}

static void BlockRef(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end, int t_begin,
                     int t_end, LowpPv pv) {
  for (int h = head_begin; h < head_end; ++h)
    for (int t0 = t_begin; t0 < t_end; t0 += kLowpRows) LowpTileRef(a, kv, h, t0, std::min(t_end, t0 + kLowpRows), pv);
}
void AttentionBlockLowpRef(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end, int t_begin,
                           int t_end) {
  BlockRef(a, kv, head_begin, head_end, t_begin, t_end, LowpPv::kBf16);
}
void AttentionBlockLowpRefInt8(const AttentionArgs& a, const uint16_t* kv, int head_begin, int head_end,
                               int t_begin, int t_end) {
  BlockRef(a, kv, head_begin, head_end, t_begin, t_end, LowpPv::kInt8);
}

void SetAttentionLowp(KernelTable* t, void (*convert)(const AttentionArgs&, int, int, int, uint16_t*),
                      void (*block)(const AttentionArgs&, const uint16_t*, int, int, int, int),
                      size_t (*scratch_bytes)(int, int)) {
  t->attention_convert_bf16 = convert;
  t->attention_kv_bytes_bf16 = AttentionLowpKvBytes;
  t->attention_kv_block_bf16 = kLowpKeys;
  t->attention_block_bf16 = block;
  t->attention_rows_bf16 = kLowpRows;
  t->attention_first_rows_bf16 = kLowpKeys;
  t->attention_first_split_bf16 = kLowpFirstSplit;
  t->attention_q8_bf16 = false;  // FillAttentionLowpAvx512 sets it
  t->attention_scratch_bytes_bf16 = scratch_bytes;
}

void FillAttentionLowpRef(KernelTable* t, LowpPv pv) {
  if (pv == LowpPv::kInt8)
    SetAttentionLowp(t, ConvertKvBlocks<AttentionLowpConvertKvRefInt8>, AttentionBlockLowpRefInt8, nullptr);
  else
    SetAttentionLowp(t, ConvertKvBlocks<AttentionLowpConvertKvRef>, AttentionBlockLowpRef, nullptr);
}

}  // namespace estream::kernels
