// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/core/mig.h"
#include "gpufleet/core/status.h"

// The node agent's view of its GPUs: what they are (inventory) and what they read now (samples).
namespace gpufleet::agent {

// One MIG device (a GPU instance with its compute instance) of a MIG-enabled GPU.
struct MigDeviceInfo {
  std::string uuid;         // "MIG-..."
  std::string profile;      // "3g.40gb", without the "MIG " prefix
  int gpu_instance_id = 0;  // dcgm-exporter's GPU_I_ID
  int compute_instance_id = 0;
  int64_t memory_mib = 0;  // the instance's framebuffer
  // First memory slice of the instance's placement; absent when the probe does not read it (the
  // NVML probe does not).
  std::optional<int> placement_start = std::nullopt;

  friend bool operator==(const MigDeviceInfo&, const MigDeviceInfo&) = default;
};

// What does not change while the driver stays loaded (MIG layouts change only by an operator).
struct GpuStaticInfo {
  int index = 0;             // NVML index (PCI bus order), dcgm-exporter's `gpu`
  std::string uuid;          // "GPU-..."
  std::string pci_bus_id;    // "00000000:18:00.0"
  std::string nvml_name;     // "NVIDIA H100 80GB HBM3", dcgm-exporter's modelName
  std::string model;         // gpufleet catalog name ("H100-80GB"); empty if the catalog lacks it
  int64_t memory_mib = 0;    // total framebuffer
  bool mig_enabled = false;  // current MIG mode
  std::vector<MigDeviceInfo> mig_devices;
  std::optional<int> slowdown_temperature_c;  // where the GPU starts to slow itself down
  // What Slurm's gres.conf says of a GPU (`gpufleet probe --gres-conf`); absent or empty when
  // the probe does not read them (the simulated one) or the driver does not answer.
  std::optional<int> minor_number;  // the N of /dev/nvidiaN
  std::vector<int> cpu_affinity;    // logical CPU ids near the GPU (its NUMA node), ascending
  // The PCI bus id at the far end of each active NVLink: another GPU's, or an NVSwitch's.
  std::vector<std::string> nvlink_remote_bus_ids;
  // The board's serial number and VBIOS version (nvmlDeviceGetSerial, nvmlDeviceGetVbiosVersion)
  // for provenance records; empty when the probe does not read them.
  std::string serial;
  std::string vbios_version;

  friend bool operator==(const GpuStaticInfo&, const GpuStaticInfo&) = default;
};

struct ProbeInventory {
  std::string driver_version;  // "550.54.15"
  std::string cuda_version;    // "12.4" (the newest CUDA the driver supports); empty if unknown
  std::string nvml_version;    // "12.550.54.15" (nvmlSystemGetNVMLVersion); empty if unknown
  std::vector<GpuStaticInfo> gpus;  // by index

  friend bool operator==(const ProbeInventory&, const ProbeInventory&) = default;
};

// One XID reported by the driver.
struct XidEvent {
  int code = 0;
  std::optional<int> gpu_instance_id;  // set when the error hit one MIG instance

  friend bool operator==(const XidEvent&, const XidEvent&) = default;
};

// Readings of one MIG device; absent values as in GpuSample.
struct MigDeviceSample {
  int gpu_instance_id = 0;
  std::optional<int64_t> fb_used_mib;
  std::optional<int64_t> fb_free_mib;

  friend bool operator==(const MigDeviceSample&, const MigDeviceSample&) = default;
};

// One reading of one GPU. Every value is optional: a value the GPU or driver does not provide
// is absent, never zero, so that exporters can leave it out and health rules can ignore it.
struct GpuSample {
  int index = 0;
  // The GPU no longer answers (NVML_ERROR_GPU_IS_LOST, "fallen off the bus"); the readings that
  // came before the loss are kept, the rest are absent.
  bool lost = false;

  std::optional<int64_t> gpu_util_percent;          // kernel-active time
  std::optional<int64_t> memory_copy_util_percent;  // memory-controller busy time
  std::optional<int64_t> fb_used_mib;               // excludes the driver's reserved memory
  std::optional<int64_t> fb_free_mib;
  std::optional<int64_t> fb_reserved_mib;
  std::optional<int64_t> temperature_c;
  std::optional<int64_t> memory_temperature_c;  // HBM; absent when NVML reads above 200
  std::optional<int64_t> power_milliwatts;
  std::optional<int64_t> total_energy_millijoules;  // since the driver loaded
  std::optional<int64_t> encoder_util_percent;
  std::optional<int64_t> decoder_util_percent;
  // NVLink data sent plus received over every link since the driver loaded, in KiB.
  std::optional<int64_t> nvlink_data_kib;
  std::optional<int64_t> sm_clock_mhz;
  std::optional<int64_t> memory_clock_mhz;

  // XIDs since the previous sample, oldest first. `xid_events_supported` is false when the
  // driver cannot report them for this GPU (then `xids` is always empty).
  bool xid_events_supported = false;
  std::vector<XidEvent> xids;

  std::optional<int64_t> ecc_dbe_volatile_total;  // uncorrected (double-bit) ECC errors
  std::optional<int64_t> correctable_remapped_rows;
  std::optional<int64_t> uncorrectable_remapped_rows;
  std::optional<bool> row_remap_pending;  // remapped rows that need a GPU reset to take effect
  std::optional<bool> row_remap_failure;
  std::optional<int64_t> pcie_replay_count;
  std::optional<uint64_t> clocks_event_reasons;  // nvmlClocksEventReason* bits ("throttle")

  // GPM ratios 0.0-1.0 (Hopper and later).
  std::optional<double> sm_active;
  std::optional<double> dram_active;
  std::optional<double> tensor_active;
  std::optional<double> graphics_engine_active;
  // GPM PCIe rates (Hopper and later), bytes per second, protocol headers included.
  std::optional<int64_t> pcie_tx_bytes_per_second;
  std::optional<int64_t> pcie_rx_bytes_per_second;

  std::vector<MigDeviceSample> mig_devices;  // MIG-enabled GPUs only, by GPU instance id
  // Reads that failed for a reason other than "not supported", e.g.
  // "nvmlDeviceGetPowerUsage: NVML_ERROR_NO_PERMISSION"; the value is absent.
  std::vector<std::string> read_errors;

  friend bool operator==(const GpuSample&, const GpuSample&) = default;
};

// A source of GPU readings: NVML on a real node, a simulation elsewhere. Implementations say
// whether they are thread-safe; callers that share one across threads serialise the calls.
class GpuProbe {
 public:
  virtual ~GpuProbe() = default;

  // The GPUs and driver as they are now (MIG layouts are re-read on every call).
  virtual Result<ProbeInventory> Inventory() = 0;

  // One sample per GPU, by index. XIDs are those reported since the previous call. A GPU that is
  // lost is reported with `lost` set, not as an error; an error means nothing could be read.
  virtual Result<std::vector<GpuSample>> Sample() = 0;

  // True when ApplyMigLayout can change MIG layouts (the node agent tells the server so).
  virtual bool CanApplyMigLayouts() const { return false; }

  // Makes the MIG instances of GPU `gpu_index` exactly `wanted` (profile and start slot; `in_use`
  // is ignored), all of it or nothing: destroys the instances not wanted and creates the missing
  // ones. Returns the GPU's MIG devices after it. By default kUnimplemented: the probe only reads
  // MIG layouts (the NVML probe). Implementations answer kFailedPrecondition when MIG is disabled
  // or an instance to destroy is in use, and kInvalidArgument for a layout the model does not
  // allow.
  virtual Result<std::vector<MigDeviceInfo>> ApplyMigLayout(int gpu_index,
                                                            const std::vector<MigInstance>& wanted);
};

// Names of the bits set in `reasons`, e.g. {"sw_power_cap", "hw_thermal_slowdown"}; an unknown
// bit is named by its value ("0x400").
std::vector<std::string> ClocksEventReasonNames(uint64_t reasons);

}  // namespace gpufleet::agent
