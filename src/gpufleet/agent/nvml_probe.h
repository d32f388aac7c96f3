// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gpufleet/agent/gpu_probe.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"

namespace gpufleet::agent {

// The GpuProbe of a real node: NVML, opened at run time with dlopen so that gpufleet builds
// without NVIDIA headers and runs where no driver is installed. Functions are resolved with
// dlsym under their versioned names (nvml_api.h). A missing required function makes Open fail
// with a message that names it; a missing optional one leaves its readings absent, as does
// NVML_ERROR_NOT_SUPPORTED. NVML_ERROR_GPU_IS_LOST marks the GPU lost for the rest of the
// probe's life. XIDs come from NVML's event API, polled without waiting on every Sample().
//
// Read-only: it never calls an NVML function that changes clocks, power limits, MIG mode,
// persistence mode or any other device state.
//
// Thread-compatible: one thread at a time (the telemetry sampler serialises its calls).
class NvmlProbe final : public GpuProbe {
 public:
  static constexpr const char* kDefaultLibrary = "libnvidia-ml.so.1";

  struct Options {
    // The soname or path given to dlopen; tests point it at the fake library.
    std::string library_path = kDefaultLibrary;
    // Maps NVML names to catalog models; nullptr means GpuCatalog::Default(). Must outlive the
    // probe.
    const GpuCatalog* catalog = nullptr;
  };

  // Loads the library, resolves its functions, initialises NVML, finds the GPUs and registers
  // for their XID events. kUnavailable when the library cannot be loaded or NVML cannot start
  // (no driver); kFailedPrecondition when a required function is missing.
  static Result<std::unique_ptr<NvmlProbe>> Open(Options options);
  ~NvmlProbe() override;
  NvmlProbe(const NvmlProbe&) = delete;
  NvmlProbe& operator=(const NvmlProbe&) = delete;

  // kUnavailable naming the GPU and the function when a GPU's identity cannot be read (a lost
  // GPU keeps the identity read before it was lost).
  Result<ProbeInventory> Inventory() override;
  Result<std::vector<GpuSample>> Sample() override;

  // Optional NVML functions the library lacks, e.g. {"nvmlGpmSampleGet"}: what `gpufleet probe`
  // prints to explain absent readings.
  const std::vector<std::string>& missing_optional_functions() const;

 private:
  struct Api;
  struct DeviceState;

  NvmlProbe(Options options, void* library, std::unique_ptr<Api> api);
  Status Start();
  void PollEvents(std::vector<GpuSample>& samples);
  void SampleDevice(DeviceState& device, GpuSample& sample);
  void SampleGpm(DeviceState& device, GpuSample& sample);
  // The readings only nvmlDeviceGetFieldValues gives: memory temperature, NVLink traffic.
  void SampleFields(DeviceState& device, GpuSample& sample);
  Result<GpuStaticInfo> ReadStaticInfo(DeviceState& device);
  void ReadSlurmInfo(const DeviceState& device, GpuStaticInfo& info);

  Options options_;
  GpuCatalog default_catalog_;
  void* library_ = nullptr;  // dlopen handle, closed by the destructor
  std::unique_ptr<Api> api_;
  bool initialized_ = false;
  std::vector<std::unique_ptr<DeviceState>> devices_;
  bool events_enabled_ = false;
  void* event_set_ = nullptr;  // nvmlEventSet_t
};

}  // namespace gpufleet::agent
