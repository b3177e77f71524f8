// GgufValue factories, type names and GgufTensorInfo helpers.
#include <fmt/format.h>

#include "gguf/gguf.h"

namespace estream {

const char* GgufTypeName(GgufType t) {
  switch (t) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return "unknown";
}

GgufValue GgufValue::Of(GgufType t) {
  GgufValue r;
  r.type = t;
  return r;
}

GgufValue GgufValue::U32(uint32_t v) {
  GgufValue r = Of(GgufType::kU32);
  r.u = v;
  return r;
}

GgufValue GgufValue::I32(int32_t v) {
  GgufValue r = Of(GgufType::kI32);
  r.i = v;
  return r;
}

GgufValue GgufValue::U64(uint64_t v) {
  GgufValue r = Of(GgufType::kU64);
  r.u = v;
  return r;
}

GgufValue GgufValue::F32(float v) {
  GgufValue r = Of(GgufType::kF32);
  r.f = v;
  return r;
}

GgufValue GgufValue::Bool(bool v) {
  GgufValue r = Of(GgufType::kBool);
  r.u = v ? 1 : 0;
  return r;
}

GgufValue GgufValue::String(std::string v) {
  GgufValue r = Of(GgufType::kString);
  r.str = std::move(v);
  return r;
}

GgufValue GgufValue::Array(GgufType elem, std::vector<GgufValue> elems) {
  GgufValue r = Of(GgufType::kArray);
  r.elem_type = elem;
  r.array = std::move(elems);
  return r;
}

namespace {
// An array of `type` whose elements are make(x) for each x of v.
template <typename T, typename Make>
GgufValue ArrayOf(GgufType type, const std::vector<T>& v, Make make) {
  std::vector<GgufValue> elems;
  elems.reserve(v.size());
  for (const T& x : v) elems.push_back(make(x));
  return GgufValue::Array(type, std::move(elems));
}
}  // namespace

GgufValue GgufValue::StringArray(const std::vector<std::string>& v) {
  return ArrayOf(GgufType::kString, v, [](const std::string& x) { return String(x); });
}

GgufValue GgufValue::F32Array(const std::vector<float>& v) { return ArrayOf(GgufType::kF32, v, F32); }

GgufValue GgufValue::I32Array(const std::vector<int32_t>& v) { return ArrayOf(GgufType::kI32, v, I32); }

std::string GgufTensorInfo::ShapeString() const {
  std::string s = "[";
  for (int d = 0; d < n_dims; ++d) {
    if (d > 0) s += ", ";
    s += std::to_string(dims[d]);
  }
  s += "]";
  return s;
}

}  // namespace estream
