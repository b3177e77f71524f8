// ExpertStreamer (src/pipeline) on its own, without OpenMP, so that it runs clean under
// ThreadSanitizer (label tsan): a test thread plays the executor over the packed tiny model's
// real records, with random active-group masks, random delays in the feeder, the reads (and
// short reads) and the executor, over many requests, every schedule and several (G, B, Q).
// Checked on every group handed out: its bank is InUse and holds exactly the group's bytes
// (every record's checksum matches: no partially loaded expert was visible, and no bank was
// overwritten while in use); the table's invariants hold at every step; after each request the
// arena is idle; the statistics add up (groups used = active groups).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "io/file.h"
#include "pack/packed_layout.h"
#include "pipeline/expert_stream.h"
#include "pipeline_test_util.h"

namespace estream::pipeline {
namespace {

using pipeline_test::TestModels;

struct Layout {
  std::unique_ptr<GgufFile> file;
  io::PackedModelInfo info;
};

Layout ReadLayout(const std::string& path) {
  Layout l;
  auto f = GgufFile::Open(path, {.mmap = false});
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  l.file = std::move(*f);
  auto info = io::ReadPackedLayout(*l.file);
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  l.info = std::move(*info);
  return l;
}

TEST(PipelineStream, SchedulesUnderRandomDelaysKeepInvariantsAndData) {
  for (const std::string& path : {TestModels().packed, TestModels().permuted}) {
    Layout layout = ReadLayout(path);
    auto base = io::PosixFile::Open(path, {.direct = true});
    ASSERT_TRUE(base.ok());
    io::FaultInjectingFile file(base->get(), {.short_read_probability = 0.2, .max_random_delay_s = 0.0003, .seed = 5});
    std::mt19937_64 rng(11);
    for (Schedule s : {Schedule::kEarly, Schedule::kAfterRouting, Schedule::kOnDemand}) {
      for (auto [g, b, q] : {std::tuple{1, 1, 1}, {3, 2, 2}, {4, 5, 8}, {16, 1, 3}, {5, 3, 1}}) {
        SCOPED_TRACE(std::string(ScheduleName(s)) + " G=" + std::to_string(g) + " B=" + std::to_string(b) +
                     " Q=" + std::to_string(q) + " " + path);
        auto st = ExpertStreamer::Create({.layout = &layout.info, .file = &file, .group_size = g, .n_banks = b,
                                          .queue_depth = q, .chunk_bytes = 65536, .schedule = s,
                                          .max_feeder_delay_s_for_testing = 0.0005, .seed = rng()});
        ASSERT_TRUE(st.ok()) << st.status().ToString();
        ExpertStreamer& x = **st;
        const int n_layers = static_cast<int>(layout.info.layers.size());
        for (int req = 0; req < 3; ++req) {
          x.BeginRequest();
          int64_t active_total = 0;
          for (int l = 0; l < n_layers; ++l) {
            x.LayerStart(l);
            if (rng() % 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));  // "attention"
            std::vector<uint8_t> active(x.n_groups());
            for (auto& a : active) a = rng() % 4 != 0;  // about a quarter inactive
            x.RoutingKnown(l, active);
            // Like the executor: the next active group (waiting), then sometimes every following
            // one that is already loaded (TryAcquireGroup), all checked, then all released.
            const io::PackedLayerInfo& li = layout.info.layers[l];
            for (int gq = 0; gq < x.n_groups();) {
              if (!active[gq]) {
                ++gq;
                continue;
              }
              std::vector<GroupLease> leases;
              auto lease = x.AcquireGroup(l, gq);
              ASSERT_TRUE(lease.ok()) << lease.status().ToString();
              leases.push_back(*lease);
              int next = gq + 1;
              const bool batch = rng() % 2;
              for (; batch && next < x.n_groups(); ++next) {
                if (!active[next]) continue;
                std::optional<GroupLease> more = x.TryAcquireGroup(l, next);
                if (!more) break;
                leases.push_back(*more);
              }
              if (!batch) next = gq + 1;
              for (const GroupLease& ls : leases) {
                ++active_total;
                EXPECT_EQ(x.table().StateOf({l, ls.group}), vmem::BankState::kInUse);
                for (int r = 0; r < li.GroupRecords(ls.group, g); ++r) {
                  const int p = ls.group * g + r;
                  EXPECT_TRUE(io::VerifyRecord(li, p, x.RecordAddress(ls, li.permutation[p])).ok());
                }
              }
              ASSERT_TRUE(x.table().CheckInvariants().ok()) << x.table().CheckInvariants().ToString();
              if (rng() % 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));  // "experts"
              for (const GroupLease& ls : leases) x.ReleaseGroup(ls);
              gq = next;
            }
          }
          ASSERT_TRUE(x.EndRequest().ok());
          ASSERT_TRUE(x.table().CheckInvariants().ok());
          EXPECT_EQ(x.table().CountInState(vmem::BankState::kAvailable), b);
          const StreamStats stats = x.stats();
          EXPECT_EQ(stats.groups_used, active_total);
          EXPECT_GE(stats.groups_read, active_total);
        }
      }
    }
  }
}

TEST(PipelineStream, ReadErrorReachesTheExecutorAndTheNextRequestWorks) {
  Layout layout = ReadLayout(TestModels().packed);
  auto base = io::PosixFile::Open(TestModels().packed, {.direct = true});
  ASSERT_TRUE(base.ok());
  io::FaultInjectingFile file(base->get(), {});
  auto st = ExpertStreamer::Create({.layout = &layout.info, .file = &file, .group_size = 4, .n_banks = 2});
  ASSERT_TRUE(st.ok());
  ExpertStreamer& x = **st;
  const io::PackedLayerInfo& li = layout.info.layers[1];
  file.AddRule({.kind = io::FaultRule::Kind::kError, .offset = li.GroupOffset(2, 4), .length = 1, .error = 5});
  std::vector<uint8_t> all(x.n_groups(), 1);
  x.BeginRequest();
  Status failure;
  for (int l = 0; l < 3 && failure.ok(); ++l) {
    x.LayerStart(l);
    x.RoutingKnown(l, all);
    for (int q = 0; q < x.n_groups() && failure.ok(); ++q) {
      auto lease = x.AcquireGroup(l, q);
      if (!lease.ok()) {
        failure = lease.status();
        break;
      }
      x.ReleaseGroup(*lease);
    }
  }
  ASSERT_FALSE(failure.ok());
  EXPECT_EQ(failure.code(), StatusCode::kIOError);
  const std::string m = failure.message();
  EXPECT_NE(m.find("layer 1 group 2"), std::string::npos) << m;
  EXPECT_NE(m.find("experts 8,9,10,11"), std::string::npos) << m;
  EXPECT_NE(m.find("file offset " + std::to_string(li.GroupOffset(2, 4))), std::string::npos) << m;
  ASSERT_TRUE(x.EndRequest().ok());
  file.ClearRules();
  x.BeginRequest();
  for (int l = 0; l < 3; ++l) {
    x.LayerStart(l);
    x.RoutingKnown(l, all);
    for (int q = 0; q < x.n_groups(); ++q) {
      auto lease = x.AcquireGroup(l, q);
      ASSERT_TRUE(lease.ok()) << lease.status().ToString();
      x.ReleaseGroup(*lease);
    }
  }
  ASSERT_TRUE(x.EndRequest().ok());
}

}  // namespace
}  // namespace estream::pipeline
