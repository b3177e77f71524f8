#include "vmem/residency.h"

#include <chrono>
#include <cmath>
#include <string>

namespace estream::vmem {
namespace {

using Clock = std::chrono::steady_clock;

// Deadline timeout_s from now; "forever" for huge or non-finite values (no clock overflow).
Clock::time_point DeadlineAfter(double timeout_s) {
  if (!(timeout_s < 1e9)) return Clock::time_point::max();
  if (timeout_s < 0) timeout_s = 0;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", s);
  return buf;
}

}  // namespace

std::string GroupName(GroupId g) {
  return "layer " + std::to_string(g.layer) + " group " + std::to_string(g.group);
}

const char* BankStateName(BankState s) {
  switch (s) {
    case BankState::kAvailable: return "Available";
    case BankState::kFilling: return "Filling";
    case BankState::kReady: return "Ready";
    case BankState::kInUse: return "InUse";
  }
  return "?";
}

Result<std::unique_ptr<ResidencyTable>> ResidencyTable::Create(const ResidencyParams& p) {
  if (p.n_layers <= 0 || p.n_expert <= 0 || p.group_size <= 0 || p.n_banks <= 0) {
    return Status::InvalidArgument("residency table: layers (" + std::to_string(p.n_layers) +
                                   "), experts (" + std::to_string(p.n_expert) + "), group size (" +
                                   std::to_string(p.group_size) + ") and banks (" +
                                   std::to_string(p.n_banks) + ") must all be >= 1");
  }
  if (!p.expert_to_position.empty()) {
    if (static_cast<int32_t>(p.expert_to_position.size()) != p.n_layers) {
      return Status::InvalidArgument("residency table: expert permutation has " +
                                     std::to_string(p.expert_to_position.size()) + " layers, expected " +
                                     std::to_string(p.n_layers));
    }
    for (int32_t l = 0; l < p.n_layers; ++l) {
      const auto& perm = p.expert_to_position[l];
      if (perm.empty()) continue;
      if (static_cast<int32_t>(perm.size()) != p.n_expert) {
        return Status::InvalidArgument("residency table: expert permutation of layer " + std::to_string(l) +
                                       " has " + std::to_string(perm.size()) + " entries, expected " +
                                       std::to_string(p.n_expert));
      }
      std::vector<bool> seen(p.n_expert, false);
      for (int32_t e = 0; e < p.n_expert; ++e) {
        if (perm[e] < 0 || perm[e] >= p.n_expert || seen[perm[e]]) {
          return Status::InvalidArgument("residency table: expert permutation of layer " + std::to_string(l) +
                                         " is not a permutation (expert " + std::to_string(e) + " -> " +
                                         std::to_string(perm[e]) + ")");
        }
        seen[perm[e]] = true;
      }
    }
  }
  return std::unique_ptr<ResidencyTable>(new ResidencyTable(p));
}

ResidencyTable::ResidencyTable(const ResidencyParams& p)
    : n_layers_(p.n_layers), n_expert_(p.n_expert), group_size_(p.group_size), n_banks_(p.n_banks),
      n_groups_((p.n_expert + p.group_size - 1) / p.group_size) {
  bool any_perm = false;
  for (const auto& perm : p.expert_to_position) any_perm |= !perm.empty();
  if (any_perm) {
    position_.resize(static_cast<size_t>(n_layers_) * n_expert_);
    expert_at_.resize(position_.size());
    for (int32_t l = 0; l < n_layers_; ++l) {
      for (int32_t e = 0; e < n_expert_; ++e) {
        const auto& perm = p.expert_to_position[l];
        const int32_t pos = perm.empty() ? e : perm[e];
        position_[static_cast<size_t>(l) * n_expert_ + e] = pos;
        expert_at_[static_cast<size_t>(l) * n_expert_ + pos] = e;
      }
    }
  }
  MutexLock lock(&mutex_);
  banks_.resize(n_banks_);
  bank_of_group_.assign(static_cast<size_t>(n_layers_) * n_groups_, -1);
  group_error_.resize(bank_of_group_.size());
  for (int32_t b = 0; b < n_banks_; ++b) free_banks_.push_back(b);
}

int32_t ResidencyTable::Position(int32_t layer, int32_t expert) const {
  ESTREAM_DCHECK(layer >= 0 && layer < n_layers_ && expert >= 0 && expert < n_expert_,
                 "ResidencyTable: (layer, expert) out of range");
  return position_.empty() ? expert : position_[static_cast<size_t>(layer) * n_expert_ + expert];
}

int32_t ResidencyTable::ExpertsInGroup(int32_t group) const {
  ESTREAM_DCHECK(group >= 0 && group < n_groups_, "ResidencyTable::ExpertsInGroup out of range");
  const int32_t first = group * group_size_;
  return std::min(group_size_, n_expert_ - first);
}

int32_t ResidencyTable::ExpertAt(int32_t layer, int32_t group, int32_t r) const {
  const int32_t pos = group * group_size_ + r;
  ESTREAM_DCHECK(layer >= 0 && layer < n_layers_ && r >= 0 && r < group_size_ && pos < n_expert_,
                 "ResidencyTable::ExpertAt out of range");
  return expert_at_.empty() ? pos : expert_at_[static_cast<size_t>(layer) * n_expert_ + pos];
}

Status ResidencyTable::CheckTicketLocked(BankTicket t, const char* op,
                                         std::initializer_list<BankState> allowed) const {
  if (t.bank < 0 || t.bank >= n_banks_) {
    return Status::InvalidArgument(std::string("residency ") + op + ": bank " + std::to_string(t.bank) +
                                   " out of range (" + std::to_string(n_banks_) + " banks)");
  }
  const BankEntry& e = banks_[t.bank];
  if (e.generation != t.generation || e.state == BankState::kAvailable) {
    return Status::Internal(std::string("residency ") + op + ": stale ticket for bank " +
                            std::to_string(t.bank) + " (generation " + std::to_string(t.generation) +
                            ", bank now " + BankStateName(e.state) + " generation " +
                            std::to_string(e.generation) + ")");
  }
  for (BankState s : allowed) {
    if (e.state == s) return Status::Ok();
  }
  std::string want;
  for (BankState s : allowed) want += std::string(want.empty() ? "" : " or ") + BankStateName(s);
  return Status::Internal(std::string("residency ") + op + ": bank " + std::to_string(t.bank) + " (" +
                          GroupName(e.group) + ") is " + BankStateName(e.state) + ", expected " + want);
}

void ResidencyTable::FreeLocked(int32_t b) {
  BankEntry& e = banks_[b];
  ESTREAM_CHECK(e.refs == 0, "residency: freeing a bank that is still referenced");
  ESTREAM_CHECK(bank_of_group_[GroupIndex(e.group)] == b, "residency: group -> bank map out of sync");
  bank_of_group_[GroupIndex(e.group)] = -1;
  e = BankEntry{.generation = e.generation};
  free_banks_.push_back(b);
  ++stats_.frees;
  changed_.SignalAll();
}

Result<BankTicket> ResidencyTable::Reserve(GroupId g, uint64_t owner, double timeout_s) {
  if (!ValidGroup(g)) {
    return Status::InvalidArgument("residency Reserve: " + GroupName(g) + " out of range (" +
                                   std::to_string(n_layers_) + " layers, " + std::to_string(n_groups_) +
                                   " groups per layer)");
  }
  const auto deadline = DeadlineAfter(timeout_s);
  MutexLock lock(&mutex_);
  const size_t gi = GroupIndex(g);
  if (const int32_t held = bank_of_group_[gi]; held >= 0) {
    return Status::InvalidArgument("residency Reserve: " + GroupName(g) + " is already in bank " +
                                   std::to_string(held) + " (" + BankStateName(banks_[held].state) + ")");
  }
  for (bool timed_out = false; free_banks_.empty(); timed_out = !changed_.WaitUntil(deadline)) {
    if (timed_out) {
      return Status::ResourceExhausted("residency Reserve: no bank became available for " + GroupName(g) +
                                       " within " + Seconds(timeout_s) + "; banks:\n" + DebugStringLocked());
    }
    // Someone else may have reserved g while we waited.
    if (const int32_t held = bank_of_group_[gi]; held >= 0) {
      return Status::InvalidArgument("residency Reserve: " + GroupName(g) + " is already in bank " +
                                     std::to_string(held) + " (" + BankStateName(banks_[held].state) + ")");
    }
  }
  const int32_t b = free_banks_.front();
  free_banks_.pop_front();
  BankEntry& e = banks_[b];
  ESTREAM_CHECK(e.state == BankState::kAvailable && e.refs == 0, "residency: free list holds a busy bank");
  e.state = BankState::kFilling;
  e.group = g;
  e.owner = owner;
  e.generation = next_generation_++;
  bank_of_group_[gi] = b;
  group_error_[gi] = Status::Ok();
  ++stats_.reserves;
  changed_.SignalAll();
  return BankTicket{b, e.generation};
}

Status ResidencyTable::Publish(BankTicket t) {
  MutexLock lock(&mutex_);
  ESTREAM_RETURN_IF_ERROR(CheckTicketLocked(t, "Publish", {BankState::kFilling}));
  banks_[t.bank].state = BankState::kReady;
  ++stats_.publishes;
  changed_.SignalAll();
  return Status::Ok();
}

Status ResidencyTable::AbortFill(BankTicket t, Status why) {
  MutexLock lock(&mutex_);
  ESTREAM_RETURN_IF_ERROR(CheckTicketLocked(t, "AbortFill", {BankState::kFilling}));
  group_error_[GroupIndex(banks_[t.bank].group)] = std::move(why);
  ++stats_.aborts;
  FreeLocked(t.bank);
  return Status::Ok();
}

Status ResidencyTable::Acquire(BankTicket t, int32_t n_work) {
  if (n_work < 1) return Status::InvalidArgument("residency Acquire: n_work " + std::to_string(n_work) + " < 1");
  MutexLock lock(&mutex_);
  ESTREAM_RETURN_IF_ERROR(CheckTicketLocked(t, "Acquire", {BankState::kReady, BankState::kInUse}));
  BankEntry& e = banks_[t.bank];
  e.state = BankState::kInUse;
  e.refs += n_work;
  ++stats_.acquires;
  return Status::Ok();
}

void ResidencyTable::Complete(BankTicket t) {
  MutexLock lock(&mutex_);
  const Status s = CheckTicketLocked(t, "Complete", {BankState::kInUse});
  ESTREAM_CHECK(s.ok(), s.message().c_str());
  BankEntry& e = banks_[t.bank];
  ESTREAM_CHECK(e.refs > 0, "residency Complete: InUse bank without references");
  ++stats_.completions;
  if (--e.refs > 0) return;
  if (e.kept) {
    e.state = BankState::kReady;  // the expert cache: the mapping stays visible
    changed_.SignalAll();
  } else {
    FreeLocked(t.bank);
  }
}

Status ResidencyTable::Keep(BankTicket t, bool keep) {
  MutexLock lock(&mutex_);
  ESTREAM_RETURN_IF_ERROR(CheckTicketLocked(t, "Keep", {BankState::kReady, BankState::kInUse}));
  banks_[t.bank].kept = keep;
  return Status::Ok();
}

Status ResidencyTable::Release(BankTicket t) {
  MutexLock lock(&mutex_);
  ESTREAM_RETURN_IF_ERROR(CheckTicketLocked(t, "Release", {BankState::kReady}));
  ++stats_.releases;
  FreeLocked(t.bank);
  return Status::Ok();
}

Result<BankTicket> ResidencyTable::WaitReady(GroupId g, double timeout_s) {
  return AcquireWhenReady(g, 0, timeout_s);
}

Result<BankTicket> ResidencyTable::AcquireWhenReady(GroupId g, int32_t n_work, double timeout_s) {
  if (!ValidGroup(g)) {
    return Status::InvalidArgument("residency WaitReady: " + GroupName(g) + " out of range");
  }
  if (n_work < 0) return Status::InvalidArgument("residency AcquireWhenReady: n_work < 0");
  const auto deadline = DeadlineAfter(timeout_s);
  const size_t gi = GroupIndex(g);
  MutexLock lock(&mutex_);
  for (bool timed_out = false;; timed_out = !changed_.WaitUntil(deadline)) {
    const int32_t b = bank_of_group_[gi];
    if (b >= 0 && (banks_[b].state == BankState::kReady || banks_[b].state == BankState::kInUse)) {
      BankEntry& e = banks_[b];
      if (n_work > 0) {
        e.state = BankState::kInUse;
        e.refs += n_work;
        ++stats_.acquires;
      }
      return BankTicket{b, e.generation};
    }
    if (b < 0 && !group_error_[gi].ok()) return group_error_[gi];
    if (timed_out) {
      return Status::Internal("residency WaitReady: " + GroupName(g) + " not ready within " + Seconds(timeout_s) +
                              " (" + (b >= 0 ? "Filling in bank " + std::to_string(b) : std::string("not reserved")) +
                              "); banks:\n" + DebugStringLocked());
    }
  }
}

Status ResidencyTable::WaitIdle(double timeout_s) {
  const auto deadline = DeadlineAfter(timeout_s);
  MutexLock lock(&mutex_);
  auto busy = [&]() ESTREAM_REQUIRES(mutex_) {
    for (const BankEntry& e : banks_) {
      if (e.state == BankState::kFilling || e.state == BankState::kInUse) return true;
    }
    return false;
  };
  for (bool timed_out = false; busy(); timed_out = !changed_.WaitUntil(deadline)) {
    if (timed_out) {
      return Status::Internal("residency WaitIdle: banks still busy after " + Seconds(timeout_s) + ":\n" +
                              DebugStringLocked());
    }
  }
  return Status::Ok();
}

int32_t ResidencyTable::ReleaseAllReady() {
  MutexLock lock(&mutex_);
  int32_t n = 0;
  for (int32_t b = 0; b < n_banks_; ++b) {
    if (banks_[b].state == BankState::kReady && !banks_[b].kept) {
      ++stats_.releases;
      FreeLocked(b);
      ++n;
    }
  }
  return n;
}

int32_t ResidencyTable::SlotOf(int32_t layer, int32_t expert) const {
  const int32_t pos = Position(layer, expert);
  const GroupId g{layer, pos / group_size_};
  MutexLock lock(&mutex_);
  const int32_t b = bank_of_group_[GroupIndex(g)];
  if (b < 0) return -1;
  const BankState s = banks_[b].state;
  if (s != BankState::kReady && s != BankState::kInUse) return -1;  // hidden while Filling
  return b * group_size_ + pos % group_size_;
}

void ResidencyTable::SlotsOfLayer(int32_t layer, int32_t* slot_of_expert) const {
  ESTREAM_CHECK(layer >= 0 && layer < n_layers_, "ResidencyTable::SlotsOfLayer: layer out of range");
  MutexLock lock(&mutex_);
  for (int32_t e = 0; e < n_expert_; ++e) {
    const int32_t pos = Position(layer, e);
    const int32_t b = bank_of_group_[GroupIndex({layer, pos / group_size_})];
    const bool visible = b >= 0 && (banks_[b].state == BankState::kReady || banks_[b].state == BankState::kInUse);
    slot_of_expert[e] = visible ? b * group_size_ + pos % group_size_ : -1;
  }
}

std::optional<BankTicket> ResidencyTable::Find(GroupId g) const {
  if (!ValidGroup(g)) return std::nullopt;
  MutexLock lock(&mutex_);
  const int32_t b = bank_of_group_[GroupIndex(g)];
  if (b < 0) return std::nullopt;
  return BankTicket{b, banks_[b].generation};
}

std::optional<BankState> ResidencyTable::StateOf(GroupId g) const {
  if (!ValidGroup(g)) return std::nullopt;
  MutexLock lock(&mutex_);
  const int32_t b = bank_of_group_[GroupIndex(g)];
  if (b < 0) return std::nullopt;
  return banks_[b].state;
}

BankInfo ResidencyTable::Bank(int32_t bank) const {
  ESTREAM_CHECK(bank >= 0 && bank < n_banks_, "ResidencyTable::Bank out of range");
  MutexLock lock(&mutex_);
  const BankEntry& e = banks_[bank];
  return BankInfo{e.state, e.group, e.owner, e.generation, e.refs, e.kept};
}

int32_t ResidencyTable::CountInState(BankState s) const {
  MutexLock lock(&mutex_);
  int32_t n = 0;
  for (const BankEntry& e : banks_) n += e.state == s;
  return n;
}

int32_t ResidencyTable::CountKept() const {
  MutexLock lock(&mutex_);
  int32_t n = 0;
  for (const BankEntry& e : banks_) n += e.kept;
  return n;
}

ResidencyStats ResidencyTable::stats() const {
  MutexLock lock(&mutex_);
  return stats_;
}

std::string ResidencyTable::DebugString() const {
  MutexLock lock(&mutex_);
  return DebugStringLocked();
}

std::string ResidencyTable::DebugStringLocked() const {
  std::string out;
  for (int32_t b = 0; b < n_banks_; ++b) {
    const BankEntry& e = banks_[b];
    out += "  bank " + std::to_string(b) + ": " + BankStateName(e.state);
    if (e.state != BankState::kAvailable) {
      out += " " + GroupName(e.group) + " refs " + std::to_string(e.refs) + " owner " + std::to_string(e.owner);
      if (e.kept) out += " kept";
    }
    out += " gen " + std::to_string(e.generation) + "\n";
  }
  return out;
}

Status ResidencyTable::CheckInvariants() const {
  MutexLock lock(&mutex_);
  return CheckInvariantsLocked();
}

Status ResidencyTable::CheckInvariantsLocked() const {
  auto fail = [&](int32_t b, const std::string& what) ESTREAM_REQUIRES(mutex_) {
    return Status::Internal("residency invariant: bank " + std::to_string(b) + " " + what + "; banks:\n" +
                            DebugStringLocked());
  };
  std::vector<int32_t> free_count(n_banks_, 0);
  for (int32_t b : free_banks_) {
    if (b < 0 || b >= n_banks_) return fail(b, "in the free list is out of range");
    ++free_count[b];
  }
  int32_t mapped = 0;
  for (int32_t b = 0; b < n_banks_; ++b) {
    const BankEntry& e = banks_[b];
    const bool available = e.state == BankState::kAvailable;
    if (free_count[b] != (available ? 1 : 0)) return fail(b, "appears " + std::to_string(free_count[b]) + " times in the free list");
    if ((e.refs > 0) != (e.state == BankState::kInUse) || e.refs < 0) {
      return fail(b, "has " + std::to_string(e.refs) + " references in state " + BankStateName(e.state));
    }
    if (e.kept && e.state != BankState::kReady && e.state != BankState::kInUse)
      return fail(b, std::string("is kept in state ") + BankStateName(e.state));
    if (available) {
      if (e.group.layer != -1 || e.group.group != -1) return fail(b, "is Available but names " + GroupName(e.group));
      continue;
    }
    if (!ValidGroup(e.group)) return fail(b, "holds invalid " + GroupName(e.group));
    if (bank_of_group_[GroupIndex(e.group)] != b) return fail(b, "holds " + GroupName(e.group) + " but the map disagrees");
    ++mapped;
  }
  int32_t map_entries = 0;
  for (size_t gi = 0; gi < bank_of_group_.size(); ++gi) {
    const int32_t b = bank_of_group_[gi];
    if (b < -1 || b >= n_banks_) return fail(b, "in the group map is out of range");
    if (b >= 0) {
      ++map_entries;
      if (banks_[b].state == BankState::kAvailable) return fail(b, "is Available but still mapped");
    }
  }
  if (map_entries != mapped) {
    return fail(-1, "group map has " + std::to_string(map_entries) + " entries for " + std::to_string(mapped) + " held banks");
  }
  return Status::Ok();
}

}  // namespace estream::vmem
