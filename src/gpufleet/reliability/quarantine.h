// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/ids.h"
#include "gpufleet/core/status.h"
#include "gpufleet/reliability/inventory.h"

// The quarantine policy: which devices take no new work, within a budget, with an audit log.
namespace gpufleet::reliability {

// What happens to the job running on a device when it is quarantined.
enum class DrainMode {
  kAfterJob,  // the running job finishes; nothing new starts
  kNow,       // the running job is stopped (and requeued) at once
};
const char* DrainModeName(DrainMode mode);  // "after-job", "now"

enum class QuarantineSource { kAttribution, kHealthRule, kOperator };
const char* QuarantineSourceName(QuarantineSource source);  // "attribution", ...

struct QuarantineRequest {
  Device device;
  DrainMode mode = DrainMode::kAfterJob;
  QuarantineSource source = QuarantineSource::kAttribution;
  std::string actor;   // who asks, e.g. "attribution", "health-rule", "operator:alice"
  std::string reason;  // the evidence in one line
};

// A device out of service.
struct QuarantineEntry {
  Device device;
  DrainMode mode = DrainMode::kAfterJob;
  QuarantineSource source = QuarantineSource::kAttribution;
  std::string actor;
  std::string reason;
  MonoTime since;
};

enum class AuditAction { kQuarantined, kDenied, kReleased };
const char* AuditActionName(AuditAction action);  // "quarantined", "denied", "released"

// One decision of the policy. `gpus_out` and `leaf_gpus_out` are the GPUs out of service in the
// fleet and in the device's leaf after the decision.
struct AuditEntry {
  int64_t sequence = 0;  // 1, 2, ... in order
  MonoTime time;
  AuditAction action = AuditAction::kQuarantined;
  Device device;
  std::string leaf;
  QuarantineSource source = QuarantineSource::kAttribution;
  DrainMode mode = DrainMode::kAfterJob;
  std::string actor;
  std::string reason;
  int gpus_out = 0;
  int leaf_gpus_out = 0;
};

// At most these shares of the fleet's GPUs, and of each leaf's GPUs, may be out of service at
// once (rounded down: a leaf of 256 GPUs at 0.05 allows 12). A node counts all its GPUs.
struct QuarantineBudget {
  double max_fleet_share = 0.02;
  double max_leaf_share = 0.05;

  // kInvalidArgument naming the field for a share outside [0, 1].
  Status Validate() const;
};

// Keeps the set of quarantined GPUs and nodes under the budget and logs every decision. Pure: no
// IO; audit times come from the injected clock. Not thread-safe.
class QuarantineManager {
 public:
  // kInvalidArgument for a bad budget. REQUIRES: `inventory` and `clock` outlive the manager.
  static Result<QuarantineManager> Create(const FleetInventory& inventory, const Clock& clock,
                                          QuarantineBudget budget);

  // Takes `request.device` out of service from now: no new work; the caller drains its running
  // job per `request.mode`. Errors, with nothing changed and nothing logged: kInvalidArgument for
  // an empty actor or reason; kNotFound for a device the inventory does not know;
  // kAlreadyExists when the device, or the node of a GPU, is quarantined already. Over the budget:
  // kResourceExhausted naming the limit; the denial is logged, nothing else changes.
  Status Quarantine(const QuarantineRequest& request);

  // Puts a quarantined device back into service (a node's own GPU quarantines stay). Errors,
  // with nothing changed and nothing logged: kInvalidArgument for an empty actor or reason;
  // kNotFound for a device the inventory does not know; kFailedPrecondition for a known device
  // that is not quarantined.
  Status Release(const Device& device, const std::string& actor, const std::string& reason);

  // The device itself is quarantined (not counting a GPU's node).
  bool IsQuarantined(const Device& device) const { return entries_.count(device) > 0; }
  // False when the GPU or its node is quarantined, or the GPU is unknown.
  bool AcceptsWork(const GpuUuid& gpu) const;
  std::optional<QuarantineEntry> Find(const Device& device) const;
  // Every quarantined device, ordered by device.
  std::vector<QuarantineEntry> Entries() const;

  int gpus_out() const { return gpus_out_; }
  int GpusOutInLeaf(int leaf) const { return leaf_out_[leaf]; }
  int FleetLimit() const;
  int LeafLimit(int leaf) const;
  const std::vector<AuditEntry>& audit_log() const { return audit_; }

 private:
  QuarantineManager(const FleetInventory& inventory, const Clock& clock, QuarantineBudget budget);

  // Adds `delta` (+1 or -1) to the out-of-service marks of the device's GPUs.
  void Mark(const Device& device, int index, int delta);
  int LeafOf(const Device& device, int index) const;
  void Log(AuditAction action, const Device& device, int index, QuarantineSource source,
           DrainMode mode, const std::string& actor, const std::string& reason);

  const FleetInventory& inventory_;
  const Clock& clock_;
  QuarantineBudget budget_;
  std::map<Device, QuarantineEntry> entries_;
  std::vector<int> gpu_marks_;  // per GPU: quarantined itself (+1), its node quarantined (+1)
  std::vector<int> leaf_out_;   // GPUs out of service per leaf
  int gpus_out_ = 0;
  std::vector<AuditEntry> audit_;
};

}  // namespace gpufleet::reliability
