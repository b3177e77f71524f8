#include "io/loader.h"

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/timer.h"

namespace estream::io {
namespace {

constexpr int kMaxRetries = 100;  // EINTR/EAGAIN in a row before a read is declared failed
constexpr int kMaxStalls = 16;    // short reads in a row that make no aligned progress

size_t RoundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

const char* ReadOutcomeName(ReadOutcome o) {
  switch (o) {
    case ReadOutcome::kOk: return "ok";
    case ReadOutcome::kFailed: return "failed";
    case ReadOutcome::kCancelled: return "cancelled";
  }
  return "?";
}

struct Loader::Job {
  uint64_t id = 0;
  ReadRequest req;
  size_t align = 1;
  size_t issue_end = 0;  // RoundUp(length, align): bytes to issue, relative to req.offset
  size_t issue_pos = 0;  // bytes [0, issue_pos) have been issued as chunks
  int chunks_in_flight = 0;
  bool cancelled = false;
  Status error;          // the first error of any chunk
  uint64_t bytes = 0;
  double submit_s = 0, start_s = 0;

  bool Finished() const {
    return chunks_in_flight == 0 && (cancelled || !error.ok() || issue_pos >= issue_end);
  }
};

// One chunk read in flight. Offsets are absolute file offsets.
struct Loader::Chunk {
  Job* job = nullptr;
  uint64_t offset = 0;   // file offset of the chunk's first byte
  uint8_t* dst = nullptr;
  size_t len = 0;        // bytes asked for (aligned with O_DIRECT)
  size_t need = 0;       // bytes that must arrive (<= len; < len only at the job's end)
  size_t done = 0;       // bytes of [0, len) known good; the next read starts here
  uint64_t bytes = 0;    // bytes the kernel delivered, re-reads included
  int reissues = 0, short_reads = 0, retries = 0, stalls = 0;
};

struct Loader::Ring {
  struct io_uring ring;
  uint64_t wake_buf = 0;
  std::vector<Chunk> slots;     // [Q]
  std::vector<int> free_slots;
};

Loader::Loader(const LoaderParams& p)
    : queue_depth_(p.queue_depth), chunk_bytes_(RoundUp(p.chunk_bytes, kDirectIoAlignment)) {}

Result<std::unique_ptr<Loader>> Loader::Create(const LoaderParams& p) {
  if (p.queue_depth < 1 || p.queue_depth > 4096) {
    return Status::InvalidArgument("loader: queue depth " + std::to_string(p.queue_depth) + " must be in [1, 4096]");
  }
  if (p.chunk_bytes == 0) return Status::InvalidArgument("loader: chunk size must be > 0");
  std::unique_ptr<Loader> loader(new Loader(p));
  Loader* l = loader.get();
  if (p.backend != IoBackend::kPread) {
    auto ring = std::make_unique<Ring>();
    int err = 0;
    if (p.fail_uring_init_for_testing) {
      err = -ENOSYS;
    } else {
      err = io_uring_queue_init(static_cast<unsigned>(p.queue_depth + 1), &ring->ring, 0);
    }
    if (err == 0) {
      l->wake_fd_ = eventfd(0, EFD_CLOEXEC);
      if (l->wake_fd_ < 0) {
        err = -errno;
        io_uring_queue_exit(&ring->ring);
      }
    }
    if (err == 0) {
      ring->slots.resize(p.queue_depth);
      for (int i = p.queue_depth - 1; i >= 0; --i) ring->free_slots.push_back(i);
      l->ring_ = std::move(ring);
      l->backend_ = IoBackend::kIoUring;
    } else {
      l->fallback_reason_ = std::string("io_uring set-up failed: ") + std::strerror(-err);
      if (p.backend == IoBackend::kIoUring) {
        return Status::NotSupported("loader: " + l->fallback_reason_ +
                                    "; use the pread backend (or enable io_uring: /proc/sys/kernel/io_uring_disabled)");
      }
    }
  }
  if (l->backend_ == IoBackend::kIoUring) {
    l->threads_.emplace_back([l] { l->UringLoop(); });
  } else {
    for (int i = 0; i < p.queue_depth; ++i) l->threads_.emplace_back([l] { l->PreadWorker(); });
  }
  return loader;
}

Loader::~Loader() {
  {
    MutexLock lock(&mutex_);
    stopping_ = true;
    for (auto& job : jobs_) job->cancelled = true;
    work_cv_.SignalAll();
  }
  if (backend_ == IoBackend::kIoUring) WakeUringThread();
  for (auto& t : threads_) t.join();
  if (ring_) io_uring_queue_exit(&ring_->ring);
  if (wake_fd_ >= 0) close(wake_fd_);
}

Result<uint64_t> Loader::Submit(ReadRequest req) {
  const std::string what = "loader: job '" + req.label + "'";
  if (req.file == nullptr || req.dst == nullptr || req.length == 0) {
    return Status::InvalidArgument(what + " needs a file, a destination and a length > 0");
  }
  const size_t align = req.file->alignment();
  const uint64_t size = req.file->size();
  if (req.offset > size || req.length > size - req.offset) {
    return Status::InvalidArgument(what + ": range [" + std::to_string(req.offset) + ", +" + std::to_string(req.length) +
                                   ") lies outside " + req.file->name() + " (" + std::to_string(size) + " bytes)");
  }
  if (req.offset % align != 0 || reinterpret_cast<uintptr_t>(req.dst) % align != 0) {
    return Status::InvalidArgument(what + ": offset " + std::to_string(req.offset) + " or destination is not " +
                                   std::to_string(align) + "-byte aligned, as direct I/O on " + req.file->name() +
                                   " requires");
  }
  const size_t issue_end = RoundUp(req.length, align);
  if (req.dst_capacity < issue_end) {
    return Status::InvalidArgument(what + ": destination holds " + std::to_string(req.dst_capacity) + " bytes, needs " +
                                   std::to_string(issue_end));
  }
  auto job = std::make_unique<Job>();
  job->req = std::move(req);
  job->align = align;
  job->issue_end = issue_end;
  job->submit_s = NowSeconds();
  uint64_t id = 0;
  {
    MutexLock lock(&mutex_);
    if (stopping_) return Status::Internal(what + ": loader is shutting down");
    id = job->id = next_id_++;
    jobs_.push_back(std::move(job));
    ++stats_.jobs_submitted;
    work_cv_.SignalAll();
  }
  if (backend_ == IoBackend::kIoUring) WakeUringThread();
  return id;
}

bool Loader::Cancel(uint64_t id) {
  bool found = false;
  {
    MutexLock lock(&mutex_);
    for (auto& job : jobs_) {
      if (job->id == id) {
        job->cancelled = true;
        found = true;
        break;
      }
    }
    if (found) work_cv_.SignalAll();
  }
  if (found && backend_ == IoBackend::kIoUring) WakeUringThread();
  return found;
}

void Loader::Drain() {
  MutexLock lock(&mutex_);
  const uint64_t target = next_id_ - 1;
  for (;;) {
    const bool pending = std::any_of(jobs_.begin(), jobs_.end(), [&](const auto& j) { return j->id <= target; });
    if (!pending && callbacks_running_ == 0) return;
    drained_cv_.Wait();
  }
}

LoaderStats Loader::stats() const {
  MutexLock lock(&mutex_);
  return stats_;
}

bool Loader::NextChunkLocked(Chunk* c) {
  if (in_flight_ >= queue_depth_) return false;
  for (auto& job : jobs_) {
    if (job->cancelled || !job->error.ok() || job->issue_pos >= job->issue_end) continue;
    const size_t pos = job->issue_pos;
    const size_t len = std::min(chunk_bytes_, job->issue_end - pos);
    *c = Chunk{};
    c->job = job.get();
    c->offset = job->req.offset + pos;
    c->dst = job->req.dst + pos;
    c->len = len;
    c->need = std::min(len, job->req.length - pos);
    job->issue_pos += len;
    ++job->chunks_in_flight;
    if (job->start_s == 0) job->start_s = NowSeconds();
    ++in_flight_;
    ++stats_.reads_issued;
    stats_.max_in_flight = std::max(stats_.max_in_flight, in_flight_);
    return true;
  }
  return false;
}

bool Loader::HandleResult(Chunk* c, int64_t result, Status* status) {
  const Job& job = *c->job;
  auto where = [&] {
    return job.req.file->name() + " at offset " + std::to_string(c->offset + c->done) + " (" + job.req.label + ")";
  };
  if (result == -EINTR || result == -EAGAIN) {
    if (++c->retries <= kMaxRetries) {
      ++c->reissues;
      return false;
    }
  }
  if (result < 0) {
    *status = Status::IOError("read of " + std::to_string(c->len - c->done) + " bytes failed: " + where() + ": " +
                              std::strerror(static_cast<int>(-result)));
    return true;
  }
  c->retries = 0;
  c->bytes += static_cast<uint64_t>(result);
  const size_t got = c->done + static_cast<size_t>(result);
  if (got >= c->need) {
    *status = Status::Ok();
    return true;
  }
  // 0, or a short read that reached the end of the file: the rest does not exist (the file
  // shrank after the job was checked against its size).
  if (result == 0 || c->offset + got >= job.req.file->size()) {
    *status = Status::IOError("unexpected end of file: " + where() + ", " + SizeText(*job.req.file) +
                              "; the file may have been truncated while in use");
    return true;
  }
  // A short read: resume. With O_DIRECT the next read must start aligned, so keep only the
  // aligned part of the progress and read the tail again.
  ++c->short_reads;
  const size_t next = got / job.align * job.align;
  if (next == c->done) {
    if (++c->stalls > kMaxStalls) {
      *status = Status::IOError("reads keep returning less than one aligned block: " + where());
      return true;
    }
  } else {
    c->stalls = 0;
  }
  c->done = next;
  ++c->reissues;
  return false;
}

void Loader::FinishChunkLocked(const Chunk& c, Status status) {
  Job& job = *c.job;
  --job.chunks_in_flight;
  --in_flight_;
  job.bytes += c.bytes;
  stats_.bytes_read += c.bytes;
  stats_.reads_issued += c.reissues;
  stats_.short_reads += c.short_reads;
  if (!status.ok() && job.error.ok()) job.error = std::move(status);
}

void Loader::CollectFinishedLocked(std::vector<std::unique_ptr<Job>>* out) {
  bool any = false;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if ((*it)->Finished()) {
      Job& job = **it;
      if (job.cancelled) {
        ++stats_.jobs_cancelled;
      } else if (!job.error.ok()) {
        ++stats_.jobs_failed;
      } else {
        ++stats_.jobs_ok;
      }
      ++callbacks_running_;
      out->push_back(std::move(*it));
      it = jobs_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  if (any) work_cv_.SignalAll();  // idle workers re-check the shutdown condition
}

void Loader::RunCallbacks(std::vector<std::unique_ptr<Job>>* finished) {
  if (finished->empty()) return;
  for (auto& job : *finished) {
    ReadResult r;
    r.id = job->id;
    r.outcome = job->cancelled ? ReadOutcome::kCancelled : !job->error.ok() ? ReadOutcome::kFailed : ReadOutcome::kOk;
    if (r.outcome == ReadOutcome::kFailed) r.status = job->error;
    r.bytes_read = job->bytes;
    r.submit_s = job->submit_s;
    r.start_s = job->start_s;
    r.end_s = NowSeconds();
    if (job->req.done) job->req.done(r);
  }
  MutexLock lock(&mutex_);
  callbacks_running_ -= finished->size();
  finished->clear();
  drained_cv_.SignalAll();
}

// ---- pread backend -------------------------------------------------------------------------

void Loader::PreadWorker() {
  for (;;) {
    Chunk c;
    bool have = false, exit = false;
    std::vector<std::unique_ptr<Job>> finished;
    {
      MutexLock lock(&mutex_);
      for (;;) {
        CollectFinishedLocked(&finished);
        if (!finished.empty()) break;
        if ((have = NextChunkLocked(&c))) break;
        if ((exit = stopping_ && jobs_.empty())) break;
        work_cv_.Wait();
      }
    }
    RunCallbacks(&finished);
    if (exit) return;
    if (!have) continue;
    Status status;
    File* file = c.job->req.file;
    while (!HandleResult(&c, file->ReadOnce(c.offset + c.done, c.len - c.done, c.dst + c.done), &status)) {
    }
    MutexLock lock(&mutex_);
    FinishChunkLocked(c, std::move(status));
  }
}

// ---- io_uring backend ----------------------------------------------------------------------

void Loader::WakeUringThread() {
  const uint64_t one = 1;
  // A full eventfd counter (never in practice) still wakes the reader, so the result is moot.
  [[maybe_unused]] const ssize_t r = write(wake_fd_, &one, sizeof(one));
}

void Loader::UringLoop() {
  Ring& R = *ring_;
  // Queues a read for chunk slot s (or the wake-up read of the eventfd for s < 0). The SQ has
  // Q + 1 entries and at most Q chunks + 1 wake-up read are ever outstanding, so it never fills.
  auto prep = [&](int s) {
    io_uring_sqe* sqe = io_uring_get_sqe(&R.ring);
    ESTREAM_CHECK(sqe != nullptr, "loader: io_uring submission queue full");
    if (s < 0) {
      io_uring_prep_read(sqe, wake_fd_, &R.wake_buf, sizeof(R.wake_buf), 0);
      io_uring_sqe_set_data(sqe, nullptr);
    } else {
      Chunk& c = R.slots[s];
      io_uring_prep_read(sqe, c.job->req.file->fd(), c.dst + c.done, static_cast<unsigned>(c.len - c.done),
                         c.offset + c.done);
      io_uring_sqe_set_data(sqe, &c);
    }
  };
  prep(-1);
  for (;;) {
    std::vector<std::unique_ptr<Job>> finished;
    std::vector<int> sync_slots;  // chunks of files without a descriptor: read right here
    bool exit = false;
    {
      MutexLock lock(&mutex_);
      Chunk c;
      while (!R.free_slots.empty() && NextChunkLocked(&c)) {
        const int s = R.free_slots.back();
        R.free_slots.pop_back();
        R.slots[s] = c;
        if (c.job->req.file->fd() < 0) {
          sync_slots.push_back(s);
        } else {
          prep(s);
        }
      }
      CollectFinishedLocked(&finished);
      exit = stopping_ && jobs_.empty() && in_flight_ == 0;
    }
    RunCallbacks(&finished);
    if (exit) return;  // the pending wake-up read dies with the ring
    for (int s : sync_slots) {
      Chunk& c = R.slots[s];
      Status status;
      while (!HandleResult(&c, c.job->req.file->ReadOnce(c.offset + c.done, c.len - c.done, c.dst + c.done), &status)) {
      }
      MutexLock lock(&mutex_);
      FinishChunkLocked(c, std::move(status));
      R.free_slots.push_back(s);
    }
    if (!sync_slots.empty()) continue;  // retire finished jobs before blocking

    io_uring_submit(&R.ring);
    io_uring_cqe* cqe = nullptr;
    int err = io_uring_wait_cqe(&R.ring, &cqe);
    if (err == -EINTR) continue;
    ESTREAM_CHECK(err == 0, "loader: io_uring_wait_cqe failed");
    // Retire every completion available now.
    while (io_uring_peek_cqe(&R.ring, &cqe) == 0) {
      auto* c = static_cast<Chunk*>(io_uring_cqe_get_data(cqe));
      const int64_t res = cqe->res;
      io_uring_cqe_seen(&R.ring, cqe);
      if (c == nullptr) {  // the eventfd: someone submitted, cancelled or is shutting down
        prep(-1);
        continue;
      }
      Status status;
      const int64_t filtered = c->job->req.file->FilterCompletion(c->offset + c->done, c->len - c->done, c->dst + c->done, res);
      if (!HandleResult(c, filtered, &status)) {
        prep(static_cast<int>(c - R.slots.data()));
        continue;
      }
      MutexLock lock(&mutex_);
      FinishChunkLocked(*c, std::move(status));
      R.free_slots.push_back(static_cast<int>(c - R.slots.data()));
    }
  }
}

}  // namespace estream::io
