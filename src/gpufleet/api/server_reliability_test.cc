// SPDX-License-Identifier: Apache-2.0
// The server's reliability side through ApiServer::Handle and the agent protocol, on a fake
// clock: outcome records written with the job's change, outcomes reported from outside, the
// attribution step's quarantines with their audit events, the budget, releases, the health-rule
// path and the failure report.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/auth.h"
#include "gpufleet/api/server.h"
#include "gpufleet/control/outcome_json.h"
#include "gpufleet/control/reliability_controller.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/wire/agent_protocol.h"

namespace gpufleet::api {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kGpusPerNode = 4;
// 2023-11-14, so that the records carry plausible Unix times.
constexpr MonoTime kStart{1'700'000'000'000'000'000};

std::string Uuid(const std::string& node, int index) {
  return fmt::format("GPU-{}-{}", node, index);
}

// With `diagnostics` the node's agent runs diagnostics (the reliability loop diagnoses it).
wire::RegisterRequest ReliabilityInventory(const std::string& name, bool diagnostics = false) {
  wire::RegisterRequest request;
  if (diagnostics) {
    request.node.labels[std::string(wire::kDiagnosticsLabel)] = "true";
  }
  request.topology_levels = {"leaf"};
  request.node.id = NodeId(name);
  request.node.capacity = {64000, 512 * 1024};
  request.node.topology = {"leaf-0"};
  request.node.labels["pool"] = name;
  for (int i = 0; i < kGpusPerNode; ++i) {
    Gpu gpu;
    gpu.index = i;
    gpu.uuid = GpuUuid(Uuid(name, i));
    gpu.model = "H100-80GB";
    gpu.memory_mib = 81559;
    request.node.gpus.push_back(gpu);
  }
  return request;
}

// With `node` the job runs on that node only (every node is labelled pool=NAME).
std::string ReliabilityJobYaml(const std::string& name, int gpus, const std::string& node = "") {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}}}
spec:
  {}
  tasks:
    - name: main
      command: [python, train.py]
      resources:
        gpus: {{count: {}}}
)",
                     name, node.empty() ? "" : fmt::format("nodeSelector: {{pool: {}}}", node),
                     gpus);
}

wire::TaskReport TaskReportFor(const std::string& id, wire::TaskPhase phase, int exit_code = 0) {
  wire::TaskReport report;
  report.id = id;
  report.phase = phase;
  report.exit_code = exit_code;
  return report;
}

wire::GpuReport GpuWith(int index, GpuHealth health, wire::DrainAction drain, std::string reason) {
  wire::GpuReport report;
  report.index = index;
  report.health = health;
  report.drain = drain;
  report.reasons = {std::move(reason)};
  return report;
}

constexpr char kXid79[] = "XID 79: GPU has fallen off the bus; drain now (reset the GPU)";

control::ReliabilityOptions EveryCycle() {
  control::ReliabilityOptions options;
  options.interval = std::chrono::milliseconds(0);
  // A fleet of 8 GPUs: room for two out of service.
  options.budget = {0.25, 0.25};
  return options;
}

class ReliabilityControllerTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(EveryCycle()); }

  void Start(const control::ReliabilityOptions& options) {
    server_.reset();
    Result<std::unique_ptr<ApiServer>> server = ApiServer::Create({.store = store_,
                                                                   .catalog = catalog_,
                                                                   .clock = clock_,
                                                                   .wall_clock = &clock_,
                                                                   .policy = "best-fit",
                                                                   .reliability = options});
    ASSERT_OK(server);
    server_ = std::move(server).value();
    admin_ = *server_->authenticator().CreateToken(control::Role::kAdmin, "", "root");
    agent_ = *server_->authenticator().CreateToken(control::Role::kAgent, "", "agents");
    Cycle();
    Register("n1");
    Register("n2");
  }

  ApiResponse Call(const std::string& method, const std::string& path, const std::string& token,
                   const std::string& body = "") {
    ApiRequest request;
    request.method = method;
    const size_t query = path.find('?');
    request.path = path.substr(0, query);
    if (query != std::string::npos) {
      const std::string pair = path.substr(query + 1);
      const size_t equals = pair.find('=');
      request.query.emplace(pair.substr(0, equals), pair.substr(equals + 1));
    }
    request.authorization = token.empty() ? "" : "Bearer " + token;
    request.body = body;
    return server_->Handle(request);
  }

  Json Get(const std::string& path) {
    const ApiResponse response = Call("GET", path, admin_);
    EXPECT_EQ(response.status, 200) << path << ": " << response.body;
    return Json::parse(response.body, nullptr, false);
  }

  // With the join token, then the node's own credential that the server gives for it.
  void Register(const std::string& node) {
    const ApiResponse response = Call(
        "POST", "/v1/agents/register", node_tokens_.count(node) > 0 ? node_tokens_[node] : agent_,
        wire::RegisterRequestToJson(ReliabilityInventory(node, diagnostics_)));
    ASSERT_EQ(response.status, 200) << response.body;
    const Result<wire::AgentReply> reply = wire::ParseAgentReply(response.body);
    ASSERT_OK(reply);
    if (!reply->node_token.empty()) {
      node_tokens_[node] = reply->node_token;
    }
  }

  void Heartbeat(const std::string& node, const wire::HeartbeatRequest& request = {}) {
    (void)Beat(node, request);
  }
  // A heartbeat and the server's answer.
  wire::AgentReply Beat(const std::string& node, const wire::HeartbeatRequest& request = {}) {
    const ApiResponse response = Call("POST", fmt::format("/v1/agents/{}/heartbeat", node),
                                      node_tokens_[node], wire::HeartbeatRequestToJson(request));
    EXPECT_EQ(response.status, 200) << response.body;
    Result<wire::AgentReply> reply = wire::ParseAgentReply(response.body);
    EXPECT_OK(reply);
    return reply.ok() ? *std::move(reply) : wire::AgentReply();
  }

  void Submit(const std::string& name, int gpus, const std::string& node = "") {
    const ApiResponse response =
        Call("POST", "/v1/jobs", admin_, ReliabilityJobYaml(name, gpus, node));
    ASSERT_EQ(response.status, 201) << response.body;
  }

  void Cycle() { ASSERT_OK(server_->RunSchedulingCycle()); }

  // Submits a one-GPU job, schedules it and reports its task running; returns (node, GPU index).
  std::pair<std::string, int> StartJob(const std::string& name) {
    Submit(name, 1);
    Cycle();
    const Json job = Get("/v1/jobs/" + name);
    EXPECT_EQ(job["state"], "Scheduled");
    const std::string node = job["placements"][0]["node"];
    const int gpu = job["placements"][0]["gpus"][0];
    wire::HeartbeatRequest beat;
    beat.tasks = {TaskReportFor(name + "/main-0/1", wire::TaskPhase::kRunning)};
    Heartbeat(node, beat);
    return {node, gpu};
  }

  Result<control::StoredOutcome> Outcome(const std::string& name) {
    GPUFLEET_ASSIGN_OR_RETURN(const store::StoredObject object,
                              store_.Get(control::kOutcomesKind, name));
    return control::OutcomeFromJson(Json::parse(object.data));
  }

  // A finished run of `hours` on one GPU, written as the server writes them.
  void AddRun(const std::string& job, const std::string& node, int gpu, double hours,
              reliability::ExitReason reason, std::vector<int> xids = {}) {
    control::StoredOutcome outcome;
    reliability::OutcomeRecord& r = outcome.record;
    r.job = JobId(job);
    r.attempt = 1;
    r.exit_reason = reason;
    r.end = MonoTime{clock_.Now().nanos - 1'000'000'000};
    r.start = MonoTime{r.end.nanos - static_cast<int64_t>(hours * 3600e9)};
    r.gpus = {GpuUuid(Uuid(node, gpu))};
    r.nodes = {NodeId(node)};
    for (const int xid : xids) {
      r.xids.push_back({GpuUuid(Uuid(node, gpu)), xid});
    }
    store::WriteBatch batch;
    batch.Create(std::string(control::kOutcomesKind), control::OutcomeName(job, 1),
                 control::OutcomeToJson(outcome).dump());
    ASSERT_OK(store_.Commit(batch));
  }

  // Healthy history on every GPU and three runs that XID 79 ended on `node`/`gpu`.
  void RecordRepeatOffender(const std::string& node, int gpu) {
    int n = 0;
    for (const std::string name : {"n1", "n2"}) {
      for (int i = 0; i < kGpusPerNode; ++i) {
        for (int k = 0; k < 3; ++k) {
          AddRun(fmt::format("ok-{}", n++), name, i, 2.0, reliability::ExitReason::kSucceeded);
        }
      }
    }
    for (int k = 0; k < 3; ++k) {
      AddRun(fmt::format("bad-{}", k), node, gpu, 0.5, reliability::ExitReason::kInfraError, {79});
    }
  }

  std::string NodeEvents(const std::string& node) {
    return Get("/v1/nodes/" + node + "/events").dump();
  }

  int64_t Revision() { return *store_.Revision(); }

  const GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_{kStart};
  store::InMemoryStateStore store_;
  std::unique_ptr<ApiServer> server_;
  std::string admin_;
  std::string agent_;
  std::map<std::string, std::string> node_tokens_;
  bool diagnostics_ = false;  // nodes register as running diagnostics
};

// ---- outcome records ----------------------------------------------------------------------

TEST_F(ReliabilityControllerTest, ASucceededRunIsRecordedInTheCommitThatEndsIt) {
  const auto [node, gpu] = StartJob("ok");
  EXPECT_EQ(Get("/v1/jobs/ok")["run"]["started_ns"], kStart.nanos) << "stamped when placed";
  EXPECT_THAT(store_.Get(control::kOutcomesKind, "ok/1"),
              gpufleet::testing::StatusIs(StatusCode::kNotFound));

  clock_.Advance(std::chrono::hours(1));
  wire::HeartbeatRequest beat;
  beat.tasks = {TaskReportFor("ok/main-0/1", wire::TaskPhase::kSucceeded)};
  Heartbeat(node, beat);
  const Result<control::StoredOutcome> outcome = Outcome("ok/1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->record.exit_reason, reliability::ExitReason::kSucceeded);
  EXPECT_EQ(outcome->record.attempt, 1);
  EXPECT_EQ(outcome->record.duration(), std::chrono::hours(1));
  EXPECT_EQ(outcome->record.gpus, std::vector<GpuUuid>{GpuUuid(Uuid(node, gpu))});
  EXPECT_EQ(outcome->record.nodes, std::vector<NodeId>{NodeId(node)});
  EXPECT_TRUE(outcome->record.xids.empty());
  EXPECT_EQ(store_.Get(control::kOutcomesKind, "ok/1")->revision,
            store_.Get(control::kJobsKind, "ok")->revision)
      << "one commit";
  EXPECT_FALSE(Get("/v1/jobs/ok").contains("run"));
}

TEST_F(ReliabilityControllerTest, ARunThatEndsBeforeItsFirstReportLastsFromItsPlacement) {
  Submit("short", 1);
  Cycle();
  const std::string node = Get("/v1/jobs/short")["placements"][0]["node"];
  clock_.Advance(std::chrono::seconds(30));
  wire::HeartbeatRequest beat;
  beat.tasks = {TaskReportFor("short/main-0/1", wire::TaskPhase::kFailed, 3)};
  Heartbeat(node, beat);
  const Result<control::StoredOutcome> outcome = Outcome("short/1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->record.duration(), std::chrono::seconds(30));
  EXPECT_EQ(outcome->record.exit_reason, reliability::ExitReason::kAppError);
}

TEST_F(ReliabilityControllerTest, ATaskExitIsTheApplicationsUnlessItsGpuReportedABlamingXid) {
  const auto [node, gpu] = StartJob("app");
  wire::HeartbeatRequest beat;
  beat.tasks = {TaskReportFor("app/main-0/1", wire::TaskPhase::kFailed, 1)};
  Heartbeat(node, beat);
  EXPECT_EQ(Outcome("app/1")->record.exit_reason, reliability::ExitReason::kAppError);

  const auto [node2, gpu2] = StartJob("infra");
  beat.tasks = {TaskReportFor("infra/main-0/1", wire::TaskPhase::kFailed, 1)};
  // XID 94 drains after the job: the task's exit is the GPU's fault.
  beat.gpus = {GpuWith(gpu2, GpuHealth::kUnhealthy, wire::DrainAction::kAfterJob,
                       "XID 94: Contained ECC error; drain after the running job (reset)")};
  Heartbeat(node2, beat);
  const Result<control::StoredOutcome> outcome = Outcome("infra/1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->record.exit_reason, reliability::ExitReason::kInfraError);
  ASSERT_EQ(outcome->record.xids.size(), 1u);
  EXPECT_EQ(outcome->record.xids[0].xid, 94);
  EXPECT_EQ(outcome->record.xids[0].gpu, GpuUuid(Uuid(node2, gpu2)));
}

TEST_F(ReliabilityControllerTest, AnXidFromBeforeTheRunIsNotTheRuns) {
  // Every GPU reports an application XID that the agent keeps until the GPU is reset.
  const std::string reason = "XID 13: Graphics Engine Exception; application error, never drain";
  for (const std::string node : {"n1", "n2"}) {
    wire::HeartbeatRequest beat;
    for (int i = 0; i < kGpusPerNode; ++i) {
      beat.gpus.push_back(GpuWith(i, GpuHealth::kHealthy, wire::DrainAction::kNone, reason));
    }
    Heartbeat(node, beat);
  }
  const auto [node, gpu] = StartJob("later");
  wire::HeartbeatRequest beat;
  beat.tasks = {TaskReportFor("later/main-0/1", wire::TaskPhase::kFailed, 2)};
  Heartbeat(node, beat);
  const Result<control::StoredOutcome> outcome = Outcome("later/1");
  ASSERT_OK(outcome);
  EXPECT_TRUE(outcome->record.xids.empty());
  EXPECT_EQ(outcome->record.exit_reason, reliability::ExitReason::kAppError);
}

TEST_F(ReliabilityControllerTest, DrainNowCancelAndNotReadyEndRunsWithTheirReasons) {
  const auto [node, gpu] = StartJob("drained");
  wire::HeartbeatRequest beat;
  beat.gpus = {GpuWith(gpu, GpuHealth::kUnhealthy, wire::DrainAction::kNow, kXid79)};
  Heartbeat(node, beat);
  Result<control::StoredOutcome> outcome = Outcome("drained/1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->record.exit_reason, reliability::ExitReason::kInfraError);
  EXPECT_EQ(outcome->record.xids.size(), 1u);
  EXPECT_THAT(outcome->cause, HasSubstr("must be drained now"));

  StartJob("cancelled");
  ASSERT_EQ(Call("POST", "/v1/jobs/cancelled/cancel", admin_).status, 200);
  EXPECT_EQ(Outcome("cancelled/1")->record.exit_reason, reliability::ExitReason::kCancelled);

  StartJob("lost");
  clock_.Advance(std::chrono::seconds(41));
  Cycle();
  outcome = Outcome("lost/1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->record.exit_reason, reliability::ExitReason::kInfraError);
  EXPECT_THAT(outcome->cause, HasSubstr("NotReady"));
}

// ---- outcomes reported from outside ---------------------------------------------------------

TEST_F(ReliabilityControllerTest, AReportedHangReplacesTheExitReason) {
  const auto [node, gpu] = StartJob("train");
  wire::HeartbeatRequest beat;
  beat.tasks = {TaskReportFor("train/main-0/1", wire::TaskPhase::kFailed, 1)};
  Heartbeat(node, beat);
  const ApiResponse response = Call("POST", "/v1/outcomes", admin_,
                                    R"({"job": "train", "attempt": 1, "exit_reason": "hang",
                                        "note": "NCCL watchdog"})");
  ASSERT_EQ(response.status, 200) << response.body;
  const Json items = Get("/v1/outcomes?job=train")["items"];
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0]["exit_reason"], "hang");
  EXPECT_EQ(items[0]["reported_by"], "root");
  EXPECT_THAT(Get("/v1/jobs/train/events").dump(),
              HasSubstr("outcome of run 1 reported by root: hang (was app-error): NCCL watchdog"));
}

TEST_F(ReliabilityControllerTest, ABadOutcomeReportIsAClearErrorAndChangesNothing) {
  const auto [node, gpu] = StartJob("train");
  struct Case {
    std::string body;
    int status;
    std::string error;
  };
  const std::vector<Case> running = {
      {R"({"job": "j7", "attempt": 1, "exit_reason": "hang"})", 404,
       "outcome for unknown job \\\"j7\\\""},
      {R"({"job": "train", "attempt": 1, "exit_reason": "hang"})", 400,
       "job \\\"train\\\" run 1 is still going"},
  };
  wire::HeartbeatRequest beat;
  for (const Case& c : running) {
    SCOPED_TRACE(c.body);
    const int64_t before = Revision();
    const ApiResponse response = Call("POST", "/v1/outcomes", admin_, c.body);
    EXPECT_EQ(response.status, c.status) << response.body;
    EXPECT_THAT(response.body, HasSubstr(c.error));
    EXPECT_EQ(Revision(), before);
  }
  beat.tasks = {TaskReportFor("train/main-0/1", wire::TaskPhase::kFailed, 1)};
  Heartbeat(node, beat);
  const std::string other_gpu = Uuid(node == "n1" ? "n2" : "n1", 0);
  const std::vector<Case> ended = {
      {"{\"job\": \"train\"", 400, "body: not valid JSON"},
      {R"({"job": "train", "attempt": 1, "exit_reason": "crashed"})", 400,
       "exit_reason: unknown \\\"crashed\\\""},
      {R"({"job": "train", "attempt": 2, "exit_reason": "hang"})", 400,
       "attempt: 2 (job \\\"train\\\" has had 1 run)"},
      {fmt::format(R"({{"job": "train", "attempt": 1, "exit_reason": "hang",
                      "xids": [{{"gpu": "{}", "xid": 79}}]}})",
                   other_gpu),
       400, fmt::format("xids[0].gpu: \\\"{}\\\" is not one of the job's GPUs", other_gpu)},
      {R"({"job": "train", "attempt": 1, "exit_reason": "hang",
           "health_events": [{"node": "n9", "check": "ib", "severity": "fail"}]})",
       400, "health_events[0].node: \\\"n9\\\" is not one of the job's nodes"},
  };
  for (const Case& c : ended) {
    SCOPED_TRACE(c.body);
    const int64_t before = Revision();
    const ApiResponse response = Call("POST", "/v1/outcomes", admin_, c.body);
    EXPECT_EQ(response.status, c.status) << response.body;
    EXPECT_THAT(response.body, HasSubstr(c.error));
    EXPECT_EQ(Revision(), before);
  }
  EXPECT_EQ(Outcome("train/1")->record.exit_reason, reliability::ExitReason::kAppError);

  const std::string member =
      *server_->authenticator().CreateToken(control::Role::kMember, "default", "alice");
  EXPECT_EQ(Call("POST", "/v1/outcomes", member,
                 R"({"job": "train", "attempt": 1, "exit_reason": "hang"})")
                .status,
            403);
  EXPECT_EQ(Call("GET", "/v1/reports/failures", member).status, 403);
}

// ---- attribution and quarantine -------------------------------------------------------------

TEST_F(ReliabilityControllerTest, ARepeatOffenderIsQuarantinedWithAnAuditEventAndItsJobRequeued) {
  const auto [node, gpu] = StartJob("victim");
  RecordRepeatOffender(node, gpu);
  Cycle();
  const Json doc = Get("/v1/nodes/" + node);
  for (int i = 0; i < kGpusPerNode; ++i) {
    EXPECT_EQ(doc["gpus"][i]["health"], i == gpu ? "Quarantined" : "Healthy") << i;
  }
  const Json other = Get("/v1/nodes/" + std::string(node == "n1" ? "n2" : "n1"));
  for (const Json& g : other["gpus"]) {
    EXPECT_EQ(g["health"], "Healthy");
  }
  EXPECT_THAT(NodeEvents(node),
              HasSubstr(fmt::format("gpu {} ({}) quarantined by attribution (attribution), drain "
                                    "now: 3 failures (3 named it)",
                                    gpu, Uuid(node, gpu))));
  // Drained at once: the job on it went back to the queue.
  EXPECT_EQ(Outcome("victim/1")->record.exit_reason, reliability::ExitReason::kPreempted);
  EXPECT_THAT(Get("/v1/jobs/victim/events").dump(), HasSubstr("then Pending: preempted: gpu"));

  const Json report = Get("/v1/reports/failures");
  ASSERT_GE(report["suspects"].size(), 1u);
  EXPECT_EQ(report["suspects"][0]["id"], Uuid(node, gpu));
  EXPECT_EQ(report["suspects"][0]["failures"], 3);
  EXPECT_EQ(report["suspects"][0]["xids"]["79"], 3);
  EXPECT_EQ(report["suspects"][0]["quarantined"], true);
  EXPECT_EQ(report["suspects"].size(), 1u) << "no healthy GPU is a suspect";
  EXPECT_EQ(report["summary"],
            "these 1 GPUs (12.50% of the fleet) were involved in 100.0% of failed jobs; "
            "quarantining them would have avoided 3 failures");
  EXPECT_EQ(report["suspects"][0]["leaf"], "leaf-0");
  ASSERT_EQ(report["quarantines"].size(), 1u);
  EXPECT_EQ(report["quarantines"][0]["source"], "attribution");
  EXPECT_EQ(report["quarantines"][0]["leaf"], "leaf-0");

  // Once is enough: the next steps change nothing (the first places the requeued job).
  Cycle();
  const int64_t before = Revision();
  Cycle();
  EXPECT_EQ(Revision(), before);
}

TEST_F(ReliabilityControllerTest, TheBudgetDeniesOnceAndChangesNothing) {
  control::ReliabilityOptions options = EveryCycle();
  options.budget = {0.0, 0.0};
  Start(options);
  RecordRepeatOffender("n1", 2);
  Cycle();
  EXPECT_EQ(Get("/v1/nodes/n1")["gpus"][2]["health"], "Healthy");
  const std::string events = NodeEvents("n1");
  EXPECT_THAT(events, HasSubstr("gpu 2 (GPU-n1-2) not quarantined by attribution"));
  EXPECT_THAT(events, HasSubstr("denied: fleet budget: 0 of 8 GPUs out, 1 more would pass the "
                                "limit of 0 (0%)"));
  const int64_t before = Revision();
  Cycle();
  EXPECT_EQ(Revision(), before) << "a denial is logged once";
  EXPECT_EQ(Get("/v1/reports/failures")["suspects"][0]["quarantined"], false);
}

TEST_F(ReliabilityControllerTest, ReleaseLetsTheDeviceStartClean) {
  RecordRepeatOffender("n1", 2);
  Cycle();
  ASSERT_EQ(Get("/v1/nodes/n1")["gpus"][2]["health"], "Quarantined");
  ASSERT_EQ(Call("POST", "/v1/nodes/n1/release", admin_, R"({"gpu": 2})").status, 200);
  Cycle();
  EXPECT_EQ(Get("/v1/nodes/n1")["gpus"][2]["health"], "Healthy") << "not quarantined again";
  EXPECT_TRUE(Get("/v1/reports/failures")["suspects"].empty());
  const Result<store::StoredObject> doc = store_.Get(control::kQuarantinesKind, "gpu:GPU-n1-2");
  ASSERT_OK(doc);
  EXPECT_EQ(Json::parse(doc->data)["state"], "released");
}

TEST_F(ReliabilityControllerTest, AnOperatorQuarantineShowsItsReasonEverywhereAtOnce) {
  ASSERT_EQ(Call("POST", "/v1/nodes/n2/quarantine", admin_,
                 R"({"gpu": 1, "reason": "fans loud, ticket 42"})")
                .status,
            200);
  // No cycle ran: the node, its events and the failure report come from the one commit.
  const Json gpu = Get("/v1/nodes/n2")["gpus"][1];
  EXPECT_EQ(gpu["health"], "Quarantined");
  EXPECT_EQ(gpu["quarantine_reason"], "fans loud, ticket 42");
  EXPECT_THAT(NodeEvents("n2"), HasSubstr("gpu 1 quarantined by root: fans loud, ticket 42"));
  const Json report = Get("/v1/reports/failures");
  ASSERT_EQ(report["quarantines"].size(), 1u);
  EXPECT_EQ(report["quarantines"][0]["reason"], "fans loud, ticket 42");
  EXPECT_EQ(report["quarantines"][0]["actor"], "root");
  EXPECT_EQ(report["quarantines"][0]["source"], "operator");
  EXPECT_EQ(report["quarantines"][0]["gpu"], 1);

  // An agent's heartbeat keeps the reason with the quarantine; a cycle does not restate it.
  wire::HeartbeatRequest beat;
  beat.gpus = {wire::GpuReport{.index = 1}};
  Heartbeat("n2", beat);
  Cycle();
  EXPECT_EQ(Get("/v1/nodes/n2")["gpus"][1]["quarantine_reason"], "fans loud, ticket 42");
  EXPECT_EQ(Get("/v1/reports/failures")["quarantines"][0]["reason"], "fans loud, ticket 42");

  ASSERT_EQ(Call("POST", "/v1/nodes/n2/release", admin_, R"({"gpu": 1})").status, 200);
  EXPECT_FALSE(Get("/v1/nodes/n2")["gpus"][1].contains("quarantine_reason"));
  EXPECT_TRUE(Get("/v1/reports/failures")["quarantines"].empty());
  const Result<store::StoredObject> doc = store_.Get(control::kQuarantinesKind, "gpu:GPU-n2-1");
  ASSERT_OK(doc);
  EXPECT_EQ(wire::ParseDocument(doc->data)["state"], "released");
  // Releasing a GPU in service again changes nothing of its record.
  const int64_t released_version = doc->version;
  ASSERT_EQ(Call("POST", "/v1/nodes/n2/release", admin_, R"({"gpu": 1})").status, 200);
  EXPECT_EQ(store_.Get(control::kQuarantinesKind, "gpu:GPU-n2-1")->version, released_version);
}

TEST_F(ReliabilityControllerTest, AQuarantineWithoutAReasonSaysWhoTookItOut) {
  ASSERT_EQ(Call("POST", "/v1/nodes/n2/quarantine", admin_, R"({"gpu": 0})").status, 200);
  EXPECT_EQ(Get("/v1/reports/failures")["quarantines"][0]["reason"], "quarantined by an operator");
  ApiResponse response = Call("POST", "/v1/nodes/n2/quarantine", admin_, R"({"reason": 7})");
  EXPECT_EQ(response.status, 400);
  EXPECT_THAT(response.body, HasSubstr("reason: 7 (must be a string)"));
  response = Call("POST", "/v1/nodes/n2/release", admin_, R"({"gpu": 0, "reason": "x"})");
  EXPECT_EQ(response.status, 400);
  EXPECT_THAT(response.body, HasSubstr("only a quarantine has one"));
}

TEST_F(ReliabilityControllerTest, ReleasingAnUnknownDeviceIsAClearErrorAndChangesNothing) {
  RecordRepeatOffender("n1", 2);
  Cycle();
  const int64_t before = Revision();
  ApiResponse response = Call("POST", "/v1/nodes/n9/release", admin_, R"({"gpu": 2})");
  EXPECT_EQ(response.status, 404);
  EXPECT_THAT(response.body, HasSubstr("node \\\"n9\\\" not found"));
  response = Call("POST", "/v1/nodes/n1/release", admin_, R"({"gpu": 9})");
  EXPECT_EQ(response.status, 400);
  EXPECT_THAT(response.body, HasSubstr("gpu: no GPU 9 on node \\\"n1\\\""));
  response = Call("POST", "/v1/nodes/n1/release", admin_, R"({"gpu": "two"})");
  EXPECT_EQ(response.status, 400);
  EXPECT_THAT(response.body, HasSubstr("gpu: \\\"two\\\" (must be an integer)"));
  EXPECT_EQ(Revision(), before);
  EXPECT_EQ(Get("/v1/nodes/n1")["gpus"][2]["health"], "Quarantined");
}

TEST_F(ReliabilityControllerTest, AHealthRuleQuarantineTakesTheSamePath) {
  control::ReliabilityOptions options = EveryCycle();
  options.quarantine_on_health_rule = true;
  Start(options);
  wire::HeartbeatRequest beat;
  beat.gpus = {GpuWith(1, GpuHealth::kUnhealthy, wire::DrainAction::kNow, kXid79)};
  Heartbeat("n2", beat);
  Cycle();
  EXPECT_EQ(Get("/v1/nodes/n2")["gpus"][1]["health"], "Quarantined");
  EXPECT_THAT(NodeEvents("n2"), HasSubstr("gpu 1 (GPU-n2-1) quarantined by health-rule "
                                          "(health-rule), drain now: xid 79 (drain-now)"));
  // The agent reporting the GPU healthy again (after a reset) does not release it.
  beat.gpus = {wire::GpuReport{.index = 1}};
  Heartbeat("n2", beat);
  Cycle();
  EXPECT_EQ(Get("/v1/nodes/n2")["gpus"][1]["health"], "Quarantined");
}

TEST_F(ReliabilityControllerTest, OperatorQuarantinesCountAgainstTheBudget) {
  ASSERT_EQ(Call("POST", "/v1/nodes/n2/quarantine", admin_, R"({"gpu": 0})").status, 200);
  ASSERT_EQ(Call("POST", "/v1/nodes/n2/quarantine", admin_, R"({"gpu": 1})").status, 200);
  RecordRepeatOffender("n1", 2);
  Cycle();
  EXPECT_EQ(Get("/v1/nodes/n1")["gpus"][2]["health"], "Healthy") << "2 of 8 out already";
  EXPECT_THAT(NodeEvents("n1"), HasSubstr("fleet budget: 2 of 8 GPUs out"));
  EXPECT_EQ(Get("/v1/reports/failures")["quarantines"].size(), 2u);
}

TEST_F(ReliabilityControllerTest, ADryRunReportsAndQuarantinesNothing) {
  control::ReliabilityOptions options = EveryCycle();
  options.rules.enabled = false;
  Start(options);
  RecordRepeatOffender("n1", 2);
  Cycle();
  EXPECT_EQ(Get("/v1/nodes/n1")["gpus"][2]["health"], "Healthy");
  EXPECT_EQ(Get("/v1/reports/failures")["suspects"][0]["id"], "GPU-n1-2");
}

TEST_F(ReliabilityControllerTest, TheStepRunsAtItsOwnInterval) {
  control::ReliabilityOptions options = EveryCycle();
  options.interval = std::chrono::minutes(5);
  Start(options);  // its first cycle ran the step
  RecordRepeatOffender("n1", 2);
  Cycle();
  EXPECT_EQ(Get("/v1/nodes/n1")["gpus"][2]["health"], "Healthy") << "not due yet";
  clock_.Advance(std::chrono::minutes(5));
  Heartbeat("n1");
  Heartbeat("n2");
  Cycle();
  EXPECT_EQ(Get("/v1/nodes/n1")["gpus"][2]["health"], "Quarantined");
}

TEST_F(ReliabilityControllerTest, AQuietFleetSkipsTheStepUntilAnInputIsWrittenOrAnHourPasses) {
  control::ReliabilityOptions options = EveryCycle();
  options.interval = std::chrono::minutes(5);
  Start(options);
  control::ReliabilityController& reliability = server_->reliability();
  clock_.Advance(std::chrono::minutes(5));
  ASSERT_TRUE(reliability.RunIfDue().has_value()) << "the registrations wrote nodes";
  clock_.Advance(std::chrono::minutes(5));
  Heartbeat("n1");
  Heartbeat("n2");
  EXPECT_FALSE(reliability.RunIfDue().has_value()) << "heartbeats that change nothing";

  RecordRepeatOffender("n1", 2);
  EXPECT_FALSE(reliability.RunIfDue().has_value()) << "not due yet";
  clock_.Advance(std::chrono::minutes(5));
  const std::optional<Result<control::ReliabilityStepResult>> step = reliability.RunIfDue();
  ASSERT_TRUE(step.has_value()) << "new outcomes";
  ASSERT_OK(*step);
  EXPECT_THAT((*step)->quarantined, ElementsAre("gpu GPU-n1-2"));
  // The quarantine it wrote is an input of the next step; after that one the fleet is quiet.
  clock_.Advance(std::chrono::minutes(5));
  EXPECT_TRUE(reliability.RunIfDue().has_value());
  for (int i = 0; i < 11; ++i) {
    clock_.Advance(std::chrono::minutes(5));
    EXPECT_FALSE(reliability.RunIfDue().has_value()) << "quiet, " << (i + 1) * 5 << " min";
  }
  clock_.Advance(std::chrono::minutes(5));
  EXPECT_TRUE(reliability.RunIfDue().has_value()) << "an hour after the last step that ran";
}

// ---- the loop: suspect, drain, diagnose, quarantine or readmit -------------------------------

// Nodes whose agents run diagnostics; the remediations the loop asks for are recorded.
class HealthLoopTest : public ReliabilityControllerTest {
 protected:
  void SetUp() override {
    diagnostics_ = true;
    StartLoop([](control::HealthLoopOptions&) {});
  }
  void StartLoop(const std::function<void(control::HealthLoopOptions&)>& adjust) {
    control::ReliabilityOptions options = EveryCycle();
    options.budget = {0.5, 0.5};
    options.loop.drain = control::LoopDrain::kAfterJob;
    options.loop.remediate = [this](const control::RemediationRequest& request) {
      remediations_.push_back(request);
      return std::string("hook started");
    };
    adjust(options.loop);
    Start(options);
  }

  // The diagnostics node `node` is asked to run now.
  std::vector<wire::DesiredDiagnostic> Asked(const std::string& node) {
    return Beat(node).diagnostics;
  }

  // Node `node` reports its one asked diagnostic ended with `phase`, then a cycle runs.
  void ReportDiagnostic(const std::string& node, wire::DiagnosticPhase phase,
                        const std::string& summary) {
    const std::vector<wire::DesiredDiagnostic> asked = Asked(node);
    ASSERT_EQ(asked.size(), 1u);
    wire::HeartbeatRequest beat;
    beat.diagnostics = {{.id = asked[0].id, .phase = phase, .summary = summary, .took_ms = 95000}};
    Heartbeat(node, beat);
    Cycle();
  }

  Json LoopEntry(const std::string& uuid) {
    const Json report = Get("/v1/reports/failures");
    for (const Json& entry : report["loop"]) {
      if (entry["id"] == uuid) {
        return entry;
      }
    }
    return Json();
  }

  std::vector<control::RemediationRequest> remediations_;
};

TEST_F(HealthLoopTest, AGpuFailingJobsIsDiagnosedThenQuarantinedWithARemediation) {
  RecordRepeatOffender("n1", 2);
  Cycle();
  const Json held = Get("/v1/nodes/n1")["gpus"][2];
  EXPECT_EQ(held["health"], "Healthy") << "diagnosed, not quarantined on statistics alone";
  ASSERT_TRUE(held.contains("diagnostic")) << held.dump();
  const std::vector<wire::DesiredDiagnostic> asked = Asked("n1");
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].gpu_index, 2);
  EXPECT_EQ(asked[0].gpu_uuid, Uuid("n1", 2));
  EXPECT_TRUE(Asked("n2").empty());

  // The diagnostic holds its GPU like a task: a job of 4 GPUs fits only on n2.
  Submit("four", 4);
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/four")["placements"][0]["node"], "n2");
  Submit("more", 4);
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/more")["state"], "Pending");

  ReportDiagnostic("n1", wire::DiagnosticPhase::kFailed, "cuda.pattern: 12 words differ");
  const Json gpu = Get("/v1/nodes/n1")["gpus"][2];
  EXPECT_EQ(gpu["health"], "Quarantined");
  EXPECT_FALSE(gpu.contains("diagnostic"));
  EXPECT_THAT(gpu["quarantine_reason"].get<std::string>(), HasSubstr("12 words differ"));
  ASSERT_EQ(remediations_.size(), 1u);
  EXPECT_EQ(remediations_[0].action, "reset-gpu");
  EXPECT_EQ(remediations_[0].node, "n1");
  EXPECT_EQ(remediations_[0].gpu, 2);
  EXPECT_TRUE(Asked("n1").empty());
  const Json entry = LoopEntry(Uuid("n1", 2));
  EXPECT_EQ(entry["phase"], "quarantined");
  const std::string events = entry["events"].dump();
  EXPECT_THAT(events, HasSubstr("suspect: 3 failures"));
  EXPECT_THAT(events, HasSubstr("quarantined by health-rule (diagnostic)"));
  EXPECT_THAT(events, HasSubstr("remediation reset-gpu (1 of 3 within 168h): hook started"));
  EXPECT_THAT(NodeEvents("n1"), HasSubstr("cuda.pattern: 12 words differ"));
}

TEST_F(HealthLoopTest, AGpuWhoseDiagnosticIsCleanIsReadmittedAndNotAskedAgain) {
  RecordRepeatOffender("n1", 2);
  Cycle();
  ReportDiagnostic("n1", wire::DiagnosticPhase::kPassed, "all checks passed");
  const Json gpu = Get("/v1/nodes/n1")["gpus"][2];
  EXPECT_EQ(gpu["health"], "Healthy");
  EXPECT_FALSE(gpu.contains("diagnostic"));
  EXPECT_TRUE(remediations_.empty());
  EXPECT_EQ(LoopEntry(Uuid("n1", 2))["phase"], "readmitted");
  Cycle();
  EXPECT_TRUE(Asked("n1").empty()) << "no new evidence since the clean diagnostic";
  Submit("eight", 4);
  Submit("eight-b", 4);
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/eight-b")["state"], "Scheduled") << "the GPU takes work again";
}

TEST_F(HealthLoopTest, ADiagnosticOnALostNodeEndsWithItsLease) {
  RecordRepeatOffender("n1", 2);
  Cycle();
  ASSERT_EQ(Asked("n1").size(), 1u);
  clock_.Advance(std::chrono::seconds(75));  // past the lease (40 s) and the stop grace (30 s)
  Heartbeat("n2");
  Cycle();
  EXPECT_FALSE(Get("/v1/nodes/n1")["gpus"][2].contains("diagnostic"));
  EXPECT_THAT(LoopEntry(Uuid("n1", 2))["events"].dump(), HasSubstr("dropped: node n1 lost"));
}

TEST_F(HealthLoopTest, AfterMaxRemediationsTheGpuNeedsAPerson) {
  StartLoop([](control::HealthLoopOptions& loop) { loop.max_remediations = 1; });
  RecordRepeatOffender("n1", 2);
  Cycle();
  ReportDiagnostic("n1", wire::DiagnosticPhase::kFailed, "nvml.ecc: XID 48");
  ASSERT_EQ(remediations_.size(), 1u);
  clock_.Advance(std::chrono::minutes(10));  // the reset is done; an operator releases it
  Heartbeat("n1");
  Heartbeat("n2");
  ASSERT_EQ(Call("POST", "/v1/nodes/n1/release", admin_, R"({"gpu": 2})").status, 200);
  Cycle();
  clock_.Advance(std::chrono::hours(1));
  Heartbeat("n1");
  Heartbeat("n2");
  AddRun("bad-again", "n1", 2, 0.5, reliability::ExitReason::kInfraError, {79});
  Cycle();
  ReportDiagnostic("n1", wire::DiagnosticPhase::kFailed, "nvml.ecc: XID 48");
  EXPECT_EQ(remediations_.size(), 1u) << "no further automatic action";
  const Json entry = LoopEntry(Uuid("n1", 2));
  EXPECT_EQ(entry["phase"], "needs-person");
  EXPECT_THAT(entry["events"].dump(), HasSubstr("needs a person"));
}

TEST_F(HealthLoopTest, TheCircuitBreakerHoldsWhileTooMuchOfTheFleetWentOut) {
  StartLoop([](control::HealthLoopOptions& loop) { loop.breaker_share = 0.2; });
  for (const int gpu : {0, 1}) {
    ASSERT_EQ(Call("POST", "/v1/nodes/n2/quarantine", admin_, fmt::format(R"({{"gpu": {}}})", gpu))
                  .status,
              200);
  }
  Cycle();  // 2 of 8 GPUs out within the window: more than 20 %
  RecordRepeatOffender("n1", 2);
  Cycle();
  EXPECT_FALSE(Get("/v1/nodes/n1")["gpus"][2].contains("diagnostic"));
  EXPECT_EQ(Get("/v1/nodes/n1")["gpus"][2]["health"], "Healthy");
  const Json breaker = Get("/v1/reports/failures")["breaker"];
  EXPECT_EQ(breaker["open"], true) << breaker.dump();
  EXPECT_THAT(Call("GET", "/metrics", admin_).body,
              HasSubstr("gpufleet_reliability_breaker_open 1"));

  clock_.Advance(std::chrono::seconds(301));  // the quarantines leave the window
  Heartbeat("n1");
  Heartbeat("n2");
  Cycle();
  EXPECT_EQ(Get("/v1/reports/failures")["breaker"]["open"], false);
  EXPECT_TRUE(Get("/v1/nodes/n1")["gpus"][2].contains("diagnostic"));
  const Result<std::vector<store::StoredEvent>> events =
      store_.Events(control::kClusterKind, "reliability-breaker");
  ASSERT_OK(events);
  ASSERT_EQ(events->size(), 2u);
  EXPECT_THAT((*events)[0].text, HasSubstr("circuit breaker open: 2 of 8 GPUs"));
  EXPECT_THAT((*events)[1].text, HasSubstr("circuit breaker closed"));
}

// Starts one-GPU jobs until one runs on n1's GPU 2; returns its name.
class HealthLoopDrainTest : public HealthLoopTest {
 protected:
  std::string RunJobOnSuspect() {
    for (int i = 0; i < 8; ++i) {
      const std::string name = fmt::format("job-{}", i);
      const auto [node, gpu] = StartJob(name);
      if (node == "n1" && gpu == 2) {
        return name;
      }
    }
    ADD_FAILURE() << "no job on n1's GPU 2";
    return "";
  }
};

TEST_F(HealthLoopDrainTest, DrainNowRequeuesTheRunExpedited) {
  StartLoop([](control::HealthLoopOptions& loop) { loop.drain = control::LoopDrain::kNow; });
  const std::string job = RunJobOnSuspect();
  RecordRepeatOffender("n1", 2);
  Cycle();
  const Json doc = Get("/v1/jobs/" + job);
  EXPECT_EQ(doc["state"], "Stopping") << doc.dump();
  EXPECT_THAT(doc["reason"].get<std::string>(), HasSubstr("drained for diagnostic"));
  EXPECT_TRUE(doc.contains("expedited"));
}

TEST_F(HealthLoopDrainTest, DrainAfterTheJobLetsItRunAndTheAgentWaits) {
  const std::string job = RunJobOnSuspect();
  RecordRepeatOffender("n1", 2);
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/" + job)["state"], "Running");
  EXPECT_FALSE(Get("/v1/jobs/" + job).contains("notice"));
  EXPECT_EQ(Asked("n1").size(), 1u) << "asked now; the agent starts it once the task ends";
}

TEST_F(HealthLoopDrainTest, DrainAfterATimeoutGivesACheckpointNoticeThenStops) {
  StartLoop([](control::HealthLoopOptions& loop) {
    loop.drain = control::LoopDrain::kAfterTimeout;
    loop.drain_timeout = std::chrono::seconds(20);
  });
  const std::string job = RunJobOnSuspect();
  RecordRepeatOffender("n1", 2);
  Cycle();
  Json doc = Get("/v1/jobs/" + job);
  EXPECT_EQ(doc["state"], "Running");
  ASSERT_TRUE(doc.contains("notice")) << doc.dump();
  EXPECT_EQ(doc["notice"]["signal"], "SIGUSR1");
  clock_.Advance(std::chrono::seconds(21));
  Heartbeat("n1");
  Heartbeat("n2");
  Cycle();
  doc = Get("/v1/jobs/" + job);
  EXPECT_EQ(doc["state"], "Stopping") << doc.dump();
  EXPECT_THAT(doc["reason"].get<std::string>(), HasSubstr("checkpoint grace ran out"));
}

// ---- expedited requeue ------------------------------------------------------------------------

TEST_F(ReliabilityControllerTest, AGangANodeFailureEndedGoesBeforeOtherPendingWork) {
  const auto run = [&](const std::string& name, const std::string& node) {
    Cycle();
    ASSERT_EQ(Get("/v1/jobs/" + name)["placements"][0]["node"], node);
    wire::HeartbeatRequest beat;
    beat.tasks = {TaskReportFor(fmt::format("{}/main-0/1", name), wire::TaskPhase::kRunning)};
    Heartbeat(node, beat);
  };
  Submit("blocker", 4, "n2");
  run("blocker", "n2");
  Submit("waiting", 4, "n2");  // submitted before the gang, at its priority
  Cycle();
  ASSERT_EQ(Get("/v1/jobs/waiting")["state"], "Pending");
  Submit("gang", 4);
  run("gang", "n1");

  // The gang's node goes silent: NotReady, then its lease and stop grace pass (old run fenced).
  wire::HeartbeatRequest running;
  running.tasks = {TaskReportFor("blocker/main-0/1", wire::TaskPhase::kRunning)};
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(std::chrono::seconds(30));
    Heartbeat("n2", running);
    Cycle();
  }
  Json gang = Get("/v1/jobs/gang");
  ASSERT_EQ(gang["state"], "Pending") << gang.dump();
  EXPECT_THAT(gang["expedited"].get<std::string>(), HasSubstr("NotReady"));

  wire::HeartbeatRequest done;
  done.tasks = {TaskReportFor("blocker/main-0/1", wire::TaskPhase::kSucceeded)};
  Heartbeat("n2", done);
  Cycle();
  gang = Get("/v1/jobs/gang");
  EXPECT_EQ(gang["state"], "Scheduled") << gang.dump();
  EXPECT_EQ(gang["placements"][0]["node"], "n2") << "onto the healthy node";
  EXPECT_FALSE(gang.contains("expedited"));
  EXPECT_EQ(Get("/v1/jobs/waiting")["state"], "Pending");
}

TEST(ReliabilityOptions, BadOptionsAreNamed) {
  control::ReliabilityOptions options;
  options.budget.max_leaf_share = 2;
  EXPECT_THAT(options.Validate(), gpufleet::testing::StatusIs(
                                      StatusCode::kInvalidArgument,
                                      "reliability.budget.max_leaf_share: 2 (must be in [0, 1])"));
  options = control::ReliabilityOptions();
  options.attribution.alpha = 0;
  EXPECT_THAT(options.Validate(),
              gpufleet::testing::StatusIs(StatusCode::kInvalidArgument,
                                          HasSubstr("reliability.attribution.alpha")));
  options = control::ReliabilityOptions();
  options.interval = std::chrono::milliseconds(-1);
  EXPECT_THAT(options.Validate(), gpufleet::testing::StatusIs(StatusCode::kInvalidArgument,
                                                              HasSubstr("reliability.interval")));
  options = control::ReliabilityOptions();
  options.quiet_interval = std::chrono::milliseconds(-1);
  EXPECT_THAT(options.Validate(),
              gpufleet::testing::StatusIs(StatusCode::kInvalidArgument,
                                          HasSubstr("reliability.quiet_interval: -1 ms")));
  options = control::ReliabilityOptions();
  options.loop.breaker_share = 0;
  EXPECT_THAT(options.Validate(),
              gpufleet::testing::StatusIs(StatusCode::kInvalidArgument,
                                          "reliability.loop.breaker_share: 0 (must be in (0, 1])"));
}

}  // namespace
}  // namespace gpufleet::api
