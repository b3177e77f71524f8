// Arena: fixed, aligned slot addresses; creation errors.
#include "vmem/arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>

namespace estream::vmem {
namespace {

TEST(Arena, AddressesAreFixedAlignedAndDisjoint) {
  // Awkward record sizes: below, at and just above a 4 KiB multiple.
  for (size_t slot_bytes : {size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{2723841}}) {
    for (size_t g : {1, 3, 8}) {
      for (size_t b : {1, 2, 5}) {
        auto arena = Arena::Create({.n_banks = b, .group_size = g, .slot_bytes = slot_bytes});
        ASSERT_TRUE(arena.ok()) << arena.status().ToString();
        const Arena& a = **arena;
        const size_t stride = (slot_bytes + 4095) / 4096 * 4096;
        EXPECT_EQ(a.slot_stride(), stride);
        EXPECT_EQ(a.n_slots(), b * g);
        EXPECT_EQ(a.bank_bytes(), g * stride);
        EXPECT_EQ(a.total_bytes(), b * g * stride);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(a.base()) % 4096, 0u);
        for (size_t bank = 0; bank < b; ++bank) {
          EXPECT_EQ(a.Bank(bank), a.base() + bank * g * stride);
          for (size_t r = 0; r < g; ++r) {
            uint8_t* p = a.Slot(bank, r);
            EXPECT_EQ(p, a.base() + (bank * g + r) * stride);
            EXPECT_EQ(a.SlotAddress(a.SlotIndex(bank, r)), p);
            EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
            EXPECT_EQ(a.Record(bank, r, stride), p);
            EXPECT_EQ(a.Record(bank, r, 4096), a.Bank(bank) + r * 4096);  // a layer with smaller records
          }
        }
        // Fill every slot's full record with its own byte, then check nothing overlapped
        // (ASan builds would also catch a write past the allocation).
        for (size_t s = 0; s < a.n_slots(); ++s) std::memset(a.SlotAddress(s), static_cast<int>(s * 7 + 1), slot_bytes);
        for (size_t s = 0; s < a.n_slots(); ++s) {
          const uint8_t* p = a.SlotAddress(s);
          EXPECT_EQ(p[0], static_cast<uint8_t>(s * 7 + 1));
          EXPECT_EQ(p[slot_bytes - 1], static_cast<uint8_t>(s * 7 + 1));
        }
        // Addresses never move: the same calls give the same answers later.
        uint8_t* const base = a.base();
        EXPECT_EQ(a.base(), base);
      }
    }
  }
}

TEST(Arena, LargerAlignmentAndPrefault) {
  auto arena = Arena::Create({.n_banks = 2, .group_size = 2, .slot_bytes = 5000, .alignment = 1 << 16, .prefault = true});
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_EQ((*arena)->slot_stride(), size_t{1} << 16);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*arena)->base()) % (1 << 16), 0u);
  EXPECT_EQ((*arena)->Slot(1, 1)[0], 0);  // prefault zeroed the first byte of each page
}

TEST(Arena, BadParameters) {
  EXPECT_EQ(Arena::Create({.n_banks = 0, .group_size = 1, .slot_bytes = 1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Arena::Create({.n_banks = 1, .group_size = 0, .slot_bytes = 1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Arena::Create({.n_banks = 1, .group_size = 1, .slot_bytes = 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Arena::Create({.n_banks = 1, .group_size = 1, .slot_bytes = 1, .alignment = 6000}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Arena::Create({.n_banks = 1, .group_size = 1, .slot_bytes = 1, .alignment = 512}).status().code(),
            StatusCode::kInvalidArgument);
  const size_t huge = std::numeric_limits<size_t>::max() / 2;
  auto r = Arena::Create({.n_banks = huge, .group_size = 4, .slot_bytes = 4096});
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace estream::vmem
