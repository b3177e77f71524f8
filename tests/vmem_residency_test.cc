// ResidencyTable: every legal transition, illegal ones rejected (Status) or fatal (CHECK),
// hidden mappings, blocking waits, invariants.
#include "vmem/residency.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <thread>

namespace estream::vmem {
namespace {

std::unique_ptr<ResidencyTable> MakeTable(int32_t n_layers, int32_t n_expert, int32_t g, int32_t b,
                                          std::vector<std::vector<int32_t>> perm = {}) {
  auto t = ResidencyTable::Create({.n_layers = n_layers, .n_expert = n_expert, .group_size = g, .n_banks = b,
                                   .expert_to_position = std::move(perm)});
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

void ExpectConsistent(const ResidencyTable& t) {
  const Status s = t.CheckInvariants();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(Residency, Geometry) {
  // 10 experts in groups of 4: groups of 4, 4, 2.
  auto t = MakeTable(2, 10, 4, 2);
  EXPECT_EQ(t->n_groups(), 3);
  EXPECT_EQ(t->ExpertsInGroup(0), 4);
  EXPECT_EQ(t->ExpertsInGroup(2), 2);
  EXPECT_EQ(t->GroupOf(1, 9), (GroupId{1, 2}));
  EXPECT_EQ(t->PositionInGroup(1, 9), 1);
  EXPECT_EQ(t->ExpertAt(1, 2, 1), 9);
}

TEST(Residency, Permutation) {
  // Layer 0 identity (empty), layer 1 reversed.
  std::vector<int32_t> rev(6);
  for (int e = 0; e < 6; ++e) rev[e] = 5 - e;
  auto t = MakeTable(2, 6, 4, 2, {{}, rev});
  EXPECT_EQ(t->GroupOf(0, 0), (GroupId{0, 0}));
  EXPECT_EQ(t->GroupOf(1, 0), (GroupId{1, 1}));  // position 5
  EXPECT_EQ(t->PositionInGroup(1, 0), 1);
  for (int e = 0; e < 6; ++e) {
    const GroupId g = t->GroupOf(1, e);
    EXPECT_EQ(t->ExpertAt(1, g.group, t->PositionInGroup(1, e)), e);
  }
  // Slots follow the permutation once published.
  auto ticket = t->Reserve({1, 1}, 0, 0);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(t->Publish(*ticket).ok());
  EXPECT_EQ(t->SlotOf(1, 0), ticket->bank * 4 + 1);
  EXPECT_EQ(t->SlotOf(1, 1), ticket->bank * 4 + 0);
  EXPECT_EQ(t->SlotOf(1, 2), -1);  // position 3: group 0, not loaded
}

TEST(Residency, BadParameters) {
  EXPECT_EQ(ResidencyTable::Create({.n_layers = 0, .n_expert = 4, .group_size = 1, .n_banks = 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ResidencyTable::Create({.n_layers = 1, .n_expert = 4, .group_size = 1, .n_banks = 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ResidencyTable::Create({.n_layers = 1, .n_expert = 3, .group_size = 1, .n_banks = 1,
                                    .expert_to_position = {{0, 1, 1}}}).status().code(),
            StatusCode::kInvalidArgument);  // not a permutation
  EXPECT_EQ(ResidencyTable::Create({.n_layers = 1, .n_expert = 3, .group_size = 1, .n_banks = 1,
                                    .expert_to_position = {{0, 1}}}).status().code(),
            StatusCode::kInvalidArgument);  // wrong length
  EXPECT_EQ(ResidencyTable::Create({.n_layers = 2, .n_expert = 3, .group_size = 1, .n_banks = 1,
                                    .expert_to_position = {{0, 1, 2}}}).status().code(),
            StatusCode::kInvalidArgument);  // wrong layer count
}

TEST(Residency, FullCycleHidesMappingUntilPublish) {
  auto t = MakeTable(2, 8, 2, 3);
  const GroupId g{1, 2};  // experts 4, 5
  auto ticket = t->Reserve(g, 42, 0);
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  const int32_t b = ticket->bank;
  EXPECT_EQ(t->Bank(b).state, BankState::kFilling);
  EXPECT_EQ(t->Bank(b).owner, 42u);
  EXPECT_EQ(t->Bank(b).group, g);
  EXPECT_EQ(t->StateOf(g), BankState::kFilling);
  EXPECT_EQ(t->SlotOf(1, 4), -1) << "a Filling group must be invisible";
  EXPECT_EQ(t->SlotOf(1, 5), -1);
  ExpectConsistent(*t);

  ASSERT_TRUE(t->Publish(*ticket).ok());
  EXPECT_EQ(t->Bank(b).state, BankState::kReady);
  EXPECT_EQ(t->SlotOf(1, 4), b * 2 + 0);
  EXPECT_EQ(t->SlotOf(1, 5), b * 2 + 1);
  EXPECT_EQ(t->SlotOf(0, 4), -1);  // same group index, other layer
  std::vector<int32_t> slots(8, 99);
  t->SlotsOfLayer(1, slots.data());
  EXPECT_EQ(slots, (std::vector<int32_t>{-1, -1, -1, -1, b * 2, b * 2 + 1, -1, -1}));

  ASSERT_TRUE(t->Acquire(*ticket, 2).ok());
  EXPECT_EQ(t->Bank(b).state, BankState::kInUse);
  EXPECT_EQ(t->Bank(b).refs, 2);
  ASSERT_TRUE(t->Acquire(*ticket, 1).ok());  // more work while InUse
  EXPECT_EQ(t->Bank(b).refs, 3);
  ExpectConsistent(*t);
  t->Complete(*ticket);
  t->Complete(*ticket);
  EXPECT_EQ(t->Bank(b).state, BankState::kInUse);
  EXPECT_EQ(t->SlotOf(1, 4), b * 2);  // still mapped while referenced
  t->Complete(*ticket);                // last completion: invalidate and free
  EXPECT_EQ(t->Bank(b).state, BankState::kAvailable);
  EXPECT_EQ(t->SlotOf(1, 4), -1);
  EXPECT_FALSE(t->Find(g).has_value());
  EXPECT_EQ(t->CountInState(BankState::kAvailable), 3);
  ExpectConsistent(*t);
  const ResidencyStats st = t->stats();
  EXPECT_EQ(st.reserves, 1u);
  EXPECT_EQ(st.publishes, 1u);
  EXPECT_EQ(st.completions, 3u);
  EXPECT_EQ(st.frees, 1u);
}

TEST(Residency, ReadyReleasedDirectly) {
  auto t = MakeTable(1, 4, 2, 1);
  auto ticket = t->Reserve({0, 1}, 1, 0);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(t->Publish(*ticket).ok());
  ASSERT_TRUE(t->Release(*ticket).ok());
  EXPECT_EQ(t->Bank(0).state, BankState::kAvailable);
  EXPECT_EQ(t->SlotOf(0, 2), -1);
  ExpectConsistent(*t);
  // ReleaseAllReady
  auto a = t->Reserve({0, 0}, 1, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(t->Publish(*a).ok());
  EXPECT_EQ(t->ReleaseAllReady(), 1);
  EXPECT_EQ(t->CountInState(BankState::kAvailable), 1);
}

TEST(Residency, KeptBankSurvivesItsLastCompleteUntilReleased) {
  auto t = MakeTable(1, 4, 2, 2);
  auto k = t->Reserve({0, 1}, 1, 0);
  ASSERT_TRUE(k.ok());
  EXPECT_FALSE(t->Keep(*k, true).ok()) << "a Filling bank cannot be kept";
  ASSERT_TRUE(t->Publish(*k).ok());
  ASSERT_TRUE(t->Acquire(*k, 2).ok());
  ASSERT_TRUE(t->Keep(*k, true).ok());
  EXPECT_TRUE(t->Bank(k->bank).kept);
  t->Complete(*k);
  t->Complete(*k);  // the last reference: Ready again, still mapped
  EXPECT_EQ(t->Bank(k->bank).state, BankState::kReady);
  EXPECT_EQ(t->SlotOf(0, 3), k->bank * 2 + 1);
  EXPECT_EQ(t->CountKept(), 1);
  ExpectConsistent(*t);
  // Not released between requests; WaitIdle does not wait for it.
  EXPECT_EQ(t->ReleaseAllReady(), 0);
  EXPECT_TRUE(t->WaitIdle(0).ok());
  // Used again with the same ticket (no new fill), then evicted.
  ASSERT_TRUE(t->Acquire(*k, 1).ok());
  EXPECT_FALSE(t->Release(*k).ok()) << "an InUse kept bank cannot be evicted";
  t->Complete(*k);
  EXPECT_EQ(t->Find({0, 1}), std::optional<BankTicket>(*k));
  ASSERT_TRUE(t->Release(*k).ok());
  EXPECT_EQ(t->Bank(k->bank).state, BankState::kAvailable);
  EXPECT_FALSE(t->Bank(k->bank).kept);
  EXPECT_EQ(t->SlotOf(0, 3), -1);
  EXPECT_EQ(t->CountKept(), 0);
  ExpectConsistent(*t);
  // Unmarked again before its last Complete: freed as usual.
  auto u = t->Reserve({0, 0}, 2, 0);
  ASSERT_TRUE(u.ok());
  ASSERT_TRUE(t->Publish(*u).ok());
  ASSERT_TRUE(t->Keep(*u, true).ok());
  ASSERT_TRUE(t->Acquire(*u, 1).ok());
  ASSERT_TRUE(t->Keep(*u, false).ok());
  t->Complete(*u);
  EXPECT_EQ(t->Bank(u->bank).state, BankState::kAvailable);
  EXPECT_FALSE(t->Keep(*u, true).ok()) << "stale ticket";
  ExpectConsistent(*t);
}

TEST(Residency, AbortedFillNeverVisibleAndErrorReachesWaiters) {
  auto t = MakeTable(1, 4, 2, 2);
  const GroupId g{0, 1};
  auto ticket = t->Reserve(g, 1, 0);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(t->AbortFill(*ticket, Status::IOError("disk on fire at offset 8192")).ok());
  EXPECT_EQ(t->Bank(ticket->bank).state, BankState::kAvailable);
  EXPECT_EQ(t->SlotOf(0, 2), -1);
  auto w = t->WaitReady(g, 5.0);  // returns at once with the recorded error
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kIOError);
  EXPECT_NE(w.status().message().find("8192"), std::string::npos);
  // A new Reserve clears the error.
  auto again = t->Reserve(g, 2, 0);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(t->Publish(*again).ok());
  auto w2 = t->WaitReady(g, 0);
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ(*w2, *again);
  ExpectConsistent(*t);
}

// Every illegal transition is rejected with a Status and changes nothing.
TEST(Residency, IllegalTransitionsRejected) {
  auto t = MakeTable(2, 8, 2, 2);
  auto filling = t->Reserve({0, 0}, 1, 0);
  ASSERT_TRUE(filling.ok());
  const std::string before = t->DebugString();
  auto expect_rejected = [&](Status s, StatusCode code, const char* what) {
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_EQ(s.code(), code) << what << ": " << s.ToString();
    EXPECT_EQ(t->DebugString(), before) << what << " changed the table";
    ExpectConsistent(*t);
  };
  // On a Filling bank: no Acquire, no Release.
  expect_rejected(t->Acquire(*filling, 1), StatusCode::kInternal, "Acquire(Filling)");
  expect_rejected(t->Release(*filling), StatusCode::kInternal, "Release(Filling)");
  // Reserving a group already held, or out of range.
  expect_rejected(t->Reserve({0, 0}, 2, 0).status(), StatusCode::kInvalidArgument, "Reserve(held group)");
  expect_rejected(t->Reserve({2, 0}, 2, 0).status(), StatusCode::kInvalidArgument, "Reserve(bad layer)");
  expect_rejected(t->Reserve({0, 4}, 2, 0).status(), StatusCode::kInvalidArgument, "Reserve(bad group)");
  // Bad ticket shapes.
  expect_rejected(t->Publish({-1, 0}), StatusCode::kInvalidArgument, "Publish(bank -1)");
  expect_rejected(t->Publish({7, 0}), StatusCode::kInvalidArgument, "Publish(bank 7)");
  expect_rejected(t->Publish({filling->bank, filling->generation + 100}), StatusCode::kInternal, "Publish(wrong gen)");
  expect_rejected(t->Acquire(*filling, 0), StatusCode::kInvalidArgument, "Acquire(0)");

  ASSERT_TRUE(t->Publish(*filling).ok());
  const std::string ready = t->DebugString();
  auto expect_rejected_ready = [&](Status s, const char* what) {
    EXPECT_EQ(s.code(), StatusCode::kInternal) << what << ": " << s.ToString();
    EXPECT_EQ(t->DebugString(), ready) << what << " changed the table";
  };
  // On a Ready bank: no second Publish, no AbortFill (its bytes are visible already).
  expect_rejected_ready(t->Publish(*filling), "Publish(Ready)");
  expect_rejected_ready(t->AbortFill(*filling, Status::Ok()), "AbortFill(Ready)");

  ASSERT_TRUE(t->Acquire(*filling, 1).ok());
  const std::string in_use = t->DebugString();
  // On an InUse bank: no Release (it would be overwritten while referenced), no Publish/Abort.
  for (Status s : {t->Release(*filling), t->Publish(*filling), t->AbortFill(*filling, Status::Ok())}) {
    EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  }
  EXPECT_EQ(t->DebugString(), in_use);
  t->Complete(*filling);

  // A stale ticket (the bank was freed and refilled for another group) is rejected.
  auto next = t->Reserve({1, 3}, 3, 0);
  ASSERT_TRUE(next.ok());
  auto next2 = t->Reserve({1, 2}, 3, 0);
  ASSERT_TRUE(next2.ok());
  const BankTicket reused = next->bank == filling->bank ? *next : *next2;
  ASSERT_EQ(reused.bank, filling->bank);
  const Status stale = t->Publish(*filling);
  EXPECT_EQ(stale.code(), StatusCode::kInternal);
  EXPECT_NE(stale.message().find("stale"), std::string::npos) << stale.message();
  EXPECT_EQ(t->Bank(reused.bank).state, BankState::kFilling);
  ExpectConsistent(*t);
}

using ResidencyDeathTest = ::testing::Test;

TEST(ResidencyDeathTest, CompleteWithoutAcquireIsFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto t = MakeTable(1, 4, 2, 1);
  auto ticket = t->Reserve({0, 0}, 1, 0);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(t->Publish(*ticket).ok());
  EXPECT_DEATH(t->Complete(*ticket), "Complete");  // Ready: no work was submitted
  ASSERT_TRUE(t->Acquire(*ticket, 1).ok());
  t->Complete(*ticket);
  EXPECT_DEATH(t->Complete(*ticket), "stale");  // bank freed: more completions than work
}

TEST(Residency, BanksHandedOutOldestFreedFirst) {
  auto t = MakeTable(1, 8, 1, 3);
  std::vector<BankTicket> tk;
  for (int g = 0; g < 3; ++g) {
    auto r = t->Reserve({0, g}, 0, 0);
    ASSERT_TRUE(r.ok());
    tk.push_back(*r);
  }
  EXPECT_EQ(t->Reserve({0, 3}, 0, 0).status().code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(t->AbortFill(tk[2], Status::Ok()).ok());
  ASSERT_TRUE(t->AbortFill(tk[0], Status::Ok()).ok());
  auto a = t->Reserve({0, 4}, 0, 0);
  auto b = t->Reserve({0, 5}, 0, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->bank, tk[2].bank);
  EXPECT_EQ(b->bank, tk[0].bank);
}

TEST(Residency, ReserveTimeoutNamesEveryBank) {
  auto t = MakeTable(1, 4, 2, 2);
  ASSERT_TRUE(t->Reserve({0, 0}, 7, 0).ok());
  ASSERT_TRUE(t->Reserve({0, 1}, 8, 0).ok());
  ResidencyTable& table = *t;
  auto r = table.Reserve({0, 0}, 9, 0.01);  // held already: rejected without waiting
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  auto t2 = MakeTable(1, 6, 2, 2);
  ASSERT_TRUE(t2->Reserve({0, 0}, 7, 0).ok());
  ASSERT_TRUE(t2->Reserve({0, 1}, 8, 0).ok());
  auto r2 = t2->Reserve({0, 2}, 9, 0.01);
  ASSERT_EQ(r2.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r2.status().message().find("bank 0: Filling layer 0 group 0"), std::string::npos) << r2.status().message();
  EXPECT_NE(r2.status().message().find("owner 8"), std::string::npos);
  auto w = t2->WaitReady({0, 0}, 0.01);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInternal);
  EXPECT_NE(w.status().message().find("Filling in bank"), std::string::npos) << w.status().message();
  EXPECT_FALSE(t2->WaitIdle(0.01).ok());
}

TEST(Residency, BlockingReserveWaitReadyAndWaitIdle) {
  auto t = MakeTable(1, 4, 2, 1);
  auto first = t->Reserve({0, 0}, 1, 0);
  ASSERT_TRUE(first.ok());
  std::atomic<bool> reserved{false};
  BankTicket second_ticket;
  std::thread reserver([&] {
    auto r = t->Reserve({0, 1}, 2, 30.0);  // waits for the only bank
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    second_ticket = *r;
    reserved = true;
  });
  std::thread waiter([&] {
    auto r = t->AcquireWhenReady({0, 0}, 1, 30.0);  // waits for the publish
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, *first);
    t->Complete(*r);  // frees the bank for the reserver
  });
  EXPECT_FALSE(reserved.load());  // the bank is Filling: nobody can have it (no time asserted)
  ASSERT_TRUE(t->Publish(*first).ok());
  waiter.join();
  reserver.join();
  EXPECT_TRUE(reserved.load());
  EXPECT_EQ(second_ticket.bank, 0);
  std::thread publisher([&] { ASSERT_TRUE(t->AbortFill(second_ticket, Status::Ok()).ok()); });
  EXPECT_TRUE(t->WaitIdle(30.0).ok());
  publisher.join();
  ExpectConsistent(*t);
}

}  // namespace
}  // namespace estream::vmem
