// Concurrency stress: a producer (scheduler + loader) and consumers (fake executors) over many
// iterations with random delays in the loader and the executors, for several bank counts and
// both I/O backends. Checked on every access:
//   - no read of a Filling bank: an executor sees its bank InUse with its own ticket, the
//     expert's slot mapped where expected, and the bytes equal to the file's;
//   - no overwrite of an InUse bank: every loader read into a bank finds that bank Filling and
//     no executor reading it;
//   - the table's invariants at the end, every bank Available again, all work completed.
// Runs under ThreadSanitizer in CI (label tsan); bounded to a few seconds there.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "io/file.h"
#include "io/loader.h"
#include "io_test_util.h"
#include "vmem/arena.h"
#include "vmem/bank_fill.h"
#include "vmem/residency.h"

namespace estream::vmem {
namespace {

using io::FaultInjectingFile;
using estream::IoBackend;
using io::Loader;
using io::PosixFile;
using testing_io::FirstMismatch;
using testing_io::TempPatternFile;

constexpr int kLayers = 3;
constexpr int kExperts = 12;
constexpr int kGroupSize = 2;
constexpr int kGroups = kExperts / kGroupSize;
constexpr size_t kRecordBytes = 5000;  // stride 8 KiB
constexpr size_t kStride = 8192;
constexpr double kTimeout = 30.0;  // generous: a wait this long means a deadlock; the error shows the table

// A blocking FIFO (std::mutex: test code).
template <typename T>
class Queue {
 public:
  void Push(T v) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(v));
    }
    cv_.notify_one();
  }
  T Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !q_.empty(); });
    T v = std::move(q_.front());
    q_.pop_front();
    return v;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> q_;
};

struct Item {  // one group of one iteration, scheduler -> dispatcher
  GroupId group{};
  BankTicket ticket{};
  bool active = false;      // routed work exists
  bool cancelled = false;   // Cancel() took effect: the fill aborts
  std::vector<int> experts{};  // routed experts (logical ids) when active
  bool stop = false;
};

struct Task {  // one unit of routed work, dispatcher -> executor
  GroupId group{};
  BankTicket ticket{};
  int expert = -1;
  bool stop = false;
};

struct Config {
  IoBackend backend;
  int n_banks;
  int iterations;
};

class StressTest : public ::testing::TestWithParam<Config> {};

TEST_P(StressTest, ProducerConsumersKeepInvariants) {
  const Config cfg = GetParam();
  if (cfg.backend == IoBackend::kIoUring &&
      !Loader::Create({.backend = IoBackend::kIoUring, .queue_depth = 1}).ok()) {
    GTEST_SKIP() << "io_uring unavailable";
  }
  const uint64_t file_bytes = static_cast<uint64_t>(kLayers) * kExperts * kStride;
  TempPatternFile tf(file_bytes, 7 + cfg.n_banks, "vmem_stress");
  auto base = PosixFile::Open(tf.path());
  ASSERT_TRUE(base.ok()) << base.status().ToString();

  // Layer 1 stores its experts in reverse order on disk (a per-layer permutation).
  std::vector<int32_t> rev(kExperts);
  for (int e = 0; e < kExperts; ++e) rev[e] = kExperts - 1 - e;
  auto table_r = ResidencyTable::Create({.n_layers = kLayers, .n_expert = kExperts, .group_size = kGroupSize,
                                         .n_banks = cfg.n_banks, .expert_to_position = {{}, rev, {}}});
  ASSERT_TRUE(table_r.ok());
  ResidencyTable& table = **table_r;
  auto arena_r = Arena::Create({.n_banks = static_cast<size_t>(cfg.n_banks), .group_size = kGroupSize,
                                .slot_bytes = kRecordBytes});
  ASSERT_TRUE(arena_r.ok());
  const Arena& arena = **arena_r;
  ASSERT_EQ(arena.slot_stride(), kStride);

  // Per bank: how many executors are reading it right now.
  std::vector<std::atomic<int>> readers(cfg.n_banks);
  std::atomic<int> overwrite_violations{0}, read_violations{0}, content_violations{0};
  std::atomic<int64_t> units_done{0};

  FaultInjectingFile file(base->get(), {
      .short_read_probability = 0.1,
      .max_random_delay_s = 200e-6,
      .seed = static_cast<uint64_t>(cfg.n_banks),
      .on_read = [&](uint64_t, size_t n, void* dst) {
        // The loader is writing [dst, dst + n): that bank must be Filling and unread.
        const auto* p = static_cast<const uint8_t*>(dst);
        ASSERT_GE(p, arena.base());
        const size_t b = static_cast<size_t>(p - arena.base()) / arena.bank_bytes();
        ASSERT_LT(b, arena.n_banks());
        ASSERT_LE(p + n, arena.Bank(b) + arena.bank_bytes());
        if (readers[b].load() != 0 || table.Bank(static_cast<int32_t>(b)).state != BankState::kFilling) {
          ++overwrite_violations;
        }
      }});

  auto loader_r = Loader::Create({.backend = cfg.backend, .queue_depth = 3, .chunk_bytes = 4096});
  ASSERT_TRUE(loader_r.ok());
  Loader& loader = **loader_r;

  Queue<Item> items;
  Queue<Task> tasks;
  const int n_executors = 2;
  int64_t units_submitted = 0;  // written by the dispatcher only, read after join

  // Dispatcher: takes the groups in order, waits for them, and hands routed work to executors
  // (Ready -> InUse); inactive groups are released unread or unused.
  std::thread dispatcher([&] {
    for (;;) {
      Item it = items.Pop();
      if (it.stop) break;
      if (it.cancelled) continue;  // the fill aborts by itself
      if (!it.active) {
        auto t = table.WaitReady(it.group, kTimeout);
        ASSERT_TRUE(t.ok()) << t.status().ToString();
        ASSERT_EQ(*t, it.ticket);
        ASSERT_TRUE(table.Release(*t).ok());
        continue;
      }
      auto t = table.AcquireWhenReady(it.group, static_cast<int32_t>(it.experts.size()), kTimeout);
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      ASSERT_EQ(*t, it.ticket) << "the bank was recycled between publish and dispatch";
      units_submitted += static_cast<int64_t>(it.experts.size());
      for (int e : it.experts) tasks.Push({it.group, *t, e});
    }
    for (int i = 0; i < n_executors; ++i) tasks.Push({.stop = true});
  });

  // Executors: check state and mapping, read the expert's bytes, compare with the file.
  std::vector<std::thread> executors;
  for (int x = 0; x < n_executors; ++x) {
    executors.emplace_back([&, x] {
      std::mt19937 rng(1000 + x);
      for (;;) {
        Task task = tasks.Pop();
        if (task.stop) break;
        const int32_t b = task.ticket.bank;
        ++readers[b];
        const BankInfo info = table.Bank(b);
        if (info.state != BankState::kInUse || info.generation != task.ticket.generation || info.refs < 1) {
          ++read_violations;
        }
        const int layer = task.group.layer;
        const int32_t slot = table.SlotOf(layer, task.expert);
        const int32_t want_slot = b * kGroupSize + table.PositionInGroup(layer, task.expert);
        if (slot != want_slot) ++read_violations;
        const uint64_t pos = static_cast<uint64_t>(layer) * kExperts +
                             (task.group.group * kGroupSize + table.PositionInGroup(layer, task.expert));
        if (FirstMismatch(tf.seed(), pos * kStride, arena.SlotAddress(want_slot), kRecordBytes) != kRecordBytes) {
          ++content_violations;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        --readers[b];
        ++units_done;
        table.Complete(task.ticket);
      }
    });
  }

  // Scheduler (this thread): per iteration one layer; each group is loaded (early schedule),
  // then found active (some experts routed) or inactive (released, or cancelled if unread).
  std::mt19937 rng(42 + cfg.n_banks);
  for (int iter = 0; iter < cfg.iterations; ++iter) {
    const int layer = iter % kLayers;
    std::vector<int> order(kGroups);
    for (int q = 0; q < kGroups; ++q) order[q] = q;
    std::shuffle(order.begin(), order.end(), rng);
    const int n_load = 1 + static_cast<int>(rng() % kGroups);
    for (int k = 0; k < n_load; ++k) {
      const GroupId gid{layer, order[k]};
      // A group still held from an earlier iteration: wait until that use ends.
      Result<BankTicket> ticket = Status::Internal("unset");
      for (int attempt = 0;; ++attempt) {
        ticket = table.Reserve(gid, static_cast<uint64_t>(iter), kTimeout);
        if (ticket.ok() || ticket.status().code() != StatusCode::kInvalidArgument) break;
        ASSERT_LT(attempt, 1000000) << ticket.status().ToString();
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
      auto job = SubmitBankFill({.loader = &loader, .table = &table, .arena = &arena, .file = &file,
                                 .ticket = *ticket, .group = gid,
                                 .offset = (static_cast<uint64_t>(layer) * kExperts + gid.group * kGroupSize) * kStride,
                                 .length = kGroupSize * kStride});
      ASSERT_TRUE(job.ok()) << job.status().ToString();
      Item it{.group = gid, .ticket = *ticket};
      const unsigned fate = rng() % 8;
      if (fate == 0) {
        it.cancelled = loader.Cancel(*job);  // inactive; false if already read: then released
      } else if (fate != 1) {
        it.active = true;
        for (int r = 0; r < kGroupSize; ++r) {
          const int e = table.ExpertAt(layer, gid.group, r);
          for (unsigned rep = 0; rep <= rng() % 2; ++rep) {
            if (rng() % 3 != 0) it.experts.push_back(e);
          }
        }
        if (it.experts.empty()) it.experts.push_back(table.ExpertAt(layer, gid.group, 0));
      }
      items.Push(std::move(it));
    }
  }
  items.Push({.stop = true});
  dispatcher.join();
  for (auto& t : executors) t.join();
  loader.Drain();
  ASSERT_TRUE(table.WaitIdle(kTimeout).ok());
  table.ReleaseAllReady();

  EXPECT_EQ(overwrite_violations.load(), 0) << "a bank was written while not Filling or while read";
  EXPECT_EQ(read_violations.load(), 0) << "an executor saw its bank not InUse, or a wrong mapping";
  EXPECT_EQ(content_violations.load(), 0) << "an executor read bytes that differ from the file";
  EXPECT_EQ(units_done.load(), units_submitted);
  EXPECT_GT(units_submitted, 0);
  const Status inv = table.CheckInvariants();
  EXPECT_TRUE(inv.ok()) << inv.ToString();
  EXPECT_EQ(table.CountInState(BankState::kAvailable), cfg.n_banks);
  const ResidencyStats st = table.stats();
  EXPECT_EQ(st.completions, static_cast<uint64_t>(units_submitted));
  EXPECT_EQ(st.reserves, st.frees);
  EXPECT_EQ(loader.stats().jobs_failed, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Banks, StressTest,
    ::testing::Values(Config{IoBackend::kIoUring, 1, 150}, Config{IoBackend::kIoUring, 2, 200},
                      Config{IoBackend::kIoUring, 3, 250}, Config{IoBackend::kIoUring, 5, 250},
                      Config{IoBackend::kPread, 1, 150}, Config{IoBackend::kPread, 2, 200},
                      Config{IoBackend::kPread, 3, 250}, Config{IoBackend::kPread, 5, 250}),
    [](const auto& info) {
      return std::string(info.param.backend == IoBackend::kIoUring ? "IoUring" : "Pread") + "_B" +
             std::to_string(info.param.n_banks);
    });

}  // namespace
}  // namespace estream::vmem
