// Regex pre-tokenizer: splits text into "words" before byte-level BPE runs on each word.
//
// Each supported `tokenizer.ggml.pre` family has one split regex (the one its Hugging Face
// tokenizer.json uses). It is compiled once with PCRE2 in UTF + UCP mode (JIT when available), so
// \p{L} and \p{N} follow the Unicode tables of the installed PCRE2. `\s` is spelled out as the
// Unicode White_Space property ([\t\n\x0B\f\r\x{85}\p{Z}]), the definition Hugging Face's
// regex engine uses; PCRE2's own \s differs for U+180E.
//
// Splitting semantics match the Hugging Face `Split(behavior="Isolated")` pre-tokenizer: every
// match is a word, and any text between two matches (which a pattern without a catch-all
// alternative may leave) is a word of its own, so the words always concatenate to the input.
//
// Thread safety: a Pretokenizer is immutable after Create; Split may run concurrently (each call
// allocates its own PCRE2 match data).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace estream::tok {

enum class PreType {
  kGpt2,      // "gpt-2", "olmo" (GPT-2's split; OLMo reuses it)
  kQwen2,     // "qwen2" (Qwen2, Qwen2.5, Qwen3): single digits, (?i:) contractions
  kLlama3,    // "llama-bpe", "llama3", "llama-v3", "lfm2": digits in runs of 1..3
  kDeepseekLlm,  // "deepseek-llm" (DeepSeek LLM, DeepSeek-V2): a SEQUENCE of six splits (below)
  kDefault,   // no tokenizer.ggml.pre (older converters): llama.cpp's default sequence of four
};

// Families whose Hugging Face pre-tokenizer is a Sequence of Split(Isolated) steps apply their
// regexes one after another: the first splits the text, each next one splits every word of the
// previous step (its anchors, e.g. '$', see one word). Single-regex families are the case n = 1.
int PreTypeRegexCount(PreType type);
const char* PreTypeRegexAt(PreType type, int i);

// The (first) regex (PCRE2 syntax) used for a family; exposed for tests and documentation.
const char* PreTypeRegex(PreType type);

class Pretokenizer {
 public:
  // Compiles the family's regex. Internal error only if PCRE2 rejects it (a bug, or a PCRE2 built
  // without Unicode support).
  static Result<std::unique_ptr<Pretokenizer>> Create(PreType type);
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // Calls on_word(begin, end) (byte offsets into `text`, begin < end) for each word in order.
  // REQUIRES: `text` is well-formed UTF-8 (the tokenizer replaces bad sequences first; PCRE2 runs
  // with PCRE2_NO_UTF_CHECK).
  template <typename F>
  void Split(std::string_view text, F&& on_word) const {
    SplitImpl(text, &CallThunk<F>, &on_word);
  }

 private:
  using WordFn = void (*)(void* ctx, size_t begin, size_t end);
  template <typename F>
  static void CallThunk(void* ctx, size_t begin, size_t end) {
    (*static_cast<F*>(ctx))(begin, end);
  }
  void SplitImpl(std::string_view text, WordFn fn, void* ctx) const;
  static void SplitWith(void* code, std::string_view text, WordFn fn, void* ctx);

  Pretokenizer() = default;
  std::vector<void*> codes_;  // pcre2_code_8*, owned, applied in order
};

}  // namespace estream::tok
