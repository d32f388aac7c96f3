// SPDX-License-Identifier: Apache-2.0
// Deployments and their autoscaling through ApiServer (server_deployments.cc), on a fake clock:
// one agent node whose heartbeats carry GPU utilization, and an inference deployment of one-GPU
// replicas.
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/auth.h"
#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/agent_node_fixture.h"
#include "gpufleet/control/deployment_controller.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/snapshot.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/wire/agent_protocol.h"
#include "gpufleet/wire/deployment_spec.h"

namespace gpufleet::api {
namespace {

using Json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Replicas of one whole GPU; scale-downs wait 5 minutes, no cooldowns unless `autoscaling` says.
Json DeploymentSpec(const Json& autoscaling = Json::object()) {
  Json spec = Json::parse(R"({"name": "chat",
    "template": {"apiVersion": "gpufleet.io/v1", "kind": "Job",
      "spec": {"kind": "inference", "tasks": [{"name": "server", "command": ["serve"],
        "resources": {"cpu": "4", "memory": "16Gi", "gpus": {"count": 1}}}]}},
    "autoscaling": {"min_replicas": 1, "max_replicas": 3, "target_utilization_pct": 70,
                    "scale_down_stabilization_seconds": 300}})");
  spec["autoscaling"].update(autoscaling);
  return spec;
}

TEST(PlanReplicasTest, CreatesAboveEveryIndexAndCancelsTheHighestFirst) {
  const std::vector<control::ReplicaJob> replicas = {{2, "chat-r2", control::JobState::kRunning},
                                                     {0, "chat-r0", control::JobState::kRunning},
                                                     {1, "chat-r1", control::JobState::kCancelled},
                                                     {3, "chat-r3", control::JobState::kPending}};
  const control::ReplicaPlan grow = control::PlanReplicas(replicas, 4, 0);
  EXPECT_THAT(grow.create, ElementsAre(4));
  EXPECT_THAT(grow.keep, ElementsAre("chat-r0", "chat-r2", "chat-r3"));
  EXPECT_TRUE(grow.cancel.empty());

  const control::ReplicaPlan shrink = control::PlanReplicas(replicas, 1, 0);
  EXPECT_TRUE(shrink.create.empty());
  EXPECT_THAT(shrink.cancel, ElementsAre("chat-r3", "chat-r2"));
  EXPECT_THAT(shrink.keep, ElementsAre("chat-r0"));

  const control::ReplicaPlan first = control::PlanReplicas({}, 2, 0);
  EXPECT_THAT(first.create, ElementsAre(0, 1));
  // Ended replicas the view no longer holds: the stored next index keeps their names unused.
  const control::ReplicaPlan after_ended = control::PlanReplicas({}, 1, 6);
  EXPECT_THAT(after_ended.create, ElementsAre(6));
}

// Replica jobs as the controller asks for them, recorded; a name in `taken` is refused as the
// server refuses a name that exists.
class RecordedReplicaJobs final : public control::ReplicaJobs {
 public:
  Result<Json> Submit(const control::Principal& owner, std::string_view spec) override {
    const std::string name = wire::ParseDocument(std::string(spec))["metadata"]["name"];
    if (taken.count(name) > 0) {
      return AlreadyExistsError(fmt::format("job \"{}\" already exists", name));
    }
    submitted.push_back(fmt::format("{}/{}", owner.team, name));
    return Json::object();
  }
  Result<Json> Cancel(const control::Principal& owner, std::string_view key) override {
    cancelled.push_back(fmt::format("{} as {}", key, owner.name));
    return Json::object();
  }

  std::set<std::string> taken;
  std::vector<std::string> submitted;
  std::vector<std::string> cancelled;
};

TEST(DeploymentControllerTest, SubmitsTheMissingReplicasAsTheCreatorPastTakenNamesAndStoresIt) {
  const GpuCatalog catalog = GpuCatalog::Default();
  store::InMemoryStateStore store;
  Json doc = DeploymentSpec({{"min_replicas", 2}});
  const Result<wire::DeploymentSpec> spec = wire::DeploymentSpecFromJson(doc, catalog);
  ASSERT_OK(spec);
  doc = wire::DeploymentSpecToJson(*spec);
  doc["team"] = "nlp";
  doc["created_by"] = "ada";
  store::WriteBatch create;
  create.Create(std::string(control::kDeploymentsKind), "nlp/chat", doc.dump());
  ASSERT_OK(store.Commit(create));

  control::DeploymentController controller(store, catalog);
  RecordedReplicaJobs replicas;
  replicas.taken = {"chat-r0"};  // an ended replica the deployment did not store
  const MonoTime now{1'000'000'000'000};
  ASSERT_TRUE(controller.Due(now));
  const Result<scheduler::ClusterSnapshot> snapshot =
      scheduler::ClusterSnapshot::Build(Cluster(), catalog);
  ASSERT_OK(snapshot);
  const Result<bool> changed = controller.Step({}, *snapshot, {}, now, replicas);
  ASSERT_OK(changed);
  EXPECT_TRUE(*changed);
  EXPECT_THAT(replicas.submitted, ElementsAre("nlp/chat-r1", "nlp/chat-r2"));
  EXPECT_FALSE(
      controller.Due(now + (control::kDeploymentControllerPeriod - std::chrono::seconds(1))));
  EXPECT_TRUE(controller.Due(now + control::kDeploymentControllerPeriod));

  const Result<store::StoredObject> stored = store.Get(control::kDeploymentsKind, "nlp/chat");
  ASSERT_OK(stored);
  const Json status = wire::ParseDocument(stored->data);
  EXPECT_EQ(status["desired_replicas"], 2);
  EXPECT_EQ(status["replicas"].dump(), R"(["chat-r1","chat-r2"])");
  EXPECT_EQ(status["next_replica_index"], 3) << "a name is never reused";
  EXPECT_THAT(control::LiveReplicasOf("nlp/chat", status, {}),
              ElementsAre("nlp/chat-r1", "nlp/chat-r2"));
  EXPECT_TRUE(replicas.cancelled.empty());
}

class ServerDeploymentsTest : public api_testing::AgentNodeServerTest {
 protected:
  void SetUp() override { StartServer(); }

  void Create(const Json& spec) {
    const ApiResponse response = Call("POST", "/v1/deployments", alice_, spec.dump());
    ASSERT_EQ(response.status, 201) << response.body;
  }

  Json Deployment() {
    const ApiResponse response = Call("GET", "/v1/deployments/chat", alice_);
    EXPECT_EQ(response.status, 200) << response.body;
    return Json::parse(response.body, nullptr, false);
  }
  int Desired() { return Deployment().value("desired_replicas", -1); }

  std::string JobState(const std::string& name) {
    const ApiResponse response = Call("GET", "/v1/jobs/" + name, admin_);
    if (response.status == 404) {
      return "absent";
    }
    return Json::parse(response.body, nullptr, false).value("state", "");
  }
};

TEST_F(ServerDeploymentsTest, BadSpecsAreRefusedNamingTheFieldAndNothingIsStored) {
  Json two_groups = DeploymentSpec();
  Json& tasks = two_groups["template"]["spec"]["tasks"];
  tasks.push_back(tasks[0]);
  tasks[1]["name"] = "sidecar";
  Json unknown = DeploymentSpec();
  unknown["replicas"] = 2;
  const std::pair<Json, std::string> cases[] = {
      {DeploymentSpec({{"min_replicas", 4}}), "autoscaling.max_replicas: 3"},
      {DeploymentSpec({{"target_utilization_pct", 0}}), "autoscaling.target_utilization_pct: 0"},
      {two_groups, "template.spec.tasks: 2 task groups"},
      {unknown, "replicas: unknown field"},
  };
  for (const auto& [spec, message] : cases) {
    SCOPED_TRACE(message);
    const ApiResponse response = Call("POST", "/v1/deployments", alice_, spec.dump());
    EXPECT_EQ(response.status, 400);
    EXPECT_THAT(response.body, HasSubstr(message));
  }
  Json other_queue = DeploymentSpec();
  other_queue["queue"] = "nowhere";
  EXPECT_EQ(Call("POST", "/v1/deployments", alice_, other_queue.dump()).status, 400);
  const ApiResponse list = Call("GET", "/v1/deployments", admin_);
  ASSERT_EQ(list.status, 200);
  EXPECT_EQ(Json::parse(list.body)["items"].size(), 0U);
  Minutes(2, 0);
  EXPECT_EQ(JobState("chat-r0"), "absent");
}

TEST_F(ServerDeploymentsTest, ListsAndGetsTheTeamsOwnAndAnswersConflicts) {
  Create(DeploymentSpec());
  EXPECT_EQ(Call("POST", "/v1/deployments", alice_, DeploymentSpec().dump()).status, 409);
  const Json doc = Deployment();
  EXPECT_EQ(doc["team"], "team-a");
  EXPECT_EQ(doc["desired_replicas"], 1);
  EXPECT_EQ(doc["autoscaling"]["target_utilization_pct"], 70);
  EXPECT_EQ(Call("GET", "/v1/deployments/chat", bob_).status, 404);
  EXPECT_EQ(Json::parse(Call("GET", "/v1/deployments", bob_).body)["items"].size(), 0U);
  EXPECT_EQ(Json::parse(Call("GET", "/v1/deployments", admin_).body)["items"].size(), 1U);
  EXPECT_EQ(Call("GET", "/v1/deployments/nope", alice_).status, 404);
}

TEST_F(ServerDeploymentsTest, HotReplicasScaleUpWithinMax) {
  Create(DeploymentSpec());
  Minute(90);  // 00:01 chat-r0 submitted and scheduled
  const Json r0 = Json::parse(Call("GET", "/v1/jobs/chat-r0", admin_).body);
  EXPECT_EQ(r0["team"], "team-a");
  EXPECT_EQ(r0["labels"]["deployment"], "chat");
  EXPECT_EQ(r0["spec"]["spec"]["kind"], "inference");
  Minutes(2, 90);  // 00:03 chat-r0 runs at 90% against 70%: a second replica
  EXPECT_EQ(JobState("chat-r0"), "Running");
  EXPECT_EQ(Desired(), 2);
  EXPECT_EQ(Deployment()["utilization_pct"], 90);
  EXPECT_THAT(Deployment().value("reason", ""), HasSubstr("1 -> 2"));
  Minutes(10, 90);
  const Json doc = Deployment();
  EXPECT_EQ(doc["desired_replicas"], 3);  // ceil(3 * 90 / 70) = 4, bounded by max 3
  EXPECT_EQ(doc["ready_replicas"], 3);
  EXPECT_THAT(doc["replicas"], ElementsAre("chat-r0", "chat-r1", "chat-r2"));
  for (const char* name : {"chat-r0", "chat-r1", "chat-r2"}) {
    EXPECT_EQ(JobState(name), "Running") << name;
  }
  EXPECT_EQ(JobState("chat-r3"), "absent");
  const std::string events = Call("GET", "/v1/deployments/chat/events", alice_).body;
  EXPECT_THAT(events, HasSubstr("scaled 1 -> 2"));
  EXPECT_THAT(events, HasSubstr("scaled 2 -> 3"));
}

TEST_F(ServerDeploymentsTest, NoScalingWhileNoReplicaIsReady) {
  Create(DeploymentSpec());
  Minutes(10, 100, /*tasks_run=*/false);  // chat-r0 never reports running
  EXPECT_EQ(JobState("chat-r0"), "Scheduled");
  const Json doc = Deployment();
  EXPECT_EQ(doc["desired_replicas"], 1);
  EXPECT_EQ(doc["ready_replicas"], 0);
  EXPECT_TRUE(doc["utilization_pct"].is_null());
  EXPECT_THAT(doc.value("reason", ""), HasSubstr("no ready replica"));
  EXPECT_EQ(JobState("chat-r1"), "absent");
}

TEST_F(ServerDeploymentsTest, ColdReplicasScaleDownAfterTheWindowHighestIndexFirst) {
  Create(DeploymentSpec());
  Minutes(12, 90);
  ASSERT_EQ(Desired(), 3);
  // 40% on 3 replicas needs ceil(3 * 40 / 70) = 2; the 5-minute window keeps 3 meanwhile.
  Minutes(4, 40);
  EXPECT_EQ(Desired(), 3);
  EXPECT_EQ(JobState("chat-r2"), "Running");
  Minutes(2, 40);
  EXPECT_EQ(Desired(), 2);
  // Cancelled once its agent no longer runs it.
  EXPECT_EQ(JobState("chat-r2"), "Stopping");
  Minute(40);
  EXPECT_EQ(JobState("chat-r2"), "Cancelled");
  EXPECT_EQ(JobState("chat-r1"), "Running");
  EXPECT_EQ(JobState("chat-r0"), "Running");
  EXPECT_THAT(Deployment()["replicas"], ElementsAre("chat-r0", "chat-r1"));
}

TEST_F(ServerDeploymentsTest, ScaleUpCooldownIsRespected) {
  Create(DeploymentSpec({{"scale_up_cooldown_seconds", 600}}));
  Minutes(3, 90);  // 00:03 1 -> 2
  ASSERT_EQ(Desired(), 2);
  // chat-r1 runs from about 00:05 and 2 replicas at 90% need 3, but not before 00:13.
  Minutes(9, 90);  // 00:12
  EXPECT_EQ(Desired(), 2);
  EXPECT_THAT(Deployment().value("reason", ""), HasSubstr("cooldown"));
  EXPECT_EQ(JobState("chat-r2"), "absent");
  Minutes(2, 90);  // 00:14
  EXPECT_EQ(Desired(), 3);
  EXPECT_NE(JobState("chat-r2"), "absent");
}

TEST_F(ServerDeploymentsTest, AnEndedReplicaIsReplacedUnderANewName) {
  Create(DeploymentSpec({{"max_replicas", 1}}));
  Minutes(3, 50);
  ASSERT_EQ(JobState("chat-r0"), "Running");
  ASSERT_EQ(Call("POST", "/v1/jobs/chat-r0/cancel", alice_).status, 200);
  Minute(50);
  EXPECT_EQ(Desired(), 1) << Deployment().dump();
  // A stopping replica no longer counts: its replacement comes at once.
  EXPECT_EQ(JobState("chat-r0"), "Stopping");
  EXPECT_NE(JobState("chat-r1"), "absent");
  Minute(50);
  EXPECT_EQ(JobState("chat-r0"), "Cancelled");
}

TEST_F(ServerDeploymentsTest, AYamlSpecIsCreatedAndMalformedYamlIsNamed) {
  const std::string yaml = R"(name: chat
template:
  apiVersion: gpufleet.io/v1
  kind: Job
  spec:
    kind: inference
    tasks:
      - name: server
        command: [serve]
        resources: {cpu: "4", memory: 16Gi, gpus: {count: 1}}
autoscaling:
  min_replicas: 2
  max_replicas: 3
)";
  const ApiResponse created = Call("POST", "/v1/deployments", alice_, yaml);
  ASSERT_EQ(created.status, 201) << created.body;
  EXPECT_EQ(Deployment()["desired_replicas"], 2);
  EXPECT_EQ(Deployment()["autoscaling"]["max_replicas"], 3);
  Minute(50);
  EXPECT_NE(JobState("chat-r1"), "absent");

  const ApiResponse broken =
      Call("POST", "/v1/deployments", alice_, "name: other\ntemplate: [unclosed\n");
  EXPECT_EQ(broken.status, 400);
  EXPECT_THAT(broken.body, HasSubstr("invalid YAML at line"));
  const ApiResponse duplicate =
      Call("POST", "/v1/deployments", alice_, "name: other\nname: again\n");
  EXPECT_EQ(duplicate.status, 400);
  EXPECT_THAT(duplicate.body, HasSubstr("name: duplicate key (line 2"));
  const ApiResponse wrong_type =
      Call("POST", "/v1/deployments", alice_,
           "name: other\ntemplate: {}\nautoscaling: {min_replicas: x}\n");
  EXPECT_EQ(wrong_type.status, 400);
  EXPECT_EQ(Call("GET", "/v1/deployments/other", admin_).status, 404);
}

TEST_F(ServerDeploymentsTest, DeleteCancelsTheReplicasAndRemovesTheDeployment) {
  Create(DeploymentSpec({{"min_replicas", 2}}));
  Minutes(3, 50);
  ASSERT_EQ(JobState("chat-r0"), "Running");
  ASSERT_EQ(JobState("chat-r1"), "Running");
  // Another team's member cannot see it, so cannot delete it either.
  EXPECT_EQ(Call("DELETE", "/v1/deployments/chat", bob_).status, 404);
  EXPECT_EQ(Call("DELETE", "/v1/deployments/nope", alice_).status, 404);
  EXPECT_EQ(JobState("chat-r0"), "Running");

  const ApiResponse deleted = Call("DELETE", "/v1/deployments/chat", alice_);
  ASSERT_EQ(deleted.status, 200) << deleted.body;
  EXPECT_THAT(Json::parse(deleted.body)["cancelled_replicas"], ElementsAre("chat-r0", "chat-r1"));
  EXPECT_EQ(JobState("chat-r0"), "Stopping");
  EXPECT_EQ(JobState("chat-r1"), "Stopping");
  EXPECT_EQ(Call("GET", "/v1/deployments/chat", alice_).status, 404);
  EXPECT_EQ(Call("DELETE", "/v1/deployments/chat", alice_).status, 404);
  // The log outlives the deployment (as a job's does); its last event says what went.
  const Result<std::vector<store::StoredEvent>> events =
      store_.Events(control::kDeploymentsKind, "team-a/chat");
  ASSERT_TRUE(events.ok());
  ASSERT_FALSE(events->empty());
  EXPECT_EQ(events->back().text, "deleted by alice; replicas cancelled: chat-r0, chat-r1");
  // The controller submits nothing more for it.
  Minutes(3, 50);
  EXPECT_EQ(JobState("chat-r0"), "Cancelled");
  EXPECT_EQ(JobState("chat-r1"), "Cancelled");
  EXPECT_EQ(JobState("chat-r2"), "absent");
  // The name is free again.
  Create(DeploymentSpec());
}

TEST_F(ServerDeploymentsTest, AnAdminDeletesAnyTeamsDeployment) {
  Create(DeploymentSpec());
  Minute(50);
  const ApiResponse deleted = Call("DELETE", "/v1/deployments/chat", admin_);
  ASSERT_EQ(deleted.status, 200) << deleted.body;
  EXPECT_EQ(JobState("chat-r0"), "Stopping");
}

TEST_F(ServerDeploymentsTest, PatchMergesAutoscalingAndTheControllerUsesIt) {
  Create(DeploymentSpec());
  Minutes(3, 50);
  ASSERT_EQ(Desired(), 1);
  const ApiResponse patched = Call("PATCH", "/v1/deployments/chat", alice_,
                                   R"({"autoscaling": {"min_replicas": 2, "max_replicas": 4}})");
  ASSERT_EQ(patched.status, 200) << patched.body;
  const Json doc = Deployment();
  EXPECT_EQ(doc["autoscaling"]["min_replicas"], 2);
  EXPECT_EQ(doc["autoscaling"]["max_replicas"], 4);
  EXPECT_EQ(doc["autoscaling"]["target_utilization_pct"], 70);  // not named: unchanged
  EXPECT_EQ(doc["autoscaling"]["scale_down_stabilization_seconds"], 300);
  EXPECT_EQ(doc["desired_replicas"], 1);  // the count stays until the controller's next step
  EXPECT_THAT(Call("GET", "/v1/deployments/chat/events", alice_).body,
              HasSubstr("autoscaling updated by alice: max_replicas 3 -> 4, min_replicas 1 -> 2"));
  Minutes(2, 50);
  EXPECT_EQ(Desired(), 2);  // raised to the new minimum
  EXPECT_NE(JobState("chat-r1"), "absent");
}

TEST_F(ServerDeploymentsTest, BadPatchesAreRefusedAndChangeNothing) {
  Create(DeploymentSpec());
  const std::pair<std::string, std::string> cases[] = {
      {R"({"autoscaling": {"max_replicas": 0}})", "autoscaling.max_replicas: 0"},
      {R"({"autoscaling": {"min_replicas": 5}})", "autoscaling.max_replicas: 3"},
      {R"({"autoscaling": {"target": 50}})", "autoscaling.target: unknown field"},
      {R"({"autoscaling": {"min_replicas": "2"}})", "must be an integer"},
      {R"({"autoscaling": 3})", "autoscaling: 3 (must be an object)"},
      {R"({"template": {}})", "template: cannot be changed; create a new deployment"},
      {R"({"queue": "other"})", "queue: cannot be changed"},
      {"not json", "must be a JSON object"},
  };
  const Json before = Deployment();
  for (const auto& [body, message] : cases) {
    SCOPED_TRACE(body);
    const ApiResponse response = Call("PATCH", "/v1/deployments/chat", alice_, body);
    EXPECT_EQ(response.status, 400);
    EXPECT_THAT(response.body, HasSubstr(message));
  }
  EXPECT_EQ(Deployment(), before);
  EXPECT_EQ(Call("PATCH", "/v1/deployments/chat", bob_, R"({"autoscaling": {}})").status, 404);
  EXPECT_EQ(Call("PATCH", "/v1/deployments/nope", alice_, R"({"autoscaling": {}})").status, 404);
}

}  // namespace
}  // namespace gpufleet::api
