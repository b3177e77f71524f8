// Disk characterisation (src/profiler/disk.h): the measured table has the right shapes and
// passes DiskProfile::Validate (no figure is asserted: a unit test never asserts a time); the
// per-device cache round-trips, is cut to the requested sizes, keeps other entries, and a
// corrupt cache is measured again with a warning and rewritten.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gguf/gguf.h"
#include "pack/packed_layout.h"
#include "pipeline_test_util.h"
#include "profiler/disk.h"

namespace estream {
namespace {

namespace fs = std::filesystem;
using pipeline_test::TestModels;

io::PackedModelInfo Layout() {
  auto f = GgufFile::Open(TestModels().packed, {.mmap = false});
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  auto l = io::ReadPackedLayout(**f);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return *l;
}

// Small cells: the test model's groups are tens of KiB.
profiler::DiskParams SmallParams() {
  profiler::DiskParams p;
  p.group_sizes = {1, 2, 4, 32};  // 32 > 16 experts: dropped
  p.queue_depths = {1, 2, 4};
  p.cell_bytes = 256 << 10;
  return p;
}

TEST(ProfilerDisk, MeasuredTableHasTheRightShape) {
  std::vector<std::string> lines;
  profiler::DiskParams p = SmallParams();
  p.progress = [&](const std::string& l) { lines.push_back(l); };
  auto d = profiler::MeasureDisk(Layout(), p);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->Validate().ok()) << d->Validate().message();
  EXPECT_EQ(d->group_sizes, (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(d->queue_depths, (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(d->bandwidth.size(), 9u);
  EXPECT_EQ(d->latency_s.size(), 3u);
  EXPECT_EQ(d->chunk_bytes % 4096, 0u);
  for (int g : d->group_sizes) {
    const int q0 = d->Q0(g);
    EXPECT_TRUE(q0 == 1 || q0 == 2 || q0 == 4) << q0;
  }
  EXPECT_GE(lines.size(), 3u);  // one line per group size
}

TEST(ProfilerDisk, BadParametersAreRefused) {
  profiler::DiskParams p = SmallParams();
  p.group_sizes = {64};  // more than the 16 experts
  auto d = profiler::MeasureDisk(Layout(), p);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("16 experts"), std::string::npos) << d.status().message();
}

config::DiskProfile HandTable() {
  return {.chunk_bytes = 1 << 20,
          .queue_depths = {1, 2, 4, 8},
          .group_sizes = {1, 2, 4},
          .bandwidth = {1.1e9f, 1.3e9f, 1.51e9f, 1.52e9f, 1.2e9f, 1.4e9f, 1.6e9f, 1.61e9f, 1.25e9f, 1.45e9f, 1.7e9f,
                        1.5e9f},
          .latency_s = {1e-4f, 1.5e-4f, 2.5e-5f}};
}

TEST(ProfilerDisk, CacheRoundTripCutAndKeys) {
  pipeline_test::ScratchDir dir;
  const profiler::DiskCacheKey key{.major = 8, .minor = 3, .chunk_bytes = 1 << 20, .record_bytes = 12288};
  const std::string path = profiler::DiskCachePath(dir.File("cache"), key);
  EXPECT_EQ(fs::path(path).filename().string(), "disk-8:3.json");
  // Absent file: not found, no error.
  auto none = profiler::LoadDiskCache(path, key, {1}, {1});
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->found);

  const config::DiskProfile t = HandTable();
  ASSERT_TRUE(profiler::StoreDiskCache(path, key, t).ok());  // creates the directory
  auto back = profiler::LoadDiskCache(path, key, t.group_sizes, t.queue_depths);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->found);
  EXPECT_EQ(back->profile.bandwidth, t.bandwidth);  // floats survive the JSON round trip exactly
  EXPECT_EQ(back->profile.latency_s, t.latency_s);
  EXPECT_EQ(back->profile.chunk_bytes, t.chunk_bytes);

  // A subset is cut out of the stored table.
  auto cut = profiler::LoadDiskCache(path, key, {2, 4}, {2, 8});
  ASSERT_TRUE(cut.ok() && cut->found);
  EXPECT_EQ(cut->profile.bandwidth, (std::vector<float>{1.4e9f, 1.61e9f, 1.45e9f, 1.5e9f}));
  EXPECT_EQ(cut->profile.latency_s, (std::vector<float>{1.5e-4f, 2.5e-5f}));
  // A size or depth the table lacks: not found (measure again).
  auto more = profiler::LoadDiskCache(path, key, {1, 8}, {1});
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(more->found);
  more = profiler::LoadDiskCache(path, key, {1}, {16});
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(more->found);
  // Other chunk size or record size: another entry, stored beside the first.
  profiler::DiskCacheKey other = key;
  other.record_bytes = 8192;
  auto miss = profiler::LoadDiskCache(path, other, {1}, {1});
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->found);
  config::DiskProfile t2 = t;
  t2.bandwidth.assign(t.bandwidth.size(), 2e9f);
  ASSERT_TRUE(profiler::StoreDiskCache(path, other, t2).ok());
  auto a = profiler::LoadDiskCache(path, key, t.group_sizes, t.queue_depths);
  auto b = profiler::LoadDiskCache(path, other, t.group_sizes, t.queue_depths);
  ASSERT_TRUE(a.ok() && a->found && b.ok() && b->found);
  EXPECT_EQ(a->profile.bandwidth, t.bandwidth);
  EXPECT_EQ(b->profile.bandwidth, t2.bandwidth);
  // Storing the same key again replaces its entry.
  ASSERT_TRUE(profiler::StoreDiskCache(path, key, t2).ok());
  a = profiler::LoadDiskCache(path, key, t.group_sizes, t.queue_depths);
  ASSERT_TRUE(a.ok() && a->found);
  EXPECT_EQ(a->profile.bandwidth, t2.bandwidth);
}

TEST(ProfilerDisk, CorruptCacheIsReportedThenMeasuredAgain) {
  pipeline_test::ScratchDir dir;
  const profiler::DiskCacheKey key{.major = 1, .minor = 2, .chunk_bytes = 1 << 20, .record_bytes = 4096};
  const std::string path = profiler::DiskCachePath(dir.File("c"), key);
  fs::create_directories(fs::path(path).parent_path());
  const config::DiskProfile t = HandTable();
  for (const std::string& bad :
       {std::string("not json at all {"), std::string("[1, 2]"), std::string("{\"version\": 7, \"entries\": []}"),
        std::string("{\"version\": 1, \"device\": \"1:2\", \"entries\": [{\"chunk_bytes\": 1048576}]}"),
        std::string("{\"version\": 1, \"device\": \"1:2\", \"entries\": [{\"chunk_bytes\": 1048576, \"record_bytes\": "
                    "4096, \"queue_depths\": [2, 1], \"group_sizes\": [1], \"bandwidth\": [1, 1], "
                    "\"latency_seconds\": [0]}]}")}) {
    std::ofstream(path) << bad;
    auto r = profiler::LoadDiskCache(path, key, {1}, {1});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
    // Storing over a corrupt file replaces it with a valid one.
    ASSERT_TRUE(profiler::StoreDiskCache(path, key, t).ok());
    auto ok = profiler::LoadDiskCache(path, key, t.group_sizes, t.queue_depths);
    ASSERT_TRUE(ok.ok() && ok->found) << bad;
  }

  // CharacteriseDisk: a corrupt cache is measured again, with a warning, and rewritten.
  const io::PackedModelInfo layout = Layout();
  profiler::DiskParams p = SmallParams();
  p.group_sizes = {1, 2};
  p.queue_depths = {1, 2};
  auto first = profiler::CharacteriseDisk(layout, p, /*refresh=*/false, dir.File("xdg"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->cached);
  EXPECT_TRUE(first->warning.empty()) << first->warning;
  auto second = profiler::CharacteriseDisk(layout, p, false, dir.File("xdg"));
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->cached);
  EXPECT_EQ(second->cache_path, first->cache_path);
  EXPECT_EQ(second->profile.bandwidth, first->profile.bandwidth);
  auto refreshed = profiler::CharacteriseDisk(layout, p, /*refresh=*/true, dir.File("xdg"));
  ASSERT_TRUE(refreshed.ok());
  EXPECT_FALSE(refreshed->cached);
  std::ofstream(first->cache_path) << "{ truncated";
  auto again = profiler::CharacteriseDisk(layout, p, false, dir.File("xdg"));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE(again->cached);
  EXPECT_NE(again->warning.find("measuring the disk again"), std::string::npos) << again->warning;
  auto fixed = profiler::CharacteriseDisk(layout, p, false, dir.File("xdg"));
  ASSERT_TRUE(fixed.ok());
  EXPECT_TRUE(fixed->cached);
  EXPECT_TRUE(fixed->warning.empty());
  // "-": no cache at all.
  auto uncached = profiler::CharacteriseDisk(layout, p, false, "-");
  ASSERT_TRUE(uncached.ok());
  EXPECT_FALSE(uncached->cached);
  EXPECT_TRUE(uncached->cache_path.empty());
}

TEST(ProfilerDisk, CacheDirFollowsXdgThenHome) {
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old_xdg ? old_xdg : "";
  setenv("XDG_CACHE_HOME", "/some/xdg", 1);
  EXPECT_EQ(profiler::DiskCacheDir(), "/some/xdg/estream");
  setenv("XDG_CACHE_HOME", "", 1);
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') { EXPECT_EQ(profiler::DiskCacheDir(), std::string(home) + "/.cache/estream"); }
  if (old_xdg) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else unsetenv("XDG_CACHE_HOME");
}

TEST(ProfilerDisk, KeyIsTheFilesDevice) {
  auto k = profiler::DiskKeyOf(TestModels().packed, 1 << 20, 4096);
  ASSERT_TRUE(k.ok());
  auto k2 = profiler::DiskKeyOf(TestModels().gguf, 1 << 20, 4096);  // same directory, same device
  ASSERT_TRUE(k2.ok());
  EXPECT_EQ(k->major, k2->major);
  EXPECT_EQ(k->minor, k2->minor);
  auto missing = profiler::DiskKeyOf("/nonexistent/model.gguf", 1 << 20, 4096);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIOError);
}

}  // namespace
}  // namespace estream
