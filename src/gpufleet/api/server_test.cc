// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/server.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/auth.h"
#include "gpufleet/api/testing/api_request.h"
#include "gpufleet/api/testing/self_signed_cert.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/cpp_httplib.h"
#include "gpufleet/http/testing/raw_connection.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/store/sqlite_store.h"
#include "gpufleet/store/testing/fault_injecting_store.h"
#include "gpufleet/wire/job_spec.h"

namespace gpufleet::api {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

// A gang of `replicas` tasks of `gpus` whole GPUs; `required` is a required topology level.
std::string JobYaml(const std::string& name, int replicas, int gpus,
                    const std::string& required = "", int priority = 0) {
  std::string yaml = fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata:
  name: {}
spec:
  priority: {}
  tasks:
    - name: workers
      command: [train]
      replicas: {}
      resources:
        cpu: "8"
        memory: 64Gi
        gpus:
          count: {}
)",
                                 name, priority, replicas, gpus);
  if (!required.empty()) {
    yaml += fmt::format("  topology:\n    required: {}\n", required);
  }
  return yaml;
}

std::string JobJson(const std::string& name, int replicas, int gpus) {
  const Json spec = {
      {"apiVersion", "gpufleet.io/v1"},
      {"kind", "Job"},
      {"metadata", {{"name", name}}},
      {"spec",
       {{"tasks",
         {{{"name", "main"},
           {"command", {"train"}},
           {"replicas", replicas},
           {"resources", {{"cpu", "4"}, {"memory", "16Gi"}, {"gpus", {{"count", gpus}}}}}}}}}}};
  return spec.dump();
}

// Two leaves of `nodes_per_leaf` nodes with 8 H100s each: node-0000.. in leaf-0, then leaf-1.
Cluster TwoLeaves(const GpuCatalog& catalog, int nodes_per_leaf) {
  SyntheticClusterSpec spec;
  spec.blocks = 1;
  spec.leaves_per_block = 2;
  spec.nodes_per_leaf = nodes_per_leaf;
  Result<Cluster> cluster = MakeSyntheticCluster(spec, catalog);
  EXPECT_OK(cluster);
  return *cluster;
}

std::set<std::string> PlacedNodes(const Json& job) {
  std::set<std::string> nodes;
  for (const Json& placement : job["placements"]) {
    nodes.insert(placement["node"].get<std::string>());
  }
  return nodes;
}

class ApiServerTest : public ::testing::Test {
 protected:
  void SetUp() override { Init(store_); }

  void Init(store::StateStore& store) {
    Result<std::unique_ptr<ApiServer>> server = ApiServer::Create({.store = store,
                                                                   .catalog = catalog_,
                                                                   .clock = clock_,
                                                                   .wall_clock = &clock_,
                                                                   .policy = "best-fit"});
    ASSERT_OK(server);
    server_ = std::move(server).value();
    ASSERT_OK(server_->RegisterNodes(TwoLeaves(catalog_, 2)));
    for (const char* team : {"team-a", "team-b"}) {
      store::WriteBatch batch;
      batch.Create(std::string(control::kTeamsKind), team,
                   control::TeamToJson({.name = team}).dump());
      ASSERT_OK(store.Commit(batch));
    }
    Result<std::string> admin =
        server_->authenticator().CreateToken(control::Role::kAdmin, "", "root");
    ASSERT_OK(admin);
    admin_ = *admin;
    Result<std::string> a =
        server_->authenticator().CreateToken(control::Role::kMember, "team-a", "alice");
    ASSERT_OK(a);
    alice_ = *a;
    Result<std::string> b =
        server_->authenticator().CreateToken(control::Role::kMember, "team-b", "bob");
    ASSERT_OK(b);
    bob_ = *b;
  }

  ApiResponse Call(const std::string& method, const std::string& path, const std::string& token,
                   const std::string& body = "") {
    return api_testing::HandleRequest(*server_, method, path, token, body);
  }

  Json CallJson(const std::string& method, const std::string& path, const std::string& token,
                const std::string& body = "", int want_status = 200) {
    const ApiResponse response = Call(method, path, token, body);
    EXPECT_EQ(response.status, want_status) << method << " " << path << ": " << response.body;
    return Json::parse(response.body, nullptr, false);
  }

  int Cycle() {
    Result<int> scheduled = server_->RunSchedulingCycle();
    EXPECT_OK(scheduled);
    return scheduled.ok() ? *scheduled : -1;
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_;
  store::InMemoryStateStore store_;
  std::unique_ptr<ApiServer> server_;
  std::string admin_;
  std::string alice_;
  std::string bob_;
};

// GET /v1/jobs?limit=N&continue=TOKEN pages through the jobs a caller sees, in key order, read
// through the store's state index (with a state filter too).
TEST_F(ApiServerTest, ListJobsPagesWithLimitAndContinue) {
  for (const char* name : {"a1", "a2", "a3", "a4", "a5"}) {
    CallJson("POST", "/v1/jobs", alice_, JobJson(name, 1, 1), 201);
  }
  for (const char* name : {"b1", "b2"}) {
    CallJson("POST", "/v1/jobs", bob_, JobJson(name, 1, 1), 201);
  }
  CallJson("POST", "/v1/jobs/a2/cancel", alice_, "", 200);
  const auto pages = [&](const std::string& query, const std::string& token) {
    std::vector<std::vector<std::string>> out;
    std::string next;
    for (int page = 0; page < 10; ++page) {
      const Json body =
          CallJson("GET", "/v1/jobs?" + query + (next.empty() ? "" : "&continue=" + next), token);
      std::vector<std::string> names;
      for (const Json& job : body["items"]) {
        names.push_back(job["name"].get<std::string>());
      }
      out.push_back(names);
      if (!body.contains("continue")) {
        break;
      }
      next = body["continue"].get<std::string>();
    }
    return out;
  };
  using Pages = std::vector<std::vector<std::string>>;
  EXPECT_EQ(pages("limit=2", admin_), (Pages{{"a1", "a2"}, {"a3", "a4"}, {"a5", "b1"}, {"b2"}}));
  EXPECT_EQ(pages("limit=3", alice_), (Pages{{"a1", "a2", "a3"}, {"a4", "a5"}}));
  EXPECT_EQ(pages("limit=2", bob_), (Pages{{"b1", "b2"}}));
  EXPECT_EQ(pages("state=Pending&limit=3", admin_),
            (Pages{{"a1", "a3", "a4"}, {"a5", "b1", "b2"}}));
  EXPECT_EQ(pages("state=Cancelled", alice_), (Pages{{"a2"}}));
  EXPECT_EQ(pages("state=Cancelled", bob_), (Pages{{}}));
  for (const char* bad : {"limit=0", "limit=x", "limit=10001", "limit=-1"}) {
    EXPECT_THAT(CallJson("GET", std::string("/v1/jobs?") + bad, alice_, "", 400)["error"]["message"]
                    .get<std::string>(),
                HasSubstr("limit"))
        << bad;
  }
  EXPECT_THAT(CallJson("GET", "/v1/jobs?continue=team-a/a1", alice_, "", 400)["error"]["message"]
                  .get<std::string>(),
              HasSubstr("continue: only with limit"));
}

TEST_F(ApiServerTest, SubmitYamlAndJsonThenScheduledWithPlacements) {
  Json yaml = CallJson("POST", "/v1/jobs", alice_, JobYaml("train", 2, 8), 201);
  EXPECT_EQ(yaml["state"], "Pending");
  EXPECT_EQ(yaml["team"], "team-a");
  EXPECT_EQ(yaml["queue"], "default");
  EXPECT_EQ(yaml["version"], 1);
  Json json = CallJson("POST", "/v1/jobs", alice_, JobJson("notebook", 1, 1), 201);
  EXPECT_EQ(json["state"], "Pending");
  EXPECT_EQ(CallJson("GET", "/v1/jobs?state=Pending", alice_)["items"].size(), 2u);

  EXPECT_EQ(Cycle(), 2);

  Json train = CallJson("GET", "/v1/jobs/train", alice_);
  EXPECT_EQ(train["state"], "Scheduled");
  ASSERT_EQ(train["placements"].size(), 2u);
  EXPECT_EQ(train["placements"][0]["task"], "workers-0");
  EXPECT_EQ(train["placements"][0]["gpus"].size(), 8u);
  EXPECT_EQ(PlacedNodes(train).size(), 2u);
  Json events = CallJson("GET", "/v1/jobs/train/events", alice_);
  ASSERT_EQ(events["items"].size(), 2u);
  EXPECT_THAT(events["items"][0]["message"].get<std::string>(), HasSubstr("submitted by alice"));
  EXPECT_THAT(events["items"][1]["message"].get<std::string>(), HasSubstr("scheduled on node-"));
  EXPECT_EQ(CallJson("GET", "/v1/jobs/notebook", alice_)["state"], "Scheduled");
  EXPECT_EQ(CallJson("GET", "/v1/jobs?state=Pending", alice_)["items"].size(), 0u);

  Json queues = CallJson("GET", "/v1/queues", alice_);
  ASSERT_EQ(queues["items"].size(), 1u);
  EXPECT_EQ(queues["items"][0]["name"], "default");
  EXPECT_EQ(queues["items"][0]["running"], 2);
  EXPECT_EQ(queues["items"][0]["gpus_allocated"], 17);

  Json node = CallJson(
      "GET", fmt::format("/v1/nodes/{}", train["placements"][0]["node"].get<std::string>()),
      alice_);
  EXPECT_EQ(node["gpus"][0]["allocated_milli"], 1000);
}

TEST_F(ApiServerTest, GangThatCannotFitStaysPendingWithReasonNamingBestLeaf) {
  CallJson("POST", "/v1/jobs", alice_, JobYaml("big", 3, 8, "leaf"), 201);
  EXPECT_EQ(Cycle(), 0);
  Json job = CallJson("GET", "/v1/jobs/big", alice_);
  EXPECT_EQ(job["state"], "Pending");
  EXPECT_THAT(job["reason"].get<std::string>(), HasSubstr("the best, block-0/leaf-"));  // by path
  const int64_t version = job["version"];
  EXPECT_EQ(Cycle(), 0);  // the same reason is not written again
  EXPECT_EQ(CallJson("GET", "/v1/jobs/big", alice_)["version"], version);
  EXPECT_EQ(CallJson("GET", "/v1/jobs/big/events", alice_)["items"].size(), 2u);
}

// A job whose reason is restated with other figures as the fleet fills: one grouped event whose
// count is every restatement, not an event each (control/event_groups.h).
TEST_F(ApiServerTest, ARestatedReasonIsOneEventWithACount) {
  // Three nodes of four taken whole: a gang of four whole nodes fits in part, on fewer and fewer
  // nodes short as the others end.
  for (int node = 0; node < 3; ++node) {
    CallJson("POST", "/v1/jobs", alice_, JobYaml(fmt::format("eight-{}", node), 1, 8), 201);
  }
  EXPECT_EQ(Cycle(), 3);
  CallJson("POST", "/v1/jobs", alice_, JobYaml("gang", 4, 8), 201);
  std::vector<std::string> reasons;
  const auto note_reason = [&] {
    const Json gang = CallJson("GET", "/v1/jobs/gang", alice_);
    const std::string reason = gang["reason"];
    if (gang["state"] == "Pending" && (reasons.empty() || reasons.back() != reason)) {
      reasons.push_back(reason);
    }
  };
  // Each cycle states the reason at most once: noted after each, they are every restatement.
  Cycle();
  note_reason();
  for (int node = 0; node < 2; ++node) {
    CallJson("POST", fmt::format("/v1/jobs/eight-{}/cancel", node), alice_, "", 200);
    for (int cycle = 0; cycle < 2; ++cycle) {  // its tasks found gone: its node is free
      Cycle();
      note_reason();
    }
  }
  ASSERT_GT(reasons.size(), 1u) << "the figures changed as nodes freed: "
                                << fmt::format("{}", fmt::join(reasons, " | "));
  const Json events = CallJson("GET", "/v1/jobs/gang/events", alice_);
  int64_t restated = 0;
  size_t entries = 0;
  Json last;
  for (const Json& event : events["items"]) {
    EXPECT_GE(event["count"].get<int64_t>(), 1) << event.dump();
    if (event["message"].get<std::string>().rfind("unschedulable: ", 0) == 0) {
      restated += event["count"].get<int64_t>();
      ++entries;
      last = event;
    }
  }
  EXPECT_EQ(restated, static_cast<int64_t>(reasons.size())) << events.dump();
  EXPECT_LT(entries, reasons.size()) << events.dump();
  // The grouped entry says the latest figures.
  EXPECT_EQ(last["message"], "unschedulable: " + reasons.back()) << events.dump();
}

TEST_F(ApiServerTest, CancelFreesGpusForTheNextJob) {
  CallJson("POST", "/v1/jobs", alice_, JobYaml("all", 4, 8), 201);
  EXPECT_EQ(Cycle(), 1);
  CallJson("POST", "/v1/jobs", alice_, JobYaml("next", 1, 8), 201);
  EXPECT_EQ(Cycle(), 0);
  EXPECT_EQ(CallJson("GET", "/v1/jobs/next", alice_)["state"], "Pending");

  // The job stops first; its node runs no agent, so the next cycle knows its tasks are gone,
  // frees its GPUs and places the next job.
  Json cancelled = CallJson("POST", "/v1/jobs/all/cancel", alice_);
  EXPECT_EQ(cancelled["state"], "Stopping");
  EXPECT_EQ(cancelled["stopping"]["then"], "Cancelled");
  EXPECT_EQ(CallJson("POST", "/v1/jobs/all/cancel", alice_)["state"], "Stopping");
  EXPECT_EQ(Cycle(), 1);
  EXPECT_EQ(CallJson("GET", "/v1/jobs/all", alice_)["state"], "Cancelled");
  EXPECT_EQ(CallJson("GET", "/v1/jobs/next", alice_)["state"], "Scheduled");
  // Cancelling again is a no-op.
  EXPECT_EQ(CallJson("POST", "/v1/jobs/all/cancel", alice_)["state"], "Cancelled");
}

// ---- no single submission halts the fleet -----------------------------------------------------

std::string CpuReplicasYaml(const std::string& name, int replicas) {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}}}
spec:
  tasks:
    - name: web
      command: [serve]
      replicas: {}
      resources: {{cpu: 100m, memory: 64Mi}}
)",
                     name, replicas);
}

TEST_F(ApiServerTest, AJobWithTooManyTasksIsRefusedAtSubmitNamingTheField) {
  const Json refused = CallJson("POST", "/v1/jobs", alice_, CpuReplicasYaml("swarm", 20000), 400);
  EXPECT_THAT(refused["error"]["message"].get<std::string>(),
              HasSubstr("spec.tasks: 20000 tasks in all, more than the limit of 4096"));
  // Nothing was stored, and the fleet schedules as before.
  EXPECT_EQ(Call("GET", "/v1/jobs/swarm", alice_).status, 404);
  CallJson("POST", "/v1/jobs", alice_, JobYaml("train", 1, 8), 201);
  EXPECT_EQ(Cycle(), 1);
}

// A task that would run nothing (no command, no image) is refused at submit, naming it; with
// either it is accepted.
TEST_F(ApiServerTest, ATaskWithNeitherCommandNorImageIsRefusedAtSubmitNamingIt) {
  std::string idle = CpuReplicasYaml("idle", 1);
  idle.erase(idle.find("      command: [serve]\n"), std::string("      command: [serve]\n").size());
  const Json refused = CallJson("POST", "/v1/jobs", alice_, idle, 400);
  EXPECT_EQ(refused["error"]["message"],
            "spec.tasks[0].command: task \"web\" has neither a command nor an image; give it one "
            "or both");
  EXPECT_EQ(Call("GET", "/v1/jobs/idle", alice_).status, 404);
  CallJson("POST", "/v1/jobs", alice_, CpuReplicasYaml("busy", 1), 201);
}

TEST_F(ApiServerTest, ASpecWhosePlacementsWouldOverflowTheStoreIsRefusedAtSubmit) {
  // Just under the 1 MiB spec limit: accepted by the parser, but no room for its placements.
  std::string yaml = JobYaml("huge", 1, 1);
  yaml.replace(yaml.find("      resources:"), 0,
               fmt::format("      env: {{PAD: \"{}\"}}\n", std::string(1040 * 1000, 'x')));
  ASSERT_LT(yaml.size(), wire::kMaxJobSpecBytes);
  const ApiResponse refused = Call("POST", "/v1/jobs", alice_, yaml);
  ASSERT_EQ(refused.status, 400) << refused.body.substr(0, 300);
  EXPECT_THAT(refused.body, HasSubstr("more than the store's limit of 1048576"));
  EXPECT_EQ(Call("GET", "/v1/jobs/huge", alice_).status, 404);
}

TEST_F(ApiServerTest, AStoredJobWhoseWriteTheStoreRefusesFailsAloneAndTheCycleGoesOn) {
  // A job stored by an earlier version without the submit-time bound: its document is so close to
  // the store's limit that scheduling it cannot be written.
  CallJson("POST", "/v1/jobs", alice_, JobYaml("legacy", 1, 8), 201);
  CallJson("POST", "/v1/jobs", bob_, JobYaml("others", 1, 8), 201);
  Result<store::StoredObject> stored = store_.Get(control::kJobsKind, "team-a/legacy");
  ASSERT_OK(stored);
  Json doc = Json::parse(stored->data);
  doc["padding"] = "";
  doc["padding"] = std::string(store::kMaxDataBytes - doc.dump().size() - 700, 'x');
  store::WriteBatch batch;
  batch.Update(std::string(control::kJobsKind), "team-a/legacy", doc.dump(), stored->version);
  ASSERT_OK(store_.Commit(batch));

  EXPECT_EQ(Cycle(), 1) << "the other job is scheduled in the same cycle";
  EXPECT_EQ(CallJson("GET", "/v1/jobs/others", bob_)["state"], "Scheduled");
  const Json legacy = CallJson("GET", "/v1/jobs/legacy", alice_);
  EXPECT_EQ(legacy["state"], "Failed");
  EXPECT_THAT(legacy["reason"].get<std::string>(),
              HasSubstr("its scheduled document cannot be stored"));
  EXPECT_TRUE(legacy["placements"].empty());
  // And the next cycles are not stuck on it.
  CallJson("POST", "/v1/jobs", alice_, JobYaml("after", 1, 8), 201);
  EXPECT_EQ(Cycle(), 1);
}

TEST_F(ApiServerTest, ASpecThatSetsTheAgentsVariablesIsRefused) {
  for (const char* name : {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GPUFLEET_TASK_ID"}) {
    SCOPED_TRACE(name);
    std::string yaml = JobYaml("spoof", 1, 1);
    yaml.replace(yaml.find("      resources:"), 0, fmt::format("      env: {{{}: \"0\"}}\n", name));
    const Json refused = CallJson("POST", "/v1/jobs", alice_, yaml, 400);
    EXPECT_THAT(refused["error"]["message"].get<std::string>(),
                HasSubstr(fmt::format("spec.tasks[0].env.{}: is set by the agent", name)));
  }
}

TEST_F(ApiServerTest, InvalidUtf8InAPathOrQueryIs400NotAServerError) {
  const ApiResponse path = Call("GET", "/v1/jobs/bad\xff\xfe", alice_);
  EXPECT_EQ(path.status, 400);
  EXPECT_THAT(path.body, HasSubstr("path: not valid UTF-8 at byte 12"));
  EXPECT_EQ(Call("GET", "/v1/jobs?state=\xc3", alice_).status, 400);
  EXPECT_EQ(Call("GET", "/v1/jobs", alice_).status, 200);
}

TEST_F(ApiServerTest, PriorityGoesFirst) {
  CallJson("POST", "/v1/jobs", alice_, JobYaml("low", 3, 8, "", 0), 201);
  CallJson("POST", "/v1/jobs", alice_, JobYaml("high", 3, 8, "", 10), 201);
  EXPECT_EQ(Cycle(), 1);
  EXPECT_EQ(CallJson("GET", "/v1/jobs/high", alice_)["state"], "Scheduled");
  EXPECT_EQ(CallJson("GET", "/v1/jobs/low", alice_)["state"], "Pending");
}

TEST_F(ApiServerTest, AuthenticationAndTeams) {
  EXPECT_EQ(Call("GET", "/v1/jobs", "").status, 401);
  EXPECT_EQ(Call("GET", "/v1/jobs", "not-a-real-token-at-all").status, 401);
  ApiRequest basic{.method = "GET", .path = "/v1/jobs", .authorization = "Basic abc"};
  EXPECT_EQ(server_->Handle(basic).status, 401);
  Json error = CallJson("GET", "/v1/jobs", "", "", 401);
  EXPECT_EQ(error["error"]["code"], "UNAUTHENTICATED");

  CallJson("POST", "/v1/jobs", alice_, JobYaml("secret", 1, 1), 201);
  // Another team's job is hidden: 404, not listed, not cancellable.
  CallJson("GET", "/v1/jobs/secret", bob_, "", 404);
  CallJson("GET", "/v1/jobs/secret/events", bob_, "", 404);
  CallJson("POST", "/v1/jobs/secret/cancel", bob_, "", 404);
  EXPECT_EQ(CallJson("GET", "/v1/jobs", bob_)["items"].size(), 0u);
  EXPECT_EQ(CallJson("GET", "/v1/jobs/secret", admin_)["state"], "Pending");
  EXPECT_EQ(CallJson("GET", "/v1/jobs", admin_)["items"].size(), 1u);

  // Node operations are admin-only; reads are open to members.
  Json denied = CallJson("POST", "/v1/nodes/node-0000/cordon", alice_, "", 403);
  EXPECT_EQ(denied["error"]["code"], "PERMISSION_DENIED");
  EXPECT_EQ(CallJson("GET", "/v1/nodes/node-0000", alice_)["state"], "Ready");
  EXPECT_EQ(CallJson("GET", "/v1/nodes", alice_)["items"].size(), 4u);

  ASSERT_OK(server_->authenticator().RevokeToken(bob_));
  EXPECT_EQ(Call("GET", "/v1/jobs", bob_).status, 401);
}

TEST_F(ApiServerTest, BadSpecIs400NamingTheFieldAndStoresNothing) {
  std::string bad = JobYaml("bad", 1, 1);
  bad.replace(bad.find("replicas: 1"), 11, "replicas: 0");
  Json error = CallJson("POST", "/v1/jobs", alice_, bad, 400);
  EXPECT_EQ(error["error"]["code"], "INVALID_ARGUMENT");
  EXPECT_THAT(error["error"]["message"].get<std::string>(), HasSubstr("replicas"));
  CallJson("POST", "/v1/jobs", alice_, "{not json", 400);
  CallJson("POST", "/v1/jobs", alice_, "", 400);
  EXPECT_EQ(CallJson("GET", "/v1/jobs", admin_)["items"].size(), 0u);
  CallJson("GET", "/v1/jobs?state=Sleeping", admin_, "", 400);
}

TEST_F(ApiServerTest, OversizedBodyIs413) {
  const ApiResponse response = Call("POST", "/v1/jobs", alice_, std::string(2 << 20, 'x'));
  EXPECT_EQ(response.status, 413);
  EXPECT_THAT(response.body, HasSubstr("RESOURCE_EXHAUSTED"));
}

TEST_F(ApiServerTest, DuplicateNameInOneTeamIs409AndInAnotherIsNoConflict) {
  CallJson("POST", "/v1/jobs", alice_, JobYaml("once", 1, 1), 201);
  Json error = CallJson("POST", "/v1/jobs", alice_, JobYaml("once", 1, 1), 409);
  EXPECT_EQ(error["error"]["code"], "ALREADY_EXISTS");
  // Names are scoped by team: bob's "once" is another job, and no 409 tells bob of alice's.
  CallJson("POST", "/v1/jobs", bob_, JobYaml("once", 1, 1), 201);
  EXPECT_EQ(CallJson("GET", "/v1/jobs/once", bob_)["team"], "team-b");
  EXPECT_EQ(CallJson("GET", "/v1/jobs/once", alice_)["team"], "team-a");
}

TEST_F(ApiServerTest, TokensAreCreatedListedAndRevokedByAdmins) {
  Json created = CallJson("POST", "/v1/tokens", admin_,
                          R"({"role": "member", "team": "team-a", "name": "ci-bot"})", 201);
  const std::string token = created["token"];
  const std::string id = created["id"];
  EXPECT_EQ(token.size(), 64u);
  EXPECT_EQ(id, TokenId(token));
  EXPECT_EQ(created["role"], "member");
  EXPECT_EQ(created["team"], "team-a");
  EXPECT_EQ(created["name"], "ci-bot");
  EXPECT_EQ(CallJson("GET", "/v1/jobs", token)["items"].size(), 0u);

  // The listing names every token by id, never by its secret.
  const ApiResponse listed = Call("GET", "/v1/tokens", admin_);
  ASSERT_EQ(listed.status, 200);
  EXPECT_EQ(listed.body.find(token), std::string::npos);
  EXPECT_EQ(listed.body.find(Sha256Hex(token)), std::string::npos);
  const Json items = Json::parse(listed.body)["items"];
  ASSERT_EQ(items.size(), 4u);
  bool found = false;
  for (const Json& item : items) {
    EXPECT_FALSE(item.contains("token"));
    found = found || (item["id"] == id && item["name"] == "ci-bot" && item["team"] == "team-a");
  }
  EXPECT_TRUE(found);

  Json revoked = CallJson("POST", fmt::format("/v1/tokens/{}/revoke", id), admin_);
  EXPECT_EQ(revoked["id"], id);
  EXPECT_EQ(revoked["revoked"], true);
  // At once: the next request with it is unauthenticated.
  EXPECT_EQ(CallJson("GET", "/v1/jobs", token, "", 401)["error"]["code"], "UNAUTHENTICATED");
  CallJson("POST", fmt::format("/v1/tokens/{}/revoke", id), admin_, "", 404);
  EXPECT_EQ(CallJson("GET", "/v1/tokens", admin_)["items"].size(), 3u);
}

TEST_F(ApiServerTest, MembersCannotCreateListOrRevokeTokens) {
  const std::string bob_id = TokenId(bob_);
  for (const auto& [method, path, body] :
       {std::tuple<std::string, std::string, std::string>{"POST", "/v1/tokens",
                                                          R"({"role": "admin", "name": "me-too"})"},
        {"GET", "/v1/tokens", ""},
        {"POST", fmt::format("/v1/tokens/{}/revoke", bob_id), ""}}) {
    SCOPED_TRACE(method + " " + path);
    EXPECT_EQ(CallJson(method, path, alice_, body, 403)["error"]["code"], "PERMISSION_DENIED");
  }
  // Nothing changed: bob's token still works and no token was added.
  EXPECT_EQ(Call("GET", "/v1/jobs", bob_).status, 200);
  EXPECT_EQ(CallJson("GET", "/v1/tokens", admin_)["items"].size(), 3u);
}

TEST_F(ApiServerTest, BadTokenRequestsNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"role": "member", "team": "nope", "name": "x"})", "team: team \"nope\" does not exist"},
      {R"({"role": "member", "name": "x"})", "team: required for a member token"},
      {R"({"role": "root", "name": "x"})", "role: \"root\""},
      {R"({"role": "admin"})", "name: required field missing"},
      {R"({"role": "admin", "name": "x", "ttl": 5})", "\"ttl\": unknown field"},
      {R"({"role": 1, "name": "x"})", "role: expected a string"},
      {R"({"role": "admin", "name": "bad\u0001name"})", "name: "},
      {"[1]", "body: expected a JSON object"},
      {"{", "body: not valid JSON"}};
  for (const auto& [body, message] : cases) {
    SCOPED_TRACE(body);
    Json error = CallJson("POST", "/v1/tokens", admin_, body, 400);
    EXPECT_THAT(error["error"]["message"].get<std::string>(), HasSubstr(message));
  }
  CallJson("POST", "/v1/tokens/zz/revoke", admin_, "", 400);
  CallJson("POST", "/v1/tokens/0123456789ab/revoke", admin_, "", 404);
  EXPECT_EQ(CallJson("GET", "/v1/tokens", admin_)["items"].size(), 3u);
}

TEST_F(ApiServerTest, TheLastAdminTokenCannotBeRevoked) {
  Json error =
      CallJson("POST", fmt::format("/v1/tokens/{}/revoke", TokenId(admin_)), admin_, "", 400);
  EXPECT_EQ(error["error"]["code"], "FAILED_PRECONDITION");
  EXPECT_EQ(Call("GET", "/v1/jobs", admin_).status, 200);
  const std::string second =
      CallJson("POST", "/v1/tokens", admin_, R"({"role": "admin", "name": "ops"})", 201)["token"];
  CallJson("POST", fmt::format("/v1/tokens/{}/revoke", TokenId(admin_)), admin_);
  EXPECT_EQ(Call("GET", "/v1/jobs", admin_).status, 401);
  EXPECT_EQ(Call("GET", "/v1/jobs", second).status, 200);
}

TEST_F(ApiServerTest, TeamsAndQueuesAreObjects) {
  // The default queue exists from the first start, shared by every team.
  Json queues = CallJson("GET", "/v1/queues", alice_);
  ASSERT_EQ(queues["items"].size(), 1u);
  EXPECT_EQ(queues["items"][0]["name"], "default");
  EXPECT_EQ(queues["items"][0]["team"], "");

  Json team = CallJson("POST", "/v1/teams", admin_, R"({"name": "nlp"})", 201);
  EXPECT_EQ(team["name"], "nlp");
  EXPECT_EQ(team["version"], 1);
  CallJson("POST", "/v1/teams", admin_, R"({"name": "nlp"})", 409);
  EXPECT_THAT(CallJson("POST", "/v1/teams", admin_, R"({"name": "NLP!"})", 400)["error"]["message"]
                  .get<std::string>(),
              HasSubstr("name: \"NLP!\" is not valid"));
  CallJson("POST", "/v1/teams", alice_, R"({"name": "mine"})", 403);
  Json teams = CallJson("GET", "/v1/teams", alice_);
  ASSERT_EQ(teams["items"].size(), 3u);
  EXPECT_EQ(teams["items"][1]["name"], "team-a");

  Json queue =
      CallJson("POST", "/v1/queues", admin_, R"({"name": "research/nlp", "team": "nlp"})", 201);
  EXPECT_EQ(queue["team"], "nlp");
  EXPECT_THAT(CallJson("POST", "/v1/queues", admin_, R"({"name": "q", "team": "ghost"})",
                       400)["error"]["message"]
                  .get<std::string>(),
              HasSubstr("team: team \"ghost\" does not exist"));
  EXPECT_THAT(CallJson("POST", "/v1/queues", admin_, R"({"name": "a//b"})", 400)["error"]["message"]
                  .get<std::string>(),
              HasSubstr("name: \"a//b\" is not valid"));
  CallJson("POST", "/v1/queues", admin_, R"({"name": "research/nlp"})", 409);
  CallJson("POST", "/v1/queues", alice_, R"({"name": "mine"})", 403);
  queues = CallJson("GET", "/v1/queues", bob_);
  ASSERT_EQ(queues["items"].size(), 2u);
  EXPECT_EQ(queues["items"][1]["name"], "research/nlp");
  EXPECT_EQ(queues["items"][1]["team"], "nlp");
  EXPECT_EQ(queues["items"][1]["pending"], 0);
}

TEST_F(ApiServerTest, SubmissionToUnknownQueueOrTeamIsRejectedAndNothingStored) {
  std::string to_nowhere = JobYaml("lost", 1, 1);
  to_nowhere.replace(to_nowhere.find("  name: lost\n"), 13, "  name: lost\n  queue: nowhere\n");
  Json error = CallJson("POST", "/v1/jobs", alice_, to_nowhere, 400);
  EXPECT_THAT(error["error"]["message"].get<std::string>(),
              HasSubstr("metadata.queue: queue \"nowhere\" does not exist"));

  Result<std::string> ghost =
      server_->authenticator().CreateToken(control::Role::kMember, "ghost-team", "casper");
  ASSERT_OK(ghost);
  error = CallJson("POST", "/v1/jobs", *ghost, JobYaml("haunted", 1, 1), 400);
  EXPECT_THAT(error["error"]["message"].get<std::string>(),
              HasSubstr("team (of the token): team \"ghost-team\" does not exist"));

  EXPECT_EQ(CallJson("GET", "/v1/jobs", admin_)["items"].size(), 0u);
  EXPECT_EQ(CallJson("GET", "/v1/jobs/lost/events", admin_, "", 404)["error"]["code"], "NOT_FOUND");
  Result<std::vector<store::StoredEvent>> events = store_.Events(control::kJobsKind, "haunted");
  ASSERT_OK(events);
  EXPECT_TRUE(events->empty());
}

TEST_F(ApiServerTest, TeamQueuesTakeTheirTeamsJobsOnly) {
  CallJson("POST", "/v1/queues", admin_, R"({"name": "a-only", "team": "team-a"})", 201);
  std::string job = JobYaml("mine", 1, 1);
  job.replace(job.find("  name: mine\n"), 13, "  name: mine\n  queue: a-only\n");
  EXPECT_EQ(CallJson("POST", "/v1/jobs", alice_, job, 201)["queue"], "a-only");
  std::string theirs = job;
  theirs.replace(theirs.find("name: mine"), 10, "name: bobs");
  EXPECT_THAT(
      CallJson("POST", "/v1/jobs", bob_, theirs, 403)["error"]["message"].get<std::string>(),
      HasSubstr("queue \"a-only\" belongs to team \"team-a\""));
  std::string admins = job;
  admins.replace(admins.find("name: mine"), 10, "name: root");
  CallJson("POST", "/v1/jobs", admin_, admins, 201);
  Json queues = CallJson("GET", "/v1/queues", alice_);
  ASSERT_EQ(queues["items"].size(), 2u);
  EXPECT_EQ(queues["items"][0]["name"], "a-only");
  EXPECT_EQ(queues["items"][0]["pending"], 1);  // alice counts her team's job only
}

TEST_F(ApiServerTest, JobsKeepTheirLabelsAndCreationTime) {
  clock_.Advance(std::chrono::seconds(1795986000));
  std::string yaml = JobYaml("labelled", 1, 1);
  yaml.replace(yaml.find("  name: labelled\n"), 17,
               "  name: labelled\n  labels: {team: nlp, gpufleet.io/project: bert}\n");
  Json job = CallJson("POST", "/v1/jobs", alice_, yaml, 201);
  EXPECT_EQ(job["labels"], (Json{{"team", "nlp"}, {"gpufleet.io/project", "bert"}}));
  EXPECT_EQ(job["created_at"], "2026-11-29T21:00:00Z");
  job = CallJson("GET", "/v1/jobs/labelled", alice_);
  EXPECT_EQ(job["labels"]["gpufleet.io/project"], "bert");
  EXPECT_EQ(job["spec"]["metadata"]["labels"]["team"], "nlp");
  EXPECT_EQ(job["created_at"], "2026-11-29T21:00:00Z");
}

TEST_F(ApiServerTest, CordonedNodeGetsNoNewJob) {
  for (const char* node : {"node-0000", "node-0001", "node-0002"}) {
    EXPECT_EQ(CallJson("POST", fmt::format("/v1/nodes/{}/cordon", node), admin_)["state"],
              "Cordoned");
  }
  CallJson("POST", "/v1/jobs", alice_, JobYaml("first", 1, 8), 201);
  CallJson("POST", "/v1/jobs", alice_, JobYaml("second", 1, 8), 201);
  EXPECT_EQ(Cycle(), 1);
  EXPECT_EQ(PlacedNodes(CallJson("GET", "/v1/jobs/first", alice_)),
            std::set<std::string>{"node-0003"});
  EXPECT_EQ(CallJson("GET", "/v1/jobs/second", alice_)["state"], "Pending");

  EXPECT_EQ(CallJson("POST", "/v1/nodes/node-0000/uncordon", admin_)["state"], "Ready");
  EXPECT_EQ(Cycle(), 1);
  EXPECT_EQ(PlacedNodes(CallJson("GET", "/v1/jobs/second", alice_)),
            std::set<std::string>{"node-0000"});
}

TEST_F(ApiServerTest, QuarantineAndReleaseGpus) {
  Json node = CallJson("POST", "/v1/nodes/node-0001/quarantine", admin_, R"({"gpu": 3})");
  EXPECT_EQ(node["gpus"][3]["health"], "Quarantined");
  EXPECT_EQ(node["gpus"][2]["health"], "Healthy");
  CallJson("POST", "/v1/nodes/node-0001/quarantine", admin_, R"({"gpu": 99})", 400);
  CallJson("POST", "/v1/nodes/node-0001/quarantine", admin_, R"({"gpu": "x"})", 400);
  CallJson("POST", "/v1/nodes/node-9999/drain", admin_, "", 404);
  node = CallJson("POST", "/v1/nodes/node-0001/release", admin_);
  EXPECT_EQ(node["gpus"][3]["health"], "Healthy");
  EXPECT_EQ(CallJson("POST", "/v1/nodes/node-0001/drain", admin_)["state"], "Draining");
}

TEST_F(ApiServerTest, ServiceRoutesAndMetrics) {
  EXPECT_EQ(Call("GET", "/healthz", "").status, 200);
  EXPECT_EQ(Call("GET", "/readyz", "").status, 503);
  CallJson("POST", "/v1/jobs", alice_, JobYaml("m", 1, 8), 201);
  CallJson("POST", "/v1/jobs", alice_, JobYaml("wait", 1, 8, "", -1), 201);
  CallJson("POST", "/v1/nodes/node-0000/cordon", admin_);
  CallJson("POST", "/v1/nodes/node-0001/cordon", admin_);
  CallJson("POST", "/v1/nodes/node-0002/cordon", admin_);
  Cycle();
  EXPECT_EQ(Call("GET", "/readyz", "").status, 200);
  // The same token rules as the rest: none is 401, a node's agent token 403, a member reads it.
  EXPECT_EQ(Call("GET", "/metrics", "").status, 401);
  Result<std::string> agent = server_->authenticator().CreateToken(control::Role::kAgent, "", "a");
  ASSERT_OK(agent);
  EXPECT_EQ(Call("GET", "/metrics", *agent).status, 403);
  const ApiResponse metrics = Call("GET", "/metrics", alice_);
  EXPECT_EQ(metrics.status, 200);
  for (const char* text :
       {"# TYPE gpufleet_jobs_pending gauge", "gpufleet_jobs_pending{queue=\"default\"} 1",
        "# TYPE gpufleet_gpus_allocated gauge", "gpufleet_gpus_allocated{model=\"H100-80GB\"} 8",
        "gpufleet_gpus_total{model=\"H100-80GB\"} 32",
        "# TYPE gpufleet_scheduling_cycle_seconds histogram",
        "gpufleet_scheduling_cycle_seconds_count 1",
        "gpufleet_scheduling_cycle_seconds_bucket{le=\"+Inf\"} 1",
        "# TYPE gpufleet_api_requests_total counter",
        "gpufleet_api_requests_total{route=\"/v1/jobs\",code=\"201\"} 2",
        "# TYPE gpufleet_api_request_seconds histogram",
        "gpufleet_api_request_seconds_bucket{route=\"/v1/jobs\",code=\"201\",le=\"+Inf\"} 2",
        "gpufleet_api_request_seconds_count{route=\"/v1/jobs\",code=\"201\"} 2",
        "# TYPE gpufleet_scheduling_cycle_step_seconds_total counter",
        "gpufleet_scheduling_cycle_step_seconds_total{step=\"place\"} ",
        "gpufleet_scheduling_cycle_step_seconds_total{step=\"commit\"} "}) {
    EXPECT_THAT(metrics.body, HasSubstr(text));
  }
  // Every step of a cycle that ran to its end, in order.
  std::vector<std::string_view> steps;
  for (const auto& [step, time] : server_->LastCycleSteps()) {
    steps.push_back(step);
  }
  EXPECT_THAT(steps, ::testing::ElementsAre("read", "node-leases", "run-ends", "queues",
                                            "idle-reclaim", "deployments", "retention", "usage",
                                            "order", "place", "commit", "grow", "publish"));
  EXPECT_EQ(Call("GET", "/v2/nothing", admin_).status, 404);
  EXPECT_EQ(Call("DELETE", "/v1/jobs/m", admin_).status, 404);
}

// Route labels come from the routes the server serves, never from the URL: requests to made-up
// paths, authenticated or not, count as "unmatched" instead of adding a series each (20,000 such
// requests took /metrics from 37 KB to 29 MB).
TEST_F(ApiServerTest, MetricsRouteLabelsComeFromTheRoutesNotTheUrl) {
  constexpr int kMadeUp = 200;
  for (int i = 0; i < kMadeUp; ++i) {
    EXPECT_EQ(Call("GET", fmt::format("/v1/made-up-{}", i), "").status, 401);
    EXPECT_EQ(Call("POST", fmt::format("/v1/nodes/node-0000/made-up-{}", i), "").status, 401);
    EXPECT_EQ(Call("GET", fmt::format("/v1/made-up-{}/x", i), alice_).status, 404);
  }
  CallJson("POST", "/v1/nodes/node-0000/cordon", admin_);
  CallJson("GET", "/v1/queues/default/events", alice_);
  EXPECT_EQ(Call("GET", "/v1/jobs/nothing/explain", alice_).status, 404);
  const std::string metrics = Call("GET", "/metrics", admin_).body;
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr("made-up")));
  for (const std::string& line :
       {fmt::format("gpufleet_api_requests_total{{route=\"unmatched\",code=\"401\"}} {}",
                    2 * kMadeUp),
        fmt::format("gpufleet_api_requests_total{{route=\"unmatched\",code=\"404\"}} {}", kMadeUp),
        std::string(
            "gpufleet_api_requests_total{route=\"/v1/nodes/{name}/cordon\",code=\"200\"} 1"),
        std::string(
            "gpufleet_api_requests_total{route=\"/v1/queues/{name}/events\",code=\"200\"} 1"),
        std::string(
            "gpufleet_api_requests_total{route=\"/v1/jobs/{name}/explain\",code=\"404\"} 1")}) {
    EXPECT_THAT(metrics, HasSubstr(line + "\n"));
  }
}

// A node whose GPUs report another name of a catalog model (NVML's, say) counts under the
// catalog's name, as queue quotas do: one series per model.
TEST_F(ApiServerTest, FleetGaugesNameGpuModelsAsTheCatalogDoes) {
  Cluster cluster = TwoLeaves(catalog_, 1);
  cluster.nodes.resize(1);
  cluster.nodes[0].id = NodeId("t4-node");
  for (Gpu& gpu : cluster.nodes[0].gpus) {
    gpu.model = "Tesla T4";
    gpu.memory_mib = 0;
    gpu.uuid = GpuUuid("GPU-t4-" + std::to_string(gpu.index));
  }
  ASSERT_OK(server_->RegisterNodes(cluster));
  Cycle();
  const std::string metrics = Call("GET", "/metrics", admin_).body;
  EXPECT_THAT(metrics, HasSubstr("gpufleet_gpus_total{model=\"T4\"} " +
                                 std::to_string(cluster.nodes[0].gpus.size()) + "\n"));
  EXPECT_THAT(metrics, HasSubstr("gpufleet_gpus_allocated{model=\"T4\"} 0\n"));
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr("Tesla T4")));
}

TEST(TokenAuthenticatorTest, BootstrapCreatesOneAdminTokenOnce) {
  store::InMemoryStateStore store;
  FakeClock clock;
  TokenAuthenticator auth(store, clock);
  Result<std::optional<std::string>> first = auth.Bootstrap(std::nullopt);
  ASSERT_OK(first);
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->size(), 64u);
  Result<control::Principal> who = auth.Authenticate("Bearer " + **first);
  ASSERT_OK(who);
  EXPECT_TRUE(who->is_admin());
  // The store holds the hash only.
  Result<std::vector<store::StoredObject>> tokens = store.List(kTokensKind);
  ASSERT_OK(tokens);
  ASSERT_EQ(tokens->size(), 1u);
  EXPECT_EQ((*tokens)[0].name, Sha256Hex(**first));
  EXPECT_EQ((*tokens)[0].data.find(**first), std::string::npos);

  Result<std::optional<std::string>> second = auth.Bootstrap(std::nullopt);
  ASSERT_OK(second);
  EXPECT_FALSE(second->has_value());
  EXPECT_THAT(auth.Authenticate("Bearer nope-nope-nope-nope"),
              gpufleet::testing::StatusIs(StatusCode::kUnauthenticated));
  EXPECT_THAT(auth.Authenticate(""), gpufleet::testing::StatusIs(StatusCode::kUnauthenticated));
}

TEST(TokenAuthenticatorTest, BootstrapInstallsTheGivenToken) {
  store::InMemoryStateStore store;
  FakeClock clock;
  TokenAuthenticator auth(store, clock);
  Result<std::optional<std::string>> result = auth.Bootstrap("operator-chosen-token-1234");
  ASSERT_OK(result);
  EXPECT_FALSE(result->has_value());
  Result<control::Principal> who = auth.Authenticate("bearer operator-chosen-token-1234");
  ASSERT_OK(who);
  EXPECT_TRUE(who->is_admin());
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// A checked token is trusted for kTokenTrustTime without reading the store; a revocation through
// the same authenticator ends the trust at once, one through another server's within that time.
TEST(TokenAuthenticatorTest, TrustsACheckedTokenBrieflyAndNotPastItsRevocation) {
  store::InMemoryStateStore inner;
  store::testing::FaultInjectingStateStore store(inner);
  FakeClock clock;
  TokenAuthenticator auth(store, clock);
  TokenAuthenticator other_server(store, clock);
  ASSERT_OK(auth.Bootstrap("operator-chosen-token-1234"));
  const Result<std::string> alice = auth.CreateToken(control::Role::kMember, "vision", "alice");
  const Result<std::string> bob = auth.CreateToken(control::Role::kMember, "vision", "bob");
  ASSERT_OK(alice);
  ASSERT_OK(bob);
  const int64_t reads = store.get_count();
  ASSERT_OK(auth.Authenticate("Bearer " + *alice));
  Result<control::Principal> again = auth.Authenticate("Bearer " + *alice);
  ASSERT_OK(again);
  EXPECT_EQ(again->name, "alice");
  EXPECT_EQ(again->team, "vision");
  EXPECT_EQ(store.get_count(), reads + 1);

  // Revoked here: refused at once.
  ASSERT_OK(auth.RevokeToken(*alice));
  EXPECT_THAT(auth.Authenticate("Bearer " + *alice),
              gpufleet::testing::StatusIs(StatusCode::kUnauthenticated));

  // Revoked by another server: trusted here until kTokenTrustTime has passed since its check.
  ASSERT_OK(auth.Authenticate("Bearer " + *bob));
  ASSERT_OK(other_server.RevokeToken(*bob));
  clock.Advance(kTokenTrustTime - std::chrono::milliseconds(1));
  EXPECT_OK(auth.Authenticate("Bearer " + *bob));
  clock.Advance(std::chrono::milliseconds(1));
  EXPECT_THAT(auth.Authenticate("Bearer " + *bob),
              gpufleet::testing::StatusIs(StatusCode::kUnauthenticated));
}

// A check that read the token before a revocation on this server does not trust its answer after.
TEST(TokenAuthenticatorTest, ACheckRacingARevocationIsNotTrusted) {
  store::InMemoryStateStore inner;
  store::testing::FaultInjectingStateStore store(inner);
  FakeClock clock;
  TokenAuthenticator auth(store, clock);
  ASSERT_OK(auth.Bootstrap("operator-chosen-token-1234"));
  const Result<std::string> carol = auth.CreateToken(control::Role::kMember, "nlp", "carol");
  ASSERT_OK(carol);
  store.AfterNextGet([&] { ASSERT_OK(auth.RevokeToken(*carol)); });
  // Read before the revocation: this one request passes, as it would have a moment earlier.
  EXPECT_OK(auth.Authenticate("Bearer " + *carol));
  EXPECT_THAT(auth.Authenticate("Bearer " + *carol),
              gpufleet::testing::StatusIs(StatusCode::kUnauthenticated));
}

// The real thing: SQLite in a temporary directory, HTTP on loopback, the loop thread; then a
// restart on the same file.
class ApiServerIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "gpufleet-server-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::filesystem::path dir_;
  // A server on `store` with a short cycle, as every run of this fixture wants.
  Result<std::unique_ptr<ApiServer>> MakeServer(store::StateStore& store) {
    return ApiServer::Create({.store = store,
                              .catalog = catalog_,
                              .clock = clock_,
                              .cycle_interval = std::chrono::milliseconds(10)});
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  SystemClock clock_;
};

// Polls GET path until `done` holds for the body or the deadline passes.
template <typename Predicate>
Json PollJson(httplib::Client& client, const std::string& path, Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  Json last;
  while (std::chrono::steady_clock::now() < deadline) {
    httplib::Result response = client.Get(path.c_str());
    if (response && response->status == 200) {
      last = Json::parse(response->body, nullptr, false);
      if (done(last)) {
        return last;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return last;
}

TEST_F(ApiServerIntegrationTest, ServesHttpAndSurvivesRestart) {
  const std::string db = (dir_ / "gpufleet.db").string();
  std::string admin;
  std::set<std::string> first_nodes;
  {
    Result<std::unique_ptr<store::SqliteStateStore>> store = store::SqliteStateStore::Open(db);
    ASSERT_OK(store);
    Result<std::unique_ptr<ApiServer>> server = MakeServer(**store);
    ASSERT_OK(server);
    ASSERT_OK((*server)->RegisterNodes(TwoLeaves(catalog_, 2)));
    Result<std::optional<std::string>> token = (*server)->authenticator().Bootstrap(std::nullopt);
    ASSERT_OK(token);
    ASSERT_TRUE(token->has_value());
    admin = **token;
    Result<int> port = (*server)->Start("127.0.0.1", 0);
    ASSERT_OK(port);
    ASSERT_GT(*port, 0);

    httplib::Client client("127.0.0.1", *port);
    client.set_connection_timeout(std::chrono::seconds(5));
    client.set_read_timeout(std::chrono::seconds(10));
    httplib::Result health = client.Get("/healthz");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
    httplib::Result anonymous = client.Get("/v1/jobs");
    ASSERT_TRUE(anonymous);
    EXPECT_EQ(anonymous->status, 401);

    client.set_bearer_token_auth(admin.c_str());
    httplib::Result created = client.Post("/v1/jobs", JobYaml("persist", 2, 8), "application/yaml");
    ASSERT_TRUE(created);
    EXPECT_EQ(created->status, 201) << created->body;
    Json job = PollJson(client, "/v1/jobs/persist",
                        [](const Json& j) { return j.value("state", "") == "Scheduled"; });
    ASSERT_EQ(job.value("state", ""), "Scheduled") << job.dump();
    first_nodes = PlacedNodes(job);
    EXPECT_EQ(first_nodes.size(), 2u);

    httplib::Result large = client.Post("/v1/jobs", std::string(2 << 20, 'x'), "application/yaml");
    ASSERT_TRUE(large);
    EXPECT_EQ(large->status, 413);
    EXPECT_THAT(large->body, HasSubstr("RESOURCE_EXHAUSTED"));
    httplib::Result ready = client.Get("/readyz");
    ASSERT_TRUE(ready);
    EXPECT_EQ(ready->status, 200);
    httplib::Result metrics = client.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_THAT(metrics->body,
                HasSubstr("gpufleet_api_requests_total{route=\"/v1/jobs\",code=\"201\"} 1"));
    (*server)->Stop();
  }
  // Restart on the same file: the job and the token are still there, and its GPUs stay taken.
  Result<std::unique_ptr<store::SqliteStateStore>> store = store::SqliteStateStore::Open(db);
  ASSERT_OK(store);
  Result<std::unique_ptr<ApiServer>> server = MakeServer(**store);
  ASSERT_OK(server);
  Result<int> added = (*server)->RegisterNodes(TwoLeaves(catalog_, 2));
  ASSERT_OK(added);
  EXPECT_EQ(*added, 0);
  Result<std::optional<std::string>> again = (*server)->authenticator().Bootstrap(std::nullopt);
  ASSERT_OK(again);
  EXPECT_FALSE(again->has_value());
  Result<int> port = (*server)->Start("127.0.0.1", 0);
  ASSERT_OK(port);
  httplib::Client client("127.0.0.1", *port);
  client.set_read_timeout(std::chrono::seconds(10));
  client.set_bearer_token_auth(admin.c_str());
  Json job = PollJson(client, "/v1/jobs/persist", [](const Json&) { return true; });
  EXPECT_EQ(job.value("state", ""), "Scheduled");
  EXPECT_EQ(PlacedNodes(job), first_nodes);

  // 16 GPUs are free: a 3 x 8 gang waits, a 2 x 8 one lands on the other two nodes.
  ASSERT_TRUE(client.Post("/v1/jobs", JobYaml("too-big", 3, 8), "application/yaml"));
  ASSERT_TRUE(client.Post("/v1/jobs", JobYaml("fits", 2, 8, "", -1), "application/yaml"));
  Json fits = PollJson(client, "/v1/jobs/fits",
                       [](const Json& j) { return j.value("state", "") == "Scheduled"; });
  ASSERT_EQ(fits.value("state", ""), "Scheduled") << fits.dump();
  for (const std::string& node : PlacedNodes(fits)) {
    EXPECT_EQ(first_nodes.count(node), 0u) << node << " is held twice";
  }
  Json too_big = PollJson(client, "/v1/jobs/too-big",
                          [](const Json& j) { return !j.value("reason", "").empty(); });
  EXPECT_EQ(too_big.value("state", ""), "Pending");
  (*server)->Stop();
}

// The HTTP defects of issue 14, on the real server: each one used to be accepted or mis-answered.
TEST_F(ApiServerIntegrationTest, HttpFramingIsStrictAndOneBodyLimitHolds) {
  store::InMemoryStateStore store;
  Result<std::unique_ptr<ApiServer>> server = MakeServer(store);
  ASSERT_OK(server);
  ASSERT_OK((*server)->RegisterNodes(TwoLeaves(catalog_, 2)));
  Result<std::optional<std::string>> admin = (*server)->authenticator().Bootstrap(std::nullopt);
  ASSERT_OK(admin);
  Result<int> port = (*server)->Start("127.0.0.1", 0);
  ASSERT_OK(port);
  const std::string auth = "Authorization: Bearer " + **admin + "\r\n";
  const auto exchange = [&](const std::string& request) {
    http_testing::RawConnection connection(*port);
    EXPECT_TRUE(connection.Send(request));
    return connection.ReadAll();
  };

  // curl's default Content-Type for -d, over 8 KiB: a job like any other, not a false 413.
  const std::string padded =
      JobYaml("form-typed", 1, 1) + "# " + std::string(20 * 1024, 'p') + "\n";
  const std::string created =
      exchange("POST /v1/jobs HTTP/1.1\r\nHost: x\r\n" + auth +
               "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: " +
               std::to_string(padded.size()) + "\r\nConnection: close\r\n\r\n" + padded);
  EXPECT_THAT(created, ::testing::StartsWith("HTTP/1.1 201")) << created;

  // Request smuggling: two Content-Lengths, or one with chunked, are refused before any route.
  const std::string job = JobYaml("smuggled", 1, 1);
  for (const std::string& framing :
       {"Content-Length: " + std::to_string(job.size()) + "\r\nContent-Length: 5\r\n",
        "Content-Length: " + std::to_string(job.size()) + "\r\nTransfer-Encoding: chunked\r\n"}) {
    const std::string answer =
        exchange("POST /v1/jobs HTTP/1.1\r\nHost: x\r\n" + auth + framing + "\r\n" + job);
    EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 400")) << framing;
    EXPECT_THAT(answer, HasSubstr("INVALID_ARGUMENT")) << framing;
  }
  EXPECT_EQ(store.Get(control::kJobsKind, "smuggled").status().code(), StatusCode::kNotFound);

  // Invalid UTF-8 in the path: 400 naming it, not 500.
  const std::string bad_path =
      exchange("GET /v1/jobs/%FF%FE HTTP/1.1\r\nHost: x\r\n" + auth + "Connection: close\r\n\r\n");
  EXPECT_THAT(bad_path, ::testing::StartsWith("HTTP/1.1 400"));
  EXPECT_THAT(bad_path, HasSubstr("not valid UTF-8"));

  // Two pipelined requests: both answered, in order.
  const std::string pipelined = exchange(
      "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/jobs/form-typed HTTP/1.1\r\nHost: x\r\n" +
      auth + "Connection: close\r\n\r\n");
  const size_t health = pipelined.find("ok\n");
  const size_t second = pipelined.find("\"name\":\"form-typed\"");
  ASSERT_NE(health, std::string::npos) << pipelined;
  ASSERT_NE(second, std::string::npos) << pipelined;
  EXPECT_LT(health, second);
  (*server)->Stop();
}

TEST_F(ApiServerIntegrationTest, ServesHttpsOnlyWhenGivenTlsFiles) {
  const std::string cert = (dir_ / "cert.pem").string();
  const std::string key = (dir_ / "key.pem").string();
  ASSERT_OK(api_testing::WriteSelfSignedCert(cert, key));
  store::InMemoryStateStore store;
  Result<std::unique_ptr<ApiServer>> server = MakeServer(store);
  ASSERT_OK(server);
  Result<std::optional<std::string>> admin = (*server)->authenticator().Bootstrap(std::nullopt);
  ASSERT_OK(admin);
  Result<int> port = (*server)->Start("127.0.0.1", 0, ApiServer::TlsFiles{cert, key});
  ASSERT_OK(port);

  httplib::Client https(fmt::format("https://127.0.0.1:{}", *port));
  https.set_ca_cert_path(cert.c_str());
  https.set_connection_timeout(std::chrono::seconds(5));
  https.set_read_timeout(std::chrono::seconds(10));
  https.set_bearer_token_auth((*admin)->c_str());
  httplib::Result queues = https.Get("/v1/queues");
  ASSERT_TRUE(queues) << httplib::to_string(queues.error());
  EXPECT_EQ(queues->status, 200);
  EXPECT_THAT(queues->body, HasSubstr("\"name\":\"default\""));

  // Plain HTTP to the TLS port gets no answer: the handshake fails and the connection closes.
  httplib::Client plain("127.0.0.1", *port);
  plain.set_connection_timeout(std::chrono::seconds(5));
  plain.set_read_timeout(std::chrono::seconds(5));
  httplib::Result plain_answer = plain.Get("/healthz");
  EXPECT_FALSE(plain_answer) << "HTTP " << plain_answer->status;

  // A client that does not trust the certificate refuses the server.
  httplib::Client untrusting(fmt::format("https://127.0.0.1:{}", *port));
  untrusting.set_ca_cert_path((dir_ / "missing-ca.pem").c_str());
  untrusting.set_connection_timeout(std::chrono::seconds(5));
  EXPECT_FALSE(untrusting.Get("/healthz"));
  (*server)->Stop();
}

TEST_F(ApiServerIntegrationTest, BadTlsFilesFailAtStartNamingTheFile) {
  const std::string cert = (dir_ / "cert.pem").string();
  const std::string key = (dir_ / "key.pem").string();
  const std::string other_cert = (dir_ / "other-cert.pem").string();
  const std::string other_key = (dir_ / "other-key.pem").string();
  ASSERT_OK(api_testing::WriteSelfSignedCert(cert, key));
  ASSERT_OK(api_testing::WriteSelfSignedCert(other_cert, other_key));
  const std::string garbage = (dir_ / "garbage.pem").string();
  std::ofstream(garbage) << "not a certificate\n";
  store::InMemoryStateStore store;
  Result<std::unique_ptr<ApiServer>> server = MakeServer(store);
  ASSERT_OK(server);
  const std::vector<std::pair<ApiServer::TlsFiles, std::string>> cases = {
      {{"/nonexistent/cert.pem", key}, "TLS certificate \"/nonexistent/cert.pem\": cannot read it"},
      {{cert, "/nonexistent/key.pem"}, "TLS key \"/nonexistent/key.pem\": cannot read it"},
      {{garbage, key}, "TLS certificate \"" + garbage + "\": not a PEM certificate"},
      {{cert, garbage}, "TLS key \"" + garbage + "\": not a PEM private key"},
      {{cert, other_key}, "does not match the certificate"}};
  for (const auto& [files, message] : cases) {
    SCOPED_TRACE(message);
    EXPECT_THAT((*server)->Start("127.0.0.1", 0, files),
                gpufleet::testing::StatusIs(StatusCode::kInvalidArgument, HasSubstr(message)));
  }
  // Nothing was started by the failed attempts.
  Result<int> port = (*server)->Start("127.0.0.1", 0, ApiServer::TlsFiles{cert, key});
  EXPECT_OK(port);
  (*server)->Stop();
}

}  // namespace
}  // namespace gpufleet::api
