// The public tokenizer (include/estream/tokenizer.h): a thin owner of the internal Tokenizer.
#include "estream/tokenizer.h"

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace estream {

TextTokenizer::TextTokenizer(std::unique_ptr<Tokenizer> impl) : impl_(std::move(impl)) {}
TextTokenizer::~TextTokenizer() = default;

Result<std::unique_ptr<TextTokenizer>> TextTokenizer::Load(const std::string& path) {
  // Header only (no mmap): the vocabulary is in the metadata, the weights are not touched.
  ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(path, {.mmap = false}));
  ESTREAM_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromGguf(*gguf));
  return std::unique_ptr<TextTokenizer>(new TextTokenizer(std::move(tok)));
}

std::vector<int32_t> TextTokenizer::Encode(std::string_view text, bool add_special, bool parse_special) const {
  return impl_->Encode(text, add_special, parse_special);
}

std::string TextTokenizer::Decode(std::span<const int32_t> ids, bool render_special) const {
  return impl_->Decode(ids, render_special);
}

int32_t TextTokenizer::n_vocab() const { return impl_->n_vocab(); }
int32_t TextTokenizer::bos_id() const { return impl_->bos_id(); }
int32_t TextTokenizer::eos_id() const { return impl_->eos_id(); }

}  // namespace estream
