// The values of the GGUF key `tokenizer.ggml.token_type` (llama.cpp's llama_token_type), one per
// vocabulary entry: read by the tokenizer (src/tokenizer), written by the synthetic vocabularies
// (src/model/bpe_builder.h).
#pragma once

#include <cstdint>

namespace estream {

enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

}  // namespace estream
