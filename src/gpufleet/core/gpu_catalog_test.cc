// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/gpu_catalog.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

TEST(GpuCatalog, KnowsTheProductsTheIssueNames) {
  const GpuCatalog catalog = GpuCatalog::Default();
  for (const char* name : {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "GB200", "L40S",
                           "A10", "T4", "V100", "P100"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(catalog.Contains(name));
  }
}

TEST(GpuCatalog, AliasesResolveToCanonicalNames) {
  const GpuCatalog catalog = GpuCatalog::Default();
  EXPECT_EQ(catalog.Canonical("V100M32"), "V100-32GB");
  EXPECT_EQ(catalog.Canonical("NVIDIA H100 80GB HBM3"), "H100-80GB");
  EXPECT_EQ(catalog.Canonical("no-such-gpu"), "");
}

TEST(GpuCatalog, UnknownModelErrorNamesTheModel) {
  const GpuCatalog catalog = GpuCatalog::Default();
  EXPECT_THAT(catalog.Find("X9000"),
              StatusIs(StatusCode::kNotFound, HasSubstr("unknown GPU model \"X9000\"")));
}

TEST(GpuCatalog, MigProfilesFollowTheUserGuide) {
  const GpuCatalog catalog = GpuCatalog::Default();
  const GpuModelInfo& h100 = **catalog.Find("H100-80GB");
  EXPECT_EQ(h100.MigProfileNames(),
            "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb");
  const MigProfile* three_g = h100.FindMigProfile("3g.40gb");
  ASSERT_NE(three_g, nullptr);
  EXPECT_EQ(three_g->profile_id, 9);
  EXPECT_EQ(three_g->memory_slices, 4);
  EXPECT_EQ(three_g->starts, (std::vector<int>{0, 4}));
  const GpuModelInfo& a100 = **catalog.Find("A100-40GB");
  EXPECT_NE(a100.FindMigProfile("1g.5gb"), nullptr);
  EXPECT_EQ(a100.FindMigProfile("1g.10gb")->memory_slices, 2);
  EXPECT_EQ(catalog.Find("H200-141GB").value()->FindMigProfile("7g.141gb")->memory_slices, 8);
  EXPECT_FALSE(catalog.Find("T4").value()->SupportsMig());
}

TEST(GpuCatalog, RegistersModelsFirstSeenInATrace) {
  GpuCatalog catalog = GpuCatalog::Default();
  EXPECT_FALSE(catalog.Contains("G2"));
  ASSERT_OK(catalog.RegisterTraceModel("G2", 0));
  EXPECT_TRUE(catalog.Find("G2").value()->from_trace);
  EXPECT_OK(catalog.RegisterTraceModel("T4", 0));
  EXPECT_FALSE(catalog.Find("T4").value()->from_trace);
  EXPECT_THAT(catalog.RegisterTraceModel("", 0), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(catalog.RegisterTraceModel("G9", -1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("G9")));
}

}  // namespace
}  // namespace gpufleet
