// The element-wise and row kernels of every vector ISA, written once over a vector-traits class
// `S`: RMSNorm, RoPE (with its fp64 sin/cos), SwiGLU, the router's softmax + top-k, the LM head's
// log-sum-exp, residual add, and the exp / exp2 they and the attention kernels use. Instantiated
// by x86_avx2/ops_avx2.cc (8 lanes), x86_avx512/ops_avx512.cc (16 lanes) and arm_neon/ops_neon.cc
// (4 lanes), each compiled with its own ISA flags. Everything here has internal linkage
// (anonymous namespace), so the instantiations of different ISAs can never be merged by the
// linker. Internal to src/kernels.
//
// Traits S provide, for fp32 vectors V of kLanes lanes (every operation rounds once, as IEEE):
//   Zero(), Set1(x), Load(p), Store(p, v)          unaligned, kLanes values
//   LoadN(p, n), LoadN(p, n, fill)                 the first min(n, kLanes) values, other lanes 0 /
//                                                  `fill`; never reads past p + n
//   StoreN(p, v, n)                                writes min(n, kLanes) values, nothing past p + n
//   ZeroFrom(v, n)                                 lanes >= n set to 0
//   Add, Sub, Mul, Div, Max, Min; Fma(a, b, c) = a b + c, Fms(a, b, c) = a b - c,
//   Fnma(a, b, c) = c - a b (fused: one rounding)
//   ReduceAdd(v), ReduceMax(v)                     horizontal; each ISA keeps its own order
//   Round(v)                                       to nearest integer, ties to even
//   Pow2Keep(p, n, x, lim)                         p 2^n where x >= lim, else 0; n integral in
//                                                  [-126, 0], p in [0.7, 1.5] (exact: no rounding)
//   Pow2Scale(p, n)                                p 2^n rounded once, n integral in [-160, 145]
//                                                  (overflow to inf, gradual underflow)
//   SwapPairs(v)                                   (v1, v0, v3, v2, ...)
// and for fp64 vectors D of kDLanes lanes (RoPE's angles):
//   DSet1, DLoadN(p, n) (lanes >= n zero), DMul, DFma(a, b, c) = a b + c, DFnma(a, b, c) = c - a b,
//   DRound (nearest), DCosSinStore(k, c, s, cos_out, sin_out): with q = k mod 4 the quadrant,
//   stores kDLanes floats of cos(theta) and sin(theta) from c = cos r, s = sin r:
//   (c, s), (-s, c), (-c, -s), (s, -c) for q = 0..3, each rounded fp64 -> fp32.
// Thread safety: RoPE's tables are thread_local; all functions are re-entrant.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/ops_internal.h"

namespace estream::kernels {
namespace {

// 2^f for f in [-0.5, 0.5]: Taylor polynomial of degree 7 in f ln2 (truncation < 6e-9 relative;
// with Horner rounding the result is within ~1.5u).
template <class S>
inline typename S::V Exp2Poly(typename S::V f) {
  typename S::V p = S::Set1(1.5252733804059840e-05f);  // ln2^7 / 7!
  p = S::Fma(p, f, S::Set1(1.5403530393381609e-04f));  // ln2^6 / 6!
  p = S::Fma(p, f, S::Set1(1.3333558146428443e-03f));  // ln2^5 / 5!
  p = S::Fma(p, f, S::Set1(9.6181291076284772e-03f));  // ln2^4 / 4!
  p = S::Fma(p, f, S::Set1(5.5504108664821580e-02f));  // ln2^3 / 3!
  p = S::Fma(p, f, S::Set1(2.4022650695910071e-01f));  // ln2^2 / 2!
  p = S::Fma(p, f, S::Set1(6.9314718055994531e-01f));  // ln2
  return S::Fma(p, f, S::Set1(1.0f));
}

// 2^x for x <= 0 (or -inf); results below 2^-125 become exactly 0 (no denormals; the attention's
// masked keys get exactly 0).
template <class S>
inline typename S::V Exp2NonPositive(typename S::V x) {
  x = S::Max(x, S::Set1(-126.0f));  // -inf -> -126 (then zeroed)
  const typename S::V n = S::Round(x);
  return S::Pow2Keep(Exp2Poly<S>(S::Sub(x, n)), n, x, -125.0f);
}

// e^x for any x: n = round(x log2e), r = x - n ln2 in two steps (Cody-Waite with FMA: n ln2_hi is
// exact, so r carries no cancellation error), e^r = 2^(r log2e) by the polynomial above on
// [-0.5, 0.5] (within ~3u overall); Pow2Scale handles overflow to inf and gradual underflow to 0.
template <class S>
inline typename S::V Exp(typename S::V x) {
  x = S::Min(S::Max(x, S::Set1(-110.0f)), S::Set1(100.0f));
  const typename S::V n = S::Round(S::Mul(x, S::Set1(1.44269504088896340736f)));
  typename S::V r = S::Fnma(n, S::Set1(0.693359375f), x);
  r = S::Fnma(n, S::Set1(-2.12194440e-4f), r);
  return S::Pow2Scale(Exp2Poly<S>(S::Mul(r, S::Set1(1.44269504088896340736f))), n);
}

// y = x / sqrt(mean(x^2) + eps) * w: four accumulators over 4 kLanes values per step.
template <class S>
void RmsNormRowT(const float* x, const float* w, float* y, int64_t n, float eps) {
  using V = typename S::V;
  constexpr int L = S::kLanes;
  V acc[4] = {S::Zero(), S::Zero(), S::Zero(), S::Zero()};
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L)
    for (int c = 0; c < 4; ++c) {
      const V v = S::Load(x + i + L * c);
      acc[c] = S::Fma(v, v, acc[c]);
    }
  for (; i < n; i += L) {
    const V v = S::LoadN(x + i, n - i);
    acc[0] = S::Fma(v, v, acc[0]);
  }
  const float sum = S::ReduceAdd(S::Add(S::Add(acc[0], acc[1]), S::Add(acc[2], acc[3])));
  const V inv = S::Set1(1.0f / std::sqrt(sum / static_cast<float>(n) + eps));
  for (i = 0; i < n; i += L) {
    const V v = S::Mul(S::LoadN(x + i, n - i), inv);
    S::StoreN(y + i, S::Mul(v, S::LoadN(w + i, n - i)), n - i);
  }
}

// cos and sin of theta (kDLanes angles): the fp64 angle is reduced by multiples of pi/2 (two-part
// constant, FMA) to |r| <= pi/4, and Taylor polynomials of degree 11/12 give sin r and cos r to
// ~1e-11, far below fp32 rounding; the quadrant picks and signs the result (DCosSinStore).
template <class S>
inline void SinCos(typename S::D theta, float* cos_out, float* sin_out) {
  using D = typename S::D;
  const D k = S::DRound(S::DMul(theta, S::DSet1(0.63661977236758134308)));
  D r = S::DFnma(k, S::DSet1(1.5707963267948966), theta);
  r = S::DFnma(k, S::DSet1(6.123233995736766e-17), r);
  const D r2 = S::DMul(r, r);
  D s = S::DSet1(-1.0 / 39916800.0);                   // -1/11!
  s = S::DFma(s, r2, S::DSet1(1.0 / 362880.0));        // 1/9!
  s = S::DFma(s, r2, S::DSet1(-1.0 / 5040.0));         // -1/7!
  s = S::DFma(s, r2, S::DSet1(1.0 / 120.0));
  s = S::DFma(s, r2, S::DSet1(-1.0 / 6.0));
  s = S::DFma(S::DMul(s, r2), r, r);                   // sin r
  D c = S::DSet1(1.0 / 479001600.0);                   // 1/12!
  c = S::DFma(c, r2, S::DSet1(-1.0 / 3628800.0));      // -1/10!
  c = S::DFma(c, r2, S::DSet1(1.0 / 40320.0));
  c = S::DFma(c, r2, S::DSet1(-1.0 / 720.0));
  c = S::DFma(c, r2, S::DSet1(1.0 / 24.0));
  c = S::DFma(c, r2, S::DSet1(-0.5));
  c = S::DFma(c, r2, S::DSet1(1.0));                   // cos r
  S::DCosSinStore(k, c, s, cos_out, sin_out);
}

// Rotates n_heads heads of one token (kernels.h Rope). The cos/sin tables are built once per
// token; for NORM they are duplicated per element with the sign folded into sin:
// x'[2p] = x[2p] c - x[2p+1] s, x'[2p+1] = x[2p+1] c + x[2p] s.
template <class S>
void RopeRowT(float* x, int n_heads, int head_dim, int pos, const double* inv_freq, RopeMode mode) {
  using V = typename S::V;
  constexpr int L = S::kLanes, DL = S::kDLanes;
  const int half = head_dim / 2;
  thread_local std::vector<float> cs, sn;
  const size_t padded = static_cast<size_t>(head_dim) + 2 * L + 2 * DL;
  if (cs.size() < padded) {
    cs.resize(padded);
    sn.resize(padded);
  }
  const typename S::D vpos = S::DSet1(static_cast<double>(pos));
  float c[DL], s[DL];
  for (int p = 0; p < half; p += DL) {
    SinCos<S>(S::DMul(vpos, S::DLoadN(inv_freq + p, half - p)), c, s);
    if (mode == RopeMode::kNeox) {
      std::memcpy(cs.data() + p, c, sizeof(c));
      std::memcpy(sn.data() + p, s, sizeof(s));
    } else {
      for (int j = 0; j < DL; ++j) {
        cs[2 * (p + j)] = cs[2 * (p + j) + 1] = c[j];
        sn[2 * (p + j)] = -s[j];
        sn[2 * (p + j) + 1] = s[j];
      }
    }
  }
  for (int h = 0; h < n_heads; ++h) {
    float* xh = x + static_cast<int64_t>(h) * head_dim;
    if (mode == RopeMode::kNeox) {
      for (int p = 0; p < half; p += L) {
        const int rest = half - p;
        const V cv = S::Load(cs.data() + p), sv = S::Load(sn.data() + p);
        const V x0 = S::LoadN(xh + p, rest), x1 = S::LoadN(xh + half + p, rest);
        S::StoreN(xh + p, S::Fms(x0, cv, S::Mul(x1, sv)), rest);
        S::StoreN(xh + half + p, S::Fma(x0, sv, S::Mul(x1, cv)), rest);
      }
    } else {
      for (int i = 0; i < head_dim; i += L) {
        const int rest = head_dim - i;
        const V v = S::LoadN(xh + i, rest);
        const V r = S::Fma(v, S::Load(cs.data() + i), S::Mul(S::SwapPairs(v), S::Load(sn.data() + i)));
        S::StoreN(xh + i, r, rest);
      }
    }
  }
}

// h = silu(g) u = g / (1 + e^-g) u.
template <class S>
void SwiGluT(const float* g, const float* u, float* h, int64_t n) {
  using V = typename S::V;
  for (int64_t i = 0; i < n; i += S::kLanes) {
    const V gv = S::LoadN(g + i, n - i);
    const V e = Exp<S>(S::Sub(S::Zero(), gv));
    const V silu = S::Div(gv, S::Add(S::Set1(1.0f), e));
    S::StoreN(h + i, S::Mul(silu, S::LoadN(u + i, n - i)), n - i);
  }
}

// Router softmax over n_expert logits and top-k (kernels.h SoftmaxTopK): the experts are picked on
// the logits (SelectTopK, exact and the same on every ISA); their weights are e^(logit - max)
// divided by the sum over all experts (or, with renormalize, over the k picked).
template <class S>
void SoftmaxTopKT(const float* logits, int n_expert, int k, bool renormalize, int32_t* idx, float* w) {
  using V = typename S::V;
  constexpr int L = S::kLanes;
  const V ninf = S::Set1(-std::numeric_limits<float>::infinity());
  V vmax = ninf;
  for (int i = 0; i < n_expert; i += L) vmax = S::Max(vmax, S::LoadN(logits + i, n_expert - i, ninf));
  const float max_logit = S::ReduceMax(vmax);
  const V vm = S::Set1(max_logit);
  V vsum = S::Zero();
  for (int i = 0; i < n_expert; i += L) {
    const int rest = n_expert - i;
    vsum = S::Add(vsum, S::ZeroFrom(Exp<S>(S::Sub(S::LoadN(logits + i, rest), vm)), rest));
  }
  SelectTopK(logits, n_expert, k, idx);
  float picked[L];
  float picked_sum = 0.0f;
  for (int r = 0; r < k; r += L) {
    for (int j = 0; j < L; ++j) picked[j] = r + j < k ? logits[idx[r + j]] : max_logit;
    S::Store(picked, Exp<S>(S::Sub(S::Load(picked), vm)));
    for (int j = 0; j < L && r + j < k; ++j) {
      w[r + j] = picked[j];
      picked_sum += picked[j];
    }
  }
  const float inv = 1.0f / (renormalize ? picked_sum : S::ReduceAdd(vsum));
  for (int r = 0; r < k; ++r) w[r] *= inv;
}

// log(sum_i e^row[i]) (kernels.h LogSumExp). Pass 1: the max, and whether every value is finite
// (x - x is 0 for a finite x, NaN for NaN or +-inf); a row with a non-finite value goes to the
// reference, whose NaN / inf results are then the same on every ISA. Pass 2: blocks of 8 vectors,
// e^(x - max) by Exp (<= 3u each; the rounding of x - max adds |x - max| u, whose softmax-weighted
// mean is at most ln n) summed in fp32 per lane (<= 8 roundings), each block's lanes added
// horizontally (log2 kLanes <= 4 roundings) into a double: the sum is within (15 + ln n) u
// relative of the exact one, so the result within that absolute (1.6e-6 at n = 151,936).
template <class S>
double LogSumExpT(const float* row, int64_t n) {
  using V = typename S::V;
  constexpr int L = S::kLanes;
  const V ninf = S::Set1(-std::numeric_limits<float>::infinity());
  V vmax[2] = {ninf, ninf}, chk[2] = {S::Zero(), S::Zero()};
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L)
    for (int c = 0; c < 2; ++c) {
      const V v = S::Load(row + i + c * L);
      vmax[c] = S::Max(vmax[c], v);
      chk[c] = S::Add(chk[c], S::Sub(v, v));
    }
  for (; i < n; i += L) {
    const V v = S::LoadN(row + i, n - i);  // lanes past n: 0, finite and ignored below
    vmax[0] = S::Max(vmax[0], S::LoadN(row + i, n - i, ninf));
    chk[0] = S::Add(chk[0], S::Sub(v, v));
  }
  if (S::ReduceAdd(S::Add(chk[0], chk[1])) != 0.0f) return LogSumExpRef(row, n);
  const float mx = S::ReduceMax(S::Max(vmax[0], vmax[1]));
  const V vm = S::Set1(mx);
  double sum = 0;
  for (i = 0; i < n;) {
    V acc = S::Zero();
    for (int s = 0; s < 8 && i < n; ++s, i += L)
      acc = S::Add(acc, S::ZeroFrom(Exp<S>(S::Sub(S::LoadN(row + i, n - i), vm)), n - i));
    sum += S::ReduceAdd(acc);
  }
  return mx + std::log(sum);
}

// y += x.
template <class S>
void AddT(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + S::kLanes <= n; i += S::kLanes) S::Store(y + i, S::Add(S::Load(y + i), S::Load(x + i)));
  if (i < n) S::StoreN(y + i, S::Add(S::LoadN(y + i, n - i), S::LoadN(x + i, n - i)), n - i);
}

// Sets the row-op entries of the table to S's instantiations.
template <class S>
void FillRowOps(KernelTable* t) {
  t->rms_norm_row = RmsNormRowT<S>;
  t->rope_row = RopeRowT<S>;
  t->swiglu = SwiGluT<S>;
  t->softmax_topk = SoftmaxTopKT<S>;
  t->log_sum_exp = LogSumExpT<S>;
  t->add = AddT<S>;
}

}  // namespace
}  // namespace estream::kernels
