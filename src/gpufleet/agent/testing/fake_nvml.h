// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gpufleet/core/status.h"

// Control of the fake NVML library (fake_nvml.cc), a shared object that NvmlProbe loads in place
// of libnvidia-ml.so.1. Its answers come from a JSON script:
//
//   {"driver_version": "550.54.15", "cuda_driver_version": 12040, "nvml_version": "12.550.54.15",
//    "init": "DRIVER_NOT_LOADED",                       // optional: nvmlInit_v2 fails so
//    "devices": [{
//      "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "pci_bus_id": "00000000:18:00.0",
//      "serial": "1650923000123", "vbios_version": "96.00.89.00.01",
//      "memory": {"total_mib": 81559, "reserved_mib": 512, "used_mib": 1024},
//      "utilization": {"gpu": 50, "memory": 20}, "temperature_c": 45,
//      "slowdown_temperature_c": 87, "power_mw": 312500, "sm_clock_mhz": 1980,
//      "mem_clock_mhz": 2619, "ecc_dbe_volatile": 0, "pcie_replay": 0,
//      "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0},
//      "clocks_event_reasons": 4,
//      "gpm": {"sm_util": 45.0, "dram_bw_util": 30.0, "any_tensor_util": 20.0},  // percent
//      "xids": [79, {"code": 31, "gpu_instance_id": 1}],  // queued XID events
//      "xid_events": true,                                // false: XID events not supported
//      "lost": false,                                     // true: every call -> GPU_IS_LOST
//      "minor_number": 0,                                 // /dev/nvidia0
//      "cpu_affinity": [0, 1, 2, 3],                      // CPU ids near the GPU
//      "nvlinks": ["00000000:19:00.0", ""],               // remote bus id per link; "" inactive
//      "mig": [{"uuid": "MIG-...", "profile": "3g.40gb", "gpu_instance_id": 1,
//               "compute_instance_id": 0, "memory": {"total_mib": 40192, "used_mib": 12}}]
//    }]}
//
// A value key that is absent answers NVML_ERROR_NOT_SUPPORTED; a string names the error to
// answer instead ("NOT_SUPPORTED", "NO_PERMISSION", "GPU_IS_LOST", "UNKNOWN", ...). Unknown
// keys or error names make the load fail. Without a loaded script, nvmlInit_v2 reads the file
// named by GPUFLEET_FAKE_NVML_SCRIPT, and answers DRIVER_NOT_LOADED when there is none.
namespace gpufleet::agent::testing {

// Holds the fake library open (so its state lives across probes) and calls its control
// functions. Not thread-safe.
class FakeNvml {
 public:
  // kUnavailable when `path` cannot be loaded or is not the fake.
  static Result<std::unique_ptr<FakeNvml>> Open(const std::string& path);
  ~FakeNvml();
  FakeNvml(const FakeNvml&) = delete;
  FakeNvml& operator=(const FakeNvml&) = delete;

  // Replaces the script (handles stay valid). kInvalidArgument with the fake's reason.
  Status LoadScript(const std::string& json);
  // Calls of `function` since the last Reset().
  int CallCount(const std::string& function) const;
  // Every function called since the last Reset(), sorted by name.
  std::vector<std::string> CalledFunctions() const;
  // Forgets the script, counts, queued events and initialisation.
  void Reset();

 private:
  explicit FakeNvml(void* library) : library_(library) {}

  void* library_;
};

// A script of `gpus` healthy H100s with distinct UUIDs and bus ids, GPM and XID events
// supported: the common starting point of tests and the benchmark.
std::string HealthyH100Script(int gpus);

}  // namespace gpufleet::agent::testing
