// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/tenancy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <initializer_list>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "gpufleet/wire/job_spec.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::control {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxTokenNameChars = 63;

// The body as a JSON object whose keys are all in `fields`.
Result<Json> ReadObject(std::string_view body, std::initializer_list<std::string_view> fields) {
  Result<Json> parsed = wire::ParseJson(body);
  if (!parsed.ok()) {
    return InvalidArgumentError(fmt::format(
        "body: {} (want an object such as {{\"name\": \"nlp\"}})", parsed.status().message()));
  }
  const Json& j = *parsed;
  if (!j.is_object()) {
    return InvalidArgumentError(
        fmt::format("body: expected a JSON object, got {}", std::string(j.type_name())));
  }
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const std::string_view field : fields) {
      known = known || key == field;
    }
    if (!known) {
      return InvalidArgumentError(fmt::format(
          "{}: unknown field (valid: {})",
          Json(key).dump(-1, ' ', false, Json::error_handler_t::replace), fmt::join(fields, ", ")));
    }
  }
  return j;
}

// The string field `key`: nullopt when absent, kInvalidArgument when not a string.
Result<std::optional<std::string>> OptionalString(const Json& j, std::string_view key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return std::optional<std::string>();
  }
  if (!it->is_string()) {
    return InvalidArgumentError(
        fmt::format("{}: expected a string, got {}", key,
                    it->dump(-1, ' ', false, Json::error_handler_t::replace)));
  }
  return std::optional<std::string>(it->get<std::string>());
}

Result<std::string> RequiredString(const Json& j, std::string_view key) {
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<std::string> value, OptionalString(j, key));
  if (!value.has_value()) {
    return InvalidArgumentError(fmt::format("{}: required field missing", key));
  }
  return std::move(*value);
}

Status ValidateTokenName(std::string_view name) {
  bool printable = !name.empty() && name.size() <= kMaxTokenNameChars;
  for (const char c : name) {
    printable = printable && c >= ' ' && c <= '~';
  }
  if (!printable) {
    return InvalidArgumentError(fmt::format(
        "name: {} is not valid (1 to {} printable ASCII characters)",
        Json(name).dump(-1, ' ', false, Json::error_handler_t::replace), kMaxTokenNameChars));
  }
  return Status::Ok();
}

// Most GPUs one quota entry may name: far above any fleet, far below int64 overflow in milli.
constexpr double kMaxQuotaGpus = 1e9;

// A quota object {"H100-80GB": 16, "*": 2.5} in milli-GPU by canonical model name.
Result<policy::GpuMilliByModel> ReadQuota(const Json& j, std::string_view key,
                                          const GpuCatalog& catalog) {
  policy::GpuMilliByModel quota;
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return quota;
  }
  if (!it->is_object()) {
    return InvalidArgumentError(
        fmt::format("{}: expected an object of GPUs by model such as {{\"H100-80GB\": 16}}, got {}",
                    key, it->dump(-1, ' ', false, Json::error_handler_t::replace)));
  }
  for (const auto& [model, value] : it->items()) {
    const std::string field = fmt::format("{}.{}", key, model);
    std::string name = model;
    if (model != policy::kAnyGpuModel) {
      if (!catalog.Contains(model)) {
        return InvalidArgumentError(fmt::format("{}: unknown GPU model \"{}\"", field, model));
      }
      name = catalog.Canonical(model);
    }
    const double gpus = value.is_number() ? value.get<double>() : -1;
    const double milli = gpus * kMilliPerUnit;
    if (!value.is_number() || gpus < 0 || gpus > kMaxQuotaGpus ||
        milli != static_cast<double>(static_cast<int64_t>(milli))) {
      return InvalidArgumentError(fmt::format(
          "{}: {} is not a number of GPUs from 0 to {:.0f} with at most three decimals", field,
          value.dump(-1, ' ', false, Json::error_handler_t::replace), kMaxQuotaGpus));
    }
    quota[name] += static_cast<int64_t>(milli);
  }
  return quota;
}

// The weight field: nullopt when absent or null.
Result<std::optional<double>> ReadWeight(const Json& j) {
  const auto it = j.find("weight");
  if (it == j.end() || it->is_null()) {
    return std::optional<double>();
  }
  if (!it->is_number() || !(it->get<double>() > 0) || it->get<double>() > 1e6) {
    return InvalidArgumentError(
        fmt::format("weight: {} is not a number in (0, 1000000]",
                    it->dump(-1, ' ', false, Json::error_handler_t::replace)));
  }
  return std::optional<double>(it->get<double>());
}

// The min_runtime field, a spec duration ("10m"), in seconds: nullopt when absent or null.
Result<std::optional<int64_t>> ReadMinRuntime(const Json& j) {
  const auto it = j.find("min_runtime");
  if (it == j.end() || it->is_null()) {
    return std::optional<int64_t>();
  }
  if (!it->is_string()) {
    return InvalidArgumentError(
        fmt::format("min_runtime: {} is not a duration (a string such as \"10m\")",
                    it->dump(-1, ' ', false, Json::error_handler_t::replace)));
  }
  const Result<Duration> duration = wire::ParseSpecDuration(it->get<std::string>());
  if (!duration.ok()) {
    return InvalidArgumentError(fmt::format("min_runtime: {}", duration.status().message()));
  }
  return std::optional<int64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(*duration).count());
}

// The may_borrow field: nullopt when absent or null.
Result<std::optional<bool>> OptionalBool(const Json& j, std::string_view key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return std::optional<bool>();
  }
  if (!it->is_boolean()) {
    return InvalidArgumentError(
        fmt::format("{}: expected true or false, got {}", key,
                    it->dump(-1, ' ', false, Json::error_handler_t::replace)));
  }
  return std::optional<bool>(it->get<bool>());
}

// A quota field of a merge patch: nullopt when absent; a null field clears the quota; within the
// object, a null model removes that entry and the others are read as ReadQuota reads them.
Result<std::optional<QuotaPatch>> ReadQuotaPatch(const Json& j, std::string_view key,
                                                 const GpuCatalog& catalog) {
  const auto it = j.find(key);
  if (it == j.end()) {
    return std::optional<QuotaPatch>();
  }
  QuotaPatch patch;
  if (it->is_null()) {
    patch.clear = true;
    return std::optional<QuotaPatch>(std::move(patch));
  }
  Json amounts = Json::object();
  if (it->is_object()) {
    for (const auto& [model, value] : it->items()) {
      if (!value.is_null()) {
        amounts[model] = value;
        continue;
      }
      if (model != policy::kAnyGpuModel && !catalog.Contains(model)) {
        return InvalidArgumentError(
            fmt::format("{}.{}: unknown GPU model \"{}\"", key, model, model));
      }
      patch.entries[model == policy::kAnyGpuModel ? model : catalog.Canonical(model)] =
          std::nullopt;
    }
  } else {
    amounts = *it;  // ReadQuota names the field and the wrong type
  }
  GPUFLEET_ASSIGN_OR_RETURN(const policy::GpuMilliByModel set,
                            ReadQuota(Json{{std::string(key), amounts}}, key, catalog));
  for (const auto& [model, milli] : set) {
    patch.entries[model] = milli;
  }
  return std::optional<QuotaPatch>(std::move(patch));
}

}  // namespace

Result<Team> ParseTeamRequest(std::string_view body) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json j, ReadObject(body, {"name"}));
  Team team;
  GPUFLEET_ASSIGN_OR_RETURN(team.name, RequiredString(j, "name"));
  GPUFLEET_RETURN_IF_ERROR(wire::ValidateTeamName("name", team.name));
  return team;
}

Result<Queue> ParseQueueRequest(std::string_view body, const GpuCatalog& catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(
      const Json j, ReadObject(body, {"name", "team", "guarantee", "limit", "weight", "may_borrow",
                                      "allow_host_network", "min_runtime"}));
  Queue queue;
  GPUFLEET_ASSIGN_OR_RETURN(queue.name, RequiredString(j, "name"));
  GPUFLEET_RETURN_IF_ERROR(wire::ValidateQueueName("name", queue.name));
  GPUFLEET_ASSIGN_OR_RETURN(const std::optional<std::string> team, OptionalString(j, "team"));
  if (team.has_value() && !team->empty()) {
    GPUFLEET_RETURN_IF_ERROR(wire::ValidateTeamName("team", *team));
    queue.team = *team;
  }
  GPUFLEET_ASSIGN_OR_RETURN(queue.guarantee, ReadQuota(j, "guarantee", catalog));
  GPUFLEET_ASSIGN_OR_RETURN(queue.limit, ReadQuota(j, "limit", catalog));
  GPUFLEET_ASSIGN_OR_RETURN(const std::optional<double> weight, ReadWeight(j));
  queue.weight = weight.value_or(queue.weight);
  GPUFLEET_ASSIGN_OR_RETURN(const std::optional<bool> may_borrow, OptionalBool(j, "may_borrow"));
  queue.may_borrow = may_borrow.value_or(queue.may_borrow);
  GPUFLEET_ASSIGN_OR_RETURN(const std::optional<bool> host_network,
                            OptionalBool(j, "allow_host_network"));
  queue.allow_host_network = host_network.value_or(queue.allow_host_network);
  GPUFLEET_ASSIGN_OR_RETURN(queue.min_runtime_seconds, ReadMinRuntime(j));
  return queue;
}

Result<QueuePatch> ParseQueuePatch(std::string_view body, const GpuCatalog& catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json j,
                            ReadObject(body, {"guarantee", "limit", "weight", "may_borrow",
                                              "allow_host_network", "min_runtime", "version"}));
  QueuePatch patch;
  GPUFLEET_ASSIGN_OR_RETURN(patch.guarantee, ReadQuotaPatch(j, "guarantee", catalog));
  GPUFLEET_ASSIGN_OR_RETURN(patch.limit, ReadQuotaPatch(j, "limit", catalog));
  // A null goes back to the default, as creating the queue without the field would.
  const Queue defaults;
  if (j.contains("weight")) {
    GPUFLEET_ASSIGN_OR_RETURN(const std::optional<double> weight, ReadWeight(j));
    patch.weight = weight.value_or(defaults.weight);
  }
  if (j.contains("may_borrow")) {
    GPUFLEET_ASSIGN_OR_RETURN(const std::optional<bool> may_borrow, OptionalBool(j, "may_borrow"));
    patch.may_borrow = may_borrow.value_or(defaults.may_borrow);
  }
  if (j.contains("allow_host_network")) {
    GPUFLEET_ASSIGN_OR_RETURN(const std::optional<bool> host_network,
                              OptionalBool(j, "allow_host_network"));
    patch.allow_host_network = host_network.value_or(defaults.allow_host_network);
  }
  if (j.contains("min_runtime")) {
    GPUFLEET_ASSIGN_OR_RETURN(const std::optional<int64_t> min_runtime, ReadMinRuntime(j));
    patch.min_runtime_seconds.emplace(min_runtime);
  }
  if (const auto it = j.find("version"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1) {
      return InvalidArgumentError(
          fmt::format("version: {} is not a version (an integer >= 1, as GET returns it)",
                      it->dump(-1, ' ', false, Json::error_handler_t::replace)));
    }
    patch.version = it->get<int64_t>();
  }
  return patch;
}

Queue ApplyQueuePatch(Queue queue, const QueuePatch& patch) {
  const auto merge = [](policy::GpuMilliByModel& quota, const std::optional<QuotaPatch>& change) {
    if (!change) {
      return;
    }
    if (change->clear) {
      quota.clear();
    }
    for (const auto& [model, milli] : change->entries) {
      if (milli) {
        quota[model] = *milli;
      } else {
        quota.erase(model);
      }
    }
  };
  merge(queue.guarantee, patch.guarantee);
  merge(queue.limit, patch.limit);
  queue.weight = patch.weight.value_or(queue.weight);
  queue.may_borrow = patch.may_borrow.value_or(queue.may_borrow);
  queue.allow_host_network = patch.allow_host_network.value_or(queue.allow_host_network);
  queue.min_runtime_seconds = patch.min_runtime_seconds.value_or(queue.min_runtime_seconds);
  return queue;
}

Result<policy::QueueTree> BuildQueueTree(const std::vector<Queue>& queues,
                                         policy::QueueTreeOptions options) {
  std::map<std::string, policy::QueueSpec> specs;
  for (const Queue& queue : queues) {
    specs[queue.name] = {.path = queue.name,
                         .guarantee = queue.guarantee,
                         .limit = queue.limit,
                         .weight = queue.weight,
                         .may_borrow = queue.may_borrow};
  }
  specs.try_emplace(std::string(kDefaultQueue),
                    policy::QueueSpec{.path = std::string(kDefaultQueue)});
  for (const Queue& queue : queues) {
    for (size_t slash = queue.name.find('/'); slash != std::string::npos;
         slash = queue.name.find('/', slash + 1)) {
      const std::string parent = queue.name.substr(0, slash);
      specs.try_emplace(parent, policy::QueueSpec{.path = parent, .implicit = true});
    }
  }
  std::vector<policy::QueueSpec> list;
  for (auto& [name, spec] : specs) {
    list.push_back(std::move(spec));
  }
  return policy::QueueTree::Create(std::move(list), options);
}

Result<TokenRequest> ParseTokenRequest(std::string_view body) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json j, ReadObject(body, {"role", "team", "name", "node"}));
  TokenRequest request;
  GPUFLEET_ASSIGN_OR_RETURN(const std::string role, RequiredString(j, "role"));
  GPUFLEET_ASSIGN_OR_RETURN(request.role, ParseRole(role));
  GPUFLEET_ASSIGN_OR_RETURN(const std::optional<std::string> team, OptionalString(j, "team"));
  if (team.has_value() && !team->empty()) {
    GPUFLEET_RETURN_IF_ERROR(wire::ValidateTeamName("team", *team));
    request.team = *team;
  } else if (request.role == Role::kMember) {
    return InvalidArgumentError("team: required for a member token");
  }
  GPUFLEET_ASSIGN_OR_RETURN(request.name, RequiredString(j, "name"));
  GPUFLEET_RETURN_IF_ERROR(ValidateTokenName(request.name));
  GPUFLEET_ASSIGN_OR_RETURN(const std::optional<std::string> node, OptionalString(j, "node"));
  if (node.has_value() && !node->empty()) {
    if (request.role != Role::kAgent) {
      return InvalidArgumentError("node: only an agent token acts for a node");
    }
    GPUFLEET_RETURN_IF_ERROR(wire::ValidateNodeName("node", *node));
    request.node = *node;
  }
  return request;
}

Json TeamToJson(const Team& team) {
  return {{"name", team.name}};
}

namespace {

Json QuotaToJson(const policy::GpuMilliByModel& quota) {
  Json out = Json::object();
  for (const auto& [model, milli] : quota) {
    out[model] = milli % kMilliPerUnit == 0 ? Json(milli / kMilliPerUnit)
                                            : Json(static_cast<double>(milli) / kMilliPerUnit);
  }
  return out;
}

policy::GpuMilliByModel QuotaFromJson(const Json& document, std::string_view key) {
  policy::GpuMilliByModel quota;
  const auto it = document.find(key);
  if (it == document.end() || !it->is_object()) {
    return quota;
  }
  for (const auto& [model, value] : it->items()) {
    if (value.is_number()) {
      quota[model] = std::llround(value.get<double>() * kMilliPerUnit);
    }
  }
  return quota;
}

}  // namespace

Json QueueToJson(const Queue& queue) {
  Json out = {{"name", queue.name},
              {"team", queue.team},
              {"guarantee", QuotaToJson(queue.guarantee)},
              {"limit", QuotaToJson(queue.limit)},
              {"weight", queue.weight},
              {"may_borrow", queue.may_borrow},
              {"allow_host_network", queue.allow_host_network}};
  if (queue.min_runtime_seconds) {
    out["min_runtime"] = wire::FormatSpecDuration(std::chrono::seconds(*queue.min_runtime_seconds));
  }
  return out;
}

std::string TeamScopedKey(std::string_view team, std::string_view name) {
  return team.empty() ? std::string(name) : fmt::format("{}{}{}", team, kTeamSeparator, name);
}

std::string TeamScopedKeyOf(const Json& document) {
  const auto text = [&](const char* field) {
    const auto it = document.find(field);
    return it != document.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  return document.is_object() ? TeamScopedKey(text("team"), text("name")) : std::string();
}

std::string_view NameOfKey(std::string_view key) {
  const size_t separator = key.find(kTeamSeparator);
  return separator == std::string_view::npos ? key : key.substr(separator + 1);
}

std::string_view TeamOfKey(std::string_view key) {
  const size_t separator = key.find(kTeamSeparator);
  return separator == std::string_view::npos ? std::string_view() : key.substr(0, separator);
}

std::optional<ScopedPath> ParseScopedPath(const std::vector<std::string_view>& segments,
                                          std::string_view method) {
  if (segments.size() < 3 || segments.size() > 5) {
    return std::nullopt;
  }
  const std::vector<std::string_view> actions =
      method == "GET"    ? std::vector<std::string_view>{"events", "explain", "logs"}
      : method == "POST" ? std::vector<std::string_view>{"cancel", "resume"}
                         : std::vector<std::string_view>{};
  ScopedPath out;
  size_t end = segments.size();
  if (end > 3 && std::find(actions.begin(), actions.end(), segments[end - 1]) != actions.end()) {
    out.action = segments[end - 1];
    --end;
  }
  if (end - 2 > 2) {
    return std::nullopt;
  }
  out.name = std::string(segments[2]);
  if (end == 4) {
    out.name = TeamScopedKey(segments[2], segments[3]);
  }
  return out;
}

Status CheckScopedName(std::string_view field, std::string_view name) {
  if (name == "events") {
    return InvalidArgumentError(fmt::format(
        "{}: \"events\" is reserved (GET /v1/jobs/TEAM/events reads the events of job TEAM)",
        field));
  }
  if (name == "explain") {
    return InvalidArgumentError(fmt::format(
        "{}: \"explain\" is reserved (GET /v1/jobs/TEAM/explain explains job TEAM)", field));
  }
  if (name == "logs") {
    return InvalidArgumentError(fmt::format(
        "{}: \"logs\" is reserved (GET /v1/jobs/TEAM/logs reads the logs of job TEAM)", field));
  }
  return Status::Ok();
}

Queue QueueFromJson(const Json& document) {
  Queue queue;
  if (!document.is_object()) {
    return queue;
  }
  if (const auto it = document.find("name"); it != document.end() && it->is_string()) {
    queue.name = it->get<std::string>();
  }
  if (const auto it = document.find("team"); it != document.end() && it->is_string()) {
    queue.team = it->get<std::string>();
  }
  queue.guarantee = QuotaFromJson(document, "guarantee");
  queue.limit = QuotaFromJson(document, "limit");
  if (const auto it = document.find("weight");
      it != document.end() && it->is_number() && it->get<double>() > 0) {
    queue.weight = it->get<double>();
  }
  if (const auto it = document.find("may_borrow"); it != document.end() && it->is_boolean()) {
    queue.may_borrow = it->get<bool>();
  }
  queue.allow_host_network = wire::BoolOr(document, "allow_host_network", false);
  // Stored by QueueToJson, so valid; anything else reads as none.
  if (const Result<std::optional<int64_t>> min_runtime = ReadMinRuntime(document);
      min_runtime.ok()) {
    queue.min_runtime_seconds = *min_runtime;
  }
  return queue;
}

}  // namespace gpufleet::control
