// The route CSR builder (docs/DESIGN.md section 3): from the router's per-token top-k
// choices and a placement map, the routes grouped by slot, the input of moe::ExpertPlan::Invoke.
//
// A route is (token t, choice j): expert e = expert_ids[t * k + j] with weight
// a = expert_weights[t * k + j]. The placement map phi[e] (e < n_expert) gives the slot of
// expert e, or -1 when the expert is not placed (not resident / not in the group being run):
// such routes are skipped (the caller runs them in another invocation). Slots are 0..n_slots-1.
//
// Output, for slots s = 0..n_slots-1: routes [slot_begin[s], slot_begin[s + 1]) of
// route_token / route_weight, in ascending token order within a slot (so the builder is stable,
// and the operator's result does not depend on how the router ordered its k choices). Empty
// slots have slot_begin[s] == slot_begin[s + 1]. O(n_slots + n_tokens * k) time, no allocation:
// slot_begin doubles as the counter and the placement cursor.
//
// Thread safety: pure function of its inputs; re-entrant.
#pragma once

#include <cstdint>

namespace estream::moe {

struct RouteInput {
  const int32_t* expert_ids = nullptr;      // [n_tokens x k]
  const float* expert_weights = nullptr;    // [n_tokens x k]
  int64_t n_tokens = 0;
  int k = 0;                                // choices per token (n_expert_used)
  const int32_t* phi = nullptr;             // [n_expert] slot of each expert or -1; nullptr = identity
  int n_expert = 0;
};

struct RouteCsr {
  int64_t* slot_begin = nullptr;   // [n_slots + 1]
  int n_slots = 0;
  int32_t* route_token = nullptr;  // capacity >= n_tokens * k
  float* route_weight = nullptr;   // capacity >= n_tokens * k
};

// Fills `out` (caller-owned arrays) and returns the number of routes placed
// (out.slot_begin[out.n_slots]). REQUIRES: every expert id in [0, n_expert); every phi value in
// [-1, n_slots); an expert never chosen twice by one token (then routes of a slot have distinct
// tokens). With phi == nullptr, slot = expert id (n_slots >= n_expert).
int64_t BuildRouteCsr(const RouteInput& in, const RouteCsr& out);

}  // namespace estream::moe
