// Sharded batch scoring without the CLI (src/batch, issue 24): shard specs (good and malformed),
// the documented id hash (XXH64 of the id's text, seed 0), every line in exactly one shard for
// both rules, result keys, and the merge: input order, missing / duplicated / foreign keys, torn
// and non-result lines, files given twice; on any problem nothing is written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "batch/merge.h"
#include "batch/shard.h"
#include "scratch_dir.h"

namespace estream::batch {
namespace {

using nlohmann::json;

using Dir = test_util::ScratchDir;

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ShardSpec, ParsesGoodSpecs) {
  auto a = ParseShardSpec("0/1");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->index, 0);
  EXPECT_EQ(a->count, 1);
  EXPECT_EQ(a->by, ShardSpec::By::kLine);
  auto b = ParseShardSpec("3/4", "id");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->index, 3);
  EXPECT_EQ(b->count, 4);
  EXPECT_EQ(b->by, ShardSpec::By::kId);
  EXPECT_EQ(ShardName(*b), "3/4 (by id)");
  auto c = ParseShardSpec("999/1000");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->index, 999);
}

TEST(ShardSpec, RefusesBadSpecsWithOneLine) {
  struct Case {
    const char* spec;
    const char* by;
    const char* words;
  };
  const Case cases[] = {
      {"4/4", "line", "out of range: I must be 0..3 for N = 4"},
      {"7/3", "line", "out of range"},
      {"1/0", "line", "N must be between 1"},
      {"0/0", "line", "N must be between 1"},
      {"0/3000000000", "line", "N must be between 1"},
      {"-1/4", "line", "malformed"},
      {"a/4", "line", "malformed"},
      {"1/4/2", "line", "malformed"},
      {"1/", "line", "malformed"},
      {"/4", "line", "malformed"},
      {"", "line", "malformed"},
      {"14", "line", "malformed"},
      {" 1/4", "line", "malformed"},
      {"1/4x", "line", "malformed"},
      {"1.0/4", "line", "malformed"},
      {"99999999999999999999/4", "line", "malformed"},
      {"1/4", "hash", "use line or id"},
  };
  for (const Case& c : cases) {
    auto r = ParseShardSpec(c.spec, c.by);
    ASSERT_FALSE(r.ok()) << c.spec;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.words), std::string::npos) << c.spec << ": " << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  }
}

TEST(IdHash, IsXxh64OfTheIdText) {
  EXPECT_EQ(IdHashText(json("q7")), "q7");
  EXPECT_EQ(IdHashText(json(17)), "17");
  EXPECT_EQ(IdHashText(json(-3)), "-3");
  EXPECT_EQ(IdHashText(json(uint64_t{18446744073709551615u})), "18446744073709551615");
  EXPECT_EQ(IdHashText(json(1.5)), "1.5");
  EXPECT_EQ(IdHashText(json(true)), "true");
  EXPECT_EQ(IdHashText(json::array({1, "a"})), "[1,\"a\"]");
  EXPECT_EQ(IdHashText(json("h\u00e9")), "h\xc3\xa9");  // the UTF-8 bytes, not an escape
  // XXH64 of the empty input with seed 0 is xxHash's published test value.
  EXPECT_EQ(IdHash(json("")), 0xEF46DB3751D8E999ull);
  // A string id and the integer with the same digits hash alike (same text); documented.
  EXPECT_EQ(IdHash(json("17")), IdHash(json(17)));
  EXPECT_NE(IdHash(json("q7")), IdHash(json("q8")));
}

TEST(ShardOf, EveryLineInExactlyOneShard) {
  std::vector<json> ids;
  for (int i = 0; i < 997; ++i) {
    if (i % 50 == 3) ids.push_back(nullptr);  // no id: placed by line
    else if (i % 3 == 0) ids.push_back(i * 7);
    else ids.push_back("row-" + std::to_string(i * 13));
  }
  for (int64_t n : {1, 2, 3, 4, 7, 16}) {
    for (const char* by : {"line", "id"}) {
      std::vector<int> owners(ids.size(), 0);
      std::vector<int64_t> sizes(n, 0);
      for (int64_t s = 0; s < n; ++s) {
        auto spec = ParseShardSpec(std::to_string(s) + "/" + std::to_string(n), by);
        ASSERT_TRUE(spec.ok());
        for (size_t l = 0; l < ids.size(); ++l) {
          const int64_t shard = ShardOf(*spec, static_cast<int64_t>(l), ids[l]);
          ASSERT_GE(shard, 0);
          ASSERT_LT(shard, n);
          if (InShard(*spec, static_cast<int64_t>(l), ids[l])) {
            ++owners[l];
            ++sizes[s];
          }
        }
      }
      for (size_t l = 0; l < ids.size(); ++l) ASSERT_EQ(owners[l], 1) << "line " << l << " n " << n << " " << by;
      const int64_t even = static_cast<int64_t>(ids.size()) / n;
      for (int64_t s = 0; s < n; ++s) {
        if (std::string(by) == "line") {
          EXPECT_GE(sizes[s], even);
          EXPECT_LE(sizes[s], even + 1);
        } else {
          EXPECT_GE(sizes[s], even / 2) << "shard " << s << " of " << n << " by id is far from even";
        }
      }
    }
  }
  // By id, a line's shard follows its id wherever the line is.
  auto spec = ParseShardSpec("0/5", "id");
  ASSERT_TRUE(spec.ok());
  for (int l = 0; l < 50; ++l) EXPECT_EQ(ShardOf(*spec, l, json("same")), ShardOf(*spec, 1000 + 3 * l, json("same")));
}

TEST(LineKeys, FirstIdThenLineNumbers) {
  LineKeys keys;
  bool dup = true;
  EXPECT_EQ(keys.Add(json("a"), 1, &dup), "\"a\"");
  EXPECT_FALSE(dup);
  EXPECT_EQ(keys.Add(json(5), 2, &dup), "5");
  EXPECT_FALSE(dup);
  EXPECT_EQ(keys.Add(json(nullptr), 3, &dup), "line:3");
  EXPECT_FALSE(dup);
  EXPECT_EQ(keys.Add(json("a"), 4, &dup), "line:4");
  EXPECT_TRUE(dup);
  EXPECT_EQ(keys.Add(json("line:3"), 5, &dup), "\"line:3\"");  // a string id never collides
  EXPECT_FALSE(dup);
  EXPECT_EQ(keys.Add(json("5"), 6, &dup), "\"5\"");  // string "5" is not integer 5
  EXPECT_FALSE(dup);
}

TEST(ResultKey, LineFirstThenId) {
  EXPECT_EQ(*ResultKey(json::parse(R"({"id": "a", "top": []})")), "\"a\"");
  EXPECT_EQ(*ResultKey(json::parse(R"({"id": "a", "line": 4, "error": "duplicate"})")), "line:4");
  EXPECT_EQ(*ResultKey(json::parse(R"({"id": null, "line": 3, "error": "x"})")), "line:3");
  EXPECT_FALSE(ResultKey(json::parse(R"({"top": []})")).ok());
  EXPECT_FALSE(ResultKey(json::parse(R"({"id": null})")).ok());
  EXPECT_FALSE(ResultKey(json::parse(R"([1, 2])")).ok());
}

// An input of n lines (with a blank line, an id-less line and a repeated id), the result line of
// each, and shard files written from them by the line rule.
struct Fixture {
  Dir dir;
  std::string input = dir.File("in.jsonl");
  std::vector<std::string> results;  // in input order: what one process writes
  std::vector<std::string> shards;

  explicit Fixture(int n_shards, int n = 23) {
    std::string in;
    for (int i = 0; i < n; ++i) {
      if (i == 5) in += "\n";  // blank: no result
      json line = {{"id", "r" + std::to_string(i)}, {"tokens", {i, i + 1}}};
      if (i == 8) line.erase("id");
      if (i == 12) line["id"] = "r3";
      in += line.dump() + "\n";
    }
    Write(input, in);
    std::vector<std::string> per_shard(n_shards);
    std::istringstream ss(in);
    std::string text;
    LineKeys keys;
    for (int64_t l = 1; std::getline(ss, text); ++l) {
      if (IsBlankLine(text)) continue;
      const json j = json::parse(text);
      bool dup = false;
      const std::string key = keys.Add(IdOfLine(j), l, &dup);
      json r = {{"id", IdOfLine(j)}};
      if (key.rfind("line:", 0) == 0) r["line"] = l;
      if (dup || IdOfLine(j).is_null()) r["error"] = "bad";
      else r["top"] = {{{"token", l}, {"logprob", -0.5 * static_cast<double>(l)}}};
      results.push_back(r.dump());
      per_shard[(l - 1) % n_shards] += r.dump() + "\n";
    }
    for (int s = 0; s < n_shards; ++s) {
      shards.push_back(dir.File("out." + std::to_string(s) + ".jsonl"));
      Write(shards.back(), per_shard[s]);
    }
  }
  std::string Expected() const {
    std::string s;
    for (const std::string& r : results) s += r + "\n";
    return s;
  }
};

TEST(Merge, WritesInputOrderAndCounts) {
  Fixture f(4);
  const std::string out = f.dir.File("all.jsonl");
  auto r = MergeShardOutputs({.shard_outputs = f.shards, .input = f.input, .output = out});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(Read(out), f.Expected());
  EXPECT_EQ(r->lines, 23);
  EXPECT_EQ(r->error_lines, 2);
  ASSERT_EQ(r->lines_per_file.size(), 4u);
  int64_t sum = 0;
  for (int64_t c : r->lines_per_file) sum += c;
  EXPECT_EQ(sum, 23);
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
  // Order of the shard files does not matter with --input; blank lines in them are ignored.
  std::vector<std::string> reversed(f.shards.rbegin(), f.shards.rend());
  Write(f.shards[1], "\n" + Read(f.shards[1]) + "\n");
  auto r2 = MergeShardOutputs({.shard_outputs = reversed, .input = f.input, .output = out});
  ASSERT_TRUE(r2.ok()) << r2.status().message();
  EXPECT_EQ(Read(out), f.Expected());
}

TEST(Merge, WithoutInputConcatenates) {
  Fixture f(3);
  const std::string out = f.dir.File("all.jsonl");
  auto r = MergeShardOutputs({.shard_outputs = f.shards, .input = "", .output = out});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(Read(out), Read(f.shards[0]) + Read(f.shards[1]) + Read(f.shards[2]));
}

// Every failure: the message names the problem, and OUT is untouched.
void ExpectRefused(const MergeOptions& o, const std::vector<std::string>& words) {
  Write(o.output, "previous\n");
  auto r = MergeShardOutputs(o);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  for (const std::string& w : words) EXPECT_NE(m.find(w), std::string::npos) << "'" << w << "' not in: " << m;
  EXPECT_EQ(Read(o.output), "previous\n");
  EXPECT_FALSE(std::filesystem::exists(o.output + ".tmp"));
}

TEST(Merge, MissingShardIsListed) {
  Fixture f(4);
  std::vector<std::string> three(f.shards.begin(), f.shards.begin() + 3);  // shard 3 of 4 absent
  // Shard 3 holds the physical lines 4 (id r3), 8, 12, ...
  ExpectRefused({.shard_outputs = three, .input = f.input, .output = f.dir.File("all.jsonl")},
                {"nothing written", "input lines have no result", "id \"r3\"", "and "});
  // Without the input the same loss goes unnoticed: that is why --input is recommended.
  EXPECT_TRUE(MergeShardOutputs({.shard_outputs = three, .input = "", .output = f.dir.File("all2.jsonl")}).ok());
}

TEST(Merge, TruncatedListNamesTheTotal) {
  Fixture f(2, 40);
  // 41 physical lines (one blank); shard 1 of 2 held the odd 0-based indices: 20, the blank among them.
  auto r = MergeShardOutputs({.shard_outputs = {f.shards[0]}, .input = f.input, .output = f.dir.File("a.jsonl"),
                              .max_listed = 3});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("19 input lines have no result"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("and 16 more"), std::string::npos) << r.status().message();
}

TEST(Merge, DuplicatesAcrossShardsAreListed) {
  Fixture f(3);
  Write(f.shards[2], Read(f.shards[2]) + f.results[0] + "\n");  // r0 again
  ExpectRefused({.shard_outputs = f.shards, .input = f.input, .output = f.dir.File("all.jsonl")},
                {"1 keys appear more than once", "id \"r0\"", "out.0.jsonl:1", "out.2.jsonl:"});
  // Without the input too.
  ExpectRefused({.shard_outputs = f.shards, .input = "", .output = f.dir.File("all.jsonl")}, {"id \"r0\""});
}

TEST(Merge, ForeignResultsAreListed) {
  Fixture f(2);
  Write(f.shards[1], Read(f.shards[1]) + json({{"id", "zz"}, {"top", json::array()}}).dump() + "\n");
  ExpectRefused({.shard_outputs = f.shards, .input = f.input, .output = f.dir.File("all.jsonl")},
                {"results are not of a line of", "id \"zz\"", "out.1.jsonl:"});
}

TEST(Merge, TornAndNonResultLinesAreListed) {
  Fixture f(2);
  Write(f.shards[0], Read(f.shards[0]) + "{\"id\": \"r9");  // a shard killed mid-write
  ExpectRefused({.shard_outputs = f.shards, .input = f.input, .output = f.dir.File("all.jsonl")},
                {"not result lines", "out.0.jsonl:", "torn last line"});
  Fixture g(2);
  Write(g.shards[1], "garbage\n" + Read(g.shards[1]) + "{\"top\": []}\n");
  ExpectRefused({.shard_outputs = g.shards, .input = g.input, .output = g.dir.File("all.jsonl")},
                {"2 lines of the shard outputs are not result lines", "out.1.jsonl:1 (not JSON)", "no \"id\""});
}

TEST(Merge, RefusesBadArguments) {
  Fixture f(2);
  const std::string out = f.dir.File("all.jsonl");
  ExpectRefused({.shard_outputs = {f.shards[0], f.shards[1], f.shards[0]}, .input = f.input, .output = out},
                {"is given twice"});
  ExpectRefused({.shard_outputs = {f.shards[0], f.input}, .input = f.input, .output = out},
                {"both as the input and as a shard output"});
  ExpectRefused({.shard_outputs = {}, .input = f.input, .output = out}, {"at least one shard output"});
  auto same = MergeShardOutputs({.shard_outputs = f.shards, .input = f.input, .output = f.shards[1]});
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.status().message().find("is also a shard output"), std::string::npos);
  auto missing = MergeShardOutputs({.shard_outputs = {f.dir.File("nope.jsonl")}, .input = "", .output = out});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIOError);
  EXPECT_NE(missing.status().message().find("nope.jsonl: cannot open"), std::string::npos);
  auto no_input = MergeShardOutputs({.shard_outputs = f.shards, .input = f.dir.File("nope.jsonl"), .output = out});
  ASSERT_FALSE(no_input.ok());
  EXPECT_NE(no_input.status().message().find("nope.jsonl: cannot open"), std::string::npos);
}

}  // namespace
}  // namespace estream::batch
