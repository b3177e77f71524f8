// AVX2 + FMA kernels: causal attention (attention_x86_impl.h with 8-lane traits), RMSNorm, RoPE,
// SwiGLU, router softmax, residual add. Compiled with the AVX2 flags only; reached through the
// dispatch table when the host has AVX2 (and AVX-512 is absent or ESTREAM_ISA=avx2).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/attention_x86_impl.h"
#include "kernels/dispatch.h"
#include "kernels/ops_internal.h"

namespace estream::kernels {
namespace {

// Lanes [0, rest) set (rest clamped to 8), for maskload/maskstore of row tails.
inline __m256i TailMask(int64_t rest) {
  const int r = rest >= 8 ? 8 : static_cast<int>(rest);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 2^f for f in [-0.5, 0.5]: Taylor polynomial of degree 7 in f ln2 (truncation < 6e-9 relative;
// with Horner rounding the result is within ~1.5u).
inline __m256 Exp2Poly(__m256 f) {
  __m256 p = _mm256_set1_ps(1.5252733804059840e-05f);  // ln2^7 / 7!
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381609e-04f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-02f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-01f));
  return _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
}

// 2^n for integer-valued n in [-126, 127], built in the exponent field.
inline __m256 Pow2i(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

// 2^x for x <= 0 (or -inf); results below 2^-125 become exactly 0 (no denormals, masked keys 0).
inline __m256 Exp2NonPositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-126.0f));  // -inf -> -126 (then zeroed below)
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-125.0f), _CMP_GE_OQ);
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_and_ps(keep, _mm256_mul_ps(Exp2Poly(_mm256_sub_ps(x, n)), Pow2i(n)));
}

// e^x for any x: Cody-Waite reduction as in the AVX-512 path (within ~3u); 2^n is applied as
// 2^(n/2) 2^(n - n/2) so that overflow to inf and gradual underflow round correctly.
inline __m256 Exp(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-110.0f)), _mm256_set1_ps(100.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896340736f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  const __m256 p = Exp2Poly(_mm256_mul_ps(r, _mm256_set1_ps(1.44269504088896340736f)));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HorizontalMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

struct Avx2Traits {
  using V = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kVecs = 2;     // 16 query rows per tile
  static constexpr int kQkRows = 6;   // 6 keys x 2 vectors = 12 accumulators (of 16 registers)
  static constexpr int kKeys = 64;    // keys per block (ST is kKeys x kQ floats)
  static constexpr int kPvRows = 6;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Div(V a, V b) { return _mm256_div_ps(a, b); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V MaskBelow(V s, int lane0, int limit) {
    const __m256i lane = _mm256_add_epi32(_mm256_set1_epi32(lane0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 below = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(limit), lane));
    return _mm256_blendv_ps(s, _mm256_set1_ps(-std::numeric_limits<float>::infinity()), below);
  }
  static V Exp2(V x) { return Exp2NonPositive(x); }
  // dst[c][r] = src[r][c] * scale for an 8 x 8 block (rows at stride lds / ldd).
  static void Transpose(const float* src, int64_t lds, float scale, float* dst, int64_t ldd) {
    const __m256 sc = _mm256_set1_ps(scale);
    __m256 r[8], t[8];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 8; ++i) r[i] = _mm256_mul_ps(_mm256_loadu_ps(src + i * lds), sc);
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 8; i += 4) {
      r[i] = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t[i]), _mm256_castps_pd(t[i + 2])));
      r[i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t[i]), _mm256_castps_pd(t[i + 2])));
      r[i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t[i + 1]), _mm256_castps_pd(t[i + 3])));
      r[i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t[i + 1]), _mm256_castps_pd(t[i + 3])));
    }
    // r[4b + j] holds, in 128-bit lane L, (rows 4b..4b+3, column 4L + j).
    _Pragma("GCC unroll 16")
    for (int j = 0; j < 4; ++j) {
      _mm256_storeu_ps(dst + j * ldd, _mm256_permute2f128_ps(r[j], r[4 + j], 0x20));
      _mm256_storeu_ps(dst + (j + 4) * ldd, _mm256_permute2f128_ps(r[j], r[4 + j], 0x31));
    }
  }
};

void AttentionBlockAvx2(const AttentionArgs& a, int head_begin, int head_end, int t_begin, int t_end) {
  AttentionBlockX86<Avx2Traits>(a, head_begin, head_end, t_begin, t_end);
}

void RmsNormRowAvx2(const float* x, const float* w, float* y, int64_t n, float eps) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int c = 0; c < 4; ++c) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * c);
      acc[c] = _mm256_fmadd_ps(v, v, acc[c]);
    }
  for (; i < n; i += 8) {
    const __m256 v = _mm256_maskload_ps(x + i, TailMask(n - i));
    acc[0] = _mm256_fmadd_ps(v, v, acc[0]);
  }
  const float sum = HorizontalSum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(sum / static_cast<float>(n) + eps));
  for (i = 0; i < n; i += 8) {
    const __m256i m = TailMask(n - i);
    const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv);
    _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(v, _mm256_maskload_ps(w + i, m)));
  }
}

// cos and sin of theta = pos * inv_freq[p] for 4 pairs; same method as the AVX-512 path: fp64
// reduction by multiples of pi/2 to |r| <= pi/4, Taylor polynomials of degree 11/12 (~1e-11).
inline void SinCos4(__m256d theta, __m128* c_out, __m128* s_out) {
  const __m256d k = _mm256_round_pd(_mm256_mul_pd(theta, _mm256_set1_pd(0.63661977236758134308)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(1.5707963267948966), theta);
  r = _mm256_fnmadd_pd(k, _mm256_set1_pd(6.123233995736766e-17), r);
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d s = _mm256_set1_pd(-1.0 / 39916800.0);
  s = _mm256_fmadd_pd(s, r2, _mm256_set1_pd(1.0 / 362880.0));
  s = _mm256_fmadd_pd(s, r2, _mm256_set1_pd(-1.0 / 5040.0));
  s = _mm256_fmadd_pd(s, r2, _mm256_set1_pd(1.0 / 120.0));
  s = _mm256_fmadd_pd(s, r2, _mm256_set1_pd(-1.0 / 6.0));
  s = _mm256_fmadd_pd(_mm256_mul_pd(s, r2), r, r);
  __m256d c = _mm256_set1_pd(1.0 / 479001600.0);
  c = _mm256_fmadd_pd(c, r2, _mm256_set1_pd(-1.0 / 3628800.0));
  c = _mm256_fmadd_pd(c, r2, _mm256_set1_pd(1.0 / 40320.0));
  c = _mm256_fmadd_pd(c, r2, _mm256_set1_pd(-1.0 / 720.0));
  c = _mm256_fmadd_pd(c, r2, _mm256_set1_pd(1.0 / 24.0));
  c = _mm256_fmadd_pd(c, r2, _mm256_set1_pd(-0.5));
  c = _mm256_fmadd_pd(c, r2, _mm256_set1_pd(1.0));
  // quadrant q = k mod 4: (cos, sin) of theta = (c, s), (-s, c), (-c, -s), (s, -c).
  const __m128i q = _mm256_cvtpd_epi32(k);
  const __m128i one = _mm_set1_epi32(1), two = _mm_set1_epi32(2);
  auto widen = [](__m128i m32) { return _mm256_castsi256_pd(_mm256_cvtepi32_epi64(m32)); };
  const __m256d odd = widen(_mm_cmpeq_epi32(_mm_and_si128(q, one), one));
  const __m256d neg_cos = widen(_mm_cmpeq_epi32(_mm_and_si128(_mm_add_epi32(q, one), two), two));
  const __m256d neg_sin = widen(_mm_cmpeq_epi32(_mm_and_si128(q, two), two));
  const __m256d sign = _mm256_set1_pd(-0.0);
  __m256d cos_t = _mm256_blendv_pd(c, s, odd);
  __m256d sin_t = _mm256_blendv_pd(s, c, odd);
  cos_t = _mm256_xor_pd(cos_t, _mm256_and_pd(neg_cos, sign));
  sin_t = _mm256_xor_pd(sin_t, _mm256_and_pd(neg_sin, sign));
  *c_out = _mm256_cvtpd_ps(cos_t);
  *s_out = _mm256_cvtpd_ps(sin_t);
}

void RopeRowAvx2(float* x, int n_heads, int head_dim, int pos, const double* inv_freq, RopeMode mode) {
  const int half = head_dim / 2;
  // Tables of cos/sin per pair; for NORM, duplicated per element with the sign folded into sin:
  // x'[2p] = x[2p] c - x[2p+1] s, x'[2p+1] = x[2p+1] c + x[2p] s.
  thread_local std::vector<float> cs, sn;
  thread_local std::vector<double> freq;
  const size_t padded = (static_cast<size_t>(head_dim) + 7) / 8 * 8 + 8;
  if (cs.size() < padded) {
    cs.resize(padded);
    sn.resize(padded);
    freq.resize(padded);
  }
  std::copy(inv_freq, inv_freq + half, freq.begin());
  std::fill(freq.begin() + half, freq.begin() + (half + 3) / 4 * 4, 0.0);
  const __m256d vpos = _mm256_set1_pd(static_cast<double>(pos));
  const __m256 even_sign = _mm256_setr_ps(-0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f);
  for (int p = 0; p < half; p += 4) {
    __m128 c, s;
    SinCos4(_mm256_mul_pd(vpos, _mm256_loadu_pd(freq.data() + p)), &c, &s);
    if (mode == RopeMode::kNeox) {
      _mm_storeu_ps(cs.data() + p, c);
      _mm_storeu_ps(sn.data() + p, s);
    } else {
      const __m256 c2 = _mm256_set_m128(_mm_unpackhi_ps(c, c), _mm_unpacklo_ps(c, c));
      const __m256 s2 = _mm256_xor_ps(_mm256_set_m128(_mm_unpackhi_ps(s, s), _mm_unpacklo_ps(s, s)), even_sign);
      _mm256_storeu_ps(cs.data() + 2 * p, c2);
      _mm256_storeu_ps(sn.data() + 2 * p, s2);
    }
  }
  for (int h = 0; h < n_heads; ++h) {
    float* xh = x + static_cast<int64_t>(h) * head_dim;
    if (mode == RopeMode::kNeox) {
      for (int p = 0; p < half; p += 8) {
        const __m256i m = TailMask(half - p);
        const __m256 c = _mm256_loadu_ps(cs.data() + p), s = _mm256_loadu_ps(sn.data() + p);
        const __m256 x0 = _mm256_maskload_ps(xh + p, m), x1 = _mm256_maskload_ps(xh + half + p, m);
        _mm256_maskstore_ps(xh + p, m, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
        _mm256_maskstore_ps(xh + half + p, m, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
      }
    } else {
      for (int i = 0; i < head_dim; i += 8) {
        const __m256i m = TailMask(head_dim - i);
        const __m256 v = _mm256_maskload_ps(xh + i, m);
        const __m256 swapped = _mm256_permute_ps(v, 0xB1);  // (x1, x0, x3, x2, ...)
        const __m256 r = _mm256_fmadd_ps(v, _mm256_loadu_ps(cs.data() + i),
                                         _mm256_mul_ps(swapped, _mm256_loadu_ps(sn.data() + i)));
        _mm256_maskstore_ps(xh + i, m, r);
      }
    }
  }
}

void SwiGluAvx2(const float* g, const float* u, float* h, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = TailMask(n - i);
    const __m256 gv = _mm256_maskload_ps(g + i, m);
    const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_maskstore_ps(h + i, m, _mm256_mul_ps(silu, _mm256_maskload_ps(u + i, m)));
  }
}

void SoftmaxTopKAvx2(const float* logits, int n_expert, int k, bool renormalize, int32_t* idx, float* w) {
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 vmax = ninf;
  for (int i = 0; i < n_expert; i += 8) {
    const __m256i m = TailMask(n_expert - i);
    vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(ninf, _mm256_maskload_ps(logits + i, m), _mm256_castsi256_ps(m)));
  }
  const float max_logit = HorizontalMax(vmax);
  const __m256 vm = _mm256_set1_ps(max_logit);
  __m256 vsum = _mm256_setzero_ps();
  for (int i = 0; i < n_expert; i += 8) {
    const __m256i m = TailMask(n_expert - i);
    const __m256 e = Exp(_mm256_sub_ps(_mm256_maskload_ps(logits + i, m), vm));
    vsum = _mm256_add_ps(vsum, _mm256_and_ps(e, _mm256_castsi256_ps(m)));
  }
  SelectTopK(logits, n_expert, k, idx);
  alignas(32) float picked[8];
  float picked_sum = 0.0f;
  for (int r = 0; r < k; r += 8) {
    for (int j = 0; j < 8; ++j) picked[j] = r + j < k ? logits[idx[r + j]] : max_logit;
    _mm256_store_ps(picked, Exp(_mm256_sub_ps(_mm256_load_ps(picked), vm)));
    for (int j = 0; j < 8 && r + j < k; ++j) {
      w[r + j] = picked[j];
      picked_sum += picked[j];
    }
  }
  const float inv = 1.0f / (renormalize ? picked_sum : HorizontalSum(vsum));
  for (int r = 0; r < k; ++r) w[r] *= inv;
}

void AddAvx2(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(y + i, m, _mm256_add_ps(_mm256_maskload_ps(y + i, m), _mm256_maskload_ps(x + i, m)));
  }
}

}  // namespace

void FillAvx2Ops(KernelTable* t) {
  t->attention_block = AttentionBlockAvx2;
  t->attention_rows = Avx2Traits::kLanes * Avx2Traits::kVecs;
  t->attention_scratch_bytes = AttentionScratchBytesX86<Avx2Traits>;
  t->rms_norm_row = RmsNormRowAvx2;
  t->rope_row = RopeRowAvx2;
  t->swiglu = SwiGluAvx2;
  t->softmax_topk = SoftmaxTopKAvx2;
  t->add = AddAvx2;
}

}  // namespace estream::kernels
