#include "kernels/phase_timer.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace estream::kernels {
namespace {

std::atomic<bool>& Enabled() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("ESTREAM_PHASE_TIMERS");
    if (env == nullptr || *env == '\0' || std::strcmp(env, "0") == 0) return false;
    if (std::strcmp(env, "1") == 0) return true;
    std::fprintf(stderr, "estream: warning: ESTREAM_PHASE_TIMERS=%s is not 0 or 1; the phase timers stay off\n", env);
    return false;
  }()};
  return on;
}

std::atomic<uint64_t> g_totals[kPhaseCount];

}  // namespace

const char* AttnPhaseName(int phase) {
  static constexpr const char* kNames[kPhaseCount] = {"convert", "first_rows", "quantise_q", "prefetch", "qk",
                                                      "softmax", "p",          "pv",         "output",   "other"};
  return phase >= 0 && phase < kPhaseCount ? kNames[phase] : "?";
}

bool PhaseTimersOn() { return Enabled().load(std::memory_order_relaxed); }
void EnablePhaseTimers(bool on) { Enabled().store(on, std::memory_order_relaxed); }

void AddPhaseTicks(const uint64_t (&ticks)[kPhaseCount]) {
  for (int p = 0; p < kPhaseCount; ++p)
    if (ticks[p] != 0) g_totals[p].fetch_add(ticks[p], std::memory_order_relaxed);
}

void TakePhaseTicks(uint64_t (&ticks)[kPhaseCount]) {
  for (int p = 0; p < kPhaseCount; ++p) ticks[p] = g_totals[p].exchange(0, std::memory_order_relaxed);
}

}  // namespace estream::kernels
