// SPDX-License-Identifier: Apache-2.0
// The reliability routes of ApiServer (docs/api.md, "Outcomes and failure reports") and the
// scheduling loop's reliability step; the work is in ReliabilityController.
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/api/server.h"

namespace gpufleet::api {
namespace {

ApiResponse Answer(const Result<Json>& result) {
  return result.ok() ? JsonResponse(200, *result) : ErrorResponse(result.status());
}

}  // namespace

std::optional<ApiResponse> ApiServer::RouteReliability(
    const control::Principal& who, const ApiRequest& request,
    const std::vector<std::string_view>& segments) {
  const size_t n = segments.size();
  const bool get = request.method == "GET";
  const bool post = request.method == "POST";
  const std::string_view collection = segments[1];
  const bool outcomes = collection == "outcomes" && n == 2 && (get || post);
  const bool failures = collection == "reports" && n == 3 && segments[2] == "failures" && get;
  if (!outcomes && !failures) {
    return std::nullopt;
  }
  if (!who.is_admin()) {
    return Answer(Status(StatusCode::kPermissionDenied,
                         fmt::format("{} {} needs an admin token", request.method, request.path)));
  }
  if (failures) {
    return Answer(reliability_->FailureReport());
  }
  if (post) {
    return Answer(reliability_->ReportOutcome(
        who.name.empty() ? control::RoleName(who.role) : who.name, request.body));
  }
  const auto job = request.query.find("job");
  if (job == request.query.end()) {
    return Answer(reliability_->ListOutcomes(""));
  }
  // Outcome records name jobs by key (TEAM/NAME); a job that no longer resolves (never existed)
  // simply has none.
  const Result<std::string> key = ResolveName(who, control::kJobsKind, "job", job->second);
  if (!key.ok() && key.status().code() != StatusCode::kNotFound) {
    return Answer(key.status());
  }
  return Answer(reliability_->ListOutcomes(key.ok() ? *key : job->second));
}

void ApiServer::RunReliabilityIfDue() {
  const std::optional<Result<control::ReliabilityStepResult>> step = reliability_->RunIfDue();
  if (!step) {
    return;
  }
  if (!step->ok()) {
    fmt::print(stderr, "gpufleet server: reliability step failed: {}\n", step->status().ToString());
    return;
  }
  // Rare decisions an operator wants to see; the audit events are on the nodes.
  for (const std::string& device : (*step)->quarantined) {
    fmt::print(stderr, "gpufleet server: quarantined {}\n", device);
  }
  for (const std::string& device : (*step)->released) {
    fmt::print(stderr, "gpufleet server: {} released, its evidence starts again\n", device);
  }
}

}  // namespace gpufleet::api
