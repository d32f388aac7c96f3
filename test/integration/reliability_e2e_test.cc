// SPDX-License-Identifier: Apache-2.0
// Failure attribution end to end (issue 8): the real ApiServer, three simulated nodes (probe,
// runner, telemetry sampler and node agent each) talking the agent protocol to it, and one GPU
// that fails the job it runs with XID 79 every time and comes back after a reset. Jobs go on
// until the attribution engine flags the GPU; it is quarantined with an audit event on its node,
// no healthy GPU is, and `gpufleet report failures` ranks it first. One fake clock drives it all,
// so the test is deterministic and takes well under a second.
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/agent/simulated_node.h"
#include "gpufleet/api/server.h"
#include "gpufleet/cli/report.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/client.h"
#include "gpufleet/store/memory_store.h"

namespace gpufleet {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kNodes = 3;
constexpr int kGpusPerNode = 4;
constexpr int kBadNode = 1;
constexpr int kBadGpu = 2;
// Three failures are the engine's least evidence; a few more rounds leave room, no more.
constexpr int kMaxRounds = 6;

// Calls the server's request handler directly, as an HTTP round trip would.
class InProcessTransport final : public http::Transport {
 public:
  explicit InProcessTransport(api::ApiServer& server) : server_(server) {}
  Result<http::HttpResponse> Send(std::string_view method, std::string_view path,
                                  std::string_view body, std::string_view /*content_type*/,
                                  std::string_view token) override {
    api::ApiRequest request;
    request.method = std::string(method);
    const size_t query = path.find('?');
    request.path = std::string(path.substr(0, query));
    if (query != std::string_view::npos) {
      const std::string_view pair = path.substr(query + 1);
      const size_t equals = pair.find('=');
      request.query.emplace(std::string(pair.substr(0, equals)),
                            std::string(pair.substr(equals + 1)));
    }
    request.authorization = token.empty() ? "" : fmt::format("Bearer {}", token);
    request.body = std::string(body);
    const api::ApiResponse response = server_.Handle(request);
    return http::HttpResponse{response.status, response.body, response.content_type};
  }

 private:
  api::ApiServer& server_;
};

// A one-GPU job whose simulated task runs for ten minutes and succeeds.
std::string JobYaml(const std::string& name) {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}}}
spec:
  tasks:
    - name: main
      command: [python, train.py]
      env: {{GPUFLEET_SIM_DURATION_MS: "600000"}}
      resources:
        gpus: {{count: 1}}
)",
                     name);
}

class ReliabilityEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    control::ReliabilityOptions reliability;
    reliability.interval = std::chrono::minutes(1);
    // The attribution's direct quarantine, as on nodes whose agents run no diagnostics: with
    // the health loop (HealthLoopTest), this GPU, reset after each fall, passes its diagnostic
    // and is readmitted.
    reliability.loop.enabled = false;
    // Twelve GPUs: the default 2 % budget would allow none.
    reliability.budget = {0.25, 0.25};
    Result<std::unique_ptr<api::ApiServer>> server =
        api::ApiServer::Create({.store = store_,
                                .catalog = catalog_,
                                .clock = clock_,
                                .wall_clock = &clock_,
                                .policy = "best-fit",
                                .reliability = reliability});
    ASSERT_OK(server);
    server_ = std::move(server).value();
    const std::string admin =
        *server_->authenticator().CreateToken(control::Role::kAdmin, "", "root");
    const std::string agent =
        *server_->authenticator().CreateToken(control::Role::kAgent, "", "agent");
    admin_ = std::make_unique<http::ApiClient>(std::make_unique<InProcessTransport>(*server_),
                                               "in-process", admin);
    agent_client_ = std::make_unique<http::ApiClient>(
        std::make_unique<InProcessTransport>(*server_), "in-process", agent);
    ASSERT_OK(server_->RunSchedulingCycle());
    for (int i = 0; i < kNodes; ++i) {
      agent::SimulatedNode::Options options;
      options.agent.node_name = fmt::format("node-{}", i);
      options.agent.topology_levels = {"leaf"};
      options.agent.topology_values = {"leaf-0"};
      options.agent.capacity = {64000, 512 * 1024};
      options.gpu_count = kGpusPerNode;
      options.seed = static_cast<uint64_t>(i + 1);
      Result<std::unique_ptr<agent::SimulatedNode>> node =
          agent::SimulatedNode::Create(options, clock_, catalog_, *agent_client_);
      ASSERT_OK(node);
      nodes_.push_back(std::move(node).value());
      ASSERT_OK(nodes_.back()->sampler().SampleOnce());
      ASSERT_OK(nodes_.back()->agent().Register());
    }
  }

  void Heartbeat(agent::SimulatedNode& node) {
    ASSERT_OK(node.sampler().SampleOnce());
    ASSERT_OK(node.agent().Heartbeat());
  }
  void HeartbeatAll() {
    for (const auto& node : nodes_) {
      Heartbeat(*node);
    }
  }

  Json Get(const std::string& path) { return *admin_->Get(path); }

  std::string BadUuid() {
    for (const auto& [uuid, index] : nodes_[kBadNode]->agent().gpu_index_by_uuid()) {
      if (index == kBadGpu) {
        return uuid;
      }
    }
    return "";
  }

  bool BadGpuQuarantined() {
    return Get(fmt::format("/v1/nodes/node-{}", kBadNode))["gpus"][kBadGpu]["health"] ==
           "Quarantined";
  }

  const GpuCatalog catalog_ = GpuCatalog::Default();
  // 2023-11-14T22:13:20Z.
  FakeClock clock_{MonoTime{1'700'000'000'000'000'000}};
  store::InMemoryStateStore store_;
  std::unique_ptr<api::ApiServer> server_;
  std::unique_ptr<http::ApiClient> admin_;
  std::unique_ptr<http::ApiClient> agent_client_;
  std::vector<std::unique_ptr<agent::SimulatedNode>> nodes_;
};

TEST_F(ReliabilityEndToEndTest, ARepeatOffenderGpuIsFoundQuarantinedAndRankedFirst) {
  agent::SimulatedNode& bad_node = *nodes_[kBadNode];
  const std::string bad_uuid = BadUuid();
  ASSERT_FALSE(bad_uuid.empty());
  int rounds = 0;
  int job = 0;
  while (!BadGpuQuarantined() && rounds < kMaxRounds) {
    ++rounds;
    // Enough work for every GPU, the bad one included.
    for (int i = 0; i < kNodes * kGpusPerNode; ++i) {
      ASSERT_OK(
          admin_->Post("/v1/jobs", JobYaml(fmt::format("job-{}", job++)), "application/yaml"));
    }
    ASSERT_OK(server_->RunSchedulingCycle());
    HeartbeatAll();  // the agents start the tasks
    HeartbeatAll();  // and report them running

    // The bad GPU falls off the bus under its job; its agent drains it at once.
    clock_.Advance(std::chrono::minutes(2));
    ASSERT_OK(bad_node.probe().InjectXid(kBadGpu, 79));
    Heartbeat(bad_node);
    // An operator (or a script) resets it and it looks healthy again.
    ASSERT_OK(bad_node.probe().ResetGpu(kBadGpu));
    ASSERT_OK(bad_node.sampler().ClearXidHistory(kBadGpu));
    Heartbeat(bad_node);

    // The other jobs finish; the loop's next cycle runs the attribution.
    clock_.Advance(std::chrono::minutes(9));
    HeartbeatAll();
    HeartbeatAll();
    ASSERT_OK(server_->RunSchedulingCycle());
  }
  ASSERT_TRUE(BadGpuQuarantined()) << "not flagged after " << rounds << " rounds";
  EXPECT_EQ(rounds, 3) << "flagged at its third failure, the engine's least evidence";

  // Quarantined with an audit event on its node, by the attribution; no healthy GPU is.
  const std::string events = Get(fmt::format("/v1/nodes/node-{}/events", kBadNode)).dump();
  EXPECT_THAT(events,
              HasSubstr(fmt::format("gpu {} ({}) quarantined by attribution", kBadGpu, bad_uuid)));
  EXPECT_THAT(events, HasSubstr("XIDs 79x3"));
  EXPECT_THAT(events, HasSubstr("GPUs out: 1 of 12 in the fleet, 1 of 12 in leaf \\\"leaf-0\\\""));
  int quarantined = 0;
  for (int n = 0; n < kNodes; ++n) {
    const Json node = Get(fmt::format("/v1/nodes/node-{}", n));
    for (const Json& gpu : node["gpus"]) {
      quarantined += gpu["health"] == "Quarantined";
    }
  }
  EXPECT_EQ(quarantined, 1);

  // The runs it ended are on record as infrastructure failures naming it.
  int failures_naming_it = 0;
  const Json outcomes = Get("/v1/outcomes");
  for (const Json& outcome : outcomes["items"]) {
    if (outcome["exit_reason"] == "infra-error") {
      EXPECT_EQ(outcome["gpus"], Json::array({bad_uuid}));
      EXPECT_EQ(outcome["xids"],
                Json::parse(fmt::format(R"([{{"gpu": "{}", "xid": 79}}])", bad_uuid)));
      ++failures_naming_it;
    }
  }
  EXPECT_EQ(failures_naming_it, 3);

  // `gpufleet report failures` ranks it first, alone.
  std::ostringstream out;
  std::ostringstream err;
  ASSERT_EQ(cli::RunReport(*admin_, {"failures", ""}, out, err), 0) << err.str();
  EXPECT_THAT(out.str(),
              HasSubstr("these 1 GPUs (8.33% of the fleet) were involved in 100.0% of failed jobs; "
                        "quarantining them would have avoided 3 failures\n"));
  EXPECT_THAT(out.str(), HasSubstr(fmt::format("\n1      gpu {}   node-{}/gpu{}", bad_uuid,
                                               kBadNode, kBadGpu)));
  const Json report = Get("/v1/reports/failures");
  ASSERT_EQ(report["suspects"].size(), 1u);
  EXPECT_EQ(report["suspects"][0]["id"], bad_uuid);
  EXPECT_EQ(report["suspects"][0]["quarantined"], true);
}

}  // namespace
}  // namespace gpufleet
