// Writes the GGUF fuzz seed corpus: a few small valid files covering every value type, nested
// arrays, v2 and v3, non-default alignment, zero-sized and multi-dim tensors, and most tensor
// types. Usage: gguf_make_corpus OUT_DIR (the files in fuzz/corpus/ were made with it;
// they have no .gguf suffix, which .gitignore excludes).
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace {

using namespace estream;

struct Tensor {
  std::string name;
  QuantType type;
  std::vector<int64_t> dims;
};

int Write(const std::string& path, uint32_t version, uint32_t alignment, const std::vector<GgufKv>& kvs,
          const std::vector<Tensor>& tensors) {
  GgufWriter w(version, alignment);
  for (const GgufKv& kv : kvs) w.AddKv(kv.key, kv.value);
  for (const Tensor& t : tensors) {
    Status s = w.AddTensor(t.name, t.type, t.dims);
    if (!s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
  }
  std::mt19937 rng(1234);
  Status s = w.Begin(path);
  for (const GgufTensorInfo& t : w.tensors()) {
    std::vector<uint8_t> bytes(t.n_bytes);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    if (s.ok()) s = w.WriteTensorData(bytes.data(), bytes.size());
  }
  if (s.ok()) s = w.Finish();
  if (!s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
  return 0;
}

GgufValue Scalar(GgufType t, uint64_t u, int64_t i, double f) {
  GgufValue v = GgufValue::Of(t);
  v.u = u;
  v.i = i;
  v.f = f;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  int rc = 0;

  // Every value type, arrays of each, nested arrays; no tensors.
  std::vector<GgufKv> values = {
      {"u8", Scalar(GgufType::kU8, 200, 0, 0)},
      {"i8", Scalar(GgufType::kI8, 0, -100, 0)},
      {"u16", Scalar(GgufType::kU16, 60000, 0, 0)},
      {"i16", Scalar(GgufType::kI16, 0, -30000, 0)},
      {"u32", GgufValue::U32(4000000000u)},
      {"i32", GgufValue::I32(-2000000000)},
      {"f32", GgufValue::F32(0.125f)},
      {"bool", GgufValue::Bool(true)},
      {"string", GgufValue::String("hello")},
      {"u64", GgufValue::U64(1ull << 50)},
      {"i64", Scalar(GgufType::kI64, 0, -(1ll << 50), 0)},
      {"f64", Scalar(GgufType::kF64, 0, 0, -2.5)},
      {"strings", GgufValue::StringArray({"a", "", "xyz"})},
      {"f32s", GgufValue::F32Array({1, 2, 3})},
      {"i32s", GgufValue::I32Array({-1, 1})},
      {"bools", GgufValue::Array(GgufType::kBool, {GgufValue::Bool(false), GgufValue::Bool(true)})},
      {"u8s", GgufValue::Array(GgufType::kU8, {Scalar(GgufType::kU8, 1, 0, 0), Scalar(GgufType::kU8, 2, 0, 0)})},
      {"nested", GgufValue::Array(GgufType::kArray, {GgufValue::I32Array({5}), GgufValue::StringArray({"q"})})},
  };
  rc |= Write(dir + "/values_v3", 3, 32, values, {});
  rc |= Write(dir + "/empty_v2", 2, 32, {}, {});

  // Tensors of the plain and 32-block types, v2, with a zero-sized one.
  rc |= Write(dir + "/tensors_v2", 2, 32, {{"general.architecture", GgufValue::String("test")}},
              {{"f32", QuantType::kF32, {4, 2}},
               {"f16", QuantType::kF16, {3}},
               {"bf16", QuantType::kBF16, {2, 1, 1, 1}},
               {"q4_0", QuantType::kQ4_0, {32}},
               {"q4_1", QuantType::kQ4_1, {32}},
               {"q5_0", QuantType::kQ5_0, {32}},
               {"q5_1", QuantType::kQ5_1, {32}},
               {"q8_0", QuantType::kQ8_0, {32, 1, 1}},
               {"empty", QuantType::kF32, {0, 3}}});

  // K-quants with a non-default alignment.
  rc |= Write(dir + "/kquants_align64", 3, 64, {{"general.architecture", GgufValue::String("test")}},
              {{"q4_K", QuantType::kQ4_K, {256}}, {"q5_K", QuantType::kQ5_K, {256}}, {"q6_K", QuantType::kQ6_K, {256}}});

  // A tiny model-shaped file: the keys and tensor names of an olmoe model.
  std::vector<GgufKv> model = {
      {"general.architecture", GgufValue::String("olmoe")},
      {"olmoe.block_count", GgufValue::U32(1)},
      {"olmoe.embedding_length", GgufValue::U32(32)},
      {"olmoe.expert_count", GgufValue::U32(2)},
      {"olmoe.expert_used_count", GgufValue::U32(1)},
      {"olmoe.attention.layer_norm_rms_epsilon", GgufValue::F32(1e-5f)},
      {"tokenizer.ggml.model", GgufValue::String("gpt2")},
      {"tokenizer.ggml.tokens", GgufValue::StringArray({"a", "b", "c", "d"})},
      {"tokenizer.ggml.token_type", GgufValue::I32Array({1, 1, 1, 3})},
  };
  rc |= Write(dir + "/model_olmoe", 3, 32, model,
              {{"token_embd.weight", QuantType::kF32, {32, 4}},
               {"blk.0.ffn_gate_inp.weight", QuantType::kF32, {32, 2}},
               {"blk.0.ffn_up_exps.weight", QuantType::kQ8_0, {32, 2, 2}},
               {"output_norm.weight", QuantType::kF32, {32}}});
  return rc;
}
