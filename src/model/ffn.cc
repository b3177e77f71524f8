#include "model/ffn.h"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"

namespace estream::model {

void RouteToken(const ModelConfig& c, const float* logits, const float* bias, int32_t* idx, float* w) {
  const int E = c.n_expert, K = c.n_expert_used;
  if (c.gating == ExpertGating::kSoftmax && bias == nullptr && c.expert_weights_scale == 1.0f) {
    kernels::SoftmaxTopK(logits, E, K, c.expert_weights_norm, idx, w);
    return;
  }
  // Scores (fp64), then the selection key. E is small (<= a few hundred): stack buffers.
  constexpr int kMaxExperts = 1024;
  double s[kMaxExperts], key[kMaxExperts];
  if (c.gating == ExpertGating::kSoftmax) {
    double mx = logits[0];
    for (int e = 1; e < E; ++e) mx = std::max<double>(mx, logits[e]);
    double z = 0;
    for (int e = 0; e < E; ++e) z += (s[e] = std::exp(static_cast<double>(logits[e]) - mx));
    for (int e = 0; e < E; ++e) s[e] /= z;
  } else {
    for (int e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e])));
  }
  for (int e = 0; e < E; ++e) key[e] = bias ? s[e] + bias[e] : s[e];
  // Top-k by insertion (strict '>' keeps the lower index ahead on ties).
  int filled = 0;
  for (int e = 0; e < E; ++e) {
    const double v = key[e];
    if (filled == K && !(v > key[idx[K - 1]])) continue;
    int pos = filled < K ? filled++ : K - 1;
    while (pos > 0 && v > key[idx[pos - 1]]) {
      idx[pos] = idx[pos - 1];
      --pos;
    }
    idx[pos] = e;
  }
  double sum = 0;
  for (int j = 0; j < K; ++j) sum += s[idx[j]];
  const double div = c.expert_weights_norm ? sum : 1.0;
  for (int j = 0; j < K; ++j) w[j] = static_cast<float>(s[idx[j]] / div * c.expert_weights_scale);
}

void FfnAdd(const DenseFfn& f, const ModelConfig& c, int64_t n_tokens, const BlockQ8A* xq, Workspace* ws) {
  const int64_t d = c.n_embd, n = f.gate.n, C = ws->chunk_capacity();
  if ((IsQuantized(f.gate.type) || IsQuantized(f.up.type)) && xq == nullptr) {
    kernels::QuantizeActivations(ws->xn.get(), d, n_tokens, d, ws->xq.get());
    xq = ws->xq.get();
  }
  const bool q_down = IsQuantized(f.down.type);
  float* x = ws->x.get();
  for (int64_t r0 = 0; r0 < n_tokens; r0 += C) {
    const int64_t m = std::min(C, n_tokens - r0);
    const float* xn = ws->xn.get() + r0 * d;
    const BlockQ8A* xqr = xq ? xq + r0 * (d / kQK8A) : nullptr;
    float* g = ws->gate.get();
    float* u = ws->up.get();
    const kernels::GemmOut gate_up[] = {{.w = &f.gate, .y = g, .ldy = n}, {.w = &f.up, .y = u, .ldy = n}};
    kernels::Gemm(gate_up, xn, d, xqr, m);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i) kernels::SwiGlu(g + i * n, u + i * n, g + i * n, n);
    const BlockQ8A* hq = nullptr;
    if (q_down) {
      kernels::QuantizeActivations(g, n, m, n, ws->hq.get());
      hq = ws->hq.get();
    }
    LinearAdd(f.down, g, n, hq, m, x + r0 * d, d);
  }
}

void DenseFfnBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws) {
  const ModelConfig& c = model.config();
  const LayerWeights& L = model.layers()[il];
  const BlockQ8A* xq = NormAndQuantize(ws->x.get(), L.ffn_norm, n_tokens, c.n_embd, c.rms_eps,
                                       IsQuantized(L.ffn.gate.type) || IsQuantized(L.ffn.up.type), ws);
  FfnAdd(L.ffn, c, n_tokens, xq, ws);
}

void SharedExpertsBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws) {
  const LayerWeights& L = model.layers()[il];
  if (!L.shexp.present()) return;
  // RouteBlock quantised xn when any of the layer's matrices (the shared experts included) is
  // quantised.
  const bool q_in = IsQuantized(L.shexp.gate.type) || IsQuantized(L.shexp.up.type);
  FfnAdd(L.shexp, model.config(), n_tokens, q_in ? ws->xq.get() : nullptr, ws);
}

}  // namespace estream::model
