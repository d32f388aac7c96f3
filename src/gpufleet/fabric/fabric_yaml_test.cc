// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/fabric_yaml.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/fabric/analysis.h"

namespace gpufleet::fabric {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr std::string_view kFull = R"(name: lab
tiers: [leaf, spine]
nodes:
  - names: "gpu[01-04]"
    gpus: 8
    gpu_model: H200-141GB
    nics: 4
    nic_speed: 200G
    nvlink_bandwidth: 450GB/s
    cpus: 96
    memory: 1024Gi
  - {names: mgmt, gpus: 0, nics: 1, nic_speed: 100G}
switches:
  - {names: "leaf[1-2]", tier: leaf, ports: 32, port_speed: 200G, group: row1}
  - {names: spine1, tier: spine, ports: 64, port_speed: 400G, slurm_link_speed: "900"}
links:
  - {from: "gpu[01-02]", to: leaf1, nics: all}
  - {from: "gpu[03-04]", to: leaf2, nics: [0, 1, 2, 3]}
  - {from: mgmt, to: leaf1, nics: 0, speed: 100G}
  - {from: "leaf[1-2]", to: spine1, count: 4, speed: 400G}
slurm:
  block_sizes: [2, 4]
)";

TEST(FabricYaml, ReadsEveryField) {
  auto spec = ParseFabricYaml(kFull, "lab.yaml");
  ASSERT_OK(spec);
  EXPECT_EQ(spec->name, "lab");
  EXPECT_THAT(spec->tiers, ElementsAre("leaf", "spine"));
  ASSERT_EQ(spec->nodes.size(), 2u);
  const NodeGroupSpec& gpu = spec->nodes[0];
  EXPECT_EQ(gpu.names, "gpu[01-04]");
  EXPECT_EQ(gpu.gpu_model, "H200-141GB");
  EXPECT_EQ(gpu.nics, 4);
  EXPECT_EQ(gpu.nic_speed_mbps, 200000);
  EXPECT_EQ(gpu.nvlink_mbps, 3600000);
  EXPECT_EQ(gpu.cpu_milli, 96000);
  EXPECT_EQ(gpu.memory_mib, 1024 * 1024);
  EXPECT_EQ(gpu.source.line, 4);
  EXPECT_EQ(spec->switches[0].group, "row1");
  EXPECT_EQ(spec->switches[1].slurm_link_speed, "900");
  EXPECT_THAT(spec->links[1].nics, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(spec->links[2].nics, ElementsAre(0));
  EXPECT_EQ(spec->links[3].count, 4);
  EXPECT_EQ(spec->links[3].speed_mbps, 400000);
  EXPECT_THAT(spec->slurm_block_sizes, ElementsAre(2, 4));
  auto fabric = Fabric::Build(*spec);
  ASSERT_OK(fabric);
  EXPECT_EQ(fabric->switches()[fabric->FindSwitch("leaf1")].up_mbps, 4 * 400000);
}

TEST(FabricYaml, WritesWhatItReads) {
  auto spec = ParseFabricYaml(kFull, "lab.yaml");
  ASSERT_OK(spec);
  const std::string written = WriteFabricYaml(*spec);
  auto again = ParseFabricYaml(written, "written.yaml");
  ASSERT_OK(again);
  EXPECT_EQ(WriteFabricYaml(*again), written);
  auto a = Fabric::Build(*spec);
  auto b = Fabric::Build(*again);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(FormatReport(Analyze(*a)), FormatReport(Analyze(*b)));
}

TEST(FabricYaml, ErrorsNameFileLineAndFieldPath) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"tiers: [leaf]\nnodes:\n  - {names: n1, colour: red}\n",
       "f.yaml:3: nodes[0].colour: unknown field"},
      {"tiers: [leaf]\nnodes:\n  - {gpus: 8}\n", "f.yaml:3: nodes[0].names: missing"},
      {"tiers: [leaf]\nswitches:\n  - {names: s, tier: leaf}\nlinks:\n  - {from: n1, to: s, "
       "speed: -400G}\n",
       "f.yaml:5: links[0].speed: \"-400G\" is negative"},
      {"tiers: [leaf]\nswitches:\n  - {names: s, tier: leaf, ports: many}\n",
       "f.yaml:3: switches[0].ports: \"many\" is not an integer"},
      {"tiers: [leaf]\nnodes:\n  - {names: n1, gpus: 99}\n",
       "f.yaml:3: nodes[0].gpus: 99 is out of range [0, 64]"},
      {"tiers: [leaf]\nlinks:\n  - {from: a, to: b, pattern: star}\n",
       "f.yaml:3: links[0].pattern: unknown pattern \"star\""},
      {"tiers: [leaf\nnodes: []\n", "f.yaml:2: malformed YAML"},
      {"- just a list\n", "f.yaml:1: (document): expected a mapping"},
      {"tiers: [leaf]\nnodes:\n  - {names: n1, memory: lots}\n",
       "f.yaml:3: nodes[0].memory: \"lots\" is not a size"},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    EXPECT_THAT(ParseFabricYaml(text, "f.yaml"),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(message)));
  }
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(FabricYaml, BundledExampleFabricsBuild) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(GPUFLEET_FABRIC_EXAMPLES_DIR)) {
    if (entry.path().extension() != ".yaml") {
      continue;
    }
    SCOPED_TRACE(entry.path().string());
    auto spec = ParseFabricYaml(ReadFile(entry.path()), entry.path().filename().string());
    ASSERT_OK(spec);
    auto fabric = Fabric::Build(*spec);
    ASSERT_OK(fabric);
    EXPECT_GT(fabric->TotalGpus(), 0);
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

}  // namespace
}  // namespace gpufleet::fabric
