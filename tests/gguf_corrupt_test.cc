// Corrupt-file suite for the GGUF reader: one handcrafted file per defect, each asserting the
// error code and that the message names the file, the field and the byte offset; plus every
// truncation of a small valid file. Images are parsed from exact-size heap copies (so that ASan
// catches any read past the end) and from disk with mmap and with pread.
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "gguf_test_util.h"

namespace estream {
namespace {

using testing_gguf::Bytes;
using testing_gguf::ScratchDir;

constexpr uint32_t kTypeString = 8, kTypeArray = 9, kTypeU32 = 4, kTypeI32 = 5, kTypeBool = 7, kTypeF32 = 6;
constexpr uint32_t kF32 = 0, kQ4_0 = 2;

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type = kF32;
  uint64_t offset = 0;
  uint32_t n_dims_override = 0;  // when nonzero (or see n_dims_zero), written instead of dims.size()
  bool n_dims_zero = false;
};

// A GGUF image: header, the kvs (each appended by a function), the tensor infos, padding, and
// `data_bytes` bytes of data. Records where each tensor info starts.
struct Image {
  uint32_t magic = kGgufMagic;
  uint32_t version = 3;
  std::optional<uint64_t> n_kv_override, n_tensors_override;
  std::vector<std::function<void(Bytes&)>> kvs;
  std::vector<TensorSpec> tensors;
  uint32_t alignment = 32;
  uint64_t data_bytes = 0;

  std::vector<uint64_t> info_at;
  uint64_t data_offset = 0;

  std::vector<uint8_t> Build() {
    Bytes b;
    b.U32(magic).U32(version);
    b.U64(n_tensors_override.value_or(tensors.size()));
    b.U64(n_kv_override.value_or(kvs.size()));
    for (auto& kv : kvs) kv(b);
    info_at.clear();
    for (const TensorSpec& t : tensors) {
      info_at.push_back(b.size());
      b.Str(t.name);
      b.U32(t.n_dims_zero ? 0 : t.n_dims_override ? t.n_dims_override : static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) b.U64(d);
      b.U32(t.type);
      b.U64(t.offset);
    }
    b.PadTo(alignment);
    data_offset = b.size();
    for (uint64_t k = 0; k < data_bytes; ++k) b.U8(static_cast<uint8_t>(k * 7 + 1));
    return b.data();
  }
};

std::function<void(Bytes&)> KvU32(std::string key, uint32_t v) {
  return [=](Bytes& b) { b.Str(key).U32(kTypeU32).U32(v); };
}
std::function<void(Bytes&)> KvString(std::string key, std::string v) {
  return [=](Bytes& b) { b.Str(key).U32(kTypeString).Str(v); };
}

// Parses `bytes` every way the reader can: from an exact-size heap copy, and from a file with
// mmap and with pread. All three must agree on the outcome; returns the FromMemory status.
Status ParseAllWays(const std::vector<uint8_t>& bytes, const std::string& name = "case.gguf") {
  // Exact-size allocation: any read past the end is a heap overflow that ASan reports.
  std::unique_ptr<uint8_t[]> exact(new uint8_t[bytes.size() + (bytes.empty() ? 1 : 0)]);
  if (!bytes.empty()) std::memcpy(exact.get(), bytes.data(), bytes.size());
  auto mem = GgufFile::FromMemory(exact.get(), bytes.size(), name);
  // Touch every tensor's bytes when parsing succeeded (they must lie inside the buffer).
  if (mem.ok()) {
    uint64_t sum = 0;
    for (const GgufTensorInfo& t : (*mem)->tensors()) {
      const uint8_t* p = (*mem)->TensorData(t);
      for (uint64_t k = 0; k < t.n_bytes; ++k) sum += p[k];
    }
    static volatile uint64_t sink = 0;
    sink = sink + sum;
  }
  static ScratchDir dir;  // one directory for the whole binary, removed at exit
  const std::string path = dir.File(name);
  testing_gguf::WriteAll(path, bytes);
  for (bool use_mmap : {true, false}) {
    auto f = GgufFile::Open(path, {.mmap = use_mmap});
    EXPECT_EQ(f.ok(), mem.ok()) << (use_mmap ? "mmap: " : "pread: ") << f.status().ToString();
    if (!f.ok() && !mem.ok()) {
      EXPECT_EQ(f.status().code(), mem.status().code());
      // Same message up to the file name.
      std::string a = f.status().message(), b = mem.status().message();
      EXPECT_EQ(a.substr(a.find(':')), b.substr(b.find(':'))) << a << "\n" << b;
    }
  }
  return mem.ok() ? Status::Ok() : mem.status();
}

// Asserts a failure with `code` whose message names the file and contains every `parts` string.
void ExpectError(Image& image, StatusCode code, std::vector<std::string> parts) {
  Status s = ParseAllWays(image.Build());
  ASSERT_FALSE(s.ok()) << "a corrupt file was accepted";
  ::testing::Test::RecordProperty("message", s.ToString());  // visible with --gtest_output=xml
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_EQ(s.message().rfind("case.gguf: ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("at byte"), std::string::npos) << s.message();
  for (const std::string& p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' not in: " << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line";
}

// A valid image with two tensors: f32 [8, 2] at 0 and q4_0 [64, 1] at 64 (36 bytes, ends at 100).
Image Valid() {
  Image im;
  im.kvs.push_back(KvString("general.architecture", "olmoe"));
  im.kvs.push_back(KvU32("olmoe.block_count", 2));
  im.tensors.push_back({"a.weight", {8, 2}, kF32, 0});
  im.tensors.push_back({"b.weight", {64, 1}, kQ4_0, 64});
  im.data_bytes = 100;
  return im;
}

TEST(GgufCorrupt, ValidBaselineParses) {
  Image im = Valid();
  Status s = ParseAllWays(im.Build());
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(GgufCorrupt, BadMagic) {
  Image im = Valid();
  im.magic = 0x46554746;  // "FGUF"
  ExpectError(im, StatusCode::kCorruption, {"header.magic", "at byte 0", "0x46554746"});
}

TEST(GgufCorrupt, TooShortForMagic) {
  Status s = ParseAllWays({'G', 'G'});
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("header.magic"), std::string::npos) << s.message();
}

TEST(GgufCorrupt, BadVersion) {
  Image im = Valid();
  im.version = 1;
  ExpectError(im, StatusCode::kNotSupported, {"header.version", "at byte 4", "version 1"});
  im.version = 4;
  ExpectError(im, StatusCode::kNotSupported, {"header.version", "version 4"});
  im.version = 0x03000000;  // a big-endian v3 file
  ExpectError(im, StatusCode::kNotSupported, {"header.version", "big-endian"});
}

TEST(GgufCorrupt, KvCountTooLargeForFile) {
  Image im = Valid();
  im.n_kv_override = uint64_t{1} << 60;
  ExpectError(im, StatusCode::kCorruption, {"header.n_kv", "at byte 16", "cannot fit"});
}

TEST(GgufCorrupt, TensorCountTooLargeForFile) {
  Image im = Valid();
  im.n_tensors_override = 1000;
  ExpectError(im, StatusCode::kCorruption, {"header.n_tensors", "at byte 8", "cannot fit"});
}

TEST(GgufCorrupt, KeyLengthPastEof) {
  Image im = Valid();
  im.kvs.insert(im.kvs.begin(), [](Bytes& b) { b.U64(uint64_t{1} << 40); });
  ExpectError(im, StatusCode::kCorruption, {"kv[0].key", "at byte 24", "string length 1099511627776 runs past end"});
}

TEST(GgufCorrupt, StringValueLengthPastEof) {
  Image im = Valid();
  im.kvs.push_back([](Bytes& b) { b.Str("general.name").U32(kTypeString).U64(~uint64_t{0}); });
  ExpectError(im, StatusCode::kCorruption, {"kv[2] 'general.name'", "runs past end of file"});
}

TEST(GgufCorrupt, TensorNameLengthPastEof) {
  Image head = Valid();
  head.tensors.clear();
  head.n_tensors_override = 1;
  head.alignment = 1;  // no padding: the tensor info follows the kvs directly
  std::vector<uint8_t> b = head.Build();
  Bytes tail;
  tail.U64(uint64_t{1} << 33).Fill(32);
  b.insert(b.end(), tail.data().begin(), tail.data().end());
  Status s = ParseAllWays(b);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("tensor[0].name"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("runs past end of file"), std::string::npos) << s.message();
}

TEST(GgufCorrupt, UnknownValueType) {
  Image im = Valid();
  im.kvs.push_back([](Bytes& b) { b.Str("weird").U32(13).U32(0); });
  ExpectError(im, StatusCode::kNotSupported, {"kv[2] 'weird' value type", "unknown value type 13"});
}

TEST(GgufCorrupt, UnknownArrayElementType) {
  Image im = Valid();
  im.kvs.push_back([](Bytes& b) { b.Str("arr").U32(kTypeArray).U32(77).U64(1).U32(0); });
  ExpectError(im, StatusCode::kNotSupported, {"'arr'", "array element type", "unknown value type 77"});
}

TEST(GgufCorrupt, ArrayCountTooLargeForFile) {
  Image im = Valid();
  im.kvs.push_back([](Bytes& b) { b.Str("tokenizer.ggml.tokens").U32(kTypeArray).U32(kTypeString).U64(uint64_t{1} << 58); });
  ExpectError(im, StatusCode::kCorruption, {"'tokenizer.ggml.tokens' array count", "cannot fit"});
}

TEST(GgufCorrupt, StringInsideArrayPastEof) {
  Image im = Valid();
  im.kvs.push_back([](Bytes& b) {
    b.Str("tokenizer.ggml.tokens").U32(kTypeArray).U32(kTypeString).U64(2).Str("ok").U64(1 << 20);
  });
  ExpectError(im, StatusCode::kCorruption, {"'tokenizer.ggml.tokens'[1]", "runs past end of file"});
}

TEST(GgufCorrupt, BoolOutOfRange) {
  Image im = Valid();
  im.kvs.push_back([](Bytes& b) { b.Str("flag").U32(kTypeBool).U8(2); });
  ExpectError(im, StatusCode::kCorruption, {"'flag'", "bool value 2"});
}

TEST(GgufCorrupt, ArraysNestedTooDeep) {
  Image im = Valid();
  im.kvs.push_back([](Bytes& b) {
    b.Str("deep").U32(kTypeArray);
    for (int k = 0; k < 20; ++k) b.U32(kTypeArray).U64(1);
    b.U32(kTypeU32).U64(0);
  });
  ExpectError(im, StatusCode::kCorruption, {"'deep'", "nested deeper"});
}

TEST(GgufCorrupt, UnknownTensorType) {
  Image im = Valid();
  im.tensors[1].type = 99;
  ExpectError(im, StatusCode::kNotSupported, {"tensor 'b.weight' type", "unknown tensor type 99", "2=q4_0", "12=q4_K"});
}

TEST(GgufCorrupt, NDimsZeroOrFive) {
  Image im = Valid();
  im.tensors[0].n_dims_zero = true;
  im.tensors[0].dims = {};
  im.Build();
  const std::string at = "info at byte " + std::to_string(im.info_at[0]);
  ExpectError(im, StatusCode::kCorruption, {"tensor 'a.weight'", at, "n_dims 0"});
  im = Valid();
  im.tensors[0].dims = {8, 2, 1, 1, 1};
  ExpectError(im, StatusCode::kCorruption, {"tensor 'a.weight'", "n_dims 5"});
}

TEST(GgufCorrupt, DimProductOverflow) {
  Image im = Valid();
  im.tensors[0].dims = {uint64_t{1} << 32, uint64_t{1} << 32};
  ExpectError(im, StatusCode::kCorruption, {"tensor 'a.weight'", "element count", "overflows"});
  im = Valid();
  im.tensors[0].dims = {~uint64_t{0}};
  ExpectError(im, StatusCode::kCorruption, {"tensor 'a.weight'", "dims[0]", "does not fit in int64"});
  im = Valid();
  im.tensors[0].dims = {uint64_t{1} << 61};  // 2^61 f32 elements: 2^63 bytes
  ExpectError(im, StatusCode::kCorruption, {"tensor 'a.weight'", "byte size", "overflows"});
}

TEST(GgufCorrupt, ZeroDimIsAllowed) {
  // ggml allows 0-sized dims; such a tensor has no bytes.
  Image im = Valid();
  im.tensors.push_back({"empty", {0, 5}, kF32, 0});
  EXPECT_TRUE(ParseAllWays(im.Build()).ok());
}

TEST(GgufCorrupt, RowNotMultipleOfBlockSize) {
  Image im = Valid();
  im.tensors[1].dims = {48, 1};
  ExpectError(im, StatusCode::kCorruption, {"tensor 'b.weight'", "dims[0] = 48", "block size 32"});
}

TEST(GgufCorrupt, MisalignedOffset) {
  Image im = Valid();
  im.tensors[1].offset = 68;
  ExpectError(im, StatusCode::kCorruption, {"tensor 'b.weight'", "data offset 68", "alignment 32"});
}

TEST(GgufCorrupt, OffsetPastEof) {
  Image im = Valid();
  im.tensors[1].offset = 96;  // 36 bytes from 96 end at 132 > 100
  im.Build();
  const std::string at = "(info at byte " + std::to_string(im.info_at[1]) + ")";
  ExpectError(im, StatusCode::kCorruption,
              {"tensor 'b.weight' " + at, "data offset 96 + 36 bytes runs past end of file",
               "file size " + std::to_string(im.data_offset + 100)});
  im.tensors[1].offset = ~uint64_t{0} - 31;  // aligned, and data_offset + offset overflows
  ExpectError(im, StatusCode::kCorruption, {"tensor 'b.weight'", "runs past end of file"});
}

// header.n_tensors one too small: the last tensor info is read as padding, and the data section
// would start too early (every tensor shifted, the last one lost). Its bytes are not zero.
TEST(GgufCorrupt, TensorCountOneTooSmallLeavesNonZeroPadding) {
  Image im = Valid();
  im.tensors.push_back({"c.weight", {8}, kF32, 128});
  im.data_bytes = 160;
  im.n_tensors_override = 2;
  im.Build();
  ExpectError(im, StatusCode::kCorruption,
              {"header padding (at byte " + std::to_string(im.info_at[2]) + ")", "is not zero",
               "header.n_tensors = 2 may be lower than the number of tensor infos"});
  // Non-zero padding after complete infos is refused too (writers pad with zeros).
  Image pad = Valid();
  std::vector<uint8_t> bytes = pad.Build();
  ASSERT_GT(pad.data_offset, pad.info_at[1] + 8 + 8 + 2 * 8 + 4 + 4 + 8) << "the test needs some padding";
  bytes[pad.data_offset - 1] = 1;
  const Status st = ParseAllWays(bytes);
  EXPECT_NE(st.message().find("header padding"), std::string::npos) << st.ToString();
}

// The same with the counted infos ending exactly on an alignment boundary: no padding to read, so
// the reader finds the info left out where the data section would start, and the file's bytes
// past the last counted tensor's data.
TEST(GgufCorrupt, TensorCountOneTooSmallOnAnAlignmentBoundary) {
  Image im;
  for (int k = 0; k < 32; ++k) {
    im = Valid();
    im.kvs.push_back(KvString("general.name", std::string(k, 'x')));
    im.tensors.push_back({"c.weight", {8}, kF32, 128});
    im.data_bytes = 160;
    im.Build();
    if (im.info_at[2] % im.alignment == 0) break;
  }
  ASSERT_EQ(im.info_at[2] % im.alignment, 0u);
  im.n_tensors_override = 2;
  ExpectError(im, StatusCode::kCorruption,
              {"header.n_tensors (at byte 8): 2 is lower than the number of tensor infos",
               "an info of tensor 'c.weight' starts at byte " + std::to_string(im.info_at[2])});
  // Bytes past the data that are not a tensor info (a writer that does not trim) are accepted.
  Image tail = Valid();
  tail.data_bytes = 300;
  const Status st = ParseAllWays(tail.Build());
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(GgufCorrupt, OverlappingTensors) {
  Image im = Valid();
  im.tensors[1].offset = 32;  // a.weight covers [0, 64)
  ExpectError(im, StatusCode::kCorruption, {"tensor 'b.weight'", "overlaps tensor 'a.weight'", "[0, 64)"});
}

TEST(GgufCorrupt, DuplicateKey) {
  Image im = Valid();
  im.kvs.push_back(KvU32("olmoe.block_count", 3));
  ExpectError(im, StatusCode::kCorruption, {"kv[2] 'olmoe.block_count'", "duplicate key", "kv[1]"});
}

TEST(GgufCorrupt, DuplicateTensorName) {
  Image im = Valid();
  im.tensors[1].name = "a.weight";
  ExpectError(im, StatusCode::kCorruption, {"tensor 'a.weight'", "duplicate tensor name"});
}

TEST(GgufCorrupt, BadAlignmentValue) {
  for (uint32_t a : {0u, 48u, 0x80000001u}) {
    Image im = Valid();
    im.kvs.push_back(KvU32("general.alignment", a));
    ExpectError(im, StatusCode::kCorruption, {"general.alignment", std::to_string(a) + " is not a power of two"});
  }
  Image im = Valid();
  im.kvs.push_back([](Bytes& b) { b.Str("general.alignment").U32(kTypeI32).U32(64); });
  ExpectError(im, StatusCode::kCorruption, {"general.alignment", "has type i32, must be u32"});
  // A valid non-default alignment is honoured: offsets must be multiples of it.
  im = Valid();
  im.kvs.push_back(KvU32("general.alignment", 64));
  im.alignment = 64;
  EXPECT_TRUE(ParseAllWays(im.Build()).ok());
  im.tensors[1].offset = 32;
  im.tensors[0].dims = {4, 2};
  ExpectError(im, StatusCode::kCorruption, {"tensor 'b.weight'", "alignment 64"});
}

TEST(GgufCorrupt, EmptyFile) {
  Status s = ParseAllWays({});
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("header.magic"), std::string::npos) << s.message();
}

// Every prefix of a small valid file fails cleanly: an error naming the file, no crash, no
// out-of-bounds read (exact-size buffers under ASan). The file's last tensor ends at EOF, so no
// prefix is itself a valid file.
TEST(GgufCorrupt, EveryTruncationFails) {
  Image im;
  im.kvs.push_back(KvString("general.architecture", "qwen3moe"));
  im.kvs.push_back(KvU32("qwen3moe.block_count", 1));
  im.kvs.push_back([](Bytes& b) { b.Str("f").U32(kTypeF32).F32(0.5f); });
  im.kvs.push_back([](Bytes& b) { b.Str("flag").U32(kTypeBool).U8(1); });
  im.kvs.push_back([](Bytes& b) {
    b.Str("tokenizer.ggml.tokens").U32(kTypeArray).U32(kTypeString).U64(3).Str("a").Str("bc").Str("");
  });
  im.kvs.push_back([](Bytes& b) { b.Str("ids").U32(kTypeArray).U32(kTypeI32).U64(3).U32(1).U32(2).U32(3); });
  im.kvs.push_back([](Bytes& b) {
    b.Str("nested").U32(kTypeArray).U32(kTypeArray).U64(1).U32(kTypeU32).U64(2).U32(7).U32(8);
  });
  im.tensors.push_back({"token_embd.weight", {8, 2}, kF32, 0});
  im.tensors.push_back({"blk.0.ffn_up_exps.weight", {64, 1, 1}, kQ4_0, 64});
  im.data_bytes = 100;
  const std::vector<uint8_t> full = im.Build();
  ASSERT_TRUE(ParseAllWays(full).ok());
  for (size_t len = 0; len < full.size(); ++len) {
    SCOPED_TRACE("prefix of " + std::to_string(len) + " of " + std::to_string(full.size()) + " bytes");
    std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
    Status s = ParseAllWays(prefix, "trunc.gguf");
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
    EXPECT_EQ(s.message().rfind("trunc.gguf: ", 0), 0u) << s.message();
    EXPECT_NE(s.message().find("at byte"), std::string::npos) << s.message();
  }
}

// Every single-byte corruption of the header region either parses or fails cleanly.
TEST(GgufCorrupt, EveryHeaderByteFlipFailsCleanlyOrParses) {
  Image im = Valid();
  const std::vector<uint8_t> full = im.Build();
  for (size_t pos = 0; pos < im.data_offset; ++pos) {
    for (uint8_t x : {uint8_t{0x00}, uint8_t{0xff}, uint8_t{0x80}}) {
      std::vector<uint8_t> bad = full;
      bad[pos] ^= x == 0 ? bad[pos] : x;  // 0 clears the byte, others flip bits
      SCOPED_TRACE("byte " + std::to_string(pos));
      Status s = ParseAllWays(bad, "flip.gguf");
      if (!s.ok()) {
        EXPECT_EQ(s.message().rfind("flip.gguf: ", 0), 0u) << s.message();
      }
    }
  }
}

}  // namespace
}  // namespace estream
