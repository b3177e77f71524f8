// estream's public tokenizer: the vocabulary of a GGUF model, text <-> token ids, exactly as the
// `estream` commands tokenize (`estream tokenize`, the "prompt" fields of `estream score`).
//
//   auto tok = estream::TextTokenizer::Load("model.gguf");
//   if (!tok.ok()) { ... tok.status().message() ... }   // e.g. a model without a vocabulary
//   std::vector<int32_t> ids = (*tok)->Encode("The capital of France is");
//   std::string text = (*tok)->Decode(ids);
//
// Vocabularies: gpt2-type byte-level BPE and SentencePiece `llama` vocabularies (the supported
// pre-tokenizers are listed in README.md). Encode never fails: invalid UTF-8 is replaced by
// U+FFFD first. Decode restores the exact bytes of the tokens (it may return ill-formed UTF-8
// when `ids` cut a multi-byte character).
//
// Thread safety: immutable after Load; every method may be called from any number of threads.
// This header wraps the library's internal tokenizer (src/tokenizer) so that front ends (the C
// API, the Python module) depend on include/estream/ only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "estream/status.h"

namespace estream {

class Tokenizer;  // src/tokenizer/tokenizer.h

class TextTokenizer {
 public:
  // Reads the `tokenizer.*` keys of the GGUF file at `path` (packed files keep them). Errors:
  // IOError (cannot open), Corruption (malformed file or tokenizer keys), NotSupported (no
  // vocabulary in the file, or an unknown tokenizer model / pre-tokenizer; the message lists the
  // supported ones).
  static Result<std::unique_ptr<TextTokenizer>> Load(const std::string& path);

  ~TextTokenizer();
  TextTokenizer(const TextTokenizer&) = delete;
  TextTokenizer& operator=(const TextTokenizer&) = delete;

  // Token ids of `text`. add_special: the BOS/EOS tokens the vocabulary asks for (what the CLI
  // does for prompts); false for text appended to a prompt (continuations, labels).
  // parse_special: recognise control tokens such as "<|im_start|>" written in the text.
  std::vector<int32_t> Encode(std::string_view text, bool add_special = true, bool parse_special = false) const;
  // Text of `ids`; control tokens render as their text only with render_special; ids outside
  // [0, n_vocab) render as U+FFFD.
  std::string Decode(std::span<const int32_t> ids, bool render_special = false) const;

  int32_t n_vocab() const;
  int32_t bos_id() const;  // -1 when the vocabulary has none
  int32_t eos_id() const;  // -1 when none

 private:
  explicit TextTokenizer(std::unique_ptr<Tokenizer> impl);
  std::unique_ptr<Tokenizer> impl_;
};

}  // namespace estream
