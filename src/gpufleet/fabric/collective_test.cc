// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/collective.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/fabric/generators.h"

namespace gpufleet::fabric {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr int64_t kLarge = int64_t{8} << 30;  // 8 GiB: bandwidth-bound, as nccl-tests' large sizes

Fabric Superpod() {
  return *Fabric::Build(*GenerateSuperpod({}));
}

std::vector<PlacedGpus> WholeNodes(const Fabric& fabric, const std::vector<std::string>& names,
                                   int gpus) {
  std::vector<PlacedGpus> placement;
  for (const std::string& name : names) {
    placement.push_back({fabric.FindNode(name), gpus});
  }
  return placement;
}

TEST(Collective, BusBandwidthFactorsOfNcclTests) {
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(Collective::kAllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(Collective::kAllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(Collective::kReduceScatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(Collective::kAllToAll, 2), 0.5);
  EXPECT_EQ(*ParseCollective("allreduce"), Collective::kAllReduce);
  EXPECT_EQ(*ParseCollective("all-to-all"), Collective::kAllToAll);
  EXPECT_THAT(ParseCollective("broadcast"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unknown \"broadcast\"")));
}

// Published: ~370 GB/s busbw for an 8 x H100 ring all-reduce (nccl-tests #212).
TEST(Collective, EightH100RingAllReduceIsAbout370GBps) {
  const Fabric fabric = Superpod();
  auto shape = ShapeOf(fabric, WholeNodes(fabric, {"su1-dgx01"}, 8));
  ASSERT_OK(shape);
  EXPECT_EQ(shape->domains, 1);
  const CollectiveEstimate estimate = EstimateCollective(Collective::kAllReduce, kLarge, *shape);
  EXPECT_EQ(estimate.algorithm, "nvlink ring");
  EXPECT_NEAR(estimate.busbw_gbytes, 370, 37);
  // The other collectives run at the same bus bandwidth.
  EXPECT_NEAR(EstimateCollective(Collective::kAllGather, kLarge, *shape).busbw_gbytes, 370, 37);
}

// Published: ~380 GB/s busbw for a multi-node H100 all-reduce with 8 x 400G per node (nccl #1649).
TEST(Collective, MultiNodeH100AllReduceIsAbout380GBps) {
  const Fabric fabric = Superpod();
  std::vector<std::string> names;
  for (int i = 1; i <= 16; ++i) {
    names.push_back(fmt::format("su2-dgx{:02d}", i));
  }
  auto shape = ShapeOf(fabric, WholeNodes(fabric, names, 8));
  ASSERT_OK(shape);
  EXPECT_EQ(shape->domains, 16);
  EXPECT_EQ(shape->gpus_per_domain, 8);
  EXPECT_EQ(shape->common_tier, 0);
  EXPECT_EQ(shape->nic_mbps, 400000);
  const CollectiveEstimate estimate = EstimateCollective(Collective::kAllReduce, kLarge, *shape);
  EXPECT_NEAR(estimate.busbw_gbytes, 380, 38);
  EXPECT_THAT(estimate.algorithm, AnyOf("ring", "hierarchical"));
}

// Published: 46-48 GB/s busbw per 400G NDR NIC (nccl-tests #290).
TEST(Collective, OneGpuPerNodeRunsAtAbout47GBpsPerNic) {
  const Fabric fabric = Superpod();
  std::vector<std::string> names;
  for (int i = 1; i <= 8; ++i) {
    names.push_back(fmt::format("su1-dgx{:02d}", i));
  }
  auto shape = ShapeOf(fabric, WholeNodes(fabric, names, 1));
  ASSERT_OK(shape);
  const CollectiveEstimate estimate = EstimateCollective(Collective::kAllReduce, kLarge, *shape);
  EXPECT_NEAR(estimate.busbw_gbytes, 47, 4.7);
  EXPECT_NEAR(estimate.network_gbytes_per_gpu, 47.5, 0.01);
}

TEST(Collective, CrossingAnOversubscribedTierSlowsTheNetworkStage) {
  ClosOptions options;
  options.leaves_per_pod = 4;
  options.nodes_per_leaf = 6;
  options.leaf_oversubscription = 3;
  const Fabric fabric = *Fabric::Build(*GenerateClos(options));
  // Four nodes under one leaf, then four spread over two leaves.
  auto packed = ShapeOf(fabric, WholeNodes(fabric, {"node01", "node02", "node03", "node04"}, 8));
  auto spread = ShapeOf(fabric, WholeNodes(fabric, {"node01", "node02", "node07", "node08"}, 8));
  ASSERT_OK(packed);
  ASSERT_OK(spread);
  EXPECT_EQ(packed->common_tier, 0);
  EXPECT_EQ(spread->common_tier, 1);
  EXPECT_DOUBLE_EQ(packed->path_oversubscription, 1);
  EXPECT_DOUBLE_EQ(spread->path_oversubscription, 3);
  const double fast = EstimateCollective(Collective::kAllReduce, kLarge, *packed).seconds;
  const double slow = EstimateCollective(Collective::kAllReduce, kLarge, *spread).seconds;
  EXPECT_GT(slow, 2 * fast);
  EXPECT_NEAR(EstimateCollective(Collective::kAllReduce, kLarge, *spread).network_gbytes_per_gpu,
              47.5 / 3, 0.01);
  // ECMP collisions come on top when traffic climbs above the leaves.
  CostModelOptions collisions;
  collisions.ecmp_efficiency = 0.5;
  EXPECT_GT(EstimateCollective(Collective::kAllReduce, kLarge, *spread, collisions).seconds,
            1.5 * slow);
  EXPECT_DOUBLE_EQ(EstimateCollective(Collective::kAllReduce, kLarge, *packed, collisions).seconds,
                   fast);
}

TEST(Collective, AllToAllIsBoundByTheNetworkShare) {
  const Fabric fabric = Superpod();
  auto shape = ShapeOf(fabric, WholeNodes(fabric, {"su1-dgx01", "su1-dgx02"}, 8));
  ASSERT_OK(shape);
  const CollectiveEstimate estimate = EstimateCollective(Collective::kAllToAll, kLarge, *shape);
  EXPECT_EQ(estimate.algorithm, "pairwise");
  // Half of each rank's data leaves the node at 47.5 GB/s.
  EXPECT_NEAR(estimate.seconds, kLarge / 2.0 / 47.5e9, 0.01 * estimate.seconds);
}

TEST(Collective, HierarchicalWinsWhenFewGpusPerNodeShareManyNodes) {
  const Fabric fabric = Superpod();
  std::vector<std::string> names;
  for (int i = 1; i <= 8; ++i) {
    names.push_back(fmt::format("su1-dgx{:02d}", i));
  }
  auto shape = ShapeOf(fabric, WholeNodes(fabric, names, 2));
  ASSERT_OK(shape);
  // Two GPUs per node: the flat ring is limited to 2 NICs' worth, the hierarchical one moves half
  // the data per GPU across the network.
  EXPECT_EQ(EstimateCollective(Collective::kAllReduce, kLarge, *shape).algorithm, "hierarchical");
}

TEST(Collective, SmallMessagesAreLatencyBound) {
  const Fabric fabric = Superpod();
  auto shape = ShapeOf(fabric, WholeNodes(fabric, {"su1-dgx01"}, 8));
  ASSERT_OK(shape);
  const CollectiveEstimate tiny = EstimateCollective(Collective::kAllReduce, 8, *shape);
  EXPECT_NEAR(tiny.seconds, (8.4 + 14 * 3.4) * 1e-6, 1e-7);
}

TEST(Collective, CompactShapeIsTheTightestPacking) {
  const Fabric fabric = Superpod();
  const PlacementShape one_node = CompactShape(fabric, 8);
  EXPECT_EQ(one_node.domains, 1);
  const PlacementShape one_su = CompactShape(fabric, 256);
  EXPECT_EQ(one_su.domains, 32);
  EXPECT_EQ(one_su.common_tier, 0);
  const PlacementShape everything = CompactShape(fabric, 1016);
  EXPECT_EQ(everything.common_tier, 1);
  EXPECT_DOUBLE_EQ(everything.path_oversubscription, 1);
}

TEST(Collective, BadPlacementsAreErrors) {
  const Fabric fabric = Superpod();
  const int node = fabric.FindNode("su1-dgx01");
  EXPECT_THAT(ShapeOf(fabric, {{node, 8}, {node, 8}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"su1-dgx01\" given twice")));
  EXPECT_THAT(ShapeOf(fabric, {{node, 9}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("9 GPUs on node \"su1-dgx01\"")));
  EXPECT_THAT(ShapeOf(fabric, {{-1, 1}}), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace gpufleet::fabric
