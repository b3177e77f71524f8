// ExpertStreamer: the loader side of expert virtualization (docs/DESIGN.md sections 4-6) for one
// packed model: the arena of B banks x G slots, the residency table, the io_uring/pread loader,
// and a feeder thread that turns the schedule's plan into bank fills.
//
// Who does what:
//   compute thread (the engine's Run, outside OpenMP regions) calls, per request:
//     BeginRequest ... for each MoE layer l: LayerStart(l) before its attention,
//     RoutingKnown(l, active) after its router, then for every active group q in ascending
//     order AcquireGroup(l, q) -> run the group's experts from the bank -> ReleaseGroup ...
//     EndRequest (always, also after an error).
//   feeder thread (owned): takes planned groups in plan order, reserves a bank when one is
//     Available (ResidencyTable::Reserve), submits the group's read, and when the read
//     completes checks every record's checksum and publishes the bank (Filling -> Ready), or
//     aborts the fill with an error naming the layer, the expert and the file offset.
//   loader thread(s) (io::Loader): the reads themselves, at most Q chunks in flight.
//
// Schedules (what enters the plan, and when):
//   kOnDemand      AcquireGroup(l, q) plans q and waits for it: every read on the critical path.
//   kAfterRouting  RoutingKnown(l) plans layer l's active groups.
//   kEarly         LayerStart(l) plans all of layer l's groups (routing unknown yet);
//                  RoutingKnown(l) drops its inactive groups (unread ones are never read,
//                  reads in flight are cancelled, loaded ones are released) and plans all groups
//                  of layer l + 1, so reading continues into the next layer as banks free up.
// Groups are consumed in plan order, so the group the executor waits for is always the oldest
// planned one not yet consumed: a bank always frees up for it (no deadlock for any B >= 1).
//
// Expert cache (cache_banks > 0; docs/DESIGN.md section 4, "Expert cache"): the arena has
// n_banks + cache_banks banks. Up to cache_banks of them keep a group across requests (the
// table's Keep): when the executor releases a group it has run, the group is kept if fewer than
// cache_banks groups are kept, or if its routing score is higher than that of the lowest-scoring
// kept group not needed by the running request, which is then evicted. A group's score is the
// routes it received in past requests, decayed by kCacheScoreDecay per request (scores are
// updated at EndRequest, so every decision within a request compares the same figures and the
// kept set does not churn within a request). A kept group planned by a request is a hit: no read;
// it is handed to the executor as it is. At least n_banks banks are never kept, so streaming
// works exactly as without the cache (no deadlock for any n_banks >= 1), and results do not
// change (the same bytes are multiplied in the same order).
//
// Statistics per request (stats()): bubble time (compute thread waiting in AcquireGroup), bytes
// read, the loader's busy time (union of read intervals), groups read / skipped / cancelled,
// expert records of the groups used and of those found in the cache.
//
// Thread safety: the compute-thread methods must be called from one thread at a time (the
// engine serialises requests); stats() from any thread. Lock order: mutex_ before the loader's
// and the residency table's internal mutexes (never the other way round).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "estream/options.h"
#include "io/file.h"
#include "io/loader.h"
#include "pack/packed_layout.h"
#include "pipeline/trace.h"
#include "vmem/arena.h"
#include "vmem/residency.h"

namespace estream::pipeline {

struct StreamParams {
  // The packed layout (not owned; must outlive the streamer). Its layers are the MoE layers,
  // indexed 0..layers.size()-1 here ("MoE layer ordinal").
  const io::PackedModelInfo* layout = nullptr;
  // Where the records are read from: `file` if set (not owned; tests wrap it to inject faults),
  // else `layout->file` opened with O_DIRECT.
  io::File* file = nullptr;
  int group_size = 8;   // G >= 1
  int n_banks = 2;      // B >= 1: banks that stream
  int cache_banks = 0;  // C >= 0: more banks that may keep groups across requests (expert cache)
  int queue_depth = 8;  // Q >= 1
  size_t chunk_bytes = size_t{1} << 20;
  Schedule schedule = Schedule::kEarly;
  IoBackend backend = IoBackend::kAuto;
  bool verify_checksums = true;
  bool prefault_arena = true;  // the arena is resident (and counted in RSS) from the start
  double wait_timeout_s = 600;  // a wait longer than this is an Internal error (a bug)
  TraceRecorder* trace = nullptr;  // not owned; may be null
  // Tests: the feeder sleeps uniformly in [0, max] before each reservation.
  double max_feeder_delay_s_for_testing = 0;
  uint64_t seed = 1;
};

struct StreamStats {
  double bubble_s = 0;          // compute thread waiting for groups
  double read_busy_s = 0;       // union of the read intervals
  uint64_t bytes_read = 0;      // bytes of completed reads (also of groups later found inactive)
  int64_t groups_read = 0;      // reads completed
  int64_t groups_used = 0;      // groups the executor consumed
  int64_t groups_skipped = 0;   // planned, found inactive before any read started
  int64_t groups_cancelled = 0; // found inactive while reading or after reading
  double verify_s = 0;          // feeder time spent on checksums
  int64_t records_used = 0;     // expert records of the groups the executor consumed
  int64_t records_cached = 0;   // ... of those, found in the expert cache (no read)
};

// Per request, a group's cache score is multiplied by this before the request's routes are added.
constexpr double kCacheScoreDecay = 0.9;

// One group handed to the executor: the bank holding it, valid until ReleaseGroup.
struct GroupLease {
  vmem::BankTicket ticket{};
  int layer = -1;  // MoE layer ordinal
  int group = -1;
  int bank = -1;
};

class ExpertStreamer {
 public:
  // Allocates the arena (B x G slots of the largest record stride), creates the table and the
  // loader, opens the file (unless given) and starts the feeder. InvalidArgument for bad sizes;
  // IOError when the file cannot be opened; ResourceExhausted when the arena cannot be allocated.
  static Result<std::unique_ptr<ExpertStreamer>> Create(const StreamParams& params);
  ~ExpertStreamer();
  ExpertStreamer(const ExpertStreamer&) = delete;
  ExpertStreamer& operator=(const ExpertStreamer&) = delete;

  const vmem::Arena& arena() const { return *arena_; }
  const vmem::ResidencyTable& table() const { return *table_; }
  const io::Loader& loader() const { return *loader_; }
  const io::PackedModelInfo& layout() const { return *params_.layout; }
  const StreamParams& params() const { return params_; }
  int n_groups() const { return table_->n_groups(); }

  // Address of the record of logical expert `expert` of MoE layer `layer` in a leased bank.
  const uint8_t* RecordAddress(const GroupLease& lease, int expert) const;

  // ---- compute thread ----
  void BeginRequest();
  void LayerStart(int layer);
  // active[q] != 0: group q of `layer` has routes. size() == n_groups(). routes (optional,
  // size() == n_groups()): the routes of each group, the expert cache's score (active counts 1
  // per group when absent).
  void RoutingKnown(int layer, const std::vector<uint8_t>& active, const std::vector<int64_t>* routes = nullptr);
  // Waits for group q of `layer` to be published and takes a reference on it. The wait is
  // bubble time. Errors: the fill's failure (IOError/Corruption naming layer, experts and file
  // offset), Internal after wait_timeout_s.
  Result<GroupLease> AcquireGroup(int layer, int group);
  // Non-blocking: the lease of group q if it is published right now (no wait, no bubble), else
  // nullopt (also when its fill failed: AcquireGroup then reports the error). The executor uses
  // it to run several loaded groups in one operator invocation.
  std::optional<GroupLease> TryAcquireGroup(int layer, int group);
  void ReleaseGroup(const GroupLease& lease);
  // Drops everything still planned, cancels reads in flight, releases loaded banks and waits
  // until the arena is idle. The streamer is then ready for the next request. Internal on a
  // timeout (a bug).
  Status EndRequest();
  StreamStats stats() const;
  // Groups kept by the expert cache now (<= cache_banks).
  int kept_groups() const;

 private:
  struct Pending {
    vmem::BankTicket ticket{};
    uint64_t job = 0;      // loader job id, 0 until Submit returned
    bool reading = true;   // false once published
    bool discard = false;  // found inactive: cancel / release instead of publishing
    bool cached = false;   // a kept group (expert cache): never read, never released
  };
  struct Completed {
    vmem::GroupId group{};
    vmem::BankTicket ticket{};
    io::ReadResult result{};
  };

  explicit ExpertStreamer(const StreamParams& params) : params_(params) {}
  int64_t Key(vmem::GroupId g) const { return static_cast<int64_t>(g.layer) * table_->n_groups() + g.group; }
  void PlanLocked(vmem::GroupId g) ESTREAM_REQUIRES(mutex_);
  // The executor is done with g (held by `t`): keep it in the cache if it earns a place.
  void MaybeKeepLocked(vmem::GroupId g, vmem::BankTicket t) ESTREAM_REQUIRES(mutex_);
  // Records of the group held by a lease the executor just took (statistics).
  void CountUseLocked(vmem::GroupId g, bool cached) ESTREAM_REQUIRES(mutex_);
  // Drops group g from the plan or from the banks (see kEarly above).
  void DiscardLocked(vmem::GroupId g) ESTREAM_REQUIRES(mutex_);
  void FeederLoop();
  void ReserveAndSubmit(vmem::GroupId g);
  void FinishRead(Completed c);
  // Checks the checksums of the group's records in its bank.
  Status VerifyGroup(vmem::GroupId g, int bank) const;
  std::string GroupLabel(vmem::GroupId g) const;

  const StreamParams params_;
  std::unique_ptr<io::File> owned_file_;
  io::File* file_ = nullptr;
  std::unique_ptr<vmem::Arena> arena_;
  std::unique_ptr<vmem::ResidencyTable> table_;
  std::unique_ptr<io::Loader> loader_;

  // mutex_ guards the plan, the pending fills, the completion queue, the statistics and the
  // stop flag; cv_ wakes the feeder (plan, completion, a bank freed, stop) and EndRequest
  // (pending fills gone).
  mutable Mutex mutex_;
  CondVar cv_{&mutex_};
  std::deque<vmem::GroupId> plan_ ESTREAM_GUARDED_BY(mutex_);
  std::vector<uint8_t> planned_ ESTREAM_GUARDED_BY(mutex_);     // [layers x groups]: entered the plan this request
  std::unordered_map<int64_t, Pending> pending_ ESTREAM_GUARDED_BY(mutex_);  // reserved, not yet consumed
  std::deque<Completed> completed_ ESTREAM_GUARDED_BY(mutex_);
  // Fills of this request that failed, by group key (the table keeps a group's error until its
  // next Reserve, which would hand a stale error of an earlier request to AcquireWhenReady).
  std::unordered_map<int64_t, Status> failed_ ESTREAM_GUARDED_BY(mutex_);
  // Expert cache: the kept groups by key and their tickets; per group the score and this
  // request's routes (folded into the score at EndRequest).
  std::unordered_map<int64_t, vmem::BankTicket> kept_ ESTREAM_GUARDED_BY(mutex_);
  std::vector<double> score_ ESTREAM_GUARDED_BY(mutex_);        // [layers x groups]
  std::vector<double> pass_routes_ ESTREAM_GUARDED_BY(mutex_);  // [layers x groups]
  int feeder_busy_ ESTREAM_GUARDED_BY(mutex_) = 0;  // 1 while the feeder works outside the lock
  StreamStats stats_ ESTREAM_GUARDED_BY(mutex_);
  double last_read_end_ ESTREAM_GUARDED_BY(mutex_) = 0;
  uint64_t request_ ESTREAM_GUARDED_BY(mutex_) = 0;
  bool stop_ ESTREAM_GUARDED_BY(mutex_) = false;
  std::mt19937_64 rng_;  // feeder thread only
  std::thread feeder_;
};

}  // namespace estream::pipeline
