// Helpers of the model tests: rewrite a GGUF model with edits (drop or reshape a tensor, change a
// key, split merged experts into Mixtral's per-expert tensors), compare logits.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "estream/engine.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "scratch_dir.h"

namespace estream::model_test {

// A tensor of the rewritten file: its bytes come from `data` (borrowed from the source mapping or
// from `owned`).
struct OutTensor {
  std::string name;
  QuantType type;
  std::vector<int64_t> dims;
  const uint8_t* data = nullptr;
  uint64_t size = 0;
};

struct GgufContents {
  std::vector<GgufKv> kvs;
  std::vector<OutTensor> tensors;

  GgufKv* FindKv(const std::string& key) {
    for (GgufKv& kv : kvs)
      if (kv.key == key) return &kv;
    return nullptr;
  }
  void EraseTensor(const std::string& name) {
    std::erase_if(tensors, [&](const OutTensor& t) { return t.name == name; });
  }
  OutTensor* FindTensor(const std::string& name) {
    for (OutTensor& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

using ScratchDir = ::estream::test_util::ScratchDir;

// Copies `src` to `dst` (same alignment) after `edit` has changed its metadata and tensor list.
inline Status RewriteGguf(const std::string& src, const std::string& dst,
                          const std::function<void(GgufContents*)>& edit) {
  ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> in, GgufFile::Open(src));
  GgufContents c;
  c.kvs = in->kvs();
  std::erase_if(c.kvs, [](const GgufKv& kv) { return kv.key == "general.alignment"; });
  for (const GgufTensorInfo& t : in->tensors())
    c.tensors.push_back({t.name, t.type, std::vector<int64_t>(t.dims, t.dims + t.n_dims), in->TensorData(t),
                         t.n_bytes});
  edit(&c);
  GgufWriter w(3, in->alignment());  // a packed model's 4096 kept
  for (GgufKv& kv : c.kvs) w.AddKv(kv.key, kv.value);
  for (const OutTensor& t : c.tensors) ESTREAM_RETURN_IF_ERROR(w.AddTensor(t.name, t.type, t.dims));
  ESTREAM_RETURN_IF_ERROR(w.Begin(dst));
  for (const OutTensor& t : c.tensors) ESTREAM_RETURN_IF_ERROR(w.WriteTensorData(t.data, t.size));
  return w.Finish();
}

// Replaces blk.N.ffn_{gate,up,down}_exps.weight by Mixtral's older per-expert tensors
// blk.N.ffn_{gate,up,down}.E.weight (same bytes, split along the expert dimension).
inline void SplitExperts(GgufContents* c) {
  std::vector<OutTensor> out;
  for (const OutTensor& t : c->tensors) {
    const std::string suffix = "_exps.weight";
    if (t.name.size() > suffix.size() && t.name.ends_with(suffix) && t.dims.size() == 3) {
      const std::string stem = t.name.substr(0, t.name.size() - suffix.size());  // blk.N.ffn_gate
      const uint64_t per = t.size / t.dims[2];
      for (int64_t e = 0; e < t.dims[2]; ++e)
        out.push_back({fmt::format("{}.{}.weight", stem, e), t.type, {t.dims[0], t.dims[1]}, t.data + e * per, per});
    } else {
      out.push_back(t);
    }
  }
  c->tensors = std::move(out);
}

// Converts every F32 weight matrix (2-D and 3-D tensors except the router ffn_gate_inp, which
// stays F32 as llama.cpp's quantiser keeps it) to `type` with the reference quantiser
// QuantizeRow. The converted bytes live in `storage`, which must outlive the contents.
inline void QuantizeMatrices(GgufContents* c, QuantType type, std::vector<std::vector<uint8_t>>* storage) {
  storage->reserve(storage->size() + c->tensors.size());
  for (OutTensor& t : c->tensors) {
    if (t.type != QuantType::kF32 || t.dims.size() < 2 || t.name.find("ffn_gate_inp") != std::string::npos) continue;
    const int64_t row = t.dims[0];
    const int64_t rows = static_cast<int64_t>(t.size / sizeof(float)) / row;
    const size_t row_bytes = RowBytes(type, row);
    storage->emplace_back(row_bytes * rows);
    for (int64_t r = 0; r < rows; ++r)
      QuantizeRow(type, reinterpret_cast<const float*>(t.data) + r * row, storage->back().data() + r * row_bytes, row);
    t.type = type;
    t.data = storage->back().data();
    t.size = storage->back().size();
  }
}

// Token ids separated by commas (shared/testdata/models/*.tokens.txt).
inline std::vector<int32_t> ReadTokens(const std::string& path) {
  std::ifstream in(path);
  std::vector<int32_t> ids;
  std::string item;
  while (std::getline(in, item, ',')) ids.push_back(std::stoi(item));
  return ids;
}

// A file of little-endian float32 values.
inline std::vector<float> ReadF32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// ||a - b|| / ||b||.
template <typename A, typename B>
double RelErr(const A* a, const B* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += e * e;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Loads a copy of `src` edited by `edit` (RewriteGguf) in an Engine; returns the load's Status.
inline Status LoadEdited(const std::string& src, const std::function<void(GgufContents*)>& edit) {
  ScratchDir dir;
  const std::string path = dir.File("edited.gguf");
  Status w = RewriteGguf(src, path, edit);
  EXPECT_TRUE(w.ok()) << w.ToString();
  auto e = Engine::Load(path, {.n_threads = 1});
  return e.ok() ? Status::Ok() : e.status();
}

// `s` is an error of `code`, one line, naming every one of `parts`.
inline void ExpectError(const Status& s, StatusCode code, std::initializer_list<const char*> parts) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "one line: " << s.message();
  for (const char* p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' in: " << s.message();
}

template <typename A>
int64_t ArgMax(const A* a, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (a[i] > a[best]) best = i;
  return best;
}

}  // namespace estream::model_test
