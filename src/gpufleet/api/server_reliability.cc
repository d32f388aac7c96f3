// SPDX-License-Identifier: Apache-2.0
// The reliability routes of ApiServer (docs/api.md, "Outcomes and failure reports") and the
// scheduling loop's reliability step; the work is in ReliabilityController.
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/api/routes.h"

namespace gpufleet::api {
namespace {

ApiResponse Answer(const Result<Json>& result) {
  return result.ok() ? JsonResponse(200, *result) : ErrorResponse(result.status());
}

}  // namespace

std::optional<ApiResponse> ApiRoutes::RouteReliability(
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
    return Answer(control_->reliability().FailureReport());
  }
  if (post) {
    return Answer(control_->reliability().ReportOutcome(
        who.name.empty() ? control::RoleName(who.role) : who.name, request.body));
  }
  const auto job = request.query.find("job");
  if (job == request.query.end()) {
    return Answer(control_->reliability().ListOutcomes(""));
  }
  // Outcome records name jobs by key (TEAM/NAME); a job that no longer resolves (never existed)
  // simply has none.
  const Result<std::string> key = ResolveName(who, control::kJobsKind, "job", job->second);
  if (!key.ok() && key.status().code() != StatusCode::kNotFound) {
    return Answer(key.status());
  }
  return Answer(control_->reliability().ListOutcomes(key.ok() ? *key : job->second));
}

}  // namespace gpufleet::api
