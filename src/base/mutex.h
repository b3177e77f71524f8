// Mutex, MutexLock and CondVar with clang thread-safety annotations.
//
// std::mutex carries no capability annotations in libstdc++, so clang's -Wthread-safety cannot
// check code that uses it directly. These thin wrappers add them: declare shared state
// `ESTREAM_GUARDED_BY(mutex_)`, functions that need the lock `ESTREAM_REQUIRES(mutex_)`, and
// clang (with -Wthread-safety) proves at compile time that every access holds the lock. With
// gcc the annotations compile to nothing.
//
// Thread safety: Mutex and CondVar are, of course, meant to be shared between threads; a
// MutexLock belongs to the thread that made it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define ESTREAM_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define ESTREAM_THREAD_ANNOTATION_(x)
#endif

#define ESTREAM_CAPABILITY(x) ESTREAM_THREAD_ANNOTATION_(capability(x))
#define ESTREAM_SCOPED_CAPABILITY ESTREAM_THREAD_ANNOTATION_(scoped_lockable)
#define ESTREAM_GUARDED_BY(x) ESTREAM_THREAD_ANNOTATION_(guarded_by(x))
#define ESTREAM_PT_GUARDED_BY(x) ESTREAM_THREAD_ANNOTATION_(pt_guarded_by(x))
#define ESTREAM_REQUIRES(...) ESTREAM_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define ESTREAM_EXCLUDES(...) ESTREAM_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define ESTREAM_ACQUIRE(...) ESTREAM_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define ESTREAM_RELEASE(...) ESTREAM_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define ESTREAM_ASSERT_CAPABILITY(x) ESTREAM_THREAD_ANNOTATION_(assert_capability(x))
#define ESTREAM_NO_THREAD_SAFETY_ANALYSIS ESTREAM_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace estream {

class ESTREAM_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ESTREAM_ACQUIRE() { mu_.lock(); }
  void Unlock() ESTREAM_RELEASE() { mu_.unlock(); }
  // Tells the analysis the lock is held (for code it cannot follow, e.g. lambdas).
  void AssertHeld() const ESTREAM_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for the scope.
class ESTREAM_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ESTREAM_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ESTREAM_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable bound to one Mutex for its life. Waits may wake spuriously: callers
// re-check their condition in a loop.
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // REQUIRES: mu held (not annotated: the analysis cannot tie this mu to the caller's member).
  // Releases it while waiting, holds it again on return.
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait, for at most until `deadline`. Returns false if the deadline passed.
  bool WaitUntil(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    const bool woke = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woke;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

}  // namespace estream
