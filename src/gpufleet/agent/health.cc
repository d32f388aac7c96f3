// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/health.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include <fmt/core.h>
#include <fmt/format.h>

#include "gpufleet/agent/nvml_api.h"

namespace gpufleet::agent {
namespace {

// gpufleet's policy per XID (telemetry.md §3.3, "Policy" column): the catalog's resolution
// bucket, DCGM's verdict and the k8s device plugin's application errors taken together. Names are
// NVIDIA's, spelt as dcgm-exporter spells them in its err_msg label.
constexpr XidRule kXidRules[] = {
    {8, "GPU stopped processing", XidClass::kApplication, "the job's fault; watch for repeats"},
    {13, "Graphics Engine Exception", XidClass::kApplication, "the job's fault"},
    {31, "GPU memory page fault", XidClass::kApplication, "the job's fault"},
    {32, "Invalid or corrupted push buffer stream", XidClass::kApplication,
     "the job's fault; watch for repeats"},
    {43, "GPU stopped processing", XidClass::kApplication, "the job's fault"},
    {45,
     "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
     XidClass::kApplication, "follows another error; look for the first XID"},
    {46, "GPU stopped processing", XidClass::kDrainNow, "reset the GPU"},
    {48, "Double Bit ECC Error", XidClass::kDrainNow, "reset the GPU; RMA if it repeats"},
    {61, "Internal micro-controller breakpoint/warning", XidClass::kMonitor,
     "report; reset if it repeats"},
    {62, "Internal micro-controller halt", XidClass::kDrainNow, "reset the GPU"},
    {63, "ECC page retirement or row remapping recording event", XidClass::kDrainAfterJob,
     "reset the GPU to apply the remap"},
    {64, "ECC page retirement or row remapper recording failure", XidClass::kDrainNow,
     "run field diagnostics; RMA"},
    {68, "NVDEC0 Exception", XidClass::kApplication, "the job's fault"},
    {74, "NVLINK Error", XidClass::kDrainNow, "check both ends of the link"},
    {79, "GPU has fallen off the bus", XidClass::kDrainNow,
     "drain the node and reboot; RMA if it repeats"},
    {92, "High single-bit ECC error rate", XidClass::kMonitor,
     "run field diagnostics if it persists"},
    {94, "Contained ECC error", XidClass::kDrainAfterJob,
     "the job on the GPU was stopped; reset the GPU"},
    {95, "Uncontained ECC error", XidClass::kDrainNow, "reset the GPU"},
    {109, "Context Switch Timeout Error", XidClass::kDrainAfterJob,
     "reset the GPU; escalate if it repeats"},
    {110, "Security Fault Error", XidClass::kDrainNow, "reset the GPU"},
    {119, "GSP RPC Timeout", XidClass::kDrainNow, "reset the GPU"},
    {120, "GSP Error", XidClass::kDrainNow, "reset the GPU"},
    {121, "C2C Link Error", XidClass::kMonitor, "watch the link"},
    {136, "ALI Training Fail", XidClass::kDrainNow, "reset the GPU"},
    {140, "Unrecovered ECC Error", XidClass::kDrainNow, "reset the GPU"},
    {143, "GPU Initialization Failure", XidClass::kDrainNow, "reset the GPU"},
    {144, "NVLINK: Saw Error", XidClass::kDrainNow, "check the NVLink fabric"},
    {145, "NVLINK: RLW Error", XidClass::kDrainNow, "check the NVLink fabric"},
    {146, "NVLINK: TLW Error", XidClass::kDrainNow, "check the NVLink fabric"},
    {147, "NVLINK: TREX Error", XidClass::kDrainNow, "check the NVLink fabric"},
    {148, "NVLINK: NVLPW_CTRL Error", XidClass::kDrainNow, "check the NVLink fabric"},
    {149, "NVLINK: NETIR Error", XidClass::kDrainNow, "check the NVLink fabric"},
    {150, "NVLINK: MSE Error", XidClass::kDrainNow, "check the NVLink fabric"},
    {154, "GPU Recovery Action Changed", XidClass::kMonitor, "read the driver's recovery action"},
    {155, "NVLINK: SW Defined Error", XidClass::kDrainNow, "reset the GPU"},
    {156, "Resource Retirement Event", XidClass::kDrainNow, "reset the GPU"},
    {158, "GPU Fatal Timeout", XidClass::kDrainNow, "reset the GPU"},
    {160, "Channel Retirement Event", XidClass::kDrainNow, "drain the node and reboot"},
};

constexpr bool SortedByCode() {
  for (size_t i = 1; i < std::size(kXidRules); ++i) {
    if (kXidRules[i - 1].code >= kXidRules[i].code) {
      return false;
    }
  }
  return true;
}
static_assert(SortedByCode(), "FindXidRule searches kXidRules by binary search");

// Clock-event reasons that mean the GPU is held below the clocks it was asked for by something
// other than normal power capping at full load.
constexpr uint64_t kDegradingClockReasons =
    nvml::kClocksEventHwSlowdown | nvml::kClocksEventSwThermalSlowdown |
    nvml::kClocksEventHwThermalSlowdown | nvml::kClocksEventHwPowerBrakeSlowdown;

HealthFinding Finding(std::string rule, GpuHealth health, DrainAction drain, std::string reason) {
  return HealthFinding{std::move(rule), health, drain, std::move(reason)};
}

int Severity(GpuHealth health) {
  switch (health) {
    case GpuHealth::kHealthy:
      return 0;
    case GpuHealth::kDegraded:
      return 1;
    case GpuHealth::kUnhealthy:
      return 2;
    case GpuHealth::kQuarantined:
      return 3;
  }
  return 0;
}

HealthFinding XidFinding(int code, int64_t count) {
  const std::string xid =
      count > 1 ? fmt::format("XID {} (x{})", code, count) : fmt::format("XID {}", code);
  const XidRule* rule = FindXidRule(code);
  if (rule == nullptr) {
    // As the k8s device plugin and Meta's GCM do, an XID without a rule counts against the GPU.
    return Finding("xid", GpuHealth::kUnhealthy, DrainAction::kAfterJob,
                   fmt::format("{}: not in gpufleet's XID catalog, taken as a GPU fault; drain "
                               "after the running job (read the driver log)",
                               xid));
  }
  switch (rule->xid_class) {
    case XidClass::kApplication:
      return Finding("xid", GpuHealth::kHealthy, DrainAction::kNone,
                     fmt::format("{}: {}; application error, never drain ({})", xid, rule->name,
                                 rule->advice));
    case XidClass::kMonitor:
      return Finding("xid", GpuHealth::kDegraded, DrainAction::kNone,
                     fmt::format("{}: {}; monitor ({})", xid, rule->name, rule->advice));
    case XidClass::kDrainAfterJob:
      return Finding(
          "xid", GpuHealth::kUnhealthy, DrainAction::kAfterJob,
          fmt::format("{}: {}; drain after the running job ({})", xid, rule->name, rule->advice));
    case XidClass::kDrainNow:
      return Finding("xid", GpuHealth::kUnhealthy, DrainAction::kNow,
                     fmt::format("{}: {}; drain now ({})", xid, rule->name, rule->advice));
  }
  return Finding("xid", GpuHealth::kDegraded, DrainAction::kNone, xid);
}

}  // namespace

const char* DrainActionName(DrainAction action) {
  switch (action) {
    case DrainAction::kNone:
      return "none";
    case DrainAction::kAfterJob:
      return "after job";
    case DrainAction::kNow:
      return "now";
  }
  return "unknown";
}

const XidRule* FindXidRule(int code) {
  const auto* end = std::end(kXidRules);
  const auto* it = std::lower_bound(std::begin(kXidRules), end, code,
                                    [](const XidRule& rule, int c) { return rule.code < c; });
  return it != end && it->code == code ? it : nullptr;
}

std::string GpuHealthReport::Summary() const {
  std::vector<std::string> reasons;
  for (const HealthFinding& finding : findings) {
    reasons.push_back(finding.reason);
  }
  return reasons.empty() ? std::string("healthy") : fmt::format("{}", fmt::join(reasons, " | "));
}

GpuHealthReport EvaluateGpuHealth(const GpuStaticInfo& info, const GpuSample& sample,
                                  const std::map<int, int64_t>& xids_since_reset,
                                  const HealthOptions& options) {
  GpuHealthReport report;
  report.gpu_index = info.index;
  std::vector<HealthFinding>& findings = report.findings;

  if (sample.lost) {
    findings.push_back(Finding(
        "lost", GpuHealth::kUnhealthy, DrainAction::kNow,
        "GPU lost (NVML_ERROR_GPU_IS_LOST): it no longer answers; drain now, reboot the node"));
  }
  for (const auto& [code, count] : xids_since_reset) {
    findings.push_back(XidFinding(code, count));
  }
  if (sample.ecc_dbe_volatile_total.value_or(0) > 0) {
    findings.push_back(Finding(
        "ecc", GpuHealth::kUnhealthy, DrainAction::kNow,
        fmt::format("{} uncorrectable (double-bit) ECC error(s) since the driver loaded; drain "
                    "now, reset the GPU",
                    *sample.ecc_dbe_volatile_total)));
  }
  if (sample.row_remap_failure.value_or(false)) {
    findings.push_back(
        Finding("row_remap", GpuHealth::kUnhealthy, DrainAction::kNow,
                "row remapping failed: memory can no longer be repaired; drain now, run field "
                "diagnostics"));
  }
  if (sample.row_remap_pending.value_or(false)) {
    findings.push_back(Finding("row_remap", GpuHealth::kUnhealthy, DrainAction::kAfterJob,
                               "remapped rows wait for a GPU reset; drain after the running job"));
  }
  const int64_t remapped = sample.uncorrectable_remapped_rows.value_or(0);
  if (remapped >= options.uncorrectable_remapped_rows_warning) {
    findings.push_back(
        Finding("row_remap", GpuHealth::kDegraded, DrainAction::kNone,
                fmt::format("{} uncorrectable remapped rows (warning from {}); plan a replacement",
                            remapped, options.uncorrectable_remapped_rows_warning)));
  }
  if (sample.temperature_c.has_value() && info.slowdown_temperature_c.has_value()) {
    const int64_t temperature = *sample.temperature_c;
    const int threshold = *info.slowdown_temperature_c;
    const int headroom = threshold - static_cast<int>(temperature);
    report.thermal_headroom_c = headroom;
    if (headroom <= 0) {
      findings.push_back(Finding(
          "thermal", GpuHealth::kDegraded, DrainAction::kNone,
          fmt::format("temperature {} C is at or above the {} C slowdown threshold; the GPU "
                      "slows itself down",
                      temperature, threshold)));
    } else if (headroom < options.min_thermal_headroom_c) {
      findings.push_back(
          Finding("thermal", GpuHealth::kDegraded, DrainAction::kNone,
                  fmt::format("temperature {} C, {} C below the {} C slowdown threshold (want "
                              "at least {} C)",
                              temperature, headroom, threshold, options.min_thermal_headroom_c)));
    }
  }
  const uint64_t degrading = sample.clocks_event_reasons.value_or(0) & kDegradingClockReasons;
  if (degrading != 0) {
    findings.push_back(Finding(
        "clocks", GpuHealth::kDegraded, DrainAction::kNone,
        fmt::format("clocks held down: {}", fmt::join(ClocksEventReasonNames(degrading), ", "))));
  }

  for (const HealthFinding& finding : findings) {
    if (Severity(finding.health) > Severity(report.health)) {
      report.health = finding.health;
    }
    report.drain = std::max(report.drain, finding.drain);
  }
  return report;
}

}  // namespace gpufleet::agent
