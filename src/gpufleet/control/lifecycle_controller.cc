// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/lifecycle_controller.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/wire/agent_protocol.h"
#include "gpufleet/wire/job_record.h"

namespace gpufleet::control {

std::vector<JobWrite> EndGoneTasksOfStoppingRuns(const std::map<std::string, ViewJob>& jobs,
                                                 const std::map<std::string, ViewNode>& nodes,
                                                 const std::map<std::string, std::string>& lost) {
  std::vector<JobWrite> writes;
  for (const auto& [name, job] : jobs) {
    if (job.state != JobState::kStopping) {
      continue;
    }
    JobWrite write{.name = name, .version = job.version, .before = wire::ParseDocument(job.data)};
    write.after = write.before;
    for (Json& placement : write.after["placements"]) {
      const std::string node = wire::StrOr(placement, "node");
      const auto gone = lost.find(node);
      if (!PlacementGone(placement) && (gone != lost.end() || nodes.count(node) == 0)) {
        const std::string why =
            gone != lost.end() ? gone->second : fmt::format("node {} is gone", node);
        MarkPlacementGone(placement, why);
        write.events.push_back(fmt::format("task {}: {}", wire::StrOr(placement, "task"), why));
      }
    }
    if (std::optional<std::string> finished = FinishStoppingIfDone(write.after)) {
      write.events.push_back(std::move(*finished));
    }
    if (!write.events.empty()) {
      writes.push_back(std::move(write));
    }
  }
  return writes;
}

std::vector<JobWrite> EndRunsOnNotReadyNodes(const std::map<std::string, ViewJob>& jobs,
                                             const std::set<std::string>& not_ready,
                                             const std::string& now_text) {
  std::vector<JobWrite> writes;
  if (not_ready.empty()) {
    return writes;
  }
  for (const auto& [name, job] : jobs) {
    if (!RunIsWanted(job.state) ||
        std::none_of(job.nodes.begin(), job.nodes.end(),
                     [&](const std::string& node) { return not_ready.count(node) > 0; })) {
      continue;
    }
    JobWrite write{.name = name, .version = job.version, .before = wire::ParseDocument(job.data)};
    write.after = write.before;
    for (const Json& placement : wire::ArrayOr(write.before, "placements")) {
      const std::string node = wire::StrOr(placement, "node");
      if (not_ready.count(node) > 0) {
        write.events.push_back(
            EndRunOnFailure(write.after,
                            fmt::format("node {} is NotReady (task {} ran there)", node,
                                        wire::StrOr(placement, "task")),
                            now_text));
        writes.push_back(std::move(write));
        break;
      }
    }
  }
  return writes;
}

std::optional<wire::NoticeRecord> PreemptionNotice(const Job& spec, JobState state,
                                                   std::chrono::seconds max_grace, int64_t now_ns,
                                                   std::string reason) {
  const int64_t grace_seconds = std::min<int64_t>(spec.checkpoint_grace_seconds, max_grace.count());
  if (grace_seconds <= 0 || state != JobState::kRunning) {
    return std::nullopt;
  }
  return wire::NoticeRecord{.signal = spec.notice_signal,
                            .since_ns = now_ns,
                            .deadline_ns = now_ns + grace_seconds * 1'000'000'000,
                            .reason = std::move(reason)};
}

std::string NoticeEvent(const wire::NoticeRecord& notice) {
  return fmt::format(
      "preemption notice ({}): stopping once a task reports a checkpoint, at the latest in {}s; "
      "{}",
      notice.signal, (notice.deadline_ns - notice.since_ns) / 1'000'000'000, notice.reason);
}

bool SavedSinceNotice(const wire::NoticeRecord& notice, std::optional<int64_t> last_checkpoint_ns) {
  const int64_t notice_second = notice.since_ns / 1'000'000'000 * 1'000'000'000;
  return last_checkpoint_ns && *last_checkpoint_ns >= notice_second;
}

bool NoticeOver(const wire::NoticeRecord& notice, std::optional<int64_t> last_checkpoint_ns,
                int64_t now_ns) {
  return now_ns >= notice.deadline_ns || SavedSinceNotice(notice, last_checkpoint_ns);
}

std::vector<JobWrite> EndNoticedRuns(const JobEntries& running, int64_t now_ns,
                                     const std::string& now_text) {
  std::vector<JobWrite> writes;
  for (const auto* entry : running) {
    const auto& [name, job] = *entry;
    if (job.state != JobState::kRunning || !job.notice) {
      continue;
    }
    const bool saved = SavedSinceNotice(*job.notice, job.last_checkpoint_ns);
    if (!NoticeOver(*job.notice, job.last_checkpoint_ns, now_ns)) {
      continue;
    }
    JobWrite write{.name = name, .version = job.version, .before = wire::ParseDocument(job.data)};
    write.after = write.before;
    Result<std::string> event =
        EndRun(write.after, JobState::kPreempted,
               fmt::format("{} ({})", job.notice->reason,
                           saved ? "a checkpoint was reported after its notice"
                                 : "its notice's checkpoint grace ran out"),
               now_text);
    if (!event.ok()) {
      continue;
    }
    write.events.push_back(std::move(*event));
    writes.push_back(std::move(write));
  }
  return writes;
}

std::vector<JobWrite> RequeuePreemptedJobs(const JobEntries& preempted) {
  std::vector<JobWrite> writes;
  for (const auto* entry : preempted) {
    const auto& [name, job] = *entry;
    if (job.state != JobState::kPreempted) {
      continue;
    }
    JobWrite write{.name = name, .version = job.version, .before = wire::ParseDocument(job.data)};
    write.after = write.before;
    const Result<wire::JobRecord> record = wire::JobRecordFromJson(write.before, nullptr);
    if (!record.ok()) {
      continue;  // never expected: the view does not hold a job it cannot read
    }
    // An elastic job that stopped to grow (GrowElasticJobs) names no preemptor: its reason says.
    const std::string why =
        !record->preempted_by ? fmt::format("requeued: {}", record->reason)
        : record->preempted_by_team.value_or("") == record->team
            ? fmt::format("requeued after preemption by job {}", NameOfKey(*record->preempted_by))
            : std::string("requeued after preemption by a job of another team");
    Result<std::string> event = TransitionJob(write.after, JobState::kPending, why, why);
    if (!event.ok()) {
      continue;
    }
    write.events.push_back(std::move(*event));
    writes.push_back(std::move(write));
  }
  return writes;
}

std::vector<JobWrite> GangStartController::Step(const JobEntries& scheduled, int64_t now_ns,
                                                const std::string& now_text) const {
  std::vector<JobWrite> writes;
  for (const auto* entry : scheduled) {
    const auto& [name, job] = *entry;
    if (job.state != JobState::kScheduled || job.placements.size() < 2) {
      continue;
    }
    JobWrite write{.name = name, .version = job.version, .before = wire::ParseDocument(job.data)};
    const std::optional<std::string> partial = PartlyStartedGang(write.before);
    if (!partial) {
      continue;
    }
    const std::optional<int64_t> since = GangWindowStart(write.before);
    if (!since || now_ns - *since < timeout_.count()) {
      continue;
    }
    write.after = write.before;
    Result<std::string> event = EndRun(
        write.after, JobState::kPending,
        fmt::format("requeued: the gang did not start together within {}s: {}",
                    std::chrono::duration_cast<std::chrono::seconds>(timeout_).count(), *partial),
        now_text);
    if (!event.ok()) {
      continue;  // not an active run after all; the next cycle sees it as it is
    }
    write.events.push_back(std::move(*event));
    writes.push_back(std::move(write));
  }
  return writes;
}

}  // namespace gpufleet::control
