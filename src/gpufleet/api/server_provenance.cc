// SPDX-License-Identifier: Apache-2.0
// GET /v1/provenance (docs/provenance.md): the records the agents reported through the control
// plane (ControlPlane::RecordProvenance), as the caller may see them.
#include <algorithm>
#include <charconv>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/api/routes.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {

std::optional<ApiResponse> ApiRoutes::RouteProvenance(
    const control::Principal& who, const ApiRequest& request,
    const std::vector<std::string_view>& segments) {
  if (segments.size() != 2 || request.method != "GET") {
    return std::nullopt;
  }
  const auto job = request.query.find("job");
  if (job == request.query.end() || job->second.empty()) {
    return ErrorResponse(InvalidArgumentError("job: required (GET /v1/provenance?job=NAME)"));
  }
  std::optional<int64_t> attempt;
  if (const auto it = request.query.find("attempt"); it != request.query.end()) {
    int64_t value = 0;
    const auto [end, error] =
        std::from_chars(it->second.data(), it->second.data() + it->second.size(), value);
    if (error != std::errc() || end != it->second.data() + it->second.size() || value < 1) {
      return ErrorResponse(InvalidArgumentError(
          fmt::format("attempt: \"{}\" is not a positive integer", it->second)));
    }
    attempt = value;
  }
  const Result<std::string> key = ResolveName(who, control::kJobsKind, "job", job->second);
  if (!key.ok()) {
    return ErrorResponse(key.status());
  }
  const Result<std::vector<store::StoredObject>> listed =
      options_.store.List(control::kProvenanceKind, *key + "/");
  if (!listed.ok()) {
    return ErrorResponse(listed.status());
  }
  std::vector<Json> items;
  for (const store::StoredObject& object : *listed) {
    Json record = wire::ParseDocument(object.data);
    if (wire::StrOr(record, "job") != *key ||
        (attempt && wire::IntOr(record, "attempt", 0) != *attempt)) {
      continue;
    }
    items.push_back(std::move(record));
  }
  std::sort(items.begin(), items.end(), [](const Json& a, const Json& b) {
    return std::make_pair(wire::IntOr(a, "attempt", 0), wire::StrOr(a, "task")) <
           std::make_pair(wire::IntOr(b, "attempt", 0), wire::StrOr(b, "task"));
  });
  Json answer = {{"job", *key}, {"items", items}};
  return JsonResponse(200, answer);
}

}  // namespace gpufleet::api
