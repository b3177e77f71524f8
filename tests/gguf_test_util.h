// Helpers shared by the GGUF tests: a scratch directory and a byte builder for handcrafted files.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "scratch_dir.h"

namespace estream::testing_gguf {

using ScratchDir = ::estream::test_util::ScratchDir;

inline std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void WriteAll(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Little-endian byte builder for handcrafted GGUF images.
class Bytes {
 public:
  Bytes& U8(uint8_t v) { return Raw(&v, 1); }
  Bytes& U32(uint32_t v) { return Raw(&v, 4); }
  Bytes& U64(uint64_t v) { return Raw(&v, 8); }
  Bytes& F32(float v) { return Raw(&v, 4); }
  Bytes& Str(const std::string& s) {
    U64(s.size());
    return Raw(s.data(), s.size());
  }
  Bytes& Raw(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    data_.insert(data_.end(), b, b + n);
    return *this;
  }
  Bytes& PadTo(size_t alignment) {
    while (data_.size() % alignment != 0) data_.push_back(0);
    return *this;
  }
  Bytes& Fill(size_t n, uint8_t v = 0x5a) {
    data_.insert(data_.end(), n, v);
    return *this;
  }
  size_t size() const { return data_.size(); }
  const std::vector<uint8_t>& data() const { return data_; }

 private:
  std::vector<uint8_t> data_;
};

}  // namespace estream::testing_gguf
