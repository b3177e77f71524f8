#include "model/shortconv_block.h"

#include "kernels/kernels.h"

namespace estream::model {

void ShortConvBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws) {
  const ModelConfig& c = model.config();
  const LayerWeights& L = model.layers()[il];
  const ShortConvWeights& w = L.conv;
  const int64_t T = n_tokens, d = c.n_embd;

  kernels::RmsNorm(ws->x.get(), d, L.attn_norm, ws->xn.get(), d, T, d, c.rms_eps);
  const BlockQ8A* xq = nullptr;
  if (IsQuantized(w.in_proj.type)) {
    kernels::QuantizeActivations(ws->xn.get(), d, T, d, ws->xq.get());
    xq = ws->xq.get();
  }
  Linear(w.in_proj, ws->xn.get(), d, xq, T, ws->bcx.get(), 3 * d);
  // The gated convolution into q (free in a conv layer; q_dim() == n_embd, checked at load).
  kernels::ShortConv(ws->bcx.get(), 3 * d, w.kernel, c.shortconv_l, d, T, ws->q.get(), d);
  // Output projection into xn (its input is consumed), then the residual add.
  Linear(w.out_proj, ws->q.get(), d, nullptr, T, ws->xn.get(), d);
  float* x = ws->x.get();
  const float* y = ws->xn.get();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) kernels::Add(x + t * d, y + t * d, d);
}

}  // namespace estream::model
