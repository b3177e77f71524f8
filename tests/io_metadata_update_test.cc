// io::UpdateMetadata (src/io/metadata_update.h) on a small synthetic packed model:
//   - `estream pack` leaves a 256 KiB header reserve as the last key;
//   - in place: the data offset and file size do not change, every tensor byte is unchanged, the
//     keys round-trip, repeated updates (growing and shrinking) and removals by prefix;
//   - full rewrite for a file without the reserve and for an update larger than the reserve:
//     every tensor's bytes unchanged, keys round-trip, a reserve is added so the next update is
//     in place;
//   - failures (temporary cannot be created, a write failing mid-copy, the rename failing, bad
//     arguments, a concurrent update) leave the original byte for byte and no temporary;
//   - a full rewrite keeps the file's permission bits and owner;
//   - the updated file still passes ReadPackedLayout and runs with bit-identical logits.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "estream/engine.h"
#include "gguf/gguf.h"
#include "pack/metadata_update.h"
#include "pack/packed_layout.h"
#include "pipeline_test_util.h"

namespace estream {
namespace {

namespace fs = std::filesystem;
using pipeline_test::ScratchDir;
using pipeline_test::TestModels;

std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Every tensor's bytes by name.
std::map<std::string, std::string> TensorBytes(const std::string& path) {
  auto f = GgufFile::Open(path, {.mmap = false});
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  std::map<std::string, std::string> out;
  if (!f.ok()) return out;
  for (const GgufTensorInfo& t : (*f)->tensors()) {
    std::string b(t.n_bytes, '\0');
    EXPECT_TRUE((*f)->ReadTensor(t, 0, b.data(), t.n_bytes).ok());
    out[t.name] = std::move(b);
  }
  return out;
}

// Keys and values of a file (the reserve's value omitted: only its presence matters).
std::vector<std::pair<std::string, std::string>> Keys(const GgufFile& f) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const GgufKv& kv : f.kvs()) {
    std::string v;
    if (kv.key != io::kHeaderReserveKey) {
      auto h = SerializeGgufHeader(3, 32, {{"k", kv.value}}, {});
      EXPECT_TRUE(h.ok());
      if (h.ok()) v = *h;
    }
    out.emplace_back(kv.key, std::move(v));
  }
  return out;
}

bool SameValue(const GgufValue& a, const GgufValue& b) {
  auto ha = SerializeGgufHeader(3, 32, {{"k", a}}, {});
  auto hb = SerializeGgufHeader(3, 32, {{"k", b}}, {});
  return ha.ok() && hb.ok() && *ha == *hb;
}

std::string CopyPacked(const ScratchDir& dir, const std::string& name) {
  const std::string path = dir.File(name);
  fs::copy_file(TestModels().packed, path, fs::copy_options::overwrite_existing);
  return path;
}

// The packed model as a file packed before the reserve existed: same keys (general.alignment
// kept at 4096), no estream.header_reserve, same tensors.
std::string WithoutReserve(const ScratchDir& dir, const std::string& name) {
  const std::string path = dir.File(name);
  auto in = GgufFile::Open(TestModels().packed);
  EXPECT_TRUE(in.ok());
  GgufWriter w(3, (*in)->alignment());
  for (const GgufKv& kv : (*in)->kvs())
    if (kv.key != io::kHeaderReserveKey) w.AddKv(kv.key, kv.value);
  for (const GgufTensorInfo& t : (*in)->tensors())
    EXPECT_TRUE(w.AddTensor(t.name, t.type, std::vector<int64_t>(t.dims, t.dims + t.n_dims)).ok());
  EXPECT_TRUE(w.Begin(path).ok());
  for (const GgufTensorInfo& t : (*in)->tensors())
    EXPECT_TRUE(w.WriteTensorData((*in)->TensorData(t), t.n_bytes).ok());
  EXPECT_TRUE(w.Finish().ok());
  return path;
}

std::vector<GgufKv> SomeKeys(int round, size_t floats) {
  std::vector<float> v(floats);
  for (size_t i = 0; i < floats; ++i) v[i] = static_cast<float>(round) + 0.25f * static_cast<float>(i);
  return {{"estream.config.group_size", GgufValue::U32(static_cast<uint32_t>(4 + round))},
          {"estream.config.schedule", GgufValue::String("early")},
          {"estream.profile.samples", GgufValue::F32Array(v)},
          {"estream.profile.version", GgufValue::U32(1)}};
}

// Checks `path` after an update from `before` (a path of the same model before it): tensor bytes
// equal, old keys kept (minus removed/replaced), `set` present with its values, reserve last.
void ExpectUpdated(const std::string& path, const std::map<std::string, std::string>& tensors_before,
                   const std::vector<GgufKv>& old_kvs, const std::vector<GgufKv>& set,
                   const std::vector<std::string>& removed_prefixes) {
  auto f = GgufFile::Open(path, {.mmap = false});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(TensorBytes(path), tensors_before);
  for (const GgufKv& kv : set) {
    const GgufValue* v = (*f)->Find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_TRUE(SameValue(*v, kv.value)) << kv.key;
  }
  for (const GgufKv& kv : old_kvs) {
    if (kv.key == io::kHeaderReserveKey) continue;
    bool is_set = false;
    for (const GgufKv& s : set) is_set |= s.key == kv.key;
    if (is_set) continue;
    bool removed = false;
    for (const std::string& p : removed_prefixes) removed |= kv.key.rfind(p, 0) == 0;
    const GgufValue* v = (*f)->Find(kv.key);
    if (removed) {
      EXPECT_EQ(v, nullptr) << kv.key << " should have been removed";
    } else {
      ASSERT_NE(v, nullptr) << kv.key << " lost";
      EXPECT_TRUE(SameValue(*v, kv.value)) << kv.key << " changed";
    }
  }
  ASSERT_FALSE((*f)->kvs().empty());
  EXPECT_EQ((*f)->kvs().back().key, io::kHeaderReserveKey) << "the reserve must stay the last key";
  auto layout = io::ReadPackedLayout(**f);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
}

// No "<path>.tmp.*" or other stray file next to `path`.
void ExpectNoTemporary(const std::string& path) {
  const fs::path p(path);
  for (const auto& e : fs::directory_iterator(p.parent_path())) {
    const std::string n = e.path().filename().string();
    EXPECT_FALSE(n.rfind(p.filename().string() + ".", 0) == 0 && e.is_regular_file()) << "stray file " << n;
  }
}

TEST(MetadataUpdate, PackLeavesAReserveAsTheLastKey) {
  auto f = GgufFile::Open(TestModels().packed, {.mmap = false});
  ASSERT_TRUE(f.ok());
  ASSERT_FALSE((*f)->kvs().empty());
  const GgufKv& last = (*f)->kvs().back();
  EXPECT_EQ(last.key, io::kHeaderReserveKey);
  EXPECT_EQ(last.value.type, GgufType::kArray);
  EXPECT_EQ(last.value.array.size() * 8, io::kHeaderReserveBytes);
  EXPECT_EQ((*f)->data_offset() % 4096, 0u);
  EXPECT_GE((*f)->data_offset(), io::kHeaderReserveBytes);
}

TEST(MetadataUpdate, InPlaceRepeatedUpdatesAndRemovals) {
  ScratchDir dir;
  const std::string path = CopyPacked(dir, "m.gguf");
  const auto tensors = TensorBytes(path);
  uint64_t data_offset = 0, file_size = fs::file_size(path);
  std::vector<GgufKv> old_kvs;
  {
    auto f = GgufFile::Open(path, {.mmap = false});
    ASSERT_TRUE(f.ok());
    data_offset = (*f)->data_offset();
    old_kvs = (*f)->kvs();
  }
  const std::string data_before = ReadBytes(path).substr(data_offset);

  // Growing, shrinking, growing again: always in place.
  for (int round = 0; round < 4; ++round) {
    const size_t floats = round % 2 == 0 ? 5000 + 3000 * round : 17;  // up to ~44 KB of values
    const std::vector<GgufKv> set = SomeKeys(round, floats);
    uint64_t last_done = 0, last_total = 0;
    io::MetadataUpdateInfo info;
    const Status st = io::UpdateMetadata(path, set, {"estream.profile.", "estream.config."},
                                         [&](uint64_t d, uint64_t t) { last_done = d, last_total = t; }, &info);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(info.in_place) << round;
    EXPECT_EQ(info.data_offset, data_offset);
    EXPECT_EQ(info.bytes_copied, 0u);
    EXPECT_LE(info.header_bytes, data_offset);
    EXPECT_GT(info.header_bytes + 8, data_offset) << "the reserve fills the header up to the data offset";
    EXPECT_EQ(last_done, last_total);
    EXPECT_EQ(fs::file_size(path), file_size);
    const std::string now = ReadBytes(path);
    ASSERT_EQ(now.size(), data_offset + data_before.size());
    EXPECT_TRUE(now.compare(data_offset, std::string::npos, data_before) == 0) << "tensor data changed";
    ExpectUpdated(path, tensors, old_kvs, set, {"estream.profile.", "estream.config."});
    auto f = GgufFile::Open(path, {.mmap = false});
    ASSERT_TRUE(f.ok());
    EXPECT_EQ((*f)->data_offset(), data_offset);
    EXPECT_EQ(info.reserve_bytes, (*f)->kvs().back().value.array.size() * 8);
  }

  // Removing by prefix without setting anything: back to the packed model's own keys.
  io::MetadataUpdateInfo info;
  ASSERT_TRUE(io::UpdateMetadata(path, {}, {"estream.profile.", "estream.config."}, {}, &info).ok());
  EXPECT_TRUE(info.in_place);
  ExpectUpdated(path, tensors, old_kvs, {}, {});
  auto f = GgufFile::Open(path, {.mmap = false});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(Keys(**f), Keys(**GgufFile::Open(TestModels().packed, {.mmap = false})));
  EXPECT_GE(info.reserve_bytes, io::kHeaderReserveBytes) << "all room given back";
  ExpectNoTemporary(path);
}

TEST(MetadataUpdate, FullRewriteWithoutReserveThenInPlace) {
  ScratchDir dir;
  const std::string path = WithoutReserve(dir, "old.gguf");
  const auto tensors = TensorBytes(path);
  std::vector<GgufKv> old_kvs;
  uint64_t old_offset = 0;
  {
    auto f = GgufFile::Open(path, {.mmap = false});
    ASSERT_TRUE(f.ok());
    old_kvs = (*f)->kvs();
    old_offset = (*f)->data_offset();
    EXPECT_EQ((*f)->Find(io::kHeaderReserveKey), nullptr);
  }
  const std::vector<GgufKv> set = SomeKeys(1, 4000);  // 16 KB: more than the old padding
  uint64_t total = 0, calls = 0, last = 0;
  io::MetadataUpdateInfo info;
  const Status st = io::UpdateMetadata(path, set, {}, [&](uint64_t d, uint64_t t) {
    EXPECT_GE(d, last);
    last = d, total = t, ++calls;
  }, &info);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(info.in_place);
  EXPECT_GT(calls, 0u);
  EXPECT_EQ(last, total);
  uint64_t tensor_total = 0;
  for (const auto& [name, bytes] : tensors) tensor_total += bytes.size();
  EXPECT_EQ(info.bytes_copied, tensor_total);
  EXPECT_EQ(info.reserve_bytes, io::kHeaderReserveBytes);
  EXPECT_GT(info.data_offset, old_offset);
  ExpectUpdated(path, tensors, old_kvs, set, {});
  ExpectNoTemporary(path);
  {
    auto f = GgufFile::Open(path, {.mmap = false});
    ASSERT_TRUE(f.ok());
    EXPECT_EQ((*f)->data_offset(), info.data_offset);
  }

  // The next update fits the new reserve.
  const std::vector<GgufKv> set2 = SomeKeys(2, 9000);
  io::MetadataUpdateInfo info2;
  ASSERT_TRUE(io::UpdateMetadata(path, set2, {"estream.profile."}, {}, &info2).ok());
  EXPECT_TRUE(info2.in_place);
  EXPECT_EQ(info2.data_offset, info.data_offset);
  ExpectUpdated(path, tensors, old_kvs, set2, {"estream.profile."});
}

// The full rewrite replaces the file by a new one (rename of the temporary): it keeps the
// original's permission bits and owner. The writer creates its temporary 0644 minus the umask, so
// 0640 (narrower) and 0664 (wider than the umask 022 lets through) both show a missing fchmod.
TEST(MetadataUpdate, FullRewriteKeepsTheFileMode) {
  ScratchDir dir;
  const mode_t old_umask = ::umask(022);
  for (const mode_t mode : {mode_t{0640}, mode_t{0664}, mode_t{0600}}) {
    const std::string path = WithoutReserve(dir, "mode.gguf");
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    struct stat before {};
    ASSERT_EQ(::stat(path.c_str(), &before), 0);
    io::MetadataUpdateInfo info;
    const Status st = io::UpdateMetadata(path, SomeKeys(1, 4000), {}, {}, &info);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_FALSE(info.in_place) << "the test needs the full-rewrite path";
    struct stat after {};
    ASSERT_EQ(::stat(path.c_str(), &after), 0);
    EXPECT_NE(after.st_ino, before.st_ino) << "a full rewrite is a new file";
    EXPECT_EQ(after.st_mode & 07777, mode) << std::oct << "mode 0" << mode << " became 0" << (after.st_mode & 07777);
    EXPECT_EQ(after.st_uid, before.st_uid);
    EXPECT_EQ(after.st_gid, before.st_gid);
    ExpectNoTemporary(path);
    fs::remove(path);
  }
  ::umask(old_umask);
}

TEST(MetadataUpdate, UpdateLargerThanTheReserveRewrites) {
  ScratchDir dir;
  const std::string path = CopyPacked(dir, "m.gguf");
  const auto tensors = TensorBytes(path);
  std::vector<GgufKv> old_kvs = (*GgufFile::Open(path, {.mmap = false}))->kvs();
  const std::vector<GgufKv> set = SomeKeys(3, 100000);  // 400 KB > 256 KiB of reserve
  io::MetadataUpdateInfo info;
  ASSERT_TRUE(io::UpdateMetadata(path, set, {}, {}, &info).ok());
  EXPECT_FALSE(info.in_place);
  ExpectUpdated(path, tensors, old_kvs, set, {});
  ExpectNoTemporary(path);
}

// Failures of the full rewrite leave the original byte for byte and no temporary.
TEST(MetadataUpdate, FailedRewriteLeavesTheOriginal) {
  ScratchDir dir;
  const std::string path = WithoutReserve(dir, "old.gguf");
  const std::string before = ReadBytes(path);
  const std::vector<GgufKv> set = SomeKeys(1, 4000);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());

  // 1. The temporary cannot be created (a directory holds its name; root ignores permissions,
  //    so an unwritable directory would not fail here when the tests run as root).
  fs::create_directory(tmp);
  Status st = io::UpdateMetadata(path, set, {});
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
  EXPECT_NE(st.message().find(path), std::string::npos) << st.ToString();
  EXPECT_EQ(ReadBytes(path), before);
  fs::remove(tmp);
  ExpectNoTemporary(path);

  // 2. A write fails in the middle of the copy (file size limit: EFBIG, like a full disk).
  {
    struct rlimit old_limit {};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old_limit;
    small.rlim_cur = before.size() / 2;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    st = io::UpdateMetadata(path, set, {});
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
    std::signal(SIGXFSZ, old_handler);
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
    EXPECT_EQ(ReadBytes(path), before);
    ExpectNoTemporary(path);
  }

  // 3. The rename fails (the temporary vanished during the copy).
  st = io::UpdateMetadata(path, set, {}, [&](uint64_t, uint64_t) { fs::remove(tmp); });
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(ReadBytes(path), before);
  ExpectNoTemporary(path);
}

// Through a symbolic link, the whole-file rewrite replaces the file the link names and keeps the
// link (it used to replace the link with a full copy and leave the target unprofiled).
TEST(MetadataUpdate, FullRewriteThroughASymlinkUpdatesItsTarget) {
  ScratchDir dir;
  fs::create_directory(dir.File("models"));
  const std::string target = WithoutReserve(dir, "models/old.gguf");
  const std::string link = dir.File("link.gguf");
  fs::create_symlink("models/old.gguf", link);
  const auto tensors = TensorBytes(target);
  std::vector<GgufKv> old_kvs = (*GgufFile::Open(target, {.mmap = false}))->kvs();
  const std::vector<GgufKv> set = SomeKeys(1, 4000);
  io::MetadataUpdateInfo info;
  const Status st = io::UpdateMetadata(link, set, {}, {}, &info);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_FALSE(info.in_place) << "the test needs the full-rewrite path";
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(fs::read_symlink(link), "models/old.gguf");
  ExpectUpdated(target, tensors, old_kvs, set, {});
  ExpectNoTemporary(target);
  ExpectNoTemporary(link);
}

// A file that cannot be written (here: writes fail with EFBIG under a file size limit, as they
// fail with EROFS or ENOSYS on read-only or write-less file systems) is found by CheckUpdatable
// without changing it, and an in-place update that writes nothing says the file is unchanged
// (not "restoring the old header failed too ... pack the model again").
TEST(MetadataUpdate, UnwritableFileIsFoundFirstAndLeftUnchanged) {
  ScratchDir dir;
  const std::string path = CopyPacked(dir, "m.gguf");
  const std::string before = ReadBytes(path);
  EXPECT_TRUE(io::CheckUpdatable(path).ok());
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit tiny = old_limit;
  tiny.rlim_cur = 0;  // every write fails, none in part
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tiny), 0);
  const Status check = io::CheckUpdatable(path);
  const Status update = io::UpdateMetadata(path, SomeKeys(1, 10), {});
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(check.code(), StatusCode::kIOError) << check.ToString();
  EXPECT_NE(check.message().find(path + ": cannot update its metadata: writing to it fails"), std::string::npos)
      << check.ToString();
  EXPECT_EQ(update.code(), StatusCode::kIOError) << update.ToString();
  EXPECT_NE(update.message().find("(the file is unchanged)"), std::string::npos) << update.ToString();
  EXPECT_EQ(update.message().find("restoring"), std::string::npos) << update.ToString();
  EXPECT_TRUE(ReadBytes(path) == before);
  if (::geteuid() != 0) {  // root may open any file for writing
    ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
    const Status ro = io::CheckUpdatable(path);
    EXPECT_NE(ro.message().find("cannot open for updating its metadata: Permission denied"), std::string::npos)
        << ro.ToString();
  }
}

TEST(MetadataUpdate, BadArgumentsAndLockedFile) {
  ScratchDir dir;
  const std::string path = CopyPacked(dir, "m.gguf");
  const std::string before = ReadBytes(path);
  auto expect = [&](const Status& st, StatusCode code, const std::string& needle) {
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.ToString();
    EXPECT_EQ(st.message().find('\n'), std::string::npos);
    EXPECT_EQ(ReadBytes(path), before);
  };
  expect(io::UpdateMetadata(path, {{"general.alignment", GgufValue::U32(32)}}, {}), StatusCode::kInvalidArgument,
         "general.alignment");
  expect(io::UpdateMetadata(path, {{io::kHeaderReserveKey, GgufValue::U32(0)}}, {}), StatusCode::kInvalidArgument,
         io::kHeaderReserveKey);
  expect(io::UpdateMetadata(path, {{"a", GgufValue::U32(1)}, {"a", GgufValue::U32(2)}}, {}),
         StatusCode::kInvalidArgument, "twice");
  expect(io::UpdateMetadata(path, {{"", GgufValue::U32(1)}}, {}), StatusCode::kInvalidArgument, "empty key");
  expect(io::UpdateMetadata(path, {}, {""}), StatusCode::kInvalidArgument, "empty prefix");
  GgufValue bad = GgufValue::Array(GgufType::kU32, {GgufValue::U32(1), GgufValue::F32(2)});
  expect(io::UpdateMetadata(path, {{"estream.bad", bad}}, {}), StatusCode::kInvalidArgument, "estream.bad");
  expect(io::UpdateMetadata(dir.File("missing.gguf"), {}, {}), StatusCode::kIOError, "missing.gguf");
  {
    const std::string text = dir.File("text.gguf");
    std::ofstream(text) << "not a gguf file at all, just text";
    const Status st = io::UpdateMetadata(text, {}, {});
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(ReadBytes(text), "not a gguf file at all, just text");
  }
  // Another process (here: another descriptor) is updating the file.
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  expect(io::UpdateMetadata(path, SomeKeys(0, 10), {}), StatusCode::kIOError, "another process");
  ::close(fd);
  EXPECT_TRUE(io::UpdateMetadata(path, SomeKeys(0, 10), {}).ok());
  // "general." does not remove general.alignment.
  ASSERT_TRUE(io::UpdateMetadata(path, {}, {"general."}).ok());
  auto f = GgufFile::Open(path, {.mmap = false});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->alignment(), 4096u);
  EXPECT_EQ((*f)->Find("general.architecture"), nullptr);
}

// The updated files still load as packed models and give the same logits, streamed.
TEST(MetadataUpdate, UpdatedModelRunsBitIdentical) {
  ScratchDir dir;
  const std::string in_place = CopyPacked(dir, "a.gguf");
  const std::string rewritten = WithoutReserve(dir, "b.gguf");
  ASSERT_TRUE(io::UpdateMetadata(in_place, SomeKeys(1, 3000), {}).ok());
  io::MetadataUpdateInfo info;
  ASSERT_TRUE(io::UpdateMetadata(rewritten, SomeKeys(2, 3000), {}, {}, &info).ok());
  ASSERT_FALSE(info.in_place);

  Request req;
  for (int i = 0; i < 40; ++i) req.tokens.push_back((i * 37 + 11) % 512);
  req.logits = Request::Logits::kLast;
  auto run = [&](const std::string& path) -> std::vector<float> {
    auto e = Engine::Load(path, {.n_threads = 2, .group_size = 4, .banks = 2, .queue_depth = 2, .budget_tokens = 64});
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (!e.ok()) return {};
    auto r = (*e)->Run(req);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->logits : std::vector<float>{};
  };
  const std::vector<float> ref = run(TestModels().packed);
  ASSERT_FALSE(ref.empty());
  EXPECT_EQ(run(in_place), ref);
  EXPECT_EQ(run(rewritten), ref);
}

}  // namespace
}  // namespace estream
