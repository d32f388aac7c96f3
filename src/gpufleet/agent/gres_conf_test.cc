// SPDX-License-Identifier: Apache-2.0
// gres.conf from what NvmlProbe reads of the fake libnvidia-ml: files, types, cores and NVLinks.
#include "gpufleet/agent/gres_conf.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/agent/nvml_probe.h"
#include "gpufleet/agent/testing/fake_nvml.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::agent {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Four H100s as on half an HGX board without NVSwitch: GPUs 0-1 and 2-3 joined by two links
// each, 0 and 2 by one; 0-1 near CPUs 0-3 and their hyperthreads 8-11, 2-3 near CPUs 4-7.
Json FourGpuScript() {
  Json script = Json::parse(testing::HealthyH100Script(4));
  Json& devices = script["devices"];
  const std::string bus[] = {"00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0",
                             "00000000:5D:00.0"};
  devices[0]["nvlinks"] = {bus[1], bus[1], "", bus[2]};
  devices[1]["nvlinks"] = {bus[0], bus[0]};
  devices[2]["nvlinks"] = {bus[3], bus[3], "00000000:C4:00.0", bus[0]};  // C4: an NVSwitch
  devices[3]["nvlinks"] = {bus[2], bus[2]};
  for (int g = 0; g < 4; ++g) {
    devices[g]["minor_number"] = g;
    devices[g]["cpu_affinity"] = g < 2 ? Json{0, 1, 2, 3, 8, 9, 10, 11} : Json{4, 5, 6, 7};
  }
  return script;
}

// One socket, 8 cores, 16 CPUs: CPU c and c + 8 are the two threads of core c.
CpuCoreMap EightCores() {
  CpuCoreMap cores;
  for (int cpu = 0; cpu < 16; ++cpu) {
    cores[cpu] = cpu % 8;
  }
  return cores;
}

class GresConfTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fake = testing::FakeNvml::Open(GPUFLEET_FAKE_NVML_PATH);
    ASSERT_OK(fake);
    fake_ = std::move(fake).value();
  }

  Result<ProbeInventory> Read(const Json& script) {
    EXPECT_OK(fake_->LoadScript(script.dump()));
    auto probe = NvmlProbe::Open({.library_path = GPUFLEET_FAKE_NVML_PATH});
    if (!probe.ok()) {
      return probe.status();
    }
    return (*probe)->Inventory();
  }

  std::unique_ptr<testing::FakeNvml> fake_;
};

TEST_F(GresConfTest, WritesFilesTypesCoresAndLinksFromNvml) {
  auto inventory = Read(FourGpuScript());
  ASSERT_OK(inventory);
  auto conf = RenderGresConf(*inventory, EightCores(), "gpu01");
  ASSERT_OK(conf);
  EXPECT_EQ(*conf,
            "# gres.conf for gpu01: 4 GPU(s), driver 550.54.15, written by gpufleet probe "
            "--gres-conf\n"
            "Name=gpu Type=h100-80gb File=/dev/nvidia0 Cores=0-3 Links=-1,2,1,0\n"
            "Name=gpu Type=h100-80gb File=/dev/nvidia1 Cores=0-3 Links=2,-1,0,0\n"
            "Name=gpu Type=h100-80gb File=/dev/nvidia2 Cores=4-7 Links=1,0,-1,2\n"
            "Name=gpu Type=h100-80gb File=/dev/nvidia3 Cores=4-7 Links=0,0,2,-1\n");
}

TEST_F(GresConfTest, LeavesOutWhatNvmlDoesNotSay) {
  Json script = Json::parse(testing::HealthyH100Script(2));
  script["devices"][0]["minor_number"] = 4;
  script["devices"][1]["minor_number"] = 5;
  script["devices"][1]["name"] = "NVIDIA Future GPU 48GB";
  auto inventory = Read(script);
  ASSERT_OK(inventory);
  auto conf = RenderGresConf(*inventory, EightCores(), "");
  ASSERT_OK(conf);
  // No affinity, no NVLinks: no Cores=, no Links=; a model the catalog lacks keeps NVML's name.
  EXPECT_THAT(*conf, HasSubstr("\nName=gpu Type=h100-80gb File=/dev/nvidia4\n"));
  EXPECT_THAT(*conf, HasSubstr("\nName=gpu Type=nvidia_future_gpu_48gb File=/dev/nvidia5\n"));
}

TEST_F(GresConfTest, NamesTheGpuWithoutAMinorNumberOrWithAnUnknownCpu) {
  Json script = FourGpuScript();
  script["devices"][3].erase("minor_number");
  auto inventory = Read(script);
  ASSERT_OK(inventory);
  EXPECT_THAT(RenderGresConf(*inventory, EightCores(), "n"),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("GPU 3 (00000000:5D:00.0)")));
  inventory = Read(FourGpuScript());
  ASSERT_OK(inventory);
  CpuCoreMap few = {{0, 0}, {1, 1}};
  EXPECT_THAT(RenderGresConf(*inventory, few, "n"),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("GPU 0: CPU 2")));
  EXPECT_THAT(RenderGresConf(ProbeInventory{}, few, "n"), StatusIs(StatusCode::kInvalidArgument));
}

TEST(CpuCoreMap, NumbersCoresSocketBySocketWithTheirThreads) {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("gres_conf_test." + std::to_string(getpid()));
  // Two sockets of two cores (core ids 0 and 4, as Linux leaves gaps), two threads each.
  const int topology[][3] = {{0, 0, 0}, {1, 0, 4}, {2, 1, 0}, {3, 1, 4},
                             {4, 0, 0}, {5, 0, 4}, {6, 1, 0}, {7, 1, 4}};
  for (const auto& [cpu, socket, core] : topology) {
    const auto dir = root / ("cpu" + std::to_string(cpu)) / "topology";
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "physical_package_id") << socket << "\n";
    std::ofstream(dir / "core_id") << core << "\n";
  }
  std::filesystem::create_directories(root / "cpufreq");  // not a CPU
  auto map = ReadCpuCoreMap(root.string());
  std::filesystem::remove_all(root);
  ASSERT_OK(map);
  EXPECT_EQ(*map, (CpuCoreMap{{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 0}, {5, 1}, {6, 2}, {7, 3}}));
  EXPECT_THAT(ReadCpuCoreMap(root.string()), StatusIs(StatusCode::kUnavailable));
}

}  // namespace
}  // namespace gpufleet::agent
