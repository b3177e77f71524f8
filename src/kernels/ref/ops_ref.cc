// Scalar reference kernels for everything but GEMM: attention, RMSNorm, RoPE, SwiGLU, router
// softmax + top-k, residual add. Plain C++, written for clarity and accuracy (fp64 reductions),
// not speed: the vectorised paths are tested against these, and these against fp64 naive code.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/ops_internal.h"

namespace estream::kernels {
namespace {

// One query head over query rows [t_begin, t_end): for each row, materialise that row's scores
// against keys 0..t (causal), softmax and weight the values, all in fp64.
void AttentionHeadRef(const AttentionArgs& a, int head, int t_begin, int t_end) {
  const int d = a.head_dim;
  const int kv_head = head / (a.n_head / a.n_head_kv);
  thread_local std::vector<double> scores;
  thread_local std::vector<double> acc;
  scores.resize(static_cast<size_t>(t_end));
  acc.resize(static_cast<size_t>(d));
  for (int t = t_begin; t < t_end; ++t) {
    const float* q = a.q + t * a.ldq + static_cast<int64_t>(head) * d;
    double max_score = -std::numeric_limits<double>::infinity();
    for (int j = 0; j <= t; ++j) {
      const float* k = a.k + j * a.ldk + static_cast<int64_t>(kv_head) * d;
      double dot = 0.0;
      for (int i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * k[i];
      scores[j] = dot * a.scale;
      max_score = std::max(max_score, scores[j]);
    }
    double sum = 0.0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int j = 0; j <= t; ++j) {
      const double p = std::exp(scores[j] - max_score);
      sum += p;
      const float* v = a.v + j * a.ldv + static_cast<int64_t>(kv_head) * d;
      for (int i = 0; i < d; ++i) acc[i] += p * v[i];
    }
    float* out = a.out + t * a.ldo + static_cast<int64_t>(head) * d;
    for (int i = 0; i < d; ++i) out[i] = static_cast<float>(acc[i] / sum);
  }
}

void AttentionBlockRef(const AttentionArgs& a, int head_begin, int head_end, int t_begin, int t_end) {
  for (int h = head_begin; h < head_end; ++h) AttentionHeadRef(a, h, t_begin, t_end);
}

void RmsNormRowRef(const float* x, const float* w, float* y, int64_t n, float eps) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const double inv_rms = 1.0 / std::sqrt(sum_sq / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] * inv_rms * w[i]);
}

void RopeRowRef(float* x, int n_heads, int head_dim, int pos, const double* inv_freq, RopeMode mode) {
  const int half = head_dim / 2;
  // Pair p rotates elements (i0, i1) by theta_p = pos * inv_freq[p]; fp64 sin/cos of the exact
  // angle, so the reference stays accurate at large positions.
  for (int p = 0; p < half; ++p) {
    const double theta = pos * inv_freq[p];
    const double c = std::cos(theta);
    const double s = std::sin(theta);
    const int i0 = mode == RopeMode::kNeox ? p : 2 * p;
    const int i1 = mode == RopeMode::kNeox ? p + half : 2 * p + 1;
    for (int h = 0; h < n_heads; ++h) {
      float* xh = x + static_cast<int64_t>(h) * head_dim;
      const double x0 = xh[i0];
      const double x1 = xh[i1];
      xh[i0] = static_cast<float>(x0 * c - x1 * s);
      xh[i1] = static_cast<float>(x0 * s + x1 * c);
    }
  }
}

void SwiGluRef(const float* g, const float* u, float* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g[i];
    h[i] = static_cast<float>(gi / (1.0 + std::exp(-gi)) * u[i]);
  }
}

void SoftmaxTopKRef(const float* logits, int n_expert, int k, bool renormalize, int32_t* idx, float* w) {
  double max_logit = -std::numeric_limits<double>::infinity();
  for (int e = 0; e < n_expert; ++e) max_logit = std::max<double>(max_logit, logits[e]);
  double sum = 0.0;
  for (int e = 0; e < n_expert; ++e) sum += std::exp(logits[e] - max_logit);
  SelectTopK(logits, n_expert, k, idx);
  double picked_sum = 0.0;
  for (int r = 0; r < k; ++r) picked_sum += std::exp(logits[idx[r]] - max_logit);
  const double denom = renormalize ? picked_sum : sum;
  for (int r = 0; r < k; ++r) w[r] = static_cast<float>(std::exp(logits[idx[r]] - max_logit) / denom);
}

void AddRef(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace

void SelectTopK(const float* logits, int n_expert, int k, int32_t* idx) {
  // Insertion into a sorted list of k: O(n_expert * k), fine for routers (k <= ~16). The strict
  // '>' keeps the earlier (lower) index ahead on ties.
  int filled = 0;
  for (int e = 0; e < n_expert; ++e) {
    const float v = logits[e];
    if (filled == k && !(v > logits[idx[k - 1]])) continue;
    int pos = filled < k ? filled++ : k - 1;
    while (pos > 0 && v > logits[idx[pos - 1]]) {
      idx[pos] = idx[pos - 1];
      --pos;
    }
    idx[pos] = e;
  }
}

double LogSumExpRef(const float* row, int64_t n) {
  float mx = row[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, row[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(row[i]) - mx);
  return mx + std::log(s);
}

void FillScalarOps(KernelTable* t) {
  t->attention_block = AttentionBlockRef;
  t->rms_norm_row = RmsNormRowRef;
  t->rope_row = RopeRowRef;
  t->swiglu = SwiGluRef;
  t->softmax_topk = SoftmaxTopKRef;
  t->log_sum_exp = LogSumExpRef;
  t->add = AddRef;
}

}  // namespace estream::kernels
