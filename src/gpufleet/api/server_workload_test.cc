// SPDX-License-Identifier: Apache-2.0
// The server's placement policy in production (docs/policies.md, "In production"): gpufleet by
// default, scored against the task mix learnt from the jobs the server started; and the
// collective-cost score with a fabric.
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/api_request.h"
#include "gpufleet/api/testing/job_spec_json.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/fabric/generators.h"
#include "gpufleet/store/memory_store.h"

namespace gpufleet::api {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A server on a memory store of its own with one team member, placing on `cluster` with the
// default policy (gpufleet) or `policy`.
class PolicyServer {
 public:
  PolicyServer(const Cluster& cluster, const GpuCatalog& catalog, const FakeClock& clock,
               const std::string& policy, std::shared_ptr<const fabric::Fabric> network) {
    ApiServer::Options options{
        .store = store_, .catalog = catalog, .clock = clock, .wall_clock = &clock};
    if (!policy.empty()) {
      options.policy = policy;
    }
    options.fabric = std::move(network);
    Result<std::unique_ptr<ApiServer>> server = ApiServer::Create(std::move(options));
    EXPECT_OK(server);
    server_ = std::move(server).value();
    EXPECT_OK(server_->RegisterNodes(cluster));
    store::WriteBatch batch;
    batch.Create(std::string(control::kTeamsKind), "team-a",
                 control::TeamToJson({.name = "team-a"}).dump());
    EXPECT_OK(store_.Commit(batch));
    Result<std::string> token =
        server_->authenticator().CreateToken(control::Role::kMember, "team-a", "alice");
    EXPECT_OK(token);
    token_ = *token;
  }

  ApiResponse Raw(const std::string& method, const std::string& path,
                  const std::string& body = "") {
    return api_testing::HandleRequest(*server_, method, path, token_, body);
  }
  nlohmann::json Call(const std::string& method, const std::string& path,
                      const std::string& body = "") {
    const ApiResponse response = Raw(method, path, body);
    EXPECT_LT(response.status, 300) << method << " " << path << ": " << response.body;
    return nlohmann::json::parse(response.body, nullptr, false);
  }
  std::string Metrics() { return Raw("GET", "/metrics").body; }
  void Cycle() { EXPECT_OK(server_->RunSchedulingCycle()); }
  std::set<std::string> NodesOf(const std::string& job) {
    std::set<std::string> nodes;
    const nlohmann::json doc = Call("GET", "/v1/jobs/" + job);
    EXPECT_TRUE(doc.contains("placements")) << doc.dump();
    for (const nlohmann::json& placement : doc["placements"]) {
      nodes.insert(placement["node"].get<std::string>());
    }
    return nodes;
  }
  // Submits, places, cancels and frees a job: it is then history only.
  void RunAndEnd(const std::string& name, int replicas, int gpus) {
    Call("POST", "/v1/jobs", api_testing::GangJobJson(name, replicas, gpus));
    Cycle();
    EXPECT_EQ(Call("GET", "/v1/jobs/" + name)["state"], "Scheduled");
    Call("POST", "/v1/jobs/" + name + "/cancel");
    Cycle();
    EXPECT_EQ(Call("GET", "/v1/jobs/" + name)["state"], "Cancelled");
  }

 private:
  store::InMemoryStateStore store_;
  std::unique_ptr<ApiServer> server_;
  std::string token_;
};

// node-0000 with 4 H100s, node-0001 with 5.
Cluster FourAndFive(const GpuCatalog& catalog) {
  SyntheticClusterSpec spec;
  spec.nodes_per_leaf = 2;
  spec.gpus_per_node = 5;
  Result<Cluster> cluster = MakeSyntheticCluster(spec, catalog);
  EXPECT_OK(cluster);
  cluster->nodes[0].gpus.pop_back();
  return *cluster;
}

class ServerWorkloadTest : public ::testing::Test {
 protected:
  std::unique_ptr<PolicyServer> Make(const Cluster& cluster, const std::string& policy = "",
                                     std::shared_ptr<const fabric::Fabric> network = nullptr) {
    return std::make_unique<PolicyServer>(cluster, catalog_, clock_, policy, std::move(network));
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_;
};

// A fresh server scores against the pending jobs' shapes; once jobs have run, against their
// history. With 4-GPU jobs in the history, a 1-GPU job goes to the 5-GPU node, keeping room for
// a 4-GPU task on both; best-fit (the former default) takes the tighter 4-GPU node.
TEST_F(ServerWorkloadTest, TheDefaultPolicyLearnsTheTaskMixFromHistory) {
  std::unique_ptr<PolicyServer> server = Make(FourAndFive(catalog_));
  // Nothing has run yet: the target is the pending job's shape.
  server->Call("POST", "/v1/jobs", api_testing::GangJobJson("first", 1, 1));
  server->Cycle();
  EXPECT_THAT(server->Metrics(), HasSubstr("gpufleet_target_workload_shapes{policy=\"gpufleet\","
                                           "source=\"pending\"} 1"));
  server->Call("POST", "/v1/jobs/first/cancel");
  server->RunAndEnd("wide-1", 1, 4);
  server->RunAndEnd("wide-2", 1, 4);
  clock_.Advance(std::chrono::minutes(1));  // the target is rebuilt once a minute
  server->Call("POST", "/v1/jobs", api_testing::GangJobJson("probe", 1, 1));
  server->Cycle();
  EXPECT_THAT(server->NodesOf("probe"), ElementsAre("node-0001"));
  EXPECT_THAT(
      server->Metrics(),
      HasSubstr("gpufleet_target_workload_shapes{policy=\"gpufleet\",source=\"history\"} 2"));

  std::unique_ptr<PolicyServer> best_fit = Make(FourAndFive(catalog_), "best-fit");
  best_fit->RunAndEnd("wide-1", 1, 4);
  best_fit->Call("POST", "/v1/jobs", api_testing::GangJobJson("probe", 1, 1));
  best_fit->Cycle();
  EXPECT_THAT(best_fit->NodesOf("probe"), ElementsAre("node-0000"));
  EXPECT_THAT(best_fit->Metrics(), ::testing::Not(HasSubstr("gpufleet_target_workload_shapes")));
}

// Two leaves of four 8-GPU nodes, 3:1 oversubscribed to the spine; two nodes of the first leaf
// busy. A four-node gang fits the second leaf whole: with the fabric the server puts it there;
// without, on nodes that declare no topology levels, it packs the first leaf's two free nodes
// and crosses the spine. (Nodes that declare their leaves keep it in one leaf without the
// fabric: the scheduler's compact-gang rule, docs/policies.md.)
TEST_F(ServerWorkloadTest, WithAFabricAGangStaysOffTheOversubscribedSpine) {
  fabric::ClosOptions clos;
  clos.leaves_per_pod = 2;
  clos.nodes_per_leaf = 4;
  clos.leaf_oversubscription = 3;
  Result<fabric::FabricSpec> spec = fabric::GenerateClos(clos);
  ASSERT_OK(spec);
  Result<fabric::Fabric> built = fabric::Fabric::Build(*std::move(spec));
  ASSERT_OK(built);
  auto network = std::make_shared<const fabric::Fabric>(*std::move(built));
  Result<Cluster> cluster = fabric::BuildCluster(*network, catalog_);
  ASSERT_OK(cluster);
  cluster->topology = Topology();
  for (Node& node : cluster->nodes) {
    node.topology.clear();
  }
  for (const bool with_fabric : {true, false}) {
    SCOPED_TRACE(with_fabric ? "with the fabric" : "without");
    std::unique_ptr<PolicyServer> server =
        Make(*cluster, "", with_fabric ? network : std::shared_ptr<const fabric::Fabric>());
    server->Call("POST", "/v1/jobs", api_testing::GangJobJson("busy", 2, 8));
    server->Cycle();
    EXPECT_THAT(server->NodesOf("busy"), ElementsAre("node1", "node2"));
    server->Call("POST", "/v1/jobs", api_testing::GangJobJson("gang", 4, 8));
    server->Cycle();
    if (with_fabric) {
      EXPECT_THAT(server->NodesOf("gang"), ElementsAre("node5", "node6", "node7", "node8"));
    } else {
      EXPECT_THAT(server->NodesOf("gang"), ElementsAre("node3", "node4", "node5", "node6"));
    }
  }
}

}  // namespace
}  // namespace gpufleet::api
