// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/agent/gpu_probe.h"

// Prometheus text in NVIDIA dcgm-exporter's format, so that dashboards built on dcgm-exporter
// (Grafana 12239 and others) read gpufleet's agent unchanged: the same metric names, HELP and
// TYPE lines, label names and order (gpu, UUID, pci_bus_id, device, modelName, then
// GPU_I_PROFILE and GPU_I_ID on MIG instances, then Hostname, then the DCGM_FI_DRIVER_VERSION
// label), value formats (integers as integers, DOUBLE fields such as power and the PROF ratios
// with six decimals) and units. A value the GPU does not provide is left out, not written as 0.
// Metrics come in the order of dcgm-exporter's counters CSV; a metric without series is left
// out entirely.
namespace gpufleet::agent {

// What one GPU contributes to a scrape.
struct GpuReading {
  GpuStaticInfo info;
  GpuSample sample;
  // DCGM_FI_DEV_XID_ERRORS, the last XID seen (0 before any); absent when the GPU cannot report
  // XIDs.
  std::optional<int64_t> last_xid;
};

// A task on a GPU or MIG device, for the labels that tie a GPU's series to its job.
struct GpuTask {
  std::string device_uuid;  // the GPU's UUID, or the MIG device's ("MIG-...")
  std::string job;          // "TEAM/NAME", dcgm-exporter's hpc_job label
  std::string task;
  std::string team;
  std::string queue;
};

struct DcgmRenderOptions {
  std::string hostname;        // the Hostname label; empty leaves it out (--no-hostname)
  std::string driver_version;  // the DCGM_FI_DRIVER_VERSION label; empty leaves it out
  // The tasks on the GPUs: a GPU (or MIG instance) that holds any gets the labels hpc_job,
  // queue, task and team after the driver label (sorted by key, as dcgm-exporter orders its
  // extra labels). Tasks sharing a GPU are listed in one series, their distinct values sorted
  // and joined by ","; at most kMaxTasksPerLabel values, then "+N", so a GPU has one series and
  // the number of series stays that of the GPUs.
  std::vector<GpuTask> tasks;
};
inline constexpr size_t kMaxTasksPerLabel = 4;

// The dcgm-exporter text for `readings`. A lost GPU has no series (DCGM reads blanks for it). On
// a MIG-enabled GPU every series is per MIG instance: framebuffer values are the instance's,
// device-wide values (temperature, power, clocks, errors) repeat on each instance, and GPU
// utilisation and the PROF ratios, which NVML does not give per instance, are left out.
std::string RenderDcgmMetrics(const std::vector<GpuReading>& readings,
                              const DcgmRenderOptions& options);

// The identifying labels of a GPU series, without braces:
// gpu="0",UUID="GPU-...",pci_bus_id="...",device="nvidia0",modelName="..."[,GPU_I_PROFILE=...,
// GPU_I_ID=...][,Hostname="..."]. For other exporters of per-GPU series (gpufleet's own
// metrics) to carry the same identity.
std::string DcgmGpuLabels(const GpuStaticInfo& info, const MigDeviceInfo* mig,
                          const std::string& hostname);

// A Prometheus label value with backslash, double quote and newline escaped.
std::string EscapeLabelValue(const std::string& value);

}  // namespace gpufleet::agent
