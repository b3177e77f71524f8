// Size switch of the kernel tests for slow hosts. ESTREAM_TEST_QUICK=1 (set by the ARM64 stage of
// scripts/test.sh, which runs the tests under qemu-user at a small fraction of a core's speed)
// makes the tests that sweep many shapes run a few of their awkward ones (each test says which),
// and skips the long-prompt attention checks. The checks and tolerances stay the same.
#pragma once

#include <cstdlib>
#include <cstring>

namespace estream::test {

inline bool QuickTests() {
  const char* s = std::getenv("ESTREAM_TEST_QUICK");
  return s != nullptr && *s != '\0' && std::strcmp(s, "0") != 0;
}

}  // namespace estream::test
