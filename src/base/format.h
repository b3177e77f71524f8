// printf-style formatting into a std::string, for the text writers of the library's result types
// (gguf/summary.h, batch/eval.h: the same bytes the commands used to printf).
#pragma once

#include <cstdarg>
#include <cstdio>
#include <string>

namespace estream {

// Appends the printf-formatted text to *out.
__attribute__((format(printf, 2, 3))) inline void Appendf(std::string* out, const char* format, ...) {
  va_list args, copy;
  va_start(args, format);
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  if (n > 0) {
    const size_t at = out->size();
    out->resize(at + static_cast<size_t>(n) + 1);
    std::vsnprintf(out->data() + at, static_cast<size_t>(n) + 1, format, args);
    out->resize(at + static_cast<size_t>(n));
  }
  va_end(args);
}

}  // namespace estream
