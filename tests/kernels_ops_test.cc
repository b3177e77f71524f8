// Tests of the non-GEMM kernels: causal attention, RMSNorm, RoPE, SwiGLU, router softmax + top-k,
// residual add.
//
// Every vectorised path (KernelsFor(kAvx2 / kAvx512), where the host has it) is compared with the
// scalar reference on fresh random inputs of awkward sizes, outputs poisoned with NaN first; the
// scalar references are compared with independent fp64 naive code. Tolerances are derived in the
// comments from the length of each reduction; u = 2^-24 is the fp32 unit roundoff and
// gamma(n) = n u / (1 - n u) bounds the relative error of an n-term fp32 sum of same-sign terms
// (Higham, Accuracy and Stability of Numerical Algorithms, ch. 3).
//
// The seed is fresh per run and printed on failure; ESTREAM_TEST_SEED=<n> replays a run.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/memory.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/ops_internal.h"
#include "kernels_test_util.h"
#include "test_quick.h"

namespace estream::kernels {
namespace {

using kernels_test::IsasToTest;
using kernels_test::kNaN;
using kernels_test::kU;
using kernels_test::Rng;
using kernels_test::TestSeed;

double Gamma(double n) { return n * kU / (1.0 - n * kU); }

// The fp32 attention of each ISA: KernelsFor(isa) without the bf16 attention entries, which carry
// the AMX-BF16 kernel (tested below with its own tolerance), x86's int8 kernels of attention_lowp.h
// (every AVX2 and AVX-512 level) and the AArch64 BFDOT kernel (every level of a FEAT_BF16 host;
// those two tested in attention_lowp_test.cc).
const KernelTable& Fp32Table(Isa isa) {
  static const std::vector<KernelTable> tables = [] {
    std::vector<KernelTable> t;
    for (int i = 0; i <= static_cast<int>(HostIsa()); ++i) {
      KernelTable k = KernelsFor(static_cast<Isa>(i));
      k.attention_convert_bf16 = nullptr;
      k.attention_kv_bytes_bf16 = nullptr;
      k.attention_kv_block_bf16 = 0;
      k.attention_block_bf16 = nullptr;
      k.attention_rows_bf16 = 0;
      k.attention_first_rows_bf16 = 0;
      k.attention_first_split_bf16 = 0;
      k.attention_scratch_bytes_bf16 = nullptr;
      t.push_back(k);
    }
    return t;
  }();
  return tables[static_cast<int>(isa)];
}

// The AVX-512 table with the AMX-BF16 attention, or null where the host cannot run it.
const KernelTable* AmxTable() {
#if !defined(__x86_64__)
  return nullptr;
#else
  if (HostIsa() != Isa::kAvx512 || !AttentionAmxUsable()) return nullptr;
  static const KernelTable t = [] {
    KernelTable k = KernelsFor(Isa::kAvx512);
    FillAvx512OpsWith(&k, /*use_amx=*/true);
    return k;
  }();
  return &t;
#endif
}

// ---- attention ------------------------------------------------------------------------------

using kernels_test::AttnShape;
using kernels_test::Name;

// The shared attention problem (kernels_test_util.h) and, per kv head, the running maxima over
// keys 0..t of |k_j| (Euclidean) and max_i |v_j[i]| that the tolerances use.
struct AttnProblem : kernels_test::AttnProblem {
  AttnProblem(const AttnShape& shape, uint32_t salt, float amplitude = 2.0f)
      : kernels_test::AttnProblem(shape, salt, amplitude) {
    k_norm_max.assign(static_cast<size_t>(s.n_head_kv) * s.n_tokens, 0.0);
    v_abs_max.assign(static_cast<size_t>(s.n_head_kv) * s.n_tokens, 0.0);
    for (int h = 0; h < s.n_head_kv; ++h)
      for (int t = 0; t < s.n_tokens; ++t) {
        double kn = 0, va = 0;
        for (int i = 0; i < s.head_dim; ++i) {
          kn += static_cast<double>(K(t, h)[i]) * K(t, h)[i];
          va = std::max(va, std::fabs(static_cast<double>(V(t, h)[i])));
        }
        const size_t at = static_cast<size_t>(h) * s.n_tokens + t;
        k_norm_max[at] = std::max(std::sqrt(kn), t > 0 ? k_norm_max[at - 1] : 0.0);
        v_abs_max[at] = std::max(va, t > 0 ? v_abs_max[at - 1] : 0.0);
      }
  }
  std::vector<double> k_norm_max, v_abs_max;
};

// Independent fp64 attention for query row t of head h (materialises the row of scores).
std::vector<double> NaiveAttentionRow(const AttnProblem& p, int h, int t) {
  const int d = p.s.head_dim;
  const int kvh = p.KvHead(h);
  std::vector<double> s(t + 1);
  double m = -INFINITY;
  for (int j = 0; j <= t; ++j) {
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += static_cast<double>(p.Q(t, h)[i]) * p.K(j, kvh)[i];
    s[j] = dot * static_cast<double>(p.scale);
    m = std::max(m, s[j]);
  }
  std::vector<double> o(d, 0.0);
  double l = 0;
  for (int j = 0; j <= t; ++j) {
    const double w = std::exp(s[j] - m);
    l += w;
    for (int i = 0; i < d; ++i) o[i] += w * p.V(j, kvh)[i];
  }
  for (double& x : o) x /= l;
  return o;
}

// Checks rows [t_begin, t_end) of `out` against `expected(h, t)` with a per-row tolerance, and
// that the row padding beyond n_head * head_dim is still NaN. Stops after a few reported errors.
template <typename Expected, typename Tol>
void CheckAttentionRows(const AttnProblem& p, const std::vector<float>& out, int t_begin, int t_end,
                        Expected expected, Tol tol, const std::string& what) {
  int errors = 0;
  for (int t = t_begin; t < t_end && errors < 5; ++t) {
    for (int h = 0; h < p.s.n_head && errors < 5; ++h) {
      const std::vector<double> e = expected(h, t);
      const double tl = tol(h, t);
      const float* o = out.data() + t * p.ldo + h * p.s.head_dim;
      for (int i = 0; i < p.s.head_dim; ++i) {
        if (!(std::fabs(o[i] - e[i]) <= tl)) {
          ADD_FAILURE() << what << " " << Name(p.s) << ": t=" << t << " head=" << h << " i=" << i << " got "
                        << o[i] << " want " << e[i] << " tol " << tl;
          if (++errors >= 5) break;
        }
      }
    }
    if (!kernels_test::PaddingIntact(p, out, t, what)) ++errors;
  }
}

// Reference outputs (scalar table) for rows [t_begin, t_end), as doubles per (h, t).
std::vector<float> ReferenceAttention(const AttnProblem& p, int t_begin, int t_end) {
  std::vector<float> out = p.Poisoned();
  const AttentionArgs a = p.Args(out.data());
  for (int h = 0; h < p.s.n_head; ++h) KernelsFor(Isa::kScalar).attention_block(a, h, h + 1, t_begin, t_end);
  return out;
}

// Tolerance of an fp32 attention path against the exact result, for query row t of head h:
//  - a score s = scale q.k computed in fp32 (fused multiply-adds over head_dim terms, then the
//    scale and the log2(e) conversion) has |ds| <= gamma(head_dim + 3) scale |q| max_j |k_j|
//    (Cauchy-Schwarz bounds sum |q_i k_i| by |q| |k|);
//  - softmax weights then change by a factor within exp(+-2 ds) (numerator and running max both
//    shift), plus the exp approximation's relative error (<= 4u in our kernels, 8u allowed);
//  - sum_j p_j v_j and sum_j p_j are fp32 sums of at most t + 1 terms: relative gamma(t + 1) each,
//    measured against sum_j p_j |v_j| <= max|v| sum_j p_j;
//  - the final division and store: 2u.
// So |o - exact| <= max|v| (2 (2 ds + 8u) + 2 gamma(t + 1) + 2u).
double FastAttentionTol(const AttnProblem& p, int h, int t) {
  double qn = 0;
  for (int i = 0; i < p.s.head_dim; ++i) qn += static_cast<double>(p.Q(t, h)[i]) * p.Q(t, h)[i];
  const size_t at = static_cast<size_t>(p.KvHead(h)) * p.s.n_tokens + t;
  const double ds = Gamma(p.s.head_dim + 3) * p.scale * std::sqrt(qn) * p.k_norm_max[at];
  return p.v_abs_max[at] * (2 * (2 * ds + 8 * kU) + 2 * Gamma(t + 1) + 2 * kU);
}

std::vector<double> RowOf(const AttnProblem& p, const std::vector<float>& out, int h, int t) {
  const float* o = out.data() + t * p.ldo + h * p.s.head_dim;
  return std::vector<double>(o, o + p.s.head_dim);
}

// The scalar reference accumulates in fp64 and rounds once: it must match naive fp64 attention
// to the rounding of the output (u |o| <= u max|v|) plus fp64 noise; 2u max|v| with max|v| <= 1.
TEST(AttentionRef, MatchesNaiveFp64) {
  SEED_TRACE();
  const AttnShape shapes[] = {{1, 4, 4, 64},   {2, 8, 2, 128},  {3, 4, 4, 32},  {7, 8, 2, 64},
                              {31, 32, 4, 128}, {64, 4, 1, 48}, {65, 6, 3, 40}, {127, 2, 2, 72},
                              {513, 2, 1, 64}};
  uint32_t salt = 1;
  for (const AttnShape& s : shapes) {
    const AttnProblem p(s, salt++);
    // Uneven blocks (37 rows) exercise arbitrary [t_begin, t_end) splits.
    std::vector<float> out = p.Poisoned();
    const AttentionArgs a = p.Args(out.data());
    for (int h = 0; h < s.n_head; ++h)
      for (int t0 = 0; t0 < s.n_tokens; t0 += 37)
        KernelsFor(Isa::kScalar).attention_block(a, h, h + 1, t0, std::min(s.n_tokens, t0 + 37));
    CheckAttentionRows(
        p, out, 0, s.n_tokens, [&](int h, int t) { return NaiveAttentionRow(p, h, t); },
        [](int, int) { return 2 * kU; }, "scalar vs fp64");
  }
}

TEST(Attention, EveryIsaMatchesReference) {
  SEED_TRACE();
  std::vector<AttnShape> shapes;
  for (int t : {1, 2, 3, 7, 31, 64, 65, 127, 513}) {
    shapes.push_back({t, 4, 4, 64});
    shapes.push_back({t, 8, 2, 128});
    if (t <= 127) shapes.push_back({t, 32, 4, 128});
  }
  // Head sizes of tiny models and other multiples of 8 or 16.
  for (int d : {32, 40, 48, 80, 96, 192}) shapes.push_back({67, 4, 2, d});
  // DeepSeek-V2's multi-head latent attention, decompressed: q/k heads of 192 (128 + 64 rope), one
  // kv head per query head (model/mla.h).
  shapes.push_back({130, 16, 16, 192});
  // Under emulation (test::QuickTests): one and several row tiles, GQA and a ragged head size.
  if (test::QuickTests()) shapes = {{1, 4, 4, 64}, {65, 4, 4, 64}, {31, 8, 2, 128}, {67, 4, 2, 40}};
  uint32_t salt = 100;
  for (const AttnShape& s : shapes) {
    const AttnProblem p(s, salt++);
    const std::vector<float> ref = ReferenceAttention(p, 0, s.n_tokens);
    std::vector<decltype(KernelTable::attention_block)> tested;  // inherited kernels run once
    for (Isa isa : IsasToTest()) {
      SCOPED_TRACE(IsaName(isa));
      const KernelTable& kt = Fp32Table(isa);
      if (std::find(tested.begin(), tested.end(), kt.attention_block) != tested.end()) continue;
      tested.push_back(kt.attention_block);
      // Through the public work split on 2 threads.
      std::vector<float> out = p.Poisoned();
      omp_set_num_threads(2);
      AttentionPrefillWith(kt, p.Args(out.data()));
      CheckAttentionRows(
          p, out, 0, s.n_tokens, [&](int h, int t) { return RowOf(p, ref, h, t); },
          [&](int h, int t) { return FastAttentionTol(p, h, t) + 2 * kU; }, IsaName(isa));
      // And with uneven calls (the table entry accepts any rows and any heads of one kv group):
      // one head at a time over 29 rows, and whole GQA groups over 150 rows.
      for (const auto& [heads, rows] : {std::pair{1, 29}, std::pair{s.n_head / s.n_head_kv, 150}}) {
        out = p.Poisoned();
        const AttentionArgs a = p.Args(out.data());
        for (int h = 0; h < s.n_head; h += heads)
          for (int t0 = 0; t0 < s.n_tokens; t0 += rows)
            kt.attention_block(a, h, h + heads, t0, std::min(s.n_tokens, t0 + rows));
        CheckAttentionRows(
            p, out, 0, s.n_tokens, [&](int h, int t) { return RowOf(p, ref, h, t); },
            [&](int h, int t) { return FastAttentionTol(p, h, t) + 2 * kU; },
            std::string(IsaName(isa)) + " calls of " + std::to_string(heads) + " heads x " +
                std::to_string(rows) + " rows");
      }
    }
  }
}

// AttentionArgs::q_begin (the engine's tree attention): only rows [q_begin, n_tokens) are
// computed, each bit-identical to the full call's row (key blocks start at key 0 whatever the row
// tiles), and rows before q_begin of out stay untouched (NaN).
TEST(Attention, QueryRowsFromQBegin) {
  uint32_t salt = 900;
  for (const AttnShape& s : {AttnShape{70, 4, 2, 64}, AttnShape{129, 8, 2, 128}, AttnShape{5, 4, 4, 32}}) {
    const AttnProblem p(s, salt++);
    for (Isa isa : IsasToTest()) {
      SCOPED_TRACE(IsaName(isa));
      const KernelTable& kt = Fp32Table(isa);
      omp_set_num_threads(2);
      std::vector<float> full = p.Poisoned();
      AttentionPrefillWith(kt, p.Args(full.data()));
      for (int q_begin : {0, 1, s.n_tokens / 2, s.n_tokens - 1, s.n_tokens}) {
        std::vector<float> out = p.Poisoned();
        AttentionArgs a = p.Args(out.data());
        a.q_begin = q_begin;
        AttentionPrefillWith(kt, a);
        for (int t = 0; t < s.n_tokens; ++t)
          for (int64_t i = 0; i < p.ldo; ++i) {
            const float got = out[t * p.ldo + i], want = full[t * p.ldo + i];
            if (t < q_begin || std::isnan(want)) {
              ASSERT_TRUE(std::isnan(got)) << "row " << t << " before q_begin " << q_begin << " was written";
            } else {
              ASSERT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << "row " << t << " q_begin " << q_begin;
            }
          }
      }
    }
  }
}

// Long prompts on a few heads; only the last rows (the most keys) and one early block are checked
// against the reference, to keep the test fast. The reference itself is checked against fp64 on
// two of those rows.
TEST(Attention, LongPrompts) {
  SEED_TRACE();
  if (test::QuickTests()) GTEST_SKIP() << "ESTREAM_TEST_QUICK: long prompts are too slow under emulation";
  const AttnShape shapes[] = {{4096, 2, 1, 128}, {8192, 1, 1, 64}};
  uint32_t salt = 500;
  for (const AttnShape& s : shapes) {
    const AttnProblem p(s, salt++);
    const int tail = s.n_tokens - 67;
    const std::vector<float> ref_tail = ReferenceAttention(p, tail, s.n_tokens);
    const std::vector<float> ref_head = ReferenceAttention(p, 100, 140);
    CheckAttentionRows(
        p, ref_tail, s.n_tokens - 2, s.n_tokens, [&](int h, int t) { return NaiveAttentionRow(p, h, t); },
        [](int, int) { return 2 * kU; }, "scalar vs fp64");
    for (Isa isa : IsasToTest()) {
      if (isa == Isa::kScalar) continue;
      SCOPED_TRACE(IsaName(isa));
      std::vector<float> out = p.Poisoned();
      omp_set_num_threads(2);
      AttentionPrefillWith(Fp32Table(isa), p.Args(out.data()));
      auto tol = [&](int h, int t) { return FastAttentionTol(p, h, t) + 2 * kU; };
      CheckAttentionRows(
          p, out, tail, s.n_tokens, [&](int h, int t) { return RowOf(p, ref_tail, h, t); }, tol, IsaName(isa));
      CheckAttentionRows(
          p, out, 100, 140, [&](int h, int t) { return RowOf(p, ref_head, h, t); }, tol, IsaName(isa));
    }
  }
}

// ---- AMX-BF16 attention ----------------------------------------------------------------------
//
// The AMX kernel (x86_avx512/attention_amx.h) rounds q * scale * log2(e) (an fp32 product), k and
// v to bf16 (round to nearest even, unit roundoff u_b = 2^-8), multiplies on the tile unit with
// exact products and fp32 accumulation, and rounds P = 2^(s - m) to bf16 for the PV product
// (its fp32 value goes into the denominator l). Two checks per output row, both against fp64:
//
// (1) vs fp64 attention on the same bf16-rounded inputs (scores in log2 units s~_j = q^ . k^_j,
//     o~ = sum_j w~_j v^_j): what is left is the kernel's own arithmetic:
//     - each score accumulates d exact products in fp32: |ds_j| <= gamma(d) sum_i |q^_i k^_ji|;
//       weights then move by factors within 2^(+-2 ds) (numerator and max both shift);
//     - exp2: degree-3 polynomial (< 7.5e-5 relative) plus the rounding of x = s - m (|x| <= 126
//       where the result is not negligible: ln2 * 126 * 2^-24 < 5.3e-6 relative; the split of x
//       into integer and fraction is exact): e_exp = 2^-13 > 8.1e-5;
//     - P rounded to bf16 in the numerator only: |sum_j w_j eps_j v_j| <= u_b max|v^|;
//     - fp32 sums over t + 1 keys and at most one rescale per block of 64 keys: gamma(2 (t + 1))
//       each for numerator and denominator; the final division and store 2u.
//     tol1 = max|v^| (2 (2 ln2 ds + e_exp) + u_b + 2 gamma(2 t + 2) + 2u).
//     This is the check that catches a wrong key, mask or rescale: tol1 is ~4e-3 max|v|.
// (2) vs fp64 attention on the exact inputs: add the effect of rounding the inputs. Each product
//     q^_i k^_i = c q_i k_i (1 + d1)(1 + d2)(1 + d3) with |d1| <= u (the fp32 scaling),
//     |d2|, |d3| <= u_b, so |ds_j| <= D = (2 u_b + u_b^2 + 2u) max_j c sum_i |q_i k_ji| (log2
//     units). Weights w~_j = w_j 2^(D_j) / sum_k w_k 2^(D_k) satisfy |w~_j - w_j| <= w_j (2^(2D) - 1),
//     and since sum_j (w~_j - w_j) = 0, |sum_j (w~_j - w_j) v_j| <= (2^(2D) - 1) sum_j w_j |v_j - o|;
//     rounding v adds u_b max|v|. tol2 = tol1 + (2^(2D) - 1) max_i sum_j w_j |v_ji - o_i| + u_b max|v|.
//     This worst case is loose (it assumes every rounding of a dot product goes the same way; the
//     observed errors are ~20x smaller, printed by the test), but it is a bound.
constexpr double kUb = 0x1p-8;  // bf16 unit roundoff
constexpr double kExpErr = 0x1p-13;
constexpr float kLog2eF = 1.44269504088896340736f;

float RoundBf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b += 0x7FFFu + ((b >> 16) & 1u);
  b &= 0xFFFF0000u;
  float y;
  std::memcpy(&y, &b, 4);
  return y;
}

struct AmxRowRef {
  std::vector<double> exact, rounded;
  double tol_rounded = 0, tol_exact = 0;
};

AmxRowRef AmxReferenceRow(const AttnProblem& p, int h, int t) {
  const int d = p.s.head_dim;
  const int kvh = p.KvHead(h);
  const float c_f = p.scale * kLog2eF;  // as the kernel forms it
  const double c = c_f;
  std::vector<double> qh(d);
  for (int i = 0; i < d; ++i) qh[i] = RoundBf16(p.Q(t, h)[i] * c_f);
  std::vector<double> s(t + 1), sr(t + 1);
  double m = -INFINITY, mr = -INFINITY, ds32 = 0, a_max = 0, v_max = 0;
  for (int j = 0; j <= t; ++j) {
    double dot = 0, dotr = 0, abs_r = 0, abs_e = 0;
    for (int i = 0; i < d; ++i) {
      const double kji = p.K(j, kvh)[i];
      const double kr = RoundBf16(p.K(j, kvh)[i]);
      dot += static_cast<double>(p.Q(t, h)[i]) * kji;
      dotr += qh[i] * kr;
      abs_r += std::fabs(qh[i] * kr);
      abs_e += std::fabs(static_cast<double>(p.Q(t, h)[i]) * kji);
      v_max = std::max(v_max, std::fabs(static_cast<double>(p.V(j, kvh)[i])));
    }
    s[j] = dot * c;  // log2 units
    sr[j] = dotr;
    m = std::max(m, s[j]);
    mr = std::max(mr, sr[j]);
    ds32 = std::max(ds32, Gamma(d) * abs_r);
    a_max = std::max(a_max, c * abs_e);
  }
  AmxRowRef r;
  r.exact.assign(d, 0.0);
  r.rounded.assign(d, 0.0);
  std::vector<double> w(t + 1);
  double l = 0, lr = 0;
  for (int j = 0; j <= t; ++j) {
    w[j] = std::exp2(s[j] - m);
    l += w[j];
    const double wr = std::exp2(sr[j] - mr);
    lr += wr;
    for (int i = 0; i < d; ++i) {
      r.exact[i] += w[j] * p.V(j, kvh)[i];
      r.rounded[i] += wr * RoundBf16(p.V(j, kvh)[i]);
    }
  }
  for (int i = 0; i < d; ++i) {
    r.exact[i] /= l;
    r.rounded[i] /= lr;
  }
  double spread = 0;  // max_i sum_j w_j |v_ji - o_i|
  for (int i = 0; i < d; ++i) {
    double acc = 0;
    for (int j = 0; j <= t; ++j) acc += w[j] / l * std::fabs(p.V(j, kvh)[i] - r.exact[i]);
    spread = std::max(spread, acc);
  }
  const double vr_max = v_max * (1 + kUb);
  r.tol_rounded = vr_max * (2 * (2 * std::log(2.0) * ds32 + kExpErr) + kUb + 2 * Gamma(2.0 * t + 2) + 2 * kU);
  const double big_d = (2 * kUb + kUb * kUb + 2 * kU) * a_max;
  r.tol_exact = r.tol_rounded + (std::exp2(2 * big_d) - 1) * spread + kUb * v_max;
  return r;
}

// Checks rows [t_begin, t_end) of `out` against both fp64 references; records the largest error
// against the exact result relative to max|v| (printed by the caller).
void CheckAmxRows(const AttnProblem& p, const std::vector<float>& out, int t_begin, int t_end, const std::string& what,
                  double* worst_exact, double* worst_ratio) {
  int errors = 0;
  for (int t = t_begin; t < t_end && errors < 5; ++t) {
    for (int h = 0; h < p.s.n_head && errors < 5; ++h) {
      const AmxRowRef ref = AmxReferenceRow(p, h, t);
      const float* o = out.data() + t * p.ldo + h * p.s.head_dim;
      for (int i = 0; i < p.s.head_dim; ++i) {
        const double e1 = std::fabs(o[i] - ref.rounded[i]), e2 = std::fabs(o[i] - ref.exact[i]);
        *worst_exact = std::max(*worst_exact, e2);
        *worst_ratio = std::max(*worst_ratio, e2 / ref.tol_exact);
        if (!(e1 <= ref.tol_rounded) || !(e2 <= ref.tol_exact)) {
          ADD_FAILURE() << what << " " << Name(p.s) << ": t=" << t << " head=" << h << " i=" << i << " got " << o[i]
                        << " want " << ref.rounded[i] << " (bf16 inputs, tol " << ref.tol_rounded << "), "
                        << ref.exact[i] << " (exact, tol " << ref.tol_exact << ")";
          if (++errors >= 5) break;
        }
      }
    }
    if (!kernels_test::PaddingIntact(p, out, t, what)) ++errors;
  }
}

// p's arguments with bf16 operands allowed (AttentionArgs::allow_bf16), as the engine passes them
// for layers with quantised projections.
AttentionArgs Bf16Args(const AttnProblem& p, float* out) {
  AttentionArgs a = p.Args(out);
  a.allow_bf16 = true;
  return a;
}

// The bf16 kernel runs only when the caller allows it: without allow_bf16 a table that carries it
// computes exactly what the fp32 table computes, and a table without it ignores allow_bf16.
TEST(AttentionAmx, RunsOnlyWhenAllowed) {
  SEED_TRACE();
  const AttnProblem p({97, 8, 2, 128}, 650);
  omp_set_num_threads(2);
  std::vector<float> fp32 = p.Poisoned(), out = p.Poisoned();
  AttentionPrefillWith(Fp32Table(HostIsa()), p.Args(fp32.data()));
  AttentionPrefillWith(Fp32Table(HostIsa()), Bf16Args(p, out.data()));
  EXPECT_EQ(0, std::memcmp(fp32.data(), out.data(), fp32.size() * sizeof(float)));
  const KernelTable* kt = AmxTable();
  if (kt == nullptr) GTEST_SKIP() << "no AMX-BF16 here (or ESTREAM_AMX=0)";
  out = p.Poisoned();
  AttentionPrefillWith(*kt, p.Args(out.data()));
  EXPECT_EQ(0, std::memcmp(fp32.data(), out.data(), fp32.size() * sizeof(float)));
  out = p.Poisoned();
  AttentionPrefillWith(*kt, Bf16Args(p, out.data()));
  EXPECT_NE(0, std::memcmp(fp32.data(), out.data(), fp32.size() * sizeof(float)));
  double worst_exact = 0, worst_ratio = 0;
  CheckAmxRows(p, out, 0, p.s.n_tokens, "amx allowed", &worst_exact, &worst_ratio);
}

TEST(AttentionAmx, MatchesFp64WithinBf16Bound) {
  const KernelTable* kt = AmxTable();
  if (kt == nullptr) GTEST_SKIP() << "no AMX-BF16 here (or ESTREAM_AMX=0)";
  SEED_TRACE();
  std::vector<AttnShape> shapes;
  for (int t : {1, 2, 3, 7, 31, 64, 65, 127, 513}) {
    if (t <= 127) shapes.push_back({t, 32, 4, 128});
    shapes.push_back({t, 16, 16, 64});
    shapes.push_back({t, 8, 2, 128});
  }
  for (int d : {32, 40, 80, 96}) shapes.push_back({67, 4, 2, d});
  uint32_t salt = 700;
  double worst_exact = 0, worst_ratio = 0;
  for (const AttnShape& s : shapes) {
    const AttnProblem p(s, salt++);
    std::vector<float> out = p.Poisoned();
    omp_set_num_threads(2);
    AttentionPrefillWith(*kt, Bf16Args(p, out.data()));
    CheckAmxRows(p, out, 0, s.n_tokens, "amx", &worst_exact, &worst_ratio);
    // Uneven calls: one head over 29 rows; whole GQA groups over 150 rows.
    for (const auto& [heads, rows] : {std::pair{1, 29}, std::pair{s.n_head / s.n_head_kv, 150}}) {
      if (s.n_tokens > 127 && heads == 1) continue;  // keep the test fast
      out = p.Poisoned();
      const AttentionArgs a = p.Args(out.data());
      const int rep = s.n_head / s.n_head_kv, kv_blocks = (s.n_tokens + kt->attention_kv_block_bf16 - 1) /
                                                          kt->attention_kv_block_bf16;
      const size_t head_elems = kt->attention_kv_bytes_bf16(s.head_dim, s.n_tokens) / sizeof(uint16_t);
      AlignedPtr<uint16_t> kv16 = AllocAligned<uint16_t>(head_elems * s.n_head_kv);
      for (int kv = 0; kv < s.n_head_kv; ++kv)
        for (int b = 0; b < kv_blocks; ++b) kt->attention_convert_bf16(a, kv, b, b + 1, kv16.get() + kv * head_elems);
      for (int h = 0; h < s.n_head; h += heads)
        for (int t0 = 0; t0 < s.n_tokens; t0 += rows)
          kt->attention_block_bf16(a, kv16.get() + (h / rep) * head_elems, h, h + heads, t0,
                                   std::min(s.n_tokens, t0 + rows));
      CheckAmxRows(p, out, 0, s.n_tokens,
                   "amx calls of " + std::to_string(heads) + " heads x " + std::to_string(rows) + " rows",
                   &worst_exact, &worst_ratio);
    }
  }
  // Keys growing along the prompt (k_j scaled by 1 + j / 16): block maxima keep rising by more
  // than the lazy-rescaling threshold, so the rescale of O and l runs many times.
  for (const AttnShape& s : {AttnShape{300, 4, 2, 64}, AttnShape{200, 8, 2, 128}}) {
    AttnProblem p(s, salt++);
    for (int t = 0; t < s.n_tokens; ++t)
      for (int64_t i = 0; i < p.ldk; ++i) p.k[t * p.ldk + i] *= 1.0f + static_cast<float>(t) / 16;
    std::vector<float> out = p.Poisoned();
    omp_set_num_threads(2);
    AttentionPrefillWith(*kt, Bf16Args(p, out.data()));
    double ignored_exact = 0, ignored_ratio = 0;  // scores of hundreds: not the typical error
    CheckAmxRows(p, out, 0, s.n_tokens, "amx rising keys", &ignored_exact, &ignored_ratio);
  }
  // A jump of hundreds of log2 units: keys from 70 on (inside the second block) scaled by 100, so
  // the second block's scores exceed the first block's maximum far beyond 2^128. The kernel's fast
  // path computes P against the old maximum first; without its overflow check (kSumCheck) P = inf
  // (checked by mutation).
  for (const AttnShape& s : {AttnShape{150, 4, 2, 64}, AttnShape{140, 8, 2, 128}}) {
    AttnProblem p(s, salt++);
    for (int t = 70; t < s.n_tokens; ++t)
      for (int64_t i = 0; i < p.ldk; ++i) p.k[t * p.ldk + i] *= 100.0f;
    std::vector<float> out = p.Poisoned();
    omp_set_num_threads(2);
    AttentionPrefillWith(*kt, Bf16Args(p, out.data()));
    double ignored_exact = 0, ignored_ratio = 0;
    CheckAmxRows(p, out, 0, s.n_tokens, "amx jumping keys", &ignored_exact, &ignored_ratio);
  }
  // Long prompt on few heads: the last rows (most keys) and one early block.
  {
    const AttnProblem p({4096, 2, 1, 128}, salt++);
    std::vector<float> out = p.Poisoned();
    omp_set_num_threads(2);
    AttentionPrefillWith(*kt, Bf16Args(p, out.data()));
    CheckAmxRows(p, out, 4096 - 40, 4096, "amx long", &worst_exact, &worst_ratio);
    CheckAmxRows(p, out, 100, 140, "amx long", &worst_exact, &worst_ratio);
  }
  std::printf("AMX attention: largest |error| vs exact fp64 %.3g (max|v| = 1), %.3f of the derived bound\n",
              worst_exact, worst_ratio);
}

// ---- RMSNorm --------------------------------------------------------------------------------

const int kRowSizes[] = {1, 2, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 128, 129, 2048, 4099};

TEST(RmsNorm, RefMatchesFp64) {
  SEED_TRACE();
  Rng rng(7);
  for (int n : kRowSizes) {
    std::vector<float> x(n), w(n), y(n, kNaN);
    rng.Fill(x, -2, 2);
    rng.Fill(w, 0.5f, 1.5f);
    KernelsFor(Isa::kScalar).rms_norm_row(x.data(), w.data(), y.data(), n, 1e-6f);
    double ss = 0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const double r = 1.0 / std::sqrt(ss / n + static_cast<double>(1e-6f));
    // fp64 throughout, one rounding to fp32 at the end: within u |y| (2u allowed).
    for (int i = 0; i < n; ++i) {
      const double e = x[i] * r * w[i];
      ASSERT_NEAR(y[i], e, 2 * kU * std::fabs(e)) << "n=" << n << " i=" << i;
    }
  }
}

TEST(RmsNorm, EveryIsaMatchesReference) {
  SEED_TRACE();
  Rng rng(8);
  for (int n : kRowSizes) {
    for (float eps : {1e-6f, 1e-5f}) {
      std::vector<float> x(n), w(n), ref(n, kNaN);
      rng.Fill(x, -3, 3);
      rng.Fill(w, -1.5f, 1.5f);
      KernelsFor(Isa::kScalar).rms_norm_row(x.data(), w.data(), ref.data(), n, eps);
      for (Isa isa : IsasToTest()) {
        // fp32 sum of n squares: relative gamma(n); the mean, + eps, sqrt and reciprocal add 4u
        // (sqrt halves the sum's error); y = x * r * w two more roundings. So
        // |y - ref| <= |ref| (gamma(n) / 2 + 6u) + u |ref| for the reference's own rounding.
        const double rel = Gamma(n) / 2 + 7 * kU;
        std::vector<float> y(n, kNaN);
        KernelsFor(isa).rms_norm_row(x.data(), w.data(), y.data(), n, eps);
        for (int i = 0; i < n; ++i)
          ASSERT_NEAR(y[i], ref[i], rel * std::fabs(ref[i])) << IsaName(isa) << " n=" << n << " i=" << i;
        // In place (y aliases x) gives the same bits.
        std::vector<float> z = x;
        KernelsFor(isa).rms_norm_row(z.data(), w.data(), z.data(), n, eps);
        ASSERT_EQ(0, std::memcmp(z.data(), y.data(), n * sizeof(float))) << IsaName(isa) << " in place, n=" << n;
      }
    }
  }
}

TEST(RmsNorm, PublicRowsWithStrides) {
  SEED_TRACE();
  Rng rng(9);
  const int rows = 37, n = 2048;
  const int64_t ldx = n + 3, ldy = n + 5;
  std::vector<float> x(rows * ldx), w(n), y(rows * ldy, kNaN), ref(n, kNaN);
  rng.Fill(x, -2, 2);
  rng.Fill(w, 0.5f, 1.5f);
  omp_set_num_threads(2);
  RmsNorm(x.data(), ldx, w.data(), y.data(), ldy, rows, n, 1e-6f);
  for (int r = 0; r < rows; ++r) {
    Kernels().rms_norm_row(x.data() + r * ldx, w.data(), ref.data(), n, 1e-6f);
    ASSERT_EQ(0, std::memcmp(ref.data(), y.data() + r * ldy, n * sizeof(float))) << "row " << r;
    for (int64_t i = n; i < ldy; ++i) ASSERT_TRUE(std::isnan(y[r * ldy + i])) << "wrote padding of row " << r;
  }
}

// ---- RoPE -----------------------------------------------------------------------------------

std::vector<double> InvFreq(int head_dim, float base) {
  std::vector<double> f(head_dim / 2);
  for (int p = 0; p < head_dim / 2; ++p) f[p] = std::pow(static_cast<double>(base), -2.0 * p / head_dim);
  return f;
}

TEST(Rope, RefMatchesDefinition) {
  SEED_TRACE();
  Rng rng(10);
  // NEOX rotates (i, i + d/2), NORM rotates (2i, 2i + 1), by theta_i = pos * base^(-2i/d).
  const int d = 8, pos = 8191;
  const float base = 10000.0f;
  const std::vector<double> f = InvFreq(d, base);
  for (RopeMode mode : {RopeMode::kNeox, RopeMode::kNorm}) {
    std::vector<float> x(2 * d);
    rng.Fill(x, -1, 1);
    std::vector<float> y = x;
    KernelsFor(Isa::kScalar).rope_row(y.data(), 2, d, pos, f.data(), mode);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < d / 2; ++i) {
        const int i0 = mode == RopeMode::kNeox ? i : 2 * i, i1 = mode == RopeMode::kNeox ? i + d / 2 : 2 * i + 1;
        const long double th = pos * std::pow(10000.0L, -2.0L * i / d);
        const long double a = x[h * d + i0], b = x[h * d + i1];
        // fp64 angle (relative 1e-16, so ~1e-12 rad at pos 8191) then one rounding: 2u (|a|+|b|).
        const double tol = 2 * kU * (std::fabs(a) + std::fabs(b));
        EXPECT_NEAR(y[h * d + i0], static_cast<double>(a * std::cos(th) - b * std::sin(th)), tol);
        EXPECT_NEAR(y[h * d + i1], static_cast<double>(a * std::sin(th) + b * std::cos(th)), tol);
      }
  }
}

TEST(Rope, EveryIsaMatchesReference) {
  SEED_TRACE();
  Rng rng(11);
  for (int d : {8, 16, 32, 40, 64, 80, 96, 128, 256}) {
    for (float base : {10000.0f, 1000000.0f}) {
      for (int pos : {0, 1, 977, 4095, 8190, 32767}) {
        for (RopeMode mode : {RopeMode::kNeox, RopeMode::kNorm}) {
          const int heads = 3;
          const std::vector<double> f = InvFreq(d, base);
          std::vector<float> x(heads * d);
          rng.Fill(x, -2, 2);
          std::vector<float> ref = x;
          KernelsFor(Isa::kScalar).rope_row(ref.data(), heads, d, pos, f.data(), mode);
          for (Isa isa : IsasToTest()) {
            std::vector<float> y = x;
            KernelsFor(isa).rope_row(y.data(), heads, d, pos, f.data(), mode);
            // The fast paths reduce the fp64 angle exactly enough and evaluate sin/cos in fp64
            // (error << u), round c and s to fp32 (u/2 |x| each) and form x0 c - x1 s with two
            // roundings (2u); the reference rounds once (u/2): 4u (|x0| + |x1|) covers all.
            for (int h = 0; h < heads; ++h)
              for (int i = 0; i < d / 2; ++i) {
                const int i0 = mode == RopeMode::kNeox ? i : 2 * i,
                          i1 = mode == RopeMode::kNeox ? i + d / 2 : 2 * i + 1;
                const double tol = 4 * kU * (std::fabs(x[h * d + i0]) + std::fabs(x[h * d + i1]));
                ASSERT_NEAR(y[h * d + i0], ref[h * d + i0], tol) << IsaName(isa) << " d=" << d << " pos=" << pos;
                ASSERT_NEAR(y[h * d + i1], ref[h * d + i1], tol) << IsaName(isa) << " d=" << d << " pos=" << pos;
              }
          }
        }
      }
    }
  }
}

TEST(Rope, PublicRowsWithStrides) {
  SEED_TRACE();
  Rng rng(12);
  const int n_tokens = 300, heads = 4, d = 128, pos0 = 7000;
  const int64_t ldx = heads * d + 9;
  std::vector<float> x(n_tokens * ldx);
  rng.Fill(x, -2, 2);
  for (int t = 0; t < n_tokens; ++t)
    for (int64_t i = heads * d; i < ldx; ++i) x[t * ldx + i] = kNaN;
  std::vector<float> y = x;
  omp_set_num_threads(2);
  Rope(y.data(), ldx, n_tokens, heads, d, pos0, 1e6f, RopeMode::kNeox);
  const std::vector<double> f = InvFreq(d, 1e6f);
  for (int t = 0; t < n_tokens; ++t) {
    std::vector<float> row(x.begin() + t * ldx, x.begin() + t * ldx + heads * d);
    Kernels().rope_row(row.data(), heads, d, pos0 + t, f.data(), RopeMode::kNeox);
    ASSERT_EQ(0, std::memcmp(row.data(), y.data() + t * ldx, heads * d * sizeof(float))) << "t=" << t;
    for (int64_t i = heads * d; i < ldx; ++i) ASSERT_TRUE(std::isnan(y[t * ldx + i]));
  }
}

// ---- fused passes: RmsNormQuantize, NormRope ------------------------------------------------

// The fused public passes compose the same row kernels (tested per ISA above), so they must give
// the bits of the two separate passes, whatever the thread split.
TEST(RmsNormQuantize, SameBitsAsNormThenQuantize) {
  SEED_TRACE();
  Rng rng(30);
  for (int rows : {1, 3, 77}) {
    for (int n : {32, 96, 2048}) {
      const int64_t ldx = n + 5, ldy = n + 3, kb = n / 32;
      std::vector<float> x(rows * ldx), w(n);
      rng.Fill(x, -3, 3);
      rng.Fill(w, -1.5f, 1.5f);
      std::vector<float> y1(rows * ldy, kNaN), y2(rows * ldy, kNaN);
      std::vector<BlockQ8A> q1(rows * kb), q2(rows * kb);
      std::memset(q1.data(), 0xA5, q1.size() * sizeof(BlockQ8A));
      std::memset(q2.data(), 0x5A, q2.size() * sizeof(BlockQ8A));
      omp_set_num_threads(2);
      RmsNorm(x.data(), ldx, w.data(), y1.data(), ldy, rows, n, 1e-6f);
      QuantizeActivations(y1.data(), ldy, rows, n, q1.data());
      RmsNormQuantize(x.data(), ldx, w.data(), y2.data(), ldy, q2.data(), rows, n, 1e-6f);
      for (int r = 0; r < rows; ++r) {
        ASSERT_EQ(0, std::memcmp(y1.data() + r * ldy, y2.data() + r * ldy, n * sizeof(float))) << "rows=" << rows
                                                                                               << " n=" << n;
        for (int64_t i = n; i < ldy; ++i) ASSERT_TRUE(std::isnan(y2[r * ldy + i])) << "wrote padding";
      }
      ASSERT_EQ(0, std::memcmp(q1.data(), q2.data(), q1.size() * sizeof(BlockQ8A))) << "rows=" << rows << " n=" << n;
    }
  }
}

TEST(NormRope, SameBitsAsNormThenRope) {
  SEED_TRACE();
  Rng rng(31);
  const int heads = 5;
  for (int d : {64, 80, 128}) {
    for (RopeMode mode : {RopeMode::kNeox, RopeMode::kNorm}) {
      for (int norm : {0, 1, 2}) {  // none, each head, the whole row
        const int rows = 41, width = heads * d;
        const int64_t ldx = width + 7;
        std::vector<float> x(rows * ldx), w(norm == 2 ? width : d);
        rng.Fill(x, -2, 2);
        rng.Fill(w, 0.5f, 1.5f);
        for (int t = 0; t < rows; ++t)
          for (int64_t i = width; i < ldx; ++i) x[t * ldx + i] = kNaN;
        // Two sequences: rows 0..16 at positions 0..16, rows 17.. continuing a context of 900.
        std::vector<int32_t> pos(rows);
        for (int t = 0; t < rows; ++t) pos[t] = t < 17 ? t : 900 + (t - 17);
        std::vector<float> ref = x, y = x;
        omp_set_num_threads(2);
        for (int t = 0; t < rows; ++t) {
          float* row = ref.data() + t * ldx;
          if (norm == 1) RmsNorm(row, d, w.data(), row, d, heads, d, 1e-6f);
          if (norm == 2) RmsNorm(row, width, w.data(), row, width, 1, width, 1e-6f);
          Rope(row, ldx, 1, heads, d, pos[t], 1e6f, mode);
        }
        NormRope(y.data(), ldx, rows, pos.data(), heads, d, 1e6f, mode, norm == 0 ? nullptr : w.data(),
                 norm == 2 ? width : d, 1e-6f);
        for (int t = 0; t < rows; ++t) {
          ASSERT_EQ(0, std::memcmp(ref.data() + t * ldx, y.data() + t * ldx, width * sizeof(float)))
              << "d=" << d << " norm=" << norm << " t=" << t;
          for (int64_t i = width; i < ldx; ++i) ASSERT_TRUE(std::isnan(y[t * ldx + i]));
        }
      }
    }
  }
}

// ---- SwiGLU ---------------------------------------------------------------------------------

TEST(SwiGlu, EveryIsaMatchesReference) {
  SEED_TRACE();
  Rng rng(13);
  for (int n : kRowSizes) {
    std::vector<float> g(n), u(n), ref(n, kNaN);
    rng.Fill(g, -20, 20);
    rng.Fill(u, -2, 2);
    // Extremes where exp(-g) overflows or vanishes.
    if (n >= 4) { g[0] = -100.0f; g[1] = 100.0f; g[2] = -88.5f; g[3] = 0.0f; }
    KernelsFor(Isa::kScalar).swiglu(g.data(), u.data(), ref.data(), n);
    // Reference check: fp64 then one rounding.
    for (int i = 0; i < n; ++i) {
      const double e = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
      ASSERT_NEAR(ref[i], e, kU * std::fabs(e) + 1e-38);
    }
    for (Isa isa : IsasToTest()) {
      // exp with Cody-Waite reduction and a polynomial: <= 3u relative; 1 + e, the division and
      // the two products: 4u; the reference's rounding u: 8u |h| (plus an absolute 1e-38 for
      // results below the normal range, where relative bounds do not hold).
      std::vector<float> h(n, kNaN);
      KernelsFor(isa).swiglu(g.data(), u.data(), h.data(), n);
      for (int i = 0; i < n; ++i)
        ASSERT_NEAR(h[i], ref[i], 8 * kU * std::fabs(ref[i]) + 1e-38) << IsaName(isa) << " n=" << n << " g=" << g[i];
      // h may alias g.
      std::vector<float> a = g;
      KernelsFor(isa).swiglu(a.data(), u.data(), a.data(), n);
      ASSERT_EQ(0, std::memcmp(a.data(), h.data(), n * sizeof(float))) << IsaName(isa);
    }
  }
}

// ---- router softmax + top-k -----------------------------------------------------------------

TEST(SoftmaxTopK, RefOrderTiesAndWeights) {
  // Ties keep the lower index; descending order; weights renormalised or not.
  const float logits[] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 2.0f};
  int32_t idx[4];
  float w[4];
  KernelsFor(Isa::kScalar).softmax_topk(logits, 6, 4, false, idx, w);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 3);
  EXPECT_EQ(idx[2], 2);
  EXPECT_EQ(idx[3], 5);
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  EXPECT_NEAR(w[0], std::exp(3.0) / z, 1e-7);
  EXPECT_NEAR(w[2], std::exp(2.0) / z, 1e-7);
  KernelsFor(Isa::kScalar).softmax_topk(logits, 6, 4, true, idx, w);
  const double zk = 2 * std::exp(3.0) + 2 * std::exp(2.0);
  EXPECT_NEAR(w[0], std::exp(3.0) / zk, 1e-7);
  EXPECT_NEAR(w[3], std::exp(2.0) / zk, 1e-7);
}

TEST(SoftmaxTopK, EveryIsaMatchesReference) {
  SEED_TRACE();
  Rng rng(14);
  for (int n : {1, 2, 7, 8, 16, 17, 60, 64, 128, 129, 256}) {
    for (int k : {1, 2, 4, 8}) {
      if (k > n) continue;
      for (bool renorm : {false, true}) {
        std::vector<float> logits(n);
        rng.Fill(logits, -8, 8);
        for (int i = 0; i + 3 < n; i += 5) logits[i + 3] = logits[i];  // ties
        std::vector<int32_t> ref_idx(k, -1);
        std::vector<float> ref_w(k, kNaN);
        KernelsFor(Isa::kScalar).softmax_topk(logits.data(), n, k, renorm, ref_idx.data(), ref_w.data());
        for (Isa isa : IsasToTest()) {
          std::vector<int32_t> idx(k, -1);
          std::vector<float> w(k, kNaN);
          KernelsFor(isa).softmax_topk(logits.data(), n, k, renorm, idx.data(), w.data());
          ASSERT_EQ(idx, ref_idx) << IsaName(isa) << " n=" << n << " k=" << k;
          // Each exp <= 3u relative; the normaliser is an fp32 sum of n (or k) positive terms:
          // gamma(n); the division u; the reference's rounding u.
          for (int r = 0; r < k; ++r)
            ASSERT_NEAR(w[r], ref_w[r], (Gamma(n) + 8 * kU) * ref_w[r]) << IsaName(isa) << " n=" << n;
        }
      }
    }
  }
}

// ---- log-sum-exp (the LM head's log-softmax) -----------------------------------------------------

// Every ISA against the double reference. Bound: each e^(x - max) within 3u plus the rounding of
// x - max (|x - max| u, whose softmax-weighted mean is at most log n), 8 fp32 additions per lane,
// log2(16) horizontal ones: (15 + log n) u of the sum, the same absolute on its log; 2u of slack.
TEST(LogSumExp, EveryIsaWithinTheBound) {
  SEED_TRACE();
  Rng rng(27);
  for (int64_t n : {1, 2, 7, 15, 16, 17, 31, 33, 127, 129, 1000, 50257, 151936}) {
    for (float range : {1.0f, 30.0f, 200.0f}) {
      std::vector<float> row(static_cast<size_t>(n));
      rng.Fill(row, -range, range / 4);
      const double ref = KernelsFor(Isa::kScalar).log_sum_exp(row.data(), n);
      const double bound = (17 + std::log(static_cast<double>(n))) * kU;
      for (Isa isa : IsasToTest())
        ASSERT_NEAR(KernelsFor(isa).log_sum_exp(row.data(), n), ref, bound)
            << IsaName(isa) << " n=" << n << " range=" << range;
    }
  }
  // Equal values: log n + x.
  std::vector<float> flat(1000, 2.5f);
  for (Isa isa : IsasToTest())
    EXPECT_NEAR(KernelsFor(isa).log_sum_exp(flat.data(), 1000), 2.5 + std::log(1000.0), 20 * kU) << IsaName(isa);
}

// A row with NaN, +inf or -inf anywhere (also in a tail lane): the reference's result on every ISA
// (NaN stays NaN; -inf terms count 0).
TEST(LogSumExp, NonFiniteValuesGiveTheReferenceResult) {
  SEED_TRACE();
  Rng rng(28);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 5, 16, 37, 300}) {
    for (float bad : {kNaN, inf, -inf}) {
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        std::vector<float> row(static_cast<size_t>(n));
        rng.Fill(row, -5, 5);
        row[static_cast<size_t>(at)] = bad;
        const double ref = KernelsFor(Isa::kScalar).log_sum_exp(row.data(), n);
        for (Isa isa : IsasToTest()) {
          const double got = KernelsFor(isa).log_sum_exp(row.data(), n);
          if (std::isnan(ref)) EXPECT_TRUE(std::isnan(got)) << IsaName(isa) << " n=" << n << " at=" << at;
          else EXPECT_EQ(got, ref) << IsaName(isa) << " n=" << n << " at=" << at << " bad=" << bad;
        }
      }
    }
  }
}

// ---- residual add ---------------------------------------------------------------------------

TEST(Add, EveryIsaIsExact) {
  SEED_TRACE();
  Rng rng(15);
  for (int n : kRowSizes) {
    std::vector<float> y0(n + 1), x(n);
    rng.Fill(y0, -4, 4);
    rng.Fill(x, -4, 4);
    y0[n] = kNaN;  // sentinel past the end
    for (Isa isa : IsasToTest()) {
      std::vector<float> y = y0;
      KernelsFor(isa).add(y.data(), x.data(), n);
      for (int i = 0; i < n; ++i) ASSERT_EQ(y[i], y0[i] + x[i]) << IsaName(isa) << " n=" << n;
      ASSERT_TRUE(std::isnan(y[n])) << IsaName(isa) << " wrote past the end, n=" << n;
    }
  }
}

}  // namespace
}  // namespace estream::kernels
