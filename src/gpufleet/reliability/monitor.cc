// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/monitor.h"

#include <fmt/format.h>

#include "gpufleet/reliability/xid_catalog.h"

namespace gpufleet::reliability {

Result<ReliabilityMonitor> ReliabilityMonitor::Create(const FleetInventory& inventory,
                                                      const Clock& clock,
                                                      const AttributionOptions& attribution,
                                                      const QuarantineBudget& budget,
                                                      const QuarantineRules& rules) {
  GPUFLEET_ASSIGN_OR_RETURN(AttributionEngine engine,
                            AttributionEngine::Create(inventory, clock, attribution));
  GPUFLEET_ASSIGN_OR_RETURN(QuarantineManager quarantine,
                            QuarantineManager::Create(inventory, clock, budget));
  return ReliabilityMonitor(std::move(engine), std::move(quarantine), rules);
}

Evaluation ReliabilityMonitor::Evaluate() {
  Evaluation evaluation;
  evaluation.report = engine_.Analyze();
  if (!rules_.enabled) {
    return evaluation;
  }
  for (const DeviceEvidence& suspect : evaluation.report.suspects) {
    const Device& device = suspect.device;
    if (device.kind == DeviceKind::kGpu ? !quarantine_.AcceptsWork(GpuUuid(device.id))
                                        : quarantine_.IsQuarantined(device)) {
      continue;
    }
    const DrainMode mode =
        suspect.HasDrainNowXid() ? rules_.drain_now_xid_mode : rules_.default_mode;
    const Status status = quarantine_.Quarantine(QuarantineRequest{
        device, mode, QuarantineSource::kAttribution, "attribution", EvidenceSummary(suspect)});
    evaluation.decisions.push_back(QuarantineDecision{device, mode, status});
  }
  return evaluation;
}

Status ReliabilityMonitor::QuarantineForXid(const GpuUuid& gpu, int xid, const std::string& actor) {
  const XidAction action = ClassifyXid(xid);
  if (action != XidAction::kDrainNow && action != XidAction::kDrainAfterJob) {
    return InvalidArgumentError(fmt::format(
        "xid: {} is an {} XID; the catalog drains nothing for it", xid, XidActionName(action)));
  }
  return quarantine_.Quarantine(QuarantineRequest{
      Device::OfGpu(gpu), action == XidAction::kDrainNow ? DrainMode::kNow : DrainMode::kAfterJob,
      QuarantineSource::kHealthRule, actor,
      fmt::format("xid {} ({})", xid, XidActionName(action))});
}

Status ReliabilityMonitor::Release(const Device& device, const std::string& actor,
                                   const std::string& reason) {
  GPUFLEET_RETURN_IF_ERROR(quarantine_.Release(device, actor, reason));
  // Cannot fail: the release just found the device in the inventory.
  return engine_.ResetDevice(device);
}

std::string EvidenceSummary(const DeviceEvidence& evidence) {
  std::string text = fmt::format(
      "{} failures ({} named it) in {} runs, {:.1f} GPU-h, expected {:.3g}, p={:.2g}, q={:.2g}",
      evidence.failures, evidence.attributed_failures, evidence.runs, evidence.gpu_hours,
      evidence.expected, evidence.p_value, evidence.q_value);
  if (!evidence.xids.empty()) {
    text += ", XIDs";
    for (const auto& [xid, count] : evidence.xids) {
      text += fmt::format(" {}x{}", xid, count);
    }
  }
  for (const auto& [check, count] : evidence.health_checks) {
    text += fmt::format(", {} x{}", check, count);
  }
  return text;
}

std::string ConcentrationSummary(const FailureConcentration& c) {
  return fmt::format(
      "these {} GPUs ({:.2f}% of the fleet) were involved in {:.1f}% of failed jobs; "
      "quarantining them would have avoided {:.0f} failures",
      c.gpus, 100 * c.fleet_share, 100 * c.failed_share, c.avoidable);
}

}  // namespace gpufleet::reliability
