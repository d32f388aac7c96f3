// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/quarantine.h"

#include <cmath>

#include <fmt/format.h>

namespace gpufleet::reliability {
namespace {

// floor(share * gpus), robust to 0.05 * 260 landing a hair below 13.
int Limit(double share, int gpus) {
  return static_cast<int>(std::floor(share * gpus + 1e-9));
}

}  // namespace

const char* DrainModeName(DrainMode mode) {
  return mode == DrainMode::kNow ? "now" : "after-job";
}

const char* QuarantineSourceName(QuarantineSource source) {
  switch (source) {
    case QuarantineSource::kAttribution:
      return "attribution";
    case QuarantineSource::kHealthRule:
      return "health-rule";
    case QuarantineSource::kOperator:
      return "operator";
  }
  return "unknown";
}

const char* AuditActionName(AuditAction action) {
  switch (action) {
    case AuditAction::kQuarantined:
      return "quarantined";
    case AuditAction::kDenied:
      return "denied";
    case AuditAction::kReleased:
      return "released";
  }
  return "unknown";
}

Status QuarantineBudget::Validate() const {
  if (!(max_fleet_share >= 0 && max_fleet_share <= 1)) {
    return InvalidArgumentError(
        fmt::format("max_fleet_share: {} (must be in [0, 1])", max_fleet_share));
  }
  if (!(max_leaf_share >= 0 && max_leaf_share <= 1)) {
    return InvalidArgumentError(
        fmt::format("max_leaf_share: {} (must be in [0, 1])", max_leaf_share));
  }
  return Status::Ok();
}

QuarantineManager::QuarantineManager(const FleetInventory& inventory, const Clock& clock,
                                     QuarantineBudget budget)
    : inventory_(inventory),
      clock_(clock),
      budget_(budget),
      gpu_marks_(inventory.gpu_count(), 0),
      leaf_out_(inventory.leaf_count(), 0) {}

Result<QuarantineManager> QuarantineManager::Create(const FleetInventory& inventory,
                                                    const Clock& clock, QuarantineBudget budget) {
  GPUFLEET_RETURN_IF_ERROR(budget.Validate());
  return QuarantineManager(inventory, clock, budget);
}

int QuarantineManager::FleetLimit() const {
  return Limit(budget_.max_fleet_share, inventory_.gpu_count());
}

int QuarantineManager::LeafLimit(int leaf) const {
  return Limit(budget_.max_leaf_share, inventory_.gpus_in_leaf(leaf));
}

int QuarantineManager::LeafOf(const Device& device, int index) const {
  return device.kind == DeviceKind::kGpu ? inventory_.leaf_of_node(inventory_.node_of_gpu(index))
                                         : inventory_.leaf_of_node(index);
}

void QuarantineManager::Mark(const Device& device, int index, int delta) {
  auto mark = [&](int gpu) {
    const bool was_out = gpu_marks_[gpu] > 0;
    gpu_marks_[gpu] += delta;
    const bool is_out = gpu_marks_[gpu] > 0;
    if (was_out != is_out) {
      const int change = is_out ? 1 : -1;
      gpus_out_ += change;
      leaf_out_[inventory_.leaf_of_node(inventory_.node_of_gpu(gpu))] += change;
    }
  };
  if (device.kind == DeviceKind::kGpu) {
    mark(index);
  } else {
    for (int gpu : inventory_.gpus_of_node(index)) {
      mark(gpu);
    }
  }
}

void QuarantineManager::Log(AuditAction action, const Device& device, int index,
                            QuarantineSource source, DrainMode mode, const std::string& actor,
                            const std::string& reason) {
  const int leaf = LeafOf(device, index);
  audit_.push_back(AuditEntry{static_cast<int64_t>(audit_.size()) + 1, clock_.Now(), action, device,
                              inventory_.leaf_name(leaf), source, mode, actor, reason, gpus_out_,
                              leaf_out_[leaf]});
}

Status QuarantineManager::Quarantine(const QuarantineRequest& request) {
  if (request.actor.empty()) {
    return InvalidArgumentError("actor: empty");
  }
  if (request.reason.empty()) {
    return InvalidArgumentError("reason: empty");
  }
  const Device& device = request.device;
  const int index = inventory_.IndexOf(device);
  if (index < 0) {
    return NotFoundError(fmt::format("unknown device: {}", device.ToString()));
  }
  if (IsQuarantined(device)) {
    return AlreadyExistsError(fmt::format("{} is already quarantined", device.ToString()));
  }
  int added = 0;
  if (device.kind == DeviceKind::kGpu) {
    const int node = inventory_.node_of_gpu(index);
    if (IsQuarantined(Device::OfNode(inventory_.node_id(node)))) {
      return AlreadyExistsError(fmt::format("{}: its node \"{}\" is already quarantined",
                                            device.ToString(), inventory_.node_id(node).value()));
    }
    added = 1;
  } else {
    for (int gpu : inventory_.gpus_of_node(index)) {
      added += gpu_marks_[gpu] == 0;
    }
  }
  const int leaf = LeafOf(device, index);
  std::string over;
  if (gpus_out_ + added > FleetLimit()) {
    over = fmt::format("fleet budget: {} of {} GPUs out, {} more would pass the limit of {} ({}%)",
                       gpus_out_, inventory_.gpu_count(), added, FleetLimit(),
                       budget_.max_fleet_share * 100);
  } else if (leaf_out_[leaf] + added > LeafLimit(leaf)) {
    over = fmt::format(
        "leaf \"{}\" budget: {} of {} GPUs out, {} more would pass the limit of {} ({}%)",
        inventory_.leaf_name(leaf), leaf_out_[leaf], inventory_.gpus_in_leaf(leaf), added,
        LeafLimit(leaf), budget_.max_leaf_share * 100);
  }
  if (!over.empty()) {
    Log(AuditAction::kDenied, device, index, request.source, request.mode, request.actor,
        request.reason + "; denied: " + over);
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("cannot quarantine {}: {}", device.ToString(), over));
  }
  entries_.emplace(device, QuarantineEntry{device, request.mode, request.source, request.actor,
                                           request.reason, clock_.Now()});
  Mark(device, index, +1);
  Log(AuditAction::kQuarantined, device, index, request.source, request.mode, request.actor,
      request.reason);
  return Status::Ok();
}

Status QuarantineManager::Release(const Device& device, const std::string& actor,
                                  const std::string& reason) {
  if (actor.empty()) {
    return InvalidArgumentError("actor: empty");
  }
  if (reason.empty()) {
    return InvalidArgumentError("reason: empty");
  }
  const int index = inventory_.IndexOf(device);
  if (index < 0) {
    return NotFoundError(fmt::format("cannot release unknown device: {}", device.ToString()));
  }
  const auto it = entries_.find(device);
  if (it == entries_.end()) {
    return FailedPreconditionError(
        fmt::format("cannot release {}: it is not quarantined", device.ToString()));
  }
  const QuarantineEntry entry = it->second;
  entries_.erase(it);
  Mark(device, index, -1);
  Log(AuditAction::kReleased, device, index, QuarantineSource::kOperator, entry.mode, actor,
      reason);
  return Status::Ok();
}

bool QuarantineManager::AcceptsWork(const GpuUuid& gpu) const {
  const int index = inventory_.GpuIndex(gpu.value());
  return index >= 0 && gpu_marks_[index] == 0;
}

std::optional<QuarantineEntry> QuarantineManager::Find(const Device& device) const {
  const auto it = entries_.find(device);
  if (it == entries_.end()) {
    return std::nullopt;
  }
  return it->second;
}

std::vector<QuarantineEntry> QuarantineManager::Entries() const {
  std::vector<QuarantineEntry> out;
  out.reserve(entries_.size());
  for (const auto& [device, entry] : entries_) {
    out.push_back(entry);
  }
  return out;
}

}  // namespace gpufleet::reliability
