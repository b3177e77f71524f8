// ScopedOmpThreads: sets the calling thread's OpenMP team size for the life of the object, then
// restores the previous one (the engine's Run, the packer's repacking, benchmarks).
#pragma once

#include <omp.h>

namespace estream {

class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedOmpThreads() { omp_set_num_threads(saved_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  const int saved_;
};

}  // namespace estream
