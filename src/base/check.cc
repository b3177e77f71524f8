#include "base/check.h"

#include <cstdio>
#include <cstdlib>

namespace estream::internal {

void CheckFailed(const char* file, int line, const char* cond, const char* msg) {
  std::fprintf(stderr, "estream: check failed at %s:%d: %s (%s)\n", file, line, cond, msg ? msg : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace estream::internal
