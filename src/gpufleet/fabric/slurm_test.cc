// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/slurm.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/fabric/generators.h"
#include "gpufleet/fabric/hostlist.h"

namespace gpufleet::fabric {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The example of Slurm's topology.conf documentation.
constexpr std::string_view kTree = R"(# tree example
SwitchName=s0 Nodes=tux[0-3]   LinkSpeed=900
SwitchName=s1 Nodes=tux[4-7]   LinkSpeed=900
SwitchName=s2 Nodes=tux[8-11]  LinkSpeed=900
SwitchName=s3 Nodes=tux[12-15] LinkSpeed=1800
SwitchName=s4 Switches=s[0-3]  LinkSpeed=1800
SwitchName=s5 Switches=s[0-3]  LinkSpeed=1800
SwitchName=s6 Switches=s[0-3]  LinkSpeed=1800
SwitchName=s7 Switches=s[0-3]  LinkSpeed=1800
)";

constexpr std::string_view kBlock = R"(BlockName=block1 Nodes=node[1-32]
BlockName=block2 Nodes=node[33-64]
BlockName=block3 Nodes=node[65-96]
BlockName=block4 Nodes=node[97-128]
BlockSizes=30,120
)";

// What Slurm reads from a topology.conf: per switch its nodes, children and link speed.
struct SlurmView {
  std::map<std::string, std::set<std::string>> nodes;
  std::map<std::string, std::set<std::string>> children;
  std::map<std::string, std::string> link_speed;
  std::vector<std::string> other_lines;
};

SlurmView Read(std::string_view text) {
  SlurmView view;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    const std::string line(text.substr(begin, end - begin));
    begin = end + 1;
    if (line.empty() || line[0] == '#') {
      continue;
    }
    if (line.rfind("SwitchName=", 0) != 0) {
      view.other_lines.push_back(line);
      continue;
    }
    std::string name;
    size_t at = 0;
    while (at < line.size()) {
      const size_t space = std::min(line.find(' ', at), line.size());
      const std::string token = line.substr(at, space - at);
      at = space + 1;
      if (token.empty()) {
        continue;
      }
      const size_t equals = token.find('=');
      const std::string key = token.substr(0, equals);
      const std::string value = token.substr(equals + 1);
      if (key == "SwitchName") {
        name = value;
        view.nodes[name];
        view.children[name];
      } else if (key == "Nodes" || key == "Switches") {
        const Result<std::vector<std::string>> names = ExpandHostlist(value);
        EXPECT_OK(names);
        if (names.ok()) {
          (key == "Nodes" ? view.nodes : view.children)[name].insert(names->begin(), names->end());
        }
      } else if (key == "LinkSpeed") {
        view.link_speed[name] = value;
      }
    }
  }
  return view;
}

TEST(Slurm, ImportsTheTreeExample) {
  auto spec = ImportSlurmTopology(kTree, "topology.conf");
  ASSERT_OK(spec);
  EXPECT_THAT(spec->tiers, ElementsAre("leaf", "spine"));
  auto fabric = Fabric::Build(*spec);
  ASSERT_OK(fabric);
  EXPECT_EQ(fabric->nodes().size(), 16u);
  EXPECT_EQ(fabric->switches().size(), 8u);
  EXPECT_EQ(fabric->switches()[fabric->FindSwitch("s5")].tier, 1);
  EXPECT_EQ(fabric->DomainName(0, fabric->DomainOf(0, fabric->FindNode("tux9"))), "s2");
  EXPECT_EQ(fabric->CommonTier({fabric->FindNode("tux0"), fabric->FindNode("tux15")}), 1);
}

TEST(Slurm, TreeRoundTripKeepsEverySwitchAndNode) {
  auto fabric = Fabric::Build(*ImportSlurmTopology(kTree, "topology.conf"));
  ASSERT_OK(fabric);
  auto exported = ExportSlurmTopology(*fabric, SlurmTopologyKind::kTree);
  ASSERT_OK(exported);
  const SlurmView before = Read(kTree);
  const SlurmView after = Read(*exported);
  EXPECT_EQ(after.nodes, before.nodes);
  EXPECT_EQ(after.children, before.children);
  EXPECT_EQ(after.link_speed, before.link_speed);
  EXPECT_THAT(*exported, HasSubstr("SwitchName=s4 Switches=s[0-3] LinkSpeed=1800\n"));
  // And once more through an import.
  auto again = Fabric::Build(*ImportSlurmTopology(*exported, "exported.conf"));
  ASSERT_OK(again);
  const SlurmView twice = Read(*ExportSlurmTopology(*again, SlurmTopologyKind::kTree));
  EXPECT_EQ(twice.nodes, before.nodes);
  EXPECT_EQ(twice.children, before.children);
  EXPECT_EQ(twice.link_speed, before.link_speed);
}

TEST(Slurm, BlockRoundTripKeepsBlocksNodesAndSizes) {
  auto spec = ImportSlurmTopology(kBlock, "blocks.conf");
  ASSERT_OK(spec);
  auto fabric = Fabric::Build(*spec);
  ASSERT_OK(fabric);
  EXPECT_EQ(fabric->nodes().size(), 128u);
  EXPECT_EQ(fabric->nvlink_domains().size(), 4u);
  auto exported = ExportSlurmTopology(*fabric, SlurmTopologyKind::kBlock);
  ASSERT_OK(exported);
  EXPECT_THAT(*exported, HasSubstr("BlockName=block1 Nodes=node[1-32]\n"));
  EXPECT_THAT(*exported, HasSubstr("BlockName=block4 Nodes=node[97-128]\n"));
  EXPECT_THAT(*exported, HasSubstr("BlockSizes=30,120\n"));
}

TEST(Slurm, RailLeavesFoldIntoOneSwitchPerScalableUnit) {
  auto fabric = Fabric::Build(*GenerateSuperpod({}));
  ASSERT_OK(fabric);
  auto exported = ExportSlurmTopology(*fabric, SlurmTopologyKind::kTree);
  ASSERT_OK(exported);
  const SlurmView view = Read(*exported);
  EXPECT_EQ(view.nodes.size(), 4u + 16u);
  EXPECT_EQ(view.nodes.at("su1").size(), 31u);
  EXPECT_EQ(view.nodes.at("su4").size(), 32u);
  EXPECT_THAT(view.children.at("spine07"), ElementsAre("su1", "su2", "su3", "su4"));
  EXPECT_EQ(view.nodes.count("ufm"), 0u);
  // Exported and imported again: the same SU domains for the scheduler.
  auto again = Fabric::Build(*ImportSlurmTopology(*exported, "superpod.conf"));
  ASSERT_OK(again);
  EXPECT_EQ(again->nodes().size(), 127u);
  EXPECT_EQ(again->DomainCount(0), 4);
}

// What `gpufleet fabric generate nvl72 --format slurm-block` writes reads back to the same racks:
// one block per NVLink domain, each with the domain's nodes, and the doublings of a rack as sizes.
TEST(Slurm, Nvl72RacksExportAsBlocksThatReadBackToTheSameNvlinkDomains) {
  Nvl72Options options;
  options.racks = 3;
  auto generated = Fabric::Build(*GenerateNvl72(options));
  ASSERT_OK(generated);
  auto exported = ExportSlurmTopology(*generated, SlurmTopologyKind::kBlock);
  ASSERT_OK(exported);
  EXPECT_THAT(*exported, HasSubstr("# TopologyPlugin=topology/block\n"));
  EXPECT_THAT(*exported, HasSubstr("BlockName=rack01 Nodes=rack01-tray[01-18]\n"));
  EXPECT_THAT(*exported, HasSubstr("BlockName=rack03 Nodes=rack03-tray[01-18]\n"));
  // 18, 36: a third doubling (72) would exceed the 54 nodes of three racks.
  EXPECT_THAT(*exported, HasSubstr("BlockSizes=18,36\n"));

  auto spec = ImportSlurmTopology(*exported, "blocks.conf");
  ASSERT_OK(spec);
  EXPECT_THAT(spec->slurm_block_sizes, ElementsAre(18, 36));
  auto again = Fabric::Build(*spec);
  ASSERT_OK(again);
  ASSERT_EQ(again->nvlink_domains().size(), generated->nvlink_domains().size());
  for (size_t d = 0; d < generated->nvlink_domains().size(); ++d) {
    const NvlinkDomain& before = generated->nvlink_domains()[d];
    const NvlinkDomain& after = again->nvlink_domains()[d];
    SCOPED_TRACE(before.name);
    EXPECT_EQ(after.name, before.name);
    ASSERT_EQ(after.nodes.size(), before.nodes.size());
    for (size_t n = 0; n < before.nodes.size(); ++n) {
      EXPECT_EQ(again->nodes()[after.nodes[n]].name, generated->nodes()[before.nodes[n]].name);
    }
  }
  // Exported once more: the same lines, sizes included (only the fabric's name in the header
  // comment is the file's now).
  auto twice = ExportSlurmTopology(*again, SlurmTopologyKind::kBlock);
  ASSERT_OK(twice);
  EXPECT_EQ(twice->substr(twice->find("BlockName=")),
            exported->substr(exported->find("BlockName=")));
}

// A fabric without NVLink domains that span nodes (HGX nodes under leaves) has its leaf domains
// as blocks, so `--format slurm-block` works on every generator.
TEST(Slurm, ClosWithoutMultiNodeNvlinkExportsLeavesAsBlocks) {
  ClosOptions options;
  options.leaves_per_pod = 2;
  options.nodes_per_leaf = 4;
  options.nics_per_node = 1;
  auto fabric = Fabric::Build(*GenerateClos(options));
  ASSERT_OK(fabric);
  auto exported = ExportSlurmTopology(*fabric, SlurmTopologyKind::kBlock);
  ASSERT_OK(exported);
  const std::vector<std::string> lines = [&] {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t end; (end = exported->find('\n', start)) != std::string::npos; start = end + 1) {
      const std::string line = exported->substr(start, end - start);
      if (!line.starts_with("#")) {
        out.push_back(line);
      }
    }
    return out;
  }();
  ASSERT_EQ(lines.size(), 3u) << *exported;
  EXPECT_THAT(lines[0], ::testing::StartsWith("BlockName="));
  EXPECT_THAT(lines[1], ::testing::StartsWith("BlockName="));
  EXPECT_EQ(lines[2], "BlockSizes=4,8");
  auto again = Fabric::Build(*ImportSlurmTopology(*exported, "leaves.conf"));
  ASSERT_OK(again);
  EXPECT_EQ(again->nodes().size(), 8u);
  EXPECT_EQ(again->nvlink_domains().size(), 2u);
}

TEST(Slurm, MalformedFilesNameFileLineAndElement) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"SwitchName=s0 Nodes=tux[0-3]\nSwitchName s1 Nodes=tux[4-7]\n",
       "topo.conf:2: malformed \"SwitchName\" (expected Key=Value"},
      {"SwitchName=s0 Nodes=tux[0-3] Speed=9\n", "topo.conf:1: Speed: unknown key"},
      {"SwitchName=s0 Nodes=tux[0-3\n", "topo.conf:1: Nodes: hostlist \"tux[0-3\": unbalanced"},
      {"SwitchName=s0 Nodes=a1\nSwitchName=s9 Switches=s[0-1]\n",
       "topo.conf:2: Switches: unknown switch \"s1\" under \"s9\""},
      {"SwitchName=s0 Switches=s1\nSwitchName=s1 Switches=s0\n",
       "topo.conf:2: Switches: loop in the tree: s0 -> s1 -> s0"},
      {"SwitchName=s0 Nodes=a[1-2]\nSwitchName=s1 Nodes=a2\n",
       "topo.conf:2: Nodes: node \"a2\" is under \"s0\" (line 1) and \"s1\""},
      {"SwitchName=s0 Nodes=a1\nSwitchName=s0 Nodes=a2\n",
       "topo.conf:2: SwitchName: duplicate switch \"s0\""},
      {"SwitchName=s0 Nodes=a1\nBlockName=b1 Nodes=a2\n",
       "topo.conf:2: tree (SwitchName) and "
       "block (BlockName) lines"},
      {"BlockName=b1 Nodes=a[1-2]\nBlockSizes=2,x\n",
       "topo.conf:2: BlockSizes: \"x\" is not a positive number"},
      {"Nodes=a1\n", "topo.conf:1: Nodes: a line starts with SwitchName"},
      {"SwitchName=s0 Nodes=\n", "topo.conf:1: Nodes: empty value"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    EXPECT_THAT(ImportSlurmTopology(text, "topo.conf"),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(message)));
  }
}

}  // namespace
}  // namespace gpufleet::fabric
