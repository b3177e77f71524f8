// File: a small random-access read interface for the loader, its POSIX implementation (with
// O_DIRECT when the file system allows it) and a fault-injecting wrapper for tests.
//
// Contract of ReadAt: returns OK only if ALL n bytes were read; short reads are resumed;
// an error names the file, the byte offset and the OS error. ReadOnce is one read attempt
// (one pread(2)): it may return fewer bytes than asked, 0 at end of file, or -errno.
//
// Direct I/O: a File opened with O_DIRECT reports alignment() = 4096, and then the offset, the
// length and the destination address of every read must be multiples of it (the kernel
// rejects anything else with EINVAL). The loader (loader.h) rounds group reads up to it.
//
// Asynchronous engines (io_uring) read through fd() directly; they pass each completion's
// result through FilterCompletion(), which is where a fault-injecting File alters it, so the
// same faults reach both the io_uring and the pread paths.
//
// Thread safety: every method of PosixFile and FaultInjectingFile may be called concurrently
// (pread has no shared file position).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace estream::io {

constexpr size_t kDirectIoAlignment = 4096;

class File {
 public:
  virtual ~File() = default;

  virtual const std::string& name() const = 0;  // the path, for error messages
  virtual uint64_t size() const = 0;            // bytes, fixed at open
  // The size now (fstat), for messages about a file that shrank while in use; size() when it
  // cannot be known.
  virtual uint64_t current_size() const { return size(); }
  // Required alignment of offsets, lengths and buffers (1: none; 4096 with O_DIRECT).
  virtual size_t alignment() const { return 1; }
  // A descriptor io_uring can read, or -1 if there is none (then only ReadOnce works).
  virtual int fd() const { return -1; }

  // One read attempt: bytes read (0 <= r <= n; 0 at end of file) or -errno.
  virtual int64_t ReadOnce(uint64_t offset, size_t n, void* dst) = 0;
  // Given the result of an asynchronous read of n bytes at offset into dst, returns the result
  // the loader should act on. Default: unchanged.
  virtual int64_t FilterCompletion(uint64_t offset, size_t n, void* dst, int64_t result) { return result; }

  // Reads exactly n bytes (see the contract above). With alignment() > 1, offset, n and dst
  // must be aligned (InvalidArgument otherwise).
  Status ReadAt(uint64_t offset, size_t n, void* dst);
};

struct PosixOpenOptions {
  bool direct = true;  // try O_DIRECT; fall back to buffered reads where it is refused (tmpfs)
};

class PosixFile final : public File {
 public:
  // IOError naming the path when it cannot be opened or stat'ed.
  static Result<std::unique_ptr<PosixFile>> Open(const std::string& path, PosixOpenOptions options = {});
  ~PosixFile() override;

  const std::string& name() const override { return path_; }
  uint64_t size() const override { return size_; }
  uint64_t current_size() const override;
  size_t alignment() const override { return direct_ ? kDirectIoAlignment : 1; }
  int fd() const override { return fd_; }
  bool direct() const { return direct_; }
  int64_t ReadOnce(uint64_t offset, size_t n, void* dst) override;

 private:
  PosixFile(std::string path, int fd, uint64_t size, bool direct)
      : path_(std::move(path)), fd_(fd), size_(size), direct_(direct) {}
  const std::string path_;
  const int fd_;
  const uint64_t size_;
  const bool direct_;
};

// "file size N", or "file size now N, M when opened" for a file that changed size since it was
// opened: for the messages about reads that stopped at the end of the file.
std::string SizeText(const File& file);

// A fault to inject on reads that overlap [offset, offset + length).
struct FaultRule {
  enum class Kind {
    kError,      // the read fails with -error
    kShortRead,  // the read returns at most short_bytes bytes (applied to reads that START in the range)
    kDelay,      // the read is delayed by delay_s seconds
  };
  Kind kind = Kind::kError;
  uint64_t offset = 0;
  uint64_t length = 0;
  int error = 5;             // EIO
  size_t short_bytes = 0;
  double delay_s = 0;
  int times = -1;            // how many reads it applies to; -1: every one
};

struct FaultOptions {
  std::vector<FaultRule> rules{};
  // Random faults on every read, from a seeded generator.
  double short_read_probability = 0;  // a read returns a random fraction of what was asked
  double max_random_delay_s = 0;      // each read sleeps uniformly in [0, max_random_delay_s]
  uint64_t seed = 1;
  // Called with every read's offset, length and destination before it is reported (after the
  // bytes landed in dst): tests check here that the destination may be written.
  std::function<void(uint64_t offset, size_t n, void* dst)> on_read{};
};

// Wraps a File (not owned; it must outlive this) and injects faults into ReadOnce and into
// FilterCompletion, so both the synchronous and the io_uring paths see them.
class FaultInjectingFile final : public File {
 public:
  FaultInjectingFile(File* base, FaultOptions options)
      : base_(base), on_read_(std::move(options.on_read)), options_(std::move(options)), rng_(options_.seed) {}

  const std::string& name() const override { return base_->name(); }
  uint64_t size() const override { return base_->size(); }
  uint64_t current_size() const override { return base_->current_size(); }
  size_t alignment() const override { return base_->alignment(); }
  int fd() const override { return base_->fd(); }
  int64_t ReadOnce(uint64_t offset, size_t n, void* dst) override;
  int64_t FilterCompletion(uint64_t offset, size_t n, void* dst, int64_t result) override;

  // Adds a rule (thread-safe; applies to reads that start after it was added).
  void AddRule(const FaultRule& rule);
  void ClearRules();
  uint64_t injected_errors() const;
  uint64_t injected_short_reads() const;

 private:
  // Applies rules and random faults to a read whose raw result is `result`.
  int64_t Apply(uint64_t offset, size_t n, void* dst, int64_t result);

  File* const base_;
  const std::function<void(uint64_t, size_t, void*)> on_read_;  // called without mutex_ held
  // mutex_ guards the rules (their remaining `times`), the random generator and the counters.
  mutable Mutex mutex_;
  FaultOptions options_ ESTREAM_GUARDED_BY(mutex_);
  std::mt19937_64 rng_ ESTREAM_GUARDED_BY(mutex_);
  uint64_t injected_errors_ ESTREAM_GUARDED_BY(mutex_) = 0;
  uint64_t injected_short_reads_ ESTREAM_GUARDED_BY(mutex_) = 0;
};

}  // namespace estream::io
