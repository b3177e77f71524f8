// Profile and chosen configuration as GGUF metadata (config/profile.h): round trip through a
// real GGUF file, one corrupt case per defect, the disk table's interpolation and Q0, sample
// thinning.
#include "config/profile.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>

#include "config/configurator.h"
#include "config/synthetic.h"
#include "gguf/gguf.h"
#include "scratch_dir.h"

namespace estream::config {
namespace {

using test_util::ScratchDir;

// Small but awkward: 5 layers, 11 experts (a partial last group for every g > 1), varying
// record bytes, an uncalibrated disk-table g.
Profile SmallProfile() {
  SyntheticProfileParams sp;
  sp.n_layer = 5;
  sp.n_expert = 11;
  sp.n_expert_used = 3;
  sp.n_tokens = 7;
  sp.expert_bytes = 12288;
  sp.group_sizes = {1, 2, 4};
  sp.queue_depths = {1, 3, 8};
  sp.seed = 99;
  Profile p = MakeSyntheticProfile(sp);
  p.record_bytes = {12288, 8192, 12288, 4096, 12288};
  p.disk.group_sizes = {1, 2, 4, 16};
  for (int q = 0; q < 3; ++q) p.disk.bandwidth.push_back(1.25e9f + static_cast<float>(q));
  p.disk.latency_s.push_back(3e-4f);
  p.other_seconds = 0.0123f;
  p.nonexpert_seconds[2] = 0.5f;
  p.runs[1].load_seconds.clear();  // a run without load samples
  EXPECT_TRUE(p.Validate().ok()) << p.Validate().ToString();
  return p;
}

void ExpectEqualProfiles(const Profile& a, const Profile& b) {
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_expert, b.n_expert);
  EXPECT_EQ(a.expert_bytes, b.expert_bytes);
  EXPECT_EQ(a.record_bytes, b.record_bytes);
  EXPECT_EQ(a.calib_tokens, b.calib_tokens);
  EXPECT_EQ(a.n_threads, b.n_threads);
  EXPECT_EQ(a.other_seconds, b.other_seconds);
  EXPECT_EQ(a.nonexpert_seconds, b.nonexpert_seconds);
  EXPECT_EQ(a.expert_routes, b.expert_routes);
  EXPECT_EQ(a.disk.chunk_bytes, b.disk.chunk_bytes);
  EXPECT_EQ(a.disk.queue_depths, b.disk.queue_depths);
  EXPECT_EQ(a.disk.group_sizes, b.disk.group_sizes);
  EXPECT_EQ(a.disk.bandwidth, b.disk.bandwidth);
  EXPECT_EQ(a.disk.latency_s, b.disk.latency_s);
  ASSERT_EQ(a.runs.size(), b.runs.size());
  for (size_t i = 0; i < a.runs.size(); ++i) {
    EXPECT_EQ(a.runs[i].group_size, b.runs[i].group_size);
    EXPECT_EQ(a.runs[i].other_bytes, b.runs[i].other_bytes);
    EXPECT_EQ(a.runs[i].load_queue_depth, b.runs[i].load_queue_depth);
    EXPECT_EQ(a.runs[i].load_seconds, b.runs[i].load_seconds);
    EXPECT_EQ(a.runs[i].exec_rows, b.runs[i].exec_rows);
    EXPECT_EQ(a.runs[i].exec_seconds, b.runs[i].exec_seconds);
  }
}

TEST(ConfigProfile, RoundTripThroughGgufFile) {
  ScratchDir dir;
  Profile p = SmallProfile();
  p.runs[0].other_bytes = (uint64_t{5} << 32) + 17;  // needs all 64 bits
  const ConfigChoice choice{.group_size = 4, .banks = 3, .queue_depth = 8, .budget_bytes = (uint64_t{3} << 33) + 5,
                            .predicted_seconds = 1.625f, .schedule = Schedule::kAfterRouting};
  const std::string path = dir.File("profile.gguf");
  {
    GgufWriter writer;
    writer.AddKv("general.architecture", GgufValue::String("qwen3moe"));
    for (GgufKv& kv : ProfileKvs(p)) writer.AddKv(std::move(kv.key), std::move(kv.value));
    for (GgufKv& kv : ConfigKvs(choice)) writer.AddKv(std::move(kv.key), std::move(kv.value));
    ASSERT_TRUE(writer.Begin(path).ok());
    ASSERT_TRUE(writer.Finish().ok());
  }
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE(HasProfile((*file)->kvs()));
  EXPECT_TRUE(HasConfigChoice((*file)->kvs()));
  auto back = ParseProfile((*file)->kvs(), path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectEqualProfiles(p, *back);
  auto c = ParseConfigChoice((*file)->kvs(), path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->group_size, 4);
  EXPECT_EQ(c->banks, 3);
  EXPECT_EQ(c->queue_depth, 8);
  EXPECT_EQ(c->budget_bytes, choice.budget_bytes);
  EXPECT_EQ(c->predicted_seconds, 1.625f);
  EXPECT_EQ(c->schedule, Schedule::kAfterRouting);
  // The re-solved answer from the file is the answer from the original.
  const SelectParams params{.budget_bytes = (uint64_t{2} << 30)};
  auto s1 = SelectConfig(p, params);
  auto s2 = SelectConfig(*back, params);
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(s1->best.group_size, s2->best.group_size);
  EXPECT_EQ(s1->best.banks, s2->best.banks);
  EXPECT_EQ(s1->best.predicted_s, s2->best.predicted_s);
}

TEST(ConfigProfile, AbsentKeys) {
  std::vector<GgufKv> kvs = {{"general.architecture", GgufValue::String("olmoe")}};
  EXPECT_FALSE(HasProfile(kvs));
  EXPECT_FALSE(HasConfigChoice(kvs));
  auto p = ParseProfile(kvs, "m.gguf");
  EXPECT_EQ(p.status().code(), StatusCode::kCorruption);
  EXPECT_NE(p.status().message().find("m.gguf: key 'estream.profile.version': missing"), std::string::npos)
      << p.status().message();
}

// Applies `edit` to the kvs of a valid profile and expects ParseProfile to fail with `code` and
// a message containing `needle`.
void ExpectProfileDefect(const std::function<void(std::vector<GgufKv>&)>& edit, StatusCode code,
                         const std::string& needle) {
  std::vector<GgufKv> kvs = ProfileKvs(SmallProfile());
  edit(kvs);
  auto p = ParseProfile(kvs, "bad.gguf");
  ASSERT_FALSE(p.ok()) << "defect not detected: " << needle;
  EXPECT_EQ(p.status().code(), code) << p.status().ToString();
  EXPECT_NE(p.status().message().find(needle), std::string::npos) << p.status().message();
  EXPECT_EQ(p.status().message().rfind("bad.gguf: ", 0), 0u) << p.status().message();
  EXPECT_EQ(p.status().message().find('\n'), std::string::npos);
}

GgufValue* Find(std::vector<GgufKv>& kvs, const std::string& key) {
  for (GgufKv& kv : kvs) {
    if (kv.key == key) return &kv.value;
  }
  ADD_FAILURE() << "no key " << key;
  static GgufValue dummy;
  return &dummy;
}

TEST(ConfigProfile, EveryKeyIsRequired) {
  const std::vector<GgufKv> all = ProfileKvs(SmallProfile());
  for (size_t i = 0; i < all.size(); ++i) {
    std::vector<GgufKv> kvs = all;
    kvs.erase(kvs.begin() + static_cast<ptrdiff_t>(i));
    auto p = ParseProfile(kvs, "cut.gguf");
    ASSERT_FALSE(p.ok()) << "parsed without " << all[i].key;
    EXPECT_EQ(p.status().code(), StatusCode::kCorruption);
    EXPECT_NE(p.status().message().find(all[i].key), std::string::npos) << p.status().message();
  }
}

TEST(ConfigProfile, CorruptValues) {
  using KVs = std::vector<GgufKv>;
  ExpectProfileDefect([](KVs& k) { *Find(k, "estream.profile.version") = GgufValue::U32(2); }, StatusCode::kNotSupported,
                      "profile version 2 is not supported");
  ExpectProfileDefect([](KVs& k) { *Find(k, "estream.profile.n_layer") = GgufValue::String("5"); },
                      StatusCode::kCorruption, "'estream.profile.n_layer': expected an integer, found string");
  ExpectProfileDefect([](KVs& k) { *Find(k, "estream.profile.n_layer") = GgufValue::I32(-5); },
                      StatusCode::kCorruption, "value -5 is negative");
  ExpectProfileDefect([](KVs& k) { *Find(k, "estream.profile.n_layer") = GgufValue::U32(6); },
                      StatusCode::kCorruption, "'estream.profile.record_bytes': has 5 elements, expected 6");
  ExpectProfileDefect([](KVs& k) { Find(k, "estream.profile.nonexpert_seconds")->array.pop_back(); },
                      StatusCode::kCorruption, "'estream.profile.nonexpert_seconds': has 4 elements, expected 5");
  ExpectProfileDefect([](KVs& k) { *Find(k, "estream.profile.other_seconds") = GgufValue::U32(1); },
                      StatusCode::kCorruption, "expected f32, found u32");
  ExpectProfileDefect([](KVs& k) { *Find(k, "estream.profile.expert_routes") = GgufValue::U32(1); },
                      StatusCode::kCorruption, "expected an array, found u32");
  ExpectProfileDefect(
      [](KVs& k) {
        GgufValue* v = Find(k, "estream.profile.disk.bandwidth");
        *v = GgufValue::I32Array(std::vector<int32_t>(v->array.size(), 1));
      },
      StatusCode::kCorruption, "expected an f32 array, found an array of i32");
  ExpectProfileDefect([](KVs& k) { Find(k, "estream.profile.disk.bandwidth")->array[3].f = -1; },
                      StatusCode::kCorruption, "bandwidth[3] = -1 is not > 0");
  ExpectProfileDefect([](KVs& k) { Find(k, "estream.profile.disk.bandwidth")->array[0].f = NAN; },
                      StatusCode::kCorruption, "bandwidth[0] = nan");
  ExpectProfileDefect([](KVs& k) { Find(k, "estream.profile.disk.queue_depths")->array[1].u = 1; },
                      StatusCode::kCorruption, "queue_depths must be non-empty, >= 1 and strictly ascending");
  ExpectProfileDefect([](KVs& k) { Find(k, "estream.profile.record_bytes")->array[1].u = 99999; },
                      StatusCode::kCorruption, "record_bytes[1] = 99999 is not in [1, expert_bytes = 12288]");
  ExpectProfileDefect([](KVs& k) { Find(k, "estream.profile.calib.group_sizes")->array[2].u = 2; },
                      StatusCode::kCorruption, "strictly ascending");
  ExpectProfileDefect([](KVs& k) { Find(k, "estream.profile.calib.group_sizes")->array[2].u = 3; },
                      StatusCode::kCorruption, "'estream.profile.calib.3.other_bytes': missing");
  ExpectProfileDefect([](KVs& k) { Find(k, "estream.profile.calib.4.exec_seconds")->array.pop_back(); },
                      StatusCode::kCorruption, "'estream.profile.calib.4.exec_seconds': has");
  ExpectProfileDefect([](KVs& k) { Find(k, "estream.profile.calib.1.load_seconds")->array[0].f = 0; },
                      StatusCode::kCorruption, "calib 1: load sample 0 is not > 0");
  ExpectProfileDefect([](KVs& k) { *Find(k, "estream.profile.calib.1.load_queue_depth") = GgufValue::U32(0); },
                      StatusCode::kCorruption, "calib 1: load_queue_depth must be >= 1");
  ExpectProfileDefect(
      [](KVs& k) {
        *Find(k, "estream.profile.calib.2.exec_rows") = GgufValue::F32Array({});
        *Find(k, "estream.profile.calib.2.exec_seconds") = GgufValue::F32Array({});
      },
      StatusCode::kCorruption, "calib 2: exec_rows (0) and exec_seconds (0) must be non-empty");
  ExpectProfileDefect([](KVs& k) { Find(k, "estream.profile.expert_routes")->array[0].u = uint64_t{1} << 33; },
                      StatusCode::kCorruption, "expert_routes[0]': value 8589934592 is larger than 4294967295");
}

TEST(ConfigProfile, UnknownKeysIgnoredAndWidthsAccepted) {
  std::vector<GgufKv> kvs = ProfileKvs(SmallProfile());
  kvs.push_back({"estream.profile.future_field", GgufValue::String("x")});
  *Find(kvs, "estream.profile.n_expert") = GgufValue::U64(11);         // any integer width
  *Find(kvs, "estream.profile.other_seconds") = GgufValue::Of(GgufType::kF64);  // f64 accepted
  auto p = ParseProfile(kvs, "ok.gguf");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->n_expert, 11);
  EXPECT_EQ(p->other_seconds, 0);
}

TEST(ConfigProfile, CorruptConfigChoice) {
  auto parse_with = [](const std::function<void(std::vector<GgufKv>&)>& edit) {
    std::vector<GgufKv> kvs = ConfigKvs({.group_size = 2, .banks = 5, .queue_depth = 4, .budget_bytes = 1 << 30,
                                         .predicted_seconds = 0.5f, .schedule = Schedule::kEarly});
    edit(kvs);
    return ParseConfigChoice(kvs, "c.gguf");
  };
  EXPECT_TRUE(parse_with([](auto&) {}).ok());
  auto r = parse_with([](auto& k) { *Find(k, "estream.config.schedule") = GgufValue::String("eager"); });
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("'estream.config.schedule': unknown schedule 'eager'"), std::string::npos)
      << r.status().message();
  r = parse_with([](auto& k) { *Find(k, "estream.config.banks") = GgufValue::U32(0); });
  EXPECT_NE(r.status().message().find("'estream.config.banks': must be >= 1"), std::string::npos);
  r = parse_with([](auto& k) { *Find(k, "estream.config.version") = GgufValue::U32(9); });
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  r = parse_with([](auto& k) { *Find(k, "estream.config.predicted_seconds") = GgufValue::F32(-1); });
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  r = parse_with([](auto& k) { k.erase(k.begin() + 4); });  // budget_bytes
  EXPECT_NE(r.status().message().find("'estream.config.budget_bytes': missing"), std::string::npos);
}

// The thread count of the calibration and of the choice: stored when known, read back; a file
// profiled before the keys existed reads as 0 (unknown) and still parses; a mistyped key is a
// defect of the full parsers but only "unknown" for the lenient reader.
TEST(ConfigProfile, ThreadCountRoundTripAndOlderFiles) {
  auto has = [](const std::vector<GgufKv>& k, const std::string& key) {
    return std::any_of(k.begin(), k.end(), [&](const GgufKv& kv) { return kv.key == key; });
  };
  Profile p = SmallProfile();
  p.n_threads = 2;
  const ConfigChoice choice{.group_size = 2, .banks = 5, .queue_depth = 4, .budget_bytes = 1 << 30,
                            .predicted_seconds = 0.5f, .n_threads = 2};
  std::vector<GgufKv> kvs = ProfileKvs(p);
  for (GgufKv& kv : ConfigKvs(choice)) kvs.push_back(std::move(kv));
  ASSERT_TRUE(has(kvs, "estream.profile.n_threads"));
  ASSERT_TRUE(has(kvs, "estream.config.n_threads"));
  auto back = ParseProfile(kvs, "t.gguf");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->n_threads, 2u);
  auto c = ParseConfigChoice(kvs, "t.gguf");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->n_threads, 2u);
  StoredThreads t = ReadStoredThreads(kvs);
  EXPECT_EQ(t.profile, 2u);
  EXPECT_EQ(t.choice, 2u);

  // Older files: no n_threads keys (0 = unknown is not written either).
  p.n_threads = 0;
  std::vector<GgufKv> old_kvs = ProfileKvs(p);
  for (GgufKv& kv : ConfigKvs({.group_size = 2, .banks = 5, .queue_depth = 4, .budget_bytes = 1 << 30}))
    old_kvs.push_back(std::move(kv));
  EXPECT_FALSE(has(old_kvs, "estream.profile.n_threads"));
  EXPECT_FALSE(has(old_kvs, "estream.config.n_threads"));
  back = ParseProfile(old_kvs, "old.gguf");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->n_threads, 0u);
  c = ParseConfigChoice(old_kvs, "old.gguf");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->n_threads, 0u);
  t = ReadStoredThreads(old_kvs);
  EXPECT_EQ(t.profile, 0u);
  EXPECT_EQ(t.choice, 0u);

  // Present but not an integer: Corruption naming the key; the lenient reader says unknown.
  *Find(kvs, "estream.profile.n_threads") = GgufValue::String("two");
  *Find(kvs, "estream.config.n_threads") = GgufValue::F32(2);
  back = ParseProfile(kvs, "bad.gguf");
  EXPECT_EQ(back.status().code(), StatusCode::kCorruption);
  EXPECT_NE(back.status().message().find("bad.gguf: key 'estream.profile.n_threads': expected an integer"),
            std::string::npos) << back.status().message();
  c = ParseConfigChoice(kvs, "bad.gguf");
  EXPECT_EQ(c.status().code(), StatusCode::kCorruption);
  EXPECT_NE(c.status().message().find("'estream.config.n_threads'"), std::string::npos) << c.status().message();
  t = ReadStoredThreads(kvs);
  EXPECT_EQ(t.profile, 0u);
  EXPECT_EQ(t.choice, 0u);
}

TEST(ConfigProfile, ThreadMismatchNote) {
  EXPECT_EQ(ThreadMismatchNote(0, 1, "m.gguf", "1500M"), "");  // unknown: an older file
  EXPECT_EQ(ThreadMismatchNote(2, 2, "m.gguf", "1500M"), "");
  const std::string note = ThreadMismatchNote(2, 1, "m.gguf", "1500M");
  EXPECT_EQ(note, "note: the stored profile was measured with 2 threads, this run uses 1; its timings are used all "
                  "the same (run `estream profile m.gguf --budget 1500M -t 1 --recalibrate` for a matching one)");
  EXPECT_EQ(note.find('\n'), std::string::npos);
  EXPECT_NE(ThreadMismatchNote(1, 4, "m", "1G").find("measured with 1 thread, this run uses 4"), std::string::npos);
}

TEST(ConfigProfile, DiskTableInterpolationAndQ0) {
  DiskProfile d;
  d.chunk_bytes = 1 << 20;
  d.queue_depths = {1, 2, 4, 8, 16, 32};
  d.group_sizes = {1, 4};
  // Row g = 1: the pooled io_uring medians of docs/PERFORMANCE.md (GB/s): peak 1.58 at Q = 8,
  // 95% of it is 1.501: Q = 4 (1.35) is below, Q = 8 reaches it.
  // Row g = 4: saturating early: peak 2.0 at 32, 95% = 1.9; Q = 2 has 1.95.
  d.bandwidth = {1.14e9f, 1.40e9f, 1.35e9f, 1.58e9f, 1.54e9f, 1.50e9f,
                 1.00e9f, 1.95e9f, 1.96e9f, 1.97e9f, 1.98e9f, 2.00e9f};
  d.latency_s = {1e-4f, 2e-4f};
  ASSERT_TRUE(d.Validate().ok());
  EXPECT_EQ(d.Q0(1), 8);
  EXPECT_EQ(d.Q0(4), 2);
  EXPECT_EQ(d.Q0(1, 0.5), 1);
  // Nearest measured g in log2: 2 is equidistant from 1 and 4 (the smaller wins), 3 is nearer 4.
  EXPECT_EQ(d.RowFor(1), 0);
  EXPECT_EQ(d.RowFor(2), 0);
  EXPECT_EQ(d.RowFor(3), 1);
  EXPECT_EQ(d.RowFor(64), 1);
  EXPECT_EQ(d.Latency(16), 2e-4f);
  // The running maximum at measured depths (row g = 1: 1.14 1.40 1.40 1.58 1.58 1.58), linear
  // between, clamped outside.
  EXPECT_EQ(d.Bandwidth(1, 2), 1.40e9f);
  EXPECT_EQ(d.Bandwidth(1, 4), 1.40e9f);
  EXPECT_EQ(d.Bandwidth(1, 8), 1.58e9f);
  EXPECT_NEAR(d.Bandwidth(1, 6), 0.5 * (1.40e9 + 1.58e9), 1e3);
  EXPECT_NEAR(d.Bandwidth(1, 3), 1.40e9, 1e3);
  EXPECT_EQ(d.Bandwidth(1, 12), 1.58e9f);
  EXPECT_EQ(d.Bandwidth(1, 64), 1.58e9f);
  EXPECT_EQ(d.Bandwidth(4, 1), 1.00e9f);
  EXPECT_NEAR(d.Bandwidth(4, 3), 0.5 * (1.95e9 + 1.96e9), 1e3);
  for (int q = 1; q < 40; ++q) EXPECT_LE(d.Bandwidth(1, q), d.Bandwidth(1, q + 1)) << q;
  d.latency_s.pop_back();
  EXPECT_FALSE(d.Validate().ok());
}

TEST(ConfigProfile, CompactExecSamplesKeepsTheFit) {
  // 5000 samples of 2e-4 + 9e-6 * rows with +-20% noise, rows 1..300 (awkward, non-uniform).
  std::vector<float> rows, secs;
  uint64_t s = 12345;
  for (int i = 0; i < 5000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(s >> 11) * 0x1.0p-53;
    const double r = 1 + std::floor(299 * u * u);
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double noise = 1 + 0.4 * (static_cast<double>(s >> 11) * 0x1.0p-53 - 0.5);
    rows.push_back(static_cast<float>(r));
    secs.push_back(static_cast<float>((2e-4 + 9e-6 * r) * noise));
  }
  auto full = FitAffine(rows, secs);
  ASSERT_TRUE(full.ok());
  CompactExecSamples(&rows, &secs, 64);
  EXPECT_EQ(rows.size(), 64u);
  EXPECT_EQ(secs.size(), 64u);
  auto small = FitAffine(rows, secs);
  ASSERT_TRUE(small.ok());
  // Bin means of equal-count bins: the fitted line moves by much less than the noise (20%); 2%
  // at the ends of the range is a loose bound for 78 samples per bin.
  for (double r : {1.0, 64.0, 300.0}) EXPECT_NEAR(small->At(r), full->At(r), 0.02 * full->At(r)) << r;
  std::vector<float> r2 = {1, 2}, s2 = {3, 4};
  CompactExecSamples(&r2, &s2, 8);  // already small: unchanged
  EXPECT_EQ(r2, (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace estream::config
