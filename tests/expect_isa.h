// The level check of the test binaries that CI runs once per forced kernel level (the whole-model
// tests of the ARM64 stage of scripts/test.sh, under qemu-aarch64 with a matching emulated CPU).
// Included by a test binary, it registers a gtest environment that runs before every test
// process's tests (ctest runs each test in its own process) and, where the environment says what
// to expect, fails the process unless the kernels really run at that level:
//   ESTREAM_EXPECT_ISA=<level>       the dispatch table the engine uses (kernels::Kernels().isa);
//   ESTREAM_EXPECT_HOST_ISA=<level>  the level detected on the (emulated) CPU (HostIsa()).
// So a forced level that the CPU lacks (clamped with a warning) or a typo in ESTREAM_ISA (ignored
// with a warning) cannot pass unnoticed as a run "at" that level. Unset: no check.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/cpu.h"
#include "kernels/dispatch.h"

namespace estream::test {

class ExpectIsaEnvironment : public ::testing::Environment {
 public:
  // A mismatch ends the process with status 1 before any test runs: a failure inside an
  // environment's SetUp would make gtest skip the tests, which ctest counts as skipped, not failed.
  void SetUp() override {
    const char* want = std::getenv("ESTREAM_EXPECT_ISA");
    const char* want_host = std::getenv("ESTREAM_EXPECT_HOST_ISA");
    const bool check = want != nullptr && *want != '\0';
    const bool check_host = want_host != nullptr && *want_host != '\0';
    if (!check && !check_host) return;
    const char* active = IsaName(kernels::Kernels().isa);
    const char* host = IsaName(HostIsa());
    std::printf("kernels at level %s (host %s)\n", active, host);
    if (check && std::strcmp(active, want) != 0) {
      std::fprintf(stderr, "ESTREAM_EXPECT_ISA=%s, but the kernels run at %s (host %s): check ESTREAM_ISA and the CPU\n",
                   want, active, host);
      std::exit(1);
    }
    if (check_host && std::strcmp(host, want_host) != 0) {
      std::fprintf(stderr, "ESTREAM_EXPECT_HOST_ISA=%s, but the CPU is at level %s\n", want_host, host);
      std::exit(1);
    }
  }
};

inline ::testing::Environment* const kExpectIsaEnvironment =
    ::testing::AddGlobalTestEnvironment(new ExpectIsaEnvironment);

}  // namespace estream::test
