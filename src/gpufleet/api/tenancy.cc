// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/tenancy.h"

#include <initializer_list>
#include <optional>

#include <fmt/format.h>

#include "gpufleet/api/job_spec.h"

namespace gpufleet::api {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxTokenNameChars = 63;

// The body as a JSON object whose keys are all in `fields`.
Result<Json> ReadObject(std::string_view body, std::initializer_list<std::string_view> fields) {
  const Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded()) {
    return InvalidArgumentError(
        "body: not valid JSON (want an object such as {\"name\": \"nlp\"})");
  }
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

}  // namespace

Result<Team> ParseTeamRequest(std::string_view body) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json j, ReadObject(body, {"name"}));
  Team team;
  GPUFLEET_ASSIGN_OR_RETURN(team.name, RequiredString(j, "name"));
  GPUFLEET_RETURN_IF_ERROR(ValidateTeamName("name", team.name));
  return team;
}

Result<Queue> ParseQueueRequest(std::string_view body) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json j, ReadObject(body, {"name", "team"}));
  Queue queue;
  GPUFLEET_ASSIGN_OR_RETURN(queue.name, RequiredString(j, "name"));
  GPUFLEET_RETURN_IF_ERROR(ValidateQueueName("name", queue.name));
  GPUFLEET_ASSIGN_OR_RETURN(const std::optional<std::string> team, OptionalString(j, "team"));
  if (team.has_value() && !team->empty()) {
    GPUFLEET_RETURN_IF_ERROR(ValidateTeamName("team", *team));
    queue.team = *team;
  }
  return queue;
}

Result<TokenRequest> ParseTokenRequest(std::string_view body) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json j, ReadObject(body, {"role", "team", "name"}));
  TokenRequest request;
  GPUFLEET_ASSIGN_OR_RETURN(const std::string role, RequiredString(j, "role"));
  GPUFLEET_ASSIGN_OR_RETURN(request.role, ParseRole(role));
  GPUFLEET_ASSIGN_OR_RETURN(const std::optional<std::string> team, OptionalString(j, "team"));
  if (team.has_value() && !team->empty()) {
    GPUFLEET_RETURN_IF_ERROR(ValidateTeamName("team", *team));
    request.team = *team;
  } else if (request.role == Role::kMember) {
    return InvalidArgumentError("team: required for a member token");
  }
  GPUFLEET_ASSIGN_OR_RETURN(request.name, RequiredString(j, "name"));
  GPUFLEET_RETURN_IF_ERROR(ValidateTokenName(request.name));
  return request;
}

Json TeamToJson(const Team& team) {
  return {{"name", team.name}};
}

Json QueueToJson(const Queue& queue) {
  return {{"name", queue.name}, {"team", queue.team}};
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
  return queue;
}

}  // namespace gpufleet::api
