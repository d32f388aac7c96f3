// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/simulated_probe.h"

#include <chrono>
#include <memory>
#include <set>
#include <string>

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

class SimulatedProbeTest : public ::testing::Test {
 protected:
  std::unique_ptr<SimulatedProbe> Make(SimulatedProbe::Options options = {}) {
    Result<std::unique_ptr<SimulatedProbe>> probe =
        SimulatedProbe::Create(clock_, catalog_, std::move(options));
    EXPECT_OK(probe);
    return probe.ok() ? std::move(probe).value() : nullptr;
  }

  GpuSample SampleOf(SimulatedProbe& probe, int gpu) {
    Result<std::vector<GpuSample>> samples = probe.Sample();
    EXPECT_OK(samples);
    return samples.ok() ? (*samples)[static_cast<size_t>(gpu)] : GpuSample{};
  }

  FakeClock clock_{MonoTime{1'000'000'000'000}};
  GpuCatalog catalog_ = GpuCatalog::Default();
};

TEST_F(SimulatedProbeTest, InventoryHasTheModelsGpusWithDistinctIdentities) {
  std::unique_ptr<SimulatedProbe> probe = Make();
  Result<ProbeInventory> inventory = probe->Inventory();
  ASSERT_OK(inventory);
  EXPECT_EQ(inventory->driver_version, "550.54.15");
  ASSERT_EQ(inventory->gpus.size(), 8U);
  std::set<std::string> uuids;
  std::set<std::string> buses;
  for (const GpuStaticInfo& gpu : inventory->gpus) {
    EXPECT_EQ(gpu.model, "H100-80GB");
    EXPECT_EQ(gpu.nvml_name, "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(gpu.memory_mib, 80 * 1024);
    EXPECT_TRUE(gpu.uuid.starts_with("GPU-")) << gpu.uuid;
    EXPECT_EQ(gpu.uuid.size(), 40U) << gpu.uuid;
    uuids.insert(gpu.uuid);
    buses.insert(gpu.pci_bus_id);
  }
  EXPECT_EQ(uuids.size(), 8U);
  EXPECT_EQ(buses.size(), 8U);
  EXPECT_EQ(inventory->gpus[0].pci_bus_id, "00000000:18:00.0");
}

TEST_F(SimulatedProbeTest, TheSeedDecidesTheUuids) {
  const std::string first = (*Make({.seed = 7})->Inventory()).gpus[0].uuid;
  EXPECT_EQ((*Make({.seed = 7})->Inventory()).gpus[0].uuid, first);
  EXPECT_NE((*Make({.seed = 8})->Inventory()).gpus[0].uuid, first);
}

TEST_F(SimulatedProbeTest, BadOptionsAreRejectedNamingTheOption) {
  EXPECT_THAT(SimulatedProbe::Create(clock_, catalog_, {.model = "Z9000"}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("Z9000")));
  EXPECT_THAT(SimulatedProbe::Create(clock_, catalog_, {.gpu_count = 0}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpu_count 0")));
  EXPECT_THAT(
      SimulatedProbe::Create(clock_, catalog_, {.model = "T4", .mig_profiles = {{0, {"1g.5gb"}}}}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("model T4 has no MIG")));
  EXPECT_THAT(SimulatedProbe::Create(clock_, catalog_, {.mig_profiles = {{8, {"1g.10gb"}}}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("GPU 8 outside [0, 8)")));
  EXPECT_THAT(SimulatedProbe::Create(clock_, catalog_, {.mig_profiles = {{0, {"5g.50gb"}}}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unknown profile \"5g.50gb\"")));
  EXPECT_THAT(
      SimulatedProbe::Create(clock_, catalog_, {.mig_profiles = {{0, {"4g.40gb", "4g.40gb"}}}}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"4g.40gb\" does not fit")));
}

TEST_F(SimulatedProbeTest, AnIdleGpuReadsIdle) {
  std::unique_ptr<SimulatedProbe> probe = Make();
  const GpuSample sample = SampleOf(*probe, 0);
  EXPECT_FALSE(sample.lost);
  EXPECT_EQ(sample.gpu_util_percent, 0);
  EXPECT_EQ(sample.fb_used_mib, 7);
  EXPECT_EQ(sample.fb_free_mib, 80 * 1024 - 512 - 7);
  EXPECT_EQ(sample.sm_clock_mhz, 345);
  EXPECT_EQ(sample.clocks_event_reasons, nvml::kClocksEventGpuIdle);
  EXPECT_LT(*sample.power_milliwatts, 75000);
  EXPECT_EQ(sample.sm_active, 0.0);
  EXPECT_TRUE(sample.xid_events_supported);
  EXPECT_THAT(sample.xids, IsEmpty());
}

TEST_F(SimulatedProbeTest, TheLoadDrivesTheReadings) {
  std::unique_ptr<SimulatedProbe> probe = Make();
  ASSERT_OK(probe->SetLoad(2, {.utilization_percent = 80, .memory_used_mib = 40000}));
  const GpuSample idle = SampleOf(*probe, 1);
  const GpuSample busy = SampleOf(*probe, 2);
  EXPECT_GE(*busy.gpu_util_percent, 78);
  EXPECT_LE(*busy.gpu_util_percent, 82);
  EXPECT_EQ(busy.fb_used_mib, 40007);
  EXPECT_GT(*busy.temperature_c, *idle.temperature_c + 30);
  EXPECT_GT(*busy.power_milliwatts, 500000);
  EXPECT_EQ(busy.sm_clock_mhz, 1980);
  EXPECT_NEAR(*busy.sm_active, *busy.gpu_util_percent * 0.009, 1e-9);
}

TEST_F(SimulatedProbeTest, ReadingsDependOnlyOnTheClockAndTheSeed) {
  std::unique_ptr<SimulatedProbe> a = Make({.seed = 3});
  std::unique_ptr<SimulatedProbe> b = Make({.seed = 3});
  ASSERT_OK(a->SetLoad(0, {.utilization_percent = 50}));
  ASSERT_OK(b->SetLoad(0, {.utilization_percent = 50}));
  for (int step = 0; step < 20; ++step) {
    EXPECT_EQ(*a->Sample(), *b->Sample());
    clock_.Advance(std::chrono::seconds(1));
  }
}

TEST_F(SimulatedProbeTest, TrainingDipsForThreeSecondsEveryThirty) {
  clock_.Set(MonoTime{0});
  std::unique_ptr<SimulatedProbe> probe = Make();
  ASSERT_OK(probe->SetLoad(0, {.utilization_percent = 96, .pattern = LoadPattern::kTraining}));
  clock_.Set(MonoTime{std::chrono::nanoseconds(std::chrono::seconds(10)).count()});
  EXPECT_GE(*SampleOf(*probe, 0).gpu_util_percent, 94);
  clock_.Set(MonoTime{std::chrono::nanoseconds(std::chrono::seconds(28)).count()});
  EXPECT_LE(*SampleOf(*probe, 0).gpu_util_percent, 26);
}

TEST_F(SimulatedProbeTest, InferenceFollowsATriangleWave) {
  clock_.Set(MonoTime{0});
  std::unique_ptr<SimulatedProbe> probe = Make();
  ASSERT_OK(probe->SetLoad(0, {.utilization_percent = 90, .pattern = LoadPattern::kInference}));
  EXPECT_LE(*SampleOf(*probe, 0).gpu_util_percent, 32);  // a third of 90, give or take
  clock_.Set(MonoTime{std::chrono::nanoseconds(std::chrono::seconds(30)).count()});
  EXPECT_GE(*SampleOf(*probe, 0).gpu_util_percent, 88);
}

TEST_F(SimulatedProbeTest, SetLoadRejectsBadValues) {
  std::unique_ptr<SimulatedProbe> probe = Make();
  EXPECT_THAT(probe->SetLoad(0, {.utilization_percent = 101}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("utilization_percent 101")));
  EXPECT_THAT(probe->SetLoad(0, {.memory_used_mib = 90000}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("memory_used_mib 90000")));
  EXPECT_THAT(probe->SetLoad(8, {}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpu index 8 outside [0, 8)")));
  EXPECT_THAT(probe->InjectXid(0, 0), StatusIs(StatusCode::kInvalidArgument, HasSubstr("XID 0")));
  EXPECT_THAT(probe->InjectThermalExcursion(0, 200),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("temperature 200")));
}

TEST_F(SimulatedProbeTest, AnInjectedXidIsReportedOnce) {
  std::unique_ptr<SimulatedProbe> probe = Make();
  ASSERT_OK(probe->InjectXid(3, 13));
  EXPECT_THAT(SampleOf(*probe, 3).xids, ElementsAre(XidEvent{13, std::nullopt}));
  EXPECT_THAT(SampleOf(*probe, 3).xids, IsEmpty());
}

TEST_F(SimulatedProbeTest, ADoubleBitEccErrorCountsRemapsAndReportsXids) {
  std::unique_ptr<SimulatedProbe> probe = Make();
  ASSERT_OK(probe->InjectDoubleBitEcc(1));
  const GpuSample sample = SampleOf(*probe, 1);
  EXPECT_EQ(sample.ecc_dbe_volatile_total, 1);
  EXPECT_EQ(sample.uncorrectable_remapped_rows, 1);
  EXPECT_EQ(sample.row_remap_pending, true);
  EXPECT_THAT(sample.xids, ElementsAre(XidEvent{48, std::nullopt}, XidEvent{63, std::nullopt}));
}

TEST_F(SimulatedProbeTest, ARowRemapFailureIsReported) {
  std::unique_ptr<SimulatedProbe> probe = Make();
  ASSERT_OK(probe->InjectRowRemapFailure(0));
  const GpuSample sample = SampleOf(*probe, 0);
  EXPECT_EQ(sample.row_remap_failure, true);
  EXPECT_THAT(sample.xids, ElementsAre(XidEvent{64, std::nullopt}));
}

TEST_F(SimulatedProbeTest, AThermalExcursionHoldsTheTemperatureAndSlowsTheClocks) {
  std::unique_ptr<SimulatedProbe> probe = Make();
  ASSERT_OK(probe->SetLoad(0, {.utilization_percent = 90}));
  ASSERT_OK(probe->InjectThermalExcursion(0, 92));
  const GpuSample sample = SampleOf(*probe, 0);
  EXPECT_EQ(sample.temperature_c, 92);
  EXPECT_LT(*sample.sm_clock_mhz, 1980);
  EXPECT_NE(*sample.clocks_event_reasons & nvml::kClocksEventHwThermalSlowdown, 0U);
}

TEST_F(SimulatedProbeTest, APowerBrakeSetsItsReasonAndCutsPower) {
  std::unique_ptr<SimulatedProbe> probe = Make();
  ASSERT_OK(probe->SetLoad(0, {.utilization_percent = 100}));
  ASSERT_OK(probe->InjectPowerBrake(0));
  const GpuSample sample = SampleOf(*probe, 0);
  EXPECT_NE(*sample.clocks_event_reasons & nvml::kClocksEventHwPowerBrakeSlowdown, 0U);
  EXPECT_LT(*sample.power_milliwatts, 300000);
  EXPECT_LE(*sample.sm_clock_mhz, 594);
}

TEST_F(SimulatedProbeTest, ALostGpuReadsNothingUntilReset) {
  std::unique_ptr<SimulatedProbe> probe = Make();
  ASSERT_OK(probe->InjectDoubleBitEcc(5));
  ASSERT_OK(probe->InjectGpuLost(5));
  GpuSample sample = SampleOf(*probe, 5);
  EXPECT_TRUE(sample.lost);
  EXPECT_FALSE(sample.temperature_c.has_value());
  EXPECT_THAT(sample.xids, ElementsAre(XidEvent{48, std::nullopt}, XidEvent{63, std::nullopt},
                                       XidEvent{79, std::nullopt}));
  EXPECT_TRUE(SampleOf(*probe, 5).lost);

  ASSERT_OK(probe->ResetGpu(5));
  sample = SampleOf(*probe, 5);
  EXPECT_FALSE(sample.lost);
  EXPECT_EQ(sample.ecc_dbe_volatile_total, 0);
  EXPECT_EQ(sample.row_remap_pending, false);
  EXPECT_EQ(sample.uncorrectable_remapped_rows, 1);  // remapped rows survive a reset
}

TEST_F(SimulatedProbeTest, MigGpusHaveInstancesAndNoGpuLevelUtilization) {
  std::unique_ptr<SimulatedProbe> probe =
      Make({.gpu_count = 2, .mig_profiles = {{1, {"3g.40gb", "2g.20gb", "1g.10gb"}}}});
  Result<ProbeInventory> inventory = probe->Inventory();
  ASSERT_OK(inventory);
  EXPECT_FALSE(inventory->gpus[0].mig_enabled);
  const GpuStaticInfo& gpu = inventory->gpus[1];
  EXPECT_TRUE(gpu.mig_enabled);
  ASSERT_EQ(gpu.mig_devices.size(), 3U);
  EXPECT_EQ(gpu.mig_devices[0].profile, "3g.40gb");
  EXPECT_EQ(gpu.mig_devices[0].gpu_instance_id, 1);
  EXPECT_EQ(gpu.mig_devices[2].gpu_instance_id, 3);
  EXPECT_TRUE(gpu.mig_devices[2].uuid.starts_with("MIG-"));
  const GpuSample sample = SampleOf(*probe, 1);
  EXPECT_FALSE(sample.gpu_util_percent.has_value());
  EXPECT_FALSE(sample.sm_active.has_value());
  ASSERT_EQ(sample.mig_devices.size(), 3U);
  EXPECT_EQ(sample.mig_devices[1].gpu_instance_id, 2);
}

TEST_F(SimulatedProbeTest, AppliesAMigLayoutChangeAroundAnInstanceInUse) {
  std::unique_ptr<SimulatedProbe> probe =
      Make({.gpu_count = 2, .mig_profiles = {{0, {"3g.40gb", "2g.20gb", "1g.10gb"}}}});
  const ProbeInventory before = probe->Inventory().value();
  const std::vector<MigDeviceInfo>& old = before.gpus[0].mig_devices;
  ASSERT_EQ(old.size(), 3U);
  EXPECT_EQ(old[0].placement_start, 0);
  EXPECT_EQ(old[1].placement_start, 4);
  EXPECT_EQ(old[2].placement_start, 6);
  ASSERT_OK(probe->SetMigDeviceInUse(0, old[0].gpu_instance_id, true));

  Result<std::vector<MigDeviceInfo>> devices = probe->ApplyMigLayoutChange(
      0, {.destroy = {{"2g.20gb", 4}, {"1g.10gb", 6}}, .create = {{"3g.40gb", 4}}});
  ASSERT_OK(devices);
  ASSERT_EQ(devices->size(), 2U);
  EXPECT_EQ((*devices)[0], old[0]);  // the instance in use keeps its identity
  const MigDeviceInfo& created = (*devices)[1];
  EXPECT_EQ(created.profile, "3g.40gb");
  EXPECT_EQ(created.placement_start, 4);
  EXPECT_EQ(created.gpu_instance_id, 2);
  EXPECT_EQ(created.memory_mib, 40 * 1024);
  EXPECT_TRUE(created.uuid.starts_with("MIG-")) << created.uuid;
  for (const MigDeviceInfo& device : old) {
    EXPECT_NE(created.uuid, device.uuid);
  }
  EXPECT_EQ(probe->Inventory()->gpus[0].mig_devices, *devices);
  EXPECT_EQ(probe->Inventory()->gpus[1], before.gpus[1]);
  const GpuSample sample = SampleOf(*probe, 0);
  ASSERT_EQ(sample.mig_devices.size(), 2U);
  EXPECT_EQ(sample.mig_devices[1].gpu_instance_id, 2);
  EXPECT_EQ(sample.mig_devices[1].fb_free_mib, 40 * 1024 - 7);
}

TEST_F(SimulatedProbeTest, AWholeGpuInstanceIsInstanceZero) {
  std::unique_ptr<SimulatedProbe> probe =
      Make({.gpu_count = 1, .mig_profiles = {{0, {"3g.40gb", "3g.40gb"}}}});
  Result<std::vector<MigDeviceInfo>> devices = probe->ApplyMigLayoutChange(
      0, {.destroy = {{"3g.40gb", 0}, {"3g.40gb", 4}}, .create = {{"7g.80gb", 0}}});
  ASSERT_OK(devices);
  ASSERT_EQ(devices->size(), 1U);
  EXPECT_EQ((*devices)[0].gpu_instance_id, 0);
  EXPECT_EQ((*devices)[0].placement_start, 0);
}

TEST_F(SimulatedProbeTest, RefusesToDestroyAMigInstanceInUse) {
  std::unique_ptr<SimulatedProbe> probe =
      Make({.gpu_count = 1, .mig_profiles = {{0, {"3g.40gb", "3g.40gb"}}}});
  const ProbeInventory before = probe->Inventory().value();
  const int second = before.gpus[0].mig_devices[1].gpu_instance_id;
  ASSERT_OK(probe->SetMigDeviceInUse(0, second, true));
  const MigLayoutChange change = {.destroy = {{"3g.40gb", 0}, {"3g.40gb", 4}},
                                  .create = {{"7g.80gb", 0}}};
  EXPECT_THAT(probe->ApplyMigLayoutChange(0, change),
              StatusIs(StatusCode::kFailedPrecondition,
                       "simulated probe: GPU 0: destroy[1]: the 3g.40gb instance at slot 4 "
                       "(instance id 2) is in use"));
  EXPECT_EQ(*probe->Inventory(), before);  // nothing changed, not even the first destroy
  ASSERT_OK(probe->SetMigDeviceInUse(0, second, false));
  EXPECT_OK(probe->ApplyMigLayoutChange(0, change));
}

TEST_F(SimulatedProbeTest, ApplyMigLayoutMakesTheWantedInstancesKeepingTheOthers) {
  std::unique_ptr<SimulatedProbe> probe =
      Make({.gpu_count = 1, .mig_profiles = {{0, {"3g.40gb", "2g.20gb", "1g.10gb"}}}});
  EXPECT_TRUE(probe->CanApplyMigLayouts());
  const std::vector<MigDeviceInfo> old = probe->Inventory()->gpus[0].mig_devices;
  ASSERT_EQ(old.size(), 3U);

  // The same set in another order changes nothing.
  Result<std::vector<MigDeviceInfo>> same =
      probe->ApplyMigLayout(0, {{"1g.10gb", 6}, {"3g.40gb", 0}, {"2g.20gb", 4}});
  ASSERT_OK(same);
  EXPECT_EQ(*same, old);

  Result<std::vector<MigDeviceInfo>> devices =
      probe->ApplyMigLayout(0, {{"3g.40gb", 0}, {"3g.40gb", 4}});
  ASSERT_OK(devices);
  ASSERT_EQ(devices->size(), 2U);
  EXPECT_EQ((*devices)[0], old[0]);  // kept, same UUID
  EXPECT_EQ((*devices)[1].profile, "3g.40gb");
  EXPECT_EQ((*devices)[1].placement_start, 4);
  EXPECT_EQ(probe->Inventory()->gpus[0].mig_devices, *devices);

  // No instances wanted: all destroyed.
  devices = probe->ApplyMigLayout(0, {});
  ASSERT_OK(devices);
  EXPECT_TRUE(devices->empty());
}

TEST_F(SimulatedProbeTest, ApplyMigLayoutLeavesAnInstanceInUseAndChangesNothing) {
  std::unique_ptr<SimulatedProbe> probe =
      Make({.gpu_count = 2, .mig_profiles = {{0, {"3g.40gb", "3g.40gb"}}}});
  const ProbeInventory before = probe->Inventory().value();
  ASSERT_OK(probe->SetMigDeviceInUse(0, before.gpus[0].mig_devices[0].gpu_instance_id, true));
  EXPECT_THAT(
      probe->ApplyMigLayout(0, {{"7g.80gb", 0}}),
      StatusIs(StatusCode::kFailedPrecondition, HasSubstr("slot 0 (instance id 1) is in use")));
  EXPECT_EQ(*probe->Inventory(), before);
  // Keeping the instance in use and changing the rest is allowed.
  EXPECT_OK(probe->ApplyMigLayout(0, {{"3g.40gb", 0}, {"2g.20gb", 4}, {"1g.10gb", 6}}));
  EXPECT_THAT(probe->ApplyMigLayout(1, {{"3g.40gb", 0}}),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("MIG is disabled")));
  EXPECT_THAT(probe->ApplyMigLayout(0, {{"3g.40gb", 0}, {"3g.40gb", 2}}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(probe->ApplyMigLayout(2, {}), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(SimulatedProbeTest, RejectsInvalidMigLayoutChanges) {
  std::unique_ptr<SimulatedProbe> probe =
      Make({.gpu_count = 2, .mig_profiles = {{0, {"3g.40gb"}}}});
  const ProbeInventory before = probe->Inventory().value();
  auto apply = [&](int gpu, MigLayoutChange change) {
    return probe->ApplyMigLayoutChange(gpu, change).status();
  };
  EXPECT_THAT(apply(2, {}), StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpu index 2")));
  EXPECT_THAT(apply(1, {.create = {{"1g.10gb", 0}}}),
              StatusIs(StatusCode::kFailedPrecondition, "simulated probe: GPU 1: MIG is disabled"));
  EXPECT_THAT(apply(0, {.destroy = {{"3g.40gb", 4}}}),
              StatusIs(StatusCode::kNotFound,
                       "simulated probe: GPU 0: destroy[0]: no 3g.40gb instance starts at slot 4"));
  EXPECT_THAT(apply(0, {.create = {{"5g.50gb", 4}}}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("create[0].profile: unknown profile \"5g.50gb\" for H100-80GB")));
  EXPECT_THAT(apply(0, {.create = {{"3g.40gb", 2}}}),
              StatusIs(StatusCode::kInvalidArgument,
                       "simulated probe: GPU 0: create[0].start: 2 is not a valid start slot for "
                       "3g.40gb"));
  EXPECT_THAT(apply(0, {.create = {{"1g.10gb", 4}, {"2g.20gb", 4}}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("overlaps another instance")));
  EXPECT_THAT(apply(0, {.create = {{"4g.40gb", 0}}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("the new layout is invalid")));
  EXPECT_THAT(apply(0, {.destroy = {{"3g.40gb", 0}},
                        .create = {{"3g.40gb", 4}, {"3g.40gb", 0}, {"1g.10gb", 0}}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("overlaps")));
  EXPECT_EQ(*probe->Inventory(), before);
  EXPECT_THAT(
      probe->SetMigDeviceInUse(0, 9, true),
      StatusIs(StatusCode::kNotFound, "simulated probe: GPU 0: no MIG device with instance id 9"));
}

TEST_F(SimulatedProbeTest, PreHopperModelsHaveNoGpm) {
  std::unique_ptr<SimulatedProbe> probe = Make({.model = "A100-80GB", .gpu_count = 1});
  const GpuSample sample = SampleOf(*probe, 0);
  EXPECT_TRUE(sample.gpu_util_percent.has_value());
  EXPECT_FALSE(sample.sm_active.has_value());
  EXPECT_EQ((*probe->Inventory()).gpus[0].nvml_name, "NVIDIA A100-SXM4-80GB");
}

}  // namespace
}  // namespace gpufleet::agent
