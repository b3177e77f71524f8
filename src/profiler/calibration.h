// The calibration request: the prompt that the profiler (`estream profile`) and the exhaustive
// sweep (`estream sweep`) run end to end to measure a packed model on this machine (docs/DESIGN.md
// section 7).
//
// The default prompt is a built-in English text of about 1K tokens (original prose written for
// estream: varied topics, numbers, a little code and punctuation, so the router sees a spread of
// inputs rather than one repeated pattern); `--calib FILE` replaces it with the file's text.
// Tokens come from the model's own GGUF tokenizer (src/tokenizer), so the same text gives the
// request that model would really see.
//
// Thread safety: pure functions (CalibrationTokens reads the model's header and the file).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace estream::profiler {

// ~6 KB of built-in calibration text (about 1,200 tokens with the GPT-2 or Qwen3 vocabularies).
// Static storage; never changes between versions without a reason (profiles record only the
// token count, but a different text gives a different routing).
std::string_view BuiltinCalibrationText();

constexpr int kDefaultCalibrationTokens = 1024;

// The calibration request's token ids for the model at `model_path` (any GGUF with tokenizer.*
// metadata; only the header is read):
//   - calib_path empty: the built-in text; else the file's whole text (read as bytes; invalid
//     UTF-8 is replaced by the tokenizer, never an error);
//   - BOS prepended when the vocabulary asks for it (tokenizer.ggml.add_bos_token), no EOS;
//     special tokens in the text are NOT parsed (they tokenize as plain text);
//   - when the text gives fewer than max_tokens tokens, its tokens (without BOS) are repeated
//     until max_tokens; then the result is truncated to min(max_tokens, context length)
//     ({arch}.context_length when present).
// Errors (InvalidArgument, one line naming the file): max_tokens < 1; the model cannot be opened
// or has no usable tokenizer ("pass token ids" is not an option here: the calibration needs
// text); the calibration file cannot be read; the text gives no tokens.
Result<std::vector<int32_t>> CalibrationTokens(const std::string& model_path, const std::string& calib_path,
                                               int max_tokens = kDefaultCalibrationTokens);

}  // namespace estream::profiler
