// estream pack: the streaming writer of the packed layout (pack_model.h, packed_layout.h).
#include "pack/pack_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <array>
#include <deque>
#include <thread>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/memory.h"
#include "base/mutex.h"
#include "base/omp_threads.h"
#include "base/output_path.h"
#include "base/timer.h"
#include "pack/metadata_update.h"
#include "pack/packed_layout.h"
#include "kernels/kernels.h"
#include "kernels/repack.h"

namespace estream::io {
namespace {

constexpr const char* kPartSuffix[3] = {"gate", "up", "down"};
constexpr size_t kCopyChunkBytes = size_t{8} << 20;

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Serialized size of a GGUF value (what GgufWriter writes after the key and the type tag).
uint64_t ValueBytes(const GgufValue& v) {
  switch (v.type) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    case GgufType::kString: return 8 + v.str.size();
    case GgufType::kArray: {
      uint64_t n = 4 + 8;
      for (const GgufValue& e : v.array) n += ValueBytes(e);
      return n;
    }
  }
  return 0;
}

// Record layout of one block: part offsets (64-aligned, in gate/up/down order) and sizes.
struct RecordLayout {
  uint64_t offsets[3] = {0, 0, 0};
  uint64_t bytes[3] = {0, 0, 0};
  uint64_t rows[3] = {0, 0, 0};  // n of each part
  uint64_t cols[3] = {0, 0, 0};  // k of each part
  uint64_t payload = 0;
  uint64_t record_bytes = 0;
};

RecordLayout MakeRecordLayout(const SourceExperts& src, const SourceExpertLayer& L) {
  RecordLayout r;
  const int64_t shapes[3][2] = {{src.n_ff_expert, src.n_embd}, {src.n_ff_expert, src.n_embd}, {src.n_embd, src.n_ff_expert}};
  uint64_t off = 0;
  for (int p = 0; p < 3; ++p) {
    off = AlignUp(off, kPackedPartAlignment);
    r.rows[p] = static_cast<uint64_t>(shapes[p][0]);
    r.cols[p] = static_cast<uint64_t>(shapes[p][1]);
    r.offsets[p] = off;
    r.bytes[p] = PackedPartBytes(L.types[p], shapes[p][0], shapes[p][1]);
    off += r.bytes[p];
  }
  r.payload = off;
  r.record_bytes = AlignUp(off, kPackedRecordAlignment);
  return r;
}

// Zeroes the bytes of a record that no part covers (between parts, and after the payload).
void ZeroGaps(const RecordLayout& r, uint8_t* rec) {
  uint64_t end = 0;
  for (int p = 0; p < 3; ++p) {
    std::memset(rec + end, 0, r.offsets[p] - end);
    end = r.offsets[p] + r.bytes[p];
  }
  std::memset(rec + end, 0, r.record_bytes - end);
}


// Writes filled buffers through the GgufWriter on a thread of its own, so that write(2) (often
// held up by dirty-page writeback) overlaps the read and repack of the next record. Two buffers
// circulate: the caller fills one (Acquire, then Submit) while the other is being written.
// Between construction and Close the writer is used only by that thread.
// Thread safety: Acquire/Submit/Close from one (the packing) thread.
class WriteBehind {
 public:
  WriteBehind(GgufWriter* writer, std::array<uint8_t*, 2> buffers) : writer_(writer), cv_(&mu_) {
    free_.assign(buffers.begin(), buffers.end());
    thread_ = std::thread([this] { Loop(); });
  }
  ~WriteBehind() { (void)Close(); }
  WriteBehind(const WriteBehind&) = delete;
  WriteBehind& operator=(const WriteBehind&) = delete;

  // A buffer to fill, once one is free; the first write error instead.
  Result<uint8_t*> Acquire() {
    MutexLock lock(&mu_);
    while (free_.empty() && error_.ok()) cv_.Wait();
    if (!error_.ok()) return error_;
    uint8_t* b = free_.back();
    free_.pop_back();
    return b;
  }
  // Queues the first n bytes of a buffer from Acquire for writing.
  void Submit(uint8_t* buffer, size_t n) {
    MutexLock lock(&mu_);
    queue_.push_back({buffer, n});
    cv_.SignalAll();
  }
  // Writes what is queued, stops the thread; the first write error, if any. Idempotent.
  Status Close() {
    {
      MutexLock lock(&mu_);
      closing_ = true;
      cv_.SignalAll();
    }
    if (thread_.joinable()) thread_.join();
    MutexLock lock(&mu_);
    return error_;
  }

 private:
  void Loop() {
    MutexLock lock(&mu_);
    for (;;) {
      while (queue_.empty() && !closing_) cv_.Wait();
      if (queue_.empty()) return;
      const auto [buffer, n] = queue_.front();
      queue_.pop_front();
      Status st;
      if (error_.ok()) {  // after an error, buffers are only recycled
        mu_.Unlock();
        st = writer_->WriteTensorData(buffer, n);
        mu_.Lock();
      }
      if (!st.ok() && error_.ok()) error_ = st;
      free_.push_back(buffer);
      cv_.SignalAll();
    }
  }

  GgufWriter* const writer_;
  Mutex mu_;    // guards the queue, the free list, the error and closing_
  CondVar cv_;  // signalled on every change of those
  std::deque<std::pair<uint8_t*, size_t>> queue_ ESTREAM_GUARDED_BY(mu_);
  std::vector<uint8_t*> free_ ESTREAM_GUARDED_BY(mu_);
  Status error_ ESTREAM_GUARDED_BY(mu_);
  bool closing_ ESTREAM_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Checks one expert tensor's type and dims; `dims` lists what it must be.
Status CheckTensor(const GgufFile& in, const GgufTensorInfo& t, const std::vector<int64_t>& dims) {
  bool ok = t.n_dims == static_cast<int>(dims.size());
  for (size_t d = 0; ok && d < dims.size(); ++d) ok = t.dims[d] == dims[d];
  if (ok) return Status::Ok();
  std::string want = "[";
  for (size_t d = 0; d < dims.size(); ++d) want += (d ? ", " : "") + std::to_string(dims[d]);
  want += "]";
  return Status::Corruption(fmt::format("{}: expert tensor '{}' has shape {}, expected {} ([n_in, n_out{}])", in.path(),
                                        t.name, t.ShapeString(), want, dims.size() == 3 ? ", n_expert" : ""));
}

// One estream.checksums.N value in the header of the written file.
struct ChecksumSlot {
  std::string key;
  uint64_t key_pos = 0;                      // header byte offset of the key's length prefix
  const std::vector<uint64_t>* sums = nullptr;
};

// Header byte offset of each key of `kvs`, as GgufWriter serialises them in this order (the
// writer adds no key of its own: general.alignment is among `kvs`).
std::unordered_map<std::string, uint64_t> KeyPositions(const std::vector<GgufKv>& kvs) {
  std::unordered_map<std::string, uint64_t> out;
  uint64_t pos = 4 + 4 + 8 + 8;  // magic, version, n_tensors, n_kv
  for (const GgufKv& kv : kvs) {
    out[kv.key] = pos;
    pos += 8 + kv.key.size() + 4 + ValueBytes(kv.value);
  }
  return out;
}

// Writes the checksums into the header of the written file (descriptor fd; `path` names it in
// messages). The bytes at each slot (key, array type, element type, count) are compared first, so
// a disagreement with the writer's serialisation is an error, never a silent overwrite.
Status PatchChecksums(int fd, const std::string& path, const std::vector<ChecksumSlot>& slots) {
  for (const ChecksumSlot& slot : slots) {
    std::string expect;
    auto put = [&expect](const void* p, size_t n) { expect.append(static_cast<const char*>(p), n); };
    const uint64_t key_len = slot.key.size();
    const uint32_t type = static_cast<uint32_t>(GgufType::kArray), elem = static_cast<uint32_t>(GgufType::kU64);
    const uint64_t count = slot.sums->size();
    put(&key_len, 8);
    put(slot.key.data(), slot.key.size());
    put(&type, 4);
    put(&elem, 4);
    put(&count, 8);
    std::string got(expect.size(), '\0');
    if (::pread(fd, got.data(), got.size(), static_cast<off_t>(slot.key_pos)) != static_cast<ssize_t>(got.size()) ||
        got != expect) {
      return Status::Internal(fmt::format("{}: key {} is not at header byte {} as computed; checksums not written",
                                          path, slot.key, slot.key_pos));
    }
    const size_t n = count * sizeof(uint64_t);
    if (::pwrite(fd, slot.sums->data(), n, static_cast<off_t>(slot.key_pos + expect.size())) !=
        static_cast<ssize_t>(n)) {
      return Status::IOError(fmt::format("{}: cannot write checksums of {}: {}", path, slot.key, std::strerror(errno)));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<SourceExperts> FindSourceExperts(const GgufFile& in) {
  if (IsPackedModel(in)) {
    const uint32_t v = in.GetU32(packed_keys::kLayoutVersion).ok() ? *in.GetU32(packed_keys::kLayoutVersion) : 0;
    return Status::InvalidArgument(fmt::format("{}: already packed ({} = {}); give estream pack the original GGUF",
                                               in.path(), packed_keys::kLayoutVersion, v));
  }
  SourceExperts src;
  ESTREAM_ASSIGN_OR_RETURN(src.architecture, in.GetString("general.architecture"));
  const std::string& arch = src.architecture;
  if (arch != "olmoe" && arch != "qwen3moe" && arch != "llama" && arch != "deepseek2" && arch != "lfm2moe")
    return Status::NotSupported(fmt::format("{}: general.architecture '{}' is not supported by estream pack "
                                            "(supported: olmoe, qwen3moe, llama, deepseek2, lfm2moe)", in.path(), arch));
  const std::string count_key = arch + ".expert_count";
  const GgufValue* count_v = in.Find(count_key);
  ESTREAM_ASSIGN_OR_RETURN(uint32_t n_expert, in.GetU32Or(count_key, 0));
  if (count_v == nullptr || n_expert == 0)
    return Status::InvalidArgument(fmt::format("{}: not a MoE model ({} is {}); estream pack needs experts", in.path(),
                                               count_key, count_v ? "0" : "absent"));
  if (n_expert > 65536)
    return Status::Corruption(fmt::format("{}: {} = {} is implausibly large", in.path(), count_key, n_expert));
  src.n_expert = static_cast<int>(n_expert);
  ESTREAM_ASSIGN_OR_RETURN(uint32_t n_embd, in.GetU32(arch + ".embedding_length"));
  ESTREAM_ASSIGN_OR_RETURN(uint32_t n_layer, in.GetU32(arch + ".block_count"));
  src.n_embd = n_embd;
  // Every block has tensors: a count beyond the file's tensors is damage, and looking up
  // 2^32 blocks' names would take a quarter of an hour.
  if (n_layer > in.tensors().size())
    return Status::Corruption(fmt::format("{}: {}.block_count = {} but the file has only {} tensors", in.path(), arch,
                                          n_layer, in.tensors().size()));

  for (uint32_t n = 0; n < n_layer; ++n) {
    const std::string p = fmt::format("blk.{}.", n);
    SourceExpertLayer L;
    L.layer = static_cast<int>(n);
    const GgufTensorInfo* merged[3];
    bool any_merged = false;
    for (int k = 0; k < 3; ++k) {
      merged[k] = in.FindTensor(fmt::format("{}ffn_{}_exps.weight", p, kPartSuffix[k]));
      any_merged |= merged[k] != nullptr;
    }
    if (any_merged) {
      for (int k = 0; k < 3; ++k) {
        if (merged[k] == nullptr)
          return Status::Corruption(fmt::format("{}: block {} has expert tensors but lacks '{}ffn_{}_exps.weight'",
                                                in.path(), n, p, kPartSuffix[k]));
        L.tensors[k].push_back(merged[k]);
        L.types[k] = merged[k]->type;
      }
    } else if (in.FindTensor(p + "ffn_gate.0.weight") != nullptr) {
      L.per_expert = true;
      for (int k = 0; k < 3; ++k) {
        for (int e = 0; e < src.n_expert; ++e) {
          const std::string name = fmt::format("{}ffn_{}.{}.weight", p, kPartSuffix[k], e);
          const GgufTensorInfo* t = in.FindTensor(name);
          if (t == nullptr)
            return Status::Corruption(fmt::format("{}: block {} has per-expert tensors but lacks '{}' ({} = {})",
                                                  in.path(), n, name, count_key, n_expert));
          if (e > 0 && t->type != L.types[k])
            return Status::NotSupported(fmt::format("{}: '{}' is {} but expert 0's {} is {}; estream pack needs one "
                                                    "type per block and matrix", in.path(), name, TypeName(t->type),
                                                    kPartSuffix[k], TypeName(L.types[k])));
          L.types[k] = t->type;
          L.tensors[k].push_back(t);
        }
      }
    } else {
      continue;  // a dense block
    }
    // n_ff_expert from the first gate tensor; every expert tensor of every block must agree.
    const int64_t n_ff = L.tensors[0][0]->ne(1);
    if (src.n_ff_expert == 0) src.n_ff_expert = n_ff;
    const int64_t E = src.n_expert;
    for (int k = 0; k < 3; ++k) {
      const int64_t n_in = k == 2 ? src.n_ff_expert : src.n_embd, n_out = k == 2 ? src.n_embd : src.n_ff_expert;
      for (const GgufTensorInfo* t : L.tensors[k]) {
        if (L.per_expert) ESTREAM_RETURN_IF_ERROR(CheckTensor(in, *t, {n_in, n_out}));
        else ESTREAM_RETURN_IF_ERROR(CheckTensor(in, *t, {n_in, n_out, E}));
      }
      if (RowBytes(L.types[k], n_in) == 0)
        return Status::Corruption(fmt::format("{}: '{}': rows of {} values are not whole {} blocks", in.path(),
                                              L.tensors[k][0]->name, n_in, TypeName(L.types[k])));
    }
    src.layers.push_back(std::move(L));
  }
  if (src.layers.empty())
    return Status::InvalidArgument(fmt::format("{}: not a MoE model: no block of the {} blocks has expert tensors "
                                               "(blk.N.ffn_gate_exps.weight or blk.N.ffn_gate.E.weight)",
                                               in.path(), n_layer));
  return src;
}

Result<PackStats> PackModel(const GgufFile& in, const std::string& out_path, const PackOptions& options) {
  Timer timer;
  if (options.threads < 1 || options.threads > kMaxComputeThreads)
    return Status::InvalidArgument(fmt::format("estream pack: {} repacking threads: give 1 to {}", options.threads,
                                               kMaxComputeThreads));
  // A device, FIFO or directory as the output is refused before any work (GgufWriter::Begin
  // checks again when it creates the temporary).
  ESTREAM_RETURN_IF_ERROR(ResolveOutputPath(out_path, "the packed model").status());
  ESTREAM_ASSIGN_OR_RETURN(SourceExperts src, FindSourceExperts(in));
  {
    std::error_code ec;
    if (std::filesystem::equivalent(in.path(), out_path, ec))
      return Status::InvalidArgument(fmt::format("{}: the output is the input file; give another -o path", out_path));
  }

  // Permutations: only for blocks with experts, each a bijection of 0..n_expert-1.
  std::vector<std::vector<int32_t>> perms(src.layers.size());
  for (const auto& [layer, perm] : options.permutations) {
    size_t i = 0;
    while (i < src.layers.size() && src.layers[i].layer != layer) ++i;
    if (i == src.layers.size())
      return Status::InvalidArgument(fmt::format("expert permutation for layer {}: {} has no experts in that layer",
                                                 layer, in.path()));
    if (perm.size() != static_cast<size_t>(src.n_expert))
      return Status::InvalidArgument(fmt::format("expert permutation for layer {}: {} entries, the model has {} experts",
                                                 layer, perm.size(), src.n_expert));
    std::vector<bool> seen(perm.size(), false);
    for (size_t p = 0; p < perm.size(); ++p) {
      if (perm[p] < 0 || perm[p] >= src.n_expert || seen[static_cast<size_t>(perm[p])])
        return Status::InvalidArgument(fmt::format("expert permutation for layer {}: entry {} = {} makes it not a "
                                                   "permutation of 0..{}", layer, p, perm[p], src.n_expert - 1));
      seen[static_cast<size_t>(perm[p])] = true;
    }
    perms[i] = perm;
  }

  std::vector<RecordLayout> layouts;
  for (const SourceExpertLayer& L : src.layers) layouts.push_back(MakeRecordLayout(src, L));

  // ---- metadata: the source's keys, then ours ----
  std::vector<GgufKv> kvs;
  bool has_alignment = false;
  for (const GgufKv& kv : in.kvs()) {
    // Stray estream.* keys of an unpacked source would describe a layout that is not there.
    if (kv.key.rfind("estream.", 0) == 0) continue;
    if (kv.key == "general.alignment") {
      kvs.push_back({kv.key, GgufValue::U32(kPackedRecordAlignment)});
      has_alignment = true;
    } else {
      kvs.push_back(kv);
    }
  }
  if (!has_alignment) kvs.push_back({"general.alignment", GgufValue::U32(kPackedRecordAlignment)});
  auto u32 = [&kvs](const char* key, uint32_t v) { kvs.push_back({key, GgufValue::U32(v)}); };
  u32(packed_keys::kLayoutVersion, kPackedLayoutVersion);
  u32(packed_keys::kKernelPackVersion, static_cast<uint32_t>(kernels::kPackLayoutVersion));
  u32(packed_keys::kRecordAlignment, kPackedRecordAlignment);
  u32(packed_keys::kPartAlignment, kPackedPartAlignment);
  u32(packed_keys::kNEmbd, static_cast<uint32_t>(src.n_embd));
  u32(packed_keys::kNFf, static_cast<uint32_t>(src.n_ff_expert));
  u32(packed_keys::kNExpert, static_cast<uint32_t>(src.n_expert));
  {
    std::vector<GgufValue> blocks, rec, types, lays, offs, bytes;
    for (size_t i = 0; i < src.layers.size(); ++i) {
      blocks.push_back(GgufValue::I32(src.layers[i].layer));
      rec.push_back(GgufValue::U64(layouts[i].record_bytes));
      for (int p = 0; p < 3; ++p) {
        types.push_back(GgufValue::U32(static_cast<uint32_t>(src.layers[i].types[p])));
        lays.push_back(GgufValue::U32(PartLayoutCode(PackedPartLayout(src.layers[i].types[p]))));
        offs.push_back(GgufValue::U64(layouts[i].offsets[p]));
        bytes.push_back(GgufValue::U64(layouts[i].bytes[p]));
      }
    }
    kvs.push_back({packed_keys::kLayers, GgufValue::Array(GgufType::kI32, std::move(blocks))});
    kvs.push_back({packed_keys::kRecordBytes, GgufValue::Array(GgufType::kU64, std::move(rec))});
    kvs.push_back({packed_keys::kPartTypes, GgufValue::Array(GgufType::kU32, std::move(types))});
    kvs.push_back({packed_keys::kPartLayouts, GgufValue::Array(GgufType::kU32, std::move(lays))});
    kvs.push_back({packed_keys::kPartOffsets, GgufValue::Array(GgufType::kU64, std::move(offs))});
    kvs.push_back({packed_keys::kPartBytes, GgufValue::Array(GgufType::kU64, std::move(bytes))});
  }
  std::vector<std::vector<uint64_t>> checksums(src.layers.size(), std::vector<uint64_t>(static_cast<size_t>(src.n_expert), 0));
  for (size_t i = 0; i < src.layers.size(); ++i) {
    if (!perms[i].empty())
      kvs.push_back({packed_keys::Permutation(src.layers[i].layer), GgufValue::I32Array(perms[i])});
    else
      for (int e = 0; e < src.n_expert; ++e) perms[i].push_back(e);
    // Placeholder zeros, filled in by PatchChecksums once the records are written.
    kvs.push_back({packed_keys::Checksums(src.layers[i].layer),
                   GgufValue::Array(GgufType::kU64, std::vector<GgufValue>(static_cast<size_t>(src.n_expert),
                                                                           GgufValue::U64(0)))});
  }

  // Room for later metadata (estream profile): the LAST key, so that io::UpdateMetadata can
  // rewrite the header in place without moving the tensor data (io/metadata_update.h).
  kvs.push_back({kHeaderReserveKey, HeaderReserveValue()});

  // ---- tensors: the source's order; each block's region takes the place of its first expert tensor ----
  std::unordered_map<std::string, size_t> expert_tensor_layer;  // name -> index in src.layers
  for (size_t i = 0; i < src.layers.size(); ++i)
    for (int p = 0; p < 3; ++p)
      for (const GgufTensorInfo* t : src.layers[i].tensors[p]) expert_tensor_layer[t->name] = i;
  struct Item {
    const GgufTensorInfo* dense = nullptr;  // else a region
    size_t layer = 0;
  };
  std::vector<Item> items;
  std::vector<bool> placed(src.layers.size(), false);
  PackStats stats;
  uint64_t bytes_total = 0;
  for (const GgufTensorInfo& t : in.tensors()) {
    bytes_total += t.n_bytes;
    auto it = expert_tensor_layer.find(t.name);
    if (it == expert_tensor_layer.end()) {
      items.push_back({&t, 0});
      stats.dense_bytes += t.n_bytes;
    } else if (!placed[it->second]) {
      placed[it->second] = true;
      items.push_back({nullptr, it->second});
    }
  }

  GgufWriter writer(3, kPackedRecordAlignment);
  std::vector<ChecksumSlot> slots;
  {
    const std::unordered_map<std::string, uint64_t> positions = KeyPositions(kvs);
    for (size_t i = 0; i < src.layers.size(); ++i) {
      const std::string key = packed_keys::Checksums(src.layers[i].layer);
      slots.push_back({key, positions.at(key), &checksums[i]});
    }
  }
  // Moved, not copied: the tokenizer arrays of a large vocabulary take tens of MB as GgufValues.
  for (GgufKv& kv : kvs) writer.AddKv(std::move(kv.key), std::move(kv.value));
  kvs = {};
  for (const Item& item : items) {
    if (item.dense != nullptr) {
      std::vector<int64_t> dims(item.dense->dims, item.dense->dims + item.dense->n_dims);
      ESTREAM_RETURN_IF_ERROR(writer.AddTensor(item.dense->name, item.dense->type, dims));
    } else {
      const SourceExpertLayer& L = src.layers[item.layer];
      ESTREAM_RETURN_IF_ERROR(writer.AddTensor(packed_keys::RegionTensor(L.layer), QuantType::kI8,
                                               {static_cast<int64_t>(layouts[item.layer].record_bytes), src.n_expert}));
    }
  }

  // Written to "<out>.tmp.<pid>" (GgufWriter), renamed to out_path by Finish.
  if (Status st = writer.Begin(out_path); !st.ok())
    return Status(st.code(), fmt::format("{}: cannot write the packed model: {}", out_path, st.message()));

  // ---- data ----
  uint64_t max_record = 0, max_src = 0;
  for (size_t i = 0; i < src.layers.size(); ++i) {
    max_record = std::max(max_record, layouts[i].record_bytes);
    for (int p = 0; p < 3; ++p)
      if (kernels::CanRepack(src.layers[i].types[p]))
        max_src = std::max<uint64_t>(max_src, layouts[i].rows[p] * RowBytes(src.layers[i].types[p],
                                                                            static_cast<int64_t>(layouts[i].cols[p])));
  }
  const size_t buffer_bytes = std::max<uint64_t>(max_record, kCopyChunkBytes);
  AlignedPtr<uint8_t> source = AllocAligned<uint8_t>(std::max<uint64_t>(max_src, 64), 64);
  AlignedPtr<uint8_t> buffers[2] = {AllocAligned<uint8_t>(buffer_bytes, kPackedRecordAlignment),
                                    AllocAligned<uint8_t>(buffer_bytes, kPackedRecordAlignment)};
  if (!source || !buffers[0] || !buffers[1])
    return Status::ResourceExhausted(fmt::format("estream pack: cannot allocate 2 x {} + {} bytes of buffers",
                                                 buffer_bytes, max_src));
  ScopedOmpThreads omp_threads(std::max(1, options.threads));
  WriteBehind write_behind(&writer, {buffers[0].get(), buffers[1].get()});

  PackProgress progress;
  progress.bytes_total = bytes_total;
  auto report = [&](int layer) {
    if (!options.progress) return;
    progress.layer = layer;
    progress.seconds = timer.Seconds();
    options.progress(progress);
  };

  for (const Item& item : items) {
    if (item.dense != nullptr) {
      const GgufTensorInfo& t = *item.dense;
      for (uint64_t off = 0; off < t.n_bytes; off += kCopyChunkBytes) {
        const uint64_t n = std::min<uint64_t>(kCopyChunkBytes, t.n_bytes - off);
        ESTREAM_ASSIGN_OR_RETURN(uint8_t* chunk, write_behind.Acquire());
        ESTREAM_RETURN_IF_ERROR(in.ReadTensor(t, off, chunk, n));
        write_behind.Submit(chunk, n);
        progress.bytes_done += n;
        report(-1);
      }
      continue;
    }
    const SourceExpertLayer& L = src.layers[item.layer];
    const RecordLayout& R = layouts[item.layer];
    for (int pos = 0; pos < src.n_expert; ++pos) {
      ESTREAM_ASSIGN_OR_RETURN(uint8_t* rec, write_behind.Acquire());
      ZeroGaps(R, rec);
      const int e = perms[item.layer][static_cast<size_t>(pos)];
      for (int p = 0; p < 3; ++p) {
        const int64_t n = static_cast<int64_t>(R.rows[p]), k = static_cast<int64_t>(R.cols[p]);
        const uint64_t src_bytes = R.rows[p] * RowBytes(L.types[p], k);
        const GgufTensorInfo& t = L.per_expert ? *L.tensors[p][static_cast<size_t>(e)] : *L.tensors[p][0];
        const uint64_t src_off = L.per_expert ? 0 : static_cast<uint64_t>(e) * src_bytes;
        if (kernels::CanRepack(L.types[p])) {
          ESTREAM_RETURN_IF_ERROR(in.ReadTensor(t, src_off, source.get(), src_bytes));
          kernels::RepackWeights(L.types[p], source.get(), n, k, rec + R.offsets[p]);
        } else {
          ESTREAM_RETURN_IF_ERROR(in.ReadTensor(t, src_off, rec + R.offsets[p], src_bytes));
        }
        progress.bytes_done += src_bytes;
      }
      checksums[item.layer][static_cast<size_t>(pos)] = RecordChecksum(rec, R.payload);
      write_behind.Submit(rec, R.record_bytes);
      stats.records += 1;
      report(L.layer);
    }
    stats.layers += 1;
    stats.record_bytes += R.record_bytes * static_cast<uint64_t>(src.n_expert);
  }
  ESTREAM_RETURN_IF_ERROR(write_behind.Close());
  // The checksums go into the header once every record is written, before the magic makes the
  // file a GGUF and the rename puts it in place.
  ESTREAM_RETURN_IF_ERROR(writer.Finish([&](int fd) { return PatchChecksums(fd, out_path, slots); }));
  stats.output_bytes = writer.ExpectedFileSize();

  stats.input_bytes = in.file_size();
  stats.seconds = timer.Seconds();
  return stats;
}

Result<ExpertPermutations> ReadPermutationFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return Status::IOError(fmt::format("{}: cannot open the permutation file: {}", path, std::strerror(errno)));
  std::stringstream text;
  text << f.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::InvalidArgument(fmt::format("{}: not a JSON object of layer index -> array of expert ids, "
                                               "e.g. {{\"0\": [3, 0, 1, 2]}}", path));
  ExpertPermutations out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    char* end = nullptr;
    const long layer = std::strtol(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || layer < 0 || layer > INT32_MAX)
      return Status::InvalidArgument(fmt::format("{}: key \"{}\" is not a layer index", path, key));
    if (!it.value().is_array())
      return Status::InvalidArgument(fmt::format("{}: value of \"{}\" is not an array of expert ids", path, key));
    std::vector<int32_t> perm;
    for (const nlohmann::json& v : it.value()) {
      if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
        return Status::InvalidArgument(fmt::format("{}: layer \"{}\": {} is not an expert id", path, key, v.dump()));
      perm.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    out[static_cast<int>(layer)] = std::move(perm);
  }
  return out;
}

}  // namespace estream::io
