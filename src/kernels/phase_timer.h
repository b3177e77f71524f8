// Opt-in phase timers of the AVX-512 low-precision attention kernel (x86_avx512/attention_lowp.cc
// and its driver AttentionPrefillWith): where a call's time goes (Q's quantisation, the Q.K^T and
// P.V tiles, the softmax, the output, the K/V conversion, ...), for tuning it (docs/PERFORMANCE.md,
// "Machine B, 2026-12-06"). Other kernels time only the driver's phases (conversion, fp32 rows).
// Off unless ESTREAM_PHASE_TIMERS=1 is in the environment (any value but 0 or 1: a warning on
// stderr, off) or EnablePhaseTimers(true) was called; off, a PhaseClock is one predictable branch
// per phase boundary (measured: no change in the kernel's time). On, each boundary reads the
// time-stamp counter (x86 rdtsc; elsewhere the steady clock in ns), and each PhaseClock adds its
// per-phase sums to process-wide atomic totals when it goes out of scope. `ops_bench`'s
// BM_Attention reports the shares as counters (pct_<phase>) when the timers are on. The reads are
// not ordered with the work around them, so a boundary is exact to some hundred cycles, and they
// add ~5% to a call.
// Thread safety: PhaseClock is per thread; the totals are atomics.
#pragma once

#include <chrono>
#include <cstdint>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace estream::kernels {

enum AttnPhase : int {
  kPhaseConvert,    // K/V converted to the kernel's blocks
  kPhaseFirstRows,  // key block 0 converted again for the first rows (their tiles: the phases below)
  kPhaseQuantiseQ,  // a group's Q rows quantised into its tiles' layout
  kPhasePrefetch,   // the next group's Q prefetched
  kPhaseQk,         // Q.K^T tiles
  kPhaseSoftmax,    // mask, block maximum, per-row state
  kPhaseP,          // 2^x, P to 8 bits, the normaliser
  kPhasePv,         // P.V tiles and their epilogues
  kPhaseOutput,     // O transposed into the output rows
  kPhaseOther,      // waits at barriers, scheduling, everything between
  kPhaseCount
};

// "qk", "pv", ...: the short name of a phase (for counters and tables).
const char* AttnPhaseName(int phase);

bool PhaseTimersOn();
void EnablePhaseTimers(bool on);
// The process-wide totals (ticks) per phase since the last call, then cleared.
void TakePhaseTicks(uint64_t (&ticks)[kPhaseCount]);

// Inline, so that a Mark is no call (every vector register is caller-saved: a call on the
// kernel's path, even an untaken one, made the compiler spill around it).
inline uint64_t PhaseNow() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
#endif
}
void AddPhaseTicks(const uint64_t (&ticks)[kPhaseCount]);

// Mark(p) charges the time since the clock's construction or its previous Mark or Skip to p.
class PhaseClock {
 public:
  PhaseClock() : on_(PhaseTimersOn()) {
    if (on_) last_ = PhaseNow();
  }
  ~PhaseClock() {
    if (on_) AddPhaseTicks(ticks_);
  }
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;
  void Mark(int phase) {
    if (on_) {
      const uint64_t now = PhaseNow();
      ticks_[phase] += now - last_;
      last_ = now;
    }
  }
  // Restarts the interval without charging it (time another clock has counted).
  void Skip() {
    if (on_) last_ = PhaseNow();
  }

 private:
  bool on_;
  uint64_t last_ = 0;
  uint64_t ticks_[kPhaseCount] = {};
};

}  // namespace estream::kernels
