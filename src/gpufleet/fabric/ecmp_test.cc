// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/ecmp.h"

#include <cmath>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/fabric/fabric_yaml.h"
#include "gpufleet/fabric/generators.h"

namespace gpufleet::fabric {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

TEST(Ecmp, Crc32IsTheStandardChecksum) {
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926U);
  EXPECT_EQ(Crc32(""), 0U);
}

TEST(Ecmp, HashDependsOnTheSourcePortAndTheSeed) {
  FiveTuple a;
  a.source_ip = 0x0A000001;
  a.destination_ip = 0x0A000002;
  a.source_port = 50000;
  FiveTuple b = a;
  b.source_port = 50001;
  EXPECT_EQ(HashFiveTuple(a, 7), HashFiveTuple(a, 7));
  EXPECT_NE(HashFiveTuple(a, 7), HashFiveTuple(b, 7));
  EXPECT_NE(HashFiveTuple(a, 7), HashFiveTuple(a, 8));
}

// k flows hashed onto n paths, 10^5 trials: the mean number of paths used within 1 % of
// n(1 - (1 - 1/n)^k), and the share of trials without a collision within four standard errors of
// n! / ((n - k)! n^k).
TEST(Ecmp, MonteCarloMatchesTheClosedForms) {
  constexpr int kTrials = 100000;
  const std::pair<int, int> cases[] = {{8, 8}, {32, 4}, {32, 32}, {16, 8}, {2, 2}, {64, 16}};
  for (const auto& [paths, flows] : cases) {
    SCOPED_TRACE(fmt::format("n={} k={}", paths, flows));
    const PathUse use = SimulatePathUse(paths, flows, kTrials, 2024);
    const double expected = ExpectedPathsUsed(paths, flows);
    EXPECT_NEAR(use.mean_paths_used, expected, 0.01 * expected);
    const double p = NoCollisionProbability(paths, flows);
    const double standard_error = std::sqrt(p * (1 - p) / kTrials);
    EXPECT_NEAR(use.no_collision_fraction, p, 4 * standard_error + 1e-9);
  }
  EXPECT_NEAR(ExpectedPathsUsed(32, 32) / 32, 0.638, 0.001);
  EXPECT_NEAR(NoCollisionProbability(8, 8), 2.4e-3, 0.1e-3);
  EXPECT_NEAR(1 - NoCollisionProbability(32, 8), 0.614, 0.001);
}

// Four leaves of eight hosts, eight spines, one cable from every leaf to every spine; host i of
// each leaf sends to host i of the next leaf, as in docs/fabric.md's Monte-Carlo table.
constexpr std::string_view kLeafSpine = R"(tiers: [leaf, spine]
nodes:
  - {names: "h[1-4]-[1-8]", gpus: 1, nics: 1}
switches:
  - {names: "leaf[1-4]", tier: leaf, ports: 16}
  - {names: "spine[1-8]", tier: spine, ports: 4}
links:
  - {from: "h1-[1-8]", to: leaf1}
  - {from: "h2-[1-8]", to: leaf2}
  - {from: "h3-[1-8]", to: leaf3}
  - {from: "h4-[1-8]", to: leaf4}
  - {from: "leaf[1-4]", to: "spine[1-8]"}
)";

std::vector<Flow> NextLeafFlows(const Fabric& fabric) {
  std::vector<Flow> flows;
  for (int leaf = 1; leaf <= 4; ++leaf) {
    for (int host = 1; host <= 8; ++host) {
      const int next = leaf % 4 + 1;
      flows.push_back(Flow{fabric.FindNode(fmt::format("h{}-{}", leaf, host)), 0,
                           fabric.FindNode(fmt::format("h{}-{}", next, host)), 0});
    }
  }
  return flows;
}

double MeanCollectiveRatio(const Fabric& fabric, int queue_pairs, int trials) {
  const std::vector<Flow> flows = NextLeafFlows(fabric);
  double sum = 0;
  for (int trial = 0; trial < trials; ++trial) {
    EcmpOptions options;
    options.queue_pairs = queue_pairs;
    options.seed = 1000 + static_cast<uint64_t>(trial);
    auto result = SimulateEcmp(fabric, flows, options);
    EXPECT_OK(result);
    sum += result->collective_ratio;
  }
  return sum / trials;
}

TEST(Ecmp, LeafSpineCollisionsMatchTheMonteCarloTable) {
  auto fabric = Fabric::Build(*ParseFabricYaml(kLeafSpine, "leaf-spine.yaml"));
  ASSERT_OK(fabric);
  // Uniform hashing gives 0.315 with one queue pair and 0.483 with four.
  EXPECT_NEAR(MeanCollectiveRatio(*fabric, 1, 400), 0.315, 0.03);
  EXPECT_NEAR(MeanCollectiveRatio(*fabric, 4, 400), 0.483, 0.03);
}

TEST(Ecmp, ReportsLoadsCollisionsAndIdeal) {
  auto fabric = Fabric::Build(*ParseFabricYaml(kLeafSpine, "leaf-spine.yaml"));
  ASSERT_OK(fabric);
  EcmpOptions options;
  options.seed = 3;
  auto result = SimulateEcmp(*fabric, NextLeafFlows(*fabric), options);
  ASSERT_OK(result);
  EXPECT_EQ(result->flows, 32);
  EXPECT_EQ(result->network_flows, 32);
  EXPECT_EQ(result->fabric_links, 64);  // 32 up and 32 down, all candidates
  EXPECT_DOUBLE_EQ(result->ideal_flow_gbps, 400);
  EXPECT_GT(result->max_subflows_per_link, 1);
  EXPECT_GT(result->colliding_flows, 0);
  EXPECT_LT(result->collective_ratio, 1);
  EXPECT_DOUBLE_EQ(result->min_flow_gbps, 400.0 / result->max_subflows_per_link);
  EXPECT_GE(result->aggregate_ratio, result->collective_ratio);
  EXPECT_LE(result->aggregate_ratio, 1 + 1e-9);
  // Same seed, same result.
  auto again = SimulateEcmp(*fabric, NextLeafFlows(*fabric), options);
  ASSERT_OK(again);
  EXPECT_EQ(again->flow_gbps, result->flow_gbps);
}

TEST(Ecmp, RailAlignedRingInsideOneUnitNeverReachesTheSpine) {
  auto fabric = Fabric::Build(*GenerateSuperpod({}));
  ASSERT_OK(fabric);
  std::vector<PlacedGpus> placement;
  for (int i = 1; i <= 16; ++i) {
    placement.push_back({fabric->FindNode(fmt::format("su2-dgx{:02d}", i)), 8});
  }
  const std::vector<Flow> flows = CollectiveFlows(*fabric, placement, Collective::kAllReduce);
  EXPECT_EQ(flows.size(), 16u * 8);
  auto result = SimulateEcmp(*fabric, flows, {});
  ASSERT_OK(result);
  EXPECT_EQ(result->network_flows, 0);
  EXPECT_EQ(result->fabric_links, 0);
  EXPECT_DOUBLE_EQ(result->collective_ratio, 1);
  EXPECT_DOUBLE_EQ(result->min_flow_gbps, 400);
}

TEST(Ecmp, RingAcrossUnitsCollidesAndMoreQueuePairsHelp) {
  auto fabric = Fabric::Build(*GenerateSuperpod({}));
  ASSERT_OK(fabric);
  // Ranks dealt round-robin over the four units: every ring hop climbs to the spines.
  std::vector<PlacedGpus> placement;
  for (int i = 1; i <= 8; ++i) {
    for (int su = 1; su <= 4; ++su) {
      placement.push_back({fabric->FindNode(fmt::format("su{}-dgx{:02d}", su, i)), 8});
    }
  }
  const std::vector<Flow> flows = CollectiveFlows(*fabric, placement, Collective::kAllReduce);
  double one = 0;
  double eight = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    EcmpOptions options;
    options.seed = seed;
    one += SimulateEcmp(*fabric, flows, options)->collective_ratio;
    options.queue_pairs = 8;
    eight += SimulateEcmp(*fabric, flows, options)->collective_ratio;
  }
  EXPECT_LT(one / 20, 0.9);
  EXPECT_GT(eight, one);
}

TEST(Ecmp, AllToAllOpensEveryPairOnEveryRail) {
  auto fabric = Fabric::Build(*GenerateSuperpod({}));
  ASSERT_OK(fabric);
  const std::vector<PlacedGpus> placement = {{fabric->FindNode("su1-dgx01"), 8},
                                             {fabric->FindNode("su1-dgx02"), 4},
                                             {fabric->FindNode("su3-dgx02"), 8}};
  // su1-dgx02 uses four rails.
  EXPECT_EQ(CollectiveFlows(*fabric, placement, Collective::kAllToAll).size(),
            8u + 4 + 4 + 4 + 8 + 4);
  EXPECT_EQ(CollectiveFlows(*fabric, placement, Collective::kAllReduce).size(), 4u + 4 + 8);
  EXPECT_TRUE(CollectiveFlows(*fabric, {placement[0]}, Collective::kAllReduce).empty());
}

TEST(Ecmp, BadInputsAreErrors) {
  auto fabric = Fabric::Build(*GenerateSuperpod({}));
  ASSERT_OK(fabric);
  EcmpOptions options;
  options.queue_pairs = 0;
  EXPECT_THAT(SimulateEcmp(*fabric, {}, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("queue_pairs: 0")));
  const Flow bad{fabric->FindNode("su1-dgx01"), 9, fabric->FindNode("su1-dgx02"), 0};
  EXPECT_THAT(SimulateEcmp(*fabric, {bad}, {}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("NIC 9 of node su1-dgx01")));
}

}  // namespace
}  // namespace gpufleet::fabric
