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
#include <utility>
#include <vector>

#include "gpufleet/control/backfill_step.h"
#include "gpufleet/control/deployment_controller.h"
#include "gpufleet/control/idle_reclaim_controller.h"
#include "gpufleet/control/lifecycle_controller.h"
#include "gpufleet/control/mig_layout_controller.h"
#include "gpufleet/control/node_lease_controller.h"
#include "gpufleet/control/parsed_documents.h"
#include "gpufleet/control/principal.h"
#include "gpufleet/control/queue_controller.h"
#include "gpufleet/control/reliability_controller.h"
#include "gpufleet/control/retention_controller.h"
#include "gpufleet/control/task_logs.h"
#include "gpufleet/control/usage_ledger.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/status.h"
#include "gpufleet/policy/idle_reclaim.h"
#include "gpufleet/policy/never_fits.h"
#include "gpufleet/policy/workload_history.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/store/state_store.h"
#include "gpufleet/wire/agent_protocol.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::fabric {
class Fabric;
}  // namespace gpufleet::fabric

namespace gpufleet::control {

class SchedulingView;
struct ViewJob;

// The text of the job documents heartbeats keep parsed (ParsedDocuments; the parsed form takes a
// few times more). Past it, the documents no heartbeat used lately are parsed again when needed.
inline constexpr size_t kParsedJobsBudgetBytes = size_t{64} << 20;

// How registration issues and takes back a node's own credential: the server's bearer tokens
// (api/auth.h). The control plane holds a token only to hand it to the agent once.
class NodeCredentials {
 public:
  virtual ~NodeCredentials() = default;
  struct Issued {
    std::string token;  // what the agent sends from now on
    std::string id;     // what the node document records (never the token itself)
  };
  // A new credential that acts for `node` alone (an agent that joined with a join token).
  virtual Result<Issued> Issue(const std::string& node) = 0;
  virtual Status Revoke(const std::string& token) = 0;
  // Revokes the credential `id` names (Issued::id); kNotFound when there is none.
  virtual Status RevokeById(const std::string& id) = 0;
  // Whether `node` has a credential of its own (an admin may make one before it registers).
  virtual Result<bool> Exists(const std::string& node) = 0;
};

// What the control plane is made of besides its store and clocks (api::ApiServer::Options
// documents each field; the server copies its own into these).
struct ControlPlaneOptions {
  // Must outlive the control plane.
  store::StateStore& store;
  const GpuCatalog& catalog;
  const Clock& clock;
  // Stamps stop times and usage records (RFC 3339, Unix nanoseconds); null: the monotonic clock.
  const WallClock* wall_clock = nullptr;
  std::string policy = "gpufleet";
  policy::WorkloadHistoryOptions workload_history;
  Duration target_workload_refresh = std::chrono::minutes(1);
  std::shared_ptr<const fabric::Fabric> fabric;
  // Cycle n places with Random(seed + n).
  uint64_t seed = 42;
  // Agents are told to heartbeat this often; a node silent for node_timeout loses its lease.
  std::chrono::milliseconds heartbeat_interval{10000};
  std::chrono::milliseconds node_timeout{40000};
  std::chrono::milliseconds stop_grace{30000};
  Duration usage_flush_interval = std::chrono::minutes(5);
  std::chrono::seconds usage_half_life{std::chrono::hours(24 * 7)};
  std::chrono::seconds min_runtime_before_preemption{60};
  std::chrono::seconds max_checkpoint_grace{300};  // QueueController::Options'
  ReliabilityOptions reliability;
  std::optional<policy::IdleReclaimOptions> idle_reclaim;
  std::chrono::seconds mig_apply_timeout{120};
  std::chrono::seconds gang_start_timeout{300};
  std::chrono::seconds mig_replan_delay{600};
  Duration retain_finished{0};
  // How the deployments step submits and cancels replicas (the server's own submit and cancel);
  // null: deployments are not stepped. Must outlive the control plane.
  ReplicaJobs* replica_jobs = nullptr;
  // Issues the credential of a node that registers with a join token; null: join tokens cannot
  // register. Must outlive the control plane.
  NodeCredentials* node_credentials = nullptr;
  // Called with the seconds of each image pull a task report gave (for /metrics); may be empty.
  std::function<void(double seconds)> observe_image_pull;
};

// Fleet gauges taken from the view at the end of each cycle, so that a scrape of /metrics costs
// O(queues + models) and never waits for the store or a cycle.
struct FleetGauges {
  std::map<std::string, int64_t> pending_by_queue;
  std::map<std::string, int64_t> allocated_milli_by_model;
  std::map<std::string, int64_t> gpus_by_model;
  // The target workload's shapes and where they came from ("history", "pending", "none"); empty
  // source: the policy needs no target workload.
  size_t target_shapes = 0;
  std::string target_source;
};

// One scheduling cycle as it went: the jobs it scheduled (or why it stopped), its wall time and
// the wall time of each step it reached, in order ("read", "node-leases", "run-ends", ...).
struct CycleReport {
  Result<int> scheduled = 0;
  Duration elapsed{0};
  std::vector<std::pair<std::string_view, Duration>> steps;
};

// The control plane without its HTTP (docs/architecture.md, "Inside the control plane"): the
// scheduling cycle, the controllers it runs, the agent sessions and the one writer of job
// documents, over a store, a clock and a seed. api::ApiServer serves it. Thread-safe: cycles are
// serialised by cycle_mutex(); the agent sessions, the job writer and the leases may be used from
// any thread.
class ControlPlane {
 public:
  // kInvalidArgument / kNotFound for bad options or an unknown policy.
  static Result<std::unique_ptr<ControlPlane>> Create(ControlPlaneOptions options);
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;
  ~ControlPlane();

  const ControlPlaneOptions& options() const { return options_; }

  // ---- the cycle ----
  // One scheduling cycle (takes cycle_mutex()): run ends, queues, idle reclaim, deployments,
  // retention, usage, then places Pending jobs in queue order and commits each placement with a
  // compare-and-set update, then publishes; then the reliability step when it is due.
  CycleReport RunCycle();
  std::vector<std::pair<std::string_view, Duration>> LastCycleSteps();
  // Taking the lead (REQUIRES: cycle_mutex() held): every node gets a full lease from now, and
  // the view, the GPU owners and the agents' index are read from the store afresh.
  Status Restart();
  // The writes a control plane makes before it first serves (at start, or when it takes the
  // lead): the queue "default" if it is missing, and the move of jobs and deployments an older
  // server stored under a bare NAME, with their events, to their TEAM/NAME key.
  Status PrepareStore();
  // Saves the queues' usage now (REQUIRES: cycle_mutex() held).
  void SaveQueueUsage() { queues_.SaveUsageNow(); }
  // The gauges the last cycle published.
  FleetGauges Gauges();
  // The jobs holding placements in the view now (takes cycle_mutex()).
  int64_t RunningJobs();

  // The state of the cycle, for the requests that read or adjust it between cycles (explain,
  // deployment updates, strict submissions): REQUIRES cycle_mutex() held.
  std::mutex& cycle_mutex() { return cycle_mu_; }
  SchedulingView& view() { return *view_; }
  QueueController& queues() { return queues_; }
  const BackfillStep& backfill() const { return backfill_; }
  scheduler::Scheduler& scheduler() { return *scheduler_; }
  DeploymentController& deployments() { return deployments_; }
  uint64_t cycle_count() const { return cycle_count_; }
  // Whether any node of the view's fleet, empty, could hold `job` (an elastic job at its minimum
  // size; policy::CheckNeverFits), with
  // the shapes found to fit remembered until the fleet's shape moves: submissions at 1,000 a
  // second come in a few shapes. REQUIRES cycle_mutex() held and the view refreshed.
  std::optional<policy::NeverFits> CheckNeverFits(const Job& job);

  // Thread-safe parts.
  NodeLeaseController& leases() { return leases_; }
  ReliabilityController& reliability() { return *reliability_; }
  // The queues as last published (thread-safe).
  std::map<std::string, policy::QueueStatus> QueueStatuses() { return queues_.Statuses(); }

  // ---- the one job writer ----
  // Every change of a job document is written through here: the outcome hook
  // (ReliabilityController::NoteJobChange), the run's usage stamp (and its usage record when the
  // change ends it), the compare-and-set update at `version` and the event (none when empty).
  // Returns the document as written.
  std::string AddJobWrite(const Json& before, Json& after, int64_t version,
                          const std::string& event, store::WriteBatch& batch);
  // Commits what a controller decided, each job's write on its own (AddJobWrite): whether
  // anything was written. A write the store refuses fails alone (logged; the next cycle decides
  // again); a store that is down (kUnavailable) ends the cycle.
  Result<bool> CommitJobWrites(std::vector<JobWrite> writes);
  // When a stop starts, RFC 3339 (empty without a wall clock).
  std::string NowText() const;
  // The time usage records carry: wall-clock Unix nanoseconds (the monotonic clock without one).
  int64_t UsageNowNanos() const;
  // The busy time of `run` so far: its stored figure, or more when heartbeats credited it since.
  int64_t RunBusy(const std::string& run, int64_t stored_busy) {
    return usage_meter_.Busy(run, stored_busy);
  }

  // ---- agent sessions (control_plane_agents.cc, docs/agent.md) ----
  // Adds the nodes of `cluster` that the store does not hold yet (by name) and records the
  // cluster's topology levels on first use. kInvalidArgument if the cluster does not validate or
  // its levels differ from the recorded ones. Returns how many nodes were added.
  Result<int> RegisterNodes(const Cluster& cluster);
  // Register and heartbeat (`body` as the agent sent it) answer the node's desired tasks.
  Result<wire::AgentReply> RegisterAgent(const Principal& who, std::string_view body);
  Result<wire::AgentReply> AgentHeartbeat(const Principal& who, std::string_view node,
                                          std::string_view body);
  // POST /v1/agents/NODE/provenance (docs/provenance.md): stores the agent's record of a run it
  // started, with the node and the job's provenance map and labels, under kProvenanceKind and
  // the task id, once: an identical second report is answered with the stored record ("created"
  // false), a different one is kAlreadyExists naming the fields that differ. kNotFound for a job
  // or an attempt or task the job does not have, kPermissionDenied for a task placed on another
  // node (or a credential of another node), kInvalidArgument for a bad report or an image that
  // is not the task's.
  Result<Json> RecordProvenance(const Principal& who, std::string_view node, std::string_view body);
  // POST /v1/agents/NODE/logs (docs/agent.md, "Task logs"): keeps the tail of a task's log in
  // memory (TaskLogCache). Only for a run the node itself recorded (its provenance record names
  // the node): kNotFound before that record, kPermissionDenied for another node's run or
  // credential, kInvalidArgument for a bad report.
  Status RecordTaskLog(const Principal& who, std::string_view node, std::string_view body);
  // The runs of job `job_key` (TEAM/NAME or NAME) by their provenance records, oldest attempt
  // first, each with the log tail kept for it, if any.
  struct TaskRunLog {
    std::string task_id;
    std::string task;
    int64_t attempt = 0;
    std::string node;
    std::optional<TaskLogCache::Entry> log;
  };
  Result<std::vector<TaskRunLog>> TaskRunLogs(const std::string& job_key);
  // A deleted node: its GPUs belong to no node and its lease is forgotten.
  void ForgetNode(const std::string& node);
  // The sum over the fleet's reporting GPUs of their utilization, in milli-GPUs.
  int64_t BusyMilli();
  // The agents' latest utilization per (node, GPU index).
  std::map<std::pair<std::string, int>, int> GpuUtilization();
  // The stored nodes the scheduling view leaves out, with why (published each cycle).
  std::map<std::string, std::string> ExcludedNodes();
  // How many agents speak each protocol version ("1.1" -> count), by the last registration or
  // heartbeat each node's agent made to this control plane (/metrics, docs/operations.md).
  std::map<std::string, int64_t> AgentsByProtocol();

 private:
  ControlPlane(ControlPlaneOptions options, std::unique_ptr<scheduler::Scheduler> scheduler);

  // An agent's credential acts for one node: a node credential for its node only, a join token
  // only for a node that has no credential yet. kPermissionDenied naming both otherwise.
  Status CheckNodeCredential(const Principal& who, const std::string& node);
  // The first heartbeat with a node credential made at a join token's registration claims it
  // (clears kCredentialUnclaimed): from then on the join token cannot register the node again.
  Status ClaimNodeCredential(const Principal& who);
  // A GPU UUID belongs to one node: kAlreadyExists naming the other node; otherwise records the
  // node's UUIDs as its own.
  Status ClaimGpuUuids(const Node& node);
  // Records the protocol `node`'s agent spoke in a request this control plane served.
  void NoteAgentProtocol(const std::string& node, wire::ProtocolVersion protocol);
  // Drops `node`'s GPUs from gpu_owners_. REQUIRES: agents_mu_ held.
  void ForgetGpuOwnersLocked(const std::string& node);
  // Adds to `batch` the end of every run on `node` that its re-registration breaks (a GPU of its
  // placements gone or replaced, CPU or memory shrunk under it): requeued or failed as the job
  // asks, through Stopping.
  Status EndRunsBrokenByReregistration(const std::string& node, const Json& before,
                                       const Json& after, store::WriteBatch& batch);
  Result<wire::AgentReply> ProcessHeartbeat(const std::string& node,
                                            const wire::HeartbeatRequest& request,
                                            bool gpus_applied);
  // The milliseconds since `node`'s previous heartbeat (at most node_timeout; 0 for the first
  // this control plane sees), and the credit of one heartbeat's GPU utilization to `job`'s run.
  int64_t UsageHeartbeatInterval(const std::string& node);
  void CreditBusy(const Json& job, const std::string& node,
                  const std::map<int64_t, int>& utilization_pct, int64_t interval_ms);
  // The jobs that may hold resources on `node` (a superset: jobs are indexed before their
  // placement commits); nullopt until the first cycle has built the index.
  std::optional<std::set<std::string>> ActiveJobsOn(const std::string& node);
  // A heartbeat's report replaces the node's GPU utilization (by GPU index).
  void RecordGpuUtilization(const std::string& node, const std::map<int64_t, int>& percent);

  Result<int> RunCycleLocked();
  // Ends the cycle's current step, named `step` (a literal): its wall time since the last mark.
  void MarkCycleStep(std::string_view step);

  // What one cycle writes for one job: its new reason, or its placements (applied to the view's
  // snapshot, and given back if the write fails).
  struct CycleWrite {
    const std::string* name = nullptr;
    ViewJob* job = nullptr;
    store::WriteBatch batch;
    std::string data;
    std::vector<scheduler::TaskPlacement> placed;
    std::set<std::string> nodes;
  };
  // Commits the cycle's writes; returns the number of jobs scheduled. A job whose own write the
  // store refuses fails alone (FailUnstorableJob); the others are committed.
  Result<int> CommitCycleWrites(std::vector<CycleWrite>& writes);
  // Takes back what an uncommitted write applied to the view (its placements, the job's
  // in-memory fields).
  void UndoCycleWrite(CycleWrite& write);
  void FailUnstorableJob(const std::string& name, const ViewJob& job, const Status& why);
  // Commits one job's write in the cycle: true when written, false when the job changed under us
  // (the view reads it again), the store's error otherwise.
  Result<bool> CommitCycleJobWrite(const std::string& name, const store::WriteBatch& batch);

  // The steps (control_plane_steps.cc). Each returns whether it wrote anything where the cycle
  // refreshes the view after it.
  // The runs of jobs on NotReady nodes end (requeued or failed).
  Result<bool> EndRunsOnNotReadyNodes();
  // Tasks on nodes that run no agent, and tasks on nodes whose lease expired more than
  // stop_grace ago, are gone; a Stopping job whose every task is gone takes the state its ending
  // asked for.
  Result<bool> FinishStoppingRuns();
  // MIG layouts (MigLayoutController): new layouts for pending MIG jobs (the view refreshed when
  // one was written), and the requeue of jobs that waited too long for their instances,
  // committed in one batch with the nodes' dropped layouts.
  Status PlanMigLayoutsForPendingJobs();
  Result<bool> RequeueJobsWaitingForMigInstances();
  // Requeues (through Stopping) the Scheduled gangs partly started for gang_start_timeout.
  Result<bool> RequeuePartlyStartedGangs();
  // The queue part (QueueController): commits the events of ended reservations, and tries
  // preemption for a job that does not fit: the victims' stop is committed in one batch with the
  // preemptor's event; returns the preemptor's new pending reason, nullopt when preemption
  // cannot help.
  void UpdateQueues();
  Result<std::optional<std::string>> TryPreemption(const std::string& name, const Job& preemptor,
                                                   const std::string& queue, Random& random);
  Result<bool> RequeuePreemptedJobs();
  // Ends the runs whose preemption notice is done waiting (control::EndNoticedRuns).
  Result<bool> EndNoticedRuns();
  // After the cycle's placements: a running elastic job below its maximum that would run larger
  // on the GPUs idle now (its own counted free), with no job of its priority or higher waiting
  // and no GPUs reserved for a preemptor, stops (after its notice) to be placed again at the
  // larger size (docs/job-spec.md, "Elastic jobs").
  Status GrowElasticJobs(Random& random);
  // Idle reclaim (IdleReclaimController): warnings and reclaims of idle interactive jobs, the
  // view refreshed so that this cycle places the waiting jobs.
  Status ReclaimIdleJobs();
  // The agents' latest reports for the nodes of the view's Running jobs.
  GpuUtilizationReports ReportsForRunningJobs();
  // The DeploymentController step when it is due.
  Status RunDeploymentsIfDue();
  // The rate-limited reliability step, its decisions logged.
  void RunReliabilityIfDue();
  // Writes the busy time counted since into the documents of running jobs, when
  // usage_flush_interval has passed. Returns whether anything was written.
  Result<bool> FlushUsageIfDue();
  // Writes the run's busy time into `after`, and adds the run's usage record to `batch` when the
  // change ends it.
  void NoteUsageChange(const Json& before, Json& after, store::WriteBatch& batch);
  // Remakes the scheduler when the target workload is due for a rebuild and has changed: from
  // the history, else from the first pending jobs in queue order.
  Status RefreshTargetWorkload(const std::vector<PendingEntry>& pending);
  // Publishes the view's newly excluded nodes (their events) and the active jobs per node to the
  // heartbeats, and the fleet gauges.
  void PublishExcludedNodes();
  void IndexActiveJobs();
  void IndexScheduledJob(const std::string& job, const std::set<std::string>& nodes);
  void PublishFleetGauges();

  ControlPlaneOptions options_;
  MonoTime started_at_;  // when this control plane was made (NotReady grace after a restart)

  NodeLeaseController leases_;                          // thread-safe
  std::unique_ptr<ReliabilityController> reliability_;  // thread-safe
  UsageMeter usage_meter_;                              // thread-safe
  TaskLogCache task_logs_{kTaskLogCacheBytes};          // thread-safe
  std::mutex usage_mu_;
  std::map<std::string, MonoTime> usage_last_heartbeat_;  // guarded by usage_mu_

  std::mutex agents_mu_;
  std::map<std::string, std::string> gpu_owners_;  // GPU UUID -> node; guarded by agents_mu_
  // The reverse of gpu_owners_ (node -> its GPU UUIDs), so that a node registering again or
  // deleted costs its own GPUs, not a walk over the fleet's. Guarded by agents_mu_.
  std::map<std::string, std::vector<std::string>> gpus_of_node_;
  // Node credentials seen claimed (ClaimNodeCredential), by token id; guarded by agents_mu_.
  std::set<std::string> claimed_credentials_;
  bool gpu_owners_loaded_ = false;                                    // guarded by agents_mu_
  std::map<std::string, std::string> excluded_nodes_;                 // guarded by agents_mu_
  std::map<std::pair<std::string, int>, int> gpu_utilization_;        // guarded by agents_mu_
  std::map<std::string, std::set<std::string>> active_jobs_by_node_;  // guarded by agents_mu_
  bool active_index_built_ = false;                                   // guarded by agents_mu_
  // The protocol of each node's agent ("1.1"), recorded once a registration or heartbeat of it
  // succeeded, so that only registered nodes are counted; guarded by agents_mu_.
  std::map<std::string, std::string> agent_protocols_;
  // Nodes IndexScheduledJob added to before their commit: the next IndexActiveJobs copies their
  // entries from the view again (a write that failed leaves its job there). Guarded by
  // agents_mu_.
  std::set<std::string> indexed_before_commit_;
  // The job documents heartbeats parsed, by job (thread-safe): a heartbeat parses again only
  // those that changed. Only jobs placed on the reporting node are kept, so an agent naming other
  // jobs' tasks cannot fill it.
  ParsedDocuments parsed_jobs_{kParsedJobsBudgetBytes, &options_.catalog};

  std::mutex cycle_mu_;                                // serialises scheduling cycles
  std::unique_ptr<scheduler::Scheduler> scheduler_;    // guarded by cycle_mu_
  std::unique_ptr<SchedulingView> view_;               // guarded by cycle_mu_
  MonoTime last_full_retry_;                           // guarded by cycle_mu_
  std::optional<MonoTime> last_usage_flush_;           // guarded by cycle_mu_
  QueueController queues_;                             // guarded by cycle_mu_, but Statuses
  MigLayoutController mig_layouts_;                    // guarded by cycle_mu_
  GangStartController gang_start_;                     // guarded by cycle_mu_
  std::optional<IdleReclaimController> idle_reclaim_;  // made on first use; cycle_mu_
  DeploymentController deployments_;                   // guarded by cycle_mu_
  RetentionController retention_;                      // guarded by cycle_mu_
  BackfillStep backfill_;                              // guarded by cycle_mu_
  policy::NeverFitsCheck never_fits_;                  // guarded by cycle_mu_
  uint64_t cycle_count_ = 0;                           // guarded by cycle_mu_
  MonoTime cycle_step_mark_;                           // guarded by cycle_mu_
  std::vector<std::pair<std::string_view, Duration>> cycle_steps_;  // guarded by cycle_mu_

  // The target workload of a policy that needs one (policy::NeedsTargetWorkload), and where the
  // scheduler's current one came from; guarded by cycle_mu_.
  enum class TargetSource { kNone, kPending, kHistory };
  std::optional<policy::WorkloadHistory> workload_history_;
  TargetSource target_source_ = TargetSource::kNone;
  scheduler::TargetWorkload target_;
  MonoTime target_built_at_;

  std::mutex gauges_mu_;
  FleetGauges gauges_;  // guarded by gauges_mu_
};

}  // namespace gpufleet::control
