// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/format.h"

#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

namespace gpufleet::policy {
namespace {

TEST(PolicyFormat, SpansShowTheLargestTwoUnits) {
  EXPECT_EQ(FormatSpan(0), "0s");
  EXPECT_EQ(FormatSpan(45), "45s");
  EXPECT_EQ(FormatSpan(30 * 60), "30m");
  EXPECT_EQ(FormatSpan(30 * 60 + 30), "30m30s");
  EXPECT_EQ(FormatSpan(90 * 60), "1h30m");
  EXPECT_EQ(FormatSpan(3600), "1h");
  EXPECT_EQ(FormatSpan(3600 + 5), "1h");
  EXPECT_EQ(FormatSpan(2 * 86400 + 3 * 3600 + 59), "2d3h");
  EXPECT_EQ(FormatSpan(-90), "-1m30s");
  EXPECT_EQ(FormatSpan(std::numeric_limits<int64_t>::min()).substr(0, 2), "-1");
}

TEST(PolicyFormat, ClockIsTheTimeOfDay) {
  EXPECT_EQ(FormatClock(0), "00:00");
  EXPECT_EQ(FormatClock(14 * 3600 + 5 * 60 + 59), "14:05");
  EXPECT_EQ(FormatClock(86400 + 3600), "01:00");
  EXPECT_EQ(FormatClock(-60), "23:59");
  EXPECT_EQ(FormatClock(1'700'000'000), "22:13");  // 2023-11-14T22:13:20Z
}

TEST(PolicyFormat, PercentOfMilli) {
  EXPECT_EQ(FormatPercentMilli(100), "10%");
  EXPECT_EQ(FormatPercentMilli(125), "12.5%");
  EXPECT_EQ(FormatPercentMilli(1000), "100%");
  EXPECT_EQ(FormatPercentMilli(0), "0%");
}

}  // namespace
}  // namespace gpufleet::policy
