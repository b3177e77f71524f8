#include "pipeline/expert_stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "base/check.h"
#include "base/timer.h"

namespace estream::pipeline {

Result<std::unique_ptr<ExpertStreamer>> ExpertStreamer::Create(const StreamParams& p) {
  if (!p.layout || p.layout->layers.empty())
    return Status::InvalidArgument("ExpertStreamer: a packed layout with at least one MoE layer is required");
  if (p.group_size < 1 || p.n_banks < 1 || p.queue_depth < 1 || p.cache_banks < 0)
    return Status::InvalidArgument(fmt::format("group size {}, banks {} and queue depth {} must all be >= 1 and "
                                               "cache banks {} >= 0", p.group_size, p.n_banks, p.queue_depth,
                                               p.cache_banks));
  std::unique_ptr<ExpertStreamer> s(new ExpertStreamer(p));
  s->rng_.seed(p.seed);
  const io::PackedModelInfo& L = *p.layout;
  if (p.group_size > L.n_expert)
    return Status::InvalidArgument(fmt::format("group size {} is larger than the {} experts of a layer",
                                               p.group_size, L.n_expert));
  if (p.file) {
    s->file_ = p.file;
  } else {
    ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<io::PosixFile> f, io::PosixFile::Open(L.file, {.direct = true}));
    s->owned_file_ = std::move(f);
    s->file_ = s->owned_file_.get();
  }
  uint64_t stride = 0;
  vmem::ResidencyParams rp{.n_layers = static_cast<int32_t>(L.layers.size()), .n_expert = L.n_expert,
                           .group_size = p.group_size, .n_banks = p.n_banks + p.cache_banks};
  for (const io::PackedLayerInfo& li : L.layers) {
    stride = std::max(stride, li.record_bytes);
    rp.expert_to_position.push_back(li.physical_of);
  }
  ESTREAM_ASSIGN_OR_RETURN(s->arena_, vmem::Arena::Create({.n_banks = static_cast<size_t>(p.n_banks + p.cache_banks),
                                                           .group_size = static_cast<size_t>(p.group_size),
                                                           .slot_bytes = static_cast<size_t>(stride),
                                                           .prefault = p.prefault_arena}));
  ESTREAM_ASSIGN_OR_RETURN(s->table_, vmem::ResidencyTable::Create(rp));
  ESTREAM_ASSIGN_OR_RETURN(s->loader_, io::Loader::Create({.backend = p.backend, .queue_depth = p.queue_depth,
                                                           .chunk_bytes = p.chunk_bytes}));
  {
    MutexLock lock(&s->mutex_);
    s->planned_.assign(L.layers.size() * s->table_->n_groups(), 0);
    s->score_.assign(s->planned_.size(), 0.0);
    s->pass_routes_.assign(s->planned_.size(), 0.0);
  }
  s->feeder_ = std::thread([raw = s.get()] { raw->FeederLoop(); });
  return s;
}

ExpertStreamer::~ExpertStreamer() {
  if (feeder_.joinable()) {
    (void)EndRequest();
    {
      MutexLock lock(&mutex_);
      stop_ = true;
      cv_.SignalAll();
    }
    feeder_.join();
  }
  loader_.reset();  // drains reads before the arena goes away
}

std::string ExpertStreamer::GroupLabel(vmem::GroupId g) const {
  const io::PackedLayerInfo& li = params_.layout->layers[g.layer];
  const int G = params_.group_size;
  const int n = li.GroupRecords(g.group, G);
  std::string experts;
  for (int r = 0; r < n && r < 16; ++r) experts += (r ? "," : "") + std::to_string(li.permutation[g.group * G + r]);
  if (n > 16) experts += ",...";
  return fmt::format("{}: layer {} group {} (experts {}; file offset {}, {} bytes)", li.file, li.layer, g.group,
                     experts, li.GroupOffset(g.group, G), li.GroupBytes(g.group, G));
}

const uint8_t* ExpertStreamer::RecordAddress(const GroupLease& lease, int expert) const {
  const io::PackedLayerInfo& li = params_.layout->layers[lease.layer];
  const int p = li.physical_of[expert];
  ESTREAM_DCHECK(p / params_.group_size == lease.group, "RecordAddress: expert not in the leased group");
  return arena_->Record(lease.bank, p % params_.group_size, li.record_bytes);
}

void ExpertStreamer::BeginRequest() {
  MutexLock lock(&mutex_);
  stats_ = {};
  last_read_end_ = 0;
  ++request_;
  failed_.clear();
  std::fill(planned_.begin(), planned_.end(), 0);
}

void ExpertStreamer::PlanLocked(vmem::GroupId g) {
  uint8_t& p = planned_[Key(g)];
  if (p) return;
  p = 1;
  if (auto it = kept_.find(Key(g)); it != kept_.end()) {
    // A hit of the expert cache: published already, nothing to read.
    pending_[Key(g)] = Pending{.ticket = it->second, .reading = false, .cached = true};
  } else {
    plan_.push_back(g);
  }
  cv_.SignalAll();
}

void ExpertStreamer::CountUseLocked(vmem::GroupId g, bool cached) {
  const int n = table_->ExpertsInGroup(g.group);
  ++stats_.groups_used;
  stats_.records_used += n;
  if (cached) stats_.records_cached += n;
}

void ExpertStreamer::MaybeKeepLocked(vmem::GroupId g, vmem::BankTicket t) {
  if (params_.cache_banks <= 0 || kept_.count(Key(g))) return;
  if (static_cast<int>(kept_.size()) >= params_.cache_banks) {
    // The lowest-scoring kept group that the running request neither holds nor has planned
    // (ties: the later one); g replaces it only with a strictly higher score.
    int64_t victim = -1;
    for (const auto& [key, kt] : kept_) {
      if (pending_.count(key) || table_->Bank(kt.bank).state != vmem::BankState::kReady) continue;
      if (victim < 0 || score_[key] < score_[victim] || (score_[key] == score_[victim] && key > victim)) victim = key;
    }
    if (victim < 0 || !(score_[Key(g)] > score_[victim])) return;
    const Status s = table_->Release(kept_[victim]);
    ESTREAM_CHECK(s.ok(), s.message().c_str());
    kept_.erase(victim);
  }
  const Status s = table_->Keep(t, true);
  ESTREAM_CHECK(s.ok(), s.message().c_str());
  kept_[Key(g)] = t;
}

int ExpertStreamer::kept_groups() const {
  MutexLock lock(&mutex_);
  return static_cast<int>(kept_.size());
}

void ExpertStreamer::LayerStart(int layer) {
  if (params_.schedule != Schedule::kEarly) return;
  MutexLock lock(&mutex_);
  for (int q = 0; q < table_->n_groups(); ++q) PlanLocked({layer, q});
}

void ExpertStreamer::DiscardLocked(vmem::GroupId g) {
  auto it = std::find(plan_.begin(), plan_.end(), g);
  if (it != plan_.end()) {
    plan_.erase(it);
    ++stats_.groups_skipped;
    return;
  }
  auto pit = pending_.find(Key(g));
  if (pit == pending_.end()) return;  // never planned, or being reserved (the feeder rechecks)
  Pending& pe = pit->second;
  if (pe.cached) {  // a kept group found inactive: it stays in the cache
    pending_.erase(pit);
    cv_.SignalAll();
    return;
  }
  if (pe.discard) return;
  pe.discard = true;
  ++stats_.groups_cancelled;
  if (pe.reading) {
    // The completion (cancelled, or ok if too late to cancel) reaches FinishRead, which aborts
    // the fill instead of publishing it. Job 0: Submit has not returned; the feeder cancels.
    if (pe.job != 0) (void)loader_->Cancel(pe.job);
  } else {
    Status s = table_->Release(pe.ticket);
    ESTREAM_CHECK(s.ok(), s.message().c_str());
    pending_.erase(pit);
    cv_.SignalAll();
  }
}

void ExpertStreamer::RoutingKnown(int layer, const std::vector<uint8_t>& active, const std::vector<int64_t>* routes) {
  ESTREAM_CHECK(static_cast<int>(active.size()) == table_->n_groups(), "RoutingKnown: one flag per group");
  ESTREAM_CHECK(!routes || static_cast<int>(routes->size()) == table_->n_groups(), "RoutingKnown: one count per group");
  MutexLock lock(&mutex_);
  for (int q = 0; q < table_->n_groups(); ++q)
    pass_routes_[Key({layer, q})] += routes ? static_cast<double>((*routes)[q]) : (active[q] ? 1.0 : 0.0);
  switch (params_.schedule) {
    case Schedule::kOnDemand: break;
    case Schedule::kAfterRouting:
      for (int q = 0; q < table_->n_groups(); ++q)
        if (active[q]) PlanLocked({layer, q});
      break;
    case Schedule::kEarly:
      for (int q = 0; q < table_->n_groups(); ++q) {
        if (active[q]) PlanLocked({layer, q});  // (planned already by LayerStart)
        else DiscardLocked({layer, q});
      }
      if (layer + 1 < table_->n_layers())
        for (int q = 0; q < table_->n_groups(); ++q) PlanLocked({layer + 1, q});
      break;
  }
}

Result<GroupLease> ExpertStreamer::AcquireGroup(int layer, int group) {
  const vmem::GroupId g{layer, group};
  const double t0 = NowSeconds();
  Status failed;
  {
    // Wait for this request's fill of g: published, or failed.
    MutexLock lock(&mutex_);
    if (params_.schedule == Schedule::kOnDemand) PlanLocked(g);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(params_.wait_timeout_s * 1000));
    for (;;) {
      if (auto it = failed_.find(Key(g)); it != failed_.end()) {
        failed = it->second;
        break;
      }
      const std::optional<vmem::BankState> st = table_->StateOf(g);
      if (st && (*st == vmem::BankState::kReady || *st == vmem::BankState::kInUse)) break;
      if (!cv_.WaitUntil(deadline) && std::chrono::steady_clock::now() >= deadline) {
        failed = Status::Internal("ExpertStreamer: waited too long for " + GroupLabel(g) + ":\n" + table_->DebugString());
        break;
      }
    }
  }
  Result<vmem::BankTicket> t = failed.ok() ? table_->AcquireWhenReady(g, 1, params_.wait_timeout_s)
                                           : Result<vmem::BankTicket>(failed);
  const double t1 = NowSeconds();
  {
    MutexLock lock(&mutex_);
    stats_.bubble_s += t1 - t0;
    if (t.ok()) {
      auto it = pending_.find(Key(g));
      CountUseLocked(g, it != pending_.end() && it->second.cached);
      if (it != pending_.end()) pending_.erase(it);
    }
    cv_.SignalAll();
  }
  if (params_.trace && t1 - t0 > 1e-6)
    params_.trace->Add({.name = fmt::format("wait L{} g{}", params_.layout->layers[layer].layer, group),
                        .category = "bubble", .tid = kComputeTid, .start_s = t0, .dur_s = t1 - t0,
                        .args = {{"layer", params_.layout->layers[layer].layer}, {"group", group}},
                        .step = TraceStep::kWait});
  if (!t.ok()) return t.status();
  return GroupLease{.ticket = *t, .layer = layer, .group = group, .bank = t->bank};
}

std::optional<GroupLease> ExpertStreamer::TryAcquireGroup(int layer, int group) {
  const vmem::GroupId g{layer, group};
  MutexLock lock(&mutex_);
  if (failed_.count(Key(g))) return std::nullopt;
  const std::optional<vmem::BankState> st = table_->StateOf(g);
  if (!st || (*st != vmem::BankState::kReady && *st != vmem::BankState::kInUse)) return std::nullopt;
  // Published and not releasable meanwhile (only inactive groups are released): cannot wait.
  Result<vmem::BankTicket> t = table_->AcquireWhenReady(g, 1, 0);
  if (!t.ok()) return std::nullopt;
  auto it = pending_.find(Key(g));
  CountUseLocked(g, it != pending_.end() && it->second.cached);
  if (it != pending_.end()) pending_.erase(it);
  return GroupLease{.ticket = *t, .layer = layer, .group = group, .bank = t->bank};
}

void ExpertStreamer::ReleaseGroup(const GroupLease& lease) {
  MutexLock lock(&mutex_);
  MaybeKeepLocked({lease.layer, lease.group}, lease.ticket);
  table_->Complete(lease.ticket);
  cv_.SignalAll();  // a bank may be Available now
}

Status ExpertStreamer::EndRequest() {
  MutexLock lock(&mutex_);
  for (size_t i = 0; i < score_.size(); ++i) {  // the expert cache's scores (see the header)
    score_[i] = score_[i] * kCacheScoreDecay + pass_routes_[i];
    pass_routes_[i] = 0;
  }
  stats_.groups_skipped += static_cast<int64_t>(plan_.size());
  plan_.clear();
  std::vector<vmem::GroupId> held;
  for (const auto& [key, pe] : pending_)
    held.push_back({static_cast<int32_t>(key / table_->n_groups()), static_cast<int32_t>(key % table_->n_groups())});
  for (vmem::GroupId g : held) DiscardLocked(g);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(params_.wait_timeout_s * 1000));
  while (!pending_.empty() || !completed_.empty() || feeder_busy_) {
    if (!cv_.WaitUntil(deadline) && std::chrono::steady_clock::now() >= deadline)
      return Status::Internal("ExpertStreamer::EndRequest: fills did not finish in time:\n" + table_->DebugString());
  }
  (void)table_->ReleaseAllReady();
  return table_->WaitIdle(params_.wait_timeout_s);
}

StreamStats ExpertStreamer::stats() const {
  MutexLock lock(&mutex_);
  return stats_;
}

void ExpertStreamer::FeederLoop() {
  MutexLock lock(&mutex_);
  while (!stop_) {
    if (!completed_.empty()) {
      Completed c = std::move(completed_.front());
      completed_.pop_front();
      feeder_busy_ = 1;
      mutex_.Unlock();
      FinishRead(std::move(c));
      mutex_.Lock();
      feeder_busy_ = 0;
      cv_.SignalAll();
      continue;
    }
    if (!plan_.empty() && table_->CountInState(vmem::BankState::kAvailable) > 0) {
      const vmem::GroupId g = plan_.front();
      plan_.pop_front();
      pending_[Key(g)] = Pending{};  // visible to DiscardLocked from now on
      feeder_busy_ = 1;
      mutex_.Unlock();
      ReserveAndSubmit(g);
      mutex_.Lock();
      feeder_busy_ = 0;
      cv_.SignalAll();
      continue;
    }
    cv_.Wait();
  }
}

void ExpertStreamer::ReserveAndSubmit(vmem::GroupId g) {
  if (params_.max_feeder_delay_s_for_testing > 0) {
    std::uniform_real_distribution<double> u(0, params_.max_feeder_delay_s_for_testing);
    std::this_thread::sleep_for(std::chrono::duration<double>(u(rng_)));
  }
  uint64_t owner;
  {
    MutexLock lock(&mutex_);
    auto it = pending_.find(Key(g));
    if (it->second.discard) {  // found inactive before we got to it
      pending_.erase(it);
      cv_.SignalAll();
      return;
    }
    owner = request_;
  }
  // Only this thread reserves, and a bank was Available: Reserve cannot wait.
  Result<vmem::BankTicket> t = table_->Reserve(g, owner, params_.wait_timeout_s);
  ESTREAM_CHECK(t.ok(), t.status().message().c_str());
  {
    MutexLock lock(&mutex_);
    auto it = pending_.find(Key(g));
    it->second.ticket = *t;
    if (it->second.discard) {
      Status s = table_->AbortFill(*t, Status::Ok());
      ESTREAM_CHECK(s.ok(), s.message().c_str());
      pending_.erase(it);
      cv_.SignalAll();
      return;
    }
  }
  const io::PackedLayerInfo& li = params_.layout->layers[g.layer];
  io::ReadRequest req;
  req.file = file_;
  req.offset = li.GroupOffset(g.group, params_.group_size);
  req.length = li.GroupBytes(g.group, params_.group_size);
  req.dst = arena_->Bank(t->bank);
  req.dst_capacity = arena_->bank_bytes();
  req.label = fmt::format("layer {} group {}", li.layer, g.group);
  req.done = [this, g, ticket = *t](const io::ReadResult& r) {
    MutexLock lock(&mutex_);
    completed_.push_back({g, ticket, r});
    cv_.SignalAll();
  };
  Result<uint64_t> id = loader_->Submit(std::move(req));
  MutexLock lock(&mutex_);
  auto it = pending_.find(Key(g));
  if (!id.ok()) {
    // A range outside the file (truncated or replaced since it was opened), misalignment.
    Status s = table_->AbortFill(*t, Status(id.status().code(), GroupLabel(g) + ": " + id.status().message()));
    ESTREAM_CHECK(s.ok(), s.message().c_str());
    if (it != pending_.end()) pending_.erase(it);
    cv_.SignalAll();
    return;
  }
  if (it != pending_.end()) {
    it->second.job = *id;
    if (it->second.discard) (void)loader_->Cancel(*id);
  }
}

Status ExpertStreamer::VerifyGroup(vmem::GroupId g, int bank) const {
  const io::PackedLayerInfo& li = params_.layout->layers[g.layer];
  const int G = params_.group_size;
  for (int r = 0; r < li.GroupRecords(g.group, G); ++r)
    ESTREAM_RETURN_IF_ERROR(io::VerifyRecord(li, g.group * G + r, arena_->Record(bank, r, li.record_bytes)));
  return Status::Ok();
}

void ExpertStreamer::FinishRead(Completed c) {
  const io::ReadResult& r = c.result;
  const io::PackedLayerInfo& li = params_.layout->layers[c.group.layer];
  bool discard;
  {
    MutexLock lock(&mutex_);
    auto it = pending_.find(Key(c.group));
    discard = it == pending_.end() || it->second.discard;
    if (r.outcome == io::ReadOutcome::kOk) {
      ++stats_.groups_read;
      stats_.bytes_read += r.bytes_read;
      const double begin = std::max(r.start_s, last_read_end_);
      if (r.end_s > begin) stats_.read_busy_s += r.end_s - begin;
      last_read_end_ = std::max(last_read_end_, r.end_s);
    }
  }
  if (params_.trace && r.start_s > 0)
    params_.trace->Add({.name = fmt::format("read L{} g{}", li.layer, c.group.group), .category = "read",
                        .tid = kLoaderTid, .start_s = r.start_s, .dur_s = r.end_s - r.start_s,
                        .args = {{"layer", li.layer}, {"group", c.group.group},
                                 {"bytes", static_cast<int64_t>(r.bytes_read)},
                                 {"ok", r.outcome == io::ReadOutcome::kOk}},
                        .step = TraceStep::kRead});
  Status outcome;
  if (r.outcome == io::ReadOutcome::kFailed) {
    outcome = Status(r.status.code(), GroupLabel(c.group) + ": " + r.status.message());
  } else if (r.outcome == io::ReadOutcome::kOk && !discard && params_.verify_checksums) {
    const double t0 = NowSeconds();
    outcome = VerifyGroup(c.group, c.ticket.bank);
    const double t1 = NowSeconds();
    if (params_.trace)
      params_.trace->Add({.name = fmt::format("verify L{} g{}", li.layer, c.group.group), .category = "verify",
                          .tid = kFeederTid, .start_s = t0, .dur_s = t1 - t0, .step = TraceStep::kVerify});
    MutexLock lock(&mutex_);
    stats_.verify_s += t1 - t0;
  }
  const bool publish = r.outcome == io::ReadOutcome::kOk && !discard && outcome.ok();
  Status s = publish ? table_->Publish(c.ticket) : table_->AbortFill(c.ticket, discard ? Status::Ok() : outcome);
  ESTREAM_CHECK(s.ok(), s.message().c_str());
  MutexLock lock(&mutex_);
  if (!publish && !discard && !outcome.ok()) failed_[Key(c.group)] = outcome;
  auto it = pending_.find(Key(c.group));
  if (it != pending_.end() && it->second.ticket == c.ticket) {
    if (!publish) {
      pending_.erase(it);
    } else if (it->second.discard) {
      // Found inactive while we were checking it: drop it now.
      Status rel = table_->Release(c.ticket);
      ESTREAM_CHECK(rel.ok(), rel.message().c_str());
      pending_.erase(it);
    } else {
      it->second.reading = false;
    }
  }
  cv_.SignalAll();
}

}  // namespace estream::pipeline
