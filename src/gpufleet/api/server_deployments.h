// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/api/job_lifecycle.h"

// Deployments in the server (server_deployments.cc; docs/api.md, "Deployments"): the store kind,
// the controller's period, and its replica plan, a pure function for tests.
namespace gpufleet::api {

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

}  // namespace gpufleet::api
