#include "config/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace estream::config {

namespace {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  uint64_t state_;
};

}  // namespace

Profile MakeSyntheticProfile(const SyntheticProfileParams& sp) {
  ESTREAM_CHECK(sp.n_layer >= 1 && sp.n_expert >= 1 && sp.n_expert_used >= 1 && sp.n_expert_used <= sp.n_expert &&
                    sp.n_tokens >= 0 && !sp.group_sizes.empty() && !sp.queue_depths.empty(),
                "MakeSyntheticProfile: bad parameters");
  SplitMix64 rng(sp.seed);
  Profile p;
  p.n_layer = sp.n_layer;
  p.n_expert = sp.n_expert;
  p.expert_bytes = sp.expert_bytes;
  p.record_bytes.assign(static_cast<size_t>(sp.n_layer), sp.expert_bytes);
  p.calib_tokens = static_cast<uint32_t>(sp.n_tokens);
  p.other_seconds = static_cast<float>(sp.other_s);
  p.nonexpert_seconds.assign(static_cast<size_t>(sp.n_layer), static_cast<float>(sp.nonexpert_s));

  // Routes: Zipf weights over a per-layer random ranking of the experts.
  const size_t E = static_cast<size_t>(sp.n_expert);
  p.expert_routes.assign(static_cast<size_t>(sp.n_layer) * E, 0);
  std::vector<double> cdf(E);
  std::vector<size_t> rank(E);
  std::vector<uint8_t> taken(E);
  for (int w = 0; w < sp.n_layer; ++w) {
    std::iota(rank.begin(), rank.end(), size_t{0});
    for (size_t i = E - 1; i > 0; --i) std::swap(rank[i], rank[rng.Next() % (i + 1)]);
    double sum = 0;
    for (size_t i = 0; i < E; ++i) {
      sum += 1.0 / std::pow(static_cast<double>(rank[i] + 1), sp.zipf);
      cdf[i] = sum;
    }
    uint32_t* routes = p.expert_routes.data() + static_cast<size_t>(w) * E;
    for (int t = 0; t < sp.n_tokens; ++t) {
      std::fill(taken.begin(), taken.end(), 0);
      for (int k = 0; k < sp.n_expert_used;) {
        const double u = rng.Uniform() * sum;
        size_t e = static_cast<size_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
        e = std::min(e, E - 1);
        if (taken[e]) continue;  // top-k experts are distinct
        taken[e] = 1;
        ++routes[e];
        ++k;
      }
    }
  }

  p.disk.chunk_bytes = uint64_t{1} << 20;
  p.disk.queue_depths = sp.queue_depths;
  p.disk.group_sizes = sp.group_sizes;
  for (size_t i = 0; i < sp.group_sizes.size(); ++i) {
    for (int q : sp.queue_depths) p.disk.bandwidth.push_back(static_cast<float>(sp.peak_bandwidth * q / (q + sp.q_half)));
    p.disk.latency_s.push_back(static_cast<float>(sp.latency_s));
  }

  for (int g : sp.group_sizes) {
    CalibrationRun run;
    run.group_size = g;
    run.other_bytes = sp.other_bytes + static_cast<uint64_t>(g) * sp.other_bytes_per_g;
    run.load_queue_depth = sp.queue_depths.back();
    const int n_groups = (sp.n_expert + g - 1) / g;
    for (int w = 0; w < sp.n_layer; ++w) {
      const uint32_t* routes = p.expert_routes.data() + static_cast<size_t>(w) * E;
      for (int k = 0; k < n_groups; ++k) {
        const int e0 = k * g, e1 = std::min(e0 + g, sp.n_expert);
        uint64_t rho = 0;
        int n_active = 0;
        for (int e = e0; e < e1; ++e) {
          rho += routes[e];
          n_active += routes[e] > 0;
        }
        if (rho == 0) continue;
        auto jitter = [&] { return 1 + sp.noise * (2 * rng.Uniform() - 1); };
        const double x = (n_active * sp.exec_per_expert_s + static_cast<double>(rho) * sp.exec_per_row_s) * jitter();
        run.exec_rows.push_back(static_cast<float>(rho));
        run.exec_seconds.push_back(static_cast<float>(x));
        // Device time of this read at the run's depth, as the profiler would record it.
        const double bw = sp.peak_bandwidth * run.load_queue_depth / (run.load_queue_depth + sp.q_half);
        const double bytes = static_cast<double>(e1 - e0) * static_cast<double>(sp.expert_bytes);
        run.load_seconds.push_back(static_cast<float>(bytes / bw * jitter()));
      }
    }
    if (run.exec_rows.empty()) {  // no token at all: one idle sample keeps the profile valid
      run.exec_rows.push_back(0);
      run.exec_seconds.push_back(0);
    }
    p.runs.push_back(std::move(run));
  }
  ESTREAM_CHECK(p.Validate().ok(), "MakeSyntheticProfile produced an invalid profile");
  return p;
}

}  // namespace estream::config
