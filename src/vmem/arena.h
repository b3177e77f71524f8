// Arena: the bounded, fixed-address memory that holds resident experts (docs/DESIGN.md section 4).
//
// The arena is P = B x G slots, each able to hold one expert record of `slot_bytes` (W_e) bytes,
// in ONE aligned allocation made at creation and kept for the life of the engine. Slots are
// grouped into B banks of G consecutive slots; a bank is the unit the loader fills with one
// contiguous read (one group of G experts on disk). Layout:
//
//   slot_stride = RoundUp(slot_bytes, alignment)       (the packed file's record stride)
//   bank_bytes  = G * slot_stride
//   slot(b, r)  = base + (b * G + r) * slot_stride      (b < B, r < G)
//
// Addresses and strides never change after Create: only the contents do, and who may look at
// them is decided by the ResidencyTable (residency.h). `alignment` is at least 4096 so every
// slot and bank is a valid O_DIRECT destination.
//
// Ownership: the Arena owns its memory. It is neither copyable nor movable (addresses handed
// out must stay valid). Thread safety: all methods are const and may be called concurrently;
// the memory itself is shared and its use is coordinated through the ResidencyTable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/check.h"
#include "base/status.h"

namespace estream::vmem {

constexpr size_t kArenaMinAlignment = 4096;  // O_DIRECT needs block-aligned buffers

struct ArenaParams {
  size_t n_banks = 0;     // B >= 1
  size_t group_size = 0;  // G >= 1 slots per bank
  size_t slot_bytes = 0;  // W_e >= 1: bytes of one expert record
  size_t alignment = kArenaMinAlignment;  // power of two >= 4096
  // Touch every page at creation, so the arena's memory is resident (and counted in RSS) from
  // the start rather than on first fill.
  bool prefault = false;
};

class Arena {
 public:
  // Allocates the arena. InvalidArgument for zero sizes or a bad alignment; ResourceExhausted
  // when the allocation fails or the total size overflows.
  static Result<std::unique_ptr<Arena>> Create(const ArenaParams& params);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  size_t n_banks() const { return n_banks_; }        // B
  size_t group_size() const { return group_size_; }  // G
  size_t n_slots() const { return n_banks_ * group_size_; }  // P
  size_t slot_bytes() const { return slot_bytes_; }  // W_e
  size_t slot_stride() const { return slot_stride_; }
  size_t bank_bytes() const { return group_size_ * slot_stride_; }
  size_t total_bytes() const { return n_slots() * slot_stride_; }  // M_arena
  size_t alignment() const { return alignment_; }
  uint8_t* base() const { return base_; }

  // Global slot index of bank b's slot r: b * G + r.
  size_t SlotIndex(size_t bank, size_t r) const {
    ESTREAM_DCHECK(bank < n_banks_ && r < group_size_, "Arena::SlotIndex out of range");
    return bank * group_size_ + r;
  }
  // Address of global slot s (s < P).
  uint8_t* SlotAddress(size_t slot) const {
    ESTREAM_DCHECK(slot < n_slots(), "Arena::SlotAddress out of range");
    return base_ + slot * slot_stride_;
  }
  uint8_t* Slot(size_t bank, size_t r) const { return SlotAddress(SlotIndex(bank, r)); }
  // First byte of bank b: its G slots follow contiguously, bank_bytes() in all.
  uint8_t* Bank(size_t bank) const { return Slot(bank, 0); }
  // Record r of a group whose records are `record_stride` bytes apart on disk, after the group
  // was read into bank b as one range. Layers of one packed model may have different record
  // strides (a Q4_K_M file keeps some ffn_down in Q6_K): the arena is sized for the largest
  // (slot_stride), and a layer with smaller records packs them tighter in the bank. With
  // record_stride == slot_stride() this is Slot(b, r). REQUIRES: record_stride <= slot_stride().
  uint8_t* Record(size_t bank, size_t r, size_t record_stride) const {
    ESTREAM_DCHECK(record_stride <= slot_stride_ && r < group_size_, "Arena::Record out of range");
    return Bank(bank) + r * record_stride;
  }

 private:
  Arena(size_t n_banks, size_t group_size, size_t slot_bytes, size_t slot_stride, size_t alignment,
        uint8_t* base)
      : n_banks_(n_banks), group_size_(group_size), slot_bytes_(slot_bytes),
        slot_stride_(slot_stride), alignment_(alignment), base_(base) {}

  const size_t n_banks_;
  const size_t group_size_;
  const size_t slot_bytes_;
  const size_t slot_stride_;
  const size_t alignment_;
  uint8_t* const base_;  // owned; AlignedFree in the destructor
};

}  // namespace estream::vmem
