// GgufWriter: streams a GGUF file to "<path>.tmp.<pid>" and renames it into place at Finish.
// The temporary's magic stays zero until every other byte is written, so an unfinished file is
// never taken for a GGUF, and it is registered with base/file_signals.h, so a killed process
// removes it.
//
// Small writes (the header, padding, tensor chunks below kDirectBytes) are gathered in one buffer
// and written in large chunks; larger tensor chunks bypass the buffer (no extra copy). Any failure closes and removes
// the temporary file, so a failed or abandoned writer never leaves anything behind.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

#include <fmt/format.h>

#include "base/file_signals.h"
#include "base/output_path.h"
#include "gguf/gguf.h"

namespace estream {

namespace {

constexpr size_t kBufferBytes = 8u << 20;
constexpr size_t kDirectBytes = 1u << 20;

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void PutString(std::string* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

// Checks that an array's elements all have its declared element type (recursively).
Status CheckValue(const std::string& key, const GgufValue& v) {
  if (static_cast<uint32_t>(v.type) > static_cast<uint32_t>(GgufType::kF64))
    return Status::InvalidArgument(fmt::format("GGUF key '{}': unknown value type {}", key,
                                               static_cast<uint32_t>(v.type)));
  if (v.type != GgufType::kArray) return Status::Ok();
  for (const GgufValue& e : v.array) {
    if (e.type != v.elem_type)
      return Status::InvalidArgument(fmt::format("GGUF key '{}': array of {} holds an element of type {}", key,
                                                 GgufTypeName(v.elem_type), GgufTypeName(e.type)));
    ESTREAM_RETURN_IF_ERROR(CheckValue(key, e));
  }
  return Status::Ok();
}

// Writes the payload of v (without its type tag). Integers are truncated to the width of the type.
void PutValue(std::string* out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::kU8: Put<uint8_t>(out, static_cast<uint8_t>(v.u)); break;
    case GgufType::kI8: Put<int8_t>(out, static_cast<int8_t>(v.i)); break;
    case GgufType::kU16: Put<uint16_t>(out, static_cast<uint16_t>(v.u)); break;
    case GgufType::kI16: Put<int16_t>(out, static_cast<int16_t>(v.i)); break;
    case GgufType::kU32: Put<uint32_t>(out, static_cast<uint32_t>(v.u)); break;
    case GgufType::kI32: Put<int32_t>(out, static_cast<int32_t>(v.i)); break;
    case GgufType::kU64: Put<uint64_t>(out, v.u); break;
    case GgufType::kI64: Put<int64_t>(out, v.i); break;
    case GgufType::kF32: Put<float>(out, static_cast<float>(v.f)); break;
    case GgufType::kF64: Put<double>(out, v.f); break;
    case GgufType::kBool: Put<uint8_t>(out, v.u != 0 ? 1 : 0); break;
    case GgufType::kString: PutString(out, v.str); break;
    case GgufType::kArray:
      Put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      Put<uint64_t>(out, v.array.size());
      for (const GgufValue& e : v.array) PutValue(out, e);
      break;
  }
}

std::string Errno() { return std::strerror(errno); }

}  // namespace

struct GgufWriter::Impl {
  enum class State { kDeclaring, kWriting, kDone, kFailed };
  State state = State::kDeclaring;
  Status failure;
  std::string path;      // as given, for messages
  std::string target;    // what the temporary is renamed onto (path, or the file a link names)
  std::string tmp_path;
  int fd = -1;
  int temp_slot = -1;    // RegisterTempFile's slot of tmp_path
  std::string header;            // serialised header (kept until written)
  std::vector<uint8_t> buffer;   // pending bytes, flushed in large chunks
  size_t buffered = 0;
  size_t cur = 0;                // tensor being written
  uint64_t cur_written = 0;      // bytes of tensor `cur` written so far
  uint64_t data_pos = 0;         // bytes of the data section emitted so far (incl. padding)
  uint64_t file_pos = 0;         // bytes handed to the OS

  Status WriteFd(const uint8_t* p, size_t n) {
    while (n > 0) {
      ssize_t r = ::write(fd, p, std::min<size_t>(n, 1u << 30));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Status::IOError(fmt::format("{}: write at byte {} failed: {}", tmp_path, file_pos, Errno()));
      p += r;
      n -= static_cast<size_t>(r);
      file_pos += static_cast<uint64_t>(r);
    }
    return Status::Ok();
  }
  Status Flush() {
    Status s = WriteFd(buffer.data(), buffered);
    buffered = 0;
    return s;
  }
  Status Append(const uint8_t* p, size_t n) {
    if (n >= kDirectBytes) {
      ESTREAM_RETURN_IF_ERROR(Flush());
      return WriteFd(p, n);
    }
    while (n > 0) {
      size_t take = std::min(n, buffer.size() - buffered);
      std::memcpy(buffer.data() + buffered, p, take);
      buffered += take;
      p += take;
      n -= take;
      if (buffered == buffer.size()) ESTREAM_RETURN_IF_ERROR(Flush());
    }
    return Status::Ok();
  }
  Status Zeros(uint64_t n) {
    static const uint8_t kZeros[4096] = {};
    while (n > 0) {
      size_t take = static_cast<size_t>(std::min<uint64_t>(n, sizeof(kZeros)));
      ESTREAM_RETURN_IF_ERROR(Append(kZeros, take));
      n -= take;
    }
    return Status::Ok();
  }
  // Closes and removes the temporary file; remembers s for later calls.
  Status Fail(Status s) {
    if (fd >= 0) {
      ::close(fd);
      fd = -1;
    }
    if (!tmp_path.empty()) ::unlink(tmp_path.c_str());
    UnregisterTempFile(temp_slot);
    temp_slot = -1;
    state = State::kFailed;
    failure = s;
    return s;
  }
};

GgufWriter::GgufWriter(uint32_t version, uint32_t alignment)
    : impl_(std::make_unique<Impl>()), version_(version), alignment_(alignment) {}

GgufWriter::~GgufWriter() {
  if (impl_->state == Impl::State::kWriting) (void)impl_->Fail(Status::Internal("GgufWriter destroyed before Finish"));
}

void GgufWriter::AddKv(std::string key, GgufValue value) {
  ESTREAM_CHECK(impl_->state == Impl::State::kDeclaring, "GgufWriter::AddKv after Begin");
  // A repeated key replaces the earlier value: GGUF forbids duplicates.
  for (GgufKv& kv : kvs_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  kvs_.push_back({std::move(key), std::move(value)});
}

Status GgufWriter::AddTensor(const std::string& name, QuantType type, const std::vector<int64_t>& dims) {
  if (impl_->state != Impl::State::kDeclaring)
    return Status::InvalidArgument(fmt::format("GGUF tensor '{}': AddTensor after Begin", name));
  for (const GgufTensorInfo& t : tensors_)
    if (t.name == name) return Status::InvalidArgument(fmt::format("GGUF tensor '{}': duplicate name", name));
  const TypeTraits* tr = GetTypeTraits(type);
  if (tr == nullptr)
    return Status::InvalidArgument(fmt::format("GGUF tensor '{}': unknown type id {}", name,
                                               static_cast<uint32_t>(type)));
  if (dims.empty() || dims.size() > kGgufMaxDims)
    return Status::InvalidArgument(
        fmt::format("GGUF tensor '{}': {} dims (must be 1..{})", name, dims.size(), kGgufMaxDims));
  GgufTensorInfo t;
  t.name = name;
  t.type = type;
  t.n_dims = static_cast<int>(dims.size());
  int64_t n_el = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] < 0) return Status::InvalidArgument(fmt::format("GGUF tensor '{}': dims[{}] = {} < 0", name, d, dims[d]));
    t.dims[d] = dims[d];
    if (__builtin_mul_overflow(n_el, dims[d], &n_el))
      return Status::InvalidArgument(fmt::format("GGUF tensor '{}': element count overflows", name));
  }
  if (dims[0] % tr->block_size != 0)
    return Status::InvalidArgument(fmt::format("GGUF tensor '{}': row length {} is not a multiple of the {} block size {}",
                                               name, dims[0], tr->name, tr->block_size));
  t.n_elements = static_cast<uint64_t>(n_el);
  if (__builtin_mul_overflow(t.n_elements / tr->block_size, uint64_t{tr->type_size}, &t.n_bytes))
    return Status::InvalidArgument(fmt::format("GGUF tensor '{}': byte size overflows", name));
  t.offset = tensors_.empty() ? 0 : AlignUp(tensors_.back().offset + tensors_.back().n_bytes, alignment_);
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

namespace {

// The header bytes (without the padding before the data section).
std::string SerializeHeader(uint32_t version, uint32_t alignment, const std::vector<GgufKv>& kvs,
                            const std::vector<GgufTensorInfo>& tensors) {
  bool has_alignment_key = false;
  for (const GgufKv& kv : kvs) has_alignment_key |= kv.key == "general.alignment";
  const bool add_alignment_key = !has_alignment_key && alignment != kGgufDefaultAlignment;
  std::string out;
  Put<uint32_t>(&out, kGgufMagic);
  Put<uint32_t>(&out, version);
  Put<uint64_t>(&out, tensors.size());
  Put<uint64_t>(&out, kvs.size() + (add_alignment_key ? 1 : 0));
  if (add_alignment_key) {
    PutString(&out, "general.alignment");
    Put<uint32_t>(&out, static_cast<uint32_t>(GgufType::kU32));
    Put<uint32_t>(&out, alignment);
  }
  for (const GgufKv& kv : kvs) {
    PutString(&out, kv.key);
    Put<uint32_t>(&out, static_cast<uint32_t>(kv.value.type));
    PutValue(&out, kv.value);
  }
  for (const GgufTensorInfo& t : tensors) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.n_dims));
    for (int d = 0; d < t.n_dims; ++d) Put<uint64_t>(&out, static_cast<uint64_t>(t.dims[d]));
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&out, t.offset);
  }
  return out;
}

uint64_t DataBytes(const std::vector<GgufTensorInfo>& tensors, uint32_t alignment) {
  if (tensors.empty()) return 0;
  return AlignUp(tensors.back().offset + tensors.back().n_bytes, alignment);
}

}  // namespace

Result<std::string> SerializeGgufHeader(uint32_t version, uint32_t alignment, const std::vector<GgufKv>& kvs,
                                        const std::vector<GgufTensorInfo>& tensors) {
  if (version != 2 && version != 3)
    return Status::InvalidArgument(fmt::format("GGUF version {} cannot be written (use 2 or 3)", version));
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    return Status::InvalidArgument(fmt::format("GGUF alignment {} is not a power of two", alignment));
  for (const GgufKv& kv : kvs) {
    ESTREAM_RETURN_IF_ERROR(CheckValue(kv.key, kv.value));
    if (kv.key == "general.alignment" && (kv.value.type != GgufType::kU32 || kv.value.u != alignment))
      return Status::InvalidArgument(
          fmt::format("key general.alignment must be a u32 equal to the file's alignment {}", alignment));
  }
  return SerializeHeader(version, alignment, kvs, tensors);
}

uint64_t GgufWriter::ExpectedFileSize() const {
  const std::string header = SerializeHeader(version_, alignment_, kvs_, tensors_);
  return AlignUp(header.size(), alignment_) + DataBytes(tensors_, alignment_);
}

Status GgufWriter::Begin(const std::string& path) {
  Impl& w = *impl_;
  if (w.state != Impl::State::kDeclaring) return Status::InvalidArgument(fmt::format("{}: GgufWriter::Begin called twice", path));
  if (version_ != 2 && version_ != 3)
    return Status::InvalidArgument(fmt::format("{}: GGUF version {} cannot be written (use 2 or 3)", path, version_));
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0)
    return Status::InvalidArgument(fmt::format("{}: GGUF alignment {} is not a power of two", path, alignment_));
  for (const GgufKv& kv : kvs_) {
    ESTREAM_RETURN_IF_ERROR(CheckValue(kv.key, kv.value));
    if (kv.key == "general.alignment" && (kv.value.type != GgufType::kU32 || kv.value.u != alignment_))
      return Status::InvalidArgument(fmt::format(
          "{}: key general.alignment must be a u32 equal to the writer's alignment {}", path, alignment_));
  }
  w.path = path;
  // A device, FIFO or directory is refused; a symbolic link is followed (base/output_path.h).
  Result<std::string> target = ResolveOutputPath(path, "a GGUF file");
  if (!target.ok()) return w.Fail(target.status());
  w.target = std::move(*target);
  w.tmp_path = fmt::format("{}.tmp.{}", w.target, ::getpid());
  // Read-write: a Finish callback may read the header back (pack compares before it patches).
  w.fd = ::open(w.tmp_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (w.fd < 0) {
    Status s = Status::IOError(fmt::format("{}: cannot create '{}' for writing: {}", path, w.tmp_path, Errno()));
    w.tmp_path.clear();  // nothing was created
    return w.Fail(s);
  }
  w.temp_slot = RegisterTempFile(w.tmp_path);
  w.state = Impl::State::kWriting;
  w.buffer.resize(kBufferBytes);
  // The magic is written last (Finish): until then the file is no GGUF any reader accepts.
  std::string header = SerializeHeader(version_, alignment_, kvs_, tensors_);
  std::memset(header.data(), 0, sizeof(kGgufMagic));
  Status s = w.Append(reinterpret_cast<const uint8_t*>(header.data()), header.size());
  if (s.ok()) s = w.Zeros(AlignUp(header.size(), alignment_) - header.size());
  if (!s.ok()) return w.Fail(s);
  // Skip leading zero-byte tensors.
  while (w.cur < tensors_.size() && tensors_[w.cur].n_bytes == 0) ++w.cur;
  return Status::Ok();
}

Status GgufWriter::WriteTensorData(const void* data, size_t size) {
  Impl& w = *impl_;
  if (w.state == Impl::State::kFailed) return w.failure;
  if (w.state != Impl::State::kWriting)
    return Status::InvalidArgument("GgufWriter::WriteTensorData called before Begin or after Finish");
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    if (w.cur >= tensors_.size())
      return w.Fail(Status::InvalidArgument(
          fmt::format("{}: {} bytes of tensor data beyond the declared tensors", w.path, size)));
    const GgufTensorInfo& t = tensors_[w.cur];
    if (w.cur_written == 0) {
      Status s = w.Zeros(t.offset - w.data_pos);
      if (!s.ok()) return w.Fail(s);
      w.data_pos = t.offset;
    }
    const size_t take = static_cast<size_t>(std::min<uint64_t>(size, t.n_bytes - w.cur_written));
    Status s = w.Append(p, take);
    if (!s.ok()) return w.Fail(s);
    p += take;
    size -= take;
    w.cur_written += take;
    w.data_pos += take;
    if (w.cur_written == t.n_bytes) {
      w.cur_written = 0;
      ++w.cur;
      while (w.cur < tensors_.size() && tensors_[w.cur].n_bytes == 0) ++w.cur;
    }
  }
  return Status::Ok();
}

int GgufWriter::temp_fd() const { return impl_->state == Impl::State::kWriting ? impl_->fd : -1; }

Status GgufWriter::Finish(const std::function<Status(int fd)>& before_magic) {
  Impl& w = *impl_;
  if (w.state == Impl::State::kFailed) return w.failure;
  if (w.state != Impl::State::kWriting)
    return Status::InvalidArgument("GgufWriter::Finish called before Begin or twice");
  if (w.cur < tensors_.size()) {
    const GgufTensorInfo& t = tensors_[w.cur];
    return w.Fail(Status::InvalidArgument(fmt::format("{}: tensor '{}' got {} of its {} bytes before Finish",
                                                      w.path, t.name, w.cur_written, t.n_bytes)));
  }
  Status s = w.Zeros(DataBytes(tensors_, alignment_) - w.data_pos);
  if (s.ok()) s = w.Flush();
  if (s.ok() && before_magic) s = before_magic(w.fd);
  if (!s.ok()) return w.Fail(s);
  const uint32_t magic = kGgufMagic;
  if (::pwrite(w.fd, &magic, sizeof(magic), 0) != static_cast<ssize_t>(sizeof(magic)))
    return w.Fail(Status::IOError(fmt::format("{}: writing the magic failed: {}", w.tmp_path, Errno())));
  if (::fsync(w.fd) != 0) return w.Fail(Status::IOError(fmt::format("{}: fsync failed: {}", w.tmp_path, Errno())));
  const int fd = w.fd;
  w.fd = -1;
  if (::close(fd) != 0) return w.Fail(Status::IOError(fmt::format("{}: close failed: {}", w.tmp_path, Errno())));
  if (::rename(w.tmp_path.c_str(), w.target.c_str()) != 0)
    return w.Fail(Status::IOError(fmt::format("{}: cannot rename '{}' into place: {}", w.path, w.tmp_path, Errno())));
  UnregisterTempFile(w.temp_slot);
  w.temp_slot = -1;
  // Make the rename durable (best effort: some file systems refuse fsync on directories).
  const size_t slash = w.target.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : w.target.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  w.state = Impl::State::kDone;
  w.buffer = {};
  return Status::Ok();
}

}  // namespace estream
