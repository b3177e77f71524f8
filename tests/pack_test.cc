// Tests of the packed layout (src/io/packed_layout.h) and `estream pack` (src/io/pack_model.h).
//
// Source models are written here with GgufWriter: olmoe/qwen3moe-like files with merged
// *_exps tensors and Mixtral-like files with per-expert tensors, expert types Q4_0, Q8_0, Q4_K,
// Q6_K, F32, F16, random bytes (with finite scales) so that every byte position is exercised.
// The shared tiny reference models are packed as well. Every packed file is checked in full by
// CheckPacked: it opens and validates as GGUF, all source metadata is kept, dense tensors are
// byte-identical, expert tensors are gone, every record is 4096-aligned, checksums verify, each
// part equals RepackWeights (or the raw rows) of the source expert at that position, and the
// padding is zero.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/fp16.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"
#include "pack/pack_model.h"
#include "pack/packed_layout.h"
#include "kernels/kernels.h"
#include "quant/quant.h"

namespace estream::io {
namespace {

using testing_gguf::ScratchDir;

// ---- source models ---------------------------------------------------------------------------

struct ModelSpec {
  std::string arch = "olmoe";
  int n_layer = 2;
  int64_t n_embd = 64;
  int64_t n_ff = 96;
  int n_expert = 8;
  QuantType types[3] = {QuantType::kQ4_0, QuantType::kQ4_0, QuantType::kQ4_0};  // gate, up, down
  bool per_expert = false;   // Mixtral naming blk.N.ffn_gate.E.weight
  int dense_block = -1;      // a block without experts (dense FFN), -1: none
  bool expert_count_key = true;
  bool omit_up = false;      // drop blk.0.ffn_up(_exps) (a defect)
  bool stray_estream_keys = false;  // estream.* keys in an unpacked file (not a layout)
  uint32_t seed = 1;
};

// Random bytes that decode to finite values: the fp16 scales of the quantised blocks (and every
// value of F16/F32) are replaced by finite numbers, the quants stay random.
std::vector<uint8_t> RandomTensorBytes(QuantType t, uint64_t n_bytes, std::mt19937* rng) {
  std::vector<uint8_t> b(n_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& x : b) x = static_cast<uint8_t>(byte(*rng));
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  auto put16 = [&](size_t at, float v) {
    const uint16_t h = Fp32ToFp16(v);
    std::memcpy(&b[at], &h, 2);
  };
  switch (t) {
    case QuantType::kF32:
      for (size_t i = 0; i + 4 <= b.size(); i += 4) {
        const float v = val(*rng);
        std::memcpy(&b[i], &v, 4);
      }
      break;
    case QuantType::kF16:
      for (size_t i = 0; i + 2 <= b.size(); i += 2) put16(i, val(*rng));
      break;
    case QuantType::kQ4_0:
      for (size_t i = 0; i < b.size(); i += sizeof(BlockQ4_0)) put16(i, 0.01f * val(*rng));
      break;
    case QuantType::kQ8_0:
      for (size_t i = 0; i < b.size(); i += sizeof(BlockQ8_0)) put16(i, 0.01f * val(*rng));
      break;
    case QuantType::kQ4_K:
      for (size_t i = 0; i < b.size(); i += sizeof(BlockQ4_K)) {
        put16(i, 0.01f * val(*rng));
        put16(i + 2, 0.01f * val(*rng));
      }
      break;
    case QuantType::kQ6_K:
      for (size_t i = 0; i < b.size(); i += sizeof(BlockQ6_K)) put16(i + offsetof(BlockQ6_K, d), 0.01f * val(*rng));
      break;
    case QuantType::kQ4_1: case QuantType::kQ5_0: case QuantType::kQ5_1: case QuantType::kQ5_K:
    case QuantType::kQ3_K: case QuantType::kQ2_K: case QuantType::kIQ4_NL: case QuantType::kIQ4_XS:
    case QuantType::kMXFP4: {
      // Quantised random values: every field well-formed (the bytes are all the test compares).
      const int64_t n = 256;
      std::vector<float> row(n);
      const size_t rb = RowBytes(t, n);
      for (size_t i = 0; i + rb <= b.size(); i += rb) {
        for (float& v : row) v = val(*rng);
        QuantizeRow(t, row.data(), &b[i], n);
      }
      break;
    }
    default:
      ADD_FAILURE() << "RandomTensorBytes: add type " << TypeName(t);
  }
  return b;
}

// Writes a source model; returns false on failure (with a test failure recorded).
void WriteModel(const std::string& path, const ModelSpec& s) {
  GgufWriter w;
  const std::string& a = s.arch;
  w.AddKv("general.architecture", GgufValue::String(a));
  w.AddKv("general.name", GgufValue::String("pack-test"));
  w.AddKv(a + ".block_count", GgufValue::U32(static_cast<uint32_t>(s.n_layer)));
  w.AddKv(a + ".embedding_length", GgufValue::U32(static_cast<uint32_t>(s.n_embd)));
  w.AddKv(a + ".feed_forward_length", GgufValue::U32(static_cast<uint32_t>(s.n_ff)));
  if (s.expert_count_key) w.AddKv(a + ".expert_count", GgufValue::U32(static_cast<uint32_t>(s.n_expert)));
  w.AddKv(a + ".expert_used_count", GgufValue::U32(2));
  w.AddKv(a + ".rope.freq_base", GgufValue::F32(10000.0f));
  w.AddKv("tokenizer.ggml.model", GgufValue::String("gpt2"));
  w.AddKv("tokenizer.ggml.tokens", GgufValue::StringArray({"a", "b", "ab", "<s>", "</s>"}));
  w.AddKv("tokenizer.ggml.token_type", GgufValue::I32Array({1, 1, 1, 3, 3}));
  w.AddKv("tokenizer.ggml.merges", GgufValue::StringArray({"a b"}));
  w.AddKv("tokenizer.ggml.bos_token_id", GgufValue::U32(3));
  if (s.stray_estream_keys) {
    w.AddKv("estream.n_embd", GgufValue::U32(7));
    w.AddKv("estream.checksums.0", GgufValue::StringArray({"x"}));
  }

  struct T {
    std::string name;
    QuantType type;
    std::vector<int64_t> dims;
  };
  std::vector<T> ts;
  const int64_t E = s.n_expert;
  const char* parts[3] = {"gate", "up", "down"};
  ts.push_back({"token_embd.weight", QuantType::kQ8_0, {s.n_embd, 5}});
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    ts.push_back({p + "attn_norm.weight", QuantType::kF32, {s.n_embd}});
    ts.push_back({p + "attn_q.weight", QuantType::kQ4_0, {s.n_embd, s.n_embd}});
    ts.push_back({p + "ffn_norm.weight", QuantType::kF32, {s.n_embd}});
    if (l == s.dense_block) {
      ts.push_back({p + "ffn_gate.weight", QuantType::kF32, {s.n_embd, s.n_ff}});
      continue;
    }
    ts.push_back({p + "ffn_gate_inp.weight", QuantType::kF32, {s.n_embd, E}});
    for (int k = 0; k < 3; ++k) {
      if (s.omit_up && l == 0 && k == 1) continue;
      const int64_t n_in = k == 2 ? s.n_ff : s.n_embd, n_out = k == 2 ? s.n_embd : s.n_ff;
      if (s.per_expert) {
        for (int e = 0; e < s.n_expert; ++e)
          ts.push_back({p + "ffn_" + parts[k] + "." + std::to_string(e) + ".weight", s.types[k], {n_in, n_out}});
      } else {
        ts.push_back({p + "ffn_" + parts[k] + "_exps.weight", s.types[k], {n_in, n_out, E}});
      }
    }
    ts.push_back({p + "attn_k.weight", QuantType::kF16, {s.n_embd, 32}});  // a dense tensor after the experts
  }
  ts.push_back({"output_norm.weight", QuantType::kF32, {s.n_embd}});
  for (const T& t : ts) ASSERT_TRUE(w.AddTensor(t.name, t.type, t.dims).ok()) << t.name;
  ASSERT_TRUE(w.Begin(path).ok());
  std::mt19937 rng(s.seed);
  for (const GgufTensorInfo& t : w.tensors()) {
    const std::vector<uint8_t> b = RandomTensorBytes(t.type, t.n_bytes, &rng);
    ASSERT_TRUE(w.WriteTensorData(b.data(), b.size()).ok());
  }
  ASSERT_TRUE(w.Finish().ok());
}

// ---- checks ----------------------------------------------------------------------------------

bool ValueEq(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type || a.u != b.u || a.i != b.i || a.str != b.str) return false;
  if (!(a.f == b.f || (a.f != a.f && b.f != b.f))) return false;
  if (a.type != GgufType::kArray) return true;
  if (a.elem_type != b.elem_type || a.array.size() != b.array.size()) return false;
  for (size_t i = 0; i < a.array.size(); ++i)
    if (!ValueEq(a.array[i], b.array[i])) return false;
  return true;
}

bool IsExpertTensor(const std::string& name) {
  return name.find("_exps.weight") != std::string::npos ||
         (name.rfind("blk.", 0) == 0 && std::count(name.begin(), name.end(), '.') == 4 &&
          name.find("ffn_") != std::string::npos);  // blk.N.ffn_gate.E.weight
}

// The source bytes of one part of logical expert e of block `layer`.
std::vector<uint8_t> SourceRows(const GgufFile& in, int layer, int part, int e) {
  const char* parts[3] = {"gate", "up", "down"};
  const std::string p = "blk." + std::to_string(layer) + ".ffn_" + parts[part];
  const GgufTensorInfo* merged = in.FindTensor(p + "_exps.weight");
  if (merged != nullptr) {
    const uint64_t bytes = merged->n_bytes / static_cast<uint64_t>(merged->ne(2));
    const uint8_t* d = in.TensorData(*merged) + static_cast<uint64_t>(e) * bytes;
    return std::vector<uint8_t>(d, d + bytes);
  }
  const GgufTensorInfo* t = in.FindTensor(p + "." + std::to_string(e) + ".weight");
  EXPECT_NE(t, nullptr);
  if (t == nullptr) return {};
  const uint8_t* d = in.TensorData(*t);
  return std::vector<uint8_t>(d, d + t->n_bytes);
}

// Full check of a packed file against its source (both opened with mmap).
void CheckPacked(const std::string& src_path, const std::string& out_path,
                 const ExpertPermutations& perms = {}) {
  SCOPED_TRACE(out_path);
  Result<std::unique_ptr<GgufFile>> src_r = GgufFile::Open(src_path);
  ASSERT_TRUE(src_r.ok()) << src_r.status().ToString();
  Result<std::unique_ptr<GgufFile>> out_r = GgufFile::Open(out_path);
  ASSERT_TRUE(out_r.ok()) << out_r.status().ToString();
  const GgufFile& src = **src_r;
  const GgufFile& out = **out_r;
  EXPECT_FALSE(IsPackedModel(src));
  EXPECT_TRUE(IsPackedModel(out));
  EXPECT_EQ(out.alignment(), 4096u);

  // Metadata: every source key with the same value (general.alignment aside).
  for (const GgufKv& kv : src.kvs()) {
    if (kv.key == "general.alignment" || kv.key.rfind("estream.", 0) == 0) continue;
    const GgufValue* v = out.Find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_TRUE(ValueEq(kv.value, *v)) << kv.key;
  }
  // Dense tensors byte-identical, expert tensors gone.
  int dense = 0;
  for (const GgufTensorInfo& t : src.tensors()) {
    const GgufTensorInfo* o = out.FindTensor(t.name);
    if (IsExpertTensor(t.name)) {
      EXPECT_EQ(o, nullptr) << t.name << " was duplicated";
      continue;
    }
    ASSERT_NE(o, nullptr) << t.name;
    EXPECT_EQ(o->type, t.type) << t.name;
    EXPECT_EQ(o->ShapeString(), t.ShapeString()) << t.name;
    ASSERT_EQ(o->n_bytes, t.n_bytes) << t.name;
    EXPECT_EQ(std::memcmp(out.TensorData(*o), src.TensorData(t), t.n_bytes), 0) << t.name;
    ++dense;
  }
  EXPECT_GT(dense, 0);

  Result<PackedModelInfo> info_r = ReadPackedLayout(out);
  ASSERT_TRUE(info_r.ok()) << info_r.status().ToString();
  const PackedModelInfo& info = *info_r;
  EXPECT_EQ(info.layout_version, kPackedLayoutVersion);
  Result<std::string> arch = src.GetString("general.architecture");
  ASSERT_TRUE(arch.ok());
  EXPECT_EQ(info.architecture, *arch);
  EXPECT_EQ(info.n_expert, static_cast<int>(*src.GetU32(*arch + ".expert_count")));
  EXPECT_EQ(static_cast<uint64_t>(info.n_embd), *src.GetU64(*arch + ".embedding_length"));
  ASSERT_FALSE(info.layers.empty());
  // Only the tensors of the layout, plus the dense ones.
  EXPECT_EQ(out.tensors().size(), static_cast<size_t>(dense) + info.layers.size());

  for (const PackedLayerInfo& L : info.layers) {
    SCOPED_TRACE("layer " + std::to_string(L.layer));
    EXPECT_EQ(L.file_offset % 4096, 0u);
    EXPECT_EQ(L.record_bytes % 4096, 0u);
    EXPECT_LE(L.payload_bytes, L.record_bytes);
    EXPECT_GT(L.payload_bytes + 4096, L.record_bytes);  // no more padding than needed
    const GgufTensorInfo* region = out.FindTensor(packed_keys::RegionTensor(L.layer));
    ASSERT_NE(region, nullptr);
    EXPECT_EQ(out.data_offset() + region->offset, L.file_offset);
    const uint8_t* base = out.TensorData(*region);
    auto pit = perms.find(L.layer);
    for (int p = 0; p < L.n_expert; ++p) {
      const int e = pit == perms.end() ? p : pit->second[static_cast<size_t>(p)];
      ASSERT_EQ(L.permutation[static_cast<size_t>(p)], e);
      ASSERT_EQ(L.physical_of[static_cast<size_t>(e)], p);
      const uint8_t* rec = base + static_cast<uint64_t>(p) * L.record_bytes;
      ASSERT_EQ(L.RecordOffset(p) % 4096, 0u);
      ASSERT_EQ(rec, out.TensorData(*region) + (L.RecordOffset(p) - L.file_offset));
      Status v = VerifyRecord(L, p, rec);
      EXPECT_TRUE(v.ok()) << v.ToString();
      uint64_t covered_end = 0;
      std::vector<bool> covered(L.record_bytes, false);
      for (int k = 0; k < kExpertParts; ++k) {
        const PackedPart& part = L.parts[static_cast<size_t>(k)];
        const std::vector<uint8_t> rows = SourceRows(src, L.layer, k, e);
        ASSERT_EQ(rows.size(), static_cast<size_t>(part.n) * RowBytes(part.type, part.k));
        std::vector<uint8_t> want;
        if (kernels::CanRepack(part.type)) {
          EXPECT_EQ(part.layout, kernels::WeightLayout::kPacked);
          want.assign(kernels::PackedWeightBytes(part.type, part.n, part.k), 0xEE);
          kernels::RepackWeights(part.type, rows.data(), part.n, part.k, want.data());
        } else {
          EXPECT_EQ(part.layout, kernels::WeightLayout::kGguf);
          want = rows;
        }
        ASSERT_EQ(part.bytes, want.size());
        EXPECT_EQ(part.offset % 64, 0u);
        EXPECT_EQ(std::memcmp(rec + part.offset, want.data(), want.size()), 0)
            << "record " << p << " part " << k << " differs from the repacked source expert " << e;
        const kernels::WeightView view = L.PartView(static_cast<ExpertPart>(k), rec);
        EXPECT_EQ(view.data, rec + part.offset);
        EXPECT_EQ(view.type, part.type);
        for (uint64_t b = part.offset; b < part.offset + part.bytes; ++b) covered[b] = true;
        covered_end = std::max(covered_end, part.offset + part.bytes);
      }
      EXPECT_EQ(covered_end, L.payload_bytes);
      for (uint64_t b = 0; b < L.record_bytes; ++b)
        if (!covered[b] && rec[b] != 0) {
          ADD_FAILURE() << "record " << p << ": padding byte " << b << " is " << int(rec[b]);
          break;
        }
    }
  }
}

std::string Pack(const std::string& src, const std::string& out, const PackOptions& options = {}) {
  Result<std::unique_ptr<GgufFile>> in = GgufFile::Open(src, {.mmap = false});
  if (!in.ok()) return in.status().ToString();
  Result<PackStats> st = PackModel(**in, out, options);
  return st.ok() ? "" : st.status().ToString();
}

// ---- packing and reading back ----------------------------------------------------------------

struct PackCase {
  const char* name;
  ModelSpec spec;
};

ModelSpec Spec(const char* arch, QuantType g, QuantType u, QuantType d, int64_t n_embd = 64, int64_t n_ff = 96,
               bool per_expert = false) {
  ModelSpec s;
  s.arch = arch;
  s.types[0] = g;
  s.types[1] = u;
  s.types[2] = d;
  s.n_embd = n_embd;
  s.n_ff = n_ff;
  s.per_expert = per_expert;
  return s;
}

class PackRoundTrip : public ::testing::TestWithParam<PackCase> {};

TEST_P(PackRoundTrip, PacksAndReadsBack) {
  ScratchDir dir;
  const std::string src = dir.File("src.gguf"), out = dir.File("out.packed.gguf");
  WriteModel(src, GetParam().spec);
  ASSERT_EQ(Pack(src, out), "");
  CheckPacked(src, out);
  // Only the output remains: no temporary beside it.
  EXPECT_EQ(dir.List().size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(
    Models, PackRoundTrip,
    ::testing::Values(
        PackCase{"olmoe_q4_0", Spec("olmoe", QuantType::kQ4_0, QuantType::kQ4_0, QuantType::kQ4_0)},
        PackCase{"olmoe_q8_0", Spec("olmoe", QuantType::kQ8_0, QuantType::kQ8_0, QuantType::kQ8_0, 96, 160)},
        PackCase{"olmoe_f32", Spec("olmoe", QuantType::kF32, QuantType::kF32, QuantType::kF32)},
        PackCase{"qwen3moe_mixed", Spec("qwen3moe", QuantType::kQ8_0, QuantType::kQ4_0, QuantType::kF16, 96, 64)},
        PackCase{"qwen3moe_k_quants", Spec("qwen3moe", QuantType::kQ4_K, QuantType::kQ4_K, QuantType::kQ6_K, 256, 256)},
        PackCase{"qwen3moe_k_quants_2", Spec("qwen3moe", QuantType::kQ5_K, QuantType::kQ3_K, QuantType::kQ2_K, 256, 256)},
        PackCase{"olmoe_iq4_q5", Spec("olmoe", QuantType::kIQ4_NL, QuantType::kIQ4_XS, QuantType::kQ5_0, 256, 256)},
        PackCase{"olmoe_mxfp4_q41_q51", Spec("olmoe", QuantType::kMXFP4, QuantType::kQ4_1, QuantType::kQ5_1, 256, 256)},
        PackCase{"mixtral_per_expert_q4_0",
                 Spec("llama", QuantType::kQ4_0, QuantType::kQ4_0, QuantType::kQ8_0, 64, 96, /*per_expert=*/true)},
        PackCase{"mixtral_per_expert_f32",
                 Spec("llama", QuantType::kF32, QuantType::kF32, QuantType::kF32, 32, 64, /*per_expert=*/true)}),
    [](const ::testing::TestParamInfo<PackCase>& i) { return std::string(i.param.name); });

TEST(Pack, DenseBlockKeptAndSkipped) {
  ScratchDir dir;
  ModelSpec s;
  s.n_layer = 3;
  s.dense_block = 1;
  WriteModel(dir.File("src.gguf"), s);
  ASSERT_EQ(Pack(dir.File("src.gguf"), dir.File("out.gguf")), "");
  CheckPacked(dir.File("src.gguf"), dir.File("out.gguf"));
  auto out = GgufFile::Open(dir.File("out.gguf"));
  ASSERT_TRUE(out.ok());
  auto info = ReadPackedLayout(**out);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  ASSERT_EQ(info->layers.size(), 2u);
  EXPECT_EQ(info->layers[0].layer, 0);
  EXPECT_EQ(info->layers[1].layer, 2);
  EXPECT_EQ(info->FindLayer(1), nullptr);
  EXPECT_NE(info->FindLayer(2), nullptr);
  EXPECT_EQ(info->TotalRecordBytes(), 2 * 8 * info->layers[0].record_bytes);
}

TEST(Pack, StrayEstreamKeysOfTheSourceAreDropped) {
  ScratchDir dir;
  ModelSpec s;
  s.stray_estream_keys = true;
  WriteModel(dir.File("src.gguf"), s);
  ASSERT_EQ(Pack(dir.File("src.gguf"), dir.File("out.gguf")), "");
  auto out = GgufFile::Open(dir.File("out.gguf"));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out->get()->GetU32(packed_keys::kNEmbd), 64u);
  auto info = ReadPackedLayout(**out);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  const uint8_t* base = out->get()->TensorData(*out->get()->FindTensor(packed_keys::RegionTensor(0)));
  for (int p = 0; p < 8; ++p) EXPECT_TRUE(VerifyRecord(info->layers[0], p, base + p * info->layers[0].record_bytes).ok());
}

TEST(Pack, SharedTinyReferenceModels) {
  ScratchDir dir;
  for (const char* m : {"olmoe", "qwen3moe", "mixtral"}) {
    const std::string src = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/" + m + "-tiny-f32.gguf";
    const std::string out = dir.File(std::string(m) + ".packed.gguf");
    ASSERT_EQ(Pack(src, out), "") << m;
    CheckPacked(src, out);
  }
}

TEST(Pack, SourceReadThroughMmapGivesTheSameFile) {
  ScratchDir dir;
  WriteModel(dir.File("src.gguf"), Spec("olmoe", QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kF32));
  ASSERT_EQ(Pack(dir.File("src.gguf"), dir.File("a.gguf")), "");
  auto in = GgufFile::Open(dir.File("src.gguf"));  // mmap
  ASSERT_TRUE(in.ok());
  int calls = 0;
  PackProgress last;
  PackOptions opt;
  opt.threads = 2;
  opt.progress = [&](const PackProgress& p) {
    EXPECT_GE(p.bytes_done, last.bytes_done);
    last = p;
    ++calls;
  };
  Result<PackStats> st = PackModel(**in, dir.File("b.gguf"), opt);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(testing_gguf::ReadAll(dir.File("a.gguf")), testing_gguf::ReadAll(dir.File("b.gguf")));
  EXPECT_GT(calls, 16);
  EXPECT_EQ(last.bytes_done, last.bytes_total);
  EXPECT_EQ(st->records, 16);
  EXPECT_EQ(st->layers, 2);
  EXPECT_EQ(st->output_bytes, std::filesystem::file_size(dir.File("b.gguf")));
}

TEST(PackedLayout, GroupsAreContiguousRanges) {
  PackedLayerInfo L;
  L.n_expert = 8;
  L.file_offset = 3 * 4096;
  L.record_bytes = 2 * 4096;
  EXPECT_EQ(L.GroupRecords(0, 3), 3);
  EXPECT_EQ(L.GroupRecords(2, 3), 2);  // records 6, 7
  EXPECT_EQ(L.GroupOffset(1, 3), L.RecordOffset(3));
  EXPECT_EQ(L.GroupBytes(2, 3), 2 * L.record_bytes);
  EXPECT_EQ(L.GroupOffset(0, 8) + L.GroupBytes(0, 8), L.RecordOffset(7) + L.record_bytes);
}

// ---- permutation -----------------------------------------------------------------------------

TEST(Pack, PermutationRoundTrip) {
  ScratchDir dir;
  WriteModel(dir.File("src.gguf"), Spec("olmoe", QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kQ4_0));
  const std::string perm_file = dir.File("perm.json");
  { std::ofstream(perm_file) << R"({"1": [7, 2, 5, 0, 1, 3, 6, 4]})"; }
  Result<ExpertPermutations> perms = ReadPermutationFile(perm_file);
  ASSERT_TRUE(perms.ok()) << perms.status().ToString();
  ASSERT_EQ(perms->size(), 1u);
  PackOptions opt;
  opt.permutations = *perms;
  ASSERT_EQ(Pack(dir.File("src.gguf"), dir.File("out.gguf"), opt), "");
  CheckPacked(dir.File("src.gguf"), dir.File("out.gguf"), *perms);
  auto out = GgufFile::Open(dir.File("out.gguf"));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->get()->Find(packed_keys::Permutation(0)), nullptr);  // identity: not stored
  EXPECT_NE(out->get()->Find(packed_keys::Permutation(1)), nullptr);
  auto info = ReadPackedLayout(**out);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->FindLayer(1)->physical_of, (std::vector<int32_t>{3, 4, 1, 5, 7, 2, 6, 0}));
}

TEST(Pack, BadPermutationsRejected) {
  ScratchDir dir;
  WriteModel(dir.File("src.gguf"), ModelSpec{});
  const std::vector<std::pair<ExpertPermutations, std::string>> cases = {
      {{{0, {0, 1, 2}}}, "3 entries, the model has 8"},
      {{{0, {0, 1, 2, 3, 4, 5, 6, 6}}}, "entry 7 = 6"},
      {{{1, {0, 1, 2, 3, 4, 5, 6, 8}}}, "entry 7 = 8"},
      {{{5, {0, 1, 2, 3, 4, 5, 6, 7}}}, "no experts in that layer"},
  };
  for (const auto& [perm, msg] : cases) {
    PackOptions opt;
    opt.permutations = perm;
    const std::string err = Pack(dir.File("src.gguf"), dir.File("out.gguf"), opt);
    EXPECT_NE(err.find("Invalid argument"), std::string::npos) << err;
    EXPECT_NE(err.find(msg), std::string::npos) << err;
  }
  EXPECT_EQ(dir.List().size(), 1u);  // nothing written
}

TEST(Pack, PermutationFileErrors) {
  ScratchDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2]", "not a JSON object"},
      {"{\"x\": [0]}", "\"x\" is not a layer index"},
      {"{\"0\": 3}", "not an array"},
      {"{\"0\": [0, \"a\"]}", "is not an expert id"},
      {"{\"0\": [0, 1", "not a JSON object"},
  };
  for (const auto& [text, msg] : cases) {
    { std::ofstream(dir.File("p.json")) << text; }
    Result<ExpertPermutations> r = ReadPermutationFile(dir.File("p.json"));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(msg), std::string::npos) << r.status().ToString();
  }
  EXPECT_EQ(ReadPermutationFile(dir.File("missing.json")).status().code(), StatusCode::kIOError);
}

// ---- damaged and foreign inputs --------------------------------------------------------------

// Overwrites bytes of a file at `offset`.
void PatchFile(const std::string& path, uint64_t offset, const void* bytes, size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes, n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
  ::close(fd);
}

TEST(Pack, CorruptRecordDetectedWithLayerExpertAndOffset) {
  ScratchDir dir;
  ModelSpec s = Spec("olmoe", QuantType::kQ4_0, QuantType::kQ8_0, QuantType::kF32);
  WriteModel(dir.File("src.gguf"), s);
  PackOptions opt;
  opt.permutations[1] = {1, 0, 2, 3, 4, 5, 6, 7};
  ASSERT_EQ(Pack(dir.File("src.gguf"), dir.File("out.gguf"), opt), "");
  uint64_t rec_off = 0, payload = 0, record = 0;
  {
    auto out = GgufFile::Open(dir.File("out.gguf"));
    ASSERT_TRUE(out.ok());
    auto info = ReadPackedLayout(**out);
    ASSERT_TRUE(info.ok());
    const PackedLayerInfo& L = *info->FindLayer(1);
    rec_off = L.RecordOffset(0);  // holds logical expert 1
    payload = L.payload_bytes;
    record = L.record_bytes;
  }
  // A byte of the padding is not covered; a byte of the payload is.
  const uint8_t x = 0x55;
  if (payload < record) PatchFile(dir.File("out.gguf"), rec_off + record - 1, &x, 1);
  {
    auto out = GgufFile::Open(dir.File("out.gguf"));
    auto info = ReadPackedLayout(**out);
    const PackedLayerInfo& L = *info->FindLayer(1);
    EXPECT_TRUE(VerifyRecord(L, 0, out->get()->TensorData(*out->get()->FindTensor(packed_keys::RegionTensor(1)))).ok());
  }
  const uint64_t at = rec_off + payload / 2;
  PatchFile(dir.File("out.gguf"), at, &x, 1);
  uint8_t y = 0x56;
  PatchFile(dir.File("out.gguf"), at, &y, 1);  // make sure the byte changed whatever it was
  auto out = GgufFile::Open(dir.File("out.gguf"));
  ASSERT_TRUE(out.ok()) << "the damage must be found by the checksum, not by the GGUF reader";
  auto info = ReadPackedLayout(**out);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  const PackedLayerInfo& L = *info->FindLayer(1);
  const uint8_t* base = out->get()->TensorData(*out->get()->FindTensor(packed_keys::RegionTensor(1)));
  int bad = 0;
  for (int p = 0; p < L.n_expert; ++p) {
    Status v = VerifyRecord(L, p, base + p * L.record_bytes);
    if (v.ok()) continue;
    ++bad;
    EXPECT_EQ(p, 0);
    EXPECT_EQ(v.code(), StatusCode::kCorruption);
    EXPECT_NE(v.message().find("layer 1 expert 1 (record 0 at file offset " + std::to_string(rec_off)),
              std::string::npos) << v.message();
    EXPECT_NE(v.message().find(dir.File("out.gguf")), std::string::npos) << v.message();
  }
  EXPECT_EQ(bad, 1);
  EXPECT_EQ(VerifyRecord(L, 8, base).code(), StatusCode::kOutOfRange);
  // The other layer is untouched.
  const PackedLayerInfo& L0 = *info->FindLayer(0);
  const uint8_t* base0 = out->get()->TensorData(*out->get()->FindTensor(packed_keys::RegionTensor(0)));
  for (int p = 0; p < L0.n_expert; ++p) EXPECT_TRUE(VerifyRecord(L0, p, base0 + p * L0.record_bytes).ok());
}

// Offset in `path` of the type field of key `key`'s value (the key found in the first MiB of the
// header); npos when the key is not there.
size_t KeyValueOffset(const std::string& path, const std::string& key, std::vector<uint8_t>* bytes) {
  *bytes = testing_gguf::ReadAll(path);
  std::string pattern(8, '\0');
  const uint64_t len = key.size();
  std::memcpy(pattern.data(), &len, 8);
  pattern += key;
  const std::string_view text(reinterpret_cast<const char*>(bytes->data()), std::min<size_t>(bytes->size(), 1 << 20));
  const size_t at = text.find(pattern);
  return at == std::string_view::npos ? at : at + pattern.size();
}

// Finds the value of u32 key `key` in the header bytes of `path` and overwrites it.
void PatchU32Key(const std::string& path, const std::string& key, uint32_t v) {
  std::vector<uint8_t> bytes;
  const size_t at = KeyValueOffset(path, key, &bytes);
  ASSERT_NE(at, std::string_view::npos) << key;
  uint32_t type;
  std::memcpy(&type, &bytes[at], 4);
  ASSERT_EQ(type, static_cast<uint32_t>(GgufType::kU32));
  PatchFile(path, at + 4, &v, 4);
}

// Overwrites element `index` of the u64 array key `key` in the header of `path`.
void PatchU64ArrayElement(const std::string& path, const std::string& key, size_t index, uint64_t v) {
  std::vector<uint8_t> bytes;
  const size_t at = KeyValueOffset(path, key, &bytes);
  ASSERT_NE(at, std::string_view::npos) << key;
  uint32_t type, elem;
  std::memcpy(&type, &bytes[at], 4);
  std::memcpy(&elem, &bytes[at + 4], 4);
  ASSERT_EQ(type, static_cast<uint32_t>(GgufType::kArray));
  ASSERT_EQ(elem, static_cast<uint32_t>(GgufType::kU64));
  PatchFile(path, at + 4 + 4 + 8 + 8 * index, &v, 8);
}

TEST(PackedLayout, UnknownLayoutVersionRejected) {
  ScratchDir dir;
  WriteModel(dir.File("src.gguf"), ModelSpec{});
  ASSERT_EQ(Pack(dir.File("src.gguf"), dir.File("out.gguf")), "");
  PatchU32Key(dir.File("out.gguf"), packed_keys::kLayoutVersion, 2);
  auto out = GgufFile::Open(dir.File("out.gguf"));
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(IsPackedModel(**out));
  Result<PackedModelInfo> info = ReadPackedLayout(**out);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(info.status().message().find("packed layout version 2"), std::string::npos) << info.status().ToString();
  EXPECT_NE(info.status().message().find("re-pack"), std::string::npos);
  // And it is still not accepted as a source.
  EXPECT_NE(Pack(dir.File("out.gguf"), dir.File("again.gguf")).find("already packed"), std::string::npos);
}

TEST(PackedLayout, KernelPackVersionMismatchRejected) {
  ScratchDir dir;
  WriteModel(dir.File("src.gguf"), ModelSpec{});
  ASSERT_EQ(Pack(dir.File("src.gguf"), dir.File("out.gguf")), "");
  PatchU32Key(dir.File("out.gguf"), packed_keys::kKernelPackVersion, 99);
  auto out = GgufFile::Open(dir.File("out.gguf"));
  ASSERT_TRUE(out.ok());
  Result<PackedModelInfo> info = ReadPackedLayout(**out);
  EXPECT_EQ(info.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(info.status().message().find("kernel layout version 99"), std::string::npos) << info.status().ToString();
}

TEST(PackedLayout, InconsistentMetadataIsCorruption) {
  ScratchDir dir;
  WriteModel(dir.File("src.gguf"), ModelSpec{});
  ASSERT_EQ(Pack(dir.File("src.gguf"), dir.File("out.gguf")), "");
  const std::vector<uint8_t> good = testing_gguf::ReadAll(dir.File("out.gguf"));
  const std::vector<std::pair<std::pair<const char*, uint32_t>, std::string>> cases = {
      {{packed_keys::kNFf, 64}, "part gate"},              // parts no longer match their byte counts
      {{packed_keys::kNExpert, 7}, "expected i8"},         // region dims disagree
      {{packed_keys::kRecordAlignment, 512}, "requires 4096"},
  };
  for (const auto& [kv, msg] : cases) {
    testing_gguf::WriteAll(dir.File("out.gguf"), good);
    PatchU32Key(dir.File("out.gguf"), kv.first, kv.second);
    auto out = GgufFile::Open(dir.File("out.gguf"));
    ASSERT_TRUE(out.ok());
    Result<PackedModelInfo> info = ReadPackedLayout(**out);
    ASSERT_FALSE(info.ok()) << kv.first;
    EXPECT_EQ(info.status().code(), StatusCode::kCorruption) << info.status().ToString();
    EXPECT_NE(info.status().message().find(msg), std::string::npos) << info.status().ToString();
  }
}

// A part offset near 2^64 makes offset + bytes wrap around to a small number; the check must not
// be fooled into accepting a part that starts before the record (the review's down matrix at
// 2^64 - 131072 read out of bounds and gave NaN). Likewise a record size no part fits in.
TEST(PackedLayout, PartOffsetsThatWrapAroundAreCorruption) {
  ScratchDir dir;
  WriteModel(dir.File("src.gguf"), ModelSpec{});
  ASSERT_EQ(Pack(dir.File("src.gguf"), dir.File("out.gguf")), "");
  const std::vector<uint8_t> good = testing_gguf::ReadAll(dir.File("out.gguf"));
  for (const uint64_t offset : {~uint64_t{0} - 131071, ~uint64_t{0} - 4095, ~uint64_t{0} - 63, uint64_t{1} << 40}) {
    SCOPED_TRACE(offset);
    testing_gguf::WriteAll(dir.File("out.gguf"), good);
    PatchU64ArrayElement(dir.File("out.gguf"), packed_keys::kPartOffsets, 2, offset);
    auto out = GgufFile::Open(dir.File("out.gguf"));
    ASSERT_TRUE(out.ok());
    Result<PackedModelInfo> info = ReadPackedLayout(**out);
    ASSERT_FALSE(info.ok());
    EXPECT_EQ(info.status().code(), StatusCode::kCorruption) << info.status().ToString();
    EXPECT_NE(info.status().message().find("runs past the record size"), std::string::npos)
        << info.status().ToString();
    EXPECT_NE(info.status().message().find("part down"), std::string::npos) << info.status().ToString();
  }
}

TEST(Pack, AlreadyPackedInputRejected) {
  ScratchDir dir;
  WriteModel(dir.File("src.gguf"), ModelSpec{});
  ASSERT_EQ(Pack(dir.File("src.gguf"), dir.File("out.gguf")), "");
  const std::string err = Pack(dir.File("out.gguf"), dir.File("twice.gguf"));
  EXPECT_NE(err.find("Invalid argument"), std::string::npos) << err;
  EXPECT_NE(err.find("already packed"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir.File("twice.gguf")));
}

TEST(PackedLayout, PlainGgufIsNotPacked) {
  ScratchDir dir;
  WriteModel(dir.File("src.gguf"), ModelSpec{});
  auto in = GgufFile::Open(dir.File("src.gguf"));
  ASSERT_TRUE(in.ok());
  EXPECT_FALSE(IsPackedModel(**in));
  Result<PackedModelInfo> info = ReadPackedLayout(**in);
  EXPECT_EQ(info.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(info.status().message().find("estream pack"), std::string::npos);
}

TEST(Pack, ForeignInputsRejectedWithClearErrors) {
  ScratchDir dir;
  struct Case {
    ModelSpec spec;
    StatusCode code;
    std::string msg;
  };
  ModelSpec no_count;
  no_count.expert_count_key = false;
  ModelSpec unknown = Spec("gemma", QuantType::kQ4_0, QuantType::kQ4_0, QuantType::kQ4_0);
  ModelSpec missing_up;
  missing_up.omit_up = true;
  ModelSpec missing_up_mixtral = Spec("llama", QuantType::kQ4_0, QuantType::kQ4_0, QuantType::kQ4_0, 64, 96, true);
  missing_up_mixtral.omit_up = true;
  ModelSpec all_dense;
  all_dense.n_layer = 1;
  all_dense.dense_block = 0;
  const std::vector<Case> cases = {
      {no_count, StatusCode::kInvalidArgument, "not a MoE model (olmoe.expert_count is absent)"},
      {unknown, StatusCode::kNotSupported, "general.architecture 'gemma' is not supported"},
      {missing_up, StatusCode::kCorruption, "lacks 'blk.0.ffn_up_exps.weight'"},
      {missing_up_mixtral, StatusCode::kCorruption, "lacks 'blk.0.ffn_up.0.weight'"},
      {all_dense, StatusCode::kInvalidArgument, "no block of the 1 blocks has expert tensors"},
  };
  for (const Case& c : cases) {
    WriteModel(dir.File("src.gguf"), c.spec);
    auto in = GgufFile::Open(dir.File("src.gguf"));
    ASSERT_TRUE(in.ok());
    Result<PackStats> st = PackModel(**in, dir.File("out.gguf"));
    ASSERT_FALSE(st.ok()) << c.msg;
    EXPECT_EQ(st.status().code(), c.code) << st.status().ToString();
    EXPECT_NE(st.status().message().find(c.msg), std::string::npos) << st.status().ToString();
    EXPECT_NE(st.status().message().find(dir.File("src.gguf")), std::string::npos) << st.status().ToString();
  }
  EXPECT_EQ(dir.List().size(), 1u);
}

TEST(Pack, UnwritableOutputAndSelfOverwrite) {
  ScratchDir dir;
  WriteModel(dir.File("src.gguf"), ModelSpec{});
  std::string err = Pack(dir.File("src.gguf"), dir.File("no/such/dir/out.gguf"));
  EXPECT_NE(err.find("I/O error"), std::string::npos) << err;
  EXPECT_NE(err.find("no/such/dir/out.gguf"), std::string::npos) << err;
  err = Pack(dir.File("src.gguf"), dir.File("src.gguf"));
  EXPECT_NE(err.find("the output is the input"), std::string::npos) << err;
  EXPECT_EQ(dir.List(), std::vector<std::string>{"src.gguf"});
}

}  // namespace
}  // namespace estream::io
