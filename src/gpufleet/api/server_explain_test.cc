// SPDX-License-Identifier: Apache-2.0
// GET /v1/jobs/NAME/explain and the cycle's EASY backfill, on a server with a fake clock and
// nodes without agents (a cancelled job's tasks are gone at the next cycle, so a cancel at a
// job's runtime estimate plays its end).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/api_request.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

// `replicas` tasks of `gpus` whole H100s, running at most `estimate` ("" for none).
std::string Job(const std::string& name, int replicas, int gpus, const std::string& estimate,
                const std::string& required = "") {
  std::string yaml = fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata:
  name: {}
spec:
  tasks:
    - name: workers
      command: [train]
      replicas: {}
      resources: {{cpu: "8", memory: 64Gi, gpus: {{count: {}}}}}
)",
                                 name, replicas, gpus);
  if (!estimate.empty()) {
    yaml += fmt::format("  runtimeEstimate: {}\n", estimate);
  }
  if (!required.empty()) {
    yaml += fmt::format("  topology: {{required: {}}}\n", required);
  }
  return yaml;
}

// Two leaves of two nodes of 8 H100s (32 GPUs); teams team-a (alice) and team-b (bob).
class ServerExplainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<ApiServer>> server = ApiServer::Create(
        {.store = store_, .catalog = catalog_, .clock = clock_, .wall_clock = &clock_});
    ASSERT_OK(server);
    server_ = std::move(server).value();
    SyntheticClusterSpec spec;
    spec.blocks = 1;
    spec.leaves_per_block = 2;
    spec.nodes_per_leaf = 2;
    Result<Cluster> cluster = MakeSyntheticCluster(spec, catalog_);
    ASSERT_OK(cluster);
    ASSERT_OK(server_->RegisterNodes(*cluster));
    for (const char* team : {"team-a", "team-b"}) {
      store::WriteBatch batch;
      batch.Create(std::string(control::kTeamsKind), team,
                   control::TeamToJson({.name = team}).dump());
      ASSERT_OK(store_.Commit(batch));
    }
    alice_ = *server_->authenticator().CreateToken(control::Role::kMember, "team-a", "alice");
    bob_ = *server_->authenticator().CreateToken(control::Role::kMember, "team-b", "bob");
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
  void Submit(const std::string& yaml, const std::string& token) {
    CallJson("POST", "/v1/jobs", token, yaml, 201);
  }
  std::string State(const std::string& name, const std::string& token) {
    return CallJson("GET", "/v1/jobs/" + name, token)["state"].get<std::string>();
  }
  void Cycles(int n = 2) {
    for (int i = 0; i < n; ++i) {
      ASSERT_OK(server_->RunSchedulingCycle());
    }
  }
  // A job ends at its estimate: cancelled, its tasks gone at the next cycle.
  void End(const std::string& name, const std::string& token) {
    CallJson("POST", "/v1/jobs/" + name + "/cancel", token);
    Cycles();
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_;
  store::InMemoryStateStore store_;
  std::unique_ptr<ApiServer> server_;
  std::string alice_;
  std::string bob_;
};

// A job that no node of the fleet could ever hold, with `spec` lines added to a job of one
// task of `gpus`.
std::string NeverJob(const std::string& name, const std::string& gpus, const std::string& spec) {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata:
  name: {}
spec:
  tasks:
    - name: workers
      command: [train]
      resources: {{cpu: "8", memory: 64Gi, gpus: {}}}
{})",
                     name, gpus, spec);
}

// Each thing the fleet (4 nodes of 8 H100-80GB, no MIG, no labels) lacks: a warning at submit
// naming it, the reason "never fits: ...", explain's `never` with no ETA and no what-if that
// cannot help; refused with ?strict=true.
TEST_F(ServerExplainTest, ImpossibleJobsAreNamedAtSubmit) {
  // Before the loop's first cycle there is no fleet to check against: the cycle names it.
  const Json early =
      CallJson("POST", "/v1/jobs", alice_, NeverJob("early", "{count: 16}", ""), 201);
  EXPECT_FALSE(early.contains("warnings"));
  Cycles(1);
  EXPECT_THAT(CallJson("GET", "/v1/jobs/early", alice_)["reason"].get<std::string>(),
              HasSubstr("never fits: task workers: 16 GPUs per task: the largest node it may use, "
                        "node-0000, has 8 H100-80GB"));
  struct Row {
    std::string name;
    std::string yaml;
    std::string want;  // in the warning, the reason and explain's message
  };
  const std::vector<Row> rows = {
      {"wide", NeverJob("wide", "{count: 16}", ""),
       "spec.tasks[0].resources.gpus: never fits: task workers: 16 GPUs per task: the largest "
       "node it may use, node-0000, has 8 H100-80GB"},
      {"a100", NeverJob("a100", "{count: 1}", "  gpuModels: [A100-80GB]\n"),
       "spec.gpuModels: never fits: GPU model A100-80GB: the fleet has none (it has H100-80GB)"},
      {"mig", NeverJob("mig", "{migProfile: 3g.40gb, count: 1}", ""),
       "spec.tasks[0].resources.gpus: never fits: task workers: MIG profile 3g.40gb: no GPU it "
       "may use is in MIG mode"},
      {"selector", NeverJob("selector", "{count: 1}", "  nodeSelector: {zone: east}\n"),
       "spec.nodeSelector: never fits: nodeSelector zone=east: no node has that label (no node "
       "has the key zone)"},
      {"gang", Job("gang", 5, 8, ""),
       "spec.tasks: never fits: 40 GPUs in all: the nodes it may use have 32 GPUs together"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    // Refused when strict, with the field; nothing is stored.
    const Json refused = CallJson("POST", "/v1/jobs?strict=true", alice_, row.yaml, 400);
    EXPECT_THAT(refused.dump(), HasSubstr(row.want));
    CallJson("GET", "/v1/jobs/" + row.name, alice_, "", 404);
    // Accepted with the warning otherwise.
    const Json created = CallJson("POST", "/v1/jobs", alice_, row.yaml, 201);
    ASSERT_TRUE(created.contains("warnings")) << created.dump();
    EXPECT_THAT(created["warnings"][0].get<std::string>(), HasSubstr(row.want));
    const std::string named = row.want.substr(row.want.find("never fits: "));
    EXPECT_THAT(created["reason"].get<std::string>(), HasSubstr(named));
    Cycles();
    const Json stored = CallJson("GET", "/v1/jobs/" + row.name, alice_);
    EXPECT_EQ(stored["state"], "Pending");
    EXPECT_THAT(stored["reason"].get<std::string>(), HasSubstr(named));
    const Json explained = CallJson("GET", "/v1/jobs/" + row.name + "/explain", alice_);
    EXPECT_EQ(explained["reason"], "never");
    EXPECT_THAT(explained["message"].get<std::string>(), HasSubstr(named));
    EXPECT_TRUE(explained["eta"]["at"].is_null());
    for (const Json& what_if : explained["whatIf"]) {
      EXPECT_TRUE(what_if["wouldStartNow"].get<bool>()) << what_if.dump();
    }
  }
  // A job that fits gets no warning, and ?strict=bad is refused by name.
  const Json fits = CallJson("POST", "/v1/jobs?strict=true", alice_, Job("fits", 1, 8, ""), 201);
  EXPECT_FALSE(fits.contains("warnings"));
  EXPECT_THAT(
      CallJson("POST", "/v1/jobs?strict=yes", alice_, Job("odd", 1, 1, ""), 400)["error"]["message"]
          .get<std::string>(),
      HasSubstr("strict: \"yes\""));

  // The fleet grows: a node of A100s joins, and the A100 job is tried again and starts.
  SyntheticClusterSpec spec;
  spec.gpu_model = "A100-80GB";
  Result<Cluster> more = MakeSyntheticCluster(spec, catalog_);
  ASSERT_OK(more);
  more->nodes[0].id = NodeId("a100-node");
  for (Gpu& gpu : more->nodes[0].gpus) {
    gpu.uuid = GpuUuid("GPU-a100-" + gpu.uuid.value());
  }
  ASSERT_OK(server_->RegisterNodes(*more));
  Cycles();
  EXPECT_EQ(State("a100", alice_), "Scheduled");
  // The others still never fit, their reasons kept.
  EXPECT_THAT(CallJson("GET", "/v1/jobs/wide", alice_)["reason"].get<std::string>(),
              HasSubstr("never fits: task workers: 16 GPUs per task"));

  // Freed GPUs do not help a job that never fits; a node that gains the label it selects does,
  // though no node joins or leaves (the node is changed in place).
  End("a100", alice_);
  EXPECT_EQ(State("selector", alice_), "Pending");
  const Result<store::StoredObject> node =
      store_.Get(std::string(control::kNodesKind), "node-0001");
  ASSERT_OK(node);
  Json labelled = wire::ParseDocument(node->data);
  labelled["labels"]["zone"] = "east";
  store::WriteBatch relabel;
  relabel.Update(std::string(control::kNodesKind), "node-0001", labelled.dump(), node->version);
  ASSERT_OK(store_.Commit(relabel));
  Cycles();
  EXPECT_EQ(State("selector", alice_), "Scheduled");
  EXPECT_EQ(State("wide", alice_), "Pending");
}

TEST_F(ServerExplainTest, HostileNamesAndOtherTeamsJobsAre404) {
  Submit(Job("mine", 1, 8, "1h"), alice_);
  Cycles();
  CallJson("GET", "/v1/jobs/nope/explain", alice_, "", 404);
  // Another team's job is not found for a member, as GET says.
  const Json hidden = CallJson("GET", "/v1/jobs/mine/explain", bob_, "", 404);
  EXPECT_THAT(hidden.dump(), Not(HasSubstr("team-a")));
  CallJson("GET", "/v1/jobs/team-a/mine/explain", bob_, "", 404);
  for (const char* odd :
       {"%3Cscript%3E", "<b>x</b>", "a..b", "UPPER", "x'%20OR%201=1", "..", "%00"}) {
    SCOPED_TRACE(odd);
    const ApiResponse response = Call("GET", fmt::format("/v1/jobs/{}/explain", odd), alice_);
    EXPECT_TRUE(response.status == 404 || response.status == 400) << response.body;
  }
  // A running job: reason none, with a message.
  const Json running = CallJson("GET", "/v1/jobs/mine/explain", alice_);
  EXPECT_EQ(running["reason"], "none");
  EXPECT_EQ(running["phase"], "Scheduled");
  EXPECT_THAT(running["message"].get<std::string>(), HasSubstr("Scheduled"));
  // "explain" is reserved as a job name, as "events" is.
  const Json reserved = CallJson("POST", "/v1/jobs", alice_, Job("explain", 1, 1, ""), 400);
  EXPECT_THAT(reserved.dump(), HasSubstr("explain"));
}

TEST_F(ServerExplainTest, OtherTeamsJobsAheadAreCountedNotNamed) {
  Submit(Job("filler", 4, 8, "1h"), bob_);
  Cycles();
  Submit(Job("bobs-wait", 1, 8, "1h"), bob_);
  Cycles(1);
  Submit(Job("alices", 1, 8, "1h"), alice_);
  Cycles(1);
  const ApiResponse response = Call("GET", "/v1/jobs/alices/explain", alice_);
  ASSERT_EQ(response.status, 200) << response.body;
  EXPECT_THAT(response.body, Not(HasSubstr("bobs-wait")));
  const Json explained = wire::ParseDocument(response.body);
  EXPECT_EQ(explained["job"], "alices");
  EXPECT_EQ(explained["reason"], "capacity");
  EXPECT_EQ(explained["queuePosition"], 2);
  ASSERT_EQ(explained["ahead"].size(), 1u);
  EXPECT_EQ(explained["ahead"][0]["hidden"], 1);
  // Bob sees his own job ahead by name.
  const Json bobs = CallJson("GET", "/v1/jobs/bobs-wait/explain", bob_);
  EXPECT_EQ(bobs["queuePosition"], 1);
  // The filler ends at its estimate, an hour from now: both ETAs are known.
  EXPECT_EQ(bobs["eta"]["inSeconds"], 3600);
  EXPECT_TRUE(bobs["eta"]["at"].is_string());
  EXPECT_EQ(explained["eta"]["inSeconds"], 3600);
}

// Issue 37 item 6: an elastic job is judged at its minimum: one larger than the fleet at its
// maximum is no "never fits", waits for capacity while the fleet is full (explain says so, for
// its minimum), then runs at the largest size that fits.
TEST_F(ServerExplainTest, AnElasticJobIsJudgedAtItsMinimumAndRunsAtTheLargestSizeThatFits) {
  Submit(Job("filler", 4, 8, "1h"), bob_);
  Cycles();
  const ApiResponse created = Call("POST", "/v1/jobs", alice_, R"(apiVersion: gpufleet.io/v1
kind: Job
metadata:
  name: elastic
spec:
  tasks:
    - name: workers
      command: [torchrun, train.py]
      replicas: {min: 2, max: 64}
      resources: {cpu: "1", memory: 8Gi, gpus: {count: 1}}
)");
  ASSERT_EQ(created.status, 201) << created.body;
  EXPECT_THAT(created.body, Not(HasSubstr("never fits")));
  Cycles(1);
  const ApiResponse response = Call("GET", "/v1/jobs/elastic/explain", alice_);
  ASSERT_EQ(response.status, 200) << response.body;
  const Json explained = wire::ParseDocument(response.body);
  EXPECT_EQ(explained["reason"], "capacity") << response.body;
  EXPECT_EQ(explained["evidence"]["neededGpus"], 2) << response.body;

  End("filler", bob_);
  const Json job = wire::ParseDocument(Call("GET", "/v1/jobs/elastic", alice_).body);
  EXPECT_NE(job["state"], "Pending") << job.dump();
  EXPECT_EQ(job["world_size"], 32) << "the whole fleet; 64 never fits";
}

// The ETA shown is the backfill plan's, and a replay with exact runtimes starts the job then;
// small jobs that would run past its reservation do not start before it (no starvation), while
// one that ends in time is backfilled.
TEST_F(ServerExplainTest, BigHeadJobKeepsItsReservationAndStartsAtItsEta) {
  Submit(Job("a", 2, 8, "1h"), alice_);
  Submit(Job("b", 1, 8, "2h"), alice_);
  Cycles();
  Submit(Job("big", 4, 8, "1h"), alice_);
  Cycles(1);
  const Json explained = CallJson("GET", "/v1/jobs/big/explain", alice_);
  EXPECT_EQ(explained["reason"], "capacity");
  ASSERT_TRUE(explained["eta"]["inSeconds"].is_number()) << explained.dump();
  const int64_t eta = explained["eta"]["inSeconds"].get<int64_t>();
  EXPECT_EQ(eta, 7200);
  EXPECT_EQ(explained["evidence"]["neededGpus"], 32);
  EXPECT_EQ(explained["evidence"]["freeGpus"], 8);

  // A stream of small jobs: the long ones are held back for big, a short one backfills.
  Submit(Job("small-0", 1, 8, "3h"), alice_);
  Cycles(1);
  EXPECT_EQ(State("small-0", alice_), "Pending");
  const Json held = CallJson("GET", "/v1/jobs/small-0/explain", alice_);
  EXPECT_EQ(held["reason"], "reservation") << held.dump();
  EXPECT_THAT(held["message"].get<std::string>(), HasSubstr("job big"));
  // Planned after big has run its hour.
  ASSERT_TRUE(held["eta"]["inSeconds"].is_number()) << held.dump();
  const int64_t small_eta = held["eta"]["inSeconds"].get<int64_t>();
  EXPECT_EQ(small_eta, 10800);
  Submit(Job("short", 1, 8, "30m"), alice_);
  Cycles(1);
  EXPECT_EQ(State("short", alice_), "Scheduled");

  const auto start = clock_.Now();
  clock_.Advance(std::chrono::minutes(30));
  End("short", alice_);
  clock_.Advance(std::chrono::minutes(30));
  End("a", alice_);
  Submit(Job("small-1", 1, 8, "3h"), alice_);
  Cycles();
  EXPECT_EQ(State("big", alice_), "Pending");
  EXPECT_EQ(State("small-0", alice_), "Pending");
  EXPECT_EQ(State("small-1", alice_), "Pending");
  clock_.Advance(std::chrono::hours(1));
  End("b", alice_);
  EXPECT_EQ(State("big", alice_), "Scheduled");
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::seconds>(clock_.Now() - start).count(), eta);
  EXPECT_EQ(State("small-0", alice_), "Pending");
  clock_.Advance(std::chrono::hours(1));
  End("big", alice_);
  EXPECT_EQ(State("small-0", alice_), "Scheduled");
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::seconds>(clock_.Now() - start).count(),
            small_eta);
}

// Every what-if that says the job would start now does: the changed spec, submitted in place of
// the waiting job (cancelled), is scheduled by the next cycle.
TEST_F(ServerExplainTest, EveryWhatIfThatWouldStartDoes) {
  // Five GPUs taken on each node: 12 free, 3 on each node.
  for (int i = 0; i < 4; ++i) {
    Submit(Job(fmt::format("hold-{}", i), 1, 5, "1h"), alice_);
  }
  Cycles();
  // Four tasks of one GPU on one node: no node has 4 free.
  Submit(Job("ring", 4, 1, "1h", "node"), alice_);
  Cycles(1);
  const Json explained = CallJson("GET", "/v1/jobs/ring/explain", alice_);
  EXPECT_EQ(explained["reason"], "topology") << explained.dump();
  EXPECT_EQ(explained["evidence"]["bestDomain"]["freeGpus"], 3);
  EXPECT_EQ(explained["evidence"]["bestDomain"]["lacksGpus"], 1);
  ASSERT_TRUE(explained["whatIf"].is_array());
  int starting = 0;
  std::string waiting = "ring";
  for (size_t i = 0; i < explained["whatIf"].size(); ++i) {
    const Json& what_if = explained["whatIf"][i];
    SCOPED_TRACE(what_if.dump());
    if (!what_if["wouldStartNow"].get<bool>()) {
      continue;
    }
    ++starting;
    End(waiting, alice_);
    Json spec = what_if["spec"];
    spec["metadata"]["name"] = fmt::format("changed-{}", i);
    Submit(spec.dump(), alice_);
    Cycles(1);
    EXPECT_EQ(State(fmt::format("changed-{}", i), alice_), "Scheduled");
    End(fmt::format("changed-{}", i), alice_);
    waiting = fmt::format("again-{}", i);
    Submit(Job(waiting, 4, 1, "1h", "node"), alice_);
    Cycles(1);
    EXPECT_EQ(State(waiting, alice_), "Pending");
  }
  // A coarser level (leaf) and fewer GPUs both would start.
  EXPECT_EQ(starting, 2) << explained.dump();
}

}  // namespace
}  // namespace gpufleet::api
