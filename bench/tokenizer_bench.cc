// Tokenizer throughput on English-like text, one thread.
//
// The text (about 4 MiB) is generated here, deterministically: sentences of Zipf-distributed
// words (the most common English words, then a long tail of made-up but pronounceable words so
// that most of the vocabulary's merge table is exercised, not just a few hundred cached words),
// capitalisation, punctuation, contractions, numbers, quotes and paragraph breaks.
//
// Vocabularies come from the shared test data (qwen3, gpt-2, llama-spm): the directory is
// $ESTREAM_SHARED_DIR when set, else the ESTREAM_SHARED_DIR compile definition; benchmarks whose
// file is missing are skipped.
//
//   build-x/bench/tokenizer_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace estream {
namespace {

const char* kCommon[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are",
    "with", "as", "I", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by",
    "hot", "but", "some", "what", "there", "we", "can", "out", "other", "were", "all", "your",
    "when", "up", "use", "word", "how", "said", "an", "each", "she", "which", "do", "their", "time",
    "if", "will", "way", "about", "many", "then", "them", "would", "write", "like", "so", "these",
    "her", "long", "make", "thing", "see", "him", "two", "has", "look", "more", "day", "could",
    "go", "come", "did", "my", "sound", "no", "most", "number", "who", "over", "know", "water",
    "than", "call", "first", "people", "may", "down", "side", "been", "now", "find", "any", "new",
    "work", "part", "take", "get", "place", "made", "live", "where", "after", "back", "little",
    "only", "round", "man", "year", "came", "show", "every", "good", "me", "give", "our", "under",
    "name", "very", "through", "just", "form", "much", "great", "think", "say", "help", "low",
    "line", "before", "turn", "cause", "same", "mean", "differ", "move", "right", "boy", "old",
    "too", "does", "tell", "sentence", "set", "three", "want", "air", "well", "also", "play",
    "small", "end", "put", "home", "read", "hand", "port", "large", "spell", "add", "even",
    "land", "here", "must", "big", "high", "such", "follow", "act", "why", "ask", "men", "change",
    "went", "light", "kind", "off", "need", "house", "picture", "try", "us", "again", "animal",
    "point", "mother", "world", "near", "build", "self", "earth", "father", "government",
    "information", "development", "university", "international", "experience", "understanding",
    "environmental", "responsibility", "technology", "significantly", "particularly",
};
const char* kContractions[] = {"don't", "it's", "I'm", "we're", "they've", "can't", "she'll", "he'd", "won't"};
const char* kOnsets[] = {"b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w",
                         "br", "cr", "st", "tr", "pl", "gr", "sh", "ch", "th", "str", "sp"};
const char* kVowels[] = {"a", "e", "i", "o", "u", "ea", "ou", "ai", "io", "y"};
const char* kCodas[] = {"", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "rt", "ck", "tion", "ment", "ness"};

std::string GenerateEnglishLike(size_t n_bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  // Vocabulary: common words first, then 20000 made-up words; Zipf(1.0) over the ranks.
  std::vector<std::string> words(std::begin(kCommon), std::end(kCommon));
  while (words.size() < 20000) {
    std::string w;
    const int syllables = 1 + static_cast<int>(rng() % 4);
    for (int s = 0; s < syllables; ++s) {
      w += kOnsets[rng() % std::size(kOnsets)];
      w += kVowels[rng() % std::size(kVowels)];
      w += kCodas[rng() % std::size(kCodas)];
    }
    words.push_back(w);
  }
  std::vector<double> cdf(words.size());
  double acc = 0;
  for (size_t i = 0; i < words.size(); ++i) cdf[i] = (acc += 1.0 / static_cast<double>(i + 1));
  std::uniform_real_distribution<double> u(0, acc);
  auto pick = [&]() -> const std::string& {
    const size_t i = static_cast<size_t>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
    return words[std::min(i, words.size() - 1)];
  };
  std::string text;
  text.reserve(n_bytes + 256);
  while (text.size() < n_bytes) {
    const int n_sentences = 2 + static_cast<int>(rng() % 6);
    for (int s = 0; s < n_sentences; ++s) {
      const int n_words = 6 + static_cast<int>(rng() % 16);
      const bool quoted = rng() % 12 == 0;
      if (quoted) text += '"';
      for (int w = 0; w < n_words; ++w) {
        std::string word;
        const uint32_t r = rng() % 100;
        if (r < 3) word = kContractions[rng() % std::size(kContractions)];
        else if (r < 5) word = std::to_string(rng() % (r == 3 ? 100 : 3000));
        else if (r < 6) word = std::to_string(rng() % 100) + "." + std::to_string(rng() % 10) + "%";
        else word = pick();
        if (w == 0 && !word.empty()) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
        text += word;
        if (w + 1 < n_words) text += rng() % 9 == 0 ? ", " : " ";
      }
      const uint32_t p = rng() % 10;
      text += p < 7 ? "." : p < 9 ? "?" : "!";
      if (quoted) text += '"';
      text += ' ';
    }
    text.back() = '\n';
    text += '\n';
  }
  return text;
}

const std::string& Text() {
  static const std::string text = GenerateEnglishLike(4u << 20, 2024);
  return text;
}

std::string SharedDir() {
  const char* env = std::getenv("ESTREAM_SHARED_DIR");
  return env && *env ? env : ESTREAM_SHARED_DIR;
}

const Tokenizer* Load(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  std::unique_ptr<Tokenizer> t;
  auto file = GgufFile::Open(SharedDir() + "/testdata/tokenizer/ggml-vocab-" + name + ".gguf");
  if (file.ok()) {
    auto r = Tokenizer::FromGguf(**file);
    if (r.ok()) t = std::move(r).value();
  }
  return (cache[name] = std::move(t)).get();
}

void BM_Encode(benchmark::State& state, const char* name) {
  const Tokenizer* t = Load(name);
  if (t == nullptr) {
    state.SkipWithError("vocabulary not found (set ESTREAM_SHARED_DIR)");
    return;
  }
  const std::string& text = Text();
  size_t n_tokens = 0;
  for (auto _ : state) {
    auto ids = t->Encode(text, false, false);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
  state.counters["bytes/token"] = static_cast<double>(text.size()) / static_cast<double>(n_tokens);
}

// The same text encoded one paragraph (about 500 bytes) per call, as prompts arrive: the per-call
// word memo gets little reuse, so this is close to the cost of the merge engine itself.
void BM_EncodeParagraphs(benchmark::State& state, const char* name) {
  const Tokenizer* t = Load(name);
  if (t == nullptr) {
    state.SkipWithError("vocabulary not found (set ESTREAM_SHARED_DIR)");
    return;
  }
  const std::string& text = Text();
  std::vector<std::string_view> paragraphs;
  for (size_t b = 0; b < text.size();) {
    size_t e = text.find("\n\n", b);
    e = e == std::string::npos ? text.size() : e + 2;
    paragraphs.push_back(std::string_view(text).substr(b, e - b));
    b = e;
  }
  for (auto _ : state) {
    for (std::string_view p : paragraphs) {
      auto ids = t->Encode(p, false, false);
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["paragraphs"] = static_cast<double>(paragraphs.size());
}

void BM_Pretokenize(benchmark::State& state, tok::PreType type) {
  auto p = tok::Pretokenizer::Create(type);
  const std::string& text = Text();
  size_t n_words = 0;
  for (auto _ : state) {
    n_words = 0;
    (*p)->Split(text, [&](size_t, size_t) { ++n_words; });
    benchmark::DoNotOptimize(n_words);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["words"] = static_cast<double>(n_words);
}

void BM_Decode(benchmark::State& state, const char* name) {
  const Tokenizer* t = Load(name);
  if (t == nullptr) {
    state.SkipWithError("vocabulary not found (set ESTREAM_SHARED_DIR)");
    return;
  }
  const auto ids = t->Encode(Text(), false, false);
  for (auto _ : state) {
    std::string s = t->Decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * Text().size()));
}

BENCHMARK_CAPTURE(BM_Encode, qwen3, "qwen3")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, gpt2, "gpt-2")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, llama_spm, "llama-spm")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_EncodeParagraphs, qwen3, "qwen3")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_EncodeParagraphs, gpt2, "gpt-2")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_EncodeParagraphs, llama_spm, "llama-spm")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Pretokenize, qwen2_regex, tok::PreType::kQwen2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Pretokenize, gpt2_regex, tok::PreType::kGpt2)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, qwen3, "qwen3")->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace estream

BENCHMARK_MAIN();
