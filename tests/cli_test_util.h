// Running the built estream binary from a test (the CLI smoke tests): stdout and stderr captured
// separately, the exit code.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "scratch_dir.h"

namespace estream::cli_test {

// Whether this build runs under AddressSanitizer (then `ulimit -v` makes every run fail).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs `estream ARGS` (the binary of this build); stderr goes through the file `err_path`.
// shell_prefix: shell commands run first in the same shell ("ulimit -v 200000; ").
inline CliResult RunCli(const std::string& args, const std::string& err_path, const std::string& shell_prefix = "") {
  const std::string cmd =
      shell_prefix + std::string(ESTREAM_BINARY_DIR) + "/tools/estream/estream " + args + " 2>" + err_path;
  CliResult r;
  if (std::FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t k;
    while ((k = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, k);
    const int status = pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::ifstream e(err_path);
  r.err.assign(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
  return r;
}

// A suite that runs the CLI on the tiny synthetic model (`estream synth --preset tiny`) and its
// packed form, both made once per suite in a scratch directory.
class TinyModelCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test_util::ScratchDir;
    ASSERT_EQ(Run("synth --preset tiny -q -o " + Model()).exit_code, 0);
    ASSERT_EQ(Run("pack -q " + Model() + " -o " + Packed()).exit_code, 0);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static CliResult Run(const std::string& args, const std::string& shell_prefix = "") {
    return RunCli(args, dir_->File("stderr.txt"), shell_prefix);
  }
  static std::string Model() { return dir_->File("tiny.gguf"); }
  static std::string Packed() { return dir_->File("tiny.packed.gguf"); }

  static inline test_util::ScratchDir* dir_ = nullptr;
};

}  // namespace estream::cli_test
