// SPDX-License-Identifier: Apache-2.0
// Job and deployment names scoped by team (docs/api.md, "Names"), through ApiServer on a fake
// clock with one agent node: two teams use one name, members never reach past their team,
// admins write TEAM/NAME, and a store written with bare names is moved over at start.
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/agent_node_fixture.h"
#include "gpufleet/control/deployment_controller.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/wire/agent_protocol.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

// A job of one task on one whole GPU.
std::string OneGpuJob(const std::string& name) {
  return Json{{"apiVersion", "gpufleet.io/v1"},
              {"kind", "Job"},
              {"metadata", {{"name", name}}},
              {"spec",
               {{"tasks",
                 {{{"name", "main"},
                   {"command", {"run"}},
                   {"resources", {{"cpu", "4"}, {"memory", "16Gi"}, {"gpus", {{"count", 1}}}}}}}}}}}
      .dump();
}

std::string Deployment(const std::string& name) {
  Json spec = Json::parse(R"({
    "template": {"apiVersion": "gpufleet.io/v1", "kind": "Job",
      "spec": {"kind": "inference", "tasks": [{"name": "server", "command": ["serve"],
        "resources": {"cpu": "4", "memory": "16Gi", "gpus": {"count": 1}}}]}},
    "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_utilization_pct": 70}})");
  spec["name"] = name;
  return spec.dump();
}

class TeamScopedNamesTest : public api_testing::AgentNodeServerTest {
 protected:
  void SetUp() override { StartServer(); }

  Json CallJson(const std::string& method, const std::string& path, const std::string& token,
                int want_status, const std::string& body = "") {
    const ApiResponse response = Call(method, path, token, body);
    EXPECT_EQ(response.status, want_status) << method << " " << path << ": " << response.body;
    return Json::parse(response.body, nullptr, false);
  }

  std::set<std::string> StoredNames(std::string_view kind) {
    std::set<std::string> names;
    const Result<std::vector<store::StoredObject>> objects = store_.List(kind);
    EXPECT_OK(objects);
    if (objects.ok()) {
      for (const store::StoredObject& object : *objects) {
        names.insert(object.name);
      }
    }
    return names;
  }
};

TEST_F(TeamScopedNamesTest, TwoTeamsSubmitTheSameJobNameAndBothRun) {
  CallJson("POST", "/v1/jobs", alice_, 201, OneGpuJob("train"));
  CallJson("POST", "/v1/jobs", bob_, 201, OneGpuJob("train"));
  EXPECT_THAT(StoredNames(control::kJobsKind),
              UnorderedElementsAre("team-a/train", "team-b/train"));

  Minute(0);  // scheduled
  Minute(0);  // node-a is told to run both
  ASSERT_EQ(desired_.size(), 2u);
  EXPECT_THAT(desired_, UnorderedElementsAre("team-a/train/main-0/1", "team-b/train/main-0/1"));
  for (const std::string& id : desired_) {
    EXPECT_LE(id.size(), kMaxTaskIdLength);
  }
  Minute(0);  // both reported running
  const Json mine = CallJson("GET", "/v1/jobs/train", alice_, 200);
  const Json theirs = CallJson("GET", "/v1/jobs/train", bob_, 200);
  EXPECT_EQ(mine["state"], "Running");
  EXPECT_EQ(theirs["state"], "Running");
  EXPECT_EQ(mine["team"], "team-a");
  EXPECT_EQ(mine["name"], "train");
  EXPECT_EQ(theirs["team"], "team-b");
  EXPECT_NE(mine["placements"][0]["gpus"], theirs["placements"][0]["gpus"]);

  // Cancelling one team's job leaves the other's running, and its events are its own.
  CallJson("POST", "/v1/jobs/train/cancel", bob_, 200);
  EXPECT_EQ(CallJson("GET", "/v1/jobs/train", alice_, 200)["state"], "Running");
  const Json events = CallJson("GET", "/v1/jobs/train/events", alice_, 200);
  for (const Json& event : events["items"]) {
    EXPECT_THAT(event["message"].get<std::string>(), Not(HasSubstr("bob")));
  }
}

TEST_F(TeamScopedNamesTest, AMembers409ConcernsItsOwnTeamOnly) {
  CallJson("POST", "/v1/jobs", alice_, 201, OneGpuJob("once"));
  const Json again = CallJson("POST", "/v1/jobs", alice_, 409, OneGpuJob("once"));
  EXPECT_EQ(again["error"]["code"], "ALREADY_EXISTS");
  EXPECT_THAT(again["error"]["message"].get<std::string>(),
              HasSubstr("job \"once\" already exists in team \"team-a\""));
  // Another team's job of that name is no conflict, and nothing tells bob it exists.
  CallJson("POST", "/v1/jobs", bob_, 201, OneGpuJob("once"));
  CallJson("POST", "/v1/deployments", alice_, 201, Deployment("chat"));
  CallJson("POST", "/v1/deployments", bob_, 201, Deployment("chat"));
  const Json twice = CallJson("POST", "/v1/deployments", bob_, 409, Deployment("chat"));
  EXPECT_THAT(twice["error"]["message"].get<std::string>(), HasSubstr("team \"team-b\""));
}

TEST_F(TeamScopedNamesTest, AMemberCannotReachAnotherTeamsJobByTeamSlashName) {
  CallJson("POST", "/v1/jobs", alice_, 201, OneGpuJob("secret"));
  CallJson("POST", "/v1/deployments", alice_, 201, Deployment("hidden"));
  // Its own team may be written out.
  EXPECT_EQ(CallJson("GET", "/v1/jobs/team-a/secret", alice_, 200)["name"], "secret");
  CallJson("GET", "/v1/jobs/team-a/secret/events", alice_, 200);
  // Another team's is hidden, as a job bob cannot see always was: 404.
  for (const char* path : {"/v1/jobs/team-a/secret", "/v1/jobs/team-a/secret/events",
                           "/v1/jobs/secret", "/v1/deployments/team-a/hidden",
                           "/v1/deployments/hidden", "/v1/deployments/team-a/hidden/events"}) {
    SCOPED_TRACE(path);
    const Json error = CallJson("GET", path, bob_, 404);
    EXPECT_EQ(error["error"]["code"], "NOT_FOUND");
  }
  CallJson("POST", "/v1/jobs/team-a/secret/cancel", bob_, 404);
  CallJson("DELETE", "/v1/deployments/team-a/hidden", bob_, 404);
  CallJson("PATCH", "/v1/deployments/team-a/hidden", bob_, 404, R"({"autoscaling": {}})");
  EXPECT_EQ(CallJson("GET", "/v1/jobs/secret", alice_, 200)["state"], "Pending");
}

TEST_F(TeamScopedNamesTest, AnAdminAddressesTeamSlashName) {
  CallJson("POST", "/v1/jobs", alice_, 201, OneGpuJob("train"));
  CallJson("POST", "/v1/jobs", bob_, 201, OneGpuJob("train"));
  CallJson("POST", "/v1/jobs", bob_, 201, OneGpuJob("solo"));

  EXPECT_EQ(CallJson("GET", "/v1/jobs/team-b/train", admin_, 200)["team"], "team-b");
  CallJson("POST", "/v1/jobs/team-b/train/cancel", admin_, 200);
  EXPECT_EQ(CallJson("GET", "/v1/jobs/team-b/train", admin_, 200)["state"], "Cancelled");
  EXPECT_EQ(CallJson("GET", "/v1/jobs/team-a/train", admin_, 200)["state"], "Pending");
  CallJson("GET", "/v1/jobs/team-c/train", admin_, 404);

  // A bare name two teams use is ambiguous: 400 naming the field and the candidates.
  const Json ambiguous = CallJson("GET", "/v1/jobs/train", admin_, 400);
  EXPECT_THAT(ambiguous["error"]["message"].get<std::string>(),
              HasSubstr("name: job \"train\" exists in 2 teams (team-a/train, team-b/train)"));
  CallJson("POST", "/v1/jobs/train/cancel", admin_, 400);
  // One team's is resolved; none is 404.
  EXPECT_EQ(CallJson("GET", "/v1/jobs/solo", admin_, 200)["team"], "team-b");
  CallJson("GET", "/v1/jobs/nowhere", admin_, 404);

  // The listing shows every team's, each with its team.
  std::set<std::string> listed;
  const Json all = CallJson("GET", "/v1/jobs", admin_, 200);
  for (const Json& job : all["items"]) {
    listed.insert(job["team"].get<std::string>() + "/" + job["name"].get<std::string>());
  }
  EXPECT_THAT(listed, UnorderedElementsAre("team-a/train", "team-b/train", "team-b/solo"));

  // Deployments likewise.
  CallJson("POST", "/v1/deployments", alice_, 201, Deployment("chat"));
  CallJson("POST", "/v1/deployments", bob_, 201, Deployment("chat"));
  EXPECT_EQ(CallJson("GET", "/v1/deployments/team-a/chat", admin_, 200)["team"], "team-a");
  CallJson("GET", "/v1/deployments/team-a/chat/events", admin_, 200);
  CallJson("GET", "/v1/deployments/chat", admin_, 400);
  const Json deleted = CallJson("DELETE", "/v1/deployments/team-b/chat", admin_, 200);
  EXPECT_EQ(deleted["name"], "chat");
  EXPECT_EQ(deleted["team"], "team-b");
  EXPECT_EQ(CallJson("GET", "/v1/deployments/chat", admin_, 200)["team"], "team-a");
}

TEST_F(TeamScopedNamesTest, DeploymentsOfTwoTeamsKeepTheirOwnReplicas) {
  CallJson("POST", "/v1/deployments", alice_, 201, Deployment("chat"));
  CallJson("POST", "/v1/deployments", bob_, 201, Deployment("chat"));
  Minute(0);
  Minute(0);
  Minute(0);
  EXPECT_THAT(StoredNames(control::kJobsKind),
              UnorderedElementsAre("team-a/chat-r0", "team-b/chat-r0"));
  const Json mine = CallJson("GET", "/v1/deployments/chat", alice_, 200);
  EXPECT_EQ(mine["replicas"], Json::array({"chat-r0"}));
  EXPECT_EQ(CallJson("GET", "/v1/jobs/chat-r0", alice_, 200)["state"], "Running");
  EXPECT_EQ(CallJson("GET", "/v1/jobs/chat-r0", bob_, 200)["state"], "Running");
  // Deleting bob's cancels bob's replica only.
  EXPECT_EQ(CallJson("DELETE", "/v1/deployments/chat", bob_, 200)["cancelled_replicas"],
            Json::array({"chat-r0"}));
  EXPECT_NE(CallJson("GET", "/v1/jobs/chat-r0", bob_, 200)["state"], "Running");
  EXPECT_EQ(CallJson("GET", "/v1/jobs/chat-r0", alice_, 200)["state"], "Running");
}

TEST_F(TeamScopedNamesTest, NamesThatCannotBeAddressedOrRunAreRefusedNamingTheField) {
  const Json events = CallJson("POST", "/v1/jobs", alice_, 400, OneGpuJob("events"));
  EXPECT_THAT(events["error"]["message"].get<std::string>(), HasSubstr("metadata.name"));
  CallJson("POST", "/v1/deployments", alice_, 400, Deployment("events"));

  // A team and job name so long that task ids would pass the agent's limit.
  const std::string team(63, 't');
  store::WriteBatch batch;
  batch.Create(std::string(control::kTeamsKind), team, control::TeamToJson({.name = team}).dump());
  ASSERT_OK(store_.Commit(batch));
  const std::string member =
      *server_->authenticator().CreateToken(control::Role::kMember, team, "long-team-member");
  Json spec = Json::parse(OneGpuJob(std::string(63, 'j')));
  spec["spec"]["tasks"][0]["name"] = std::string(63, 'g');
  spec["spec"]["tasks"][0]["replicas"] = 11;
  const Json refused = CallJson("POST", "/v1/jobs", member, 400, spec.dump());
  EXPECT_THAT(refused["error"]["message"].get<std::string>(),
              HasSubstr("metadata.name: task ids of job"));
  spec["spec"]["tasks"][0]["replicas"] = 1;
  spec["metadata"]["name"] = std::string(50, 'j');
  CallJson("POST", "/v1/jobs", member, 201, spec.dump());
}

// An older server stored jobs and deployments under their bare name: a new server moves them to
// TEAM/NAME with their events and goes on serving and scheduling them.
TEST_F(TeamScopedNamesTest, AnAdminOfATeamFindsATeamlessAdminsJobByItsName) {
  CallJson("POST", "/v1/jobs", admin_, 201, OneGpuJob("solo"));
  const std::string ops =
      *server_->authenticator().CreateToken(control::Role::kAdmin, "team-a", "ops");
  EXPECT_EQ(CallJson("GET", "/v1/jobs/solo", ops, 200)["name"], "solo");
  CallJson("POST", "/v1/jobs", bob_, 201, OneGpuJob("solo"));
  EXPECT_THAT(CallJson("GET", "/v1/jobs/solo", ops, 400).dump(),
              HasSubstr("exists in 2 teams (solo, team-b/solo)"));
}

TEST_F(TeamScopedNamesTest, ABareNameWhoseKeyIsTakenStaysWhereItIsAndTheServerStarts) {
  CallJson("POST", "/v1/jobs", alice_, 201, OneGpuJob("train"));
  server_.reset();
  // An older server's bare-key copy beside the new key (a roll back and forward).
  const Result<store::StoredObject> stored = store_.Get(control::kJobsKind, "team-a/train");
  ASSERT_OK(stored);
  store::WriteBatch batch;
  batch.Create(std::string(control::kJobsKind), "train", stored->data);
  ASSERT_OK(store_.Commit(batch));

  Result<std::unique_ptr<ApiServer>> restarted =
      ApiServer::Create({.store = store_, .catalog = catalog_, .clock = clock_});
  ASSERT_OK(restarted);
  server_ = std::move(restarted).value();
  EXPECT_THAT(StoredNames(control::kJobsKind), UnorderedElementsAre("team-a/train", "train"));
  ASSERT_OK(server_->RunSchedulingCycle());
  ASSERT_OK(server_->RunSchedulingCycle());
  // Only the job under its TEAM/NAME is placed: the stray copy waits for an administrator.
  const auto state_of = [&](const std::string& key) {
    const Result<store::StoredObject> object = store_.Get(control::kJobsKind, key);
    return object.ok() ? wire::ParseDocument(object->data)["state"].get<std::string>() : "";
  };
  EXPECT_EQ(state_of("team-a/train"), "Scheduled");
  EXPECT_EQ(state_of("train"), "Pending");
}

TEST_F(TeamScopedNamesTest, AStoreWithBareNamesIsMovedOverAtStart) {
  CallJson("POST", "/v1/jobs", alice_, 201, OneGpuJob("train"));
  CallJson("POST", "/v1/deployments", bob_, 201, Deployment("chat"));
  Minute(0);  // the deployment's first replica is submitted; train is scheduled
  ASSERT_THAT(StoredNames(control::kJobsKind),
              UnorderedElementsAre("team-a/train", "team-b/chat-r0"));
  server_.reset();
  // Rewrite the store as the older server had it.
  for (const std::string_view kind : {control::kJobsKind, control::kDeploymentsKind}) {
    const Result<std::vector<store::StoredObject>> objects = store_.List(kind);
    ASSERT_OK(objects);
    for (const store::StoredObject& object : *objects) {
      Json doc = wire::ParseDocument(object.data);
      const std::string bare = doc["name"];
      const Result<std::vector<store::StoredEvent>> old_events = store_.Events(kind, object.name);
      ASSERT_OK(old_events);
      store::WriteBatch batch;
      batch.Delete(std::string(kind), object.name, object.version);
      batch.Create(std::string(kind), bare, doc.dump());
      for (const store::StoredEvent& event : *old_events) {
        batch.AppendEvent(std::string(kind), bare, event.text);
      }
      ASSERT_OK(store_.Commit(batch));
    }
  }
  ASSERT_THAT(StoredNames(control::kJobsKind), UnorderedElementsAre("train", "chat-r0"));
  // An older server's store has no record that the move was done (a newer server leaves one
  // after a complete pass, so that it does not list every job at each start).
  ASSERT_OK(store_.Commit(store::WriteBatch().Delete("migrations", "team-scoped-names")));

  Result<std::unique_ptr<ApiServer>> restarted =
      ApiServer::Create({.store = store_,
                         .catalog = catalog_,
                         .clock = clock_,
                         .wall_clock = &clock_,
                         .heartbeat_interval = std::chrono::seconds(60),
                         .node_timeout = std::chrono::minutes(10)});
  ASSERT_OK(restarted);
  server_ = std::move(restarted).value();
  ASSERT_OK(server_->RunSchedulingCycle());  // heartbeats are served after the first cycle
  EXPECT_THAT(StoredNames(control::kJobsKind),
              UnorderedElementsAre("team-a/train", "team-b/chat-r0"));
  EXPECT_THAT(StoredNames(control::kDeploymentsKind), UnorderedElementsAre("team-b/chat"));

  const Json train = CallJson("GET", "/v1/jobs/train", alice_, 200);
  EXPECT_EQ(train["state"], "Scheduled");
  std::vector<std::string> messages;
  const Json events = CallJson("GET", "/v1/jobs/train/events", alice_, 200);
  for (const Json& event : events["items"]) {
    messages.push_back(event["message"]);
  }
  ASSERT_GE(messages.size(), 3u);
  EXPECT_THAT(messages.front(), HasSubstr("submitted by alice"));
  EXPECT_THAT(messages.back(), HasSubstr("renamed from \"train\""));

  // Scheduled and run under the new task ids; the deployment keeps its replica.
  Minute(0);
  EXPECT_THAT(desired_, UnorderedElementsAre("team-a/train/main-0/1", "team-b/chat-r0/server-0/1"));
  Minute(0);
  Minute(0);
  EXPECT_EQ(CallJson("GET", "/v1/jobs/train", alice_, 200)["state"], "Running");
  EXPECT_EQ(CallJson("GET", "/v1/jobs/chat-r0", bob_, 200)["state"], "Running");
  EXPECT_EQ(CallJson("GET", "/v1/deployments/chat", bob_, 200)["replicas"],
            Json::array({"chat-r0"}));
  EXPECT_THAT(StoredNames(control::kJobsKind),
              UnorderedElementsAre("team-a/train", "team-b/chat-r0"));
}

}  // namespace
}  // namespace gpufleet::api
