// The server's scheduler: one queue of jobs ordered by predicted job time with aging, one engine
// worker thread that packs the queue into batches and runs them through Engine::RunBatch.
//
// A Job is one HTTP request's work: one or more engine Requests (a list of prompts, the documents
// of a rerank) that run together in one batch. Its predicted cost is its token count (prefill time
// is close to linear in tokens at the lengths served here; the quadratic attention part is small
// next to the expert GEMMs).
//
// Order (JobQueue): a job arriving at time a (seconds) with c tokens gets the key
//     key = a + aging_seconds * c / max_batch_tokens
// and the queue is served in increasing key order (ties: arrival order). Among jobs that arrive
// together this is shortest-job-first; over time a job's size costs it at most aging_seconds of
// place in the line: the largest job allowed (c = max_batch_tokens) is served as if it had
// arrived aging_seconds later (aging_seconds = 0: first come, first served; large: pure
// shortest-job-first, which can starve long jobs).
// Bound (tested in tests/server_scheduler_test.cc): a job j can only be overtaken by a job i with
// key_i < key_j, i.e. a_i < a_j + aging_seconds * (c_j - c_i) / max_batch_tokens < a_j +
// aging_seconds. So no job that arrives more than aging_seconds after j is ever served before it,
// and j's wait is at most aging_seconds plus the time to run what was queued ahead of it at
// a_j + aging_seconds (at most max_queue jobs) plus the batch running at that moment.
//
// Batches (JobQueue::PopBatch): the job with the smallest key always goes first; then the queue is
// walked in key order and every job that still fits under max_batch_tokens joins (backfilling),
// except one that arrived more than aging_seconds after a job skipped for lack of room (so
// backfilling keeps the bound above).
// A job larger than max_batch_tokens is never queued (Scheduler::Submit: kTooBig -> HTTP 413).
//
// Threading (Scheduler): Submit/Cancel/Stop may be called from any thread (the HTTP handler
// threads); the worker thread is the only caller of the BatchRunner (the engine), so the engine
// sees one batch at a time. While a batch runs, new jobs queue up (their parsing and tokenization
// happened on the HTTP threads); when it returns the worker forms the next batch at once (a
// queue walk under the mutex, microseconds), so the engine never idles with work queued.
// Linger (convoys): clients that send their next request when the last one is answered all come
// back just after a batch ends, and the first of them would otherwise start a batch alone (under a
// budget a 1-job pass re-reads every expert, seconds, while the others queue behind it). So after
// a batch of n jobs, with m jobs queued when it returned (they arrived while it ran), the worker
// waits, up to max(linger_seconds, linger_share x that batch's run time) after its end, until
// n + m jobs are queued (or max_batch_tokens are): the clients coming back join those that
// waited, and the batch is whole again. The share: n clients answered together need time to
// read their answers and send again (64 echo-logprob answers on 2 cores: more than 0.02 s), and
// one that misses the batch costs a pass of its own later (under a budget, every active expert
// read again), so a long batch waits longer for its stragglers, at most that share of it.
// Without the m, closed-loop clients that split once into two halves (the first batch takes
// whoever arrived first, the rest queue behind it) stay split for ever: each half's batch starts
// as soon as the other's ends, and under a budget every half re-reads every expert. A
// server whose clients are all back stops lingering at once; one idle past the linger gathers a
// burst instead (below).
// Bursts: a server that is idle (past the linger, or after a batch of one job) would take the
// first request that comes alone: 64 clients starting together, or one client sending 64 requests
// at once, would split into a pass of the first few and a pass of the rest, and under a budget
// each pass reads every expert. So before such a batch the worker waits while jobs keep arriving,
// each within gather_gap_seconds of the one before, for at most linger_share x the last batch's
// run time (nothing before the first batch, whose length is unknown). A lone client's request
// waits one gap (2 ms by default, against a budgeted request's seconds).
// Completion is signalled per job (Job::Wait*); a handler that gives up (client gone, timeout)
// calls Cancel: a queued job is removed at once; a running one's result is dropped, and once every
// job of the running batch is cancelled the batch itself stops at the engine's next layer (the
// runner's `interrupted`), so the engine turns to the queue. Stop interrupts the running batch
// the same way when its grace has passed: shutdown takes at most the grace plus one layer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "estream/engine.h"

namespace estream::server {

class Metrics;

// One HTTP request's engine work and its outcome.
struct Job {
  std::vector<Request> requests;  // moved into the batch when it runs
  int64_t tokens = 0;             // predicted cost: all tokens of all requests (continuations too)

  // ---- filled by the scheduler; read by the submitter after Wait* returned true ----
  std::vector<Result<Response>> results;  // one per request, in order
  double queue_seconds = 0;               // submit -> batch start
  double compute_seconds = 0;             // the batch's RunBatch wall time
  int batch_jobs = 0;                     // jobs in the batch that ran this one
  bool dropped = false;                   // cancelled at shutdown without running

  // Blocks until the job is finished (or dropped) or `timeout` passes. Returns true when finished.
  bool WaitFor(std::chrono::milliseconds timeout);
  bool finished() const;

  // Internal (Scheduler).
  void Finish();
  std::atomic<bool> cancelled{false};
  std::chrono::steady_clock::time_point submitted;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

// The ordering and packing policy alone: no threads, no clock (times are passed in), so the
// order and the aging bound are unit-testable. Not thread-safe.
class JobQueue {
 public:
  // REQUIRES: max_batch_tokens > 0, aging_seconds >= 0.
  JobQueue(int64_t max_batch_tokens, double aging_seconds);

  double Key(int64_t tokens, double arrival_seconds) const;
  // REQUIRES: 0 < job->tokens <= max_batch_tokens, job not queued.
  void Push(std::shared_ptr<Job> job, double arrival_seconds);
  // Removes a queued job; false when it is not queued (already popped, or never pushed).
  bool Remove(const Job* job);
  // The next batch (see the file comment); empty when the queue is empty.
  std::vector<std::shared_ptr<Job>> PopBatch();
  // Every queued job, in key order (shutdown).
  std::vector<std::shared_ptr<Job>> PopAll();

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  int64_t queued_tokens() const { return queued_tokens_; }
  int64_t max_batch_tokens() const { return max_batch_tokens_; }

 private:
  struct Entry {
    double key;
    uint64_t seq;
    double arrival;
    std::shared_ptr<Job> job;
    bool operator<(const Entry& o) const { return key != o.key ? key < o.key : seq < o.seq; }
  };
  int64_t max_batch_tokens_;
  double aging_seconds_;
  uint64_t next_seq_ = 0;
  int64_t queued_tokens_ = 0;
  std::set<Entry> entries_;
  std::unordered_map<const Job*, std::set<Entry>::iterator> index_;
};

// Runs a batch; results[i] belongs to requests[i]. Engine::RunBatch in the server: `interrupted`
// is asked between layers, and true from it ends the batch with its unfinished requests
// Cancelled.
using BatchRunner =
    std::function<std::vector<Result<Response>>(std::span<const Request>, const std::function<bool()>& interrupted)>;

struct SchedulerOptions {
  int64_t max_batch_tokens = 4096;  // most tokens of one batch (and of one job)
  int max_queue = 64;               // most jobs waiting (the running batch not counted)
  double aging_seconds = 2.0;       // see the file comment
  double linger_seconds = 0.02;     // see "Linger" in the file comment
  double linger_share = 0.01;       // of the last batch's run time (ditto); both 0: never wait
  double gather_gap_seconds = 0.002;  // see "Bursts" in the file comment
};

class Scheduler {
 public:
  // Starts the worker thread. `metrics` (may be null) receives batch figures; must outlive this.
  Scheduler(BatchRunner runner, SchedulerOptions options, Metrics* metrics = nullptr);
  ~Scheduler();  // Stop(0)
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Admit { kOk, kTooBig, kQueueFull, kStopping };
  // Queues `job` (job->tokens must be set). kTooBig: job->tokens > max_batch_tokens (or 0);
  // kQueueFull: max_queue jobs wait already; kStopping: Stop was called.
  Admit Submit(const std::shared_ptr<Job>& job);
  // The submitter gives up on `job`: removed from the queue and finished (dropped) if still
  // queued; a running job's result is not used, and a batch whose jobs are all cancelled stops.
  void Cancel(const std::shared_ptr<Job>& job);

  // Stops accepting; lets the worker run queued jobs for up to grace_seconds, then drops the
  // rest (their waiters see dropped = true), interrupts the running batch (its requests fail with
  // Cancelled) and joins the worker.
  void Stop(double grace_seconds);

  // A Retry-After hint for a full queue: queued tokens / recent throughput, at least 1 s.
  int RetryAfterSeconds() const;
  size_t queued() const;
  const SchedulerOptions& options() const { return options_; }

 private:
  void WorkerLoop();
  double Now() const;

  BatchRunner runner_;
  const SchedulerOptions options_;
  Metrics* metrics_;
  const std::chrono::steady_clock::time_point origin_ = std::chrono::steady_clock::now();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  JobQueue queue_;                 // GUARDED_BY(mu_)
  bool stopping_ = false;          // GUARDED_BY(mu_): no new jobs
  bool quit_ = false;              // GUARDED_BY(mu_): worker exits when the queue is empty
  std::atomic<bool> abort_{false};  // the grace has passed: the running batch stops
  double tokens_per_second_ = 0;   // GUARDED_BY(mu_): smoothed throughput of recent batches
  std::thread worker_;
};

}  // namespace estream::server
