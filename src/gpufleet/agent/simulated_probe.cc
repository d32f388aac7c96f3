// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/simulated_probe.h"

#include <algorithm>
#include <set>
#include <utility>

#include <fmt/core.h>

#include "gpufleet/agent/nvml_api.h"
#include "gpufleet/core/mig.h"
#include "gpufleet/core/random.h"

namespace gpufleet::agent {

namespace internal {

// Plausible figures per model (board power, clocks); not measurements.
struct SimulatedModelParams {
  const char* model;
  const char* nvml_name;
  int64_t idle_milliwatts;
  int64_t max_milliwatts;
  int64_t idle_sm_clock_mhz;
  int64_t max_sm_clock_mhz;
  int64_t memory_clock_mhz;
  int slowdown_temperature_c;
  bool gpm;  // Hopper and later
};

}  // namespace internal

namespace {

using internal::SimulatedModelParams;

constexpr int kMaxGpus = 64;
constexpr int64_t kReservedMiB = 512;  // what the driver keeps for itself
constexpr int64_t kIdleUsedMiB = 7;    // an idle GPU's used memory (NVML v2 excludes reserved)
constexpr int kAmbientC = 30;
constexpr int kBuses[] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

}  // namespace

struct SimulatedProbe::SimGpu {
  GpuLoad load;
  std::vector<XidEvent> pending_xids;
  int64_t ecc_dbe_volatile = 0;
  int64_t uncorrectable_remapped_rows = 0;
  bool remap_pending = false;
  bool remap_failure = false;
  std::optional<int64_t> thermal_excursion_c;
  bool power_brake = false;
  bool lost = false;
  bool latent_fault = false;
  std::set<int> mig_in_use;  // GPU instance ids held by tasks
};

namespace {

const SimulatedModelParams kModels[] = {
    {"H100-80GB", "NVIDIA H100 80GB HBM3", 70000, 700000, 345, 1980, 2619, 87, true},
    {"H200-141GB", "NVIDIA H200", 75000, 700000, 345, 1980, 3201, 87, true},
    {"GB200", "NVIDIA GB200", 120000, 1200000, 390, 2062, 3996, 87, true},
    {"A100-80GB", "NVIDIA A100-SXM4-80GB", 55000, 400000, 210, 1410, 1593, 86, false},
    {"A100-40GB", "NVIDIA A100-SXM4-40GB", 50000, 400000, 210, 1410, 1215, 86, false},
    {"L40S", "NVIDIA L40S", 35000, 350000, 210, 2520, 9001, 88, false},
    {"A10", "NVIDIA A10", 25000, 150000, 210, 1695, 6251, 88, false},
    {"T4", "Tesla T4", 10000, 70000, 300, 1590, 5000, 85, false},
    {"V100-16GB", "Tesla V100-SXM2-16GB", 40000, 300000, 135, 1530, 877, 86, false},
    {"V100-32GB", "Tesla V100-SXM2-32GB", 40000, 300000, 135, 1530, 877, 86, false},
    {"P100", "Tesla P100-SXM2-16GB", 30000, 300000, 405, 1480, 715, 85, false},
};
// Models the catalog learnt from traces get generic figures.
const SimulatedModelParams kGenericModel = {"", "", 40000, 300000, 210, 1500, 1500, 85, false};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from the random stream.
std::string RandomUuid(Random& random, const char* prefix) {
  const uint64_t high = random.Next();
  const uint64_t low = random.Next();
  return fmt::format("{}-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", prefix, high >> 32,
                     (high >> 16) & 0xffff, high & 0xffff, low >> 48, low & 0xffffffffffffULL);
}

// Noise in [-spread, spread], fixed for one (seed, GPU, second).
int64_t Noise(uint64_t seed, int gpu, int64_t second, int64_t spread) {
  Random random(seed ^ (uint64_t{0x9e3779b97f4a7c15} * static_cast<uint64_t>(gpu + 1)) ^
                static_cast<uint64_t>(second));
  return static_cast<int64_t>(random.Uniform(static_cast<uint64_t>(2 * spread + 1))) - spread;
}

// The pattern's share of the target at `now_ms`.
int64_t PatternUtilization(const GpuLoad& load, int64_t now_ms) {
  const int64_t target = load.utilization_percent;
  switch (load.pattern) {
    case LoadPattern::kSteady:
      return target;
    case LoadPattern::kTraining:
      return (now_ms / 1000) % 30 >= 27 ? target / 4 : target;
    case LoadPattern::kInference: {
      const int64_t phase = now_ms % 60000;  // up for 30 s, down for 30 s
      const int64_t rise = phase < 30000 ? phase : 60000 - phase;
      const int64_t low = target / 3;
      return low + (target - low) * rise / 30000;
    }
  }
  return target;
}

}  // namespace

Result<std::unique_ptr<SimulatedProbe>> SimulatedProbe::Create(const Clock& clock,
                                                               const GpuCatalog& catalog,
                                                               Options options) {
  Result<const GpuModelInfo*> model = catalog.Find(options.model);
  if (!model.ok()) {
    return InvalidArgumentError(
        fmt::format("simulated probe: model: {}", model.status().message()));
  }
  const GpuModelInfo& info = **model;
  if (options.gpu_count < 1 || options.gpu_count > kMaxGpus) {
    return InvalidArgumentError(
        fmt::format("simulated probe: gpu_count {} outside [1, {}]", options.gpu_count, kMaxGpus));
  }
  for (const auto& [name, rate] :
       {std::pair<const char*, double>{"diagnostic_sensitivity", options.diagnostic_sensitivity},
        {"diagnostic_false_positive_rate", options.diagnostic_false_positive_rate}}) {
    if (!(rate >= 0 && rate <= 1)) {
      return InvalidArgumentError(
          fmt::format("simulated probe: {}: {} outside [0, 1]", name, rate));
    }
  }
  const SimulatedModelParams* params = &kGenericModel;
  for (const SimulatedModelParams& candidate : kModels) {
    if (info.name == candidate.model) {
      params = &candidate;
    }
  }

  Random random(options.seed);
  ProbeInventory inventory;
  inventory.driver_version = options.driver_version;
  inventory.cuda_version = options.cuda_version;
  inventory.nvml_version = options.nvml_version;
  for (int i = 0; i < options.gpu_count; ++i) {
    GpuStaticInfo gpu;
    gpu.index = i;
    gpu.uuid = RandomUuid(random, "GPU");
    gpu.pci_bus_id = fmt::format("00000000:{:02X}:00.0", i < 8 ? kBuses[i] : 0x10 + i);
    gpu.nvml_name = *params->nvml_name != '\0' ? params->nvml_name : "NVIDIA " + info.name;
    gpu.model = info.name;
    gpu.memory_mib = info.memory_mib;
    gpu.slowdown_temperature_c = params->slowdown_temperature_c;
    // A 13-digit board serial, as NVIDIA's data-center boards have, from the UUID's last digits.
    gpu.serial = "1650" + gpu.uuid.substr(gpu.uuid.size() - 9);
    gpu.vbios_version = options.vbios_version;
    inventory.gpus.push_back(std::move(gpu));
  }
  for (const auto& [index, profiles] : options.mig_profiles) {
    if (index < 0 || index >= options.gpu_count) {
      return InvalidArgumentError(fmt::format(
          "simulated probe: mig_profiles: GPU {} outside [0, {})", index, options.gpu_count));
    }
    if (!info.SupportsMig()) {
      return InvalidArgumentError(
          fmt::format("simulated probe: mig_profiles: model {} has no MIG", info.name));
    }
    GpuStaticInfo& gpu = inventory.gpus[static_cast<size_t>(index)];
    gpu.mig_enabled = true;
    MigLayout layout;
    int next_instance_id = 1;
    for (const std::string& name : profiles) {
      const MigProfile* profile = info.FindMigProfile(name);
      if (profile == nullptr) {
        return InvalidArgumentError(
            fmt::format("simulated probe: mig_profiles: GPU {}: unknown profile \"{}\" (known: {})",
                        index, name, info.MigProfileNames()));
      }
      const std::optional<int> start = layout.FindStart(*profile);
      if (!start.has_value()) {
        return InvalidArgumentError(fmt::format(
            "simulated probe: mig_profiles: GPU {}: \"{}\" does not fit after the instances "
            "before it",
            index, name));
      }
      layout.Add(*profile, *start);
      MigDeviceInfo mig;
      mig.uuid = RandomUuid(random, "MIG");
      mig.profile = profile->name;
      // The full-GPU profile is instance 0, as NVML numbers it.
      mig.gpu_instance_id = profile->memory_slices == kMigMemorySlices ? 0 : next_instance_id++;
      mig.memory_mib = profile->memory_mib;
      mig.placement_start = *start;
      gpu.mig_devices.push_back(std::move(mig));
    }
  }
  return std::unique_ptr<SimulatedProbe>(
      new SimulatedProbe(clock, info, std::move(options), std::move(inventory), *params, random));
}

SimulatedProbe::SimulatedProbe(const Clock& clock, GpuModelInfo model, Options options,
                               ProbeInventory inventory,
                               const internal::SimulatedModelParams& params, Random uuid_random)
    : clock_(clock),
      model_(std::move(model)),
      options_(std::move(options)),
      params_(params),
      inventory_(std::move(inventory)),
      gpus_(inventory_.gpus.size()),
      uuid_random_(uuid_random),
      diagnostic_random_(options_.seed ^ 0xd1a6'0a57'1c5e'ed00ULL) {}

SimulatedProbe::~SimulatedProbe() = default;

Result<ProbeInventory> SimulatedProbe::Inventory() {
  std::lock_guard<std::mutex> lock(mu_);
  return inventory_;
}

Status SimulatedProbe::CheckIndex(int gpu_index) const {
  if (gpu_index < 0 || gpu_index >= static_cast<int>(gpus_.size())) {
    return InvalidArgumentError(
        fmt::format("simulated probe: gpu index {} outside [0, {})", gpu_index, gpus_.size()));
  }
  return Status();
}

Status SimulatedProbe::SetLoad(int gpu_index, GpuLoad load) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  if (load.utilization_percent < 0 || load.utilization_percent > 100) {
    return InvalidArgumentError(
        fmt::format("simulated probe: GPU {}: utilization_percent {} outside [0, 100]", gpu_index,
                    load.utilization_percent));
  }
  // The framebuffer size never changes, so it is read before taking the lock.
  const int64_t capacity = model_.memory_mib - kReservedMiB - kIdleUsedMiB;
  if (load.memory_used_mib < 0 || load.memory_used_mib > capacity) {
    return InvalidArgumentError(
        fmt::format("simulated probe: GPU {}: memory_used_mib {} outside [0, {}]", gpu_index,
                    load.memory_used_mib, capacity));
  }
  std::lock_guard<std::mutex> lock(mu_);
  gpus_[static_cast<size_t>(gpu_index)].load = load;
  return Status();
}

Status SimulatedProbe::InjectXid(int gpu_index, int code) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  if (code < 1 || code > 999) {
    return InvalidArgumentError(
        fmt::format("simulated probe: GPU {}: XID {} outside [1, 999]", gpu_index, code));
  }
  std::lock_guard<std::mutex> lock(mu_);
  gpus_[static_cast<size_t>(gpu_index)].pending_xids.push_back(XidEvent{code, std::nullopt});
  return Status();
}

Status SimulatedProbe::InjectDoubleBitEcc(int gpu_index) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  std::lock_guard<std::mutex> lock(mu_);
  SimGpu& gpu = gpus_[static_cast<size_t>(gpu_index)];
  ++gpu.ecc_dbe_volatile;
  ++gpu.uncorrectable_remapped_rows;
  gpu.remap_pending = true;
  gpu.pending_xids.push_back(XidEvent{48, std::nullopt});
  gpu.pending_xids.push_back(XidEvent{63, std::nullopt});
  return Status();
}

Status SimulatedProbe::InjectRowRemapFailure(int gpu_index) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  std::lock_guard<std::mutex> lock(mu_);
  SimGpu& gpu = gpus_[static_cast<size_t>(gpu_index)];
  gpu.remap_failure = true;
  gpu.pending_xids.push_back(XidEvent{64, std::nullopt});
  return Status();
}

Status SimulatedProbe::SetLatentFault(int gpu_index, bool faulty) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  std::lock_guard<std::mutex> lock(mu_);
  gpus_[static_cast<size_t>(gpu_index)].latent_fault = faulty;
  return Status();
}

std::vector<DiagnosticCheck> SimulatedProbe::Exercise(const GpuStaticInfo& info) {
  if (Status valid = CheckIndex(info.index); !valid.ok()) {
    return {{"simulated.exercise", DiagnosticVerdict::kUnavailable, valid.message()}};
  }
  std::lock_guard<std::mutex> lock(mu_);
  const SimGpu& gpu = gpus_[static_cast<size_t>(info.index)];
  const bool faulty = gpu.latent_fault || gpu.remap_failure || gpu.ecc_dbe_volatile > 0 || gpu.lost;
  const double fails =
      faulty ? options_.diagnostic_sensitivity : options_.diagnostic_false_positive_rate;
  if (diagnostic_random_.UniformDouble() < fails) {
    return {{"simulated.exercise", DiagnosticVerdict::kFailed,
             "memory pattern and compute check found a fault"}};
  }
  return {{"simulated.exercise", DiagnosticVerdict::kPassed,
           "memory pattern and compute check found no fault"}};
}

Status SimulatedProbe::InjectThermalExcursion(int gpu_index, int64_t temperature_c) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  if (temperature_c < 0 || temperature_c > 150) {
    return InvalidArgumentError(fmt::format(
        "simulated probe: GPU {}: temperature {} C outside [0, 150]", gpu_index, temperature_c));
  }
  std::lock_guard<std::mutex> lock(mu_);
  gpus_[static_cast<size_t>(gpu_index)].thermal_excursion_c = temperature_c;
  return Status();
}

Status SimulatedProbe::InjectPowerBrake(int gpu_index) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  std::lock_guard<std::mutex> lock(mu_);
  gpus_[static_cast<size_t>(gpu_index)].power_brake = true;
  return Status();
}

Status SimulatedProbe::InjectGpuLost(int gpu_index) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  std::lock_guard<std::mutex> lock(mu_);
  SimGpu& gpu = gpus_[static_cast<size_t>(gpu_index)];
  if (!gpu.lost) {
    gpu.lost = true;
    gpu.pending_xids.push_back(XidEvent{79, std::nullopt});
  }
  return Status();
}

Status SimulatedProbe::ResetGpu(int gpu_index) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  std::lock_guard<std::mutex> lock(mu_);
  SimGpu& gpu = gpus_[static_cast<size_t>(gpu_index)];
  gpu.pending_xids.clear();
  gpu.ecc_dbe_volatile = 0;
  gpu.remap_pending = false;
  gpu.thermal_excursion_c.reset();
  gpu.power_brake = false;
  gpu.lost = false;
  return Status();
}

Status SimulatedProbe::SetMigDeviceInUse(int gpu_index, int gpu_instance_id, bool in_use) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  std::lock_guard<std::mutex> lock(mu_);
  const GpuStaticInfo& info = inventory_.gpus[static_cast<size_t>(gpu_index)];
  const bool known = std::any_of(
      info.mig_devices.begin(), info.mig_devices.end(),
      [&](const MigDeviceInfo& device) { return device.gpu_instance_id == gpu_instance_id; });
  if (!known) {
    return NotFoundError(fmt::format("simulated probe: GPU {}: no MIG device with instance id {}",
                                     gpu_index, gpu_instance_id));
  }
  std::set<int>& held = gpus_[static_cast<size_t>(gpu_index)].mig_in_use;
  if (in_use) {
    held.insert(gpu_instance_id);
  } else {
    held.erase(gpu_instance_id);
  }
  return Status();
}

Result<std::vector<MigDeviceInfo>> SimulatedProbe::ApplyMigLayoutChange(
    int gpu_index, const MigLayoutChange& change) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  std::lock_guard<std::mutex> lock(mu_);
  GpuStaticInfo& info = inventory_.gpus[static_cast<size_t>(gpu_index)];
  const std::set<int>& held = gpus_[static_cast<size_t>(gpu_index)].mig_in_use;
  if (!info.mig_enabled) {
    return FailedPreconditionError(
        fmt::format("simulated probe: GPU {}: MIG is disabled", gpu_index));
  }
  std::vector<MigDeviceInfo> kept = info.mig_devices;
  for (size_t i = 0; i < change.destroy.size(); ++i) {
    const MigInstance& target = change.destroy[i];
    auto found = std::find_if(kept.begin(), kept.end(), [&](const MigDeviceInfo& device) {
      return device.profile == target.profile && device.placement_start == target.start;
    });
    if (found == kept.end()) {
      return NotFoundError(
          fmt::format("simulated probe: GPU {}: destroy[{}]: no {} instance starts at slot {}",
                      gpu_index, i, target.profile, target.start));
    }
    if (held.count(found->gpu_instance_id) > 0) {
      return FailedPreconditionError(fmt::format(
          "simulated probe: GPU {}: destroy[{}]: the {} instance at slot {} (instance id {}) is "
          "in use",
          gpu_index, i, target.profile, target.start, found->gpu_instance_id));
    }
    kept.erase(found);
  }
  std::vector<MigInstance> layout;
  for (const MigDeviceInfo& device : kept) {
    layout.push_back({device.profile, device.placement_start.value_or(-1), false});
  }
  for (size_t i = 0; i < change.create.size(); ++i) {
    const MigInstance& instance = change.create[i];
    const MigProfile* profile = model_.FindMigProfile(instance.profile);
    if (profile == nullptr) {
      return InvalidArgumentError(
          fmt::format("simulated probe: GPU {}: create[{}].profile: unknown profile \"{}\" for {} "
                      "(valid: {})",
                      gpu_index, i, instance.profile, model_.name, model_.MigProfileNames()));
    }
    if (std::find(profile->starts.begin(), profile->starts.end(), instance.start) ==
        profile->starts.end()) {
      return InvalidArgumentError(fmt::format(
          "simulated probe: GPU {}: create[{}].start: {} is not a valid start slot for {}",
          gpu_index, i, instance.start, instance.profile));
    }
    layout.push_back({instance.profile, instance.start, false});
  }
  Result<MigLayout> valid = MigLayout::FromInstances(model_, layout);
  if (!valid.ok()) {
    return InvalidArgumentError(
        fmt::format("simulated probe: GPU {}: the new layout is invalid: {}", gpu_index,
                    valid.status().message()));
  }
  std::set<int> ids;
  for (const MigDeviceInfo& device : kept) {
    ids.insert(device.gpu_instance_id);
  }
  for (const MigInstance& instance : change.create) {
    const MigProfile& profile = *model_.FindMigProfile(instance.profile);
    MigDeviceInfo device;
    device.uuid = RandomUuid(uuid_random_, "MIG");
    device.profile = profile.name;
    // The full-GPU profile is instance 0, as NVML numbers it; others take the lowest free id.
    int id = profile.memory_slices == kMigMemorySlices ? 0 : 1;
    while (id != 0 && ids.count(id) > 0) {
      ++id;
    }
    ids.insert(id);
    device.gpu_instance_id = id;
    device.memory_mib = profile.memory_mib;
    device.placement_start = instance.start;
    kept.push_back(std::move(device));
  }
  info.mig_devices = kept;
  return kept;
}

Result<std::vector<MigDeviceInfo>> SimulatedProbe::ApplyMigLayout(
    int gpu_index, const std::vector<MigInstance>& wanted) {
  GPUFLEET_RETURN_IF_ERROR(CheckIndex(gpu_index));
  MigLayoutChange change;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const GpuStaticInfo& info = inventory_.gpus[static_cast<size_t>(gpu_index)];
    change.create = wanted;
    for (const MigDeviceInfo& device : info.mig_devices) {
      const auto same = std::find_if(
          change.create.begin(), change.create.end(), [&](const MigInstance& instance) {
            return instance.profile == device.profile && device.placement_start == instance.start;
          });
      if (same != change.create.end()) {
        change.create.erase(same);
      } else {
        change.destroy.push_back({device.profile, device.placement_start.value_or(-1)});
      }
    }
    if (info.mig_enabled && change.destroy.empty() && change.create.empty()) {
      return info.mig_devices;
    }
  }
  // All or nothing, under the lock again: a change made in between is checked there.
  return ApplyMigLayoutChange(gpu_index, change);
}

GpuSample SimulatedProbe::SampleGpu(size_t index, int64_t now_ms) {
  SimGpu& gpu = gpus_[index];
  const GpuStaticInfo& info = inventory_.gpus[index];
  GpuSample sample;
  sample.index = info.index;
  sample.xid_events_supported = true;
  sample.xids = std::move(gpu.pending_xids);
  gpu.pending_xids.clear();
  if (gpu.lost) {
    sample.lost = true;
    return sample;
  }
  const int64_t second = now_ms / 1000;
  int64_t utilization = PatternUtilization(gpu.load, now_ms);
  if (utilization > 0) {
    utilization =
        std::clamp<int64_t>(utilization + Noise(options_.seed, info.index, second, 2), 1, 100);
  }
  int64_t sm_clock = utilization > 0 ? params_.max_sm_clock_mhz : params_.idle_sm_clock_mhz;
  int64_t power = params_.idle_milliwatts +
                  (params_.max_milliwatts - params_.idle_milliwatts) * utilization / 100 +
                  Noise(options_.seed, info.index + 1000, second, params_.idle_milliwatts / 50);
  int64_t temperature =
      kAmbientC + 45 * utilization / 100 + Noise(options_.seed, info.index + 2000, second, 1);
  uint64_t reasons = utilization == 0 ? nvml::kClocksEventGpuIdle : 0;
  if (power >= params_.max_milliwatts * 95 / 100) {
    reasons |= nvml::kClocksEventSwPowerCap;
  }
  if (gpu.thermal_excursion_c.has_value()) {
    temperature = *gpu.thermal_excursion_c;
    if (temperature >= params_.slowdown_temperature_c) {
      reasons |= nvml::kClocksEventSwThermalSlowdown | nvml::kClocksEventHwThermalSlowdown;
      sm_clock = sm_clock * 3 / 4;
    }
  }
  if (gpu.power_brake) {
    reasons |= nvml::kClocksEventHwSlowdown | nvml::kClocksEventHwPowerBrakeSlowdown;
    sm_clock = std::min(sm_clock, params_.max_sm_clock_mhz * 3 / 10);
    power = std::min(power, params_.idle_milliwatts +
                                (params_.max_milliwatts - params_.idle_milliwatts) * 3 / 10);
  }

  if (!info.mig_enabled) {
    sample.gpu_util_percent = utilization;
    sample.memory_copy_util_percent = utilization * 2 / 5;
    if (params_.gpm) {
      sample.sm_active = static_cast<double>(utilization) * 0.009;
      sample.dram_active = static_cast<double>(utilization) * 0.0045;
      sample.tensor_active = static_cast<double>(utilization) * 0.006;
    }
  }
  const int64_t used = kIdleUsedMiB + gpu.load.memory_used_mib;
  sample.fb_used_mib = used;
  sample.fb_reserved_mib = kReservedMiB;
  sample.fb_free_mib = info.memory_mib - kReservedMiB - used;
  sample.temperature_c = temperature;
  sample.power_milliwatts = std::max<int64_t>(power, 0);
  sample.sm_clock_mhz = sm_clock;
  sample.memory_clock_mhz = params_.memory_clock_mhz;
  sample.ecc_dbe_volatile_total = gpu.ecc_dbe_volatile;
  sample.correctable_remapped_rows = 0;
  sample.uncorrectable_remapped_rows = gpu.uncorrectable_remapped_rows;
  sample.row_remap_pending = gpu.remap_pending;
  sample.row_remap_failure = gpu.remap_failure;
  sample.pcie_replay_count = 0;
  sample.clocks_event_reasons = reasons;
  for (const MigDeviceInfo& mig : info.mig_devices) {
    MigDeviceSample mig_sample;
    mig_sample.gpu_instance_id = mig.gpu_instance_id;
    mig_sample.fb_used_mib = kIdleUsedMiB;
    mig_sample.fb_free_mib = mig.memory_mib - kIdleUsedMiB;
    sample.mig_devices.push_back(mig_sample);
  }
  return sample;
}

Result<std::vector<GpuSample>> SimulatedProbe::Sample() {
  const int64_t now_ms = clock_.Now().nanos / 1000000;
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<GpuSample> samples;
  samples.reserve(gpus_.size());
  for (size_t i = 0; i < gpus_.size(); ++i) {
    samples.push_back(SampleGpu(i, now_ms));
  }
  return samples;
}

}  // namespace gpufleet::agent
