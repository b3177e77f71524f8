// Tokenizer tests: the shared reference vectors (every file in testdata/tokenizer), the merge
// engines against naive reference implementations on random input, the pre-tokenizer splits,
// special tokens, BOS/EOS, bad input (invalid UTF-8, bad metadata) and round trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "gguf/gguf.h"
#include "tokenizer/models.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace estream {
namespace {

namespace fs = std::filesystem;

const fs::path kTokDir = fs::path(ESTREAM_SHARED_DIR) / "testdata" / "tokenizer";

std::string ReadAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// NAME.gguf.inp: strings separated by "\n__ggml_vocab_test__\n" (also after the last one).
std::vector<std::string> ReadInputs(const fs::path& p) {
  const std::string all = ReadAll(p);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t next = all.find(sep, pos);
    if (next == std::string::npos) break;
    out.push_back(all.substr(pos, next - pos));
    pos = next + sep.size();
  }
  return out;
}

std::vector<std::vector<int32_t>> ReadOutputs(const fs::path& p) {
  std::ifstream f(p);
  std::vector<std::vector<int32_t>> out;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    int32_t id;
    while (ls >> id) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

// Every vocab file with its .inp/.out pair.
std::vector<std::string> VectorFiles() {
  std::vector<std::string> names;
  if (!fs::exists(kTokDir)) return names;
  for (const auto& e : fs::directory_iterator(kTokDir)) {
    const fs::path p = e.path();
    if (p.extension() != ".gguf") continue;
    if (fs::exists(p.string() + ".inp") && fs::exists(p.string() + ".out"))
      names.push_back(p.filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Tokenizers are loaded once per file for the whole binary (qwen3 has 151k tokens and merges).
const Tokenizer& Load(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[name];
  if (!slot) {
    auto file = GgufFile::Open((kTokDir / name).string());
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    auto t = Tokenizer::FromGguf(**file);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    slot = std::move(t).value();
  }
  return *slot;
}

std::string Ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += " " + std::to_string(id);
  return s;
}

TEST(TokenizerVectors, AllFilesPresent) {
  // The README lists three families; all must be exercised.
  const auto names = VectorFiles();
  EXPECT_GE(names.size(), 3u) << "expected test vectors in " << kTokDir;
}

class VectorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(VectorTest, MatchesReferenceIds) {
  const fs::path base = kTokDir / GetParam();
  const auto inputs = ReadInputs(base.string() + ".inp");
  const auto outputs = ReadOutputs(base.string() + ".out");
  ASSERT_EQ(inputs.size(), outputs.size());
  ASSERT_GT(inputs.size(), 0u);
  const Tokenizer& t = Load(GetParam());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto ids = t.Encode(inputs[i], /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(ids, outputs[i]) << "string " << i << " '" << inputs[i] << "'\n got:" << Ids(ids)
                               << "\nwant:" << Ids(outputs[i]);
  }
}

TEST_P(VectorTest, DecodeRestoresInput) {
  const fs::path base = kTokDir / GetParam();
  const Tokenizer& t = Load(GetParam());
  for (const std::string& s : ReadInputs(base.string() + ".inp")) {
    EXPECT_EQ(t.Decode(t.Encode(s, false, false)), s);
    // With BOS/EOS as the metadata says, the specials render as nothing.
    EXPECT_EQ(t.Decode(t.Encode(s, true, false)), s);
  }
}

INSTANTIATE_TEST_SUITE_P(SharedTestdata, VectorTest, ::testing::ValuesIn(VectorFiles()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

const char* kQwen = "ggml-vocab-qwen3.gguf";
const char* kGpt2 = "ggml-vocab-gpt-2.gguf";
const char* kSpm = "ggml-vocab-llama-spm.gguf";
const char* kAll[] = {kQwen, kGpt2, kSpm};

// ---- metadata ---------------------------------------------------------------------------------

TEST(TokenizerMeta, SpecialIdsAndFlags) {
  const Tokenizer& q = Load(kQwen);
  EXPECT_EQ(q.n_vocab(), 151669);
  EXPECT_EQ(q.model(), "gpt2");
  EXPECT_EQ(q.pre(), "qwen2");
  EXPECT_EQ(q.bos_id(), -1);
  EXPECT_EQ(q.eos_id(), 151645);
  EXPECT_EQ(q.pad_id(), 151643);
  EXPECT_FALSE(q.add_bos());
  const Tokenizer& s = Load(kSpm);
  EXPECT_EQ(s.n_vocab(), 32000);
  EXPECT_EQ(s.bos_id(), 1);
  EXPECT_EQ(s.eos_id(), 2);
  EXPECT_EQ(s.unk_id(), 0);
  EXPECT_TRUE(s.add_bos());
  EXPECT_FALSE(s.add_eos());
  EXPECT_TRUE(s.add_space_prefix());
  const Tokenizer& g = Load(kGpt2);
  EXPECT_EQ(g.bos_id(), 50256);
  EXPECT_FALSE(g.add_bos());  // key absent: gpt-2 adds no BOS
}

TEST(TokenizerMeta, BosEosPerMetadata) {
  const Tokenizer& s = Load(kSpm);
  auto ids = s.Encode("Hello", true, false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 15043}));
  EXPECT_EQ(s.Encode("", true, false), std::vector<int32_t>{1});
  const Tokenizer& q = Load(kQwen);
  EXPECT_EQ(q.Encode("Hello", true, false), std::vector<int32_t>{9707});
}

// ---- own cases --------------------------------------------------------------------------------

TEST(TokenizerEdge, EmptyString) {
  for (const char* name : kAll) EXPECT_TRUE(Load(name).Encode("", false, false).empty()) << name;
  EXPECT_EQ(Load(kQwen).Decode({}), "");
}

TEST(TokenizerEdge, OnlyWhitespaceAndOnlyDigits) {
  const std::string cases[] = {" ", "\t", "\n", "   \t\t \n\n  \r\n ", "\xC2\xA0\xE3\x80\x80 \xE2\x80\xA8",
                               std::string(1000, ' '), std::string(999, '\n'), "0", "0123456789",
                               std::string(1001, '7'), "\xD9\xA3\xD9\xA4 \xEF\xBC\x95"};
  for (const char* name : kAll) {
    const Tokenizer& t = Load(name);
    for (const std::string& s : cases) {
      const auto ids = t.Encode(s, false, false);
      EXPECT_FALSE(ids.empty()) << name;
      EXPECT_EQ(t.Decode(ids), s) << name;
    }
  }
  // Qwen splits digits one by one: 1001 sevens are 1001 tokens of "7".
  const auto sevens = Load(kQwen).Encode(std::string(1001, '7'), false, false);
  ASSERT_EQ(sevens.size(), 1001u);
  EXPECT_TRUE(std::all_of(sevens.begin(), sevens.end(), [&](int32_t id) { return id == sevens[0]; }));
  EXPECT_EQ(Load(kQwen).TokenPiece(sevens[0]), "7");
}

TEST(TokenizerEdge, VeryLongWords) {
  // 100 KB of one letter is a single pre-tokenizer word: the merge engine must stay O(n log n).
  const std::string word(100 * 1024, 'a');
  for (const char* name : kAll) {
    const Tokenizer& t = Load(name);
    const auto ids = t.Encode(word, false, false);
    EXPECT_LT(ids.size(), word.size() / 2) << name;  // merged into multi-letter tokens
    EXPECT_EQ(t.Decode(ids), word) << name;
  }
  // A long word of mixed letters (random, reproducible) and a long run of one CJK character.
  std::mt19937 rng(1234);
  std::string mixed;
  for (int i = 0; i < 50000; ++i) mixed.push_back(static_cast<char>('a' + rng() % 26));
  std::string cjk;
  for (int i = 0; i < 20000; ++i) cjk += "\xE4\xB8\xAD";
  for (const char* name : kAll) {
    const Tokenizer& t = Load(name);
    EXPECT_EQ(t.Decode(t.Encode(mixed, false, false)), mixed) << name;
    EXPECT_EQ(t.Decode(t.Encode(cjk, false, false)), cjk) << name;
  }
}

TEST(TokenizerEdge, InvalidUtf8IsReplacedNotFatal) {
  // Documented behaviour: each maximal ill-formed subpart becomes one U+FFFD.
  const std::string fffd = "\xEF\xBF\xBD";
  const std::pair<std::string, std::string> cases[] = {
      {"\xFF", fffd},
      {"a\xE2\x82" "b", "a" + fffd + "b"},          // truncated 3-byte sequence: one subpart
      {"\xED\xA0\x80", fffd + fffd + fffd},          // surrogate: ED then two stray bytes
      {"\xC0\xAF", fffd + fffd},                     // overlong
      {"\xF4\x90\x80\x80", fffd + fffd + fffd + fffd},  // above U+10FFFF
      {"\x80\x80", fffd + fffd},                     // stray continuation bytes
      {"ok\xF0\x9F\x98", "ok" + fffd},               // truncated at end of input
      {"\xE2\x82\xAC", "\xE2\x82\xAC"},              // valid euro sign unchanged
  };
  for (const auto& [in, want] : cases) {
    EXPECT_EQ(tok::ReplaceInvalidUtf8(in), want);
    size_t bad = 0;
    EXPECT_EQ(Tokenizer::IsValidUtf8(in, &bad), in == want);
    for (const char* name : kAll) {
      const Tokenizer& t = Load(name);
      EXPECT_EQ(t.Encode(in, false, false), t.Encode(want, false, false)) << name;
    }
  }
  size_t bad = 99;
  EXPECT_FALSE(Tokenizer::IsValidUtf8("abcdefghij\xC3", &bad));
  EXPECT_EQ(bad, 10u);
}

TEST(TokenizerEdge, RandomBytesNeverCrashAndRoundTripAfterReplacement) {
  std::mt19937 rng(42);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s(1 + rng() % 97, '\0');
    for (char& c : s) {
      const uint32_t r = rng() % 4;
      c = static_cast<char>(r == 0 ? rng() % 256 : r == 1 ? ' ' + rng() % 95 : r == 2 ? 0x80 + rng() % 64 : 0xE0 + rng() % 16);
    }
    const std::string repaired = tok::ReplaceInvalidUtf8(s);
    EXPECT_TRUE(tok::IsValidUtf8(repaired));
    for (const char* name : kAll) {
      const Tokenizer& t = Load(name);
      const auto ids = t.Encode(s, true, true);
      for (int32_t id : ids) ASSERT_TRUE(t.IsValidId(id));
      EXPECT_EQ(t.Decode(t.Encode(s, false, false)), repaired) << name;
    }
  }
}

TEST(TokenizerEdge, RoundTripRandomUnicode) {
  // decode(encode(s)) == s for well-formed text in all scripts, including characters that no
  // token covers (byte fallback in SPM, byte alphabet in BPE).
  const char* alphabet[] = {"a", "Z", " ", "  ", "\n", "\t", "7", "'", "'s", "'LL", "!", "...", "\xC3\xA9",
                            "\xD0\x96", "\xE4\xB8\xAD", "\xE0\xA4\xB9", "\xF0\x9F\x98\x80", "\xE2\x80\x8D",
                            "\xCC\x81", "\xEF\xB8\x8F", "\xC2\xA0", "\r\n", "\xF0\x90\x8D\x88", "\x01", "<", "|"};
  std::mt19937 rng(7);
  for (int iter = 0; iter < 200; ++iter) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % std::size(alphabet)];
    for (const char* name : kAll) {
      const Tokenizer& t = Load(name);
      EXPECT_EQ(t.Decode(t.Encode(s, false, false)), s) << name;
    }
  }
}

TEST(TokenizerSpecial, ControlTokensOnlyWithParseSpecial) {
  const Tokenizer& q = Load(kQwen);
  const std::string text = "<|im_start|>user\nHi<|im_end|>";
  const auto parsed = q.Encode(text, false, true);
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 151644);
  EXPECT_EQ(parsed.back(), 151645);
  const auto plain = q.Encode(text, false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 151644), 0);
  EXPECT_EQ(q.Decode(plain), text);
  EXPECT_EQ(q.Decode(parsed, /*render_special=*/true), text);
  EXPECT_EQ(q.Decode(parsed, /*render_special=*/false), "user\nHi");
  // User-defined tokens (type 4) are always recognised, as in llama.cpp and Hugging Face.
  EXPECT_EQ(q.Encode("<think>", false, false), std::vector<int32_t>{151667});
  EXPECT_EQ(q.Encode("a<think>b", false, false).size(), 3u);
  EXPECT_EQ(q.Decode(q.Encode("a<think>b", false, false)), "a<think>b");
  // Longest match wins among specials starting at the same place.
  EXPECT_EQ(q.Encode("</tool_call>", false, false), std::vector<int32_t>{151658});

  const Tokenizer& g = Load(kGpt2);
  EXPECT_EQ(g.Encode("<|endoftext|>", false, true), std::vector<int32_t>{50256});
  EXPECT_GT(g.Encode("<|endoftext|>", false, false).size(), 1u);
}

TEST(TokenizerSpecial, SpmSpecialsAndPrefixSpace) {
  const Tokenizer& s = Load(kSpm);
  // "<s>" parsed as BOS; the text after it gets the prefix space again.
  const auto ids = s.Encode("<s>Hello", false, true);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 15043}));
  EXPECT_EQ(s.Decode(ids, true), "<s>Hello");
  EXPECT_NE(s.Encode("<s>Hello", false, false), ids);
  EXPECT_EQ(s.Decode(s.Encode("<s>Hello", false, false)), "<s>Hello");
  EXPECT_EQ(s.Decode(s.Encode("<unk>", false, true)), "\xEF\xBF\xBD");
}

TEST(TokenizerDecode, PiecesAndInvalidIds) {
  const Tokenizer& q = Load(kQwen);
  EXPECT_EQ(q.TokenPiece(9707), "Hello");
  EXPECT_EQ(q.TokenPiece(21927), " Hello");
  EXPECT_EQ(q.TokenPiece(198), "\n");
  EXPECT_EQ(q.TokenPiece(151644), "<|im_start|>");
  EXPECT_EQ(q.TokenPiece(-1), "");
  EXPECT_EQ(q.TokenPiece(q.n_vocab()), "");
  const std::vector<int32_t> bad = {9707, -5, 1 << 30};
  EXPECT_EQ(q.Decode(bad), "Hello\xEF\xBF\xBD\xEF\xBF\xBD");
  const Tokenizer& s = Load(kSpm);
  EXPECT_EQ(s.TokenPiece(3 + 0x41), "A");  // <0x41>
  EXPECT_EQ(s.TokenPiece(15043), " Hello");
  EXPECT_EQ(s.FindToken("\xE2\x96\x81Hello"), 15043);
}

TEST(TokenizerThreads, ConcurrentEncodeAgrees) {
  const Tokenizer& q = Load(kQwen);
  const std::string text = "The quick brown fox jumps over the lazy dog. 12345 \xE4\xB8\xAD\xE6\x96\x87!\n";
  std::string big;
  for (int i = 0; i < 200; ++i) big += text;
  const auto want = q.Encode(big, false, false);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { got[i] = q.Encode(big, false, false); });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

// ---- pre-tokenizer ----------------------------------------------------------------------------

std::vector<std::string> Split(tok::PreType type, const std::string& text) {
  auto p = tok::Pretokenizer::Create(type);
  EXPECT_TRUE(p.ok());
  std::vector<std::string> words;
  (*p)->Split(text, [&](size_t b, size_t e) { words.push_back(text.substr(b, e - b)); });
  return words;
}

using W = std::vector<std::string>;

TEST(Pretokenizer, Gpt2Splits) {
  EXPECT_EQ(Split(tok::PreType::kGpt2, "Hello  world"), (W{"Hello", " ", " world"}));
  EXPECT_EQ(Split(tok::PreType::kGpt2, "I'll 42x"), (W{"I", "'ll", " 42", "x"}));
  EXPECT_EQ(Split(tok::PreType::kGpt2, "a\tb"), (W{"a", "\t", "b"}));
  EXPECT_EQ(Split(tok::PreType::kGpt2, "x   "), (W{"x", "   "}));
  EXPECT_EQ(Split(tok::PreType::kGpt2, "'S"), (W{"'", "S"}));  // contractions are case-sensitive
  // U+0085 (NEL) is White_Space; U+180E is not (PCRE2's own \s would say it is).
  EXPECT_EQ(Split(tok::PreType::kGpt2, "a\xC2\x85" "b"), (W{"a", "\xC2\x85", "b"}));
  EXPECT_EQ(Split(tok::PreType::kGpt2, "a\xE1\xA0\x8E" "b"), (W{"a", "\xE1\xA0\x8E", "b"}));
}

TEST(Pretokenizer, Qwen2AndLlama3Splits) {
  EXPECT_EQ(Split(tok::PreType::kQwen2, "abc1234"), (W{"abc", "1", "2", "3", "4"}));
  EXPECT_EQ(Split(tok::PreType::kLlama3, "abc1234567"), (W{"abc", "123", "456", "7"}));
  EXPECT_EQ(Split(tok::PreType::kQwen2, "x\n\n  y"), (W{"x", "\n\n", " ", " y"}));
  EXPECT_EQ(Split(tok::PreType::kQwen2, "I'LL go"), (W{"I", "'LL", " go"}));
  EXPECT_EQ(Split(tok::PreType::kQwen2, "(hi)!!\n\nok"), (W{"(hi", ")!!\n\n", "ok"}));
  EXPECT_EQ(Split(tok::PreType::kQwen2, ""), W{});
}

// ---- merge engines against naive references -----------------------------------------------

// Naive byte-level BPE: repeatedly merge the adjacent pair of lowest rank (leftmost on ties),
// on strings, in O(n^2) per word.
std::vector<std::string> NaiveBpe(const std::string& mapped_word,
                                  const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> syms;
  for (size_t i = 0; i < mapped_word.size();) {
    const size_t n = tok::LeadByteLength(static_cast<uint8_t>(mapped_word[i]));
    syms.push_back(mapped_word.substr(i, n));
    i += n;
  }
  while (syms.size() > 1) {
    int best = -1, best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto it = ranks.find({syms[i], syms[i + 1]});
      if (it != ranks.end() && it->second < best_rank) {
        best_rank = it->second;
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + best + 1);
  }
  return syms;
}

TEST(MergeEngines, BpeMatchesNaiveOnRandomWords) {
  // A small synthetic vocabulary over 4 letters with every 2- and 3-letter string and merges in
  // a shuffled order, so ties and re-merges are frequent.
  std::mt19937 rng(99);
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    tok::AppendUtf8(tok::ByteToCodepoint(static_cast<uint8_t>(b)), &s);
    tokens.push_back(s);
  }
  std::vector<std::string> merges;
  const std::string letters = "abcd";
  for (char x : letters)
    for (char y : letters) merges.push_back(std::string(1, x) + " " + y);
  for (char x : letters) {
    for (char y : letters) {
      for (char z : letters) {
        merges.push_back(rng() % 2 ? std::string(1, x) + y + " " + z : std::string(1, x) + " " + y + z);
      }
    }
  }
  std::shuffle(merges.begin() + 16, merges.end(), rng);
  merges.push_back("abab cdcd");  // merges whose result and parts may be absent from the vocab
  std::map<std::pair<std::string, std::string>, int> ranks;
  for (size_t i = 0; i < merges.size(); ++i) {
    const size_t sp = merges[i].find(' ', 1);
    ranks.emplace(std::make_pair(merges[i].substr(0, sp), merges[i].substr(sp + 1)), static_cast<int>(i));
    const std::string joined = merges[i].substr(0, sp) + merges[i].substr(sp + 1);
    if (rng() % 4 != 0 && std::find(tokens.begin(), tokens.end(), joined) == tokens.end()) tokens.push_back(joined);
  }
  tok::TokenIndex index;
  for (size_t i = 0; i < tokens.size(); ++i) index[tokens[i]] = static_cast<int32_t>(i);
  auto model = tok::BpeModel::Create(tokens, index, merges, false, "synthetic");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  tok::MergeScratch scratch;
  for (int iter = 0; iter < 400; ++iter) {
    const int n = 1 + static_cast<int>(rng() % (iter < 390 ? 40 : 700));
    std::string word;
    for (int i = 0; i < n; ++i) word.push_back(letters[rng() % 4]);
    std::vector<int32_t> got;
    (*model)->EncodeWord(word, &scratch, &got);
    std::vector<int32_t> want;
    for (const std::string& sym : NaiveBpe(word, ranks)) {
      auto it = index.find(sym);
      if (it != index.end()) {
        want.push_back(it->second);
      } else {
        for (char ch : sym) want.push_back(index.at(std::string(1, ch)));
      }
    }
    ASSERT_EQ(got, want) << word;
  }
}

// Naive SentencePiece BPE: repeatedly merge the adjacent pair whose concatenation is a token of
// highest score (leftmost on ties).
std::vector<std::string> NaiveSpm(const std::string& text, const std::map<std::string, float>& score) {
  std::vector<std::string> syms;
  for (size_t i = 0; i < text.size();) {
    const size_t n = tok::LeadByteLength(static_cast<uint8_t>(text[i]));
    syms.push_back(text.substr(i, n));
    i += n;
  }
  while (true) {
    int best = -1;
    float best_score = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      auto it = score.find(syms[i] + syms[i + 1]);
      if (it != score.end() && (best < 0 || it->second > best_score)) {
        best = static_cast<int>(i);
        best_score = it->second;
      }
    }
    if (best < 0) break;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + best + 1);
  }
  return syms;
}

// inner_space: let tokens hold "▁" after another character (disables the word split).
void SpmAgainstNaive(bool inner_space, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> tokens = {"<unk>"};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.push_back(name);
  }
  const std::string mark = "\xE2\x96\x81";
  const std::vector<std::string> chars = {"a", "b", "c", mark, "\xC3\xA9"};
  auto allowed = [&](const std::string& t) {
    if (inner_space) return true;
    for (size_t p = t.find(mark, 1); p != std::string::npos; p = t.find(mark, p + 1))
      if (p < 3 || t.compare(p - 3, 3, mark) != 0) return false;
    return true;
  };
  for (const auto& x : chars) tokens.push_back(x);
  for (const auto& x : chars)
    for (const auto& y : chars)
      if (rng() % 3 && allowed(x + y)) tokens.push_back(x + y);
  for (int i = 0; i < 80; ++i) {
    const std::string t = chars[rng() % 5] + chars[rng() % 5] + chars[rng() % 5];
    if (allowed(t)) tokens.push_back(t);
  }
  std::vector<float> scores;
  std::map<std::string, float> score;
  tok::TokenIndex index;
  for (size_t i = 0; i < tokens.size(); ++i) {
    scores.push_back(static_cast<float>(rng() % 7));  // few distinct scores: many ties
    index[tokens[i]] = static_cast<int32_t>(i);       // last wins, as in the tokenizer
    score[tokens[i]] = scores.back();
  }
  auto model = tok::SpmModel::Create(tokens, scores, index, 0);
  tok::MergeScratch scratch;
  for (int iter = 0; iter < 400; ++iter) {
    const int n = 1 + static_cast<int>(rng() % (iter < 390 ? 40 : 600));
    std::string text;
    for (int i = 0; i < n; ++i) text += rng() % 10 == 0 ? std::string("\xE4\xB8\xAD") : chars[rng() % 5];
    std::vector<int32_t> got;
    tok::WordCache cache(text.size());
    model->EncodeText(text, &scratch, &cache, &got);
    std::vector<int32_t> want;
    for (const std::string& sym : NaiveSpm(text, score)) {
      auto it = index.find(sym);
      if (it != index.end()) {
        want.push_back(it->second);
      } else {
        for (unsigned char ch : sym) want.push_back(1 + ch);  // "<0xXX>" is id 1 + byte
      }
    }
    ASSERT_EQ(got, want) << text;
  }
}

TEST(MergeEngines, SpmMatchesNaiveOnRandomText) { SpmAgainstNaive(/*inner_space=*/true, 5); }
TEST(MergeEngines, SpmWordSplitMatchesNaiveOnRandomText) { SpmAgainstNaive(/*inner_space=*/false, 6); }

// ---- bad metadata -----------------------------------------------------------------------------

TokenizerVocab TinyBpe() {
  TokenizerVocab v;
  v.model = "gpt2";
  v.pre = "gpt-2";
  for (int b = 0; b < 256; ++b) {
    std::string s;
    tok::AppendUtf8(tok::ByteToCodepoint(static_cast<uint8_t>(b)), &s);
    v.tokens.push_back(s);
  }
  v.tokens.push_back("ab");
  v.merges = {"a b"};
  return v;
}

TEST(TokenizerErrors, UnknownModelOrPre) {
  TokenizerVocab v = TinyBpe();
  v.model = "bert";
  auto r = Tokenizer::FromVocab(v, "m.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(r.status().message().find("gpt2"), std::string::npos) << r.status().message();
  v = TinyBpe();
  v.pre = "deepseek-coder";
  r = Tokenizer::FromVocab(v, "m.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(r.status().message().find("qwen2"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("m.gguf"), std::string::npos);
  v = TinyBpe();
  auto ok = Tokenizer::FromVocab(v);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->Encode("ab", false, false), std::vector<int32_t>{256});
}

// A gpt2 vocabulary without tokenizer.ggml.pre (older converters) gets llama.cpp's default
// pre-tokenizer (a warning on stderr) instead of a refusal; "default" names it explicitly.
TEST(TokenizerFamilies, MissingPreUsesDefault) {
  for (const char* pre : {"", "default"}) {
    TokenizerVocab v = TinyBpe();
    v.pre = pre;
    auto t = Tokenizer::FromVocab(v, "old.gguf");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ((*t)->pre(), pre);
    EXPECT_EQ((*t)->Encode("ab", false, false), std::vector<int32_t>{256});
    // Punctuation is split off first, digits in groups of three: every byte still round-trips.
    EXPECT_EQ((*t)->Decode((*t)->Encode("ab, 12345!? ab", false, false)), "ab, 12345!? ab");
  }
  EXPECT_EQ(tok::PreTypeRegexCount(tok::PreType::kDefault), 4);
  EXPECT_EQ(tok::PreTypeRegexCount(tok::PreType::kDeepseekLlm), 6);
  EXPECT_EQ(tok::PreTypeRegexCount(tok::PreType::kGpt2), 1);
}

// The sequence semantics: each step splits the words of the previous one, and '$' anchors at the
// end of the word being split (deepseek-llm's trailing-whitespace step).
TEST(Pretokenizer, DeepseekLlmSequence) {
  auto p = tok::Pretokenizer::Create(tok::PreType::kDeepseekLlm);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto words = [&](std::string_view text) {
    std::vector<std::string> out;
    (*p)->Split(text, [&](size_t b, size_t e) { out.emplace_back(text.substr(b, e - b)); });
    return out;
  };
  EXPECT_EQ(words("Hello world, 123 \u4f60\u597d!\n  x  "),
            (std::vector<std::string>{"Hello", " world", ",", " ", "123", " ", "\u4f60\u597d", "!", "\n", " ",
                                      " x", "  "}));
}

TEST(TokenizerFamilies, Llama3IgnoreMergesAndBos) {
  // "abc" is a token that the merges cannot build ("a b" gives "ab", nothing joins "ab c"): the
  // gpt-2 family emits ab + c, llama-bpe emits the whole word because it is a token.
  TokenizerVocab v = TinyBpe();
  v.tokens.push_back("abc");
  v.tokens.push_back("<|begin_of_text|>");
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types.back() = 3;
  v.bos_id = static_cast<int32_t>(v.tokens.size() - 1);
  auto gpt2 = Tokenizer::FromVocab(v);
  ASSERT_TRUE(gpt2.ok()) << gpt2.status().ToString();
  EXPECT_EQ((*gpt2)->Encode("abc", true, false), (std::vector<int32_t>{256, 'c'}));
  v.pre = "llama-bpe";
  auto llama3 = Tokenizer::FromVocab(v);
  ASSERT_TRUE(llama3.ok()) << llama3.status().ToString();
  EXPECT_TRUE((*llama3)->add_bos());  // llama-bpe adds BOS unless the metadata says otherwise
  EXPECT_EQ((*llama3)->Encode("abc", true, false), (std::vector<int32_t>{*v.bos_id, 257}));
  EXPECT_EQ((*llama3)->Decode((*llama3)->Encode("abc abc", true, false)), "abc abc");
}

TEST(TokenizerFamilies, Lfm2IsLlama3Split) {
  // LFM2 files say tokenizer.ggml.pre = "lfm2": Llama 3's split, merges ignored, BOS by default.
  TokenizerVocab v = TinyBpe();
  v.tokens.push_back("abc");
  v.tokens.push_back("<|startoftext|>");
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types.back() = 3;
  v.bos_id = static_cast<int32_t>(v.tokens.size() - 1);
  v.pre = "lfm2";
  auto lfm2 = Tokenizer::FromVocab(v);
  ASSERT_TRUE(lfm2.ok()) << lfm2.status().ToString();
  EXPECT_TRUE((*lfm2)->add_bos());
  EXPECT_EQ((*lfm2)->Encode("abc", true, false), (std::vector<int32_t>{*v.bos_id, 257}));
  v.pre = "llama-bpe";
  auto llama3 = Tokenizer::FromVocab(v);
  ASSERT_TRUE(llama3.ok());
  for (const char* text : {"abc 12345 ab's", "  x\n\n  y 7"})
    EXPECT_EQ((*lfm2)->Encode(text, false, false), (*llama3)->Encode(text, false, false)) << text;
}

TEST(TokenizerErrors, InconsistentMetadata) {
  TokenizerVocab v = TinyBpe();
  v.token_types = {1, 1};
  EXPECT_EQ(Tokenizer::FromVocab(v).status().code(), StatusCode::kCorruption);
  v = TinyBpe();
  v.merges = {"ab"};
  EXPECT_EQ(Tokenizer::FromVocab(v).status().code(), StatusCode::kCorruption);
  v = TinyBpe();
  v.merges.clear();
  EXPECT_EQ(Tokenizer::FromVocab(v).status().code(), StatusCode::kCorruption);
  v = TinyBpe();
  v.eos_id = 100000;
  EXPECT_EQ(Tokenizer::FromVocab(v).status().code(), StatusCode::kCorruption);
  v = TinyBpe();
  v.add_bos = true;  // but no bos id
  EXPECT_EQ(Tokenizer::FromVocab(v).status().code(), StatusCode::kCorruption);
  v = TinyBpe();
  v.model = "llama";  // no scores
  EXPECT_EQ(Tokenizer::FromVocab(v).status().code(), StatusCode::kCorruption);
  v = TinyBpe();
  v.tokens.clear();
  EXPECT_EQ(Tokenizer::FromVocab(v).status().code(), StatusCode::kCorruption);
}

// The file is removed once open (the open file stays readable), so runs leave nothing behind.
Result<std::unique_ptr<GgufFile>> WriteAndOpen(GgufWriter& w, const std::string& name) {
  const std::string path = (fs::path(ESTREAM_BINARY_DIR) / name).string();
  ESTREAM_RETURN_IF_ERROR(w.Begin(path));
  ESTREAM_RETURN_IF_ERROR(w.Finish());
  auto file = GgufFile::Open(path);
  std::error_code ec;
  fs::remove(path, ec);
  return file;
}

TEST(TokenizerErrors, GgufWithoutTokenizerKeys) {
  GgufWriter w;
  w.AddKv("general.architecture", GgufValue::String("qwen3moe"));
  auto f = WriteAndOpen(w, "tokenizer_test_no_vocab.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto t = Tokenizer::FromGguf(**f);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(t.status().message().find("tokenizer.ggml.model"), std::string::npos);
  EXPECT_NE(t.status().message().find("token ids"), std::string::npos);
}

TEST(TokenizerErrors, GgufWrongKeyTypes) {
  GgufWriter w;
  w.AddKv("tokenizer.ggml.model", GgufValue::String("gpt2"));
  w.AddKv("tokenizer.ggml.pre", GgufValue::String("gpt-2"));
  w.AddKv("tokenizer.ggml.tokens", GgufValue::I32Array({1, 2, 3}));
  auto f = WriteAndOpen(w, "tokenizer_test_bad_types.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto t = Tokenizer::FromGguf(**f);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption);
  EXPECT_NE(t.status().message().find("tokenizer.ggml.tokens"), std::string::npos) << t.status().message();
}

}  // namespace
}  // namespace estream
