// Quantised and float GEMM: every ISA's kernels (GGUF and packed layouts) against an fp64
// reference, the Q8A quantiser fast vs scalar, the repack, and thread-count independence.
//
// Reference. W is dequantised with DequantizeRow (quant.cc, independent of the kernels), X is
// quantised with the scalar QuantizeRowQ8A and dequantised (x^ = d_x * q), and
// ref = sum_k w_k x^_k in fp64.
//
// Tolerance (kernel vs ref). A kernel computes, per 32-value block, an exact int32 dot I of the
// integer weight and activation values (|I| < 2^21, so its conversion to fp32 is exact), then
// one to four fp32 terms per block: I * (d_w * d_x) (two roundings) and, for the types with mins,
// the min term m * (d_x * sum) (two roundings); Q6_K, Q3_K and Q2_K have two scaled halves (Q2_K
// also two min terms) per block. These N <= 4 * k/32
// terms are summed in fp32 in some order (blocks in order within k chunks, chunks added to y):
// any summation order of N terms has error <= (N - 1) u sum|t| (u = 2^-24, first order), and
// each term carries <= 2u relative error of its own. DequantizeRow rounds each weight at most
// once (Q4_K: d1*q - m1, Q6_K: (d*sc)*q), <= u |w x^| per product. Hence
//     |y - ref| <= (N + 3) u B,   B = sum_k |x^_k| * (|d q_k| + |m|) for the types with mins (the
// two terms are computed separately and may cancel), B = sum_k |w_k x^_k| otherwise.
// Second check (activation quantisation): |x_k - x^_k| <= d_x (1/2 + 2^8 u) (round to nearest of
// fl(x * id), with d * id within 2u of 1), so |y - sum_k w_k x_k| <= sum_k |w_k| d_x (1/2 + 2^8 u)
// + the bound above.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "base/fp16.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/repack.h"
#if defined(__x86_64__)
#include "kernels/x86_avx2/gemm_avx2.h"
#include "kernels/x86_avx512/gemm_avx512.h"
#endif
#include "quant/quant.h"
#include "test_quick.h"

namespace estream::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

// Every level of the host's chain (scalar, avx2, avx512 / scalar, neon, dotprod, i8mm).
std::vector<Isa> IsasToTest() { return IsaLevelsUpTo(HostIsa()); }

struct Path {
  std::string name;
  const KernelTable* table;
};

// Every ISA's table, plus the AVX2 kernels without AVX-VNNI (vpmaddubsw) when the host would
// otherwise only run the VNNI variant.
std::vector<Path> PathsToTest() {
  std::vector<Path> paths;
  for (Isa isa : IsasToTest()) paths.push_back({IsaName(isa), &KernelsFor(isa)});
#if defined(__x86_64__)
  if (IsaAtLeast(HostIsa(), Isa::kAvx2)) {
    static const KernelTable no_vnni = [] {
      KernelTable t = KernelsFor(Isa::kScalar);
      FillAvx2GemmWith(&t, false);
      return t;
    }();
    paths.push_back({"avx2-maddubs", &no_vnni});
  }
  // With AMX the avx512 table sends row tiles of 16 to the tile unit; check vpdpbusd alone too.
  if (HostIsa() == Isa::kAvx512 && AmxUsable()) {
    static const KernelTable no_amx = [] {
      KernelTable t = KernelsFor(Isa::kAvx2);
      FillAvx512GemmWith(&t, false);
      return t;
    }();
    paths.push_back({"avx512-vnni-only", &no_amx});
  }
#endif
  return paths;
}

// Fresh inputs every run; the seed is printed, and ESTREAM_TEST_SEED=<n> replays a run.
std::mt19937_64& Rng() {
  static std::mt19937_64 rng([] {
    const char* env = std::getenv("ESTREAM_TEST_SEED");
    const uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("kernels_gemm_test: seed %llu (ESTREAM_TEST_SEED replays it)\n", static_cast<unsigned long long>(seed));
    return seed;
  }());
  return rng;
}

// Activations: normal with a few outliers, never exactly zero.
std::vector<float> RandomX(int64_t m, int64_t k) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) {
    v = nd(Rng());
    if (u(Rng()) < 0.01f) v *= 12.0f;
    if (v == 0.0f) v = 0.25f;
  }
  return x;
}

uint16_t RandomHalf(float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  return Fp32ToFp16(u(Rng()));
}

// n GGUF rows of k values of type t.
std::vector<uint8_t> RandomWeights(QuantType t, int64_t n, int64_t k) {
  const size_t rb = RowBytes(t, k);
  std::vector<uint8_t> w(rb * static_cast<size_t>(n));
  std::uniform_int_distribution<int> byte(0, 255);
  switch (t) {
    case QuantType::kQ4_0:
    case QuantType::kQ8_0:
    case QuantType::kF32:
    case QuantType::kF16:
    case QuantType::kBF16: {
      std::normal_distribution<float> nd(0.0f, 0.05f);
      std::vector<float> row(static_cast<size_t>(k));
      for (int64_t r = 0; r < n; ++r) {
        for (float& v : row) v = nd(Rng());
        QuantizeRow(t, row.data(), w.data() + r * rb, k);
      }
      return w;
    }
    case QuantType::kQ4_K: {
      for (auto& v : w) v = static_cast<uint8_t>(byte(Rng()));
      auto* b = reinterpret_cast<BlockQ4_K*>(w.data());
      for (size_t i = 0; i < w.size() / sizeof(BlockQ4_K); ++i) {
        b[i].d = RandomHalf(2e-4f, 8e-4f);
        b[i].dmin = RandomHalf(2e-4f, 2e-3f);
      }
      return w;
    }
    case QuantType::kQ6_K: {
      for (auto& v : w) v = static_cast<uint8_t>(byte(Rng()));
      auto* b = reinterpret_cast<BlockQ6_K*>(w.data());
      for (size_t i = 0; i < w.size() / sizeof(BlockQ6_K); ++i) b[i].d = RandomHalf(5e-5f, 2e-4f);
      return w;
    }
    // The other 256-value types: random bytes (every code, scale and min pattern) with sane f16
    // super-block scales.
    case QuantType::kQ5_K: {
      for (auto& v : w) v = static_cast<uint8_t>(byte(Rng()));
      auto* b = reinterpret_cast<BlockQ5_K*>(w.data());
      for (size_t i = 0; i < w.size() / sizeof(BlockQ5_K); ++i) {
        b[i].d = RandomHalf(1e-4f, 4e-4f);
        b[i].dmin = RandomHalf(2e-4f, 2e-3f);
      }
      return w;
    }
    case QuantType::kQ3_K: {
      for (auto& v : w) v = static_cast<uint8_t>(byte(Rng()));
      auto* b = reinterpret_cast<BlockQ3_K*>(w.data());
      for (size_t i = 0; i < w.size() / sizeof(BlockQ3_K); ++i) b[i].d = RandomHalf(2e-4f, 8e-4f);
      return w;
    }
    case QuantType::kQ2_K: {
      for (auto& v : w) v = static_cast<uint8_t>(byte(Rng()));
      auto* b = reinterpret_cast<BlockQ2_K*>(w.data());
      for (size_t i = 0; i < w.size() / sizeof(BlockQ2_K); ++i) {
        b[i].d = RandomHalf(1e-3f, 4e-3f);
        b[i].dmin = RandomHalf(1e-3f, 4e-3f);
      }
      return w;
    }
    case QuantType::kIQ4_XS: {
      for (auto& v : w) v = static_cast<uint8_t>(byte(Rng()));
      auto* b = reinterpret_cast<BlockIQ4_XS*>(w.data());
      for (size_t i = 0; i < w.size() / sizeof(BlockIQ4_XS); ++i) b[i].d = RandomHalf(1e-5f, 4e-5f);
      return w;
    }
    case QuantType::kMXFP4: {  // random codes, exponents around 2^-6 (e = 2^(e-128) x 2 E2M1)
      for (auto& v : w) v = static_cast<uint8_t>(byte(Rng()));
      auto* b = reinterpret_cast<BlockMXFP4*>(w.data());
      std::uniform_int_distribution<int> e(118, 124);
      for (size_t i = 0; i < w.size() / sizeof(BlockMXFP4); ++i) b[i].e = static_cast<uint8_t>(e(Rng()));
      return w;
    }
    case QuantType::kQ4_1:
    case QuantType::kQ5_0:
    case QuantType::kQ5_1:
    case QuantType::kIQ4_NL: {  // quantised normal values, shifted so that mins are not all ~-max
      std::normal_distribution<float> nd(0.0f, 0.05f);
      std::vector<float> row(static_cast<size_t>(k));
      for (int64_t r = 0; r < n; ++r) {
        const float shift = nd(Rng());
        for (float& v : row) v = nd(Rng()) + shift;
        QuantizeRow(t, row.data(), w.data() + r * rb, k);
      }
      return w;
    }
    default:
      ADD_FAILURE() << "no generator for " << TypeName(t);
      return w;
  }
}

// Per-value magnitude of the terms a kernel computes for weight value k of a row (see the
// comment at the top): |d_h (Q - Z)| + |m_h| from the block decoder (repack.h Block32), i.e. |w_k|
// for the types without mins.
std::vector<double> TermMagnitudes(QuantType t, const uint8_t* row, int64_t k) {
  std::vector<double> mag(static_cast<size_t>(k));
  const uint8_t* lut = PackedLut(t);
  const int z = ZeroPoint(t);
  for (int64_t b = 0; b < k / 32; ++b) {
    Block32 blk;
    DecodeBlock32(t, row, b, &blk);
    for (int v = 0; v < 32; ++v) {
      const int q = lut ? lut[blk.q[v]] : blk.q[v];
      mag[b * 32 + v] = std::fabs(static_cast<double>(blk.d[v / 16]) * (q - z)) + std::fabs(blk.m[v / 16]);
    }
  }
  return mag;
}

struct Problem {
  QuantType type;
  int64_t m, n, k;
  std::vector<uint8_t> w;       // GGUF rows
  std::vector<uint8_t> packed;  // RepackWeights(w)
  std::vector<float> x;         // m x k
  std::vector<BlockQ8A> xq;     // scalar Q8A of x
  std::vector<double> ref;      // fp64 reference with quantised x
  std::vector<double> tol;      // derived bound vs ref
  std::vector<double> ref_x;    // fp64 with the unquantised x
  std::vector<double> tol_x;    // bound vs ref_x
};

Problem MakeProblem(QuantType t, int64_t m, int64_t n, int64_t k) {
  Problem p;
  p.type = t;
  p.m = m;
  p.n = n;
  p.k = k;
  p.w = RandomWeights(t, n, k);
  p.x = RandomX(m, k);
  const int64_t kb = k / 32;
  p.xq.resize(static_cast<size_t>(m * kb));
  for (int64_t i = 0; i < m; ++i) QuantizeRowQ8A(p.x.data() + i * k, p.xq.data() + i * kb, k);
  if (CanRepack(t)) {
    p.packed.resize(PackedWeightBytes(t, n, k));
    RepackWeights(t, p.w.data(), n, k, p.packed.data());
  }
  std::vector<float> xdq(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m; ++i) DequantizeRowQ8A(p.xq.data() + i * kb, xdq.data() + i * k, k);
  p.ref.assign(static_cast<size_t>(m * n), 0.0);
  p.tol.assign(p.ref.size(), 0.0);
  p.ref_x.assign(p.ref.size(), 0.0);
  p.tol_x.assign(p.ref.size(), 0.0);
  const size_t rb = RowBytes(t, k);
  const int64_t terms = 4 * kb;  // <= 2 scaled halves and 2 min terms per block
  std::vector<float> wd(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    DequantizeRow(t, p.w.data() + r * rb, wd.data(), k);
    const std::vector<double> mag = TermMagnitudes(t, p.w.data() + r * rb, k);
    for (int64_t i = 0; i < m; ++i) {
      double acc = 0, accx = 0, bound = 0, qerr = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double xh = xdq[i * k + j];
        acc += wd[j] * xh;
        accx += static_cast<double>(wd[j]) * p.x[i * k + j];
        bound += mag[j] * std::fabs(xh);
        qerr += std::fabs(static_cast<double>(wd[j])) * p.xq[i * kb + j / 32].d * (0.5 + 256 * kU);
      }
      p.ref[i * n + r] = acc;
      p.tol[i * n + r] = (terms + 3) * kU * bound + 1e-30;
      p.ref_x[i * n + r] = accx;
      p.tol_x[i * n + r] = qerr + p.tol[i * n + r];
    }
  }
  return p;
}

KernelTable::GemmFn Fn(const KernelTable& kt, QuantType t, bool packed) { return kt.Quant(t, packed); }

// The table's float GEMM for weights of type t (F32, F16 or BF16).
auto FloatFn(const KernelTable& kt, QuantType t) {
  return t == QuantType::kF32 ? kt.gemm_f32 : t == QuantType::kF16 ? kt.gemm_f16 : kt.gemm_bf16;
}

int64_t BlockOf(QuantType t) { return GetTypeTraits(t)->block_size; }

// Checks y (m x n, leading dimension ldy) against the problem's bounds; returns the count of
// failures (reporting the first few).
int CheckAgainst(const Problem& p, const std::vector<float>& y, int64_t ldy, const std::string& what) {
  int bad = 0;
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t r = 0; r < p.n; ++r) {
      const double v = y[i * ldy + r];
      const size_t at = static_cast<size_t>(i * p.n + r);
      const bool ok = std::fabs(v - p.ref[at]) <= p.tol[at] && std::fabs(v - p.ref_x[at]) <= p.tol_x[at];
      if (!ok && ++bad <= 3)
        ADD_FAILURE() << what << " m=" << p.m << " n=" << p.n << " k=" << p.k << " at (" << i << "," << r
                      << "): got " << v << " ref " << p.ref[at] << " (tol " << p.tol[at] << ") ref_x "
                      << p.ref_x[at] << " (tol " << p.tol_x[at] << ")";
    }
  return bad;
}

struct Shape {
  int64_t m, n, kmul;
  bool quick = false;  // one of the shapes of test::QuickTests() runs (emulated ARM64 stage)
};

// M sweeps the required values; N is odd/prime and K off the tile (multiples of the block).
const Shape kShapes[] = {{1, 97, 7, true}, {2, 17, 3}, {3, 47, 1}, {7, 33, 5, true}, {31, 61, 3},
                         {64, 50, 2}, {65, 19, 7, true}, {127, 41, 1}, {513, 23, 2}};

bool SkipShape(const Shape& s) { return test::QuickTests() && !s.quick; }

void RunQuantTest(QuantType t, int64_t block) {
  for (const Shape& s : kShapes) {
    if (SkipShape(s)) continue;
    const int64_t k = s.kmul * (block == 32 ? 37 : 256);  // Q4_0/Q8_0: 37 blocks per kmul
    Problem p = MakeProblem(t, s.m, s.n, block == 32 ? (s.kmul * 32 * (s.m % 2 ? 5 : 9)) : k);
    const int64_t ldy = p.n + 3;
    std::vector<KernelTable::GemmFn> tested;  // a level that inherits a kernel runs it once
    for (const Path& path : PathsToTest()) {
      for (bool packed : {false, true}) {
        const auto fn = Fn(*path.table, t, packed);
        ASSERT_NE(fn, nullptr);
        if (std::find(tested.begin(), tested.end(), fn) != tested.end()) continue;
        tested.push_back(fn);
        std::vector<float> y(static_cast<size_t>(p.m * ldy), std::nanf(""));
        const WeightView w{t, packed ? WeightLayout::kPacked : WeightLayout::kGguf, p.n, p.k,
                           packed ? p.packed.data() : p.w.data()};
        // In two column ranges (the second not panel-aligned) to exercise the split.
        const int64_t split = p.n / 2;
        fn(w, p.xq.data(), p.m, 0, split, y.data(), ldy);
        fn(w, p.xq.data(), p.m, split, p.n, y.data(), ldy);
        const std::string what = std::string(TypeName(t)) + " " + path.name + (packed ? " packed" : " gguf");
        EXPECT_EQ(CheckAgainst(p, y, ldy, what), 0) << what;
        for (int64_t i = 0; i < p.m; ++i)  // the padding columns stay untouched
          for (int64_t c = p.n; c < ldy; ++c) ASSERT_TRUE(std::isnan(y[i * ldy + c])) << what;
      }
    }
  }
}

TEST(GemmQuant, Q4_0EveryIsaAndLayout) { RunQuantTest(QuantType::kQ4_0, 32); }
TEST(GemmQuant, Q8_0EveryIsaAndLayout) { RunQuantTest(QuantType::kQ8_0, 32); }
TEST(GemmQuant, Q4_KEveryIsaAndLayout) { RunQuantTest(QuantType::kQ4_K, 256); }
TEST(GemmQuant, Q6_KEveryIsaAndLayout) { RunQuantTest(QuantType::kQ6_K, 256); }
TEST(GemmQuant, Q4_1EveryIsaAndLayout) { RunQuantTest(QuantType::kQ4_1, 32); }
TEST(GemmQuant, Q5_0EveryIsaAndLayout) { RunQuantTest(QuantType::kQ5_0, 32); }
TEST(GemmQuant, Q5_1EveryIsaAndLayout) { RunQuantTest(QuantType::kQ5_1, 32); }
TEST(GemmQuant, Q5_KEveryIsaAndLayout) { RunQuantTest(QuantType::kQ5_K, 256); }
TEST(GemmQuant, Q3_KEveryIsaAndLayout) { RunQuantTest(QuantType::kQ3_K, 256); }
TEST(GemmQuant, Q2_KEveryIsaAndLayout) { RunQuantTest(QuantType::kQ2_K, 256); }
TEST(GemmQuant, IQ4_NLEveryIsaAndLayout) { RunQuantTest(QuantType::kIQ4_NL, 32); }
TEST(GemmQuant, IQ4_XSEveryIsaAndLayout) { RunQuantTest(QuantType::kIQ4_XS, 256); }
TEST(GemmQuant, MXFP4EveryIsaAndLayout) { RunQuantTest(QuantType::kMXFP4, 32); }

// The byte that sets every packed weight of t to its format's largest stored value
// (quant/packed_format.h): 6-bit bytes 63, 5-bit bytes 31, else 0xFF (both nibbles 15, or Q8_0's
// 255).
uint8_t MaxStoredByte(QuantType t) {
  const QuantType f = PackedFormat(t);
  if (f == QuantType::kQ6_K) return 63;
  if (f == QuantType::kQ5_1 || f == QuantType::kQ5_K) return 31;
  return 0xFF;
}

// Every stored weight at its format's largest value and every activation at +127 or -127 (the
// ends of Q8A's range, one sign per row): the largest integer partial sums a kernel forms, where a
// 16-bit intermediate that overflowed or saturated (vpmaddubsw pairs, the AVX2 kernels' int16
// sums of several of them) would show as a gross error. Every path against the scalar one.
TEST(GemmQuant, ExtremeStoredValuesDoNotOverflow) {
  constexpr int64_t m = 5, n = 32, k = 512;
  const int64_t kb = k / 32;
  std::vector<BlockQ8A> xq(static_cast<size_t>(m * kb));
  std::uniform_real_distribution<float> du(0.005f, 0.02f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = 0; b < kb; ++b) {
      BlockQ8A& blk = xq[i * kb + b];
      const int v = i % 2 ? -127 : 127;
      for (int8_t& q : blk.qs) q = static_cast<int8_t>(v);
      blk.d = du(Rng());
      blk.sum[0] = blk.sum[1] = static_cast<int16_t>(16 * v);
    }
  for (QuantType t : kGemmQuantTypes) {
    if (!CanRepack(t)) continue;
    std::vector<uint8_t> packed(PackedWeightBytes(t, n, k));
    RepackWeights(t, RandomWeights(t, n, k).data(), n, k, packed.data());
    const int64_t sect = PackedScaleSection(PackedFormat(t), kb), panel = PackedPanelBytes(PackedFormat(t), k);
    const int64_t qbytes = kb * PackedQuantBytes(PackedFormat(t));
    for (int64_t p = 0; p < n / kPackRows; ++p)
      std::memset(packed.data() + p * panel + sect, MaxStoredByte(t), static_cast<size_t>(qbytes));
    const WeightView w{t, WeightLayout::kPacked, n, k, packed.data()};
    std::vector<float> ref(static_cast<size_t>(m * n));
    Fn(KernelsFor(Isa::kScalar), t, true)(w, xq.data(), m, 0, n, ref.data(), n);
    for (const Path& path : PathsToTest()) {
      std::vector<float> y(ref.size(), std::nanf(""));
      Fn(*path.table, t, true)(w, xq.data(), m, 0, n, y.data(), n);
      for (int64_t i = 0; i < m; ++i) {
        double scale = 0;
        for (int64_t r = 0; r < n; ++r) scale = std::max(scale, std::fabs(static_cast<double>(ref[i * n + r])));
        for (int64_t r = 0; r < n; ++r)
          ASSERT_LE(std::fabs(static_cast<double>(y[i * n + r]) - ref[i * n + r]), 1e-5 * scale)
              << TypeName(t) << " " << path.name << " at (" << i << "," << r << "): " << y[i * n + r] << " vs "
              << ref[i * n + r];
      }
    }
  }
}

// The packed layout holds exactly the GGUF values: the scalar kernels agree bit for bit.
TEST(GemmQuant, RepackIsExact) {
  for (QuantType t : kGemmQuantTypes) {
    const int64_t k = BlockOf(t) == 32 ? 96 : 512;
    Problem p = MakeProblem(t, 5, 37, k);
    std::vector<float> a(static_cast<size_t>(p.m * p.n), std::nanf("")), b = a;
    const KernelTable& kt = KernelsFor(Isa::kScalar);
    Fn(kt, t, false)({t, WeightLayout::kGguf, p.n, p.k, p.w.data()}, p.xq.data(), p.m, 0, p.n, a.data(), p.n);
    Fn(kt, t, true)({t, WeightLayout::kPacked, p.n, p.k, p.packed.data()}, p.xq.data(), p.m, 0, p.n, b.data(), p.n);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << TypeName(t);
  }
}

// PackPanel against the layout of quant/packed_format.h, spelled out from DecodeBlock32 (the per-value decoder)
// for full and partial panels of every type; Q4_0 and Q8_0 have their own byte-copy path.
TEST(GemmQuant, PackPanelMatchesLayout) {
  for (QuantType t : kGemmQuantTypes) {
    const int64_t k = BlockOf(t) == 32 ? 160 : 512, kb = k / 32;
    const size_t row_bytes = RowBytes(t, k);
    for (int rows : {16, 11}) {
      const std::vector<uint8_t> w = RandomWeights(t, rows, k);
      std::vector<uint8_t> got(static_cast<size_t>(PackedPanelBytes(t, k)), 0xA5);
      PackPanel(t, w.data(), row_bytes, rows, k, got.data());
      const uint8_t* quants = got.data() + PackedScaleSection(t, kb);
      const bool nibbles = PackedNibbles(t);
      for (int64_t b = 0; b < kb; ++b)
        for (int r = 0; r < kPackRows; ++r) {
          Block32 blk{};
          if (r < rows) DecodeBlock32(t, w.data() + r * row_bytes, b, &blk);
          const uint8_t* q = quants + b * PackedQuantBytes(t);
          for (int v = 0; v < 32; ++v) {
            const int s = v / 4, j = v % 4;
            const int got_v = nibbles ? (q[((s % 4) * 16 + r) * 4 + j] >> (s < 4 ? 0 : 4)) & 0x0F
                                      : q[(s * 16 + r) * 4 + j];
            ASSERT_EQ(got_v, r < rows ? blk.q[v] : 0)
                << TypeName(t) << " rows " << rows << " block " << b << " row " << r << " value " << v;
          }
        }
    }
  }
}

TEST(GemmQuant, PackedBytes) {
  // Q4_0/Q8_0: scale section of k/32 fp16 x 16 rows padded to 64 bytes, then the quants.
  EXPECT_EQ(PackedWeightBytes(QuantType::kQ4_0, 17, 64), 2u * (64 + 2 * 256));
  EXPECT_EQ(PackedWeightBytes(QuantType::kQ4_0, 32, 4096), 2u * 16 * RowBytes(QuantType::kQ4_0, 4096));
  EXPECT_EQ(PackedWeightBytes(QuantType::kQ8_0, 16, 32), 576u);
  EXPECT_EQ(PackedWeightBytes(QuantType::kQ4_K, 1, 256), 64u + 8 * 32 + 8 * 256);
  EXPECT_EQ(PackedWeightBytes(QuantType::kQ6_K, 33, 256), 3u * (320 + 8 * 512));
  EXPECT_FALSE(CanRepack(QuantType::kF16));
  EXPECT_TRUE(GemmSupports(QuantType::kBF16));
  EXPECT_FALSE(GemmSupports(QuantType::kQ8_K));
  for (QuantType t : kGemmQuantTypes) {
    EXPECT_TRUE(GemmSupports(t)) << TypeName(t);
    EXPECT_TRUE(CanRepack(t)) << TypeName(t);
  }
  // The new formats' sizes (quant/packed_format.h): Q4_1 5.0 bits per weight, Q5_0 as Q8_0, Q5_K 8.625,
  // Q3_K 4.5625, Q2_K 5.125, IQ4_NL 4.5, IQ4_XS 4.3125, MXFP4 4.25.
  EXPECT_EQ(PackedWeightBytes(QuantType::kQ4_1, 16, 4096), 16u * 4096 * 5 / 8);
  EXPECT_EQ(PackedWeightBytes(QuantType::kQ5_0, 16, 4096), PackedWeightBytes(QuantType::kQ8_0, 16, 4096));
  EXPECT_EQ(PackedWeightBytes(QuantType::kQ5_K, 16, 4096), 16u * 4096 * 8.625 / 8);
  EXPECT_EQ(PackedWeightBytes(QuantType::kQ3_K, 16, 4096), 16u * 4096 * 4.5625 / 8);
  EXPECT_EQ(PackedWeightBytes(QuantType::kQ2_K, 16, 4096), 16u * 4096 * 5.125 / 8);
  EXPECT_EQ(PackedWeightBytes(QuantType::kIQ4_NL, 16, 4096), 16u * 4096 * 4.5 / 8);
  EXPECT_EQ(PackedWeightBytes(QuantType::kIQ4_XS, 16, 4096), 16u * 4096 * 4.3125 / 8);
  EXPECT_EQ(PackedWeightBytes(QuantType::kMXFP4, 16, 4096), 16u * 4096 * 4.25 / 8);
}

// The thread-count tests mean something only if a team of two really runs on two threads: under
// qemu-user (the ARM64 stage of scripts/test.sh) every guest thread is a host thread, and a
// runtime that quietly gave one thread would let them pass without splitting anything.
TEST(Threads, TeamOfTwoRunsTwoThreads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  int team = 0, ran = 0;
#pragma omp parallel reduction(+ : ran)
  {
#pragma omp single
    team = omp_get_num_threads();
    ran += 1;
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(team, 2);
  EXPECT_EQ(ran, 2);
}

// Public entry points with 1 and 2 threads: bit-identical, and correct. n = 17 (two panels) makes
// the split go by rows, which moves rows between the AMX tiles and the vpdpbusd tail.
TEST(GemmQuant, ThreadCountDoesNotChangeResults) {
  const int saved = omp_get_max_threads();
  for (QuantType t : kGemmQuantTypes) {
    for (int64_t m : {3, 70}) {
      if (test::QuickTests() && m == 3) continue;
      const int64_t k = BlockOf(t) == 32 ? 320 : 512;
      for (int64_t n : {101, 17}) {
      Problem p = MakeProblem(t, m, n, k);
      for (bool packed : {false, true}) {
        const WeightView w{t, packed ? WeightLayout::kPacked : WeightLayout::kGguf, p.n, p.k,
                           packed ? p.packed.data() : p.w.data()};
        std::vector<float> y1(static_cast<size_t>(p.m * p.n), std::nanf("")), y2 = y1, y3 = y1;
        omp_set_num_threads(1);
        MatMul(w, p.x.data(), p.k, p.m, y1.data(), p.n);
        omp_set_num_threads(2);
        MatMul(w, p.x.data(), p.k, p.m, y2.data(), p.n);
        GemmQ8A(w, p.xq.data(), p.m, y3.data(), p.n);
        omp_set_num_threads(saved);
        EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0) << TypeName(t);
        EXPECT_EQ(std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float)), 0) << TypeName(t);
        EXPECT_EQ(CheckAgainst(p, y1, p.n, std::string("MatMul ") + TypeName(t)), 0);
      }
      }
    }
  }
}

// The AMX tile path does the fp32 operations of the vpdpbusd kernel in the same order (Q6_K: its
// two halves per block in order), so the two give bit-identical outputs; m = 70 puts 64 rows on
// the tile unit and 6 on vpdpbusd, k covers several 256-value super-blocks and k chunks.
TEST(GemmQuant, AmxPathBitIdenticalToVnni) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "AMX is x86-64 only";
#else
  if (HostIsa() != Isa::kAvx512 || !AmxUsable()) GTEST_SKIP() << "no AMX-INT8 on this CPU";
  KernelTable amx = KernelsFor(Isa::kAvx2), vnni = amx;
  FillAvx512GemmWith(&amx, true);
  FillAvx512GemmWith(&vnni, false);
  // Row counts with a tail of 6, 5 (both padded AMX tiles, in a pair and alone), 4 (vpdpbusd) and 15.
  for (QuantType t : kGemmQuantTypes)
    for (int64_t m : {70, 21, 20, 127}) {
      const int64_t k = BlockOf(t) == 32 ? 32 * 37 : 256 * 5;
      Problem p = MakeProblem(t, m, 37, k);
      const std::string what = std::string(TypeName(t)) + " m " + std::to_string(m);
      for (bool packed : {false, true}) {
        const WeightView w{t, packed ? WeightLayout::kPacked : WeightLayout::kGguf, p.n, p.k,
                           packed ? p.packed.data() : p.w.data()};
        // 16 guard rows after the output: a padded tile must not store its padding rows.
        const std::vector<float> poison(static_cast<size_t>((p.m + 16) * p.n), std::nanf(""));
        std::vector<float> ya = poison, yv = poison;
        Fn(amx, t, packed)(w, p.xq.data(), p.m, 0, p.n, ya.data(), p.n);
        Fn(vnni, t, packed)(w, p.xq.data(), p.m, 0, p.n, yv.data(), p.n);
        EXPECT_EQ(std::memcmp(ya.data(), yv.data(), ya.size() * sizeof(float)), 0) << what;
        EXPECT_EQ(std::memcmp(ya.data() + p.m * p.n, poison.data(), 16 * p.n * sizeof(float)), 0) << what;
        ya.resize(static_cast<size_t>(p.m * p.n));
        EXPECT_EQ(CheckAgainst(p, ya, p.n, "AMX " + what), 0);
      }
    }
#endif
}

// ---- Gemm: several outputs on shared activations, and the residual add -----------------------

// One weight of a multi-output case: GGUF rows and, where the type repacks, the packed rows.
struct Part {
  QuantType t;
  int64_t n;
  std::vector<uint8_t> w, packed;
  WeightView View(int64_t k, bool use_packed) const {
    const bool p = use_packed && !packed.empty();
    return {t, p ? WeightLayout::kPacked : WeightLayout::kGguf, n, k, p ? packed.data() : w.data()};
  }
};

std::vector<Part> MakeParts(const std::vector<std::pair<QuantType, int64_t>>& spec, int64_t k) {
  std::vector<Part> parts;
  for (const auto& [t, n] : spec) {
    Part p{t, n, RandomWeights(t, n, k), {}};
    if (CanRepack(t)) {
      p.packed.resize(PackedWeightBytes(t, n, k));
      RepackWeights(t, p.w.data(), n, k, p.packed.data());
    }
    parts.push_back(std::move(p));
  }
  return parts;
}

// GemmWith over `parts` (in one call, 1 and 2 threads, xq given or quantised inside, plain and
// `add`) against each weight alone through the table's kernel on one thread over all its columns
// (the entries the tests above check against fp64), then for `add` kt.add of that into the
// residual rows: bit for bit, padding columns (NaN) untouched.
void CheckGemmParts(const std::vector<Part>& parts, int64_t m, int64_t k, const std::string& what) {
  const std::vector<float> x = RandomX(m, k);
  std::vector<BlockQ8A> xq(static_cast<size_t>(m * (k / 32)));
  for (int64_t i = 0; i < m; ++i) QuantizeRowQ8A(x.data() + i * k, xq.data() + i * (k / 32), k);
  const size_t np = parts.size();
  std::vector<int64_t> ldy(np);
  std::vector<std::vector<float>> residual(np);
  for (size_t i = 0; i < np; ++i) {
    ldy[i] = parts[i].n + 3;
    residual[i] = RandomX(m, ldy[i]);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = parts[i].n; c < ldy[i]; ++c) residual[i][r * ldy[i] + c] = std::nanf("");
  }
  const int saved = omp_get_max_threads();
  for (const Path& path : PathsToTest()) {
    const KernelTable& kt = *path.table;
    for (bool packed : {false, true}) {
      std::vector<WeightView> views;
      for (const Part& p : parts) views.push_back(p.View(k, packed));
      // Each weight alone.
      std::vector<std::vector<float>> alone(np), alone_add(np);
      for (size_t i = 0; i < np; ++i) {
        alone[i].assign(static_cast<size_t>(m * ldy[i]), std::nanf(""));
        GemmColumns(kt, views[i], xq.data(), x.data(), k, m, 0, parts[i].n, alone[i].data(), ldy[i]);
        int nonzero = 0;
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < parts[i].n; ++c) nonzero += alone[i][r * ldy[i] + c] != 0.0f;
        ASSERT_GT(nonzero, 0) << what;
        alone_add[i] = residual[i];
        for (int64_t r = 0; r < m; ++r) kt.add(alone_add[i].data() + r * ldy[i], alone[i].data() + r * ldy[i], parts[i].n);
      }
      for (int threads : {1, 2})
        for (bool add : {false, true}) {
          std::vector<std::vector<float>> y(np);
          std::vector<GemmOut> outs;
          for (size_t i = 0; i < np; ++i) {
            y[i] = add ? residual[i] : std::vector<float>(static_cast<size_t>(m * ldy[i]), std::nanf(""));
            outs.push_back({.w = &views[i], .y = y[i].data(), .ldy = ldy[i], .add = add});
          }
          omp_set_num_threads(threads);
          GemmWith(kt, outs, x.data(), k, threads == 1 ? xq.data() : nullptr, m);
          omp_set_num_threads(saved);
          for (size_t i = 0; i < np; ++i) {
            const std::vector<float>& want = add ? alone_add[i] : alone[i];
            EXPECT_EQ(std::memcmp(y[i].data(), want.data(), want.size() * sizeof(float)), 0)
                << what << " " << path.name << (packed ? " packed" : " gguf") << " part " << i << " threads "
                << threads << (add ? " add" : "");
          }
        }
    }
  }
}

// Q/K/V of the shapes the engine runs (4096 / 512 / 512; M off every tile; with `add`, 4096
// columns on one thread make two row chunks of the add tile) and awkward ones: odd panel counts
// (each output starts at an even unit of the split), a case the split cuts by rows (3 panels, 70
// rows), one row.
TEST(GemmParts, QkvMatchSeparateCallsBitForBit) {
  for (QuantType t : {QuantType::kQ4_0, QuantType::kQ4_K}) {
    const int64_t k = BlockOf(t) == 32 ? 32 * 7 : 512;
    CheckGemmParts(MakeParts({{t, 4096}, {t, 512}, {t, 512}}, k), 37, k, std::string(TypeName(t)) + " 4096/512/512");
    if (test::QuickTests()) break;
  }
}

TEST(GemmParts, EveryTypeAwkwardSizesMatchSeparateCalls) {
  for (QuantType t : kGemmQuantTypes) {
    if (test::QuickTests() && t != QuantType::kQ8_0) continue;
    const int64_t k = BlockOf(t) == 32 ? 32 * 5 : 256;
    const std::string name = TypeName(t);
    CheckGemmParts(MakeParts({{t, 97}, {t, 33}, {t, 161}}, k), 70, k, name + " 97/33/161 m 70");
    CheckGemmParts(MakeParts({{t, 17}, {t, 5}}, k), 70, k, name + " 17/5 m 70 (by rows)");
    CheckGemmParts(MakeParts({{t, 31}, {t, 1}, {t, 47}}, k), 1, k, name + " 31/1/47 m 1");
  }
}

// Mixed types (one region per type, float weights on the float rows) and float weights alone.
TEST(GemmParts, MixedAndFloatTypesMatchSeparateCalls) {
  const int64_t k = 32 * 6;
  CheckGemmParts(MakeParts({{QuantType::kQ4_0, 97}, {QuantType::kQ8_0, 33}, {QuantType::kF32, 40},
                            {QuantType::kQ4_0, 19}},
                           k),
                 37, k, "Q4_0/Q8_0/F32/Q4_0");
  CheckGemmParts(MakeParts({{QuantType::kF16, 300}, {QuantType::kBF16, 17}}, k), 21, k, "F16/BF16");
}

// The public entry points as the engine calls them: Gemm's `add` output equals MatMul into a
// buffer followed by Add row by row.
TEST(GemmParts, AddEqualsMatMulThenAdd) {
  const int64_t m = 45, n = 200, k = 32 * 9;
  const std::vector<Part> parts = MakeParts({{QuantType::kQ4_0, n}}, k);
  const WeightView w = parts[0].View(k, true);
  const std::vector<float> x = RandomX(m, k);
  std::vector<float> y_ref = RandomX(m, n), y = y_ref, buf(static_cast<size_t>(m * n));
  MatMul(w, x.data(), k, m, buf.data(), n);
  for (int64_t r = 0; r < m; ++r) Add(y_ref.data() + r * n, buf.data() + r * n, n);
  const GemmOut out{.w = &w, .y = y.data(), .ldy = n, .add = true};
  Gemm(std::span(&out, 1), x.data(), k, nullptr, m);
  EXPECT_EQ(std::memcmp(y.data(), y_ref.data(), y.size() * sizeof(float)), 0);
}

// Float weights: each output is summed in k order by one thread, whatever the split: m = 37 and
// n = 17 split by rows (32 + 5), n = 300 by columns.
TEST(GemmFloat, ThreadCountDoesNotChangeResults) {
  const int saved = omp_get_max_threads();
  for (QuantType t : {QuantType::kF32, QuantType::kF16, QuantType::kBF16})
    for (int64_t n : {17, 300}) {
      const int64_t m = 37, k = 77;
      const std::vector<uint8_t> wq = RandomWeights(t, n, k);
      const std::vector<float> x = RandomX(m, k);
      const WeightView w{t, WeightLayout::kGguf, n, k, wq.data()};
      std::vector<float> y1(static_cast<size_t>(m * n), std::nanf("")), y2 = y1;
      omp_set_num_threads(1);
      MatMul(w, x.data(), k, m, y1.data(), n);
      omp_set_num_threads(2);
      MatMul(w, x.data(), k, m, y2.data(), n);
      omp_set_num_threads(saved);
      EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0) << TypeName(t) << " n=" << n;
    }
}

// Float weights: fp32 products and sums; |y - ref| <= (k + 2) u sum|w x| (recursive summation
// of k products, each rounded once; the weights themselves are exact in fp32).
TEST(GemmFloat, EveryIsaMatchesFp64) {
  for (QuantType t : {QuantType::kF32, QuantType::kF16, QuantType::kBF16}) {
    for (const Shape& s : kShapes) {
      if (SkipShape(s)) continue;
      const int64_t k = 13 + 29 * s.kmul;  // off every vector width
      if (s.m > 127) continue;             // the scalar float path is slow; 127 covers the tiles
      const std::vector<uint8_t> wq = RandomWeights(t, s.n, k);
      const std::vector<float> x = RandomX(s.m, k);
      std::vector<float> wd(static_cast<size_t>(s.n * k));
      for (int64_t r = 0; r < s.n; ++r) DequantizeRow(t, wq.data() + r * RowBytes(t, k), wd.data() + r * k, k);
      for (const Path& path : PathsToTest()) {
        const KernelTable& kt = *path.table;
        const auto fn = FloatFn(kt, t);
        std::vector<float> y(static_cast<size_t>(s.m * s.n), std::nanf(""));
        const WeightView w{t, WeightLayout::kGguf, s.n, k, wq.data()};
        fn(w, x.data(), k, s.m, 0, s.n / 3, y.data(), s.n);
        fn(w, x.data(), k, s.m, s.n / 3, s.n, y.data(), s.n);
        int bad = 0;
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t r = 0; r < s.n; ++r) {
            double acc = 0, mag = 0;
            for (int64_t j = 0; j < k; ++j) {
              acc += static_cast<double>(wd[r * k + j]) * x[i * k + j];
              mag += std::fabs(static_cast<double>(wd[r * k + j]) * x[i * k + j]);
            }
            const double v = y[i * s.n + r];
            if (!(std::fabs(v - acc) <= (k + 2) * kU * mag) && ++bad <= 3)
              ADD_FAILURE() << TypeName(t) << " " << path.name << " m=" << s.m << " (" << i << "," << r
                            << "): " << v << " vs " << acc;
          }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

// The AVX2 and AVX-512 float kernels sum each output in k order with one FMA per term from zero,
// so they agree bit for bit whatever the vector width and the split of rows and columns.
TEST(GemmFloat, Avx2EqualsAvx512BitForBit) {
  if (!IsaAtLeast(HostIsa(), Isa::kAvx512)) GTEST_SKIP() << "needs an AVX-512 host";
  const KernelTable& a2 = KernelsFor(Isa::kAvx2);
  const KernelTable& a5 = KernelsFor(Isa::kAvx512);
  for (QuantType t : {QuantType::kF32, QuantType::kF16, QuantType::kBF16}) {
    const int64_t m = 37, n = 45, k = 301;
    const std::vector<uint8_t> wq = RandomWeights(t, n, k);
    const std::vector<float> x = RandomX(m, k);
    const WeightView w{t, WeightLayout::kGguf, n, k, wq.data()};
    std::vector<float> y2(static_cast<size_t>(m * n), std::nanf("")), y5 = y2;
    FloatFn(a2, t)(w, x.data(), k, m, 0, 7, y2.data(), n);
    FloatFn(a2, t)(w, x.data(), k, m, 7, n, y2.data(), n);
    FloatFn(a5, t)(w, x.data(), k, m, 0, n, y5.data(), n);
    EXPECT_EQ(std::memcmp(y2.data(), y5.data(), y2.size() * sizeof(float)), 0) << TypeName(t);
  }
}

// The fast quantisers follow the scalar definition bit for bit (same fp32 operations, round
// half to even), including exact ties, tiny and huge magnitudes and an all-equal block.
TEST(QuantizeQ8A, FastMatchesScalarBitExact) {
  const int64_t k = 32 * 41;
  std::vector<float> x = RandomX(1, k);
  for (int j = 0; j < 32; ++j) x[j] = (j - 15.5f) / 254.0f * 3.0f;  // ties at +-x.5
  for (int j = 32; j < 64; ++j) x[j] = 1e-30f * (j - 40);
  for (int j = 64; j < 96; ++j) x[j] = 3e30f * (j % 5 - 2.5f);
  for (int j = 96; j < 128; ++j) x[j] = 0.7f;
  std::vector<BlockQ8A> ref(k / 32), got(k / 32);
  QuantizeRowQ8A(x.data(), ref.data(), k);
  for (const Path& path : PathsToTest()) {
    std::memset(got.data(), 0xAB, got.size() * sizeof(BlockQ8A));
    path.table->quantize_q8a(x.data(), got.data(), k);
    EXPECT_EQ(std::memcmp(ref.data(), got.data(), ref.size() * sizeof(BlockQ8A)), 0) << path.name;
  }
  // Public wrapper, several rows with a leading dimension.
  std::vector<BlockQ8A> rows(3 * 2);
  std::vector<float> xr = RandomX(3, 80);
  QuantizeActivations(xr.data(), 80, 3, 64, rows.data());
  for (int i = 0; i < 3; ++i) {
    QuantizeRowQ8A(xr.data() + i * 80, ref.data(), 64);
    EXPECT_EQ(std::memcmp(ref.data(), rows.data() + 2 * i, 2 * sizeof(BlockQ8A)), 0);
  }
}

}  // namespace
}  // namespace estream::kernels
