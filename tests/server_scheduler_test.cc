// The server's job queue (order, packing, aging bound) and scheduler (one worker, cancellation,
// admission, shutdown) without HTTP or an engine: a fake BatchRunner. Label tsan: scripts/test.sh
// also runs this under ThreadSanitizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "server/metrics.h"
#include "server/scheduler.h"

namespace estream::server {
namespace {

std::shared_ptr<Job> MakeJob(int64_t tokens) {
  auto j = std::make_shared<Job>();
  Request r;
  r.tokens.assign(static_cast<size_t>(tokens), 1);
  j->requests.push_back(std::move(r));
  j->tokens = tokens;
  return j;
}

std::vector<int64_t> Sizes(const std::vector<std::shared_ptr<Job>>& jobs) {
  std::vector<int64_t> s;
  for (const auto& j : jobs) s.push_back(j->tokens);
  return s;
}

TEST(JobQueue, ShortestFirstAmongJobsThatArriveTogether) {
  JobQueue q(100, 1.0);
  for (int64_t t : {50, 10, 30, 20}) q.Push(MakeJob(t), 0.0);
  EXPECT_EQ(q.queued_tokens(), 110);
  EXPECT_EQ(Sizes(q.PopBatch()), (std::vector<int64_t>{10, 20, 30}));  // 50 does not fit (60 + 50 > 100)
  EXPECT_EQ(Sizes(q.PopBatch()), (std::vector<int64_t>{50}));
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.queued_tokens(), 0);
}

TEST(JobQueue, EqualKeysKeepArrivalOrder) {
  JobQueue q(10, 1.0);
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 5; ++i) {
    jobs.push_back(MakeJob(10));
    q.Push(jobs.back(), 3.0);
  }
  for (int i = 0; i < 5; ++i) {
    auto b = q.PopBatch();
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(b[0], jobs[i]);
  }
}

TEST(JobQueue, ZeroAgingIsFirstComeFirstServed) {
  JobQueue q(100, 0.0);
  for (int64_t t : {50, 10, 30, 20}) q.Push(MakeJob(t), 0.0);
  EXPECT_EQ(Sizes(q.PopBatch()), (std::vector<int64_t>{50, 10, 30}));
  EXPECT_EQ(Sizes(q.PopBatch()), (std::vector<int64_t>{20}));
}

TEST(JobQueue, BackfillsAroundAJobThatDoesNotFit) {
  JobQueue q(100, 1.0);
  q.Push(MakeJob(70), 0.0);
  q.Push(MakeJob(80), 0.0);
  q.Push(MakeJob(30), 0.0);
  // keys: 30 < 70 < 80; batch: 30 + 70 = 100, 80 waits.
  EXPECT_EQ(Sizes(q.PopBatch()), (std::vector<int64_t>{30, 70}));
  EXPECT_EQ(Sizes(q.PopBatch()), (std::vector<int64_t>{80}));
}

TEST(JobQueue, RemoveTakesAJobOut) {
  JobQueue q(100, 1.0);
  auto a = MakeJob(10), b = MakeJob(20);
  q.Push(a, 0);
  q.Push(b, 0);
  EXPECT_TRUE(q.Remove(a.get()));
  EXPECT_FALSE(q.Remove(a.get()));
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.queued_tokens(), 20);
  EXPECT_EQ(q.PopBatch()[0], b);
  EXPECT_FALSE(q.Remove(b.get()));
}

// Aging: a large job is served before small jobs that arrive more than aging_seconds after it,
// however many of them keep arriving.
TEST(JobQueue, AgingServesALargeJobDespiteAStreamOfSmallOnes) {
  const double aging = 2.0;
  JobQueue q(1000, aging);
  auto big = MakeJob(1000);
  q.Push(big, 0.0);
  // One small job arrives every 0.1 s; each "batch" has room for one job only (tokens 1000).
  double now = 0;
  bool served = false;
  for (int step = 0; step < 100 && !served; ++step) {
    now += 0.1;
    q.Push(MakeJob(600), now);  // 600 + 1000 > 1000: never batched together with the big one
    auto b = q.PopBatch();
    for (const auto& j : b) served |= j == big;
  }
  ASSERT_TRUE(served);
  // The big job's key is 0 + 2.0 * 1000/1000 = 2.0; a 600-token job arriving at a has key
  // a + 1.2, so those that arrived before 0.8 s go first, and none after.
  EXPECT_LE(now, 0.8 + 0.1 + 1e-9);
}

// The stated bound on random traffic: no job is ever served before another job that arrived
// more than aging_seconds earlier and was still queued.
TEST(JobQueue, NoJobIsOvertakenByOneArrivingMoreThanAgingSecondsLater) {
  std::mt19937 rng(7);
  const double aging = 0.5;
  const int64_t max_tokens = 512;
  JobQueue q(max_tokens, aging);
  std::map<const Job*, double> arrival;
  std::vector<std::shared_ptr<Job>> keep;
  double now = 0;
  int checks = 0;
  for (int step = 0; step < 3000; ++step) {
    now += std::uniform_real_distribution<double>(0, 0.02)(rng);
    const int n_new = std::uniform_int_distribution<int>(0, 3)(rng);
    for (int k = 0; k < n_new; ++k) {
      auto j = MakeJob(std::uniform_int_distribution<int64_t>(1, max_tokens)(rng));
      arrival[j.get()] = now;
      keep.push_back(j);
      q.Push(j, now);
    }
    if (std::uniform_int_distribution<int>(0, 1)(rng) == 0) continue;  // the engine is busy
    auto batch = q.PopBatch();
    // Every job still queued must not have arrived more than `aging` before a job just served.
    double latest_served = -1;
    for (const auto& j : batch) latest_served = std::max(latest_served, arrival[j.get()]);
    std::vector<std::shared_ptr<Job>> rest = q.PopAll();
    for (const auto& j : rest) {
      EXPECT_LE(latest_served - arrival[j.get()], aging + 1e-9);
      ++checks;
      q.Push(j, arrival[j.get()]);  // put back with the same arrival (same key)
    }
  }
  EXPECT_GT(checks, 1000);
}

// A runner that records its batches and can be held closed.
struct FakeRunner {
  std::mutex mu;
  std::condition_variable cv;
  bool open = true;
  std::vector<std::vector<int64_t>> batches;  // request sizes per batch
  std::atomic<int> running{0}, max_running{0};

  BatchRunner Runner() {
    return [this](std::span<const Request> reqs, const std::function<bool()>&) {
      const int now = ++running;
      int prev = max_running.load();
      while (now > prev && !max_running.compare_exchange_weak(prev, now)) {
      }
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return open; });
        std::vector<int64_t> sizes;
        for (const Request& r : reqs) sizes.push_back(static_cast<int64_t>(r.tokens.size()));
        batches.push_back(sizes);
      }
      std::vector<Result<Response>> out;
      for (const Request& r : reqs) {
        Response resp;
        resp.n_tokens = static_cast<int64_t>(r.tokens.size());
        out.push_back(std::move(resp));
      }
      --running;
      return out;
    };
  }
  void Set(bool o) {
    {
      std::lock_guard<std::mutex> l(mu);
      open = o;
    }
    cv.notify_all();
  }
};

TEST(Scheduler, ManyThreadsSubmitAndEveryJobGetsItsOwnResult) {
  FakeRunner fake;
  Metrics metrics;
  Scheduler s(fake.Runner(), {.max_batch_tokens = 64, .max_queue = 1000, .aging_seconds = 0.1}, &metrics);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const int64_t n = 1 + (t * 7 + i * 3) % 40;
        auto j = MakeJob(n);
        if (s.Submit(j) != Scheduler::Admit::kOk) { ++bad; continue; }
        while (!j->WaitFor(std::chrono::milliseconds(100))) {
        }
        if (j->results.size() != 1 || !j->results[0].ok() || j->results[0]->n_tokens != n) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(fake.max_running.load(), 1);  // one batch at a time
  int64_t total = 0;
  for (const auto& b : fake.batches) {
    int64_t sum = 0;
    for (int64_t x : b) sum += x;
    EXPECT_LE(sum, 64);
    total += static_cast<int64_t>(b.size());
  }
  EXPECT_EQ(total, 400);
  EXPECT_EQ(metrics.batches(), fake.batches.size());
}

TEST(Scheduler, OrdersTheQueueShortestFirstWhileABatchRuns) {
  FakeRunner fake;
  fake.Set(false);
  // Aging 100 s: the size term dominates arrival differences of microseconds.
  Scheduler s(fake.Runner(), {.max_batch_tokens = 100, .max_queue = 10, .aging_seconds = 100});
  auto first = MakeJob(100);
  ASSERT_EQ(s.Submit(first), Scheduler::Admit::kOk);
  while (fake.running.load() == 0) std::this_thread::yield();  // the worker holds `first`
  std::vector<std::shared_ptr<Job>> jobs;
  for (int64_t n : {90, 50, 70, 10}) {
    jobs.push_back(MakeJob(n));
    ASSERT_EQ(s.Submit(jobs.back()), Scheduler::Admit::kOk);
  }
  fake.Set(true);
  for (auto& j : jobs) ASSERT_TRUE(j->WaitFor(std::chrono::seconds(10)));
  ASSERT_EQ(fake.batches.size(), 4u);
  EXPECT_EQ(fake.batches[0], (std::vector<int64_t>{100}));
  EXPECT_EQ(fake.batches[1], (std::vector<int64_t>{10, 50}));  // 10 + 50 + 70 > 100
  EXPECT_EQ(fake.batches[2], (std::vector<int64_t>{70}));
  EXPECT_EQ(fake.batches[3], (std::vector<int64_t>{90}));
}

// Linger: clients answered together come back together. After a batch of 3 jobs, 3 jobs that
// arrive one by one within the linger window form one batch; a lone client (batches of 1) never
// waits for the (here very long) linger.
TEST(Scheduler, JobsArrivingJustAfterABatchOfManyAreBatchedTogether) {
  FakeRunner fake;
  fake.Set(false);
  Scheduler s(fake.Runner(), {.max_batch_tokens = 100, .max_queue = 10, .aging_seconds = 0, .linger_seconds = 60});
  auto first = MakeJob(5);
  ASSERT_EQ(s.Submit(first), Scheduler::Admit::kOk);
  while (fake.running.load() == 0) std::this_thread::yield();
  std::vector<std::shared_ptr<Job>> three = {MakeJob(10), MakeJob(10), MakeJob(10)};
  for (auto& j : three) ASSERT_EQ(s.Submit(j), Scheduler::Admit::kOk);
  fake.Set(true);
  for (auto& j : three) ASSERT_TRUE(j->WaitFor(std::chrono::seconds(10)));
  std::vector<std::shared_ptr<Job>> back;
  for (int64_t n : {13, 11, 12}) {
    back.push_back(MakeJob(n));
    ASSERT_EQ(s.Submit(back.back()), Scheduler::Admit::kOk);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  for (auto& j : back) ASSERT_TRUE(j->WaitFor(std::chrono::seconds(10)));
  ASSERT_EQ(fake.batches.size(), 3u);
  EXPECT_EQ(fake.batches[1], (std::vector<int64_t>{10, 10, 10}));
  EXPECT_EQ(fake.batches[2], (std::vector<int64_t>{13, 11, 12}));  // aging 0: arrival order
  EXPECT_EQ(back[0]->batch_jobs, 3);
}

// A runner whose batches each wait for the test's release (one release per batch, in order).
struct GatedRunner {
  std::mutex mu;
  std::condition_variable cv;
  int released = 0, started = 0;  // batches let through / begun
  std::vector<std::vector<int64_t>> batches;

  BatchRunner Runner() {
    return [this](std::span<const Request> reqs, const std::function<bool()>&) {
      std::vector<int64_t> sizes;
      for (const Request& r : reqs) sizes.push_back(static_cast<int64_t>(r.tokens.size()));
      {
        std::unique_lock<std::mutex> l(mu);
        const int index = started++;
        batches.push_back(sizes);
        cv.notify_all();
        cv.wait(l, [&] { return released > index; });
      }
      std::vector<Result<Response>> out;
      for (size_t i = 0; i < reqs.size(); ++i) out.push_back(Response{});
      return out;
    };
  }
  void WaitStarted(int n) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return started >= n; });
  }
  int Started() {
    std::lock_guard<std::mutex> l(mu);
    return started;
  }
  void Release(int n = 1) {
    {
      std::lock_guard<std::mutex> l(mu);
      released += n;
    }
    cv.notify_all();
  }
  // Declared after the Scheduler: lets every batch through before the Scheduler is destroyed, so
  // that a failed assertion ends the test instead of leaving the worker blocked in the runner.
  struct OpenOnExit {
    GatedRunner* g;
    ~OpenOnExit() { g->Release(1 << 20); }
  };
};

// Two halves of closed-loop clients merge: while batch [a1, a2] runs, b1..b3 queue; when it
// returns, the worker waits for a1 and a2 to come back (2 answered + 3 waiting) instead of running
// the b's alone, so the next batch has all five. (Waiting only for as many jobs as the last batch
// had, 2, would start [b1, b2, b3] at once and the halves would alternate for ever.)
TEST(Scheduler, ClientsThatWaitedAndClientsComingBackFormOneBatch) {
  GatedRunner g;
  Scheduler s(g.Runner(), {.max_batch_tokens = 100, .max_queue = 10, .aging_seconds = 0, .linger_seconds = 60});
  GatedRunner::OpenOnExit open{&g};
  ASSERT_EQ(s.Submit(MakeJob(5)), Scheduler::Admit::kOk);
  g.WaitStarted(1);
  std::vector<std::shared_ptr<Job>> a = {MakeJob(10), MakeJob(11)};
  for (auto& j : a) ASSERT_EQ(s.Submit(j), Scheduler::Admit::kOk);
  g.Release();      // [5] ends; a batch of 1 never lingers: [10, 11] starts
  g.WaitStarted(2);
  for (int64_t n : {20, 21, 22}) ASSERT_EQ(s.Submit(MakeJob(n)), Scheduler::Admit::kOk);
  g.Release();      // [10, 11] ends with 3 jobs queued
  for (auto& j : a) ASSERT_TRUE(j->WaitFor(std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the worker lingers, not runs
  EXPECT_EQ(g.Started(), 2);
  std::vector<std::shared_ptr<Job>> back = {MakeJob(12), MakeJob(13)};
  for (auto& j : back) ASSERT_EQ(s.Submit(j), Scheduler::Admit::kOk);
  g.WaitStarted(3);
  g.Release();
  for (auto& j : back) ASSERT_TRUE(j->WaitFor(std::chrono::seconds(10)));
  std::lock_guard<std::mutex> l(g.mu);
  ASSERT_EQ(g.batches.size(), 3u);
  EXPECT_EQ(g.batches[1], (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(g.batches[2], (std::vector<int64_t>{20, 21, 22, 12, 13}));  // aging 0: arrival order
}

// The linger grows with the batch: after a batch that ran ~1 s, with a share of 0.5 the worker
// waits (up to ~0.5 s) for both clients it answered, though the fixed linger (1 ms) has long
// passed when they come back 50 ms later; with a share of 0 the first to come back runs alone.
TEST(Scheduler, ALongBatchWaitsLongerForTheClientsItAnswered) {
  for (const double share : {0.5, 0.0}) {
    SCOPED_TRACE(share);
    GatedRunner g;
    Scheduler s(g.Runner(), {.max_batch_tokens = 100, .max_queue = 10, .aging_seconds = 0, .linger_seconds = 0.001,
                             .linger_share = share});
    GatedRunner::OpenOnExit open{&g};
    ASSERT_EQ(s.Submit(MakeJob(5)), Scheduler::Admit::kOk);
    g.WaitStarted(1);
    std::vector<std::shared_ptr<Job>> a = {MakeJob(10), MakeJob(11)};
    for (auto& j : a) ASSERT_EQ(s.Submit(j), Scheduler::Admit::kOk);
    g.Release();  // [5] ends; [10, 11] starts and runs for a second
    g.WaitStarted(2);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    g.Release();
    for (auto& j : a) ASSERT_TRUE(j->WaitFor(std::chrono::seconds(10)));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::vector<std::shared_ptr<Job>> back = {MakeJob(12), MakeJob(13)};
    ASSERT_EQ(s.Submit(back[0]), Scheduler::Admit::kOk);
    if (share == 0) g.WaitStarted(3);  // [12] alone
    ASSERT_EQ(s.Submit(back[1]), Scheduler::Admit::kOk);
    g.WaitStarted(3);
    g.Release();
    if (share == 0) {
      g.WaitStarted(4);
      g.Release();
    }
    for (auto& j : back) ASSERT_TRUE(j->WaitFor(std::chrono::seconds(10)));
    std::lock_guard<std::mutex> l(g.mu);
    if (share > 0) {
      ASSERT_EQ(g.batches.size(), 3u);
      EXPECT_EQ(g.batches[2], (std::vector<int64_t>{12, 13}));
    } else {
      ASSERT_EQ(g.batches.size(), 4u);
      EXPECT_EQ(g.batches[2], (std::vector<int64_t>{12}));
    }
  }
}

// Bursts: after a batch that ran ~0.5 s the worker is idle; jobs then arriving one after another,
// each well within the gap of the one before, form one batch (the gap is large here so that a
// slow test machine cannot split them); with no gap the first of them starts alone. Idle after a
// batch of one job, and after one of two jobs once its linger (0.5 s) has passed.
TEST(Scheduler, ABurstAtAnIdleServerFormsOneBatch) {
  for (const double gap : {0.2, 0.0})
    for (const int before : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "gap " << gap << ", last batch of " << before);
      GatedRunner g;
      Scheduler s(g.Runner(), {.max_batch_tokens = 100, .max_queue = 10, .aging_seconds = 0, .linger_share = 1.0,
                               .gather_gap_seconds = gap});
      GatedRunner::OpenOnExit open{&g};
      std::vector<std::shared_ptr<Job>> first = {MakeJob(5)};
      ASSERT_EQ(s.Submit(first[0]), Scheduler::Admit::kOk);
      g.WaitStarted(1);
      if (before == 2) {  // [5] runs while [6, 7] queue: [6, 7] is the batch before the burst
        for (int64_t n : {6, 7}) {
          first.push_back(MakeJob(n));
          ASSERT_EQ(s.Submit(first.back()), Scheduler::Admit::kOk);
        }
        g.Release();
        g.WaitStarted(2);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      g.Release();
      for (auto& j : first) ASSERT_TRUE(j->WaitFor(std::chrono::seconds(10)));
      if (before == 2) std::this_thread::sleep_for(std::chrono::milliseconds(700));  // past the linger
      const int b = g.Started();
      std::vector<std::shared_ptr<Job>> burst;
      for (int64_t n = 10; n < 14; ++n) {
        burst.push_back(MakeJob(n));
        ASSERT_EQ(s.Submit(burst.back()), Scheduler::Admit::kOk);
        if (gap == 0 && n == 10) g.WaitStarted(b + 1);  // [10] alone, at once
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      g.WaitStarted(b + 1);
      g.Release();
      if (gap == 0) {
        g.WaitStarted(b + 2);
        g.Release();
      }
      for (auto& j : burst) ASSERT_TRUE(j->WaitFor(std::chrono::seconds(10)));
      std::lock_guard<std::mutex> l(g.mu);
      if (gap > 0) {
        ASSERT_EQ(g.batches.size(), static_cast<size_t>(b + 1));
        EXPECT_EQ(g.batches[b], (std::vector<int64_t>{10, 11, 12, 13}));
      } else {
        ASSERT_EQ(g.batches.size(), static_cast<size_t>(b + 2));
        EXPECT_EQ(g.batches[b], (std::vector<int64_t>{10}));
        EXPECT_EQ(g.batches[b + 1], (std::vector<int64_t>{11, 12, 13}));
      }
    }
}

TEST(Scheduler, ALoneClientIsNeverDelayedByTheLinger) {
  FakeRunner fake;
  Scheduler s(fake.Runner(), {.max_batch_tokens = 100, .max_queue = 10, .aging_seconds = 0, .linger_seconds = 60});
  for (int i = 0; i < 5; ++i) {
    auto j = MakeJob(8 + i);
    ASSERT_EQ(s.Submit(j), Scheduler::Admit::kOk);
    ASSERT_TRUE(j->WaitFor(std::chrono::seconds(30))) << "job " << i << " waited for the linger";
  }
  EXPECT_EQ(fake.batches.size(), 5u);
}

// Jobs cancelled while the worker lingers leave nothing to run; later jobs still run.
TEST(Scheduler, CancellingEveryQueuedJobDuringTheLingerKeepsTheWorkerServing) {
  FakeRunner fake;
  fake.Set(false);
  Scheduler s(fake.Runner(), {.max_batch_tokens = 100, .max_queue = 10, .aging_seconds = 0, .linger_seconds = 2});
  auto a = MakeJob(5), b = MakeJob(6);
  ASSERT_EQ(s.Submit(a), Scheduler::Admit::kOk);
  while (fake.running.load() == 0) std::this_thread::yield();
  auto c = MakeJob(7);
  ASSERT_EQ(s.Submit(b), Scheduler::Admit::kOk);
  ASSERT_EQ(s.Submit(c), Scheduler::Admit::kOk);
  fake.Set(true);
  ASSERT_TRUE(c->WaitFor(std::chrono::seconds(10)));  // batches [5], [6, 7]: the last had 2 jobs
  auto d = MakeJob(9);
  ASSERT_EQ(s.Submit(d), Scheduler::Admit::kOk);  // the worker lingers for a second job
  s.Cancel(d);
  EXPECT_TRUE(d->dropped);
  auto e = MakeJob(4);
  ASSERT_EQ(s.Submit(e), Scheduler::Admit::kOk);
  ASSERT_TRUE(e->WaitFor(std::chrono::seconds(10)));
  ASSERT_TRUE(e->results.size() == 1 && e->results[0].ok());
}

TEST(Scheduler, AdmissionAndCancellation) {
  FakeRunner fake;
  fake.Set(false);
  Scheduler s(fake.Runner(), {.max_batch_tokens = 100, .max_queue = 2, .aging_seconds = 1});
  EXPECT_EQ(s.Submit(MakeJob(101)), Scheduler::Admit::kTooBig);
  auto running = MakeJob(5);
  ASSERT_EQ(s.Submit(running), Scheduler::Admit::kOk);
  while (fake.running.load() == 0) std::this_thread::yield();
  auto a = MakeJob(5), b = MakeJob(5), c = MakeJob(5);
  EXPECT_EQ(s.Submit(a), Scheduler::Admit::kOk);
  EXPECT_EQ(s.Submit(b), Scheduler::Admit::kOk);
  EXPECT_EQ(s.Submit(c), Scheduler::Admit::kQueueFull);
  EXPECT_GE(s.RetryAfterSeconds(), 1);
  s.Cancel(a);  // queued: removed and finished at once, never run
  EXPECT_TRUE(a->finished());
  EXPECT_TRUE(a->dropped);
  EXPECT_EQ(s.queued(), 1u);
  EXPECT_EQ(s.Submit(c), Scheduler::Admit::kOk);  // room again
  s.Cancel(running);  // running: finishes normally, result unused
  fake.Set(true);
  for (auto* j : {&running, &b, &c}) ASSERT_TRUE((*j)->WaitFor(std::chrono::seconds(10)));
  EXPECT_FALSE(running->dropped);
  size_t run = 0;
  for (const auto& batch : fake.batches) run += batch.size();
  EXPECT_EQ(run, 3u);  // running, b, c: never a
}

TEST(Scheduler, StopRunsQueuedWorkWithinTheGraceAndDropsTheRest) {
  {
    FakeRunner fake;
    Scheduler s(fake.Runner(), {.max_batch_tokens = 10, .max_queue = 10, .aging_seconds = 1});
    std::vector<std::shared_ptr<Job>> jobs;
    for (int i = 0; i < 5; ++i) {
      jobs.push_back(MakeJob(10));
      ASSERT_EQ(s.Submit(jobs.back()), Scheduler::Admit::kOk);
    }
    s.Stop(30);
    for (auto& j : jobs) {
      EXPECT_TRUE(j->finished());
      EXPECT_FALSE(j->dropped);
    }
    EXPECT_EQ(s.Submit(MakeJob(1)), Scheduler::Admit::kStopping);
  }
  {
    FakeRunner fake;
    fake.Set(false);
    Scheduler s(fake.Runner(), {.max_batch_tokens = 10, .max_queue = 10, .aging_seconds = 1});
    auto held = MakeJob(10);
    ASSERT_EQ(s.Submit(held), Scheduler::Admit::kOk);
    while (fake.running.load() == 0) std::this_thread::yield();
    auto queued = MakeJob(10);
    ASSERT_EQ(s.Submit(queued), Scheduler::Admit::kOk);
    std::thread release([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      fake.Set(true);
    });
    s.Stop(0.05);  // grace over while `held` runs: `queued` is dropped; `held` completes
    release.join();
    EXPECT_TRUE(queued->finished());
    EXPECT_TRUE(queued->dropped);
    EXPECT_TRUE(held->finished());
    EXPECT_FALSE(held->dropped);
  }
}

// A runner like an engine's pass that never ends by itself: it polls `interrupted` (as the engine
// does between layers) and then fails its requests with Cancelled.
struct EndlessRunner {
  std::atomic<int> started{0}, interrupted{0};
  BatchRunner Runner() {
    return [this](std::span<const Request> reqs, const std::function<bool()>& stop) {
      ++started;
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      std::vector<Result<Response>> out;
      while (!stop()) {
        if (std::chrono::steady_clock::now() > give_up) {  // the test fails below, it does not hang
          for (size_t i = 0; i < reqs.size(); ++i) out.push_back(Status::Internal("never interrupted"));
          return out;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ++interrupted;
      for (size_t i = 0; i < reqs.size(); ++i) out.push_back(Status::Cancelled("interrupted at layer 1 of 2"));
      return out;
    };
  }
};

// A running batch whose clients have all given up stops (the engine turns to the queue); one job
// cancelled of two keeps it running. A first batch [z] holds the worker while a and b queue, so
// that they share the second batch (submitted to an idle worker, a could start alone).
TEST(Scheduler, ARunningBatchStopsWhenAllItsJobsAreCancelled) {
  EndlessRunner endless;
  Scheduler s(endless.Runner(), {.max_batch_tokens = 100, .max_queue = 10, .aging_seconds = 1});
  auto z = MakeJob(5), a = MakeJob(5), b = MakeJob(5);
  ASSERT_EQ(s.Submit(z), Scheduler::Admit::kOk);
  while (endless.started.load() == 0) std::this_thread::yield();
  ASSERT_EQ(s.Submit(a), Scheduler::Admit::kOk);
  ASSERT_EQ(s.Submit(b), Scheduler::Admit::kOk);
  s.Cancel(z);
  ASSERT_TRUE(z->WaitFor(std::chrono::seconds(10)));
  while (endless.started.load() < 2) std::this_thread::yield();
  s.Cancel(a);
  EXPECT_FALSE(a->WaitFor(std::chrono::milliseconds(100)));  // b still wants the batch
  s.Cancel(b);
  ASSERT_TRUE(a->WaitFor(std::chrono::seconds(10)));
  ASSERT_TRUE(b->WaitFor(std::chrono::seconds(10)));
  EXPECT_EQ(endless.started.load(), 2);
  EXPECT_EQ(endless.interrupted.load(), 2);
  ASSERT_EQ(b->results.size(), 1u);
  EXPECT_EQ(b->results[0].status().code(), StatusCode::kCancelled);
}

// Shutdown is bounded by the grace plus one layer: the running batch is interrupted when the grace
// has passed, and its jobs finish with Cancelled (the server answers 503 shutting_down).
TEST(Scheduler, StopInterruptsTheRunningBatchAfterTheGrace) {
  EndlessRunner endless;
  Scheduler s(endless.Runner(), {.max_batch_tokens = 100, .max_queue = 10, .aging_seconds = 1});
  auto running = MakeJob(5);
  ASSERT_EQ(s.Submit(running), Scheduler::Admit::kOk);
  while (endless.started.load() == 0) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  s.Stop(0.1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_EQ(endless.interrupted.load(), 1);
  ASSERT_TRUE(running->finished());
  EXPECT_FALSE(running->dropped);
  ASSERT_EQ(running->results.size(), 1u);
  EXPECT_EQ(running->results[0].status().code(), StatusCode::kCancelled);
}

// The worker adds each engine pass's streaming figures once (they are shared by the requests of
// a pass): bytes read and the expert cache's lookups and hits reach /metrics.
TEST(Scheduler, CountsEachPassStreamingFiguresOnce) {
  Metrics m;
  auto runner = [](std::span<const Request> reqs, const std::function<bool()>&) {
    std::vector<Result<Response>> out;
    for (size_t i = 0; i < reqs.size(); ++i) {
      Response r;
      r.pass = i < 2 ? 0 : 1;  // requests 0 and 1 share pass 0
      r.bytes_read = r.pass == 0 ? 1000 : 300;
      r.experts_needed = r.pass == 0 ? 10 : 6;
      r.experts_cached = r.pass == 0 ? 4 : 6;
      r.config.cache_bytes = 8192;
      out.push_back(std::move(r));
    }
    return out;
  };
  Scheduler s(runner, {.max_batch_tokens = 100, .max_queue = 8}, &m);
  auto job = MakeJob(30);
  job->requests.resize(3);
  ASSERT_EQ(s.Submit(job), Scheduler::Admit::kOk);
  ASSERT_TRUE(job->WaitFor(std::chrono::seconds(30)));
  s.Stop(0);
  const std::string t = m.Render({});
  EXPECT_NE(t.find("estream_expert_bytes_read_total 1300\n"), std::string::npos) << t;
  EXPECT_NE(t.find("estream_expert_cache_lookups_total 16\n"), std::string::npos) << t;
  EXPECT_NE(t.find("estream_expert_cache_hits_total 10\n"), std::string::npos) << t;
  EXPECT_NE(t.find("estream_expert_cache_bytes 8192\n"), std::string::npos) << t;
}

TEST(Metrics, RendersPrometheusText) {
  Metrics m;
  m.CountRequest("/v1/embeddings", 200);
  m.CountRequest("/v1/embeddings", 200);
  m.CountRequest("/v1/completions", 400);
  m.AddPromptTokens(42);
  m.ObserveJob(0.002, 0.3);
  m.ObserveBatch({.jobs = 3, .tokens = 300, .seconds = 0.3, .bubble_seconds = 0.01, .expert_bytes_read = 12345,
                  .experts_needed = 64, .experts_cached = 16, .expert_cache_bytes = 4096});
  const std::string t = m.Render({.queue_jobs = 2, .budget_bytes = 1000, .peak_rss_bytes = 77, .ready = true});
  EXPECT_NE(t.find("estream_requests_total{route=\"/v1/embeddings\",status=\"200\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("estream_requests_total{route=\"/v1/completions\",status=\"400\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("estream_prompt_tokens_total 42\n"), std::string::npos);
  EXPECT_NE(t.find("estream_queue_seconds_bucket{le=\"0.0025\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("estream_queue_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(t.find("estream_batch_jobs_bucket{le=\"+Inf\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("estream_expert_bytes_read_total 12345\n"), std::string::npos);
  EXPECT_NE(t.find("estream_expert_cache_lookups_total 64\n"), std::string::npos) << t;
  EXPECT_NE(t.find("estream_expert_cache_hits_total 16\n"), std::string::npos);
  EXPECT_NE(t.find("estream_expert_cache_hit_ratio 0.25\n"), std::string::npos);
  EXPECT_NE(t.find("estream_expert_cache_bytes 4096\n"), std::string::npos);
  EXPECT_NE(t.find("estream_budget_bytes 1000\n"), std::string::npos);
  EXPECT_NE(t.find("estream_peak_rss_bytes 77\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE estream_queue_seconds histogram\n"), std::string::npos);
}

}  // namespace
}  // namespace estream::server
