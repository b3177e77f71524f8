#include "vmem/bank_fill.h"

#include <string>
#include <utility>

namespace estream::vmem {

Result<uint64_t> SubmitBankFill(BankFill f) {
  ESTREAM_CHECK(f.loader != nullptr && f.table != nullptr && f.arena != nullptr && f.file != nullptr,
                "SubmitBankFill: loader, table, arena and file are required");
  ResidencyTable* table = f.table;
  const BankTicket ticket = f.ticket;
  const std::string name = GroupName(f.group);
  if (ticket.bank < 0 || static_cast<size_t>(ticket.bank) >= f.arena->n_banks()) {
    return Status::InvalidArgument("SubmitBankFill: " + name + ": bank " + std::to_string(ticket.bank) + " not in the arena");
  }
  if (f.length > f.arena->bank_bytes()) {
    Status s = Status::InvalidArgument("SubmitBankFill: " + name + " has " + std::to_string(f.length) +
                                       " bytes, more than a bank (" + std::to_string(f.arena->bank_bytes()) + ")");
    (void)table->AbortFill(ticket, s);
    return s;
  }
  io::ReadRequest req;
  req.file = f.file;
  req.offset = f.offset;
  req.length = f.length;
  req.dst = f.arena->Bank(ticket.bank);
  req.dst_capacity = f.arena->bank_bytes();
  req.label = name;
  req.done = [table, ticket, then = std::move(f.then)](const io::ReadResult& r) {
    Status s;
    switch (r.outcome) {
      case io::ReadOutcome::kOk: s = table->Publish(ticket); break;
      case io::ReadOutcome::kFailed: s = table->AbortFill(ticket, r.status); break;
      case io::ReadOutcome::kCancelled: s = table->AbortFill(ticket, Status::Ok()); break;
    }
    // The ticket came from Reserve and only this callback ends the fill: a failure here is a
    // broken invariant (someone else published or aborted our bank).
    ESTREAM_CHECK(s.ok(), s.message().c_str());
    if (then) then(r);
  };
  Result<uint64_t> id = f.loader->Submit(std::move(req));
  if (!id.ok()) (void)table->AbortFill(ticket, id.status());
  return id;
}

}  // namespace estream::vmem
