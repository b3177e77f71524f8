#include "experts_baseline.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "kernels/dispatch.h"

namespace estream::ref {

using model::ExpertWeights;
using model::ModelConfig;
using model::Workspace;
using model::IsQuantized;
using model::Linear;
using model::kExpertChunkRows;

void ExpertsGrouped(const ExpertWeights& experts, const ModelConfig& c, int64_t n_tokens, Workspace* ws) {
  const int64_t d = c.n_embd, ff = c.n_ff_expert;
  const int64_t d_blocks = d / kQK8A, ff_blocks = ff / kQK8A;
  const kernels::KernelTable& kt = kernels::Kernels();
  const float* xn = ws->xn.get();
  const BlockQ8A* xq = ws->xq.get();
  double* acc = ws->acc.get();
  moe::BeginExpertSum(ws->x.get(), n_tokens, d, acc);
  std::vector<float> down(static_cast<size_t>(std::min(kExpertChunkRows, n_tokens) * d));  // [chunk x d]

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
      float* dn = down.data();
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
      // Weighted scatter-add into the layer's fp64 sum (distinct tokens within one expert).
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        double* dst = acc + static_cast<int64_t>(tok[r]) * d;
        const float* src = dn + r * d;
        const double a = aw[r];
        for (int64_t i = 0; i < d; ++i) dst[i] += a * static_cast<double>(src[i]);
      }
    }
  }
  moe::EndExpertSum(acc, n_tokens, d, ws->x.get());
}

namespace {

struct Unit {
  int expert;
  int64_t route0;  // first route (index into route_token / route_w)
  int64_t rows;    // routes in this unit
  int64_t wrow;    // first row in the window's buffers
};

// The window's buffers (ExpertsBatched is not re-entrant), grown on demand and kept.
template <typename T>
T* Scratch(AlignedPtr<T>* p, int64_t* have, int64_t n) {
  if (n > *have) {
    *p = AllocAligned<T>(static_cast<size_t>(n));
    ESTREAM_CHECK(*p != nullptr, "ExpertsBatched: cannot allocate its window buffers");
    *have = n;
  }
  return p->get();
}

}  // namespace

void ExpertsBatched(const ExpertWeights& experts, const ModelConfig& c, int64_t n_tokens, Workspace* ws) {
  const int64_t d = c.n_embd, ff = c.n_ff_expert;
  const int64_t d_blocks = d / kQK8A, ff_blocks = ff / kQK8A;
  // A unit holds at most one route per token of one expert, so at most min(kExpertChunkRows, T)
  // rows: the rows of its tiles.
  const int64_t C = kExpertChunkRows;
  const int64_t tile_elems = std::min(C, n_tokens) * std::max(kFfBlock, kEmbdBlock);
  const kernels::KernelTable& kt = kernels::Kernels();
  const int nth = omp_get_max_threads();
  static AlignedPtr<BlockQ8A> wxq_buf, whq_buf;
  static AlignedPtr<float> wx_buf, whf_buf, tiles_buf;
  static int64_t wxq_n = 0, whq_n = 0, wx_n = 0, whf_n = 0, tiles_n = 0;
  BlockQ8A* const wxq = Scratch(&wxq_buf, &wxq_n, kRouteWindow * d_blocks);  // gathered Q8A rows
  float* const wx = Scratch(&wx_buf, &wx_n, kRouteWindow * d);               // gathered float rows
  BlockQ8A* const whq = Scratch(&whq_buf, &whq_n, kRouteWindow * ff_blocks); // SwiGLU output, Q8A
  float* const whf = Scratch(&whf_buf, &whf_n, kRouteWindow * ff);           // SwiGLU output, float
  float* const tiles = Scratch(&tiles_buf, &tiles_n, nth * 3 * tile_elems);  // per thread: 3 tiles

  // Units, then windows of consecutive units.
  std::vector<Unit> units;
  for (int e = 0; e < c.n_expert; ++e)
    for (int64_t r0 = ws->expert_begin[e]; r0 < ws->expert_begin[e + 1]; r0 += C)
      units.push_back({e, r0, std::min(C, ws->expert_begin[e + 1] - r0), 0});
  const int64_t n_ff_items = (ff + kFfBlock - 1) / kFfBlock;
  const int64_t n_d_items = (d + kEmbdBlock - 1) / kEmbdBlock;
  moe::BeginExpertSum(ws->x.get(), n_tokens, d, ws->acc.get());

  for (size_t u0 = 0; u0 < units.size();) {
    size_t u1 = u0;
    int64_t rows = 0;
    while (u1 < units.size() && rows + units[u1].rows <= kRouteWindow) {
      units[u1].wrow = rows;
      rows += units[u1++].rows;
    }
    const int64_t n_units = static_cast<int64_t>(u1 - u0);
    const Unit* win = units.data() + u0;

#pragma omp parallel num_threads(nth)
    {
      float* my_tiles = tiles + omp_get_thread_num() * 3 * tile_elems;
      float* tg = my_tiles;
      float* tu = my_tiles + tile_elems;
      float* td = my_tiles + 2 * tile_elems;

      // 1. Gather the routed rows (Q8A for quantised gate/up, floats for float ones).
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < n_units; ++i) {
        const Unit& u = win[i];
        const bool q_in = IsQuantized(experts.gate[u.expert].type) || IsQuantized(experts.up[u.expert].type);
        const bool f_in = !IsQuantized(experts.gate[u.expert].type) || !IsQuantized(experts.up[u.expert].type);
        for (int64_t r = 0; r < u.rows; ++r) {
          const int64_t t = ws->route_token[u.route0 + r];
          if (q_in) std::memcpy(wxq + (u.wrow + r) * d_blocks, ws->xq.get() + t * d_blocks, d_blocks * sizeof(BlockQ8A));
          if (f_in) std::memcpy(wx + (u.wrow + r) * d, ws->xn.get() + t * d, d * sizeof(float));
        }
      }
      // (implicit barrier)

      // 2. Gate and up by column blocks, SwiGLU, H.
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < n_units * n_ff_items; ++item) {
        const Unit& u = win[item / n_ff_items];
        const int64_t n0 = (item % n_ff_items) * kFfBlock, n1 = std::min(ff, n0 + kFfBlock), nb = n1 - n0;
        const BlockQ8A* xq = wxq + u.wrow * d_blocks;
        const float* x = wx + u.wrow * d;
        kernels::GemmColumns(kt, experts.gate[u.expert], xq, x, d, u.rows, n0, n1, tg, nb);
        kernels::GemmColumns(kt, experts.up[u.expert], xq, x, d, u.rows, n0, n1, tu, nb);
        const bool q_down = IsQuantized(experts.down[u.expert].type);
        for (int64_t r = 0; r < u.rows; ++r) {
          float* h = tg + r * nb;
          kt.swiglu(h, tu + r * nb, h, nb);
          if (q_down) {
            kt.quantize_q8a(h, whq + (u.wrow + r) * ff_blocks + n0 / kQK8A, nb);
          } else {
            std::memcpy(whf + (u.wrow + r) * ff + n0, h, nb * sizeof(float));
          }
        }
      }
      // (implicit barrier)

      // 3. Down by column blocks of n_embd, every unit in order, scatter-add into the fp64 sum.
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < n_d_items; ++item) {
        const int64_t c0 = item * kEmbdBlock, c1 = std::min(d, c0 + kEmbdBlock), nb = c1 - c0;
        for (int64_t i = 0; i < n_units; ++i) {
          const Unit& u = win[i];
          kernels::GemmColumns(kt, experts.down[u.expert], whq + u.wrow * ff_blocks, whf + u.wrow * ff, ff, u.rows, c0,
                               c1, td, nb);
          for (int64_t r = 0; r < u.rows; ++r) {
            double* dst = ws->acc.get() + static_cast<int64_t>(ws->route_token[u.route0 + r]) * d + c0;
            const float* src = td + r * nb;
            const double a = ws->route_w[u.route0 + r];
            for (int64_t j = 0; j < nb; ++j) dst[j] += a * static_cast<double>(src[j]);
          }
        }
      }
    }
    u0 = u1;
  }
  moe::EndExpertSum(ws->acc.get(), n_tokens, d, ws->x.get());
}

}  // namespace estream::ref
