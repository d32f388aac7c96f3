// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/control/outcome_json.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/reliability/attribution.h"
#include "gpufleet/reliability/monitor.h"
#include "gpufleet/reliability/quarantine.h"
#include "gpufleet/store/state_store.h"
#include "gpufleet/wire/json_fields.h"

// The server side of the reliability library (docs/reliability.md, "The server"): an outcome
// record for every run of a job, written in the commit that ends the run; a periodic step that
// runs the attribution over the stored outcomes and quarantines the flagged devices within the
// budget; and the data of the /v1/outcomes and /v1/reports/failures routes.
namespace gpufleet::control {

using wire::Json;

struct ReliabilityOptions {
  // How often the scheduling loop analyses the outcomes and applies the quarantine rules, on the
  // server's clock; zero: every cycle.
  std::chrono::milliseconds interval{std::chrono::minutes(5)};
  // A due step is skipped while none of its inputs changed (no node, outcome, quarantine or
  // topology written since the last one) and the budget denied nothing last time, but it runs at
  // least this often: with nothing new, only the attribution window's drift moves the figures.
  // Zero: never skipped.
  std::chrono::milliseconds quiet_interval{std::chrono::hours(1)};
  reliability::AttributionOptions attribution;
  reliability::QuarantineBudget budget;
  // rules.enabled = false reports suspects and quarantines nothing.
  reliability::QuarantineRules rules;
  // A GPU that an agent's health rule drains for an XID that blames it is quarantined through
  // the same path as a suspect (budget, audit event on the node, manual release). Off, the GPU
  // takes no new work only while its agent reports it unhealthy, and its XIDs are evidence.
  bool quarantine_on_health_rule = false;

  // kInvalidArgument naming the field, e.g. `reliability.budget: max_fleet_share: 2 ...`.
  Status Validate() const;
};

// What one reliability step did.
struct ReliabilityStepResult {
  int outcomes = 0;          // records analysed
  int skipped_outcomes = 0;  // stored records that no longer fit the fleet (a node is gone)
  int suspects = 0;
  std::vector<std::string> quarantined;  // "gpu GPU-..." or "node n7" (Device::ToString)
  std::vector<std::string> denied;       // by the budget
  std::vector<std::string> released;     // releases noticed since the last step
  int preempted_runs = 0;                // runs stopped on devices drained at once
};

// Thread-safe: NoteJobChange runs on the HTTP threads and the scheduling loop, RunStep on the
// loop, the route methods on the HTTP threads. The store is the only durable state; what the
// controller keeps in memory (parsed outcomes, budget denials already logged, when it last ran)
// is a cache or a courtesy.
class ReliabilityController final : public store::CommitObserver {
 public:
  // The one writer of job document changes (ControlPlane::AddJobWrite), through which the
  // controller requeues the runs on a device it drains at once: it adds the change from `before`
  // to `after` at `version`, with `event`, to the batch (calling NoteJobChange itself).
  using JobWriter = std::function<void(const Json& before, Json& after, int64_t version,
                                       const std::string& event, store::WriteBatch& batch)>;

  // REQUIRES: `options` validate; `store`, `clock` and `wall_clock` (nullable) outlive it.
  ReliabilityController(store::StateStore& store, const Clock& clock, const WallClock* wall_clock,
                        ReliabilityOptions options, JobWriter write_job);
  ~ReliabilityController() override;
  ReliabilityController(const ReliabilityController&) = delete;
  ReliabilityController& operator=(const ReliabilityController&) = delete;

  // Notes whether a commit wrote one of the step's inputs (see ReliabilityOptions::quiet_interval).
  // A failed commit may have been written all the same: it counts as a change.
  void Committed(const store::WriteBatch& batch) override;
  void CommitFailed(const store::WriteBatch& batch) override { Committed(batch); }
  // The next due step runs whatever was noted: another server may have written the store
  // meanwhile (a server that becomes the leader again calls it).
  void ReadAllAgain();

  // Called wherever a job document changes from `before` to `after` in `batch`, before `after` is
  // written into the batch. When `before` is a run that is going (Scheduled or Running) and
  // `after` ends it (any other state, or a new attempt), adds the run's outcome record to the
  // batch, so that it commits with the job's change or not at all; otherwise stamps the run's
  // start in `after` ("run") the first time its job changes. Reads the node documents for the
  // GPUs' UUIDs and health reasons. A record that cannot be built is left out (the job's change
  // never fails for it).
  void NoteJobChange(const Json& before, Json& after, store::WriteBatch& batch);

  // Called where the scheduling cycle places a job (its document is Scheduled with its new
  // attempt): stamps the run's start in the document ("run"), so that a run that ends before
  // its first task report still has its duration. No IO.
  void NoteRunStarted(Json& job) const;

  // RunStep when `interval` has passed since the last one (or there was none) and its inputs
  // changed or `quiet_interval` passed since the last one that ran. Returns nullopt when it did
  // not run.
  std::optional<Result<ReliabilityStepResult>> RunIfDue();

  // One step: notices releases of quarantined devices (their evidence starts again from then),
  // records operators' quarantines, applies the health-rule path when enabled, runs the
  // attribution and quarantines each flagged device still in service within the budget: the
  // node document's GPUs become Quarantined and the node's event log gets the decision with its
  // evidence, in one commit with the device's document in kind "quarantines". A device drained
  // at once has its running jobs requeued (exit reason preempted). A denial by the budget is
  // logged on the node once.
  Result<ReliabilityStepResult> RunStep();

  // POST /v1/outcomes by `actor`: sets the exit reason of a run that has ended and adds the
  // report's XIDs and health events to its record. kNotFound for an unknown job (`outcome for
  // unknown job "j7"`) or a run with no stored outcome; kInvalidArgument for a malformed body,
  // an attempt the job never had, or evidence on devices the run did not hold (naming the field);
  // kFailedPrecondition while the run is still going. Nothing changes on error. Returns the
  // stored outcome.
  Result<Json> ReportOutcome(std::string_view actor, std::string_view body);

  // GET /v1/outcomes[?job=NAME]: {"items": [...]}, by name.
  Result<Json> ListOutcomes(std::string_view job);

  // GET /v1/reports/failures: the attribution over the stored outcomes now, without changing
  // anything: counts, fleet rates, the concentration of failed runs on the flagged devices with
  // the sentence "these k GPUs ...", the ranked suspects and runners-up with their evidence, and
  // the quarantined devices.
  Result<Json> FailureReport();

  // An operator's quarantine (`release` false) or release of the GPUs of node `node` (every GPU,
  // or the one at index `gpu`), added to `batch` beside the update of `node_doc`, which it
  // changes too: each GPU's health and "quarantine_reason", and each GPU's document in kind
  // "quarantines" (in force with `actor` and `reason`, or released). The failure report and the
  // node's page then say the same from the same commit, not from the next step. kInvalidArgument
  // for a GPU the node lacks (naming it); on error nothing is added to `batch` (drop
  // `node_doc`).
  Status AddOperatorQuarantine(Json& node_doc, std::string_view node, std::optional<int64_t> gpu,
                               bool release, std::string_view actor, std::string_view reason,
                               store::WriteBatch& batch);

  const ReliabilityOptions& options() const { return options_; }

 private:
  struct Fleet;
  struct Analysis;

  int64_t NowNanos() const;
  Result<Fleet> LoadFleet();
  Result<std::vector<reliability::OutcomeRecord>> LoadOutcomes();
  Result<std::unique_ptr<Analysis>> Analyse();
  Result<StoredOutcome> BuildOutcome(const Json& before, const Json& after);
  Json XidBaseline(const Json& job);
  Status NoticeQuarantineChanges(const Fleet& fleet, ReliabilityStepResult& result);
  Status ApplyQuarantine(const Analysis& analysis, const reliability::AuditEntry& entry);
  Status LogDenial(const Analysis& analysis, const reliability::AuditEntry& entry);
  Result<int> PreemptRunsOn(const Analysis& analysis, const reliability::Device& device);

  store::StateStore& store_;
  const Clock& clock_;
  const WallClock* wall_clock_;
  const ReliabilityOptions options_;
  const JobWriter write_job_;

  struct CachedOutcome {
    int64_t version = 0;
    std::optional<reliability::OutcomeRecord> record;  // nullopt: it did not parse
  };
  std::mutex mu_;
  std::optional<MonoTime> last_step_;              // guarded by mu_
  std::optional<MonoTime> last_run_;               // a step that ran; guarded by mu_
  bool inputs_changed_ = true;                     // guarded by mu_
  bool last_denied_ = false;                       // guarded by mu_
  std::map<std::string, CachedOutcome> outcomes_;  // guarded by mu_
  std::set<reliability::Device> denials_logged_;   // guarded by mu_

  // The nodes as LoadFleet last parsed them, by name, with their store revisions: a node
  // document is parsed again only when it was written.
  struct ParsedNodes;
  std::mutex fleet_mu_;
  std::unique_ptr<ParsedNodes> parsed_nodes_;  // guarded by fleet_mu_
};

}  // namespace gpufleet::control
