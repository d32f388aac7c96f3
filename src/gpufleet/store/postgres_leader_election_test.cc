// SPDX-License-Identifier: Apache-2.0
// PostgresLeaderElection against a real PostgreSQL server the test starts: one leader per lease,
// takeover after expiry with a higher token, and fencing: a deposed holder's commits are refused
// and change nothing. Expiry is brought about by moving the lease's expires_at into the past (as
// if the holder had stopped renewing long ago), so that no test waits on a wall clock.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/postgres_store.h"
#include "gpufleet/store/testing/postgres_server.h"

namespace gpufleet::store {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::PostgresServer;

// An OK Result whose value matches `matcher`.
MATCHER_P(IsOkAndHolds, matcher, "") {
  if (!arg.ok()) {
    *result_listener << "which is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

Result<PostgresServer*> SharedServer() {
  static Result<std::unique_ptr<PostgresServer>> server = PostgresServer::Start();
  if (!server.ok()) {
    return server.status();
  }
  return server->get();
}

// One server's view of the database: its store and its election.
struct Campaigner {
  std::unique_ptr<PostgresStateStore> store;
  std::unique_ptr<PostgresLeaderElection> election;
};

class PostgresLeaderElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<PostgresServer*> server = SharedServer();
    ASSERT_OK(server);
    server_ = *server;
    static int next = 0;
    database_ = fmt::format("election{}", ++next);
    Result<std::string> uri = server_->CreateDatabase(database_);
    ASSERT_OK(uri);
    uri_ = *uri;
  }

  Campaigner Join(const std::string& identity) {
    Campaigner campaigner;
    Result<std::unique_ptr<PostgresStateStore>> store = PostgresStateStore::Open(uri_);
    EXPECT_OK(store);
    if (!store.ok()) {
      return campaigner;
    }
    campaigner.store = std::move(store).value();
    Result<std::unique_ptr<PostgresLeaderElection>> election = PostgresLeaderElection::Open(
        uri_, *campaigner.store,
        {.identity = identity, .address = "http://" + identity + ":8080", .lease = kLease});
    EXPECT_OK(election);
    if (election.ok()) {
      campaigner.election = std::move(election).value();
    }
    return campaigner;
  }

  // As if the holder had not renewed for longer than the lease.
  void ExpireLease() {
    ASSERT_OK(server_->Execute(
        database_, "UPDATE gpufleet.leader_lease SET expires_at = now() - interval '1 second'"));
  }

  std::vector<std::string> Column(const std::string& sql) {
    Result<std::vector<std::string>> column = server_->QueryColumn(database_, sql);
    EXPECT_OK(column);
    return column.ok() ? *column : std::vector<std::string>();
  }

  static constexpr std::chrono::milliseconds kLease{5000};
  PostgresServer* server_ = nullptr;
  std::string database_;
  std::string uri_;
};

TEST_F(PostgresLeaderElectionTest, OneCampaignerHoldsTheLeaseAndTheOtherFollows) {
  Campaigner a = Join("a");
  Campaigner b = Join("b");
  ASSERT_NE(a.election, nullptr);
  ASSERT_NE(b.election, nullptr);
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(LeaseState{true, 1, "a", "http://a:8080"}));
  EXPECT_THAT(b.election->Campaign(), IsOkAndHolds(LeaseState{false, 1, "a", "http://a:8080"}));
  // Renewing keeps the token; the lease runs for its duration on the database's clock.
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(LeaseState{true, 1, "a", "http://a:8080"}));
  const std::vector<std::string> left = Column(
      "SELECT (extract(epoch FROM expires_at - now()) * 1000)::bigint FROM gpufleet.leader_lease");
  ASSERT_EQ(left.size(), 1u);
  EXPECT_GT(std::stoll(left[0]), 4000);
  EXPECT_LE(std::stoll(left[0]), 5000);

  EXPECT_OK(a.store->Commit(WriteBatch().Create("job", "j1", "by a")));
  EXPECT_THAT(b.store->Commit(WriteBatch().Create("job", "j2", "by b")),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("not the leader"), HasSubstr("does not hold the lease"),
                             HasSubstr("the leader is a at http://a:8080"))));
  EXPECT_THAT(Column("SELECT name FROM gpufleet.objects ORDER BY name"), ElementsAre("j1"));
  // Reads are not fenced.
  EXPECT_THAT(b.store->Get("job", "j1"),
              IsOkAndHolds(::testing::Field(&StoredObject::data, "by a")));
}

TEST_F(PostgresLeaderElectionTest, AnExpiredLeaseIsTakenOverWithAHigherTokenAndFencesTheOldHolder) {
  Campaigner a = Join("a");
  Campaigner b = Join("b");
  ASSERT_NE(a.election, nullptr);
  ASSERT_NE(b.election, nullptr);
  ASSERT_THAT(a.election->Campaign(), IsOkAndHolds(::testing::Field(&LeaseState::leader, true)));
  ASSERT_OK(a.store->Commit(WriteBatch().Create("job", "j1", "v1")));
  // a stops renewing; while its lease lasts b cannot take it, once it has expired b can.
  EXPECT_THAT(b.election->Campaign(), IsOkAndHolds(::testing::Field(&LeaseState::leader, false)));
  ExpireLease();
  EXPECT_THAT(b.election->Campaign(), IsOkAndHolds(LeaseState{true, 2, "b", "http://b:8080"}));

  // a's store still believes it holds token 1 (a has not campaigned since): the database
  // refuses its late write, and the row is not changed.
  const std::vector<std::string> revision_before =
      Column("SELECT revision FROM gpufleet.store_revision");
  EXPECT_THAT(
      a.store->Commit(WriteBatch().Update("job", "j1", "late write by a", 1)),
      StatusIs(StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("not the leader: fencing token 1 is stale"), HasSubstr("at token 2"),
                     HasSubstr("the leader is b at http://b:8080"))));
  EXPECT_THAT(Column("SELECT encode(data, 'escape') || ' ' || version FROM gpufleet.objects"),
              ElementsAre("v1 1"));
  EXPECT_EQ(Column("SELECT revision FROM gpufleet.store_revision"), revision_before);
  EXPECT_THAT(Column("SELECT count(*) FROM gpufleet.events"), ElementsAre("0"));

  EXPECT_OK(b.store->Commit(WriteBatch().Update("job", "j1", "v2 by b", 1)));
  // a, campaigning again, learns it follows b and stays fenced.
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(LeaseState{false, 2, "b", "http://b:8080"}));
  EXPECT_THAT(a.store->Commit(WriteBatch().Create("job", "j3", "")),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("does not hold the lease")));
}

TEST_F(PostgresLeaderElectionTest, AHolderWhoseLeaseExpiredCannotCommitUntilItRenews) {
  Campaigner a = Join("a");
  ASSERT_NE(a.election, nullptr);
  ASSERT_THAT(a.election->Campaign(), IsOkAndHolds(::testing::Field(&LeaseState::token, 1)));
  ExpireLease();
  EXPECT_THAT(a.store->Commit(WriteBatch().Create("job", "j1", "")),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("of fencing token 1 expired before it was renewed")));
  // No one took over meanwhile: renewing keeps the term and its token.
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(LeaseState{true, 1, "a", "http://a:8080"}));
  EXPECT_OK(a.store->Commit(WriteBatch().Create("job", "j1", "")));
}

TEST_F(PostgresLeaderElectionTest, ResigningHandsTheLeaseOverAtOnce) {
  Campaigner a = Join("a");
  Campaigner b = Join("b");
  ASSERT_NE(a.election, nullptr);
  ASSERT_NE(b.election, nullptr);
  ASSERT_THAT(a.election->Campaign(), IsOkAndHolds(::testing::Field(&LeaseState::leader, true)));
  ASSERT_OK(a.election->Resign());
  EXPECT_THAT(a.store->Commit(WriteBatch().Create("job", "j1", "")),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("not the leader")));
  EXPECT_THAT(b.election->Campaign(), IsOkAndHolds(LeaseState{true, 2, "b", "http://b:8080"}));
  // Coming back, a starts a new term only once b's lease has expired.
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(::testing::Field(&LeaseState::leader, false)));
  ExpireLease();
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(LeaseState{true, 3, "a", "http://a:8080"}));
}

TEST_F(PostgresLeaderElectionTest, AnEmptyIdentityOrATinyLeaseIsInvalid) {
  Result<std::unique_ptr<PostgresStateStore>> store = PostgresStateStore::Open(uri_);
  ASSERT_OK(store);
  EXPECT_THAT(PostgresLeaderElection::Open(uri_, **store, {.identity = ""}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("identity")));
  EXPECT_THAT(PostgresLeaderElection::Open(
                  uri_, **store, {.identity = "a", .lease = std::chrono::milliseconds(10)})
                  .status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("10 ms")));
}

}  // namespace
}  // namespace gpufleet::store
