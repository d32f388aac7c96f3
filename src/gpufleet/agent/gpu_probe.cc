// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/gpu_probe.h"

#include <utility>

#include <fmt/core.h>

#include "gpufleet/agent/nvml_api.h"

namespace gpufleet::agent {

Result<std::vector<MigDeviceInfo>> GpuProbe::ApplyMigLayout(
    int gpu_index, const std::vector<MigInstance>& /*wanted*/) {
  return Status(StatusCode::kUnimplemented,
                fmt::format("gpu {}: this GPU probe only reads MIG layouts; change them with "
                            "nvidia-smi mig",
                            gpu_index));
}

std::vector<std::string> ClocksEventReasonNames(uint64_t reasons) {
  static constexpr std::pair<uint64_t, const char*> kNames[] = {
      {nvml::kClocksEventGpuIdle, "gpu_idle"},
      {nvml::kClocksEventApplicationsClocksSetting, "applications_clocks_setting"},
      {nvml::kClocksEventSwPowerCap, "sw_power_cap"},
      {nvml::kClocksEventHwSlowdown, "hw_slowdown"},
      {nvml::kClocksEventSyncBoost, "sync_boost"},
      {nvml::kClocksEventSwThermalSlowdown, "sw_thermal_slowdown"},
      {nvml::kClocksEventHwThermalSlowdown, "hw_thermal_slowdown"},
      {nvml::kClocksEventHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
      {nvml::kClocksEventDisplayClockSetting, "display_clock_setting"},
  };
  std::vector<std::string> names;
  uint64_t known = 0;
  for (const auto& [bit, name] : kNames) {
    known |= bit;
    if ((reasons & bit) != 0) {
      names.emplace_back(name);
    }
  }
  for (int shift = 0; shift < 64; ++shift) {
    const uint64_t bit = uint64_t{1} << shift;
    if ((reasons & bit) != 0 && (known & bit) == 0) {
      names.push_back(fmt::format("{:#x}", bit));
    }
  }
  return names;
}

}  // namespace gpufleet::agent
