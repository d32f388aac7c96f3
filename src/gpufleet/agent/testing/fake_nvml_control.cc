// SPDX-License-Identifier: Apache-2.0
#include <dlfcn.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "gpufleet/agent/testing/fake_nvml.h"

namespace gpufleet::agent::testing {
namespace {

using LoadScriptFn = int (*)(const char*);
using LastErrorFn = const char* (*)();
using CallCountFn = int (*)(const char*);
using ResetFn = void (*)();
using CalledFunctionsFn = const char* (*)();

template <typename Fn>
Fn Find(void* library, const char* name) {
  return reinterpret_cast<Fn>(dlsym(library, name));
}

}  // namespace

Result<std::unique_ptr<FakeNvml>> FakeNvml::Open(const std::string& path) {
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    return UnavailableError(
        fmt::format("cannot load fake NVML \"{}\": {}", path, error ? error : "unknown error"));
  }
  if (dlsym(library, "gpufleet_fake_nvml_load_script") == nullptr) {
    dlclose(library);
    return UnavailableError(fmt::format("\"{}\" is not the fake NVML library", path));
  }
  return std::unique_ptr<FakeNvml>(new FakeNvml(library));
}

FakeNvml::~FakeNvml() {
  Reset();
  dlclose(library_);
}

Status FakeNvml::LoadScript(const std::string& json) {
  if (Find<LoadScriptFn>(library_, "gpufleet_fake_nvml_load_script")(json.c_str()) != 0) {
    return InvalidArgumentError(Find<LastErrorFn>(library_, "gpufleet_fake_nvml_last_error")());
  }
  return Status();
}

int FakeNvml::CallCount(const std::string& function) const {
  return Find<CallCountFn>(library_, "gpufleet_fake_nvml_call_count")(function.c_str());
}

std::vector<std::string> FakeNvml::CalledFunctions() const {
  const std::string names =
      Find<CalledFunctionsFn>(library_, "gpufleet_fake_nvml_called_functions")();
  std::vector<std::string> functions;
  size_t begin = 0;
  while (begin < names.size()) {
    const size_t comma = names.find(',', begin);
    const size_t end = comma == std::string::npos ? names.size() : comma;
    functions.push_back(names.substr(begin, end - begin));
    begin = end + 1;
  }
  return functions;
}

void FakeNvml::Reset() {
  Find<ResetFn>(library_, "gpufleet_fake_nvml_reset")();
}

std::string HealthyH100Script(int gpus) {
  // Bus numbers of an 8-GPU HGX board.
  static constexpr int kBuses[] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};
  nlohmann::json devices = nlohmann::json::array();
  for (int i = 0; i < gpus; ++i) {
    const int bus = i < 8 ? kBuses[i] : 0x10 + i;
    devices.push_back({
        {"name", "NVIDIA H100 80GB HBM3"},
        {"uuid", fmt::format("GPU-{:08x}-1111-2222-3333-{:012x}", 0xa0000000 + i, 0x4000 + i)},
        {"pci_bus_id", fmt::format("00000000:{:02X}:00.0", bus)},
        {"memory", {{"total_mib", 81559}, {"reserved_mib", 512}, {"used_mib", 1024 * (i + 1)}}},
        {"utilization", {{"gpu", 10 * i}, {"memory", 5 * i}}},
        {"temperature_c", 40 + i},
        {"slowdown_temperature_c", 87},
        {"power_mw", 100000 + 25000 * i},
        {"sm_clock_mhz", 1980},
        {"mem_clock_mhz", 2619},
        {"ecc_dbe_volatile", 0},
        {"remapped_rows",
         {{"correctable", 0}, {"uncorrectable", 0}, {"pending", 0}, {"failure", 0}}},
        {"pcie_replay", 0},
        {"clocks_event_reasons", 0},
        {"gpm", {{"sm_util", 9.0 * i}, {"dram_bw_util", 4.0 * i}, {"any_tensor_util", 2.5 * i}}},
        {"serial", fmt::format("16509230{:05d}", i)},
        {"vbios_version", "96.00.89.00.01"},
    });
  }
  return nlohmann::json{{"driver_version", "550.54.15"},
                        {"cuda_driver_version", 12040},
                        {"nvml_version", "12.550.54.15"},
                        {"devices", devices}}
      .dump();
}

}  // namespace gpufleet::agent::testing
