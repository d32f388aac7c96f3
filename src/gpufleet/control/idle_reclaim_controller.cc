// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/idle_reclaim_controller.h"

#include <algorithm>
#include <chrono>
#include <set>

#include <fmt/format.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/wire/job_record.h"
#include "gpufleet/wire/job_spec.h"

namespace gpufleet::control {
namespace {

const std::string kWarningField = "warning";
// Agents report whole percents; the reclaimer takes milli.
constexpr int64_t kMilliPerPercent = 10;

int64_t FloorSeconds(int64_t nanos) {
  return std::chrono::floor<std::chrono::seconds>(std::chrono::nanoseconds(nanos)).count();
}

}  // namespace

std::optional<JobUtilization> MeasureJobUtilization(
    const ViewJob& job, const scheduler::ClusterSnapshot& snapshot,
    const std::map<std::string, MonoTime>& heartbeat_at,
    const std::map<std::pair<std::string, int>, int>& percent) {
  std::optional<MonoTime> as_of;
  int64_t sum = 0;
  int64_t count = 0;
  for (const scheduler::TaskPlacement& placement : job.placements) {
    const Node& node = *snapshot.nodes()[placement.node].node;
    const auto beat = heartbeat_at.find(node.id.value());
    if (beat == heartbeat_at.end()) {
      return std::nullopt;
    }
    as_of = as_of ? std::min(*as_of, beat->second) : beat->second;
    for (const scheduler::GpuAssignment& gpu : placement.gpus) {
      const auto utilization = percent.find({node.id.value(), node.gpus[gpu.gpu].index});
      if (utilization == percent.end()) {
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

Result<IdleReclaimController> IdleReclaimController::Create(
    const policy::IdleReclaimOptions& options, const GpuCatalog& catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(policy::IdleReclaimer reclaimer,
                            policy::IdleReclaimer::Create(options));
  return IdleReclaimController(std::move(reclaimer), catalog);
}

int64_t IdleReclaimController::Seconds(MonoTime time) const {
  return *epoch_seconds_ + FloorSeconds(time.nanos);
}

Result<IdleReclaimStep> IdleReclaimController::Step(const std::map<std::string, ViewJob>& jobs,
                                                    const scheduler::ClusterSnapshot& snapshot,
                                                    const IdleReclaimInputs& inputs) {
  if (!epoch_seconds_) {
    // Fixed once: the time line stays monotonic (the reclaimer requires it) and reads as wall
    // time in the reasons.
    epoch_seconds_ = inputs.now_seconds - FloorSeconds(inputs.now.nanos);
  }
  GPUFLEET_RETURN_IF_ERROR(TrackRunningJobs(jobs));
  GPUFLEET_RETURN_IF_ERROR(Sample(jobs, snapshot, inputs.reports));
  GPUFLEET_RETURN_IF_ERROR(reclaimer_.Decide(Seconds(inputs.now), inputs.pending_jobs).status());
  return Writes(jobs, inputs);
}

const IdleReclaimController::RunningJob& IdleReclaimController::ReadRunningJob(
    const std::string& name, const ViewJob& job, std::map<std::string, RunningJob>& running) {
  if (const auto known = running_.find(name);
      known != running_.end() && known->second.version == job.version) {
    return running.emplace(name, known->second).first->second;
  }
  RunningJob read{.version = job.version};
  // The spec is read with the record unless the view has parsed it already.
  const Result<wire::JobRecord> record =
      wire::JobRecordFromJson(wire::ParseDocument(job.data), job.spec ? nullptr : catalog_);
  const Job* spec = job.spec ? (job.spec->ok() ? &**job.spec : nullptr)
                             : (record.ok() && record->spec ? &*record->spec : nullptr);
  read.interactive = spec != nullptr && spec->kind == JobKind::kInteractive;
  if (read.interactive && record.ok()) {
    read.attempt = record->attempt;
  }
  return running[name] = read;
}

Status IdleReclaimController::TrackRunningJobs(const std::map<std::string, ViewJob>& jobs) {
  // Follow the view: a job is watched while it is Running; one that left Running (finished,
  // requeued, reclaimed) is forgotten, and one that runs a new attempt is watched afresh, so that
  // every run starts afresh.
  std::map<std::string, RunningJob> running;
  std::set<std::string> watched;
  for (const auto& [name, job] : jobs) {
    if (job.state != JobState::kRunning || !job.applied) {
      continue;
    }
    const RunningJob& read = ReadRunningJob(name, job, running);
    if (!read.interactive) {
      continue;
    }
    watched.insert(name);
    const auto tracked = tracked_.find(name);
    if (tracked != tracked_.end() && tracked->second.attempt == read.attempt) {
      continue;
    }
    if (tracked != tracked_.end()) {
      reclaimer_.Untrack(JobId(name));
      tracked_.erase(tracked);
    }
    GPUFLEET_RETURN_IF_ERROR(reclaimer_.Track(JobId(name), JobKind::kInteractive));
    tracked_.emplace(name, TrackedJob{.attempt = read.attempt});
  }
  running_ = std::move(running);
  for (auto it = tracked_.begin(); it != tracked_.end();) {
    if (watched.count(it->first) > 0) {
      ++it;
      continue;
    }
    reclaimer_.Untrack(JobId(it->first));
    it = tracked_.erase(it);
  }
  return Status::Ok();
}

Status IdleReclaimController::Sample(const std::map<std::string, ViewJob>& jobs,
                                     const scheduler::ClusterSnapshot& snapshot,
                                     const GpuUtilizationReports& reports) {
  // One sample per job and heartbeat: the mean utilization of its GPUs, as of the oldest of its
  // nodes' latest heartbeats. A GPU without a reported utilization means no sample (never idle).
  for (auto& [name, tracked] : tracked_) {
    const std::optional<JobUtilization> measured =
        MeasureJobUtilization(jobs.at(name), snapshot, reports.heartbeat_at, reports.percent);
    if (!measured) {
      continue;
    }
    const int64_t time_seconds = Seconds(measured->as_of);
    if (tracked.last_sample_seconds && time_seconds <= *tracked.last_sample_seconds) {
      continue;  // nothing new since the last step
    }
    GPUFLEET_RETURN_IF_ERROR(reclaimer_.Observe(JobId(name), time_seconds, measured->milli));
    tracked.last_sample_seconds = time_seconds;
  }
  return Status::Ok();
}

Result<IdleReclaimStep> IdleReclaimController::Writes(const std::map<std::string, ViewJob>& jobs,
                                                      const IdleReclaimInputs& inputs) {
  const bool suspend = !preempts();
  IdleReclaimStep step;
  for (auto& [name, tracked] : tracked_) {
    const ViewJob& job = jobs.at(name);
    GPUFLEET_ASSIGN_OR_RETURN(const policy::IdleJobStatus status, reclaimer_.Describe(JobId(name)));
    if (tracked.version != job.version) {
      tracked.warning = wire::StrOr(wire::ParseDocument(job.data), kWarningField);
      tracked.version = job.version;
    }
    const std::string warning =
        status.state == policy::IdleState::kWarned ? status.last_reason : "";
    if (status.state != policy::IdleState::kReclaimed && warning == tracked.warning) {
      continue;
    }
    JobWrite write{.name = name, .version = job.version, .before = wire::ParseDocument(job.data)};
    write.after = write.before;
    Json& doc = write.after;
    if (status.state == policy::IdleState::kReclaimed) {
      const std::string why = fmt::format("reclaimed: {}{}", status.last_reason,
                                          suspend ? " until its owner resumes it" : "");
      // The run ends as a preemption (its outcome record says so) whatever the job becomes.
      doc.erase(kWarningField);
      Result<std::string> ended =
          EndRun(doc, suspend ? JobState::kSuspended : JobState::kPreempted, why, inputs.now_text);
      if (!ended.ok()) {
        continue;
      }
      if (!suspend && !inputs.first_pending.empty()) {
        doc["preempted_by"] = inputs.first_pending;
        const auto preemptor = jobs.find(inputs.first_pending);
        doc["preempted_by_team"] =
            preemptor != jobs.end()
                ? wire::StrOr(wire::ParseDocument(preemptor->second.data), "team")
                : std::string();
      }
      write.events.push_back(std::move(*ended));
      step.reclaimed = true;
    } else if (warning.empty()) {
      doc.erase(kWarningField);
      write.events.push_back(status.last_reason.empty() ? "idle warning withdrawn"
                                                        : status.last_reason);
    } else {
      doc[kWarningField] = warning;
      write.events.push_back(fmt::format("idle warning: {}", warning));
    }
    step.writes.push_back(std::move(write));
  }
  return step;
}

}  // namespace gpufleet::control
