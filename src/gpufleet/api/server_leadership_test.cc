// SPDX-License-Identifier: Apache-2.0
// ApiServer with an election (docs/ha.md), on a fake election it campaigns in on its own thread:
// a follower serves reads, redirects writes and runs no cycle; granted the lease it leads; when
// another server takes the lease it is deposed. Listens on loopback (the election thread starts
// with the server): an integration test.
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/api_request.h"
#include "gpufleet/api/testing/job_spec_json.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/leader_election.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/store/testing/fault_injecting_store.h"

namespace gpufleet::api {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Answers every campaign with the lease the test sets. Thread-safe.
class FakeElection final : public store::LeaderElection {
 public:
  const std::string& identity() const override { return identity_; }
  Duration lease_duration() const override { return std::chrono::seconds(5); }
  Result<store::LeaseState> Campaign() override {
    std::lock_guard<std::mutex> lock(mu_);
    return lease_;
  }
  Status Resign() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++resigned_;
    return Status::Ok();
  }
  void Set(store::LeaseState lease) {
    std::lock_guard<std::mutex> lock(mu_);
    lease_ = std::move(lease);
  }
  int resigned() {
    std::lock_guard<std::mutex> lock(mu_);
    return resigned_;
  }

 private:
  const std::string identity_ = "me";
  std::mutex mu_;
  store::LeaseState lease_;  // guarded by mu_
  int resigned_ = 0;         // guarded by mu_
};

class ApiServerLeadershipIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    election_.Set({.leader = false, .token = 1, .holder = "other", .address = "http://other:9/"});
    Result<std::unique_ptr<ApiServer>> server =
        ApiServer::Create({.store = faulty_,
                           .catalog = catalog_,
                           .clock = clock_,
                           .cycle_interval = std::chrono::milliseconds(10),
                           .election = &election_,
                           .election_interval = std::chrono::milliseconds(10)});
    ASSERT_OK(server);
    server_ = std::move(server).value();
    SyntheticClusterSpec spec;
    spec.blocks = 1;
    spec.leaves_per_block = 1;
    spec.nodes_per_leaf = 2;
    Result<Cluster> cluster = MakeSyntheticCluster(spec, catalog_);
    ASSERT_OK(cluster);
    // Written straight to the store, as the leader would have: this server follows.
    ASSERT_OK(server_->RegisterNodes(*cluster));
    Result<std::string> admin =
        server_->authenticator().CreateToken(control::Role::kAdmin, "", "root");
    ASSERT_OK(admin);
    admin_ = *admin;
    ASSERT_OK(server_->Start("127.0.0.1", 0));
  }

  ApiResponse Call(const std::string& method, const std::string& target,
                   const std::string& body = "") {
    return api_testing::HandleRequest(*server_, method, target, admin_, body);
  }

  // Polls `done` every millisecond for at most 10 s.
  static bool Eventually(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  std::string JobState(const std::string& name) {
    const ApiResponse response = Call("GET", "/v1/jobs/" + name);
    const nlohmann::json job = nlohmann::json::parse(response.body, nullptr, false);
    return response.status == 200 ? job.value("state", "") : "";
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  SystemClock clock_;
  store::InMemoryStateStore store_;
  // Refuses a chosen commit as PostgreSQL's fencing check would.
  store::testing::FaultInjectingStateStore faulty_{store_};
  FakeElection election_;
  std::unique_ptr<ApiServer> server_;
  std::string admin_;
};

TEST_F(ApiServerLeadershipIntegrationTest, AFollowerRedirectsWritesLeadsWhenGrantedAndIsDeposed) {
  ASSERT_TRUE(Eventually([&] { return Call("GET", "/readyz").status == 200; }))
      << "a follower is ready once it knows the lease";
  const ApiResponse redirected = Call("POST", "/v1/jobs?dry=1", api_testing::OneTaskJobJson("j1"));
  EXPECT_EQ(redirected.status, 307);
  EXPECT_EQ(redirected.location, "http://other:9/v1/jobs?dry=1");
  EXPECT_THAT(redirected.body, HasSubstr("the leader is other at http://other:9"));
  EXPECT_EQ(Call("POST", "/v1/agents/register", "{}").status, 307) << "agents' routes too";
  EXPECT_EQ(Call("GET", "/v1/nodes").status, 200) << "reads are served";
  std::string metrics = Call("GET", "/metrics").body;
  EXPECT_THAT(metrics, HasSubstr("gpufleet_server_leader{server=\"me\"} 0"));
  EXPECT_THAT(metrics,
              HasSubstr("gpufleet_leader_info{leader=\"other\",address=\"http://other:9/\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("gpufleet_leader_fencing_token 1"));
  EXPECT_THAT(metrics, Not(HasSubstr("gpufleet_gpus_total{")))
      << "a follower exports no fleet figures: the leader does";
  EXPECT_FALSE(store_.Get("queue", "default").ok()) << "a follower makes no start-up write";

  // No leader known: 503.
  election_.Set({.leader = false, .token = 1});
  ASSERT_TRUE(Eventually(
      [&] { return Call("POST", "/v1/jobs", api_testing::OneTaskJobJson("j1")).status == 503; }));

  // Granted the lease, it becomes the leader: writes accepted, cycles run.
  election_.Set({.leader = true, .token = 2, .holder = "me", .address = "http://me:1"});
  ASSERT_TRUE(Eventually([&] { return server_->leading(); }));
  EXPECT_EQ(Call("POST", "/v1/jobs", api_testing::OneTaskJobJson("j1")).status, 201);
  EXPECT_TRUE(Eventually([&] { return JobState("j1") == "Scheduled"; })) << JobState("j1");
  metrics = Call("GET", "/metrics").body;
  EXPECT_THAT(metrics, HasSubstr("gpufleet_server_leader{server=\"me\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("gpufleet_gpus_total{model="));
  EXPECT_THAT(metrics, HasSubstr("gpufleet_gpus_allocated{model="));

  // Another server takes the lease over: deposed for good, writes redirected.
  election_.Set({.leader = false, .token = 3, .holder = "other", .address = "http://other:9"});
  ASSERT_TRUE(Eventually([&] { return server_->deposed(); }));
  EXPECT_FALSE(server_->leading());
  EXPECT_EQ(Call("POST", "/v1/jobs", api_testing::OneTaskJobJson("j2")).status, 307);
  EXPECT_THAT(Call("GET", "/metrics").body, Not(HasSubstr("gpufleet_gpus_total{")))
      << "deposed, its last figures are not the fleet's";
  election_.Set({.leader = true, .token = 4, .holder = "me", .address = "http://me:1"});
  server_->Stop();
  EXPECT_FALSE(server_->leading()) << "a deposed server never leads again";
  EXPECT_EQ(election_.resigned(), 0);
}

// The leader believes it leads, but another server took the lease: the store's fencing check
// refuses its commit. The client is told 503 with Retry-After and the leader's address (the write
// belongs there and nothing was written), not 400 as for a request that is wrong.
TEST_F(ApiServerLeadershipIntegrationTest, AFencedWriteIsA503WithRetryAfterNamingTheLeader) {
  election_.Set({.leader = true, .token = 1, .holder = "me", .address = "http://me:1"});
  ASSERT_TRUE(Eventually([&] { return server_->leading(); }));
  const Status refusal = store::NotLeaderError(
      "fencing token 1 is stale, the lease \"scheduler\" is at token 2; the leader is other at "
      "http://other:9");
  ApiResponse fenced;
  std::string name;
  // The scheduling loop may commit first and take the fault: then the submission is 201 and the
  // next one meets the refusal (bounded: 5 tries).
  for (int attempt = 0; attempt < 5 && fenced.status != 503; ++attempt) {
    faulty_.FailNthCommit(1, store::testing::FaultInjectingStateStore::FaultMode::kBeforeCommit,
                          refusal);
    name = fmt::format("late-{}", attempt);
    fenced = Call("POST", "/v1/jobs", api_testing::OneTaskJobJson(name));
  }
  EXPECT_EQ(fenced.status, 503) << fenced.body;
  EXPECT_EQ(fenced.retry_after_s, 1);
  const nlohmann::json error = nlohmann::json::parse(fenced.body, nullptr, false);
  ASSERT_TRUE(error.is_object()) << fenced.body;
  EXPECT_EQ(error["error"]["code"], "UNAVAILABLE");
  EXPECT_THAT(error["error"]["message"].get<std::string>(),
              HasSubstr("no longer the leader and wrote nothing"));
  EXPECT_THAT(error["error"]["message"].get<std::string>(),
              HasSubstr("the leader is other at http://other:9"));
  EXPECT_EQ(Call("GET", "/v1/jobs/" + name).status, 404) << "nothing of it was written";
}

// The mapping itself: only the store's fencing refusal is a 503; any other kFailedPrecondition (a
// request the state forbids) stays 400, even when its text mentions a leader.
TEST(ErrorResponseTest, AFencingRefusalIs503AndOtherPreconditionsStay400) {
  const ApiResponse fenced = ErrorResponse(store::NotLeaderError("no leader holds it now"));
  EXPECT_EQ(fenced.status, 503);
  EXPECT_EQ(fenced.retry_after_s, 1);
  EXPECT_THAT(fenced.body, HasSubstr("\"UNAVAILABLE\""));
  EXPECT_THAT(fenced.body, HasSubstr("not the leader: no leader holds it now"));
  const ApiResponse forbidden =
      ErrorResponse(FailedPreconditionError("job j1 has ended; not the leader: of anything"));
  EXPECT_EQ(forbidden.status, 400);
  EXPECT_EQ(forbidden.retry_after_s, 0);
  EXPECT_THAT(forbidden.body, HasSubstr("\"FAILED_PRECONDITION\""));
  EXPECT_EQ(ErrorResponse(UnavailableError("down")).retry_after_s, 0);
}

TEST_F(ApiServerLeadershipIntegrationTest, ALeaderStoppedHandsTheLeaseOver) {
  election_.Set({.leader = true, .token = 1, .holder = "me", .address = "http://me:1"});
  ASSERT_TRUE(Eventually([&] { return server_->leading(); }));
  server_->Stop();
  EXPECT_EQ(election_.resigned(), 1);
}

}  // namespace
}  // namespace gpufleet::api
