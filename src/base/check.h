// ESTREAM_CHECK / ESTREAM_DCHECK: programmer errors (broken invariants), never bad input.
// A failed check prints file:line, the condition and the message to stderr and aborts.
#pragma once

namespace estream::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const char* msg);
}  // namespace estream::internal

#define ESTREAM_CHECK(cond, msg)                                                \
  do {                                                                          \
    if (__builtin_expect(!(cond), 0))                                           \
      ::estream::internal::CheckFailed(__FILE__, __LINE__, #cond, (msg));       \
  } while (0)

#ifdef NDEBUG
#define ESTREAM_DCHECK(cond, msg) \
  do {                            \
  } while (0)
#else
#define ESTREAM_DCHECK(cond, msg) ESTREAM_CHECK(cond, msg)
#endif
