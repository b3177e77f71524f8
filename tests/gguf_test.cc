// GGUF writer -> reader round trips (every value type, every tensor type, v2 and v3, mmap and
// pread), writer failure behaviour, a sparse 17 GB file opened without reading it, and the real
// GGUF files of shared/testdata.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <csignal>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/file_signals.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"

namespace estream {
namespace {

using testing_gguf::Bytes;
using testing_gguf::ReadAll;
using testing_gguf::ScratchDir;

uint32_t FreshSeed() { return std::random_device{}(); }

// memcmp that accepts empty ranges (whose pointers may be null).
bool SameBytes(const void* a, const void* b, size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

// Deep equality of two values; `where` names the place for failure messages.
void ExpectSameValue(const GgufValue& a, const GgufValue& b, const std::string& where) {
  ASSERT_EQ(a.type, b.type) << where;
  switch (a.type) {
    case GgufType::kU8: case GgufType::kU16: case GgufType::kU32: case GgufType::kU64: case GgufType::kBool:
      EXPECT_EQ(a.u, b.u) << where;
      break;
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64:
      EXPECT_EQ(a.i, b.i) << where;
      break;
    case GgufType::kF32: case GgufType::kF64:
      if (std::isnan(a.f)) EXPECT_TRUE(std::isnan(b.f)) << where;
      else EXPECT_EQ(a.f, b.f) << where;
      break;
    case GgufType::kString:
      EXPECT_EQ(a.str, b.str) << where;
      break;
    case GgufType::kArray:
      ASSERT_EQ(a.elem_type, b.elem_type) << where;
      ASSERT_EQ(a.array.size(), b.array.size()) << where;
      for (size_t k = 0; k < a.array.size(); ++k) ExpectSameValue(a.array[k], b.array[k], where + "[" + std::to_string(k) + "]");
      break;
  }
}

// One random value of scalar type t; values are representable in t (so they survive the round trip).
GgufValue RandomScalar(GgufType t, std::mt19937_64& rng) {
  GgufValue v = GgufValue::Of(t);
  const uint64_t r = rng();
  switch (t) {
    case GgufType::kU8: v.u = r & 0xff; break;
    case GgufType::kI8: v.i = static_cast<int8_t>(r); break;
    case GgufType::kU16: v.u = r & 0xffff; break;
    case GgufType::kI16: v.i = static_cast<int16_t>(r); break;
    case GgufType::kU32: v.u = r & 0xffffffffu; break;
    case GgufType::kI32: v.i = static_cast<int32_t>(r); break;
    case GgufType::kU64: v.u = r; break;
    case GgufType::kI64: v.i = static_cast<int64_t>(r); break;
    case GgufType::kF32: v.f = std::ldexp(static_cast<float>(static_cast<int32_t>(r)), -20); break;
    case GgufType::kF64: v.f = std::ldexp(static_cast<double>(static_cast<int64_t>(r)), -40); break;
    case GgufType::kBool: v.u = r & 1; break;
    case GgufType::kString: {
      std::string s(r % 40, '\0');
      for (char& c : s) c = static_cast<char>(rng());  // arbitrary bytes incl. NUL and UTF-8 fragments
      v.str = s;
      break;
    }
    case GgufType::kArray: break;
  }
  return v;
}

const GgufType kScalarTypes[] = {GgufType::kU8,  GgufType::kI8,  GgufType::kU16, GgufType::kI16, GgufType::kU32,
                                 GgufType::kI32, GgufType::kF32, GgufType::kBool, GgufType::kString,
                                 GgufType::kU64, GgufType::kI64, GgufType::kF64};

// Every known tensor type id.
std::vector<QuantType> AllTensorTypes() {
  std::vector<QuantType> out;
  for (uint32_t id = 0; id < 256; ++id)
    if (const TypeTraits* tr = GetTypeTraits(id)) out.push_back(tr->type);
  return out;
}

class GgufVersionTest : public ::testing::TestWithParam<uint32_t> {};
INSTANTIATE_TEST_SUITE_P(V2V3, GgufVersionTest, ::testing::Values(2u, 3u));

TEST_P(GgufVersionTest, EveryValueTypeRoundTrips) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ScratchDir dir;
  const std::string path = dir.File("values.gguf");

  std::vector<GgufKv> expected;
  for (GgufType t : kScalarTypes) {
    expected.push_back({std::string("scalar.") + GgufTypeName(t), RandomScalar(t, rng)});
    // Arrays of every type: empty, one element, and an awkward length.
    for (size_t n : {0, 1, 37}) {
      std::vector<GgufValue> elems;
      for (size_t k = 0; k < n; ++k) elems.push_back(RandomScalar(t, rng));
      expected.push_back({std::string("array.") + GgufTypeName(t) + "." + std::to_string(n),
                          GgufValue::Array(t, std::move(elems))});
    }
  }
  // Extremes and special cases.
  GgufValue u64max = GgufValue::U64(std::numeric_limits<uint64_t>::max());
  GgufValue i64min = GgufValue::Of(GgufType::kI64);
  i64min.i = std::numeric_limits<int64_t>::min();
  GgufValue f32nan = GgufValue::F32(std::numeric_limits<float>::quiet_NaN());
  GgufValue f64inf = GgufValue::Of(GgufType::kF64);
  f64inf.f = -std::numeric_limits<double>::infinity();
  expected.push_back({"extreme.u64max", u64max});
  expected.push_back({"extreme.i64min", i64min});
  expected.push_back({"extreme.f32nan", f32nan});
  expected.push_back({"extreme.f64inf", f64inf});
  expected.push_back({"string.empty", GgufValue::String("")});
  expected.push_back({"string.utf8", GgufValue::String("Grüße, 世界 \xF0\x9F\x98\x80")});
  expected.push_back({"", GgufValue::String("empty key")});
  expected.push_back({"factory.u32", GgufValue::U32(0xdeadbeef)});
  expected.push_back({"factory.i32", GgufValue::I32(-123456)});
  expected.push_back({"factory.f32", GgufValue::F32(1e-6f)});
  expected.push_back({"factory.bool", GgufValue::Bool(true)});
  expected.push_back({"factory.strings", GgufValue::StringArray({"a", "", "ccc"})});
  expected.push_back({"factory.f32s", GgufValue::F32Array({1.5f, -2.25f})});
  expected.push_back({"factory.i32s", GgufValue::I32Array({-1, 0, 7})});
  // Nested arrays: an array of arrays of (u16 | string), and an empty array of arrays.
  std::vector<GgufValue> inner;
  inner.push_back(GgufValue::Array(GgufType::kU16, {RandomScalar(GgufType::kU16, rng)}));
  inner.push_back(GgufValue::Array(GgufType::kString, {GgufValue::String("x"), GgufValue::String("yz")}));
  inner.push_back(GgufValue::Array(GgufType::kArray, {GgufValue::Array(GgufType::kI8, {})}));
  expected.push_back({"nested.arrays", GgufValue::Array(GgufType::kArray, inner)});
  expected.push_back({"nested.empty", GgufValue::Array(GgufType::kArray, {})});

  GgufWriter writer(GetParam());
  for (const GgufKv& kv : expected) writer.AddKv(kv.key, kv.value);
  ASSERT_TRUE(writer.Begin(path).ok());
  Status s = writer.Finish();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(std::filesystem::file_size(path), writer.ExpectedFileSize());

  for (bool use_mmap : {true, false}) {
    SCOPED_TRACE(use_mmap ? "mmap" : "pread");
    auto file = GgufFile::Open(path, {.mmap = use_mmap});
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    EXPECT_EQ((*file)->version(), GetParam());
    EXPECT_EQ((*file)->alignment(), kGgufDefaultAlignment);
    EXPECT_TRUE((*file)->tensors().empty());
    ASSERT_EQ((*file)->kvs().size(), expected.size());
    for (size_t k = 0; k < expected.size(); ++k) {
      EXPECT_EQ((*file)->kvs()[k].key, expected[k].key);
      const GgufValue* v = (*file)->Find(expected[k].key);
      ASSERT_NE(v, nullptr) << expected[k].key;
      ExpectSameValue(expected[k].value, *v, expected[k].key);
    }
    EXPECT_EQ((*file)->Find("no.such.key"), nullptr);
  }
}

TEST_P(GgufVersionTest, EveryTensorTypeRoundTrips) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ScratchDir dir;

  for (uint32_t alignment : {32u, 64u, 4096u}) {
    SCOPED_TRACE("alignment " + std::to_string(alignment));
    const std::string path = dir.File("tensors" + std::to_string(alignment) + ".gguf");
    GgufWriter writer(GetParam(), alignment);
    writer.AddKv("general.architecture", GgufValue::String("test"));
    struct Expect {
      std::string name;
      QuantType type;
      std::vector<int64_t> dims;
      std::vector<uint8_t> bytes;
    };
    std::vector<Expect> expected;
    int n = 0;
    for (QuantType t : AllTensorTypes()) {
      const TypeTraits* tr = GetTypeTraits(t);
      // Awkward shapes: 1 to 4 dims, 3 blocks per row, odd trailing dims.
      std::vector<int64_t> dims = {int64_t{tr->block_size} * 3};
      for (int d = 1; d < 1 + n % 4; ++d) dims.push_back(d == 1 ? 5 : 3);
      Expect e{std::string("t.") + tr->name + "." + std::to_string(n++), t, dims, {}};
      ASSERT_TRUE(writer.AddTensor(e.name, t, dims).ok()) << e.name;
      expected.push_back(std::move(e));
    }
    // A zero-element tensor in the middle of the data and one at the end.
    ASSERT_TRUE(writer.AddTensor("empty", QuantType::kF32, {0, 4}).ok());
    expected.push_back({"empty", QuantType::kF32, {0, 4}, {}});
    ASSERT_EQ(writer.tensors().size(), expected.size());
    for (size_t k = 0; k < expected.size(); ++k) {
      const GgufTensorInfo& info = writer.tensors()[k];
      EXPECT_EQ(info.offset % alignment, 0u);
      expected[k].bytes.resize(info.n_bytes);
      for (uint8_t& b : expected[k].bytes) b = static_cast<uint8_t>(rng());
    }

    ASSERT_TRUE(writer.Begin(path).ok());
    // Write each tensor in uneven chunks, sometimes spanning into the next tensor.
    std::vector<uint8_t> all;
    for (const Expect& e : expected) all.insert(all.end(), e.bytes.begin(), e.bytes.end());
    size_t pos = 0;
    while (pos < all.size()) {
      size_t chunk = std::min<size_t>(all.size() - pos, 1 + rng() % 700);
      ASSERT_TRUE(writer.WriteTensorData(all.data() + pos, chunk).ok());
      pos += chunk;
    }
    Status s = writer.Finish();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(std::filesystem::file_size(path), writer.ExpectedFileSize());

    for (bool use_mmap : {true, false}) {
      SCOPED_TRACE(use_mmap ? "mmap" : "pread");
      auto file = GgufFile::Open(path, {.mmap = use_mmap});
      ASSERT_TRUE(file.ok()) << file.status().ToString();
      const GgufFile& f = **file;
      EXPECT_EQ(f.alignment(), alignment);
      EXPECT_EQ(f.data_offset() % alignment, 0u);
      ASSERT_EQ(f.tensors().size(), expected.size());
      for (const Expect& e : expected) {
        SCOPED_TRACE(e.name);
        const GgufTensorInfo* t = f.FindTensor(e.name);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(t->type, e.type);
        ASSERT_EQ(t->n_dims, static_cast<int>(e.dims.size()));
        uint64_t n_el = 1;
        for (size_t d = 0; d < e.dims.size(); ++d) {
          EXPECT_EQ(t->dims[d], e.dims[d]);
          n_el *= static_cast<uint64_t>(e.dims[d]);
        }
        EXPECT_EQ(t->ne(3), e.dims.size() > 3 ? e.dims[3] : 1);
        EXPECT_EQ(t->n_elements, n_el);
        ASSERT_EQ(t->n_bytes, e.bytes.size());
        if (use_mmap) {
          ASSERT_NE(f.TensorData(*t), nullptr);
          EXPECT_TRUE(SameBytes(f.TensorData(*t), e.bytes.data(), e.bytes.size()));
        } else {
          EXPECT_EQ(f.TensorData(*t), nullptr);
        }
        // ReadTensor of the whole tensor and of an interior range; a range past the end fails.
        std::vector<uint8_t> got(e.bytes.size() + 1, 0xcd);
        ASSERT_TRUE(f.ReadTensor(*t, 0, got.data(), e.bytes.size()).ok());
        EXPECT_TRUE(SameBytes(got.data(), e.bytes.data(), e.bytes.size()));
        if (e.bytes.size() > 3) {
          ASSERT_TRUE(f.ReadTensor(*t, 1, got.data(), e.bytes.size() - 2).ok());
          EXPECT_EQ(0, std::memcmp(got.data(), e.bytes.data() + 1, e.bytes.size() - 2));
        }
        Status past = f.ReadTensor(*t, e.bytes.size(), got.data(), 1);
        EXPECT_EQ(past.code(), StatusCode::kInvalidArgument);
      }
    }
  }
}

TEST(GgufWriter, LargeChunksBypassTheBuffer) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  ScratchDir dir;
  const std::string path = dir.File("big.gguf");
  // 9 MiB + a bit: larger than the writer's 8 MiB buffer, written in one call.
  const int64_t n = (9 << 20) / 4 + 13;
  std::vector<float> data(static_cast<size_t>(n));
  for (float& x : data) x = static_cast<float>(rng());
  GgufWriter writer;
  ASSERT_TRUE(writer.AddTensor("small", QuantType::kF16, {3}).ok());
  ASSERT_TRUE(writer.AddTensor("big", QuantType::kF32, {n}).ok());
  ASSERT_TRUE(writer.Begin(path).ok());
  const uint16_t small[3] = {1, 2, 3};
  ASSERT_TRUE(writer.WriteTensorData(small, sizeof(small)).ok());
  ASSERT_TRUE(writer.WriteTensorData(data.data(), data.size() * 4).ok());
  ASSERT_TRUE(writer.Finish().ok());
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufTensorInfo* big = (*file)->FindTensor("big");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(0, std::memcmp((*file)->TensorData(*big), data.data(), data.size() * 4));
  EXPECT_EQ(0, std::memcmp((*file)->TensorData(*(*file)->FindTensor("small")), small, sizeof(small)));
}

TEST(GgufWriter, UnwritablePathIsAnIOErrorNamingThePath) {
  ScratchDir dir;
  const std::string path = dir.File("no/such/dir/model.gguf");
  GgufWriter writer;
  ASSERT_TRUE(writer.AddTensor("t", QuantType::kF32, {4}).ok());
  Status s = writer.Begin(path);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_TRUE(dir.List().empty());
  // Later calls keep failing instead of crashing.
  const float x[4] = {1, 2, 3, 4};
  EXPECT_FALSE(writer.WriteTensorData(x, sizeof(x)).ok());
  EXPECT_FALSE(writer.Finish().ok());
}

TEST(GgufWriter, AbandonedOrFailedWritesLeaveNothingBehind) {
  ScratchDir dir;
  const float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  {  // Destroyed before Finish.
    GgufWriter writer;
    ASSERT_TRUE(writer.AddTensor("t", QuantType::kF32, {8}).ok());
    ASSERT_TRUE(writer.Begin(dir.File("a.gguf")).ok());
    ASSERT_TRUE(writer.WriteTensorData(x, 16).ok());
    EXPECT_EQ(dir.List().size(), 1u);  // the temporary file exists while writing
    EXPECT_NE(dir.List()[0].find("a.gguf.tmp."), std::string::npos);
  }
  EXPECT_TRUE(dir.List().empty());
  {  // Finish with a tensor incomplete.
    GgufWriter writer;
    ASSERT_TRUE(writer.AddTensor("t", QuantType::kF32, {8}).ok());
    ASSERT_TRUE(writer.Begin(dir.File("b.gguf")).ok());
    ASSERT_TRUE(writer.WriteTensorData(x, 16).ok());
    Status s = writer.Finish();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("'t'"), std::string::npos) << s.message();
    EXPECT_TRUE(dir.List().empty());
  }
  {  // More data than declared.
    GgufWriter writer;
    ASSERT_TRUE(writer.AddTensor("t", QuantType::kF32, {4}).ok());
    ASSERT_TRUE(writer.Begin(dir.File("c.gguf")).ok());
    EXPECT_FALSE(writer.WriteTensorData(x, sizeof(x)).ok());
    EXPECT_FALSE(writer.Finish().ok());
    EXPECT_TRUE(dir.List().empty());
  }
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // the sanitizers own SIGBUS and SIGSEGV
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Writes a GGUF with one 64 KiB f32 tensor "w" (a dense weight) and returns its path.
std::string WriteOneTensorModel(const ScratchDir& dir) {
  const std::string path = dir.File("m.gguf");
  GgufWriter writer;
  EXPECT_TRUE(writer.AddTensor("w", QuantType::kF32, {16384}).ok());
  EXPECT_TRUE(writer.Begin(path).ok());
  const std::vector<float> w(16384, 1.0f);
  EXPECT_TRUE(writer.WriteTensorData(w.data(), w.size() * sizeof(float)).ok());
  EXPECT_TRUE(writer.Finish().ok());
  return path;
}

// Reads the last byte of tensor "w" through the mapping (the page is not resident yet after the
// truncation, so the access faults).
int TouchLastByte(const GgufFile& f) {
  const GgufTensorInfo* t = f.FindTensor("w");
  return t == nullptr ? -1 : *(static_cast<const volatile uint8_t*>(f.TensorData(*t)) + t->n_bytes - 1);
}

// A model truncated while mapped: the access to a dense weight past the new end gets SIGBUS,
// which the handlers of base/file_signals.h (installed by the CLI) turn into one line naming the
// file and exit status 74 (docs/DESIGN.md section 11).
TEST(GgufFileDeathTest, TruncatedWhileMappedIsOneLineAndExitStatus74) {
  if (kSanitized) GTEST_SKIP() << "the sanitizers handle SIGBUS themselves";
  ScratchDir dir;
  const std::string path = WriteOneTensorModel(dir);
  EXPECT_EXIT(
      {
        InstallFileSignalHandlers("estream test: error: ");
        auto f = GgufFile::Open(path);
        if (!f.ok()) std::_Exit(2);
        if (::truncate(path.c_str(), 4096) != 0) std::_Exit(3);
        (void)TouchLastByte(**f);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kMappedFileErrorExitCode),
      "^estream test: error: .*m\\.gguf: the model file was truncated or could not be read \\(I/O error\\) "
      "while in use; ");
}

// A SIGBUS elsewhere (a mapping no GgufFile registered) keeps the default action.
TEST(GgufFileDeathTest, OtherBusErrorsKeepTheDefaultAction) {
  if (kSanitized) GTEST_SKIP() << "the sanitizers handle SIGBUS themselves";
  ScratchDir dir;
  const std::string path = WriteOneTensorModel(dir);
  EXPECT_EXIT(
      {
        InstallFileSignalHandlers("estream test: error: ");
        const int fd = ::open(path.c_str(), O_RDONLY);
        void* p = ::mmap(nullptr, 65536 + 4096, PROT_READ, MAP_SHARED, fd, 0);
        if (fd < 0 || p == MAP_FAILED || ::truncate(path.c_str(), 4096) != 0) std::_Exit(3);
        std::_Exit(*(static_cast<const volatile uint8_t*>(p) + 65536));
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

// rename(2) over a device node or a FIFO would replace it with a regular file (as root,
// `pack x.gguf -o /dev/null` turned /dev/null into a model): such destinations are refused before
// anything is written; a symbolic link to a regular file is followed (the link stays).
TEST(GgufWriter, DestinationMustBeARegularFileOrALinkToOne) {
  ScratchDir dir;
  const float x[4] = {1, 2, 3, 4};
  auto write = [&](const std::string& path) {
    GgufWriter writer;
    EXPECT_TRUE(writer.AddTensor("t", QuantType::kF32, {4}).ok());
    Status s = writer.Begin(path);
    if (s.ok()) s = writer.WriteTensorData(x, sizeof(x));
    if (s.ok()) s = writer.Finish();
    return s;
  };
  ASSERT_EQ(::mkfifo(dir.File("fifo").c_str(), 0644), 0);
  ASSERT_EQ(::mkdir(dir.File("dir").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(dir.File("fifo").c_str(), dir.File("link-to-fifo").c_str()), 0);
  ASSERT_EQ(::symlink(dir.File("missing").c_str(), dir.File("dangling").c_str()), 0);
  std::vector<std::pair<std::string, std::string>> refused = {
      {"fifo", "is a FIFO"},
      {"dir", "is a directory"},
      {"link-to-fifo", "is a symbolic link to a FIFO"},
      {"dangling", "is a symbolic link to a file that does not exist"}};
  // A /dev/null-like node: only root may make one.
  if (::mknod(dir.File("null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0)
    refused.push_back({"null", "is a character device"});
  for (const auto& [name, what] : refused) {
    const Status s = write(dir.File(name));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << ": " << s.ToString();
    EXPECT_NE(s.message().find(dir.File(name) + " " + what), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("give "), std::string::npos) << s.message();  // what to do instead
  }
  struct stat st;
  ASSERT_EQ(::stat(dir.File("fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  if (::lstat(dir.File("null").c_str(), &st) == 0) {
    EXPECT_TRUE(S_ISCHR(st.st_mode));
  }

  // Through a link: the target is written, the link kept, no temporary left anywhere.
  ASSERT_EQ(::mkdir(dir.File("models").c_str(), 0755), 0);
  testing_gguf::WriteAll(dir.File("models/m.gguf"), {1, 2, 3});
  ASSERT_EQ(::symlink("models/m.gguf", dir.File("link.gguf").c_str()), 0);
  ASSERT_TRUE(write(dir.File("link.gguf")).ok());
  ASSERT_EQ(::lstat(dir.File("link.gguf").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  auto f = GgufFile::Open(dir.File("models/m.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_NE((*f)->FindTensor("t"), nullptr);
  EXPECT_EQ(std::filesystem::directory_iterator(dir.File("models"))->path().filename(), "m.gguf");
}

// Until Finish has written everything, the temporary's magic is zero: a temporary left by a
// crash or a kill is not a GGUF any reader accepts.
TEST(GgufWriter, TemporaryIsNotAGgufUntilFinished) {
  ScratchDir dir;
  GgufWriter writer;
  ASSERT_TRUE(writer.AddTensor("t", QuantType::kF32, {4}).ok());
  ASSERT_TRUE(writer.Begin(dir.File("m.gguf")).ok());
  const float x[4] = {1, 2, 3, 4};
  ASSERT_TRUE(writer.WriteTensorData(x, sizeof(x)).ok());
  std::string tmp;
  ASSERT_EQ(dir.List().size(), 1u);
  tmp = dir.File(dir.List()[0]);
  // What a crash would leave: everything but the magic (the writer's buffer, flushed here by a
  // Finish callback that copies the file at that moment).
  ASSERT_TRUE(writer
                  .Finish([&](int) {
                    std::filesystem::copy_file(tmp, dir.File("left-behind"));
                    return Status::Ok();
                  })
                  .ok());
  auto left = GgufFile::Open(dir.File("left-behind"));
  ASSERT_FALSE(left.ok());
  EXPECT_EQ(left.status().code(), StatusCode::kCorruption);
  EXPECT_NE(left.status().message().find("bad magic 0x00000000"), std::string::npos) << left.status().ToString();
  EXPECT_NE(left.status().message().find("did not finish writing"), std::string::npos) << left.status().ToString();
  EXPECT_TRUE(GgufFile::Open(dir.File("m.gguf")).ok());
}

// A process killed while writing (SIGTERM, SIGINT, SIGHUP) removes its temporary when the
// handlers of base/file_signals.h are installed, as the CLI does; the signal still ends it.
TEST(GgufWriterDeathTest, KilledWriterRemovesItsTemporary) {
  ScratchDir dir;
  for (const int sig : {SIGTERM, SIGINT}) {
    EXPECT_EXIT(
        {
          InstallFileSignalHandlers("estream test: error: ");
          GgufWriter writer;
          if (!writer.AddTensor("t", QuantType::kF32, {1 << 20}).ok() || !writer.Begin(dir.File("m.gguf")).ok())
            std::_Exit(2);
          const std::vector<float> half(1 << 19, 1.0f);
          if (!writer.WriteTensorData(half.data(), half.size() * sizeof(float)).ok() || dir.List().size() != 1)
            std::_Exit(3);
          std::raise(sig);
          std::_Exit(4);
        },
        ::testing::KilledBySignal(sig), "");
    EXPECT_TRUE(dir.List().empty()) << dir.List()[0];
  }
}

TEST(GgufWriter, RejectsBadTensorDeclarations) {
  GgufWriter writer;
  ASSERT_TRUE(writer.AddTensor("a", QuantType::kQ4_0, {64, 2}).ok());
  EXPECT_EQ(writer.AddTensor("a", QuantType::kF32, {4}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.AddTensor("b", QuantType::kQ4_0, {48}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.AddTensor("c", QuantType::kF32, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.AddTensor("d", QuantType::kF32, {1, 1, 1, 1, 1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.AddTensor("e", QuantType::kF32, {-1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.AddTensor("f", QuantType::kF32, {int64_t{1} << 40, int64_t{1} << 40}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.AddTensor("g", static_cast<QuantType>(99), {4}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.tensors().size(), 1u);
}

TEST(GgufFile, TypedGetters) {
  ScratchDir dir;
  const std::string path = dir.File("getters.gguf");
  GgufWriter writer;
  GgufValue u8 = GgufValue::Of(GgufType::kU8);
  u8.u = 200;
  GgufValue i16 = GgufValue::Of(GgufType::kI16);
  i16.i = -5;
  GgufValue f64 = GgufValue::Of(GgufType::kF64);
  f64.f = 0.25;
  writer.AddKv("u8", u8);
  writer.AddKv("i16", i16);
  writer.AddKv("i32", GgufValue::I32(77));
  writer.AddKv("big", GgufValue::U64(uint64_t{1} << 40));
  writer.AddKv("f64", f64);
  writer.AddKv("flag", GgufValue::Bool(true));
  writer.AddKv("name", GgufValue::String("olmoe"));
  writer.AddKv("name", GgufValue::String("qwen3moe"));  // replaces: no duplicate keys
  ASSERT_TRUE(writer.Begin(path).ok());
  ASSERT_TRUE(writer.Finish().ok());
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const GgufFile& f = **file;
  EXPECT_EQ(f.kvs().size(), 7u);
  EXPECT_EQ(*f.GetU32("u8"), 200u);
  EXPECT_EQ(*f.GetU32("i32"), 77u);
  EXPECT_EQ(*f.GetU64("big"), uint64_t{1} << 40);
  EXPECT_FALSE(f.GetU32("big").ok());
  EXPECT_FALSE(f.GetU64("i16").ok());
  EXPECT_FLOAT_EQ(*f.GetF32("f64"), 0.25f);
  EXPECT_TRUE(*f.GetBool("flag"));
  EXPECT_EQ(*f.GetString("name"), "qwen3moe");
  EXPECT_EQ(*f.GetU32Or("missing", 9), 9u);
  EXPECT_EQ(*f.GetF32Or("missing", 1.5f), 1.5f);
  EXPECT_FALSE(*f.GetBoolOr("missing", false));
  EXPECT_FALSE(f.GetU32Or("name", 9).ok());  // present with the wrong type
  Result<std::string> missing = f.GetString("general.architecture");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("general.architecture"), std::string::npos);
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
  Result<float> wrong = f.GetF32("name");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("string"), std::string::npos);
}

// A 17 GB file (sparse: only the header is real) opens at once: nothing but the header is read.
TEST(GgufFile, OpensA17GBFileWithoutReadingIt) {
  ScratchDir dir;
  const std::string path = dir.File("huge.gguf");
  const int64_t n_embd = 4096, n_ff = 14336, n_expert = 72;  // 4096*14336*72*4 B = 16.9 GB of f32
  Bytes b;
  b.U32(kGgufMagic).U32(3).U64(1).U64(1);
  b.Str("general.architecture").U32(8).Str("llama");
  b.Str("blk.0.ffn_up_exps.weight").U32(3).U64(n_embd).U64(n_ff).U64(n_expert).U32(0).U64(0);
  b.PadTo(32);
  const uint64_t data_bytes = static_cast<uint64_t>(n_embd * n_ff * n_expert) * 4;
  const uint64_t size = b.size() + data_bytes;
  {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, b.data().data(), b.size()), static_cast<ssize_t>(b.size()));
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      ::close(fd);
      GTEST_SKIP() << "file system does not allow a sparse 17 GB file";
    }
    ::close(fd);
  }
  for (bool use_mmap : {true, false}) {
    auto file = GgufFile::Open(path, {.mmap = use_mmap});
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    const GgufTensorInfo& t = (*file)->tensors().at(0);
    EXPECT_EQ(t.n_bytes, data_bytes);
    EXPECT_EQ((*file)->file_size(), size);
    uint8_t tail[16];
    std::memset(tail, 0xff, sizeof(tail));
    ASSERT_TRUE((*file)->ReadTensor(t, t.n_bytes - sizeof(tail), tail, sizeof(tail)).ok());
    for (uint8_t x : tail) EXPECT_EQ(x, 0);
  }
}

std::string SharedDir() { return ESTREAM_SHARED_DIR; }

TEST(GgufRealFiles, TinyModels) {
  const std::string dir = SharedDir() + "/testdata/models";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is absent";
  int seen = 0;
  for (const char* arch : {"olmoe", "qwen3moe", "mixtral"}) {
    const std::string path = dir + "/" + arch + "-tiny-f32.gguf";
    if (!std::filesystem::exists(path)) continue;
    ++seen;
    SCOPED_TRACE(path);
    auto file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    const GgufFile& f = **file;
    auto a = f.GetString("general.architecture");
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    const std::string gguf_arch = std::string(arch) == "mixtral" ? "llama" : arch;
    EXPECT_EQ(*a, gguf_arch);
    // README: 2 layers, n_embd 256, 8 experts, 2 used, a 512-token vocabulary.
    EXPECT_EQ(*f.GetU32(gguf_arch + ".block_count"), 2u);
    EXPECT_EQ(*f.GetU32(gguf_arch + ".embedding_length"), 256u);
    EXPECT_EQ(*f.GetU32(gguf_arch + ".expert_count"), 8u);
    EXPECT_EQ(*f.GetU32(gguf_arch + ".expert_used_count"), 2u);
    const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
    ASSERT_NE(tokens, nullptr);
    EXPECT_EQ(tokens->elem_type, GgufType::kString);
    EXPECT_EQ(tokens->array.size(), 512u);
    const GgufTensorInfo* emb = f.FindTensor("token_embd.weight");
    ASSERT_NE(emb, nullptr);
    EXPECT_EQ(emb->ne(0), 256);
    EXPECT_EQ(emb->ne(1), 512);
    // Per block: attn_norm, q, k, v, output, ffn_norm, router, 3 expert tensors (+ q/k norms).
    EXPECT_GE(f.tensors().size(), 2u * 10 + 2);
    uint64_t total = 0;
    for (const GgufTensorInfo& t : f.tensors()) {
      EXPECT_EQ(t.type, QuantType::kF32) << t.name;
      total += t.n_bytes;
      const float* x = reinterpret_cast<const float*>(f.TensorData(t));
      for (uint64_t k = 0; k < t.n_elements; k += 97) ASSERT_TRUE(std::isfinite(x[k])) << t.name;
    }
    EXPECT_LE(f.data_offset() + total, f.file_size());
    EXPECT_GT(f.data_offset() + total, f.file_size() - f.alignment() * f.tensors().size());
  }
  if (seen == 0) GTEST_SKIP() << "no tiny models in " << dir;
}

TEST(GgufRealFiles, VocabOnlyFiles) {
  const std::string dir = SharedDir() + "/testdata/tokenizer";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is absent";
  struct Vocab {
    const char* file;
    const char* model;
    size_t min_tokens;
  };
  int seen = 0;
  for (const Vocab& v : {Vocab{"ggml-vocab-gpt-2.gguf", "gpt2", 50000}, Vocab{"ggml-vocab-llama-spm.gguf", "llama", 32000},
                         Vocab{"ggml-vocab-qwen3.gguf", "gpt2", 151000}}) {
    const std::string path = dir + "/" + v.file;
    if (!std::filesystem::exists(path)) continue;
    ++seen;
    SCOPED_TRACE(path);
    for (bool use_mmap : {true, false}) {
      auto file = GgufFile::Open(path, {.mmap = use_mmap});
      ASSERT_TRUE(file.ok()) << file.status().ToString();
      const GgufFile& f = **file;
      EXPECT_TRUE(f.tensors().empty());
      EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), v.model);
      const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
      ASSERT_NE(tokens, nullptr);
      EXPECT_EQ(tokens->elem_type, GgufType::kString);
      EXPECT_GE(tokens->array.size(), v.min_tokens);
      if (const GgufValue* types = f.Find("tokenizer.ggml.token_type")) {
        EXPECT_EQ(types->array.size(), tokens->array.size());
      }
      if (const GgufValue* scores = f.Find("tokenizer.ggml.scores")) {
        EXPECT_EQ(scores->array.size(), tokens->array.size());
      }
    }
  }
  if (seen == 0) GTEST_SKIP() << "no vocab files in " << dir;
}

}  // namespace
}  // namespace estream
