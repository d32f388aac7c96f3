// SPDX-License-Identifier: Apache-2.0
// Idle reclaim of interactive jobs in the scheduling cycle, and the resume of a suspended job
// (docs/utilization.md, "Idle reclaim in the server").
#include <chrono>
#include <limits>
#include <mutex>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/api/server.h"
#include "gpufleet/control/idle_reclaim_controller.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/store/read_modify_write.h"

namespace gpufleet::api {

Status ApiServer::ReclaimIdleJobs() {
  if (!options_.idle_reclaim) {
    return Status::Ok();
  }
  if (!idle_reclaim_) {
    GPUFLEET_ASSIGN_OR_RETURN(
        control::IdleReclaimController controller,
        control::IdleReclaimController::Create(*options_.idle_reclaim, options_.catalog));
    idle_reclaim_.emplace(std::move(controller));
  }
  const MonoTime now = options_.clock.Now();
  const int64_t now_nanos = options_.wall_clock != nullptr ? options_.wall_clock->UnixNanos()
                                                           : (now - started_at_).count();
  control::IdleReclaimInputs inputs{
      .now = now,
      .now_seconds =
          std::chrono::floor<std::chrono::seconds>(std::chrono::nanoseconds(now_nanos)).count(),
      .now_text = NowText()};
  const scheduler::ClusterSnapshot& snapshot = view_->snapshot();
  std::vector<control::PendingEntry> pending = control::PendingEntries(*view_);
  inputs.pending_jobs = static_cast<int>(pending.size());
  if (idle_reclaim_->preempts() && !pending.empty()) {
    queues_.OrderPending(pending);
    inputs.first_pending = *pending.front().name;
  }
  inputs.reports = ReportsForRunningJobs();

  GPUFLEET_ASSIGN_OR_RETURN(control::IdleReclaimStep step,
                            idle_reclaim_->Step(view_->jobs(), snapshot, inputs));
  GPUFLEET_ASSIGN_OR_RETURN(const bool wrote, CommitJobWrites(std::move(step.writes)));
  if (!wrote) {
    return Status::Ok();
  }
  // This cycle's placements see the freed GPUs and the queues' new charges.
  GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  if (step.reclaimed) {
    UpdateQueues();
  }
  return Status::Ok();
}

control::GpuUtilizationReports ApiServer::ReportsForRunningJobs() {
  const scheduler::ClusterSnapshot& snapshot = view_->snapshot();
  std::set<std::string> running_nodes;
  for (const control::ViewJobEntry* entry : view_->JobsIn(control::JobState::kRunning)) {
    if (const control::ViewJob& job = entry->second; job.applied) {
      for (const scheduler::TaskPlacement& placement : job.placements) {
        running_nodes.insert(snapshot.nodes()[placement.node].node->id.value());
      }
    }
  }
  control::GpuUtilizationReports reports;
  reports.heartbeat_at = leases_.HeartbeatTimes(running_nodes);
  std::lock_guard<std::mutex> lock(agents_mu_);
  for (const std::string& node : running_nodes) {
    for (auto gpu = gpu_utilization_.lower_bound({node, std::numeric_limits<int>::min()});
         gpu != gpu_utilization_.end() && gpu->first.first == node; ++gpu) {
      reports.percent.insert(*gpu);
    }
  }
  return reports;
}

ApiResponse ApiServer::ResumeJob(const control::Principal& who, std::string_view name) {
  const Status not_found = NotFoundError(fmt::format("job \"{}\" not found", name));
  ApiResponse response;
  const Status committed = store::CommitWithRetries(
      options_.store, control::kCasAttempts,
      fmt::format("job \"{}\" kept changing; retry the resume", name),
      [&]() -> store::AttemptResult {
        const Result<store::StoredObject> object =
            ReadVisible(who, control::kJobsKind, name, not_found);
        if (!object.ok()) {
          response = ErrorResponse(object.status());
          return store::NoWrite();
        }
        Json doc = wire::ParseDocument(object->data);
        const std::string state = wire::StrOr(doc, "state");
        if (control::StoredJobState(doc) != control::JobState::kSuspended) {
          response = ErrorResponse(FailedPreconditionError(fmt::format(
              "job \"{}\" is {}, not Suspended; only a suspended job resumes", name, state)));
          return store::NoWrite();
        }
        const std::string by = who.name.empty() ? control::RoleName(who.role) : who.name;
        const Result<std::string> event = control::TransitionJob(
            doc, control::JobState::kPending, fmt::format("resumed by {}", by),
            fmt::format("resumed by {}; waits to be scheduled", by));
        if (!event.ok()) {
          response = ErrorResponse(event.status());
          return store::NoWrite();
        }
        store::WriteBatch batch;
        batch.Update(std::string(control::kJobsKind), std::string(name), doc.dump(),
                     object->version);
        batch.AppendEvent(std::string(control::kJobsKind), std::string(name), *event);
        doc["version"] = object->version + 1;
        response = JsonResponse(200, doc);
        return store::Write(std::move(batch));
      });
  return committed.ok() ? response : ErrorResponse(committed);
}

}  // namespace gpufleet::api
