// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpufleet/agent/diagnostics.h"
#include "gpufleet/agent/gpu_probe.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/mig.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/status.h"

namespace gpufleet::agent {

namespace internal {
struct SimulatedModelParams;
}  // namespace internal

// How a task's utilisation moves over time.
enum class LoadPattern {
  kSteady,     // the target, give or take noise
  kTraining,   // the target, with a dip to a quarter of it for 3 s of every 30 s (checkpoints)
  kInference,  // a 60 s triangle wave between a third of the target and the target
};

// A change of one MIG-enabled GPU's layout, as the MIG planner makes it: free instances to
// destroy (by profile and start slot; `in_use` is ignored) and instances to create at the given
// start slots.
struct MigLayoutChange {
  std::vector<MigInstance> destroy;
  std::vector<MigInstance> create;
};

// What a task does to a GPU.
struct GpuLoad {
  int64_t utilization_percent = 0;  // 0-100; 0 is an idle GPU
  int64_t memory_used_mib = 0;      // framebuffer the task holds
  LoadPattern pattern = LoadPattern::kSteady;
};

// A GpuProbe without hardware: GPUs of one catalog model whose readings follow the load set on
// them (SetLoad, which the agent calls for running tasks) and the faults injected into them.
// Readings are a function of the injected clock's time, the seed and that state only, so the
// same run gives the same numbers. Per-model figures (power, clocks, GPM on Hopper and later)
// are plausible values, not measurements. MIG-enabled GPUs report no GPU utilisation and no
// GPM at the GPU level, as NVML does.
//
// It is also the built-in diagnostic's device exercise on such a node, answering per the fault
// model: a faulty GPU (a latent fault, SetLatentFault, or an injected uncorrectable ECC error,
// row-remap failure or loss) fails it with probability diagnostic_sensitivity, a healthy one
// with probability diagnostic_false_positive_rate; the draws follow the seed.
//
// Thread-safe: the sampler and the task runner may call it from different threads.
class SimulatedProbe final : public GpuProbe, public DeviceExercise {
 public:
  struct Options {
    std::string model = "H100-80GB";  // a catalog name or alias
    int gpu_count = 8;
    uint64_t seed = 1;  // UUIDs and noise
    std::string driver_version = "550.54.15";
    std::string cuda_version = "12.4";
    std::string nvml_version = "12.550.54.15";
    std::string vbios_version = "96.00.89.00.01";
    // GPUs with MIG enabled and their instances in creation order, e.g. {{0, {"3g.40gb",
    // "3g.40gb"}}}; each goes at the lowest placement where it fits.
    std::map<int, std::vector<std::string>> mig_profiles;
    // The diagnostic's chance to find a faulty GPU's fault, and to fail a healthy GPU. Assumed
    // figures (docs/reliability.md, "Active diagnostics"): DCGM's level-2 diagnostic finds most
    // but not all of what fails jobs, and a stress test sometimes trips on a good part.
    double diagnostic_sensitivity = 0.9;
    double diagnostic_false_positive_rate = 0.01;
  };

  // kInvalidArgument naming the option and its value: an unknown model, a GPU count outside
  // [1, 64], a MIG layout on a model without MIG, on a GPU that does not exist, or that does not
  // fit, a diagnostic rate outside [0, 1]. `clock` must outlive the probe.
  static Result<std::unique_ptr<SimulatedProbe>> Create(const Clock& clock,
                                                        const GpuCatalog& catalog, Options options);
  ~SimulatedProbe() override;
  SimulatedProbe(const SimulatedProbe&) = delete;
  SimulatedProbe& operator=(const SimulatedProbe&) = delete;

  Result<ProbeInventory> Inventory() override;
  Result<std::vector<GpuSample>> Sample() override;
  bool CanApplyMigLayouts() const override { return true; }
  // ApplyMigLayoutChange with the difference between the GPU's instances and `wanted`; the
  // devices unchanged when they match. Its errors, and kInvalidArgument for a bad index.
  Result<std::vector<MigDeviceInfo>> ApplyMigLayout(
      int gpu_index, const std::vector<MigInstance>& wanted) override;

  // Each of these answers kInvalidArgument for a GPU index outside [0, gpu_count).

  // kInvalidArgument for a utilisation outside [0, 100] or memory outside [0, the GPU's free].
  Status SetLoad(int gpu_index, GpuLoad load);
  // Reported once, in the next sample. kInvalidArgument for a code outside [1, 999].
  Status InjectXid(int gpu_index, int code);
  // One uncorrectable ECC error: the volatile DBE count and the uncorrectable remapped rows go
  // up, a remap waits for a reset, and XIDs 48 and 63 are reported.
  Status InjectDoubleBitEcc(int gpu_index);
  // Row remapping failed (permanent) and XID 64 is reported.
  Status InjectRowRemapFailure(int gpu_index);
  // The GPU holds `temperature_c` with its thermal slowdown reasons set and lower clocks.
  // kInvalidArgument for a temperature outside [0, 150].
  Status InjectThermalExcursion(int gpu_index, int64_t temperature_c);
  // The board's power brake is asserted: HW power-brake slowdown, clocks and power drop.
  Status InjectPowerBrake(int gpu_index);
  // The GPU falls off the bus: every later sample reports it lost, with XID 79 once.
  Status InjectGpuLost(int gpu_index);
  // A fault that no reading shows (the fault model's bad GPU, which only fails jobs) but that a
  // diagnostic may find; `faulty` false repairs it (a replaced part).
  Status SetLatentFault(int gpu_index, bool faulty);
  // One "simulated.exercise" check of the GPU at gpu.index, drawn per the fault model; an index
  // outside the probe's GPUs is an unavailable check.
  std::vector<DiagnosticCheck> Exercise(const GpuStaticInfo& gpu) override;
  // A GPU reset: clears the transient faults (thermal, power brake, lost, volatile ECC count,
  // pending remap); remapped rows and a remap failure stay, as in hardware. The load stays.
  Status ResetGpu(int gpu_index);

  // Marks MIG device `gpu_instance_id` of the GPU as held by a task, or no longer held; a device
  // in use cannot be destroyed. kNotFound when the GPU has no such device.
  Status SetMigDeviceInUse(int gpu_index, int gpu_instance_id, bool in_use);
  // Applies `change` to the GPU's MIG layout, all of it or nothing, and returns the GPU's MIG
  // devices after it: those kept, then the new ones, each with a new MIG UUID and the lowest free
  // GPU instance id (0 for the full-GPU profile). Inventory() reports them from then on.
  // kFailedPrecondition when the GPU has MIG disabled or an instance to destroy is in use;
  // kNotFound when no instance of that profile starts at that slot; kInvalidArgument naming the
  // instance for an unknown profile, a start slot the profile does not allow, or a layout that
  // breaks the model's limits (overlapping slices, too many instances).
  Result<std::vector<MigDeviceInfo>> ApplyMigLayoutChange(int gpu_index,
                                                          const MigLayoutChange& change);

 private:
  struct SimGpu;

  SimulatedProbe(const Clock& clock, GpuModelInfo model, Options options, ProbeInventory inventory,
                 const internal::SimulatedModelParams& params, Random uuid_random);
  Status CheckIndex(int gpu_index) const;
  // REQUIRES: mu_ held.
  GpuSample SampleGpu(size_t index, int64_t now_ms);

  const Clock& clock_;
  const GpuModelInfo model_;  // a copy: the catalog may go first
  const Options options_;
  const internal::SimulatedModelParams& params_;

  mutable std::mutex mu_;
  ProbeInventory inventory_;  // guarded by mu_: MIG layouts change
  std::vector<SimGpu> gpus_;  // guarded by mu_
  Random uuid_random_;        // guarded by mu_
  Random diagnostic_random_;  // guarded by mu_
};

}  // namespace gpufleet::agent
