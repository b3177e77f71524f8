#include "tokenizer/utf8.h"

#include <cstring>

namespace estream::tok {
namespace {

// Walks the sequence at text[pos] following Table 3-7 of the Unicode standard (well-formed UTF-8
// byte sequences). Returns the total length when well-formed; otherwise returns 0 and stores in
// *subpart the length of the maximal subpart (>= 1) that one U+FFFD replaces.
size_t Walk(std::string_view text, size_t pos, size_t* subpart) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t avail = text.size() - pos;
  const uint8_t b0 = s[pos];
  if (b0 < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;        // no overlongs
    else if (b0 == 0xED) hi = 0x9F;   // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;        // no overlongs
    else if (b0 == 0xF4) hi = 0x8F;   // nothing above U+10FFFF
  } else {
    *subpart = 1;  // C0, C1, F5..FF or a stray continuation byte
    return 0;
  }
  size_t i = 1;
  for (; i < need && i < avail; ++i) {
    const uint8_t b = s[pos + i];
    const uint8_t l = i == 1 ? lo : 0x80;
    const uint8_t h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  if (i == need) return need;
  *subpart = i;
  return 0;
}

}  // namespace

size_t ValidSequenceLength(std::string_view text, size_t pos) {
  size_t subpart = 0;
  return Walk(text, pos, &subpart);
}

bool IsValidUtf8(std::string_view text, size_t* bad_offset) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  while (pos < n) {
    // Fast path: 8 ASCII bytes at a time.
    if (pos + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + pos, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        pos += 8;
        continue;
      }
    }
    if (s[pos] < 0x80) {
      ++pos;
      continue;
    }
    size_t subpart = 0;
    const size_t len = Walk(text, pos, &subpart);
    if (len == 0) {
      if (bad_offset) *bad_offset = pos;
      return false;
    }
    pos += len;
  }
  return true;
}

std::string ReplaceInvalidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t subpart = 0;
    const size_t len = Walk(text, pos, &subpart);
    if (len > 0) {
      out.append(text.data() + pos, len);
      pos += len;
    } else {
      out.append("\xEF\xBF\xBD");
      pos += subpart;
    }
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t DecodeAt(std::string_view text, size_t pos, size_t n) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data()) + pos;
  switch (n) {
    case 1: return s[0];
    case 2: return ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    case 3: return ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    default:
      return ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
  }
}

}  // namespace estream::tok
