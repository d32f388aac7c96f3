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
#include "gpufleet/api/tenancy.h"

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
    Result<DeploymentSpec> spec = ParseDeploymentSpec(request.body, options_.catalog);
    if (!spec.ok()) {
      return Error(spec.status());
    }
    if (Status status = CheckScopedName("name", spec->name); !status.ok()) {
      return Error(status);
    }
    if (Status status = CheckSubmission(who, spec->queue); !status.ok()) {
      return Error(status);
    }
    const std::string key = TeamScopedKey(who.team, spec->name);
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
    batch.Create(std::string(kDeploymentsKind), key, doc.dump());
    batch.AppendEvent(std::string(kDeploymentsKind), key,
                      fmt::format("created by {} with {} replicas", StrOr(doc, "created_by"),
                                  spec->autoscaling.min_replicas));
    if (Status status = options_.store.Commit(batch); !status.ok()) {
      // Names are scoped by team: the deployment that exists is the creator's team's own.
      return Error(
          status.code() == StatusCode::kAlreadyExists
              ? AlreadyExistsError(fmt::format("deployment \"{}\" already exists in team \"{}\"",
                                               spec->name, who.team))
              : status);
    }
    doc["version"] = 1;
    return Reply(201, doc);
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
      return Error(key.status());
    }
    if (request.method == "DELETE") {
      return DeleteDeployment(who, *key);
    }
    if (request.method == "PATCH") {
      return UpdateDeployment(who, *key, request.body);
    }
    const Result<store::StoredObject> object = options_.store.Get(kDeploymentsKind, *key);
    if (!object.ok()) {
      return Error(object.status().code() == StatusCode::kNotFound ||
                           object.status().code() == StatusCode::kInvalidArgument
                       ? DeploymentNotFound(*key)
                       : object.status());
    }
    Json doc = DeploymentOutput(*object);
    if (!CanSeeDeployment(who, doc)) {
      return Error(DeploymentNotFound(*key));
    }
    return one ? Reply(200, doc) : ObjectEvents(kDeploymentsKind, *key);
  }
  if (n == 2 && get) {
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
  return std::nullopt;
}

ApiResponse ApiServer::DeleteDeployment(const Principal& who, std::string_view name) {
  // Under the cycle's lock the controller cannot submit a replica between the cancels and the
  // removal, and the scheduling view and the autoscalers may be read and changed.
  std::lock_guard<std::mutex> lock(cycle_mu_);
  const Result<store::StoredObject> object = options_.store.Get(kDeploymentsKind, name);
  if (!object.ok()) {
    return Error(object.status().code() == StatusCode::kNotFound ||
                         object.status().code() == StatusCode::kInvalidArgument
                     ? DeploymentNotFound(name)
                     : object.status());
  }
  const Json doc = ParseDocument(object->data);
  if (!CanSeeDeployment(who, doc)) {
    return Error(DeploymentNotFound(name));
  }
  // The replicas the deployment last stored, and any the view knows of that it has not stored yet.
  // Keys: the stored replicas are named without their team, the deployment's.
  const std::string team = StrOr(doc, "team");
  std::set<std::string> replicas;
  if (const auto stored = doc.find("replicas"); stored != doc.end() && stored->is_array()) {
    for (const Json& replica : *stored) {
      if (replica.is_string()) {
        replicas.insert(TeamScopedKey(team, replica.get<std::string>()));
      }
    }
  }
  for (const auto& [job_name, job] : view_->jobs()) {
    const Json job_doc = ParseDocument(job.data);
    if (ReplicaIndex(name, job_name) >= 0 && IsLiveReplicaState(job.state, job.stopping_then) &&
        StrOr(job_doc, "team") == team &&
        StringMapOr(job_doc, "labels")[std::string(kDeploymentLabel)] == NameOfKey(name)) {
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
      return Error(Status(StatusCode::kUnavailable,
                          fmt::format("replica {} not cancelled: {}", replica,
                                      StrOr(ParseDocument(response.body)["error"], "message"))));
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
    return Error(status.code() == StatusCode::kNotFound ? DeploymentNotFound(name) : status);
  }
  autoscalers_.erase(std::string(name));
  if (!cancelled.empty()) {
    if (Status status = view_->Refresh(); !status.ok()) {
      return Error(status);
    }
  }
  return Reply(200, {{"name", std::string(NameOfKey(name))},
                     {"team", team},
                     {"deleted", true},
                     {"cancelled_replicas", Json(cancelled)}});
}

ApiResponse ApiServer::UpdateDeployment(const Principal& who, std::string_view name,
                                        std::string_view body) {
  const Json patch = Json::parse(body, nullptr, false);
  if (patch.is_discarded() || !patch.is_object()) {
    return Error(InvalidArgumentError(
        "deployment update: must be a JSON object such as {\"autoscaling\": {...}}"));
  }
  for (const auto& [key, value] : patch.items()) {
    if (key == "template") {
      return Error(InvalidArgumentError("template: cannot be changed; create a new deployment"));
    }
    if (key != "autoscaling") {
      return Error(InvalidArgumentError(
          fmt::format("{}: cannot be changed (an update changes autoscaling only)", key)));
    }
    if (!value.is_object()) {
      return Error(
          InvalidArgumentError(fmt::format("autoscaling: {} (must be an object)", value.dump())));
    }
  }
  std::lock_guard<std::mutex> lock(cycle_mu_);  // the autoscalers are the cycle's
  for (int attempt = 0; attempt < kCasAttempts; ++attempt) {
    const Result<store::StoredObject> object = options_.store.Get(kDeploymentsKind, name);
    if (!object.ok()) {
      return Error(object.status().code() == StatusCode::kNotFound ||
                           object.status().code() == StatusCode::kInvalidArgument
                       ? DeploymentNotFound(name)
                       : object.status());
    }
    Json doc = ParseDocument(object->data);
    if (!CanSeeDeployment(who, doc)) {
      return Error(DeploymentNotFound(name));
    }
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
    const Result<DeploymentSpec> spec = DeploymentSpecFromJson(candidate, options_.catalog);
    if (!spec.ok()) {
      return Error(spec.status());
    }
    Result<policy::Autoscaler> autoscaler = policy::Autoscaler::Create(spec->autoscaling);
    if (!autoscaler.ok()) {
      return Error(autoscaler.status());
    }
    doc["autoscaling"] = DeploymentSpecToJson(*spec)["autoscaling"];
    std::vector<std::string> changes;
    for (const auto& [key, value] : doc["autoscaling"].items()) {
      const Json old_value = before.is_object() && before.contains(key) ? before[key] : Json();
      if (old_value != value) {
        changes.push_back(fmt::format("{} {} -> {}", key, old_value.dump(), value.dump()));
      }
    }
    if (changes.empty()) {
      return Reply(200, DeploymentOutput(*object));
    }
    const std::string by = who.name.empty() ? RoleName(who.role) : who.name;
    store::WriteBatch batch;
    batch.Update(std::string(kDeploymentsKind), std::string(name), doc.dump(), object->version);
    batch.AppendEvent(std::string(kDeploymentsKind), std::string(name),
                      fmt::format("autoscaling updated by {}: {}", by, fmt::join(changes, ", ")));
    const Status status = options_.store.Commit(batch);
    if (status.code() == StatusCode::kAborted) {
      continue;  // the controller wrote its status meanwhile: merge into the new version
    }
    if (!status.ok()) {
      return Error(status);
    }
    // The next step decides from the stored desired count with the new options; the
    // stabilization history of the old options does not carry over.
    autoscalers_.insert_or_assign(std::string(name), std::move(*autoscaler));
    doc["version"] = object->version + 1;
    return Reply(200, doc);
  }
  return Error(Status(StatusCode::kAborted,
                      fmt::format("deployment \"{}\" changed concurrently; retry", name)));
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
        StringMapOr(doc, "labels")[std::string(kDeploymentLabel)] != NameOfKey(deployment)) {
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
      submit.body = ReplicaJobSpec(*spec, index);
      const ApiResponse response = SubmitJob(owner, submit);
      if (response.status == 201) {
        names.push_back(ReplicaJobName(StrOr(doc, "name"), index));
        jobs_changed = true;
        ++made;
        continue;
      }
      // A job of that name may exist (an ended replica whose index was not stored): try the next.
      if (response.status == 409 && ++attempts < static_cast<size_t>(kCasAttempts)) {
        continue;
      }
      reason +=
          fmt::format("; replica {} not created: {}", ReplicaJobName(StrOr(doc, "name"), index),
                      StrOr(ParseDocument(response.body)["error"], "message"));
      break;
    }
    for (const std::string& name : plan.cancel) {
      const ApiResponse response = CancelJob(owner, name);
      jobs_changed = true;
      if (response.status != 200) {
        const std::string error = StrOr(ParseDocument(response.body)["error"], "message");
        reason += fmt::format("; replica {} not cancelled: {}", NameOfKey(name), error);
        names.push_back(NameOfKey(name));
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
