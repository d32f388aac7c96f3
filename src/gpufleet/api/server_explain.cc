// SPDX-License-Identifier: Apache-2.0
// GET /v1/jobs/NAME/explain (docs/explain.md): why a job waits, answered by policy::Explain over
// the scheduling view's snapshot, under the cycle's lock, with the queue order, the quota and the
// backfill reservation the cycle itself uses.
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/routes.h"
#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/rfc3339.h"
#include "gpufleet/policy/backfill.h"
#include "gpufleet/policy/explain.h"
#include "gpufleet/wire/job_spec.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {
namespace {

// Most jobs ahead named one by one; the rest are counted.
constexpr size_t kMaxAheadShown = 100;

Json GpusJson(int64_t milli) {
  if (milli % kMilliPerUnit == 0) {
    return milli / kMilliPerUnit;
  }
  return static_cast<double>(milli) / kMilliPerUnit;
}

}  // namespace

ApiResponse ApiRoutes::ExplainJob(const control::Principal& who, std::string_view name) {
  const Status absent = NotFoundError(fmt::format("job \"{}\" not found", name));
  const Result<store::StoredObject> object = ReadVisible(who, control::kJobsKind, name, absent);
  if (!object.ok()) {
    return ErrorResponse(object.status());
  }
  const Json doc = wire::ParseDocument(object->data);
  const std::string phase = wire::StrOr(doc, "state");
  Json out = {{"job", std::string(control::NameOfKey(name))},
              {"phase", phase},
              {"reason", "none"},
              {"message", ""},
              {"evidence", Json::object()},
              {"queuePosition", 0},
              {"ahead", Json::array()},
              {"eta", {{"at", nullptr}, {"why", "it is not pending"}}},
              {"whatIf", Json::array()}};
  if (control::StoredJobState(doc) != control::JobState::kPending) {
    const std::string reason = wire::StrOr(doc, "reason");
    out["message"] = fmt::format("the job is {}{}", phase,
                                 reason.empty() ? std::string() : fmt::format(": {}", reason));
    return JsonResponse(200, out);
  }

  std::lock_guard<std::mutex> lock(control_->cycle_mutex());
  control::SchedulingView& view = control_->view();
  control::QueueController& queues = control_->queues();
  if (!ready_.load()) {
    return ErrorResponse(UnavailableError("the scheduling loop has not run yet"));
  }
  if (const Status refreshed = view.Refresh(); !refreshed.ok()) {
    return ErrorResponse(refreshed);
  }
  const std::string key(name);
  const auto it = view.jobs().find(key);
  if (it == view.jobs().end() || it->second.state != control::JobState::kPending) {
    return ErrorResponse(UnavailableError("the job changed meanwhile; ask again"));
  }
  control::ViewJob& job = it->second;
  if (!control::ViewJobSpec(job, options_.catalog).ok()) {
    out["reason"] = "constraints";
    out["message"] = fmt::format("its stored spec is invalid: {}", job.spec->status().message());
    out["eta"] = {{"at", nullptr}, {"why", "unknown: it can never start as stored"}};
    return JsonResponse(200, out);
  }

  // The queue order the cycle uses.
  std::vector<control::PendingEntry> pending = control::PendingEntries(view);
  queues.OrderPending(pending);
  std::vector<const Job*> ahead;
  Json ahead_json = Json::array();
  int hidden = 0;
  int more = 0;  // visible, past the kMaxAheadShown named
  int position = 0;
  for (const control::PendingEntry& entry : pending) {
    ++position;
    if (*entry.name == key) {
      break;
    }
    control::ViewJob& other = *entry.job;
    if (const Result<Job>& spec = control::ViewJobSpec(other, options_.catalog); spec.ok()) {
      ahead.push_back(&*spec);
    }
    // Other teams' jobs ahead are counted, not named.
    if (!who.Sees(control::TeamOfKey(*entry.name))) {
      ++hidden;
      continue;
    }
    if (ahead_json.size() >= kMaxAheadShown) {
      ++more;
      continue;
    }
    Json shown = {{"name", std::string(control::NameOfKey(*entry.name))}, {"queue", other.queue}};
    shown["gpus"] = other.spec->ok() ? GpusJson((*other.spec)->RequestedGpuMilliTotal()) : Json();
    ahead_json.push_back(std::move(shown));
  }
  if (more > 0) {
    ahead_json.push_back({{"more", more}});
  }
  if (hidden > 0) {
    ahead_json.push_back({{"hidden", hidden}});
  }

  const int64_t now = queues.CycleSeconds();
  Random random(options_.seed + control_->cycle_count());
  std::vector<policy::RunningJob> running = control_->backfill().RunningJobs(view, queues, now);
  // An elastic job waits because not even its minimum fits (docs/job-spec.md, "Elastic jobs").
  const Job& waiting = **job.spec;
  const std::optional<Job> minimum =
      waiting.IsElastic() ? std::optional<Job>(waiting.AtSize(waiting.groups[0].min_replicas))
                          : std::nullopt;
  policy::ExplainInput input{.job = minimum ? &*minimum : &waiting,
                             .ahead = ahead,
                             .running = running,
                             .now_seconds = now};
  const std::string queue = job.queue;
  input.quota = [&](const Job&, const std::vector<scheduler::TaskPlacement>& placed,
                    const scheduler::ClusterSnapshot& snapshot) {
    return queues.QuotaRefusal(queue, placed, snapshot);
  };
  // The reservation the last cycle made for the head of the queue, planned again on this view.
  const std::optional<std::string>& head = control_->backfill().head();
  std::optional<policy::Reservation> reservation;
  const Job* head_spec = nullptr;
  policy::BackfillPlanner planner(control_->scheduler());
  if (head && *head != key) {
    const auto head_job = view.jobs().find(*head);
    if (head_job != view.jobs().end() && head_job->second.state == control::JobState::kPending &&
        head_job->second.spec && head_job->second.spec->ok()) {
      head_spec = &**head_job->second.spec;
      Result<policy::Reservation> planned =
          planner.Reserve(*head_spec, running, now, view.snapshot(), random);
      if (planned.ok() && planned->exists()) {
        reservation = std::move(*planned);
      }
    }
  }
  if (reservation) {
    const std::string head_name =
        control::TeamOfKey(*head) == control::TeamOfKey(key) || who.is_admin()
            ? fmt::format("job {}", control::NameOfKey(*head))
            : std::string("a job of another team");
    input.reservation = [&, head_name](
                            const Job& candidate_job,
                            const std::vector<scheduler::TaskPlacement>& placed,
                            const scheduler::ClusterSnapshot&) -> std::optional<std::string> {
      const policy::RunningJob candidate{
          .id = JobId(key),
          .start_seconds = now,
          .estimate_seconds = control::EstimateSeconds(candidate_job),
          .placements = placed};
      // KeepsReservation asks with the candidate's placements applied.
      scheduler::ClusterSnapshot& snapshot = view.snapshot();
      std::vector<scheduler::TaskPlacement> applied;
      for (const scheduler::TaskPlacement& placement : placed) {
        if (snapshot.Apply(placement).ok()) {
          applied.push_back(placement);
        }
      }
      const Result<bool> keeps = planner.KeepsReservation(*reservation, *head_spec, candidate,
                                                          running, now, snapshot, random);
      for (auto p = applied.rbegin(); p != applied.rend(); ++p) {
        snapshot.Revert(*p);
      }
      if (!keeps.ok() || *keeps) {
        return std::nullopt;
      }
      return fmt::format(
          "starting it would delay {}, first in the queue, whose reservation starts in {} s",
          head_name, reservation->shadow_seconds - now);
    };
  }
  const Result<policy::Explanation> explained =
      policy::Explain(control_->scheduler(), view.snapshot(), input, random);
  if (!explained.ok()) {
    return ErrorResponse(explained.status());
  }
  out["reason"] = policy::PendingReasonName(explained->reason);
  out["message"] = explained->message;
  out["queuePosition"] = position;
  out["queue"] = job.queue;
  out["ahead"] = std::move(ahead_json);
  Json evidence = {{"scheduler", explained->scheduler_reason},
                   {"nodes",
                    {{"fits", explained->nodes.fits},
                     {"capacity", explained->nodes.capacity},
                     {"constraints", explained->nodes.constraints},
                     {"health", explained->nodes.health}}},
                   {"neededGpus", GpusJson(explained->needed_gpu_milli)},
                   {"freeGpus", GpusJson(explained->free_gpu_milli)}};
  if (explained->best_domain) {
    const policy::DomainEvidence& best = *explained->best_domain;
    evidence["bestDomain"] = {
        {"level", best.level},
        {"name", best.name},
        {"freeGpus", GpusJson(best.free_gpu_milli)},
        {"totalGpus", GpusJson(best.total_gpu_milli)},
        {"lacksGpus", GpusJson(std::max<int64_t>(0, best.needed_gpu_milli - best.free_gpu_milli))}};
  }
  if (reservation && head_spec != nullptr) {
    evidence["backfillReservation"] = {{"inSeconds", reservation->shadow_seconds - now}};
  }
  out["evidence"] = std::move(evidence);
  Json eta = {{"at", nullptr}, {"why", explained->eta_why}};
  if (explained->ahead_never_start > 0) {
    eta["aheadCannotStart"] = explained->ahead_never_start;
  }
  if (explained->eta_seconds) {
    const int64_t in = *explained->eta_seconds - now;
    eta["inSeconds"] = in;
    if (options_.wall_clock != nullptr) {
      eta["at"] = FormatRfc3339(options_.wall_clock->UnixNanos() + in * 1'000'000'000);
    } else {
      eta["why"] =
          fmt::format("{} (in {} s; the server has no wall clock)", explained->eta_why, in);
    }
  }
  out["eta"] = std::move(eta);
  Json what_ifs = Json::array();
  for (const policy::WhatIf& what_if : explained->what_ifs) {
    // The changed job as a spec to submit in place of this one.
    Json spec = wire::JobSpecToJson(what_if.job);
    spec["metadata"]["name"] = std::string(control::NameOfKey(name));
    what_ifs.push_back({{"change", what_if.change},
                        {"wouldStartNow", what_if.would_start_now},
                        {"detail", what_if.detail},
                        {"spec", std::move(spec)}});
  }
  out["whatIf"] = std::move(what_ifs);
  return JsonResponse(200, out);
}

}  // namespace gpufleet::api
