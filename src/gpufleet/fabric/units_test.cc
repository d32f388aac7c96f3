// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/units.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::fabric {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

TEST(Units, ParsesBitAndByteSpeeds) {
  EXPECT_EQ(*ParseSpeedMbps("400G", "f"), 400000);
  EXPECT_EQ(*ParseSpeedMbps("400Gb/s", "f"), 400000);
  EXPECT_EQ(*ParseSpeedMbps("400 Gbps", "f"), 400000);
  EXPECT_EQ(*ParseSpeedMbps("1.6T", "f"), 1600000);
  EXPECT_EQ(*ParseSpeedMbps("100M", "f"), 100);
  EXPECT_EQ(*ParseSpeedMbps("450GB/s", "f"), 3600000);
  EXPECT_EQ(*ParseSpeedMbps("1.8TB/s", "f"), 14400000);
  EXPECT_EQ(*ParseSpeedMbps("200", "f"), 200000);
}

TEST(Units, RejectsNegativeZeroAndGarbageNamingTheField) {
  EXPECT_THAT(
      ParseSpeedMbps("-400G", "links[2].speed"),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("links[2].speed: \"-400G\" is negative")));
  EXPECT_THAT(ParseSpeedMbps("0G", "nic_speed"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("nic_speed: \"0G\" is zero")));
  EXPECT_THAT(
      ParseSpeedMbps("fast", "port_speed"),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("port_speed: \"fast\" is not a speed")));
}

TEST(Units, FormatsTheShortestExactForm) {
  EXPECT_EQ(FormatSpeed(400000), "400G");
  EXPECT_EQ(FormatSpeed(1600000), "1.6T");
  EXPECT_EQ(FormatSpeed(2000000), "2T");
  EXPECT_EQ(FormatSpeed(25000), "25G");
  EXPECT_EQ(FormatSpeed(100), "100M");
  EXPECT_EQ(FormatByteSpeed(3600000), "450GB/s");
  EXPECT_EQ(FormatBandwidth(204.8e6), "204.8 Tb/s");
  EXPECT_EQ(FormatBandwidth(400000), "400 Gb/s");
  for (int64_t mbps : {400000, 1600000, 25000, 100, 3600000, 12500}) {
    EXPECT_EQ(*ParseSpeedMbps(FormatSpeed(mbps), "f"), mbps);
  }
}

}  // namespace
}  // namespace gpufleet::fabric
