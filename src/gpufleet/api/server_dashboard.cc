// SPDX-License-Identifier: Apache-2.0
// The dashboard (docs/dashboard.md): its embedded files, served without a token, and the
// routes only it needs: the fleet's history (GET /v1/history), the GPUs' last measured
// utilization (GET /v1/utilization) and who the caller's token is (GET /v1/whoami). Every other
// figure the page shows comes from the API's own routes, with the caller's token, so roles and team
// visibility are the API's.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "gpufleet/api/dashboard_assets.h"
#include "gpufleet/api/fleet_history.h"
#include "gpufleet/api/routes.h"
#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/core/rfc3339.h"

namespace gpufleet::api {
namespace {

// The store object that keeps the history across restarts.
constexpr std::string_view kHistoryKind = "history";
constexpr std::string_view kHistoryName = "fleet";

// How far back the coarse history goes when finished jobs are kept forever: a bound on the
// document the loop writes with each sample (90 days of hours are about 130 KB).
constexpr Duration kMaxHistoryRetention = std::chrono::hours(24 * 90);

// The coarse rows that, after the samples as taken, reach back as far as the store keeps
// finished jobs.
size_t CoarseHistoryCapacity(const ApiServer::Options& options) {
  const Duration retention = options.retain_finished.count() > 0
                                 ? std::min(options.retain_finished, kMaxHistoryRetention)
                                 : kMaxHistoryRetention;
  const Duration fine = options.history_interval * static_cast<int64_t>(options.history_capacity);
  const Duration row = options.history_interval * static_cast<int64_t>(FleetHistory::kCoarseEvery);
  if (retention <= fine || row.count() <= 0) {
    return 0;
  }
  return static_cast<size_t>((retention - fine + row - Duration(1)) / row);
}

std::string_view ContentTypeOf(std::string_view path) {
  const auto ends_with = [&](std::string_view suffix) {
    return path.size() >= suffix.size() && path.substr(path.size() - suffix.size()) == suffix;
  };
  if (ends_with(".html")) {
    return "text/html; charset=utf-8";
  }
  if (ends_with(".js")) {
    return "text/javascript; charset=utf-8";
  }
  if (ends_with(".css")) {
    return "text/css; charset=utf-8";
  }
  if (ends_with(".svg")) {
    return "image/svg+xml";
  }
  return "application/octet-stream";
}

}  // namespace

std::optional<ApiResponse> ApiRoutes::ServeDashboard(const ApiRequest& request) const {
  if (request.method != "GET") {
    return std::nullopt;
  }
  const std::string_view path =
      request.path == "/" ? std::string_view("/index.html") : std::string_view(request.path);
  for (const EmbeddedFile& file : internal::EmbeddedFiles()) {
    if (file.path == path) {
      ApiResponse response;
      response.content_type = std::string(ContentTypeOf(path));
      response.body = std::string(file.bytes);
      response.route = path == "/index.html" ? "/" : "/assets";
      return response;
    }
  }
  return std::nullopt;
}

void ApiServer::RecordHistoryIfDue() {
  if (options_.wall_clock == nullptr || options_.history_capacity == 0) {
    return;
  }
  FleetHistoryState& d = history_;
  std::lock_guard<std::mutex> lock(d.mu);
  const MonoTime now = options_.clock.Now();
  if (d.last_sample && now - *d.last_sample < options_.history_interval) {
    return;
  }
  d.last_sample = now;
  if (!d.loaded) {
    // What an earlier run (or an earlier leader) kept; a document that cannot be read starts a
    // new series rather than stopping the samples.
    d.history = FleetHistory(options_.history_capacity, CoarseHistoryCapacity(options_));
    if (Result<store::StoredObject> stored = options_.store.Get(kHistoryKind, kHistoryName);
        stored.ok()) {
      d.stored_version = stored->version;
      if (Result<FleetHistory> kept = FleetHistory::FromDocument(
              stored->data, options_.history_capacity, CoarseHistoryCapacity(options_));
          kept.ok()) {
        d.history = std::move(kept).value();
      } else {
        fmt::print(stderr, "gpufleet server: {}; starting a new one\n", kept.status().message());
      }
    }
    d.loaded = true;
  }
  FleetSample sample{.unix_ms = options_.wall_clock->UnixNanos() / 1000000,
                     .busy_milli = control_->BusyMilli(),
                     .running_jobs = control_->RunningJobs()};
  const control::FleetGauges gauges = control_->Gauges();
  for (const auto& [model, gpus] : gauges.gpus_by_model) {
    sample.gpus += gpus;
  }
  for (const auto& [model, milli] : gauges.allocated_milli_by_model) {
    sample.allocated_milli += milli;
  }
  for (const auto& [queue, pending] : gauges.pending_by_queue) {
    sample.pending_jobs += pending;
  }
  d.history.Add(sample);
  store::WriteBatch batch;
  if (d.stored_version == 0) {
    batch.Create(std::string(kHistoryKind), std::string(kHistoryName), d.history.ToDocument());
  } else {
    batch.Update(std::string(kHistoryKind), std::string(kHistoryName), d.history.ToDocument(),
                 d.stored_version);
  }
  if (const Status status = options_.store.Commit(batch); !status.ok()) {
    // Another writer (a former leader) or a store outage: read the version again next time; the
    // samples stay in memory meanwhile.
    d.loaded = false;
    fmt::print(stderr, "gpufleet server: fleet history not saved: {}\n", status.ToString());
    return;
  }
  ++d.stored_version;
}

ApiResponse ApiServer::GetHistory(const ApiRequest& request) {
  int64_t since_ms = 0;
  if (const auto it = request.query.find("since"); it != request.query.end()) {
    const Result<int64_t> since = ParseRfc3339(it->second);
    if (!since.ok()) {
      return ErrorResponse(InvalidArgumentError(
          fmt::format("since: \"{}\" is not an RFC 3339 time (2026-12-01T10:00:00Z)", it->second)));
    }
    since_ms = *since / 1000000;
  }
  std::vector<FleetSample> samples;
  if (leading()) {
    FleetHistoryState& d = history_;
    std::lock_guard<std::mutex> lock(d.mu);
    samples = d.history.Since(since_ms);
  }
  if (!leading() || samples.empty()) {
    // A follower (or a leader that has not sampled yet) answers from the store.
    Result<store::StoredObject> stored = options_.store.Get(kHistoryKind, kHistoryName);
    if (!stored.ok() && stored.status().code() != StatusCode::kNotFound) {
      return ErrorResponse(stored.status());
    }
    if (stored.ok()) {
      Result<FleetHistory> kept =
          FleetHistory::FromDocument(stored->data, std::max<size_t>(1, options_.history_capacity),
                                     CoarseHistoryCapacity(options_));
      if (kept.ok()) {
        samples = kept->Since(since_ms);
      }
    }
  }
  const size_t coarse = CoarseHistoryCapacity(options_);
  const double interval_s = std::chrono::duration<double>(options_.history_interval).count();
  return JsonResponse(
      200, Json{{"interval_s", interval_s},
                {"capacity", options_.history_capacity},
                {"coarse_capacity", coarse},
                {"kept_s", interval_s * static_cast<double>(options_.history_capacity +
                                                            coarse * FleetHistory::kCoarseEvery)},
                {"items", FleetHistory::SamplesToJson(samples)}});
}

std::optional<ApiResponse> ApiRoutes::RouteDashboard(
    const control::Principal& who, const ApiRequest& request,
    const std::vector<std::string_view>& segments) {
  if (segments.size() != 2 || request.method != "GET") {
    return std::nullopt;
  }
  if (segments[1] == "whoami") {
    return JsonResponse(200, Json{{"role", who.is_admin() ? "admin" : "member"},
                                  {"team", who.team},
                                  {"name", who.name}});
  }
  Json items = Json::array();
  for (const auto& [gpu, percent] : control_->GpuUtilization()) {
    items.push_back({{"node", gpu.first}, {"gpu", gpu.second}, {"utilization_pct", percent}});
  }
  return JsonResponse(200, Json{{"items", std::move(items)}});
}

}  // namespace gpufleet::api
