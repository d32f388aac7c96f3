// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

Cluster OneNodeCluster() {
  Cluster cluster;
  cluster.topology = Topology({"block", "leaf"});
  Node node;
  node.id = NodeId("n1");
  node.capacity = {96000, 786432};
  node.topology = {"b1", "l1"};
  for (int i = 0; i < 2; ++i) {
    Gpu gpu;
    gpu.index = i;
    gpu.model = "H100-80GB";
    gpu.memory_mib = 81920;
    node.gpus.push_back(gpu);
  }
  cluster.nodes.push_back(node);
  return cluster;
}

TEST(Topology, KnowsDeclaredAndBuiltInLevels) {
  Topology topology({"zone", "block", "leaf"});
  EXPECT_EQ(topology.LevelIndex("block"), 1);
  EXPECT_EQ(topology.LevelIndex("rack"), -1);
  EXPECT_TRUE(topology.IsKnownLevel("node"));
  EXPECT_TRUE(topology.IsKnownLevel("nvlink-domain"));
  EXPECT_FALSE(topology.IsKnownLevel("rack"));
  EXPECT_EQ(topology.KnownLevelNames(), "zone, block, leaf, node, nvlink-domain");
}

TEST(Cluster, ValidClusterPasses) {
  EXPECT_OK(OneNodeCluster().Validate(GpuCatalog::Default()));
}

TEST(Cluster, RejectsUnknownGpuModelNamingTheField) {
  Cluster cluster = OneNodeCluster();
  cluster.nodes[0].gpus[1].model = "X9000";
  EXPECT_THAT(cluster.Validate(GpuCatalog::Default()),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("nodes[0] (\"n1\").gpus[1].model: unknown GPU model \"X9000\"")));
}

TEST(Cluster, RejectsDuplicateIdsAndMissingTopology) {
  Cluster duplicate = OneNodeCluster();
  duplicate.nodes.push_back(duplicate.nodes[0]);
  EXPECT_THAT(duplicate.Validate(GpuCatalog::Default()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("duplicate node id")));
  Cluster short_path = OneNodeCluster();
  short_path.nodes[0].topology = {"b1"};
  EXPECT_THAT(short_path.Validate(GpuCatalog::Default()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("declares 2 levels")));
}

TEST(Cluster, RejectsInvalidMigLayouts) {
  Cluster cluster = OneNodeCluster();
  cluster.nodes[0].gpus[0].mig_instances = {{"1g.10gb", 0}};
  EXPECT_THAT(cluster.Validate(GpuCatalog::Default()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("MIG disabled")));
  cluster.nodes[0].gpus[0].mig_enabled = true;
  EXPECT_OK(cluster.Validate(GpuCatalog::Default()));
  cluster.nodes[0].gpus[0].mig_instances = {{"2g.20gb", 1}};
  EXPECT_THAT(cluster.Validate(GpuCatalog::Default()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpus[0].mig_instances[0].start")));
}

}  // namespace
}  // namespace gpufleet
