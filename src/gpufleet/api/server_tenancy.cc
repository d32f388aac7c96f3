// SPDX-License-Identifier: Apache-2.0
// The tenancy routes of ApiServer: tokens, teams and queues (docs/api.md), and the checks a job
// submission passes before it is stored.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/routes.h"
#include "gpufleet/control/deployment_controller.h"
#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/store/read_modify_write.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {
namespace {

Status NeedsAdmin(const control::Principal& who, std::string_view what) {
  if (who.is_admin()) {
    return Status::Ok();
  }
  return Status(StatusCode::kPermissionDenied, fmt::format("{} needs an admin token", what));
}

Json TokenInfoToJson(const TokenInfo& info) {
  Json out = {{"id", info.id},
              {"role", control::RoleName(info.role)},
              {"team", info.team},
              {"name", info.name}};
  if (!info.node.empty()) {
    out["node"] = info.node;
  }
  return out;
}

Json WithVersion(Json document, int64_t version) {
  document["version"] = version;
  return document;
}

// kInvalidArgument naming `field` when the team does not exist.
Status TeamMustExist(store::StateStore& store, std::string_view field, std::string_view team) {
  const Result<store::StoredObject> object = store.Get(control::kTeamsKind, team);
  if (object.ok()) {
    return Status::Ok();
  }
  if (object.status().code() == StatusCode::kNotFound) {
    return InvalidArgumentError(
        fmt::format("{}: team \"{}\" does not exist (an admin creates it: gpufleet create team {})",
                    field, team, team));
  }
  return object.status();
}

// Creates `document` as kind/name; 201 with the document and its version, 409 if it exists.
ApiResponse CreateObject(store::StateStore& store, std::string_view kind, const std::string& name,
                         const Json& document, std::string event) {
  store::WriteBatch batch;
  batch.Create(std::string(kind), name, document.dump());
  batch.AppendEvent(std::string(kind), name, std::move(event));
  if (Status status = store.Commit(batch); !status.ok()) {
    if (status.code() == StatusCode::kAlreadyExists) {
      // "teams" -> "team".
      const std::string_view singular = kind.substr(0, kind.size() - 1);
      return ErrorResponse(
          AlreadyExistsError(fmt::format("{} \"{}\" already exists", singular, name)));
    }
    return ErrorResponse(status);
  }
  return JsonResponse(201, WithVersion(document, 1));
}

std::string ActorName(const control::Principal& who) {
  return who.name.empty() ? control::RoleName(who.role) : who.name;
}

ApiResponse CreateToken(const control::Principal& who, const std::string& body,
                        store::StateStore& store, TokenAuthenticator& authenticator) {
  if (Status status = NeedsAdmin(who, "creating a token"); !status.ok()) {
    return ErrorResponse(status);
  }
  const Result<control::TokenRequest> request = control::ParseTokenRequest(body);
  if (!request.ok()) {
    return ErrorResponse(request.status());
  }
  if (!request->team.empty()) {
    if (Status status = TeamMustExist(store, "team", request->team); !status.ok()) {
      return ErrorResponse(status);
    }
  }
  const Result<std::string> token =
      authenticator.CreateToken(request->role, request->team, request->name, request->node);
  if (!token.ok()) {
    return ErrorResponse(token.status());
  }
  Json answer = TokenInfoToJson({.id = TokenId(*token),
                                 .role = request->role,
                                 .team = request->team,
                                 .name = request->name,
                                 .node = request->node});
  answer["token"] = *token;
  return JsonResponse(201, answer);
}

ApiResponse ListTokens(const control::Principal& who, const TokenAuthenticator& authenticator) {
  if (Status status = NeedsAdmin(who, "listing tokens"); !status.ok()) {
    return ErrorResponse(status);
  }
  const Result<std::vector<TokenInfo>> tokens = authenticator.ListTokens();
  if (!tokens.ok()) {
    return ErrorResponse(tokens.status());
  }
  Json items = Json::array();
  for (const TokenInfo& info : *tokens) {
    items.push_back(TokenInfoToJson(info));
  }
  return JsonResponse(200, {{"items", std::move(items)}});
}

ApiResponse RevokeToken(const control::Principal& who, std::string_view id,
                        TokenAuthenticator& authenticator) {
  if (Status status = NeedsAdmin(who, "revoking a token"); !status.ok()) {
    return ErrorResponse(status);
  }
  const Result<TokenInfo> revoked = authenticator.RevokeTokenById(id);
  if (!revoked.ok()) {
    return ErrorResponse(revoked.status());
  }
  Json answer = TokenInfoToJson(*revoked);
  answer["revoked"] = true;
  return JsonResponse(200, answer);
}

ApiResponse CreateTeam(const control::Principal& who, const std::string& body,
                       store::StateStore& store) {
  if (Status status = NeedsAdmin(who, "creating a team"); !status.ok()) {
    return ErrorResponse(status);
  }
  const Result<control::Team> team = control::ParseTeamRequest(body);
  if (!team.ok()) {
    return ErrorResponse(team.status());
  }
  return CreateObject(store, control::kTeamsKind, team->name, control::TeamToJson(*team),
                      fmt::format("created by {}", ActorName(who)));
}

ApiResponse ListObjects(store::StateStore& store, std::string_view kind) {
  const Result<std::vector<store::StoredObject>> objects = store.List(kind);
  if (!objects.ok()) {
    return ErrorResponse(objects.status());
  }
  Json items = Json::array();
  for (const store::StoredObject& object : *objects) {
    items.push_back(WithVersion(wire::ParseDocument(object.data), object.version));
  }
  return JsonResponse(200, {{"items", std::move(items)}});
}

ApiResponse CreateQueue(const control::Principal& who, const std::string& body,
                        store::StateStore& store, const GpuCatalog& catalog) {
  if (Status status = NeedsAdmin(who, "creating a queue"); !status.ok()) {
    return ErrorResponse(status);
  }
  const Result<control::Queue> queue = control::ParseQueueRequest(body, catalog);
  if (!queue.ok()) {
    return ErrorResponse(queue.status());
  }
  if (!queue->team.empty()) {
    if (Status status = TeamMustExist(store, "team", queue->team); !status.ok()) {
      return ErrorResponse(status);
    }
  }
  // The new queue must fit the tree: its guarantee within its parent's, its children's within its
  // own.
  const Result<std::vector<store::StoredObject>> stored = store.List(control::kQueuesKind);
  if (!stored.ok()) {
    return ErrorResponse(stored.status());
  }
  std::vector<control::Queue> queues = {*queue};
  for (const store::StoredObject& object : *stored) {
    queues.push_back(control::QueueFromJson(wire::ParseDocument(object.data)));
  }
  if (const Result<policy::QueueTree> tree = control::BuildQueueTree(queues); !tree.ok()) {
    return ErrorResponse(tree.status());
  }
  return CreateObject(store, control::kQueuesKind, queue->name, control::QueueToJson(*queue),
                      fmt::format("created by {}", ActorName(who)));
}

// "guarantee {"H100-80GB":16} -> {"H100-80GB":8}, weight 1 -> 2": the fields that differ.
std::string QuotaChanges(const Json& before, const Json& after) {
  std::vector<std::string> changes;
  for (const char* field : {"guarantee", "limit", "weight", "may_borrow", "min_runtime"}) {
    // A queue without a minimum runtime stores none: null.
    const Json was = before.value(field, Json());
    const Json now = after.value(field, Json());
    if (was != now) {
      changes.push_back(fmt::format("{} {} -> {}", field, was.dump(), now.dump()));
    }
  }
  return fmt::format("{}", fmt::join(changes, ", "));
}

// PATCH /v1/queues/NAME: merges the quota fields into the stored queue, validated against the
// tree as creation is, with a compare-and-set update. Running jobs are not stopped: the next
// cycles admit and reclaim by the new quota.
ApiResponse PatchQueue(const control::Principal& who, std::string_view name,
                       const std::string& body, store::StateStore& store,
                       const GpuCatalog& catalog) {
  if (Status status = NeedsAdmin(who, "changing a queue"); !status.ok()) {
    return ErrorResponse(status);
  }
  const Result<control::QueuePatch> patch = control::ParseQueuePatch(body, catalog);
  if (!patch.ok()) {
    return ErrorResponse(patch.status());
  }
  ApiResponse response;
  const Status committed = store::CommitWithRetries(
      store, control::kCasAttempts,
      fmt::format("queue \"{}\" kept changing; retry the update", name),
      [&]() -> store::AttemptResult {
        const Result<std::vector<store::StoredObject>> stored = store.List(control::kQueuesKind);
        if (!stored.ok()) {
          response = ErrorResponse(stored.status());
          return store::NoWrite();
        }
        const auto object =
            std::find_if(stored->begin(), stored->end(),
                         [&](const store::StoredObject& queue) { return queue.name == name; });
        if (object == stored->end()) {
          response = ErrorResponse(NotFoundError(fmt::format("queue \"{}\" not found", name)));
          return store::NoWrite();
        }
        if (patch->version && *patch->version != object->version) {
          response = ErrorResponse(
              Status(StatusCode::kAborted,
                     fmt::format(
                         "version: queue \"{}\" is at version {}, not {} (read it again and retry)",
                         name, object->version, *patch->version)));
          return store::NoWrite();
        }
        const control::Queue before = control::QueueFromJson(wire::ParseDocument(object->data));
        const control::Queue after = control::ApplyQueuePatch(before, *patch);
        const Json before_document = control::QueueToJson(before);
        const Json after_document = control::QueueToJson(after);
        if (after_document == before_document) {
          response = JsonResponse(200, WithVersion(after_document, object->version));
          return store::NoWrite();
        }
        // The changed queue must still fit the tree, as a new one must.
        std::vector<control::Queue> queues;
        for (const store::StoredObject& other : *stored) {
          queues.push_back(
              &other == &*object ? after : control::QueueFromJson(wire::ParseDocument(other.data)));
        }
        if (const Result<policy::QueueTree> tree = control::BuildQueueTree(queues); !tree.ok()) {
          response = ErrorResponse(tree.status());
          return store::NoWrite();
        }
        store::WriteBatch batch;
        batch.Update(std::string(control::kQueuesKind), std::string(name), after_document.dump(),
                     object->version);
        batch.AppendEvent(std::string(control::kQueuesKind), std::string(name),
                          fmt::format("quota changed by {}: {}", ActorName(who),
                                      QuotaChanges(before_document, after_document)));
        response = JsonResponse(200, WithVersion(after_document, object->version + 1));
        return store::Write(std::move(batch));
      });
  return committed.ok() ? response : ErrorResponse(committed);
}

// The finished job states: a finished job keeps its queue's name as history and is no reason to
// keep the queue.
bool JobIsFinished(std::string_view state) {
  const std::optional<control::JobState> typed = control::ParseJobState(state);
  return typed && control::IsFinished(*typed);
}

// "2 jobs not finished (train-1, train-2)": at most `shown` names, then a count.
std::string NamesInTheWay(std::string_view what, const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  const std::vector<std::string> shown(names.begin(),
                                       names.begin() + std::min(names.size(), kShown));
  return fmt::format("{} {} ({}{})", names.size(), what, fmt::join(shown, ", "),
                     names.size() > kShown ? fmt::format(", {} more", names.size() - kShown) : "");
}

// DELETE /v1/queues/NAME: removes the queue and its saved usage, refused (409) while child queues,
// unfinished jobs or deployments use it. A job submitted between the check and the delete is not
// lost: the cycles treat a job of an unknown queue as the default queue's.
ApiResponse DeleteQueue(const control::Principal& who, const std::string& name,
                        store::StateStore& store) {
  if (Status status = NeedsAdmin(who, "deleting a queue"); !status.ok()) {
    return ErrorResponse(status);
  }
  if (name == control::kDefaultQueue) {
    return ErrorResponse(FailedPreconditionError(
        fmt::format("queue \"{}\" cannot be deleted: jobs without metadata.queue go there", name)));
  }
  const Result<store::StoredObject> queue = store.Get(control::kQueuesKind, name);
  if (!queue.ok()) {
    return ErrorResponse(queue.status().code() == StatusCode::kNotFound ||
                                 queue.status().code() == StatusCode::kInvalidArgument
                             ? NotFoundError(fmt::format("queue \"{}\" not found", name))
                             : queue.status());
  }
  const Result<std::vector<store::StoredObject>> children =
      store.List(control::kQueuesKind, fmt::format("{}/", name));
  const Result<std::vector<store::StoredObject>> jobs =
      store.ListWhere(control::kJobsKind, control::UnfinishedJobs());
  const Result<std::vector<store::StoredObject>> deployments =
      store.List(control::kDeploymentsKind);
  for (const auto* listed : {&children, &jobs, &deployments}) {
    if (!listed->ok()) {
      return ErrorResponse(listed->status());
    }
  }
  std::vector<std::string> in_the_way;
  std::vector<std::string> child_names;
  for (const store::StoredObject& child : *children) {
    child_names.push_back(child.name);
  }
  if (!child_names.empty()) {
    in_the_way.push_back(NamesInTheWay("child queues", child_names));
  }
  std::vector<std::string> job_names;
  for (const store::StoredObject& object : *jobs) {
    const Json job = wire::ParseDocument(object.data);
    if (wire::StrOr(job, "queue", std::string(control::kDefaultQueue)) == name &&
        !JobIsFinished(wire::StrOr(job, "state"))) {
      job_names.push_back(object.name);
    }
  }
  if (!job_names.empty()) {
    in_the_way.push_back(NamesInTheWay("jobs not finished", job_names));
  }
  // A deployment's replicas to come would be refused by a queue that is gone.
  std::vector<std::string> deployment_names;
  for (const store::StoredObject& object : *deployments) {
    if (wire::StrOr(wire::ParseDocument(object.data), "queue",
                    std::string(control::kDefaultQueue)) == name) {
      deployment_names.push_back(object.name);
    }
  }
  if (!deployment_names.empty()) {
    in_the_way.push_back(NamesInTheWay("deployments", deployment_names));
  }
  if (!in_the_way.empty()) {
    return ErrorResponse(FailedPreconditionError(
        fmt::format("queue \"{}\" is in use: {}; delete or finish them first", name,
                    fmt::join(in_the_way, "; "))));
  }
  // The queue at the version read (a concurrent PATCH makes this a 409 to retry), and its usage
  // entry, in one commit; the next cycle rebuilds the tree without it.
  store::WriteBatch batch;
  batch.Delete(std::string(control::kQueuesKind), name, queue->version);
  batch.AppendEvent(std::string(control::kQueuesKind), name,
                    fmt::format("deleted by {}", ActorName(who)));
  const Result<store::StoredObject> usage =
      store.Get(control::kQueueUsageKind, control::kQueueUsageName);
  if (usage.ok()) {
    Json document = wire::ParseDocument(usage->data);
    if (document.contains("queues") && document["queues"].is_object() &&
        document["queues"].erase(name) > 0) {
      batch.Update(std::string(control::kQueueUsageKind), std::string(control::kQueueUsageName),
                   document.dump(), usage->version);
    }
  } else if (usage.status().code() != StatusCode::kNotFound) {
    return ErrorResponse(usage.status());
  }
  if (const Status status = store.Commit(batch); !status.ok()) {
    return ErrorResponse(
        status.code() == StatusCode::kAborted
            ? Status(StatusCode::kAborted, fmt::format("queue \"{}\" changed while it was being "
                                                       "deleted; retry",
                                                       name))
            : status);
  }
  return JsonResponse(200, {{"name", name}, {"deleted", true}});
}

// The queues with their jobs counted: pending, holding resources, and the GPUs they hold. A member
// sees every queue (to know where it may submit) but counts only its own team's jobs, and sees the
// scheduling loop's figures (borrowed, fair share, usage) of its team's and the shared queues.
// Queues that unfinished jobs name but that are not stored (data from before queues were objects)
// are listed too.
ApiResponse ListQueues(const control::Principal& who, store::StateStore& store,
                       const std::map<std::string, policy::QueueStatus>& status) {
  const Result<std::vector<store::StoredObject>> queue_objects = store.List(control::kQueuesKind);
  const Result<std::vector<store::StoredObject>> jobs =
      store.ListWhere(control::kJobsKind, control::UnfinishedJobs());
  if (!queue_objects.ok() || !jobs.ok()) {
    return ErrorResponse(!queue_objects.ok() ? queue_objects.status() : jobs.status());
  }
  struct QueueRow {
    Json document = Json::object();
    int64_t pending = 0;
    int64_t running = 0;
    int64_t gpu_milli = 0;
  };
  std::map<std::string, QueueRow> rows;
  for (const store::StoredObject& object : *queue_objects) {
    rows[object.name].document = WithVersion(wire::ParseDocument(object.data), object.version);
  }
  // Parents that were never created but that the queue tree implies; the tree may be a cycle
  // old, so only those of a queue still stored (not those of one just deleted).
  std::vector<std::string> implied;
  for (const auto& [name, figures] : status) {
    const std::string prefix = name + "/";
    const auto child = rows.lower_bound(prefix);
    if (rows.count(name) == 0 && child != rows.end() && child->first.starts_with(prefix)) {
      implied.push_back(name);
    }
  }
  for (const std::string& name : implied) {
    rows[name].document = control::QueueToJson({.name = name});
  }
  for (const store::StoredObject& object : *jobs) {
    const Json job = wire::ParseDocument(object.data);
    if (!who.Sees(wire::StrOr(job, "team"))) {
      continue;
    }
    const std::string queue = wire::StrOr(job, "queue", std::string(control::kDefaultQueue));
    const std::string state = wire::StrOr(job, "state");
    // A deleted queue's finished jobs keep its name as history, not as a queue.
    if (JobIsFinished(state) && rows.count(queue) == 0) {
      continue;
    }
    QueueRow& row = rows[queue];
    if (row.document.empty()) {
      row.document = control::QueueToJson({.name = queue});
    }
    const std::optional<control::JobState> typed = control::ParseJobState(state);
    if (typed == control::JobState::kPending) {
      ++row.pending;
    } else if (typed && control::HoldsResources(*typed)) {
      // A stopping run still holds its GPUs, and the scheduler still charges them.
      ++row.running;
      for (const Json& placement : wire::ArrayOr(job, "placements")) {
        if (control::PlacementGone(placement)) {
          continue;
        }
        for (const Json& assignment : wire::ArrayOr(placement, "assignments")) {
          row.gpu_milli += wire::IntOr(assignment, "milli", 0);
        }
      }
    }
  }
  Json items = Json::array();
  for (auto& [name, row] : rows) {
    Json item = std::move(row.document);
    item["pending"] = row.pending;
    item["running"] = row.running;
    // The scheduling loop's figures for the whole subtree (every team's jobs): GPUs held beyond
    // the guarantee, and the fair-share ratio (below 1: served less than its weight's share).
    // A member sees them for its team's queues and the shared ones only: another team's usage
    // is that team's business.
    const std::string team = wire::StrOr(item, "team");
    const bool figures_visible = team.empty() || who.Sees(team);
    if (const auto figures = status.find(name); figures_visible && figures != status.end()) {
      item["borrowed"] = static_cast<double>(figures->second.borrowed_milli) / kMilliPerUnit;
      item["weight_share"] = figures->second.weight_share;
      item["fair_share"] = figures->second.fair_share_ratio;
      Json usage = Json::object();
      for (const auto& [model, gpu_seconds] : figures->second.usage_gpu_seconds) {
        usage[model] = gpu_seconds / 3600;
      }
      item["usage_gpu_hours"] = std::move(usage);
    }
    // Whole GPUs as an integer, shares as a decimal.
    item["gpus_allocated"] =
        row.gpu_milli % kMilliPerUnit == 0
            ? Json(row.gpu_milli / kMilliPerUnit)
            : Json(static_cast<double>(row.gpu_milli) / static_cast<double>(kMilliPerUnit));
    items.push_back(std::move(item));
  }
  return JsonResponse(200, {{"items", std::move(items)}});
}

}  // namespace

std::optional<ApiResponse> ApiRoutes::RouteTenancy(const control::Principal& who,
                                                   const ApiRequest& request,
                                                   const std::vector<std::string_view>& segments) {
  const bool get = request.method == "GET";
  const bool post = request.method == "POST";
  const size_t n = segments.size();
  const std::string_view collection = segments[1];
  store::StateStore& store = options_.store;
  if (collection == "tokens") {
    if (n == 2 && post) {
      return CreateToken(who, request.body, store, authenticator_);
    }
    if (n == 2 && get) {
      return ListTokens(who, authenticator_);
    }
    if (n == 4 && post && segments[3] == "revoke") {
      return RevokeToken(who, segments[2], authenticator_);
    }
  } else if (collection == "teams") {
    if (n == 2 && post) {
      return CreateTeam(who, request.body, store);
    }
    if (n == 2 && get) {
      return ListObjects(store, control::kTeamsKind);
    }
  } else if (collection == "queues") {
    if (n == 2 && post) {
      return CreateQueue(who, request.body, store, options_.catalog);
    }
    if (n == 2 && get) {
      return ListQueues(who, store, control_->QueueStatuses());
    }
    // A queue name has slashes ("research/nlp"): its segments are joined back.
    std::vector<std::string_view> path(segments.begin() + 2, segments.end());
    const bool events = !path.empty() && path.back() == "events" && get;
    if (events) {
      path.pop_back();
    }
    const std::string name = fmt::format("{}", fmt::join(path, "/"));
    if (!path.empty() && request.method == "PATCH") {
      return PatchQueue(who, name, request.body, store, options_.catalog);
    }
    if (!path.empty() && request.method == "DELETE") {
      return DeleteQueue(who, name, store);
    }
    if (!path.empty() && events) {
      if (const Result<store::StoredObject> queue = store.Get(control::kQueuesKind, name);
          !queue.ok()) {
        // A deleted queue's events stay readable, its deletion last.
        if (queue.status().code() == StatusCode::kNotFound) {
          if (const Result<std::vector<store::StoredEvent>> history =
                  store.Events(control::kQueuesKind, name);
              history.ok() && !history->empty()) {
            return ObjectEvents(control::kQueuesKind, name);
          }
        }
        return ErrorResponse(queue.status().code() == StatusCode::kNotFound ||
                                     queue.status().code() == StatusCode::kInvalidArgument
                                 ? NotFoundError(fmt::format("queue \"{}\" not found", name))
                                 : queue.status());
      }
      return ObjectEvents(control::kQueuesKind, name);
    }
  }
  return std::nullopt;
}

Result<std::string> ApiRoutes::ResolveName(const control::Principal& who, std::string_view kind,
                                           std::string_view noun, std::string_view text) {
  const Status not_found = NotFoundError(fmt::format("{} \"{}\" not found", noun, text));
  if (const size_t separator = text.find(control::kTeamSeparator);
      separator != std::string_view::npos) {
    if (!who.Sees(text.substr(0, separator))) {
      return not_found;
    }
    return std::string(text);
  }
  const std::string own = control::TeamScopedKey(who.team, text);
  if (!who.is_admin()) {
    return own;
  }
  const auto missing = [](const Status& status) {
    return status.code() == StatusCode::kNotFound || status.code() == StatusCode::kInvalidArgument;
  };
  if (const Result<store::StoredObject> object = options_.store.Get(kind, own); object.ok()) {
    return own;
  } else if (!missing(object.status())) {
    return object.status();
  }
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> teams,
                            options_.store.List(control::kTeamsKind));
  // Every team's, and the team-less one a team-less admin made (its key is the bare name).
  std::vector<std::string> candidates = {std::string(text)};
  for (const store::StoredObject& team : teams) {
    candidates.push_back(control::TeamScopedKey(team.name, text));
  }
  std::vector<std::string> found;
  for (const std::string& key : candidates) {
    if (key == own) {
      continue;  // looked at above
    }
    if (const Result<store::StoredObject> object = options_.store.Get(kind, key); object.ok()) {
      found.push_back(key);
    } else if (!missing(object.status())) {
      return object.status();
    }
  }
  if (found.empty()) {
    return not_found;
  }
  if (found.size() > 1) {
    return InvalidArgumentError(
        fmt::format("name: {} \"{}\" exists in {} teams ({}); name one as TEAM/NAME", noun, text,
                    found.size(), fmt::join(found, ", ")));
  }
  return found.front();
}

Status ApiRoutes::CheckSubmission(const control::Principal& who, std::string_view queue_name,
                                  bool host_network) {
  if (!who.team.empty()) {
    GPUFLEET_RETURN_IF_ERROR(TeamMustExist(options_.store, "team (of the token)", who.team));
  }
  const Result<store::StoredObject> object =
      ReadObject(control::kQueuesKind, queue_name,
                 InvalidArgumentError(fmt::format(
                     "metadata.queue: queue \"{}\" does not exist (gpufleet get queues lists them)",
                     queue_name)));
  if (!object.ok()) {
    return object.status();
  }
  const control::Queue queue = control::QueueFromJson(wire::ParseDocument(object->data));
  if (!queue.team.empty() && !who.Sees(queue.team)) {
    return Status(StatusCode::kPermissionDenied,
                  fmt::format("metadata.queue: queue \"{}\" belongs to team \"{}\", not to \"{}\"",
                              queue_name, queue.team, who.team));
  }
  if (host_network && !who.is_admin() && !queue.allow_host_network) {
    return Status(StatusCode::kPermissionDenied,
                  fmt::format("hostNetwork: true: queue \"{}\" does not allow tasks on the node's "
                              "network (an admin may set allow_host_network on the queue)",
                              queue_name));
  }
  return Status::Ok();
}

}  // namespace gpufleet::api
