// Text <-> token ids, from the `tokenizer.*` metadata of a GGUF file.
//
// Supported vocabularies (`tokenizer.ggml.model`):
//   gpt2   byte-level BPE. Text is split into words by the regex of the `tokenizer.ggml.pre`
//          family, each word's bytes are mapped to GPT-2's printable "byte alphabet", and merges
//          (`tokenizer.ggml.merges`, rank = position in the list) are applied lowest rank first,
//          leftmost first on ties. Pre-tokenizer families:
//            qwen2                       Qwen2 / Qwen2.5 / Qwen3
//            gpt-2, olmo                 GPT-2's split (OLMo / OLMoE use the same)
//            llama-bpe, llama3, llama-v3 Llama 3 (digits in runs of 1..3; a word that is
//                                        itself a token is emitted whole: "ignore_merges")
//   llama  SentencePiece-style BPE (Llama / Mistral / Mixtral). Spaces become U+2581 "▁", one
//          "▁" is prepended to each text fragment when `tokenizer.ggml.add_space_prefix` says so
//          (default true), adjacent pieces are merged highest `tokenizer.ggml.scores` first
//          (leftmost on ties) as long as the merged text is a token, and characters that no token
//          covers fall back to byte tokens "<0xXX>" (or `unknown_token_id` if a byte token is
//          missing).
// Unicode: PCRE2 in UTF + UCP mode gives \p{L} / \p{N}; no NFC normalisation is applied (neither
// does llama.cpp; Qwen's tokenizer.json asks for NFC, so decomposed input may tokenize
// differently from Hugging Face).
//
// Special tokens in text (the llama.cpp / Hugging Face rule): user-defined tokens
// (token_type 4, e.g. Qwen3's "<think>") are always recognised as single tokens; control (3) and
// unknown (2) tokens such as "<|im_start|>" or "<s>" only when `parse_special` is true; otherwise
// their text is tokenized like any other text. Where several special tokens could match, the
// leftmost wins, then the longest.
//
// Invalid UTF-8 in Encode input is never an error: each maximal ill-formed subpart is replaced by
// U+FFFD before tokenizing (see tokenizer/utf8.h for the exact rule). IsValidUtf8() lets callers
// warn about it.
//
// Decode restores the exact bytes of normal and byte tokens (no "clean-up" of spaces before
// punctuation): for the gpt2 families Decode(Encode(s)) == s for every well-formed s; for llama
// the prefix space added by Encode is removed again.
//
// Thread safety: a Tokenizer is immutable after construction; every const method may be called
// concurrently from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "gguf/token_type.h"

namespace estream {

class GgufFile;

namespace tok {
class Pretokenizer;
class BpeModel;
class SpmModel;
}  // namespace tok

// The tokenizer metadata, as read from GGUF (or built by hand in tests). Absent optional keys
// take the llama.cpp defaults listed in Tokenizer::FromVocab.
struct TokenizerVocab {
  std::string model;                 // tokenizer.ggml.model: "gpt2" | "llama"
  std::string pre;                   // tokenizer.ggml.pre (gpt2 only; ignored for llama)
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens, n_vocab entries
  std::vector<float> scores;         // tokenizer.ggml.scores (llama: required; gpt2: unused)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (absent: all normal)
  std::vector<std::string> merges;   // tokenizer.ggml.merges "left right" (gpt2: required)
  std::optional<int32_t> bos_id, eos_id, unk_id, pad_id;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

class Tokenizer {
 public:
  // Reads the `tokenizer.*` keys of `file`. Errors name the file and key:
  //   NotSupported  no tokenizer keys (a model without vocabulary: pass token ids instead), an
  //                 unknown tokenizer.ggml.model or .pre (the message lists the supported ones);
  //   Corruption    keys present with the wrong type or inconsistent lengths, ids out of range.
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);

  // Builds a tokenizer from metadata. `source` names it in error messages. Defaults when absent:
  //   llama: bos 1, eos 2, unk 0, add_bos true, add_eos false, add_space_prefix true;
  //   gpt2:  no bos/eos/unk, add_bos true only for llama-bpe, add_eos false, no space prefix.
  static Result<std::unique_ptr<Tokenizer>> FromVocab(TokenizerVocab vocab,
                                                      std::string source = "<vocab>");

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. add_special: prepend BOS if the metadata asks for it (add_bos) and
  // append EOS if add_eos; false adds neither. parse_special: see "Special tokens" above.
  // Never fails (invalid UTF-8 is replaced, see above). O(n log n) in the longest word.
  std::vector<int32_t> Encode(std::string_view text, bool add_special, bool parse_special) const;

  // Text of `ids`. Control and unknown tokens render as their text when render_special is
  // true and as nothing otherwise (unknown: U+FFFD); user-defined tokens always render as their
  // text; ids outside [0, n_vocab) render as U+FFFD. The result may contain ill-formed UTF-8
  // when `ids` cut a multi-byte character.
  std::string Decode(std::span<const int32_t> ids, bool render_special = false) const;

  // The bytes one token stands for (byte tokens -> that byte, "▁"/byte-level -> real bytes,
  // special tokens -> their text). Empty for ids outside [0, n_vocab).
  std::string TokenPiece(int32_t id) const;
  // The token's string exactly as stored in the vocabulary. REQUIRES: IsValidId(id).
  const std::string& TokenText(int32_t id) const { return tokens_[static_cast<size_t>(id)]; }
  TokenType token_type(int32_t id) const;
  // The id of a vocabulary string (exact match), or -1.
  int32_t FindToken(std::string_view text) const;

  bool IsValidId(int32_t id) const { return id >= 0 && id < n_vocab(); }
  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }  // -1 when the vocabulary has none
  int32_t eos_id() const { return eos_id_; }  // -1 when none
  int32_t unk_id() const { return unk_id_; }  // -1 when none
  int32_t pad_id() const { return pad_id_; }  // -1 when none
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  const std::string& model() const { return model_; }
  const std::string& pre() const { return pre_; }  // "" for llama

  // Convenience re-export of tok::IsValidUtf8 for callers that want to warn about bad input.
  static bool IsValidUtf8(std::string_view text, size_t* bad_offset = nullptr);

 private:
  Tokenizer();
  struct Special {
    std::string_view text;
    int32_t id;
    bool always;  // user-defined: recognised even when parse_special is false
  };
  // Splits `text` at special tokens; calls on_text(begin, end) for plain text and on_token(id).
  template <typename TextFn, typename TokenFn>
  void Partition(std::string_view text, bool parse_special, TextFn&& on_text,
                 TokenFn&& on_token) const;
  struct EncodeState;  // per-call scratch and word memo (tokenizer.cc)
  void EncodeFragment(std::string_view text, bool prefix_space, EncodeState* state,
                      std::vector<int32_t>* out) const;

  bool is_bpe_ = true;
  std::string model_, pre_;
  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string_view, int32_t> index_;  // views into tokens_
  std::vector<Special> specials_;  // sorted by first byte, then length descending
  bool special_first_byte_[256] = {};
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1, pad_id_ = -1;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
  std::unique_ptr<tok::Pretokenizer> pretokenizer_;  // gpt2 only
  std::unique_ptr<tok::BpeModel> bpe_;               // gpt2 only
  std::unique_ptr<tok::SpmModel> spm_;               // llama only
};

}  // namespace estream
