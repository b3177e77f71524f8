#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

namespace estream::tok {
namespace {

// Unicode White_Space, written out (see the header for why not PCRE2's \s).
#define ES_WS "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}"

// GPT-2 (tiktoken r50k): contractions, letters, digits, other symbols, each with an optional
// leading space; trailing whitespace not followed by a non-space; then any whitespace.
constexpr const char kGpt2Regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d"
    "| ?\\p{L}+| ?\\p{N}+| ?[^" ES_WS "\\p{L}\\p{N}]+"
    "|[" ES_WS "]+(?![^" ES_WS "])|[" ES_WS "]+";

// Qwen2 tokenizer.json: case-insensitive contractions, a letter run with one optional leading
// non-letter/non-digit/non-newline, single digits, symbol runs (optional leading space) that
// absorb following newlines, newline runs with their leading whitespace, then whitespace.
constexpr const char kQwen2Regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" ES_WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" ES_WS "]*[\\r\\n]+|[" ES_WS "]+(?![^" ES_WS "])|[" ES_WS "]+";

// Llama 3 tokenizer.json: like Qwen2 but digits in runs of one to three.
constexpr const char kLlama3Regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" ES_WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" ES_WS "]*[\\r\\n]+|[" ES_WS "]+(?![^" ES_WS "])|[" ES_WS "]+";

#undef ES_WS

pcre2_code* Code(void* p) { return static_cast<pcre2_code*>(p); }

}  // namespace

const char* PreTypeRegex(PreType type) {
  switch (type) {
    case PreType::kGpt2: return kGpt2Regex;
    case PreType::kQwen2: return kQwen2Regex;
    case PreType::kLlama3: return kLlama3Regex;
  }
  return kGpt2Regex;
}

Result<std::unique_ptr<Pretokenizer>> Pretokenizer::Create(PreType type) {
  const char* pattern = PreTypeRegex(type);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error_code, msg, sizeof(msg));
    return Status::Internal("tokenizer: PCRE2 rejected the pre-tokenizer regex at offset " +
                            std::to_string(error_offset) + ": " +
                            reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation only: without it (e.g. a PCRE2 built without JIT) matching still works.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  std::unique_ptr<Pretokenizer> p(new Pretokenizer());
  p->code_ = code;
  return p;
}

Pretokenizer::~Pretokenizer() { pcre2_code_free(Code(code_)); }

void Pretokenizer::SplitImpl(std::string_view text, WordFn fn, void* ctx) const {
  if (text.empty()) return;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(Code(code_), nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;   // where the next search starts
  size_t emitted = 0;  // end of the last word handed out
  while (pos < n) {
    int rc = pcre2_match(Code(code_), subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // A resource limit (JIT stack, heap, match limit) on pathological input: retry with the
      // interpreter; if that fails too, split off one character and go on. Never seen with the
      // built-in patterns (1 MiB runs of one character split fine), but never lump text silently.
      rc = pcre2_match(Code(code_), subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        size_t step = 1;
        while (pos + step < n && (static_cast<uint8_t>(text[pos + step]) & 0xC0) == 0x80) ++step;
        if (pos > emitted) fn(ctx, emitted, pos);
        fn(ctx, pos, pos + step);
        pos += step;
        emitted = pos;
        continue;
      }
    }
    if (rc < 0) break;  // no further match: the rest is one gap word
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t begin = ov[0], end = ov[1];
    if (begin > emitted) fn(ctx, emitted, begin);  // unmatched gap
    if (end == begin) {
      // Cannot happen with the built-in patterns (every alternative consumes a character), but
      // never loop forever: step over one character and let it join the next gap.
      size_t step = 1;
      while (begin + step < n && (static_cast<uint8_t>(text[begin + step]) & 0xC0) == 0x80) ++step;
      pos = begin + step;
      emitted = begin;
      continue;
    }
    fn(ctx, begin, end);
    emitted = end;
    pos = end;
  }
  if (emitted < n) fn(ctx, emitted, n);
  pcre2_match_data_free(md);
}

}  // namespace estream::tok
