// SPDX-License-Identifier: Apache-2.0
// GET /v1/usage (docs/usage.md). The run records written with job changes, the busy time
// credited from heartbeats and its periodic write are the control plane's
// (control/control_plane_steps.cc); the computation is control::ComputeUsage (usage_ledger.h).
#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/api/routes.h"
#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/json_scan.h"
#include "gpufleet/wire/usage_cost.h"

namespace gpufleet::api {
namespace {

std::optional<std::string_view> QueryValue(const ApiRequest& request, const std::string& key) {
  const auto it = request.query.find(key);
  if (it == request.query.end()) {
    return std::nullopt;
  }
  return std::string_view(it->second);
}

}  // namespace

std::optional<ApiResponse> ApiRoutes::RouteUsage(const control::Principal& who,
                                                 const ApiRequest& request,
                                                 const std::vector<std::string_view>& segments) {
  if (segments.size() != 2 || segments[1] != "usage" || request.method != "GET") {
    return std::nullopt;
  }
  if (!who.is_admin() && who.role != control::Role::kMember) {
    return ErrorResponse(
        Status(StatusCode::kPermissionDenied, "GET /v1/usage needs a member or admin token"));
  }
  Result<control::UsageQuery> query = control::ParseUsageQuery(
      QueryValue(request, "from"), QueryValue(request, "to"), QueryValue(request, "by"));
  if (!query.ok()) {
    return ErrorResponse(query.status());
  }
  if (!who.is_admin()) {
    query->team = who.team;
  }
  const int64_t now = control_->UsageNowNanos();
  // The runs going first, then the records: a run that ends between the two reads is found in
  // both, and its record wins.
  Result<std::vector<store::StoredObject>> jobs =
      options_.store.ListWhere(control::kJobsKind, control::UnfinishedJobs());
  if (!jobs.ok()) {
    return ErrorResponse(jobs.status());
  }
  std::map<std::string, control::RunUsage> runs;
  for (const store::StoredObject& object : *jobs) {
    const std::optional<std::string> state = TopLevelString(object.data, "state");
    const std::optional<control::JobState> typed =
        state ? control::ParseJobState(*state) : std::nullopt;
    if (!typed || !control::HoldsResources(*typed)) {
      continue;
    }
    const Json doc = wire::ParseDocument(object.data);
    const std::optional<control::StampedRun> stamped = control::StampedRunOf(doc);
    if (!stamped) {
      continue;
    }
    std::optional<control::RunUsage> run =
        control::RunUsageOfJob(doc, now, control_->RunBusy(stamped->name, stamped->busy));
    if (run && run->start_ns < query->to_ns) {
      runs[stamped->name] = *std::move(run);
    }
  }
  Result<std::vector<store::StoredObject>> records = options_.store.List(control::kUsageKind);
  if (!records.ok()) {
    return ErrorResponse(records.status());
  }
  for (const store::StoredObject& object : *records) {
    Result<control::RunUsage> run = control::RunUsageFromJson(wire::ParseDocument(object.data));
    if (!run.ok()) {
      fmt::print(stderr, "gpufleet server: usage/{}: left out: {}\n", object.name,
                 run.status().ToString());
      continue;
    }
    if (run->end_ns > query->from_ns && run->start_ns < query->to_ns) {
      runs[object.name] = *std::move(run);
    } else {
      runs.erase(object.name);
    }
  }
  Result<std::vector<store::StoredObject>> nodes = options_.store.List(control::kNodesKind);
  if (!nodes.ok()) {
    return ErrorResponse(nodes.status());
  }
  std::vector<Json> node_docs;
  node_docs.reserve(nodes->size());
  for (const store::StoredObject& object : *nodes) {
    node_docs.push_back(wire::ParseDocument(object.data));
  }
  std::vector<control::RunUsage> list;
  list.reserve(runs.size());
  for (auto& [name, run] : runs) {
    list.push_back(std::move(run));
  }
  const control::UsageReport report =
      control::ComputeUsage(list, control::FleetCapacity(node_docs, *query, now), *query);
  Json answer = control::UsageReportToJson(report, /*with_fleet=*/who.is_admin());
  if (options_.usage_prices) {
    (void)wire::AddCosts(answer, *options_.usage_prices);
  }
  return JsonResponse(200, answer);
}

}  // namespace gpufleet::api
