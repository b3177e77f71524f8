// Reader of the packed layout documented in packed_layout.h.
#include "pack/packed_layout.h"

#include <xxhash.h>

#include <algorithm>
#include <optional>

#include <fmt/format.h>


namespace estream::io {
namespace {

// Integer value of a scalar GgufValue of any integer type; nullopt for other types.
std::optional<uint64_t> UnsignedOf(const GgufValue& v) {
  switch (v.type) {
    case GgufType::kU8: case GgufType::kU16: case GgufType::kU32: case GgufType::kU64:
      return v.u;
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64:
      if (v.i < 0) return std::nullopt;
      return static_cast<uint64_t>(v.i);
    default:
      return std::nullopt;
  }
}
std::optional<int64_t> SignedOf(const GgufValue& v) {
  switch (v.type) {
    case GgufType::kU8: case GgufType::kU16: case GgufType::kU32: case GgufType::kU64:
      if (v.u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
      return static_cast<int64_t>(v.u);
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64:
      return v.i;
    default:
      return std::nullopt;
  }
}

// The array value of `key`, checked to hold exactly `count` elements (count < 0: any count).
Result<const GgufValue*> GetArray(const GgufFile& f, const std::string& key, int64_t count) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr)
    return Status::Corruption(fmt::format("{}: packed model lacks key {}; re-run estream pack", f.path(), key));
  if (v->type != GgufType::kArray)
    return Status::Corruption(fmt::format("{}: key {} is a {}, expected an integer array", f.path(), key,
                                          GgufTypeName(v->type)));
  if (count >= 0 && v->array.size() != static_cast<size_t>(count))
    return Status::Corruption(fmt::format("{}: key {} has {} elements, expected {}", f.path(), key,
                                          v->array.size(), count));
  return v;
}

// Reads an integer array key of exactly `count` elements (count < 0: any count), each converted by
// `of`; `what` says what an element must be ("an integer") in the error.
template <typename T>
Result<std::vector<T>> GetIntArray(const GgufFile& f, const std::string& key, int64_t count,
                                   std::optional<T> (*of)(const GgufValue&), const char* what) {
  ESTREAM_ASSIGN_OR_RETURN(const GgufValue* v, GetArray(f, key, count));
  std::vector<T> out;
  out.reserve(v->array.size());
  for (size_t i = 0; i < v->array.size(); ++i) {
    std::optional<T> x = of(v->array[i]);
    if (!x) return Status::Corruption(fmt::format("{}: key {} element {} is not {}", f.path(), key, i, what));
    out.push_back(*x);
  }
  return out;
}

// Unsigned reading rejects negative values.
Result<std::vector<uint64_t>> GetU64Array(const GgufFile& f, const std::string& key, int64_t count) {
  return GetIntArray<uint64_t>(f, key, count, UnsignedOf, "a non-negative integer");
}
Result<std::vector<int64_t>> GetI64Array(const GgufFile& f, const std::string& key, int64_t count) {
  return GetIntArray<int64_t>(f, key, count, SignedOf, "an integer");
}

// A u32 key that must equal `expected`.
Status ExpectU32(const GgufFile& f, const char* key, uint32_t expected) {
  ESTREAM_ASSIGN_OR_RETURN(uint32_t v, f.GetU32(key));
  if (v != expected)
    return Status::Corruption(fmt::format("{}: key {} is {}, layout version 1 requires {}", f.path(), key, v, expected));
  return Status::Ok();
}

// Validates block i's parts and record size; fills layer->parts and payload_bytes.
Status ReadParts(const GgufFile& f, size_t i, const std::vector<uint64_t>& types, const std::vector<uint64_t>& layouts,
                 const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& bytes, int64_t n_embd,
                 int64_t n_ff, PackedLayerInfo* layer) {
  const int64_t shapes[kExpertParts][2] = {{n_ff, n_embd}, {n_ff, n_embd}, {n_embd, n_ff}};
  uint64_t end = 0;
  for (int p = 0; p < kExpertParts; ++p) {
    const size_t j = 3 * i + static_cast<size_t>(p);
    const char* pname = ExpertPartName(static_cast<ExpertPart>(p));
    auto where = [&] { return fmt::format("{}: layer {} part {} ({})", f.path(), layer->layer, pname, packed_keys::kPartTypes); };
    if (types[j] > UINT32_MAX || GetTypeTraits(static_cast<uint32_t>(types[j])) == nullptr)
      return Status::Corruption(fmt::format("{}: unknown ggml type id {}", where(), types[j]));
    PackedPart& part = layer->parts[static_cast<size_t>(p)];
    part.type = static_cast<QuantType>(types[j]);
    part.n = shapes[p][0];
    part.k = shapes[p][1];
    const WeightLayout expected_layout = PackedPartLayout(part.type);
    if (layouts[j] != PartLayoutCode(expected_layout))
      return Status::Corruption(fmt::format("{}: {} is {} for type {}, expected {}", where(), packed_keys::kPartLayouts,
                                            layouts[j], TypeName(part.type), PartLayoutCode(expected_layout)));
    part.layout = expected_layout;
    const uint64_t want = PackedPartBytes(part.type, part.n, part.k);
    if (want == 0)
      return Status::Corruption(fmt::format("{}: a {} x {} {} matrix is not a valid expert part (rows not whole "
                                            "blocks, or too large)", where(), part.n, part.k, TypeName(part.type)));
    if (bytes[j] != want)
      return Status::Corruption(fmt::format("{}: {} is {}, but a {} x {} {} matrix takes {} bytes", where(),
                                            packed_keys::kPartBytes, bytes[j], part.n, part.k, TypeName(part.type), want));
    part.bytes = bytes[j];
    if (offsets[j] % kPackedPartAlignment != 0 || offsets[j] < end)
      return Status::Corruption(fmt::format("{}: {} is {}: not a multiple of {} or overlapping the previous part "
                                            "(which ends at {})", where(), packed_keys::kPartOffsets, offsets[j],
                                            kPackedPartAlignment, end));
    // offset + bytes <= record_bytes, written so that no sum can wrap around (an offset near
    // 2^64 would otherwise pass and point before the record).
    if (offsets[j] > layer->record_bytes || part.bytes > layer->record_bytes - offsets[j])
      return Status::Corruption(fmt::format("{}: {} {} + {} bytes runs past the record size {} ({})", where(),
                                            packed_keys::kPartOffsets, offsets[j], part.bytes, layer->record_bytes,
                                            packed_keys::kRecordBytes));
    part.offset = offsets[j];
    end = part.offset + part.bytes;
  }
  layer->payload_bytes = end;  // > 0: every part has bytes, and <= record_bytes
  return Status::Ok();
}

}  // namespace

const char* ExpertPartName(ExpertPart part) {
  switch (part) {
    case ExpertPart::kGate: return "gate";
    case ExpertPart::kUp: return "up";
    case ExpertPart::kDown: return "down";
  }
  return "?";
}

namespace packed_keys {
std::string Checksums(int layer) { return fmt::format("estream.checksums.{}", layer); }
std::string Permutation(int layer) { return fmt::format("estream.expert_permutation.{}", layer); }
std::string RegionTensor(int layer) { return fmt::format("blk.{}.ffn_exps.packed", layer); }
}  // namespace packed_keys

uint32_t PartLayoutCode(WeightLayout layout) { return layout == WeightLayout::kPacked ? 1 : 0; }

WeightLayout PackedPartLayout(QuantType t) {
  return CanRepack(t) ? WeightLayout::kPacked : WeightLayout::kGguf;
}

uint64_t PackedPartBytes(QuantType t, int64_t n, int64_t k) {
  if (n <= 0 || k <= 0 || RowBytes(t, k) == 0) return 0;
  // The shapes come from a file (u32 keys): a product past 2^64 is refused, not wrapped.
  uint64_t bytes = 0;
  const bool overflow =
      CanRepack(t) ? __builtin_mul_overflow(static_cast<uint64_t>(PackedPanels(n)),
                                            static_cast<uint64_t>(PackedPanelBytes(t, k)), &bytes)
                   : __builtin_mul_overflow(static_cast<uint64_t>(n), static_cast<uint64_t>(RowBytes(t, k)), &bytes);
  return overflow ? 0 : bytes;
}

int PackedLayerInfo::GroupRecords(int q, int g) const {
  ESTREAM_CHECK(g >= 1 && q >= 0 && static_cast<int64_t>(q) * g < n_expert, "GroupRecords: group outside the region");
  return std::min(g, n_expert - q * g);
}

WeightView PackedLayerInfo::PartView(ExpertPart p, const uint8_t* record) const {
  const PackedPart& pt = part(p);
  return WeightView{.type = pt.type, .layout = pt.layout, .n = pt.n, .k = pt.k, .data = record + pt.offset};
}

const PackedLayerInfo* PackedModelInfo::FindLayer(int layer) const {
  for (const PackedLayerInfo& l : layers)
    if (l.layer == layer) return &l;
  return nullptr;
}

uint64_t PackedModelInfo::TotalRecordBytes() const {
  uint64_t total = 0;
  for (const PackedLayerInfo& l : layers) total += l.record_bytes * static_cast<uint64_t>(l.n_expert);
  return total;
}

bool IsPackedModel(const GgufFile& file) { return file.Find(packed_keys::kLayoutVersion) != nullptr; }

uint64_t RecordChecksum(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

Result<PackedModelInfo> ReadPackedLayout(const GgufFile& f) {
  if (!IsPackedModel(f))
    return Status::InvalidArgument(fmt::format("{}: not a packed model (no key {}); run 'estream pack {} -o OUT' first",
                                               f.path(), packed_keys::kLayoutVersion, f.path()));
  PackedModelInfo info;
  info.file = f.path();
  ESTREAM_ASSIGN_OR_RETURN(info.layout_version, f.GetU32(packed_keys::kLayoutVersion));
  if (info.layout_version != kPackedLayoutVersion)
    return Status::NotSupported(fmt::format("{}: packed layout version {} ({}) is not supported by this estream, which "
                                            "reads version {}; re-pack the original GGUF with this estream",
                                            f.path(), info.layout_version, packed_keys::kLayoutVersion,
                                            kPackedLayoutVersion));
  ESTREAM_ASSIGN_OR_RETURN(info.kernel_pack_version, f.GetU32(packed_keys::kKernelPackVersion));
  if (info.kernel_pack_version != static_cast<uint32_t>(kPackLayoutVersion))
    return Status::NotSupported(fmt::format("{}: experts were packed for kernel layout version {} ({}), this estream's "
                                            "kernels use version {}; re-pack the original GGUF with this estream",
                                            f.path(), info.kernel_pack_version, packed_keys::kKernelPackVersion,
                                            kPackLayoutVersion));
  ESTREAM_RETURN_IF_ERROR(ExpectU32(f, packed_keys::kRecordAlignment, kPackedRecordAlignment));
  ESTREAM_RETURN_IF_ERROR(ExpectU32(f, packed_keys::kPartAlignment, kPackedPartAlignment));
  info.record_alignment = kPackedRecordAlignment;
  if (f.alignment() % kPackedRecordAlignment != 0)
    return Status::Corruption(fmt::format("{}: general.alignment is {}, a packed model needs a multiple of {}", f.path(),
                                          f.alignment(), kPackedRecordAlignment));
  ESTREAM_ASSIGN_OR_RETURN(info.architecture, f.GetString("general.architecture"));
  ESTREAM_ASSIGN_OR_RETURN(uint32_t n_embd, f.GetU32(packed_keys::kNEmbd));
  ESTREAM_ASSIGN_OR_RETURN(uint32_t n_ff, f.GetU32(packed_keys::kNFf));
  ESTREAM_ASSIGN_OR_RETURN(uint32_t n_expert, f.GetU32(packed_keys::kNExpert));
  if (n_embd == 0 || n_ff == 0 || n_expert == 0 || n_expert > static_cast<uint32_t>(INT32_MAX))
    return Status::Corruption(fmt::format("{}: {} = {}, {} = {}, {} = {}: all must be positive", f.path(),
                                          packed_keys::kNEmbd, n_embd, packed_keys::kNFf, n_ff, packed_keys::kNExpert,
                                          n_expert));
  info.n_embd = n_embd;
  info.n_ff_expert = n_ff;
  info.n_expert = static_cast<int>(n_expert);

  ESTREAM_ASSIGN_OR_RETURN(std::vector<int64_t> blocks, GetI64Array(f, packed_keys::kLayers, -1));
  if (blocks.empty())
    return Status::Corruption(fmt::format("{}: key {} is empty: a packed model has at least one region", f.path(),
                                          packed_keys::kLayers));
  const int64_t n_layers = static_cast<int64_t>(blocks.size());
  ESTREAM_ASSIGN_OR_RETURN(std::vector<uint64_t> record_bytes, GetU64Array(f, packed_keys::kRecordBytes, n_layers));
  ESTREAM_ASSIGN_OR_RETURN(std::vector<uint64_t> types, GetU64Array(f, packed_keys::kPartTypes, 3 * n_layers));
  ESTREAM_ASSIGN_OR_RETURN(std::vector<uint64_t> layouts, GetU64Array(f, packed_keys::kPartLayouts, 3 * n_layers));
  ESTREAM_ASSIGN_OR_RETURN(std::vector<uint64_t> offsets, GetU64Array(f, packed_keys::kPartOffsets, 3 * n_layers));
  ESTREAM_ASSIGN_OR_RETURN(std::vector<uint64_t> bytes, GetU64Array(f, packed_keys::kPartBytes, 3 * n_layers));

  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] < 0 || blocks[i] > INT32_MAX || (i > 0 && blocks[i] <= blocks[i - 1]))
      return Status::Corruption(fmt::format("{}: key {} element {} = {}: block indices must be ascending and >= 0",
                                            f.path(), packed_keys::kLayers, i, blocks[i]));
    PackedLayerInfo L;
    L.file = f.path();
    L.layer = static_cast<int>(blocks[i]);
    L.n_expert = info.n_expert;
    L.record_bytes = record_bytes[i];
    if (L.record_bytes == 0 || L.record_bytes % kPackedRecordAlignment != 0)
      return Status::Corruption(fmt::format("{}: layer {}: {} = {} is not a positive multiple of {}", f.path(), L.layer,
                                            packed_keys::kRecordBytes, L.record_bytes, kPackedRecordAlignment));
    ESTREAM_RETURN_IF_ERROR(ReadParts(f, i, types, layouts, offsets, bytes, info.n_embd, info.n_ff_expert, &L));

    const std::string tname = packed_keys::RegionTensor(L.layer);
    const GgufTensorInfo* t = f.FindTensor(tname);
    if (t == nullptr)
      return Status::Corruption(fmt::format("{}: layer {} is listed in {} but tensor '{}' is missing", f.path(), L.layer,
                                            packed_keys::kLayers, tname));
    if (t->type != QuantType::kI8 || t->n_dims != 2 || static_cast<uint64_t>(t->dims[0]) != L.record_bytes ||
        t->dims[1] != info.n_expert)
      return Status::Corruption(fmt::format("{}: tensor '{}' is {} {}, expected i8 [{}, {}] ({} x {})", f.path(), tname,
                                            TypeName(t->type), t->ShapeString(), L.record_bytes, info.n_expert,
                                            packed_keys::kRecordBytes, packed_keys::kNExpert));
    L.file_offset = f.data_offset() + t->offset;
    if (L.file_offset % kPackedRecordAlignment != 0)
      return Status::Corruption(fmt::format("{}: tensor '{}' starts at file offset {}, not a multiple of {}", f.path(),
                                            tname, L.file_offset, kPackedRecordAlignment));

    ESTREAM_ASSIGN_OR_RETURN(L.checksums, GetU64Array(f, packed_keys::Checksums(L.layer), info.n_expert));
    L.permutation.resize(static_cast<size_t>(info.n_expert));
    L.physical_of.assign(static_cast<size_t>(info.n_expert), -1);
    const std::string pkey = packed_keys::Permutation(L.layer);
    if (f.Find(pkey) != nullptr) {
      ESTREAM_ASSIGN_OR_RETURN(std::vector<int64_t> perm, GetI64Array(f, pkey, info.n_expert));
      for (int p = 0; p < info.n_expert; ++p) {
        const int64_t e = perm[static_cast<size_t>(p)];
        if (e < 0 || e >= info.n_expert || L.physical_of[static_cast<size_t>(e)] != -1)
          return Status::Corruption(fmt::format("{}: key {} element {} = {}: not a permutation of 0..{}", f.path(), pkey,
                                                p, e, info.n_expert - 1));
        L.permutation[static_cast<size_t>(p)] = static_cast<int32_t>(e);
        L.physical_of[static_cast<size_t>(e)] = p;
      }
    } else {
      for (int p = 0; p < info.n_expert; ++p) L.permutation[static_cast<size_t>(p)] = L.physical_of[static_cast<size_t>(p)] = p;
    }
    info.layers.push_back(std::move(L));
  }
  return info;
}

Status VerifyRecord(const PackedLayerInfo& layer, int p, const uint8_t* bytes) {
  if (p < 0 || p >= layer.n_expert)
    return Status::OutOfRange(fmt::format("{}: layer {}: record {} outside 0..{}", layer.file, layer.layer, p,
                                          layer.n_expert - 1));
  const uint64_t got = RecordChecksum(bytes, layer.payload_bytes);
  const uint64_t want = layer.checksums[static_cast<size_t>(p)];
  if (got == want) return Status::Ok();
  return Status::Corruption(fmt::format(
      "{}: checksum mismatch in layer {} expert {} (record {} at file offset {}, {} bytes): xxh3 {:016x}, stored "
      "{:016x}; the file is damaged: re-run estream pack",
      layer.file, layer.layer, layer.permutation[static_cast<size_t>(p)], p, layer.RecordOffset(p),
      layer.payload_bytes, got, want));
}

}  // namespace estream::io
