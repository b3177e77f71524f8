#include "vmem/arena.h"

#include <unistd.h>

#include <cstring>
#include <string>

#include "base/memory.h"

namespace estream::vmem {

Result<std::unique_ptr<Arena>> Arena::Create(const ArenaParams& p) {
  if (p.n_banks == 0 || p.group_size == 0 || p.slot_bytes == 0) {
    return Status::InvalidArgument("arena: banks (" + std::to_string(p.n_banks) + "), group size (" +
                                   std::to_string(p.group_size) + ") and slot bytes (" +
                                   std::to_string(p.slot_bytes) + ") must all be >= 1");
  }
  if (p.alignment < kArenaMinAlignment || (p.alignment & (p.alignment - 1)) != 0) {
    return Status::InvalidArgument("arena: alignment " + std::to_string(p.alignment) +
                                   " must be a power of two >= 4096");
  }
  const size_t stride = (p.slot_bytes + p.alignment - 1) / p.alignment * p.alignment;
  size_t slots = 0, total = 0;
  if (stride < p.slot_bytes || __builtin_mul_overflow(p.n_banks, p.group_size, &slots) ||
      __builtin_mul_overflow(slots, stride, &total)) {
    return Status::ResourceExhausted("arena: " + std::to_string(p.n_banks) + " banks x " +
                                     std::to_string(p.group_size) + " slots x " +
                                     std::to_string(p.slot_bytes) + " bytes overflows size_t");
  }
  auto* base = static_cast<uint8_t*>(AlignedAlloc(p.alignment, total));
  if (base == nullptr) {
    return Status::ResourceExhausted("arena: cannot allocate " + std::to_string(total) +
                                     " bytes; use fewer banks or a smaller group size");
  }
  if (p.prefault) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    for (size_t i = 0; i < total; i += page) base[i] = 0;
  }
  return std::unique_ptr<Arena>(new Arena(p.n_banks, p.group_size, p.slot_bytes, stride, p.alignment, base));
}

Arena::~Arena() { AlignedFree(base_); }

}  // namespace estream::vmem
