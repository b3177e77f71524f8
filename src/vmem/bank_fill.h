// Glue between the loader (io/loader.h) and the residency table: read one group into the bank
// reserved for it and publish it when every byte arrived.
//
// Usage (a scheduler):
//   ESTREAM_ASSIGN_OR_RETURN(BankTicket t, table.Reserve(g, request_id, timeout_s));
//   ESTREAM_ASSIGN_OR_RETURN(uint64_t job, SubmitBankFill({.loader = &loader, ..., .ticket = t, ...}));
//   ... later an executor: table.AcquireWhenReady(g, n_work, timeout_s) / Complete(ticket).
//   A group found inactive: loader.Cancel(job) (unread groups end Available), or, once Ready,
//   table.Release(ticket).
//
// On kOk the bank is published (Filling -> Ready); on kFailed the fill is aborted with the
// loader's Status prefixed by the group's name (WaitReady callers for the group get it); on
// kCancelled the fill is aborted with an OK status. Then `then` (if any) runs, on the loader
// thread. The bank's memory is written only between Submit and that callback.
#pragma once

#include <cstdint>
#include <functional>

#include "io/loader.h"
#include "vmem/arena.h"
#include "vmem/residency.h"

namespace estream::vmem {

struct BankFill {
  io::Loader* loader = nullptr;
  ResidencyTable* table = nullptr;
  const Arena* arena = nullptr;
  io::File* file = nullptr;
  BankTicket ticket{};  // from table->Reserve(group, ...): the bank is Filling
  GroupId group{};      // the group that ticket was reserved for
  uint64_t offset = 0;  // file offset of the group's first record
  size_t length = 0;    // bytes of the group: <= arena->bank_bytes()
  std::function<void(const io::ReadResult&)> then{};
};

// Submits the read; returns the loader's job id. On error (InvalidArgument from the loader or
// a length larger than a bank) the fill is aborted with that error and nothing is queued.
Result<uint64_t> SubmitBankFill(BankFill fill);

}  // namespace estream::vmem
