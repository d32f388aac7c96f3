// SPDX-License-Identifier: Apache-2.0
// The real NvmlProbe (dlopen, dlsym, struct versions, error codes) against the fake libnvidia-ml
// built in testing/fake_nvml.cc.
#include "gpufleet/agent/nvml_probe.h"

#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/agent/testing/fake_nvml.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::agent {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using Json = nlohmann::json;

class NvmlProbeTest : public ::testing::Test {
 protected:
  void SetUp() override { fake_ = Load(GPUFLEET_FAKE_NVML_PATH); }

  static std::unique_ptr<testing::FakeNvml> Load(const char* path) {
    Result<std::unique_ptr<testing::FakeNvml>> fake = testing::FakeNvml::Open(path);
    EXPECT_OK(fake);
    return fake.ok() ? std::move(fake).value() : nullptr;
  }

  // HealthyH100Script as JSON, for a test to edit.
  static Json Script(int gpus = 2) { return Json::parse(testing::HealthyH100Script(gpus)); }

  std::unique_ptr<NvmlProbe> Open(const Json& script, const char* path = GPUFLEET_FAKE_NVML_PATH) {
    EXPECT_OK(fake_->LoadScript(script.dump()));
    Result<std::unique_ptr<NvmlProbe>> probe = NvmlProbe::Open({.library_path = path});
    EXPECT_OK(probe);
    return probe.ok() ? std::move(probe).value() : nullptr;
  }

  std::unique_ptr<testing::FakeNvml> fake_;
};

TEST_F(NvmlProbeTest, ReadsTheInventory) {
  std::unique_ptr<NvmlProbe> probe = Open(Script());
  ASSERT_NE(probe, nullptr);
  Result<ProbeInventory> inventory = probe->Inventory();
  ASSERT_OK(inventory);
  EXPECT_EQ(inventory->driver_version, "550.54.15");
  EXPECT_EQ(inventory->cuda_version, "12.4");
  ASSERT_EQ(inventory->gpus.size(), 2U);
  const GpuStaticInfo& gpu = inventory->gpus[1];
  EXPECT_EQ(gpu.index, 1);
  EXPECT_EQ(gpu.uuid, "GPU-a0000001-1111-2222-3333-000000004001");
  EXPECT_EQ(gpu.pci_bus_id, "00000000:2A:00.0");
  EXPECT_EQ(gpu.nvml_name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(gpu.model, "H100-80GB");
  EXPECT_EQ(gpu.memory_mib, 81559);
  EXPECT_EQ(gpu.slowdown_temperature_c, 87);
  EXPECT_FALSE(gpu.mig_enabled);
}

TEST_F(NvmlProbeTest, ReadsSerialsVbiosAndTheNvmlVersionForProvenance) {
  Json script = Script();
  script["devices"][1].erase("serial");  // a board without one (GeForce): left empty
  script["devices"][1].erase("vbios_version");
  std::unique_ptr<NvmlProbe> probe = Open(script);
  ASSERT_NE(probe, nullptr);
  Result<ProbeInventory> inventory = probe->Inventory();
  ASSERT_OK(inventory);
  EXPECT_EQ(inventory->nvml_version, "12.550.54.15");
  EXPECT_EQ(inventory->gpus[0].serial, "1650923000000");
  EXPECT_EQ(inventory->gpus[0].vbios_version, "96.00.89.00.01");
  EXPECT_EQ(inventory->gpus[1].serial, "");
  EXPECT_EQ(inventory->gpus[1].vbios_version, "");
  EXPECT_GE(fake_->CallCount("nvmlDeviceGetSerial"), 2);
  EXPECT_GE(fake_->CallCount("nvmlDeviceGetVbiosVersion"), 2);
  EXPECT_GE(fake_->CallCount("nvmlSystemGetCudaDriverVersion_v2"), 1);

  script.erase("nvml_version");
  probe = Open(script);
  ASSERT_NE(probe, nullptr);
  inventory = probe->Inventory();
  ASSERT_OK(inventory);
  EXPECT_EQ(inventory->nvml_version, "");
}

TEST_F(NvmlProbeTest, SamplesEveryField) {
  std::unique_ptr<NvmlProbe> probe = Open(Script());
  ASSERT_NE(probe, nullptr);
  Result<std::vector<GpuSample>> samples = probe->Sample();
  ASSERT_OK(samples);
  ASSERT_EQ(samples->size(), 2U);
  const GpuSample& sample = (*samples)[1];
  EXPECT_FALSE(sample.lost);
  EXPECT_EQ(sample.gpu_util_percent, 10);
  EXPECT_EQ(sample.memory_copy_util_percent, 5);
  EXPECT_EQ(sample.fb_used_mib, 2048);
  EXPECT_EQ(sample.fb_reserved_mib, 512);
  EXPECT_EQ(sample.fb_free_mib, 81559 - 512 - 2048);
  EXPECT_EQ(sample.temperature_c, 41);
  EXPECT_EQ(sample.power_milliwatts, 125000);
  EXPECT_EQ(sample.sm_clock_mhz, 1980);
  EXPECT_EQ(sample.memory_clock_mhz, 2619);
  EXPECT_EQ(sample.ecc_dbe_volatile_total, 0);
  EXPECT_EQ(sample.uncorrectable_remapped_rows, 0);
  EXPECT_EQ(sample.row_remap_failure, false);
  EXPECT_EQ(sample.row_remap_pending, false);
  EXPECT_EQ(sample.pcie_replay_count, 0);
  EXPECT_EQ(sample.clocks_event_reasons, 0U);
  EXPECT_TRUE(sample.xid_events_supported);
  EXPECT_THAT(sample.read_errors, IsEmpty());
  // GPM needs two samples: the first one only primes it.
  EXPECT_FALSE(sample.sm_active.has_value());
}

TEST_F(NvmlProbeTest, GpmRatiosComeFromTwoSamples) {
  std::unique_ptr<NvmlProbe> probe = Open(Script());
  ASSERT_NE(probe, nullptr);
  ASSERT_OK(probe->Sample());
  Result<std::vector<GpuSample>> samples = probe->Sample();
  ASSERT_OK(samples);
  const GpuSample& sample = (*samples)[1];
  ASSERT_TRUE(sample.sm_active.has_value());
  EXPECT_DOUBLE_EQ(*sample.sm_active, 0.09);
  EXPECT_DOUBLE_EQ(*sample.dram_active, 0.04);
  EXPECT_DOUBLE_EQ(*sample.tensor_active, 0.025);
}

TEST_F(NvmlProbeTest, ReadsTheOtherCountersDcgmExporterExportsByDefault) {
  Json script = Script();
  Json& gpu = script["devices"][1];
  gpu["memory_temperature_c"] = 52;
  gpu["total_energy_mj"] = 123456789012LL;
  gpu["encoder_util"] = 3;
  gpu["decoder_util"] = 7;
  gpu["nvlink_data_kib"] = {{"tx", 1000}, {"rx", 2000}};
  gpu["gpm"]["graphics_util"] = 81.25;
  gpu["gpm"]["pcie_tx_mib_per_s"] = 100;
  gpu["gpm"]["pcie_rx_mib_per_s"] = 50.5;
  script["devices"][0]["memory_temperature_c"] = 255;  // NVML's reading of a broken sensor
  std::unique_ptr<NvmlProbe> probe = Open(script);
  ASSERT_NE(probe, nullptr);
  ASSERT_OK(probe->Sample());
  Result<std::vector<GpuSample>> samples = probe->Sample();
  ASSERT_OK(samples);
  const GpuSample& sample = (*samples)[1];
  EXPECT_EQ(sample.memory_temperature_c, 52);
  EXPECT_EQ(sample.total_energy_millijoules, 123456789012LL);
  EXPECT_EQ(sample.encoder_util_percent, 3);
  EXPECT_EQ(sample.decoder_util_percent, 7);
  EXPECT_EQ(sample.nvlink_data_kib, 3000);
  ASSERT_TRUE(sample.graphics_engine_active.has_value());
  EXPECT_DOUBLE_EQ(*sample.graphics_engine_active, 0.8125);
  EXPECT_EQ(sample.pcie_tx_bytes_per_second, 100 << 20);
  EXPECT_EQ(sample.pcie_rx_bytes_per_second, 50.5 * (1 << 20));
  EXPECT_THAT(sample.read_errors, IsEmpty());
  // Fields the GPU does not have are absent; a memory temperature above 200 C is no reading.
  const GpuSample& other = (*samples)[0];
  EXPECT_FALSE(other.memory_temperature_c.has_value());
  EXPECT_FALSE(other.nvlink_data_kib.has_value());
  EXPECT_FALSE(other.encoder_util_percent.has_value());
  EXPECT_THAT(other.read_errors, IsEmpty());
}

TEST_F(NvmlProbeTest, UsesMemoryInfoV2WithItsStructVersion) {
  std::unique_ptr<NvmlProbe> probe = Open(Script());
  ASSERT_NE(probe, nullptr);
  Result<std::vector<GpuSample>> samples = probe->Sample();
  ASSERT_OK(samples);
  // The fake answers ARGUMENT_VERSION_MISMATCH unless the version is 0x02000028.
  EXPECT_EQ((*samples)[0].fb_used_mib, 1024);
  EXPECT_THAT((*samples)[0].read_errors, IsEmpty());
  EXPECT_GT(fake_->CallCount("nvmlDeviceGetMemoryInfo_v2"), 0);
  EXPECT_EQ(fake_->CallCount("nvmlDeviceGetMemoryInfo"), 0);
}

TEST_F(NvmlProbeTest, NotSupportedFieldsAreAbsentNotZero) {
  Json script = Script();
  Json& gpu = script["devices"][0];
  gpu["power_mw"] = "NOT_SUPPORTED";
  gpu.erase("temperature_c");
  gpu.erase("gpm");
  gpu["remapped_rows"] = "NOT_SUPPORTED";
  std::unique_ptr<NvmlProbe> probe = Open(script);
  ASSERT_NE(probe, nullptr);
  ASSERT_OK(probe->Sample());
  Result<std::vector<GpuSample>> samples = probe->Sample();
  ASSERT_OK(samples);
  const GpuSample& sample = (*samples)[0];
  EXPECT_FALSE(sample.power_milliwatts.has_value());
  EXPECT_FALSE(sample.temperature_c.has_value());
  EXPECT_FALSE(sample.uncorrectable_remapped_rows.has_value());
  EXPECT_FALSE(sample.row_remap_failure.has_value());
  EXPECT_FALSE(sample.sm_active.has_value());
  EXPECT_EQ(sample.gpu_util_percent, 0);  // supported, and really zero
  EXPECT_THAT(sample.read_errors, IsEmpty());
}

TEST_F(NvmlProbeTest, OtherErrorsLeaveTheValueAbsentAndAreReported) {
  Json script = Script(1);
  script["devices"][0]["power_mw"] = "NO_PERMISSION";
  std::unique_ptr<NvmlProbe> probe = Open(script);
  ASSERT_NE(probe, nullptr);
  Result<std::vector<GpuSample>> samples = probe->Sample();
  ASSERT_OK(samples);
  EXPECT_FALSE((*samples)[0].power_milliwatts.has_value());
  EXPECT_THAT((*samples)[0].read_errors,
              ElementsAre("nvmlDeviceGetPowerUsage: NVML_ERROR_NO_PERMISSION"));
}

TEST_F(NvmlProbeTest, AGpuThatBecomesLostIsMarkedLostAndStaysLost) {
  Json script = Script();
  std::unique_ptr<NvmlProbe> probe = Open(script);
  ASSERT_NE(probe, nullptr);
  ASSERT_OK(probe->Inventory());
  ASSERT_OK(probe->Sample());

  script["devices"][1]["lost"] = true;
  ASSERT_OK(fake_->LoadScript(script.dump()));
  Result<std::vector<GpuSample>> samples = probe->Sample();
  ASSERT_OK(samples);
  EXPECT_FALSE((*samples)[0].lost);
  EXPECT_EQ((*samples)[0].gpu_util_percent, 0);
  EXPECT_TRUE((*samples)[1].lost);
  EXPECT_FALSE((*samples)[1].gpu_util_percent.has_value());
  EXPECT_FALSE((*samples)[1].temperature_c.has_value());

  // The driver may answer again, but a lost GPU needs a reset before it can be trusted.
  script["devices"][1]["lost"] = false;
  ASSERT_OK(fake_->LoadScript(script.dump()));
  samples = probe->Sample();
  ASSERT_OK(samples);
  EXPECT_TRUE((*samples)[1].lost);

  // Its identity, read before the loss, stays in the inventory.
  Result<ProbeInventory> inventory = probe->Inventory();
  ASSERT_OK(inventory);
  EXPECT_EQ(inventory->gpus[1].uuid, "GPU-a0000001-1111-2222-3333-000000004001");
}

TEST_F(NvmlProbeTest, DeliversXidEventsOnceWithTheirCodes) {
  Json script = Script();
  script["devices"][1]["xids"] = {79, {{"code", 31}, {"gpu_instance_id", 2}}};
  std::unique_ptr<NvmlProbe> probe = Open(script);
  ASSERT_NE(probe, nullptr);
  Result<std::vector<GpuSample>> samples = probe->Sample();
  ASSERT_OK(samples);
  EXPECT_THAT((*samples)[0].xids, IsEmpty());
  EXPECT_THAT((*samples)[1].xids,
              ElementsAre(XidEvent{79, std::nullopt}, XidEvent{31, std::optional<int>(2)}));
  samples = probe->Sample();
  ASSERT_OK(samples);
  EXPECT_THAT((*samples)[1].xids, IsEmpty());
  EXPECT_GT(fake_->CallCount("nvmlEventSetWait_v2"), 0);
}

TEST_F(NvmlProbeTest, AGpuWithoutXidEventsSaysSo) {
  Json script = Script();
  script["devices"][0]["xid_events"] = false;
  std::unique_ptr<NvmlProbe> probe = Open(script);
  ASSERT_NE(probe, nullptr);
  Result<std::vector<GpuSample>> samples = probe->Sample();
  ASSERT_OK(samples);
  EXPECT_FALSE((*samples)[0].xid_events_supported);
  EXPECT_TRUE((*samples)[1].xid_events_supported);
}

TEST_F(NvmlProbeTest, ReadsMigDevices) {
  Json script = Script(1);
  script["devices"][0]["mig"] = {
      {{"uuid", "MIG-11111111-2222-3333-4444-555555555555"},
       {"profile", "3g.40gb"},
       {"gpu_instance_id", 1},
       {"compute_instance_id", 0},
       {"memory", {{"total_mib", 40192}, {"used_mib", 12}}}},
      {{"uuid", "MIG-66666666-2222-3333-4444-555555555555"},
       {"profile", "3g.40gb"},
       {"gpu_instance_id", 2},
       {"compute_instance_id", 0},
       {"memory", {{"total_mib", 40192}, {"used_mib", 4000}}}},
  };
  script["devices"][0]["utilization"] = "NOT_SUPPORTED";
  std::unique_ptr<NvmlProbe> probe = Open(script);
  ASSERT_NE(probe, nullptr);
  Result<ProbeInventory> inventory = probe->Inventory();
  ASSERT_OK(inventory);
  const GpuStaticInfo& gpu = inventory->gpus[0];
  EXPECT_TRUE(gpu.mig_enabled);
  EXPECT_THAT(
      gpu.mig_devices,
      ElementsAre(
          MigDeviceInfo{"MIG-11111111-2222-3333-4444-555555555555", "3g.40gb", 1, 0, 40192},
          MigDeviceInfo{"MIG-66666666-2222-3333-4444-555555555555", "3g.40gb", 2, 0, 40192}));
  Result<std::vector<GpuSample>> samples = probe->Sample();
  ASSERT_OK(samples);
  const GpuSample& sample = (*samples)[0];
  EXPECT_FALSE(sample.gpu_util_percent.has_value());
  ASSERT_EQ(sample.mig_devices.size(), 2U);
  EXPECT_EQ(sample.mig_devices[1].gpu_instance_id, 2);
  EXPECT_EQ(sample.mig_devices[1].fb_used_mib, 4000);
  EXPECT_EQ(sample.mig_devices[1].fb_free_mib, 40192 - 4000);
}

TEST_F(NvmlProbeTest, NeverCallsAFunctionThatChangesTheGpu) {
  Json script = Script();
  script["devices"][0]["mig"] = Json::array();
  std::unique_ptr<NvmlProbe> probe = Open(script);
  ASSERT_NE(probe, nullptr);
  ASSERT_OK(probe->Inventory());
  ASSERT_OK(probe->Sample());
  ASSERT_OK(probe->Sample());
  probe.reset();
  const std::vector<std::string> called = fake_->CalledFunctions();
  EXPECT_THAT(called, Contains("nvmlDeviceGetMigMode"));
  for (const std::string& function : called) {
    if (function.starts_with("nvmlEventSet")) {
      continue;  // the probe's own event set: create, wait, free
    }
    for (const char* verb : {"Set", "Clear", "Reset", "Create", "Destroy"}) {
      EXPECT_THAT(function, Not(HasSubstr(verb)));
    }
  }
  EXPECT_EQ(fake_->CallCount("nvmlDeviceSetMigMode"), 0);
  EXPECT_EQ(fake_->CallCount("nvmlDeviceSetPersistenceMode"), 0);
}

TEST_F(NvmlProbeTest, ShutsDownAndFreesWhatItAllocated) {
  std::unique_ptr<NvmlProbe> probe = Open(Script());
  ASSERT_NE(probe, nullptr);
  ASSERT_OK(probe->Sample());
  probe.reset();
  EXPECT_EQ(fake_->CallCount("nvmlInit_v2"), 1);
  EXPECT_EQ(fake_->CallCount("nvmlShutdown"), 1);
  EXPECT_EQ(fake_->CallCount("nvmlEventSetFree"), 1);
  EXPECT_EQ(fake_->CallCount("nvmlGpmSampleAlloc"), 4);
  EXPECT_EQ(fake_->CallCount("nvmlGpmSampleFree"), 4);
}

TEST_F(NvmlProbeTest, NoDriverIsUnavailable) {
  Json script = Script();
  script["init"] = "DRIVER_NOT_LOADED";
  ASSERT_OK(fake_->LoadScript(script.dump()));
  EXPECT_THAT(NvmlProbe::Open({.library_path = GPUFLEET_FAKE_NVML_PATH}),
              StatusIs(StatusCode::kUnavailable, HasSubstr("NVML_ERROR_DRIVER_NOT_LOADED")));
}

TEST_F(NvmlProbeTest, NoLibraryIsUnavailableNamingThePath) {
  EXPECT_THAT(NvmlProbe::Open({.library_path = "/nonexistent/libnvidia-ml.so.1"}),
              StatusIs(StatusCode::kUnavailable, HasSubstr("/nonexistent/libnvidia-ml.so.1")));
}

TEST_F(NvmlProbeTest, AMissingRequiredFunctionIsAnErrorNamingIt) {
  std::unique_ptr<testing::FakeNvml> fake = Load(GPUFLEET_FAKE_NVML_NO_HANDLE_PATH);
  ASSERT_NE(fake, nullptr);
  ASSERT_OK(fake->LoadScript(testing::HealthyH100Script(1)));
  EXPECT_THAT(NvmlProbe::Open({.library_path = GPUFLEET_FAKE_NVML_NO_HANDLE_PATH}),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("lacks the required function nvmlDeviceGetHandleByIndex_v2")));
  EXPECT_EQ(fake->CallCount("nvmlInit_v2"), 0);
}

TEST_F(NvmlProbeTest, AnOldDriverWithoutOptionalFunctionsLeavesTheirFieldsAbsent) {
  std::unique_ptr<testing::FakeNvml> fake = Load(GPUFLEET_FAKE_NVML_LEGACY_PATH);
  ASSERT_NE(fake, nullptr);
  Json script = Script(1);
  script["devices"][0]["clocks_event_reasons"] = 4;
  ASSERT_OK(fake->LoadScript(script.dump()));
  Result<std::unique_ptr<NvmlProbe>> probe =
      NvmlProbe::Open({.library_path = GPUFLEET_FAKE_NVML_LEGACY_PATH});
  ASSERT_OK(probe);
  EXPECT_THAT((*probe)->missing_optional_functions(),
              AllOf(Contains("nvmlDeviceGetMemoryInfo_v2"), Contains("nvmlDeviceGetRemappedRows"),
                    Contains("nvmlGpmSampleGet"), Contains("nvmlEventSetWait_v2"),
                    Not(Contains("nvmlDeviceGetCurrentClocksEventReasons"))));
  ASSERT_OK((*probe)->Sample());
  Result<std::vector<GpuSample>> samples = (*probe)->Sample();
  ASSERT_OK(samples);
  const GpuSample& sample = (*samples)[0];
  // Version 1 memory info counts the reserved memory as used.
  EXPECT_EQ(sample.fb_used_mib, 1024 + 512);
  EXPECT_FALSE(sample.fb_reserved_mib.has_value());
  EXPECT_EQ(sample.temperature_c, 40);
  EXPECT_EQ(sample.clocks_event_reasons, 4U);  // through the older "throttle" name
  EXPECT_FALSE(sample.uncorrectable_remapped_rows.has_value());
  EXPECT_FALSE(sample.sm_active.has_value());
  EXPECT_FALSE(sample.xid_events_supported);
  EXPECT_EQ(fake->CallCount("nvmlDeviceGetCurrentClocksThrottleReasons"), 2);
}

TEST_F(NvmlProbeTest, TheFakeRejectsAScriptWithAnUnknownKey) {
  Json script = Script(1);
  script["devices"][0]["temperature"] = 40;
  EXPECT_THAT(fake_->LoadScript(script.dump()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unknown key \"temperature\"")));
  script = Script(1);
  script["devices"][0]["power_mw"] = "NOT_SUPORTED";
  EXPECT_THAT(fake_->LoadScript(script.dump()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("NOT_SUPORTED")));
}

}  // namespace
}  // namespace gpufleet::agent
