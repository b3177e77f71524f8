// UTF-8 helpers for the tokenizers: validation, replacement of invalid sequences, encoding.
//
// Invalid input policy (used by Tokenizer::Encode): every *maximal subpart* of an ill-formed
// sequence becomes one U+FFFD (EF BF BD), the practice Unicode recommends (section 3.9, "U+FFFD
// Substitution of Maximal Subparts") and the one Python's bytes.decode("utf-8", "replace") and
// WHATWG decoders follow. Examples: "\xff" -> 1 x U+FFFD; "\xe2\x82" (truncated 3-byte) -> 1 x
// U+FFFD; "\xed\xa0\x80" (a surrogate) -> 3 x U+FFFD; "\xc0\xaf" (overlong) -> 2 x U+FFFD.
//
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace estream::tok {

// Length in bytes (1..4) of the well-formed UTF-8 sequence starting at text[pos], or 0 if the
// bytes there are not a well-formed sequence (bad lead byte, bad or missing continuation byte,
// overlong form, surrogate, code point above U+10FFFF). REQUIRES: pos < text.size().
size_t ValidSequenceLength(std::string_view text, size_t pos);

// True when `text` is entirely well-formed UTF-8. On false, *bad_offset (if given) receives the
// byte offset of the first ill-formed sequence.
bool IsValidUtf8(std::string_view text, size_t* bad_offset = nullptr);

// Returns `text` with every maximal ill-formed subpart replaced by U+FFFD (see above). Well-formed
// input is returned unchanged.
std::string ReplaceInvalidUtf8(std::string_view text);

// Appends the UTF-8 encoding of code point `cp` (REQUIRES: cp <= 0x10FFFF) to *out.
void AppendUtf8(uint32_t cp, std::string* out);

// Decodes the well-formed sequence at text[pos] (REQUIRES: ValidSequenceLength(text, pos) == n > 0).
uint32_t DecodeAt(std::string_view text, size_t pos, size_t n);

// Length of the UTF-8 sequence announced by a lead byte (1 for ASCII and for stray bytes, which
// the SPM symbol splitter then treats as one-byte symbols).
inline size_t LeadByteLength(uint8_t b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 1;
}

}  // namespace estream::tok
