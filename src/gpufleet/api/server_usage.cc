// SPDX-License-Identifier: Apache-2.0
// The usage ledger's part of ApiServer (docs/usage.md): GET /v1/usage, the run records written
// with job changes, the busy time credited from heartbeats and its periodic write. The
// computation is control::ComputeUsage (usage_ledger.h).
#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/api/server.h"
#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/json_scan.h"

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

int64_t ApiServer::UsageNowNanos() const {
  return options_.wall_clock != nullptr ? options_.wall_clock->UnixNanos()
                                        : options_.clock.Now().nanos;
}

void ApiServer::NoteUsageChange(const Json& before, Json& after, store::WriteBatch& batch) {
  const std::optional<control::StampedRun> stamped = control::StampedRunOf(before);
  if (!stamped) {
    return;
  }
  const int64_t busy = usage_meter_.Busy(stamped->name, stamped->busy);
  const std::optional<control::RunUsage> ended =
      control::NoteUsageChange(before, after, UsageNowNanos(), busy);
  if (!ended) {
    return;
  }
  // A run ends once; a record already there (an earlier try of this write committed) stays.
  if (!options_.store.Get(control::kUsageKind, stamped->name).ok()) {
    batch.Create(std::string(control::kUsageKind), stamped->name,
                 control::RunUsageToJson(*ended).dump());
  }
  usage_meter_.Forget(stamped->name);
}

int64_t ApiServer::UsageHeartbeatInterval(const std::string& node) {
  const MonoTime now = options_.clock.Now();
  std::lock_guard<std::mutex> lock(usage_mu_);
  auto [it, first] = usage_last_heartbeat_.try_emplace(node, now);
  if (first) {
    return 0;
  }
  const Duration since = std::min<Duration>(now - it->second, options_.node_timeout);
  it->second = now;
  return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(since).count());
}

void ApiServer::CreditBusy(const Json& job, const std::string& node,
                           const std::map<int64_t, int>& utilization_pct, int64_t interval_ms) {
  if (interval_ms <= 0 || utilization_pct.empty()) {
    return;
  }
  const std::optional<control::StampedRun> stamped = control::StampedRunOf(job);
  if (!stamped || control::StoredJobState(job) == control::JobState::kScheduled) {
    return;  // a run whose tasks have not started keeps nothing busy
  }
  const int64_t credit = control::BusyCredit(job, node, utilization_pct, interval_ms);
  if (credit > 0) {
    usage_meter_.Credit(stamped->name, stamped->busy, credit);
  }
}

Result<bool> ApiServer::FlushUsageIfDue() {
  const MonoTime now = options_.clock.Now();
  if (last_usage_flush_ && now - *last_usage_flush_ < options_.usage_flush_interval) {
    return false;
  }
  last_usage_flush_ = now;
  std::vector<control::JobWrite> writes;
  for (const auto& [run, busy] : usage_meter_.Snapshot()) {
    // "TEAM/NAME/ATTEMPT": the job's key is all before the last '/'.
    const size_t slash = run.rfind('/');
    const auto job =
        slash == std::string::npos ? view_->jobs().end() : view_->jobs().find(run.substr(0, slash));
    if (job == view_->jobs().end() || !control::HoldsResources(job->second.state)) {
      usage_meter_.Forget(run);  // ended without this server (or deleted): nothing to write to
      continue;
    }
    Json doc = wire::ParseDocument(job->second.data);
    const std::optional<control::StampedRun> stamped = control::StampedRunOf(doc);
    if (!stamped || stamped->name != run) {
      usage_meter_.Forget(run);
      continue;
    }
    if (stamped->busy >= busy) {
      continue;
    }
    // The same document: NoteUsageChange writes the busy time into it.
    writes.push_back(control::JobWrite{job->first, job->second.version, doc, doc, {""}});
  }
  if (writes.empty()) {
    return false;
  }
  // One commit for all of them; if one job changed under us, one by one (the rest still land).
  store::WriteBatch batch;
  for (control::JobWrite& write : writes) {
    Json after = write.after;
    AddJobWrite(write.before, after, write.version, "", batch);
  }
  if (const Status status = options_.store.Commit(batch); status.ok()) {
    return true;
  } else if (status.code() != StatusCode::kAborted && status.code() != StatusCode::kNotFound) {
    return status;
  }
  return CommitJobWrites(std::move(writes));
}

std::optional<ApiResponse> ApiServer::RouteUsage(const control::Principal& who,
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
  const int64_t now = UsageNowNanos();
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
        control::RunUsageOfJob(doc, now, usage_meter_.Busy(stamped->name, stamped->busy));
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
      control::ComputeUsage(list, control::FleetShareUnits(node_docs), *query);
  return JsonResponse(200, control::UsageReportToJson(report, /*with_fleet=*/who.is_admin()));
}

}  // namespace gpufleet::api
