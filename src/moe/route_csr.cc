#include "moe/route_csr.h"

#include "base/check.h"

namespace estream::moe {

int64_t BuildRouteCsr(const RouteInput& in, const RouteCsr& out) {
  const int P = out.n_slots;
  int64_t* begin = out.slot_begin;
  const int64_t n_routes = in.n_tokens * in.k;
  // Count into begin[s + 1].
  for (int s = 0; s <= P; ++s) begin[s] = 0;
  for (int64_t i = 0; i < n_routes; ++i) {
    const int32_t e = in.expert_ids[i];
    ESTREAM_DCHECK(e >= 0 && e < in.n_expert, "BuildRouteCsr: expert id out of range");
    const int32_t s = in.phi != nullptr ? in.phi[e] : e;
    ESTREAM_DCHECK(s >= -1 && s < P, "BuildRouteCsr: placement outside [-1, n_slots)");
    if (s >= 0) ++begin[s + 1];
  }
  // Exclusive prefix sum shifted by one: begin[s + 1] = start of slot s, used as its cursor.
  int64_t acc = 0;
  for (int s = 0; s < P; ++s) {
    const int64_t n = begin[s + 1];
    begin[s + 1] = acc;
    acc += n;
  }
  // Place in token order; each placement advances begin[s + 1], which ends at the end of slot s
  // (= the start of slot s + 1): the CSR offsets.
  for (int64_t t = 0; t < in.n_tokens; ++t) {
    for (int j = 0; j < in.k; ++j) {
      const int64_t i = t * in.k + j;
      const int32_t e = in.expert_ids[i];
      const int32_t s = in.phi != nullptr ? in.phi[e] : e;
      if (s < 0) continue;
      const int64_t pos = begin[s + 1]++;
      out.route_token[pos] = static_cast<int32_t>(t);
      out.route_weight[pos] = in.expert_weights[i];
    }
  }
  begin[0] = 0;
  return acc;
}

}  // namespace estream::moe
