// The profiler's calibration request and measured runs (src/profiler/calibration.h, measure.h)
// and base ResetPeakRss: the built-in text gives >= 1000 tokens with every real vocabulary of
// shared/testdata/tokenizer and the synthetic one; repetition, truncation to the context length,
// BOS; one-line errors; the peak RSS of a MeasureRun after a bigger allocation was freed is this
// run's, not the earlier peak; where the reset is refused, the lifetime peak marked inexact.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/memory.h"
#include "gguf/gguf.h"
#include "pipeline_test_util.h"
#include "profiler/calibration.h"
#include "profiler/measure.h"
#include "tokenizer/tokenizer.h"

namespace estream {
namespace {

namespace fs = std::filesystem;
using pipeline_test::TestModels;

const fs::path kTokDir = fs::path(ESTREAM_SHARED_DIR) / "testdata" / "tokenizer";

// Allocates and touches `bytes`, then frees them (a block this big is mmapped by glibc, so the
// free returns it to the kernel at once): the process's peak RSS is then at least `bytes` above
// its current RSS.
void TouchAndFree(size_t bytes) {
  auto* p = static_cast<volatile char*>(std::malloc(bytes));
  ASSERT_NE(p, nullptr);
  for (size_t i = 0; i < bytes; i += 4096) p[i] = static_cast<char>(i >> 12);
  std::free(const_cast<char*>(p));
}

TEST(ResetPeakRss, ResetsThePeakToTheCurrentRss) {
  constexpr size_t kBig = size_t{256} << 20;
  TouchAndFree(kBig);
  const uint64_t before = PeakRssBytes();
  ASSERT_GE(before, kBig) << "VmHWM unreadable or the allocation was not resident";
  ASSERT_TRUE(ResetPeakRss()) << "/proc/self/clear_refs not writable";
  const uint64_t after = PeakRssBytes();
  const uint64_t current = CurrentRssBytes();
  EXPECT_LT(after + kBig / 2, before) << "peak not reset";
  // The reset sets VmHWM to the current RSS; allow for a few pages touched in between.
  EXPECT_LE(after, current + (uint64_t{4} << 20));
  // The peak is tracked again from there.
  TouchAndFree(kBig / 2);
  EXPECT_GE(PeakRssBytes(), kBig / 2);
}

TEST(CalibrationText, IsAboutSixKilobytesOfProse) {
  const std::string_view text = profiler::BuiltinCalibrationText();
  EXPECT_GE(text.size(), 5000u);
  EXPECT_LE(text.size(), 8000u);
  EXPECT_NE(text.front(), '\n');
  EXPECT_TRUE(Tokenizer::IsValidUtf8(text));
}

// Every real vocabulary: the built-in text alone gives >= 1000 tokens, and CalibrationTokens
// returns exactly the default count with BOS first when the vocabulary asks for it.
TEST(CalibrationTokens, RealVocabularies) {
  int n_files = 0;
  for (const char* name : {"ggml-vocab-gpt-2.gguf", "ggml-vocab-qwen3.gguf", "ggml-vocab-llama-spm.gguf"}) {
    const std::string path = (kTokDir / name).string();
    if (!fs::exists(path)) continue;
    ++n_files;
    auto file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    auto tok = Tokenizer::FromGguf(**file);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    const auto body = (*tok)->Encode(profiler::BuiltinCalibrationText(), false, false);
    EXPECT_GE(body.size(), 1000u) << name;

    auto ids = profiler::CalibrationTokens(path, "");
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    ASSERT_EQ(ids->size(), static_cast<size_t>(profiler::kDefaultCalibrationTokens)) << name;
    const size_t skip = (*tok)->add_bos() && (*tok)->bos_id() >= 0 ? 1 : 0;
    if (skip == 1) {
      EXPECT_EQ((*ids)[0], (*tok)->bos_id()) << name;
    }
    for (size_t i = skip; i < ids->size(); ++i) ASSERT_EQ((*ids)[i], body[i - skip]) << name << " at " << i;
  }
  EXPECT_EQ(n_files, 3) << "shared/testdata/tokenizer is incomplete";
}

TEST(CalibrationTokens, SyntheticVocabulary) {
  const std::string& model = TestModels().packed;
  auto ids = profiler::CalibrationTokens(model, "");
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(ids->size(), 1024u);
  auto file = GgufFile::Open(model);
  ASSERT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok());
  // The small synthetic vocabulary (512 tokens) needs more tokens for the text than 1024.
  EXPECT_GE((*tok)->Encode(profiler::BuiltinCalibrationText(), false, false).size(), 1000u);
  for (int32_t id : *ids) ASSERT_TRUE((*tok)->IsValidId(id));

  // More than the text gives, less than the context (4096): the text is repeated, no BOS between.
  auto more = profiler::CalibrationTokens(model, "", 3000);
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(more->size(), 3000u);
  // Beyond the context length: truncated to it.
  auto capped = profiler::CalibrationTokens(model, "", 100000);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->size(), 4096u);
}

TEST(CalibrationTokens, ShortFileIsRepeated) {
  pipeline_test::ScratchDir dir;
  const std::string path = dir.File("calib.txt");
  std::ofstream(path) << "The quick brown fox.";
  const std::string vocab = (kTokDir / "ggml-vocab-gpt-2.gguf").string();
  auto file = GgufFile::Open(vocab);
  ASSERT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok());
  const auto body = (*tok)->Encode("The quick brown fox.", false, false);
  ASSERT_FALSE(body.empty());
  const size_t skip = (*tok)->add_bos() && (*tok)->bos_id() >= 0 ? 1 : 0;
  auto ids = profiler::CalibrationTokens(vocab, path, 50);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  ASSERT_EQ(ids->size(), 50u);
  for (size_t i = skip; i < ids->size(); ++i) EXPECT_EQ((*ids)[i], body[(i - skip) % body.size()]) << i;
}

TEST(CalibrationTokens, Errors) {
  pipeline_test::ScratchDir dir;
  const std::string& model = TestModels().packed;
  auto expect_error = [](const Result<std::vector<int32_t>>& r, const std::string& needle) {
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << "not one line: " << r.status().ToString();
  };
  expect_error(profiler::CalibrationTokens(model, dir.File("missing.txt")), "missing.txt");
  expect_error(profiler::CalibrationTokens(dir.File("missing.gguf"), ""), "missing.gguf");
  expect_error(profiler::CalibrationTokens(model, "", 0), ">= 1");
  const std::string empty = dir.File("empty.txt");
  std::ofstream(empty).close();
  expect_error(profiler::CalibrationTokens(model, empty), "empty.txt");
  // A directory is not a readable text file.
  const std::string subdir = dir.File("subdir");
  fs::create_directories(subdir);
  expect_error(profiler::CalibrationTokens(model, subdir), "subdir");

  // A GGUF without tokenizer keys.
  const std::string bare = dir.File("bare.gguf");
  GgufWriter w;
  w.AddKv("general.architecture", GgufValue::String("olmoe"));
  ASSERT_TRUE(w.AddTensor("x", QuantType::kF32, {4}).ok());
  ASSERT_TRUE(w.Begin(bare).ok());
  const float x[4] = {1, 2, 3, 4};
  ASSERT_TRUE(w.WriteTensorData(x, sizeof(x)).ok());
  ASSERT_TRUE(w.Finish().ok());
  expect_error(profiler::CalibrationTokens(bare, ""), "tokenizer");
}

// A MeasureRun after a much bigger (freed) allocation reports its own, smaller peak.
TEST(MeasureRun, PeakRssIsThisRunsAfterABiggerEarlierAllocation) {
  const std::string& model = TestModels().packed;
  auto tokens = profiler::CalibrationTokens(model, "", 256);
  ASSERT_TRUE(tokens.ok());

  constexpr size_t kBig = size_t{512} << 20;
  TouchAndFree(kBig);
  ASSERT_GE(PeakRssBytes(), kBig);

  auto r = profiler::MeasureRun(model, {.n_threads = 2, .group_size = 4, .banks = 2, .queue_depth = 2,
                                        .budget_tokens = 256},
                                *tokens, /*repeat=*/3);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->peak_rss_bytes, 0u);
  EXPECT_LT(r->peak_rss_bytes, kBig / 2) << "the earlier peak leaked into the measurement";
  EXPECT_GE(r->peak_rss_bytes, r->response.peak_rss_bytes / 2);
  EXPECT_GT(r->seconds, 0);
  EXPECT_GT(r->load_seconds, 0);
  EXPECT_EQ(r->response.n_tokens, 256);
  ASSERT_EQ(r->response.top.size(), 1u);
  EXPECT_TRUE(r->response.config.streamed);
  EXPECT_EQ(r->response.config.group_size, 4);
  EXPECT_EQ(r->response.config.banks, 2);
  EXPECT_EQ(r->response.config.queue_depth, 2);
  EXPECT_GT(r->response.bytes_read, 0u);
}

// Where the peak cannot be reset (simulated: profiler::kRefuseClearRefsEnv), the figure is the
// process's peak since it started, and the result says so instead of passing it off as the run's.
TEST(MeasureRun, RefusedResetGivesTheCumulativePeakMarked) {
  const std::string& model = TestModels().packed;
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7};
  const EngineOptions options{.n_threads = 1, .group_size = 4, .banks = 2, .queue_depth = 2, .budget_tokens = 8};
  constexpr size_t kBig = size_t{256} << 20;
  TouchAndFree(kBig);
  const uint64_t earlier_peak = PeakRssBytes();
  ASSERT_GE(earlier_peak, kBig);

  ASSERT_EQ(::setenv(profiler::kRefuseClearRefsEnv, "1", 1), 0);
  EXPECT_FALSE(profiler::ResetPeakRssForMeasurement());
  auto r = profiler::MeasureRun(model, options, tokens, 1);
  ASSERT_EQ(::unsetenv(profiler::kRefuseClearRefsEnv), 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->peak_rss_exact);
  EXPECT_GE(r->peak_rss_bytes, earlier_peak) << "a refused reset must leave the lifetime peak, not a smaller figure";

  // The warning is one line that says what the figures mean.
  const std::string warning = profiler::CumulativePeakWarning();
  EXPECT_EQ(warning.find('\n'), std::string::npos);
  EXPECT_NE(warning.find("cumulative"), std::string::npos) << warning;

  // Reset allowed again: this run's own peak, marked exact.
  r = profiler::MeasureRun(model, options, tokens, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->peak_rss_exact);
  EXPECT_LT(r->peak_rss_bytes, kBig / 2);
}

TEST(MeasureRun, Errors) {
  const std::string& model = TestModels().packed;
  const std::vector<int32_t> tokens = {1, 2, 3};
  auto r0 = profiler::MeasureRun(model, {.n_threads = 1}, tokens, 0);
  ASSERT_FALSE(r0.ok());
  EXPECT_EQ(r0.status().code(), StatusCode::kInvalidArgument);
  auto r1 = profiler::MeasureRun(model, {.n_threads = 1}, {}, 1);
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.status().code(), StatusCode::kInvalidArgument);
  // Does not fit: the engine's ResourceExhausted comes back (the sweep skips such points).
  auto r2 = profiler::MeasureRun(model, {.n_threads = 1, .budget_bytes = 1 << 20}, tokens, 1);
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.status().code(), StatusCode::kResourceExhausted) << r2.status().ToString();
  auto r3 = profiler::MeasureRun("/nonexistent/model.gguf", {.n_threads = 1}, tokens, 1);
  EXPECT_FALSE(r3.ok());
}

}  // namespace
}  // namespace estream
