#include "base/memory.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace estream {
namespace {

uint64_t ReadStatusKb(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kb = 0;
  const size_t key_len = std::strlen(key);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, key, key_len) == 0) {
      kb = std::strtoull(line + key_len, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kb;
}

}  // namespace

uint64_t PeakRssBytes() { return ReadStatusKb("VmHWM:") * 1024; }
uint64_t CurrentRssBytes() { return ReadStatusKb("VmRSS:") * 1024; }

bool ResetPeakRss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  // "5" resets the peak resident set size (Documentation/filesystems/proc.rst, clear_refs).
  const bool wrote = std::fputs("5", f) >= 0;
  const bool closed = std::fclose(f) == 0;  // the write reaches the kernel at the flush
  return wrote && closed;
}

void* AlignedAlloc(size_t alignment, size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, alignment, bytes == 0 ? alignment : bytes) != 0) return nullptr;
  return p;
}

void AlignedFree(void* p) { std::free(p); }

}  // namespace estream
