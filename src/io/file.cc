#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/file_type.h"

namespace estream::io {
namespace {

bool Aligned(uint64_t v, size_t a) { return v % a == 0; }

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

}  // namespace

Status File::ReadAt(uint64_t offset, size_t n, void* dst) {
  const size_t align = alignment();
  if (align > 1 && !(Aligned(offset, align) && Aligned(n, align) && Aligned(reinterpret_cast<uintptr_t>(dst), align))) {
    return Status::InvalidArgument(name() + ": direct read of " + std::to_string(n) + " bytes at offset " +
                                   std::to_string(offset) + " is not " + std::to_string(align) + "-byte aligned");
  }
  auto* out = static_cast<uint8_t*>(dst);
  size_t done = 0;
  int stalls = 0;
  while (done < n) {
    const int64_t r = ReadOnce(offset + done, n - done, out + done);
    if (r == -EINTR || r == -EAGAIN) continue;
    if (r < 0) {
      return Status::IOError(name() + ": read of " + std::to_string(n - done) + " bytes at offset " +
                             std::to_string(offset + done) + " failed: " + ErrnoText(static_cast<int>(-r)));
    }
    if (done + static_cast<size_t>(r) >= n) break;
    // 0, or a short read that reached the end of the file: the rest does not exist.
    if (r == 0 || offset + done + static_cast<uint64_t>(r) >= size()) {
      return Status::IOError(name() + ": unexpected end of file at offset " + std::to_string(offset + done + r) +
                             " (" + SizeText(*this) + ", wanted " + std::to_string(n - done - r) +
                             " more bytes); the file may be truncated");
    }
    // With O_DIRECT a resumed read must start aligned: keep only the aligned part of the
    // progress and read the tail again.
    const size_t next = align > 1 ? (done + static_cast<size_t>(r)) / align * align : done + static_cast<size_t>(r);
    if (next == done && ++stalls > 16) {
      return Status::IOError(name() + ": reads at offset " + std::to_string(offset + done) +
                             " keep returning less than one aligned block");
    }
    if (next > done) stalls = 0;
    done = next;
  }
  return Status::Ok();
}

Result<std::unique_ptr<PosixFile>> PosixFile::Open(const std::string& path, PosixOpenOptions options) {
  int fd = -1;
  bool direct = false;
  // O_NONBLOCK: a FIFO is refused below instead of blocking the open; the flag is cleared again
  // for the regular file (io_uring would otherwise answer uncached reads with EAGAIN).
  if (options.direct) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_DIRECT);
    direct = fd >= 0;
    // EINVAL: the file system does not support O_DIRECT; read through the page cache instead.
    if (fd < 0 && errno != EINVAL) {
      return Status::IOError(path + ": cannot open: " + ErrnoText(errno));
    }
  }
  if (fd < 0) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return Status::IOError(path + ": cannot open: " + ErrnoText(errno));
  }
  Result<uint64_t> size = RegularFileSize(fd, path);
  if (!size.ok()) {
    ::close(fd);
    return size.status();
  }
  return std::unique_ptr<PosixFile>(new PosixFile(path, fd, *size, direct));
}

PosixFile::~PosixFile() { ::close(fd_); }

uint64_t PosixFile::current_size() const {
  struct stat st;
  return ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : size_;
}

std::string SizeText(const File& file) {
  const uint64_t now = file.current_size();
  if (now == file.size()) return "file size " + std::to_string(now);
  return "file size now " + std::to_string(now) + ", " + std::to_string(file.size()) + " when opened";
}

int64_t PosixFile::ReadOnce(uint64_t offset, size_t n, void* dst) {
  const ssize_t r = ::pread(fd_, dst, n, static_cast<off_t>(offset));
  return r < 0 ? -static_cast<int64_t>(errno) : static_cast<int64_t>(r);
}

// ---- FaultInjectingFile ----------------------------------------------------------------------

int64_t FaultInjectingFile::ReadOnce(uint64_t offset, size_t n, void* dst) {
  return Apply(offset, n, dst, base_->ReadOnce(offset, n, dst));
}

int64_t FaultInjectingFile::FilterCompletion(uint64_t offset, size_t n, void* dst, int64_t result) {
  return Apply(offset, n, dst, base_->FilterCompletion(offset, n, dst, result));
}

int64_t FaultInjectingFile::Apply(uint64_t offset, size_t n, void* dst, int64_t result) {
  if (on_read_) on_read_(offset, n, dst);
  double delay = 0;
  {
    MutexLock lock(&mutex_);
    for (FaultRule& rule : options_.rules) {
      if (rule.times == 0) continue;
      const bool overlaps = offset < rule.offset + rule.length && rule.offset < offset + n;
      const bool starts_in = offset >= rule.offset && offset < rule.offset + rule.length;
      bool applied = false;
      switch (rule.kind) {
        case FaultRule::Kind::kError:
          if (overlaps && result >= 0) {
            result = -rule.error;
            ++injected_errors_;
            applied = true;
          }
          break;
        case FaultRule::Kind::kShortRead:
          if (starts_in && result > static_cast<int64_t>(rule.short_bytes)) {
            result = static_cast<int64_t>(rule.short_bytes);
            ++injected_short_reads_;
            applied = true;
          }
          break;
        case FaultRule::Kind::kDelay:
          if (overlaps) {
            delay += rule.delay_s;
            applied = true;
          }
          break;
      }
      if (applied && rule.times > 0) --rule.times;
    }
    if (options_.short_read_probability > 0 && result > 1) {
      std::uniform_real_distribution<double> u(0.0, 1.0);
      if (u(rng_) < options_.short_read_probability) {
        result = std::uniform_int_distribution<int64_t>(1, result - 1)(rng_);
        ++injected_short_reads_;
      }
    }
    if (options_.max_random_delay_s > 0) {
      delay += std::uniform_real_distribution<double>(0.0, options_.max_random_delay_s)(rng_);
    }
  }
  if (delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  return result;
}

void FaultInjectingFile::AddRule(const FaultRule& rule) {
  MutexLock lock(&mutex_);
  options_.rules.push_back(rule);
}

void FaultInjectingFile::ClearRules() {
  MutexLock lock(&mutex_);
  options_.rules.clear();
}

uint64_t FaultInjectingFile::injected_errors() const {
  MutexLock lock(&mutex_);
  return injected_errors_;
}

uint64_t FaultInjectingFile::injected_short_reads() const {
  MutexLock lock(&mutex_);
  return injected_short_reads_;
}

}  // namespace estream::io
