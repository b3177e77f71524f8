#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "gguf/gguf.h"
#include "tokenizer/models.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace estream {
namespace {

constexpr const char kSupportedModels[] = "gpt2 (byte-level BPE), llama (SentencePiece BPE)";
constexpr const char kSupportedPre[] =
    "qwen2, gpt-2, olmo, llama-bpe (llama3, llama-v3, lfm2), deepseek-llm, default (also when absent)";
constexpr const char kSpaceMark[] = "\xE2\x96\x81";  // U+2581, SentencePiece's space
constexpr const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

bool IsIntegerType(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kU16: case GgufType::kI16:
    case GgufType::kU32: case GgufType::kI32: case GgufType::kU64: case GgufType::kI64:
      return true;
    default:
      return false;
  }
}
bool IsSigned(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}

// Reads the tokenizer keys of a GGUF file; every type error names the file and the key.
class VocabReader {
 public:
  explicit VocabReader(const GgufFile& f) : f_(f) {}

  Status Bad(std::string_view key, const std::string& what) const {
    return Status::Corruption(f_.path() + ": " + std::string(key) + " " + what +
                              "; the file is damaged or was written by a broken converter");
  }
  Result<std::optional<std::string>> String(std::string_view key) const {
    const GgufValue* v = f_.Find(key);
    if (v == nullptr) return std::optional<std::string>();
    if (v->type != GgufType::kString) return Bad(key, std::string("is ") + GgufTypeName(v->type) + ", expected string");
    return std::optional<std::string>(v->str);
  }
  Result<std::optional<bool>> Bool(std::string_view key) const {
    const GgufValue* v = f_.Find(key);
    if (v == nullptr) return std::optional<bool>();
    if (v->type == GgufType::kBool) return std::optional<bool>(v->u != 0);
    if (IsIntegerType(v->type)) return std::optional<bool>(IsSigned(v->type) ? v->i != 0 : v->u != 0);
    return Bad(key, std::string("is ") + GgufTypeName(v->type) + ", expected bool");
  }
  Result<std::optional<int32_t>> Id(std::string_view key) const {
    const GgufValue* v = f_.Find(key);
    if (v == nullptr) return std::optional<int32_t>();
    if (!IsIntegerType(v->type)) return Bad(key, std::string("is ") + GgufTypeName(v->type) + ", expected an integer token id");
    const int64_t id = IsSigned(v->type) ? v->i : static_cast<int64_t>(std::min<uint64_t>(v->u, INT64_MAX));
    if (id < 0 || id > INT32_MAX) return Bad(key, "= " + std::to_string(id) + " is not a token id");
    return std::optional<int32_t>(static_cast<int32_t>(id));
  }
  const GgufValue* Array(std::string_view key, Status* st) const {
    const GgufValue* v = f_.Find(key);
    if (v != nullptr && v->type != GgufType::kArray)
      *st = Bad(key, std::string("is ") + GgufTypeName(v->type) + ", expected an array");
    return v;
  }
  Status Strings(std::string_view key, std::vector<std::string>* out) const {
    Status st;
    const GgufValue* v = Array(key, &st);
    if (!st.ok() || v == nullptr) return st;
    if (v->elem_type != GgufType::kString) return Bad(key, std::string("holds ") + GgufTypeName(v->elem_type) + ", expected strings");
    out->reserve(v->array.size());
    for (const GgufValue& e : v->array) out->push_back(e.str);
    return Status::Ok();
  }
  Status Floats(std::string_view key, std::vector<float>* out) const {
    Status st;
    const GgufValue* v = Array(key, &st);
    if (!st.ok() || v == nullptr) return st;
    if (v->elem_type != GgufType::kF32 && v->elem_type != GgufType::kF64)
      return Bad(key, std::string("holds ") + GgufTypeName(v->elem_type) + ", expected f32");
    out->reserve(v->array.size());
    for (const GgufValue& e : v->array) out->push_back(static_cast<float>(e.f));
    return Status::Ok();
  }
  Status Ints(std::string_view key, std::vector<int32_t>* out) const {
    Status st;
    const GgufValue* v = Array(key, &st);
    if (!st.ok() || v == nullptr) return st;
    if (!IsIntegerType(v->elem_type)) return Bad(key, std::string("holds ") + GgufTypeName(v->elem_type) + ", expected integers");
    const bool s = IsSigned(v->elem_type);
    out->reserve(v->array.size());
    for (const GgufValue& e : v->array) out->push_back(static_cast<int32_t>(s ? e.i : static_cast<int64_t>(e.u)));
    return Status::Ok();
  }

 private:
  const GgufFile& f_;
};

}  // namespace

struct Tokenizer::EncodeState {
  explicit EncodeState(size_t text_bytes) : cache(text_bytes) {}
  tok::MergeScratch scratch;
  tok::WordCache cache;  // BPE words; keys view the Encode input
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

bool Tokenizer::IsValidUtf8(std::string_view text, size_t* bad_offset) {
  return tok::IsValidUtf8(text, bad_offset);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  VocabReader r(file);
  TokenizerVocab v;
  ESTREAM_ASSIGN_OR_RETURN(std::optional<std::string> model, r.String("tokenizer.ggml.model"));
  if (!model.has_value())
    return Status::NotSupported(file.path() + ": no tokenizer in this model (tokenizer.ggml.model is "
                                "missing); give token ids instead of text, or use a GGUF with a vocabulary");
  v.model = *model;
  ESTREAM_ASSIGN_OR_RETURN(std::optional<std::string> pre, r.String("tokenizer.ggml.pre"));
  v.pre = pre.value_or("");
  ESTREAM_RETURN_IF_ERROR(r.Strings("tokenizer.ggml.tokens", &v.tokens));
  ESTREAM_RETURN_IF_ERROR(r.Floats("tokenizer.ggml.scores", &v.scores));
  ESTREAM_RETURN_IF_ERROR(r.Ints("tokenizer.ggml.token_type", &v.token_types));
  ESTREAM_RETURN_IF_ERROR(r.Strings("tokenizer.ggml.merges", &v.merges));
  ESTREAM_ASSIGN_OR_RETURN(v.bos_id, r.Id("tokenizer.ggml.bos_token_id"));
  ESTREAM_ASSIGN_OR_RETURN(v.eos_id, r.Id("tokenizer.ggml.eos_token_id"));
  ESTREAM_ASSIGN_OR_RETURN(v.unk_id, r.Id("tokenizer.ggml.unknown_token_id"));
  ESTREAM_ASSIGN_OR_RETURN(v.pad_id, r.Id("tokenizer.ggml.padding_token_id"));
  ESTREAM_ASSIGN_OR_RETURN(v.add_bos, r.Bool("tokenizer.ggml.add_bos_token"));
  ESTREAM_ASSIGN_OR_RETURN(v.add_eos, r.Bool("tokenizer.ggml.add_eos_token"));
  ESTREAM_ASSIGN_OR_RETURN(v.add_space_prefix, r.Bool("tokenizer.ggml.add_space_prefix"));
  return FromVocab(std::move(v), file.path());
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(TokenizerVocab v, std::string source) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const bool bpe = v.model == "gpt2";
  const bool spm = v.model == "llama";
  if (!bpe && !spm)
    return Status::NotSupported(source + ": tokenizer.ggml.model '" + v.model +
                                "' is not supported; supported: " + kSupportedModels);
  tok::PreType pre_type = tok::PreType::kGpt2;
  bool ignore_merges = false;
  bool default_add_bos = spm;
  if (bpe) {
    if (v.pre == "qwen2") {
      pre_type = tok::PreType::kQwen2;
    } else if (v.pre == "gpt-2" || v.pre == "olmo") {
      pre_type = tok::PreType::kGpt2;
    } else if (v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "llama-v3" || v.pre == "lfm2") {
      // LFM2's tokenizer.json splits with Llama 3's regex (llama.cpp maps "lfm2" to the same
      // pre-tokenizer, merges ignored for whole-word vocabulary hits, BOS added by default).
      pre_type = tok::PreType::kLlama3;
      ignore_merges = true;
      default_add_bos = true;
    } else if (v.pre == "deepseek-llm") {
      pre_type = tok::PreType::kDeepseekLlm;
    } else if (v.pre.empty() || v.pre == "default") {
      // Older converters wrote no tokenizer.ggml.pre: llama.cpp then warns and uses its default
      // pre-tokenizer; so does estream (the warning once, on stderr).
      pre_type = tok::PreType::kDefault;
      if (v.pre.empty())
        std::fprintf(stderr, "warning: %s: tokenizer.ggml.pre is missing; using the default pre-tokenizer (as "
                     "llama.cpp does); tokens may differ from the model's own tokenizer\n", source.c_str());
    } else {
      return Status::NotSupported(source + ": tokenizer.ggml.pre '" + v.pre +
                                  (v.pre.empty() ? "' (missing)" : "'") +
                                  " is not supported for gpt2 vocabularies; supported: " + kSupportedPre);
    }
  }
  const size_t n = v.tokens.size();
  if (n == 0) return Status::Corruption(source + ": tokenizer.ggml.tokens is missing or empty");
  if (n > static_cast<size_t>(INT32_MAX)) return Status::Corruption(source + ": tokenizer.ggml.tokens has too many entries");
  if (!v.token_types.empty() && v.token_types.size() != n)
    return Status::Corruption(source + ": tokenizer.ggml.token_type has " + std::to_string(v.token_types.size()) +
                              " entries for " + std::to_string(n) + " tokens");
  if (spm && v.scores.size() != n)
    return Status::Corruption(source + ": tokenizer.ggml.scores has " + std::to_string(v.scores.size()) +
                              " entries for " + std::to_string(n) + " tokens (llama vocabularies need one score per token)");
  if (bpe && v.merges.empty())
    return Status::Corruption(source + ": tokenizer.ggml.merges is missing (gpt2 vocabularies need it)");

  t->is_bpe_ = bpe;
  t->model_ = v.model;
  t->pre_ = bpe ? v.pre : "";
  t->tokens_ = std::move(v.tokens);
  t->types_.resize(n, TokenType::kNormal);
  for (size_t i = 0; i < v.token_types.size(); ++i) {
    const int32_t ty = v.token_types[i];
    t->types_[i] = ty >= 0 && ty <= 6 ? static_cast<TokenType>(ty) : TokenType::kUndefined;
  }
  t->index_.reserve(n);
  for (size_t i = 0; i < n; ++i) t->index_[t->tokens_[i]] = static_cast<int32_t>(i);  // last wins

  auto check_id = [&](const char* key, std::optional<int32_t> id, int32_t fallback,
                      int32_t* out) -> Status {
    *out = id.value_or(fallback);
    if (*out >= static_cast<int32_t>(n))
      return Status::Corruption(source + ": tokenizer.ggml." + key + " = " + std::to_string(*out) +
                                " is outside the vocabulary of " + std::to_string(n) + " tokens");
    return Status::Ok();
  };
  ESTREAM_RETURN_IF_ERROR(check_id("bos_token_id", v.bos_id, spm ? 1 : -1, &t->bos_id_));
  ESTREAM_RETURN_IF_ERROR(check_id("eos_token_id", v.eos_id, spm ? 2 : -1, &t->eos_id_));
  ESTREAM_RETURN_IF_ERROR(check_id("unknown_token_id", v.unk_id, spm ? 0 : -1, &t->unk_id_));
  ESTREAM_RETURN_IF_ERROR(check_id("padding_token_id", v.pad_id, -1, &t->pad_id_));
  t->add_bos_ = v.add_bos.value_or(default_add_bos);
  t->add_eos_ = v.add_eos.value_or(false);
  t->add_space_prefix_ = v.add_space_prefix.value_or(spm);
  if (t->add_bos_ && t->bos_id_ < 0)
    return Status::Corruption(source + ": tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing");
  if (t->add_eos_ && t->eos_id_ < 0)
    return Status::Corruption(source + ": tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is missing");

  // Special tokens matched in text: control and unknown (with parse_special), user-defined
  // (always). Sorted by first byte, longest first, for the scan in Partition.
  for (size_t i = 0; i < n; ++i) {
    const TokenType ty = t->types_[i];
    if (t->tokens_[i].empty()) continue;
    if (ty == TokenType::kControl || ty == TokenType::kUnknown || ty == TokenType::kUserDefined) {
      t->specials_.push_back({t->tokens_[i], static_cast<int32_t>(i), ty == TokenType::kUserDefined});
      t->special_first_byte_[static_cast<uint8_t>(t->tokens_[i][0])] = true;
    }
  }
  std::sort(t->specials_.begin(), t->specials_.end(), [](const Special& a, const Special& b) {
    if (a.text[0] != b.text[0]) return static_cast<uint8_t>(a.text[0]) < static_cast<uint8_t>(b.text[0]);
    if (a.text.size() != b.text.size()) return a.text.size() > b.text.size();
    return a.id < b.id;
  });

  if (bpe) {
    ESTREAM_ASSIGN_OR_RETURN(t->pretokenizer_, tok::Pretokenizer::Create(pre_type));
    ESTREAM_ASSIGN_OR_RETURN(t->bpe_, tok::BpeModel::Create(t->tokens_, t->index_, v.merges,
                                                            ignore_merges, source));
  } else {
    t->spm_ = tok::SpmModel::Create(t->tokens_, v.scores, t->index_, t->unk_id_);
  }
  return t;
}

TokenType Tokenizer::token_type(int32_t id) const {
  return IsValidId(id) ? types_[static_cast<size_t>(id)] : TokenType::kUndefined;
}

int32_t Tokenizer::FindToken(std::string_view text) const {
  auto it = index_.find(text);
  return it == index_.end() ? -1 : it->second;
}

template <typename TextFn, typename TokenFn>
void Tokenizer::Partition(std::string_view text, bool parse_special, TextFn&& on_text,
                          TokenFn&& on_token) const {
  size_t plain_begin = 0;
  size_t pos = 0;
  const size_t n = text.size();
  if (!specials_.empty()) {
    while (pos < n) {
      const uint8_t b = static_cast<uint8_t>(text[pos]);
      if (!special_first_byte_[b]) {
        ++pos;
        continue;
      }
      // Candidates with this first byte are contiguous and longest first.
      auto it = std::lower_bound(specials_.begin(), specials_.end(), b,
                                 [](const Special& s, uint8_t v) { return static_cast<uint8_t>(s.text[0]) < v; });
      const Special* hit = nullptr;
      for (; it != specials_.end() && static_cast<uint8_t>(it->text[0]) == b; ++it) {
        if (!it->always && !parse_special) continue;
        if (it->text.size() <= n - pos && std::memcmp(text.data() + pos, it->text.data(), it->text.size()) == 0) {
          hit = &*it;
          break;
        }
      }
      if (hit == nullptr) {
        ++pos;
        continue;
      }
      if (pos > plain_begin) on_text(plain_begin, pos);
      on_token(hit->id);
      pos += hit->text.size();
      plain_begin = pos;
    }
  }
  if (n > plain_begin) on_text(plain_begin, n);
}

void Tokenizer::EncodeFragment(std::string_view text, bool prefix_space, EncodeState* state,
                               std::vector<int32_t>* out) const {
  tok::MergeScratch& scratch = state->scratch;
  if (is_bpe_) {
    auto encode = [&](std::string_view word, std::vector<int32_t>* o) { bpe_->EncodeWord(word, &scratch, o); };
    pretokenizer_->Split(text, [&](size_t begin, size_t end) {
      state->cache.Encode(text.substr(begin, end - begin), out, encode);
    });
    return;
  }
  // SentencePiece: optional prefix space, then every ' ' becomes U+2581.
  std::string escaped;
  escaped.reserve(text.size() + text.size() / 4 + 3);
  if (prefix_space) escaped += kSpaceMark;
  for (char ch : text) {
    if (ch == ' ') escaped += kSpaceMark;
    else escaped.push_back(ch);
  }
  // The memo's keys view `escaped`, which dies here.
  tok::WordCache cache(escaped.size());
  spm_->EncodeText(escaped, &scratch, &cache, out);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::string repaired;
  if (!tok::IsValidUtf8(text)) {
    repaired = tok::ReplaceInvalidUtf8(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && add_bos_) out.push_back(bos_id_);
  // SentencePiece adds the prefix space to the first text fragment and to each one that follows a
  // special token (llama.cpp's rule).
  bool after_special = true;
  EncodeState state(is_bpe_ ? text.size() : 0);
  Partition(
      text, parse_special,
      [&](size_t begin, size_t end) {
        EncodeFragment(text.substr(begin, end - begin), add_space_prefix_ && after_special, &state, &out);
        after_special = false;
      },
      [&](int32_t id) {
        out.push_back(id);
        after_special = true;
      });
  if (add_special && add_eos_) out.push_back(eos_id_);
  return out;
}

std::string Tokenizer::TokenPiece(int32_t id) const {
  std::string out;
  if (!IsValidId(id)) return out;
  const std::string& text = tokens_[static_cast<size_t>(id)];
  switch (types_[static_cast<size_t>(id)]) {
    case TokenType::kNormal:
    case TokenType::kUndefined:
    case TokenType::kUnused:
      if (is_bpe_) {
        tok::AppendByteLevelDecoded(text, &out);
      } else {
        out.reserve(text.size());
        for (size_t i = 0; i < text.size();) {
          if (text.compare(i, 3, kSpaceMark) == 0) {
            out.push_back(' ');
            i += 3;
          } else {
            out.push_back(text[i++]);
          }
        }
      }
      return out;
    case TokenType::kByte: {
      unsigned v = 0;
      if (text.size() == 6 && std::sscanf(text.c_str(), "<0x%2X>", &v) == 1) out.push_back(static_cast<char>(v));
      else if (is_bpe_) tok::AppendByteLevelDecoded(text, &out);
      else out = text;
      return out;
    }
    case TokenType::kControl:
    case TokenType::kUnknown:
    case TokenType::kUserDefined:
      return text;
  }
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  out.reserve(ids.size() * 4);
  bool strip_space = add_space_prefix_;  // SentencePiece: undo the prefix space of a fragment
  for (int32_t id : ids) {
    if (!IsValidId(id)) {
      out += kReplacement;
      strip_space = false;
      continue;
    }
    const TokenType ty = types_[static_cast<size_t>(id)];
    if (ty == TokenType::kControl || ty == TokenType::kUnknown || ty == TokenType::kUserDefined) {
      if (ty == TokenType::kUserDefined || render_special) out += tokens_[static_cast<size_t>(id)];
      else if (ty == TokenType::kUnknown) out += kReplacement;
      strip_space = add_space_prefix_;
      continue;
    }
    std::string piece = TokenPiece(id);
    if (strip_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    strip_space = false;
    out += piece;
  }
  return out;
}

}  // namespace estream
