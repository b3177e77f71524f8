#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <iterator>
#include <string>
#include <utility>
#include <vector>

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

// DeepSeek LLM (llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM, the tokenizer.json Sequence):
// newlines; letter runs of the listed scripts with an optional leading space; ASCII / CJK
// punctuation runs with an optional leading space; trailing whitespace; CJK and Hangul runs;
// digit runs.
constexpr const char* kDeepseekLlmRegexes[] = {
    "[\\r\\n]",
    // Letters of the listed scripts, as code points (the source's literal characters include
    // compatibility characters such as U+1FD3 and U+2126 that editors may normalise away).
    "[" ES_WS "]?[A-Za-z"
    "\\x{00b5}\\x{00c0}-\\x{00d6}\\x{00d8}-\\x{00f6}\\x{00f8}-\\x{01ba}\\x{01bc}-\\x{01bf}\\x{01c4}-\\x{0293}"
    "\\x{0295}-\\x{02af}\\x{0370}-\\x{0373}\\x{0376}\\x{0377}\\x{037b}-\\x{037d}\\x{037f}\\x{0386}\\x{0388}-\\x{038a}\\x{038c}"
    "\\x{038e}-\\x{03a1}\\x{03a3}-\\x{03f5}\\x{03f7}-\\x{0481}\\x{048a}-\\x{052f}\\x{0531}-\\x{0556}\\x{10a0}-\\x{10c5}"
    "\\x{13a0}-\\x{13f5}\\x{13f8}-\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}\\x{1d00}-\\x{1d2b}\\x{1d6b}-\\x{1d77}"
    "\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}\\x{1f20}-\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}"
    "\\x{1f5b}\\x{1f5d}\\x{1f5f}-\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}\\x{1fc6}-\\x{1fcc}"
    "\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}\\x{1ff2}-\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}"
    "\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-\\x{211d}\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}"
    "\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}"
    "\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}"
    "\\x{ab70}-\\x{abbf}\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-\\x{ff5a}\\x{10400}-\\x{1044f}"
    "\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}\\x{10c80}-\\x{10cb2}\\x{10cc0}-\\x{10cf2}"
    "\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}"
    "]+",
    "[" ES_WS "]?[!-/:-~\\x{ff01}-\\x{ff0f}\\x{ff1a}-\\x{ff5e}\\x{2018}-\\x{201f}\\x{3000}-\\x{3002}]+",
    "[" ES_WS "]+$",
    "[\\x{4e00}-\\x{9fa5}\\x{0800}-\\x{4e00}\\x{ac00}-\\x{d7ff}]+",
    "\\p{N}+",
};

// llama.cpp's default BPE pre-tokenizer (LLAMA_VOCAB_PRE_TYPE_DEFAULT), what it uses for a gpt2
// vocabulary without tokenizer.ggml.pre: punctuation runs; GPT-2's split without the final
// whitespace alternative; digit runs; then groups of three ASCII digits.
constexpr const char* kDefaultRegexes[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" ES_WS "\\p{L}\\p{N}]+|[" ES_WS "]+(?![^" ES_WS "])",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
};

#undef ES_WS

pcre2_code* Code(void* p) { return static_cast<pcre2_code*>(p); }

}  // namespace

const char* PreTypeRegex(PreType type) { return PreTypeRegexAt(type, 0); }

int PreTypeRegexCount(PreType type) {
  if (type == PreType::kDeepseekLlm) return static_cast<int>(std::size(kDeepseekLlmRegexes));
  if (type == PreType::kDefault) return static_cast<int>(std::size(kDefaultRegexes));
  return 1;
}

const char* PreTypeRegexAt(PreType type, int i) {
  switch (type) {
    case PreType::kGpt2: return kGpt2Regex;
    case PreType::kQwen2: return kQwen2Regex;
    case PreType::kLlama3: return kLlama3Regex;
    case PreType::kDeepseekLlm: return kDeepseekLlmRegexes[i];
    case PreType::kDefault: return kDefaultRegexes[i];
  }
  return kGpt2Regex;
}

Result<std::unique_ptr<Pretokenizer>> Pretokenizer::Create(PreType type) {
  std::unique_ptr<Pretokenizer> p(new Pretokenizer());
  for (int i = 0; i < PreTypeRegexCount(type); ++i) {
    const char* pattern = PreTypeRegexAt(type, i);
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    // DOLLAR_ENDONLY: '$' is the end of the word being split (not also before a final newline).
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | PCRE2_DOLLAR_ENDONLY,
                                     &error_code, &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(error_code, msg, sizeof(msg));
      return Status::Internal("tokenizer: PCRE2 rejected the pre-tokenizer regex at offset " +
                              std::to_string(error_offset) + ": " +
                              reinterpret_cast<const char*>(msg));
    }
    // JIT is an optimisation only: without it (e.g. a PCRE2 built without JIT) matching still works.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    p->codes_.push_back(code);
  }
  return p;
}

Pretokenizer::~Pretokenizer() {
  for (void* c : codes_) pcre2_code_free(Code(c));
}

void Pretokenizer::SplitImpl(std::string_view text, WordFn fn, void* ctx) const {
  if (codes_.size() == 1) return SplitWith(codes_[0], text, fn, ctx);
  // A sequence: split every word of the previous step with the next regex.
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  Ranges words{{0, text.size()}}, next;
  if (text.empty()) return;
  for (void* code : codes_) {
    next.clear();
    for (const auto& [b, e] : words) {
      struct Sink { Ranges* out; size_t base; } sink{&next, b};
      SplitWith(code, text.substr(b, e - b),
                [](void* c, size_t wb, size_t we) {
                  Sink* s = static_cast<Sink*>(c);
                  s->out->push_back({s->base + wb, s->base + we});
                },
                &sink);
    }
    words.swap(next);
  }
  for (const auto& [b, e] : words) fn(ctx, b, e);
}

void Pretokenizer::SplitWith(void* code_, std::string_view text, WordFn fn, void* ctx) {
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
