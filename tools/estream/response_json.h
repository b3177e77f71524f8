// The JSON of a Response's streaming configuration, written by `estream prefill --json` (its
// "config" object) and by `estream bench` (each run's "config"), so both say the same.
#pragma once

#include <nlohmann/json.hpp>

#include "estream/engine.h"

namespace estream::cli {

// REQUIRES: r.config.streamed. Sizes in bytes; docs/GUIDE.md section 6 lists the fields.
inline nlohmann::json StreamConfigJson(const Response& r) {
  const Response::StreamConfig& k = r.config;
  return {{"group_size", k.group_size},         {"banks", k.banks},
          {"queue_depth", k.queue_depth},       {"schedule", k.schedule},
          {"io", k.io_backend},                 {"arena_bytes", k.arena_bytes},
          {"expert_bytes", k.expert_bytes},     {"budget_bytes", k.budget_bytes},
          {"groups_read", k.groups_read},       {"groups_skipped", k.groups_skipped},
          {"groups_cancelled", k.groups_cancelled}, {"source", k.source},
          {"other_bytes", k.other_bytes},       {"cache_banks", k.cache_banks},
          {"cache_bytes", k.cache_bytes},       {"experts_needed", r.experts_needed},
          {"experts_cached", r.experts_cached}};
}

}  // namespace estream::cli
