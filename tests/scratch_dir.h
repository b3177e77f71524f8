// A scratch directory for tests: a fresh directory under the gtest temp dir, removed with its
// contents on destruction. Shared by the test helpers of every area (gguf_test_util.h,
// model_test_util.h, ...) and the tests that need nothing else.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <gtest/gtest.h>

namespace estream::test_util {

class ScratchDir {
 public:
  // Under `base` (ending with '/'): the gtest temp dir by default.
  explicit ScratchDir(const std::string& base = ::testing::TempDir()) {
    std::string tmpl = base + "estream_test_XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr) << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }

  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }
  // Names of the entries in the directory.
  std::vector<std::string> List() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
    return out;
  }

 private:
  std::string path_;
};

}  // namespace estream::test_util
