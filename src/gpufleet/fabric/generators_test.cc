// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/generators.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/fabric/analysis.h"
#include "gpufleet/fabric/fabric_yaml.h"

namespace gpufleet::fabric {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

int SwitchesInTier(const Fabric& fabric, int tier) {
  int count = 0;
  for (const FabricSwitch& entry : fabric.switches()) {
    count += entry.tier == tier ? 1 : 0;
  }
  return count;
}

int64_t Cables(const FabricReport& report, std::string_view lower, std::string_view upper) {
  for (const CableCount& count : report.cables_by_layer) {
    if (count.lower == lower && count.upper == upper) {
      return count.cables;
    }
  }
  return -1;
}

// NVIDIA DGX SuperPOD H100 reference architecture, component counts per number of SUs.
struct SuperpodRow {
  int sus;
  int nodes;
  int gpus;
  int leaves;
  int spines;
  int compute_and_ufm_cables;
  int spine_leaf_cables;
};

TEST(Superpod, ReproducesThePublishedComponentCounts) {
  const SuperpodRow rows[] = {{1, 31, 248, 8, 4, 252, 256},
                              {2, 63, 504, 16, 8, 508, 512},
                              {3, 95, 760, 24, 16, 764, 768},
                              {4, 127, 1016, 32, 16, 1020, 1024}};
  for (const SuperpodRow& row : rows) {
    SCOPED_TRACE(row.sus);
    SuperpodOptions options;
    options.scalable_units = row.sus;
    auto spec = GenerateSuperpod(options);
    ASSERT_OK(spec);
    auto fabric = Fabric::Build(*spec);
    ASSERT_OK(fabric);
    const FabricReport report = Analyze(*fabric);
    EXPECT_EQ(report.nodes, row.nodes);
    EXPECT_EQ(report.gpus, row.gpus);
    EXPECT_EQ(SwitchesInTier(*fabric, 0), row.leaves);
    EXPECT_EQ(SwitchesInTier(*fabric, 1), row.spines);
    EXPECT_EQ(Cables(report, "node", "leaf"), row.compute_and_ufm_cables);
    EXPECT_EQ(Cables(report, "leaf", "spine"), row.spine_leaf_cables);
    EXPECT_TRUE(report.warnings.empty()) << report.warnings.front();
  }
}

TEST(Superpod, FourUnitsHaveFullBisectionOf204Point8Terabits) {
  auto fabric = Fabric::Build(*GenerateSuperpod({}));
  ASSERT_OK(fabric);
  const FabricReport report = Analyze(*fabric);
  EXPECT_DOUBLE_EQ(report.bisection_mbps, 204.8e6);
  EXPECT_DOUBLE_EQ(report.tiers[0].oversubscription, 1020.0 / 1024.0);
  EXPECT_EQ(report.largest_nonblocking_job_gpus, 1016);
  // Rail-aligned: the eight leaves of an SU are one domain, and a node's NIC i is on rail leaf i.
  EXPECT_EQ(fabric->DomainCount(0), 4);
  EXPECT_EQ(fabric->DomainName(0, fabric->DomainOf(0, fabric->FindNode("su3-dgx07"))), "su3");
  const FabricNode& node = fabric->nodes()[fabric->FindNode("su2-dgx05")];
  EXPECT_EQ(fabric->switches()[node.nic_switch[6]].name, "su2-leaf7");
}

TEST(Superpod, MoreUnitsThanTwoTiersHoldIsAnError) {
  SuperpodOptions options;
  options.scalable_units = 8;
  EXPECT_OK(GenerateSuperpod(options));
  options.scalable_units = 9;
  EXPECT_THAT(GenerateSuperpod(options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("scalable_units: 9 SUs")));
  options.scalable_units = 0;
  EXPECT_THAT(GenerateSuperpod(options), StatusIs(StatusCode::kInvalidArgument));
}

TEST(Clos, TwoTiersWithThreeToOneLeavesWarnAndLimitTheNonBlockingJob) {
  ClosOptions options;
  options.leaves_per_pod = 8;
  options.nodes_per_leaf = 6;
  options.leaf_oversubscription = 3;
  auto spec = GenerateClos(options);
  ASSERT_OK(spec);
  auto fabric = Fabric::Build(*spec);
  ASSERT_OK(fabric);
  const FabricReport report = Analyze(*fabric);
  EXPECT_EQ(report.gpus, 8 * 6 * 8);
  EXPECT_DOUBLE_EQ(report.tiers[0].oversubscription, 3.0);
  EXPECT_EQ(Cables(report, "leaf", "spine"), 8 * 16);
  ASSERT_FALSE(report.warnings.empty());
  EXPECT_THAT(report.warnings[0], HasSubstr("tier leaf is not 1:1: oversubscribed 3:1"));
  EXPECT_EQ(report.largest_nonblocking_job_gpus, 48);
  // Bisection: half of the leaves' uplinks, N r / (2 o).
  EXPECT_DOUBLE_EQ(report.bisection_mbps, 8 * 6 * 8 * 400000.0 / (2 * 3));
}

TEST(Clos, ThreeTiersFollowTheFoldedClosCounts) {
  // Radix 8, non-blocking: k^3/4 = 128 endpoints, k pods, (k/2)^2 core switches.
  ClosOptions options;
  options.tiers = 3;
  options.radix = 8;
  options.pods = 8;
  options.leaves_per_pod = 4;
  options.nodes_per_leaf = 4;
  options.gpus_per_node = 1;
  options.nics_per_node = 1;
  auto spec = GenerateClos(options);
  ASSERT_OK(spec);
  auto fabric = Fabric::Build(*spec);
  ASSERT_OK(fabric);
  EXPECT_EQ(fabric->TotalGpus(), 128);
  EXPECT_EQ(SwitchesInTier(*fabric, 0), 32);
  EXPECT_EQ(SwitchesInTier(*fabric, 1), 32);
  EXPECT_EQ(SwitchesInTier(*fabric, 2), 16);
  const FabricReport report = Analyze(*fabric);
  EXPECT_TRUE(report.warnings.empty());
  EXPECT_DOUBLE_EQ(report.bisection_mbps, 128 * 400000.0 / 2);
  EXPECT_EQ(fabric->DomainCount(1), 8);
  EXPECT_EQ(fabric->DomainName(1, fabric->DomainOf(1, fabric->FindNode("node017"))), "pod2");
}

TEST(Clos, ThreeToOneSpineLimitsJobsToOnePod) {
  ClosOptions options;
  options.tiers = 3;
  options.pods = 4;
  options.leaves_per_pod = 4;
  options.nodes_per_leaf = 4;
  options.spine_oversubscription = 3;
  auto fabric = Fabric::Build(*GenerateClos(options));
  ASSERT_OK(fabric);
  const FabricReport report = Analyze(*fabric);
  EXPECT_DOUBLE_EQ(report.tiers[0].oversubscription, 1.0);
  EXPECT_NEAR(report.tiers[1].oversubscription, 3.0, 0.1);
  EXPECT_EQ(report.largest_nonblocking_job_gpus, 4 * 4 * 8);
}

TEST(Clos, DesignsThatDoNotFitTheRadixNameTheOption) {
  ClosOptions options;
  options.nodes_per_leaf = 8;  // 64 NICs down already fill a 64-port leaf
  EXPECT_THAT(GenerateClos(options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("radix: a leaf needs 128 ports")));
  options = {};
  options.tiers = 4;
  EXPECT_THAT(GenerateClos(options), StatusIs(StatusCode::kInvalidArgument, HasSubstr("tiers: 4")));
  options = {};
  options.leaf_oversubscription = -1;
  EXPECT_THAT(GenerateClos(options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("leaf_oversubscription: -1")));
}

TEST(Nvl72, RacksAreNvlinkDomainsOfSeventyTwoGpus) {
  auto spec = GenerateNvl72({});
  ASSERT_OK(spec);
  auto fabric = Fabric::Build(*spec);
  ASSERT_OK(fabric);
  EXPECT_EQ(fabric->nodes().size(), 8u * 18);
  EXPECT_EQ(fabric->TotalGpus(), 576);
  ASSERT_EQ(fabric->nvlink_domains().size(), 8u);
  EXPECT_EQ(fabric->NvlinkDomainGpus(fabric->FindNode("rack03-tray17")), 72);
  const FabricReport report = Analyze(*fabric);
  EXPECT_TRUE(report.warnings.empty());
  EXPECT_EQ(Cables(report, "node", "leaf"), 8 * 18 * 4);
  EXPECT_EQ(report.largest_nonblocking_job_gpus, 576);
  auto cluster = BuildCluster(*fabric, GpuCatalog::Default());
  ASSERT_OK(cluster);
  EXPECT_THAT(cluster->topology.levels(), ElementsAre("spine", "leaf", "nvlink-domain"));
  EXPECT_THAT(cluster->nodes[20].topology, ElementsAre("gb200-nvl72-8racks", "rack02", "rack02"));
}

TEST(Generators, OutputRoundTripsThroughYaml) {
  for (auto spec : {GenerateSuperpod({}), GenerateClos({}), GenerateNvl72({})}) {
    ASSERT_OK(spec);
    auto again = ParseFabricYaml(WriteFabricYaml(*spec), "generated.yaml");
    ASSERT_OK(again);
    auto a = Fabric::Build(*spec);
    auto b = Fabric::Build(*again);
    ASSERT_OK(a);
    ASSERT_OK(b);
    EXPECT_EQ(FormatReport(Analyze(*a)), FormatReport(Analyze(*b)));
  }
}

}  // namespace
}  // namespace gpufleet::fabric
