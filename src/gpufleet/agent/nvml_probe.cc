// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/nvml_probe.h"

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <utility>

#include <fmt/core.h>

#include "gpufleet/agent/nvml_api.h"

namespace gpufleet::agent {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
// Events drained per Sample(), so that an event storm cannot hold the sampler forever.
constexpr int kMaxEventsPerSample = 4096;

int64_t ToMiB(unsigned long long bytes) {  // NOLINT(google-runtime-int)
  return static_cast<int64_t>(bytes / kMiB);
}

// The NUL-terminated prefix of a fixed-size buffer NVML filled.
std::string FromBuffer(const char* buffer, size_t size) {
  return std::string(buffer, strnlen(buffer, size));
}

// "MIG 3g.40gb" at the end of a MIG device's name ("NVIDIA H100 80GB HBM3 MIG 3g.40gb").
std::string MigProfileFromName(const std::string& name) {
  const size_t at = name.rfind("MIG ");
  return at == std::string::npos ? std::string() : name.substr(at + 4);
}

}  // namespace

// Resolved NVML functions; nullptr for an optional one the library lacks.
struct NvmlProbe::Api {
  nvml::InitFn init = nullptr;
  nvml::ShutdownFn shutdown = nullptr;
  nvml::ErrorStringFn error_string = nullptr;
  nvml::SystemGetStringFn system_get_driver_version = nullptr;
  nvml::SystemGetCudaDriverVersionFn system_get_cuda_driver_version = nullptr;
  nvml::SystemGetStringFn system_get_nvml_version = nullptr;
  nvml::DeviceGetStringFn device_get_serial = nullptr;
  nvml::DeviceGetStringFn device_get_vbios_version = nullptr;
  nvml::DeviceGetCountFn device_get_count = nullptr;
  nvml::DeviceGetHandleByIndexFn device_get_handle_by_index = nullptr;
  nvml::DeviceGetStringFn device_get_name = nullptr;
  nvml::DeviceGetStringFn device_get_uuid = nullptr;
  nvml::DeviceGetPciInfoFn device_get_pci_info = nullptr;
  nvml::DeviceGetMemoryInfoV2Fn device_get_memory_info_v2 = nullptr;
  nvml::DeviceGetMemoryInfoFn device_get_memory_info = nullptr;
  nvml::DeviceGetUtilizationRatesFn device_get_utilization_rates = nullptr;
  nvml::DeviceGetTemperatureVFn device_get_temperature_v = nullptr;
  nvml::DeviceGetTemperatureFn device_get_temperature = nullptr;
  nvml::DeviceGetTemperatureThresholdFn device_get_temperature_threshold = nullptr;
  nvml::DeviceGetUintFn device_get_power_usage = nullptr;
  nvml::DeviceGetClockInfoFn device_get_clock_info = nullptr;
  nvml::DeviceGetTotalEccErrorsFn device_get_total_ecc_errors = nullptr;
  nvml::DeviceGetRemappedRowsFn device_get_remapped_rows = nullptr;
  nvml::DeviceGetUintFn device_get_pcie_replay_counter = nullptr;
  nvml::DeviceGetUllFn device_get_total_energy_consumption = nullptr;
  nvml::DeviceGetCodecUtilizationFn device_get_encoder_utilization = nullptr;
  nvml::DeviceGetCodecUtilizationFn device_get_decoder_utilization = nullptr;
  nvml::DeviceGetFieldValuesFn device_get_field_values = nullptr;
  nvml::DeviceGetUllFn device_get_clocks_event_reasons = nullptr;
  const char* clocks_event_reasons_name = "";
  nvml::DeviceGetMigModeFn device_get_mig_mode = nullptr;
  nvml::DeviceGetUintFn device_get_max_mig_device_count = nullptr;
  nvml::DeviceGetMigDeviceHandleByIndexFn device_get_mig_device_handle_by_index = nullptr;
  nvml::DeviceGetUintFn device_get_gpu_instance_id = nullptr;
  nvml::DeviceGetUintFn device_get_compute_instance_id = nullptr;
  nvml::DeviceGetUintFn device_get_minor_number = nullptr;
  nvml::DeviceGetCpuAffinityFn device_get_cpu_affinity = nullptr;
  nvml::DeviceGetNvLinkStateFn device_get_nvlink_state = nullptr;
  nvml::DeviceGetNvLinkRemotePciInfoFn device_get_nvlink_remote_pci_info = nullptr;
  nvml::EventSetCreateFn event_set_create = nullptr;
  nvml::EventSetFreeFn event_set_free = nullptr;
  nvml::DeviceGetUllFn device_get_supported_event_types = nullptr;
  nvml::DeviceRegisterEventsFn device_register_events = nullptr;
  nvml::EventSetWaitFn event_set_wait = nullptr;
  nvml::GpmQueryDeviceSupportFn gpm_query_device_support = nullptr;
  nvml::GpmSampleAllocFn gpm_sample_alloc = nullptr;
  nvml::GpmSampleFreeFn gpm_sample_free = nullptr;
  nvml::GpmSampleGetFn gpm_sample_get = nullptr;
  nvml::GpmMetricsGetFn gpm_metrics_get = nullptr;

  std::vector<std::string> missing_optional;

  bool events_available() const {
    return event_set_create != nullptr && event_set_free != nullptr &&
           device_get_supported_event_types != nullptr && device_register_events != nullptr &&
           event_set_wait != nullptr;
  }
  bool gpm_available() const {
    return gpm_query_device_support != nullptr && gpm_sample_alloc != nullptr &&
           gpm_sample_free != nullptr && gpm_sample_get != nullptr && gpm_metrics_get != nullptr;
  }
};

struct NvmlProbe::DeviceState {
  int index = 0;
  nvml::Device handle;
  bool lost = false;
  bool xid_events = false;
  std::vector<XidEvent> pending_xids;
  // GPM needs two samples: `previous` is the last one taken, valid when `has_previous`.
  bool gpm_supported = false;
  bool has_previous = false;
  nvml::GpmSample previous;
  nvml::GpmSample current;
  // The last identity read, kept for a GPU that is lost later.
  std::optional<GpuStaticInfo> info;
  std::vector<std::pair<nvml::Device, int>> mig_handles;  // (handle, GPU instance id)
};

namespace {

// Looks `name` up; a missing required function is an error naming it, a missing optional one is
// recorded in `missing`.
template <typename Fn>
Status Resolve(void* library, const std::string& path, const char* name, bool required, Fn& out,
               std::vector<std::string>& missing) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    if (required) {
      return FailedPreconditionError(fmt::format(
          "NVML library \"{}\" lacks the required function {} (driver too old?)", path, name));
    }
    missing.emplace_back(name);
    return Status();
  }
  out = reinterpret_cast<Fn>(symbol);
  return Status();
}

}  // namespace

Result<std::unique_ptr<NvmlProbe>> NvmlProbe::Open(Options options) {
  dlerror();
  void* library = dlopen(options.library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    return UnavailableError(fmt::format("cannot load NVML from \"{}\": {} (no NVIDIA driver?)",
                                        options.library_path, error ? error : "unknown error"));
  }
  auto api = std::make_unique<Api>();
  const std::string& path = options.library_path;
  std::vector<std::string>& missing = api->missing_optional;
  const auto required = [&](const char* name, auto& out) {
    return Resolve(library, path, name, true, out, missing);
  };
  const auto optional = [&](const char* name, auto& out) {
    return Resolve(library, path, name, false, out, missing);
  };
  Status status;
  for (Status step : {
           required("nvmlInit_v2", api->init),
           required("nvmlShutdown", api->shutdown),
           required("nvmlSystemGetDriverVersion", api->system_get_driver_version),
           required("nvmlDeviceGetCount_v2", api->device_get_count),
           required("nvmlDeviceGetHandleByIndex_v2", api->device_get_handle_by_index),
           required("nvmlDeviceGetName", api->device_get_name),
           required("nvmlDeviceGetUUID", api->device_get_uuid),
           required("nvmlDeviceGetPciInfo_v3", api->device_get_pci_info),
           optional("nvmlErrorString", api->error_string),
           optional("nvmlSystemGetCudaDriverVersion_v2", api->system_get_cuda_driver_version),
           optional("nvmlSystemGetNVMLVersion", api->system_get_nvml_version),
           optional("nvmlDeviceGetSerial", api->device_get_serial),
           optional("nvmlDeviceGetVbiosVersion", api->device_get_vbios_version),
           optional("nvmlDeviceGetMemoryInfo_v2", api->device_get_memory_info_v2),
           optional("nvmlDeviceGetMemoryInfo", api->device_get_memory_info),
           optional("nvmlDeviceGetUtilizationRates", api->device_get_utilization_rates),
           optional("nvmlDeviceGetTemperatureV", api->device_get_temperature_v),
           optional("nvmlDeviceGetTemperature", api->device_get_temperature),
           optional("nvmlDeviceGetTemperatureThreshold", api->device_get_temperature_threshold),
           optional("nvmlDeviceGetPowerUsage", api->device_get_power_usage),
           optional("nvmlDeviceGetClockInfo", api->device_get_clock_info),
           optional("nvmlDeviceGetTotalEccErrors", api->device_get_total_ecc_errors),
           optional("nvmlDeviceGetRemappedRows", api->device_get_remapped_rows),
           optional("nvmlDeviceGetPcieReplayCounter", api->device_get_pcie_replay_counter),
           optional("nvmlDeviceGetTotalEnergyConsumption",
                    api->device_get_total_energy_consumption),
           optional("nvmlDeviceGetEncoderUtilization", api->device_get_encoder_utilization),
           optional("nvmlDeviceGetDecoderUtilization", api->device_get_decoder_utilization),
           optional("nvmlDeviceGetFieldValues", api->device_get_field_values),
           optional("nvmlDeviceGetMigMode", api->device_get_mig_mode),
           optional("nvmlDeviceGetMaxMigDeviceCount", api->device_get_max_mig_device_count),
           optional("nvmlDeviceGetMigDeviceHandleByIndex",
                    api->device_get_mig_device_handle_by_index),
           optional("nvmlDeviceGetGpuInstanceId", api->device_get_gpu_instance_id),
           optional("nvmlDeviceGetComputeInstanceId", api->device_get_compute_instance_id),
           optional("nvmlDeviceGetMinorNumber", api->device_get_minor_number),
           optional("nvmlDeviceGetCpuAffinity", api->device_get_cpu_affinity),
           optional("nvmlDeviceGetNvLinkState", api->device_get_nvlink_state),
           optional("nvmlDeviceGetNvLinkRemotePciInfo_v2", api->device_get_nvlink_remote_pci_info),
           optional("nvmlEventSetCreate", api->event_set_create),
           optional("nvmlEventSetFree", api->event_set_free),
           optional("nvmlDeviceGetSupportedEventTypes", api->device_get_supported_event_types),
           optional("nvmlDeviceRegisterEvents", api->device_register_events),
           optional("nvmlEventSetWait_v2", api->event_set_wait),
           optional("nvmlGpmQueryDeviceSupport", api->gpm_query_device_support),
           optional("nvmlGpmSampleAlloc", api->gpm_sample_alloc),
           optional("nvmlGpmSampleFree", api->gpm_sample_free),
           optional("nvmlGpmSampleGet", api->gpm_sample_get),
           optional("nvmlGpmMetricsGet", api->gpm_metrics_get),
       }) {
    if (!step.ok() && status.ok()) {
      status = step;
    }
  }
  if (status.ok()) {
    // The clock-event call was renamed in API 12; older drivers only have the "throttle" name.
    api->clocks_event_reasons_name = "nvmlDeviceGetCurrentClocksEventReasons";
    void* symbol = dlsym(library, api->clocks_event_reasons_name);
    if (symbol == nullptr) {
      api->clocks_event_reasons_name = "nvmlDeviceGetCurrentClocksThrottleReasons";
      symbol = dlsym(library, api->clocks_event_reasons_name);
    }
    if (symbol == nullptr) {
      missing.emplace_back("nvmlDeviceGetCurrentClocksEventReasons");
    } else {
      api->device_get_clocks_event_reasons = reinterpret_cast<nvml::DeviceGetUllFn>(symbol);
    }
  }
  if (!status.ok()) {
    dlclose(library);
    return status;
  }
  std::unique_ptr<NvmlProbe> probe(new NvmlProbe(std::move(options), library, std::move(api)));
  GPUFLEET_RETURN_IF_ERROR(probe->Start());
  return probe;
}

NvmlProbe::NvmlProbe(Options options, void* library, std::unique_ptr<Api> api)
    : options_(std::move(options)),
      default_catalog_(options_.catalog == nullptr ? GpuCatalog::Default() : GpuCatalog()),
      library_(library),
      api_(std::move(api)) {}

NvmlProbe::~NvmlProbe() {
  if (initialized_) {
    if (api_->gpm_available()) {
      for (const auto& device : devices_) {
        if (device->gpm_supported) {
          api_->gpm_sample_free(device->previous);
          api_->gpm_sample_free(device->current);
        }
      }
    }
    if (events_enabled_) {
      api_->event_set_free(nvml::EventSet{event_set_});
    }
    api_->shutdown();
  }
  dlclose(library_);
}

const std::vector<std::string>& NvmlProbe::missing_optional_functions() const {
  return api_->missing_optional;
}

Status NvmlProbe::Start() {
  const nvml::Return init = api_->init();
  if (init != nvml::Return::kSuccess) {
    const char* text = api_->error_string != nullptr ? api_->error_string(init) : nullptr;
    return UnavailableError(
        fmt::format("nvmlInit_v2 failed: {}{} (library \"{}\")", nvml::ReturnName(init),
                    text != nullptr ? fmt::format(" ({})", text) : "", options_.library_path));
  }
  initialized_ = true;
  unsigned int count = 0;
  const nvml::Return count_rc = api_->device_get_count(&count);
  if (count_rc != nvml::Return::kSuccess) {
    return UnavailableError(
        fmt::format("nvmlDeviceGetCount_v2 failed: {}", nvml::ReturnName(count_rc)));
  }
  for (unsigned int i = 0; i < count; ++i) {
    auto device = std::make_unique<DeviceState>();
    device->index = static_cast<int>(i);
    const nvml::Return rc = api_->device_get_handle_by_index(i, &device->handle);
    if (rc == nvml::Return::kGpuIsLost) {
      device->lost = true;
    } else if (rc != nvml::Return::kSuccess) {
      return UnavailableError(
          fmt::format("nvmlDeviceGetHandleByIndex_v2({}) failed: {}", i, nvml::ReturnName(rc)));
    }
    devices_.push_back(std::move(device));
  }

  if (api_->events_available()) {
    nvml::EventSet set;
    if (api_->event_set_create(&set) == nvml::Return::kSuccess) {
      event_set_ = set.handle;
      events_enabled_ = true;
      for (const auto& device : devices_) {
        if (device->lost) {
          continue;
        }
        unsigned long long supported = 0;  // NOLINT(google-runtime-int)
        if (api_->device_get_supported_event_types(device->handle, &supported) !=
            nvml::Return::kSuccess) {
          continue;
        }
        const unsigned long long wanted =  // NOLINT(google-runtime-int)
            supported & (nvml::kEventXidCriticalError | nvml::kEventGpuUnavailable);
        if ((wanted & nvml::kEventXidCriticalError) != 0 &&
            api_->device_register_events(device->handle, wanted, set) == nvml::Return::kSuccess) {
          device->xid_events = true;
        }
      }
    }
  }

  if (api_->gpm_available()) {
    for (const auto& device : devices_) {
      if (device->lost) {
        continue;
      }
      nvml::GpmSupport support{nvml::kGpmSupportVersion, 0};
      if (api_->gpm_query_device_support(device->handle, &support) != nvml::Return::kSuccess ||
          support.is_supported_device == 0) {
        continue;
      }
      if (api_->gpm_sample_alloc(&device->previous) != nvml::Return::kSuccess) {
        continue;
      }
      if (api_->gpm_sample_alloc(&device->current) != nvml::Return::kSuccess) {
        api_->gpm_sample_free(device->previous);
        continue;
      }
      device->gpm_supported = true;
    }
  }
  return Status();
}

// What gres.conf needs; each part is left out when the driver does not answer it, since the
// agent's own readings do not depend on them.
void NvmlProbe::ReadSlurmInfo(const DeviceState& device, GpuStaticInfo& info) {
  unsigned int minor = 0;
  if (api_->device_get_minor_number != nullptr &&
      api_->device_get_minor_number(device.handle, &minor) == nvml::Return::kSuccess) {
    info.minor_number = static_cast<int>(minor);
  }
  if (api_->device_get_cpu_affinity != nullptr) {
    // 1,024 CPUs in 64-bit words (NVML fills `unsigned long` words, lowest CPU in bit 0).
    constexpr unsigned int kWords = 16;
    unsigned long mask[kWords] = {};  // NOLINT(google-runtime-int): NVML's type
    if (api_->device_get_cpu_affinity(device.handle, kWords, mask) == nvml::Return::kSuccess) {
      constexpr int kBits = 8 * sizeof(mask[0]);
      for (unsigned int word = 0; word < kWords; ++word) {
        for (int bit = 0; bit < kBits; ++bit) {
          if ((mask[word] >> bit) & 1UL) {
            info.cpu_affinity.push_back(static_cast<int>(word) * kBits + bit);
          }
        }
      }
    }
  }
  if (api_->device_get_nvlink_state != nullptr &&
      api_->device_get_nvlink_remote_pci_info != nullptr) {
    for (unsigned int link = 0; link < nvml::kNvlinkMaxLinks; ++link) {
      int state = 0;
      nvml::PciInfo remote{};
      // Links past the GPU's last answer INVALID_ARGUMENT or NOT_SUPPORTED: skipped.
      if (api_->device_get_nvlink_state(device.handle, link, &state) != nvml::Return::kSuccess ||
          state != nvml::kFeatureEnabled ||
          api_->device_get_nvlink_remote_pci_info(device.handle, link, &remote) !=
              nvml::Return::kSuccess) {
        continue;
      }
      info.nvlink_remote_bus_ids.push_back(FromBuffer(remote.bus_id, sizeof(remote.bus_id)));
    }
  }
}

Result<GpuStaticInfo> NvmlProbe::ReadStaticInfo(DeviceState& device) {
  GpuStaticInfo info;
  info.index = device.index;
  const auto fail = [&](const char* function, nvml::Return rc) -> Status {
    if (rc == nvml::Return::kGpuIsLost) {
      device.lost = true;
    }
    return UnavailableError(
        fmt::format("GPU {}: {} failed: {}", device.index, function, nvml::ReturnName(rc)));
  };
  char buffer[nvml::kDeviceNameBufferSize] = {};
  nvml::Return rc = api_->device_get_name(device.handle, buffer, sizeof(buffer));
  if (rc != nvml::Return::kSuccess) {
    return fail("nvmlDeviceGetName", rc);
  }
  info.nvml_name = FromBuffer(buffer, sizeof(buffer));
  char uuid[nvml::kDeviceUuidBufferSize] = {};
  rc = api_->device_get_uuid(device.handle, uuid, sizeof(uuid));
  if (rc != nvml::Return::kSuccess) {
    return fail("nvmlDeviceGetUUID", rc);
  }
  info.uuid = FromBuffer(uuid, sizeof(uuid));
  nvml::PciInfo pci{};
  rc = api_->device_get_pci_info(device.handle, &pci);
  if (rc != nvml::Return::kSuccess) {
    return fail("nvmlDeviceGetPciInfo_v3", rc);
  }
  info.pci_bus_id = FromBuffer(pci.bus_id, sizeof(pci.bus_id));
  // Provenance only (docs/provenance.md): a board without a serial (GeForce) or a driver that
  // does not say leaves them empty.
  if (api_->device_get_serial != nullptr) {
    char serial[nvml::kDeviceSerialBufferSize] = {};
    if (api_->device_get_serial(device.handle, serial, sizeof(serial)) == nvml::Return::kSuccess) {
      info.serial = FromBuffer(serial, sizeof(serial));
    }
  }
  if (api_->device_get_vbios_version != nullptr) {
    char vbios[nvml::kDeviceVbiosVersionBufferSize] = {};
    if (api_->device_get_vbios_version(device.handle, vbios, sizeof(vbios)) ==
        nvml::Return::kSuccess) {
      info.vbios_version = FromBuffer(vbios, sizeof(vbios));
    }
  }
  const GpuCatalog& catalog = options_.catalog ? *options_.catalog : default_catalog_;
  info.model = catalog.Canonical(info.nvml_name);

  if (api_->device_get_memory_info_v2 != nullptr) {
    nvml::MemoryV2 memory{};
    memory.version = nvml::kMemoryV2Version;
    if (api_->device_get_memory_info_v2(device.handle, &memory) == nvml::Return::kSuccess) {
      info.memory_mib = ToMiB(memory.total);
    }
  } else if (api_->device_get_memory_info != nullptr) {
    nvml::MemoryV1 memory{};
    if (api_->device_get_memory_info(device.handle, &memory) == nvml::Return::kSuccess) {
      info.memory_mib = ToMiB(memory.total);
    }
  }
  if (api_->device_get_temperature_threshold != nullptr) {
    unsigned int threshold = 0;
    if (api_->device_get_temperature_threshold(device.handle, nvml::kTemperatureThresholdSlowdown,
                                               &threshold) == nvml::Return::kSuccess) {
      info.slowdown_temperature_c = static_cast<int>(threshold);
    }
  }
  ReadSlurmInfo(device, info);

  device.mig_handles.clear();
  unsigned int current_mode = 0;
  unsigned int pending_mode = 0;
  if (api_->device_get_mig_mode != nullptr &&
      api_->device_get_mig_mode(device.handle, &current_mode, &pending_mode) ==
          nvml::Return::kSuccess) {
    info.mig_enabled = current_mode == nvml::kMigEnabled;
  }
  unsigned int max_mig = 0;
  if (info.mig_enabled && api_->device_get_max_mig_device_count != nullptr &&
      api_->device_get_mig_device_handle_by_index != nullptr &&
      api_->device_get_max_mig_device_count(device.handle, &max_mig) == nvml::Return::kSuccess) {
    for (unsigned int m = 0; m < max_mig; ++m) {
      nvml::Device mig;
      // Slots without an instance answer NOT_FOUND.
      if (api_->device_get_mig_device_handle_by_index(device.handle, m, &mig) !=
          nvml::Return::kSuccess) {
        continue;
      }
      MigDeviceInfo mig_info;
      char mig_uuid[nvml::kDeviceUuidBufferSize] = {};
      if (api_->device_get_uuid(mig, mig_uuid, sizeof(mig_uuid)) == nvml::Return::kSuccess) {
        mig_info.uuid = FromBuffer(mig_uuid, sizeof(mig_uuid));
      }
      char mig_name[nvml::kDeviceNameBufferSize] = {};
      if (api_->device_get_name(mig, mig_name, sizeof(mig_name)) == nvml::Return::kSuccess) {
        mig_info.profile = MigProfileFromName(FromBuffer(mig_name, sizeof(mig_name)));
      }
      unsigned int id = 0;
      if (api_->device_get_gpu_instance_id != nullptr &&
          api_->device_get_gpu_instance_id(mig, &id) == nvml::Return::kSuccess) {
        mig_info.gpu_instance_id = static_cast<int>(id);
      }
      if (api_->device_get_compute_instance_id != nullptr &&
          api_->device_get_compute_instance_id(mig, &id) == nvml::Return::kSuccess) {
        mig_info.compute_instance_id = static_cast<int>(id);
      }
      if (api_->device_get_memory_info_v2 != nullptr) {
        nvml::MemoryV2 memory{};
        memory.version = nvml::kMemoryV2Version;
        if (api_->device_get_memory_info_v2(mig, &memory) == nvml::Return::kSuccess) {
          mig_info.memory_mib = ToMiB(memory.total);
        }
      }
      device.mig_handles.emplace_back(mig, mig_info.gpu_instance_id);
      info.mig_devices.push_back(std::move(mig_info));
    }
  }
  return info;
}

Result<ProbeInventory> NvmlProbe::Inventory() {
  ProbeInventory inventory;
  char version[nvml::kSystemDriverVersionBufferSize] = {};
  const nvml::Return rc = api_->system_get_driver_version(version, sizeof(version));
  if (rc != nvml::Return::kSuccess) {
    return UnavailableError(
        fmt::format("nvmlSystemGetDriverVersion failed: {}", nvml::ReturnName(rc)));
  }
  inventory.driver_version = FromBuffer(version, sizeof(version));
  int cuda = 0;
  if (api_->system_get_cuda_driver_version != nullptr &&
      api_->system_get_cuda_driver_version(&cuda) == nvml::Return::kSuccess && cuda > 0) {
    // 12040 means CUDA 12.4.
    inventory.cuda_version = fmt::format("{}.{}", cuda / 1000, (cuda % 1000) / 10);
  }
  if (api_->system_get_nvml_version != nullptr) {
    char nvml_version[nvml::kSystemNvmlVersionBufferSize] = {};
    if (api_->system_get_nvml_version(nvml_version, sizeof(nvml_version)) ==
        nvml::Return::kSuccess) {
      inventory.nvml_version = FromBuffer(nvml_version, sizeof(nvml_version));
    }
  }
  for (const auto& device : devices_) {
    if (!device->lost) {
      Result<GpuStaticInfo> info = ReadStaticInfo(*device);
      if (info.ok()) {
        device->info = *std::move(info);
      } else if (!device->lost) {
        return info.status();
      }
    }
    if (device->info.has_value()) {
      inventory.gpus.push_back(*device->info);
    } else {
      // Lost before its identity could be read: only the index is known.
      GpuStaticInfo unknown;
      unknown.index = device->index;
      inventory.gpus.push_back(std::move(unknown));
    }
  }
  return inventory;
}

void NvmlProbe::PollEvents(std::vector<GpuSample>& samples) {
  if (!events_enabled_) {
    return;
  }
  const auto find = [&](const nvml::Device& handle) -> DeviceState* {
    for (const auto& device : devices_) {
      if (device->handle.handle == handle.handle) {
        return device.get();
      }
    }
    return nullptr;
  };
  for (int i = 0; i < kMaxEventsPerSample; ++i) {
    nvml::EventData data{};
    const nvml::Return rc = api_->event_set_wait(nvml::EventSet{event_set_}, &data, 0);
    if (rc == nvml::Return::kTimeout) {
      return;
    }
    DeviceState* device = find(data.device);
    if (rc == nvml::Return::kSuccess) {
      if (device == nullptr) {
        continue;
      }
      if ((data.event_type & nvml::kEventXidCriticalError) != 0) {
        XidEvent event;
        event.code = static_cast<int>(std::min<unsigned long long>(  // NOLINT(google-runtime-int)
            data.event_data, INT_MAX));
        if (data.gpu_instance_id != UINT_MAX) {
          event.gpu_instance_id = static_cast<int>(data.gpu_instance_id);
        }
        device->pending_xids.push_back(event);
      }
      if ((data.event_type & nvml::kEventGpuUnavailable) != 0) {
        device->lost = true;
      }
      continue;
    }
    if (rc == nvml::Return::kGpuIsLost && device != nullptr) {
      device->lost = true;
      continue;
    }
    // Anything else (e.g. NVML_ERROR_UNKNOWN) ends this poll; the next sample tries again.
    const std::string error = fmt::format("nvmlEventSetWait_v2: {}", nvml::ReturnName(rc));
    for (GpuSample& sample : samples) {
      sample.read_errors.push_back(error);
    }
    return;
  }
}

Result<std::vector<GpuSample>> NvmlProbe::Sample() {
  std::vector<GpuSample> samples(devices_.size());
  for (size_t i = 0; i < devices_.size(); ++i) {
    samples[i].index = devices_[i]->index;
  }
  PollEvents(samples);
  for (size_t i = 0; i < devices_.size(); ++i) {
    SampleDevice(*devices_[i], samples[i]);
  }
  return samples;
}

void NvmlProbe::SampleDevice(DeviceState& device, GpuSample& sample) {
  sample.xid_events_supported = device.xid_events;
  sample.xids = std::move(device.pending_xids);
  device.pending_xids.clear();
  // True when the read succeeded. Not-supported leaves the value absent silently; a lost GPU is
  // marked; any other error is recorded.
  const auto ok = [&](nvml::Return rc, const char* function) {
    if (rc == nvml::Return::kSuccess) {
      return true;
    }
    if (rc == nvml::Return::kGpuIsLost) {
      device.lost = true;
    } else if (rc != nvml::Return::kNotSupported) {
      sample.read_errors.push_back(fmt::format("{}: {}", function, nvml::ReturnName(rc)));
    }
    return false;
  };
  const auto alive = [&] { return !device.lost; };

  if (alive() && api_->device_get_utilization_rates != nullptr) {
    nvml::Utilization utilization{};
    if (ok(api_->device_get_utilization_rates(device.handle, &utilization),
           "nvmlDeviceGetUtilizationRates")) {
      sample.gpu_util_percent = utilization.gpu;
      sample.memory_copy_util_percent = utilization.memory;
    }
  }
  if (alive() && api_->device_get_memory_info_v2 != nullptr) {
    nvml::MemoryV2 memory{};
    memory.version = nvml::kMemoryV2Version;
    if (ok(api_->device_get_memory_info_v2(device.handle, &memory), "nvmlDeviceGetMemoryInfo_v2")) {
      sample.fb_used_mib = ToMiB(memory.used);
      sample.fb_free_mib = ToMiB(memory.free);
      sample.fb_reserved_mib = ToMiB(memory.reserved);
    }
  } else if (alive() && api_->device_get_memory_info != nullptr) {
    // Drivers before R510: `used` includes the reserved memory.
    nvml::MemoryV1 memory{};
    if (ok(api_->device_get_memory_info(device.handle, &memory), "nvmlDeviceGetMemoryInfo")) {
      sample.fb_used_mib = ToMiB(memory.used);
      sample.fb_free_mib = ToMiB(memory.free);
    }
  }
  if (alive() && api_->device_get_temperature_v != nullptr) {
    nvml::Temperature temperature{nvml::kTemperatureV1Version, nvml::kTemperatureGpu, 0};
    if (ok(api_->device_get_temperature_v(device.handle, &temperature),
           "nvmlDeviceGetTemperatureV")) {
      sample.temperature_c = temperature.temperature;
    }
  } else if (alive() && api_->device_get_temperature != nullptr) {
    unsigned int temperature = 0;
    if (ok(api_->device_get_temperature(device.handle, nvml::kTemperatureGpu, &temperature),
           "nvmlDeviceGetTemperature")) {
      sample.temperature_c = temperature;
    }
  }
  if (alive() && api_->device_get_power_usage != nullptr) {
    unsigned int milliwatts = 0;
    if (ok(api_->device_get_power_usage(device.handle, &milliwatts), "nvmlDeviceGetPowerUsage")) {
      sample.power_milliwatts = milliwatts;
    }
  }
  if (alive() && api_->device_get_clock_info != nullptr) {
    unsigned int mhz = 0;
    if (ok(api_->device_get_clock_info(device.handle, nvml::kClockSm, &mhz),
           "nvmlDeviceGetClockInfo")) {
      sample.sm_clock_mhz = mhz;
    }
    if (alive() && ok(api_->device_get_clock_info(device.handle, nvml::kClockMem, &mhz),
                      "nvmlDeviceGetClockInfo")) {
      sample.memory_clock_mhz = mhz;
    }
  }
  if (alive() && api_->device_get_total_ecc_errors != nullptr) {
    unsigned long long count = 0;  // NOLINT(google-runtime-int)
    if (ok(api_->device_get_total_ecc_errors(device.handle, nvml::kMemoryErrorUncorrected,
                                             nvml::kVolatileEcc, &count),
           "nvmlDeviceGetTotalEccErrors")) {
      sample.ecc_dbe_volatile_total = static_cast<int64_t>(count);
    }
  }
  if (alive() && api_->device_get_remapped_rows != nullptr) {
    unsigned int correctable = 0;
    unsigned int uncorrectable = 0;
    unsigned int pending = 0;
    unsigned int failure = 0;
    if (ok(api_->device_get_remapped_rows(device.handle, &correctable, &uncorrectable, &pending,
                                          &failure),
           "nvmlDeviceGetRemappedRows")) {
      sample.correctable_remapped_rows = correctable;
      sample.uncorrectable_remapped_rows = uncorrectable;
      sample.row_remap_pending = pending != 0;
      sample.row_remap_failure = failure != 0;
    }
  }
  if (alive() && api_->device_get_pcie_replay_counter != nullptr) {
    unsigned int replays = 0;
    if (ok(api_->device_get_pcie_replay_counter(device.handle, &replays),
           "nvmlDeviceGetPcieReplayCounter")) {
      sample.pcie_replay_count = replays;
    }
  }
  if (alive() && api_->device_get_total_energy_consumption != nullptr) {
    unsigned long long millijoules = 0;  // NOLINT(google-runtime-int)
    if (ok(api_->device_get_total_energy_consumption(device.handle, &millijoules),
           "nvmlDeviceGetTotalEnergyConsumption")) {
      sample.total_energy_millijoules = static_cast<int64_t>(millijoules);
    }
  }
  unsigned int percent = 0;
  unsigned int sampling_period_us = 0;
  if (alive() && api_->device_get_encoder_utilization != nullptr &&
      ok(api_->device_get_encoder_utilization(device.handle, &percent, &sampling_period_us),
         "nvmlDeviceGetEncoderUtilization")) {
    sample.encoder_util_percent = percent;
  }
  if (alive() && api_->device_get_decoder_utilization != nullptr &&
      ok(api_->device_get_decoder_utilization(device.handle, &percent, &sampling_period_us),
         "nvmlDeviceGetDecoderUtilization")) {
    sample.decoder_util_percent = percent;
  }
  if (alive() && api_->device_get_field_values != nullptr) {
    SampleFields(device, sample);
  }
  if (alive() && api_->device_get_clocks_event_reasons != nullptr) {
    unsigned long long reasons = 0;  // NOLINT(google-runtime-int)
    if (ok(api_->device_get_clocks_event_reasons(device.handle, &reasons),
           api_->clocks_event_reasons_name)) {
      sample.clocks_event_reasons = reasons;
    }
  }
  if (alive() && device.gpm_supported) {
    SampleGpm(device, sample);
  }
  if (alive() && api_->device_get_memory_info_v2 != nullptr) {
    for (const auto& [mig, gpu_instance_id] : device.mig_handles) {
      MigDeviceSample mig_sample;
      mig_sample.gpu_instance_id = gpu_instance_id;
      nvml::MemoryV2 memory{};
      memory.version = nvml::kMemoryV2Version;
      if (alive() &&
          ok(api_->device_get_memory_info_v2(mig, &memory), "nvmlDeviceGetMemoryInfo_v2")) {
        mig_sample.fb_used_mib = ToMiB(memory.used);
        mig_sample.fb_free_mib = ToMiB(memory.free);
      }
      sample.mig_devices.push_back(mig_sample);
    }
  }
  sample.lost = device.lost;
}

void NvmlProbe::SampleFields(DeviceState& device, GpuSample& sample) {
  nvml::FieldValue values[3] = {};
  values[0].field_id = nvml::kFieldMemoryTemp;
  values[1].field_id = nvml::kFieldNvlinkThroughputDataTx;
  values[1].scope_id = nvml::kScopeAllLinks;
  values[2].field_id = nvml::kFieldNvlinkThroughputDataRx;
  values[2].scope_id = nvml::kScopeAllLinks;
  const nvml::Return rc = api_->device_get_field_values(device.handle, 3, values);
  if (rc == nvml::Return::kGpuIsLost) {
    device.lost = true;
    return;
  }
  if (rc != nvml::Return::kSuccess) {
    if (rc != nvml::Return::kNotSupported) {
      sample.read_errors.push_back(
          fmt::format("nvmlDeviceGetFieldValues: {}", nvml::ReturnName(rc)));
    }
    return;
  }
  // SUCCESS means that some value was filled: each carries its own return code and type.
  const auto integer = [](const nvml::FieldValue& field) -> std::optional<int64_t> {
    if (field.nvml_return != nvml::Return::kSuccess) {
      return std::nullopt;
    }
    switch (field.value_type) {
      case nvml::kValueTypeUnsignedInt:
        return field.value.ui;
      case nvml::kValueTypeUnsignedLong:
        return static_cast<int64_t>(field.value.ul);
      case nvml::kValueTypeUnsignedLongLong:
        return static_cast<int64_t>(field.value.ull);
      case nvml::kValueTypeSignedLongLong:
        return field.value.sll;
      case nvml::kValueTypeSignedInt:
        return field.value.si;
      default:
        return std::nullopt;
    }
  };
  // dcgm-exporter treats a memory temperature above 200 C as a read error.
  if (const std::optional<int64_t> celsius = integer(values[0]); celsius && *celsius <= 200) {
    sample.memory_temperature_c = celsius;
  }
  const std::optional<int64_t> tx = integer(values[1]);
  const std::optional<int64_t> rx = integer(values[2]);
  if (tx.has_value() && rx.has_value()) {
    sample.nvlink_data_kib = *tx + *rx;
  }
}

void NvmlProbe::SampleGpm(DeviceState& device, GpuSample& sample) {
  const nvml::Return rc = api_->gpm_sample_get(device.handle, device.current);
  if (rc == nvml::Return::kGpuIsLost) {
    device.lost = true;
    return;
  }
  if (rc != nvml::Return::kSuccess) {
    sample.read_errors.push_back(fmt::format("nvmlGpmSampleGet: {}", nvml::ReturnName(rc)));
    device.has_previous = false;
    return;
  }
  if (device.has_previous) {
    // 13 KB: too large for the sampler thread's stack frame to carry comfortably.
    auto request = std::make_unique<nvml::GpmMetricsGet>();
    request->version = nvml::kGpmMetricsGetVersion;
    request->num_metrics = 6;
    request->sample1 = device.previous;
    request->sample2 = device.current;
    request->metrics[0].metric_id = nvml::kGpmMetricSmUtil;
    request->metrics[1].metric_id = nvml::kGpmMetricDramBwUtil;
    request->metrics[2].metric_id = nvml::kGpmMetricAnyTensorUtil;
    request->metrics[3].metric_id = nvml::kGpmMetricGraphicsUtil;
    request->metrics[4].metric_id = nvml::kGpmMetricPcieTxPerSec;
    request->metrics[5].metric_id = nvml::kGpmMetricPcieRxPerSec;
    const nvml::Return metrics_rc = api_->gpm_metrics_get(request.get());
    if (metrics_rc == nvml::Return::kSuccess) {
      // Each metric carries its own return code; GPM reports percent, DCGM ratios.
      const auto ratio = [&](int i) -> std::optional<double> {
        if (request->metrics[i].nvml_return != nvml::Return::kSuccess) {
          return std::nullopt;
        }
        return std::clamp(request->metrics[i].value / 100.0, 0.0, 1.0);
      };
      // MiB per second, as DCGM turns it into bytes per second.
      const auto bytes_per_second = [&](int i) -> std::optional<int64_t> {
        if (request->metrics[i].nvml_return != nvml::Return::kSuccess ||
            !(request->metrics[i].value >= 0)) {
          return std::nullopt;
        }
        return std::llround(request->metrics[i].value * (1 << 20));
      };
      sample.sm_active = ratio(0);
      sample.dram_active = ratio(1);
      sample.tensor_active = ratio(2);
      sample.graphics_engine_active = ratio(3);
      sample.pcie_tx_bytes_per_second = bytes_per_second(4);
      sample.pcie_rx_bytes_per_second = bytes_per_second(5);
    } else if (metrics_rc != nvml::Return::kNotSupported) {
      sample.read_errors.push_back(
          fmt::format("nvmlGpmMetricsGet: {}", nvml::ReturnName(metrics_rc)));
    }
  }
  std::swap(device.previous, device.current);
  device.has_previous = true;
}

}  // namespace gpufleet::agent
