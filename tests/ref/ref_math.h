// The fp64 building blocks every naive reference forward shares (ref_forward.cc, ref_deepseek2.cc,
// ref_lfm2moe.cc), one helper per operation: weights read and dequantised into doubles, the
// token embedding, matrix-vector products, RMSNorm (of a row, of each head), RoPE, SiLU, SwiGLU,
// softmax, one causal attention head, the expert choice with its margins and forced routing, the
// weighted sum of experts, the residual add and the output head. Plain loops in a fixed order, no
// vectorisation: the references are slow on purpose, and each family's forward is these calls.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "ref/ref_forward.h"

namespace estream::ref {

// The whole tensor `name` as doubles (dequantised rows); Corruption if it is missing or its
// GGUF shape (fastest dimension first) is not `shape`.
inline Result<std::vector<double>> ReadTensor(const GgufFile& f, const std::string& name,
                                              const std::vector<int64_t>& shape) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (!t) return Status::Corruption("ref: missing tensor " + name);
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (t->ne(static_cast<int>(d)) != shape[d]) return Status::Corruption("ref: bad shape of " + name);
    n *= shape[d];
  }
  if (static_cast<uint64_t>(n) != t->n_elements) return Status::Corruption("ref: bad size of " + name);
  const int64_t row = shape[0];
  const size_t row_bytes = RowBytes(t->type, row);
  const uint8_t* src = f.TensorData(*t);
  std::vector<double> out(n);
  std::vector<float> tmp(row);
  for (int64_t r = 0; r < n / row; ++r) {
    DequantizeRow(t->type, src + r * row_bytes, tmp.data(), row);
    for (int64_t i = 0; i < row; ++i) out[r * row + i] = tmp[i];
  }
  return out;
}

// y[n_out] = W x, W stored as n_out rows of n_in starting at w[w_offset].
inline void MatVec(const std::vector<double>& w, const double* x, int64_t n_in, int64_t n_out, double* y,
                   int64_t w_offset = 0) {
  for (int64_t o = 0; o < n_out; ++o) {
    double s = 0;
    const double* row = w.data() + w_offset + o * n_in;
    for (int64_t i = 0; i < n_in; ++i) s += row[i] * x[i];
    y[o] = s;
  }
}

// x = x / sqrt(mean(x^2) + eps) * w, n values.
inline void RmsNormInPlace(double* x, const double* w, int64_t n, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * scale * w[i];
}

// Rotates one head of `hd` values at position pos. neox: pairs (i, i + hd/2); else (2i, 2i+1).
inline void RotateHead(double* x, int hd, int pos, double base, bool neox) {
  for (int i = 0; i < hd / 2; ++i) {
    const double theta = pos * std::pow(base, -2.0 * i / hd);
    const double c = std::cos(theta), s = std::sin(theta);
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + hd / 2 : 2 * i + 1;
    const double x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

inline double Silu(double g) { return g / (1.0 + std::exp(-g)); }

using Vec = std::vector<double>;

// x[t][i] = emb[tokens[t]][i]: the residual stream [T][d] at the start.
inline Vec Embed(const Vec& emb, const std::vector<int32_t>& tokens, int64_t d) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  Vec x(T * d);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i) x[t * d + i] = emb[int64_t{tokens[t]} * d + i];
  return x;
}

// The output head's weights [V][d]: output.weight, or the embeddings when the head is tied.
inline Result<Vec> ReadHead(const GgufFile& f, const Vec& emb, int64_t d, int64_t V) {
  if (!f.FindTensor("output.weight")) return emb;
  return ReadTensor(f, "output.weight", {d, V});
}

// Row t of x [T][d], RMS-normalised with weights w: the input of a block.
inline Vec NormedRow(const Vec& x, int64_t t, int64_t d, const double* w, double eps) {
  Vec h(x.begin() + t * d, x.begin() + (t + 1) * d);
  RmsNormInPlace(h.data(), w, d, eps);
  return h;
}

// RMSNorm of each of n_heads heads of hd values (the same weights w [hd] for every head).
inline void NormHeads(double* x, int64_t n_heads, int64_t hd, const double* w, double eps) {
  for (int64_t h = 0; h < n_heads; ++h) RmsNormInPlace(x + h * hd, w, hd, eps);
}

// RotateHead on each of n_heads heads of hd values.
inline void RotateHeads(double* x, int64_t n_heads, int hd, int pos, double base, bool neox) {
  for (int64_t h = 0; h < n_heads; ++h) RotateHead(x + h * hd, hd, pos, base, neox);
}

// x[n] += y[n]: the residual add.
inline void AddInPlace(double* x, const double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// One causal attention head at query position t: out[vd] += sum_{u <= t} softmax_u(q . k_u *
// scale) v_u, where k_u = k0 + u * k_stride (hd values) and v_u = v0 + u * v_stride (vd values).
inline void CausalHead(const double* q, const double* k0, int64_t k_stride, const double* v0, int64_t v_stride,
                       int64_t t, int64_t hd, int64_t vd, double scale, double* out) {
  Vec s(t + 1);
  double mx = -1e300;
  for (int64_t u = 0; u <= t; ++u) {
    double dot = 0;
    for (int64_t i = 0; i < hd; ++i) dot += q[i] * k0[u * k_stride + i];
    s[u] = dot * scale;
    mx = std::max(mx, s[u]);
  }
  double z = 0;
  for (int64_t u = 0; u <= t; ++u) z += (s[u] = std::exp(s[u] - mx));
  for (int64_t u = 0; u <= t; ++u)
    for (int64_t i = 0; i < vd; ++i) out[i] += s[u] / z * v0[u * v_stride + i];
}

// SwiGLU FFN of width n on h [d]: y[d] = down (silu(gate h) * (up h)); gate/up GGUF [d, n] and
// down [n, d], or the slices at off_gu / off_d of 3-D expert tensors.
inline void SwiGlu(const Vec& gate, const Vec& up, const Vec& down, const double* h, int64_t d, int64_t n, double* y,
                   int64_t off_gu = 0, int64_t off_d = 0) {
  Vec g(n), u(n);
  MatVec(gate, h, d, n, g.data(), off_gu);
  MatVec(up, h, d, n, u.data(), off_gu);
  for (int64_t i = 0; i < n; ++i) g[i] = Silu(g[i]) * u[i];
  MatVec(down, g.data(), n, d, y, off_d);
}

// softmax of `logit` (max subtracted).
inline Vec Softmax(const Vec& logit) {
  const double mx = *std::max_element(logit.begin(), logit.end());
  Vec prob(logit.size());
  double z = 0;
  for (size_t e = 0; e < logit.size(); ++e) z += (prob[e] = std::exp(logit[e] - mx));
  for (size_t e = 0; e < logit.size(); ++e) prob[e] /= z;
  return prob;
}

// The experts of token t at layer il: the k_used largest `key` (stable order), recorded in
// out->routing, with out->router_gap = margin of the k-th minus margin of the (k+1)-th (1e30
// when every expert is used). With forced routing (options.routing), returns those experts
// instead and records out->route_deficit = max(0, own k-th margin - the weakest forced one).
// *order: the chosen experts first. InvalidArgument for a forced id out of range.
inline Status ChooseExperts(const Vec& key, const Vec& margin, int64_t il, int64_t t, const RefOptions& options,
                            RefOutputs* out, std::vector<int>* order) {
  const int64_t n_exp = static_cast<int64_t>(key.size()), k = out->n_expert_used;
  const int64_t T = out->n_tokens, n_layer = out->n_layer;
  order->resize(n_exp);
  std::iota(order->begin(), order->end(), 0);
  std::stable_sort(order->begin(), order->end(), [&](int a, int b) { return key[a] > key[b]; });
  std::vector<int>& o = *order;
  out->router_gap[t * n_layer + il] = k < n_exp ? margin[o[k - 1]] - margin[o[k]] : 1e30;
  int32_t* chosen = &out->routing[(il * T + t) * k];
  for (int64_t j = 0; j < k; ++j) chosen[j] = o[j];
  if (!options.routing) return Status::Ok();
  const int32_t* forced = &(*options.routing)[(il * T + t) * k];
  double weakest = 1e300;
  for (int64_t j = 0; j < k; ++j) {
    if (forced[j] < 0 || forced[j] >= n_exp) return Status::InvalidArgument("ref: forced expert id");
    weakest = std::min(weakest, margin[forced[j]]);
  }
  out->route_deficit[t * n_layer + il] = std::max(0.0, margin[chosen[k - 1]] - weakest);
  for (int64_t j = 0; j < k; ++j) o[j] = forced[j];
  return Status::Ok();
}

// moe[d] += sum_j weight[j] * SwiGlu of expert experts[j] (j < weight.size()) on h [d]; gate/up
// GGUF [d, ff, E], down [ff, d, E].
inline void AddExperts(const Vec& gate, const Vec& up, const Vec& down, const double* h, int64_t d, int64_t ff,
                       const std::vector<int>& experts, const Vec& weight, double* moe) {
  Vec y(d);
  for (size_t j = 0; j < weight.size(); ++j) {
    const int64_t e = experts[j];
    SwiGlu(gate, up, down, h, d, ff, y.data(), e * ff * d, e * d * ff);
    for (int64_t i = 0; i < d; ++i) moe[i] += weight[j] * y[i];
  }
}

// The outputs' sizes and shapes for T tokens; router_gap starts at `gap` (1e30: layers without
// routing keep it). InvalidArgument when the forced routing has the wrong size.
inline Status InitOutputs(int64_t T, int64_t V, int64_t d, int64_t n_layer, int64_t k_used, double gap,
                          const RefOptions& options, RefOutputs* out) {
  out->n_tokens = static_cast<int>(T);
  out->n_vocab = static_cast<int>(V);
  out->n_embd = static_cast<int>(d);
  out->n_layer = static_cast<int>(n_layer);
  out->n_expert_used = static_cast<int>(k_used);
  out->router_gap.assign(T * n_layer, gap);
  out->routing.assign(n_layer * T * k_used, -1);
  out->route_deficit.assign(T * n_layer, 0.0);
  if (options.routing && options.routing->size() != out->routing.size())
    return Status::InvalidArgument("ref: forced routing has the wrong size");
  return Status::Ok();
}

// The final RMSNorm (weights norm [d]) of the residual stream x [T][d] into out->hidden, and the
// logits out->logits = hidden head^T (head [V][d]).
inline void OutputHead(const Vec& x, const Vec& norm, const Vec& head, double eps, RefOutputs* out) {
  const int64_t T = out->n_tokens, d = out->n_embd, V = out->n_vocab;
  out->hidden.resize(T * d);
  out->logits.resize(T * V);
  for (int64_t t = 0; t < T; ++t) {
    double* h = &out->hidden[t * d];
    std::copy(x.begin() + t * d, x.begin() + (t + 1) * d, h);
    RmsNormInPlace(h, norm.data(), d, eps);
    MatVec(head, h, d, V, &out->logits[t * V]);
  }
}

}  // namespace estream::ref
