// Internal to src/tokenizer: the two merge engines behind Tokenizer.
//
// BpeModel  byte-level BPE over one pre-tokenized word at a time. Each input byte starts as one
//           symbol (the token of its GPT-2 byte-alphabet character); the pair table maps
//           (left symbol, right symbol) -> (rank, merged symbol) so merging never builds strings.
//           Symbols are vocabulary ids; strings that appear in merges but not in the vocabulary
//           get ids >= n_vocab ("synthetic") and fall back to single-byte tokens at the end, as
//           llama.cpp does.
// SpmModel  SentencePiece-style BPE over a whole (already escaped) text fragment: adjacent
//           pieces merge while the concatenation is a token, highest score first.
// Both use a linked list of symbols plus a binary heap of candidate pairs with lazy
// invalidation: O(n log n) per word/fragment, so a 100 KB word costs milliseconds.
//
// Thread safety: immutable after Create; Encode* take caller-owned scratch space.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace estream::tok {

// GPT-2's reversible byte <-> printable-character map: bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF
// map to the same code point; the other 68 bytes map to U+0100.. in byte order.
uint32_t ByteToCodepoint(uint8_t b);
// The byte for a code point of that alphabet, or -1.
int ByteFromCodepoint(uint32_t cp);
// Appends the real bytes of a byte-alphabet string (characters outside the alphabet are copied
// unchanged).
void AppendByteLevelDecoded(std::string_view text, std::string* out);

using TokenIndex = std::unordered_map<std::string_view, int32_t>;

// Reusable per-call working memory (not shared between threads).
struct MergeScratch {
  std::vector<int32_t> sym;    // symbol id per position (BPE) / token id (SPM, unused)
  std::vector<int32_t> start;  // byte offset of the symbol (SPM)
  std::vector<int32_t> len;    // byte length; 0 = merged away
  std::vector<int32_t> prev, next;
  struct Cand {
    float key;      // BPE: rank; SPM: -score (smaller is better in both)
    int32_t left;   // position of the left symbol
    int32_t a, b;   // BPE: the two symbol ids at push time; SPM: unused, merged byte length
    int32_t c;      // BPE: the merged symbol; SPM: unused
  };
  std::vector<Cand> heap;
  std::string mapped;  // BPE ignore_merges lookup
};

// Memo of word -> ids for one Encode call (natural text repeats its words constantly): a
// direct-mapped table sized from the input length, so a short prompt pays almost nothing and a
// long document hits on its frequent words. A value is the range of the output vector where the
// word's ids were first written, so nothing is copied into the memo; the keys view the caller's
// text, which must outlive the memo.
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 48;  // longer words are rare and not worth caching

  explicit WordCache(size_t text_bytes) {
    size_t n = 64;
    while (n < text_bytes / 8 && n < (size_t{1} << 16)) n <<= 1;
    slots_.resize(n);
    mask_ = n - 1;
  }

  // Appends the ids of `word` to *out, from the memo or by calling encode(word, out).
  template <typename F>
  void Encode(std::string_view word, std::vector<int32_t>* out, F&& encode) {
    if (word.size() > kMaxWordBytes) {
      encode(word, out);
      return;
    }
    Slot& slot = slots_[Hash(word) & mask_];
    if (slot.len == word.size() && slot.ptr != nullptr &&
        std::memcmp(slot.ptr, word.data(), word.size()) == 0) {
      const size_t old = out->size();
      out->resize(old + slot.count);
      std::copy(out->begin() + slot.offset, out->begin() + slot.offset + slot.count, out->begin() + old);
      return;
    }
    const size_t offset = out->size();
    encode(word, out);
    const size_t count = out->size() - offset;
    if (offset <= UINT32_MAX && count <= UINT32_MAX)
      slot = {word.data(), static_cast<uint32_t>(word.size()), static_cast<uint32_t>(offset),
              static_cast<uint32_t>(count)};
  }

 private:
  struct Slot {
    const char* ptr = nullptr;
    uint32_t len = 0;
    uint32_t offset = 0;
    uint32_t count = 0;
  };
  static uint64_t Hash(std::string_view w) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ w.size();
    size_t i = 0;
    for (; i + 8 <= w.size(); i += 8) {
      uint64_t v;
      std::memcpy(&v, w.data() + i, 8);
      h = (h ^ v) * 0xFF51AFD7ED558CCDull;
    }
    uint64_t tail = 0;
    std::memcpy(&tail, w.data() + i, w.size() - i);
    h = (h ^ tail) * 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 29);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

class BpeModel {
 public:
  // tokens/index: the vocabulary (index holds views into tokens, which must outlive the model).
  // merges: "left right" strings, rank = position. ignore_merges: emit a word whole when it is a
  // token (Llama 3). Errors: Corruption naming `source` and the merge index for a malformed entry.
  static Result<std::unique_ptr<BpeModel>> Create(const std::vector<std::string>& tokens,
                                                  const TokenIndex& index,
                                                  const std::vector<std::string>& merges,
                                                  bool ignore_merges, const std::string& source);
  ~BpeModel();

  // Appends the ids of one word (raw UTF-8 bytes, non-empty).
  void EncodeWord(std::string_view word, MergeScratch* s, std::vector<int32_t>* out) const;

 private:
  BpeModel() = default;
  struct PairTable;
  int32_t n_vocab_ = 0;
  bool ignore_merges_ = false;
  const TokenIndex* index_ = nullptr;
  int32_t byte_symbol_[256] = {};          // initial symbol of each byte
  std::string byte_string_[256];           // UTF-8 of each byte's alphabet character
  std::vector<std::string> synthetic_;     // text of symbol n_vocab + i
  std::unique_ptr<PairTable> pairs_;
};

class SpmModel {
 public:
  // scores: one per token. Byte tokens "<0xXX>" are looked up once here; a missing one falls back
  // to unk_id (or is dropped when unk_id < 0).
  static std::unique_ptr<SpmModel> Create(const std::vector<std::string>& tokens,
                                          const std::vector<float>& scores,
                                          const TokenIndex& index, int32_t unk_id);

  // Appends the ids of `text`, which is already escaped (spaces as U+2581, prefix added).
  // When no token has a "▁" right after another character (true of Llama/Mistral vocabularies,
  // checked at Create), no merge can cross the start of a "▁" run, so the text is cut there into
  // independent words that are merged separately and memoised in *cache (same result, much
  // faster); otherwise the whole text is merged at once.
  void EncodeText(std::string_view text, MergeScratch* s, WordCache* cache,
                  std::vector<int32_t>* out) const;

 private:
  SpmModel() = default;
  void EncodeWord(std::string_view text, MergeScratch* s, std::vector<int32_t>* out) const;
  bool split_at_space_ = false;
  const TokenIndex* index_ = nullptr;
  std::vector<float> scores_;
  int32_t byte_token_[256] = {};
  size_t max_token_len_ = 0;
};

}  // namespace estream::tok
