// Loader: reads whole expert groups from a File into arena banks (docs/DESIGN.md section 5).
//
// A read job is one contiguous byte range of a file (one group of G expert records = one bank)
// copied into one destination buffer. The loader splits each job into chunks of at most
// `chunk_bytes` and keeps at most `queue_depth` (Q) chunk reads in flight over all jobs, taking
// chunks from the oldest unfinished job first, so jobs finish roughly in submission order.
//
// Backends:
//   io_uring  one I/O thread owns a ring of Q entries (+1 for its wake-up eventfd); reads go
//             straight to the file descriptor (O_DIRECT when the File was opened so).
//   pread     Q worker threads, each doing synchronous pread(2)s through File::ReadOnce.
//             Used when io_uring cannot be set up (io_uring_queue_init fails: old kernel,
//             seccomp, io_uring_disabled), when a File has no descriptor, or when forced.
// Both resume short reads (with O_DIRECT from the last aligned byte), retry EINTR/EAGAIN, and
// report one Status per job.
//
// Lengths and alignment: with an O_DIRECT File (alignment() = 4096) the job's offset and
// destination must be aligned; the length need not be: the last chunk is rounded up to the
// alignment (so `dst_capacity` must cover RoundUp(length, alignment)) and a read that stops at
// end of file is accepted once `length` bytes arrived. Arena banks (vmem/arena.h) satisfy this.
//
// Completion: each job's `done` callback runs exactly once, on a loader thread, after every
// chunk of the job has left the kernel (so the destination is no longer written): outcome kOk
// (every byte arrived), kFailed (the first error; the message names the file, the byte offset
// and the job's label), or kCancelled. Callbacks must be short; they may call Submit and Cancel.
// A failed job does not affect other jobs; the loader stays usable.
//
// Cancellation: Cancel(id) stops a job that has not finished: its chunks not yet issued are
// never issued, those in flight are drained, then it completes as kCancelled.
//
// Thread safety: Submit, Cancel, Drain and stats may be called from any thread. The destructor
// cancels jobs not yet finished, drains reads in flight, and joins the loader threads; it must
// not run on a loader thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "estream/options.h"
#include "io/file.h"

namespace estream::io {

struct LoaderParams {
  IoBackend backend = IoBackend::kAuto;  // kAuto: io_uring, else pread; kIoUring: error if unavailable
  int queue_depth = 8;                   // Q >= 1: chunk reads in flight at most
  size_t chunk_bytes = size_t{1} << 20;  // > 0; rounded up to a multiple of 4096
  // Tests: behave as if io_uring_queue_init had failed (exercises the fallback).
  bool fail_uring_init_for_testing = false;
};

enum class ReadOutcome { kOk, kFailed, kCancelled };
const char* ReadOutcomeName(ReadOutcome o);

struct ReadResult {
  uint64_t id = 0;
  ReadOutcome outcome = ReadOutcome::kOk;
  Status status{};          // non-OK exactly when kFailed
  uint64_t bytes_read = 0;  // bytes the kernel delivered for this job (resumed reads included)
  // NowSeconds() stamps: Submit, first chunk issued (0 if none was), completion.
  double submit_s = 0, start_s = 0, end_s = 0;
};

struct ReadRequest {
  File* file = nullptr;       // not owned; must outlive the job
  uint64_t offset = 0;        // file offset of the first byte
  size_t length = 0;          // bytes that must arrive (>= 1)
  uint8_t* dst = nullptr;     // destination (not owned; must stay valid until `done` ran)
  size_t dst_capacity = 0;    // >= RoundUp(length, file->alignment())
  std::string label{};        // names the job in errors, e.g. "layer 3 group 5"
  std::function<void(const ReadResult&)> done{};  // may be empty
};

struct LoaderStats {
  uint64_t jobs_submitted = 0, jobs_ok = 0, jobs_failed = 0, jobs_cancelled = 0;
  uint64_t reads_issued = 0;      // chunk reads issued, resumptions and retries included
  uint64_t short_reads = 0;       // reads that returned fewer bytes than asked (and were resumed)
  uint64_t bytes_read = 0;
  int max_in_flight = 0;          // the most chunk reads ever in flight at once (<= Q)
};

class Loader {
 public:
  // Starts the loader thread(s). Errors: InvalidArgument for bad parameters; NotSupported when
  // kIoUring was asked for and the ring cannot be created (the message gives the errno).
  static Result<std::unique_ptr<Loader>> Create(const LoaderParams& params);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  IoBackend backend() const { return backend_; }  // the one in use: kIoUring or kPread
  int queue_depth() const { return queue_depth_; }
  size_t chunk_bytes() const { return chunk_bytes_; }
  // Why io_uring is not in use (empty when it is, or when pread was asked for).
  const std::string& fallback_reason() const { return fallback_reason_; }

  // Queues a job; returns its id (> 0). InvalidArgument (naming the label) for a null file or
  // destination, a zero length, a range outside the file, misalignment, or a destination too
  // small; the job is then not queued and `done` is not called.
  Result<uint64_t> Submit(ReadRequest request);
  // True if job `id` will complete as kCancelled; false if it already completed (or is unknown).
  bool Cancel(uint64_t id);
  // Blocks until every job submitted so far has completed (callbacks included). Must not be
  // called from a `done` callback.
  void Drain();
  LoaderStats stats() const;

 private:
  struct Job;
  struct Chunk;
  explicit Loader(const LoaderParams& params);

  // Picks the next chunk to issue (oldest job first), or false if none may be issued now.
  bool NextChunkLocked(Chunk* chunk) ESTREAM_REQUIRES(mutex_);
  // Records a finished chunk (status OK or the error) and collects jobs that are complete.
  void FinishChunkLocked(const Chunk& chunk, Status status) ESTREAM_REQUIRES(mutex_);
  // Moves every finished job from jobs_ to `out` (callbacks to run after unlocking).
  void CollectFinishedLocked(std::vector<std::unique_ptr<Job>>* out) ESTREAM_REQUIRES(mutex_);
  void RunCallbacks(std::vector<std::unique_ptr<Job>>* finished) ESTREAM_EXCLUDES(mutex_);
  // Acts on the result of one read attempt of `chunk`: true if the chunk is done (with
  // *status set), false if it must be read again from chunk->done.
  bool HandleResult(Chunk* chunk, int64_t result, Status* status);

  void PreadWorker() ESTREAM_EXCLUDES(mutex_);
  void UringLoop() ESTREAM_EXCLUDES(mutex_);
  void WakeUringThread();

  IoBackend backend_ = IoBackend::kPread;
  const int queue_depth_;
  const size_t chunk_bytes_;
  std::string fallback_reason_;

  // io_uring state: owned by the I/O thread after Create (ring_ is opaque here: loader.cc).
  struct Ring;
  std::unique_ptr<Ring> ring_;
  int wake_fd_ = -1;  // eventfd: Submit/Cancel/shutdown write it, the I/O thread reads it via the ring

  // mutex_ guards the job queue, the in-flight count, the shutdown flag and the statistics;
  // loader threads hold it only to pick and retire chunks, never across a read.
  mutable Mutex mutex_;
  CondVar work_cv_{&mutex_};     // pread workers: a chunk may be issuable, or shutdown
  CondVar drained_cv_{&mutex_};  // Drain: a job completed
  std::deque<std::unique_ptr<Job>> jobs_ ESTREAM_GUARDED_BY(mutex_);  // submitted, not yet completed
  int in_flight_ ESTREAM_GUARDED_BY(mutex_) = 0;
  uint64_t next_id_ ESTREAM_GUARDED_BY(mutex_) = 1;
  uint64_t callbacks_running_ ESTREAM_GUARDED_BY(mutex_) = 0;
  bool stopping_ ESTREAM_GUARDED_BY(mutex_) = false;
  LoaderStats stats_ ESTREAM_GUARDED_BY(mutex_);

  std::vector<std::thread> threads_;
};

}  // namespace estream::io
