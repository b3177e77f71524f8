// Test helpers for the loader and vmem tests: files with deterministic pseudo-random contents
// (so a read can be checked without keeping a copy), created in the build directory, where
// O_DIRECT works (tmpfs, often /tmp, refuses it).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace estream::testing_io {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The byte the test file holds at `offset`.
inline uint8_t ExpectedByte(uint64_t seed, uint64_t offset) {
  return static_cast<uint8_t>(SplitMix64(seed ^ (offset >> 3) * 0x100000001B3ull) >> (8 * (offset & 7)));
}

// Offset (relative) of the first byte of p[0, n) that differs from the file at `offset`, or n.
inline size_t FirstMismatch(uint64_t seed, uint64_t offset, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != ExpectedByte(seed, offset + i)) return i;
  }
  return n;
}

// A file of `size` bytes of ExpectedByte(seed, .), removed when the object dies.
class TempPatternFile {
 public:
  TempPatternFile(uint64_t size, uint64_t seed, const std::string& tag) : seed_(seed) {
    path_ = std::string(ESTREAM_BINARY_DIR) + "/tmp_" + tag + "_" + std::to_string(getpid()) + "_" +
            std::to_string(counter()++) + ".bin";
    FILE* f = std::fopen(path_.c_str(), "wb");
    EXPECT_NE(f, nullptr) << path_;
    if (f == nullptr) return;
    std::vector<uint8_t> buf(1 << 16);
    for (uint64_t off = 0; off < size; off += buf.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
      for (size_t i = 0; i < n; ++i) buf[i] = ExpectedByte(seed, off + i);
      EXPECT_EQ(std::fwrite(buf.data(), 1, n, f), n);
    }
    std::fclose(f);
  }
  ~TempPatternFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }
  uint64_t seed() const { return seed_; }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string path_;
  uint64_t seed_;
};

}  // namespace estream::testing_io
