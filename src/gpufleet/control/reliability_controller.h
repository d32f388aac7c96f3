// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
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
// budget, or on nodes that run diagnostics drives the loop ("The loop"); and the data of the
// /v1/outcomes and /v1/reports/failures routes.
namespace gpufleet::control {

using wire::Json;

// How the loop empties a suspect GPU of its running work before the diagnostic (docs/
// reliability.md, "The loop"): the run ends at once (requeued, expedited); the run goes on to its
// end and nothing new starts on the GPU; or the run gets a checkpoint notice and ends once it
// reports a checkpoint or the timeout passes.
enum class LoopDrain { kNow, kAfterJob, kAfterTimeout };
// "now", "after-job", "after-timeout"
const char* LoopDrainName(LoopDrain drain);
std::optional<LoopDrain> ParseLoopDrain(std::string_view name);

// What the admin's hook for one remediation action gets (`gpufleet server --remediation-hook`).
struct RemediationRequest {
  std::string action;  // one of kRemediationActions
  std::string node;
  int64_t gpu = -1;  // its index on the node
  std::string gpu_uuid;
  std::string reason;  // the diagnostic's evidence
};
inline constexpr std::string_view kRemediationActions[] = {"reset-gpu", "reboot-node", "ticket"};
// Starts the hook configured for the request's action and returns at once, with what it did
// ("hook started", "no hook for reboot-node"): a hook never holds up the scheduling cycle.
using RemediationHook = std::function<std::string(const RemediationRequest&)>;

// The closed loop on nodes whose agent runs diagnostics (labelled wire::kDiagnosticsLabel):
// suspect, drain, diagnose, then quarantine with a remediation or readmit. Nodes without the label
// keep the attribution's direct quarantine. Mirrors sim/failure_sim.h's DiagnosticsModel.
struct HealthLoopOptions {
  bool enabled = true;
  std::string diagnostic_kind = "builtin";  // or "command": the agent's site command
  // The looser suspect threshold than the attribution's flag: a GPU with at least this many
  // failures at p <= suspect_max_p is diagnosed; so is one a failure's XID names, and a flagged
  // one. Each once per new failure.
  int suspect_min_failures = 2;
  double suspect_max_p = 1e-3;
  LoopDrain drain = LoopDrain::kAfterTimeout;
  std::chrono::seconds drain_timeout{std::chrono::minutes(60)};
  // After this many remediations of one GPU within the window it needs a person: no further
  // automatic action.
  int max_remediations = 3;
  std::chrono::seconds remediation_window{std::chrono::hours(24 * 7)};
  // The circuit breaker: while more than this share of the fleet's GPUs went out (quarantined or
  // held for a diagnostic) within the window, nothing is drained or quarantined automatically.
  double breaker_share = 0.5;
  std::chrono::seconds breaker_window{std::chrono::minutes(5)};
  RemediationHook remediate;  // null: remediations are recorded, nothing is run

  Status Validate() const;
};

struct ReliabilityOptions {
  // How often the scheduling loop analyses the outcomes and applies the quarantine rules, on the
  // server's clock; zero: every cycle.
  std::chrono::milliseconds interval{std::chrono::minutes(5)};
  // A due step is skipped while none of its inputs changed (no node, outcome, quarantine or
  // topology written since the last one) and the last one left nothing that time moves on (a
  // budget denial, an open breaker, a diagnostic's hold, a lost node), but it runs at
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
  HealthLoopOptions loop;

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
  // The loop's steps: diagnostics asked for, their results acted on, holds of lost nodes dropped.
  std::vector<std::string> diagnosed;
  std::vector<std::string> readmitted;
  std::vector<std::string> needs_person;
  int noticed_runs = 0;  // runs given a checkpoint notice for a diagnostic
  bool breaker_open = false;
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
  // changed, the last step left work that time moves on, or `quiet_interval` passed since the
  // last one that ran. Returns nullopt when it did not run.
  // `lost_nodes`: the nodes whose tasks are surely gone (NodeLeaseController::LostNodes); a
  // diagnostic on one of them is over.
  std::optional<Result<ReliabilityStepResult>> RunIfDue(
      const std::set<std::string>& lost_nodes = {});

  // One step: notices releases of quarantined devices (their evidence starts again from then),
  // records operators' quarantines, applies the health-rule path when enabled, runs the
  // attribution and quarantines each flagged device still in service within the budget: the
  // node document's GPUs become Quarantined and the node's event log gets the decision with its
  // evidence, in one commit with the device's document in kind "quarantines". A device drained
  // at once has its running jobs requeued (exit reason preempted). A denial by the budget is
  // logged on the node once. With the loop (HealthLoopOptions), the circuit breaker is updated
  // first and the diagnostics' results are acted on; a flagged GPU of a node that runs
  // diagnostics is diagnosed instead of quarantined, and so are the looser suspects.
  Result<ReliabilityStepResult> RunStep(const std::set<std::string>& lost_nodes = {});

  // Whether the loop's circuit breaker was open at the last step (for /metrics).
  bool breaker_open() const { return breaker_open_.load(); }

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
  // Ends the runs on `device` (requeued, expedited) with `reason`, or with `notice` set gives
  // each Running one a checkpoint notice instead (its deadline `notice_deadline_ns`).
  Result<int> PreemptRunsOn(const Analysis& analysis, const reliability::Device& device,
                            const std::string& reason,
                            std::optional<int64_t> notice_deadline_ns = std::nullopt);

  // ---- the loop (HealthLoopOptions) ----
  struct Breaker;
  Result<Breaker> UpdateBreaker(const Analysis& analysis);
  Status ActOnDiagnostics(Analysis& analysis, const std::set<std::string>& lost_nodes,
                          bool breaker_open, ReliabilityStepResult& result);
  // Asks a diagnostic of each suspect in the loop, at most `room` of them.
  Status RequestDiagnostics(Analysis& analysis, const reliability::Evaluation& evaluation, int room,
                            ReliabilityStepResult& result);
  Status RequestDiagnostic(Analysis& analysis, size_t gpu, const std::string& reason, int failures,
                           ReliabilityStepResult& result);
  Status Remediate(const Analysis& analysis, size_t gpu, const std::string& reason,
                   ReliabilityStepResult& result);
  // Changes the node document's entry of GPU `index` of `node` with `change` (false: nothing to
  // write), and appends `event` to the node and to the GPU's document in kind "quarantines",
  // which `record` changes (created when missing).
  Status WriteLoopStep(const std::string& node, int64_t index, const std::string& device_doc,
                       const std::function<bool(Json& gpu)>& change,
                       const std::function<void(Json& record)>& record, const std::string& event);
  // Whether the loop acts on this GPU of the fleet (its node runs diagnostics).
  bool InLoop(const Analysis& analysis, size_t gpu) const;

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
  bool last_busy_ = false;                         // guarded by mu_
  std::map<std::string, CachedOutcome> outcomes_;  // guarded by mu_
  std::set<reliability::Device> denials_logged_;   // guarded by mu_
  std::atomic<bool> breaker_open_{false};

  // The nodes as LoadFleet last parsed them, by name, with their store revisions: a node
  // document is parsed again only when it was written.
  struct ParsedNodes;
  std::mutex fleet_mu_;
  std::unique_ptr<ParsedNodes> parsed_nodes_;  // guarded by fleet_mu_
};

}  // namespace gpufleet::control
