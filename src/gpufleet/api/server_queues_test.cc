// SPDX-License-Identifier: Apache-2.0
// Queues through the server: quota validation, limits, fair-share figures, priority preemption
// and reclaiming a guarantee (server_queues.cc).
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/api_request.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/store/testing/fault_injecting_store.h"
#include "gpufleet/wire/json_fields.h"

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
      command: [train]
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
    Result<std::string> admin =
        server_->authenticator().CreateToken(control::Role::kAdmin, "", "root");
    ASSERT_OK(admin);
    admin_ = *admin;
  }

  Json Call(const std::string& method, const std::string& path, const std::string& body = "",
            int want_status = 200, ApiServer* on = nullptr, const std::string& token = "") {
    const ApiResponse response = api_testing::HandleRequest(
        on != nullptr ? *on : *server_, method, path, token.empty() ? admin_ : token, body);
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

  std::string PatchError(const std::string& queue, const std::string& body, int want_status) {
    return Call("PATCH", "/v1/queues/" + queue, body, want_status)["error"]["message"];
  }
  std::string NodeOf(const std::string& job) {
    return Call("GET", "/v1/jobs/" + job)["placements"][0]["node"];
  }

  // Teams team-a and team-b, and a member token of each.
  struct Members {
    std::string alice;  // of team-a
    std::string bob;    // of team-b
  };
  Members TwoTeams() {
    Call("POST", "/v1/teams", R"({"name": "team-a"})", 201);
    Call("POST", "/v1/teams", R"({"name": "team-b"})", 201);
    Result<std::string> alice =
        server_->authenticator().CreateToken(control::Role::kMember, "team-a", "alice");
    Result<std::string> bob =
        server_->authenticator().CreateToken(control::Role::kMember, "team-b", "bob");
    EXPECT_OK(alice);
    EXPECT_OK(bob);
    return {alice.ok() ? *alice : "", bob.ok() ? *bob : ""};
  }

  Json QueueRow(const std::string& name, ApiServer* on = nullptr) {
    const Json queues = Call("GET", "/v1/queues", "", 200, on);
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

// A child whose parent was never created: the error says the parent is implicit, in GPUs as the
// guarantee was written, and how to create it; once created, the child is accepted.
TEST_F(ServerQueuesTest, AnImplicitParentIsNamedInGpus) {
  const std::string error =
      Error("/v1/queues", R"({"name": "research/cv", "guarantee": {"H100-80GB": 16}})");
  EXPECT_THAT(error, HasSubstr("its children's guarantees of H100-80GB (16 GPUs) exceed its own "
                               "(0 GPUs); \"research\" was created implicitly as the parent of "
                               "\"research/cv\", with no guarantee: create it first with one "
                               "that covers its children (gpufleet create queue research "
                               "--guarantee H100-80GB=16)"));
  EXPECT_THAT(error, Not(HasSubstr("milli")));
  Call("POST", "/v1/queues", R"({"name": "research", "guarantee": {"H100-80GB": 16}})", 201);
  Call("POST", "/v1/queues", R"({"name": "research/cv", "guarantee": {"H100-80GB": 16}})", 201);
}

TEST_F(ServerQueuesTest, AStoppingJobStillCountsAsRunningWithItsGpus) {
  Call("POST", "/v1/jobs", NodeJob("a", "default"), 201);
  Cycle();
  Call("POST", "/v1/jobs/a/cancel");
  ASSERT_EQ(State("a"), "Stopping");
  EXPECT_EQ(QueueRow("default")["running"], 1);
  EXPECT_EQ(QueueRow("default")["gpus_allocated"], 8);
  Cycle();  // its node runs no agent: its task is gone, and so are its GPUs
  EXPECT_EQ(State("a"), "Cancelled");
  EXPECT_EQ(QueueRow("default")["running"], 0);
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
    if (State(name) == "Stopping") {
      ++preempted;
      victim = name;
    }
  }
  ASSERT_EQ(preempted, 1) << "one node frees room for one 8-GPU job";
  EXPECT_THAT(Reason(victim), HasSubstr("preempted by job urgent (priority 10 over 0)"));
  EXPECT_THAT(Reason("urgent"), HasSubstr("GPUs reserved on "));
  EXPECT_THAT(Reason("urgent"), HasSubstr("after preempting " + victim));
  EXPECT_THAT(Events("urgent"), HasSubstr("preempting " + victim));

  Cycle();
  EXPECT_EQ(State("urgent"), "Scheduled");
  EXPECT_EQ(State(victim), "Pending");
  EXPECT_THAT(Events(victim), HasSubstr("requeued after preemption by job urgent"));
}

// Issue 14: a member whose job another team's job preempted learned that job's name from the
// reason, the events and `preempted_by`; a node's events named every team's jobs.
// A container task on the node's network sees its interfaces and what listens on its loopback
// (the agent's image mirror): members may ask for it only in a queue an admin opened to it.
TEST_F(ServerQueuesTest, HostNetworkIsForAdminsAndQueuesThatAllowIt) {
  Call("POST", "/v1/teams", R"({"name": "team-a"})", 201);
  Result<std::string> alice =
      server_->authenticator().CreateToken(control::Role::kMember, "team-a", "alice");
  ASSERT_OK(alice);
  const auto job = [](const std::string& name, const std::string& queue) {
    return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}, queue: {}}}
spec:
  tasks: [{{name: t, command: [sh], image: localhost/tiny:1, hostNetwork: true}}]
)",
                       name, queue);
  };
  const Json refused = Call("POST", "/v1/jobs", job("on-host", "default"), 403, nullptr, *alice);
  EXPECT_THAT(refused["error"]["message"].get<std::string>(),
              HasSubstr("hostNetwork: true: queue \"default\" does not allow"));
  const Json deployment = wire::ParseDocument(R"({"name": "svc",
    "template": {"apiVersion": "gpufleet.io/v1", "kind": "Job",
      "spec": {"kind": "inference", "tasks": [{"name": "server", "command": ["serve"],
        "image": "localhost/tiny:1", "hostNetwork": true}]}}})");
  const Json refused_deployment =
      Call("POST", "/v1/deployments", deployment.dump(), 403, nullptr, *alice);
  EXPECT_THAT(refused_deployment["error"]["message"].get<std::string>(),
              HasSubstr("hostNetwork: true: queue \"default\" does not allow"));
  // Nothing was stored for either.
  Call("GET", "/v1/jobs/team-a/on-host", "", 404);
  Call("GET", "/v1/deployments/team-a/svc", "", 404);

  Call("POST", "/v1/jobs", job("admins", "default"), 201);
  Call("POST", "/v1/queues", R"({"name": "edge", "team": "team-a", "allow_host_network": true})",
       201);
  EXPECT_EQ(QueueRow("edge")["allow_host_network"], true);
  Call("POST", "/v1/jobs", job("on-host", "edge"), 201, nullptr, *alice);
  Call("PATCH", "/v1/queues/edge", R"({"allow_host_network": false})");
  Call("POST", "/v1/jobs", job("again", "edge"), 403, nullptr, *alice);
  EXPECT_THAT(PatchError("edge", R"({"allow_host_network": "yes"})", 400),
              HasSubstr("allow_host_network: expected true or false, got \"yes\""));
}

// A member sees how its own team's queues and the shared ones fare, not another team's usage.
TEST_F(ServerQueuesTest, AMemberSeesTheFiguresOfItsOwnAndTheSharedQueuesOnly) {
  const Members members = TwoTeams();
  Call("POST", "/v1/queues", R"({"name": "qa", "team": "team-a"})", 201);
  Call("POST", "/v1/queues", R"({"name": "qb", "team": "team-b"})", 201);
  Call("POST", "/v1/jobs", NodeJob("b-job", "qb"), 201, nullptr, members.bob);
  Cycle();
  EXPECT_TRUE(QueueRow("qb").contains("borrowed")) << "an admin sees every queue's figures";
  EXPECT_TRUE(QueueRow("qb").contains("usage_gpu_hours"));
  const Json seen_by_alice = Call("GET", "/v1/queues", "", 200, nullptr, members.alice);
  for (const Json& item : seen_by_alice["items"]) {
    SCOPED_TRACE(item.dump());
    const bool shown = item["name"] != "qb";
    for (const char* figure : {"borrowed", "fair_share", "weight_share", "usage_gpu_hours"}) {
      EXPECT_EQ(item.contains(figure), shown) << figure;
    }
  }
  const Json seen_by_bob = Call("GET", "/v1/queues", "", 200, nullptr, members.bob);
  EXPECT_TRUE(seen_by_bob["items"][2].contains("borrowed"));
}

TEST_F(ServerQueuesTest, AVictimOfAnotherTeamIsNotToldThePreemptorsName) {
  const Members members = TwoTeams();
  for (const std::string name : {"low-0", "low-1", "low-2", "low-3"}) {
    Call("POST", "/v1/jobs", NodeJob(name, "default"), 201, nullptr, members.bob);
  }
  Cycle();
  clock_.Advance(std::chrono::seconds(61));
  Call("POST", "/v1/jobs", NodeJob("secret-urgent", "default", 10), 201, nullptr, members.alice);
  Cycle();
  std::string victim;
  for (const std::string name : {"low-0", "low-1", "low-2", "low-3"}) {
    if (State(name) == "Stopping") {
      victim = name;
    }
  }
  ASSERT_FALSE(victim.empty());
  const Json seen = Call("GET", "/v1/jobs/" + victim, "", 200, nullptr, members.bob);
  EXPECT_EQ(seen["reason"], "preempted by a job of another team (priority 10 over 0)");
  EXPECT_FALSE(seen.contains("preempted_by"));
  // The admin still sees who it was.
  EXPECT_EQ(Call("GET", "/v1/jobs/team-b/" + victim)["preempted_by"], "team-a/secret-urgent");
  Cycle();
  EXPECT_EQ(State(victim), "Pending");
  for (const std::string& path :
       {std::string("/v1/jobs"), "/v1/jobs/" + victim, "/v1/jobs/" + victim + "/events"}) {
    EXPECT_THAT(Call("GET", path, "", 200, nullptr, members.bob).dump(),
                Not(HasSubstr("secret-urgent")))
        << path;
  }
  Call("GET", "/v1/nodes/" + NodeOf("secret-urgent") + "/events", "", 403, nullptr, members.bob);
  Call("GET", "/v1/nodes/" + NodeOf("secret-urgent") + "/events", "", 200);
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
    if (State(name) == "Stopping") {
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

// Issue 37: a job's spec.preemption.minRuntime, else its queue's min_runtime, replaces the
// server's minimum runtime before preemption (60 s here).
TEST_F(ServerQueuesTest, AJobsOrItsQueuesMinimumRuntimeReplacesTheServers) {
  Call("POST", "/v1/queues", R"({"name": "patient", "min_runtime": "2h"})", 201);
  EXPECT_EQ(QueueRow("patient")["min_runtime"], "2h");
  EXPECT_THAT(Error("/v1/queues", R"({"name": "bad", "min_runtime": "soon"})"),
              HasSubstr("min_runtime: \"soon\" is not a duration"));
  EXPECT_THAT(Error("/v1/queues", R"({"name": "bad", "min_runtime": 60})"),
              HasSubstr("min_runtime: 60 is not a duration"));
  for (const std::string name : {"low-0", "low-1", "low-2"}) {
    Call("POST", "/v1/jobs", NodeJob(name, "patient"), 201);
  }
  // Its own minimum runtime of 0 s lets this one go first, whatever the queue says.
  std::string eager = NodeJob("eager", "patient");
  eager.replace(eager.find("  tasks:"), 0, "  preemption: {minRuntime: 0s}\n");
  Call("POST", "/v1/jobs", eager, 201);
  Cycle();
  Call("POST", "/v1/jobs", NodeJob("urgent", "patient", 10), 201);
  clock_.Advance(std::chrono::seconds(61));
  Cycle();
  EXPECT_EQ(State("eager"), "Stopping");
  EXPECT_EQ(Call("GET", "/v1/jobs/eager")["spec"]["spec"]["preemption"]["minRuntime"], "0s");
  for (const std::string name : {"low-0", "low-1", "low-2"}) {
    EXPECT_EQ(State(name), "Scheduled") << name;
  }
  // Within the queue's two hours nothing more is preempted; then the next one goes.
  Call("POST", "/v1/jobs", NodeJob("urgent-2", "patient", 10), 201);
  clock_.Advance(std::chrono::seconds(600));
  Cycle();
  Cycle();
  EXPECT_EQ(State("urgent-2"), "Pending");
  EXPECT_THAT(Reason("urgent-2"), Not(HasSubstr("preempting")));
  Call("PATCH", "/v1/queues/patient", R"({"min_runtime": null})");
  EXPECT_FALSE(QueueRow("patient").contains("min_runtime"));
  EXPECT_THAT(Call("GET", "/v1/queues/patient/events").dump(),
              HasSubstr(R"(min_runtime \"2h\" -> null)"));
  Cycle();
  Cycle();
  int stopped = 0;
  for (const std::string name : {"low-0", "low-1", "low-2"}) {
    stopped += State(name) == "Scheduled" ? 0 : 1;
  }
  EXPECT_EQ(stopped, 1) << "back to the server's minimum runtime";
}

TEST_F(ServerQueuesTest, PatchChangesOnlyTheFieldsItNames) {
  Call("POST", "/v1/queues",
       R"({"name": "research", "guarantee": {"H100-80GB": 16, "*": 4}, "limit": {"*": 64}})", 201);
  Json queue = Call("PATCH", "/v1/queues/research", R"({"weight": 2})");
  EXPECT_EQ(queue["weight"], 2.0);
  EXPECT_EQ(queue["guarantee"], Json({{"*", 4}, {"H100-80GB", 16}}));
  EXPECT_EQ(queue["limit"], Json({{"*", 64}}));
  EXPECT_EQ(queue["may_borrow"], true);
  EXPECT_EQ(queue["version"], 2);
  // Quota objects merge by model: an alias sets its canonical model, null removes an entry.
  queue = Call("PATCH", "/v1/queues/research",
               R"({"guarantee": {"H100": 8, "*": null}, "may_borrow": false, "version": 2})");
  EXPECT_EQ(queue["guarantee"], Json({{"H100-80GB", 8}}));
  EXPECT_EQ(queue["may_borrow"], false);
  EXPECT_EQ(queue["version"], 3);
  // A null field goes back to the default; a patch that changes nothing writes nothing.
  queue = Call("PATCH", "/v1/queues/research", R"({"limit": null, "weight": null})");
  EXPECT_EQ(queue["limit"], Json::object());
  EXPECT_EQ(queue["weight"], 1.0);
  EXPECT_EQ(Call("PATCH", "/v1/queues/research", "{}")["version"], 4);
  EXPECT_EQ(QueueRow("research")["version"], 4);
  const std::string events = Call("GET", "/v1/queues/research/events").dump();
  EXPECT_THAT(events, HasSubstr("quota changed by root: weight 1.0 -> 2.0"));
  EXPECT_THAT(events, HasSubstr(R"(guarantee {\"*\":4,\"H100-80GB\":16} -> {\"H100-80GB\":8})"));
  // A nested queue is addressed by its path.
  Call("POST", "/v1/queues", R"({"name": "research/nlp", "guarantee": {"H100-80GB": 4}})", 201);
  EXPECT_EQ(
      Call("PATCH", "/v1/queues/research/nlp", R"({"guarantee": {"H100-80GB": 8}})")["guarantee"],
      Json({{"H100-80GB", 8}}));
  // The metrics name the route, not the queue's path.
  ApiRequest metrics;
  metrics.method = "GET";
  metrics.path = "/metrics";
  metrics.authorization = "Bearer " + admin_;
  const std::string text = server_->Handle(metrics).body;
  EXPECT_THAT(text,
              HasSubstr(R"(gpufleet_api_requests_total{route="/v1/queues/{name}",code="200"} 5)"));
  EXPECT_THAT(text, HasSubstr(R"(route="/v1/queues/{name}/events")"));
  EXPECT_THAT(text, Not(HasSubstr("/nlp")));
}

TEST_F(ServerQueuesTest, PatchIsRefusedWholeWhenItDoesNotFitTheTree) {
  Call("POST", "/v1/queues", R"({"name": "research", "guarantee": {"H100-80GB": 16}})", 201);
  Call("POST", "/v1/queues", R"({"name": "research/nlp", "guarantee": {"H100-80GB": 8}})", 201);
  // A parent guaranteed less than its child, a child more than its parent, a limit below the
  // guarantee: 400 naming the queue and field, and nothing changes.
  EXPECT_THAT(PatchError("research", R"({"guarantee": {"H100-80GB": 4}, "weight": 3})", 400),
              HasSubstr("guarantee"));
  EXPECT_THAT(PatchError("research/nlp", R"({"guarantee": {"H100-80GB": 24}})", 400),
              HasSubstr("children's guarantees of H100-80GB (24 GPUs) exceed"));
  EXPECT_THAT(PatchError("research/nlp", R"({"limit": {"H100-80GB": 2}})", 400),
              HasSubstr("limit"));
  // Values are read as creation reads them.
  EXPECT_THAT(PatchError("research", R"({"guarantee": {"B9000": 1}})", 400),
              HasSubstr("guarantee.B9000: unknown GPU model \"B9000\""));
  EXPECT_THAT(PatchError("research", R"({"guarantee": {"B9000": null}})", 400),
              HasSubstr("guarantee.B9000: unknown GPU model"));
  EXPECT_THAT(PatchError("research", R"({"limit": {"*": -1}})", 400),
              HasSubstr("limit.*: -1 is not a number of GPUs"));
  EXPECT_THAT(PatchError("research", R"({"limit": 5})", 400),
              HasSubstr("limit: expected an object"));
  EXPECT_THAT(PatchError("research", R"({"weight": 0})", 400), HasSubstr("weight: 0"));
  EXPECT_THAT(PatchError("research", R"({"may_borrow": "no"})", 400),
              HasSubstr("may_borrow: expected true or false"));
  EXPECT_THAT(PatchError("research", R"({"team": "nlp"})", 400),
              HasSubstr("\"team\": unknown field"));
  EXPECT_THAT(PatchError("research", R"({"version": "1"})", 400), HasSubstr("version: \"1\""));
  EXPECT_THAT(PatchError("research", "weight=2", 400), HasSubstr("not valid JSON"));
  // A stale version is a conflict; an unknown queue is 404; a member may not change quota.
  EXPECT_THAT(PatchError("research", R"({"weight": 2, "version": 7})", 409),
              HasSubstr("is at version 1, not 7"));
  EXPECT_THAT(PatchError("nope", R"({"weight": 2})", 404), HasSubstr("queue \"nope\" not found"));
  Call("POST", "/v1/teams", R"({"name": "nlp"})", 201);
  const std::string member =
      Call("POST", "/v1/tokens", R"({"role": "member", "team": "nlp", "name": "m"})", 201)["token"];
  EXPECT_EQ(Call("PATCH", "/v1/queues/research", R"({"weight": 2})", 403, nullptr,
                 member)["error"]["code"],
            "PERMISSION_DENIED");
  const Json research = QueueRow("research");
  EXPECT_EQ(research["version"], 1);
  EXPECT_EQ(research["weight"], 1.0);
  EXPECT_EQ(research["guarantee"], Json({{"H100-80GB", 16}}));
}

TEST_F(ServerQueuesTest, ALowerQuotaStopsNothingAndANewGuaranteeIsReclaimed) {
  Call("POST", "/v1/queues", R"({"name": "owner"})", 201);
  Call("POST", "/v1/queues", R"({"name": "borrower", "limit": {"*": 32}})", 201);
  for (const std::string name : {"b-0", "b-1", "b-2", "b-3"}) {
    Call("POST", "/v1/jobs", NodeJob(name, "borrower"), 201);
  }
  Cycle();
  clock_.Advance(std::chrono::seconds(61));
  Call("POST", "/v1/jobs", NodeJob("mine", "owner"), 201);
  Cycle();
  // Without a guarantee the owner cannot reclaim anything.
  EXPECT_EQ(State("mine"), "Pending");
  Call("PATCH", "/v1/queues/borrower", R"({"limit": {"*": 16}})");
  Cycle();
  // Over its new limit, but running jobs are not stopped by it.
  EXPECT_EQ(QueueRow("borrower")["running"], 4);
  Call("PATCH", "/v1/queues/owner", R"({"guarantee": {"*": 8}})");
  Cycle();
  int preempted = 0;
  for (const std::string name : {"b-0", "b-1", "b-2", "b-3"}) {
    preempted += State(name) == "Stopping" ? 1 : 0;
  }
  EXPECT_EQ(preempted, 1);
  Cycle();
  EXPECT_EQ(State("mine"), "Scheduled");
  // The requeued victim now meets the lower limit.
  EXPECT_EQ(QueueRow("borrower")["running"], 3);
  EXPECT_EQ(QueueRow("borrower")["pending"], 1);
}

TEST_F(ServerQueuesTest, QueueUsageSurvivesARestartDecayedToTheStartTime) {
  const ApiServer::Options options{.store = store_,
                                   .catalog = catalog_,
                                   .clock = clock_,
                                   .wall_clock = &clock_,
                                   .usage_half_life = std::chrono::hours(1)};
  Call("POST", "/v1/queues", R"({"name": "heavy"})", 201);
  Call("POST", "/v1/queues", R"({"name": "light"})", 201);
  Result<std::unique_ptr<ApiServer>> first = ApiServer::Create(options);
  ASSERT_OK(first);
  Call("POST", "/v1/jobs", NodeJob("h-0", "heavy"), 201);
  Call("POST", "/v1/jobs", NodeJob("h-1", "heavy"), 201);
  Call("POST", "/v1/jobs", NodeJob("l-0", "light"), 201);
  EXPECT_OK((*first)->RunSchedulingCycle());
  Call("POST", "/v1/jobs/l-0/cancel");
  clock_.Advance(std::chrono::hours(1));
  EXPECT_OK((*first)->RunSchedulingCycle());
  const double heavy = QueueRow("heavy", first->get())["usage_gpu_hours"]["H100-80GB"];
  const double light = QueueRow("light", first->get())["usage_gpu_hours"]["H100-80GB"];
  // 16 GPUs for an hour with a half-life of an hour: 16 / ln 2 / 2 GPU-hours.
  EXPECT_NEAR(heavy, 16 / std::log(2.0) / 2, 1e-6);
  EXPECT_GT(light, 0);
  // A quota change rebuilds the tree and keeps the usage.
  Call("PATCH", "/v1/queues/heavy", R"({"limit": {"*": 32}})", 200, first->get());
  EXPECT_OK((*first)->RunSchedulingCycle());
  EXPECT_EQ(QueueRow("heavy", first->get())["usage_gpu_hours"]["H100-80GB"], heavy);
  first->reset();

  // Down for ten minutes: the next server starts with the usage decayed over them.
  clock_.Advance(std::chrono::minutes(10));
  Result<std::unique_ptr<ApiServer>> second = ApiServer::Create(options);
  ASSERT_OK(second);
  EXPECT_OK((*second)->RunSchedulingCycle());
  const double decay = std::exp2(-10.0 / 60);
  EXPECT_NEAR(QueueRow("heavy", second->get())["usage_gpu_hours"]["H100-80GB"], heavy * decay,
              1e-9);
  EXPECT_NEAR(QueueRow("light", second->get())["usage_gpu_hours"]["H100-80GB"], light * decay,
              1e-9);
  // So fair share still puts the light queue first.
  EXPECT_LT(QueueRow("light", second->get())["fair_share"],
            QueueRow("heavy", second->get())["fair_share"]);
}

TEST_F(ServerQueuesTest, DeleteIsRefusedWhileTheQueueIsInUse) {
  Call("POST", "/v1/teams", R"({"name": "nlp"})", 201);
  Result<std::string> member =
      server_->authenticator().CreateToken(control::Role::kMember, "nlp", "ann");
  ASSERT_OK(member);
  Call("POST", "/v1/queues", R"({"name": "research", "guarantee": {"*": 16}})", 201);
  Call("POST", "/v1/queues", R"({"name": "research/nlp", "guarantee": {"*": 8}})", 201);
  Call("POST", "/v1/jobs", NodeJob("train", "research/nlp"), 201);
  Cycle();
  ASSERT_EQ(State("train"), "Scheduled");

  const auto refusal = [&](const std::string& queue, int want_status, const std::string& token) {
    return Call("DELETE", "/v1/queues/" + queue, "", want_status, nullptr, token)["error"].value(
        "message", "");
  };
  EXPECT_EQ(refusal("research", 403, *member), "deleting a queue needs an admin token");
  EXPECT_EQ(refusal("nowhere", 404, ""), "queue \"nowhere\" not found");
  EXPECT_THAT(refusal("default", 400, ""), HasSubstr("jobs without metadata.queue go there"));
  EXPECT_EQ(refusal("research", 400, ""),
            "queue \"research\" is in use: 1 child queues (research/nlp); delete or finish them "
            "first");
  EXPECT_THAT(refusal("research/nlp", 400, ""), HasSubstr("1 jobs not finished (train)"));
  // A job that finished is history, not a reason to keep the queue; one that is stopping is not.
  Call("POST", "/v1/jobs/train/cancel");
  EXPECT_THAT(refusal("research/nlp", 400, ""), HasSubstr("1 jobs not finished (train)"));
  Cycle();
  Call("DELETE", "/v1/queues/research/nlp", "", 200);
  EXPECT_EQ(refusal("research/nlp", 404, ""), "queue \"research/nlp\" not found");
  Call("DELETE", "/v1/queues/research", "", 200);
  EXPECT_EQ(Call("GET", "/v1/jobs/train")["queue"], "research/nlp");
  EXPECT_THAT(Call("GET", "/v1/queues/research/nlp/events").dump(), HasSubstr("deleted by root"));
}

TEST_F(ServerQueuesTest, ADeletedQueueLeavesTheTreeAndTheSavedUsage) {
  Call("POST", "/v1/queues", R"({"name": "gone"})", 201);
  Call("POST", "/v1/queues", R"({"name": "kept"})", 201);
  Call("POST", "/v1/jobs", NodeJob("g-0", "gone"), 201);
  Call("POST", "/v1/jobs", NodeJob("k-0", "kept"), 201);
  Cycle();
  clock_.Advance(std::chrono::minutes(2));
  Cycle();  // saves the usage of both
  const auto saved_queues = [&] {
    const Result<store::StoredObject> usage =
        store_.Get(control::kQueueUsageKind, control::kQueueUsageName);
    return usage.ok() ? Json::parse(usage->data)["queues"] : Json();
  };
  ASSERT_TRUE(saved_queues().contains("gone"));
  Call("POST", "/v1/jobs/g-0/cancel");
  Cycle();
  Call("DELETE", "/v1/queues/gone", "", 200);
  EXPECT_FALSE(saved_queues().contains("gone"));
  EXPECT_TRUE(saved_queues().contains("kept"));
  Cycle();
  EXPECT_TRUE(QueueRow("gone").is_null());
  EXPECT_TRUE(QueueRow("kept").contains("fair_share"));
  EXPECT_THAT(Error("/v1/jobs", NodeJob("late", "gone")),
              HasSubstr("metadata.queue: queue \"gone\" does not exist"));
  // A saved usage never brings it back, nor does a queue of the same name inherit it.
  clock_.Advance(std::chrono::minutes(2));
  Cycle();
  EXPECT_FALSE(saved_queues().contains("gone"));
  Call("POST", "/v1/queues", R"({"name": "gone"})", 201);
  Cycle();
  EXPECT_EQ(QueueRow("gone")["usage_gpu_hours"], Json::object());
}

TEST_F(ServerQueuesTest, StopSavesTheUsageWithinTheMinute) {
  const ApiServer::Options options{.store = store_,
                                   .catalog = catalog_,
                                   .clock = clock_,
                                   .wall_clock = &clock_,
                                   .usage_half_life = std::chrono::hours(1)};
  Call("POST", "/v1/queues", R"({"name": "heavy"})", 201);
  Call("POST", "/v1/jobs", NodeJob("h-0", "heavy"), 201);
  Result<std::unique_ptr<ApiServer>> first = ApiServer::Create(options);
  ASSERT_OK(first);
  EXPECT_OK((*first)->RunSchedulingCycle());  // the first save: nothing used yet
  clock_.Advance(std::chrono::seconds(30));
  EXPECT_OK((*first)->RunSchedulingCycle());  // within the minute: not saved
  (*first)->Stop();

  Result<std::unique_ptr<ApiServer>> second = ApiServer::Create(options);
  ASSERT_OK(second);
  EXPECT_OK((*second)->RunSchedulingCycle());
  // 8 GPUs for 30 s, decayed a little over them.
  const Json usage = QueueRow("heavy", second->get())["usage_gpu_hours"];
  ASSERT_TRUE(usage.contains("H100-80GB")) << usage;
  EXPECT_NEAR(usage["H100-80GB"].get<double>(), 8 * 30.0 / 3600, 8 * 30.0 / 3600 * 0.01);
}

// Four nodes run borrowed jobs; the owner preempts one of them. A job of another queue with a
// higher priority arrives before the victim's GPUs are free.
// `gpus` whole GPUs on one node, in the default queue.
std::string GpuJob(const std::string& name, int gpus, int priority) {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}}}
spec:
  priority: {}
  tasks:
    - name: main
      command: [train]
      resources: {{cpu: "1", memory: 1Gi, gpus: {{count: {}}}}}
)",
                     name, priority, gpus);
}

// Issue 14: a cycle that failed midway (the store refused the preemption's commit) left the
// placements it had made before in the view, so those GPUs looked taken until the next full
// reload.
TEST(ServerCycleTest, ACycleThatFailsMidwayLeavesNothingInTheView) {
  const GpuCatalog catalog = GpuCatalog::Default();
  FakeClock clock;
  store::InMemoryStateStore inner;
  store::testing::FaultInjectingStateStore store(inner);
  Result<std::unique_ptr<ApiServer>> server =
      ApiServer::Create({.store = store, .catalog = catalog, .clock = clock});
  ASSERT_OK(server);
  SyntheticClusterSpec spec;
  spec.blocks = 1;
  spec.leaves_per_block = 1;
  spec.nodes_per_leaf = 2;
  Result<Cluster> cluster = MakeSyntheticCluster(spec, catalog);
  ASSERT_OK(cluster);
  ASSERT_OK((*server)->RegisterNodes(*cluster));
  Result<std::string> admin =
      (*server)->authenticator().CreateToken(control::Role::kAdmin, "", "root");
  ASSERT_OK(admin);
  const auto call = [&](const std::string& method, const std::string& path,
                        const std::string& body = "") {
    return Json::parse(api_testing::HandleRequest(**server, method, path, *admin, body).body,
                       nullptr, false);
  };
  // One node full with a job that may be preempted, the other free.
  call("POST", "/v1/jobs", GpuJob("low", 8, 0));
  ASSERT_OK((*server)->RunSchedulingCycle());
  clock.Advance(std::chrono::seconds(61));
  ASSERT_OK((*server)->RunSchedulingCycle());

  // "small" is placed on the free node, then "urgent" needs a preemption whose commit fails.
  call("POST", "/v1/jobs", GpuJob("small", 2, 10));
  call("POST", "/v1/jobs", GpuJob("urgent", 8, 5));
  store.FailNthCommit(1);
  EXPECT_FALSE((*server)->RunSchedulingCycle().ok());
  ASSERT_EQ(store.injected_faults(), 1);
  EXPECT_EQ(call("GET", "/v1/jobs/small")["state"], "Pending");

  // The free node has all 8 GPUs again: "small" and a 6-GPU job both fit there now.
  call("POST", "/v1/jobs", GpuJob("fill", 6, 10));
  ASSERT_OK((*server)->RunSchedulingCycle());
  const Json small = call("GET", "/v1/jobs/small");
  const Json fill = call("GET", "/v1/jobs/fill");
  EXPECT_EQ(small["state"], "Scheduled") << small.dump();
  EXPECT_EQ(fill["state"], "Scheduled") << fill.dump();
  EXPECT_EQ(small["placements"][0]["node"], fill["placements"][0]["node"]);
  EXPECT_EQ(call("GET", "/v1/jobs/low")["state"], "Stopping") << "urgent preempted it this time";
}

class ServerReservationTest : public ServerQueuesTest {
 protected:
  void PreemptForMine() {
    Call("POST", "/v1/queues", R"({"name": "owner", "guarantee": {"*": 16}})", 201);
    Call("POST", "/v1/queues", R"({"name": "borrower"})", 201);
    Call("POST", "/v1/queues", R"({"name": "third"})", 201);
    for (const std::string name : {"b-0", "b-1", "b-2", "b-3"}) {
      Call("POST", "/v1/jobs", NodeJob(name, "borrower"), 201);
    }
    Cycle();
    clock_.Advance(std::chrono::seconds(61));
    Call("POST", "/v1/jobs", NodeJob("mine", "owner"), 201);
    for (const std::string name : {"b-0", "b-1", "b-2", "b-3"}) {
      node_of_[name] = NodeOf(name);
    }
    Cycle();
    for (const std::string name : {"b-0", "b-1", "b-2", "b-3"}) {
      if (State(name) == "Stopping") {
        victim_ = name;
      }
    }
    ASSERT_FALSE(victim_.empty());
    Call("POST", "/v1/jobs", NodeJob("rival", "third", 5), 201);
  }

  std::map<std::string, std::string> node_of_;
  std::string victim_;
};

TEST_F(ServerReservationTest, ThePreemptorGetsTheGpusItsVictimsFreed) {
  PreemptForMine();
  EXPECT_EQ(Reason("mine"), fmt::format("GPUs reserved on {} after preempting {}; waiting for "
                                        "them to stop",
                                        node_of_[victim_], victim_));
  Cycle();
  EXPECT_EQ(State("mine"), "Scheduled");
  EXPECT_EQ(NodeOf("mine"), node_of_[victim_]);
  EXPECT_EQ(State("rival"), "Pending");
  // Nobody else was preempted for it.
  for (const auto& [name, node] : node_of_) {
    EXPECT_EQ(State(name), name == victim_ ? "Pending" : "Scheduled") << name;
  }
  // The reservation ended with the placement: the rival takes the next GPUs freed.
  Call("POST", "/v1/jobs/mine/cancel");
  Cycle();
  EXPECT_EQ(State("rival"), "Scheduled");
}

TEST_F(ServerReservationTest, HeldGpusStayFreeUntilTheReservationExpires) {
  PreemptForMine();
  // The owner may no longer hold anything: its preemptor is refused, but the freed node stays
  // reserved for it, so neither the rival nor the requeued victim takes it.
  Call("PATCH", "/v1/queues/owner", R"({"guarantee": null, "limit": {"*": 0}})");
  Cycle();
  EXPECT_EQ(State("mine"), "Pending");
  EXPECT_THAT(Reason("mine"), HasSubstr("limit"));
  EXPECT_EQ(State("rival"), "Pending");
  EXPECT_EQ(State(victim_), "Pending");
  Cycle();
  EXPECT_EQ(State("rival"), "Pending");
  clock_.Advance(std::chrono::seconds(61));
  Cycle();
  EXPECT_EQ(State("rival"), "Scheduled");
  EXPECT_EQ(NodeOf("rival"), node_of_[victim_]);
  EXPECT_THAT(Events("mine"), HasSubstr("reservation of GPUs on cluster expired"));
}

TEST_F(ServerReservationTest, ACancelledPreemptorFreesItsReservation) {
  PreemptForMine();
  Call("POST", "/v1/jobs/mine/cancel");
  Cycle();
  EXPECT_EQ(State("rival"), "Scheduled");
  EXPECT_EQ(NodeOf("rival"), node_of_[victim_]);
}

}  // namespace
}  // namespace gpufleet::api
