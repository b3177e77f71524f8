// GGUF reader and writer.
//
// ---- The GGUF format (versions 2 and 3; all integers little-endian) -------------------------
//
//   header:
//     u32  magic            "GGUF" = bytes 47 47 55 46 (0x46554747 read as u32)
//     u32  version          2 or 3 (version 1 used u32 counts and is not supported)
//     u64  n_tensors
//     u64  n_kv
//   n_kv key/value pairs:
//     string key            (u64 length, then that many bytes of UTF-8, no terminator)
//     u32    value_type     0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (1 byte, 0/1),
//                           8 string, 9 array, 10 u64, 11 i64, 12 f64
//     value                 the bytes of that type; an array is: u32 elem_type, u64 count,
//                           count elements (nested arrays are legal in the format)
//   n_tensors tensor infos:
//     string name
//     u32    n_dims         1..4
//     u64    dims[n_dims]   fastest-varying first: a weight [n_in, n_out] is n_out rows of n_in
//     u32    type           ggml type id (quant/types.h)
//     u64    offset         of the tensor's data, relative to the start of the data section;
//                           a multiple of the alignment
//   padding to `alignment`  (key "general.alignment" (u32), default 32)
//   data section            tensor data, each tensor at data_start + offset
//
// ---- Reader ---------------------------------------------------------------------------------
// GgufFile::Open validates everything before any of it is used:
//   - magic; version 2 or 3 (1 and big-endian files -> NotSupported);
//   - n_kv, n_tensors, array counts and string lengths bounded by the bytes left in the file
//     (each element's smallest encoding), so nothing is allocated from an unchecked count;
//   - value types 0..12 and tensor types known to quant/types.h (else NotSupported, listing them);
//     bools 0 or 1; arrays nested at most 8 deep;
//   - general.alignment, if present: u32, a power of two (default 32);
//   - per tensor: n_dims 1..4, dims >= 0 (0 is allowed, as in ggml) with element and byte counts
//     that do not overflow int64, dims[0] a multiple of the type's block size, offset a multiple
//     of the alignment, data inside the file, no two tensors' data overlapping;
//   - no duplicate keys, no duplicate tensor names.
// Any defect returns a one-line Status naming the file, the field and its byte offset, e.g.
//   "model.gguf: tensor 'blk.0.attn_q.weight' (info at byte 1234): data offset 999 + 4096 bytes
//    runs past end of file (data section at byte 1248, file size 2000)".
// Codes: IOError (open/stat/mmap/read), NotSupported (version, value or tensor type), Corruption
// (everything else). Trailing padding after the last tensor is not required.
// Tensor data is never copied: with GgufOpenOptions.mmap (default) the whole file is mapped
// read-only (MAP_SHARED) and only the header pages are touched by Open, so a 17 GB file opens in
// milliseconds; with mmap = false the header is parsed through a 1 MiB pread window and tensor
// bytes are read on demand by ReadTensor. (A file truncated by someone else while mapped makes
// later accesses fault: SIGBUS, as with any mapping; the mapping is registered with
// base/file_signals.h, so a program that installed its handlers reports that in one line and
// exits with kMappedFileErrorExitCode.) Metadata is parsed into GgufValues (about
// 100 bytes per array element), so the metadata's memory is proportional to its size on disk.
//
// Thread safety: a GgufFile is immutable after Open; all const methods may be called
// concurrently (ReadTensor uses pread, no shared file position). GgufWriter is single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "quant/types.h"

namespace estream {

namespace gguf_internal {
class Cursor;  // gguf_reader.cc: bounded reads from memory or with pread
}  // namespace gguf_internal

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF"
constexpr uint32_t kGgufDefaultAlignment = 32;
constexpr int kGgufMaxDims = 4;

enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* GgufTypeName(GgufType t);

// One metadata value. Scalars are kept widened (integers in i/u, floats in f); arrays keep their
// element type and hold scalars or strings (nested arrays are parsed into `array`).
struct GgufValue {
  GgufType type = GgufType::kU32;
  uint64_t u = 0;       // kU8, kU16, kU32, kU64, kBool
  int64_t i = 0;        // kI8, kI16, kI32, kI64
  double f = 0;         // kF32, kF64
  std::string str;      // kString
  GgufType elem_type = GgufType::kU32;  // kArray
  std::vector<GgufValue> array;         // kArray

  static GgufValue U32(uint32_t v);
  static GgufValue I32(int32_t v);
  static GgufValue U64(uint64_t v);
  static GgufValue F32(float v);
  static GgufValue Bool(bool v);
  static GgufValue String(std::string v);
  static GgufValue Of(GgufType t);  // zero value of a scalar type
  static GgufValue Array(GgufType elem, std::vector<GgufValue> elems);
  static GgufValue StringArray(const std::vector<std::string>& v);
  static GgufValue F32Array(const std::vector<float>& v);
  static GgufValue I32Array(const std::vector<int32_t>& v);
};

struct GgufKv {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  int n_dims = 0;
  int64_t dims[kGgufMaxDims] = {1, 1, 1, 1};  // fastest first; unused dims are 1
  QuantType type = QuantType::kF32;
  uint64_t offset = 0;      // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;

  int64_t ne(int d) const { return d < n_dims ? dims[d] : 1; }
  // "[2048, 1024, 64]"
  std::string ShapeString() const;
};

struct GgufOpenOptions {
  // Map the file (default). When false, the header is read with pread and tensor data on demand
  // with ReadTensor (TensorData returns nullptr).
  bool mmap = true;
};

class GgufFile {
 public:
  // Opens and validates `path`. Errors: IOError (cannot open/stat/map), Corruption (any
  // structural defect, with field and byte offset), NotSupported (version, value or tensor type).
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path, GgufOpenOptions options = {});
  // Parses an in-memory image (fuzzing, tests). `data` must outlive the returned object.
  // `name` is used in error messages.
  static Result<std::unique_ptr<GgufFile>> FromMemory(const uint8_t* data, size_t size,
                                                      const std::string& name = "<memory>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section

  const std::vector<GgufKv>& kvs() const { return kvs_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  // nullptr when absent.
  const GgufValue* Find(std::string_view key) const;
  const GgufTensorInfo* FindTensor(std::string_view name) const;

  // Typed getters: a Corruption Status naming the file and key when the key is missing or has an
  // incompatible type. Integer getters accept any integer type (signed or unsigned, any width)
  // whose value fits; bools are not integers.
  Result<uint64_t> GetU64(std::string_view key) const;
  Result<uint32_t> GetU32(std::string_view key) const;
  Result<float> GetF32(std::string_view key) const;  // accepts f32/f64
  Result<bool> GetBool(std::string_view key) const;
  Result<std::string> GetString(std::string_view key) const;
  // Defaults when absent (still an error if present with the wrong type).
  Result<uint32_t> GetU32Or(std::string_view key, uint32_t fallback) const;
  Result<float> GetF32Or(std::string_view key, float fallback) const;
  Result<bool> GetBoolOr(std::string_view key, bool fallback) const;

  // Pointer to a tensor's bytes (n_bytes long) in the mapping. nullptr if not mapped.
  const uint8_t* TensorData(const GgufTensorInfo& t) const;
  // Copies a tensor's bytes [offset_in_tensor, +size) into dst (pread or memcpy). InvalidArgument
  // if the range is outside the tensor; IOError if pread fails.
  Status ReadTensor(const GgufTensorInfo& t, uint64_t offset_in_tensor, void* dst, uint64_t size) const;

 private:
  GgufFile() = default;
  Status Parse(gguf_internal::Cursor& cur);

  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t file_size_ = 0;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensorInfo> tensors_;
  // Index maps for Find/FindTensor (name -> position).
  struct Index;
  std::unique_ptr<Index> index_;
  int fd_ = -1;
  const uint8_t* map_ = nullptr;  // whole-file mapping (or the FromMemory buffer)
  size_t map_size_ = 0;
  bool owns_map_ = false;
  int mapped_slot_ = -1;  // RegisterMappedFile's slot of the mapping (base/file_signals.h)
};

// Streams a GGUF file to disk tensor by tensor, without holding tensor data in memory.
// Usage: AddKv... AddTensor... (declares all tensors: name, type, dims) ; Begin(path) writes the
// header; then WriteTensorData for each tensor in declaration order (in one or more chunks, which
// may span tensor boundaries; zero-byte tensors are skipped); Finish() pads, writes the magic,
// fsyncs and renames the temporary file "<path>.tmp.<pid>" to `path` (and fsyncs the directory).
// Destination: Begin refuses a path that names a directory, a device, a FIFO or a socket (the
// rename would replace it) and follows a symbolic link to a regular file, whose target is
// replaced and whose directory holds the temporary (base/output_path.h).
// Unfinished files: the temporary's first 4 bytes (the magic) stay zero until Finish has written
// everything else, so a temporary left by a crash is refused by every GGUF reader ("bad magic"),
// and the temporary is registered with base/file_signals.h, so a process killed by SIGINT,
// SIGTERM or SIGHUP (in a program that installed the handlers) removes it.
// Offsets are assigned in declaration order, each aligned to `alignment`; the file ends padded to
// the alignment (as ggml writes it). An alignment other than 32 adds a general.alignment key.
// Errors: Begin on an unwritable path -> IOError naming the path, on a destination that is not a
// regular file (nor a link to one) -> InvalidArgument saying what it is; any failed write, too much
// data, or Finish before every tensor is complete -> an error, and the temporary file is removed
// at once; every later call returns that error. Destruction before Finish also removes it: a
// failure never leaves a partial file at `path` nor a temporary beside it.
// Speed: small writes are gathered in an 8 MiB buffer, chunks of 1 MiB or more go straight to
// write(2), so writing runs at disk speed.
class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3, uint32_t alignment = kGgufDefaultAlignment);
  ~GgufWriter();

  // A repeated key replaces the earlier value (GGUF forbids duplicates). REQUIRES: before Begin.
  // Integers are written truncated to the width of their type.
  void AddKv(std::string key, GgufValue value);
  // dims fastest first. Returns InvalidArgument for a duplicate name, bad dims or a row length
  // that is not a multiple of the type's block size.
  Status AddTensor(const std::string& name, QuantType type, const std::vector<int64_t>& dims);

  // InvalidArgument for a version other than 2/3, an alignment that is not a power of two, an
  // array whose elements are not all of its elem_type, or a general.alignment key that disagrees
  // with the writer's alignment; IOError if the temporary file cannot be created.
  Status Begin(const std::string& path);
  // Appends bytes of the current tensor; a tensor is complete after n_bytes have been written,
  // and the next call continues with the next declared tensor.
  Status WriteTensorData(const void* data, size_t size);
  // `before_magic`, when given, is called with the temporary's descriptor once every byte but the
  // magic is written (and flushed): for a caller that fills in header values it knows only at the
  // end (pack's checksums) with pwrite. Its error fails the write like any other.
  Status Finish(const std::function<Status(int fd)>& before_magic = {});

  // The temporary file's descriptor from a successful Begin until Finish or a failure, else -1:
  // for a caller that sets the new file's mode or owner (fchmod/fchown) before Finish renames it
  // into place. The writer keeps ownership: do not close it.
  int temp_fd() const;

  // Total size the file will have (valid after all AddKv/AddTensor calls).
  uint64_t ExpectedFileSize() const;
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint32_t version_;
  uint32_t alignment_;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensorInfo> tensors_;
};

// The header bytes (magic .. last tensor info, without the padding before the data section) of
// a GGUF file with these keys and tensor infos, their offsets as given: byte for byte what
// GgufWriter writes (general.alignment is added when absent and alignment != 32). For rewriting a
// header in place (io/metadata_update.h). InvalidArgument, naming the key, as GgufWriter::Begin
// for a bad version or alignment, an inhomogeneous array, or a general.alignment key that
// disagrees with `alignment`.
Result<std::string> SerializeGgufHeader(uint32_t version, uint32_t alignment, const std::vector<GgufKv>& kvs,
                                        const std::vector<GgufTensorInfo>& tensors);

}  // namespace estream
