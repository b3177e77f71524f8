// Loader: group reads into arena banks match the file for many (G, Q, chunk) combinations via
// io_uring and via pread; injected errors fail only their group; short reads are resumed;
// cancellation; the fallback when io_uring cannot be set up.
#include "io/loader.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <condition_variable>
#include <map>
#include <mutex>

#include "base/memory.h"
#include "io_test_util.h"
#include "vmem/arena.h"
#include "vmem/bank_fill.h"
#include "vmem/residency.h"

namespace estream::io {
namespace {

using testing_io::FirstMismatch;
using testing_io::TempPatternFile;
using vmem::Arena;
using vmem::BankTicket;
using vmem::GroupId;
using vmem::ResidencyTable;

constexpr size_t kA = kDirectIoAlignment;

// An expert record of awkward size: 3 blocks + 100 bytes, padded to a 16 KiB stride on disk.
constexpr size_t kRecordBytes = 3 * kA + 100;
constexpr size_t kStride = 4 * kA;
constexpr int kRecords = 37;  // a prime: the last group is partial for every G > 1
// The file ends 3000 bytes short of the last stride: the last record is complete, its padding
// is not, and the last group's read stops at end of file (unaligned under O_DIRECT).
constexpr uint64_t kFileBytes = kRecords * kStride - 3000;

std::unique_ptr<Loader> MakeLoader(IoBackend backend, int q, size_t chunk) {
  auto l = Loader::Create({.backend = backend, .queue_depth = q, .chunk_bytes = chunk});
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  if (!l.ok()) return nullptr;
  EXPECT_EQ((*l)->backend(), backend);
  return std::move(l).value();
}

// Bytes of group q (of G records) in the file.
size_t GroupLength(int q, int g) {
  const uint64_t off = static_cast<uint64_t>(q) * g * kStride;
  const uint64_t end = std::min<uint64_t>(off + static_cast<uint64_t>(g) * kStride, kFileBytes);
  return static_cast<size_t>(end - off);
}

// Checks that every record of group q landed in its slot of bank b.
void ExpectBankMatches(const Arena& arena, int b, int q, int g, uint64_t seed, const std::string& ctx) {
  const int n = std::min(g, kRecords - q * g);
  for (int r = 0; r < n; ++r) {
    const uint64_t off = (static_cast<uint64_t>(q) * g + r) * kStride;
    const size_t bad = FirstMismatch(seed, off, arena.Slot(b, r), kRecordBytes);
    ASSERT_EQ(bad, kRecordBytes) << ctx << ": group " << q << " record " << r << " differs at byte " << bad;
  }
}

bool IoUringAvailable() {
  static const bool available = Loader::Create({.backend = IoBackend::kIoUring, .queue_depth = 1}).ok();
  return available;
}

class LoaderBackendTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    if (GetParam() == IoBackend::kIoUring && !IoUringAvailable()) {
      GTEST_SKIP() << "io_uring cannot be set up here (the pread instances still run)";
    }
  }
};

// All groups of the file through B < n_groups banks, for many G, Q and chunk sizes: reads go
// through the residency table (Reserve -> fill -> Publish -> verify -> Release).
TEST_P(LoaderBackendTest, GroupReadsMatchFile) {
  TempPatternFile tf(kFileBytes, 101, "io_loader");
  auto file = PosixFile::Open(tf.path());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  for (int g : {1, 3, 4}) {
    const int n_groups = (kRecords + g - 1) / g;
    for (int q : {1, 2, 7}) {
      for (size_t chunk : {kA, 3 * kA, size_t{1} << 20}) {
        const std::string ctx = "G=" + std::to_string(g) + " Q=" + std::to_string(q) + " chunk=" + std::to_string(chunk);
        const int n_banks = 3;
        auto loader = MakeLoader(GetParam(), q, chunk);
        ASSERT_NE(loader, nullptr);
        auto arena = Arena::Create({.n_banks = n_banks, .group_size = static_cast<size_t>(g), .slot_bytes = kRecordBytes});
        ASSERT_TRUE(arena.ok());
        std::memset((*arena)->base(), 0xEE, (*arena)->total_bytes());
        auto table = ResidencyTable::Create({.n_layers = 1, .n_expert = kRecords, .group_size = g, .n_banks = n_banks});
        ASSERT_TRUE(table.ok());
        // Keep n_banks groups in flight; verify and release the oldest before the next one.
        int next_submit = 0;
        for (int next_check = 0; next_check < n_groups; ++next_check) {
          while (next_submit < n_groups && next_submit < next_check + n_banks) {
            const GroupId gid{0, next_submit};
            auto ticket = (*table)->Reserve(gid, 1, 0);
            ASSERT_TRUE(ticket.ok()) << ctx << ": " << ticket.status().ToString();
            auto job = vmem::SubmitBankFill({.loader = loader.get(), .table = table->get(), .arena = arena->get(),
                                             .file = file->get(), .ticket = *ticket, .group = gid,
                                             .offset = static_cast<uint64_t>(next_submit) * g * kStride,
                                             .length = GroupLength(next_submit, g)});
            ASSERT_TRUE(job.ok()) << ctx << ": " << job.status().ToString();
            ++next_submit;
          }
          auto ready = (*table)->WaitReady({0, next_check}, 60.0);
          ASSERT_TRUE(ready.ok()) << ctx << ": " << ready.status().ToString();
          ExpectBankMatches(**arena, ready->bank, next_check, g, tf.seed(), ctx);
          // Visible mapping of every expert of the group.
          for (int r = 0; r < (*table)->ExpertsInGroup(next_check); ++r) {
            EXPECT_EQ((*table)->SlotOf(0, next_check * g + r), ready->bank * g + r);
          }
          ASSERT_TRUE((*table)->Release(*ready).ok());
        }
        loader->Drain();
        const LoaderStats st = loader->stats();
        EXPECT_EQ(st.jobs_ok, static_cast<uint64_t>(n_groups)) << ctx;
        EXPECT_LE(st.max_in_flight, q) << ctx;
        EXPECT_GE(st.bytes_read, kFileBytes - 0) << ctx;
        EXPECT_TRUE((*table)->CheckInvariants().ok());
      }
    }
  }
}

// Plain reads (no arena): arbitrary lengths, destination capacity rounding, timestamps.
TEST_P(LoaderBackendTest, RangesOfAwkwardLength) {
  TempPatternFile tf(kFileBytes, 102, "io_loader");
  auto file = PosixFile::Open(tf.path());
  ASSERT_TRUE(file.ok());
  auto loader = MakeLoader(GetParam(), 4, 2 * kA);
  ASSERT_NE(loader, nullptr);
  const size_t align = (*file)->alignment();
  struct Case { uint64_t offset; size_t length; };
  std::vector<Case> cases = {{0, 1}, {kA, 4095}, {2 * kA, 4097}, {0, 3 * kA + 1}, {5 * kA, 17 * kA + 3},
                             {kFileBytes / kA * kA, static_cast<size_t>(kFileBytes % kA)},
                             {kFileBytes / kA * kA - 2 * kA, static_cast<size_t>(kFileBytes % kA) + 2 * kA}};
  std::vector<AlignedPtr<uint8_t>> bufs;
  std::mutex mu;
  std::map<uint64_t, ReadResult> results;
  for (const Case& c : cases) {
    const size_t cap = (c.length + kA - 1) / kA * kA;
    bufs.push_back(AllocAligned<uint8_t>(cap, kA));
    std::memset(bufs.back().get(), 0xAB, cap);
    auto id = loader->Submit({.file = file->get(), .offset = c.offset, .length = c.length, .dst = bufs.back().get(),
                              .dst_capacity = cap, .label = "case", .done = [&](const ReadResult& r) {
                                std::lock_guard<std::mutex> lock(mu);
                                results[r.id] = r;
                              }});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
  }
  loader->Drain();
  ASSERT_EQ(results.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const ReadResult& r = results[i + 1];
    EXPECT_EQ(r.outcome, ReadOutcome::kOk) << r.status.ToString();
    EXPECT_GE(r.bytes_read, cases[i].length);
    EXPECT_LE(r.submit_s, r.start_s);
    EXPECT_LE(r.start_s, r.end_s);
    EXPECT_EQ(FirstMismatch(tf.seed(), cases[i].offset, bufs[i].get(), cases[i].length), cases[i].length) << "case " << i;
  }
  (void)align;
}

TEST_P(LoaderBackendTest, SubmitRejectsBadRequests) {
  TempPatternFile tf(8 * kA, 103, "io_loader");
  auto file = PosixFile::Open(tf.path());
  ASSERT_TRUE(file.ok());
  auto loader = MakeLoader(GetParam(), 2, kA);
  ASSERT_NE(loader, nullptr);
  auto buf = AllocAligned<uint8_t>(16 * kA, kA);
  auto code = [&](ReadRequest r) { return loader->Submit(std::move(r)).status().code(); };
  EXPECT_EQ(code({.file = nullptr, .length = 1, .dst = buf.get(), .dst_capacity = kA}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.file = file->get(), .length = 0, .dst = buf.get(), .dst_capacity = kA}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.file = file->get(), .offset = 7 * kA, .length = 2 * kA, .dst = buf.get(), .dst_capacity = 2 * kA}),
            StatusCode::kInvalidArgument);  // past the end
  EXPECT_EQ(code({.file = file->get(), .length = kA + 1, .dst = buf.get(), .dst_capacity = kA + 1}),
            StatusCode::kInvalidArgument);  // no room for the rounded-up length
  if ((*file)->alignment() > 1) {
    EXPECT_EQ(code({.file = file->get(), .offset = 512, .length = kA, .dst = buf.get(), .dst_capacity = 2 * kA}),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(code({.file = file->get(), .length = kA, .dst = buf.get() + 8, .dst_capacity = 2 * kA}),
              StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(loader->stats().jobs_submitted, 0u);
}

// An I/O error in the middle of one group fails that group only, with a Status naming the
// file offset and the group; the loader keeps working; a retry succeeds.
TEST_P(LoaderBackendTest, InjectedErrorFailsOnlyItsGroup) {
  TempPatternFile tf(kFileBytes, 104, "io_loader");
  auto base = PosixFile::Open(tf.path());
  ASSERT_TRUE(base.ok());
  const int g = 4, n_groups = (kRecords + g - 1) / g, n_banks = n_groups;
  // Second record of group 2, one block in: the chunk of 1 block there fails.
  const uint64_t bad_offset = (2 * g + 1) * kStride + kA;
  FaultInjectingFile file(base->get(), {.rules = {{.kind = FaultRule::Kind::kError, .offset = bad_offset, .length = 1}}});
  for (size_t chunk : {kA, size_t{1} << 20}) {
    auto loader = MakeLoader(GetParam(), 3, chunk);
    ASSERT_NE(loader, nullptr);
    auto arena = Arena::Create({.n_banks = static_cast<size_t>(n_banks), .group_size = g, .slot_bytes = kRecordBytes});
    ASSERT_TRUE(arena.ok());
    auto table = ResidencyTable::Create({.n_layers = 1, .n_expert = kRecords, .group_size = g, .n_banks = n_banks});
    ASSERT_TRUE(table.ok());
    std::mutex mu;
    std::map<int, ReadResult> results;
    auto fill = [&](int q) {
      auto ticket = (*table)->Reserve({0, q}, 5, 0);
      ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
      auto job = vmem::SubmitBankFill({.loader = loader.get(), .table = table->get(), .arena = arena->get(),
                                       .file = &file, .ticket = *ticket, .group = {0, q},
                                       .offset = static_cast<uint64_t>(q) * g * kStride, .length = GroupLength(q, g),
                                       .then = [&, q](const ReadResult& r) {
                                         std::lock_guard<std::mutex> lock(mu);
                                         results[q] = r;
                                       }});
      ASSERT_TRUE(job.ok()) << job.status().ToString();
    };
    for (int q = 0; q < n_groups; ++q) fill(q);
    loader->Drain();
    ASSERT_EQ(results.size(), static_cast<size_t>(n_groups));
    for (int q = 0; q < n_groups; ++q) {
      if (q == 2) {
        EXPECT_EQ(results[q].outcome, ReadOutcome::kFailed);
        const std::string msg = results[q].status.message();
        EXPECT_EQ(results[q].status.code(), StatusCode::kIOError);
        // The failed read's offset: exactly the injected one with 1-block chunks, else the
        // start of the chunk that holds it.
        const uint64_t group_start = 2 * g * kStride;
        const uint64_t named = group_start + (bad_offset - group_start) / chunk * chunk;
        EXPECT_NE(msg.find("offset " + std::to_string(named)), std::string::npos) << msg;
        EXPECT_NE(msg.find("layer 0 group 2"), std::string::npos) << msg;
        EXPECT_NE(msg.find(tf.path()), std::string::npos) << msg;
        // The bank was freed and the group never became visible; waiters get the error.
        EXPECT_FALSE((*table)->Find({0, 2}).has_value());
        EXPECT_EQ((*table)->SlotOf(0, 2 * g), -1);
        auto w = (*table)->WaitReady({0, 2}, 10.0);
        ASSERT_FALSE(w.ok());
        EXPECT_NE(w.status().message().find("offset " + std::to_string(named)), std::string::npos);
      } else {
        EXPECT_EQ(results[q].outcome, ReadOutcome::kOk) << "group " << q << ": " << results[q].status.ToString();
        auto t = (*table)->Find({0, q});
        ASSERT_TRUE(t.has_value());
        ExpectBankMatches(**arena, t->bank, q, g, tf.seed(), "after error");
      }
    }
    EXPECT_EQ(loader->stats().jobs_failed, 1u);
    // The loader is still usable: the same group, with the fault gone, loads fine.
    file.ClearRules();
    results.clear();
    fill(2);
    loader->Drain();
    EXPECT_EQ(results[2].outcome, ReadOutcome::kOk) << results[2].status.ToString();
    auto t = (*table)->WaitReady({0, 2}, 10.0);
    ASSERT_TRUE(t.ok());
    ExpectBankMatches(**arena, t->bank, 2, g, tf.seed(), "retry");
    file.AddRule({.kind = FaultRule::Kind::kError, .offset = bad_offset, .length = 1});
    EXPECT_TRUE((*table)->CheckInvariants().ok());
  }
}

// Short reads (injected, random and rule-based, some shorter than one block) are resumed.
TEST_P(LoaderBackendTest, ShortReadsResumed) {
  TempPatternFile tf(kFileBytes, 105, "io_loader");
  auto base = PosixFile::Open(tf.path());
  ASSERT_TRUE(base.ok());
  FaultInjectingFile file(base->get(), {.rules = {{.kind = FaultRule::Kind::kShortRead, .offset = kStride,
                                                   .length = kStride, .short_bytes = 100, .times = 3},
                                                  {.kind = FaultRule::Kind::kShortRead, .offset = 5 * kStride,
                                                   .length = 3 * kStride, .short_bytes = 5000}},
                                        .short_read_probability = 0.3, .seed = 9});
  const int g = 2, n_groups = (kRecords + g - 1) / g;
  auto loader = MakeLoader(GetParam(), 4, 2 * kA);
  ASSERT_NE(loader, nullptr);
  auto arena = Arena::Create({.n_banks = static_cast<size_t>(n_groups), .group_size = g, .slot_bytes = kRecordBytes});
  ASSERT_TRUE(arena.ok());
  auto table = ResidencyTable::Create({.n_layers = 1, .n_expert = kRecords, .group_size = g, .n_banks = n_groups});
  ASSERT_TRUE(table.ok());
  for (int q = 0; q < n_groups; ++q) {
    auto ticket = (*table)->Reserve({0, q}, 1, 0);
    ASSERT_TRUE(ticket.ok());
    ASSERT_TRUE(vmem::SubmitBankFill({.loader = loader.get(), .table = table->get(), .arena = arena->get(),
                                      .file = &file, .ticket = *ticket, .group = {0, q},
                                      .offset = static_cast<uint64_t>(q) * g * kStride, .length = GroupLength(q, g)})
                    .ok());
  }
  for (int q = 0; q < n_groups; ++q) {
    auto t = (*table)->WaitReady({0, q}, 60.0);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ExpectBankMatches(**arena, t->bank, q, g, tf.seed(), "short reads");
  }
  loader->Drain();
  EXPECT_GE(loader->stats().short_reads, 3u);
  EXPECT_GE(file.injected_short_reads(), 3u);
  EXPECT_EQ(loader->stats().jobs_ok, static_cast<uint64_t>(n_groups));
}

// The file shrinks after open (replaced or truncated while in use): an error, no crash.
TEST_P(LoaderBackendTest, TruncatedFileFailsCleanly) {
  TempPatternFile tf(16 * kA, 106, "io_loader");
  auto file = PosixFile::Open(tf.path());
  ASSERT_TRUE(file.ok());
  ASSERT_EQ(truncate(tf.path().c_str(), 6 * kA), 0);
  auto loader = MakeLoader(GetParam(), 2, 2 * kA);
  ASSERT_NE(loader, nullptr);
  auto buf = AllocAligned<uint8_t>(8 * kA, kA);
  ReadResult result;
  auto id = loader->Submit({.file = file->get(), .offset = 4 * kA, .length = 8 * kA, .dst = buf.get(),
                            .dst_capacity = 8 * kA, .label = "layer 1 group 1",
                            .done = [&](const ReadResult& r) { result = r; }});
  ASSERT_TRUE(id.ok());
  loader->Drain();
  EXPECT_EQ(result.outcome, ReadOutcome::kFailed);
  EXPECT_NE(result.status.message().find("end of file"), std::string::npos) << result.status.message();
  EXPECT_NE(result.status.message().find("layer 1 group 1"), std::string::npos);
  // The size the file has now, not the one seen at open.
  EXPECT_NE(result.status.message().find("file size now " + std::to_string(6 * kA) + ", " +
                                         std::to_string(16 * kA) + " when opened"),
            std::string::npos)
      << result.status.message();
}

// Cancelled jobs end kCancelled; their banks return to Available without ever being visible.
TEST_P(LoaderBackendTest, CancelSkipsInactiveGroups) {
  TempPatternFile tf(kFileBytes, 107, "io_loader");
  auto base = PosixFile::Open(tf.path());
  ASSERT_TRUE(base.ok());
  // The first read blocks until the gate opens, so the later jobs cannot have started.
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool gate_open = false;
  FaultInjectingFile file(base->get(), {.on_read = [&](uint64_t, size_t, void*) {
                                          std::unique_lock<std::mutex> lock(gate_mu);
                                          gate_cv.wait(lock, [&] { return gate_open; });
                                        }});
  const int g = 2, n = 5;
  auto loader = MakeLoader(GetParam(), 1, 1 << 20);
  ASSERT_NE(loader, nullptr);
  auto arena = Arena::Create({.n_banks = n, .group_size = g, .slot_bytes = kRecordBytes});
  ASSERT_TRUE(arena.ok());
  auto table = ResidencyTable::Create({.n_layers = 1, .n_expert = kRecords, .group_size = g, .n_banks = n});
  ASSERT_TRUE(table.ok());
  std::mutex mu;
  std::map<int, ReadOutcome> outcome;
  std::vector<uint64_t> jobs;
  for (int q = 0; q < n; ++q) {
    auto ticket = (*table)->Reserve({0, q}, 1, 0);
    ASSERT_TRUE(ticket.ok());
    auto job = vmem::SubmitBankFill({.loader = loader.get(), .table = table->get(), .arena = arena->get(),
                                     .file = &file, .ticket = *ticket, .group = {0, q},
                                     .offset = static_cast<uint64_t>(q) * g * kStride, .length = GroupLength(q, g),
                                     .then = [&, q](const ReadResult& r) {
                                       std::lock_guard<std::mutex> lock(mu);
                                       outcome[q] = r.outcome;
                                     }});
    ASSERT_TRUE(job.ok());
    jobs.push_back(*job);
  }
  EXPECT_TRUE(loader->Cancel(jobs[2]));
  EXPECT_TRUE(loader->Cancel(jobs[4]));
  EXPECT_FALSE(loader->Cancel(12345));
  {
    std::lock_guard<std::mutex> lock(gate_mu);
    gate_open = true;
  }
  gate_cv.notify_all();
  loader->Drain();
  EXPECT_FALSE(loader->Cancel(jobs[0]));  // finished
  for (int q = 0; q < n; ++q) {
    const bool cancelled = q == 2 || q == 4;
    EXPECT_EQ(outcome[q], cancelled ? ReadOutcome::kCancelled : ReadOutcome::kOk) << q;
    EXPECT_EQ((*table)->Find({0, q}).has_value(), !cancelled) << q;
    EXPECT_EQ((*table)->SlotOf(0, q * g), cancelled ? -1 : (*table)->Find({0, q}).value_or(BankTicket{}).bank * g);
  }
  EXPECT_EQ(loader->stats().jobs_cancelled, 2u);
  EXPECT_EQ((*table)->CountInState(vmem::BankState::kAvailable), 2);
  EXPECT_TRUE((*table)->CheckInvariants().ok());
}

// Destroying a loader with queued work cancels it cleanly (callbacks still run once).
TEST_P(LoaderBackendTest, DestructionCancelsPendingJobs) {
  TempPatternFile tf(64 * kA, 108, "io_loader");
  auto file = PosixFile::Open(tf.path());
  ASSERT_TRUE(file.ok());
  auto buf = AllocAligned<uint8_t>(64 * kA, kA);
  std::atomic<int> callbacks{0};
  {
    auto loader = MakeLoader(GetParam(), 1, kA);
    ASSERT_NE(loader, nullptr);
    for (int i = 0; i < 16; ++i) {
      ASSERT_TRUE(loader->Submit({.file = file->get(), .offset = 0, .length = 64 * kA, .dst = buf.get(),
                                  .dst_capacity = 64 * kA, .label = "x",
                                  .done = [&](const ReadResult&) { ++callbacks; }})
                      .ok());
    }
  }
  EXPECT_EQ(callbacks.load(), 16);
}

INSTANTIATE_TEST_SUITE_P(Backends, LoaderBackendTest, ::testing::Values(IoBackend::kIoUring, IoBackend::kPread),
                         [](const auto& info) { return std::string(IoBackendName(info.param)) == "io_uring" ? "IoUring" : "Pread"; });

TEST(Loader, FallsBackToPreadWhenIoUringCannotBeSetUp) {
  auto l = Loader::Create({.backend = IoBackend::kAuto, .queue_depth = 2, .fail_uring_init_for_testing = true});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ((*l)->backend(), IoBackend::kPread);
  EXPECT_NE((*l)->fallback_reason().find("io_uring"), std::string::npos);
  TempPatternFile tf(8 * kA, 109, "io_loader");
  auto file = PosixFile::Open(tf.path());
  ASSERT_TRUE(file.ok());
  auto buf = AllocAligned<uint8_t>(8 * kA, kA);
  ReadResult res;
  ASSERT_TRUE((*l)->Submit({.file = file->get(), .length = 8 * kA, .dst = buf.get(), .dst_capacity = 8 * kA,
                            .label = "fallback", .done = [&](const ReadResult& r) { res = r; }})
                  .ok());
  (*l)->Drain();
  EXPECT_EQ(res.outcome, ReadOutcome::kOk);
  EXPECT_EQ(FirstMismatch(tf.seed(), 0, buf.get(), 8 * kA), 8 * kA);

  auto forced = Loader::Create({.backend = IoBackend::kIoUring, .fail_uring_init_for_testing = true});
  ASSERT_FALSE(forced.ok());
  EXPECT_EQ(forced.status().code(), StatusCode::kNotSupported);
  auto auto_ok = Loader::Create({});
  ASSERT_TRUE(auto_ok.ok());
  EXPECT_EQ((*auto_ok)->backend(), IoUringAvailable() ? IoBackend::kIoUring : IoBackend::kPread);
}

TEST(Loader, BadParameters) {
  EXPECT_EQ(Loader::Create({.queue_depth = 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Loader::Create({.chunk_bytes = 0}).status().code(), StatusCode::kInvalidArgument);
  auto l = Loader::Create({.backend = IoBackend::kPread, .chunk_bytes = 5000});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ((*l)->chunk_bytes(), 2 * kA);  // rounded up to the direct I/O block
}

}  // namespace
}  // namespace estream::io
