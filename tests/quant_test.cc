// Quant formats: every shared ggml test vector dequantises bit for bit, the Q8_0/Q4_0 quantisers
// reproduce ggml's stored bytes, and round trips on fresh random rows stay inside the error the
// format allows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <algorithm>
#include <vector>

#include "base/fp16.h"
#include "quant/quant.h"
#include "quant/types.h"

namespace estream {
namespace {

const std::string kQuantDir = std::string(ESTREAM_SHARED_DIR) + "/testdata/quant/";

// One test vector file: u32 type, u32 n, the row bytes, n dequantised floats, n source floats.
struct Vector {
  QuantType type = QuantType::kF32;
  int64_t n = 0;
  std::vector<uint8_t> row;
  std::vector<float> expected;
  std::vector<float> source;
};

bool LoadVector(const std::string& file, Vector* v) {
  FILE* f = std::fopen((kQuantDir + file).c_str(), "rb");
  if (f == nullptr) return false;
  std::vector<uint8_t> bytes;
  uint8_t buf[65536];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.insert(bytes.end(), buf, buf + got);
  std::fclose(f);
  if (bytes.size() < 8) return false;
  uint32_t type, n;
  std::memcpy(&type, bytes.data(), 4);
  std::memcpy(&n, bytes.data() + 4, 4);
  v->type = static_cast<QuantType>(type);
  v->n = n;
  const size_t row_bytes = RowBytes(v->type, n);
  if (row_bytes == 0 || bytes.size() != 8 + row_bytes + 2 * sizeof(float) * n) return false;
  v->row.assign(bytes.begin() + 8, bytes.begin() + 8 + row_bytes);
  v->expected.resize(n);
  v->source.resize(n);
  std::memcpy(v->expected.data(), bytes.data() + 8 + row_bytes, sizeof(float) * n);
  std::memcpy(v->source.data(), bytes.data() + 8 + row_bytes + sizeof(float) * n, sizeof(float) * n);
  return true;
}

struct VectorCase {
  const char* file;
  QuantType type;
};
void PrintTo(const VectorCase& c, std::ostream* os) { *os << c.file; }

class SharedVectorTest : public ::testing::TestWithParam<VectorCase> {};

TEST_P(SharedVectorTest, DequantisesBitForBit) {
  Vector v;
  ASSERT_TRUE(LoadVector(GetParam().file, &v)) << "cannot read " << kQuantDir << GetParam().file;
  ASSERT_EQ(v.type, GetParam().type);
  ASSERT_TRUE(CanDequantize(v.type));
  std::vector<float> out(v.n, std::numeric_limits<float>::quiet_NaN());
  DequantizeRow(v.type, v.row.data(), out.data(), v.n);
  for (int64_t i = 0; i < v.n; ++i) {
    uint32_t a = FloatToBits(out[i]), b = FloatToBits(v.expected[i]);
    ASSERT_EQ(a, b) << TypeName(v.type) << " value " << i << ": got " << out[i] << " want " << v.expected[i];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Quant, SharedVectorTest,
    ::testing::Values(VectorCase{"f16.bin", QuantType::kF16}, VectorCase{"bf16.bin", QuantType::kBF16},
                      VectorCase{"q4_0.bin", QuantType::kQ4_0}, VectorCase{"q4_1.bin", QuantType::kQ4_1},
                      VectorCase{"q5_0.bin", QuantType::kQ5_0}, VectorCase{"q5_1.bin", QuantType::kQ5_1},
                      VectorCase{"q8_0.bin", QuantType::kQ8_0}, VectorCase{"q4_k.bin", QuantType::kQ4_K},
                      VectorCase{"q5_k.bin", QuantType::kQ5_K}, VectorCase{"q6_k.bin", QuantType::kQ6_K},
                      VectorCase{"q2_k.bin", QuantType::kQ2_K}, VectorCase{"q3_k.bin", QuantType::kQ3_K},
                      VectorCase{"iq4_nl.bin", QuantType::kIQ4_NL}, VectorCase{"iq4_xs.bin", QuantType::kIQ4_XS},
                      VectorCase{"mxfp4.bin", QuantType::kMXFP4}),
    [](const auto& info) {
      std::string s = info.param.file;
      return s.substr(0, s.find('.'));
    });

// The types estream quantises (round to nearest, as ggml's reference) reproduce the stored bytes.
class SharedQuantiseTest : public ::testing::TestWithParam<VectorCase> {};

TEST_P(SharedQuantiseTest, QuantisesToStoredBytes) {
  Vector v;
  ASSERT_TRUE(LoadVector(GetParam().file, &v)) << "cannot read " << kQuantDir << GetParam().file;
  ASSERT_EQ(v.type, GetParam().type);
  ASSERT_TRUE(CanQuantize(v.type));
  std::vector<uint8_t> out(v.row.size(), 0xA5);
  QuantizeRow(v.type, v.source.data(), out.data(), v.n);
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_EQ(out[i], v.row[i]) << TypeName(v.type) << " byte " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Quant, SharedQuantiseTest,
    ::testing::Values(VectorCase{"f16.bin", QuantType::kF16}, VectorCase{"bf16.bin", QuantType::kBF16},
                      VectorCase{"q4_0.bin", QuantType::kQ4_0}, VectorCase{"q8_0.bin", QuantType::kQ8_0},
                      VectorCase{"q4_1.bin", QuantType::kQ4_1}, VectorCase{"q5_0.bin", QuantType::kQ5_0},
                      VectorCase{"q5_1.bin", QuantType::kQ5_1}),
    [](const auto& info) {
      std::string s = info.param.file;
      return s.substr(0, s.find('.'));
    });

// The other quantisers (round to nearest with simpler scale choices than ggml's searches, see
// quant.h): their rms error on the shared source row is at most `ratio` x that of ggml's stored
// quantisation, and the output dequantises (every value finite).
struct ErrorCase {
  const char* file;
  QuantType type;
  double ratio;
};
void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.file; }
class SharedQuantiseErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(SharedQuantiseErrorTest, ErrorCloseToGgml) {
  Vector v;
  ASSERT_TRUE(LoadVector(GetParam().file, &v)) << "cannot read " << kQuantDir << GetParam().file;
  ASSERT_EQ(v.type, GetParam().type);
  ASSERT_TRUE(CanQuantize(v.type));
  std::vector<uint8_t> q(v.row.size(), 0xA5);
  QuantizeRow(v.type, v.source.data(), q.data(), v.n);
  std::vector<float> y(v.n, std::numeric_limits<float>::quiet_NaN());
  DequantizeRow(v.type, q.data(), y.data(), v.n);
  double ours = 0, ggml = 0;
  for (int64_t i = 0; i < v.n; ++i) {
    ASSERT_TRUE(std::isfinite(y[i])) << TypeName(v.type) << " value " << i;
    ours += (y[i] - static_cast<double>(v.source[i])) * (y[i] - v.source[i]);
    ggml += (v.expected[i] - static_cast<double>(v.source[i])) * (v.expected[i] - v.source[i]);
  }
  const double ratio = std::sqrt(ours / ggml);
  std::printf("%s: rms error %.4g, ggml %.4g (ratio %.3f)\n", TypeName(v.type), std::sqrt(ours / v.n),
              std::sqrt(ggml / v.n), ratio);
  EXPECT_LE(ratio, GetParam().ratio) << TypeName(v.type);
}

INSTANTIATE_TEST_SUITE_P(
    Quant, SharedQuantiseErrorTest,
    ::testing::Values(ErrorCase{"q4_k.bin", QuantType::kQ4_K, 1.2}, ErrorCase{"q5_k.bin", QuantType::kQ5_K, 1.2},
                      ErrorCase{"q6_k.bin", QuantType::kQ6_K, 1.2}, ErrorCase{"q3_k.bin", QuantType::kQ3_K, 1.2},
                      ErrorCase{"q2_k.bin", QuantType::kQ2_K, 1.25}, ErrorCase{"iq4_nl.bin", QuantType::kIQ4_NL, 1.1},
                      ErrorCase{"iq4_xs.bin", QuantType::kIQ4_XS, 1.1}, ErrorCase{"mxfp4.bin", QuantType::kMXFP4, 1.0}),
    [](const auto& info) {
      std::string s = info.param.file;
      return s.substr(0, s.find('.'));
    });

// ---- round trips on fresh random rows -------------------------------------------------------

// Rows drawn fresh each run from a seeded generator, with per-block magnitudes spread over
// several decades (a block of tiny values next to one of large values) and some exact ties.
std::vector<float> RandomRow(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-3.0f, 3.0f);
  std::vector<float> x(n);
  float scale = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 32 == 0) scale = std::pow(10.0f, decade(rng));
    x[i] = normal(rng) * scale;
  }
  if (n > 2) x[1] = -x[0];  // a tie of opposite signs for the signed-max search
  return x;
}

const int64_t kBlockLengths[] = {32, 64, 96, 224, 1056, 4064, 32 * 257};

// Q8_0: q = round(x / d) with d = amax / 127, stored as fp16 d16. The error is the rounding
// |x - q d| <= d / 2 plus |q| |d - d16| <= 127 * d * 2^-11 (fp16 has 11 significant bits),
// plus float rounding of x * (1/d) (a few ulps of x, covered by a relative 1e-6 of amax).
// Blocks of tiny values have a subnormal fp16 d, where the rounding error is absolute: at most
// half the smallest subnormal, 2^-25.
TEST(QuantRoundTrip, Q8_0WithinHalfStep) {
  for (int64_t n : kBlockLengths) {
    const std::vector<float> x = RandomRow(n, static_cast<uint32_t>(n) * 7 + 1);
    std::vector<BlockQ8_0> q(n / kQK8_0);
    QuantizeRowQ8_0(x.data(), q.data(), n);
    std::vector<float> y(n, std::numeric_limits<float>::quiet_NaN());
    DequantizeRow(QuantType::kQ8_0, q.data(), y.data(), n);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
      float amax = 0;
      for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[b * kQK8_0 + j]));
      const float d = amax / 127.0f;
      const float d_err = std::max(d * std::ldexp(1.0f, -11), std::ldexp(1.0f, -25));
      const float bound = d * 0.5f + 127.0f * d_err + amax * 1e-6f;
      for (int j = 0; j < kQK8_0; ++j) {
        const int64_t i = b * kQK8_0 + j;
        ASSERT_LE(std::fabs(x[i] - y[i]), bound) << "n=" << n << " i=" << i;
      }
    }
  }
}

// Q4_0: d = vmax / -8 (vmax the signed value of largest magnitude), q = clamp(round(x/d) + 8,
// 0, 15). Values on vmax's side land inside [-8, 7] exactly, rounding error <= |d| / 2; values
// on the other side reaching past +7.5 steps are clamped to 7, error up to |d|. The fp16 scale
// adds |q - 8| |d - d16| <= 8 |d| 2^-11.
TEST(QuantRoundTrip, Q4_0WithinHalfStepOrClamp) {
  for (int64_t n : kBlockLengths) {
    const std::vector<float> x = RandomRow(n, static_cast<uint32_t>(n) * 13 + 5);
    std::vector<BlockQ4_0> q(n / kQK4_0);
    QuantizeRowQ4_0(x.data(), q.data(), n);
    std::vector<float> y(n, std::numeric_limits<float>::quiet_NaN());
    DequantizeRow(QuantType::kQ4_0, q.data(), y.data(), n);
    for (int64_t b = 0; b < n / kQK4_0; ++b) {
      float amax = 0;
      for (int j = 0; j < kQK4_0; ++j) amax = std::max(amax, std::fabs(x[b * kQK4_0 + j]));
      const float d = amax / 8.0f;
      for (int j = 0; j < kQK4_0; ++j) {
        const int64_t i = b * kQK4_0 + j;
        const float steps = std::fabs(x[i]) / d;  // <= 8
        const float clamp = steps > 7.5f ? (steps - 7.5f) * d : 0.0f;
        const float d_err = std::max(d * std::ldexp(1.0f, -11), std::ldexp(1.0f, -25));
        const float bound = d * 0.5f + clamp + 8.0f * d_err + amax * 1e-6f;
        ASSERT_LE(std::fabs(x[i] - y[i]), bound) << "n=" << n << " i=" << i;
      }
    }
  }
}

// The value of largest magnitude itself is represented exactly up to the fp16 rounding of d.
TEST(QuantRoundTrip, Q4_0KeepsExtremeValue) {
  const std::vector<float> x = RandomRow(4064, 99);
  std::vector<BlockQ4_0> q(4064 / kQK4_0);
  QuantizeRowQ4_0(x.data(), q.data(), 4064);
  std::vector<float> y(4064);
  DequantizeRow(QuantType::kQ4_0, q.data(), y.data(), 4064);
  for (int b = 0; b < 4064 / kQK4_0; ++b) {
    int arg = 0;
    for (int j = 1; j < kQK4_0; ++j)
      if (std::fabs(x[b * 32 + j]) > std::fabs(x[b * 32 + arg])) arg = j;
    const float v = x[b * 32 + arg];
    EXPECT_NEAR(y[b * 32 + arg], v, std::fabs(v) * std::ldexp(1.0f, -11) * 1.01f);
  }
}

// F16 / BF16 on lengths that are not multiples of anything: relative error 2^-11 / 2^-8
// (round to nearest with 11 / 8 significant bits). Below fp16's normal range (2^-14) the error
// is absolute, half the smallest subnormal: 2^-25. bf16 shares fp32's range.
TEST(QuantRoundTrip, HalfAndBf16Relative) {
  for (int64_t n : {1, 7, 31, 33, 1000, 4097}) {
    std::vector<float> x = RandomRow(n, static_cast<uint32_t>(n) + 17);
    for (auto [t, rel, abs_floor] : {std::tuple{QuantType::kF16, std::ldexp(1.0f, -11), std::ldexp(1.0f, -25)},
                                     std::tuple{QuantType::kBF16, std::ldexp(1.0f, -8), 0.0f}}) {
      std::vector<uint16_t> q(n);
      QuantizeRow(t, x.data(), q.data(), n);
      std::vector<float> y(n, std::numeric_limits<float>::quiet_NaN());
      DequantizeRow(t, q.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_LE(std::fabs(x[i] - y[i]), std::max(std::fabs(x[i]) * rel, abs_floor)) << TypeName(t) << " n=" << n << " i=" << i;
    }
  }
}

TEST(QuantRoundTrip, F32IsExact) {
  const std::vector<float> x = RandomRow(77, 3);
  std::vector<float> q(77), y(77, std::numeric_limits<float>::quiet_NaN());
  QuantizeRow(QuantType::kF32, x.data(), q.data(), 77);
  DequantizeRow(QuantType::kF32, q.data(), y.data(), 77);
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), sizeof(float) * 77));
}

// An all-zero block has d = 0 and must come back as zeros, not NaN (1/d is guarded).
TEST(QuantRoundTrip, ZeroBlockStaysZero) {
  std::vector<float> x = RandomRow(96, 5);
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;
  x.resize(256);
  for (int j = 96; j < 256; ++j) x[j] = 0.5f * (j % 7) - 1.0f;
  for (QuantType t : {QuantType::kQ8_0, QuantType::kQ4_0, QuantType::kQ4_1, QuantType::kQ5_0, QuantType::kQ5_1,
                      QuantType::kQ2_K, QuantType::kQ3_K, QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K,
                      QuantType::kIQ4_NL, QuantType::kIQ4_XS, QuantType::kMXFP4}) {
    std::vector<uint8_t> q(RowBytes(t, 256));
    QuantizeRow(t, x.data(), q.data(), 256);
    std::vector<float> y(256, std::numeric_limits<float>::quiet_NaN());
    DequantizeRow(t, q.data(), y.data(), 256);
    for (int j = 0; j < 256; ++j) ASSERT_TRUE(std::isfinite(y[j])) << TypeName(t);
    // 32-value blocks: the zero block is exact. (The K-quants' and IQ4_XS's zero sub-blocks share a
    // super-block with non-zero ones, so they come back as small multiples of its scales.)
    if (GetTypeTraits(t)->block_size == 32) {
      for (int j = 32; j < 64; ++j) EXPECT_EQ(y[j], 0.0f) << TypeName(t);
    }
  }
}

TEST(QuantSupport, Lists) {
  for (QuantType t : {QuantType::kF32, QuantType::kF16, QuantType::kBF16, QuantType::kQ4_0, QuantType::kQ4_1,
                      QuantType::kQ5_0, QuantType::kQ5_1, QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ5_K,
                      QuantType::kQ6_K, QuantType::kQ2_K, QuantType::kQ3_K, QuantType::kIQ4_NL,
                      QuantType::kIQ4_XS, QuantType::kMXFP4}) {
    EXPECT_TRUE(CanDequantize(t)) << TypeName(t);
    EXPECT_TRUE(CanQuantize(t)) << TypeName(t);
    EXPECT_TRUE(GetTypeTraits(t)->can_dequantize) << TypeName(t);
  }
  EXPECT_FALSE(CanDequantize(QuantType::kQ8_K));
  EXPECT_EQ(ParseTypeName("IQ4_XS"), QuantType::kIQ4_XS);
  EXPECT_EQ(ParseTypeName("mxfp4"), QuantType::kMXFP4);
  EXPECT_TRUE(CanQuantize(QuantType::kQ4_0));
}

}  // namespace
}  // namespace estream
