// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/control/idle_reclaim_controller.h"
#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/principal.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/policy/autoscaler.h"
#include "gpufleet/store/state_store.h"
#include "gpufleet/wire/json_fields.h"

// Deployments of inference replica jobs and their autoscaling in the scheduling cycle (docs/api.md,
// "Deployments"; docs/utilization.md, "Inference autoscaling"): the store kind, the controller,
// and its replica plan, a pure function for tests. The routes are the server's
// (api/server_deployments.cc).
namespace gpufleet::control {

// One document per deployment: its spec (deployment_spec.h) plus "team", "created_by",
// "created_by_admin", "created_at" and the controller's status fields "desired_replicas",
// "ready_replicas", "utilization_pct" (null when no replica is measured), "replicas", "reason"
// and "next_replica_index".
inline constexpr std::string_view kDeploymentsKind = "deployments";

// The controller runs in the scheduling cycle at most this often (server clock), as the
// Kubernetes HPA syncs every 15 s.
inline constexpr std::chrono::seconds kDeploymentControllerPeriod{15};

// A replica job of a deployment as the controller sees it.
struct ReplicaJob {
  int64_t index = 0;  // the k of NAME-r<k>
  std::string name;
  JobState state = JobState::kPending;
  std::optional<JobState> stopping_then;
};

struct ReplicaPlan {
  std::vector<int64_t> create;      // indices of new replicas, ascending
  std::vector<std::string> cancel;  // surplus replicas, highest index first
  std::vector<std::string> keep;    // the live replicas that stay, lowest index first
};

// Brings the live replicas (not Succeeded, Failed or Cancelled) of `replicas` to `desired`:
// surplus ones are cancelled from the highest index down; missing ones get indices from
// `next_index` up, above every index in `replicas`, so that a name is not reused (the scheduling
// view forgets ended jobs; the deployment stores its next index).
ReplicaPlan PlanReplicas(std::vector<ReplicaJob> replicas, int desired, int64_t next_index);

// Whether a job in `state` still counts as a replica: it has not ended, and a Stopping one only
// when it comes back (`then` Pending, Preempted or Suspended: preempted, reclaimed, requeued).
bool IsLiveReplicaState(JobState state, std::optional<JobState> then = std::nullopt);

// Who the controller acts as for a deployment's replicas: its creator's role and team.
Principal ReplicaOwner(const Json& deployment);

// The live replica jobs (store keys) of the deployment stored under `key` as `deployment`: those
// it last stored, and any of the view's `jobs` it has not stored yet (named NAME-r<k>, labelled
// deployment=NAME, of its team).
std::set<std::string> LiveReplicasOf(const std::string& key, const Json& deployment,
                                     const std::map<std::string, ViewJob>& jobs);

// How the controller submits and cancels replica jobs: through the server's own submit and
// cancel, as the deployment's creator (ReplicaOwner), so a replica passes the checks and quota a
// user's job does.
class ReplicaJobs {
 public:
  virtual ~ReplicaJobs() = default;
  // The stored job; kAlreadyExists when the name is taken.
  virtual Result<Json> Submit(const Principal& owner, std::string_view spec) = 0;
  // kFailedPrecondition when the job has ended, kNotFound when it is gone.
  virtual Result<Json> Cancel(const Principal& owner, std::string_view key) = 0;
};

// Each deployment's autoscaler takes the mean utilization of its Running replicas, and replica
// jobs are submitted or cancelled to match the desired count, which it stores with the
// deployment's status fields (their one writer). Not thread-safe: it belongs to the thread that
// runs cycles (the deployment routes take the cycle's lock to call Forget and SetAutoscaler).
class DeploymentController {
 public:
  // Must outlive the controller.
  DeploymentController(store::StateStore& store, const GpuCatalog& catalog)
      : store_(store), catalog_(catalog) {}

  // Whether a step is due at `now` (server clock): at most every kDeploymentControllerPeriod.
  bool Due(MonoTime now) const;
  // One step at `now`: `reports` hold the agents' latest reports for the nodes of the running
  // jobs. Returns whether replicas were submitted or cancelled (the view must read them).
  Result<bool> Step(const std::map<std::string, ViewJob>& jobs,
                    const scheduler::ClusterSnapshot& snapshot,
                    const GpuUtilizationReports& reports, MonoTime now, ReplicaJobs& replica_jobs);

  // A deleted deployment's autoscaler goes; an updated one's is replaced (the next step decides
  // from the stored desired count with the new options).
  void Forget(const std::string& key) { autoscalers_.erase(key); }
  void SetAutoscaler(const std::string& key, policy::Autoscaler autoscaler);

 private:
  store::StateStore& store_;
  const GpuCatalog& catalog_;
  // One autoscaler per deployment, made on first use (after a restart from the stored count).
  std::map<std::string, policy::Autoscaler> autoscalers_;
  std::optional<MonoTime> last_step_;
};

}  // namespace gpufleet::control
