// Helpers of the batch tests (batch_test.cc: the library; batch_cli_test.cc: the CLI smoke tests):
// the shared tiny model, JSONL files, result comparison, token ids, the model's tokenizer.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace estream::batch_test {

using nlohmann::json;

inline const std::string kModel = std::string(ESTREAM_SHARED_DIR) + "/testdata/models/qwen3moe-tiny-f32.gguf";

inline std::vector<json> ReadJsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Two results agree: same keys, numbers within 1e-5 relative (+1e-6 absolute).
inline void ExpectSameJson(const json& a, const json& b, const std::string& where) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    EXPECT_LE(std::fabs(x - y), 1e-5 * std::fabs(y) + 1e-6) << where;
    return;
  }
  ASSERT_EQ(a.type(), b.type()) << where << ": " << a.dump() << " vs " << b.dump();
  if (a.is_array()) {
    ASSERT_EQ(a.size(), b.size()) << where;
    for (size_t i = 0; i < a.size(); ++i) ExpectSameJson(a[i], b[i], where + "[" + std::to_string(i) + "]");
  } else if (a.is_object()) {
    ASSERT_EQ(a.size(), b.size()) << where << ": " << a.dump() << " vs " << b.dump();
    for (auto it = a.begin(); it != a.end(); ++it) {
      ASSERT_TRUE(b.contains(it.key())) << where << "." << it.key();
      ExpectSameJson(it.value(), b[it.key()], where + "." + it.key());
    }
  } else {
    EXPECT_EQ(a, b) << where;
  }
}

// n token ids below 512 (the tiny vocabulary), different for each salt.
inline std::vector<int32_t> Ids(int n, int salt) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 53 + salt * 17 + 3) % 512;
  return ids;
}

// An input with every kind of line (ids of both types, an id-less line, a repeated id, bad JSON,
// a bad token, a blank line, continuations).
inline std::string ShardInput(int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    json j = {{"id", i % 4 == 1 ? json(i) : json("s" + std::to_string(i))}, {"tokens", Ids(1 + (i * 5) % 23, i)},
              {"top_k", 2}};
    if (i % 6 == 0) j["continuations"] = {Ids(2, i + 1), Ids(1, i + 2)};
    if (i == 7) j.erase("id");
    if (i == 11) j["id"] = "s2";  // repeated id: an error line keyed by its line number
    if (i == 13) j["tokens"] = {1, 99999};
    text += j.dump() + "\n";
    if (i == 9) text += "\n";
    if (i == 17) text += "{not json\n";
  }
  return text;
}

// The tokenizer of kModel.
inline std::unique_ptr<Tokenizer> ModelTokenizer() {
  auto f = GgufFile::Open(kModel, {.mmap = false});
  EXPECT_TRUE(f.ok());
  if (!f.ok()) return nullptr;
  auto r = Tokenizer::FromGguf(**f);
  EXPECT_TRUE(r.ok());
  return r.ok() ? std::move(*r) : nullptr;
}

}  // namespace estream::batch_test
