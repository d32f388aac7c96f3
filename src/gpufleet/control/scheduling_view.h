// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/scheduler/snapshot.h"
#include "gpufleet/store/state_store.h"
#include "gpufleet/wire/job_record.h"
#include "gpufleet/wire/json_fields.h"

// The scheduling loop's in-memory view of the store: every node, every active job and the
// cluster snapshot with the active jobs' placements applied. It is loaded once and then kept up
// to date from the store's commit notifications, so a cycle reads only the objects written since
// the last one instead of every node and job (the control plane's cycle-latency target, issue 4).
namespace gpufleet::control {

using wire::Json;

// The placements of a stored job that still hold resources (a task of a Stopping job found gone
// holds none) against `snapshot`, whose nodes `node_index` indexes by name; nullopt if a node is
// unknown. Each GPU is found on its node by UUID (placement_gpus.h); one the node no longer has
// is left out, never taken for another (the run is ended when its node registers or reports
// without it).
std::optional<std::vector<scheduler::TaskPlacement>> SnapshotPlacements(
    const std::vector<wire::PlacementRecord>& placements,
    const std::map<std::string, int>& node_index, const scheduler::ClusterSnapshot& snapshot);

// One node as the view keeps it.
struct ViewNode {
  int64_t version = 0;
  Node node;
  bool agent = false;  // registered by an agent, so it must heartbeat
};

// One job that has not finished, as the view keeps it.
struct ViewJob {
  int64_t version = 0;
  std::string data;  // the stored document
  JobState state = JobState::kPending;
  // A Stopping job: what it becomes once its tasks are gone.
  std::optional<JobState> stopping_then;
  std::string reason;
  std::string queue;
  int priority = 0;
  int64_t submit_seq = 0;
  // The job that its last stop (a preemption or an idle reclaim) was for, or empty.
  std::string preempted_by;
  // wire::JobRecord::expedited: a run a failure ended goes ahead of its priority's pending jobs.
  bool expedited = false;
  // wire::JobRecord::last_checkpoint_ns: what a preemption of the job would lose.
  std::optional<int64_t> last_checkpoint_ns;
  // wire::JobRecord::notice: a running job under a preemption notice (no victim again; its run
  // ends by EndNoticedRuns).
  std::optional<wire::NoticeRecord> notice;
  // wire::JobRecord::world_size (0 when unset) and the placements under a release (the ranks a
  // shrink stops): a shrinking job is no victim again and does not grow.
  int64_t world_size = 0;
  int releasing = 0;
  std::set<std::string> nodes;  // of its placements
  // Applied to the snapshot; set only while the job holds resources and its nodes are known.
  std::vector<scheduler::TaskPlacement> placements;
  bool applied = false;
  // The parsed spec, on first need (Pending jobs), or the error it gave.
  std::optional<Result<Job>> spec;
  // The view's capacity epoch when the job last failed to fit; it is tried again once resources
  // have been freed since (kube-scheduler's unschedulable queue works the same way).
  std::optional<uint64_t> unschedulable_epoch;
  // The view's shape epoch when the job was last found never to fit (policy/never_fits.h): the
  // answer holds until the fleet's shape moves on, whatever is freed meanwhile.
  std::optional<uint64_t> never_fits_epoch;
};

// The spec of `job`, parsed from its stored document on first need and kept (the record's spec,
// wire::StoredJobSpec), or the error it gave.
const Result<Job>& ViewJobSpec(ViewJob& job, const GpuCatalog& catalog);

// One entry of SchedulingView::jobs().
using ViewJobEntry = std::map<std::string, ViewJob>::value_type;
struct ByJobName {
  bool operator()(const ViewJobEntry* a, const ViewJobEntry* b) const {
    return a->first < b->first;
  }
};
// Entries of SchedulingView::jobs() in the map's own (name) order.
using JobEntries = std::set<ViewJobEntry*, ByJobName>;

// Names (of nodes) noted since a consumer last took them, or "everything" after a full load.
class NameChanges {
 public:
  void Note(const std::string& name) {
    if (!all_) {
      names_.insert(name);
    }
  }
  void All() {
    names_.clear();
    all_ = true;
  }
  // The names noted since the last call, or nullopt when All() was called meanwhile.
  std::optional<std::set<std::string>> Take() {
    std::set<std::string> names = std::exchange(names_, {});
    if (std::exchange(all_, false)) {
      return std::nullopt;
    }
    return names;
  }

 private:
  std::set<std::string> names_;
  bool all_ = true;
};

// Thread-safe for Committed and CommitFailed (any committing thread); every other method belongs to
// the one thread that runs scheduling cycles.
class SchedulingView final : public store::CommitObserver {
 public:
  // Starts watching `store`. REQUIRES: `store` and `catalog` outlive the view.
  SchedulingView(store::StateStore& store, const GpuCatalog& catalog);
  ~SchedulingView() override;
  SchedulingView(const SchedulingView&) = delete;
  SchedulingView& operator=(const SchedulingView&) = delete;

  void Committed(const store::WriteBatch& batch) override;
  // A commit that failed may have been written all the same: its objects are read again.
  void CommitFailed(const store::WriteBatch& batch) override;

  // Brings the view up to date: the first call (and a change of the recorded topology) loads
  // everything; later calls re-read only the objects committed since. The store's error if it
  // cannot be read; a node document that does not parse fails the refresh.
  Status Refresh();

  // The next Refresh reads this job again, or everything: for a commit whose outcome is unknown
  // (it failed, but may have been written; the store told no observer).
  void ReadJobAgain(const std::string& name);
  void ReadAllAgain();

  // REQUIRES: a Refresh succeeded.
  scheduler::ClusterSnapshot& snapshot() { return *snapshot_; }
  const std::map<std::string, ViewNode>& nodes() const { return nodes_; }
  // The nodes of nodes() with a MIG-enabled GPU: most fleets have none, or few.
  const std::set<std::string>& mig_enabled_nodes() const { return mig_enabled_nodes_; }
  // The nodes of nodes() that are NotReady.
  const std::set<std::string>& not_ready_nodes() const { return not_ready_nodes_; }
  // The nodes whose document the view read again (changed, added or removed) since the last call,
  // or nullopt when it read every node again meanwhile (a full load).
  std::optional<std::set<std::string>> TakeNodeChanges() { return node_changes_.Take(); }
  std::map<std::string, ViewJob>& jobs() { return jobs_; }
  const std::map<std::string, ViewJob>& jobs() const { return jobs_; }
  // Snapshot index of a node, or -1.
  int NodeIndex(const std::string& name) const;
  // Names of the active jobs (those that hold resources) on each node, kept as jobs change.
  const std::map<std::string, std::set<std::string>>& ActiveJobsByNode() const {
    return active_jobs_by_node_;
  }
  // The nodes whose entry of ActiveJobsByNode() may have changed since the last call, or nullopt
  // when the whole index was built again meanwhile (a full load): a copy of it follows these.
  std::optional<std::set<std::string>> TakeActiveJobChanges() { return active_job_changes_.Take(); }
  // The jobs of jobs() in `state`, kept as jobs change: a step that looks at the jobs of one
  // state walks those, not every active job (most are Pending or Running).
  const JobEntries& JobsIn(JobState state) const {
    return jobs_by_state_[static_cast<size_t>(state)];
  }
  size_t JobsInState(JobState state) const { return JobsIn(state).size(); }
  // How many Pending jobs each queue (by ViewJob::queue) has, kept as jobs change; a queue
  // without one is left out.
  const std::map<std::string, size_t>& PendingByQueue() const { return pending_by_queue_; }

  // True once after a queue was created or changed (and at first).
  bool TakeQueuesChanged();

  // Stored nodes left out of the snapshot because they do not parse or fail
  // scheduler::ValidateNode, with why; Take... returns each new reason once.
  const std::map<std::string, std::string>& excluded_nodes() const { return excluded_; }
  std::map<std::string, std::string> TakeNewlyExcludedNodes() {
    return std::exchange(newly_excluded_, {});
  }

  // Bumped whenever resources may have become free: a job released its placements, or a node
  // changed. A job that did not fit at epoch E cannot fit before the epoch moves on.
  uint64_t capacity_epoch() const { return capacity_epoch_; }
  void BumpCapacityEpoch() { ++capacity_epoch_; }
  // Bumped when a node is added or removed or changes in what policy::CheckNeverFits reads
  // (policy::SameShapeForNeverFits); free resources, node state and health leave it.
  uint64_t shape_epoch() const { return shape_epoch_; }

  // Records that the cycle committed `placements` (already applied to the snapshot) for `name`:
  // the job is Scheduled at `version` with the new document `data`.
  void MarkScheduled(const std::string& name, int64_t version, std::string data,
                     std::vector<scheduler::TaskPlacement> placements, std::set<std::string> nodes);
  // Records that the cycle committed `data` for `name` at `version`, changing only its reason
  // (already in ViewJob::reason): the next refresh need not read and parse it again. With
  // thousands of jobs pending, a change of capacity can rewrite most of their reasons at once.
  void MarkReasonWritten(const std::string& name, int64_t version, std::string data);

 private:
  // Notes the objects `batch` writes for the next Refresh; `outcome_known` false: a failed commit,
  // whose jobs are read again whatever version the view holds.
  void NoteWrites(const store::WriteBatch& batch, bool outcome_known);
  Status LoadAll();
  Status RefreshNode(const std::string& name);
  // Reads the jobs `names` (sorted, no repeats) again: each is taken in, or dropped when it is
  // gone.
  Status RefreshJobs(const std::vector<std::string>& names);
  // Keeps mig_enabled_nodes_ and not_ready_nodes_ in step with nodes_ for `name` (`node`: null
  // when it left).
  void NoteNodeChanged(const std::string& name, const ViewNode* node);
  // A stored node as the view keeps it, or nullopt (recorded in excluded_) when it cannot be.
  std::optional<ViewNode> Accept(const store::StoredObject& object, const Topology& topology);
  // Rebuilds the snapshot from nodes_ and applies every job that holds resources.
  Status RebuildSnapshot();
  // Brings the snapshot in step with the nodes named in `changed` (already read into nodes_):
  // each node whose document changed is replaced in place and the placements on it applied
  // again, in job name order as a rebuild applies them; a node added, removed or left out, or
  // one with a topology domain or GPU model new to the snapshot, rebuilds it all.
  Status UpdateSnapshot(const std::set<std::string>& changed);
  // Takes a stored job into jobs_ (or drops it when it has finished), keeping the snapshot in
  // step.
  void PutJob(const store::StoredObject& object);
  void PutJobUnindexed(const store::StoredObject& object);
  // Take job `name` (if held) out of, and back into, ActiveJobsByNode(), JobsIn() and
  // PendingByQueue():
  // around every change of a job's state or nodes, and before it leaves jobs_.
  void UnindexJob(const std::string& name);
  void IndexJob(const std::string& name);
  void ReleaseJob(ViewJob& job);
  // Applies the stored `placements` of job `name` to the snapshot.
  void ApplyJob(const std::string& name, ViewJob& job,
                const std::vector<wire::PlacementRecord>& placements);

  store::StateStore& store_;
  const GpuCatalog& catalog_;

  std::mutex changes_mu_;
  bool reload_all_ = true;               // guarded by changes_mu_
  bool queues_changed_ = true;           // guarded by changes_mu_
  std::set<std::string> changed_nodes_;  // guarded by changes_mu_
  // Jobs written since the last refresh, each with the version its last update gave it, or
  // kVersionUnknown (created, deleted, or a commit whose outcome is unknown): a job the view
  // already holds at that version (the cycle's own write) is not read again.
  static constexpr int64_t kVersionUnknown = -1;
  std::map<std::string, int64_t> changed_jobs_;  // guarded by changes_mu_

  Topology topology_;
  std::map<std::string, ViewNode> nodes_;
  std::set<std::string> mig_enabled_nodes_;
  std::set<std::string> not_ready_nodes_;
  NameChanges node_changes_;
  std::map<std::string, std::string> excluded_;
  std::map<std::string, std::string> newly_excluded_;
  std::map<std::string, ViewJob> jobs_;
  std::map<std::string, std::set<std::string>> active_jobs_by_node_;
  NameChanges active_job_changes_;  // nodes
  std::array<JobEntries, kJobStates.size()> jobs_by_state_;
  std::map<std::string, size_t> pending_by_queue_;
  std::optional<scheduler::ClusterSnapshot> snapshot_;
  std::map<std::string, int> node_index_;
  uint64_t capacity_epoch_ = 0;
  uint64_t shape_epoch_ = 0;
};

}  // namespace gpufleet::control
