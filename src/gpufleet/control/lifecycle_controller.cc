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
    const std::string why = record->preempted_by_team.value_or("") == record->team
                                ? fmt::format("requeued after preemption by job {}",
                                              NameOfKey(record->preempted_by.value_or("?")))
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
