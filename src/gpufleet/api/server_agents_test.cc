// SPDX-License-Identifier: Apache-2.0
// The agent protocol through ApiServer::Handle, on a fake clock: registration, desired tasks,
// task states, NotReady nodes, drain-now GPUs, and bad reports.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/auth.h"
#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/api_request.h"
#include "gpufleet/control/mig_layout_controller.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/plugins/filters.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/wire/agent_protocol.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {
namespace {

using Json = nlohmann::json;
using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// A node of 8 H100s in leaf `leaf` as its agent describes it; its agent runs containers with
// `container_runtime` (empty: processes only).
wire::RegisterRequest Inventory(const std::string& name, const std::string& leaf,
                                const std::string& container_runtime = "podman") {
  wire::RegisterRequest request;
  request.topology_levels = {"block", "leaf"};
  request.node.id = NodeId(name);
  request.node.capacity = {128000, 1024 * 1024};
  request.node.labels = {{std::string(kDriverVersionLabel), "550.54"}};
  if (!container_runtime.empty()) {
    request.node.labels[std::string(kContainerRuntimeLabel)] = container_runtime;
  }
  request.node.topology = {"block-0", leaf};
  for (int i = 0; i < 8; ++i) {
    Gpu gpu;
    gpu.index = i;
    gpu.uuid = GpuUuid(fmt::format("GPU-{}-{}", name, i));
    gpu.model = "H100-80GB";
    gpu.memory_mib = 81559;
    request.node.gpus.push_back(gpu);
  }
  return request;
}

// `request` with its GPUs listed, and numbered by NVML, the other way round.
wire::RegisterRequest Reversed(wire::RegisterRequest request) {
  std::reverse(request.node.gpus.begin(), request.node.gpus.end());
  for (size_t i = 0; i < request.node.gpus.size(); ++i) {
    request.node.gpus[i].index = static_cast<int>(i);
  }
  return request;
}

int IndexOf(const wire::RegisterRequest& request, const std::string& uuid) {
  for (const Gpu& gpu : request.node.gpus) {
    if (gpu.uuid.value() == uuid) {
      return gpu.index;
    }
  }
  return -1;
}

// `image`: the tasks run in a container of that image (its line is left out when empty).
std::string AgentsJobYaml(const std::string& name, int replicas, int gpus,
                          const std::string& on_node_failure = "requeue",
                          const std::string& image = "") {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}}}
spec:
  onNodeFailure: {}
  tasks:
    - name: workers
      replicas: {}
      command: [python, train.py, --epochs, "3"]
      env: {{NCCL_DEBUG: INFO}}{}
      resources:
        gpus: {{count: {}}}
)",
                     name, on_node_failure, replicas,
                     image.empty() ? "" : fmt::format("\n      image: {}", image), gpus);
}

class AgentProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StartServer();
    admin_ = *server_->authenticator().CreateToken(control::Role::kAdmin, "", "root");
    agent_ = *server_->authenticator().CreateToken(control::Role::kAgent, "", "agents");
  }

  // A server on the fixture's store: a new one stands for a new leader (or a restart), which
  // knows only what the store holds.
  void StartServer() {
    server_.reset();
    Result<std::unique_ptr<ApiServer>> server =
        ApiServer::Create({.store = store_,
                           .catalog = catalog_,
                           .clock = clock_,
                           .policy = "best-fit",
                           .heartbeat_interval = std::chrono::seconds(10),
                           .node_timeout = std::chrono::seconds(40)});
    ASSERT_OK(server);
    server_ = std::move(server).value();
  }

  ApiResponse Call(const std::string& method, const std::string& path, const std::string& token,
                   const std::string& body = "") {
    ApiRequest request;
    request.method = method;
    request.path = path;
    request.authorization = token.empty() ? "" : "Bearer " + token;
    request.body = body;
    return server_->Handle(request);
  }

  // Registers with the node's credential once it has one, else with the join token, and keeps
  // the credential the server gives in exchange (as the agent does).
  wire::AgentReply Register(const wire::RegisterRequest& request) {
    const std::string& node = request.node.id.value();
    const std::string token = node_tokens_.count(node) > 0 ? node_tokens_[node] : agent_;
    const ApiResponse response =
        Call("POST", "/v1/agents/register", token, wire::RegisterRequestToJson(request));
    EXPECT_EQ(response.status, 200) << response.body;
    Result<wire::AgentReply> reply = wire::ParseAgentReply(response.body);
    EXPECT_OK(reply);
    if (reply.ok() && !reply->node_token.empty()) {
      node_tokens_[node] = reply->node_token;
    }
    return reply.ok() ? *reply : wire::AgentReply{};
  }

  wire::AgentReply Heartbeat(const std::string& node, const wire::HeartbeatRequest& request = {}) {
    const ApiResponse response = Call("POST", fmt::format("/v1/agents/{}/heartbeat", node),
                                      node_tokens_.count(node) > 0 ? node_tokens_[node] : agent_,
                                      wire::HeartbeatRequestToJson(request));
    EXPECT_EQ(response.status, 200) << response.body;
    Result<wire::AgentReply> reply = wire::ParseAgentReply(response.body);
    EXPECT_OK(reply);
    return reply.ok() ? *reply : wire::AgentReply{};
  }

  Json Get(const std::string& path) {
    const ApiResponse response = Call("GET", path, admin_);
    EXPECT_EQ(response.status, 200) << response.body;
    return Json::parse(response.body, nullptr, false);
  }

  void Submit(const std::string& yaml) {
    const ApiResponse response = Call("POST", "/v1/jobs", admin_, yaml);
    ASSERT_EQ(response.status, 201) << response.body;
  }

  void Cycle() { ASSERT_OK(server_->RunSchedulingCycle()); }

  // The desired task of `job` in `reply`; an empty one (and a failure) when there is none.
  static wire::DesiredTask TaskOf(const wire::AgentReply& reply, const std::string& job) {
    for (const wire::DesiredTask& task : reply.tasks) {
      if (task.job == job) {
        return task;
      }
    }
    ADD_FAILURE() << "no task of job " << job << " in the reply";
    return wire::DesiredTask{};
  }

  static wire::TaskReport Report(const std::string& id, wire::TaskPhase phase, int exit_code = 0) {
    wire::TaskReport report;
    report.id = id;
    report.phase = phase;
    report.exit_code = exit_code;
    return report;
  }

  const GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_;
  store::InMemoryStateStore store_;
  std::unique_ptr<ApiServer> server_;
  std::string admin_;
  std::string agent_;                               // a fleet-wide join token
  std::map<std::string, std::string> node_tokens_;  // the credential each node was given
};

TEST_F(AgentProtocolTest, RegisteredNodeIsReadyAndRunsItsTasksToSuccess) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  const Json node = Get("/v1/nodes/node-a");
  EXPECT_EQ(node["state"], "Ready");
  EXPECT_EQ(node["gpus"].size(), 8u);
  EXPECT_EQ(node["labels"][std::string(kDriverVersionLabel)], "550.54");

  Submit(AgentsJobYaml("train", 2, 4));
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Scheduled");

  wire::AgentReply reply = Heartbeat("node-a");
  EXPECT_EQ(reply.heartbeat_interval_ms, 10000);
  ASSERT_EQ(reply.tasks.size(), 2u);
  const wire::DesiredTask& task = reply.tasks[0];
  EXPECT_EQ(task.id, "train/workers-0/1");
  EXPECT_EQ(task.job, "train");
  EXPECT_EQ(task.command, (std::vector<std::string>{"python", "train.py", "--epochs", "3"}));
  EXPECT_EQ(task.env.at("NCCL_DEBUG"), "INFO");
  ASSERT_EQ(task.gpu_uuids.size(), 4u);
  EXPECT_THAT(task.gpu_uuids[0], HasSubstr("GPU-node-a-"));
  EXPECT_EQ(task.gpu_milli, 4000);
  // The request the scheduler placed is what the node's cgroup limits.
  const Json placement = Get("/v1/jobs/train")["placements"][0];
  EXPECT_EQ(task.cpu_milli, placement.value("cpu_milli", -1));
  EXPECT_EQ(task.memory_mib, placement.value("memory_mib", -1));

  // One task running is not yet a running gang; both are.
  wire::HeartbeatRequest beat;
  beat.tasks = {Report("train/workers-0/1", wire::TaskPhase::kRunning)};
  Heartbeat("node-a", beat);
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Scheduled");
  beat.tasks.push_back(Report("train/workers-1/1", wire::TaskPhase::kRunning));
  Heartbeat("node-a", beat);
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Running");

  beat.tasks = {Report("train/workers-0/1", wire::TaskPhase::kSucceeded),
                Report("train/workers-1/1", wire::TaskPhase::kSucceeded)};
  reply = Heartbeat("node-a", beat);
  EXPECT_TRUE(reply.tasks.empty());
  const Json job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Succeeded");
  EXPECT_TRUE(job["placements"].empty());

  // Its GPUs are free: a job wanting all 8 fits.
  Submit(AgentsJobYaml("whole-node", 1, 8));
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/whole-node")["state"], "Scheduled");
}

// A fleet coming up: agents register at once, racing to record the topology and their nodes;
// every one is registered and Ready, none refused because another created the topology first.
TEST_F(AgentProtocolTest, AgentsRegisteringAtOnceAreAllRegistered) {
  Cycle();
  constexpr int kAgents = 8;
  std::vector<int> statuses(kAgents, 0);
  std::vector<std::thread> agents;
  for (int i = 0; i < kAgents; ++i) {
    agents.emplace_back([&, i] {
      const wire::RegisterRequest request =
          Inventory(fmt::format("node-{}", i), fmt::format("leaf-{}", i % 2));
      statuses[static_cast<size_t>(i)] =
          Call("POST", "/v1/agents/register", agent_, wire::RegisterRequestToJson(request)).status;
    });
  }
  for (std::thread& agent : agents) {
    agent.join();
  }
  EXPECT_THAT(statuses, ::testing::Each(200));
  for (int i = 0; i < kAgents; ++i) {
    EXPECT_EQ(Get(fmt::format("/v1/nodes/node-{}", i))["state"], "Ready") << i;
  }
}

TEST_F(AgentProtocolTest, ANonZeroExitFailsTheGangAndStopsItsOtherTasks) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("train", 2, 4));
  Cycle();
  wire::HeartbeatRequest beat;
  beat.tasks = {Report("train/workers-0/1", wire::TaskPhase::kRunning),
                Report("train/workers-1/1", wire::TaskPhase::kFailed, 3)};
  wire::AgentReply reply = Heartbeat("node-a", beat);
  EXPECT_TRUE(reply.tasks.empty()) << "workers-0 is no longer wanted";
  Json job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Stopping");
  EXPECT_EQ(job["stopping"]["then"], "Failed");
  EXPECT_THAT(job["reason"].get<std::string>(),
              HasSubstr("task workers-1 on node-a failed: exit code 3"));

  // workers-0 still runs on its 4 GPUs: a job wanting the whole node waits.
  Submit(AgentsJobYaml("whole-node", 1, 8));
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/whole-node")["state"], "Pending");

  // The agent reports workers-0 ended after SIGTERM: only now are its GPUs free.
  beat.tasks = {Report("train/workers-0/1", wire::TaskPhase::kFailed, 143)};
  reply = Heartbeat("node-a", beat);
  job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Failed");
  EXPECT_THAT(job["reason"].get<std::string>(),
              HasSubstr("task workers-1 on node-a failed: exit code 3"));
  EXPECT_TRUE(job["placements"].empty());
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/whole-node")["state"], "Scheduled");
}

TEST_F(AgentProtocolTest, ACancelledJobsGpusGoToTheNextJobOnlyOnceItsTaskHasExited) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("slow-exit", 1, 8));
  Cycle();
  wire::HeartbeatRequest beat;
  beat.tasks = {Report("slow-exit/workers-0/1", wire::TaskPhase::kRunning)};
  ASSERT_EQ(Heartbeat("node-a", beat).tasks.size(), 1u);
  ASSERT_EQ(Call("POST", "/v1/jobs/slow-exit/cancel", admin_).status, 200);
  Submit(AgentsJobYaml("next", 1, 8));
  // The task takes 15 s to exit after SIGTERM: until the agent says it has, nothing else is
  // placed on its GPUs and the node is told to run nothing.
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(std::chrono::seconds(5));
    EXPECT_TRUE(Heartbeat("node-a", beat).tasks.empty());
    Cycle();
    EXPECT_EQ(Get("/v1/jobs/slow-exit")["state"], "Stopping");
    EXPECT_EQ(Get("/v1/jobs/next")["state"], "Pending");
  }
  beat.tasks = {Report("slow-exit/workers-0/1", wire::TaskPhase::kFailed, 143)};
  Heartbeat("node-a", beat);
  EXPECT_EQ(Get("/v1/jobs/slow-exit")["state"], "Cancelled");
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/next")["state"], "Scheduled");
  const wire::AgentReply reply = Heartbeat("node-a");
  ASSERT_EQ(reply.tasks.size(), 1u);
  EXPECT_EQ(reply.tasks[0].id, "next/workers-0/1");
}

TEST_F(AgentProtocolTest, AReportDeliveredLateSaysNothingByATasksAbsence) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("train", 1, 8));
  Cycle();
  wire::HeartbeatRequest beat;
  beat.sequence = 20;
  beat.tasks = {Report("train/workers-0/1", wire::TaskPhase::kRunning)};
  Heartbeat("node-a", beat);
  ASSERT_EQ(Call("POST", "/v1/jobs/train/cancel", admin_).status, 200);
  // A heartbeat the agent sent before it started the task arrives now: it does not list the task,
  // but that proves nothing, and the job keeps its GPUs.
  wire::HeartbeatRequest late;
  late.sequence = 10;
  Heartbeat("node-a", late);
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Stopping");
  wire::HeartbeatRequest fresh;
  fresh.sequence = 30;
  Heartbeat("node-a", fresh);
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Cancelled");
}

// ---- agents act for their own node only --------------------------------------------------------

TEST_F(AgentProtocolTest, AJoinTokenIsExchangedForANodeCredentialThatActsForThatNodeAlone) {
  Cycle();
  const wire::AgentReply first = Register(Inventory("node-a", "leaf-0"));
  ASSERT_FALSE(first.node_token.empty()) << "the join token is exchanged at first registration";
  Register(Inventory("node-b", "leaf-0"));
  Submit(AgentsJobYaml("train", 1, 8));
  Cycle();
  const std::string placed = Get("/v1/jobs/train")["placements"][0]["node"];
  const std::string other = placed == "node-a" ? "node-b" : "node-a";
  // Each agent uses its credential: the nodes' credentials are claimed.
  Heartbeat(placed);
  Heartbeat(other);

  // The join token can no longer act for a registered node: it cannot register as it (and so
  // receive its tasks with their command and env), nor heartbeat for it.
  ApiResponse response = Call("POST", "/v1/agents/register", agent_,
                              wire::RegisterRequestToJson(Inventory(placed, "leaf-0")));
  EXPECT_EQ(response.status, 403);
  EXPECT_THAT(response.body, HasSubstr("has its own credential"));
  response = Call("POST", fmt::format("/v1/agents/{}/heartbeat", placed), agent_,
                  wire::HeartbeatRequestToJson({}));
  EXPECT_EQ(response.status, 403);
  // Another node's credential cannot either, nor report the task Failed through its own node.
  response = Call("POST", fmt::format("/v1/agents/{}/heartbeat", placed), node_tokens_[other],
                  wire::HeartbeatRequestToJson({}));
  EXPECT_EQ(response.status, 403);
  EXPECT_THAT(response.body, HasSubstr("acts for node " + other + " only"));
  wire::HeartbeatRequest forged;
  forged.tasks = {Report("train/workers-0/1", wire::TaskPhase::kFailed, 1)};
  Heartbeat(other, forged);
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Scheduled");
  // The node's own credential still works, and an admin's node token too.
  EXPECT_EQ(Heartbeat(placed).tasks.size(), 1u);
  const std::string issued =
      *server_->authenticator().CreateToken(control::Role::kAgent, "", "ops", placed);
  response = Call("POST", fmt::format("/v1/agents/{}/heartbeat", placed), issued,
                  wire::HeartbeatRequestToJson({}));
  EXPECT_EQ(response.status, 200);
}

// Found by `gpufleet sim chaos`: a registration answered 503 while the server was starting left
// a credential behind that the agent never received, and the join token was refused for the node
// from then on. The same for a registration whose answer is lost on the way: until the agent has
// used its credential, the join token may register the node again, and the new credential
// replaces the old one.
TEST_F(AgentProtocolTest, ARegistrationWhoseAnswerNeverArrivedCanBeRepeated) {
  ApiResponse response = Call("POST", "/v1/agents/register", agent_,
                              wire::RegisterRequestToJson(Inventory("node-a", "leaf-0")));
  EXPECT_EQ(response.status, 503) << response.body;  // before the first cycle
  Cycle();
  response = Call("POST", "/v1/agents/register", agent_,
                  wire::RegisterRequestToJson(Inventory("node-a", "leaf-0")));
  ASSERT_EQ(response.status, 200) << response.body;
  const std::string lost = wire::ParseAgentReply(response.body)->node_token;
  // That answer is lost: the agent registers again with its join token and gets a new credential.
  const wire::AgentReply again = Register(Inventory("node-a", "leaf-0"));
  ASSERT_FALSE(again.node_token.empty());
  EXPECT_NE(again.node_token, lost);
  response = Call("POST", "/v1/agents/node-a/heartbeat", lost, wire::HeartbeatRequestToJson({}));
  EXPECT_EQ(response.status, 401) << "the replaced credential is revoked";
  Heartbeat("node-a");  // claims the new one
  response = Call("POST", "/v1/agents/register", agent_,
                  wire::RegisterRequestToJson(Inventory("node-a", "leaf-0")));
  EXPECT_EQ(response.status, 403);
  EXPECT_THAT(response.body, HasSubstr("has its own credential"));
  Result<store::StoredObject> node = store_.Get(control::kNodesKind, "node-a");
  ASSERT_OK(node);
  EXPECT_FALSE(
      wire::ParseDocument(node->data).contains(std::string(control::kCredentialUnclaimed)));
}

// Found by `gpufleet sim chaos`: a heartbeat sent while a task ran and delivered after the one
// that reported its end put the task back to Running, and its agent started it again on GPUs the
// next job had been given.
TEST_F(AgentProtocolTest, AReportDeliveredLateDoesNotUndoATasksEnd) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("first", 1, 8));
  Cycle();
  wire::HeartbeatRequest running;
  running.sequence = 10;
  running.tasks = {Report("first/workers-0/1", wire::TaskPhase::kRunning)};
  wire::HeartbeatRequest ended;
  ended.sequence = 20;
  ended.tasks = {Report("first/workers-0/1", wire::TaskPhase::kSucceeded)};
  Heartbeat("node-a", ended);
  EXPECT_EQ(Get("/v1/jobs/first")["state"], "Succeeded");
  Submit(AgentsJobYaml("second", 1, 8));
  Cycle();
  // The earlier heartbeat arrives late: the finished task stays finished and is not wanted.
  const wire::AgentReply reply = Heartbeat("node-a", running);
  EXPECT_EQ(Get("/v1/jobs/first")["state"], "Succeeded");
  ASSERT_EQ(reply.tasks.size(), 1u);
  EXPECT_EQ(reply.tasks[0].job, "second");
}

// A gang's finished task stays finished while its other task still runs.
TEST_F(AgentProtocolTest, AReportDeliveredLateDoesNotRestartAFinishedTaskOfARunningGang) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("gang", 2, 4));
  Cycle();
  wire::HeartbeatRequest running;
  running.sequence = 10;
  running.tasks = {Report("gang/workers-0/1", wire::TaskPhase::kRunning),
                   Report("gang/workers-1/1", wire::TaskPhase::kRunning)};
  wire::HeartbeatRequest one_ended;
  one_ended.sequence = 20;
  one_ended.tasks = {Report("gang/workers-0/1", wire::TaskPhase::kSucceeded),
                     Report("gang/workers-1/1", wire::TaskPhase::kRunning)};
  Heartbeat("node-a", running);
  Heartbeat("node-a", one_ended);
  const wire::AgentReply reply = Heartbeat("node-a", running);
  ASSERT_EQ(reply.tasks.size(), 1u) << "only the task still running is wanted";
  EXPECT_EQ(reply.tasks[0].id, "gang/workers-1/1");
}

// An admin may make a node's credential before the node first registers (docs/agent.md,
// "Credentials"): from then on a join token cannot claim the node, so that only the holder of
// that credential acts for it. Revoking it frees the node for a join token again.
TEST_F(AgentProtocolTest, AJoinTokenCannotClaimANodeWhoseCredentialAnAdminMade) {
  Cycle();
  const Json made = wire::ParseDocument(
      Call("POST", "/v1/tokens", admin_, R"({"role": "agent", "node": "node-c", "name": "ops"})")
          .body);
  ASSERT_TRUE(made.contains("token")) << made.dump();
  ApiResponse response = Call("POST", "/v1/agents/register", agent_,
                              wire::RegisterRequestToJson(Inventory("node-c", "leaf-0")));
  EXPECT_EQ(response.status, 403) << response.body;
  EXPECT_THAT(response.body, HasSubstr("node node-c has its own credential"));
  // The admin's credential registers it, and no second credential was issued.
  response = Call("POST", "/v1/agents/register", made["token"].get<std::string>(),
                  wire::RegisterRequestToJson(Inventory("node-c", "leaf-0")));
  ASSERT_EQ(response.status, 200) << response.body;
  EXPECT_FALSE(wire::ParseDocument(response.body).contains("node_token"));
  const auto agent_tokens_of = [&](const std::string& node) {
    int count = 0;
    const Json tokens = wire::ParseDocument(Call("GET", "/v1/tokens", admin_).body);
    for (const Json& token : tokens["items"]) {
      count += token.value("node", "") == node ? 1 : 0;
    }
    return count;
  };
  EXPECT_EQ(agent_tokens_of("node-c"), 1);
  // Its id is for admins, who revoke it; a member does not see it.
  EXPECT_EQ(wire::ParseDocument(Call("GET", "/v1/nodes/node-c", admin_).body)["credential"],
            made["id"]);
  const std::string member =
      *server_->authenticator().CreateToken(control::Role::kMember, "team-x", "m");
  for (const std::string path : {"/v1/nodes/node-c", "/v1/nodes"}) {
    const ApiResponse seen = Call("GET", path, member);
    EXPECT_EQ(seen.status, 200);
    EXPECT_THAT(seen.body, Not(HasSubstr("credential"))) << path;
  }

  // Another node: its credential made and revoked before it registered. A join token may claim
  // it, and a node whose name extends it ("node-d1") is not taken for it.
  const Json revoked = wire::ParseDocument(
      Call("POST", "/v1/tokens", admin_, R"({"role": "agent", "node": "node-d1", "name": "x"})")
          .body);
  ASSERT_EQ(
      Call("POST", fmt::format("/v1/tokens/{}/revoke", revoked["id"].get<std::string>()), admin_)
          .status,
      200);
  Call("POST", "/v1/tokens", admin_, R"({"role": "agent", "node": "node-d12", "name": "y"})");
  EXPECT_EQ(Register(Inventory("node-d1", "leaf-0")).node_token.empty(), false);
  EXPECT_EQ(agent_tokens_of("node-d1"), 1);
}

// ---- no registration halts the fleet ------------------------------------------------------------

TEST_F(AgentProtocolTest, RegistrationsTheSchedulerCannotTakeAreRefusedNamingTheField) {
  Cycle();
  const auto refusal = [&](const wire::RegisterRequest& request) {
    const ApiResponse response =
        Call("POST", "/v1/agents/register", agent_, wire::RegisterRequestToJson(request));
    EXPECT_EQ(response.status / 100, 4) << response.body;
    return response.body;
  };
  wire::RegisterRequest many = Inventory("node-big", "leaf-0");
  for (int i = 8; i < 65; ++i) {
    Gpu gpu = many.node.gpus[0];
    gpu.index = i;
    gpu.uuid = GpuUuid(fmt::format("GPU-node-big-{}", i));
    many.node.gpus.push_back(gpu);
  }
  EXPECT_THAT(refusal(many), HasSubstr("node.gpus: 65 GPUs, at most 64"));
  EXPECT_THAT(refusal(Inventory("../x", "leaf-0")), HasSubstr("node.name"));
  wire::RegisterRequest twice = Inventory("node-twice", "leaf-0");
  twice.node.gpus[1].index = 0;
  EXPECT_THAT(refusal(twice), HasSubstr("gpus[1].index: 0 appears twice on the node"));
  wire::RegisterRequest long_uuid = Inventory("node-long", "leaf-0");
  long_uuid.node.gpus[2].uuid = GpuUuid("GPU-" + std::string(92, 'f'));
  EXPECT_THAT(refusal(long_uuid), HasSubstr("node.gpus[2].uuid: 96 bytes, at most 95"));
  Register(Inventory("node-a", "leaf-0"));
  wire::RegisterRequest thief = Inventory("node-b", "leaf-0");
  thief.node.gpus[3].uuid = GpuUuid("GPU-node-a-3");
  EXPECT_THAT(refusal(thief), HasSubstr("GPU-node-a-3 is a GPU of node node-a"));
  // Nothing of the refused nodes was stored, and the fleet schedules as before.
  EXPECT_EQ(Get("/v1/nodes")["items"].size(), 1u);
  Submit(AgentsJobYaml("train", 1, 8));
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Scheduled");
}

TEST_F(AgentProtocolTest, ANodeRegisteringAgainWithoutAGpuEndsTheRunsOnIt) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("train", 1, 8));
  Cycle();
  wire::HeartbeatRequest beat;
  beat.tasks = {Report("train/workers-0/1", wire::TaskPhase::kRunning)};
  Heartbeat("node-a", beat);
  wire::RegisterRequest fewer = Inventory("node-a", "leaf-0");
  fewer.node.gpus.pop_back();
  fewer.tasks = beat.tasks;
  const wire::AgentReply reply = Register(fewer);
  EXPECT_TRUE(reply.tasks.empty()) << "no longer wanted: its GPU is gone";
  const Json job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Stopping");
  EXPECT_THAT(job["reason"].get<std::string>(),
              HasSubstr("node-a registered again without its GPU GPU-node-a-7"));
  // Once its task has ended it waits for a node with 8 GPUs; none is given a GPU that is gone.
  beat.tasks = {Report("train/workers-0/1", wire::TaskPhase::kFailed, 143)};
  Heartbeat("node-a", beat);
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Pending");
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Pending");
}

TEST_F(AgentProtocolTest, ANodeRegisteringAgainWithItsGpusInAnotherOrderKeepsEachRunOnItsGpus) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("train", 1, 4));
  Cycle();
  const std::vector<std::string> uuids = TaskOf(Heartbeat("node-a"), "train").gpu_uuids;
  ASSERT_EQ(uuids.size(), 4u);
  wire::HeartbeatRequest beat;
  beat.tasks = {Report("train/workers-0/1", wire::TaskPhase::kRunning)};
  Heartbeat("node-a", beat);
  // The agent comes back with NVML numbering the same GPUs the other way round.
  wire::RegisterRequest reordered = Reversed(Inventory("node-a", "leaf-0"));
  reordered.tasks = beat.tasks;
  EXPECT_EQ(TaskOf(Register(reordered), "train").gpu_uuids, uuids) << "the same physical GPUs";
  const Json job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Running");
  EXPECT_EQ(job["placements"][0].value("gpu_uuids", Json()), Json(uuids));
  for (size_t i = 0; i < uuids.size(); ++i) {
    EXPECT_EQ(job["placements"][0]["gpus"][i], IndexOf(reordered, uuids[i]))
        << "the index people read is the GPU's index now";
  }
  for (const Json& gpu : Get("/v1/nodes/node-a")["gpus"]) {
    const bool held = std::count(uuids.begin(), uuids.end(), gpu["uuid"].get<std::string>()) > 0;
    EXPECT_EQ(gpu["allocated_milli"], held ? 1000 : 0) << gpu["uuid"];
  }
  // The next job gets the other four GPUs, none of the running job's.
  Submit(AgentsJobYaml("next", 1, 4));
  Cycle();
  for (const std::string& uuid : TaskOf(Heartbeat("node-a", beat), "next").gpu_uuids) {
    EXPECT_EQ(std::count(uuids.begin(), uuids.end(), uuid), 0) << uuid;
  }
}

TEST_F(AgentProtocolTest, ANodeRegisteringAgainWithoutAGpuEndsOnlyTheRunThatHeldIt) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("first", 1, 4));
  Cycle();
  Submit(AgentsJobYaml("second", 1, 4));
  Cycle();
  const wire::AgentReply before = Heartbeat("node-a");
  const std::vector<std::string> first = TaskOf(before, "first").gpu_uuids;
  const std::vector<std::string> second = TaskOf(before, "second").gpu_uuids;
  ASSERT_EQ(first.size(), 4u);
  wire::HeartbeatRequest beat;
  beat.tasks = {Report("first/workers-0/1", wire::TaskPhase::kRunning),
                Report("second/workers-0/1", wire::TaskPhase::kRunning)};
  Heartbeat("node-a", beat);
  // One GPU of the first job is gone; the GPUs listed after it move up the list.
  wire::RegisterRequest fewer = Inventory("node-a", "leaf-0");
  std::erase_if(fewer.node.gpus, [&](const Gpu& gpu) { return gpu.uuid.value() == first[0]; });
  fewer.tasks = beat.tasks;
  const wire::AgentReply reply = Register(fewer);
  ASSERT_EQ(reply.tasks.size(), 1u);
  EXPECT_EQ(reply.tasks[0].job, "second");
  EXPECT_EQ(reply.tasks[0].gpu_uuids, second);
  EXPECT_EQ(Get("/v1/jobs/second")["state"], "Running");
  Json job = Get("/v1/jobs/first");
  EXPECT_EQ(job["state"], "Stopping");
  EXPECT_THAT(
      job["reason"].get<std::string>(),
      HasSubstr(fmt::format("requeued: node-a registered again without its GPU {}", first[0])));
  EXPECT_EQ(job["placements"][0].value("gpu_uuids", Json()), Json(first))
      << "never an empty or another UUID";
  // Once its task has ended it waits: three GPUs are left for its four.
  beat.tasks = {Report("first/workers-0/1", wire::TaskPhase::kFailed, 143),
                Report("second/workers-0/1", wire::TaskPhase::kRunning)};
  Heartbeat("node-a", beat);
  EXPECT_EQ(Get("/v1/jobs/first")["state"], "Pending");
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/first")["state"], "Pending");
}

TEST_F(AgentProtocolTest, APlacementNamingAGpuItsNodeNoLongerHasEndsTheRunRatherThanMoveIt) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("train", 1, 1));
  Cycle();
  // As a cycle that placed the job against the node's inventory before it registered again
  // would have committed it.
  Result<store::StoredObject> stored = store_.Get(control::kJobsKind, "train");
  ASSERT_OK(stored);
  Json doc = Json::parse(stored->data);
  doc["placements"][0]["gpu_uuids"][0] = "GPU-gone";
  store::WriteBatch batch;
  batch.Update(std::string(control::kJobsKind), "train", doc.dump(), stored->version);
  ASSERT_OK(store_.Commit(batch));
  EXPECT_TRUE(Heartbeat("node-a").tasks.empty()) << "never started on another GPU";
  const Json job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Pending");
  EXPECT_THAT(job["reason"].get<std::string>(),
              HasSubstr("(GPU-gone) of node-a is no longer on the node (task workers-0)"));
}

TEST_F(AgentProtocolTest, AJobStoredBeforePlacementsNamedUuidsRunsOnTheGpusOfItsIndices) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("train", 1, 2));
  Cycle();
  // As the server stored placements before: NVML indices and positions, no UUIDs.
  Result<store::StoredObject> stored = store_.Get(control::kJobsKind, "train");
  ASSERT_OK(stored);
  Json doc = Json::parse(stored->data);
  Json& placement = doc["placements"][0];
  placement.erase("gpu_uuids");
  std::vector<std::string> uuids;
  for (size_t i = 0; i < placement["gpus"].size(); ++i) {
    placement["assignments"][i]["gpu"] = placement["gpus"][i];
    uuids.push_back(fmt::format("GPU-node-a-{}", placement["gpus"][i].get<int>()));
  }
  store::WriteBatch batch;
  batch.Update(std::string(control::kJobsKind), "train", doc.dump(), stored->version);
  ASSERT_OK(store_.Commit(batch));
  EXPECT_EQ(TaskOf(Heartbeat("node-a"), "train").gpu_uuids, uuids);
  wire::HeartbeatRequest beat;
  beat.tasks = {Report("train/workers-0/1", wire::TaskPhase::kRunning)};
  Heartbeat("node-a", beat);
  // A re-registration that numbers the GPUs otherwise keeps the run on them, and from then on
  // the placement names them by UUID.
  wire::RegisterRequest reordered = Reversed(Inventory("node-a", "leaf-0"));
  reordered.tasks = beat.tasks;
  EXPECT_EQ(TaskOf(Register(reordered), "train").gpu_uuids, uuids);
  const Json job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Running");
  EXPECT_EQ(job["placements"][0].value("gpu_uuids", Json()), Json(uuids));
}

TEST_F(AgentProtocolTest, AQuarantineFollowsItsGpuByUuidAcrossReRegistration) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  ASSERT_EQ(Call("POST", "/v1/nodes/node-a/quarantine", admin_, R"({"gpu": 2})").status, 200);
  Register(Reversed(Inventory("node-a", "leaf-0")));
  for (const Json& gpu : Get("/v1/nodes/node-a")["gpus"]) {
    EXPECT_EQ(gpu["health"], gpu["uuid"] == "GPU-node-a-2" ? "Quarantined" : "Healthy")
        << gpu["uuid"];
  }
}

TEST_F(AgentProtocolTest, DeleteNodeRemovesANodeThatHoldsNoRuns) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("train", 1, 8));
  Cycle();
  const ApiResponse busy = Call("DELETE", "/v1/nodes/node-a", admin_);
  EXPECT_EQ(busy.status, 400);
  EXPECT_THAT(busy.body, HasSubstr("holds runs of 1 job(s) (train)"));
  EXPECT_EQ(Call("DELETE", "/v1/nodes/node-a", agent_).status, 403);
  ASSERT_EQ(Call("POST", "/v1/jobs/train/cancel", admin_).status, 200);
  Heartbeat("node-a");  // the task is not on the node: the job is Cancelled
  ASSERT_EQ(Call("DELETE", "/v1/nodes/node-a", admin_).status, 200);
  EXPECT_EQ(Call("GET", "/v1/nodes/node-a", admin_).status, 404);
  EXPECT_EQ(Call("DELETE", "/v1/nodes/node-a", admin_).status, 404);
  // Its GPUs may now belong to another node.
  wire::RegisterRequest moved = Inventory("node-b", "leaf-0");
  moved.node.gpus[0].uuid = GpuUuid("GPU-node-a-0");
  Register(moved);
}

TEST_F(AgentProtocolTest, TheGpuTotalFollowsNodesRegisteredAndDeletedBetweenCycles) {
  const auto total = [&]() {
    Cycle();
    const std::string metrics = Call("GET", "/metrics", admin_).body;
    const std::string series = "gpufleet_gpus_total{model=\"H100-80GB\"} ";
    const size_t at = metrics.find(series);
    if (at == std::string::npos) {
      return std::string("none");
    }
    const size_t value = at + series.size();
    return metrics.substr(value, metrics.find('\n', value) - value);
  };
  EXPECT_EQ(total(), "none");
  Register(Inventory("node-a", "leaf-0"));
  EXPECT_EQ(total(), "8");
  EXPECT_EQ(total(), "8") << "a cycle that changed no node";
  Register(Inventory("node-b", "leaf-0"));
  EXPECT_EQ(total(), "16");
  wire::RegisterRequest fewer = Inventory("node-b", "leaf-0");
  fewer.node.gpus.resize(3);
  Register(fewer);
  EXPECT_EQ(total(), "11");
  ASSERT_EQ(Call("DELETE", "/v1/nodes/node-a", admin_).status, 200);
  EXPECT_EQ(total(), "3");
}

TEST_F(AgentProtocolTest, SilentNodeBecomesNotReadyAndItsJobIsRequeuedWithoutHoldingGpus) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Register(Inventory("node-b", "leaf-0"));
  Submit(AgentsJobYaml("train", 1, 8));
  Cycle();
  const std::string first_node = Get("/v1/jobs/train")["placements"][0]["node"];
  const std::string other_node = first_node == "node-a" ? "node-b" : "node-a";

  // Only the other node keeps heartbeating. After the 40 s lease the node is NotReady and the
  // run is Stopping: its agent, cut off, stops the task itself within the 30 s stop grace, and
  // until then the job runs nowhere else.
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(std::chrono::seconds(10));
    Heartbeat(other_node);
    Cycle();
  }
  EXPECT_EQ(Get("/v1/nodes/" + first_node)["state"], "NotReady");
  EXPECT_EQ(Get("/v1/nodes/" + other_node)["state"], "Ready");
  Json job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Stopping");
  EXPECT_EQ(job["placements"][0]["node"], first_node);
  EXPECT_TRUE(Heartbeat(other_node).tasks.empty());
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(std::chrono::seconds(10));
    Heartbeat(other_node);
    Cycle();
  }
  // Lease plus grace have passed: requeued, and placed again on the node that answers, as
  // attempt 2.
  job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Scheduled");
  EXPECT_EQ(job["attempt"], 2);
  EXPECT_EQ(job["placements"][0]["node"], other_node);
  const Json events = Get("/v1/jobs/train/events");
  EXPECT_THAT(events.dump(), HasSubstr("requeued: node " + first_node + " is NotReady"));
  EXPECT_THAT(events.dump(), HasSubstr("node " + first_node + " lost"));

  // The silent node comes back: Ready again, and its old task is not wanted any more.
  wire::HeartbeatRequest beat;
  beat.tasks = {Report("train/workers-0/1", wire::TaskPhase::kRunning)};
  const wire::AgentReply reply = Heartbeat(first_node, beat);
  EXPECT_TRUE(reply.tasks.empty());
  EXPECT_EQ(Get("/v1/nodes/" + first_node)["state"], "Ready");
  job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Scheduled") << "a stale attempt's report changes nothing";
}

TEST_F(AgentProtocolTest, OnNodeFailureFailEndsTheJob) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("train", 1, 8, "fail"));
  Cycle();
  clock_.Advance(std::chrono::seconds(41));
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Stopping");
  clock_.Advance(std::chrono::seconds(30));
  Cycle();
  const Json job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Failed");
  EXPECT_THAT(job["reason"].get<std::string>(), HasSubstr("node node-a is NotReady"));
  EXPECT_TRUE(job["placements"].empty());
}

TEST_F(AgentProtocolTest, AHeartbeatTellsTheAgentItsLeaseAndAFencedAgentLeavesANodeEvent) {
  Cycle();
  wire::AgentReply reply = Register(Inventory("node-a", "leaf-0"));
  EXPECT_EQ(reply.lease_ms, 40000);
  wire::HeartbeatRequest beat;
  beat.fenced = "lease of 40s not renewed: stopped 2 tasks";
  Heartbeat("node-a", beat);
  EXPECT_THAT(Get("/v1/nodes/node-a/events").dump(),
              HasSubstr("agent fenced itself: lease of 40s not renewed: stopped 2 tasks"));
}

// ---- images ------------------------------------------------------------------------------

const std::string kTinyDigest = "sha256:" + std::string(64, 'd');

// The heartbeat of node-a that reports the one task of a job of localhost/tiny:1, placed there,
// running with kTinyDigest after a pull of `pull_ms` (none: no pull).
wire::HeartbeatRequest ImageJobRunning(const std::string& job, std::optional<int64_t> pull_ms) {
  wire::TaskReport running;
  running.id = job + "/workers-0/1";
  running.image_pull_ms = pull_ms;
  running.image_digest = kTinyDigest;
  wire::HeartbeatRequest beat;
  beat.tasks = {running};
  return beat;
}

TEST_F(AgentProtocolTest, APullIsAJobEventOnTheRunInItsOutcomeAndOnMetrics) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("pulled", 1, 1, "requeue", "localhost/tiny:1"));
  Cycle();
  wire::HeartbeatRequest beat = ImageJobRunning("pulled", 12345);
  Heartbeat("node-a", beat);
  Heartbeat("node-a", beat);  // the agent reports the pull with every report of the task
  const std::string events = Get("/v1/jobs/pulled/events").dump();
  const std::string event =
      "task workers-0 pulled localhost/tiny:1 (" + kTinyDigest + ") in 12.3 s on node-a";
  EXPECT_THAT(events, HasSubstr(event));
  EXPECT_EQ(events.find(event), events.rfind(event)) << "recorded once";
  const Json placement = Get("/v1/jobs/pulled")["placements"][0];
  EXPECT_EQ(placement["image_pull_ms"], 12345);
  EXPECT_EQ(placement["image_digest"], kTinyDigest);

  ApiRequest metrics;
  metrics.method = "GET";
  metrics.path = "/metrics";
  metrics.authorization = "Bearer " + admin_;
  const std::string text = server_->Handle(metrics).body;
  EXPECT_THAT(text, HasSubstr("# TYPE gpufleet_image_pull_seconds histogram"));
  EXPECT_THAT(text, HasSubstr(R"(gpufleet_image_pull_seconds_bucket{le="10"} 0)"));
  EXPECT_THAT(text, HasSubstr(R"(gpufleet_image_pull_seconds_bucket{le="30"} 1)"));
  EXPECT_THAT(text, HasSubstr("gpufleet_image_pull_seconds_sum 12.345"));
  EXPECT_THAT(text, HasSubstr("gpufleet_image_pull_seconds_count 1"));

  beat.tasks = {Report("pulled/workers-0/1", wire::TaskPhase::kSucceeded)};
  Heartbeat("node-a", beat);
  const Result<store::StoredObject> outcome = store_.Get(control::kOutcomesKind, "pulled/1");
  ASSERT_OK(outcome);
  const Json pulls = Json::parse(outcome->data)["image_pulls"];
  EXPECT_EQ(pulls, Json::parse(R"([{"task": "workers-0", "node": "node-a",
      "image": "localhost/tiny:1", "digest": ")" +
                               kTinyDigest + R"(", "pull_ms": 12345}])"));
}

TEST_F(AgentProtocolTest, ADigestWithoutAPullIsRecordedToo) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("cached", 1, 1, "requeue", "localhost/tiny:1"));
  Cycle();
  Heartbeat("node-a", ImageJobRunning("cached", std::nullopt));
  EXPECT_EQ(Get("/v1/jobs/cached")["placements"][0]["image_digest"], kTinyDigest);
  EXPECT_FALSE(Get("/v1/jobs/cached")["placements"][0].contains("image_pull_ms"));
  EXPECT_THAT(Get("/v1/jobs/cached/events").dump(),
              HasSubstr("task workers-0 runs localhost/tiny:1 (" + kTinyDigest + ") on node-a"));
}

TEST_F(AgentProtocolTest, HeartbeatImagesAreKeptOnTheNodeAndBounded) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  wire::HeartbeatRequest beat;
  beat.images = std::vector<CachedImage>{{{"localhost/tiny:1"}, kTinyDigest, 1987655}};
  Heartbeat("node-a", beat);
  Json node = Get("/v1/nodes/node-a");
  EXPECT_EQ(node["images"], Json::parse(R"([{"references": ["localhost/tiny:1"], "digest": ")" +
                                        kTinyDigest + R"(", "size_bytes": 1987655}])"));
  EXPECT_THAT(Get("/v1/nodes/node-a/events").dump(), HasSubstr("images: 1 held (0.0 GiB)"));
  // A heartbeat without images leaves them; registering again too.
  Heartbeat("node-a");
  Register(Inventory("node-a", "leaf-0"));
  EXPECT_EQ(Get("/v1/nodes/node-a")["images"].size(), 1u);

  // A hostile list: too many images, a reference that is a flag, a digest that is not one, a
  // huge reference (the HTTP body's 1 MiB bound stops larger ones). The heartbeat is answered
  // (the node stays Ready), the list is cut to the bound, and the node says what was dropped.
  beat.images->clear();
  for (int i = 0; i < 300; ++i) {
    beat.images->push_back({{fmt::format("localhost/image{}:1", i)}, kTinyDigest, 1000});
  }
  beat.images->at(0).references = {"--privileged"};
  beat.images->at(1).digest = "sha256:0";
  beat.images->at(2).references = {std::string(100000, 'a')};
  const ApiResponse response = Call("POST", "/v1/agents/node-a/heartbeat", node_tokens_["node-a"],
                                    wire::HeartbeatRequestToJson(beat));
  EXPECT_EQ(response.status, 200) << response.body;
  node = Get("/v1/nodes/node-a");
  EXPECT_EQ(node["state"], "Ready");
  EXPECT_EQ(node["images"].size(), wire::kMaxReportedImages);
  EXPECT_TRUE(node["images"][0]["references"].empty());
  EXPECT_THAT(node["images_dropped"].get<std::string>(), HasSubstr("images[0].references[0]"));
  EXPECT_THAT(node["images_dropped"].get<std::string>(), HasSubstr("images[1].digest"));
  EXPECT_LT(node.dump().size(), 64u * 1024) << "a bounded node document";
  EXPECT_THAT(Get("/v1/nodes/node-a/events").dump(), HasSubstr("images not kept: 46 dropped"));
  // A malformed list is refused like any malformed field, naming it.
  const ApiResponse bad = Call("POST", "/v1/agents/node-a/heartbeat", node_tokens_["node-a"],
                               R"({"images": [{"size_bytes": -1}]})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("images[0].size_bytes"));
}

TEST_F(AgentProtocolTest, LinkProblemsLabelTheNodeUntilTheAgentReportsNone) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  const std::string label(kLinkDegradedLabel);
  EXPECT_FALSE(Get("/v1/nodes/node-a")["labels"].contains(label));
  wire::HeartbeatRequest beat;
  beat.link_problems = {"mlx5_1/1: rate 200 Gb/sec (2X NDR) below 400 Gb/sec"};
  Heartbeat("node-a", beat);
  Json node = Get("/v1/nodes/node-a");
  EXPECT_EQ(node["labels"][label], "true");
  EXPECT_EQ(node["link_problems"][0], beat.link_problems[0]);
  EXPECT_THAT(Get("/v1/nodes/node-a/events").dump(),
              HasSubstr("links degraded: mlx5_1/1: rate 200 Gb/sec (2X NDR) below 400 Gb/sec"));
  // A restarted agent registers again: the problems and the label stay until it reports.
  Register(Inventory("node-a", "leaf-0"));
  EXPECT_EQ(Get("/v1/nodes/node-a")["labels"][label], "true");
  Heartbeat("node-a");
  node = Get("/v1/nodes/node-a");
  EXPECT_FALSE(node["labels"].contains(label));
  EXPECT_FALSE(node.contains("link_problems"));
  EXPECT_THAT(Get("/v1/nodes/node-a/events").dump(), HasSubstr("links healthy again"));
}

// Issue 36: a node whose agent reports a degraded link takes no gang that spans nodes, but a
// one-task job still goes there.
TEST_F(AgentProtocolTest, ADegradedLinkKeepsAGangOffItsNode) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Register(Inventory("node-b", "leaf-0"));
  wire::HeartbeatRequest degraded;
  degraded.link_problems = {"mlx5_1/1: port DOWN (Disabled), not ACTIVE and LinkUp"};
  Heartbeat("node-a", degraded);
  Submit(AgentsJobYaml("gang", 2, 8));
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/gang")["state"], "Pending");
  Submit(AgentsJobYaml("solo", 1, 8));
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/solo")["state"], "Scheduled");
  Submit(AgentsJobYaml("solo-2", 1, 8));
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/solo-2")["state"], "Scheduled") << "the degraded node takes one task";
}

// While its image is pulled a task is Pulling: one event, its progress kept on the placement (and
// bounded) without an event per report, the run still wanted; a cancel waits for the pull to end.
TEST_F(AgentProtocolTest, APullingTaskShowsItsProgressAndIsLiveUntilItsPullEnds) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("big", 1, 1, "requeue", "localhost/tiny:1"));
  Cycle();
  wire::HeartbeatRequest beat;
  beat.tasks = {Report("big/workers-0/1", wire::TaskPhase::kPulling)};
  beat.tasks[0].message = "Copying blob sha256:aaaa";
  EXPECT_EQ(Heartbeat("node-a", beat).tasks.size(), 1u) << "still wanted";
  beat.tasks[0].message = "Copying blob sha256:bbbb " + std::string(5000, 'x');
  Heartbeat("node-a", beat);
  Json job = Get("/v1/jobs/big");
  EXPECT_EQ(job["state"], "Scheduled");
  EXPECT_EQ(job["placements"][0]["phase"], "Pulling");
  const std::string progress = job["placements"][0]["image_pull_progress"];
  EXPECT_EQ(progress.size(), wire::kMaxPullProgressBytes);
  EXPECT_THAT(progress, ::testing::StartsWith("Copying blob sha256:bbbb"));
  const std::string events = Get("/v1/jobs/big/events").dump();
  const std::string event = "task workers-0 pulling localhost/tiny:1 on node-a";
  EXPECT_THAT(events, HasSubstr(event));
  EXPECT_EQ(events.find(event), events.rfind(event)) << "one event, not one per report";
  EXPECT_THAT(events, Not(HasSubstr("sha256:bbbb"))) << "progress is no event";

  // Cancelled while pulling: the task is not gone until the agent reports its end.
  ASSERT_EQ(Call("POST", "/v1/jobs/big/cancel", admin_).status, 200);
  Heartbeat("node-a", beat);
  EXPECT_EQ(Get("/v1/jobs/big")["state"], "Stopping");
  beat.tasks = {Report("big/workers-0/1", wire::TaskPhase::kFailed, -1)};
  beat.tasks[0].message = "failed to start: stopped while its image was being pulled";
  Heartbeat("node-a", beat);
  job = Get("/v1/jobs/big");
  EXPECT_EQ(job["state"], "Cancelled");
}

TEST_F(AgentProtocolTest, TheSchedulerPrefersTheNodeThatHoldsTheImage) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Register(Inventory("node-b", "leaf-0"));
  wire::HeartbeatRequest beat;
  beat.images = std::vector<CachedImage>{{{"localhost/tiny:1"}, kTinyDigest, int64_t{8} << 30}};
  Heartbeat("node-b", beat);
  Submit(AgentsJobYaml("local", 1, 8, "requeue", "localhost/tiny:1"));
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/local")["placements"][0]["node"], "node-b");
}

// Issue 33: a container job was placed on a node whose agent runs the process runner, and failed
// there. Agents say at registration whether they run containers; a job with an image goes only
// where they do, and with none it pends saying why, while a process job still runs anywhere.
TEST_F(AgentProtocolTest, AContainerJobGoesOnlyToANodeWhoseAgentRunsContainers) {
  Cycle();
  Register(Inventory("node-a", "leaf-0", /*container_runtime=*/""));
  Submit(AgentsJobYaml("boxed", 1, 8, "requeue", "localhost/tiny:1"));
  Submit(AgentsJobYaml("plain", 1, 8));
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/plain")["placements"][0]["node"], "node-a");
  EXPECT_EQ(Get("/v1/jobs/boxed")["state"], "Pending");
  const std::string explained = Get("/v1/jobs/boxed/explain").dump();
  EXPECT_THAT(explained, HasSubstr("node runs no container runtime")) << explained;
  EXPECT_EQ(Get("/v1/nodes/node-a")["labels"].count(std::string(kContainerRuntimeLabel)), 0u);

  Register(Inventory("node-b", "leaf-0", "podman"));
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/boxed")["placements"][0]["node"], "node-b");
  EXPECT_EQ(Get("/v1/nodes/node-b")["labels"][std::string(kContainerRuntimeLabel)], "podman");
}

TEST_F(AgentProtocolTest, AWaitingTaskKeepsItsJobScheduled) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("train", 1, 8));
  Cycle();
  wire::HeartbeatRequest beat;
  beat.tasks = {Report("train/workers-0/1", wire::TaskPhase::kWaiting)};
  beat.tasks[0].message = "GPU-node-a-0 is held by task old/main-0/1";
  const wire::AgentReply reply = Heartbeat("node-a", beat);
  EXPECT_EQ(reply.tasks.size(), 1u) << "still wanted";
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Scheduled");
  EXPECT_THAT(Get("/v1/jobs/train/events").dump(),
              HasSubstr("waiting on node-a: GPU-node-a-0 is held by task old/main-0/1"));
}

TEST_F(AgentProtocolTest, AGangPartlyStartedForTheGangStartTimeoutIsRequeuedWhole) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Register(Inventory("node-b", "leaf-0"));
  Submit(AgentsJobYaml("train", 2, 8));  // one task per node
  Cycle();
  wire::HeartbeatRequest on_a;
  on_a.tasks = {Report("train/workers-0/1", wire::TaskPhase::kRunning)};
  wire::HeartbeatRequest on_b;
  on_b.tasks = {Report("train/workers-1/1", wire::TaskPhase::kWaiting)};
  on_b.tasks[0].message = "GPU-node-b-0 is held by task old/main-0/1";
  // Part-started for just under the 300 s timeout: it still waits.
  for (int second = 0; second < 300; second += 10) {
    Heartbeat("node-a", on_a);
    Heartbeat("node-b", on_b);
    Cycle();
    clock_.Advance(std::chrono::seconds(10));
  }
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Scheduled");
  Heartbeat("node-b", on_b);
  EXPECT_EQ(Heartbeat("node-a", on_a).tasks.size(), 1u);
  Cycle();  // 300 s after the first cycle that saw it part-started

  Json job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Stopping");
  EXPECT_EQ(job["stopping"]["then"], "Pending");
  EXPECT_THAT(job["reason"].get<std::string>(),
              HasSubstr("the gang did not start together within 300s: 1 of 2 tasks started; not "
                        "started: workers-1 on node-b (Waiting)"));
  // The physical outcome: neither node is asked to run the run's tasks any more, and its GPUs
  // stay held until the started task has ended.
  EXPECT_TRUE(Heartbeat("node-b", on_b).tasks.empty());
  EXPECT_TRUE(Heartbeat("node-a", on_a).tasks.empty());
  on_a.tasks = {Report("train/workers-0/1", wire::TaskPhase::kFailed, 143)};
  Heartbeat("node-a", on_a);
  job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Pending");
  EXPECT_EQ(job["attempt"], 1);
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/train")["state"], "Scheduled");
  EXPECT_EQ(Get("/v1/jobs/train")["attempt"], 2);
}

// The kill-leader trials found a gang partly started for 20 s with an 8 s timeout: each new
// leader counted the window from when it took over, and leaders were killed every few seconds.
TEST_F(AgentProtocolTest, AGangsWindowToStartTogetherOutlivesTheLeader) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Register(Inventory("node-b", "leaf-0"));
  Submit(AgentsJobYaml("train", 2, 8));
  Cycle();
  wire::HeartbeatRequest on_a;
  on_a.tasks = {Report("train/workers-0/1", wire::TaskPhase::kRunning)};
  wire::HeartbeatRequest on_b;
  on_b.tasks = {Report("train/workers-1/1", wire::TaskPhase::kWaiting)};
  for (int second = 0; second < 300; second += 10) {
    if (second % 100 == 0) {
      StartServer();  // a new leader every 100 s, each seeing the gang for less than 300 s
      Cycle();        // it serves agents once it has read the store
    }
    Heartbeat("node-a", on_a);
    Heartbeat("node-b", on_b);
    Cycle();
    EXPECT_EQ(Get("/v1/jobs/train")["state"], "Scheduled") << second << " s";
    clock_.Advance(std::chrono::seconds(10));
  }
  StartServer();
  Cycle();
  Heartbeat("node-a", on_a);
  Cycle();  // 300 s after node-a's task was reported started
  const Json job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Stopping");
  EXPECT_THAT(job["reason"].get<std::string>(),
              HasSubstr("the gang did not start together within 300s"));
  // The physical outcome: node-b is not asked to start its task any more.
  EXPECT_TRUE(Heartbeat("node-b", on_b).tasks.empty());
}

TEST_F(AgentProtocolTest, CordonedNodeStaysCordonedAcrossNotReady) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  ASSERT_EQ(Call("POST", "/v1/nodes/node-a/cordon", admin_, "").status, 200);
  clock_.Advance(std::chrono::seconds(41));
  Cycle();
  EXPECT_EQ(Get("/v1/nodes/node-a")["state"], "NotReady");
  Heartbeat("node-a");
  EXPECT_EQ(Get("/v1/nodes/node-a")["state"], "Cordoned");
}

TEST_F(AgentProtocolTest, DrainNowGpuEndsTheRunAndTakesTheGpuOutOfService) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(AgentsJobYaml("train", 1, 8));
  Cycle();
  wire::HeartbeatRequest beat;
  wire::GpuReport lost;
  lost.index = 3;
  lost.health = GpuHealth::kUnhealthy;
  lost.reasons = {"XID 79: GPU has fallen off the bus"};
  lost.drain = wire::DrainAction::kNow;
  beat.gpus = {lost};
  Heartbeat("node-a", beat);
  Json job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Pending");
  EXPECT_THAT(job["reason"].get<std::string>(),
              HasSubstr("gpu 3 (GPU-node-a-3) of node-a must be drained now"));
  const Json node = Get("/v1/nodes/node-a");
  EXPECT_EQ(node["gpus"][3]["health"], "Unhealthy");
  EXPECT_THAT(node["gpus"][3]["reasons"].dump(), HasSubstr("XID 79"));
  // Seven healthy GPUs are left: the 8-GPU job waits.
  Cycle();
  job = Get("/v1/jobs/train");
  EXPECT_EQ(job["state"], "Pending");
  EXPECT_THAT(Get("/v1/nodes/node-a/events").dump(), HasSubstr("gpu 3: Unhealthy: XID 79"));
}

TEST_F(AgentProtocolTest, QuarantineSurvivesReRegistration) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  ASSERT_EQ(Call("POST", "/v1/nodes/node-a/quarantine", admin_, R"({"gpu": 2})").status, 200);
  Register(Inventory("node-a", "leaf-0"));
  EXPECT_EQ(Get("/v1/nodes/node-a")["gpus"][2]["health"], "Quarantined");
}

TEST_F(AgentProtocolTest, HeartbeatsWaitForTheFirstCycle) {
  const ApiResponse response = Call("POST", "/v1/agents/register", agent_,
                                    wire::RegisterRequestToJson(Inventory("n", "leaf-0")));
  EXPECT_EQ(response.status, 503) << response.body;
  EXPECT_THAT(response.body, HasSubstr("retry"));
}

TEST_F(AgentProtocolTest, BadReportsAreRefusedAndChangeNothing) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  const std::string path = "/v1/agents/node-a/heartbeat";
  struct Case {
    std::string body;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"{", "body: not valid JSON"},
      {R"({"gpus": [{"index": 0, "health": "Sick"}]})",
       "gpus[0].health: unknown \"Sick\" (valid: Healthy, Degraded, Unhealthy)"},
      {R"({"gpus": [{"index": 0}, {"index": 0}]})", "gpus[1].index: duplicate GPU index 0"},
      {R"({"tasks": [{"phase": "Running"}]})", "tasks[0].id: required field missing"},
      {R"({"tasks": [{"id": "x/y/1", "phase": "Done"}]})", "tasks[0].phase: unknown \"Done\""},
      {R"({"gpus": [{"index": 0, "utilization_pct": 140}]})",
       "gpus[0].utilization_pct: 140 is out of range [0, 100]"},
      {R"({"gpu": []})", "gpu: unknown field"},
  };
  for (const Case& c : cases) {
    const ApiResponse response = Call("POST", path, agent_, c.body);
    EXPECT_EQ(response.status, 400) << c.body;
    const Json error = Json::parse(response.body, nullptr, false);
    EXPECT_THAT(error["error"]["message"].get<std::string>(), HasSubstr(c.error)) << c.body;
  }
  EXPECT_EQ(Get("/v1/nodes/node-a")["gpus"][0]["health"], "Healthy");

  EXPECT_EQ(Call("POST", "/v1/agents/ghost/heartbeat", agent_,
                 wire::HeartbeatRequestToJson(wire::HeartbeatRequest{}))
                .status,
            404);
  wire::RegisterRequest bad_model = Inventory("node-c", "leaf-0");
  bad_model.node.gpus[5].model = "H900";
  const ApiResponse unknown_model =
      Call("POST", "/v1/agents/register", agent_, wire::RegisterRequestToJson(bad_model));
  EXPECT_EQ(unknown_model.status, 400);
  EXPECT_THAT(unknown_model.body, HasSubstr("H900"));
  EXPECT_EQ(Call("GET", "/v1/nodes/node-c", admin_).status, 404) << "nothing stored";
}

TEST_F(AgentProtocolTest, RolesAreKeptApart) {
  Cycle();
  const std::string member =
      *server_->authenticator().CreateToken(control::Role::kMember, "team-a", "al");
  EXPECT_EQ(Call("POST", "/v1/agents/register", member,
                 wire::RegisterRequestToJson(Inventory("node-a", "leaf-0")))
                .status,
            403);
  EXPECT_EQ(Call("GET", "/v1/jobs", agent_).status, 403);
  EXPECT_EQ(Call("POST", "/v1/jobs", agent_, AgentsJobYaml("x", 1, 1)).status, 403);
  EXPECT_EQ(Call("POST", "/v1/agents/register", "", "{}").status, 401);
}

// A node of one H100 with MIG enabled and these instances, as its agent describes it.
wire::RegisterRequest MigInventory(const std::vector<wire::MigDeviceReport>& devices) {
  wire::RegisterRequest request = Inventory("mig-a", "leaf-0");
  request.node.labels[std::string(wire::kMigLayoutsLabel)] = "true";
  request.node.gpus.resize(1);
  request.node.gpus[0].mig_enabled = true;
  wire::GpuReport report;
  report.mig_devices = devices;
  for (const wire::MigDeviceReport& device : devices) {
    request.node.gpus[0].mig_instances.push_back({device.profile, device.start});
  }
  request.gpus.push_back(report);
  return request;
}

// A heartbeat of the MIG node `inventory` reporting the instances of `layout` as made.
wire::HeartbeatRequest MigLayoutMade(const wire::RegisterRequest& inventory,
                                     const wire::WantedMigLayout& layout) {
  wire::HeartbeatRequest beat;
  beat.gpus.push_back(inventory.gpus[0]);
  beat.gpus[0].mig_devices->clear();
  for (const MigInstance& instance : layout.instances) {
    beat.gpus[0].mig_devices->push_back({fmt::format("MIG-{}-{}", instance.profile, instance.start),
                                         instance.profile, instance.start});
  }
  return beat;
}

TEST_F(AgentProtocolTest, APlannedMigLayoutIsSentUntilReportedAndSurvivesReRegistration) {
  Cycle();
  const wire::RegisterRequest whole = MigInventory({{"MIG-whole", "7g.80gb", 0}});
  EXPECT_TRUE(Register(whole).mig_layouts.empty()) << "the layout is as wanted";
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: infer}
spec:
  tasks:
    - name: main
      command: [serve]
      resources: {gpus: {migProfile: 3g.40gb}}
)");
  Cycle();  // does not fit
  Cycle();  // a new layout, and the job placed on it
  ASSERT_EQ(Get("/v1/jobs/infer")["state"], "Scheduled");
  const Json assignment = Get("/v1/jobs/infer")["placements"][0]["assignments"][0];
  EXPECT_EQ(assignment["mig_created"], false) << "on an instance of the planned layout";

  // Re-registering with the old layout does not undo the plan: the agent is still told.
  wire::AgentReply reply = Register(whole);
  ASSERT_EQ(reply.mig_layouts.size(), 1u);
  EXPECT_EQ(reply.mig_layouts[0].gpu_index, 0);
  EXPECT_THAT(wire::DescribeMigInstances(reply.mig_layouts[0].instances), HasSubstr("3g.40gb"));
  EXPECT_TRUE(reply.tasks.empty()) << "the task waits for its instance";

  // Reported: the task comes with the MIG device's UUID, and the layout is no longer sent.
  reply = Heartbeat("mig-a", MigLayoutMade(whole, reply.mig_layouts[0]));
  EXPECT_TRUE(reply.mig_layouts.empty());
  ASSERT_EQ(reply.tasks.size(), 1u);
  const std::string uuid = fmt::format("MIG-3g.40gb-{}", assignment["mig_start"].get<int>());
  EXPECT_EQ(reply.tasks[0].gpu_uuids, std::vector<std::string>{uuid});
  ASSERT_EQ(reply.tasks[0].mig_instances.size(), 1u);
  EXPECT_EQ(reply.tasks[0].mig_instances[0],
            (wire::TaskMigInstance{0, "3g.40gb", assignment["mig_start"].get<int>(), uuid}));
}

TEST_F(AgentProtocolTest, TwoTeamsMigJobsOfOneNameAreBothPlanned) {
  for (const char* team : {"team-a", "team-b"}) {
    store::WriteBatch batch;
    batch.Create(std::string(control::kTeamsKind), team,
                 control::TeamToJson({.name = team}).dump());
    ASSERT_OK(store_.Commit(batch));
  }
  Cycle();
  const wire::RegisterRequest whole = MigInventory({{"MIG-whole", "7g.80gb", 0}});
  Register(whole);
  const std::string yaml = R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: infer}
spec:
  tasks:
    - name: main
      command: [serve]
      resources: {gpus: {migProfile: 3g.40gb}}
)";
  for (const char* team : {"team-a", "team-b"}) {
    const std::string member = *server_->authenticator().CreateToken(control::Role::kMember, team,
                                                                     std::string(team) + "-user");
    ASSERT_EQ(Call("POST", "/v1/jobs", member, yaml).status, 201);
  }
  Cycle();  // neither fits the whole-GPU instance
  Cycle();  // one layout with an instance for each, both placed
  EXPECT_EQ(Get("/v1/jobs/team-a/infer")["state"], "Scheduled");
  EXPECT_EQ(Get("/v1/jobs/team-b/infer")["state"], "Scheduled");
}

// Issue 14: a gang's other tasks started while its MIG task still waited for its instance, so
// part of the gang ran (and was killed if the instance never came).
TEST_F(AgentProtocolTest, AGangWithAMigTaskStartsOnlyOnceItsInstancesExist) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  const wire::RegisterRequest whole = MigInventory({{"MIG-whole", "7g.80gb", 0}});
  Register(whole);
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: mixed}
spec:
  tasks:
    - name: infer
      command: [serve]
      resources: {gpus: {migProfile: 3g.40gb}}
    - name: helper
      command: [help]
      resources: {gpus: {count: 1}}
)");
  Cycle();
  Cycle();
  const Json job = Get("/v1/jobs/mixed");
  ASSERT_EQ(job["state"], "Scheduled") << job.dump();
  std::set<std::string> nodes;
  for (const Json& placement : job["placements"]) {
    nodes.insert(placement["node"].get<std::string>());
  }
  ASSERT_EQ(nodes, (std::set<std::string>{"mig-a", "node-a"}));

  // The helper's node is told nothing while the MIG instance does not exist.
  EXPECT_TRUE(Heartbeat("node-a").tasks.empty());
  wire::AgentReply mig_reply = Heartbeat("mig-a");
  EXPECT_TRUE(mig_reply.tasks.empty());
  ASSERT_EQ(mig_reply.mig_layouts.size(), 1u) << "the layout is still sent, so it gets made";

  EXPECT_EQ(Heartbeat("mig-a", MigLayoutMade(whole, mig_reply.mig_layouts[0])).tasks.size(), 1u);
  const wire::AgentReply helper = Heartbeat("node-a");
  ASSERT_EQ(helper.tasks.size(), 1u);
  EXPECT_EQ(helper.tasks[0].task, "helper-0");
}

TEST_F(AgentProtocolTest, NoLayoutIsPlannedForAnAgentThatCannotApplyOne) {
  Cycle();
  wire::RegisterRequest whole = MigInventory({{"MIG-whole", "7g.80gb", 0}});
  whole.node.labels.erase(std::string(wire::kMigLayoutsLabel));
  Register(whole);
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: infer}
spec:
  tasks: [{name: main, command: [serve], resources: {gpus: {migProfile: 3g.40gb}}}]
)");
  Cycle();
  Cycle();
  EXPECT_EQ(Get("/v1/jobs/infer")["state"], "Pending");
  EXPECT_EQ(Get("/v1/nodes/mig-a")["gpus"][0]["mig_instances"].dump(),
            R"([{"profile":"7g.80gb","start":0}])");
}

// A MIG agent that never applies the planned layout (mig-layouts label, one H100 with a 7g).
class MigApplyTimeoutTest : public AgentProtocolTest {
 protected:
  static constexpr const char* kMigJob = R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: infer}
spec:
  tasks: [{name: main, command: [serve], resources: {gpus: {migProfile: 3g.40gb}}}]
)";

  // Registers mig-a with a 7g instance and places the 3g job on a planned layout.
  void PlaceOnAPlannedLayout() {
    Cycle();
    Register(whole_);
    Submit(kMigJob);
    Cycle();  // does not fit
    Cycle();  // a new layout, and the job placed on it
    ASSERT_EQ(Get("/v1/jobs/infer")["state"], "Scheduled");
    Cycle();  // the wait starts
  }

  // `seconds` in 10 s steps: mig-a heartbeats with these devices and error, then a cycle runs.
  // Returns the last heartbeat's answer.
  wire::AgentReply Wait(int seconds, const std::vector<wire::MigDeviceReport>& devices,
                        const std::string& error) {
    wire::AgentReply reply;
    for (int waited = 0; waited < seconds; waited += 10) {
      clock_.Advance(std::chrono::seconds(10));
      wire::HeartbeatRequest beat;
      beat.gpus.push_back(whole_.gpus[0]);
      beat.gpus[0].mig_devices = devices;
      beat.gpus[0].mig_error = error;
      reply = Heartbeat("mig-a", beat);
      Cycle();
    }
    return reply;
  }

  std::string Events(const std::string& kind, const std::string& name) {
    return Get(fmt::format("/v1/{}/{}/events", kind, name)).dump();
  }

  const wire::RegisterRequest whole_ = MigInventory({{"MIG-whole", "7g.80gb", 0}});
  const std::vector<wire::MigDeviceReport> whole_devices_ = {{"MIG-whole", "7g.80gb", 0}};
  static constexpr const char* kError = "gpu 0: the 7g.80gb instance at 0 is in use";
};

TEST_F(MigApplyTimeoutTest, AJobWaitingForALayoutNeverAppliedIsRequeuedAndTheLayoutDropped) {
  PlaceOnAPlannedLayout();
  EXPECT_EQ(Wait(110, whole_devices_, kError).mig_layouts.size(), 1u) << "still asked to apply";
  EXPECT_EQ(Get("/v1/jobs/infer")["state"], "Scheduled") << "not yet 120 s";

  const wire::AgentReply reply = Wait(10, whole_devices_, kError);
  const Json job = Get("/v1/jobs/infer");
  EXPECT_EQ(job["state"], "Pending");
  EXPECT_TRUE(job["placements"].empty());
  const std::string events = Events("jobs", "infer");
  EXPECT_THAT(events, HasSubstr("requeued: MIG instances 3g.40gb at "));
  EXPECT_THAT(events, HasSubstr(fmt::format(
                          "on mig-a gpu 0 not reported by its agent within 120s: {}", kError)));
  // The layout is what the agent has; nothing more is asked of it, and the node says why.
  EXPECT_EQ(Get("/v1/nodes/mig-a")["gpus"][0]["mig_instances"].dump(),
            R"([{"profile":"7g.80gb","start":0}])");
  EXPECT_THAT(Events("nodes", "mig-a"),
              HasSubstr("layout back to 7g.80gb at 0, jobs infer requeued, no new layout planned "
                        "here for 600s or until its MIG devices change"));
  EXPECT_TRUE(Wait(10, whole_devices_, "").mig_layouts.empty());
  EXPECT_TRUE(reply.tasks.empty());

  // The node is not planned again while it reports the same devices...
  Wait(580, whole_devices_, "");
  EXPECT_EQ(Get("/v1/jobs/infer")["state"], "Pending");
  EXPECT_EQ(Get("/v1/nodes/mig-a")["gpus"][0]["mig_instances"].size(), 1u);
  // ...and is once the hold is over: a new attempt on a new layout.
  Wait(20, whole_devices_, "");
  const Json again = Get("/v1/jobs/infer");
  EXPECT_EQ(again["state"], "Scheduled");
  EXPECT_EQ(again["attempt"], 2);
}

TEST_F(MigApplyTimeoutTest, TheHoldEndsWhenTheAgentReportsOtherDevices) {
  PlaceOnAPlannedLayout();
  Wait(120, whole_devices_, kError);
  ASSERT_EQ(Get("/v1/jobs/infer")["state"], "Pending");
  // An operator freed the GPU: the node is planned again at once.
  Wait(20, {}, "");
  EXPECT_EQ(Get("/v1/jobs/infer")["state"], "Scheduled");
}

TEST_F(MigApplyTimeoutTest, AReportedInstanceEndsTheWaitEvenBeforeTheTaskRuns) {
  PlaceOnAPlannedLayout();
  const wire::AgentReply reply = Wait(60, whole_devices_, kError);
  ASSERT_EQ(reply.mig_layouts.size(), 1u);
  std::vector<wire::MigDeviceReport> applied;
  for (const MigInstance& instance : reply.mig_layouts[0].instances) {
    applied.push_back({fmt::format("MIG-{}-{}", instance.profile, instance.start), instance.profile,
                       instance.start});
  }
  // The agent applied the layout but never reports the task: no requeue for the layout.
  EXPECT_EQ(Wait(300, applied, "").tasks.size(), 1u);
  EXPECT_EQ(Get("/v1/jobs/infer")["state"], "Scheduled");
  EXPECT_THAT(Events("jobs", "infer"), ::testing::Not(HasSubstr("requeued")));
}

TEST_F(MigApplyTimeoutTest, TheControllerWritesNothingItselfAndHoldsOnlyOnceCommitted) {
  PlaceOnAPlannedLayout();
  // A controller of the test's own over the server's store, stepped by hand.
  control::SchedulingView view(store_, catalog_);
  ASSERT_OK(view.Refresh());
  control::MigLayoutController controller({.store = store_, .catalog = catalog_, .clock = clock_});
  Result<std::optional<control::MigRequeue>> requeue = controller.PlanRequeue(view, "t0");
  ASSERT_OK(requeue);
  EXPECT_FALSE(requeue->has_value()) << "the wait starts now";
  clock_.Advance(std::chrono::seconds(120));
  const Result<int64_t> revision = store_.Revision();
  ASSERT_OK(revision);
  requeue = controller.PlanRequeue(view, "t1");
  ASSERT_OK(requeue);
  ASSERT_TRUE(requeue->has_value());
  EXPECT_EQ(*store_.Revision(), *revision) << "the server commits, not the controller";
  ASSERT_EQ((*requeue)->job_writes.size(), 1u);
  EXPECT_EQ((*requeue)->job_writes[0].after["state"], "Pending");
  EXPECT_FALSE((*requeue)->node_writes.empty()) << "the unapplied layout is dropped";
  // Not committed: the wait goes on and the next step decides the same.
  requeue = controller.PlanRequeue(view, "t2");
  ASSERT_OK(requeue);
  EXPECT_TRUE(requeue->has_value());
  controller.Requeued();
  requeue = controller.PlanRequeue(view, "t3");
  ASSERT_OK(requeue);
  EXPECT_FALSE(requeue->has_value()) << "committed: the GPU's wait is over";
}

TEST_F(AgentProtocolTest, ANonPositiveMigApplyTimeoutIsRefused) {
  store::InMemoryStateStore store;
  ApiServer::Options options{.store = store, .catalog = catalog_, .clock = clock_};
  options.mig_apply_timeout = std::chrono::seconds(0);
  EXPECT_THAT(ApiServer::Create(options).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("mig_apply_timeout 0s")));
  options.mig_apply_timeout = std::chrono::seconds(1);
  options.mig_replan_delay = std::chrono::seconds(-1);
  EXPECT_THAT(ApiServer::Create(options).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("mig_replan_delay -1s")));
}

// Idle reclaim reads the utilization the heartbeats carry.
class AgentUtilizationTest : public AgentProtocolTest {
 protected:
  void SetUp() override {
    policy::IdleReclaimOptions reclaim;
    reclaim.threshold_milli = 100;
    reclaim.idle_seconds = 30 * 60;
    reclaim.warning_seconds = 15 * 60;
    reclaim.max_sample_gap_seconds = 5 * 60;
    Result<std::unique_ptr<ApiServer>> server =
        ApiServer::Create({.store = store_,
                           .catalog = catalog_,
                           .clock = clock_,
                           .heartbeat_interval = std::chrono::seconds(60),
                           .node_timeout = std::chrono::minutes(10),
                           .idle_reclaim = reclaim});
    ASSERT_OK(server);
    server_ = std::move(server).value();
    admin_ = *server_->authenticator().CreateToken(control::Role::kAdmin, "", "root");
    agent_ = *server_->authenticator().CreateToken(control::Role::kAgent, "", "agents");
  }

  // One minute: node-a heartbeats with every GPU at `utilization` (nullopt: not measured) and
  // the tasks it was told to run reported running, then a cycle runs.
  void Minute(std::optional<int> utilization) {
    clock_.Advance(std::chrono::minutes(1));
    wire::HeartbeatRequest beat;
    for (int i = 0; i < 8; ++i) {
      wire::GpuReport gpu;
      gpu.index = i;
      gpu.utilization_pct = utilization;
      beat.gpus.push_back(gpu);
    }
    for (const std::string& id : desired_) {
      beat.tasks.push_back(Report(id, wire::TaskPhase::kRunning));
    }
    desired_.clear();
    for (const wire::DesiredTask& task : Heartbeat("node-a", beat).tasks) {
      desired_.push_back(task.id);
    }
    Cycle();
  }

  std::vector<std::string> desired_;
};

TEST_F(AgentUtilizationTest, AGpuNoLongerMeasuredKeepsNoOldUtilization) {
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: nb}
spec:
  kind: interactive
  tasks: [{name: main, command: [jupyter], resources: {gpus: {count: 1}}}]
)");
  Submit(AgentsJobYaml("train", 1, 8));  // waits for the notebook's GPU
  for (int minute = 0; minute < 3; ++minute) {
    Minute(0);  // idle, measured
  }
  ASSERT_EQ(Get("/v1/jobs/nb")["state"], "Running");
  // The agent stops measuring: the last idle reading must not count for the next 45 minutes.
  for (int minute = 0; minute < 45; ++minute) {
    Minute(std::nullopt);
  }
  const Json nb = Get("/v1/jobs/nb");
  EXPECT_EQ(nb["state"], "Running");
  EXPECT_FALSE(nb.contains("warning")) << nb.dump();
  // Measured idle again, it is warned as before.
  for (int minute = 0; minute < 32; ++minute) {
    Minute(0);
  }
  EXPECT_TRUE(Get("/v1/jobs/nb").contains("warning"));
}

// ---- provenance ----------------------------------------------------------------------------

namespace provenance {

constexpr char kJob[] = R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: prov, labels: {project: bert}}
spec:
  provenance: {git.commit: 3f2c1e0, dataset: "sha256:9b1d4c"}
  tasks:
    - name: workers
      replicas: 2
      image: localhost/tiny:1
      command: [python, train.py]
      env: {WANDB_API_KEY: hunter2}
      resources:
        gpus: {count: 8}
)";

// The record node-a's agent would send for `task_id`.
wire::ProvenanceReport Report(const std::string& task_id) {
  wire::ProvenanceReport report;
  report.task_id = task_id;
  report.image = "localhost/tiny:1";
  report.image_digest = kTinyDigest;
  report.driver_version = "550.54.15";
  report.cuda_version = "12.4";
  report.nvml_version = "12.550.54.15";
  report.gpus = {{"GPU-node-a-0", "1650923000000", "96.00.89.00.01"}};
  report.command = {"python", "train.py"};
  report.env_names = {"CUDA_VISIBLE_DEVICES", "WANDB_API_KEY"};
  return report;
}

}  // namespace provenance

class ProvenanceTest : public AgentProtocolTest {
 protected:
  // Two nodes, a 2-node gang of `provenance::kJob` on them; fills task_a_ and task_b_.
  void PlaceGang() {
    Cycle();
    Register(Inventory("node-a", "leaf-0"));
    Register(Inventory("node-b", "leaf-0"));
    Submit(provenance::kJob);
    Cycle();
    task_a_ = TaskOf(Heartbeat("node-a"), "prov").id;
    task_b_ = TaskOf(Heartbeat("node-b"), "prov").id;
    ASSERT_FALSE(task_a_.empty());
    ASSERT_FALSE(task_b_.empty());
  }

  ApiResponse Post(const std::string& node, const std::string& body,
                   const std::string& as_node = "") {
    return Call("POST", fmt::format("/v1/agents/{}/provenance", node),
                node_tokens_[as_node.empty() ? node : as_node], body);
  }

  // GET /v1/provenance?job=prov, with `attempt` when given, as `token` (admin: empty).
  ApiResponse List(const std::string& attempt = "", const std::string& token = "") {
    return api_testing::HandleRequest(
        *server_, "GET", "/v1/provenance?job=prov" + (attempt.empty() ? "" : "&attempt=" + attempt),
        token.empty() ? admin_ : token);
  }
  Json Listed(const std::string& attempt = "") { return Json::parse(List(attempt).body); }

  std::string task_a_;
  std::string task_b_;
};

TEST_F(ProvenanceTest, AnAgentRecordsARunOnceAndTheRecordIsImmutable) {
  PlaceGang();
  const std::string body = wire::ProvenanceReportToJson(provenance::Report(task_a_));
  ApiResponse first = Post("node-a", body);
  ASSERT_EQ(first.status, 201) << first.body;
  const Json record = Json::parse(first.body);
  EXPECT_EQ(record["node"], "node-a");
  EXPECT_EQ(record["attempt"], 1);
  EXPECT_EQ(record["provenance"]["git.commit"], "3f2c1e0");
  EXPECT_EQ(record["labels"]["project"], "bert");
  EXPECT_EQ(record["gpus"][0]["serial"], "1650923000000");
  // Names only: the spec's value of WANDB_API_KEY is nowhere in what the server keeps.
  EXPECT_THAT(record["env_names"].dump(), HasSubstr("WANDB_API_KEY"));
  EXPECT_THAT(first.body, Not(HasSubstr("hunter2")));

  const ApiResponse again = Post("node-a", body);  // a retry after a lost answer
  EXPECT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(Json::parse(again.body)["created"], false);

  wire::ProvenanceReport changed = provenance::Report(task_a_);
  changed.image_digest = "sha256:" + std::string(64, 'e');
  changed.driver_version = "560.28.03";
  const ApiResponse conflict = Post("node-a", wire::ProvenanceReportToJson(changed));
  EXPECT_EQ(conflict.status, 409);
  EXPECT_THAT(conflict.body, HasSubstr("records are immutable; this report differs in "
                                       "driver_version, image_digest"));

  const Json listed = Listed();
  ASSERT_EQ(listed["items"].size(), 1U);
  EXPECT_EQ(listed["items"][0]["image_digest"], kTinyDigest) << "not overwritten";
  EXPECT_EQ(listed["items"][0]["driver_version"], "550.54.15");
  EXPECT_EQ(Listed("2")["items"].size(), 0U);
  EXPECT_EQ(Listed("1")["items"].size(), 1U);
  EXPECT_EQ(List("x").status, 400);
}

TEST_F(ProvenanceTest, HostileReportsAreRefusedWithTheirReason) {
  PlaceGang();
  struct Case {
    std::string name;
    ApiResponse response;
    int status;
    std::string error;
  };
  wire::ProvenanceReport wrong_image = provenance::Report(task_a_);
  wrong_image.image = "localhost/other:1";
  const std::string secret_env =
      R"({"task_id": ")" + task_a_ + R"(", "env_names": ["WANDB_API_KEY=hunter2"]})";
  const std::string oversized =
      R"({"task_id": ")" + task_a_ + R"(", "command": [")" + std::string(70000, 'x') + R"("]})";
  const std::string other_attempt = task_a_.substr(0, task_a_.rfind('/')) + "/7";
  const Case cases[] = {
      {"another node's run",
       Post("node-a", wire::ProvenanceReportToJson(provenance::Report(task_b_))), 403,
       "runs on node node-b, not node-a"},
      {"as another node",
       Post("node-b", wire::ProvenanceReportToJson(provenance::Report(task_b_)),
            /*as_node=*/"node-a"),
       403, "acts for node node-a only"},
      {"unknown attempt",
       Post("node-a", wire::ProvenanceReportToJson(provenance::Report(other_attempt))), 404,
       "has no run of attempt 7"},
      {"unknown job",
       Post("node-a", wire::ProvenanceReportToJson(provenance::Report("nope/w-0/1"))), 404,
       "nope\\\" not found"},
      {"wrong image", Post("node-a", wire::ProvenanceReportToJson(wrong_image)), 400,
       "is not the task's image"},
      {"a value in env", Post("node-a", secret_env), 400, "env_names[0]: not an environment"},
      {"oversized", Post("node-a", oversized), 400, "more than the 65536 bytes"},
      {"an empty report", Call("POST", "/v1/agents/node-a/provenance", admin_, "{}"), 400,
       "task_id: required field missing"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(c.response.status, c.status) << c.response.body;
    EXPECT_THAT(c.response.body, HasSubstr(c.error));
    EXPECT_THAT(c.response.body, Not(HasSubstr("hunter2")));
  }
  EXPECT_EQ(Listed()["items"].size(), 0U) << "nothing stored";
  EXPECT_EQ(List("", node_tokens_["node-a"]).status, 403);
}

TEST_F(AgentProtocolTest, APinnedImageDigestIsWhatAgentsPullAndRecord) {
  const std::string pinned = "sha256:" + std::string(64, 'f');
  Cycle();
  Register(Inventory("node-a", "leaf-0"));
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: pinned}
spec:
  identicalStack: {labels: [], imageDigest: ")" +
         pinned + R"("}
  tasks:
    - name: workers
      image: localhost/tiny:1
      command: [serve]
      resources:
        gpus: {count: 1}
)");
  Cycle();
  const wire::DesiredTask task = TaskOf(Heartbeat("node-a"), "pinned");
  EXPECT_EQ(task.image, "localhost/tiny@" + pinned) << "the tag gives way to the digest";
  wire::ProvenanceReport report;
  report.task_id = task.id;
  report.image = task.image;
  report.image_digest = pinned;
  const ApiResponse recorded = Call("POST", "/v1/agents/node-a/provenance", node_tokens_["node-a"],
                                    wire::ProvenanceReportToJson(report));
  EXPECT_EQ(recorded.status, 201) << recorded.body;
}

}  // namespace
}  // namespace gpufleet::api
