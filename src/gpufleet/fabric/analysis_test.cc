// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/analysis.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/fabric/fabric_yaml.h"
#include "gpufleet/fabric/generators.h"

namespace gpufleet::fabric {
namespace {

using ::testing::HasSubstr;

TEST(Analysis, FormatsRatiosAsPeopleWriteThem) {
  EXPECT_EQ(FormatRatio(1.0), "1:1");
  EXPECT_EQ(FormatRatio(3.0), "3:1");
  EXPECT_EQ(FormatRatio(25.6 / 24.0), "1.07:1");
  EXPECT_EQ(FormatRatio(0.5), "1:2");
  EXPECT_EQ(FormatRatio(0), "-");
}

TEST(Analysis, SuperpodReportPrintsCountsAndBisection) {
  auto fabric = Fabric::Build(*GenerateSuperpod({}));
  ASSERT_OK(fabric);
  const std::string text = FormatReport(Analyze(*fabric));
  EXPECT_THAT(text, HasSubstr("127 nodes (1,016 GPUs) + 1 other, 48 switches, 2,044 cables"));
  EXPECT_THAT(text, HasSubstr("cables: node-leaf 1,020; leaf-spine 1,024"));
  EXPECT_THAT(text, HasSubstr("bisection bandwidth: 204.8 Tb/s per direction"));
  EXPECT_THAT(text, HasSubstr("largest job without crossing an oversubscribed tier: 1,016 GPUs"));
  EXPECT_THAT(
      text,
      HasSubstr("note: tier leaf has spare uplink bandwidth (down 408.0 Tb/s, up 409.6 Tb/s)"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("warning")));
}

TEST(Analysis, OversubscribedTierIsAPlainWarningNamingTierAndRatio) {
  auto fabric = Fabric::Build(*ParseFabricYaml(R"(name: small
tiers: [leaf, spine]
nodes:
  - {names: "n[1-8]", nics: 2}
switches:
  - {names: "leaf[1-2]", tier: leaf}
  - {names: spine, tier: spine}
links:
  - {from: "n[1-4]", to: leaf1}
  - {from: "n[5-8]", to: leaf2}
  - {from: "leaf[1-2]", to: spine, count: 2}
)",
                                               "small.yaml"));
  ASSERT_OK(fabric);
  const FabricReport report = Analyze(*fabric);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_THAT(report.warnings[0],
              HasSubstr("tier leaf is not 1:1: oversubscribed 4:1 (down 6.4 Tb/s, up 1.6 Tb/s)"));
  EXPECT_EQ(report.largest_nonblocking_job_gpus, 32);
  EXPECT_THAT(report.nonblocking_limit, HasSubstr("one leaf domain"));
  EXPECT_DOUBLE_EQ(report.bisection_mbps, 1.6e6 / 2);
  EXPECT_THAT(FormatReport(report), HasSubstr("warning: tier leaf is not 1:1"));
}

TEST(Analysis, OneSwitchTooManyIsNamedEvenWhenTheTierIsBalanced) {
  auto fabric = Fabric::Build(*ParseFabricYaml(R"(tiers: [leaf, spine]
nodes:
  - {names: "n[1-4]", nics: 1}
switches:
  - {names: "leaf[1-2]", tier: leaf}
  - {names: spine, tier: spine}
links:
  - {from: "n[1-3]", to: leaf1}
  - {from: n4, to: leaf2}
  - {from: "leaf[1-2]", to: spine, count: 2}
)",
                                               "uneven.yaml"));
  ASSERT_OK(fabric);
  const FabricReport report = Analyze(*fabric);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_THAT(report.warnings[0], HasSubstr("switch leaf1 in tier leaf is oversubscribed 1.50:1"));
}

TEST(Analysis, DisconnectedFabricIsAWarning) {
  auto fabric = Fabric::Build(*ParseFabricYaml(R"(tiers: [leaf]
nodes:
  - {names: "n[1-2]", nics: 1}
switches:
  - {names: "leaf[1-2]", tier: leaf}
links:
  - {from: n1, to: leaf1}
  - {from: n2, to: leaf2}
)",
                                               "apart.yaml"));
  ASSERT_OK(fabric);
  const FabricReport report = Analyze(*fabric);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_THAT(report.warnings[0], HasSubstr("not connected: 2 separate parts"));
  EXPECT_EQ(report.bisection_mbps, 0);
}

}  // namespace
}  // namespace gpufleet::fabric
