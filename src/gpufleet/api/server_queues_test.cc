// SPDX-License-Identifier: Apache-2.0
// Queues through the server: quota validation, limits, fair-share figures, priority preemption
// and reclaiming a guarantee (server_queues.cc).
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/api/server.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"

namespace gpufleet::api {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// One task of 8 whole GPUs (a whole node) in `queue`.
std::string NodeJob(const std::string& name, const std::string& queue, int priority = 0) {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}, queue: {}}}
spec:
  priority: {}
  tasks:
    - name: main
      resources: {{cpu: "8", memory: 64Gi, gpus: {{count: 8}}}}
)",
                     name, queue, priority);
}

// Four nodes of 8 H100s (32 GPUs) in two leaves; an admin token.
class ServerQueuesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<ApiServer>> server = ApiServer::Create(
        {.store = store_, .catalog = catalog_, .clock = clock_, .policy = "best-fit"});
    ASSERT_OK(server);
    server_ = std::move(server).value();
    SyntheticClusterSpec spec;
    spec.blocks = 1;
    spec.leaves_per_block = 2;
    spec.nodes_per_leaf = 2;
    Result<Cluster> cluster = MakeSyntheticCluster(spec, catalog_);
    ASSERT_OK(cluster);
    ASSERT_OK(server_->RegisterNodes(*cluster));
    Result<std::string> admin = server_->authenticator().CreateToken(Role::kAdmin, "", "root");
    ASSERT_OK(admin);
    admin_ = *admin;
  }

  Json Call(const std::string& method, const std::string& path, const std::string& body = "",
            int want_status = 200) {
    ApiRequest request;
    request.method = method;
    request.path = path;
    request.authorization = "Bearer " + admin_;
    request.body = body;
    const ApiResponse response = server_->Handle(request);
    EXPECT_EQ(response.status, want_status) << method << " " << path << ": " << response.body;
    return Json::parse(response.body, nullptr, false);
  }

  std::string Error(const std::string& path, const std::string& body) {
    return Call("POST", path, body, 400)["error"]["message"].get<std::string>();
  }

  void Cycle() { EXPECT_OK(server_->RunSchedulingCycle()); }
  std::string State(const std::string& job) { return Call("GET", "/v1/jobs/" + job)["state"]; }
  std::string Reason(const std::string& job) { return Call("GET", "/v1/jobs/" + job)["reason"]; }
  std::string Events(const std::string& job) {
    return Call("GET", "/v1/jobs/" + job + "/events").dump();
  }

  Json QueueRow(const std::string& name) {
    const Json queues = Call("GET", "/v1/queues");
    for (const Json& item : queues["items"]) {
      if (item["name"] == name) {
        return item;
      }
    }
    return Json();
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_;
  store::InMemoryStateStore store_;
  std::unique_ptr<ApiServer> server_;
  std::string admin_;
};

TEST_F(ServerQueuesTest, QuotaIsValidatedAgainstTheTreeAndTheCatalog) {
  Call("POST", "/v1/queues", R"({"name": "research", "guarantee": {"H100-80GB": 16}})", 201);
  EXPECT_THAT(Error("/v1/queues", R"({"name": "research/nlp", "guarantee": {"H100": 24}})"),
              HasSubstr("guarantee"));
  EXPECT_THAT(Error("/v1/queues", R"({"name": "x", "guarantee": {"B9000": 1}})"),
              HasSubstr("guarantee.B9000: unknown GPU model \"B9000\""));
  EXPECT_THAT(Error("/v1/queues", R"({"name": "x", "limit": {"*": -1}})"),
              HasSubstr("limit.*: -1 is not a number of GPUs"));
  EXPECT_THAT(Error("/v1/queues", R"({"name": "x", "guarantee": {"*": 0.0001}})"),
              HasSubstr("at most three decimals"));
  EXPECT_THAT(Error("/v1/queues", R"({"name": "x", "weight": 0})"), HasSubstr("weight: 0"));
  EXPECT_THAT(Error("/v1/queues", R"({"name": "x", "may_borrow": "no"})"),
              HasSubstr("may_borrow: expected true or false"));
  EXPECT_THAT(Error("/v1/queues", R"({"name": "x", "quota": 3})"),
              HasSubstr("\"quota\": unknown field"));
  // Nothing of the refused queues was stored; an alias is stored by its canonical name.
  Call("POST", "/v1/queues", R"({"name": "research/nlp", "guarantee": {"H100": 8}})", 201);
  Cycle();
  const Json nlp = QueueRow("research/nlp");
  EXPECT_EQ(nlp["guarantee"], Json({{"H100-80GB", 8}}));
  EXPECT_EQ(nlp["borrowed"], 0.0);
  EXPECT_TRUE(nlp.contains("fair_share"));
  EXPECT_TRUE(QueueRow("x").is_null());
}

TEST_F(ServerQueuesTest, ALimitKeepsAQueueWithinItsQuotaExactly) {
  Call("POST", "/v1/queues", R"({"name": "capped", "limit": {"*": 16}})", 201);
  for (const std::string name : {"a", "b", "c"}) {
    Call("POST", "/v1/jobs", NodeJob(name, "capped"), 201);
  }
  Cycle();
  // Two jobs fill the limit exactly; the third would pass it.
  EXPECT_EQ(State("a"), "Scheduled");
  EXPECT_EQ(State("b"), "Scheduled");
  EXPECT_EQ(State("c"), "Pending");
  EXPECT_THAT(Reason("c"), HasSubstr("limit"));
  EXPECT_EQ(QueueRow("capped")["gpus_allocated"], 16);
  Call("POST", "/v1/jobs/a/cancel");
  Cycle();
  EXPECT_EQ(State("c"), "Scheduled");
}

TEST_F(ServerQueuesTest, HigherPriorityPreemptsLowerInTheSameQueueAfterTheMinimumRuntime) {
  for (const std::string name : {"low-0", "low-1", "low-2", "low-3"}) {
    Call("POST", "/v1/jobs", NodeJob(name, "default"), 201);
  }
  Cycle();
  Call("POST", "/v1/jobs", NodeJob("urgent", "default", 10), 201);
  Cycle();
  // The victims have run for less than the minimum runtime.
  EXPECT_EQ(State("urgent"), "Pending");
  EXPECT_THAT(Reason("urgent"), Not(HasSubstr("preempted")));

  clock_.Advance(std::chrono::seconds(61));
  Cycle();
  int preempted = 0;
  std::string victim;
  for (const std::string name : {"low-0", "low-1", "low-2", "low-3"}) {
    if (State(name) == "Preempted") {
      ++preempted;
      victim = name;
    }
  }
  ASSERT_EQ(preempted, 1) << "one node frees room for one 8-GPU job";
  EXPECT_THAT(Reason(victim), HasSubstr("preempted by job urgent (priority 10 over 0)"));
  EXPECT_THAT(Reason("urgent"), HasSubstr("waiting for preempted jobs " + victim));
  EXPECT_THAT(Events("urgent"), HasSubstr("preempting " + victim));

  Cycle();
  EXPECT_EQ(State("urgent"), "Scheduled");
  EXPECT_EQ(State(victim), "Pending");
  EXPECT_THAT(Events(victim), HasSubstr("requeued after preemption by job urgent"));
}

TEST_F(ServerQueuesTest, AQueueWithinItsGuaranteeReclaimsItFromABorrower) {
  Call("POST", "/v1/queues", R"({"name": "owner", "guarantee": {"*": 16}})", 201);
  Call("POST", "/v1/queues", R"({"name": "borrower"})", 201);
  for (const std::string name : {"b-0", "b-1", "b-2", "b-3"}) {
    Call("POST", "/v1/jobs", NodeJob(name, "borrower"), 201);
  }
  Cycle();
  EXPECT_EQ(QueueRow("borrower")["borrowed"], 32.0);
  clock_.Advance(std::chrono::seconds(61));
  Call("POST", "/v1/jobs", NodeJob("mine", "owner"), 201);
  Cycle();
  int preempted = 0;
  for (const std::string name : {"b-0", "b-1", "b-2", "b-3"}) {
    if (State(name) == "Preempted") {
      ++preempted;
      EXPECT_THAT(Reason(name),
                  HasSubstr("queue owner reclaims its guarantee from queue borrower"));
    }
  }
  EXPECT_EQ(preempted, 1);
  Cycle();
  EXPECT_EQ(State("mine"), "Scheduled");
  // A borrower never takes back what the owner is guaranteed.
  clock_.Advance(std::chrono::seconds(61));
  Cycle();
  EXPECT_EQ(State("mine"), "Scheduled");
}

TEST_F(ServerQueuesTest, NonPreemptibleJobsAreNeverVictims) {
  for (int i = 0; i < 4; ++i) {
    std::string spec = NodeJob(fmt::format("keep-{}", i), "default");
    spec.replace(spec.find("  priority: 0"), 13, "  priority: 0\n  preemptible: false");
    Call("POST", "/v1/jobs", spec, 201);
  }
  Cycle();
  clock_.Advance(std::chrono::seconds(61));
  Call("POST", "/v1/jobs", NodeJob("urgent", "default", 10), 201);
  Cycle();
  Cycle();
  EXPECT_EQ(State("urgent"), "Pending");
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(State(fmt::format("keep-{}", i)), "Scheduled");
  }
}

}  // namespace
}  // namespace gpufleet::api
