// The configurator's stored profile and chosen configuration, and their GGUF metadata form
// (docs/DESIGN.md section 7).
//
// A Profile holds everything the configurator needs to re-solve (G, Q, B) for a new memory
// budget without running the model: the device's grouped-read bandwidth table, and what one
// calibration request per candidate group size measured. It is compact by construction:
//   - route counts are stored once, per expert in PACKED (physical) order: the routing of the
//     calibration request does not depend on G, Q, B or the schedule (docs/DESIGN.md
//     section 6), and group k of size g holds physical experts [k*g, k*g + g), so every g's
//     per-group route vector rho_k = sum of its experts' counts is derived from them
//     (configurator.h);
//   - non-expert times are pooled across g (one T_ne per MoE layer), as the design says;
//   - per candidate g only M_other(g) and the pooled load and execution samples are kept (the
//     profiler may thin the execution samples with CompactExecSamples: the fit is affine).
// For 48 layers x 128 experts and 5 candidate g this is ~6K route counts + a few hundred floats.
//
// Units: bytes, seconds, bytes per second, routed rows (token-expert pairs).
//
// ---- Metadata keys (profile version 1) ------------------------------------------------------
// W = n_layer (MoE layers, in execution order), E = n_expert, nq / ng = disk table sizes,
// nc = calibrated group sizes; <g> below is a decimal group size, e.g. estream.profile.calib.4.*
//   estream.profile.version                u32       1 (a reader refuses others: NotSupported)
//   estream.profile.n_layer                u32       W >= 1
//   estream.profile.n_expert               u32       E >= 1
//   estream.profile.expert_bytes           u64       W_e: one arena slot (the packed record
//                                                    stride of the largest layer), >= 1
//   estream.profile.record_bytes           u64[W]    bytes read per expert of layer w, <= W_e
//   estream.profile.calib_tokens           u32       tokens of the calibration request
//   estream.profile.n_threads              u32       compute threads the calibration ran with
//                                                    (OPTIONAL: absent in files profiled before
//                                                    it existed; read as 0 = unknown)
//   estream.profile.other_seconds          f32       compute outside the MoE layers
//   estream.profile.nonexpert_seconds      f32[W]    T_ne_w (pooled across g)
//   estream.profile.expert_routes          u32[W*E]  routed rows of physical expert e of layer
//                                                    w at w*E + e
//   estream.profile.disk.chunk_bytes       u64       loader chunk size of the table
//   estream.profile.disk.queue_depths      u32[nq]   strictly ascending, >= 1
//   estream.profile.disk.group_sizes       u32[ng]   strictly ascending, >= 1
//   estream.profile.disk.bandwidth         f32[ng*nq] bytes/s of group size i at depth j at
//                                                    i*nq + j, > 0
//   estream.profile.disk.latency_seconds   f32[ng]   per-read latency not in the bandwidth, >= 0
//   estream.profile.calib.group_sizes      u32[nc]   strictly ascending, each in [1, E]
//   estream.profile.calib.<g>.other_bytes       u64    M_other(g): non-arena memory (peak RSS
//                                                      minus the arena) of the calibration run
//   estream.profile.calib.<g>.load_queue_depth  u32    Q the loads were measured at (>= 1)
//   estream.profile.calib.<g>.load_seconds      f32[]  pooled group-read service times (may
//                                                      be empty: the disk table alone is used)
//   estream.profile.calib.<g>.exec_rows         f32[]  routed rows rho of each exec sample
//   estream.profile.calib.<g>.exec_seconds      f32[]  its execution time; same length, >= 1
// The chosen configuration (estream.config.*; reserved for it by io/packed_layout.h):
//   estream.config.version            u32     1
//   estream.config.group_size         u32     G* >= 1
//   estream.config.banks              u32     B* >= 1
//   estream.config.queue_depth        u32     Q* >= 1
//   estream.config.budget_bytes       u64     the budget it was solved for
//   estream.config.predicted_seconds  f32     the model's latency for the calibration request
//   estream.config.schedule           string  "early" | "after-routing" | "on-demand"
//   estream.config.n_threads          u32     OPTIONAL: compute threads of the profile it was
//                                             solved from (absent in older files: 0 = unknown)
// Parsing validates everything (presence, type, array lengths, ranges, consistency) and returns
// one-line errors naming the source and the key: Corruption for a defect, NotSupported for
// another version. Unknown estream.profile.* / estream.config.* keys are ignored (later minor
// additions, such as n_threads: an older build reads a newer file, a newer build an older file);
// any change of meaning bumps the version.
//
// Thread count: service times scale with the compute threads, so a profile measured with 2
// threads predicts a 1-thread run badly. The stored thread count is advisory: a run with another
// count still uses the stored profile/choice, and says so in one line (ThreadMismatchNote).
//
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "config/maxplus.h"
#include "gguf/gguf.h"

namespace estream::config {

constexpr uint32_t kProfileVersion = 1;
constexpr uint32_t kConfigVersion = 1;
// Q0 = smallest measured depth whose bandwidth reaches this fraction of the row's peak.
constexpr double kQ0PeakFraction = 0.95;

// Grouped-read bandwidth of the device (io_bench / the profiler's disk characterisation).
struct DiskProfile {
  uint64_t chunk_bytes = 0;          // loader chunk size the table was measured with
  std::vector<int> queue_depths;     // [nq] strictly ascending, >= 1
  std::vector<int> group_sizes;      // [ng] strictly ascending, >= 1
  std::vector<float> bandwidth;      // [ng * nq] bytes/s, row i = group_sizes[i]
  std::vector<float> latency_s;      // [ng] fixed per-read latency beyond bytes / bandwidth

  // Row used for group size g: the measured g, else the nearest in log2(g) (ties: the smaller).
  // REQUIRES: group_sizes non-empty.
  int RowFor(int g) const;
  // bw(g, q): at a measured depth, the largest bandwidth the row measured at that depth or any
  // shallower one (a running maximum: a deeper queue does not slow the device down; the dips a
  // table shows at larger depths are the noise of its short cells); linear in q between measured depths,
  // clamped outside the range. Q0 is the same on the raw row and on this envelope.
  double Bandwidth(int g, int q) const;
  double Latency(int g) const { return latency_s[static_cast<size_t>(RowFor(g))]; }
  // Q0(g): the smallest measured depth with bandwidth >= fraction * the row's peak.
  int Q0(int g, double fraction = kQ0PeakFraction) const;
  Status Validate() const;  // InvalidArgument naming the field
};

// What the calibration request run with group size g measured.
struct CalibrationRun {
  int group_size = 0;
  uint64_t other_bytes = 0;         // M_other(g)
  int load_queue_depth = 0;         // Q of the loads below (>= 1 when there are any)
  // Group-read service times, pooled (all reads of one g have the same size). The profiler
  // records, per read, completion minus max(first chunk issued, previous read's completion):
  // the device time this read alone accounts for.
  std::vector<float> load_seconds;
  // Fused-operator execution samples: routed rows of the group, seconds. >= 1 sample.
  std::vector<float> exec_rows, exec_seconds;
};

struct Profile {
  int n_layer = 0;                    // W: MoE layers
  int n_expert = 0;                   // E
  uint64_t expert_bytes = 0;          // W_e: arena slot bytes
  std::vector<uint64_t> record_bytes; // [W] bytes read per expert of layer w (<= W_e)
  uint32_t calib_tokens = 0;
  uint32_t n_threads = 0;             // compute threads of the calibration runs; 0: unknown
  float other_seconds = 0;            // T_other
  std::vector<float> nonexpert_seconds;  // [W] T_ne_w
  std::vector<uint32_t> expert_routes;   // [W * E] routed rows, physical order
  DiskProfile disk;
  std::vector<CalibrationRun> runs;   // strictly ascending group_size

  // nullptr when g was not calibrated.
  const CalibrationRun* Run(int g) const;
  // Sum of all layers' expert bytes: E * sum_w record_bytes[w].
  uint64_t TotalExpertBytes() const;
  // Every constraint listed in the key table above; InvalidArgument naming the field.
  Status Validate() const;
};

// The configurator's answer, as stored in the packed model.
struct ConfigChoice {
  int group_size = 0;
  int banks = 0;
  int queue_depth = 0;
  uint64_t budget_bytes = 0;
  float predicted_seconds = 0;
  Schedule schedule = Schedule::kEarly;
  uint32_t n_threads = 0;  // threads of the profile it was solved from; 0: unknown
};

// ---- GGUF metadata ----
// The key/values of a profile (all estream.profile.*). REQUIRES: profile.Validate() is OK.
std::vector<GgufKv> ProfileKvs(const Profile& profile);
// True when estream.profile.version is present (a profile is stored; it may still be invalid).
bool HasProfile(const std::vector<GgufKv>& kvs);
// Parses and validates the estream.profile.* keys of `kvs`; `source` (a file name) prefixes
// every error. Corruption for a missing/mistyped/inconsistent key, NotSupported for another
// version.
Result<Profile> ParseProfile(const std::vector<GgufKv>& kvs, std::string_view source);

std::vector<GgufKv> ConfigKvs(const ConfigChoice& choice);
bool HasConfigChoice(const std::vector<GgufKv>& kvs);
Result<ConfigChoice> ParseConfigChoice(const std::vector<GgufKv>& kvs, std::string_view source);

// ---- Thread count of a stored profile/choice ----
// The n_threads keys of `kvs` read leniently (0 when absent or not an integer: the full parsers
// above judge the rest), for a caller that already knows which of the two a run used.
struct StoredThreads {
  uint32_t profile = 0;  // estream.profile.n_threads
  uint32_t choice = 0;   // estream.config.n_threads
};
StoredThreads ReadStoredThreads(const std::vector<GgufKv>& kvs);

// One line (no trailing newline) for a run with `run_threads` compute threads that uses a stored
// profile measured with `stored_threads`:
//   "note: the stored profile was measured with 2 threads, this run uses 1; its timings are used
//    all the same (run `estream profile MODEL --budget BUDGET -t 1 --recalibrate` for a matching
//    one)"
// `model` and `budget` are put into the suggested command as given. Empty when stored_threads is
// 0 (unknown: a file profiled before the count was stored) or equals run_threads.
std::string ThreadMismatchNote(uint32_t stored_threads, int run_threads, std::string_view model,
                               std::string_view budget);

// Thins execution samples to at most `max_samples` (>= 2) for storage: sorts by rows and
// replaces each run of consecutive samples (equal counts, +-1) by its mean rows and mean
// seconds. An affine least-squares fit on the result is close to the fit on all samples (the
// spread in rows is kept, only within-bin noise is averaged). No-op when already small enough.
void CompactExecSamples(std::vector<float>* rows, std::vector<float>* seconds, size_t max_samples);

}  // namespace estream::config
