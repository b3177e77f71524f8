#include "model/experts.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/dispatch.h"

namespace estream::model {

void ExpertsGrouped(const ExpertWeights& experts, const ModelConfig& c, int64_t n_tokens, Workspace* ws) {
  const int64_t d = c.n_embd, ff = c.n_ff_expert;
  const int64_t d_blocks = d / kQK8A, ff_blocks = ff / kQK8A;
  const kernels::KernelTable& kt = kernels::Kernels();
  const float* xn = ws->xn.get();
  const BlockQ8A* xq = ws->xq.get();
  float* x = ws->x.get();

  for (int e = 0; e < c.n_expert; ++e) {
    const kernels::WeightView& wg = experts.gate[e];
    const kernels::WeightView& wu = experts.up[e];
    const kernels::WeightView& wd = experts.down[e];
    const bool q_in = IsQuantized(wg.type) || IsQuantized(wu.type);
    const bool f_in = !IsQuantized(wg.type) || !IsQuantized(wu.type);
    const bool q_down = IsQuantized(wd.type);

    for (int64_t r0 = ws->expert_begin[e]; r0 < ws->expert_begin[e + 1]; r0 += kExpertChunkRows) {
      const int64_t R = std::min(kExpertChunkRows, ws->expert_begin[e + 1] - r0);
      const int32_t* tok = ws->route_token.get() + r0;
      const float* aw = ws->route_w.get() + r0;
      float* g = ws->gate.get();
      float* u = ws->up.get();
      float* dn = ws->down.get();
      BlockQ8A* gxq = ws->gxq.get();
      float* gx = ws->gx.get();
      BlockQ8A* hq = ws->hq.get();

#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        if (q_in) std::memcpy(gxq + r * d_blocks, xq + tok[r] * d_blocks, d_blocks * sizeof(BlockQ8A));
        if (f_in) std::memcpy(gx + r * d, xn + tok[r] * d, d * sizeof(float));
      }
      Linear(wg, gx, d, q_in ? gxq : nullptr, R, g, ff);
      Linear(wu, gx, d, q_in ? gxq : nullptr, R, u, ff);
      // SwiGLU, and the Q8A form of its output for a quantised down projection.
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        kt.swiglu(g + r * ff, u + r * ff, g + r * ff, ff);
        if (q_down) kt.quantize_q8a(g + r * ff, hq + r * ff_blocks, ff);
      }
      Linear(wd, g, ff, q_down ? hq : nullptr, R, dn, d);
      // Weighted scatter-add into the residual stream (distinct tokens within one expert).
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        float* dst = x + static_cast<int64_t>(tok[r]) * d;
        const float* src = dn + r * d;
        const float a = aw[r];
        for (int64_t i = 0; i < d; ++i) dst[i] += a * src[i];
      }
    }
  }
}

}  // namespace estream::model
