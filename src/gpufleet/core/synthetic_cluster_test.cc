// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/synthetic_cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

TEST(SyntheticCluster, BuildsTheRequestedTree) {
  const GpuCatalog catalog = GpuCatalog::Default();
  auto cluster = MakeSyntheticCluster({2, 3, 4, 8, "H100-80GB"}, catalog);
  ASSERT_OK(cluster);
  EXPECT_EQ(cluster->nodes.size(), 24U);
  EXPECT_EQ(cluster->nodes[23].topology, (std::vector<std::string>{"block-1", "leaf-5"}));
  EXPECT_EQ(cluster->nodes[23].gpus.size(), 8U);
  EXPECT_EQ(cluster->nodes[0].fault_domains.at("rack"), "rack-0");
  EXPECT_OK(cluster->Validate(catalog));
}

TEST(SyntheticCluster, TotalNodesLeavesTheLastLeafPartial) {
  const GpuCatalog catalog = GpuCatalog::Default();
  SyntheticClusterSpec spec{1, 8, 32, 8, "V100-32GB"};
  spec.total_nodes = 250;
  auto cluster = MakeSyntheticCluster(spec, catalog);
  ASSERT_OK(cluster);
  EXPECT_EQ(cluster->nodes.size(), 250U);
  EXPECT_EQ(cluster->nodes.back().topology[1], "leaf-7");
}

TEST(SyntheticCluster, RejectsBadSpecs) {
  const GpuCatalog catalog = GpuCatalog::Default();
  EXPECT_THAT(MakeSyntheticCluster({0, 1, 1, 8, "H100-80GB"}, catalog),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("blocks: 0")));
  EXPECT_THAT(MakeSyntheticCluster({1, 1, 1, 8, "Z9"}, catalog),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpu_model: unknown GPU model")));
}

}  // namespace
}  // namespace gpufleet
