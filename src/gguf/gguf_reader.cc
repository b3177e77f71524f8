// GgufFile: parsing and validation of GGUF v2/v3 (format at the top of gguf.h).
//
// The parser reads through a Cursor that either points into memory (mmap or FromMemory) or
// reads the file with pread through a small window (GgufOpenOptions.mmap = false). Every count
// and length is checked against the bytes that remain before anything is allocated from it, so
// a hostile file can at most make us allocate in proportion to its own size.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <unordered_map>

#include <fmt/format.h>

#include "base/file_signals.h"
#include "base/file_type.h"
#include "gguf/gguf.h"

namespace estream {

struct GgufFile::Index {
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, size_t, Hash, std::equal_to<>> kv;
  std::unordered_map<std::string, size_t, Hash, std::equal_to<>> tensor;
};

namespace {

// Smallest encodings, used to bound counts by the bytes left in the file.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                // key length, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name length, n_dims, 1 dim, type, offset
constexpr int kMaxArrayDepth = 8;                          // nested arrays deeper than this are refused
constexpr size_t kReadWindow = 1 << 20;                    // pread window of the non-mmap parser

std::string Errno() { return std::strerror(errno); }

}  // namespace

namespace gguf_internal {

// Reads [pos, pos + n) of a file image, from memory or with pread. Failures: not enough bytes
// (returns false) or an I/O error (returns false and sets io_error()).
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  Cursor(int fd, uint64_t size) : fd_(fd), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  uint64_t remaining() const { return size_ - pos_; }
  const std::string& io_error() const { return io_error_; }

  bool Read(void* dst, uint64_t n) {
    if (n > remaining()) return false;
    if (data_ != nullptr) {
      if (n > 0) std::memcpy(dst, data_ + pos_, n);
    } else if (!ReadFd(dst, n)) {
      return false;
    }
    pos_ += n;
    return true;
  }
  template <typename T>
  bool ReadPod(T* v) { return Read(v, sizeof(T)); }

 private:
  bool ReadFd(void* dst, uint64_t n) {
    if (pos_ >= win_start_ && pos_ + n <= win_start_ + window_.size()) {
      std::memcpy(dst, window_.data() + (pos_ - win_start_), n);
      return true;
    }
    if (n >= kReadWindow) return PreadAll(static_cast<uint8_t*>(dst), n, pos_);
    const uint64_t fill = std::min<uint64_t>(kReadWindow, size_ - pos_);
    window_.resize(fill);
    win_start_ = pos_;
    if (!PreadAll(window_.data(), fill, pos_)) {
      window_.clear();
      return false;
    }
    std::memcpy(dst, window_.data(), n);
    return true;
  }
  bool PreadAll(uint8_t* dst, uint64_t n, uint64_t off) {
    while (n > 0) {
      ssize_t r = ::pread(fd_, dst, std::min<uint64_t>(n, 1u << 30), static_cast<off_t>(off));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        io_error_ = r < 0 ? Errno() : "unexpected end of file (was the file truncated while open?)";
        return false;
      }
      dst += r;
      off += static_cast<uint64_t>(r);
      n -= static_cast<uint64_t>(r);
    }
    return true;
  }

  const uint8_t* data_ = nullptr;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t pos_ = 0;
  std::vector<uint8_t> window_;
  uint64_t win_start_ = 0;
  std::string io_error_;
};

}  // namespace gguf_internal

namespace {

using gguf_internal::Cursor;

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Whether the bytes at the cursor parse as a tensor info (a short printable name, 1..4 non-zero
// dims, a known type, an aligned offset); its name in `name`. Consumes what it reads.
bool LooksLikeTensorInfo(Cursor& cur, uint32_t alignment, std::string* name) {
  uint64_t len = 0;
  if (!cur.ReadPod(&len) || len == 0 || len > 256) return false;
  name->assign(len, '\0');
  if (!cur.Read(name->data(), len)) return false;
  for (const unsigned char ch : *name)
    if (ch <= ' ' || ch >= 0x7f) return false;
  uint32_t n_dims = 0;
  if (!cur.ReadPod(&n_dims) || n_dims < 1 || n_dims > kGgufMaxDims) return false;
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t dim = 0;
    if (!cur.ReadPod(&dim) || dim == 0 || dim > (uint64_t{1} << 40)) return false;
  }
  uint32_t type = 0;
  uint64_t offset = 0;
  return cur.ReadPod(&type) && GetTypeTraits(type) != nullptr && cur.ReadPod(&offset) && offset % alignment == 0;
}

bool IsKnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kF64); }

// Fixed encoded size of a scalar value type (0 for string and array).
uint64_t ScalarBytes(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    case GgufType::kString: case GgufType::kArray: return 0;
  }
  return 0;
}

// Smallest encoding of one element of type t (bounds array counts).
uint64_t MinElemBytes(GgufType t) {
  if (t == GgufType::kString) return 8;
  if (t == GgufType::kArray) return 4 + 8;
  return ScalarBytes(t);
}

std::string KnownTensorTypes() {
  std::string out;
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits* tr = GetTypeTraits(id);
    if (tr == nullptr) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{}={}", id, tr->name);
  }
  return out;
}

std::string Quote(std::string_view s) {
  // Names come from the file: keep messages one printable line.
  std::string out = "'";
  size_t n = 0;
  for (char c : s) {
    if (++n > 200) {
      out += "...";
      break;
    }
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out + "'";
}

class Parser {
 public:
  Parser(const std::string& name, Cursor& cur) : name_(name), cur_(cur) {}

  Status Corrupt(uint64_t at, std::string_view field, std::string_view what) const {
    return Status::Corruption(fmt::format("{}: {} (at byte {}): {}", name_, field, at, what));
  }
  // `need` bytes at `at` are not there: an I/O error, or the file ends too early.
  Status Truncated(uint64_t at, std::string_view field, uint64_t need) const {
    if (!cur_.io_error().empty())
      return Status::IOError(fmt::format("{}: reading {} at byte {}: {}", name_, field, at, cur_.io_error()));
    return Corrupt(at, field,
                   fmt::format("needs {} bytes but the file ends at byte {} (truncated file?)", need,
                               cur_.size()));
  }

  template <typename T>
  Status Pod(T* v, std::string_view field) {
    const uint64_t at = cur_.pos();
    if (!cur_.ReadPod(v)) return Truncated(at, field, sizeof(T));
    return Status::Ok();
  }
  // A string: u64 length, then the bytes. The length is checked against the file first.
  Status String(std::string* s, std::string_view field) {
    const uint64_t at = cur_.pos();
    uint64_t len = 0;
    if (!cur_.ReadPod(&len)) return Truncated(at, field, 8);
    if (len > cur_.remaining())
      return Corrupt(at, field,
                     fmt::format("string length {} runs past end of file ({} bytes left after the length)",
                                 len, cur_.remaining()));
    s->resize(len);
    if (!cur_.Read(s->data(), len)) return Truncated(at + 8, field, len);
    return Status::Ok();
  }

  // Parses one value of type t (already validated as known) into *v.
  Status Value(GgufType t, GgufValue* v, const std::string& field, int depth) {
    v->type = t;
    const uint64_t at = cur_.pos();
    switch (t) {
      case GgufType::kU8: { uint8_t x{}; ESTREAM_RETURN_IF_ERROR(Pod(&x, field)); v->u = x; break; }
      case GgufType::kI8: { int8_t x{}; ESTREAM_RETURN_IF_ERROR(Pod(&x, field)); v->i = x; break; }
      case GgufType::kU16: { uint16_t x{}; ESTREAM_RETURN_IF_ERROR(Pod(&x, field)); v->u = x; break; }
      case GgufType::kI16: { int16_t x{}; ESTREAM_RETURN_IF_ERROR(Pod(&x, field)); v->i = x; break; }
      case GgufType::kU32: { uint32_t x{}; ESTREAM_RETURN_IF_ERROR(Pod(&x, field)); v->u = x; break; }
      case GgufType::kI32: { int32_t x{}; ESTREAM_RETURN_IF_ERROR(Pod(&x, field)); v->i = x; break; }
      case GgufType::kU64: { uint64_t x{}; ESTREAM_RETURN_IF_ERROR(Pod(&x, field)); v->u = x; break; }
      case GgufType::kI64: { int64_t x{}; ESTREAM_RETURN_IF_ERROR(Pod(&x, field)); v->i = x; break; }
      case GgufType::kF32: { float x{}; ESTREAM_RETURN_IF_ERROR(Pod(&x, field)); v->f = x; break; }
      case GgufType::kF64: { double x{}; ESTREAM_RETURN_IF_ERROR(Pod(&x, field)); v->f = x; break; }
      case GgufType::kBool: {
        uint8_t x{};
        ESTREAM_RETURN_IF_ERROR(Pod(&x, field));
        if (x > 1) return Corrupt(at, field, fmt::format("bool value {} (must be 0 or 1)", x));
        v->u = x;
        break;
      }
      case GgufType::kString: ESTREAM_RETURN_IF_ERROR(String(&v->str, field)); break;
      case GgufType::kArray: {
        if (depth >= kMaxArrayDepth)
          return Corrupt(at, field, fmt::format("arrays nested deeper than {} levels", kMaxArrayDepth));
        uint32_t elem = 0;
        ESTREAM_RETURN_IF_ERROR(Pod(&elem, field + " array element type"));
        if (!IsKnownValueType(elem))
          return Status::NotSupported(fmt::format(
              "{}: {} array element type (at byte {}): unknown value type {} (known: 0..12)", name_, field,
              at, elem));
        v->elem_type = static_cast<GgufType>(elem);
        const uint64_t count_at = cur_.pos();
        uint64_t count = 0;
        ESTREAM_RETURN_IF_ERROR(Pod(&count, field + " array count"));
        const uint64_t min_bytes = MinElemBytes(v->elem_type);
        if (count > cur_.remaining() / min_bytes)
          return Corrupt(count_at, field + " array count",
                         fmt::format("{} elements of type {} (at least {} bytes each) cannot fit in the {} "
                                     "bytes left in the file",
                                     count, GgufTypeName(v->elem_type), min_bytes, cur_.remaining()));
        v->array.resize(count);
        for (uint64_t k = 0; k < count; ++k) {
          GgufValue& e = v->array[k];
          if (v->elem_type == GgufType::kString || v->elem_type == GgufType::kArray ||
              v->elem_type == GgufType::kBool) {
            ESTREAM_RETURN_IF_ERROR(Value(v->elem_type, &e, fmt::format("{}[{}]", field, k), depth + 1));
          } else {
            // Fast path for numeric arrays: the element field name is only built on failure.
            Status s = Value(v->elem_type, &e, field, depth + 1);
            if (!s.ok()) return Value(v->elem_type, &e, fmt::format("{}[{}]", field, k), depth + 1);
          }
        }
        break;
      }
    }
    return Status::Ok();
  }

 private:
  const std::string& name_;
  Cursor& cur_;
};

}  // namespace

GgufFile::~GgufFile() {
  UnregisterMappedFile(mapped_slot_);
  if (owns_map_ && map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_size_);
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path, GgufOpenOptions options) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever; it is
  // refused just below, and cleared for the regular file.
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (f->fd_ < 0) return Status::IOError(fmt::format("{}: cannot open for reading: {}", path, Errno()));
  ESTREAM_ASSIGN_OR_RETURN(f->file_size_, RegularFileSize(f->fd_, path));
  if (options.mmap && f->file_size_ > 0) {
    void* p = ::mmap(nullptr, f->file_size_, PROT_READ, MAP_SHARED, f->fd_, 0);
    if (p == MAP_FAILED)
      return Status::IOError(fmt::format("{}: cannot mmap {} bytes: {} (try GgufOpenOptions.mmap = false)",
                                         path, f->file_size_, Errno()));
    f->map_ = static_cast<const uint8_t*>(p);
    f->map_size_ = f->file_size_;
    f->owns_map_ = true;
    // A SIGBUS in the mapping (the file truncated or unreadable while in use) is then reported
    // as such by the CLI's handler (base/file_signals.h).
    f->mapped_slot_ = RegisterMappedFile(f->map_, f->map_size_, path);
    Cursor cur(f->map_, f->file_size_);
    ESTREAM_RETURN_IF_ERROR(f->Parse(cur));
  } else {
    Cursor cur(f->fd_, f->file_size_);
    ESTREAM_RETURN_IF_ERROR(f->Parse(cur));
  }
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::FromMemory(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  f->file_size_ = size;
  f->map_ = data;
  f->map_size_ = size;
  Cursor cur(data, size);
  ESTREAM_RETURN_IF_ERROR(f->Parse(cur));
  return f;
}

Status GgufFile::Parse(gguf_internal::Cursor& cur) {
  Parser p(path_, cur);
  index_ = std::make_unique<Index>();

  // ---- header ----
  uint32_t magic = 0;
  if (cur.size() < 4)
    return p.Corrupt(0, "header.magic",
                     fmt::format("file is {} bytes, too short for a GGUF header (24 bytes)", cur.size()));
  ESTREAM_RETURN_IF_ERROR(p.Pod(&magic, "header.magic"));
  if (magic != kGgufMagic)
    return p.Corrupt(0, "header.magic",
                     fmt::format("bad magic 0x{:08x}, expected 0x{:08x} (\"GGUF\"): not a GGUF file{}", magic,
                                 kGgufMagic,
                                 magic == 0 ? " (a zero magic: an output estream did not finish writing, or a "
                                              "header update that was interrupted)"
                                            : ""));
  ESTREAM_RETURN_IF_ERROR(p.Pod(&version_, "header.version"));
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    std::string hint = version_ == 1 ? "GGUF v1 is not supported: re-convert the model with a current llama.cpp"
                       : (swapped == 2 || swapped == 3) ? "this looks like a big-endian GGUF file, which is not supported"
                                                        : "estream reads GGUF versions 2 and 3";
    return Status::NotSupported(
        fmt::format("{}: header.version (at byte 4): version {}: {}", path_, version_, hint));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  ESTREAM_RETURN_IF_ERROR(p.Pod(&n_tensors, "header.n_tensors"));
  ESTREAM_RETURN_IF_ERROR(p.Pod(&n_kv, "header.n_kv"));
  if (n_kv > cur.remaining() / kMinKvBytes)
    return p.Corrupt(16, "header.n_kv",
                     fmt::format("{} key/value pairs (at least {} bytes each) cannot fit in the {} bytes left "
                                 "in the file",
                                 n_kv, kMinKvBytes, cur.remaining()));
  if (n_tensors > (cur.remaining() - n_kv * kMinKvBytes) / kMinTensorInfoBytes)
    return p.Corrupt(8, "header.n_tensors",
                     fmt::format("{} tensor infos (at least {} bytes each) cannot fit in the {} bytes left in "
                                 "the file",
                                 n_tensors, kMinTensorInfoBytes, cur.remaining()));

  // ---- key/value pairs ----
  kvs_.resize(n_kv);
  uint64_t alignment_at = 0;
  for (uint64_t k = 0; k < n_kv; ++k) {
    GgufKv& kv = kvs_[k];
    const uint64_t key_at = cur.pos();
    ESTREAM_RETURN_IF_ERROR(p.String(&kv.key, fmt::format("kv[{}].key", k)));
    const std::string field = fmt::format("kv[{}] {}", k, Quote(kv.key));
    auto [it, inserted] = index_->kv.emplace(kv.key, k);
    if (!inserted)
      return p.Corrupt(key_at, field, fmt::format("duplicate key (first defined by kv[{}])", it->second));
    const uint64_t type_at = cur.pos();
    uint32_t type = 0;
    ESTREAM_RETURN_IF_ERROR(p.Pod(&type, field + " value type"));
    if (!IsKnownValueType(type))
      return Status::NotSupported(fmt::format(
          "{}: {} value type (at byte {}): unknown value type {} (known: 0..12 = u8, i8, u16, i16, u32, i32, "
          "f32, bool, string, array, u64, i64, f64)",
          path_, field, type_at, type));
    if (kv.key == "general.alignment") alignment_at = cur.pos();
    ESTREAM_RETURN_IF_ERROR(p.Value(static_cast<GgufType>(type), &kv.value, field, 0));
  }
  if (const GgufValue* a = Find("general.alignment")) {
    if (a->type != GgufType::kU32)
      return p.Corrupt(alignment_at, "general.alignment",
                       fmt::format("has type {}, must be u32", GgufTypeName(a->type)));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      return p.Corrupt(alignment_at, "general.alignment", fmt::format("{} is not a power of two", a->u));
    alignment_ = static_cast<uint32_t>(a->u);
  }

  // ---- tensor infos ----
  tensors_.resize(n_tensors);
  std::vector<uint64_t> info_at(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo& t = tensors_[k];
    info_at[k] = cur.pos();
    ESTREAM_RETURN_IF_ERROR(p.String(&t.name, fmt::format("tensor[{}].name", k)));
    const std::string field = fmt::format("tensor {}", Quote(t.name));
    const uint64_t at = info_at[k];
    auto bad = [&](std::string_view what) {
      return Status::Corruption(fmt::format("{}: {} (info at byte {}): {}", path_, field, at, what));
    };
    auto [it, inserted] = index_->tensor.emplace(t.name, k);
    if (!inserted) return bad(fmt::format("duplicate tensor name (first defined by tensor[{}])", it->second));
    uint32_t n_dims = 0;
    ESTREAM_RETURN_IF_ERROR(p.Pod(&n_dims, field + " n_dims"));
    if (n_dims < 1 || n_dims > kGgufMaxDims)
      return bad(fmt::format("n_dims {} (must be 1..{})", n_dims, kGgufMaxDims));
    t.n_dims = static_cast<int>(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      ESTREAM_RETURN_IF_ERROR(p.Pod(&dim, field + " dims"));
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return bad(fmt::format("dims[{}] = {} does not fit in int64", d, dim));
      t.dims[d] = static_cast<int64_t>(dim);
    }
    const uint64_t type_at = cur.pos();
    uint32_t raw_type = 0;
    ESTREAM_RETURN_IF_ERROR(p.Pod(&raw_type, field + " type"));
    const TypeTraits* tr = GetTypeTraits(raw_type);
    if (tr == nullptr)
      return Status::NotSupported(
          fmt::format("{}: {} type (at byte {}): unknown tensor type {} (known: {}); {}", path_, field, type_at,
                      raw_type, KnownTensorTypes(), UnsupportedTypeAdvice(raw_type)));
    t.type = tr->type;
    ESTREAM_RETURN_IF_ERROR(p.Pod(&t.offset, field + " offset"));

    int64_t n_el = 1;
    for (int d = 0; d < t.n_dims; ++d) {
      if (__builtin_mul_overflow(n_el, t.dims[d], &n_el))
        return bad(fmt::format("element count of shape {} overflows int64", t.ShapeString()));
    }
    if (t.dims[0] % tr->block_size != 0)
      return bad(fmt::format("row length dims[0] = {} is not a multiple of the {} block size {}", t.dims[0],
                             tr->name, tr->block_size));
    t.n_elements = static_cast<uint64_t>(n_el);
    uint64_t n_bytes = 0;
    if (__builtin_mul_overflow(t.n_elements / tr->block_size, uint64_t{tr->type_size}, &n_bytes) ||
        n_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return bad(fmt::format("byte size of shape {} of type {} overflows", t.ShapeString(), tr->name));
    t.n_bytes = n_bytes;
  }

  // ---- padding, then the data section ----
  data_offset_ = AlignUp(cur.pos(), alignment_);
  // Writers pad with zeros. Bytes that are not zero there are usually the tail of a tensor info
  // that header.n_tensors leaves out: the data section would start too early, every tensor would
  // be read shifted, and the last tensor (output.weight, then silently "tied") would be lost.
  {
    const uint64_t pad_at = cur.pos();
    const uint64_t pad_end = std::min<uint64_t>(data_offset_, cur.size());
    uint8_t chunk[256];
    for (uint64_t at = pad_at; at < pad_end;) {
      const uint64_t n = std::min<uint64_t>(sizeof(chunk), pad_end - at);
      if (!cur.Read(chunk, n)) return p.Truncated(at, "header padding", n);
      for (uint64_t i = 0; i < n; ++i)
        if (chunk[i] != 0)
          return p.Corrupt(at + i, "header padding",
                           fmt::format("byte {} between the last tensor info (ends at byte {}) and the data section "
                                       "(byte {}) is not zero: header.n_tensors = {} may be lower than the number "
                                       "of tensor infos; the file is damaged",
                                       at + i, pad_at, data_offset_, n_tensors));
      at += n;
    }
  }
  for (uint64_t k = 0; k < n_tensors; ++k) {
    const GgufTensorInfo& t = tensors_[k];
    auto bad = [&](std::string_view what) {
      return Status::Corruption(
          fmt::format("{}: tensor {} (info at byte {}): {}", path_, Quote(t.name), info_at[k], what));
    };
    if (t.offset % alignment_ != 0)
      return bad(fmt::format("data offset {} is not a multiple of the alignment {}", t.offset, alignment_));
    uint64_t start = 0, end = 0;
    if (__builtin_add_overflow(data_offset_, t.offset, &start) || __builtin_add_overflow(start, t.n_bytes, &end) ||
        end > file_size_)
      return bad(fmt::format("data offset {} + {} bytes runs past end of file (data section at byte {}, file "
                             "size {})",
                             t.offset, t.n_bytes, data_offset_, file_size_));
  }
  std::vector<uint64_t> order(n_tensors);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) {
    return tensors_[a].offset != tensors_[b].offset ? tensors_[a].offset < tensors_[b].offset : a < b;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = tensors_[order[k - 1]];
    const GgufTensorInfo& t = tensors_[order[k]];
    // Sorted, so t.offset >= prev.offset: the difference cannot wrap.
    if (prev.n_bytes > 0 && t.n_bytes > 0 && t.offset - prev.offset < prev.n_bytes)
      return Status::Corruption(fmt::format(
          "{}: tensor {} (info at byte {}): data [{}, {}) overlaps tensor {} data [{}, {})", path_,
          Quote(t.name), info_at[order[k]], t.offset, t.offset + t.n_bytes, Quote(prev.name), prev.offset,
          prev.offset + prev.n_bytes));
  }
  // header.n_tensors too low with the infos it counts ending on an alignment boundary: there is no
  // padding to show it, the data section would start at the first info left out. Writers end the
  // file within one alignment of the last tensor's data; more bytes than that, with a tensor info
  // where the data section starts, give it away.
  uint64_t data_end = 0;
  for (const GgufTensorInfo& t : tensors_) data_end = std::max(data_end, t.offset + t.n_bytes);
  std::string name;
  if (file_size_ - data_offset_ > AlignUp(data_end, alignment_) && cur.pos() == data_offset_ &&
      LooksLikeTensorInfo(cur, alignment_, &name))
    return p.Corrupt(8, "header.n_tensors",
                     fmt::format("{} is lower than the number of tensor infos: an info of tensor {} starts at byte "
                                 "{}, where the data section would begin, and the file runs {} bytes past the "
                                 "last tensor's data; the file is damaged",
                                 n_tensors, Quote(name), data_offset_,
                                 file_size_ - data_offset_ - data_end));
  return Status::Ok();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = index_->kv.find(key);
  return it == index_->kv.end() ? nullptr : &kvs_[it->second].value;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = index_->tensor.find(name);
  return it == index_->tensor.end() ? nullptr : &tensors_[it->second];
}

namespace {

bool IsUnsigned(GgufType t) {
  return t == GgufType::kU8 || t == GgufType::kU16 || t == GgufType::kU32 || t == GgufType::kU64;
}
bool IsSigned(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}

}  // namespace

Result<uint64_t> GgufFile::GetU64(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::Corruption(fmt::format("{}: key '{}' is missing", path_, key));
  if (IsUnsigned(v->type)) return v->u;
  if (IsSigned(v->type) && v->i >= 0) return static_cast<uint64_t>(v->i);
  if (IsSigned(v->type))
    return Status::Corruption(fmt::format("{}: key '{}' is {} (negative), expected an unsigned integer", path_,
                                          key, v->i));
  return Status::Corruption(
      fmt::format("{}: key '{}' has type {}, expected an integer", path_, key, GgufTypeName(v->type)));
}

Result<uint32_t> GgufFile::GetU32(std::string_view key) const {
  ESTREAM_ASSIGN_OR_RETURN(uint64_t v, GetU64(key));
  if (v > std::numeric_limits<uint32_t>::max())
    return Status::Corruption(fmt::format("{}: key '{}' is {}, too large for u32", path_, key, v));
  return static_cast<uint32_t>(v);
}

Result<float> GgufFile::GetF32(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::Corruption(fmt::format("{}: key '{}' is missing", path_, key));
  if (v->type == GgufType::kF32 || v->type == GgufType::kF64) return static_cast<float>(v->f);
  return Status::Corruption(
      fmt::format("{}: key '{}' has type {}, expected f32 or f64", path_, key, GgufTypeName(v->type)));
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::Corruption(fmt::format("{}: key '{}' is missing", path_, key));
  if (v->type == GgufType::kBool) return v->u != 0;
  return Status::Corruption(
      fmt::format("{}: key '{}' has type {}, expected bool", path_, key, GgufTypeName(v->type)));
}

Result<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::Corruption(fmt::format("{}: key '{}' is missing", path_, key));
  if (v->type == GgufType::kString) return v->str;
  return Status::Corruption(
      fmt::format("{}: key '{}' has type {}, expected string", path_, key, GgufTypeName(v->type)));
}

Result<uint32_t> GgufFile::GetU32Or(std::string_view key, uint32_t fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetU32(key);
}

Result<float> GgufFile::GetF32Or(std::string_view key, float fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetF32(key);
}

Result<bool> GgufFile::GetBoolOr(std::string_view key, bool fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetBool(key);
}

const uint8_t* GgufFile::TensorData(const GgufTensorInfo& t) const {
  if (map_ == nullptr) return nullptr;
  ESTREAM_DCHECK(&t >= tensors_.data() && &t < tensors_.data() + tensors_.size(),
                 "GgufFile::TensorData: tensor info of another file");
  return map_ + data_offset_ + t.offset;
}

Status GgufFile::ReadTensor(const GgufTensorInfo& t, uint64_t offset_in_tensor, void* dst, uint64_t size) const {
  if (offset_in_tensor > t.n_bytes || size > t.n_bytes - offset_in_tensor)
    return Status::InvalidArgument(fmt::format("{}: tensor '{}': read of [{}, +{}) is outside its {} bytes", path_,
                                               t.name, offset_in_tensor, size, t.n_bytes));
  const uint64_t off = data_offset_ + t.offset + offset_in_tensor;
  if (map_ != nullptr) {
    if (size > 0) std::memcpy(dst, map_ + off, size);
    return Status::Ok();
  }
  uint8_t* out = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < size) {
    ssize_t r = ::pread(fd_, out + done, std::min<uint64_t>(size - done, 1u << 30), static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return Status::IOError(fmt::format("{}: tensor '{}': read at byte {} failed: {}", path_, t.name, off + done,
                                         r < 0 ? Errno() : "unexpected end of file"));
    done += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

}  // namespace estream
