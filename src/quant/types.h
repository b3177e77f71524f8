// Tensor element types of GGUF (the ggml type ids) and their block layouts.
//
// Every quantised type stores a row of n values as n / block_size blocks of type_size bytes.
// The layouts below are exactly those of GGUF files (little-endian, packed, no padding);
// the static_asserts pin the sizes. Values marked "f16" are IEEE half bits (base/fp16.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace estream {

// Ids as stored in GGUF tensor infos (ggml_type). Ids not listed are unknown to estream.
enum class QuantType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
  kMXFP4 = 39,
};

struct TypeTraits {
  QuantType type;
  const char* name;      // lower-case GGUF/ggml name: "f32", "q4_0", "q4_K", ...
  uint32_t block_size;   // values per block (1 for plain types)
  uint32_t type_size;    // bytes per block
  bool can_dequantize;   // estream has a dequantiser for it
};

// Traits of a raw ggml type id, or nullptr if the id is unknown. Known-but-unsupported types
// (Q2_K, Q3_K, ...) have traits so that files containing them can be read and inspected.
const TypeTraits* GetTypeTraits(uint32_t raw_type);
inline const TypeTraits* GetTypeTraits(QuantType t) { return GetTypeTraits(static_cast<uint32_t>(t)); }
const char* TypeName(QuantType t);
// Parses a name as printed by TypeName (case-insensitive). nullopt if unknown.
std::optional<QuantType> ParseTypeName(const std::string& name);
// Comma-separated list of the types estream can dequantise, for error messages.
std::string SupportedTypeNames();

// For a tensor type estream cannot use (an unknown id, or a known one without kernels such as
// q8_K): a sentence naming it and the nearest mix estream supports to convert the model to with
// llama-quantize, e.g. "ggml type 16 (iq2_xxs): re-quantise the model to the nearest supported
// mix, Q2_K (llama-quantize MODEL.gguf OUT.gguf Q2_K)".
std::string UnsupportedTypeAdvice(uint32_t raw_type);

// Bytes of one row of n values, or 0 if n is not a multiple of the block size.
size_t RowBytes(QuantType t, int64_t n);

constexpr int kQK4_0 = 32;
constexpr int kQK4_1 = 32;
constexpr int kQK5_0 = 32;
constexpr int kQK5_1 = 32;
constexpr int kQK8_0 = 32;
constexpr int kQK_K = 256;
constexpr int kKScaleSize = 12;

#pragma pack(push, 1)
struct BlockQ4_0 {
  uint16_t d;               // f16 scale
  uint8_t qs[kQK4_0 / 2];   // nibbles: low nibble = value j, high nibble = value j + 16
};
struct BlockQ4_1 {
  uint16_t d;               // f16 scale
  uint16_t m;               // f16 minimum
  uint8_t qs[kQK4_1 / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];            // 5th bits, bit j for value j
  uint8_t qs[kQK5_0 / 2];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};
struct BlockQ8_0 {
  uint16_t d;               // f16 scale
  int8_t qs[kQK8_0];
};
struct BlockQ4_K {
  uint16_t d;               // f16 super-block scale for the scales
  uint16_t dmin;            // f16 super-block scale for the mins
  uint8_t scales[kKScaleSize];  // 8 x (6-bit scale, 6-bit min), packed
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // per 16 values: low nibble scale, high nibble min
  uint8_t qs[kQK_K / 4];    // 2-bit values: byte l of 128-value half n holds values
                            // n*128 + 32*j + l (l < 32) in bits 2j..2j+1
  uint16_t d;               // f16 super-block scale for the scales
  uint16_t dmin;            // f16 super-block scale for the mins
};
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8]; // high bits: bit j of hmask[l] belongs to value 32j + l
  uint8_t qs[kQK_K / 4];    // low 2 bits, laid out as BlockQ2_K::qs
  uint8_t scales[12];       // 16 x 6-bit scales (stored + 32), packed
  uint16_t d;               // f16 super-block scale
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];    // lower 4 bits
  uint8_t qh[kQK_K / 4];    // upper 2 bits
  int8_t scales[kQK_K / 16];
  uint16_t d;               // f16 super-block scale
};

// Non-linear 4-bit types: 4-bit codes index a fixed table of 16 int8 values (quant.h:
// kIq4NlValues, kMxfp4Values). Nibbles as in Q4_0 (low: value j, high: value j + 16).
constexpr int kQK4_NL = 32;
constexpr int kQKMxfp4 = 32;
struct BlockIQ4_NL {
  uint16_t d;               // f16 scale
  uint8_t qs[kQK4_NL / 2];
};
struct BlockIQ4_XS {
  uint16_t d;               // f16 super-block scale
  uint16_t scales_h;        // top 2 bits of the 8 6-bit block scales (stored + 32)
  uint8_t scales_l[kQK_K / 64];  // low 4 bits of the block scales, two per byte
  uint8_t qs[kQK_K / 2];    // 8 blocks of 32 values, nibbles as in BlockIQ4_NL
};
struct BlockMXFP4 {
  uint8_t e;                // E8M0 shared exponent: the scale is 2^(e - 127)
  uint8_t qs[kQKMxfp4 / 2]; // E2M1 codes, nibbles as in BlockIQ4_NL
};

// The 8-bit activation format of the quantised kernels: activations X are quantised once per
// row in blocks of 32 with an fp32 scale (d = max|x| / 127, q = round(x / d)), and the integer
// sums of each half block, which the kernels need to fold in weight offsets and minimums
// (Q4_0's -8, Q4_K's mins, Q6_K's -32) without touching the weights again.
constexpr int kQK8A = 32;
struct BlockQ8A {
  float d;                  // scale
  int16_t sum[2];           // sum of qs[0..15] and of qs[16..31]
  int8_t qs[kQK8A];
};
#pragma pack(pop)

static_assert(sizeof(BlockQ8A) == 40);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockMXFP4) == 17);

}  // namespace estream
