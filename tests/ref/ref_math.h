// The fp64 building blocks every naive reference forward shares (ref_forward.cc, ref_deepseek2.cc,
// ref_lfm2moe.cc): weights read and dequantised into doubles, matrix-vector products, RMSNorm,
// RoPE of one head, SiLU. Plain loops, no vectorisation: the references are slow on purpose.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

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

}  // namespace estream::ref
