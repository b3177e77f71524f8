// Tests of LFM2's short convolution (kernels.h, ShortConv): the scalar reference against an
// independent naive fp64 definition, every vectorised path (KernelsFor(kAvx2 / kAvx512), where the
// host has it) against the reference on fresh random inputs of awkward sizes (channel counts that
// are not multiples of the vector width, prompts shorter than the kernel), outputs poisoned with
// NaN first; the public entry point with strides (padding must stay NaN) and with threads.
//
// Tolerance: a vector path rounds B * x once and accumulates L products with FMA, then multiplies
// by C: |error| <= (L + 2) u * |C| * sum_j |w_j B_s x_s| (u = 2^-24), against a reference that is
// exact to one rounding of the final value.
//
// The seed is fresh per run and printed on failure; ESTREAM_TEST_SEED=<n> replays a run.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels_test_util.h"

namespace estream::kernels {
namespace {

using kernels_test::IsasToTest;
using kernels_test::kNaN;
using kernels_test::kU;
using kernels_test::TestSeed;

struct Problem {
  int64_t T, d, ldb, ldy;
  int L;
  std::vector<float> bcx, w;  // [T x ldb], [L x d] tap-major
};

Problem MakeProblem(std::mt19937& gen, int64_t T, int64_t d, int L, int64_t pad_b = 0, int64_t pad_y = 0) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  Problem p{T, d, 3 * d + pad_b, d + pad_y, L, {}, {}};
  p.bcx.assign(T * p.ldb, kNaN);  // padding stays NaN: a read of it would poison the output
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < 3 * d; ++i) p.bcx[t * p.ldb + i] = u(gen);
  p.w.resize(L * d);
  for (float& x : p.w) x = u(gen);
  return p;
}

// The definition, in fp64, plus the magnitude sum |C| * sum_j |w B x| for the tolerance.
void Naive(const Problem& p, std::vector<double>* y, std::vector<double>* mag) {
  y->assign(p.T * p.d, 0.0);
  mag->assign(p.T * p.d, 0.0);
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t c = 0; c < p.d; ++c) {
      double acc = 0, m = 0;
      for (int j = 0; j < p.L; ++j) {
        const int64_t s = t - (p.L - 1) + j;
        if (s < 0) continue;
        const double term = double(p.w[j * p.d + c]) * double(p.bcx[s * p.ldb + c]) * double(p.bcx[s * p.ldb + 2 * p.d + c]);
        acc += term;
        m += std::fabs(term);
      }
      const double cc = p.bcx[t * p.ldb + p.d + c];
      (*y)[t * p.d + c] = cc * acc;
      (*mag)[t * p.d + c] = std::fabs(cc) * m;
    }
}

TEST(ShortConv, RefMatchesFp64Definition) {
  SEED_TRACE();
  std::mt19937 gen(TestSeed() ^ 0x5C0);
  for (auto [T, d, L] : {std::tuple<int64_t, int64_t, int>{1, 1, 1}, {2, 7, 3}, {37, 45, 3}, {5, 33, 4}, {64, 256, 3}}) {
    const Problem p = MakeProblem(gen, T, d, L);
    std::vector<float> y(T * d, kNaN);
    KernelsFor(Isa::kScalar).short_conv_rows(p.bcx.data(), p.ldb, p.w.data(), L, d, 0, T, y.data(), d);
    std::vector<double> want, mag;
    Naive(p, &want, &mag);
    for (int64_t i = 0; i < T * d; ++i)
      ASSERT_NEAR(y[i], want[i], 2 * kU * mag[i] + 1e-30) << "T=" << T << " d=" << d << " L=" << L << " i=" << i;
  }
}

TEST(ShortConv, EveryIsaMatchesReference) {
  SEED_TRACE();
  std::mt19937 gen(TestSeed() ^ 0x5C1);
  std::uniform_int_distribution<int64_t> dt(1, 70), dd(1, 300);
  std::uniform_int_distribution<int> dl(1, 5);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t T = dt(gen), d = dd(gen);
    const int L = dl(gen);
    const Problem p = MakeProblem(gen, T, d, L);
    std::vector<double> want, mag;
    Naive(p, &want, &mag);
    std::vector<float> ref(T * d, kNaN);
    KernelsFor(Isa::kScalar).short_conv_rows(p.bcx.data(), p.ldb, p.w.data(), L, d, 0, T, ref.data(), d);
    for (Isa isa : IsasToTest()) {
      SCOPED_TRACE(std::string(IsaName(isa)) + " T=" + std::to_string(T) + " d=" + std::to_string(d) +
                   " L=" + std::to_string(L));
      std::vector<float> y(T * d, kNaN);
      // Two calls over a split token range: a range that starts mid-prompt reads the rows before it.
      const int64_t mid = T / 3;
      KernelsFor(isa).short_conv_rows(p.bcx.data(), p.ldb, p.w.data(), L, d, 0, mid, y.data(), d);
      KernelsFor(isa).short_conv_rows(p.bcx.data(), p.ldb, p.w.data(), L, d, mid, T, y.data(), d);
      int bad = 0;
      for (int64_t i = 0; i < T * d && bad < 5; ++i) {
        const double tol = (L + 3) * kU * mag[i] + 1e-30;
        if (!(std::fabs(double(y[i]) - double(ref[i])) <= tol)) {
          ADD_FAILURE() << "i=" << i << " got " << y[i] << " ref " << ref[i] << " tol " << tol;
          ++bad;
        }
      }
    }
  }
}

// The public entry point: strided rows (NaN padding never read, never written), several thread
// counts, the same values as one scalar-reference call.
TEST(ShortConv, PublicStridesAndThreads) {
  SEED_TRACE();
  std::mt19937 gen(TestSeed() ^ 0x5C2);
  for (auto [T, d, L] : {std::tuple<int64_t, int64_t, int>{1, 48, 3}, {2, 48, 3}, {100, 77, 3}, {257, 130, 4}}) {
    const Problem p = MakeProblem(gen, T, d, L, /*pad_b=*/5, /*pad_y=*/3);
    std::vector<double> want, mag;
    Naive(p, &want, &mag);
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE("threads=" + std::to_string(threads) + " T=" + std::to_string(T));
      std::vector<float> y(T * p.ldy, kNaN);
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      ShortConv(p.bcx.data(), p.ldb, p.w.data(), L, d, T, y.data(), p.ldy);
      omp_set_num_threads(saved);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t c = 0; c < d; ++c)
          ASSERT_NEAR(y[t * p.ldy + c], want[t * d + c], (L + 3) * kU * mag[t * d + c] + 1e-30) << t << "," << c;
        for (int64_t c = d; c < p.ldy; ++c) ASSERT_TRUE(std::isnan(y[t * p.ldy + c])) << "padding written";
      }
    }
  }
}

}  // namespace
}  // namespace estream::kernels
