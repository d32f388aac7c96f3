// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/mig.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

class MigLayoutTest : public ::testing::Test {
 protected:
  const MigProfile& Profile(const char* name) { return *h100_.FindMigProfile(name); }

  GpuCatalog catalog_ = GpuCatalog::Default();
  const GpuModelInfo& h100_ = **catalog_.Find("H100-80GB");
};

TEST_F(MigLayoutTest, EmptyGpuTakesEveryProfileAtItsFirstStart) {
  MigLayout layout;
  for (const MigProfile& profile : h100_.mig_profiles) {
    SCOPED_TRACE(profile.name);
    EXPECT_EQ(layout.FindStart(profile), 0);
  }
}

TEST_F(MigLayoutTest, SevenSingleSlicesFillTheGpu) {
  MigLayout layout;
  for (int i = 0; i < 7; ++i) {
    auto start = layout.FindStart(Profile("1g.10gb"));
    ASSERT_TRUE(start.has_value());
    EXPECT_EQ(*start, i);
    layout.Add(Profile("1g.10gb"), *start);
  }
  // Slice 7 is free, but no 1g profile may start there and the 7 SM slices are spent.
  EXPECT_EQ(layout.free_memory_slices(), 1);
  EXPECT_FALSE(layout.FindStart(Profile("1g.10gb")).has_value());
}

// 4 free slices in total (1, 3, 5, 7), yet no 2-slice profile has a valid start on them.
TEST_F(MigLayoutTest, FreeSlicesWithoutAValidStartDoNotFit) {
  MigLayout layout;
  for (int start : {0, 2, 4, 6}) {
    layout.Add(Profile("1g.10gb"), start);
  }
  EXPECT_EQ(layout.free_memory_slices(), 4);
  EXPECT_FALSE(layout.FindStart(Profile("1g.20gb")).has_value());
  EXPECT_FALSE(layout.FindStart(Profile("2g.20gb")).has_value());
  EXPECT_EQ(layout.FindStart(Profile("1g.10gb")), 1);
}

TEST_F(MigLayoutTest, FourGAlwaysTakesTheLowHalf) {
  MigLayout layout;
  layout.Add(Profile("3g.40gb"), 4);
  EXPECT_EQ(layout.FindStart(Profile("4g.40gb")), 0);
  MigLayout other;
  other.Add(Profile("1g.10gb"), 0);
  EXPECT_FALSE(other.FindStart(Profile("4g.40gb")).has_value());
  EXPECT_EQ(other.FindStart(Profile("3g.40gb")), 4);
}

TEST_F(MigLayoutTest, MediaExtensionProfileAtMostOnce) {
  MigLayout layout;
  layout.Add(Profile("1g.10gb+me"), 0);
  EXPECT_FALSE(layout.FindStart(Profile("1g.10gb+me")).has_value());
  layout.Remove(Profile("1g.10gb+me"), 0);
  EXPECT_EQ(layout.FindStart(Profile("1g.10gb+me")), 0);
  EXPECT_TRUE(layout.empty());
}

TEST_F(MigLayoutTest, FromInstancesRejectsBadLayouts) {
  EXPECT_OK(MigLayout::FromInstances(h100_, {{"4g.40gb", 0}, {"3g.40gb", 4}}));
  EXPECT_THAT(MigLayout::FromInstances(h100_, {{"3g.45gb", 0}}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("unknown profile \"3g.45gb\" for H100-80GB (valid: 1g.10gb")));
  EXPECT_THAT(MigLayout::FromInstances(h100_, {{"3g.40gb", 2}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("not a valid start slot")));
  EXPECT_THAT(MigLayout::FromInstances(h100_, {{"2g.20gb", 0}, {"1g.10gb", 1}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("overlaps")));
  EXPECT_THAT(MigLayout::FromInstances(h100_, {{"4g.40gb", 0}, {"4g.40gb", 0}}),
              StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace gpufleet
