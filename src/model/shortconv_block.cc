#include "model/shortconv_block.h"

#include <algorithm>
#include <vector>

#include "kernels/kernels.h"

namespace estream::model {

void ShortConvBlock(const Model& model, int il, int64_t n_tokens, Workspace* ws, std::span<const SeqSpan> seqs) {
  const ModelConfig& c = model.config();
  const LayerWeights& L = model.layers()[il];
  const ShortConvWeights& w = L.conv;
  const int64_t T = n_tokens, d = c.n_embd;

  const BlockQ8A* xq = NormAndQuantize(ws->x.get(), L.attn_norm, T, d, c.rms_eps, IsQuantized(w.in_proj.type), ws);
  Linear(w.in_proj, ws->xn.get(), d, xq, T, ws->bcx.get(), 3 * d);
  // The gated convolution into q (free in a conv layer; q_dim() == n_embd, checked at load).
  const SeqSpan whole{.row = 0, .len = T};
  if (seqs.empty()) seqs = std::span<const SeqSpan>(&whole, 1);
  const int64_t taps = c.shortconv_l, ld = 3 * d;
  const float* bcx = ws->bcx.get();
  float* conv = ws->q.get();
  for (const SeqSpan& s : seqs) {
    kernels::ShortConv(bcx + s.row * ld, ld, w.kernel, static_cast<int>(taps), d, s.len, conv + s.row * d, d);
    if (s.ctx_len == 0 || taps < 2) continue;
    // A continuation's first m rows also reach back into its context: convolve the context's last
    // h rows followed by those m rows, and keep the last m outputs.
    const int64_t h = std::min(taps - 1, s.ctx_len), m = std::min(taps - 1, s.len);
    std::vector<float> in(static_cast<size_t>((h + m) * ld)), out(static_cast<size_t>((h + m) * d));
    std::copy(bcx + (s.ctx_row + s.ctx_len - h) * ld, bcx + (s.ctx_row + s.ctx_len) * ld, in.begin());
    std::copy(bcx + s.row * ld, bcx + (s.row + m) * ld, in.begin() + h * ld);
    kernels::ShortConv(in.data(), ld, w.kernel, static_cast<int>(taps), d, h + m, out.data(), d);
    std::copy(out.begin() + h * d, out.end(), conv + s.row * d);
  }
  // Output projection with the residual add in its epilogue: x += conv W_out^T.
  LinearAdd(w.out_proj, ws->q.get(), d, nullptr, T, ws->x.get(), d);
}

}  // namespace estream::model
