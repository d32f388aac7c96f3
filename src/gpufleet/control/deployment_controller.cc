// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/deployment_controller.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/control/store_keys.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/wire/deployment_spec.h"

namespace gpufleet::control {
namespace {

// Agents report whole percents; the autoscaler takes milli.
constexpr int64_t kUtilizationMilliPerPercent = 10;

}  // namespace

Principal ReplicaOwner(const Json& deployment) {
  return Principal{
      wire::BoolOr(deployment, "created_by_admin", false) ? Role::kAdmin : Role::kMember,
      wire::StrOr(deployment, "team"),
      fmt::format("deployment/{}", wire::StrOr(deployment, "name"))};
}

std::set<std::string> LiveReplicasOf(const std::string& key, const Json& deployment,
                                     const std::map<std::string, ViewJob>& jobs) {
  // Keys: the stored replicas are named without their team, the deployment's.
  const std::string team = wire::StrOr(deployment, "team");
  std::set<std::string> replicas;
  if (const auto stored = deployment.find("replicas");
      stored != deployment.end() && stored->is_array()) {
    for (const Json& replica : *stored) {
      if (replica.is_string()) {
        replicas.insert(TeamScopedKey(team, replica.get<std::string>()));
      }
    }
  }
  for (const auto& [job_name, job] : jobs) {
    const Json job_doc = wire::ParseDocument(job.data);
    if (wire::ReplicaIndex(key, job_name) >= 0 &&
        IsLiveReplicaState(job.state, job.stopping_then) && wire::StrOr(job_doc, "team") == team &&
        wire::StringMapOr(job_doc, "labels")[std::string(wire::kDeploymentLabel)] ==
            NameOfKey(key)) {
      replicas.insert(job_name);
    }
  }
  return replicas;
}

bool IsLiveReplicaState(JobState state, std::optional<JobState> then) {
  if (state == JobState::kStopping) {
    return then.has_value() && !IsFinished(*then);
  }
  return !IsFinished(state);
}

ReplicaPlan PlanReplicas(std::vector<ReplicaJob> replicas, int desired, int64_t next_index) {
  std::sort(replicas.begin(), replicas.end(),
            [](const ReplicaJob& a, const ReplicaJob& b) { return a.index < b.index; });
  ReplicaPlan plan;
  if (!replicas.empty()) {
    next_index = std::max(next_index, replicas.back().index + 1);
  }
  for (const ReplicaJob& replica : replicas) {
    if (IsLiveReplicaState(replica.state, replica.stopping_then)) {
      plan.keep.push_back(replica.name);
    }
  }
  while (static_cast<int>(plan.keep.size()) > std::max(desired, 0)) {
    plan.cancel.push_back(std::move(plan.keep.back()));
    plan.keep.pop_back();
  }
  for (int i = static_cast<int>(plan.keep.size()); i < desired; ++i) {
    plan.create.push_back(next_index++);
  }
  return plan;
}

bool DeploymentController::Due(MonoTime now) const {
  return !last_step_ || now - *last_step_ >= kDeploymentControllerPeriod;
}

void DeploymentController::SetAutoscaler(const std::string& key, policy::Autoscaler autoscaler) {
  autoscalers_.insert_or_assign(key, std::move(autoscaler));
}

Result<bool> DeploymentController::Step(const std::map<std::string, ViewJob>& jobs,
                                        const scheduler::ClusterSnapshot& snapshot,
                                        const GpuUtilizationReports& reports, MonoTime now,
                                        ReplicaJobs& replica_jobs) {
  last_step_ = now;
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> deployments,
                            store_.List(kDeploymentsKind));
  if (deployments.empty()) {
    autoscalers_.clear();
    return false;
  }
  // Replica jobs by deployment: named NAME-r<k>, labelled deployment=NAME, of its team; keyed
  // TEAM/NAME-r<k> beside the deployment's TEAM/NAME.
  std::map<std::string, std::string> team_of;
  for (const store::StoredObject& object : deployments) {
    team_of[object.name] = wire::StrOr(wire::ParseDocument(object.data), "team");
  }
  std::map<std::string, std::vector<ReplicaJob>> replicas;
  for (const auto& [name, job] : jobs) {
    const size_t dash = name.rfind("-r");
    if (dash == std::string::npos || team_of.count(name.substr(0, dash)) == 0) {
      continue;
    }
    const std::string deployment = name.substr(0, dash);
    const int64_t index = wire::ReplicaIndex(deployment, name);
    const Json doc = wire::ParseDocument(job.data);
    if (index < 0 || wire::StrOr(doc, "team") != team_of[deployment] ||
        wire::StringMapOr(doc, "labels")[std::string(wire::kDeploymentLabel)] !=
            NameOfKey(deployment)) {
      continue;
    }
    replicas[deployment].push_back({index, name, job.state, job.stopping_then});
  }

  const int64_t now_seconds =
      std::chrono::floor<std::chrono::seconds>(std::chrono::nanoseconds(now.nanos)).count();
  bool jobs_changed = false;
  std::set<std::string> seen;
  for (const store::StoredObject& object : deployments) {
    seen.insert(object.name);
    Json doc = wire::ParseDocument(object.data);
    const Result<wire::DeploymentSpec> spec = wire::DeploymentSpecFromJson(doc, catalog_);
    if (!spec.ok()) {
      continue;  // written by this server after the same checks; a newer catalog may refuse it
    }
    auto autoscaler = autoscalers_.find(object.name);
    if (autoscaler == autoscalers_.end()) {
      GPUFLEET_ASSIGN_OR_RETURN(policy::Autoscaler made,
                                policy::Autoscaler::Create(spec->autoscaling));
      autoscaler = autoscalers_.emplace(object.name, std::move(made)).first;
    }
    const int current =
        static_cast<int>(wire::IntOr(doc, "desired_replicas", spec->autoscaling.min_replicas));

    // Measure the live replicas that the current count keeps: the Running ones whose GPUs have
    // all reported are ready; Pending and Scheduled ones serve nothing yet.
    const std::vector<ReplicaJob>& mine = replicas[object.name];
    const int64_t next_index = wire::IntOr(doc, "next_replica_index", 0);
    const ReplicaPlan before = PlanReplicas(mine, current, next_index);
    int ready = 0;
    int64_t utilization_sum = 0;
    for (const std::string& name : before.keep) {
      const ViewJob& job = jobs.at(name);
      if (job.state != JobState::kRunning) {
        continue;
      }
      if (const std::optional<JobUtilization> measured =
              MeasureJobUtilization(job, snapshot, reports.heartbeat_at, reports.percent)) {
        ++ready;
        utilization_sum += measured->milli;
      }
    }
    const int64_t utilization_milli = ready == 0 ? 0 : utilization_sum / ready;
    GPUFLEET_ASSIGN_OR_RETURN(const policy::ScaleDecision decision,
                              autoscaler->second.Decide({.now_seconds = now_seconds,
                                                         .current_replicas = current,
                                                         .ready_replicas = ready,
                                                         .utilization_milli = utilization_milli}));

    // Submit and cancel through the same handlers as a user, as the deployment's creator.
    const ReplicaPlan plan = PlanReplicas(mine, decision.desired_replicas, next_index);
    const Principal owner = ReplicaOwner(doc);
    store::WriteBatch batch;
    std::string reason = decision.reason;
    // Stored and shown without the team, as the deployment's own name is.
    Json names = Json::array();
    for (const std::string& kept : plan.keep) {
      names.push_back(NameOfKey(kept));
    }
    int64_t index = plan.create.empty() ? next_index : plan.create.front();
    for (size_t made = 0, attempts = 0; made < plan.create.size(); ++index) {
      const Result<Json> submitted = replica_jobs.Submit(owner, wire::ReplicaJobSpec(*spec, index));
      if (submitted.ok()) {
        names.push_back(wire::ReplicaJobName(wire::StrOr(doc, "name"), index));
        jobs_changed = true;
        ++made;
        continue;
      }
      // A job of that name may exist (an ended replica whose index was not stored): try the next.
      if (submitted.status().code() == StatusCode::kAlreadyExists &&
          ++attempts < static_cast<size_t>(kCasAttempts)) {
        continue;
      }
      reason += fmt::format("; replica {} not created: {}",
                            wire::ReplicaJobName(wire::StrOr(doc, "name"), index),
                            submitted.status().message());
      break;
    }
    for (const std::string& name : plan.cancel) {
      const Result<Json> cancelled = replica_jobs.Cancel(owner, name);
      jobs_changed = true;
      if (!cancelled.ok()) {
        reason += fmt::format("; replica {} not cancelled: {}", NameOfKey(name),
                              cancelled.status().message());
        names.push_back(NameOfKey(name));
      }
    }

    const Json utilization_pct =
        ready == 0 ? Json(nullptr) : Json(utilization_milli / kUtilizationMilliPerPercent);
    if (wire::IntOr(doc, "desired_replicas", -1) == decision.desired_replicas &&
        wire::IntOr(doc, "ready_replicas", -1) == ready &&
        doc["utilization_pct"] == utilization_pct && wire::StrOr(doc, "reason") == reason &&
        doc["replicas"] == names && wire::IntOr(doc, "next_replica_index", 0) == index) {
      continue;
    }
    if (decision.desired_replicas != current) {
      batch.AppendEvent(
          std::string(kDeploymentsKind), object.name,
          fmt::format("scaled {} -> {}: {}", current, decision.desired_replicas, reason));
    }
    doc["desired_replicas"] = decision.desired_replicas;
    doc["ready_replicas"] = ready;
    doc["utilization_pct"] = utilization_pct;
    doc["replicas"] = std::move(names);
    doc["reason"] = reason;
    doc["next_replica_index"] = index;
    batch.Update(std::string(kDeploymentsKind), object.name, doc.dump(), object.version);
    // A conflicting write loses this step's status; the next step measures and writes again.
    if (const Status status = store_.Commit(batch); !status.ok() &&
                                                    status.code() != StatusCode::kAborted &&
                                                    status.code() != StatusCode::kNotFound) {
      return status;
    }
  }
  std::erase_if(autoscalers_, [&](const auto& entry) { return seen.count(entry.first) == 0; });
  return jobs_changed;
}

}  // namespace gpufleet::control
