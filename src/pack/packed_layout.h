// The packed model layout ("estream pack", docs/DESIGN.md sections 4-5) and its reader.
//
// ---- What a packed model is -----------------------------------------------------------------
// A packed model is an ordinary GGUF file (v3), so every GGUF tool still opens it:
//   - every metadata key of the source model is kept as it was (tokenizer.*, {arch}.*,
//     general.*), except general.alignment, which is 4096;
//   - every dense tensor (embeddings, attention, norms, routers, output) is kept byte for byte,
//     under its own name, type and shape;
//   - the routed expert tensors of each MoE block N (blk.N.ffn_{gate,up,down}_exps.weight, or
//     the older per-expert blk.N.ffn_{gate,up,down}.E.weight of Mixtral files) are NOT kept;
//     they are replaced by ONE tensor per block, the block's "region":
//
//        blk.N.ffn_exps.packed     type I8, dims [record_bytes, n_expert]
//
//     i.e. n_expert records of record_bytes each, back to back. With general.alignment = 4096
//     the region starts 4096-aligned in the file, and record_bytes is a multiple of 4096, so
//     every record starts 4096-aligned and any run of consecutive records (a group of G
//     experts, docs/DESIGN.md section 4) is one contiguous range that O_DIRECT can read as it is.
//
// ---- One record (one expert) ----------------------------------------------------------------
//   offset 0                  gate   n = n_ff rows,   k = n_embd columns  (W_g of the expert)
//   offset part_offsets[1]    up     n = n_ff,        k = n_embd
//   offset part_offsets[2]    down   n = n_embd,      k = n_ff
//   payload end = part_offsets[2] + part_bytes[2]; zeros up to record_bytes.
// Each part is the kernel-native packed layout when the type has one (CanRepack: bytes =
// PackedWeightBytes(type, n, k), written by kernels::RepackWeights, layout code 1), else the
// expert's GGUF rows exactly as in the source (n rows of RowBytes(type, k), code 0). The layout
// knows that format from quant/packed_format.h only: this reader does not depend on the kernels.
// Parts start at multiples of 64 bytes (the kernels load 64-byte vectors); the gaps are zero.
// Every record of a block has the same parts (types, shapes, offsets); blocks may differ
// (a Q4_K_M file keeps some ffn_down in Q6_K).
//
// ---- Permutation ----------------------------------------------------------------------------
// Record p of block N (its "physical position") holds logical expert permutation[p]; without
// estream.expert_permutation.N the permutation is the identity. Router expert ids are logical;
// the loader maps them through PackedLayerInfo::physical_of.
//
// ---- Checksums ------------------------------------------------------------------------------
// checksums[p] = XXH3-64 (seed 0, libxxhash's XXH3_64bits) of the payload bytes of record p
// (bytes [0, payload_bytes) of the record; the zero padding is not covered).
//
// ---- Metadata keys (layout version 1) -------------------------------------------------------
// L = number of packed blocks; arrays indexed by i = 0..L-1 follow estream.layers; "3L" arrays
// hold (gate, up, down) of block i at 3i, 3i + 1, 3i + 2.
//   estream.layout_version        u32     1. A reader refuses any other value (NotSupported).
//   estream.kernel_pack_version   u32     the version of the kernel-native packed layout the
//                                         parts were written with (kPackLayoutVersion,
//                                         quant/packed_format.h); a reader of another version
//                                         refuses the file.
//   estream.record_alignment      u32     4096: alignment of the region and of record_bytes
//   estream.part_alignment        u32     64: alignment of part offsets inside a record
//   estream.n_embd                u32     model width (k of gate/up, n of down)
//   estream.n_ff                  u32     expert width (n of gate/up, k of down)
//   estream.n_expert              u32     records per region (= {arch}.expert_count)
//   estream.layers                i32[L]  block indices N that have a region, ascending
//   estream.record_bytes          u64[L]  record stride of each region (multiple of 4096)
//   estream.part_types            u32[3L] ggml type ids of gate, up, down
//   estream.part_layouts          u32[3L] 0 = GGUF rows, 1 = kernel-packed
//   estream.part_offsets          u64[3L] byte offset of each part inside a record
//   estream.part_bytes            u64[3L] bytes of each part
//   estream.checksums.N           u64[n_expert]  per physical record of block N
//   estream.expert_permutation.N  i32[n_expert]  physical -> logical; only when not identity
//   estream.header_reserve        u64[]   zeros, the last key: room for later metadata, so that
//                                         io::UpdateMetadata rewrites the header in place
// Later versions may add keys (a reader of version 1 ignores estream.* keys it does not know);
// any change to the meaning of the keys above bumps estream.layout_version. The prefix
// estream.config.* is reserved for the configurator's result (group size, queue depth, banks;
// docs/DESIGN.md section 7), which does not change the layout.
//
// ---- Reader ---------------------------------------------------------------------------------
// ReadPackedLayout validates all of the above against the file (tensor present with the right
// type and dims, 4096-aligned region, parts inside the record and with the byte counts their
// type and shape imply, permutation a bijection, one checksum per record) and returns, per
// block, what the loader needs to read group q = records [q*G, q*G + G) as one range and to
// bind slot pointers (PartView). It reads metadata only; no tensor data is touched.
//
// Thread safety: the functions are pure (const inputs); PackedModelInfo is a value.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "quant/packed_format.h"
#include "quant/types.h"

namespace estream::io {

constexpr uint32_t kPackedLayoutVersion = 1;
constexpr uint32_t kPackedRecordAlignment = 4096;
constexpr uint32_t kPackedPartAlignment = 64;

// The three matrices of one expert record, in record order.
enum class ExpertPart : int { kGate = 0, kUp = 1, kDown = 2 };
constexpr int kExpertParts = 3;
const char* ExpertPartName(ExpertPart part);  // "gate", "up", "down"

// Metadata key and tensor names (see the table above).
namespace packed_keys {
inline constexpr char kLayoutVersion[] = "estream.layout_version";
inline constexpr char kKernelPackVersion[] = "estream.kernel_pack_version";
inline constexpr char kRecordAlignment[] = "estream.record_alignment";
inline constexpr char kPartAlignment[] = "estream.part_alignment";
inline constexpr char kNEmbd[] = "estream.n_embd";
inline constexpr char kNFf[] = "estream.n_ff";
inline constexpr char kNExpert[] = "estream.n_expert";
inline constexpr char kLayers[] = "estream.layers";
inline constexpr char kRecordBytes[] = "estream.record_bytes";
inline constexpr char kPartTypes[] = "estream.part_types";
inline constexpr char kPartLayouts[] = "estream.part_layouts";
inline constexpr char kPartOffsets[] = "estream.part_offsets";
inline constexpr char kPartBytes[] = "estream.part_bytes";
// "estream.checksums.N", "estream.expert_permutation.N", "blk.N.ffn_exps.packed"
std::string Checksums(int layer);
std::string Permutation(int layer);
std::string RegionTensor(int layer);
}  // namespace packed_keys

// The layout code stored in estream.part_layouts for a WeightLayout.
uint32_t PartLayoutCode(WeightLayout layout);

// One matrix inside a record.
struct PackedPart {
  QuantType type = QuantType::kF32;
  WeightLayout layout = WeightLayout::kGguf;
  int64_t n = 0;        // rows (output features)
  int64_t k = 0;        // columns (input features)
  uint64_t offset = 0;  // bytes from the start of the record; a multiple of kPackedPartAlignment
  uint64_t bytes = 0;   // PackedWeightBytes(type, n, k) when packed, else n * RowBytes(type, k)
};

// The bytes one part of an n x k matrix of type t takes in a record, and the layout it gets:
// packed when CanRepack(t), else GGUF rows. 0 bytes if k is not a multiple of t's block, or if
// the size does not fit in 64 bits.
uint64_t PackedPartBytes(QuantType t, int64_t n, int64_t k);
WeightLayout PackedPartLayout(QuantType t);

// One MoE block's region. Physical position p (0 <= p < n_expert) is the p-th record.
struct PackedLayerInfo {
  std::string file;            // path of the packed model, for messages
  int layer = -1;              // block index N
  int n_expert = 0;
  uint64_t file_offset = 0;    // absolute offset of record 0; a multiple of kPackedRecordAlignment
  uint64_t record_bytes = 0;   // record stride; a multiple of kPackedRecordAlignment
  uint64_t payload_bytes = 0;  // checksummed bytes at the start of a record (end of down)
  std::array<PackedPart, kExpertParts> parts{};  // gate, up, down
  std::vector<int32_t> permutation;  // physical -> logical expert (identity by default)
  std::vector<int32_t> physical_of;  // logical -> physical (the inverse)
  std::vector<uint64_t> checksums;   // per physical record

  const PackedPart& part(ExpertPart p) const { return parts[static_cast<int>(p)]; }
  // Absolute file offset of physical record p.
  uint64_t RecordOffset(int p) const { return file_offset + static_cast<uint64_t>(p) * record_bytes; }
  // Group q of size g is records [q*g, min(q*g + g, n_expert)): one contiguous range starting at
  // GroupOffset, GroupRecords(q, g) * record_bytes long. REQUIRES: g >= 1, 0 <= q*g < n_expert.
  int GroupRecords(int q, int g) const;
  uint64_t GroupOffset(int q, int g) const { return RecordOffset(q * g); }
  uint64_t GroupBytes(int q, int g) const { return static_cast<uint64_t>(GroupRecords(q, g)) * record_bytes; }
  // The weight view of one part of the record whose bytes start at `record` (e.g. a slot in a
  // bank). The data pointer is record + part offset; for a packed part keep `record` 64-byte
  // aligned (arena slots are 4096-aligned).
  WeightView PartView(ExpertPart p, const uint8_t* record) const;
};

struct PackedModelInfo {
  std::string file;
  std::string architecture;          // general.architecture
  uint32_t layout_version = 0;
  uint32_t kernel_pack_version = 0;
  uint32_t record_alignment = 0;
  int64_t n_embd = 0;
  int64_t n_ff_expert = 0;  // expert FFN width (ModelInfo::n_ff_expert)
  int n_expert = 0;
  std::vector<PackedLayerInfo> layers;  // ascending block index

  // nullptr if block `layer` has no region.
  const PackedLayerInfo* FindLayer(int layer) const;
  // Sum of every region's bytes (all records, padding included).
  uint64_t TotalRecordBytes() const;
};

// True if the file carries estream.layout_version (of any value: a file of an unknown version is
// still a packed model, which ReadPackedLayout then refuses).
bool IsPackedModel(const GgufFile& file);

// Reads and validates the layout. Errors (one line naming the file and the key or tensor):
//   InvalidArgument  not a packed model (no estream.layout_version): run `estream pack` first;
//   NotSupported     estream.layout_version != 1, or a kernel pack version other than this
//                    build's (re-pack with this estream);
//   Corruption       anything inconsistent (missing key, wrong type or count, region tensor
//                    missing or of the wrong type/dims/alignment, parts overlapping or outside
//                    the record, bad permutation, wrong number of checksums).
Result<PackedModelInfo> ReadPackedLayout(const GgufFile& file);

// XXH3-64 (seed 0) of `bytes` bytes: the record checksum.
uint64_t RecordChecksum(const void* data, size_t bytes);

// Checks physical record p of `layer` whose bytes (at least payload_bytes) start at `bytes`.
// Corruption naming the file, block, logical expert, physical record and its file offset on a
// mismatch; OutOfRange for p outside [0, n_expert).
Status VerifyRecord(const PackedLayerInfo& layer, int p, const uint8_t* bytes);

}  // namespace estream::io
