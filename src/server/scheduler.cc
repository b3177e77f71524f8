#include "server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/check.h"
#include "server/metrics.h"

namespace estream::server {

// ---- Job --------------------------------------------------------------------------------------

bool Job::WaitFor(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_for(l, timeout, [&] { return done_; });
}

bool Job::finished() const {
  std::lock_guard<std::mutex> l(mu_);
  return done_;
}

void Job::Finish() {
  {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

// ---- JobQueue ---------------------------------------------------------------------------------

JobQueue::JobQueue(int64_t max_batch_tokens, double aging_seconds)
    : max_batch_tokens_(max_batch_tokens), aging_seconds_(aging_seconds) {
  ESTREAM_CHECK(max_batch_tokens > 0 && aging_seconds >= 0, "JobQueue: bad options");
}

double JobQueue::Key(int64_t tokens, double arrival_seconds) const {
  return arrival_seconds + aging_seconds_ * static_cast<double>(tokens) / static_cast<double>(max_batch_tokens_);
}

void JobQueue::Push(std::shared_ptr<Job> job, double arrival_seconds) {
  ESTREAM_CHECK(job && job->tokens > 0 && job->tokens <= max_batch_tokens_, "JobQueue::Push: job size out of range");
  const Job* raw = job.get();
  const int64_t tokens = job->tokens;
  auto [it, inserted] = entries_.insert(Entry{Key(tokens, arrival_seconds), next_seq_++, arrival_seconds, std::move(job)});
  ESTREAM_CHECK(inserted, "JobQueue::Push: duplicate entry");
  index_[raw] = it;
  queued_tokens_ += tokens;
}

bool JobQueue::Remove(const Job* job) {
  auto it = index_.find(job);
  if (it == index_.end()) return false;
  queued_tokens_ -= it->second->job->tokens;
  entries_.erase(it->second);
  index_.erase(it);
  return true;
}

std::vector<std::shared_ptr<Job>> JobQueue::PopBatch() {
  std::vector<std::shared_ptr<Job>> batch;
  int64_t tokens = 0;
  // Earliest arrival among the jobs skipped so far: a later job may only backfill ahead of them
  // if it arrived at most aging_seconds after it (the bound of the file comment).
  double skipped_arrival = std::numeric_limits<double>::infinity();
  for (auto it = entries_.begin(); it != entries_.end() && tokens < max_batch_tokens_;) {
    // The head always fits (Push refuses jobs over the limit).
    if (tokens + it->job->tokens <= max_batch_tokens_ && it->arrival <= skipped_arrival + aging_seconds_) {
      tokens += it->job->tokens;
      queued_tokens_ -= it->job->tokens;
      index_.erase(it->job.get());
      batch.push_back(it->job);
      it = entries_.erase(it);
    } else {
      skipped_arrival = std::min(skipped_arrival, it->arrival);
      ++it;
    }
  }
  return batch;
}

std::vector<std::shared_ptr<Job>> JobQueue::PopAll() {
  std::vector<std::shared_ptr<Job>> all;
  for (const Entry& e : entries_) all.push_back(e.job);
  entries_.clear();
  index_.clear();
  queued_tokens_ = 0;
  return all;
}

// ---- Scheduler --------------------------------------------------------------------------------

Scheduler::Scheduler(BatchRunner runner, SchedulerOptions options, Metrics* metrics)
    : runner_(std::move(runner)),
      options_(options),
      metrics_(metrics),
      queue_(options.max_batch_tokens, options.aging_seconds) {
  worker_ = std::thread([this] { WorkerLoop(); });
}

Scheduler::~Scheduler() { Stop(0); }

double Scheduler::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count();
}

Scheduler::Admit Scheduler::Submit(const std::shared_ptr<Job>& job) {
  if (job->tokens <= 0 || job->tokens > options_.max_batch_tokens) return Admit::kTooBig;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) return Admit::kStopping;
    if (static_cast<int64_t>(queue_.size()) >= options_.max_queue) return Admit::kQueueFull;
    job->submitted = std::chrono::steady_clock::now();
    queue_.Push(job, Now());
  }
  cv_.notify_all();
  return Admit::kOk;
}

void Scheduler::Cancel(const std::shared_ptr<Job>& job) {
  job->cancelled.store(true);
  bool removed;
  {
    std::lock_guard<std::mutex> l(mu_);
    removed = queue_.Remove(job.get());
  }
  if (removed) {
    job->dropped = true;
    job->Finish();
    cv_.notify_all();  // Stop may wait for the queue to drain
  }
}

size_t Scheduler::queued() const {
  std::lock_guard<std::mutex> l(mu_);
  return queue_.size();
}

int Scheduler::RetryAfterSeconds() const {
  std::lock_guard<std::mutex> l(mu_);
  if (tokens_per_second_ <= 0) return 1;
  return std::max(1, static_cast<int>(std::ceil(static_cast<double>(queue_.queued_tokens()) / tokens_per_second_)));
}

void Scheduler::Stop(double grace_seconds) {
  std::vector<std::shared_ptr<Job>> dropped;
  {
    std::unique_lock<std::mutex> l(mu_);
    if (!worker_.joinable()) return;
    stopping_ = true;
    cv_.notify_all();
    cv_.wait_for(l, std::chrono::duration<double>(std::max(0.0, grace_seconds)), [&] { return queue_.empty(); });
    dropped = queue_.PopAll();
    quit_ = true;
    abort_.store(true);
  }
  cv_.notify_all();
  for (const auto& j : dropped) {
    j->dropped = true;
    j->Finish();
  }
  worker_.join();
}

void Scheduler::WorkerLoop() {
  std::chrono::steady_clock::time_point last_end{};
  size_t last_jobs = 0;      // jobs of the last batch (0: none yet)
  size_t queued_at_end = 0;  // jobs that were queued when the last batch's engine run returned
  double linger = 0;         // how long to wait after the last batch (see "Linger" in scheduler.h)
  double gather = 0;         // longest wait for a burst (see "Bursts" in scheduler.h)
  auto after = [](std::chrono::steady_clock::time_point t, double seconds) {
    return t + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  };
  for (;;) {
    std::vector<std::shared_ptr<Job>> batch;
    {
      std::unique_lock<std::mutex> l(mu_);
      for (;;) {
        cv_.wait(l, [&] { return quit_ || !queue_.empty(); });
        if (queue_.empty()) return;  // quit_
        if (last_jobs > 1 && linger > 0 && std::chrono::steady_clock::now() < after(last_end, linger)) {
          cv_.wait_until(l, after(last_end, linger), [&] {
            return quit_ || queue_.size() >= last_jobs + queued_at_end ||
                   queue_.queued_tokens() >= options_.max_batch_tokens;
          });
        } else if (gather > 0 && options_.gather_gap_seconds > 0) {  // idle: a burst may be arriving
          const auto until = after(std::chrono::steady_clock::now(), gather);
          for (size_t seen = queue_.size(); !quit_ && queue_.queued_tokens() < options_.max_batch_tokens;
               seen = queue_.size()) {
            const auto gap_end = std::min(until, after(std::chrono::steady_clock::now(), options_.gather_gap_seconds));
            if (!cv_.wait_until(l, gap_end, [&] { return quit_ || queue_.size() != seen; })) break;  // quiet
          }
        }
        if (!queue_.empty()) break;  // else every queued job was cancelled while lingering
      }
      batch = queue_.PopBatch();
    }
    cv_.notify_all();  // Stop waits for the queue to drain

    // One engine batch: every request of every job, in job order.
    std::vector<Request> requests;
    int64_t tokens = 0;
    for (const auto& j : batch) {
      tokens += j->tokens;
      for (Request& r : j->requests) requests.push_back(std::move(r));
    }
    const auto start = std::chrono::steady_clock::now();
    const auto interrupted = [&] {
      if (abort_.load()) return true;
      for (const auto& j : batch)
        if (!j->cancelled.load()) return false;
      return true;  // nobody waits for any of it
    };
    std::vector<Result<Response>> results = runner_(requests, interrupted);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ESTREAM_CHECK(results.size() == requests.size(), "BatchRunner returned the wrong number of results");
    {
      // Before any of this batch's jobs is answered (see "Linger" in scheduler.h).
      std::lock_guard<std::mutex> l(mu_);
      queued_at_end = queue_.size();
    }

    // Streaming figures are per pass and shared by the requests of a pass: count each pass once.
    BatchObservation ob{.jobs = static_cast<int>(batch.size()), .tokens = tokens, .seconds = seconds};
    std::vector<int> seen_pass;
    for (const auto& r : results) {
      if (!r.ok() || std::find(seen_pass.begin(), seen_pass.end(), r->pass) != seen_pass.end()) continue;
      seen_pass.push_back(r->pass);
      ob.bubble_seconds += r->bubble_seconds;
      ob.expert_bytes_read += r->bytes_read;
      ob.experts_needed += r->experts_needed;
      ob.experts_cached += r->experts_cached;
      ob.expert_cache_bytes = r->config.cache_bytes;
    }
    if (metrics_) metrics_->ObserveBatch(ob);

    size_t next = 0;
    for (const auto& j : batch) {
      const size_t n = j->requests.size();
      j->results.clear();
      for (size_t i = 0; i < n; ++i) j->results.push_back(std::move(results[next + i]));
      next += n;
      j->queue_seconds = std::chrono::duration<double>(start - j->submitted).count();
      j->compute_seconds = seconds;
      j->batch_jobs = static_cast<int>(batch.size());
      if (metrics_) metrics_->ObserveJob(j->queue_seconds, seconds);
      j->Finish();
    }
    last_end = std::chrono::steady_clock::now();
    last_jobs = batch.size();
    linger = std::max(options_.linger_seconds, options_.linger_share * seconds);
    gather = options_.linger_share * seconds;
    {
      std::lock_guard<std::mutex> l(mu_);
      const double tps = seconds > 0 ? static_cast<double>(tokens) / seconds : 0;
      tokens_per_second_ = tokens_per_second_ <= 0 ? tps : 0.7 * tokens_per_second_ + 0.3 * tps;
    }
  }
}

}  // namespace estream::server
