// ResidencyTable: the software page table of the expert arena (docs/DESIGN.md section 4).
//
// It maps logical (layer, expert) to an arena slot and runs, per bank, the state machine
//
//   Available --Reserve--> Filling --Publish--> Ready --Acquire--> InUse --Complete (last)--> Available
//                             |                   |                  ^  |
//                             +--AbortFill--------+--Release-->      +--+ Acquire (more work)
//                                 (-> Available)     (-> Available)
//
//   Reserve    Available -> Filling: a bank is taken for group (layer, q); the owner (a request
//              or loader id, for diagnostics) is recorded. The group's mapping stays HIDDEN:
//              SlotOf() does not return its slots while the bytes are arriving.
//   Publish    Filling -> Ready: called only after every byte of the group arrived. From now
//              on SlotOf() returns the group's slots.
//   AbortFill  Filling -> Available: the read failed or was cancelled; the mapping was never
//              visible. A failure Status is kept for WaitReady() callers until the next Reserve
//              of that group.
//   Acquire    Ready|InUse -> InUse: n units of routed work (invocations of the fused expert
//              operator) will read the bank; its reference count grows by n.
//   Complete   one unit of work finished: the count drops by one; the LAST completion
//              invalidates the mappings and frees the bank (InUse -> Available).
//   Release    Ready -> Available: a loaded group that no work needs (found inactive after
//              routing, or evicted) is dropped directly.
//   Keep       marks a published bank (Ready or InUse) as kept (the expert cache, kept across
//              requests: docs/DESIGN.md section 4, "Expert cache"): its LAST Complete then
//              returns it to Ready with its mapping still visible instead of freeing it, and
//              ReleaseAllReady leaves it alone. A kept bank leaves only through Release
//              (eviction), which clears the mark.
//
// Invariants (checked by CheckInvariants(), and locally on every transition):
//   - no partially loaded expert is ever visible: only Ready and InUse banks are mapped;
//   - no bank is overwritten while referenced: a bank can be Reserved (and so refilled) only
//     from Available, which an InUse bank reaches only after its last Complete;
//   - a group is held by at most one bank, and a bank holds at most one group.
//
// Every fill is identified by a BankTicket (bank, generation). The generation changes at each
// Reserve, so a ticket kept past the end of its fill (a stale handle) is recognised: misuse by
// a caller that can recover (Publish of a bank that is not Filling, Release of an InUse bank,
// Acquire of a bank that is not Ready, a stale ticket) returns a non-OK Status and changes
// nothing; Complete() without matching Acquire() is a programmer error and CHECK-fails, because
// carrying on could free a bank that other work still reads.
//
// Groups: with group size G, logical expert e of layer l sits at packed position
// p = perm_l(e) (identity without a permutation), in group q = p / G at position r = p % G.
// The last group of a layer holds n_expert - q*G experts when G does not divide n_expert.
// A group in bank b puts position r in arena slot b * G + r (arena.h).
//
// Thread safety: every method may be called from any thread. One mutex guards all mutable
// state; waits (Reserve, WaitReady, AcquireWhenReady, WaitIdle) block on one condition
// variable signalled at every transition, up to a timeout, and report the whole table in the
// timeout error for diagnosis.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace estream::vmem {

struct GroupId {
  int32_t layer = -1;
  int32_t group = -1;  // q = packed position / G
  bool operator==(const GroupId&) const = default;
};
std::string GroupName(GroupId g);  // "layer 3 group 5"

enum class BankState : uint8_t { kAvailable, kFilling, kReady, kInUse };
const char* BankStateName(BankState s);

// One fill of one bank. Obtained from Reserve (or WaitReady/AcquireWhenReady); valid until the
// bank returns to Available.
struct BankTicket {
  int32_t bank = -1;
  uint64_t generation = 0;
  bool operator==(const BankTicket&) const = default;
};

// A snapshot of one bank.
struct BankInfo {
  BankState state = BankState::kAvailable;
  GroupId group{};      // {-1, -1} when Available
  uint64_t owner = 0;   // as given to Reserve
  uint64_t generation = 0;
  int32_t refs = 0;     // outstanding units of work (> 0 exactly when InUse)
  bool kept = false;    // Keep(): survives its last Complete (Ready or InUse only)
};

struct ResidencyStats {
  uint64_t reserves = 0, publishes = 0, aborts = 0, acquires = 0, completions = 0,
           releases = 0, frees = 0;  // frees: banks returned to Available by any path
};

struct ResidencyParams {
  int32_t n_layers = 0;    // MoE layers (indices 0..n_layers-1)
  int32_t n_expert = 0;    // experts per layer
  int32_t group_size = 0;  // G
  int32_t n_banks = 0;     // B
  // Optional per-layer expert permutation: expert_to_position[l][e] = packed position of expert
  // e in layer l. Empty (or an empty inner vector): identity.
  std::vector<std::vector<int32_t>> expert_to_position{};
};

class ResidencyTable {
 public:
  // InvalidArgument for non-positive sizes or a permutation that is not one.
  static Result<std::unique_ptr<ResidencyTable>> Create(const ResidencyParams& params);
  ResidencyTable(const ResidencyTable&) = delete;
  ResidencyTable& operator=(const ResidencyTable&) = delete;

  // ---- geometry (immutable, lock-free) ----
  int32_t n_layers() const { return n_layers_; }
  int32_t n_expert() const { return n_expert_; }
  int32_t group_size() const { return group_size_; }
  int32_t n_banks() const { return n_banks_; }
  int32_t n_groups() const { return n_groups_; }  // groups per layer: ceil(n_expert / G)
  // REQUIRES (DCHECK): 0 <= layer < n_layers, 0 <= expert < n_expert.
  GroupId GroupOf(int32_t layer, int32_t expert) const { return {layer, Position(layer, expert) / group_size_}; }
  int32_t PositionInGroup(int32_t layer, int32_t expert) const { return Position(layer, expert) % group_size_; }
  // Experts in group q: G, or fewer for the last one.
  int32_t ExpertsInGroup(int32_t group) const;
  // The logical expert at position r of group q in layer l (inverse permutation).
  int32_t ExpertAt(int32_t layer, int32_t group, int32_t r) const;

  // ---- transitions ----
  // Available -> Filling for group g, waiting up to timeout_s (0: no wait) for a free bank
  // (banks are handed out oldest-freed first). Errors: InvalidArgument if g is out of range or
  // already held by a bank (Filling, Ready or InUse); ResourceExhausted if no bank became
  // Available in time (the message shows every bank).
  Result<BankTicket> Reserve(GroupId g, uint64_t owner, double timeout_s);
  // Filling -> Ready: the group's slots become visible. REQUIRES: every byte arrived.
  Status Publish(BankTicket t);
  // Filling -> Available. A non-OK `why` is kept and returned to WaitReady callers for this
  // group until it is reserved again.
  Status AbortFill(BankTicket t, Status why);
  // Ready|InUse -> InUse with n_work (>= 1) more references.
  Status Acquire(BankTicket t, int32_t n_work);
  // One reference dropped; the last one invalidates the mapping and frees the bank, or, for a
  // kept bank, returns it to Ready (mapping visible). CHECK-fails on a stale ticket or a bank
  // with no references.
  void Complete(BankTicket t);
  // Ready (no references) -> Available; clears the kept mark (eviction of a kept bank).
  Status Release(BankTicket t);
  // Marks (keep = true) or unmarks a published bank (Ready or InUse) as kept; see Keep above.
  Status Keep(BankTicket t, bool keep);

  // Waits until group g is published (Ready or InUse) and returns its ticket. Returns the
  // failure Status if its fill was aborted with one, or an Internal error after timeout_s.
  Result<BankTicket> WaitReady(GroupId g, double timeout_s);
  // WaitReady + Acquire(n_work) atomically (no Release can slip in between).
  Result<BankTicket> AcquireWhenReady(GroupId g, int32_t n_work, double timeout_s);
  // Waits until no bank is Filling or InUse (between requests; before destroying the loader's
  // destination). Internal error after timeout_s.
  Status WaitIdle(double timeout_s);
  // Releases every Ready bank that is not kept; returns how many.
  int32_t ReleaseAllReady();

  // ---- queries (snapshots: may change as soon as they return) ----
  // Global arena slot s = b * G + r of (layer, expert) if its group is published (Ready or
  // InUse), else -1. Its address: arena.SlotAddress(s), or arena.Record(s / G, s % G, stride)
  // for a layer whose record stride is smaller than the arena's slot stride.
  int32_t SlotOf(int32_t layer, int32_t expert) const;
  // slot_of_expert[e] = SlotOf(layer, e) for all n_expert experts, under one lock.
  void SlotsOfLayer(int32_t layer, int32_t* slot_of_expert) const;
  // The bank holding g in any state but Available, with its ticket.
  std::optional<BankTicket> Find(GroupId g) const;
  std::optional<BankState> StateOf(GroupId g) const;
  BankInfo Bank(int32_t bank) const;
  int32_t CountInState(BankState s) const;
  int32_t CountKept() const;
  ResidencyStats stats() const;
  // One line per bank: "bank 2: InUse layer 3 group 5 refs 2 owner 7 gen 12".
  std::string DebugString() const;
  // Full consistency check of the table; Internal error naming the first violation.
  Status CheckInvariants() const;

 private:
  explicit ResidencyTable(const ResidencyParams& p);

  struct BankEntry {
    BankState state = BankState::kAvailable;
    GroupId group{};
    uint64_t owner = 0;
    uint64_t generation = 0;
    int32_t refs = 0;
    bool kept = false;
  };

  int32_t Position(int32_t layer, int32_t expert) const;
  bool ValidGroup(GroupId g) const {
    return g.layer >= 0 && g.layer < n_layers_ && g.group >= 0 && g.group < n_groups_;
  }
  size_t GroupIndex(GroupId g) const { return static_cast<size_t>(g.layer) * n_groups_ + g.group; }
  // Non-OK if t does not name the current fill of a bank in one of the `allowed` states.
  Status CheckTicketLocked(BankTicket t, const char* op, std::initializer_list<BankState> allowed) const
      ESTREAM_REQUIRES(mutex_);
  // Bank b (Filling, Ready, or InUse with no refs) -> Available; mapping invalidated.
  void FreeLocked(int32_t b) ESTREAM_REQUIRES(mutex_);
  std::string DebugStringLocked() const ESTREAM_REQUIRES(mutex_);
  Status CheckInvariantsLocked() const ESTREAM_REQUIRES(mutex_);

  // Immutable after construction.
  const int32_t n_layers_, n_expert_, group_size_, n_banks_, n_groups_;
  std::vector<int32_t> position_;  // [layer * n_expert + e] -> packed position; empty = identity
  std::vector<int32_t> expert_at_;  // inverse of position_; empty = identity

  // mutex_ guards the bank states, the group -> bank map, the free list, the per-group errors
  // and the statistics: every transition and every query reads or writes them together.
  mutable Mutex mutex_;
  // Signalled (to all) at every transition; Reserve, WaitReady and WaitIdle wait on it.
  CondVar changed_{&mutex_};
  std::vector<BankEntry> banks_ ESTREAM_GUARDED_BY(mutex_);          // [n_banks]
  std::vector<int32_t> bank_of_group_ ESTREAM_GUARDED_BY(mutex_);    // [n_layers * n_groups], -1: none
  std::vector<Status> group_error_ ESTREAM_GUARDED_BY(mutex_);       // [n_layers * n_groups]
  std::deque<int32_t> free_banks_ ESTREAM_GUARDED_BY(mutex_);        // Available banks, oldest-freed first
  uint64_t next_generation_ ESTREAM_GUARDED_BY(mutex_) = 1;
  ResidencyStats stats_ ESTREAM_GUARDED_BY(mutex_);
};

}  // namespace estream::vmem
