// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "gpufleet/api/auth.h"
#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/api_request.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/policy/idle_reclaim.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/wire/agent_protocol.h"

namespace gpufleet::api_testing {

// An ApiServer on a fake clock with one agent node, "node-a" (kGpus H100-80GB), whose heartbeats
// carry GPU utilization: for tests of what the server does with measured utilization (idle
// reclaim, deployments). Teams team-a and team-b; tokens admin_, agent_, alice_ (a member of
// team-a) and bob_ (team-b). Heartbeats every minute, nodes time out after ten.
class AgentNodeServerTest : public ::testing::Test {
 protected:
  static constexpr int kGpus = 8;

  void StartServer(std::optional<policy::IdleReclaimOptions> idle_reclaim = std::nullopt) {
    Result<std::unique_ptr<api::ApiServer>> server =
        api::ApiServer::Create({.store = store_,
                                .catalog = catalog_,
                                .clock = clock_,
                                .wall_clock = &clock_,
                                .heartbeat_interval = std::chrono::seconds(60),
                                .node_timeout = std::chrono::minutes(10),
                                .idle_reclaim = std::move(idle_reclaim)});
    ASSERT_OK(server);
    server_ = std::move(server).value();
    for (const char* team : {"team-a", "team-b"}) {
      store::WriteBatch batch;
      batch.Create(std::string(control::kTeamsKind), team,
                   control::TeamToJson({.name = team}).dump());
      ASSERT_OK(store_.Commit(batch));
    }
    admin_ = *server_->authenticator().CreateToken(control::Role::kAdmin, "", "root");
    agent_ = *server_->authenticator().CreateToken(control::Role::kAgent, "", "agents");
    alice_ = *server_->authenticator().CreateToken(control::Role::kMember, "team-a", "alice");
    bob_ = *server_->authenticator().CreateToken(control::Role::kMember, "team-b", "bob");
    ASSERT_OK(server_->RunSchedulingCycle());

    wire::RegisterRequest inventory;
    inventory.topology_levels = {"block", "leaf"};
    inventory.node.id = NodeId("node-a");
    inventory.node.capacity = {128000, 1024 * 1024};
    inventory.node.topology = {"block-0", "leaf-0"};
    for (int i = 0; i < kGpus; ++i) {
      Gpu gpu;
      gpu.index = i;
      gpu.uuid = GpuUuid(fmt::format("GPU-node-a-{}", i));
      gpu.model = "H100-80GB";
      gpu.memory_mib = 81559;
      inventory.node.gpus.push_back(gpu);
    }
    const api::ApiResponse registered =
        Call("POST", "/v1/agents/register", agent_, wire::RegisterRequestToJson(inventory));
    ASSERT_EQ(registered.status, 200) << registered.body;
    // The join token is exchanged for node-a's own credential, used from now on.
    const Result<wire::AgentReply> reply = wire::ParseAgentReply(registered.body);
    ASSERT_OK(reply);
    agent_ = reply->node_token;
  }

  // `path` may carry one "?key=value".
  api::ApiResponse Call(const std::string& method, const std::string& path,
                        const std::string& token, const std::string& body = "") {
    return HandleRequest(*server_, method, path, token, body);
  }

  // One minute passes: node-a heartbeats with GPU `i` at utilization(i) percent and, when
  // `tasks_run`, every task it was told to run reported running; then a scheduling cycle runs.
  void Minute(const std::function<int(int)>& utilization, bool tasks_run = true) {
    clock_.Advance(std::chrono::minutes(1));
    wire::HeartbeatRequest beat;
    for (int i = 0; i < kGpus; ++i) {
      wire::GpuReport gpu;
      gpu.index = i;
      gpu.utilization_pct = utilization(i);
      beat.gpus.push_back(gpu);
    }
    for (const std::string& id : tasks_run ? desired_ : std::vector<std::string>{}) {
      wire::TaskReport task;
      task.id = id;
      task.phase = wire::TaskPhase::kRunning;
      beat.tasks.push_back(task);
    }
    const api::ApiResponse response =
        Call("POST", "/v1/agents/node-a/heartbeat", agent_, wire::HeartbeatRequestToJson(beat));
    ASSERT_EQ(response.status, 200) << response.body;
    const Result<wire::AgentReply> reply = wire::ParseAgentReply(response.body);
    ASSERT_OK(reply);
    desired_.clear();
    for (const wire::DesiredTask& task : reply->tasks) {
      desired_.push_back(task.id);
    }
    ASSERT_OK(server_->RunSchedulingCycle());
  }
  // The same with every GPU at `utilization_pct`.
  void Minute(int utilization_pct, bool tasks_run = true) {
    Minute([utilization_pct](int) { return utilization_pct; }, tasks_run);
  }
  template <typename Utilization>
  void Minutes(int count, const Utilization& utilization, bool tasks_run = true) {
    for (int i = 0; i < count; ++i) {
      Minute(utilization, tasks_run);
    }
  }

  const GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_;
  store::InMemoryStateStore store_;
  std::unique_ptr<api::ApiServer> server_;
  std::string admin_;
  std::string agent_;
  std::string alice_;
  std::string bob_;
  std::vector<std::string> desired_;  // the task ids node-a was last told to run
};

}  // namespace gpufleet::api_testing
