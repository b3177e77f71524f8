#include "quant/types.h"

#include <algorithm>
#include <cctype>

namespace estream {
namespace {

constexpr TypeTraits kTraits[] = {
    {QuantType::kF32, "f32", 1, 4, true},
    {QuantType::kF16, "f16", 1, 2, true},
    {QuantType::kQ4_0, "q4_0", 32, 18, true},
    {QuantType::kQ4_1, "q4_1", 32, 20, true},
    {QuantType::kQ5_0, "q5_0", 32, 22, true},
    {QuantType::kQ5_1, "q5_1", 32, 24, true},
    {QuantType::kQ8_0, "q8_0", 32, 34, true},
    {QuantType::kQ8_1, "q8_1", 32, 36, false},
    {QuantType::kQ2_K, "q2_K", 256, 84, true},
    {QuantType::kQ3_K, "q3_K", 256, 110, true},
    {QuantType::kQ4_K, "q4_K", 256, 144, true},
    {QuantType::kQ5_K, "q5_K", 256, 176, true},
    {QuantType::kQ6_K, "q6_K", 256, 210, true},
    {QuantType::kQ8_K, "q8_K", 256, 292, false},
    {QuantType::kIQ4_NL, "iq4_nl", 32, 18, true},
    {QuantType::kIQ4_XS, "iq4_xs", 256, 136, true},
    {QuantType::kI8, "i8", 1, 1, false},
    {QuantType::kI16, "i16", 1, 2, false},
    {QuantType::kI32, "i32", 1, 4, false},
    {QuantType::kI64, "i64", 1, 8, false},
    {QuantType::kF64, "f64", 1, 8, false},
    {QuantType::kBF16, "bf16", 1, 2, true},
    {QuantType::kMXFP4, "mxfp4", 32, 17, true},
};

}  // namespace

const TypeTraits* GetTypeTraits(uint32_t raw_type) {
  for (const TypeTraits& t : kTraits)
    if (static_cast<uint32_t>(t.type) == raw_type) return &t;
  return nullptr;
}

const char* TypeName(QuantType t) {
  const TypeTraits* tr = GetTypeTraits(t);
  return tr ? tr->name : "unknown";
}

std::optional<QuantType> ParseTypeName(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const TypeTraits& t : kTraits) {
    std::string tn = t.name;
    std::transform(tn.begin(), tn.end(), tn.begin(), [](unsigned char c) { return std::tolower(c); });
    if (tn == lower) return t.type;
  }
  return std::nullopt;
}

std::string SupportedTypeNames() {
  std::string out;
  for (const TypeTraits& t : kTraits) {
    if (!t.can_dequantize) continue;
    if (!out.empty()) out += ", ";
    out += t.name;
  }
  return out;
}

std::string UnsupportedTypeAdvice(uint32_t raw_type) {
  // ggml type ids estream does not know, with the mix of about the same bits per weight.
  struct Other {
    uint32_t id;
    const char* name;
    const char* mix;
  };
  static constexpr Other kOthers[] = {
      {16, "iq2_xxs", "Q2_K"}, {17, "iq2_xs", "Q2_K"},   {18, "iq3_xxs", "Q3_K_S"}, {19, "iq1_s", "Q2_K"},
      {21, "iq3_s", "Q3_K_M"}, {22, "iq2_s", "Q2_K"},    {29, "iq1_m", "Q2_K"},     {34, "tq1_0", "Q2_K"},
      {35, "tq2_0", "Q2_K"},   {9, "q8_1", "Q8_0"},      {15, "q8_K", "Q8_0"},      {24, "i8", "Q8_0"},
      {25, "i16", "F16"},      {26, "i32", "F32"},       {27, "i64", "F32"},        {28, "f64", "F32"},
  };
  std::string name = "unknown", mix = "Q4_K_M";
  for (const Other& o : kOthers)
    if (o.id == raw_type) {
      name = o.name;
      mix = o.mix;
    }
  return "ggml type " + std::to_string(raw_type) + " (" + name +
         "): re-quantise the model to the nearest supported mix, " + mix + " (llama-quantize MODEL.gguf OUT.gguf " +
         mix + ")";
}

size_t RowBytes(QuantType t, int64_t n) {
  const TypeTraits* tr = GetTypeTraits(t);
  if (tr == nullptr || n < 0 || n % tr->block_size != 0) return 0;
  return static_cast<size_t>(n / tr->block_size) * tr->type_size;
}

}  // namespace estream
