// Corrupt hyper-parameters, systematically: every metadata key of the five shared tiny models
// (every family; OLMoE also packed) is changed one at a time to values that a damaged or
// hand-edited file holds (0, 1, one more, twice, the type's extremes, -1, NaN, infinity, an empty
// string, another type) or removed. For each edit the engine either refuses the file with a
// one-line error or loads it and then answers requests (a prompt of 1 and of 9 tokens, with logits
// and an embedding) either with a result of finite logits and embedding or with a one-line error.
// Never a crash, a hang or an allocation of the size of a wrong value: the test runs under
// ASan+UBSan in CI (label `sanitize`). Beyond finiteness the outputs of a file that loads are not
// checked: a changed epsilon or RoPE base gives other logits, not wrong ones. (Found by it: a RoPE
// base of 1e-30 and a YaRN log multiplier of 1e30 loaded and gave NaN logits.) The tensor-level
// defects (missing, reshaped, wrong type) are model_engine_test's.
#include <gtest/gtest.h>

#include <sys/statvfs.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "estream/engine.h"
#include "model_test_util.h"
#include "pack/pack_model.h"

namespace estream {
namespace {

using model_test::GgufContents;
using model_test::RewriteGguf;
using model_test::ScratchDir;

const std::string kModels = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/";

struct Mutation {
  std::string label;
  std::optional<GgufValue> value;  // nullopt: the key is removed
};

// The edits of one value.
std::vector<Mutation> MutationsOf(const GgufValue& v) {
  std::vector<Mutation> out = {{"removed", std::nullopt}, {"a string", GgufValue::String("7")}};
  switch (v.type) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kU16: case GgufType::kI16:
    case GgufType::kU32: case GgufType::kI32: case GgufType::kU64: case GgufType::kI64: {
      const uint64_t x = v.type == GgufType::kI8 || v.type == GgufType::kI16 || v.type == GgufType::kI32 ||
                                 v.type == GgufType::kI64
                             ? static_cast<uint64_t>(v.i)
                             : v.u;
      for (uint64_t y : {uint64_t{0}, uint64_t{1}, x + 1, 2 * x, x > 1 ? x - 1 : 3})
        out.push_back({"u32 " + std::to_string(y), GgufValue::U32(static_cast<uint32_t>(y))});
      out.push_back({"u32 max", GgufValue::U32(std::numeric_limits<uint32_t>::max())});
      out.push_back({"i32 -1", GgufValue::I32(-1)});
      out.push_back({"u64 2^40", GgufValue::U64(uint64_t{1} << 40)});
      out.push_back({"f32 1.5", GgufValue::F32(1.5f)});
      break;
    }
    case GgufType::kF32: case GgufType::kF64:
      for (float y : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      1e30f, 1e-30f})
        out.push_back({fmt::format("f32 {}", y), GgufValue::F32(y)});
      out.push_back({"u32 3", GgufValue::U32(3)});
      break;
    case GgufType::kBool:
      out.push_back({"flipped", GgufValue::Bool(v.u == 0)});
      break;
    case GgufType::kString:
      out.push_back({"empty", GgufValue::String("")});
      out.push_back({"bogus", GgufValue::String("bogus")});
      break;
    case GgufType::kArray:
      out.push_back({"empty array", GgufValue::Array(v.elem_type, {})});
      if (!v.array.empty()) {
        std::vector<GgufValue> half(v.array.begin(), v.array.begin() + static_cast<std::ptrdiff_t>(v.array.size() / 2));
        out.push_back({"half the array", GgufValue::Array(v.elem_type, std::move(half))});
      }
      break;
  }
  return out;
}

bool OneLine(const Status& s) { return !s.message().empty() && s.message().find('\n') == std::string::npos; }

// packed: the family's model packed (estream pack) and loaded streamed (G = 2, B = 2), so that
// the packed layout's keys (estream.*) are edited too; the same keys for every family, so one
// family covers them (CI's time: under ASan the packed DeepSeek-V2 alone took 45 s).
void CheckFamily(const std::string& file, bool packed = false) {
  // Hundreds of rewritten files, each fsynced by GgufWriter: in memory where the host has room
  // (a container's /dev/shm may hold 64 MiB).
  struct statvfs shm;
  const bool in_memory = ::statvfs("/dev/shm", &shm) == 0 && ::access("/dev/shm", W_OK) == 0 &&
                         static_cast<uint64_t>(shm.f_bavail) * shm.f_frsize >= (uint64_t{512} << 20);
  ScratchDir dir(in_memory ? "/dev/shm/" : ::testing::TempDir());
  std::string src = kModels + file;
  if (packed) {
    auto model = GgufFile::Open(src);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    src = dir.File("packed.gguf");
    ASSERT_TRUE(io::PackModel(**model, src).ok());
  }
  auto in = GgufFile::Open(src);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  std::vector<GgufKv> kvs = (*in)->kvs();
  const std::string path = dir.File("edited.gguf");
  EngineOptions options;
  options.n_threads = 1;
  if (packed) {
    options.group_size = 2;
    options.banks = 2;
    options.budget_tokens = 64;
  }
  // The rewrite itself changes nothing.
  ASSERT_TRUE(RewriteGguf(src, path, [](GgufContents*) {}).ok());
  {
    auto e = Engine::Load(path, options);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
  }
  int loaded = 0, refused = 0;
  for (const GgufKv& kv : kvs) {
    if (kv.key == "general.alignment" || kv.key.rfind("synthetic.", 0) == 0) continue;
    // The vocabulary's strings are the tokenizer's (tokenizer_test); its sizes and ids are here.
    if (kv.key == "tokenizer.ggml.merges") continue;
    for (const Mutation& m : MutationsOf(kv.value)) {
      SCOPED_TRACE(file + ": " + kv.key + " " + m.label);
      ASSERT_TRUE(RewriteGguf(src, path, [&](GgufContents* c) {
                    for (auto it = c->kvs.begin(); it != c->kvs.end(); ++it)
                      if (it->key == kv.key) {
                        if (m.value) it->value = *m.value;
                        else c->kvs.erase(it);
                        break;
                      }
                  }).ok());
      auto e = Engine::Load(path, options);
      if (!e.ok()) {
        ++refused;
        EXPECT_TRUE(OneLine(e.status())) << e.status().ToString();
        continue;
      }
      ++loaded;
      Engine& engine = **e;
      const int32_t n_vocab = engine.info().n_vocab;
      for (int n : {1, 9}) {
        Request r;
        for (int i = 0; i < n; ++i) r.tokens.push_back((i * 37 + 5) % std::max(1, n_vocab));
        r.logits = Request::Logits::kLast;
        r.embedding = Request::Pooling::kMean;
        r.prompt_logprobs = true;
        auto out = engine.Run(r);
        if (!out.ok()) {
          EXPECT_TRUE(OneLine(out.status())) << out.status().ToString();
          continue;
        }
        int bad = 0;
        for (float x : out->logits) bad += !std::isfinite(x);
        for (float x : out->embedding) bad += !std::isfinite(x);
        EXPECT_EQ(bad, 0) << "non-finite outputs of a file the engine accepted, prompt of " << n;
      }
    }
  }
  // Both outcomes occur for every family (a file whose every edit were refused, or accepted,
  // would mean that the edits did not reach the loader).
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, 0);
  std::printf("%s%s: %d edits refused, %d loaded and served\n", file.c_str(), packed ? " (packed)" : "", refused,
              loaded);
}

TEST(ModelCorrupt, Olmoe) { CheckFamily("olmoe-tiny-f32.gguf"); }
TEST(ModelCorrupt, Qwen3Moe) { CheckFamily("qwen3moe-tiny-f32.gguf"); }
TEST(ModelCorrupt, Mixtral) { CheckFamily("mixtral-tiny-f32.gguf"); }
TEST(ModelCorrupt, Deepseek2) { CheckFamily("deepseek2-tiny-f32.gguf"); }
TEST(ModelCorrupt, Lfm2Moe) { CheckFamily("lfm2moe-tiny-f32.gguf"); }
TEST(ModelCorrupt, PackedOlmoe) { CheckFamily("olmoe-tiny-f32.gguf", /*packed=*/true); }

}  // namespace
}  // namespace estream
