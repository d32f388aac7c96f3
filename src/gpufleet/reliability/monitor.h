// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/reliability/attribution.h"
#include "gpufleet/reliability/inventory.h"
#include "gpufleet/reliability/quarantine.h"

// The reliability loop in one place: outcomes in, attribution, quarantine of the flagged
// devices by rule, release with a clean slate. The server and the simulator drive it the same way.
namespace gpufleet::reliability {

// How flagged suspects are quarantined.
struct QuarantineRules {
  // False: suspects are reported, never quarantined (a dry run).
  bool enabled = true;
  DrainMode default_mode = DrainMode::kAfterJob;
  // For a suspect whose evidence holds an XID the catalog drains at once (xid_catalog.h).
  DrainMode drain_now_xid_mode = DrainMode::kNow;
};

// What Evaluate did about one flagged suspect that was still in service.
struct QuarantineDecision {
  Device device;
  DrainMode mode = DrainMode::kAfterJob;
  Status status;  // ok: quarantined; kResourceExhausted: denied by the budget
};

struct Evaluation {
  AttributionReport report;
  std::vector<QuarantineDecision> decisions;  // in suspect rank order
};

// Owns an AttributionEngine and a QuarantineManager over one inventory and clock. Pure: no IO.
// Not thread-safe.
class ReliabilityMonitor {
 public:
  // kInvalidArgument for bad options or budget. REQUIRES: `inventory` and `clock` outlive it.
  static Result<ReliabilityMonitor> Create(const FleetInventory& inventory, const Clock& clock,
                                           const AttributionOptions& attribution,
                                           const QuarantineBudget& budget,
                                           const QuarantineRules& rules);

  AttributionEngine& engine() { return engine_; }
  const AttributionEngine& engine() const { return engine_; }
  const QuarantineManager& quarantine() const { return quarantine_; }

  // Runs the attribution and, when the rules are enabled, quarantines each flagged suspect
  // that is still in service (a GPU on a quarantined node is), best-ranked first, with the
  // rules' drain mode, as long as the budget allows.
  Evaluation Evaluate();

  // A quarantine from elsewhere (an operator, a health rule); see QuarantineManager::Quarantine.
  Status Quarantine(const QuarantineRequest& request) { return quarantine_.Quarantine(request); }

  // The agent's health rule for an XID a GPU reported: quarantines the GPU with the catalog's
  // drain mode (source kHealthRule). kInvalidArgument, naming the XID, for an XID the catalog
  // drains nothing for (an application fault or one to monitor); else as Quarantine.
  Status QuarantineForXid(const GpuUuid& gpu, int xid, const std::string& actor);

  // Releases the device and forgets the evidence against it (a released device starts clean).
  // Errors as QuarantineManager::Release, with nothing changed.
  Status Release(const Device& device, const std::string& actor, const std::string& reason);

 private:
  ReliabilityMonitor(AttributionEngine engine, QuarantineManager quarantine,
                     const QuarantineRules& rules)
      : engine_(std::move(engine)), quarantine_(std::move(quarantine)), rules_(rules) {}

  AttributionEngine engine_;
  QuarantineManager quarantine_;
  QuarantineRules rules_;
};

// One line of evidence for the audit log: "5 failures (3 named it) in 41 runs, 310.2 GPU-h,
// expected 0.21, p=1.2e-08, q=3.4e-05, XIDs 48x1 79x2, nvlink-down x1".
std::string EvidenceSummary(const DeviceEvidence& evidence);

// The concentration in one sentence, as the server's failure report and the simulator's say it:
// "these 97 GPUs (0.97% of the fleet) were involved in 46.1% of failed jobs; quarantining them
// would have avoided 412 failures".
std::string ConcentrationSummary(const FailureConcentration& concentration);

}  // namespace gpufleet::reliability
