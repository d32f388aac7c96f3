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

#include "gpufleet/api/scheduling_view.h"
#include "gpufleet/api/server.h"
#include "gpufleet/api/tenancy.h"
#include "gpufleet/store/read_modify_write.h"
#include "gpufleet/wire/deployment_spec.h"

namespace gpufleet::api {
namespace {

// Agents report whole percents; the autoscaler takes milli.
constexpr int64_t kMilliPerPercent = 10;

Status DeploymentNotFound(std::string_view name) {
  return NotFoundError(fmt::format("deployment \"{}\" not found", name));
}

Json DeploymentOutput(const store::StoredObject& object) {
  Json doc = wire::ParseDocument(object.data);
  doc["version"] = object.version;
  return doc;
}

// Who the controller acts as for a deployment's replicas: its creator's role and team.
Principal ReplicaOwner(const Json& doc) {
  return Principal{wire::BoolOr(doc, "created_by_admin", false) ? Role::kAdmin : Role::kMember,
                   wire::StrOr(doc, "team"),
                   fmt::format("deployment/{}", wire::StrOr(doc, "name"))};
}

}  // namespace

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

std::optional<ApiResponse> ApiServer::RouteDeployments(
    const Principal& who, const ApiRequest& request,
    const std::vector<std::string_view>& segments) {
  if (segments.size() < 2 || segments[1] != "deployments") {
    return std::nullopt;
  }
  const size_t n = segments.size();
  if (n == 2 && request.method == "POST") {
    Result<wire::DeploymentSpec> spec = wire::ParseDeploymentSpec(request.body, options_.catalog);
    if (!spec.ok()) {
      return ErrorResponse(spec.status());
    }
    if (Status status = CheckScopedName("name", spec->name); !status.ok()) {
      return ErrorResponse(status);
    }
    if (Status status = CheckSubmission(who, spec->queue); !status.ok()) {
      return ErrorResponse(status);
    }
    const std::string key = TeamScopedKey(who.team, spec->name);
    Json doc = wire::DeploymentSpecToJson(*spec);
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
    batch.Create(std::string(kDeploymentsKind), key, doc.dump());
    batch.AppendEvent(std::string(kDeploymentsKind), key,
                      fmt::format("created by {} with {} replicas", wire::StrOr(doc, "created_by"),
                                  spec->autoscaling.min_replicas));
    if (Status status = options_.store.Commit(batch); !status.ok()) {
      // Names are scoped by team: the deployment that exists is the creator's team's own.
      return ErrorResponse(
          status.code() == StatusCode::kAlreadyExists
              ? AlreadyExistsError(fmt::format("deployment \"{}\" already exists in team \"{}\"",
                                               spec->name, who.team))
              : status);
    }
    doc["version"] = 1;
    return JsonResponse(201, doc);
  }
  // NAME or TEAM/NAME (docs/api.md, "Names").
  const std::optional<ScopedPath> path = ParseScopedPath(segments, request.method);
  const bool one = path && path->action.empty();
  const bool events = path && path->action == "events";
  const bool get = request.method == "GET";
  if (one || events) {
    if (!get && (events || (request.method != "DELETE" && request.method != "PATCH"))) {
      return std::nullopt;
    }
    const Result<std::string> key = ResolveName(who, kDeploymentsKind, "deployment", path->name);
    if (!key.ok()) {
      return ErrorResponse(key.status());
    }
    if (request.method == "DELETE") {
      return DeleteDeployment(who, *key);
    }
    if (request.method == "PATCH") {
      return UpdateDeployment(who, *key, request.body);
    }
    const Result<store::StoredObject> object =
        ReadVisible(who, kDeploymentsKind, *key, DeploymentNotFound(*key));
    if (!object.ok()) {
      return ErrorResponse(object.status());
    }
    Json doc = DeploymentOutput(*object);
    return one ? JsonResponse(200, doc) : ObjectEvents(kDeploymentsKind, *key);
  }
  if (n == 2 && get) {
    const Result<std::vector<store::StoredObject>> objects = options_.store.List(kDeploymentsKind);
    if (!objects.ok()) {
      return ErrorResponse(objects.status());
    }
    Json items = Json::array();
    for (const store::StoredObject& object : *objects) {
      Json doc = DeploymentOutput(object);
      if (who.Sees(wire::StrOr(doc, "team"))) {
        items.push_back(std::move(doc));
      }
    }
    return JsonResponse(200, {{"items", std::move(items)}});
  }
  return std::nullopt;
}

ApiResponse ApiServer::DeleteDeployment(const Principal& who, std::string_view name) {
  // Under the cycle's lock the controller cannot submit a replica between the cancels and the
  // removal, and the scheduling view and the autoscalers may be read and changed.
  std::lock_guard<std::mutex> lock(cycle_mu_);
  const Result<store::StoredObject> object =
      ReadVisible(who, kDeploymentsKind, name, DeploymentNotFound(name));
  if (!object.ok()) {
    return ErrorResponse(object.status());
  }
  const Json doc = wire::ParseDocument(object->data);
  // The replicas the deployment last stored, and any the view knows of that it has not stored yet.
  // Keys: the stored replicas are named without their team, the deployment's.
  const std::string team = wire::StrOr(doc, "team");
  std::set<std::string> replicas;
  if (const auto stored = doc.find("replicas"); stored != doc.end() && stored->is_array()) {
    for (const Json& replica : *stored) {
      if (replica.is_string()) {
        replicas.insert(TeamScopedKey(team, replica.get<std::string>()));
      }
    }
  }
  for (const auto& [job_name, job] : view_->jobs()) {
    const Json job_doc = wire::ParseDocument(job.data);
    if (wire::ReplicaIndex(name, job_name) >= 0 &&
        IsLiveReplicaState(job.state, job.stopping_then) && wire::StrOr(job_doc, "team") == team &&
        wire::StringMapOr(job_doc, "labels")[std::string(wire::kDeploymentLabel)] ==
            NameOfKey(name)) {
      replicas.insert(job_name);
    }
  }
  // Cancelled through the controller's own path, as the deployment's creator. A replica that has
  // ended cannot be cancelled and needs nothing; any other failure is reported and stops the
  // delete, so that no replica outlives its deployment unseen.
  const Principal owner = ReplicaOwner(doc);
  std::vector<std::string> cancelled;
  for (const std::string& replica : replicas) {
    const ApiResponse response = CancelJob(owner, replica);
    if (response.status == 200) {
      cancelled.push_back(std::string(NameOfKey(replica)));
    } else if (response.status != 400 && response.status != 404) {  // ended, or gone
      return ErrorResponse(
          Status(StatusCode::kUnavailable,
                 fmt::format("replica {} not cancelled: {}", replica,
                             wire::StrOr(wire::ParseDocument(response.body)["error"], "message"))));
    }
  }
  const std::string by = who.name.empty() ? RoleName(who.role) : who.name;
  store::WriteBatch batch;
  batch.Delete(std::string(kDeploymentsKind), std::string(name));
  batch.AppendEvent(std::string(kDeploymentsKind), std::string(name),
                    fmt::format("deleted by {}; replicas cancelled: {}", by,
                                cancelled.empty() ? std::string("none")
                                                  : fmt::format("{}", fmt::join(cancelled, ", "))));
  if (Status status = options_.store.Commit(batch); !status.ok()) {
    return ErrorResponse(status.code() == StatusCode::kNotFound ? DeploymentNotFound(name)
                                                                : status);
  }
  autoscalers_.erase(std::string(name));
  if (!cancelled.empty()) {
    if (Status status = view_->Refresh(); !status.ok()) {
      return ErrorResponse(status);
    }
  }
  return JsonResponse(200, {{"name", std::string(NameOfKey(name))},
                            {"team", team},
                            {"deleted", true},
                            {"cancelled_replicas", Json(cancelled)}});
}

ApiResponse ApiServer::UpdateDeployment(const Principal& who, std::string_view name,
                                        std::string_view body) {
  const Json patch = Json::parse(body, nullptr, false);
  if (patch.is_discarded() || !patch.is_object()) {
    return ErrorResponse(InvalidArgumentError(
        "deployment update: must be a JSON object such as {\"autoscaling\": {...}}"));
  }
  for (const auto& [key, value] : patch.items()) {
    if (key == "template") {
      return ErrorResponse(
          InvalidArgumentError("template: cannot be changed; create a new deployment"));
    }
    if (key != "autoscaling") {
      return ErrorResponse(InvalidArgumentError(
          fmt::format("{}: cannot be changed (an update changes autoscaling only)", key)));
    }
    if (!value.is_object()) {
      return ErrorResponse(
          InvalidArgumentError(fmt::format("autoscaling: {} (must be an object)", value.dump())));
    }
  }
  std::lock_guard<std::mutex> lock(cycle_mu_);  // the autoscalers are the cycle's
  ApiResponse response;
  std::optional<policy::Autoscaler> updated_autoscaler;
  const Status committed = store::CommitWithRetries(
      options_.store, kCasAttempts,
      fmt::format("deployment \"{}\" changed concurrently; retry", name),
      [&]() -> store::AttemptResult {
        const Result<store::StoredObject> object =
            ReadVisible(who, kDeploymentsKind, name, DeploymentNotFound(name));
        if (!object.ok()) {
          response = ErrorResponse(object.status());
          return store::NoWrite();
        }
        Json doc = wire::ParseDocument(object->data);
        // A merge: the fields named change, a null one returns to its default, the others stay.
        const Json before = doc["autoscaling"];
        Json merged = before.is_object() ? before : Json::object();
        const Json asked = patch.contains("autoscaling") ? patch["autoscaling"] : Json::object();
        for (const auto& [key, value] : asked.items()) {
          if (value.is_null()) {
            merged.erase(key);
          } else {
            merged[key] = value;
          }
        }
        Json candidate = doc;
        candidate["autoscaling"] = merged;
        const Result<wire::DeploymentSpec> spec =
            wire::DeploymentSpecFromJson(candidate, options_.catalog);
        if (!spec.ok()) {
          response = ErrorResponse(spec.status());
          return store::NoWrite();
        }
        Result<policy::Autoscaler> autoscaler = policy::Autoscaler::Create(spec->autoscaling);
        if (!autoscaler.ok()) {
          response = ErrorResponse(autoscaler.status());
          return store::NoWrite();
        }
        doc["autoscaling"] = wire::DeploymentSpecToJson(*spec)["autoscaling"];
        std::vector<std::string> changes;
        for (const auto& [key, value] : doc["autoscaling"].items()) {
          const Json old_value = before.is_object() && before.contains(key) ? before[key] : Json();
          if (old_value != value) {
            changes.push_back(fmt::format("{} {} -> {}", key, old_value.dump(), value.dump()));
          }
        }
        if (changes.empty()) {
          response = JsonResponse(200, DeploymentOutput(*object));
          return store::NoWrite();
        }
        const std::string by = who.name.empty() ? RoleName(who.role) : who.name;
        store::WriteBatch batch;
        batch.Update(std::string(kDeploymentsKind), std::string(name), doc.dump(), object->version);
        batch.AppendEvent(
            std::string(kDeploymentsKind), std::string(name),
            fmt::format("autoscaling updated by {}: {}", by, fmt::join(changes, ", ")));
        // A conflict is the controller's status write: merged into the new version.
        updated_autoscaler = std::move(*autoscaler);
        doc["version"] = object->version + 1;
        response = JsonResponse(200, doc);
        return store::Write(std::move(batch));
      });
  if (!committed.ok()) {
    return ErrorResponse(committed);
  }
  if (updated_autoscaler) {
    // The next step decides from the stored desired count with the new options; the
    // stabilization history of the old options does not carry over.
    autoscalers_.insert_or_assign(std::string(name), std::move(*updated_autoscaler));
  }
  return response;
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
  // Replica jobs by deployment: named NAME-r<k>, labelled deployment=NAME, of its team; keyed
  // TEAM/NAME-r<k> beside the deployment's TEAM/NAME.
  std::map<std::string, std::string> team_of;
  for (const store::StoredObject& object : deployments) {
    team_of[object.name] = wire::StrOr(wire::ParseDocument(object.data), "team");
  }
  std::map<std::string, std::vector<ReplicaJob>> replicas;
  for (const auto& [name, job] : view_->jobs()) {
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
    const Result<wire::DeploymentSpec> spec = wire::DeploymentSpecFromJson(doc, options_.catalog);
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
    {
      std::lock_guard<std::mutex> lock(agents_mu_);
      for (const std::string& name : before.keep) {
        const ViewJob& job = view_->jobs().at(name);
        if (job.state != JobState::kRunning) {
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
    // Stored and shown without the team, as the deployment's own name is.
    Json names = Json::array();
    for (const std::string& kept : plan.keep) {
      names.push_back(NameOfKey(kept));
    }
    int64_t index = plan.create.empty() ? next_index : plan.create.front();
    for (size_t made = 0, attempts = 0; made < plan.create.size(); ++index) {
      ApiRequest submit;
      submit.method = "POST";
      submit.body = wire::ReplicaJobSpec(*spec, index);
      const ApiResponse response = SubmitJob(owner, submit);
      if (response.status == 201) {
        names.push_back(wire::ReplicaJobName(wire::StrOr(doc, "name"), index));
        jobs_changed = true;
        ++made;
        continue;
      }
      // A job of that name may exist (an ended replica whose index was not stored): try the next.
      if (response.status == 409 && ++attempts < static_cast<size_t>(kCasAttempts)) {
        continue;
      }
      reason += fmt::format("; replica {} not created: {}",
                            wire::ReplicaJobName(wire::StrOr(doc, "name"), index),
                            wire::StrOr(wire::ParseDocument(response.body)["error"], "message"));
      break;
    }
    for (const std::string& name : plan.cancel) {
      const ApiResponse response = CancelJob(owner, name);
      jobs_changed = true;
      if (response.status != 200) {
        const std::string error =
            wire::StrOr(wire::ParseDocument(response.body)["error"], "message");
        reason += fmt::format("; replica {} not cancelled: {}", NameOfKey(name), error);
        names.push_back(NameOfKey(name));
      }
    }

    const Json utilization_pct =
        ready == 0 ? Json(nullptr) : Json(utilization_milli / kMilliPerPercent);
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
