// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/memory_election.h"

#include <chrono>

#include <gtest/gtest.h>

#include "gpufleet/store/memory_store.h"

namespace gpufleet::store {
namespace {

using std::chrono::seconds;

class MemoryElectionTest : public ::testing::Test {
 protected:
  MemoryElectionTest()
      : clock_(MonoTime{int64_t{1'000'000'000}}),
        lease_(clock_, seconds(5)),
        a_(lease_, "server-a", "http://a"),
        b_(lease_, "server-b", "http://b"),
        store_a_(shared_, a_),
        store_b_(shared_, b_) {}

  static WriteBatch Put(const std::string& name) {
    WriteBatch batch;
    batch.Create("things", name, "{}");
    return batch;
  }

  FakeClock clock_;
  MemoryLease lease_;
  InMemoryStateStore shared_;
  MemoryLeaderElection a_;
  MemoryLeaderElection b_;
  FencedStore store_a_;
  FencedStore store_b_;
};

TEST_F(MemoryElectionTest, TheFirstCampaignerLeadsAndTheSecondLearnsWho) {
  const LeaseState first = *a_.Campaign();
  EXPECT_TRUE(first.leader);
  EXPECT_EQ(first.token, 1);
  const LeaseState second = *b_.Campaign();
  EXPECT_FALSE(second.leader);
  EXPECT_EQ(second.holder, "server-a");
  EXPECT_EQ(second.address, "http://a");
  EXPECT_EQ(second.token, 1);
}

TEST_F(MemoryElectionTest, RenewalKeepsTheTokenAndATakeoverAfterExpiryBumpsIt) {
  ASSERT_TRUE(a_.Campaign()->leader);
  clock_.Advance(seconds(4));
  EXPECT_EQ(a_.Campaign()->token, 1);
  clock_.Advance(seconds(4));
  EXPECT_FALSE(b_.Campaign()->leader) << "renewed 4 s ago, the lease lasts 5 s";
  clock_.Advance(seconds(2));
  const LeaseState taken = *b_.Campaign();
  EXPECT_TRUE(taken.leader);
  EXPECT_EQ(taken.token, 2);
  EXPECT_FALSE(a_.Campaign()->leader);
}

TEST_F(MemoryElectionTest, OnlyTheHolderCommitsAndADeposedLeadersLateWriteIsRefused) {
  EXPECT_TRUE(IsNotLeaderError(store_a_.Commit(Put("before-any-campaign"))));
  ASSERT_TRUE(a_.Campaign()->leader);
  ASSERT_TRUE(b_.Campaign().ok());
  EXPECT_TRUE(store_a_.Commit(Put("from-a")).ok());
  EXPECT_TRUE(IsNotLeaderError(store_b_.Commit(Put("from-b"))));
  // a stalls past its lease; b takes over; a has not campaigned since and still holds token 1.
  clock_.Advance(seconds(6));
  ASSERT_TRUE(b_.Campaign()->leader);
  const Status late = store_a_.Commit(Put("late-from-a"));
  EXPECT_TRUE(IsNotLeaderError(late)) << late.ToString();
  EXPECT_TRUE(store_b_.Commit(Put("from-b")).ok());
  EXPECT_FALSE(shared_.Get("things", "late-from-a").ok());
  EXPECT_TRUE(shared_.Get("things", "from-b").ok());
}

TEST_F(MemoryElectionTest, AnExpiredLeaseRefusesCommitsEvenBeforeAnotherTakesIt) {
  ASSERT_TRUE(a_.Campaign()->leader);
  clock_.Advance(seconds(5));
  EXPECT_TRUE(IsNotLeaderError(store_a_.Commit(Put("expired"))));
  // Renewed with the same token (no one took it meanwhile): commits land again.
  EXPECT_EQ(a_.Campaign()->token, 1);
  EXPECT_TRUE(store_a_.Commit(Put("renewed")).ok());
}

TEST_F(MemoryElectionTest, ResigningHandsTheLeaseOverAtOnce) {
  ASSERT_TRUE(a_.Campaign()->leader);
  ASSERT_TRUE(a_.Resign().ok());
  EXPECT_TRUE(IsNotLeaderError(store_a_.Commit(Put("after-resign"))));
  const LeaseState taken = *b_.Campaign();
  EXPECT_TRUE(taken.leader);
  EXPECT_EQ(taken.token, 2);
}

TEST_F(MemoryElectionTest, ReadsGoThroughWithoutTheLease) {
  ASSERT_TRUE(shared_.Commit(Put("x")).ok());
  EXPECT_TRUE(store_b_.Get("things", "x").ok());
  EXPECT_EQ(store_b_.List("things")->size(), 1u);
  EXPECT_EQ(*store_b_.Revision(), 1);
}

}  // namespace
}  // namespace gpufleet::store
