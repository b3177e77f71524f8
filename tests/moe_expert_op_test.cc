// The fused expert operator (src/moe/expert_op.h) and the route CSR builder (route_csr.h):
//   - CSR builder vs a naive grouping, with a placement map that drops experts;
//   - operator vs a scalar fp64 reference on dequantised weights, for random routings with empty
//     slots, a slot with one route, one slot holding every token, and R > C (several passes);
//     for Q4_0 packed, Q8_0 in GGUF layout, Q4_K packed and F32 weights;
//   - bit-identical fp64 sums for thread counts 1..4, repeated runs and different capacities C;
//   - the order of the experts does not matter: the same routes in another slot order, split
//     into two invocations run in either order (as a streamed, permuted layer does), give the
//     same fp32 result after the final rounding (the fp64 sum, expert_op.h), bit for bit except
//     at proven ties;
//   - the fp64 scatter-add epilogue of every ISA the host has against the scalar one, bit for bit;
//   - no allocation per invocation (global operator new counter and the plan's own counter);
//   - invalid invocations refused with the accumulator untouched.
// ESTREAM_TEST_SEED replays a seed (each test prints the one it used).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <vector>

#include "base/cpu.h"
#include "base/fp16.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "moe/expert_op.h"
#include "moe/route_csr.h"
#include "moe/scatter_add.h"
#include "quant/quant.h"

// Counts every operator new of the test binary (the allocation test reads it around Invoke).
static std::atomic<int64_t> g_news{0};
// The replaced operator new takes its memory from malloc, so delete's free() matches it; GCC 12's
// -Wmismatched-new-delete sees only the names.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace estream::moe {
namespace {

uint32_t Seed() {
  static const uint32_t seed = [] {
    const char* s = std::getenv("ESTREAM_TEST_SEED");
    const uint32_t v = s != nullptr ? static_cast<uint32_t>(std::strtoul(s, nullptr, 10)) : std::random_device{}();
    std::printf("moe_expert_op_test seed: %u (ESTREAM_TEST_SEED=%u replays)\n", v, v);
    return v;
  }();
  return seed;
}

bool IsFloatType(QuantType t) { return t == QuantType::kF32 || t == QuantType::kF16 || t == QuantType::kBF16; }

// One random matrix n x k in `type` and `layout`, with its dequantised values (what the
// reference multiplies by).
struct Matrix {
  std::vector<uint8_t> gguf;
  AlignedPtr<uint8_t> packed;
  std::vector<double> deq;  // [n x k]
  kernels::WeightView view;
};

Matrix MakeMatrix(QuantType type, kernels::WeightLayout layout, int64_t n, int64_t k, std::mt19937& rng) {
  Matrix m;
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(k)));
  std::vector<float> f(n * k);
  for (float& v : f) v = nd(rng);
  const size_t row = RowBytes(type, k);
  m.gguf.resize(n * row);
  std::vector<float> back(k);
  m.deq.resize(n * k);
  for (int64_t r = 0; r < n; ++r) {
    uint8_t* dst = m.gguf.data() + r * row;
    if (type == QuantType::kF32) {
      std::memcpy(dst, f.data() + r * k, k * sizeof(float));
    } else if (type == QuantType::kQ4_K) {
      // No Q4_K quantiser: random blocks with scales that give values of about the same size.
      auto* b = reinterpret_cast<BlockQ4_K*>(dst);
      for (int64_t i = 0; i < k / kQK_K; ++i) {
        for (size_t j = 0; j < sizeof(BlockQ4_K); ++j) reinterpret_cast<uint8_t*>(b + i)[j] = rng() & 0xFF;
        b[i].d = Fp32ToFp16(0.15f / std::sqrt(static_cast<float>(k)) / 32.0f);
        b[i].dmin = Fp32ToFp16(0.15f / std::sqrt(static_cast<float>(k)) / 16.0f);
      }
    } else {
      QuantizeRow(type, f.data() + r * k, dst, k);
    }
    DequantizeRow(type, m.gguf.data() + r * row, back.data(), k);
    for (int64_t c = 0; c < k; ++c) m.deq[r * k + c] = back[c];
  }
  m.view = {.type = type, .layout = kernels::WeightLayout::kGguf, .n = n, .k = k, .data = m.gguf.data()};
  if (layout == kernels::WeightLayout::kPacked && kernels::CanRepack(type)) {
    m.packed = AllocAligned<uint8_t>(kernels::PackedWeightBytes(type, n, k));
    kernels::RepackWeights(type, m.gguf.data(), n, k, m.packed.get());
    m.view.layout = kernels::WeightLayout::kPacked;
    m.view.data = m.packed.get();
  }
  return m;
}

struct Expert {
  Matrix gate, up, down;
  SlotBinding binding() const { return {gate.view, up.view, down.view}; }
};

struct Case {
  QuantType type;
  kernels::WeightLayout layout;
  int64_t d, ff;
};

class Fixture {
 public:
  Fixture(const Case& c, int n_experts, int64_t T, std::mt19937& rng) : c_(c), T_(T) {
    for (int e = 0; e < n_experts; ++e) {
      Expert ex;
      ex.gate = MakeMatrix(c.type, c.layout, c.ff, c.d, rng);
      ex.up = MakeMatrix(c.type, c.layout, c.ff, c.d, rng);
      ex.down = MakeMatrix(c.type, c.layout, c.d, c.ff, rng);
      experts_.push_back(std::move(ex));
    }
    std::normal_distribution<float> nd(0.0f, 1.0f);
    xn_.resize(T * c.d);
    for (float& v : xn_) v = nd(rng);
    xq_.resize(T * c.d / kQK8A);
    for (int64_t t = 0; t < T; ++t) QuantizeRowQ8A(xn_.data() + t * c.d, xq_.data() + t * c.d / kQK8A, c.d);
    y0_.resize(T * c.d);
    for (float& v : y0_) v = nd(rng);
  }
  ExpertShape shape() const { return ExpertShape::Of(experts_[0].gate.view, experts_[0].up.view, experts_[0].down.view); }
  std::vector<SlotBinding> Bindings(const std::vector<int>& expert_of_slot) const {
    std::vector<SlotBinding> b;
    for (int e : expert_of_slot) b.push_back(experts_[e].binding());
    return b;
  }
  ExpertInvocation Inv(const std::vector<int64_t>& begin, const std::vector<int32_t>& tok, const std::vector<float>& w,
                       const std::vector<SlotBinding>& b, double* acc) const {
    return {.slot_begin = begin.data(), .n_slots = static_cast<int>(begin.size()) - 1, .route_token = tok.data(),
            .route_weight = w.data(), .bindings = b.data(), .xn = xn_.data(), .xq = xq_.data(), .acc = acc,
            .n_tokens = T_};
  }
  // The layer's fp64 sum set from the residual y0 (BeginExpertSum), poisoned first.
  std::vector<double> FreshAcc() const {
    std::vector<double> acc(y0_.size(), std::numeric_limits<double>::quiet_NaN());
    BeginExpertSum(y0_.data(), T_, c_.d, acc.data());
    return acc;
  }
  // The residual after the layer (EndExpertSum), poisoned first.
  std::vector<float> Rounded(const std::vector<double>& acc) const {
    std::vector<float> y(acc.size(), std::numeric_limits<float>::quiet_NaN());
    EndExpertSum(acc.data(), T_, c_.d, y.data());
    return y;
  }

  // fp64 reference and a per-element error bound. The operator multiplies gate/up against the
  // Q8A rows xq (the caller's input, so the reference uses their dequantised values: no error
  // from that step) and quantises H = silu(G) * U to Q8A before the down projection: each H value
  // moves by at most half a quantum, amax(block)/254. So per route and output j,
  //   |err| <= a * sum_k |Wd[j,k]| * amax_blk(k) / 254 * 1.01   (1% for H's own fp32 error)
  //          + 1e-5 * a * sum_k |Wd[j,k] h_k|                      (fp32 accumulation)
  // and float weights skip the quantisation term. Bounds of the routes of a token add up.
  void Reference(const std::vector<int64_t>& begin, const std::vector<int32_t>& tok, const std::vector<float>& w,
                 const std::vector<int>& expert_of_slot, std::vector<double>* y, std::vector<double>* bound) const {
    const int64_t d = c_.d, ff = c_.ff;
    y->assign(y0_.begin(), y0_.end());
    bound->assign(T_ * d, 0.0);
    std::vector<double> x(d), h(ff);
    std::vector<float> xf(d);
    const bool fl = IsFloatType(c_.type);
    for (size_t s = 0; s + 1 < begin.size(); ++s) {
      const Expert& ex = experts_[expert_of_slot[s]];
      for (int64_t i = begin[s]; i < begin[s + 1]; ++i) {
        const int64_t t = tok[i];
        if (fl) std::copy(xn_.begin() + t * d, xn_.begin() + (t + 1) * d, xf.begin());
        else DequantizeRowQ8A(xq_.data() + t * d / kQK8A, xf.data(), d);
        for (int64_t k = 0; k < d; ++k) x[k] = xf[k];
        for (int64_t n = 0; n < ff; ++n) {
          double g = 0, u = 0;
          for (int64_t k = 0; k < d; ++k) {
            g += ex.gate.deq[n * d + k] * x[k];
            u += ex.up.deq[n * d + k] * x[k];
          }
          h[n] = g / (1.0 + std::exp(-g)) * u;
        }
        for (int64_t j = 0; j < d; ++j) {
          double acc = 0, mag = 0, qerr = 0;
          for (int64_t b = 0; b < ff / kQK8A; ++b) {
            double amax = 0;
            for (int64_t k = b * kQK8A; k < (b + 1) * kQK8A; ++k) amax = std::max(amax, std::abs(h[k]));
            for (int64_t k = b * kQK8A; k < (b + 1) * kQK8A; ++k) {
              const double wv = ex.down.deq[j * ff + k];
              acc += wv * h[k];
              mag += std::abs(wv * h[k]);
              if (!fl) qerr += std::abs(wv) * amax / 254.0 * 1.01;
            }
          }
          (*y)[t * d + j] += w[i] * acc;
          (*bound)[t * d + j] += std::abs(w[i]) * (qerr + 1e-5 * mag) + 1e-6 * std::abs((*y)[t * d + j]);
        }
      }
    }
  }

  int64_t T() const { return T_; }
  int64_t d() const { return c_.d; }

 private:
  Case c_;
  int64_t T_;
  std::vector<Expert> experts_;
  std::vector<float> xn_;
  std::vector<BlockQ8A> xq_;
  std::vector<float> y0_;
};

// Routes from per-token choices through the CSR builder.
struct Routes {
  std::vector<int64_t> begin;
  std::vector<int32_t> tok;
  std::vector<float> w;
};
Routes Build(const std::vector<int32_t>& ids, const std::vector<float>& wts, int64_t T, int k,
             const std::vector<int32_t>& phi, int n_slots) {
  Routes r;
  r.begin.resize(n_slots + 1);
  r.tok.resize(T * k);
  r.w.resize(T * k);
  const int64_t n = BuildRouteCsr({.expert_ids = ids.data(), .expert_weights = wts.data(), .n_tokens = T, .k = k,
                                   .phi = phi.data(), .n_expert = static_cast<int>(phi.size())},
                                  {.slot_begin = r.begin.data(), .n_slots = n_slots, .route_token = r.tok.data(),
                                   .route_weight = r.w.data()});
  r.tok.resize(n);
  r.w.resize(n);
  return r;
}

// Random top-k choices (distinct experts per token) over n_expert experts.
void RandomChoices(int64_t T, int k, int n_expert, std::mt19937& rng, std::vector<int32_t>* ids,
                   std::vector<float>* wts) {
  ids->resize(T * k);
  wts->resize(T * k);
  std::vector<int32_t> perm(n_expert);
  std::uniform_real_distribution<float> ud(0.05f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < n_expert; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < k; ++j) {
      (*ids)[t * k + j] = perm[j];
      (*wts)[t * k + j] = ud(rng);
    }
  }
}

TEST(RouteCsr, MatchesNaiveGrouping) {
  std::mt19937 rng(Seed());
  const int64_t T = 97;
  const int k = 3, E = 11, P = 6;
  std::vector<int32_t> ids;
  std::vector<float> wts;
  RandomChoices(T, k, E, rng, &ids, &wts);
  // Experts 0..5 placed in reverse order, the rest not placed.
  std::vector<int32_t> phi(E, -1);
  for (int e = 0; e < P; ++e) phi[e] = P - 1 - e;
  const Routes r = Build(ids, wts, T, k, phi, P);
  int64_t at = 0;
  for (int s = 0; s < P; ++s) {
    EXPECT_EQ(r.begin[s], at);
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j)
        if (phi[ids[t * k + j]] == s) {
          ASSERT_LT(at, static_cast<int64_t>(r.tok.size()));
          EXPECT_EQ(r.tok[at], t);
          EXPECT_EQ(r.w[at], wts[t * k + j]);
          ++at;
        }
  }
  EXPECT_EQ(r.begin[P], at);
  // Identity placement keeps every route.
  std::vector<int64_t> begin(E + 1);
  std::vector<int32_t> tok(T * k);
  std::vector<float> w(T * k);
  EXPECT_EQ(BuildRouteCsr({.expert_ids = ids.data(), .expert_weights = wts.data(), .n_tokens = T, .k = k,
                           .phi = nullptr, .n_expert = E},
                          {.slot_begin = begin.data(), .n_slots = E, .route_token = tok.data(),
                           .route_weight = w.data()}),
            T * k);
}

// The operator's epilogue (scatter_add.h): every ISA the host has gives the scalar result bit
// for bit (each product is exact in fp64, one rounding per element), for lengths around the
// vector widths, unaligned starts, and values of mixed sign and magnitude.
TEST(ScaledAddF64, EveryIsaMatchesScalarBitForBit) {
  std::mt19937 rng(Seed() + 500);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ue(-20.0f, 20.0f);
  for (Isa isa : IsaLevelsUpTo(HostIsa())) {
    if (isa == Isa::kScalar) continue;
    SCOPED_TRACE(IsaName(isa));
    const ScaledAddF64Fn fn = ScaledAddF64For(isa);
    for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 128, 131}) {
      for (int64_t offset : {0, 1, 3}) {
        std::vector<float> v(n + offset);
        std::vector<double> acc(n + offset);
        for (int64_t j = 0; j < n + offset; ++j) {
          v[j] = nd(rng) * std::exp2(ue(rng));
          acc[j] = static_cast<double>(nd(rng)) * std::exp2(static_cast<double>(ue(rng)));
        }
        std::vector<double> want = acc;
        const float a = nd(rng);
        ScaledAddF64Scalar(want.data() + offset, v.data() + offset, a, n);
        fn(acc.data() + offset, v.data() + offset, a, n);
        EXPECT_EQ(std::memcmp(acc.data(), want.data(), acc.size() * sizeof(double)), 0) << "n " << n << " offset "
                                                                                       << offset;
      }
    }
  }
}

class ExpertOp : public ::testing::TestWithParam<Case> {};

// Compares y with the reference; returns the number of elements checked.
void ExpectNear(const std::vector<float>& y, const std::vector<double>& ref, const std::vector<double>& bound, int64_t d) {
  int64_t bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!(std::abs(y[i] - ref[i]) <= bound[i])) {
      if (++bad <= 5)
        ADD_FAILURE() << "token " << i / d << " column " << i % d << ": " << y[i] << " vs " << ref[i] << " (bound "
                      << bound[i] << ")";
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(ExpertOp, MatchesReferenceOnRandomRoutings) {
  const Case c = GetParam();
  std::mt19937 rng(Seed() + static_cast<uint32_t>(c.type));
  const int64_t T = 45;
  const int E = 7;
  Fixture fx(c, E, T, rng);
  omp_set_num_threads(2);

  struct Routing {
    const char* name;
    std::vector<int32_t> ids;
    std::vector<float> wts;
    int k;
    std::vector<int32_t> phi;  // expert -> slot
    int64_t capacity;
  };
  std::vector<Routing> routings;
  {
    // Random top-3 of 7 experts; expert 6 not placed, slot 5 gets no expert (empty), and expert
    // 4 is chosen by one token only.
    Routing r{"random top-3, empty slot, single-route slot", {}, {}, 3, {0, 1, 2, 3, 4, 6, -1}, 1000};
    RandomChoices(T, 3, E - 1, rng, &r.ids, &r.wts);  // over 6 experts, renamed to skip 4
    for (int32_t& e : r.ids) e = e >= 4 ? e + 1 : e;
    r.ids[7 * 3] = 4;  // token 7's first choice becomes expert 4, its only route
    routings.push_back(r);
  }
  {
    // One slot holds every token (k = 1, all to expert 2), capacity below R: several passes.
    Routing r{"every route in one slot, R > C", std::vector<int32_t>(T, 2), {}, 1, {0, 1, 2, 3, 4, 5, 6}, 16};
    std::uniform_real_distribution<float> ud(0.1f, 1.0f);
    for (int64_t t = 0; t < T; ++t) r.wts.push_back(ud(rng));
    routings.push_back(r);
  }
  {
    // Random top-2 with a capacity that makes passes cut through slots.
    Routing r{"random top-2, C = 13", {}, {}, 2, {3, 0, 6, 1, 5, 2, 4}, 13};
    RandomChoices(T, 2, E, rng, &r.ids, &r.wts);
    routings.push_back(r);
  }

  for (const Routing& rt : routings) {
    SCOPED_TRACE(rt.name);
    const std::vector<int32_t>& ids = rt.ids;
    const int P = 7;
    const Routes r = Build(ids, rt.wts, T, rt.k, rt.phi, P);
    std::vector<int> expert_of_slot(P, 0);
    for (int e = 0; e < E; ++e)
      if (rt.phi[e] >= 0) expert_of_slot[rt.phi[e]] = e;
    const std::vector<SlotBinding> b = fx.Bindings(expert_of_slot);
    auto plan = ExpertPlan::Create(fx.shape(), rt.capacity, T, 4);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    std::vector<double> acc = fx.FreshAcc();
    ASSERT_TRUE(plan->Invoke(fx.Inv(r.begin, r.tok, r.w, b, acc.data())).ok());
    const std::vector<float> y = fx.Rounded(acc);
    const int64_t R = r.begin[P];
    EXPECT_EQ(plan->last_passes(), (R + rt.capacity - 1) / rt.capacity);
    std::vector<double> ref, bound;
    fx.Reference(r.begin, r.tok, r.w, expert_of_slot, &ref, &bound);
    ExpectNear(y, ref, bound, fx.d());
  }
  omp_set_num_threads(omp_get_num_procs());
}

TEST_P(ExpertOp, BitIdenticalAcrossThreadsRunsAndCapacities) {
  const Case c = GetParam();
  std::mt19937 rng(Seed() + 100 + static_cast<uint32_t>(c.type));
  const int64_t T = 150;
  const int E = 5, k = 2;
  Fixture fx(c, E, T, rng);
  std::vector<int32_t> ids;
  std::vector<float> wts;
  RandomChoices(T, k, E, rng, &ids, &wts);
  const Routes r = Build(ids, wts, T, k, {0, 1, 2, 3, 4}, E);
  const std::vector<SlotBinding> b = fx.Bindings({0, 1, 2, 3, 4});
  std::vector<double> first;
  for (int64_t cap : {int64_t{1000}, int64_t{37}}) {
    auto plan = ExpertPlan::Create(fx.shape(), cap, T, 4);
    ASSERT_TRUE(plan.ok());
    for (int threads : {1, 2, 3, 4, 2}) {
      SCOPED_TRACE(testing::Message() << "C " << cap << " threads " << threads);
      omp_set_num_threads(threads);
      std::vector<double> acc = fx.FreshAcc();
      ASSERT_TRUE(plan->Invoke(fx.Inv(r.begin, r.tok, r.w, b, acc.data())).ok());
      if (first.empty()) first = acc;
      else EXPECT_EQ(std::memcmp(first.data(), acc.data(), acc.size() * sizeof(double)), 0);
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

// True if fp32 a != b can only come from rounding two fp64 sums s1, s2 that lie on either side of
// (or on) the midpoint of two adjacent floats: a = float(s1), b = float(s2).
bool IsTie(double s1, double s2, float a, float b) {
  if (std::nextafter(a, b) != b) return false;  // not even adjacent: a real difference
  const double mid = (static_cast<double>(a) + static_cast<double>(b)) / 2;  // exact in fp64
  return (s1 - mid) * (s2 - mid) <= 0;
}

TEST_P(ExpertOp, OrderOfTheExpertsDoesNotMatter) {
  const Case c = GetParam();
  std::mt19937 rng(Seed() + 400 + static_cast<uint32_t>(c.type));
  const int64_t T = 150;
  const int E = 6, k = 4;
  Fixture fx(c, E, T, rng);
  omp_set_num_threads(2);
  std::vector<int32_t> ids;
  std::vector<float> wts;
  RandomChoices(T, k, E, rng, &ids, &wts);
  auto plan = ExpertPlan::Create(fx.shape(), 0, T, 2);
  ASSERT_TRUE(plan.ok());

  // Order A: slots = experts in ascending order, one invocation (the resident engine).
  const Routes ra = Build(ids, wts, T, k, {0, 1, 2, 3, 4, 5}, E);
  const std::vector<SlotBinding> ba = fx.Bindings({0, 1, 2, 3, 4, 5});
  std::vector<double> acc_a = fx.FreshAcc();
  ASSERT_TRUE(plan->Invoke(fx.Inv(ra.begin, ra.tok, ra.w, ba, acc_a.data())).ok());

  // Order B: a random placement of the experts in slots, cut into two "groups" (slots [0, 3)
  // and [3, 6)), the second group invoked first: every token's experts arrive in another order.
  std::vector<int32_t> phi = {0, 1, 2, 3, 4, 5};
  do std::shuffle(phi.begin(), phi.end(), rng);
  while (phi == std::vector<int32_t>{0, 1, 2, 3, 4, 5});
  std::vector<int> expert_of_slot(E);
  for (int e = 0; e < E; ++e) expert_of_slot[phi[e]] = e;
  const Routes rb = Build(ids, wts, T, k, phi, E);
  const std::vector<SlotBinding> bb = fx.Bindings(expert_of_slot);
  std::vector<double> acc_b = fx.FreshAcc();
  for (int g : {1, 0}) {
    const int s0 = 3 * g;
    std::vector<int64_t> begin(rb.begin.begin() + s0, rb.begin.begin() + s0 + 4);
    for (int64_t& v : begin) v -= rb.begin[s0];  // the group's own CSR (as RunExperts builds it)
    const std::vector<int32_t> tok(rb.tok.begin() + rb.begin[s0], rb.tok.begin() + rb.begin[s0 + 3]);
    const std::vector<float> w(rb.w.begin() + rb.begin[s0], rb.w.begin() + rb.begin[s0 + 3]);
    const std::vector<SlotBinding> b(bb.begin() + s0, bb.begin() + s0 + 3);
    ASSERT_TRUE(plan->Invoke(fx.Inv(begin, tok, w, b, acc_b.data())).ok());
  }

  // The fp64 sums differ by a few fp64 roundings of k + 1 terms at most (each product a_i v_i is
  // exact): |s_a - s_b| <= (k + 1) 2^-53 sum|terms| < 1e-14 |s| for sums that do not cancel
  // below 1/100 of their terms (the bound checked is relative to the largest |s| of the row).
  const int64_t d = fx.d();
  int64_t ties = 0, differ = 0;
  const std::vector<float> ya = fx.Rounded(acc_a), yb = fx.Rounded(acc_b);
  for (int64_t t = 0; t < T; ++t) {
    double row_max = 0;
    for (int64_t j = 0; j < d; ++j) row_max = std::max(row_max, std::abs(acc_a[t * d + j]));
    for (int64_t j = 0; j < d; ++j) {
      const int64_t i = t * d + j;
      ASSERT_LE(std::abs(acc_a[i] - acc_b[i]), 1e-14 * row_max) << "token " << t << " column " << j;
      differ += acc_a[i] != acc_b[i];
      if (std::memcmp(&ya[i], &yb[i], sizeof(float)) == 0) continue;
      EXPECT_TRUE(IsTie(acc_a[i], acc_b[i], ya[i], yb[i]))
          << "token " << t << " column " << j << ": " << ya[i] << " vs " << yb[i] << " from sums " << acc_a[i]
          << " and " << acc_b[i];
      ++ties;
    }
  }
  // Ties are expected at ~1e-9 per element (expert_op.h): almost always none in T x d = 33600.
  std::printf("order test %s: %lld of %lld fp64 sums differ in the last bits; %lld fp32 results differ (ties)\n",
              TypeName(c.type), static_cast<long long>(differ), static_cast<long long>(T * d),
              static_cast<long long>(ties));
  EXPECT_LE(ties, 2);
  omp_set_num_threads(omp_get_num_procs());
}

TEST_P(ExpertOp, NoAllocationPerInvocation) {
  const Case c = GetParam();
  std::mt19937 rng(Seed() + 200);
  const int64_t T = 64;
  const int E = 4, k = 2;
  Fixture fx(c, E, T, rng);
  std::vector<int32_t> ids;
  std::vector<float> wts;
  RandomChoices(T, k, E, rng, &ids, &wts);
  const Routes r = Build(ids, wts, T, k, {0, 1, 2, 3}, E);
  const std::vector<SlotBinding> b = fx.Bindings({0, 1, 2, 3});
  omp_set_num_threads(2);
  auto plan = ExpertPlan::Create(fx.shape(), 50, T, 2);
  ASSERT_TRUE(plan.ok());
  const int64_t plan_allocs = plan->allocations();
  std::vector<double> y = fx.FreshAcc();
  // Warm-up: the OpenMP team and the GEMM kernels' per-thread scratch (thread_local, grown once
  // per thread to the largest call it has seen: not the operator's) are set up on first use.
  // With dynamic scheduling a thread may not meet every GEMM shape in a few invocations, so each
  // thread first runs every matrix of the class at the largest row count explicitly.
  if (!IsFloatType(c.type)) {
    const kernels::KernelTable& kt = kernels::Kernels();
    std::vector<BlockQ8A> xq(128 * std::max(c.d, c.ff) / kQK8A);
    for (BlockQ8A& blk : xq) blk = BlockQ8A{};
    std::vector<float> out(128 * 16);
#pragma omp parallel num_threads(2)
    {
      std::vector<float> my(out.size());
      for (const kernels::WeightView* w : {&b[0].gate, &b[0].up, &b[0].down}) {
        const bool packed = w->layout == kernels::WeightLayout::kPacked;
        kernels::KernelTable::GemmFn fn = kt.Quant(c.type, packed);
        fn(*w, xq.data(), 128, 0, 16, my.data(), 16);
      }
    }
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(plan->Invoke(fx.Inv(r.begin, r.tok, r.w, b, y.data())).ok());
  const int64_t before = g_news.load();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(plan->Invoke(fx.Inv(r.begin, r.tok, r.w, b, y.data())).ok());
  EXPECT_EQ(g_news.load() - before, 0);
  EXPECT_EQ(plan->allocations(), plan_allocs);
  EXPECT_GT(plan->last_passes(), 1);
  omp_set_num_threads(omp_get_num_procs());
}

TEST_P(ExpertOp, RefusesMismatchedBindings) {
  const Case c = GetParam();
  std::mt19937 rng(Seed() + 300);
  const int64_t T = 8;
  Fixture fx(c, 2, T, rng);
  std::vector<int32_t> ids(T, 1);
  std::vector<float> wts(T, 0.5f);
  const Routes r = Build(ids, wts, T, 1, {0, 1}, 2);
  std::vector<SlotBinding> b = fx.Bindings({0, 1});
  b[1].down.n += 32;  // wrong shape
  auto plan = ExpertPlan::Create(fx.shape(), 0, T, 1);
  ASSERT_TRUE(plan.ok());
  std::vector<double> y = fx.FreshAcc();
  EXPECT_FALSE(plan->Invoke(fx.Inv(r.begin, r.tok, r.w, b, y.data())).ok());
  EXPECT_EQ(std::memcmp(y.data(), fx.FreshAcc().data(), y.size() * sizeof(double)), 0);
  // An empty slot's binding is not read: slot 0 has no route.
  b[0] = SlotBinding{};
  b[1] = fx.Bindings({1})[0];
  EXPECT_TRUE(plan->Invoke(fx.Inv(r.begin, r.tok, r.w, b, y.data())).ok());
  EXPECT_FALSE(ExpertPlan::Create(ExpertShape{.n_embd = 100, .n_ff_expert = 64}, 0, 8, 1).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ExpertOp,
    ::testing::Values(Case{QuantType::kQ4_0, kernels::WeightLayout::kPacked, 224, 160},
                      Case{QuantType::kQ8_0, kernels::WeightLayout::kGguf, 96, 288},
                      Case{QuantType::kQ4_K, kernels::WeightLayout::kPacked, 256, 512},
                      Case{QuantType::kF32, kernels::WeightLayout::kGguf, 160, 96},
                      Case{QuantType::kQ5_K, kernels::WeightLayout::kPacked, 256, 512},
                      Case{QuantType::kIQ4_XS, kernels::WeightLayout::kPacked, 512, 256},
                      Case{QuantType::kQ2_K, kernels::WeightLayout::kGguf, 256, 256},
                      Case{QuantType::kMXFP4, kernels::WeightLayout::kPacked, 224, 160},
                      Case{QuantType::kQ5_0, kernels::WeightLayout::kPacked, 96, 288}),
    [](const auto& info) {
      return std::string(TypeName(info.param.type)) +
             (info.param.layout == kernels::WeightLayout::kPacked ? "_packed" : "_gguf");
    });

}  // namespace
}  // namespace estream::moe
