// SPDX-License-Identifier: Apache-2.0
// Deployments of inference replica jobs and their autoscaling in the scheduling cycle
// (docs/api.md, "Deployments"; docs/utilization.md, "Inference autoscaling").
#include "gpufleet/api/server_deployments.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "gpufleet/api/deployment_spec.h"
#include "gpufleet/api/scheduling_view.h"
#include "gpufleet/api/server.h"

namespace gpufleet::api {
namespace {

// Agents report whole percents; the autoscaler takes milli.
constexpr int64_t kMilliPerPercent = 10;

ApiResponse Reply(int status, const Json& body) {
  ApiResponse response;
  response.status = status;
  response.body = body.dump() + "\n";
  return response;
}

ApiResponse Error(const Status& status) {
  ApiResponse response;
  response.status = HttpStatusOf(status.code());
  response.body = ErrorBody(status);
  return response;
}

Status DeploymentNotFound(std::string_view name) {
  return NotFoundError(fmt::format("deployment \"{}\" not found", name));
}

Json DeploymentOutput(const store::StoredObject& object) {
  Json doc = ParseDocument(object.data);
  doc["version"] = object.version;
  return doc;
}

bool CanSeeDeployment(const Principal& who, const Json& doc) {
  return who.is_admin() || StrOr(doc, "team") == who.team;
}

// Who the controller acts as for a deployment's replicas: its creator's role and team.
Principal ReplicaOwner(const Json& doc) {
  return Principal{BoolOr(doc, "created_by_admin", false) ? Role::kAdmin : Role::kMember,
                   StrOr(doc, "team"), fmt::format("deployment/{}", StrOr(doc, "name"))};
}

}  // namespace

bool IsLiveReplicaState(std::string_view state) {
  return state != "Succeeded" && state != "Failed" && state != "Cancelled";
}

ReplicaPlan PlanReplicas(std::vector<ReplicaJob> replicas, int desired, int64_t next_index) {
  std::sort(replicas.begin(), replicas.end(),
            [](const ReplicaJob& a, const ReplicaJob& b) { return a.index < b.index; });
  ReplicaPlan plan;
  if (!replicas.empty()) {
    next_index = std::max(next_index, replicas.back().index + 1);
  }
  for (const ReplicaJob& replica : replicas) {
    if (IsLiveReplicaState(replica.state)) {
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

std::optional<ApiResponse> ApiServer::RouteDeployments(
    const Principal& who, const ApiRequest& request,
    const std::vector<std::string_view>& segments) {
  if (segments.size() < 2 || segments[1] != "deployments") {
    return std::nullopt;
  }
  const size_t n = segments.size();
  if (n == 2 && request.method == "POST") {
    Result<DeploymentSpec> spec = ParseDeploymentSpec(request.body, options_.catalog);
    if (!spec.ok()) {
      return Error(spec.status());
    }
    if (Status status = CheckSubmission(who, spec->queue); !status.ok()) {
      return Error(status);
    }
    Json doc = DeploymentSpecToJson(*spec);
    doc["team"] = who.team;
    doc["created_by"] = who.name.empty() ? RoleName(who.role) : who.name;
    doc["created_by_admin"] = who.is_admin();
    if (options_.wall_clock != nullptr) {
      doc["created_at"] = fmt::format(
          "{:%Y-%m-%dT%H:%M:%SZ}",
          std::chrono::floor<std::chrono::seconds>(std::chrono::sys_time<std::chrono::nanoseconds>(
              std::chrono::nanoseconds(options_.wall_clock->UnixNanos()))));
    }
    doc["desired_replicas"] = spec->autoscaling.min_replicas;
    doc["ready_replicas"] = 0;
    doc["utilization_pct"] = nullptr;
    doc["replicas"] = Json::array();
    doc["reason"] = "created; replicas start at min_replicas";
    store::WriteBatch batch;
    batch.Create(std::string(kDeploymentsKind), spec->name, doc.dump());
    batch.AppendEvent(std::string(kDeploymentsKind), spec->name,
                      fmt::format("created by {} with {} replicas", StrOr(doc, "created_by"),
                                  spec->autoscaling.min_replicas));
    if (Status status = options_.store.Commit(batch); !status.ok()) {
      return Error(
          status.code() == StatusCode::kAlreadyExists
              ? AlreadyExistsError(fmt::format("deployment \"{}\" already exists", spec->name))
              : status);
    }
    doc["version"] = 1;
    return Reply(201, doc);
  }
  if (request.method != "GET") {
    return std::nullopt;
  }
  if (n == 2) {
    const Result<std::vector<store::StoredObject>> objects = options_.store.List(kDeploymentsKind);
    if (!objects.ok()) {
      return Error(objects.status());
    }
    Json items = Json::array();
    for (const store::StoredObject& object : *objects) {
      Json doc = DeploymentOutput(object);
      if (CanSeeDeployment(who, doc)) {
        items.push_back(std::move(doc));
      }
    }
    return Reply(200, {{"items", std::move(items)}});
  }
  if (n == 3 || (n == 4 && segments[3] == "events")) {
    const Result<store::StoredObject> object = options_.store.Get(kDeploymentsKind, segments[2]);
    if (!object.ok()) {
      return Error(object.status().code() == StatusCode::kNotFound ||
                           object.status().code() == StatusCode::kInvalidArgument
                       ? DeploymentNotFound(segments[2])
                       : object.status());
    }
    Json doc = DeploymentOutput(*object);
    if (!CanSeeDeployment(who, doc)) {
      return Error(DeploymentNotFound(segments[2]));
    }
    return n == 3 ? Reply(200, doc) : ObjectEvents(kDeploymentsKind, segments[2]);
  }
  return std::nullopt;
}

Status ApiServer::RunDeploymentsIfDue() {
  const MonoTime now = options_.clock.Now();
  if (deployments_run_at_ && now - *deployments_run_at_ < kDeploymentControllerPeriod) {
    return Status::Ok();
  }
  deployments_run_at_ = now;
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> deployments,
                            options_.store.List(kDeploymentsKind));
  if (deployments.empty()) {
    autoscalers_.clear();
    return Status::Ok();
  }
  // Replica jobs by deployment: named NAME-r<k>, labelled deployment=NAME, of its team.
  std::map<std::string, std::string> team_of;
  for (const store::StoredObject& object : deployments) {
    team_of[object.name] = StrOr(ParseDocument(object.data), "team");
  }
  std::map<std::string, std::vector<ReplicaJob>> replicas;
  for (const auto& [name, job] : view_->jobs()) {
    const size_t dash = name.rfind("-r");
    if (dash == std::string::npos || team_of.count(name.substr(0, dash)) == 0) {
      continue;
    }
    const std::string deployment = name.substr(0, dash);
    const int64_t index = ReplicaIndex(deployment, name);
    const Json doc = ParseDocument(job.data);
    if (index < 0 || StrOr(doc, "team") != team_of[deployment] ||
        StringMapOr(doc, "labels")[std::string(kDeploymentLabel)] != deployment) {
      continue;
    }
    replicas[deployment].push_back({index, name, job.state});
  }

  const int64_t now_seconds =
      std::chrono::floor<std::chrono::seconds>(std::chrono::nanoseconds(now.nanos)).count();
  bool jobs_changed = false;
  std::set<std::string> seen;
  for (const store::StoredObject& object : deployments) {
    seen.insert(object.name);
    Json doc = ParseDocument(object.data);
    const Result<DeploymentSpec> spec = DeploymentSpecFromJson(doc, options_.catalog);
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
        static_cast<int>(IntOr(doc, "desired_replicas", spec->autoscaling.min_replicas));

    // Measure the live replicas that the current count keeps: the Running ones whose GPUs have
    // all reported are ready; Pending and Scheduled ones serve nothing yet.
    const std::vector<ReplicaJob>& mine = replicas[object.name];
    const int64_t next_index = IntOr(doc, "next_replica_index", 0);
    const ReplicaPlan before = PlanReplicas(mine, current, next_index);
    int ready = 0;
    int64_t utilization_sum = 0;
    {
      std::lock_guard<std::mutex> lock(agents_mu_);
      for (const std::string& name : before.keep) {
        const ViewJob& job = view_->jobs().at(name);
        if (job.state != "Running") {
          continue;
        }
        if (const std::optional<JobUtilization> measured = MeasureJobUtilization(job)) {
          ++ready;
          utilization_sum += measured->milli;
        }
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
    Json names = plan.keep;
    int64_t index = plan.create.empty() ? next_index : plan.create.front();
    for (size_t made = 0, attempts = 0; made < plan.create.size(); ++index) {
      ApiRequest submit;
      submit.method = "POST";
      submit.body = ReplicaJobSpec(*spec, index);
      const ApiResponse response = SubmitJob(owner, submit);
      if (response.status == 201) {
        names.push_back(ReplicaJobName(object.name, index));
        jobs_changed = true;
        ++made;
        continue;
      }
      // A job of that name may exist (an ended replica whose index was not stored): try the next.
      if (response.status == 409 && ++attempts < static_cast<size_t>(kCasAttempts)) {
        continue;
      }
      reason += fmt::format("; replica {} not created: {}", ReplicaJobName(object.name, index),
                            StrOr(ParseDocument(response.body)["error"], "message"));
      break;
    }
    for (const std::string& name : plan.cancel) {
      const ApiResponse response = CancelJob(owner, name);
      jobs_changed = true;
      if (response.status != 200) {
        const std::string error = StrOr(ParseDocument(response.body)["error"], "message");
        reason += fmt::format("; replica {} not cancelled: {}", name, error);
        names.push_back(name);
      }
    }

    const Json utilization_pct =
        ready == 0 ? Json(nullptr) : Json(utilization_milli / kMilliPerPercent);
    if (IntOr(doc, "desired_replicas", -1) == decision.desired_replicas &&
        IntOr(doc, "ready_replicas", -1) == ready && doc["utilization_pct"] == utilization_pct &&
        StrOr(doc, "reason") == reason && doc["replicas"] == names &&
        IntOr(doc, "next_replica_index", 0) == index) {
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
    if (const Status status = options_.store.Commit(batch);
        !status.ok() && status.code() != StatusCode::kAborted &&
        status.code() != StatusCode::kNotFound) {
      return status;
    }
  }
  std::erase_if(autoscalers_, [&](const auto& entry) { return seen.count(entry.first) == 0; });
  return jobs_changed ? view_->Refresh() : Status::Ok();
}

}  // namespace gpufleet::api
