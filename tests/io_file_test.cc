// PosixFile (O_DIRECT where possible) and FaultInjectingFile: the "OK only if all bytes were
// read" contract, errors naming the offset, short reads resumed.
#include "io/file.h"

#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

#include "base/memory.h"
#include "io_test_util.h"

namespace estream::io {
namespace {

using testing_io::FirstMismatch;
using testing_io::TempPatternFile;

constexpr size_t kA = kDirectIoAlignment;

AlignedPtr<uint8_t> Buffer(size_t n) {
  auto p = AllocAligned<uint8_t>(n, kA);
  std::memset(p.get(), 0xCD, n);  // poison: a read that does not land is visible
  return p;
}

TEST(PosixFile, OpenSizeAndDirect) {
  TempPatternFile tf(5 * kA + 123, 11, "io_file");
  auto f = PosixFile::Open(tf.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->size(), 5 * kA + 123);
  EXPECT_GE((*f)->fd(), 0);
  EXPECT_EQ((*f)->name(), tf.path());
  // The build directory sits on a disk file system: O_DIRECT is expected to work there. Where
  // it does not (tmpfs), the file falls back to buffered reads with alignment 1.
  EXPECT_EQ((*f)->alignment(), (*f)->direct() ? kA : 1u);
  auto buffered = PosixFile::Open(tf.path(), {.direct = false});
  ASSERT_TRUE(buffered.ok());
  EXPECT_FALSE((*buffered)->direct());
  EXPECT_EQ((*buffered)->alignment(), 1u);

  auto missing = PosixFile::Open(tf.path() + ".missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIOError);
  EXPECT_NE(missing.status().message().find(".missing"), std::string::npos);
}

TEST(PosixFile, ReadAtReadsEverythingOrFails) {
  const uint64_t size = 9 * kA + 77;
  TempPatternFile tf(size, 12, "io_file");
  for (bool direct : {true, false}) {
    auto f = PosixFile::Open(tf.path(), {.direct = direct});
    ASSERT_TRUE(f.ok());
    auto buf = Buffer(10 * kA);
    ASSERT_TRUE((*f)->ReadAt(2 * kA, 4 * kA, buf.get()).ok());
    EXPECT_EQ(FirstMismatch(tf.seed(), 2 * kA, buf.get(), 4 * kA), 4 * kA);
    // Past the end: an error naming the offset, not a silent short read.
    Status s = (*f)->ReadAt(8 * kA, 2 * kA, buf.get());
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kIOError);
    EXPECT_NE(s.message().find("end of file"), std::string::npos) << s.message();
    if ((*f)->alignment() > 1) {
      Status mis = (*f)->ReadAt(100, kA, buf.get());
      EXPECT_EQ(mis.code(), StatusCode::kInvalidArgument) << mis.ToString();
    } else {
      ASSERT_TRUE((*f)->ReadAt(100, 333, buf.get() + 1).ok());
      EXPECT_EQ(FirstMismatch(tf.seed(), 100, buf.get() + 1, 333), 333u);
    }
  }
}

TEST(FaultInjectingFile, ErrorsShortReadsAndDelays) {
  const uint64_t size = 16 * kA;
  TempPatternFile tf(size, 13, "io_file");
  auto base = PosixFile::Open(tf.path());
  ASSERT_TRUE(base.ok());
  FaultInjectingFile f(base->get(), {.rules = {{.kind = FaultRule::Kind::kError, .offset = 5 * kA + 10, .length = 1,
                                                .times = 1},
                                               {.kind = FaultRule::Kind::kDelay, .offset = 0, .length = size,
                                                .delay_s = 1e-4}}});
  auto buf = Buffer(size);
  // The error rule overlaps [4K*5+10]: the first read covering it fails once, with the offset.
  Status s = f.ReadAt(4 * kA, 4 * kA, buf.get());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find("offset " + std::to_string(4 * kA)), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(tf.path()), std::string::npos);
  EXPECT_EQ(f.injected_errors(), 1u);
  // times = 1: the same read now succeeds.
  ASSERT_TRUE(f.ReadAt(4 * kA, 4 * kA, buf.get()).ok());
  EXPECT_EQ(FirstMismatch(tf.seed(), 4 * kA, buf.get(), 4 * kA), 4 * kA);
  // Reads starting in the first two blocks return at most 5000 bytes: resumed until done.
  f.ClearRules();
  f.AddRule({.kind = FaultRule::Kind::kShortRead, .offset = 0, .length = 2 * kA, .short_bytes = 5000});
  ASSERT_TRUE(f.ReadAt(0, 8 * kA, buf.get()).ok());
  EXPECT_EQ(FirstMismatch(tf.seed(), 0, buf.get(), 8 * kA), 8 * kA);
  EXPECT_GE(f.injected_short_reads(), 1u);
}

TEST(FaultInjectingFile, StalledShortReadsFailInsteadOfLooping) {
  TempPatternFile tf(4 * kA, 14, "io_file");
  auto base = PosixFile::Open(tf.path());
  ASSERT_TRUE(base.ok());
  if ((*base)->alignment() == 1) GTEST_SKIP() << "no O_DIRECT here: a 100-byte read always makes progress";
  FaultInjectingFile f(base->get(), {.rules = {{.kind = FaultRule::Kind::kShortRead, .offset = 0, .length = kA,
                                                .short_bytes = 100}}});
  auto buf = Buffer(4 * kA);
  Status s = f.ReadAt(0, 4 * kA, buf.get());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("aligned block"), std::string::npos) << s.message();
}

TEST(FaultInjectingFile, RandomShortReads) {
  const uint64_t size = 64 * kA;
  TempPatternFile tf(size, 15, "io_file");
  auto base = PosixFile::Open(tf.path(), {.direct = false});
  ASSERT_TRUE(base.ok());
  FaultInjectingFile f(base->get(), {.short_read_probability = 0.7, .seed = 3});
  auto buf = Buffer(size);
  ASSERT_TRUE(f.ReadAt(0, size, buf.get()).ok());
  EXPECT_EQ(FirstMismatch(tf.seed(), 0, buf.get(), size), size);
  EXPECT_GE(f.injected_short_reads(), 1u);
}

}  // namespace
}  // namespace estream::io
