// SPDX-License-Identifier: Apache-2.0
// The routes of deployments of inference replica jobs (docs/api.md, "Deployments"); their
// autoscaling is a step of the control plane's cycle (docs/utilization.md, "Inference
// autoscaling").
#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "gpufleet/api/routes.h"
#include "gpufleet/control/deployment_controller.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/store/read_modify_write.h"
#include "gpufleet/wire/deployment_spec.h"

namespace gpufleet::api {
namespace {

Status DeploymentNotFound(std::string_view name) {
  return NotFoundError(fmt::format("deployment \"{}\" not found", name));
}

Json DeploymentOutput(const store::StoredObject& object) {
  Json doc = wire::ParseDocument(object.data);
  doc["version"] = object.version;
  return doc;
}

}  // namespace

std::optional<ApiResponse> ApiRoutes::RouteDeployments(
    const control::Principal& who, const ApiRequest& request,
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
    if (Status status = control::CheckScopedName("name", spec->name); !status.ok()) {
      return ErrorResponse(status);
    }
    if (Status status = CheckSubmission(who, spec->queue, spec->host_network); !status.ok()) {
      return ErrorResponse(status);
    }
    const std::string key = control::TeamScopedKey(who.team, spec->name);
    Json doc = wire::DeploymentSpecToJson(*spec);
    doc["team"] = who.team;
    doc["created_by"] = who.name.empty() ? control::RoleName(who.role) : who.name;
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
    batch.Create(std::string(control::kDeploymentsKind), key, doc.dump());
    batch.AppendEvent(std::string(control::kDeploymentsKind), key,
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
  const std::optional<control::ScopedPath> path =
      control::ParseScopedPath(segments, request.method);
  const bool one = path && path->action.empty();
  const bool events = path && path->action == "events";
  const bool get = request.method == "GET";
  if (one || events) {
    if (!get && (events || (request.method != "DELETE" && request.method != "PATCH"))) {
      return std::nullopt;
    }
    const Result<std::string> key =
        ResolveName(who, control::kDeploymentsKind, "deployment", path->name);
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
        ReadVisible(who, control::kDeploymentsKind, *key, DeploymentNotFound(*key));
    if (!object.ok()) {
      return ErrorResponse(object.status());
    }
    Json doc = DeploymentOutput(*object);
    return one ? JsonResponse(200, doc) : ObjectEvents(control::kDeploymentsKind, *key);
  }
  if (n == 2 && get) {
    const Result<std::vector<store::StoredObject>> objects =
        options_.store.List(control::kDeploymentsKind);
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

ApiResponse ApiRoutes::DeleteDeployment(const control::Principal& who, std::string_view name) {
  // Under the cycle's lock the controller cannot submit a replica between the cancels and the
  // removal, and the scheduling view and the autoscalers may be read and changed.
  std::lock_guard<std::mutex> lock(control_->cycle_mutex());
  const Result<store::StoredObject> object =
      ReadVisible(who, control::kDeploymentsKind, name, DeploymentNotFound(name));
  if (!object.ok()) {
    return ErrorResponse(object.status());
  }
  const Json doc = wire::ParseDocument(object->data);
  const std::string team = wire::StrOr(doc, "team");
  // Cancelled through the controller's own path, as the deployment's creator. A replica that has
  // ended cannot be cancelled and needs nothing; any other failure is reported and stops the
  // delete, so that no replica outlives its deployment unseen.
  const control::Principal owner = control::ReplicaOwner(doc);
  std::vector<std::string> cancelled;
  for (const std::string& replica :
       control::LiveReplicasOf(std::string(name), doc, control_->view().jobs())) {
    const Result<Json> response = CancelJob(owner, replica);
    const StatusCode code = response.status().code();
    if (response.ok()) {
      cancelled.push_back(std::string(control::NameOfKey(replica)));
    } else if (store::IsNotLeaderError(response.status())) {
      return ErrorResponse(response.status());  // deposed: the leader deletes it
    } else if (code != StatusCode::kFailedPrecondition && code != StatusCode::kInvalidArgument &&
               code != StatusCode::kNotFound) {  // ended, or gone
      return ErrorResponse(Status(
          StatusCode::kUnavailable,
          fmt::format("replica {} not cancelled: {}", replica, response.status().message())));
    }
  }
  const std::string by = who.name.empty() ? control::RoleName(who.role) : who.name;
  store::WriteBatch batch;
  batch.Delete(std::string(control::kDeploymentsKind), std::string(name));
  batch.AppendEvent(std::string(control::kDeploymentsKind), std::string(name),
                    fmt::format("deleted by {}; replicas cancelled: {}", by,
                                cancelled.empty() ? std::string("none")
                                                  : fmt::format("{}", fmt::join(cancelled, ", "))));
  if (Status status = options_.store.Commit(batch); !status.ok()) {
    return ErrorResponse(status.code() == StatusCode::kNotFound ? DeploymentNotFound(name)
                                                                : status);
  }
  control_->deployments().Forget(std::string(name));
  if (!cancelled.empty()) {
    if (Status status = control_->view().Refresh(); !status.ok()) {
      return ErrorResponse(status);
    }
  }
  return JsonResponse(200, {{"name", std::string(control::NameOfKey(name))},
                            {"team", team},
                            {"deleted", true},
                            {"cancelled_replicas", Json(cancelled)}});
}

ApiResponse ApiRoutes::UpdateDeployment(const control::Principal& who, std::string_view name,
                                        std::string_view body) {
  const Result<Json> parsed = wire::ParseJson(body);
  if (!parsed.ok() || !parsed->is_object()) {
    return ErrorResponse(InvalidArgumentError(fmt::format(
        "deployment update: must be a JSON object such as {{\"autoscaling\": {{...}}}}{}",
        parsed.ok() ? "" : fmt::format(" ({})", parsed.status().message()))));
  }
  const Json& patch = *parsed;
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
  std::lock_guard<std::mutex> lock(control_->cycle_mutex());  // the autoscalers are the cycle's
  ApiResponse response;
  std::optional<policy::Autoscaler> updated_autoscaler;
  const Status committed = store::CommitWithRetries(
      options_.store, control::kCasAttempts,
      fmt::format("deployment \"{}\" changed concurrently; retry", name),
      [&]() -> store::AttemptResult {
        const Result<store::StoredObject> object =
            ReadVisible(who, control::kDeploymentsKind, name, DeploymentNotFound(name));
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
        const std::string by = who.name.empty() ? control::RoleName(who.role) : who.name;
        store::WriteBatch batch;
        batch.Update(std::string(control::kDeploymentsKind), std::string(name), doc.dump(),
                     object->version);
        batch.AppendEvent(
            std::string(control::kDeploymentsKind), std::string(name),
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
    control_->deployments().SetAutoscaler(std::string(name), std::move(*updated_autoscaler));
  }
  return response;
}

}  // namespace gpufleet::api
