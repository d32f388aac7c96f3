// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/health.h"

#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/agent/nvml_api.h"

namespace gpufleet::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

class HealthTest : public ::testing::Test {
 protected:
  HealthTest() {
    info_.index = 3;
    info_.slowdown_temperature_c = 87;
    sample_.index = 3;
    sample_.temperature_c = 45;
    sample_.ecc_dbe_volatile_total = 0;
    sample_.uncorrectable_remapped_rows = 0;
    sample_.row_remap_failure = false;
    sample_.row_remap_pending = false;
    sample_.clocks_event_reasons = 0;
  }

  GpuHealthReport Evaluate(const std::map<int, int64_t>& xids = {}) const {
    return EvaluateGpuHealth(info_, sample_, xids);
  }

  GpuStaticInfo info_;
  GpuSample sample_;
};

TEST_F(HealthTest, AGpuWithNothingWrongIsHealthy) {
  const GpuHealthReport report = Evaluate();
  EXPECT_EQ(report.gpu_index, 3);
  EXPECT_EQ(report.health, GpuHealth::kHealthy);
  EXPECT_EQ(report.drain, DrainAction::kNone);
  EXPECT_THAT(report.findings, IsEmpty());
  EXPECT_EQ(report.thermal_headroom_c, 42);
  EXPECT_EQ(report.Summary(), "healthy");
}

TEST_F(HealthTest, AnApplicationXidNeverDrains) {
  const GpuHealthReport report = Evaluate({{13, 1}});
  EXPECT_EQ(report.health, GpuHealth::kHealthy);
  EXPECT_EQ(report.drain, DrainAction::kNone);
  ASSERT_EQ(report.findings.size(), 1U);
  EXPECT_THAT(report.findings[0].reason,
              StartsWith("XID 13: Graphics Engine Exception; application error, never drain"));
}

TEST_F(HealthTest, AMonitorXidDegrades) {
  const GpuHealthReport report = Evaluate({{92, 1}});
  EXPECT_EQ(report.health, GpuHealth::kDegraded);
  EXPECT_EQ(report.drain, DrainAction::kNone);
  EXPECT_THAT(report.Summary(), StartsWith("XID 92: High single-bit ECC error rate; monitor"));
}

TEST_F(HealthTest, ARemapXidDrainsAfterTheJob) {
  const GpuHealthReport report = Evaluate({{63, 1}});
  EXPECT_EQ(report.health, GpuHealth::kUnhealthy);
  EXPECT_EQ(report.drain, DrainAction::kAfterJob);
  EXPECT_THAT(report.Summary(), HasSubstr("drain after the running job"));
}

TEST_F(HealthTest, XidSeventyNineDrainsNow) {
  const GpuHealthReport report = Evaluate({{79, 1}});
  EXPECT_EQ(report.health, GpuHealth::kUnhealthy);
  EXPECT_EQ(report.drain, DrainAction::kNow);
  EXPECT_THAT(report.Summary(), StartsWith("XID 79: GPU has fallen off the bus; drain now"));
}

TEST_F(HealthTest, AnXidWithoutARuleCountsAgainstTheGpu) {
  const GpuHealthReport report = Evaluate({{54, 2}});
  EXPECT_EQ(report.health, GpuHealth::kUnhealthy);
  EXPECT_EQ(report.drain, DrainAction::kAfterJob);
  EXPECT_THAT(report.Summary(), StartsWith("XID 54 (x2): not in gpufleet's XID catalog"));
}

TEST_F(HealthTest, TheXidCatalogFollowsThePolicyTable) {
  // telemetry.md §3.3, "Drain summary".
  for (int code :
       {46, 48, 62, 64, 74, 79, 95, 110, 119, 120, 136, 140, 143, 144, 150, 155, 156, 158, 160}) {
    ASSERT_NE(FindXidRule(code), nullptr) << code;
    EXPECT_EQ(FindXidRule(code)->xid_class, XidClass::kDrainNow) << code;
  }
  for (int code : {63, 94, 109}) {
    EXPECT_EQ(FindXidRule(code)->xid_class, XidClass::kDrainAfterJob) << code;
  }
  for (int code : {13, 31, 43, 45, 68}) {
    EXPECT_EQ(FindXidRule(code)->xid_class, XidClass::kApplication) << code;
  }
  EXPECT_EQ(FindXidRule(92)->xid_class, XidClass::kMonitor);
  EXPECT_EQ(FindXidRule(54), nullptr);
  EXPECT_EQ(FindXidRule(0), nullptr);
}

TEST_F(HealthTest, AnUncorrectableEccErrorDrainsNow) {
  sample_.ecc_dbe_volatile_total = 2;
  const GpuHealthReport report = Evaluate();
  EXPECT_EQ(report.health, GpuHealth::kUnhealthy);
  EXPECT_EQ(report.drain, DrainAction::kNow);
  EXPECT_THAT(report.findings,
              ElementsAre(Field(&HealthFinding::reason,
                                StartsWith("2 uncorrectable (double-bit) ECC error(s)"))));
  EXPECT_EQ(report.findings[0].rule, "ecc");
}

TEST_F(HealthTest, ARowRemapFailureDrainsNow) {
  sample_.row_remap_failure = true;
  const GpuHealthReport report = Evaluate();
  EXPECT_EQ(report.health, GpuHealth::kUnhealthy);
  EXPECT_EQ(report.drain, DrainAction::kNow);
  EXPECT_THAT(report.Summary(), HasSubstr("row remapping failed"));
}

TEST_F(HealthTest, APendingRowRemapDrainsAfterTheJob) {
  sample_.row_remap_pending = true;
  const GpuHealthReport report = Evaluate();
  EXPECT_EQ(report.health, GpuHealth::kUnhealthy);
  EXPECT_EQ(report.drain, DrainAction::kAfterJob);
}

TEST_F(HealthTest, ManyRemappedRowsDegrade) {
  sample_.uncorrectable_remapped_rows = 511;
  EXPECT_EQ(Evaluate().health, GpuHealth::kHealthy);
  sample_.uncorrectable_remapped_rows = 512;
  const GpuHealthReport report = Evaluate();
  EXPECT_EQ(report.health, GpuHealth::kDegraded);
  EXPECT_THAT(report.Summary(), HasSubstr("512 uncorrectable remapped rows"));
}

TEST_F(HealthTest, ALostGpuDrainsNow) {
  sample_ = GpuSample{};
  sample_.index = 3;
  sample_.lost = true;
  const GpuHealthReport report = Evaluate();
  EXPECT_EQ(report.health, GpuHealth::kUnhealthy);
  EXPECT_EQ(report.drain, DrainAction::kNow);
  EXPECT_THAT(report.Summary(), StartsWith("GPU lost (NVML_ERROR_GPU_IS_LOST)"));
  EXPECT_FALSE(report.thermal_headroom_c.has_value());
}

TEST_F(HealthTest, LittleThermalHeadroomDegrades) {
  sample_.temperature_c = 82;  // 5 C of headroom is enough
  EXPECT_EQ(Evaluate().health, GpuHealth::kHealthy);
  sample_.temperature_c = 84;
  GpuHealthReport report = Evaluate();
  EXPECT_EQ(report.health, GpuHealth::kDegraded);
  EXPECT_EQ(report.thermal_headroom_c, 3);
  EXPECT_THAT(report.Summary(), StartsWith("temperature 84 C, 3 C below the 87 C slowdown"));
  sample_.temperature_c = 90;
  report = Evaluate();
  EXPECT_EQ(report.health, GpuHealth::kDegraded);
  EXPECT_EQ(report.thermal_headroom_c, -3);
  EXPECT_THAT(report.Summary(), HasSubstr("at or above the 87 C slowdown threshold"));
}

TEST_F(HealthTest, NoThresholdMeansNoThermalVerdict) {
  info_.slowdown_temperature_c.reset();
  sample_.temperature_c = 99;
  const GpuHealthReport report = Evaluate();
  EXPECT_EQ(report.health, GpuHealth::kHealthy);
  EXPECT_FALSE(report.thermal_headroom_c.has_value());
}

TEST_F(HealthTest, HardwareSlowdownReasonsDegradeButPowerCappingDoesNot) {
  sample_.clocks_event_reasons = nvml::kClocksEventSwPowerCap | nvml::kClocksEventGpuIdle;
  EXPECT_EQ(Evaluate().health, GpuHealth::kHealthy);
  sample_.clocks_event_reasons =
      nvml::kClocksEventSwPowerCap | nvml::kClocksEventHwPowerBrakeSlowdown;
  const GpuHealthReport report = Evaluate();
  EXPECT_EQ(report.health, GpuHealth::kDegraded);
  EXPECT_EQ(report.drain, DrainAction::kNone);
  EXPECT_EQ(report.Summary(), "clocks held down: hw_power_brake_slowdown");
}

TEST_F(HealthTest, TheWorstFindingDecides) {
  sample_.temperature_c = 85;
  sample_.ecc_dbe_volatile_total = 1;
  const GpuHealthReport report = Evaluate({{13, 1}, {63, 1}});
  EXPECT_EQ(report.health, GpuHealth::kUnhealthy);
  EXPECT_EQ(report.drain, DrainAction::kNow);
  EXPECT_EQ(report.findings.size(), 4U);
}

TEST(DrainActionName, NamesEachAction) {
  EXPECT_STREQ(DrainActionName(DrainAction::kNone), "none");
  EXPECT_STREQ(DrainActionName(DrainAction::kAfterJob), "after job");
  EXPECT_STREQ(DrainActionName(DrainAction::kNow), "now");
}

}  // namespace
}  // namespace gpufleet::agent
