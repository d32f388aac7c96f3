// SPDX-License-Identifier: Apache-2.0
// Idle reclaim of interactive jobs in the scheduling cycle, and the resume of a suspended job
// (docs/utilization.md, "Idle reclaim in the server").
#include <algorithm>
#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/api/scheduling_view.h"
#include "gpufleet/api/server.h"
#include "gpufleet/store/read_modify_write.h"
#include "gpufleet/wire/job_spec.h"

namespace gpufleet::api {
namespace {

const std::string kWarningField = "warning";
// Agents report whole percents; the reclaimer takes milli.
constexpr int64_t kMilliPerPercent = 10;

int64_t FloorSeconds(int64_t nanos) {
  return std::chrono::floor<std::chrono::seconds>(std::chrono::nanoseconds(nanos)).count();
}

}  // namespace

int64_t ApiServer::ReclaimSeconds(MonoTime time) {
  if (!reclaim_epoch_seconds_) {
    // Fixed once: the time line stays monotonic (the reclaimer requires it) and reads as wall
    // time in the reasons; without a wall clock it counts from the server's start.
    const int64_t wall_seconds = options_.wall_clock != nullptr
                                     ? FloorSeconds(options_.wall_clock->UnixNanos())
                                     : FloorSeconds((options_.clock.Now() - started_at_).count());
    reclaim_epoch_seconds_ = wall_seconds - FloorSeconds(options_.clock.Now().nanos);
  }
  return *reclaim_epoch_seconds_ + FloorSeconds(time.nanos);
}

Status ApiServer::ReclaimIdleJobs() {
  if (!options_.idle_reclaim) {
    return Status::Ok();
  }
  if (!idle_reclaimer_) {
    GPUFLEET_ASSIGN_OR_RETURN(policy::IdleReclaimer reclaimer,
                              policy::IdleReclaimer::Create(*options_.idle_reclaim));
    idle_reclaimer_.emplace(std::move(reclaimer));
  }
  GPUFLEET_RETURN_IF_ERROR(TrackAndSampleIdleJobs());
  int pending = 0;
  for (const auto& [name, job] : view_->jobs()) {
    pending += job.state == JobState::kPending ? 1 : 0;
  }
  GPUFLEET_RETURN_IF_ERROR(
      idle_reclaimer_->Decide(ReclaimSeconds(options_.clock.Now()), pending).status());
  return WriteIdleDecisions();
}

Status ApiServer::TrackAndSampleIdleJobs() {
  // Follow the view: a job is watched while it is Running; one that left Running (finished,
  // requeued, reclaimed) is forgotten, so a later run starts afresh.
  std::set<std::string> running;
  for (auto& [name, job] : view_->jobs()) {
    if (job.state != JobState::kRunning || !job.applied) {
      continue;
    }
    if (!job.spec) {
      job.spec = wire::ParseJobSpec(wire::ParseDocument(job.data)["spec"].dump(), options_.catalog);
    }
    if (!job.spec->ok() || (*job.spec)->kind != JobKind::kInteractive) {
      continue;
    }
    running.insert(name);
    if (idle_tracked_.count(name) == 0) {
      GPUFLEET_RETURN_IF_ERROR(idle_reclaimer_->Track(JobId(name), JobKind::kInteractive));
      idle_tracked_.emplace(name, IdleTrackedJob{});
    }
  }
  for (auto it = idle_tracked_.begin(); it != idle_tracked_.end();) {
    if (running.count(it->first) > 0) {
      ++it;
      continue;
    }
    idle_reclaimer_->Untrack(JobId(it->first));
    it = idle_tracked_.erase(it);
  }

  // One sample per job and heartbeat: the mean utilization of its GPUs, as of the oldest of its
  // nodes' latest heartbeats. A GPU without a reported utilization means no sample (never idle).
  struct Sample {
    std::string job;
    int64_t time_seconds = 0;
    int64_t milli = 0;
  };
  std::vector<Sample> samples;
  {
    std::lock_guard<std::mutex> lock(agents_mu_);
    for (const auto& [name, tracked] : idle_tracked_) {
      const std::optional<JobUtilization> measured = MeasureJobUtilization(view_->jobs().at(name));
      if (!measured) {
        continue;
      }
      const int64_t time_seconds = ReclaimSeconds(measured->as_of);
      if (tracked.last_sample_seconds && time_seconds <= *tracked.last_sample_seconds) {
        continue;  // nothing new since the last cycle
      }
      samples.push_back({name, time_seconds, measured->milli});
    }
  }
  for (const Sample& sample : samples) {
    GPUFLEET_RETURN_IF_ERROR(
        idle_reclaimer_->Observe(JobId(sample.job), sample.time_seconds, sample.milli));
    idle_tracked_.at(sample.job).last_sample_seconds = sample.time_seconds;
  }
  return Status::Ok();
}

std::optional<ApiServer::JobUtilization> ApiServer::MeasureJobUtilization(const ViewJob& job) {
  const scheduler::ClusterSnapshot& snapshot = view_->snapshot();
  std::optional<MonoTime> as_of;
  int64_t sum = 0;
  int64_t count = 0;
  for (const scheduler::TaskPlacement& placement : job.placements) {
    const Node& node = *snapshot.nodes()[placement.node].node;
    const auto beat = last_heartbeat_.find(node.id.value());
    if (beat == last_heartbeat_.end()) {
      return std::nullopt;
    }
    as_of = as_of ? std::min(*as_of, beat->second) : beat->second;
    for (const scheduler::GpuAssignment& gpu : placement.gpus) {
      const auto utilization = gpu_utilization_.find({node.id.value(), node.gpus[gpu.gpu].index});
      if (utilization == gpu_utilization_.end()) {
        return std::nullopt;
      }
      sum += utilization->second;
      ++count;
    }
  }
  if (count == 0) {
    return std::nullopt;
  }
  return JobUtilization{*as_of, sum * kMilliPerPercent / count};
}

Status ApiServer::WriteIdleDecisions() {
  // The documents follow the reclaimer's state rather than its events, so that a write lost to a
  // conflict is made by a later cycle.
  const bool suspend = options_.idle_reclaim->action == policy::ReclaimAction::kSuspend;
  std::optional<std::string> first_waiting;  // in queue order, for "preempted_by"
  store::WriteBatch batch;
  std::vector<std::string> written;
  bool reclaimed = false;
  for (auto& [name, tracked] : idle_tracked_) {
    const ViewJob& job = view_->jobs().at(name);
    GPUFLEET_ASSIGN_OR_RETURN(const policy::IdleJobStatus status,
                              idle_reclaimer_->Describe(JobId(name)));
    if (tracked.version != job.version) {
      tracked.warning = wire::StrOr(wire::ParseDocument(job.data), kWarningField);
      tracked.version = job.version;
    }
    const std::string warning =
        status.state == policy::IdleState::kWarned ? status.last_reason : "";
    if (status.state != policy::IdleState::kReclaimed && warning == tracked.warning) {
      continue;
    }
    const Json before = wire::ParseDocument(job.data);
    Json doc = before;
    std::string event;
    if (status.state == policy::IdleState::kReclaimed) {
      event = fmt::format("reclaimed: {}{}", status.last_reason,
                          suspend ? " until its owner resumes it" : "");
      // The run ends as a preemption (its outcome record says so) whatever the job becomes.
      doc.erase(kWarningField);
      const Result<std::string> ended =
          EndRun(doc, suspend ? JobState::kSuspended : JobState::kPreempted, event, NowText());
      if (!ended.ok()) {
        continue;
      }
      if (!suspend) {
        if (!first_waiting) {
          std::vector<PendingEntry> pending;
          for (auto& [other, other_job] : view_->jobs()) {
            if (other_job.state == JobState::kPending) {
              pending.push_back({&other, &other_job});
            }
          }
          OrderPendingJobs(pending);
          first_waiting = pending.empty() ? "" : *pending.front().name;
        }
        if (!first_waiting->empty()) {
          doc["preempted_by"] = *first_waiting;
          doc["preempted_by_team"] =
              wire::StrOr(wire::ParseDocument(view_->jobs().at(*first_waiting).data), "team");
        }
      }
      reliability_->NoteJobChange(before, doc, batch);
      event = *ended;
      reclaimed = true;
    } else {
      if (warning.empty()) {
        doc.erase(kWarningField);
        event = status.last_reason.empty() ? "idle warning withdrawn" : status.last_reason;
      } else {
        doc[kWarningField] = warning;
        event = fmt::format("idle warning: {}", warning);
      }
      reliability_->NoteJobChange(before, doc, batch);
    }
    batch.Update(std::string(kJobsKind), name, doc.dump(), job.version);
    batch.AppendEvent(std::string(kJobsKind), name, event);
    written.push_back(name);
  }
  if (written.empty()) {
    return Status::Ok();
  }
  if (const Status status = options_.store.Commit(batch); !status.ok()) {
    for (const std::string& name : written) {
      view_->ReadJobAgain(name);
    }
    if (status.code() == StatusCode::kAborted || status.code() == StatusCode::kNotFound) {
      return Status::Ok();
    }
    return status;
  }
  // This cycle's placements see the freed GPUs and the queues' new charges.
  GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  if (reclaimed) {
    UpdateQueueTree();
  }
  return Status::Ok();
}

ApiResponse ApiServer::ResumeJob(const Principal& who, std::string_view name) {
  const Status not_found = NotFoundError(fmt::format("job \"{}\" not found", name));
  ApiResponse response;
  const Status committed = store::CommitWithRetries(
      options_.store, kCasAttempts, fmt::format("job \"{}\" kept changing; retry the resume", name),
      [&]() -> store::AttemptResult {
        const Result<store::StoredObject> object = ReadVisible(who, kJobsKind, name, not_found);
        if (!object.ok()) {
          response = ErrorResponse(object.status());
          return store::NoWrite();
        }
        Json doc = wire::ParseDocument(object->data);
        const std::string state = wire::StrOr(doc, "state");
        if (StoredJobState(doc) != JobState::kSuspended) {
          response = ErrorResponse(FailedPreconditionError(fmt::format(
              "job \"{}\" is {}, not Suspended; only a suspended job resumes", name, state)));
          return store::NoWrite();
        }
        const std::string by = who.name.empty() ? RoleName(who.role) : who.name;
        const Result<std::string> event =
            TransitionJob(doc, JobState::kPending, fmt::format("resumed by {}", by),
                          fmt::format("resumed by {}; waits to be scheduled", by));
        if (!event.ok()) {
          response = ErrorResponse(event.status());
          return store::NoWrite();
        }
        store::WriteBatch batch;
        batch.Update(std::string(kJobsKind), std::string(name), doc.dump(), object->version);
        batch.AppendEvent(std::string(kJobsKind), std::string(name), *event);
        doc["version"] = object->version + 1;
        response = JsonResponse(200, doc);
        return store::Write(std::move(batch));
      });
  return committed.ok() ? response : ErrorResponse(committed);
}

}  // namespace gpufleet::api
