// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/gpu_probe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/agent/nvml_api.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::agent {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A probe that only reads, as the NVML probe is for MIG layouts.
class ReadOnlyProbe final : public GpuProbe {
 public:
  Result<ProbeInventory> Inventory() override { return ProbeInventory{}; }
  Result<std::vector<GpuSample>> Sample() override { return std::vector<GpuSample>{}; }
};

TEST(GpuProbe, OnlyReadsMigLayoutsUnlessItSaysOtherwise) {
  ReadOnlyProbe probe;
  EXPECT_FALSE(probe.CanApplyMigLayouts());
  EXPECT_THAT(probe.ApplyMigLayout(3, {{"3g.40gb", 0}}),
              StatusIs(StatusCode::kUnimplemented,
                       HasSubstr("gpu 3: this GPU probe only reads MIG layouts")));
}

TEST(ClocksEventReasonNames, NamesEachSetBitInBitOrder) {
  EXPECT_THAT(ClocksEventReasonNames(0), IsEmpty());
  EXPECT_THAT(
      ClocksEventReasonNames(nvml::kClocksEventSwPowerCap | nvml::kClocksEventHwPowerBrakeSlowdown),
      ElementsAre("sw_power_cap", "hw_power_brake_slowdown"));
}

TEST(ClocksEventReasonNames, NamesAnUnknownBitByItsValue) {
  EXPECT_THAT(ClocksEventReasonNames(nvml::kClocksEventGpuIdle | 0x400),
              ElementsAre("gpu_idle", "0x400"));
}

TEST(NvmlApi, MemoryV2VersionIsSizeAndVersionNotABareTwo) {
  EXPECT_EQ(nvml::kMemoryV2Version, 0x02000028U);
  EXPECT_NE(nvml::kMemoryV2Version, 2U);
}

TEST(NvmlApi, ReturnNameSpellsNvmlsMacro) {
  EXPECT_STREQ(nvml::ReturnName(nvml::Return::kGpuIsLost), "NVML_ERROR_GPU_IS_LOST");
  EXPECT_STREQ(nvml::ReturnName(nvml::Return::kSuccess), "NVML_SUCCESS");
  EXPECT_STREQ(nvml::ReturnName(static_cast<nvml::Return>(77)), "NVML_ERROR_UNRECOGNIZED");
}

}  // namespace
}  // namespace gpufleet::agent
