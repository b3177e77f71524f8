#include "pack/metadata_update.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <unordered_map>

#include <fmt/format.h>

#include "base/memory.h"
#include "base/output_path.h"

// GCC 12's -Wrestrict misfires inside std::string's inlined copies (GCC bug 105329) on the
// path strings built below.
#pragma GCC diagnostic ignored "-Wrestrict"
#include "base/timer.h"

namespace estream::io {
namespace {

constexpr uint64_t kCopyChunkBytes = uint64_t{16} << 20;
// Serialised size of the reserve key with an empty array: key (u64 length + bytes), value type,
// element type, count.
constexpr uint64_t kReserveOverhead = 8 + (sizeof(kHeaderReserveKey) - 1) + 4 + 4 + 8;

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
std::string Errno() { return std::strerror(errno); }

// Closes the descriptor on every path (releasing the flock with it).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// `written`, when given, counts the bytes that reached the file (also on failure).
Status PwriteAll(int fd, const void* data, size_t n, uint64_t offset, const std::string& path,
                 size_t* written = nullptr) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t r = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Status::IOError(fmt::format("{}: header write at byte {} failed: {}", path, offset, Errno()));
    if (written != nullptr) *written += static_cast<size_t>(r);
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status PreadAll(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Status::IOError(fmt::format("{}: header read at byte {} failed: {}", path, offset,
                                                   r == 0 ? "unexpected end of file" : Errno()));
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status Sync(int fd, const std::string& path) {
  if (::fdatasync(fd) != 0) return Status::IOError(fmt::format("{}: fdatasync failed: {}", path, Errno()));
  return Status::Ok();
}

bool HasPrefix(const std::string& key, const std::vector<std::string>& prefixes) {
  for (const std::string& p : prefixes)
    if (key.rfind(p, 0) == 0) return true;
  return false;
}

// The new key list without the reserve (see the header: order kept, `set` replaces in place).
Result<std::vector<GgufKv>> MergeKvs(const std::string& path, const std::vector<GgufKv>& old_kvs,
                                     const std::vector<GgufKv>& set, const std::vector<std::string>& remove_prefixes) {
  std::unordered_map<std::string, size_t> set_index;
  for (size_t i = 0; i < set.size(); ++i) {
    const std::string& key = set[i].key;
    if (key.empty()) return Status::InvalidArgument(fmt::format("{}: metadata update: empty key", path));
    if (key == "general.alignment" || key == kHeaderReserveKey)
      return Status::InvalidArgument(
          fmt::format("{}: metadata update: key {} cannot be set (it is managed by the update itself)", path, key));
    if (!set_index.emplace(key, i).second)
      return Status::InvalidArgument(fmt::format("{}: metadata update: key {} given twice", path, key));
  }
  for (const std::string& p : remove_prefixes)
    if (p.empty()) return Status::InvalidArgument(fmt::format("{}: metadata update: empty prefix to remove", path));

  std::vector<GgufKv> out;
  out.reserve(old_kvs.size() + set.size());
  std::vector<bool> used(set.size(), false);
  for (const GgufKv& kv : old_kvs) {
    if (kv.key == kHeaderReserveKey) continue;
    if (auto it = set_index.find(kv.key); it != set_index.end()) {
      out.push_back(set[it->second]);
      used[it->second] = true;
      continue;
    }
    if (kv.key != "general.alignment" && HasPrefix(kv.key, remove_prefixes)) continue;
    out.push_back(kv);
  }
  for (size_t i = 0; i < set.size(); ++i)
    if (!used[i]) out.push_back(set[i]);
  return out;
}

// Rewrites [0, data_offset) of the open file with `image` (new header + zero padding), in the
// three steps of the header comment. On an I/O error writes `old_image` back (best effort).
Status WriteHeaderInPlace(int fd, const std::string& path, const std::string& image, const std::string& old_image) {
  static const char kZeroMagic[4] = {0, 0, 0, 0};
  size_t written = 0;
  Status st = PwriteAll(fd, kZeroMagic, 4, 0, path, &written);
  // Not a byte written (a read-only or write-less file system: EROFS, ENOSYS): nothing to undo.
  if (!st.ok() && written == 0) return Status::IOError(fmt::format("{} (the file is unchanged)", st.message()));
  if (st.ok()) st = Sync(fd, path);
  if (st.ok()) st = PwriteAll(fd, image.data() + 4, image.size() - 4, 4, path);
  if (st.ok()) st = Sync(fd, path);
  if (st.ok()) st = PwriteAll(fd, image.data(), 4, 0, path);
  if (st.ok()) st = Sync(fd, path);
  if (st.ok()) return st;
  // Put the old header back: body first, magic last, as above.
  Status restore = PwriteAll(fd, old_image.data() + 4, old_image.size() - 4, 4, path);
  if (restore.ok()) restore = Sync(fd, path);
  if (restore.ok()) restore = PwriteAll(fd, old_image.data(), 4, 0, path);
  if (restore.ok()) restore = Sync(fd, path);
  if (!restore.ok())
    return Status::IOError(fmt::format("{} (and restoring the old header failed too: the file's tensor data is intact "
                                       "but its header is not; pack the model again)",
                                       st.message()));
  return Status::IOError(fmt::format("{} (the old header was restored)", st.message()));
}

// Gives the temporary that will replace `path` the original's owner and permission bits: the
// writer creates it 0644 minus the umask, owned by this process, and the rename would otherwise
// change who may read a model shared through its group (or widen a private one). The owner is
// best effort (only root, or a member of the target group, may change it); fchown goes first
// because it may clear set-id bits, which fchmod then restores.
Status KeepOwnerAndMode(int tmp_fd, const struct stat& original, const std::string& path) {
  if (original.st_uid != ::geteuid() || original.st_gid != ::getegid())
    (void)::fchown(tmp_fd, original.st_uid, original.st_gid);  // EPERM: keep ours
  if (::fchmod(tmp_fd, original.st_mode & 07777) != 0)
    return Status::IOError(fmt::format("{}: cannot give the rewritten file the original's mode {:o}: {}", path,
                                       original.st_mode & 07777, Errno()));
  return Status::Ok();
}

// The full-rewrite path (see the header).
// base_header_bytes: the serialised header of `kvs` (no reserve) and the tensor infos; original:
// fstat of `path` (its owner and mode are kept).
Status RewriteWholeFile(const std::string& path, const GgufFile& old, const std::vector<GgufKv>& kvs,
                        uint64_t base_header_bytes, const struct stat& original, const ProgressFn& progress,
                        MetadataUpdateInfo* info) {
  GgufWriter writer(old.version(), old.alignment());
  for (const GgufKv& kv : kvs) writer.AddKv(kv.key, kv.value);
  writer.AddKv(kHeaderReserveKey, HeaderReserveValue());
  uint64_t total = 0;
  for (const GgufTensorInfo& t : old.tensors()) {
    ESTREAM_RETURN_IF_ERROR(
        writer.AddTensor(t.name, t.type, std::vector<int64_t>(t.dims, t.dims + t.n_dims)));
    total += t.n_bytes;
  }

  // Free space: the temporary holds a whole new copy until the rename.
  const uint64_t needed = writer.ExpectedFileSize();
  // The base header plus the reserve key (HeaderReserveValue() is exactly kHeaderReserveBytes).
  const uint64_t header_bytes = base_header_bytes + kReserveOverhead + kHeaderReserveBytes;
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (avail < needed)
      return Status::IOError(fmt::format("{}: the metadata does not fit in the header's reserve and rewriting the "
                                         "file needs {} bytes free in {}, only {} are (free some space)",
                                         path, needed, dir, avail));
  }

  // Errors past this point say the file is unchanged (the writer removes its temporary).
  auto failed = [&path](const Status& st) {
    return Status(st.code(), fmt::format("{} (rewriting {} whole for its new metadata; the file is unchanged)",
                                         st.message(), path));
  };
  if (Status st = writer.Begin(path); !st.ok()) return failed(st);
  // (On an error below the writer's destructor removes the temporary.)
  if (Status st = KeepOwnerAndMode(writer.temp_fd(), original, path); !st.ok()) return failed(st);

  const uint64_t chunk = std::clamp<uint64_t>(total, 1, kCopyChunkBytes);
  auto buffer = AllocAligned<uint8_t>(static_cast<size_t>(chunk));
  if (!buffer) return Status::ResourceExhausted(fmt::format("{}: cannot allocate the copy buffer", path));
  uint64_t done = 0;
  for (const GgufTensorInfo& t : old.tensors()) {
    for (uint64_t off = 0; off < t.n_bytes; off += chunk) {
      const uint64_t n = std::min(chunk, t.n_bytes - off);
      if (Status st = old.ReadTensor(t, off, buffer.get(), n); !st.ok()) return failed(st);
      if (Status st = writer.WriteTensorData(buffer.get(), static_cast<size_t>(n)); !st.ok()) return failed(st);
      done += n;
      if (progress) progress(done, total);
    }
  }
  // fsync, rename over `path`, fsync of the directory.
  if (Status st = writer.Finish(); !st.ok())
    return Status(st.code(), fmt::format("{} (rewriting {} whole for its new metadata)", st.message(), path));

  if (info != nullptr) {
    info->in_place = false;
    info->data_offset = AlignUp(header_bytes, old.alignment());
    info->header_bytes = header_bytes;
    info->reserve_bytes = kHeaderReserveBytes;
    info->bytes_copied = done;
  }
  return Status::Ok();
}

}  // namespace

GgufValue HeaderReserveValue(uint64_t payload_bytes) {
  return GgufValue::Array(GgufType::kU64, std::vector<GgufValue>(static_cast<size_t>((payload_bytes + 7) / 8),
                                                                 GgufValue::U64(0)));
}

Status CheckUpdatable(const std::string& path) {
  ESTREAM_ASSIGN_OR_RETURN(const std::string file, ResolveOutputPath(path, "the model"));
  Fd fd(::open(file.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) return Status::IOError(fmt::format("{}: cannot open for updating its metadata: {}", path, Errno()));
  // Under the update's lock: an update in progress rewrites the magic, and writing back what was
  // read before it did would undo that.
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0)
    return Status::IOError(fmt::format("{}: being updated by another process; try again when it is done", path));
  // Writing the first 4 bytes back as they are finds file systems that open for writing but
  // cannot write (ENOSYS on a FUSE file system without write support) without changing a byte.
  char magic[4];
  ESTREAM_RETURN_IF_ERROR(PreadAll(fd.get(), magic, sizeof(magic), 0, path));
  if (::pwrite(fd.get(), magic, sizeof(magic), 0) != static_cast<ssize_t>(sizeof(magic)))
    return Status::IOError(fmt::format("{}: cannot update its metadata: writing to it fails: {}", path, Errno()));
  return Status::Ok();
}

Status UpdateMetadata(const std::string& path_given, const std::vector<GgufKv>& set,
                      const std::vector<std::string>& remove_prefixes, ProgressFn progress,
                      MetadataUpdateInfo* info) {
  Timer timer;
  // Through a symbolic link the file it names is updated (and, on the full-rewrite path,
  // replaced), never the link itself.
  ESTREAM_ASSIGN_OR_RETURN(const std::string path, ResolveOutputPath(path_given, "the model"));
  // Lock first, then parse: what is parsed is what gets rewritten.
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (fd.get() < 0) return Status::IOError(fmt::format("{}: cannot open for updating its metadata: {}", path, Errno()));
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK)
      return Status::IOError(fmt::format("{}: being updated by another process; try again when it is done", path));
    return Status::IOError(fmt::format("{}: cannot lock for updating: {}", path, Errno()));
  }
  struct stat original {};
  if (::fstat(fd.get(), &original) != 0) return Status::IOError(fmt::format("{}: cannot stat: {}", path, Errno()));
  auto old = GgufFile::Open(path, {.mmap = false});
  if (!old.ok()) return old.status();
  const GgufFile& f = **old;

  ESTREAM_ASSIGN_OR_RETURN(std::vector<GgufKv> kvs, MergeKvs(path, f.kvs(), set, remove_prefixes));

  // ---- in place: a reserve that ends the header in the last 8 bytes before the data offset ----
  const uint64_t data_offset = f.data_offset();
  const uint64_t alignment = f.alignment();
  auto base = SerializeGgufHeader(f.version(), f.alignment(), kvs, f.tensors());
  if (!base.ok()) return Status(base.status().code(), fmt::format("{}: {}", path, base.status().message()));
  std::string image;
  uint64_t reserve_payload = 0;
  bool fits = false;
  if (base->size() + kReserveOverhead <= data_offset) {
    reserve_payload = (data_offset - base->size() - kReserveOverhead) / 8 * 8;
    kvs.push_back({kHeaderReserveKey, HeaderReserveValue(reserve_payload)});
    auto with = SerializeGgufHeader(f.version(), f.alignment(), kvs, f.tensors());
    if (!with.ok()) return with.status();
    image = std::move(*with);
    kvs.pop_back();
    fits = AlignUp(image.size(), alignment) == data_offset;
  } else if (base->size() <= data_offset && AlignUp(base->size(), alignment) == data_offset) {
    image = std::move(*base);  // fits, but with no room for even an empty reserve key
    fits = true;
  }
  if (!fits) {
    image.clear();
    ESTREAM_RETURN_IF_ERROR(RewriteWholeFile(path, f, kvs, base->size(), original, progress, info));
    if (info != nullptr) info->seconds = timer.Seconds();
    return Status::Ok();
  }

  const uint64_t header_bytes = image.size();
  std::string old_image(static_cast<size_t>(data_offset), '\0');
  ESTREAM_RETURN_IF_ERROR(PreadAll(fd.get(), old_image.data(), old_image.size(), 0, path));
  image.resize(static_cast<size_t>(data_offset), '\0');  // zero padding up to the data section
  ESTREAM_RETURN_IF_ERROR(WriteHeaderInPlace(fd.get(), path, image, old_image));

  if (progress) progress(data_offset, data_offset);
  if (info != nullptr) {
    info->in_place = true;
    info->data_offset = data_offset;
    info->header_bytes = header_bytes;
    info->reserve_bytes = reserve_payload;
    info->bytes_copied = 0;
    info->seconds = timer.Seconds();
  }
  return Status::Ok();
}

}  // namespace estream::io
