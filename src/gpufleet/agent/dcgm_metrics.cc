// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/dcgm_metrics.h"

#include <algorithm>
#include <string_view>
#include <variant>

#include <fmt/core.h>

#include "gpufleet/agent/health.h"

namespace gpufleet::agent {
namespace {

// DCGM stores most fields as INT64 (printed "%d") and a few as DOUBLE (printed "%f").
using Value = std::variant<int64_t, double>;

// Where a metric's value comes from on a MIG instance.
enum class MigScope {
  kDevice,    // the whole GPU's value, repeated on each instance
  kInstance,  // the instance's own value
  kNone,      // not available per instance: left out on MIG-enabled GPUs
};

struct MetricDef {
  const char* name;
  const char* type;
  const char* help;  // dcgm-exporter's help text, verbatim
  MigScope mig_scope;
  std::optional<Value> (*value)(const GpuReading& reading, const MigDeviceSample* mig);
};

std::optional<Value> Int(const std::optional<int64_t>& value) {
  if (!value.has_value()) {
    return std::nullopt;
  }
  return Value(*value);
}

std::optional<Value> Ratio(const std::optional<double>& value) {
  if (!value.has_value()) {
    return std::nullopt;
  }
  return Value(*value);
}

// dcgm-exporter's counters CSV order (default-counters.csv, then dcp-metrics-included.csv for
// the PROF fields).
const MetricDef kMetrics[] = {
    {"DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) { return Int(r.sample.sm_clock_mhz); }},
    {"DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) { return Int(r.sample.memory_clock_mhz); }},
    {"DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) {
       return Int(r.sample.memory_temperature_c);
     }},
    {"DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) { return Int(r.sample.temperature_c); }},
    {"DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) -> std::optional<Value> {
       if (!r.sample.power_milliwatts.has_value()) {
         return std::nullopt;
       }
       return Value(static_cast<double>(*r.sample.power_milliwatts) / 1000.0);
     }},
    {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ).", MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) {
       return Int(r.sample.total_energy_millijoules);
     }},
    {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
     MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) { return Int(r.sample.pcie_replay_count); }},
    {"DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", MigScope::kNone,
     [](const GpuReading& r, const MigDeviceSample*) { return Int(r.sample.gpu_util_percent); }},
    {"DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", MigScope::kNone,
     [](const GpuReading& r, const MigDeviceSample*) {
       return Int(r.sample.memory_copy_util_percent);
     }},
    {"DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", MigScope::kNone,
     [](const GpuReading& r, const MigDeviceSample*) {
       return Int(r.sample.encoder_util_percent);
     }},
    {"DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", MigScope::kNone,
     [](const GpuReading& r, const MigDeviceSample*) {
       return Int(r.sample.decoder_util_percent);
     }},
    {"DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
     MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) { return Int(r.last_xid); }},
    {"DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", MigScope::kInstance,
     [](const GpuReading& r, const MigDeviceSample* mig) {
       return Int(mig != nullptr ? mig->fb_free_mib : r.sample.fb_free_mib);
     }},
    {"DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", MigScope::kInstance,
     [](const GpuReading& r, const MigDeviceSample* mig) {
       return Int(mig != nullptr ? mig->fb_used_mib : r.sample.fb_used_mib);
     }},
    {"DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", MigScope::kNone,
     [](const GpuReading& r, const MigDeviceSample*) { return Int(r.sample.fb_reserved_mib); }},
    {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
     "Total number of NVLink bandwidth counters for all lanes.", MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) { return Int(r.sample.nvlink_data_kib); }},
    {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
     MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) {
       return Int(r.sample.ecc_dbe_volatile_total);
     }},
    {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors", MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) {
       return Int(r.sample.uncorrectable_remapped_rows);
     }},
    {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors", MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) {
       return Int(r.sample.correctable_remapped_rows);
     }},
    {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
     MigScope::kDevice,
     [](const GpuReading& r, const MigDeviceSample*) -> std::optional<Value> {
       if (!r.sample.row_remap_failure.has_value()) {
         return std::nullopt;
       }
       return Value(int64_t{*r.sample.row_remap_failure ? 1 : 0});
     }},
    {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
     MigScope::kNone,
     [](const GpuReading& r, const MigDeviceSample*) {
       return Ratio(r.sample.graphics_engine_active);
     }},
    {"DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.",
     MigScope::kNone,
     [](const GpuReading& r, const MigDeviceSample*) { return Ratio(r.sample.sm_active); }},
    {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
     "Ratio of cycles the tensor (HMMA) pipe is active.", MigScope::kNone,
     [](const GpuReading& r, const MigDeviceSample*) { return Ratio(r.sample.tensor_active); }},
    {"DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data.",
     MigScope::kNone,
     [](const GpuReading& r, const MigDeviceSample*) { return Ratio(r.sample.dram_active); }},
    {"DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
     "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
     "payloads - in bytes per second.",
     MigScope::kNone,
     [](const GpuReading& r, const MigDeviceSample*) {
       return Int(r.sample.pcie_tx_bytes_per_second);
     }},
    {"DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
     "The rate of data received over the PCIe bus - including both protocol headers and data "
     "payloads - in bytes per second.",
     MigScope::kNone,
     [](const GpuReading& r, const MigDeviceSample*) {
       return Int(r.sample.pcie_rx_bytes_per_second);
     }},
};

std::string FormatValue(const Value& value) {
  if (const auto* integer = std::get_if<int64_t>(&value)) {
    return fmt::format("{}", *integer);
  }
  return fmt::format("{:.6f}", std::get<double>(value));
}

// dcgm-exporter's err_msg for an XID: "No Error" before any, NVIDIA's name when gpufleet's
// catalog has the XID.
std::string XidMessage(int64_t code) {
  if (code == 0) {
    return "No Error";
  }
  const XidRule* rule = FindXidRule(static_cast<int>(code));
  return rule != nullptr ? rule->name : "Unknown Error";
}

void AppendSeries(std::string& out, const MetricDef& metric, const std::string& labels,
                  const std::string& driver_label, const Value& value) {
  out += metric.name;
  out += '{';
  out += labels;
  out += driver_label;
  if (std::string_view(metric.name) == "DCGM_FI_DEV_XID_ERRORS") {
    const int64_t code = std::get<int64_t>(value);
    out += fmt::format(",err_code=\"{}\",err_msg=\"{}\"", code, EscapeLabelValue(XidMessage(code)));
  }
  out += "} ";
  out += FormatValue(value);
  out += '\n';
}

// The distinct values sorted, joined by ",", with at most kMaxTasksPerLabel of them.
std::string JoinedValues(std::vector<std::string> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  const size_t shown = std::min(values.size(), kMaxTasksPerLabel);
  std::string joined;
  for (size_t i = 0; i < shown; ++i) {
    joined += (i == 0 ? "" : ",") + values[i];
  }
  if (values.size() > shown) {
    joined += fmt::format(",+{}", values.size() - shown);
  }
  return joined;
}

// ",hpc_job=...,queue=...,task=...,team=..." for the tasks on `device_uuid`; empty for none.
std::string TaskLabels(const std::vector<GpuTask>& tasks, const std::string& device_uuid) {
  std::vector<std::string> jobs, queues, names, teams;
  for (const GpuTask& task : tasks) {
    if (task.device_uuid == device_uuid) {
      jobs.push_back(task.job);
      queues.push_back(task.queue);
      names.push_back(task.task);
      teams.push_back(task.team);
    }
  }
  if (jobs.empty()) {
    return "";
  }
  return fmt::format(",hpc_job=\"{}\",queue=\"{}\",task=\"{}\",team=\"{}\"",
                     EscapeLabelValue(JoinedValues(std::move(jobs))),
                     EscapeLabelValue(JoinedValues(std::move(queues))),
                     EscapeLabelValue(JoinedValues(std::move(names))),
                     EscapeLabelValue(JoinedValues(std::move(teams))));
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string escaped;
  escaped.reserve(value.size());
  for (const char c : value) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '"') {
      escaped += "\\\"";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

std::string DcgmGpuLabels(const GpuStaticInfo& info, const MigDeviceInfo* mig,
                          const std::string& hostname) {
  std::string labels =
      fmt::format("gpu=\"{}\",UUID=\"{}\",pci_bus_id=\"{}\",device=\"nvidia{}\",modelName=\"{}\"",
                  info.index, EscapeLabelValue(info.uuid), EscapeLabelValue(info.pci_bus_id),
                  info.index, EscapeLabelValue(info.nvml_name));
  if (mig != nullptr) {
    labels += fmt::format(",GPU_I_PROFILE=\"{}\",GPU_I_ID=\"{}\"", EscapeLabelValue(mig->profile),
                          mig->gpu_instance_id);
  }
  if (!hostname.empty()) {
    labels += fmt::format(",Hostname=\"{}\"", EscapeLabelValue(hostname));
  }
  return labels;
}

std::string RenderDcgmMetrics(const std::vector<GpuReading>& readings,
                              const DcgmRenderOptions& options) {
  const std::string driver_label =
      options.driver_version.empty()
          ? std::string()
          : fmt::format(",DCGM_FI_DRIVER_VERSION=\"{}\"", EscapeLabelValue(options.driver_version));
  // The label strings of every series, computed once per scrape rather than once per metric.
  struct Entity {
    const GpuReading* reading;
    const MigDeviceSample* mig_sample;  // nullptr for a whole GPU
    std::string labels;
    std::string task_labels;  // after the driver label
  };
  std::vector<Entity> entities;
  for (const GpuReading& reading : readings) {
    if (reading.sample.lost) {
      continue;
    }
    if (!reading.info.mig_enabled || reading.info.mig_devices.empty()) {
      entities.push_back({&reading, nullptr, DcgmGpuLabels(reading.info, nullptr, options.hostname),
                          TaskLabels(options.tasks, reading.info.uuid)});
      continue;
    }
    for (const MigDeviceInfo& mig : reading.info.mig_devices) {
      const MigDeviceSample* mig_sample = nullptr;
      for (const MigDeviceSample& candidate : reading.sample.mig_devices) {
        if (candidate.gpu_instance_id == mig.gpu_instance_id) {
          mig_sample = &candidate;
        }
      }
      static const MigDeviceSample kUnread;
      entities.push_back({&reading, mig_sample != nullptr ? mig_sample : &kUnread,
                          DcgmGpuLabels(reading.info, &mig, options.hostname),
                          TaskLabels(options.tasks, mig.uuid)});
    }
  }

  std::string out;
  for (const MetricDef& metric : kMetrics) {
    bool header_written = false;
    for (const Entity& entity : entities) {
      if (entity.mig_sample != nullptr && metric.mig_scope == MigScope::kNone) {
        continue;
      }
      const MigDeviceSample* mig =
          metric.mig_scope == MigScope::kInstance ? entity.mig_sample : nullptr;
      const std::optional<Value> value = metric.value(*entity.reading, mig);
      if (!value.has_value()) {
        continue;
      }
      if (!header_written) {
        out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", metric.name, metric.help, metric.name,
                           metric.type);
        header_written = true;
      }
      AppendSeries(out, metric, entity.labels, driver_label + entity.task_labels, *value);
    }
  }
  return out;
}

}  // namespace gpufleet::agent
