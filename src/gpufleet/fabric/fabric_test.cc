// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/fabric.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/fabric/fabric_yaml.h"

namespace gpufleet::fabric {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

Result<Fabric> FromYaml(std::string_view text) {
  GPUFLEET_ASSIGN_OR_RETURN(FabricSpec spec, ParseFabricYaml(text, "test.yaml"));
  return Fabric::Build(std::move(spec));
}

// Two leaves of two nodes under one spine; every node has two NICs on its leaf.
constexpr std::string_view kTwoLeaves = R"(name: two-leaves
tiers: [leaf, spine]
nodes:
  - {names: "n[1-4]", gpus: 8, nics: 2}
switches:
  - {names: "leaf[1-2]", tier: leaf, ports: 8}
  - {names: spine, tier: spine, ports: 8, group: pod}
links:
  - {from: "n[1-2]", to: leaf1}
  - {from: "n[3-4]", to: leaf2}
  - {from: "leaf[1-2]", to: spine, count: 2}
)";

TEST(Fabric, ExpandsNodesSwitchesAndCables) {
  auto fabric = FromYaml(kTwoLeaves);
  ASSERT_OK(fabric);
  EXPECT_EQ(fabric->nodes().size(), 4u);
  EXPECT_EQ(fabric->switches().size(), 3u);
  EXPECT_EQ(fabric->TotalGpus(), 32);
  const FabricSwitch& leaf = fabric->switches()[fabric->FindSwitch("leaf1")];
  EXPECT_EQ(leaf.used_ports, 6);  // 2 nodes x 2 NICs + 2 uplinks
  EXPECT_EQ(leaf.down_mbps, 4 * 400000);
  EXPECT_EQ(leaf.up_mbps, 2 * 400000);
  const FabricNode& n3 = fabric->nodes()[fabric->FindNode("n3")];
  EXPECT_THAT(n3.nic_switch, ElementsAre(fabric->FindSwitch("leaf2"), fabric->FindSwitch("leaf2")));
}

TEST(Fabric, DomainsFollowTheSwitchesOfEachTier) {
  auto fabric = FromYaml(kTwoLeaves);
  ASSERT_OK(fabric);
  EXPECT_EQ(fabric->DomainCount(0), 2);
  EXPECT_EQ(fabric->DomainName(0, fabric->DomainOf(0, fabric->FindNode("n1"))), "leaf1");
  EXPECT_EQ(fabric->DomainName(0, fabric->DomainOf(0, fabric->FindNode("n4"))), "leaf2");
  EXPECT_EQ(fabric->DomainGpus(0, 0), 16);
  EXPECT_EQ(fabric->DomainCount(1), 1);
  EXPECT_EQ(fabric->DomainName(1, 0), "pod");
  const int n1 = fabric->FindNode("n1");
  const int n2 = fabric->FindNode("n2");
  const int n3 = fabric->FindNode("n3");
  EXPECT_EQ(fabric->CommonTier({n1}), -1);
  EXPECT_EQ(fabric->CommonTier({n1, n2}), 0);
  EXPECT_EQ(fabric->CommonTier({n1, n3}), 1);
}

TEST(Fabric, RailLeavesOfOneGroupFormOneDomain) {
  auto fabric = FromYaml(R"(tiers: [leaf, spine]
nodes:
  - {names: "a[1-2]", nics: 2}
switches:
  - {names: "su1-rail[1-2]", tier: leaf, group: su1}
  - {names: s, tier: spine}
links:
  - {from: "a[1-2]", to: "su1-rail[1-2]", pattern: rails}
  - {from: "su1-rail[1-2]", to: s}
)");
  ASSERT_OK(fabric);
  EXPECT_EQ(fabric->DomainCount(0), 1);
  EXPECT_EQ(fabric->DomainName(0, 0), "su1");
  const FabricNode& a2 = fabric->nodes()[fabric->FindNode("a2")];
  EXPECT_THAT(a2.nic_switch,
              ElementsAre(fabric->FindSwitch("su1-rail1"), fabric->FindSwitch("su1-rail2")));
}

TEST(Fabric, LinkToAnUnknownSwitchNamesFileLineAndElement) {
  EXPECT_THAT(FromYaml(R"(tiers: [leaf]
nodes:
  - {names: n1}
switches:
  - {names: leaf1, tier: leaf}
links:
  - {from: n1, to: leaf9}
)"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("test.yaml:7: links[0].to: unknown switch \"leaf9\"")));
}

TEST(Fabric, PortCountExceededNamesTheSwitchAndLink) {
  EXPECT_THAT(FromYaml(R"(tiers: [leaf]
nodes:
  - {names: "n[1-3]", nics: 2}
switches:
  - {names: leaf1, tier: leaf, ports: 5}
links:
  - {from: "n[1-3]", to: leaf1}
)"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("test.yaml:7: links[0]: switch \"leaf1\" has 5 ports; this link "
                                 "needs port 6")));
}

TEST(Fabric, LinkInsideATierIsALoop) {
  EXPECT_THAT(FromYaml(R"(tiers: [leaf, spine]
switches:
  - {names: "leaf[1-2]", tier: leaf}
links:
  - {from: leaf1, to: leaf2}
)"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("test.yaml:5: links[0]: \"leaf1\" and \"leaf2\" are both in tier "
                                 "\"leaf\": a link inside a tier would make a loop")));
}

TEST(Fabric, OtherBadDescriptionsNameTheElement) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"tiers: [leaf]\nswitches:\n  - {names: s, tier: spine}\n",
       "test.yaml:3: switches[0].tier: unknown tier \"spine\" (tiers: leaf)"},
      {"tiers: [leaf]\nnodes:\n  - {names: n1}\n  - {names: n1}\n",
       "test.yaml:4: nodes[1].names: duplicate node \"n1\""},
      {"tiers: [leaf]\nnodes:\n  - {names: n1, nics: 1}\nswitches:\n  - {names: \"l[1-2]\", "
       "tier: leaf}\nlinks:\n  - {from: n1, to: \"l[1-2]\"}\n",
       "test.yaml:7: links[0]: NIC 0 of node \"n1\" is already cabled to \"l1\""},
      {"tiers: [leaf]\nnodes:\n  - {names: n1, nics: 1}\nswitches:\n  - {names: l1, tier: leaf}\n"
       "links:\n  - {from: n1, to: l1, nics: [3]}\n",
       "test.yaml:7: links[0].nics: NIC 3 of node \"n1\" does not exist (it has 1)"},
      {"tiers: [leaf]\nnodes:\n  - {names: n1}\nlinks:\n  - {from: n1, to: n1}\n",
       "test.yaml:5: links[0].to: \"n1\" is a node; a link goes up to a switch"},
      {"tiers: [node]\n", "tiers[0]: \"node\" is reserved"},
      {"tiers: [leaf]\nnodes:\n  - {names: \"n[1-2]\"}\nnvlink_domains:\n  - {name: r1, nodes: "
       "\"n[1-2]\"}\n  - {name: r2, nodes: n2}\n",
       "test.yaml:6: nvlink_domains[1].nodes: node \"n2\" is already in NVLink domain \"r1\""},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    EXPECT_THAT(FromYaml(text), StatusIs(StatusCode::kInvalidArgument, HasSubstr(message)));
  }
}

TEST(Fabric, GeneratedSpecsWithoutLinesStillNameTheElement) {
  FabricSpec spec;
  spec.tiers = {"leaf"};
  NodeGroupSpec group;
  group.names = "n1";
  group.gpus = -1;
  group.source.path = "nodes[0]";
  spec.nodes.push_back(group);
  EXPECT_THAT(Fabric::Build(spec),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("nodes[0].gpus: -1 is negative")));
}

TEST(Fabric, BuildsTheSchedulersClusterWithTopologyLevels) {
  auto fabric = FromYaml(kTwoLeaves);
  ASSERT_OK(fabric);
  auto cluster = BuildCluster(*fabric, GpuCatalog::Default());
  ASSERT_OK(cluster);
  EXPECT_THAT(cluster->topology.levels(), ElementsAre("spine", "leaf"));
  ASSERT_EQ(cluster->nodes.size(), 4u);
  EXPECT_EQ(cluster->nodes[2].id.value(), "n3");
  EXPECT_THAT(cluster->nodes[2].topology, ElementsAre("pod", "leaf2"));
  EXPECT_EQ(cluster->nodes[2].gpus.size(), 8u);
  EXPECT_EQ(cluster->nodes[2].gpus[0].model, "H100-80GB");
  EXPECT_EQ(cluster->nodes[2].fault_domains.at("rack"), "leaf2");
  EXPECT_OK(cluster->Validate(GpuCatalog::Default()));
}

TEST(Fabric, NvlinkDomainsAcrossNodesBecomeALevel) {
  auto fabric = FromYaml(R"(tiers: [leaf]
nodes:
  - {names: "r1-t[1-2]", gpus: 4, gpu_model: GB200, nics: 1}
  - {names: "r2-t[1-2]", gpus: 4, gpu_model: GB200, nics: 1}
nvlink_domains:
  - {name: r1, nodes: "r1-t[1-2]", bandwidth: 900GB/s}
  - {name: r2, nodes: "r2-t[1-2]", bandwidth: 900GB/s}
switches:
  - {names: leaf, tier: leaf}
links:
  - {from: "r[1-2]-t[1-2]", to: leaf}
)");
  ASSERT_OK(fabric);
  EXPECT_EQ(fabric->NvlinkDomainGpus(0), 8);
  EXPECT_EQ(fabric->CommonTier({0, 1}), -1);
  EXPECT_EQ(fabric->CommonTier({0, 2}), 0);
  EXPECT_EQ(fabric->nodes()[0].nvlink_mbps, 7200000);
  auto cluster = BuildCluster(*fabric, GpuCatalog::Default());
  ASSERT_OK(cluster);
  EXPECT_THAT(cluster->topology.levels(), ElementsAre("leaf", "nvlink-domain"));
  EXPECT_THAT(cluster->nodes[3].topology, ElementsAre("leaf", "r2"));
  EXPECT_EQ(cluster->nodes[3].fault_domains.at("rack"), "r2");
}

TEST(Fabric, ClusterOfAnUnknownGpuModelNamesTheNode) {
  auto fabric = FromYaml("tiers: [leaf]\nnodes:\n  - {names: x1, gpu_model: X9000}\n");
  ASSERT_OK(fabric);
  EXPECT_THAT(BuildCluster(*fabric, GpuCatalog::Default()),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("node \"x1\": gpu_model: unknown GPU model \"X9000\"")));
}

}  // namespace
}  // namespace gpufleet::fabric
