// A small byte-level BPE vocabulary builder, so that `estream synth` can put a self-made
// tokenizer into the models it writes (GGUF tokenizer.ggml.model = "gpt2").
//
// Vocabulary layout (ids in this order):
//   [0, 256)             one token per byte value b, spelled with GPT-2's byte-to-unicode
//                        mapping (printable Latin-1 bytes as themselves, the others as U+0100..),
//                        so token id b is byte b
//   then                 one token per learned merge "a b" -> "ab" (merges learned greedily, most
//                        frequent adjacent pair first, from a built-in English text split the way
//                        GPT-2's pre-tokenizer splits: words with their leading space, numbers,
//                        punctuation runs, whitespace); a merge whose result already exists adds
//                        no token
//   then                 the special tokens (default "<|endoftext|>", token type CONTROL), the
//                        first of which is BOS and EOS
//   then                 "<|pad_N|>" tokens (type UNUSED) up to the requested size
// The merges array holds the merges in the order they were learned (their rank).
//
// Deterministic: the same parameters give the same vocabulary (ties between equally frequent
// pairs are broken by the smaller pair of token ids). Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/token_type.h"

namespace estream::synth {

struct BpeVocab {
  std::vector<std::string> tokens;   // UTF-8 spellings, id = index
  std::vector<int32_t> token_types;  // TokenType values (gguf/token_type.h), parallel to tokens
  std::vector<std::string> merges;   // "left right" in rank order
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int n_learned = 0;                 // tokens added by merges
  int n_padding = 0;                 // "<|pad_N|>" tokens
};

struct BpeBuildParams {
  int vocab_size = 512;              // exact size of the result
  // Upper bound on merges learned (the text limits them too: pairs seen fewer than twice are not
  // merged). The rest of the vocabulary is padding.
  int max_merges = 2048;
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
  std::string_view text = {};        // empty: the built-in English text
};

// InvalidArgument if vocab_size cannot hold the 256 byte tokens and the special tokens.
Result<BpeVocab> BuildByteBpe(const BpeBuildParams& params);

// GPT-2's byte-to-unicode spelling of byte b, as UTF-8.
std::string ByteToUnicode(uint8_t b);
// The built-in training text (a few KB of plain English written for estream).
std::string_view BuiltinBpeText();
// The pre-tokenizer split used for training: GPT-2's pattern restricted to ASCII
// ('s 't 're 've 'm 'll 'd | ?letters | ?digits | ?other | whitespace not followed by non-space
// | whitespace). Exposed for tests.
std::vector<std::string> SplitWords(std::string_view text);

}  // namespace estream::synth
