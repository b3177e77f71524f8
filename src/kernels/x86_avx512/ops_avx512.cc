// AVX-512 (F/DQ/VL) kernels: causal attention (attention_x86_impl.h with 16-lane traits),
// RMSNorm, RoPE, SwiGLU, router softmax, residual add. Compiled with the AVX-512 flags only;
// reached through the dispatch table when the host has AVX-512.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/attention_lowp.h"
#include "kernels/attention_x86_impl.h"
#include "kernels/x86_avx512/attention_amx.h"
#include "kernels/dispatch.h"
#include "kernels/ops_internal.h"

// GCC 12 reports the _mm512_undefined_* operand inside some intrinsics (_mm512_reduce_add_ps,
// unpack/shuffle) as uninitialised: a false positive, as in gemm_amx.cc.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace estream::kernels {
namespace {

// 2^f for f in [-0.5, 0.5]: Taylor polynomial of degree 7 in f ln2 (truncation < 6e-9 relative;
// with Horner rounding the result is within ~1.5u).
inline __m512 Exp2Poly(__m512 f) {
  __m512 p = _mm512_set1_ps(1.5252733804059840e-05f);  // ln2^7 / 7!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381609e-04f));  // ln2^6 / 6!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));  // ln2^5 / 5!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-03f));  // ln2^4 / 4!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-02f));  // ln2^3 / 3!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-01f));  // ln2^2 / 2!
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-01f));  // ln2
  return _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
}

// 2^x for x <= 0 (or -inf); results below 2^-125 become exactly 0 (no denormals, masked keys 0).
inline __m512 Exp2NonPositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.0f));  // -inf -> -126 (then zeroed below)
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_maskz_scalef_ps(keep, Exp2Poly(_mm512_sub_ps(x, n)), n);
}

// e^x for any x: n = round(x log2e), r = x - n ln2 in two steps (Cody-Waite with FMA: n ln2_hi
// is exact, so r carries no cancellation error), e^r = 2^(r log2e) by the same polynomial on
// [-0.5, 0.5] in units of ln2 (within ~3u overall); scalef handles overflow to inf and gradual
// underflow to 0.
inline __m512 Exp(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-110.0f)), _mm512_set1_ps(100.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896340736f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  return _mm512_scalef_ps(Exp2Poly(_mm512_mul_ps(r, _mm512_set1_ps(1.44269504088896340736f))), n);
}

inline __mmask16 TailMask(int64_t rest) { return rest >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << rest) - 1); }

struct Avx512Traits {
  using V = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kVecs = 4;     // 64 query rows per tile
  static constexpr int kQkRows = 6;   // 6 keys x 4 vectors = 24 accumulators
  static constexpr int kKeys = 64;    // keys per block (ST is kKeys x kQ floats)
  static constexpr int kPvRows = 4;   // 4 head dims x 4 vectors (no tail for head_dim % 4 == 0)
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Div(V a, V b) { return _mm512_div_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V MaskBelow(V s, int lane0, int limit) {
    const __m512i lane = _mm512_add_epi32(_mm512_set1_epi32(lane0),
                                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __mmask16 below = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(limit));
    return _mm512_mask_mov_ps(s, below, _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
  }
  static V Exp2(V x) { return Exp2NonPositive(x); }
  // dst[c][r] = src[r][c] * scale for a 16 x 16 block (rows at stride lds / ldd).
  static void Transpose(const float* src, int64_t lds, float scale, float* dst, int64_t ldd) {
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 r[16], t[16];
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 16; ++i) r[i] = _mm512_mul_ps(_mm512_loadu_ps(src + i * lds), sc);
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    _Pragma("GCC unroll 16")
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
      r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
      r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
      r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    // r[4b + j] now holds, in each 128-bit lane L, elements (row 4b..4b+3, column 4L + j).
    _Pragma("GCC unroll 16")
    for (int j = 0; j < 4; ++j) {
      t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);       // lanes 0, 2 of rows 0-3 | 4-7
      t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);   // lanes 1, 3
      t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
      t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    }
    _Pragma("GCC unroll 16")
    for (int j = 0; j < 4; ++j) {
      // column j + 4L for L = 0..3: (rows 0-7 | 8-15) from the lane pairs above.
      _mm512_storeu_ps(dst + (j + 0) * ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88));
      _mm512_storeu_ps(dst + (j + 8) * ldd, _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD));
      _mm512_storeu_ps(dst + (j + 4) * ldd, _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88));
      _mm512_storeu_ps(dst + (j + 12) * ldd, _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD));
    }
  }
};

void AttentionBlockAvx512(const AttentionArgs& a, int head_begin, int head_end, int t_begin, int t_end) {
  AttentionBlockX86<Avx512Traits>(a, head_begin, head_end, t_begin, t_end);
}

void RmsNormRowAvx512(const float* x, const float* w, float* y, int64_t n, float eps) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int c = 0; c < 4; ++c) {
      const __m512 v = _mm512_loadu_ps(x + i + 16 * c);
      acc[c] = _mm512_fmadd_ps(v, v, acc[c]);
    }
  for (; i < n; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(TailMask(n - i), x + i);
    acc[0] = _mm512_fmadd_ps(v, v, acc[0]);
  }
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(sum / static_cast<float>(n) + eps));
  for (i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
  }
}

// cos and sin of theta = pos * inv_freq[p] for 8 pairs: the fp64 angle is reduced by multiples of
// pi/2 (two-part constant, FMA) to |r| <= pi/4, and Taylor polynomials of degree 11/12 give sin r
// and cos r to ~1e-11, far below fp32 rounding; the quadrant picks and signs the result.
inline void SinCos8(__m512d theta, __m256* c_out, __m256* s_out) {
  const __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(theta, _mm512_set1_pd(0.63661977236758134308)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(1.5707963267948966), theta);
  r = _mm512_fnmadd_pd(k, _mm512_set1_pd(6.123233995736766e-17), r);
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d s = _mm512_set1_pd(-1.0 / 39916800.0);                      // -1/11!
  s = _mm512_fmadd_pd(s, r2, _mm512_set1_pd(1.0 / 362880.0));         // 1/9!
  s = _mm512_fmadd_pd(s, r2, _mm512_set1_pd(-1.0 / 5040.0));          // -1/7!
  s = _mm512_fmadd_pd(s, r2, _mm512_set1_pd(1.0 / 120.0));
  s = _mm512_fmadd_pd(s, r2, _mm512_set1_pd(-1.0 / 6.0));
  s = _mm512_fmadd_pd(_mm512_mul_pd(s, r2), r, r);                      // sin r
  __m512d c = _mm512_set1_pd(1.0 / 479001600.0);                      // 1/12!
  c = _mm512_fmadd_pd(c, r2, _mm512_set1_pd(-1.0 / 3628800.0));       // -1/10!
  c = _mm512_fmadd_pd(c, r2, _mm512_set1_pd(1.0 / 40320.0));
  c = _mm512_fmadd_pd(c, r2, _mm512_set1_pd(-1.0 / 720.0));
  c = _mm512_fmadd_pd(c, r2, _mm512_set1_pd(1.0 / 24.0));
  c = _mm512_fmadd_pd(c, r2, _mm512_set1_pd(-0.5));
  c = _mm512_fmadd_pd(c, r2, _mm512_set1_pd(1.0));                    // cos r
  // quadrant q = k mod 4: (cos, sin) of theta = (c, s), (-s, c), (-c, -s), (s, -c).
  const __m256i q = _mm512_cvtpd_epi32(k);
  const __mmask8 odd = _mm256_test_epi32_mask(q, _mm256_set1_epi32(1));
  const __mmask8 neg_cos = _mm256_test_epi32_mask(_mm256_add_epi32(q, _mm256_set1_epi32(1)), _mm256_set1_epi32(2));
  const __mmask8 neg_sin = _mm256_test_epi32_mask(q, _mm256_set1_epi32(2));
  __m512d cos_t = _mm512_mask_blend_pd(odd, c, s);
  __m512d sin_t = _mm512_mask_blend_pd(odd, s, c);
  const __m512d zero = _mm512_setzero_pd();
  cos_t = _mm512_mask_sub_pd(cos_t, neg_cos, zero, cos_t);
  sin_t = _mm512_mask_sub_pd(sin_t, neg_sin, zero, sin_t);
  *c_out = _mm512_cvtpd_ps(cos_t);
  *s_out = _mm512_cvtpd_ps(sin_t);
}

void RopeRowAvx512(float* x, int n_heads, int head_dim, int pos, const double* inv_freq, RopeMode mode) {
  const int half = head_dim / 2;
  // Tables of cos/sin per pair; for NORM, duplicated per element with the sign folded into sin:
  // x'[2p] = x[2p] c - x[2p+1] s, x'[2p+1] = x[2p+1] c + x[2p] s.
  thread_local std::vector<float> cs, sn;
  const size_t padded = (static_cast<size_t>(head_dim) + 15) / 16 * 16 + 16;
  if (cs.size() < padded) {
    cs.resize(padded);
    sn.resize(padded);
  }
  const __m512d vpos = _mm512_set1_pd(static_cast<double>(pos));
  for (int p = 0; p < half; p += 8) {
    const __mmask8 m = static_cast<__mmask8>(half - p >= 8 ? 0xFF : (1u << (half - p)) - 1);
    __m256 c, s;
    SinCos8(_mm512_mul_pd(vpos, _mm512_maskz_loadu_pd(m, inv_freq + p)), &c, &s);
    if (mode == RopeMode::kNeox) {
      _mm256_storeu_ps(cs.data() + p, c);
      _mm256_storeu_ps(sn.data() + p, s);
    } else {
      // interleave: (c0, c0, c1, c1, ...), (-s0, s0, -s1, s1, ...)
      const __m512i idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
      const __m512 c2 = _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(c));
      __m512 s2 = _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(s));
      s2 = _mm512_mask_sub_ps(s2, 0x5555, _mm512_setzero_ps(), s2);
      _mm512_storeu_ps(cs.data() + 2 * p, c2);
      _mm512_storeu_ps(sn.data() + 2 * p, s2);
    }
  }
  for (int h = 0; h < n_heads; ++h) {
    float* xh = x + static_cast<int64_t>(h) * head_dim;
    if (mode == RopeMode::kNeox) {
      for (int p = 0; p < half; p += 16) {
        const __mmask16 m = TailMask(half - p);
        const __m512 c = _mm512_loadu_ps(cs.data() + p), s = _mm512_loadu_ps(sn.data() + p);
        const __m512 x0 = _mm512_maskz_loadu_ps(m, xh + p), x1 = _mm512_maskz_loadu_ps(m, xh + half + p);
        _mm512_mask_storeu_ps(xh + p, m, _mm512_fmsub_ps(x0, c, _mm512_mul_ps(x1, s)));
        _mm512_mask_storeu_ps(xh + half + p, m, _mm512_fmadd_ps(x0, s, _mm512_mul_ps(x1, c)));
      }
    } else {
      for (int i = 0; i < head_dim; i += 16) {
        const __mmask16 m = TailMask(head_dim - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, xh + i);
        const __m512 swapped = _mm512_permute_ps(v, 0xB1);  // (x1, x0, x3, x2, ...)
        const __m512 r = _mm512_fmadd_ps(v, _mm512_loadu_ps(cs.data() + i),
                                         _mm512_mul_ps(swapped, _mm512_loadu_ps(sn.data() + i)));
        _mm512_mask_storeu_ps(xh + i, m, r);
      }
    }
  }
}

void SwiGluAvx512(const float* g, const float* u, float* h, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

void SoftmaxTopKAvx512(const float* logits, int n_expert, int k, bool renormalize, int32_t* idx, float* w) {
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int i = 0; i < n_expert; i += 16)
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, TailMask(n_expert - i), logits + i));
  const float max_logit = _mm512_reduce_max_ps(vmax);
  const __m512 vm = _mm512_set1_ps(max_logit);
  __m512 vsum = _mm512_setzero_ps();
  for (int i = 0; i < n_expert; i += 16) {
    const __mmask16 m = TailMask(n_expert - i);
    vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, logits + i), vm))));
  }
  SelectTopK(logits, n_expert, k, idx);
  alignas(64) float picked[16];
  float picked_sum = 0.0f;
  for (int r = 0; r < k; r += 16) {
    const __mmask16 m = TailMask(k - r);
    const __m512i vi = _mm512_maskz_loadu_epi32(m, idx + r);
    const __m512 e = Exp(_mm512_sub_ps(_mm512_mask_i32gather_ps(vm, m, vi, logits, 4), vm));
    _mm512_store_ps(picked, e);
    for (int j = 0; j < 16 && r + j < k; ++j) {
      w[r + j] = picked[j];
      picked_sum += picked[j];
    }
  }
  const float inv = 1.0f / (renormalize ? picked_sum : _mm512_reduce_add_ps(vsum));
  for (int r = 0; r < k; ++r) w[r] *= inv;
}

void AddAvx512(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
  }
}

}  // namespace

// Without a selected AMX kernel, the bf16 entries carry the int8/bf16 attention
// (attention_lowp.h) unless ESTREAM_ATTN_LOWP is "0".
void FillAvx512Ops(KernelTable* t) {
  FillAvx512OpsWith(t, AttentionAmxSelected());
  if (!AttentionAmxSelected() && AttentionLowpSelected()) FillAttentionLowpAvx512(t);
}

void FillAvx512OpsWith(KernelTable* t, bool use_amx) {
  t->attention_block = AttentionBlockAvx512;
  t->attention_rows = Avx512Traits::kLanes * Avx512Traits::kVecs;
  t->attention_scratch_bytes = AttentionScratchBytesX86<Avx512Traits>;
  t->attention_convert_bf16 = use_amx ? AttentionAmxConvertKv : nullptr;
  t->attention_kv_bytes_bf16 = use_amx ? AttentionAmxKvBytes : nullptr;
  t->attention_kv_block_bf16 = use_amx ? kAmxAttnKeys : 0;
  t->attention_block_bf16 = use_amx ? AttentionBlockAmx : nullptr;
  t->attention_rows_bf16 = use_amx ? kAmxAttnRows : 0;
  t->attention_exact_rows_bf16 = 0;
  t->attention_scratch_bytes_bf16 = use_amx ? AttentionAmxScratchBytes : nullptr;
  t->rms_norm_row = RmsNormRowAvx512;
  t->rope_row = RopeRowAvx512;
  t->swiglu = SwiGluAvx512;
  t->softmax_topk = SoftmaxTopKAvx512;
  t->add = AddAvx512;
}

}  // namespace estream::kernels
