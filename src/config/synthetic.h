// A synthetic, deterministic Profile with realistic shapes, for tests, the configurator
// benchmark, and trying the configurator without a calibration run.
//
// Routing: each of n_tokens tokens picks n_expert_used distinct experts per layer from a Zipf
// distribution over the experts (exponent `zipf`, per-layer random ranking), so route counts are
// skewed like a real router's; with small n_tokens some experts (hence groups) stay inactive.
// Times: a group of n experts with rho routed rows executes in
//   n * exec_per_expert_s + rho * exec_per_row_s       (times a noise factor in [1 - noise, 1 + noise])
// and that is what the calibration samples hold (one per active group and layer). Disk: bandwidth
// bw(q) = peak * q / (q + q_half) (non-decreasing in q), the same for every group size, plus a
// fixed per-read latency. M_other(g) = other_bytes + g * other_bytes_per_g.
// Values are generated with an explicit splitmix64 generator: the same params give the same
// profile on every platform.
#pragma once

#include <cstdint>
#include <vector>

#include "config/profile.h"

namespace estream::config {

struct SyntheticProfileParams {
  int n_layer = 48;
  int n_expert = 128;
  int n_expert_used = 8;
  int n_tokens = 1024;
  double zipf = 0.8;
  uint64_t expert_bytes = 2654208;  // one Q4_0 Qwen3-30B-A3B expert record
  double nonexpert_s = 2e-3;        // per layer
  double other_s = 20e-3;
  double exec_per_expert_s = 150e-6;
  double exec_per_row_s = 9e-6;
  double noise = 0.05;
  double peak_bandwidth = 1.6e9;    // bytes/s
  double q_half = 0.5;
  double latency_s = 100e-6;
  std::vector<int> queue_depths{1, 2, 4, 8, 16, 32};
  std::vector<int> group_sizes{1, 2, 4, 8, 16};  // disk table and calibration runs
  uint64_t other_bytes = uint64_t{1} << 30;
  uint64_t other_bytes_per_g = uint64_t{1} << 20;
  uint64_t seed = 1;
};

// REQUIRES: sizes >= 1, n_expert_used <= n_expert, group sizes <= n_expert. The result passes
// Profile::Validate.
Profile MakeSyntheticProfile(const SyntheticProfileParams& params);

}  // namespace estream::config
