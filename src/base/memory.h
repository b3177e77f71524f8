// Memory helpers: aligned allocation and the process's resident-set figures.
// Peak memory in estream always means the process's peak RSS (VmHWM), the figure users see.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace estream {

// Peak resident set size of this process in bytes (VmHWM), or 0 if it cannot be read.
uint64_t PeakRssBytes();
// Current resident set size in bytes (VmRSS), or 0 if it cannot be read.
uint64_t CurrentRssBytes();
// Resets the process's peak RSS (VmHWM) to its current RSS by writing "5" to
// /proc/self/clear_refs (Linux >= 4.0), so that a later PeakRssBytes() reports the peak of what
// happened since. Process-wide: affects every thread's view. False when not possible (no /proc,
// an older kernel, a sandbox that forbids the write); the peak is then unchanged.
bool ResetPeakRss();

// Aligned heap memory. `alignment` is a power of two >= sizeof(void*). Returns nullptr when
// the allocation fails (callers turn that into a ResourceExhausted Status).
void* AlignedAlloc(size_t alignment, size_t bytes);
void AlignedFree(void* p);

struct AlignedDeleter {
  void operator()(void* p) const { AlignedFree(p); }
};
template <typename T>
using AlignedPtr = std::unique_ptr<T[], AlignedDeleter>;

// Allocates n elements of T (uninitialised) at 64-byte alignment; nullptr on failure.
template <typename T>
AlignedPtr<T> AllocAligned(size_t n, size_t alignment = 64) {
  return AlignedPtr<T>(static_cast<T*>(AlignedAlloc(alignment, n != 0 ? n * sizeof(T) : alignment)));
}

}  // namespace estream
