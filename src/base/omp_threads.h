// ScopedOmpThreads: sets the calling thread's OpenMP team size for the life of the object, then
// restores the previous one (the engine's Run, the packer's repacking, benchmarks).
#pragma once

#include <omp.h>

namespace estream {

// The most compute threads any part of estream accepts (estream::kMaxThreads in the public
// estream/engine.h equals it: src/model/engine.cc checks); for layers below the engine, which
// may not include it (pack, docs/DESIGN.md section 1).
inline constexpr int kMaxComputeThreads = 1024;

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
