// Tests of the low-precision attention (kernels/attention_lowp.h: Q.K^T in int8, P.V in int8 on
// AVX-512 and in bf16 on AVX2):
//  - the AVX-512 and AVX2 conversions of K/V write the same bytes as the scalar reference's of
//    the same P.V;
//  - the AVX-512 kernel matches the scalar reference of P.V in int8 bit for bit, the AVX2 kernel,
//    Q.K^T on vpdpbusd (AVX-VNNI) and on vpmaddubsw (any AVX2 host), the reference of P.V in bf16
//    (the same int32 sums, the same fp32 operations in the same order);
//  - all match fp64 attention within the bound stated in attention_lowp.h for their P.V,
//    computed per query from the data (the largest score error delta_i of that query's quantised
//    scores; for P.V in int8 also the share of the weights lost to P's rounding);
//  - awkward sizes (T not a multiple of 64, head_dim 40/64/72/128/192, GQA 1/4/8), outputs
//    NaN-poisoned first (row padding must stay NaN), keys with large outliers, T = 4096;
//  - causality through AttentionPrefill: a row's output depends only on keys 0..t, so a prompt's
//    rows are bit for bit those of any longer prompt it begins, and rows computed with q_begin > 0
//    (a shared-prefix continuation) those of the whole sequence; rows before the first key block
//    are the fp32 kernel's;
//  - the wiring: the active table carries the AVX-512 kernel exactly where the AMX kernel is not
//    selected, the AVX2 one at the AVX2 level (its vpmaddubsw variant without AVX-VNNI), each
//    only when ESTREAM_ATTN_LOWP is not "0", and only allow_bf16 calls reach it;
//  - the phase timers (kernels/phase_timer.h) change no bit and count every phase of a call.
// And the AArch64 BFDOT kernel (arm_neon/attention_neon_bf16.cc: bf16 Q/K/P/V, fp32 accumulation)
// on hosts with FEAT_BF16 (qemu -cpu max has it): against fp64 within its stated bound computed per
// query from the data, on the same awkward shapes, NaN-poisoned; direct calls split any way give
// the same bits; causality through AttentionPrefill; its wiring (ESTREAM_ATTN_BF16 / _LOWP).
// The seed is fresh per run and printed on failure; ESTREAM_TEST_SEED=<n> replays a run.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/memory.h"
#include "kernels/attention_lowp.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/ops_internal.h"
#include "kernels/phase_timer.h"
#include "kernels_test_util.h"
#include "quant/quant.h"
#include "test_quick.h"
#if defined(__x86_64__)
#include "kernels/x86_avx512/attention_amx.h"
#endif

namespace estream::kernels {
namespace {

using kernels_test::kNaN;
using kernels_test::kU;
using kernels_test::TestSeed;

// The tables as the engine fills them (`first_rows`: the first kLowpKeys rows on key block 0
// converted once more for them, KernelTable::attention_first_rows_bf16) or, for the tests of the
// kernel itself, with every row on the shared conversion.
KernelTable LowpRefTable(bool first_rows, LowpPv pv) {
  KernelTable k = KernelsFor(Isa::kScalar);
  FillAttentionLowpRef(&k, pv);
  if (!first_rows) k.attention_first_rows_bf16 = k.attention_first_split_bf16 = 0;
  return k;
}
#if defined(__x86_64__)
// The AVX-512 one (REQUIRES HostIsa() == kAvx512: VNNI + BF16).
KernelTable LowpAvx512Table(bool first_rows) {
  KernelTable k = KernelsFor(Isa::kAvx512);
  FillAvx512OpsWith(&k, /*use_amx=*/false);
  FillAttentionLowpAvx512(&k);
  if (!first_rows) k.attention_first_rows_bf16 = k.attention_first_split_bf16 = 0;
  return k;
}
// The AVX2 one, Q.K^T on vpdpbusd (REQUIRES AVX2 + AVX-VNNI) or on vpmaddubsw (REQUIRES AVX2).
KernelTable LowpAvx2Table(bool first_rows, bool vnni) {
  KernelTable k = KernelsFor(Isa::kAvx2);
  FillAttentionLowpAvx2(&k, vnni);
  if (!first_rows) k.attention_first_rows_bf16 = k.attention_first_split_bf16 = 0;
  return k;
}
#endif
const KernelTable& RefTable(LowpPv pv) {
  static const KernelTable bf16 = LowpRefTable(false, LowpPv::kBf16), int8 = LowpRefTable(false, LowpPv::kInt8);
  return pv == LowpPv::kInt8 ? int8 : bf16;
}
// Null without AVX-512.
[[maybe_unused]] const KernelTable* Avx512Table() {
#if !defined(__x86_64__)
  return nullptr;
#else
  if (HostIsa() != Isa::kAvx512) return nullptr;
  static const KernelTable t = LowpAvx512Table(false);
  return &t;
#endif
}

// Null without AVX2 (vnni false) or without AVX2 + AVX-VNNI (vnni true).
[[maybe_unused]] const KernelTable* Avx2Table(bool vnni) {
#if !defined(__x86_64__)
  return nullptr;
#else
  if (!IsaAtLeast(HostIsa(), Isa::kAvx2) || (vnni && !HostCpuFeatures().avx_vnni)) return nullptr;
  static const KernelTable with = LowpAvx2Table(false, true), without = LowpAvx2Table(false, false);
  return vnni ? &with : &without;
#endif
}

// The x86 fast paths this host has: the table (every row on the low-precision kernel), its K/V
// conversion and its P.V (the reference it equals bit for bit).
struct X86Path {
  std::string name;
  const KernelTable* kt;
  void (*convert)(const AttentionArgs&, int, int, uint16_t*);
  LowpPv pv;
};
std::vector<X86Path> X86Paths() {
  std::vector<X86Path> paths;
#if defined(__x86_64__)
  if (const KernelTable* kt = Avx512Table()) paths.push_back({"avx512", kt, AttentionLowpConvertKvAvx512, LowpPv::kInt8});
  if (const KernelTable* kt = Avx2Table(true))
    paths.push_back({"avx2_vnni", kt, AttentionLowpConvertKvAvx2, LowpPv::kBf16});
  if (const KernelTable* kt = Avx2Table(false))
    paths.push_back({"avx2_maddubs", kt, AttentionLowpConvertKvAvx2, LowpPv::kBf16});
#endif
  return paths;
}

// Null unless the host is AArch64 with bf16.
const KernelTable* NeonBf16Table() {
#if !defined(__aarch64__)
  return nullptr;
#else
  if (!HostCpuFeatures().neon_bf16) return nullptr;
  static const KernelTable t = [] {
    KernelTable k = KernelsFor(HostIsa());
    FillNeonBf16Attention(&k);
    return k;
  }();
  return &t;
#endif
}

using Shape = kernels_test::AttnShape;
using kernels_test::Name;

// The shared attention problem (kernels_test_util.h), run with allow_bf16. `outliers`: a few key
// channels get a large common offset (+-40) and a few keys a large spike, as real K has.
struct Problem : kernels_test::AttnProblem {
  Problem(const Shape& shape, uint32_t salt, bool outliers = false) : kernels_test::AttnProblem(shape, salt) {
    if (outliers) {
      for (int h = 0; h < s.n_head_kv; ++h)
        for (int c : {1, s.head_dim / 3, s.head_dim - 2}) {
          const float off = (c % 2 ? 40.0f : -40.0f);
          for (int t = 0; t < s.n_tokens; ++t) k[t * ldk + h * s.head_dim + c] += off;
        }
      for (int t = 3; t < s.n_tokens; t += 37) k[t * ldk + (t % s.head_dim)] *= 25.0f;
    }
  }
  AttentionArgs Args(float* out) const { return kernels_test::AttnProblem::Args(out, /*allow_bf16=*/true); }
};

std::vector<float> RunLowp(const KernelTable& kt, const Problem& p, int threads = 2) {
  std::vector<float> out = p.Poisoned();
  omp_set_num_threads(threads);
  AttentionPrefillWith(kt, p.Args(out.data()));
  return out;
}

// Rows [t_begin, t_end) of the reference (scalar) low-precision attention with P.V as `pv`.
std::vector<float> RefRows(const Problem& p, int t_begin, int t_end, LowpPv pv) {
  const KernelTable& kt = RefTable(pv);
  std::vector<float> out = p.Poisoned();
  const AttentionArgs a = p.Args(out.data());
  const size_t bytes = kt.attention_kv_bytes_bf16(p.s.head_dim, p.s.n_tokens);
  AlignedPtr<uint16_t> kv = AllocAligned<uint16_t>(bytes / 2 + 32);
  const int blocks = (t_end + kLowpKeys - 1) / kLowpKeys;
  const int rep = p.s.n_head / p.s.n_head_kv;
  for (int h = 0; h < p.s.n_head_kv; ++h) {
    kt.attention_convert_bf16(a, h, 0, blocks, kv.get());
    kt.attention_block_bf16(a, kv.get(), h * rep, (h + 1) * rep, t_begin, t_end);
  }
  return out;
}

// tol: the bound for P.V in bf16 (and of the BFDOT kernel); tol_int8: for P.V in int8.
struct Fp64Row {
  std::vector<double> o;
  double tol = 0, tol_int8 = 0;
  double Tol(LowpPv pv) const { return pv == LowpPv::kInt8 ? tol_int8 : tol; }
};

// The fp64 softmax(s) . V of row t of head h (s: its exact scores, natural-log units, max m) and
// the stated bound (2^(2 delta) - 1 + 2^-7 + 1e-5) max_{j<=t} |v_j| for a score error delta.
Fp64Row SoftmaxRowAndBound(const Problem& p, int h, int t, const std::vector<double>& s, double m, double delta,
                           double vmax) {
  const int d = p.s.head_dim, kvh = p.KvHead(h);
  Fp64Row r;
  r.o.assign(d, 0.0);
  double l = 0;
  for (int j = 0; j <= t; ++j) {
    const double w = std::exp(s[j] - m);
    l += w;
    for (int c = 0; c < d; ++c) r.o[c] += w * p.V(j, kvh)[c];
  }
  for (double& x : r.o) x /= l;
  r.tol = (std::exp2(2 * delta) - 1 + 0x1p-7 + 1e-5) * vmax;
  return r;
}

// The stated bounds for query row t of head h against fp64 attention: the exact score error of
// the quantised scores (delta, log2 units) from the same quantisation as the kernel (mu, K and Q
// rounded to the int8 grid as in ref/), then with P.V in bf16 (2^(2 delta) - 1 + 2^-7 + 1e-5)
// max_{j<=t} |v_j|, with P.V in int8 (2^(2 delta) - 1 + 1/254 + 1e-5) max |v_j| + F,
// F = sum_j min(w_j a_j, W_b A_b / 510) / sum_j w_j over the weights w_j = 2^(s^_j) of the
// quantised scores, a_j = max |v_j|, W_b and A_b the largest w and a in the span b of key j
// (kLowpSpanKeys keys; keys up to t; attention_lowp.h). mean_keys: K smoothed by the mean of its
// first mean_keys keys (AttentionArgs::lowp_mean_keys: 0 = kLowpKeys; 1 = key 0 alone, as the
// engine's first rows).
Fp64Row Fp64RowAndBound(const Problem& p, int h, int t, int mean_keys = 0) {
  const int d = p.s.head_dim, kvh = p.KvHead(h), T = p.s.n_tokens;
  const float q_scale = p.scale * 1.44269504088896340736f;
  // mu exactly as the kernel (fp32 sums in sample order, one division).
  const int ns = std::min(mean_keys > 0 ? mean_keys : kLowpKeys, T);
  std::vector<float> mu(d, 0.0f);
  for (int s = 0; s < ns; ++s)
    for (int c = 0; c < d; ++c) mu[c] += p.K(s, kvh)[c];
  for (int c = 0; c < d; ++c) mu[c] /= static_cast<float>(ns);
  // q^ (int8 grid) and its scale.
  float qa = 0;
  for (int c = 0; c < d; ++c) qa = std::max(qa, std::fabs(p.Q(t, h)[c] * q_scale));
  const float qinv = qa > 0 ? 127.0f / qa : 0.0f;
  std::vector<double> qh(d);
  for (int c = 0; c < d; ++c) qh[c] = std::nearbyint(p.Q(t, h)[c] * q_scale * qinv) * static_cast<double>(qa / 127.0f);
  double delta = 0, vmax = 0, m = -INFINITY;
  std::vector<double> s(t + 1), sh(t + 1), va(t + 1, 0.0);
  std::vector<float> kc(d);
  for (int j = 0; j <= t; ++j) {
    float ka = 0;
    for (int c = 0; c < d; ++c) {
      kc[c] = p.K(j, kvh)[c] - mu[c];
      ka = std::max(ka, std::fabs(kc[c]));
    }
    const float kinv = ka > 0 ? 127.0f / ka : 0.0f;
    double shat = 0, sc = 0, dot = 0;
    for (int c = 0; c < d; ++c) {
      shat += qh[c] * (std::nearbyint(kc[c] * kinv) * static_cast<double>(ka / 127.0f));
      sc += static_cast<double>(p.Q(t, h)[c]) * q_scale * kc[c];
      dot += static_cast<double>(p.Q(t, h)[c]) * p.K(j, kvh)[c];
      va[j] = std::max(va[j], std::fabs(static_cast<double>(p.V(j, kvh)[c])));
    }
    vmax = std::max(vmax, va[j]);
    delta = std::max(delta, std::fabs(shat - sc));
    sh[j] = shat;
    s[j] = dot * p.scale;
    m = std::max(m, s[j]);
  }
  Fp64Row r = SoftmaxRowAndBound(p, h, t, s, m, delta, vmax);
  const double shmax = *std::max_element(sh.begin(), sh.end());
  double lost = 0, total = 0;
  for (int b = 0; b <= t; b += kLowpSpanKeys) {
    const int e = std::min(t + 1, b + kLowpSpanKeys);
    double w_max = 0, a_max = 0;
    for (int j = b; j < e; ++j) {
      w_max = std::max(w_max, std::exp2(sh[j] - shmax));
      a_max = std::max(a_max, va[j]);
    }
    const double wa_max = w_max * a_max;
    for (int j = b; j < e; ++j) {
      const double w = std::exp2(sh[j] - shmax);
      lost += std::min(w * va[j], wa_max / 510);
      total += w;
    }
  }
  r.tol_int8 = (std::exp2(2 * delta) - 1 + 1.0 / 254 + 1e-5) * vmax + lost / total;
  return r;
}

// fp32 -> bf16 (round to nearest even) -> fp32, as the BFDOT kernel rounds its operands.
float RoundBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// The stated bound of the BFDOT kernel (arm_neon/attention_neon_bf16.cc) for query row t of head
// h: delta = the largest score error of the bf16-rounded q scale log2(e) and k (log2 units), plus a
// generous fp32 accumulation term 2 (d + 8) u sum |q^ k^|; then as above,
// (2^(2 delta) - 1 + 2^-7 + 1e-5) max_{j<=t} |v_j|.
Fp64Row Bf16RowAndBound(const Problem& p, int h, int t) {
  const int d = p.s.head_dim, kvh = p.KvHead(h);
  const float q_scale = p.scale * 1.44269504088896340736f;
  std::vector<double> qh(d), qx(d);
  for (int c = 0; c < d; ++c) {
    qh[c] = RoundBf16(p.Q(t, h)[c] * q_scale);
    qx[c] = static_cast<double>(p.Q(t, h)[c]) * q_scale;
  }
  double delta = 0, vmax = 0, m = -INFINITY;
  std::vector<double> s(t + 1);
  for (int j = 0; j <= t; ++j) {
    double shat = 0, sabs = 0, sx = 0;
    for (int c = 0; c < d; ++c) {
      const double kh = RoundBf16(p.K(j, kvh)[c]);
      shat += qh[c] * kh;
      sabs += std::fabs(qh[c] * kh);
      sx += qx[c] * p.K(j, kvh)[c];
      vmax = std::max(vmax, std::fabs(static_cast<double>(p.V(j, kvh)[c])));
    }
    delta = std::max(delta, std::fabs(shat - sx) + 2 * (d + 8) * kU * sabs);
    s[j] = sx / 1.44269504088896340736;  // natural-log units
    m = std::max(m, s[j]);
  }
  return SoftmaxRowAndBound(p, h, t, s, m, delta, vmax);
}

// Rows [t_begin, t_end): got vs want within tol(h, t); padding NaN. Returns the largest error seen
// relative to max|v| (for the log).
template <typename Want, typename Tol>
double Check(const Problem& p, const std::vector<float>& got, int t_begin, int t_end, Want want, Tol tol,
             const std::string& what) {
  int errors = 0;
  double worst = 0;
  for (int t = t_begin; t < t_end && errors < 5; ++t) {
    for (int h = 0; h < p.s.n_head && errors < 5; ++h) {
      const std::vector<double> e = want(h, t);
      const double tl = tol(h, t);
      const float* o = got.data() + t * p.ldo + h * p.s.head_dim;
      for (int c = 0; c < p.s.head_dim; ++c) {
        const double err = std::fabs(o[c] - e[c]);
        worst = std::max(worst, err);
        if (!(err <= tl)) {
          ADD_FAILURE() << what << " " << Name(p.s) << ": t=" << t << " head=" << h << " c=" << c << " got " << o[c]
                        << " want " << e[c] << " tol " << tl;
          if (++errors >= 5) break;
        }
      }
    }
    if (!kernels_test::PaddingIntact(p, got, t, what)) ++errors;
  }
  return worst;
}

std::vector<double> RowOf(const Problem& p, const std::vector<float>& out, int h, int t) {
  const float* o = out.data() + t * p.ldo + h * p.s.head_dim;
  return std::vector<double>(o, o + p.s.head_dim);
}

std::vector<Shape> AwkwardShapes() {
  // Under emulation (test::QuickTests, the ARM64 stage): one and several key blocks, GQA 1/4/8,
  // head sizes not a multiple of 8.
  if (test::QuickTests()) return {{1, 4, 4, 64}, {65, 8, 2, 128}, {130, 8, 1, 192}, {97, 4, 2, 100}, {63, 4, 2, 40}};
  std::vector<Shape> shapes;
  for (int t : {1, 2, 7, 63, 64, 65, 130, 257}) {
    shapes.push_back({t, 4, 4, 64});    // GQA 1
    shapes.push_back({t, 8, 2, 128});   // GQA 4
    shapes.push_back({t, 8, 1, 192});   // GQA 8, deepseek-sized heads
  }
  for (int d : {40, 72, 100}) shapes.push_back({97, 4, 2, d});
  shapes.push_back({130, 16, 16, 64});  // 16 kv heads: whole kv heads per thread (AttentionPrefillWith)
  return shapes;
}

// Direct calls of the table's conversion and block entries, split as one head x 29 rows and whole
// GQA groups x 150 rows (a row's result must not depend on its tile), checked against want/tol.
template <typename Want, typename Tol>
void CheckUnevenDirectCalls(const KernelTable& kt, const Problem& p, Want want, Tol tol, const std::string& name) {
  const Shape& s = p.s;
  const size_t bytes = kt.attention_kv_bytes_bf16(s.head_dim, s.n_tokens);
  AlignedPtr<uint16_t> kv = AllocAligned<uint16_t>(bytes / 2 * s.n_head_kv + 32);
  std::vector<float> out = p.Poisoned();
  const AttentionArgs a = p.Args(out.data());
  const int blocks = (s.n_tokens + kt.attention_kv_block_bf16 - 1) / kt.attention_kv_block_bf16;
  for (int h = 0; h < s.n_head_kv; ++h)
    // In two ranges, as threads get them (the second starts mid-head).
    for (const auto& [b0, b1] : {std::pair{0, blocks / 2}, std::pair{blocks / 2, blocks}})
      kt.attention_convert_bf16(a, h, b0, b1, kv.get() + h * (bytes / 2));
  const int rep = s.n_head / s.n_head_kv;
  for (const auto& [heads, rows] : {std::pair{1, 29}, std::pair{rep, 150}}) {
    std::fill(out.begin(), out.end(), kNaN);
    for (int h = 0; h < s.n_head; h += heads)
      for (int t0 = 0; t0 < s.n_tokens; t0 += rows)
        kt.attention_block_bf16(a, kv.get() + (h / rep) * (bytes / 2), h, h + heads, t0, std::min(s.n_tokens, t0 + rows));
    Check(p, out, 0, s.n_tokens, want, tol,
          name + " calls of " + std::to_string(heads) + " heads x " + std::to_string(rows) + " rows");
  }
}

TEST(AttentionLowp, ConvertX86WritesTheReferenceBytes) {
  SEED_TRACE();
  if (X86Paths().empty()) GTEST_SKIP() << "no AVX2 here";
  for (const X86Path& path : X86Paths()) {
  uint32_t salt = 1;
  for (const Shape& s : {Shape{1, 1, 1, 64}, Shape{63, 2, 2, 72}, Shape{65, 2, 1, 128}, Shape{130, 2, 2, 192},
                         Shape{200, 1, 1, 40}}) {
    for (bool outliers : {false, true}) {
      const Problem p(s, salt++, outliers);
      for (int mean_keys : {0, 1}) {  // the shared conversion; the first rows' block 0
      AttentionArgs a = p.Args(nullptr);
      a.lowp_mean_keys = mean_keys;
      const size_t bytes = AttentionLowpKvBytes(s.head_dim, s.n_tokens);
      std::vector<uint8_t> ref(bytes, 0xAB), fast(bytes, 0xCD);
      const int blocks = (s.n_tokens + kLowpKeys - 1) / kLowpKeys;
      const LowpLayout L(s.head_dim);
      for (int h = 0; h < s.n_head_kv; ++h) {
        for (int b = 0; b < blocks; ++b) {
          (path.pv == LowpPv::kInt8 ? AttentionLowpConvertKvRefInt8 : AttentionLowpConvertKvRef)(
              a, h, b, reinterpret_cast<uint16_t*>(ref.data()));
          path.convert(a, h, b, reinterpret_cast<uint16_t*>(fast.data()));
        }
        // Compare the fields (the alignment gaps between them are not written).
        for (int b = 0; b < blocks; ++b) {
          const size_t o = b * L.block_bytes;
          EXPECT_EQ(0, std::memcmp(ref.data() + o, fast.data() + o, static_cast<size_t>(kLowpKeys) * L.dp))
              << path.name << " " << Name(s) << " keys, block " << b;
          EXPECT_EQ(0, std::memcmp(ref.data() + o + L.corr, fast.data() + o + L.corr, 8 * kLowpKeys))
              << path.name << " " << Name(s) << " corr/scales, block " << b;
          const size_t v_bytes = path.pv == LowpPv::kInt8 ? L.sv - L.vb + 8 * kLowpKeys : 2 * kLowpKeys * s.head_dim;
          EXPECT_EQ(0, std::memcmp(ref.data() + o + L.vb, fast.data() + o + L.vb, v_bytes))
              << path.name << " " << Name(s) << " values, block " << b;
        }
      }
      }
    }
  }
  }
}

TEST(AttentionLowp, X86MatchesReference) {
  SEED_TRACE();
  if (X86Paths().empty()) GTEST_SKIP() << "no AVX2 here";
  for (const X86Path& path : X86Paths()) {
    const KernelTable* kt = path.kt;
    uint32_t salt = 100;
    for (const Shape& s : AwkwardShapes()) {
      const bool outliers = salt % 3 == 0;
      const Problem p(s, salt++, outliers);
      auto tol = [](int, int) { return 0.0; };
      const std::vector<float> ref = RefRows(p, 0, s.n_tokens, path.pv);
      const std::vector<float> out = RunLowp(*kt, p);
      Check(p, out, 0, s.n_tokens, [&](int h, int t) { return RowOf(p, ref, h, t); }, tol, path.name + " vs ref");
      CheckUnevenDirectCalls(*kt, p, [&](int h, int t) { return RowOf(p, ref, h, t); }, tol, path.name);
    }
  }
}

// Keys of some blocks scaled up so that their scores exceed every earlier one by far more than
// kLowpRescale (log2 units) in most rows, and blocks after them back at the normal scale: the
// int8 P.V path's running max then moves in some lanes of a tile and not in others, and some
// blocks rescale no lane (the PV step's add without alpha). Fast paths equal to their reference;
// the int8 reference within its bound of fp64.
TEST(AttentionLowp, MaxJumpsMatchReferenceAndBound) {
  SEED_TRACE();
  uint32_t salt = 700;
  for (const Shape& s : {Shape{300, 4, 2, 64}, Shape{517, 8, 1, 128}, Shape{640, 2, 2, 80}}) {
    Problem p(s, salt++);
    for (int t = 0; t < s.n_tokens; ++t) {
      const int block = t / kLowpKeys;
      const float f = block == 2 ? 8.0f : block == 5 ? 30.0f : block == 6 ? 4.0f : 1.0f;
      for (int c = 0; c < s.n_head_kv * s.head_dim; ++c) p.k[t * p.ldk + c] *= f;
    }
    const std::vector<float> ref = RefRows(p, 0, s.n_tokens, LowpPv::kInt8);
    for (const X86Path& path : X86Paths()) {
      if (path.pv != LowpPv::kInt8) continue;
      const std::vector<float> out = RunLowp(*path.kt, p);
      Check(p, out, 0, s.n_tokens, [&](int h, int t) { return RowOf(p, ref, h, t); },
            [](int, int) { return 0.0; }, path.name + " vs ref, jumping max " + Name(s));
    }
    std::vector<std::vector<Fp64Row>> want(s.n_tokens, std::vector<Fp64Row>(s.n_head));
    for (int t = 0; t < s.n_tokens; ++t)
      for (int h = 0; h < s.n_head; ++h) want[t][h] = Fp64RowAndBound(p, h, t);
    Check(p, ref, 0, s.n_tokens, [&](int h, int t) { return want[t][h].o; },
          [&](int h, int t) { return want[t][h].Tol(LowpPv::kInt8); }, "int8 ref vs fp64, jumping max " + Name(s));
  }
}

// Both the reference and the fast path against fp64 attention within the stated bound, with and
// without key outliers.
TEST(AttentionLowp, MatchesFp64WithinStatedBound) {
  SEED_TRACE();
  uint32_t salt = 300;
  for (const Shape& s : AwkwardShapes()) {
    for (bool outliers : {false, true}) {
      const Problem p(s, salt++, outliers);
      std::vector<std::vector<Fp64Row>> want(s.n_tokens, std::vector<Fp64Row>(s.n_head));
      for (int t = 0; t < s.n_tokens; ++t)
        for (int h = 0; h < s.n_head; ++h) want[t][h] = Fp64RowAndBound(p, h, t);
      auto w = [&](int h, int t) { return want[t][h].o; };
      const std::string tag = outliers ? " (key outliers)" : "";
      for (LowpPv pv : {LowpPv::kBf16, LowpPv::kInt8})
        Check(p, RefRows(p, 0, s.n_tokens, pv), 0, s.n_tokens, w, [&](int h, int t) { return want[t][h].Tol(pv); },
              std::string(pv == LowpPv::kInt8 ? "int8 P.V" : "bf16 P.V") + " ref vs fp64" + tag);
      for (const X86Path& path : X86Paths())
        Check(p, RunLowp(*path.kt, p), 0, s.n_tokens, w, [&](int h, int t) { return want[t][h].Tol(path.pv); },
              path.name + " vs fp64" + tag);
    }
  }
}

// For the log (the figures quoted in attention_lowp.h; nothing asserted beyond the bound): the
// error of either P.V against fp64 with q, k, v ~ N(0, 1), T = 512, head_dim 64 and 128.
TEST(AttentionLowp, ErrorAgainstFp64ForTheLog) {
  SEED_TRACE();
  for (int d : {64, 128}) {
    Problem p(Shape{512, 4, 2, d}, 900 + d);
    std::mt19937 rng(TestSeed() + d);
    std::normal_distribution<float> n01;
    for (std::vector<float>* x : {&p.q, &p.k, &p.v})
      for (float& e : *x) e = n01(rng);
    std::vector<std::vector<Fp64Row>> want(p.s.n_tokens, std::vector<Fp64Row>(p.s.n_head));
    for (int t = 0; t < p.s.n_tokens; ++t)
      for (int h = 0; h < p.s.n_head; ++h) want[t][h] = Fp64RowAndBound(p, h, t);
    for (LowpPv pv : {LowpPv::kBf16, LowpPv::kInt8}) {
      const std::vector<float> out = RefRows(p, 0, p.s.n_tokens, pv);
      double sq = 0, worst = 0, vmax = 0;
      for (int t = 0; t < p.s.n_tokens; ++t)
        for (int h = 0; h < p.s.n_head; ++h)
          for (int c = 0; c < d; ++c) {
            const double e = out[t * p.ldo + h * d + c] - want[t][h].o[c];
            sq += e * e;
            worst = std::max(worst, std::fabs(e));
            vmax = std::max(vmax, std::fabs(static_cast<double>(p.V(t, p.KvHead(h))[c])));
          }
      std::printf("P.V in %s, head_dim %d: rms %.2e, largest %.2e (max|v| %.2f)\n",
                  pv == LowpPv::kInt8 ? "int8" : "bf16", d, std::sqrt(sq / (p.s.n_tokens * p.s.n_head * d)), worst,
                  vmax);
      Check(p, out, 0, p.s.n_tokens, [&](int h, int t) { return want[t][h].o; },
            [&](int h, int t) { return want[t][h].Tol(pv); }, "N(0, 1) inputs");
    }
  }
}

// The AArch64 BFDOT kernel against fp64 within its stated bound (Bf16RowAndBound), with and without
// key outliers, through AttentionPrefill (2 threads); then direct calls split as 1 head x 29 rows
// and whole GQA groups x 150 rows give the same bits (a row's result does not depend on its tile).
TEST(AttentionLowp, NeonBf16MatchesFp64WithinStatedBound) {
  SEED_TRACE();
  const KernelTable* kt = NeonBf16Table();
  if (kt == nullptr) GTEST_SKIP() << "no AArch64 bf16 here";
  uint32_t salt = 500;
  for (const Shape& s : AwkwardShapes()) {
    for (bool outliers : {false, true}) {
      const Problem p(s, salt++, outliers);
      std::vector<std::vector<Fp64Row>> want(s.n_tokens, std::vector<Fp64Row>(s.n_head));
      for (int t = 0; t < s.n_tokens; ++t)
        for (int h = 0; h < s.n_head; ++h) want[t][h] = Bf16RowAndBound(p, h, t);
      const std::string tag = outliers ? " (key outliers)" : "";
      const std::vector<float> out = RunLowp(*kt, p);
      Check(p, out, 0, s.n_tokens, [&](int h, int t) { return want[t][h].o; }, [&](int h, int t) { return want[t][h].tol; },
            "neon bf16 vs fp64" + tag);
      if (outliers) continue;
      CheckUnevenDirectCalls(*kt, p, [&](int h, int t) { return RowOf(p, out, h, t); }, [](int, int) { return 0.0; },
                             "neon bf16");
    }
  }
}

// Smoothing matters: channel offsets of +-40 on three key dims (as real K has) cancel in
// q.(k - mu), so the error stays that of the same heads without them (quantising the raw keys
// would put a step of 40/127 on every dim of every key, ~10x the error).
TEST(AttentionLowp, KeyChannelOffsetsKeepTheErrorSmall) {
  SEED_TRACE();
  const Shape s{257, 4, 1, 128};
  const Problem plain(s, 7);
  Problem offset = plain;
  for (int c : {1, 40, 126})
    for (int t = 0; t < s.n_tokens; ++t) offset.k[t * offset.ldk + c] += (c % 2 ? 40.0f : -40.0f);
  std::vector<const KernelTable*> tables = {&RefTable(LowpPv::kBf16), &RefTable(LowpPv::kInt8)};
  for (const X86Path& path : X86Paths()) tables.push_back(path.kt);
  for (const KernelTable* kt : tables) {
  auto worst_error = [&](const Problem& p) {
    const std::vector<float> out = RunLowp(*kt, p);
    double worst = 0;
    for (int t = 0; t < s.n_tokens; t += 4)
      for (int h = 0; h < s.n_head; ++h) {
        const Fp64Row r = Fp64RowAndBound(p, h, t);
        for (int c = 0; c < s.head_dim; ++c)
          worst = std::max(worst, std::fabs(out[t * p.ldo + h * s.head_dim + c] - r.o[c]));
      }
    return worst;
  };
  const double e_plain = worst_error(plain), e_offset = worst_error(offset);
  EXPECT_LT(e_offset, 2 * e_plain + 1e-3) << "plain heads " << e_plain << " isa " << static_cast<int>(kt->isa);
  EXPECT_LT(e_plain, 0.03) << "largest error vs fp64 (max|v| <= 1), isa " << static_cast<int>(kt->isa);
  }
}

// T = 4096: the last rows (most keys) and an early block against the reference and fp64.
TEST(AttentionLowp, LongSequence) {
  SEED_TRACE();
  if (X86Paths().empty()) GTEST_SKIP() << "no AVX2 here";
  const Shape s{4096, 2, 1, 128};
  const Problem p(s, 11, /*outliers=*/true);
  std::vector<std::vector<float>> refs[2];  // by LowpPv
  for (LowpPv pv : {LowpPv::kBf16, LowpPv::kInt8})
    for (const auto& [t0, t1] : {std::pair{4096 - 24, 4096}, std::pair{100, 120}})
      refs[static_cast<int>(pv)].push_back(RefRows(p, t0, t1, pv));
  std::vector<std::vector<Fp64Row>> want(s.n_head);
  for (int h = 0; h < s.n_head; ++h)
    for (int t : {4095, 2049, 130}) want[h].push_back(Fp64RowAndBound(p, h, t));
  for (const X86Path& path : X86Paths()) {
    const std::vector<float> out = RunLowp(*path.kt, p);
    int i = 0;
    for (const auto& [t0, t1] : {std::pair{4096 - 24, 4096}, std::pair{100, 120}}) {
      const std::vector<float>& ref = refs[static_cast<int>(path.pv)][i++];
      Check(p, out, t0, t1, [&](int h, int t) { return RowOf(p, ref, h, t); }, [](int, int) { return 0.0; },
            path.name + " long vs ref");
    }
    int k = 0;
    for (int t : {4095, 2049, 130}) {
      Check(p, out, t, t + 1, [&](int h, int) { return want[h][k].o; },
            [&](int h, int) { return want[h][k].Tol(path.pv); }, path.name + " long vs fp64");
      ++k;
    }
  }
}

// The engine's tables (the first kLowpKeys rows on key block 0 converted for them: K smoothed by
// key 0 before kLowpFirstSplit, by the mean of keys [0, kLowpFirstSplit) from it on): every row
// within the stated bound of fp64 (with that smoothing for those rows), with key outliers, T
// within the first split, within the first block and beyond; the fast paths' rows equal the
// reference's bit for bit.
TEST(AttentionLowp, FirstRowsWithinStatedBound) {
  SEED_TRACE();
  omp_set_num_threads(2);
  uint32_t salt = 1100;
  for (const Shape& s : {Shape{11, 2, 1, 64}, Shape{37, 4, 2, 64}, Shape{150, 4, 1, 128}, Shape{100, 2, 2, 72}}) {
    const Problem p(s, salt++, /*outliers=*/true);
    std::vector<std::vector<Fp64Row>> want(s.n_tokens, std::vector<Fp64Row>(s.n_head));
    for (int t = 0; t < s.n_tokens; ++t)
      for (int h = 0; h < s.n_head; ++h)
        want[t][h] = Fp64RowAndBound(p, h, t, t < kLowpFirstSplit ? 1 : t < kLowpKeys ? kLowpFirstSplit : 0);
    auto w = [&](int h, int t) { return want[t][h].o; };
    for (LowpPv pv : {LowpPv::kBf16, LowpPv::kInt8}) {
      const KernelTable ref_kt = LowpRefTable(true, pv);
      const std::vector<float> ref = RunLowp(ref_kt, p);
      Check(p, ref, 0, s.n_tokens, w, [&](int h, int t) { return want[t][h].Tol(pv); },
            std::string(pv == LowpPv::kInt8 ? "int8" : "bf16") + " ref, first rows, vs fp64 " + Name(s));
#if defined(__x86_64__)
      std::vector<std::pair<std::string, KernelTable>> fast;
      if (pv == LowpPv::kInt8 && HostIsa() == Isa::kAvx512) fast.emplace_back("avx512", LowpAvx512Table(true));
      if (pv == LowpPv::kBf16 && HostCpuFeatures().avx_vnni) fast.emplace_back("avx2_vnni", LowpAvx2Table(true, true));
      if (pv == LowpPv::kBf16 && IsaAtLeast(HostIsa(), Isa::kAvx2))
        fast.emplace_back("avx2_maddubs", LowpAvx2Table(true, false));
      for (const auto& [name, kt] : fast)
        Check(p, RunLowp(kt, p), 0, s.n_tokens, [&](int h, int t) { return RowOf(p, ref, h, t); },
              [](int, int) { return 0.0; }, name + " first rows vs ref " + Name(s));
#endif
    }
  }
}

// AttentionArgs::out_q8: the Q8A rows equal QuantizeRowQ8A of the same table's fp32 rows bit for
// bit, on the AVX-512 kernel (which quantises its O tiles itself) and on every other path
// (quantised after: the AVX2 ones, the references, the fp32 kernel, a head_dim not a multiple of
// 32), with a continuation's rows (q_begin > 0) and the blocks past each row's width untouched;
// rows before q_begin are not written.
TEST(AttentionLowp, Q8AOutputEqualsTheQuantisedRows) {
  SEED_TRACE();
  omp_set_num_threads(2);
  std::vector<std::pair<std::string, KernelTable>> tables = {{"ref int8", LowpRefTable(true, LowpPv::kInt8)},
                                                             {"ref bf16", LowpRefTable(true, LowpPv::kBf16)}};
#if defined(__x86_64__)
  if (HostIsa() == Isa::kAvx512) tables.emplace_back("avx512", LowpAvx512Table(true));
  if (HostCpuFeatures().avx_vnni) tables.emplace_back("avx2_vnni", LowpAvx2Table(true, true));
#endif
  uint32_t salt = 1300;
  for (const Shape& s : {Shape{37, 4, 2, 64}, Shape{150, 4, 1, 128}, Shape{300, 2, 2, 96}, Shape{70, 4, 2, 72},
                         Shape{130, 2, 1, 128}}) {
    const Problem p(s, salt++, /*outliers=*/true);
    const int64_t width = static_cast<int64_t>(s.n_head) * s.head_dim, blocks = width / kQK8A, ld = blocks + 1;
    for (const auto& [name, kt] : tables) {
      for (bool allow : {true, false}) {
        for (int q_begin : {0, 29}) {
          std::vector<float> fp32 = p.Poisoned(), scratch = p.Poisoned();
          AttentionArgs f = p.Args(fp32.data());
          f.allow_bf16 = allow;
          f.q_begin = q_begin;
          AttentionPrefillWith(kt, f);
          std::vector<BlockQ8A> got(static_cast<size_t>(s.n_tokens) * ld), want(got.size());
          std::memset(got.data(), 0xA5, got.size() * sizeof(BlockQ8A));
          std::memset(want.data(), 0xA5, want.size() * sizeof(BlockQ8A));
          for (int t = q_begin; t < s.n_tokens; ++t)
            QuantizeRowQ8A(fp32.data() + t * p.ldo, want.data() + t * ld, width);
          AttentionArgs a = p.Args(scratch.data());
          a.allow_bf16 = allow;
          a.q_begin = q_begin;
          a.out_q8 = got.data();
          a.ldo_q8 = ld;
          AttentionPrefillWith(kt, a);
          for (int t = 0; t < s.n_tokens; ++t)
            ASSERT_EQ(0, std::memcmp(&got[t * ld], &want[t * ld], ld * sizeof(BlockQ8A)))
                << name << " " << Name(s) << " allow_bf16 " << allow << " q_begin " << q_begin << " row " << t;
        }
      }
    }
  }
}

// With 8 kv heads a thread or more, AttentionPrefillWith hands each thread whole kv heads (each
// converted into the thread's own slot just before its items): the same bits as the schedule of
// items after a shared conversion (4 threads: 16 kv heads < 32), with two items per kv head.
TEST(AttentionLowp, WholeKvHeadsPerThreadGiveTheSameBits) {
  SEED_TRACE();
  if (X86Paths().empty()) GTEST_SKIP() << "no AVX2 here";
  const Shape s{2100, 16, 16, 64};  // 2,100 rows: two items (2,048 + 52 rows) per kv head
  const Problem p(s, 31, /*outliers=*/true);
  for (const X86Path& path : X86Paths()) {
    const std::vector<float> items = RunLowp(*path.kt, p, 4);
    for (int threads : {1, 2}) {
      const std::vector<float> whole = RunLowp(*path.kt, p, threads);
      Check(p, whole, 0, s.n_tokens, [&](int h, int t) { return RowOf(p, items, h, t); }, [](int, int) { return 0.0; },
            path.name + " whole kv heads, " + std::to_string(threads) + " threads");
    }
  }
}

// Where the converted-K/V buffer has a slot per thread beside the threads' own, the last `threads`
// kv heads are shared: their owner converts and publishes one, and every thread out of heads runs
// its rows in items of 4 tiles. The same bits as the items schedule, on 2 and 3 threads (3 on
// this 2-core machine: a thread may find a head still being converted), run after run, GQA 2.
TEST(AttentionLowp, SharedLastKvHeadsGiveTheSameBits) {
  SEED_TRACE();
  if (X86Paths().empty()) GTEST_SKIP() << "no AVX2 here";
  const Shape s{700, 48, 24, 64};  // 700 rows: three shared items (256, 256, 188 rows) per kv head
  const Problem p(s, 37, /*outliers=*/true);
  for (const X86Path& path : X86Paths()) {
    const std::vector<float> items = RunLowp(*path.kt, p, 4);
    for (int threads : {2, 3})
      for (int run = 0; run < 4; ++run) {
        const std::vector<float> shared = RunLowp(*path.kt, p, threads);
        const std::string what = path.name + " shared last kv heads, " + std::to_string(threads) + " threads";
        Check(p, shared, 0, s.n_tokens, [&](int h, int t) { return RowOf(p, items, h, t); },
              [](int, int) { return 0.0; }, what);
      }
  }
}

// An output of 8 MiB or more with 64-byte aligned rows is written with non-temporal stores (the
// AVX-512 kernel's finish_tile): the same bits as the plain stores of an unaligned output, every
// row, and the row padding untouched.
TEST(AttentionLowp, StreamedOutputEqualsPlainStores) {
  SEED_TRACE();
#if defined(__x86_64__)
  if (HostIsa() != Isa::kAvx512) GTEST_SKIP() << "no AVX-512 here";
  const Shape s{2050, 8, 2, 128};  // 2050 x 1024 floats: just over 8 MiB
  const Problem p(s, 21, /*outliers=*/false);
  const KernelTable kt = LowpAvx512Table(true);
  const std::vector<float> plain = RunLowp(kt, p);  // ldo = 1031: plain stores
  const int64_t ldo = static_cast<int64_t>(s.n_head) * s.head_dim + 16;
  AlignedPtr<float> out = AllocAligned<float>(static_cast<size_t>(s.n_tokens) * ldo);
  std::fill(out.get(), out.get() + static_cast<size_t>(s.n_tokens) * ldo, kNaN);
  AttentionArgs a = p.Args(out.get());
  a.ldo = ldo;
  omp_set_num_threads(2);
  AttentionPrefillWith(kt, a);
  int errors = 0;
  for (int t = 0; t < s.n_tokens && errors < 5; ++t) {
    const float* got = out.get() + t * ldo;
    const float* want = plain.data() + t * p.ldo;
    for (int c = 0; c < s.n_head * s.head_dim + 16; ++c) {
      const bool pad = c >= s.n_head * s.head_dim;
      if (pad ? !std::isnan(got[c]) : std::memcmp(&got[c], &want[c], sizeof(float)) != 0) {
        ADD_FAILURE() << "t=" << t << " c=" << c << " got " << got[c] << " want " << (pad ? kNaN : want[c]);
        if (++errors >= 5) break;
      }
    }
  }
#else
  GTEST_SKIP() << "x86 only";
#endif
}

// The phase timers (kernels/phase_timer.h) leave the results' bits alone, charge time to every
// phase the AVX-512 kernel's call passes through, and count nothing once switched off again.
TEST(AttentionLowp, PhaseTimersCountWithoutChangingTheResult) {
  SEED_TRACE();
  EXPECT_STREQ(AttnPhaseName(kPhaseQk), "qk");
  EXPECT_STREQ(AttnPhaseName(kPhaseCount), "?");
#if defined(__x86_64__)
  if (HostIsa() != Isa::kAvx512) GTEST_SKIP() << "no AVX-512 here";
  const Problem p(Shape{300, 8, 2, 128}, 23, /*outliers=*/true);
  const KernelTable kt = LowpAvx512Table(/*first_rows=*/true);
  const bool was_on = PhaseTimersOn();  // ESTREAM_PHASE_TIMERS=1 may have switched them on
  EnablePhaseTimers(false);
  uint64_t ticks[kPhaseCount];
  TakePhaseTicks(ticks);
  const std::vector<float> off = RunLowp(kt, p);
  TakePhaseTicks(ticks);
  for (const uint64_t t : ticks) EXPECT_EQ(t, 0u);
  EnablePhaseTimers(true);
  const std::vector<float> on = RunLowp(kt, p);
  EnablePhaseTimers(false);
  TakePhaseTicks(ticks);
  ASSERT_EQ(off.size(), on.size());
  EXPECT_EQ(std::memcmp(off.data(), on.data(), off.size() * sizeof(float)), 0);
  for (int phase : {kPhaseConvert, kPhaseFirstRows, kPhaseQuantiseQ, kPhaseQk, kPhaseSoftmax, kPhaseP, kPhasePv,
                    kPhaseOutput})
    EXPECT_GT(ticks[phase], 0u) << AttnPhaseName(phase);
  RunLowp(kt, p);
  TakePhaseTicks(ticks);
  for (const uint64_t t : ticks) EXPECT_EQ(t, 0u);
  EnablePhaseTimers(was_on);
#else
  GTEST_SKIP() << "the timed kernel is x86's";
#endif
}

// Through AttentionPrefill, whatever follows a row cannot change it: the rows of a prefix equal
// those of the whole sequence bit for bit, and so do rows computed from q_begin (a continuation
// after its context); the first kLowpKeys rows are those of direct calls on key block 0 converted
// with K smoothed by key 0 (rows before kLowpFirstSplit) or by the mean of keys
// [0, kLowpFirstSplit) (AttentionArgs::lowp_mean_keys). Ref table and the fast ones
// of this host (AVX-512, AVX2 with and without AVX-VNNI, AArch64 bf16); T on both sides of the first key block,
// GQA 2.
TEST(AttentionLowp, RowsDependOnlyOnEarlierKeys) {
  std::vector<KernelTable> tables = {LowpRefTable(true, LowpPv::kBf16), LowpRefTable(true, LowpPv::kInt8)};
#if defined(__x86_64__)
  if (HostIsa() == Isa::kAvx512) tables.push_back(LowpAvx512Table(true));
  if (HostCpuFeatures().avx_vnni) tables.push_back(LowpAvx2Table(true, true));
  if (IsaAtLeast(HostIsa(), Isa::kAvx2)) tables.push_back(LowpAvx2Table(true, false));
#endif
  if (const KernelTable* kt = NeonBf16Table()) tables.push_back(*kt);
  omp_set_num_threads(2);
  for (const KernelTable& kt : tables) {
    for (int T : {37, 200}) {
      const Problem p({T, 4, 2, 64}, 30 + T, /*outliers=*/true);
      std::vector<float> whole = p.Poisoned();
      AttentionPrefillWith(kt, p.Args(whole.data()));
      std::vector<float> first = p.Poisoned();
      const int split = kt.attention_first_split_bf16, first_end = std::min(T, kt.attention_first_rows_bf16);
      AlignedPtr<uint16_t> kv = AllocAligned<uint16_t>(kt.attention_kv_bytes_bf16(p.s.head_dim, kLowpKeys) / 2);
      const int rep = p.s.n_head / p.s.n_head_kv;
      for (const auto& [t0, t1, mean_keys] : {std::tuple{0, std::min(split, first_end), 1},
                                              std::tuple{split, first_end, split}}) {
        if (t0 >= t1) continue;
        AttentionArgs c = p.Args(first.data());
        c.lowp_mean_keys = mean_keys;
        for (int h = 0; h < p.s.n_head_kv; ++h) {
          kt.attention_convert_bf16(c, h, 0, 1, kv.get());
          kt.attention_block_bf16(p.Args(first.data()), kv.get(), h * rep, (h + 1) * rep, t0, t1);
        }
      }
      for (int prefix : {1, 29, 64, 65, 130}) {
        if (prefix >= T) continue;
        std::vector<float> part = p.Poisoned();
        AttentionArgs a = p.Args(part.data());
        a.n_tokens = prefix;
        AttentionPrefillWith(kt, a);
        std::vector<float> cont = p.Poisoned();
        AttentionArgs c = p.Args(cont.data());
        c.q_begin = prefix;
        AttentionPrefillWith(kt, c);
        for (int t = 0; t < T; ++t)
          for (int h = 0; h < p.s.n_head; ++h)
            for (int x = 0; x < p.s.head_dim; ++x) {
              const int64_t i = t * p.ldo + h * p.s.head_dim + x;
              const float* other = t < prefix ? &part[i] : &cont[i];
              ASSERT_EQ(0, std::memcmp(other, &whole[i], 4))
                  << "T=" << T << " prefix=" << prefix << " row " << t << " head " << h << " isa "
                  << static_cast<int>(kt.isa) << " seed " << TestSeed();
              if (t < first_end) {
                ASSERT_EQ(0, std::memcmp(&first[i], &whole[i], 4)) << "row " << t << " not on its own block 0";
              }
            }
      }
    }
  }
}

// The engine's table carries it exactly where the AMX kernel is not selected (and the switch is
// on), counts its buffer, and calls without allow_bf16 still run the fp32 kernel.
TEST(AttentionLowp, Wiring) {
#if defined(__aarch64__)
  // On AArch64: the BFDOT kernel exactly where the host has bf16 and neither switch is "0".
  const char* bf16_env = std::getenv("ESTREAM_ATTN_BF16");
  const char* lowp_env = std::getenv("ESTREAM_ATTN_LOWP");
  const bool want = HostCpuFeatures().neon_bf16 && !(bf16_env != nullptr && std::strcmp(bf16_env, "0") == 0) &&
                    !(lowp_env != nullptr && std::strcmp(lowp_env, "0") == 0);
  EXPECT_EQ(want, NeonBf16AttentionSelected());
  EXPECT_EQ(want, Kernels().attention_block_bf16 != nullptr);
  if (want) {
    EXPECT_EQ(Kernels().attention_first_rows_bf16, 0);
    EXPECT_GE(AttentionKvBytes(128, 32, 4, 1024, 2), Kernels().attention_kv_bytes_bf16(128, 1024));
    const Problem p({70, 4, 2, 64}, 21);
    std::vector<float> fp32 = p.Poisoned(), not_allowed = p.Poisoned();
    omp_set_num_threads(2);
    AttentionArgs f = p.Args(fp32.data());
    f.allow_bf16 = false;
    AttentionPrefillWith(KernelsFor(Isa::kNeon), f);
    AttentionArgs a = p.Args(not_allowed.data());
    a.allow_bf16 = false;
    AttentionPrefillWith(Kernels(), a);
    for (size_t i = 0; i < fp32.size(); ++i)
      ASSERT_TRUE(std::memcmp(&fp32[i], &not_allowed[i], 4) == 0) << "allow_bf16 = false must run the fp32 kernel";
  }
#elif !defined(__x86_64__)
  EXPECT_EQ(Kernels().attention_block_bf16, nullptr) << "the low-precision attention is x86-64 and AArch64 only";
#else
  // The AVX-512 kernel at the AVX-512 level without AMX; the AVX2 one at the AVX2 level
  // (the vpmaddubsw variant without AVX-VNNI); none at the scalar level.
  const KernelTable& kt = Kernels();
  const bool avx512 = ActiveIsa() == Isa::kAvx512 && !AttentionAmxSelected() && AttentionLowpSelected();
  const bool avx2 = ActiveIsa() == Isa::kAvx2 && AttentionLowpSelected();
  EXPECT_EQ(avx512, kt.attention_block_bf16 == AttentionBlockLowpAvx512);
  EXPECT_EQ(avx2, kt.attention_block_bf16 ==
                      (HostCpuFeatures().avx_vnni ? AttentionBlockLowpAvx2 : AttentionBlockLowpAvx2Maddubs));
  if (ActiveIsa() == Isa::kScalar) {
    EXPECT_EQ(kt.attention_block_bf16, nullptr);
  }
  if (avx512 || avx2) {
    EXPECT_GE(AttentionKvBytes(128, 32, 4, 1024, 2), AttentionLowpKvBytes(128, 1024));
    EXPECT_GE(AttentionScratchBytes(128), kt.attention_scratch_bytes_bf16(128, 32));
    const Problem p({70, 4, 2, 64}, 21);
    KernelTable fp32_only = kt;
    fp32_only.attention_block_bf16 = nullptr;
    std::vector<float> fp32 = p.Poisoned(), not_allowed = p.Poisoned();
    omp_set_num_threads(2);
    AttentionPrefillWith(fp32_only, p.Args(fp32.data()));
    AttentionArgs a = p.Args(not_allowed.data());
    a.allow_bf16 = false;
    AttentionPrefillWith(kt, a);
    for (size_t i = 0; i < fp32.size(); ++i)
      ASSERT_TRUE(std::memcmp(&fp32[i], &not_allowed[i], 4) == 0) << "allow_bf16 = false must run the fp32 kernel";
  }
#endif
}

}  // namespace
}  // namespace estream::kernels
