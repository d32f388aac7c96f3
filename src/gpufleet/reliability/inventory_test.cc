// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/inventory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::reliability {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

TEST(FleetInventory, FromClusterIndexesGpusNodesAndLeaves) {
  SyntheticClusterSpec spec;
  spec.leaves_per_block = 2;
  spec.nodes_per_leaf = 3;
  spec.gpus_per_node = 4;
  auto cluster = MakeSyntheticCluster(spec, GpuCatalog::Default());
  ASSERT_OK(cluster);
  auto inventory = FleetInventory::FromCluster(*cluster);
  ASSERT_OK(inventory);
  EXPECT_EQ(inventory->gpu_count(), 24);
  EXPECT_EQ(inventory->node_count(), 6);
  ASSERT_EQ(inventory->leaf_count(), 2);
  EXPECT_EQ(inventory->leaf_name(1), "leaf-1");
  EXPECT_EQ(inventory->gpus_in_leaf(1), 12);
  const int gpu = inventory->GpuIndex("GPU-node-0004-2");
  ASSERT_GE(gpu, 0);
  EXPECT_EQ(inventory->node_id(inventory->node_of_gpu(gpu)).value(), "node-0004");
  EXPECT_EQ(inventory->leaf_of_node(inventory->node_of_gpu(gpu)), 1);
  EXPECT_EQ(inventory->gpus_of_node(inventory->NodeIndex("node-0004")).size(), 4u);
  EXPECT_EQ(inventory->IndexOf(Device{DeviceKind::kNode, "node-0005"}), 5);
  EXPECT_FALSE(inventory->Contains(Device{DeviceKind::kGpu, "GPU-nope"}));
}

TEST(FleetInventory, RejectsDuplicatesAndEmptyIdsWithoutChange) {
  FleetInventory inventory;
  ASSERT_OK(inventory.AddNode(NodeId("a"), "l", {GpuUuid("a0"), GpuUuid("a1")}));
  EXPECT_THAT(inventory.AddNode(NodeId("a"), "l", {}),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("node \"a\"")));
  EXPECT_THAT(inventory.AddNode(NodeId("b"), "l", {GpuUuid("b0"), GpuUuid("a1")}),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("GPU \"a1\"")));
  EXPECT_THAT(inventory.AddNode(NodeId("c"), "l", {GpuUuid("c0"), GpuUuid("c0")}),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("GPU \"c0\"")));
  EXPECT_THAT(inventory.AddNode(NodeId(""), "l", {}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(inventory.AddNode(NodeId("d"), "l", {GpuUuid("")}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("empty uuid")));
  EXPECT_EQ(inventory.node_count(), 1);
  EXPECT_EQ(inventory.gpu_count(), 2);
  EXPECT_EQ(inventory.GpuIndex("b0"), -1);
}

TEST(Device, ToStringNamesKindAndId) {
  EXPECT_EQ(Device::OfGpu(GpuUuid("GPU-1")).ToString(), "gpu GPU-1");
  EXPECT_EQ(Device::OfNode(NodeId("n7")).ToString(), "node n7");
}

}  // namespace
}  // namespace gpufleet::reliability
