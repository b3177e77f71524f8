// Helpers shared by the kernel tests: the fp32 unit roundoff, NaN poison, the ISA levels to test,
// the per-run seed (ESTREAM_TEST_SEED=<n> replays a run), a seeded random source, and one causal
// attention problem with padded rows (the padding of out is NaN and must stay NaN).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/cpu.h"
#include "kernels/kernels.h"

namespace estream::kernels_test {

constexpr double kU = 0x1p-24;  // fp32 unit roundoff
inline const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Every level of the host's chain (scalar, avx2, avx512 / scalar, neon, dotprod, i8mm).
inline std::vector<Isa> IsasToTest() { return IsaLevelsUpTo(HostIsa()); }

// Fresh per run, or ESTREAM_TEST_SEED.
inline uint32_t TestSeed() {
  if (const char* s = std::getenv("ESTREAM_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  static const uint32_t seed = std::random_device{}();
  return seed;
}
#define SEED_TRACE() SCOPED_TRACE("ESTREAM_TEST_SEED=" + std::to_string(::estream::kernels_test::TestSeed()))

// Random numbers of the run's seed, salted per use.
class Rng {
 public:
  explicit Rng(uint32_t salt) : gen_(TestSeed() ^ (salt * 0x9E3779B9u)) {}
  float Uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen_); }
  void Fill(std::vector<float>& v, float lo, float hi) {
    for (float& x : v) x = Uniform(lo, hi);
  }

 private:
  std::mt19937 gen_;
};

struct AttnShape {
  int n_tokens, n_head, n_head_kv, head_dim;
};

inline std::string Name(const AttnShape& s) {
  return "T=" + std::to_string(s.n_tokens) + " heads=" + std::to_string(s.n_head) + "/" +
         std::to_string(s.n_head_kv) + " d=" + std::to_string(s.head_dim);
}

// Q, K, V, out of one attention problem. Rows are padded (ld > width) so that strides are
// exercised and writes outside a head are caught: the padding is NaN and must stay NaN. q and k
// are uniform in [-amplitude, amplitude], v in [-1, 1]; amplitude 2 gives score standard
// deviations around 1.3: softmax rows are neither flat nor one-hot, so a wrong key or a wrong
// mask shows far above any tolerance.
struct AttnProblem {
  AttnShape s;
  int64_t ldq, ldk, ldv, ldo;
  std::vector<float> q, k, v;
  float scale;

  AttnProblem(const AttnShape& shape, uint32_t salt, float amplitude = 2.0f) : s(shape) {
    Rng rng(salt);
    ldq = static_cast<int64_t>(s.n_head) * s.head_dim + 3;
    ldk = static_cast<int64_t>(s.n_head_kv) * s.head_dim + 5;
    ldv = static_cast<int64_t>(s.n_head_kv) * s.head_dim + 1;
    ldo = static_cast<int64_t>(s.n_head) * s.head_dim + 7;
    q.resize(s.n_tokens * ldq);
    k.resize(s.n_tokens * ldk);
    v.resize(s.n_tokens * ldv);
    rng.Fill(q, -amplitude, amplitude);
    rng.Fill(k, -amplitude, amplitude);
    rng.Fill(v, -1.0f, 1.0f);
    scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  }
  kernels::AttentionArgs Args(float* out, bool allow_bf16 = false) const {
    return kernels::AttentionArgs{.n_tokens = s.n_tokens, .n_head = s.n_head, .n_head_kv = s.n_head_kv,
                         .head_dim = s.head_dim, .scale = scale, .q = q.data(), .ldq = ldq, .k = k.data(),
                         .ldk = ldk, .v = v.data(), .ldv = ldv, .out = out, .ldo = ldo, .allow_bf16 = allow_bf16};
  }
  std::vector<float> Poisoned() const { return std::vector<float>(s.n_tokens * ldo, kNaN); }
  const float* Q(int t, int h) const { return q.data() + t * ldq + h * s.head_dim; }
  const float* K(int t, int h) const { return k.data() + t * ldk + h * s.head_dim; }
  const float* V(int t, int h) const { return v.data() + t * ldv + h * s.head_dim; }
  int KvHead(int h) const { return h / (s.n_head / s.n_head_kv); }
};

// True if the padding of output row t (past n_head * head_dim) is still NaN; else adds a failure
// naming `what`.
inline bool PaddingIntact(const AttnProblem& p, const std::vector<float>& out, int64_t t, const std::string& what) {
  for (int64_t i = static_cast<int64_t>(p.s.n_head) * p.s.head_dim; i < p.ldo; ++i)
    if (!std::isnan(out[t * p.ldo + i])) {
      ADD_FAILURE() << what << " " << Name(p.s) << ": wrote row padding at t=" << t;
      return false;
    }
  return true;
}

}  // namespace estream::kernels_test
