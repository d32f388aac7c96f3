// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpufleet/control/lifecycle_controller.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/policy/idle_reclaim.h"
#include "gpufleet/scheduler/snapshot.h"

// Idle reclaim of running interactive jobs as a controller of the scheduling cycle
// (docs/utilization.md, "Idle reclaim in the server"): it reads the view's jobs and the agents'
// GPU utilization reports, feeds policy::IdleReclaimer, and returns the job writes its decisions
// call for; the server commits them (ApiServer::CommitJobWrites). No IO, no clock, no locks.
namespace gpufleet::control {

// What the agents last reported, as plain data: the server copies it from its heartbeat state
// (under its agents lock) for the nodes of the running jobs.
struct GpuUtilizationReports {
  std::map<std::string, MonoTime> heartbeat_at;        // node -> its latest heartbeat
  std::map<std::pair<std::string, int>, int> percent;  // (node, GPU index) -> utilization, 0..100
};

// The mean utilization (milli) of the GPUs a job holds, as of the oldest of its nodes' latest
// heartbeats.
struct JobUtilization {
  MonoTime as_of;
  int64_t milli = 0;
};
// `job`'s utilization from the reports (`heartbeat_at` and `percent` as in
// GpuUtilizationReports); nullopt when one of its nodes or GPUs has reported none, or it holds no
// GPU. `snapshot` resolves its placements. Also the deployments' autoscaler's measure.
std::optional<JobUtilization> MeasureJobUtilization(
    const ViewJob& job, const scheduler::ClusterSnapshot& snapshot,
    const std::map<std::string, MonoTime>& heartbeat_at,
    const std::map<std::pair<std::string, int>, int>& percent);

// What a step needs besides the view.
struct IdleReclaimInputs {
  GpuUtilizationReports reports;
  int pending_jobs = 0;  // jobs waiting for GPUs
  // The first Pending job in queue order: the "preempted_by" of a job the kPreempt action
  // reclaims. Empty when none waits; needed only when preempts().
  std::string first_pending;
  MonoTime now;  // on the server's clock
  // Unix seconds now (server seconds without a wall clock): fixes, on the first step, where the
  // reclaimer's time line starts.
  int64_t now_seconds = 0;
  std::string now_text;  // when a reclaimed run's stop starts (RFC 3339, or empty)
};

// What a step decided.
struct IdleReclaimStep {
  // Warnings set or withdrawn (the job's "warning" field and an event) and reclaims (the run
  // ends as preempted; the job becomes Suspended or Preempted through Stopping).
  std::vector<JobWrite> writes;
  bool reclaimed = false;  // some write is a reclaim: the queues' charges change once committed
};

// Watches the Running interactive jobs of the view: a job is tracked while it is Running and
// forgotten once it left Running (finished, requeued, reclaimed) or runs a new attempt, so that
// every run starts afresh. Each step feeds the reclaimer one sample per job and heartbeat and asks
// it what to do; the job documents follow the reclaimer's state rather than its events, so that a
// write lost to a conflict is made again by a later step. Stateful: one instance per server.
// Thread-compatible: the scheduling cycle serialises the calls.
class IdleReclaimController {
 public:
  // kInvalidArgument when `options` do not validate. REQUIRES: `catalog` outlives the controller.
  static Result<IdleReclaimController> Create(const policy::IdleReclaimOptions& options,
                                              const GpuCatalog& catalog);

  // Whether a reclaimed job is requeued (kPreempt), which needs `first_pending`.
  bool preempts() const { return reclaimer_.options().action == policy::ReclaimAction::kPreempt; }

  // One step of the cycle. `jobs` and `snapshot` are the view's. The reclaimer's errors
  // (kInvalidArgument for a time going backwards or a utilization out of range) as they are.
  Result<IdleReclaimStep> Step(const std::map<std::string, ViewJob>& jobs,
                               const scheduler::ClusterSnapshot& snapshot,
                               const IdleReclaimInputs& inputs);

 private:
  // A running interactive job the reclaimer tracks.
  struct TrackedJob {
    int64_t attempt = 0;                         // the run it watches
    std::optional<int64_t> last_sample_seconds;  // of the latest sample fed
    int64_t version = -1;                        // of the document `warning` was read from
    std::string warning;                         // its "warning" field; empty when absent
  };
  // Whether a running job is interactive, and its attempt (interactive jobs only), as of a
  // version of its document.
  struct RunningJob {
    int64_t version = 0;
    bool interactive = false;
    int64_t attempt = 0;
  };

  IdleReclaimController(policy::IdleReclaimer reclaimer, const GpuCatalog& catalog)
      : reclaimer_(std::move(reclaimer)), catalog_(&catalog) {}

  // The reclaimer's time line: Unix seconds (server seconds without a wall clock), monotonic.
  int64_t Seconds(MonoTime time) const;
  // Reads (once per version) whether a running job is interactive and its attempt, into
  // `running`.
  const RunningJob& ReadRunningJob(const std::string& name, const ViewJob& job,
                                   std::map<std::string, RunningJob>& running);
  Status TrackRunningJobs(const std::map<std::string, ViewJob>& jobs);
  Status Sample(const std::map<std::string, ViewJob>& jobs,
                const scheduler::ClusterSnapshot& snapshot, const GpuUtilizationReports& reports);
  Result<IdleReclaimStep> Writes(const std::map<std::string, ViewJob>& jobs,
                                 const IdleReclaimInputs& inputs);

  policy::IdleReclaimer reclaimer_;
  const GpuCatalog* catalog_;  // not owned
  std::map<std::string, TrackedJob> tracked_;
  std::map<std::string, RunningJob> running_;
  // Unix seconds of MonoTime{0} on the reclaimer's time line, fixed by the first step.
  std::optional<int64_t> epoch_seconds_;
};

}  // namespace gpufleet::control
