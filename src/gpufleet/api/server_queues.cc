// SPDX-License-Identifier: Apache-2.0
// The queue side of the scheduling cycle (docs/utilization.md): the queue tree with quota and
// fair share, admission of placements, and preemption for priority and for reclaiming guarantees.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "gpufleet/api/lifecycle_controller.h"
#include "gpufleet/api/scheduling_view.h"
#include "gpufleet/api/server.h"
#include "gpufleet/api/tenancy.h"
#include "gpufleet/policy/preemption.h"
#include "gpufleet/wire/job_spec.h"
#include "gpufleet/wire/json_scan.h"

namespace gpufleet::api {
namespace {

// How long a preemptor's reservation lasts: a minute of server time, and at least three cycles
// (with a long cycle interval the preemptor still gets its tries). The victims' GPUs are free in
// the next cycle, so a preemptor that fits at all starts then.
constexpr int64_t kReservationSeconds = 60;
constexpr uint64_t kReservationCycles = 3;

// Milli-GPU by model that `placements` take.
policy::GpuMilliByModel AllocationOf(const std::vector<scheduler::TaskPlacement>& placements,
                                     const scheduler::ClusterSnapshot& snapshot) {
  policy::GpuMilliByModel allocation;
  for (const scheduler::TaskPlacement& placement : placements) {
    const scheduler::NodeInfo& node = snapshot.nodes()[placement.node];
    for (const scheduler::GpuAssignment& gpu : placement.gpus) {
      allocation[snapshot.Model(node.gpus[gpu.gpu].model_id).name] += gpu.milli;
    }
  }
  return allocation;
}

}  // namespace

int64_t ApiServer::CycleSeconds() const {
  return std::chrono::duration_cast<std::chrono::seconds>(options_.clock.Now() - started_at_)
      .count();
}

void ApiServer::UpdateQueueTree() {
  DropEndedReservations();
  const int64_t now = CycleSeconds();
  // When each job was first charged, across a rebuild of the tree (the minimum-runtime guard).
  std::map<std::string, int64_t> since_before_rebuild;
  if (view_->TakeQueuesChanged() || !queue_tree_) {
    const Result<std::vector<store::StoredObject>> stored = options_.store.List(kQueuesKind);
    std::vector<Queue> queues;
    if (stored.ok()) {
      for (const store::StoredObject& object : *stored) {
        queues.push_back(QueueFromJson(wire::ParseDocument(object.data)));
      }
    }
    Result<policy::QueueTree> tree = BuildQueueTree(
        queues,
        {.usage_half_life_seconds = std::max<int64_t>(1, options_.usage_half_life.count())});
    if (!stored.ok() || !tree.ok()) {
      // Keep the tree we have (or order by priority alone) until the queues are readable again.
      fmt::print(stderr, "gpufleet server: queue tree: {}\n",
                 (stored.ok() ? tree.status() : stored.status()).ToString());
      view_->ReadAllAgain();
    } else {
      // A changed quota keeps the usage recorded so far, queue by queue (a queue that is gone
      // takes its usage with it).
      (void)tree->Advance(now);
      if (queue_tree_) {
        (void)queue_tree_->Advance(std::max(now, queue_tree_->last_advance_seconds()));
        for (const QueueId& queue : queue_tree_->Queues()) {
          if (const Result<policy::QueueStatus> old = queue_tree_->StatusOf(queue); old.ok()) {
            (void)tree->AddUsage(queue, old->usage_gpu_seconds);
          }
        }
      }
      queue_tree_.emplace(std::move(*tree));
      // Jobs refused by the old quota are tried again under the new one.
      view_->BumpCapacityEpoch();
      for (const auto& [name, charged] : charged_) {
        since_before_rebuild[name] = charged.since_seconds;
      }
      charged_.clear();
    }
  }
  if (!queue_tree_) {
    return;
  }
  policy::QueueTree& tree = *queue_tree_;
  (void)tree.Advance(std::max(now, tree.last_advance_seconds()));
  if (!queue_usage_loaded_) {
    if (const Status loaded = LoadQueueUsage(); loaded.ok()) {
      queue_usage_loaded_ = true;
    } else {
      fmt::print(stderr, "gpufleet server: queue usage not loaded yet: {}\n", loaded.ToString());
    }
  }
  const scheduler::ClusterSnapshot& snapshot = view_->snapshot();
  policy::GpuMilliByModel capacity;
  for (const scheduler::NodeInfo& node : snapshot.nodes()) {
    for (const scheduler::GpuSlot& gpu : node.gpus) {
      capacity[snapshot.Model(gpu.model_id).name] += kMilliPerUnit;
    }
  }
  tree.SetCapacity(std::move(capacity));
  // Follow the view: charge what holds resources, release what no longer does.
  for (auto it = charged_.begin(); it != charged_.end();) {
    const auto job = view_->jobs().find(it->first);
    if (job == view_->jobs().end() || !job->second.applied) {
      (void)tree.Release(JobId(it->first));
      it = charged_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [name, job] : view_->jobs()) {
    if (!job.applied) {
      continue;
    }
    auto it = charged_.find(name);
    if (it != charged_.end() && it->second.version == job.version) {
      continue;  // placements change only with the job's version
    }
    policy::GpuMilliByModel allocation = AllocationOf(job.placements, snapshot);
    if (it != charged_.end() && it->second.allocation == allocation) {
      it->second.version = job.version;
      continue;
    }
    if (it != charged_.end()) {
      (void)tree.Release(JobId(name));
    }
    const QueueId queue(job.queue);
    const QueueId charged_queue =
        tree.StatusOf(queue).ok() ? queue : QueueId(std::string(kDefaultQueue));
    if (tree.Charge(JobId(name), charged_queue, allocation).ok()) {
      const auto before = since_before_rebuild.find(name);
      const int64_t since = it != charged_.end()                   ? it->second.since_seconds
                            : before != since_before_rebuild.end() ? before->second
                                                                   : now;
      charged_[name] = {std::move(allocation), since, job.version};
    }
  }
}

void ApiServer::PublishQueueStatus() {
  if (!queue_tree_) {
    return;
  }
  std::map<std::string, policy::QueueStatus> status;
  for (const QueueId& queue : queue_tree_->Queues()) {
    if (Result<policy::QueueStatus> one = queue_tree_->StatusOf(queue); one.ok()) {
      status[queue.value()] = std::move(*one);
    }
  }
  {
    std::lock_guard<std::mutex> lock(queue_status_mu_);
    queue_status_ = std::move(status);
  }
  SaveQueueUsageIfDue();
}

Status ApiServer::LoadQueueUsage() {
  const Result<store::StoredObject> object = options_.store.Get(kQueueUsageKind, kQueueUsageName);
  if (!object.ok()) {
    return object.status().code() == StatusCode::kNotFound ? Status::Ok() : object.status();
  }
  const Json document = wire::ParseDocument(object->data);
  // Decayed over the time the server was down, as the running tree decays it; without a wall
  // clock that time is unknown and the usage is taken as saved.
  double decay = 1;
  const int64_t saved_at = wire::IntOr(document, "saved_at_unix_seconds", -1);
  if (options_.wall_clock != nullptr && saved_at >= 0) {
    const int64_t down_seconds = options_.wall_clock->UnixNanos() / 1'000'000'000 - saved_at;
    decay = std::exp2(-static_cast<double>(std::max<int64_t>(0, down_seconds)) /
                      static_cast<double>(std::max<int64_t>(1, options_.usage_half_life.count())));
  }
  const auto queues = document.find("queues");
  if (queues == document.end() || !queues->is_object()) {
    return Status::Ok();
  }
  for (const auto& [queue, by_model] : queues->items()) {
    std::map<std::string, double> usage;
    for (const auto& [model, gpu_seconds] : by_model.items()) {
      if (gpu_seconds.is_number()) {
        usage[model] = gpu_seconds.get<double>() * decay;
      }
    }
    // A queue deleted since (kNotFound) leaves its usage behind.
    (void)queue_tree_->AddUsage(QueueId(queue), usage);
  }
  return Status::Ok();
}

void ApiServer::SaveQueueUsageIfDue() {
  // Fair share moves on a scale of days (the half-life): a minute of usage lost in a crash does
  // not change the order, and one small commit a minute costs nothing next to the cycles'.
  constexpr Duration kSaveInterval = std::chrono::minutes(1);
  if (queue_usage_saved_at_ && options_.clock.Now() - *queue_usage_saved_at_ < kSaveInterval) {
    return;
  }
  SaveQueueUsage();
}

void ApiServer::SaveQueueUsage() {
  const MonoTime now = options_.clock.Now();
  if (!queue_tree_ || !queue_usage_loaded_) {
    return;
  }
  Json queues = Json::object();
  for (const QueueId& queue : queue_tree_->Queues()) {
    const Result<policy::QueueStatus> status = queue_tree_->StatusOf(queue);
    if (status.ok() && !status->usage_gpu_seconds.empty()) {
      queues[queue.value()] = status->usage_gpu_seconds;
    }
  }
  Json document = {{"queues", queues}};
  if (options_.wall_clock != nullptr) {
    document["saved_at_unix_seconds"] = options_.wall_clock->UnixNanos() / 1'000'000'000;
  }
  const Result<store::StoredObject> stored = options_.store.Get(kQueueUsageKind, kQueueUsageName);
  store::WriteBatch batch;
  if (stored.ok()) {
    const Json previous = wire::ParseDocument(stored->data);
    if (previous.contains("queues") && previous["queues"] == queues) {
      queue_usage_saved_at_ = now;  // nothing used, nothing decayed: no write
      return;
    }
    batch.Update(std::string(kQueueUsageKind), std::string(kQueueUsageName), document.dump(),
                 stored->version);
  } else if (stored.status().code() == StatusCode::kNotFound) {
    batch.Create(std::string(kQueueUsageKind), std::string(kQueueUsageName), document.dump());
  } else {
    fmt::print(stderr, "gpufleet server: queue usage not saved: {}\n", stored.status().ToString());
    return;
  }
  // A failed write is tried again after the next cycle.
  if (const Status status = options_.store.Commit(batch); !status.ok()) {
    fmt::print(stderr, "gpufleet server: queue usage not saved: {}\n", status.ToString());
    return;
  }
  queue_usage_saved_at_ = now;
}

std::map<std::string, policy::QueueStatus> ApiServer::QueueStatuses() {
  std::lock_guard<std::mutex> lock(queue_status_mu_);
  return queue_status_;
}

void ApiServer::OrderPendingJobs(std::vector<PendingEntry>& pending) const {
  std::sort(pending.begin(), pending.end(), [](const PendingEntry& a, const PendingEntry& b) {
    return std::tie(b.job->priority, a.job->submit_seq, *a.name) <
           std::tie(a.job->priority, b.job->submit_seq, *b.name);
  });
  OrderByFairShare(pending);
  // A preemptor whose victims were stopped for it goes before every other job, whatever their
  // priority or fair share, so that what it preempted for is not taken by another.
  std::stable_partition(pending.begin(), pending.end(), [&](const PendingEntry& entry) {
    return reservations_.count(*entry.name) > 0;
  });
  // A job requeued after a preemption (or an idle reclaim) for a job that still waits goes right
  // behind that job: its stop freed the GPUs for the other, not for its own next run.
  std::map<std::string, std::vector<PendingEntry>> behind;
  std::set<std::string> names;
  for (const PendingEntry& entry : pending) {
    names.insert(*entry.name);
  }
  std::vector<PendingEntry> kept;
  for (const PendingEntry& entry : pending) {
    const std::optional<std::string> preemptor =
        wire::TopLevelString(entry.job->data, "preempted_by");
    if (preemptor && *preemptor != *entry.name && names.count(*preemptor) > 0) {
      behind[*preemptor].push_back(entry);
    } else {
      kept.push_back(entry);
    }
  }
  if (behind.empty()) {
    return;
  }
  pending.clear();
  std::set<std::string> emitted;
  const auto emit = [&](const PendingEntry& entry, const auto& self) -> void {
    if (!emitted.insert(*entry.name).second) {
      return;
    }
    pending.push_back(entry);
    if (const auto it = behind.find(*entry.name); it != behind.end()) {
      for (const PendingEntry& follower : it->second) {
        self(follower, self);
      }
    }
  };
  for (const PendingEntry& entry : kept) {
    emit(entry, emit);
  }
  // Jobs that name each other (a cycle of preemptions) keep their order at the end.
  for (const auto& [preemptor, followers] : behind) {
    for (const PendingEntry& follower : followers) {
      emit(follower, emit);
    }
  }
}

void ApiServer::OrderByFairShare(std::vector<PendingEntry>& pending) const {
  if (!queue_tree_) {
    return;
  }
  std::map<std::string, PendingEntry> by_name;
  std::vector<policy::PendingJob> jobs;
  for (const PendingEntry& entry : pending) {
    const QueueId queue(entry.job->queue);
    jobs.push_back({JobId(*entry.name),
                    queue_tree_->StatusOf(queue).ok() ? queue : QueueId(std::string(kDefaultQueue)),
                    entry.job->priority, entry.job->submit_seq});
    by_name[*entry.name] = entry;
  }
  if (!queue_tree_->Order(jobs).ok()) {
    return;
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    pending[i] = by_name.at(jobs[i].id.value());
  }
}

std::optional<std::string> ApiServer::AdmitPlacement(
    const std::string& name, const ViewJob& job,
    const std::vector<scheduler::TaskPlacement>& placed) {
  std::optional<std::string> refused = AdmitByQuota(name, job, placed);
  if (const auto reservation = reservations_.find(name);
      !refused && reservation != reservations_.end()) {
    reservation->second.placed_this_cycle = true;
  }
  return refused;
}

std::optional<std::string> ApiServer::AdmitByQuota(
    const std::string& name, const ViewJob& job,
    const std::vector<scheduler::TaskPlacement>& placed) {
  if (!queue_tree_) {
    return std::nullopt;
  }
  policy::GpuMilliByModel allocation = AllocationOf(placed, view_->snapshot());
  const QueueId queue(job.queue);
  const Result<policy::Admission> admission = queue_tree_->CheckAdmission(queue, allocation);
  if (!admission.ok()) {
    return std::nullopt;  // a queue the tree does not know: the submission checks guard that
  }
  if (!admission->admitted()) {
    return admission->reason;
  }
  // Charged now, so the next admission in this cycle sees it.
  if (queue_tree_->Charge(JobId(name), queue, allocation).ok()) {
    // The version the job has once the cycle's write lands.
    charged_[name] = {std::move(allocation), CycleSeconds(), job.version + 1};
  }
  return std::nullopt;
}

Result<std::optional<std::string>> ApiServer::TryPreemption(const std::string& name,
                                                            const Job& preemptor,
                                                            const std::string& queue,
                                                            Random& random) {
  // Within the queue a higher priority; across queues only reclaiming the queue's guarantee,
  // the same rule as the simulator's (policy::QueueTreeRule).
  policy::PreemptionRule rule = policy::HigherPriorityInSameQueue();
  if (queue_tree_) {
    if (Result<policy::PreemptionRule> tree_rule =
            policy::QueueTreeRule(*queue_tree_, QueueId(queue));
        tree_rule.ok()) {
      rule = std::move(*tree_rule);
    }
  }
  std::vector<policy::RunningJob> running;
  for (auto& [other, job] : view_->jobs()) {
    // A job already stopping is no victim: its GPUs come free without another preemption.
    if (!job.applied || other == name || !RunIsWanted(job.state)) {
      continue;
    }
    if (!job.spec) {
      job.spec = wire::ParseJobSpec(wire::ParseDocument(job.data)["spec"].dump(), options_.catalog);
    }
    const auto charged = charged_.find(other);
    running.push_back(
        {.id = JobId(other),
         .queue = QueueId(job.queue),
         .priority = job.priority,
         .preemptible = job.spec->ok() && (*job.spec)->preemptible,
         .start_seconds = charged != charged_.end()
                              ? std::min(charged->second.since_seconds, CycleSeconds())
                              : CycleSeconds(),
         .placements = job.placements});
  }
  // Nothing to ask the search when no running job may be preempted by this one.
  if (std::none_of(running.begin(), running.end(), [&](const policy::RunningJob& victim) {
        return victim.preemptible && rule(preemptor, victim);
      })) {
    return std::optional<std::string>();
  }
  GPUFLEET_ASSIGN_OR_RETURN(
      policy::PreemptionSearch search,
      policy::PreemptionSearch::Create(
          *scheduler_, rule,
          {.min_runtime_seconds = std::chrono::duration_cast<std::chrono::seconds>(
                                      options_.min_runtime_before_preemption)
                                      .count()}));
  GPUFLEET_ASSIGN_OR_RETURN(
      const policy::PreemptionDecision decision,
      search.Find(view_->snapshot(), preemptor, running, CycleSeconds(), random));
  if (!decision.plan || decision.plan->victims.empty()) {
    return std::optional<std::string>();
  }
  // Stop the victims now; the preemptor is placed by a later cycle, once their GPUs are free.
  store::WriteBatch batch;
  std::vector<std::string> victims;
  std::vector<std::string> shown_victims;
  int other_teams_victims = 0;
  const std::string preemptor_team =
      wire::StrOr(wire::ParseDocument(view_->jobs().at(name).data), "team");
  for (const JobId& victim_id : decision.plan->victims) {
    const std::string& victim = victim_id.value();
    const ViewJob& job = view_->jobs().at(victim);
    const Json before = wire::ParseDocument(job.data);
    // The victim's team reads this reason: another team's job is not named to it.
    const std::string by = wire::StrOr(before, "team") == preemptor_team
                               ? fmt::format("job {}", NameOfKey(name))
                               : std::string("a job of another team");
    const std::string why =
        job.queue == queue
            ? fmt::format("preempted by {} (priority {} over {})", by, preemptor.priority,
                          job.priority)
            : fmt::format("preempted by {}: queue {} reclaims its guarantee from queue {}", by,
                          queue, job.queue);
    Json doc = before;
    const Result<std::string> event = EndRun(doc, JobState::kPreempted, why, NowText());
    if (!event.ok()) {
      continue;
    }
    doc["preempted_by"] = name;
    doc["preempted_by_team"] = preemptor_team;
    AddJobWrite(before, doc, job.version, *event, batch);
    victims.push_back(victim);
    // The preemptor's team reads its reason and events: another team's victim is not named.
    if (wire::StrOr(before, "team") == preemptor_team) {
      shown_victims.emplace_back(NameOfKey(victim));
    } else {
      ++other_teams_victims;
    }
  }
  if (other_teams_victims > 0) {
    shown_victims.push_back(fmt::format("{} job(s) of other teams", other_teams_victims));
  }
  Reservation reservation{.domain = decision.plan->domain,
                          .victims = victims,
                          .placements = decision.plan->placements,
                          .until_seconds = CycleSeconds() + kReservationSeconds,
                          .until_cycle = cycle_count_ + kReservationCycles};
  std::set<std::string> nodes;
  for (const scheduler::TaskPlacement& placement : reservation.placements) {
    reservation.placement_nodes.push_back(
        view_->snapshot().nodes()[placement.node].node->id.value());
    nodes.insert(reservation.placement_nodes.back());
  }
  const std::string where =
      reservation.domain == "cluster" || nodes.count(reservation.domain) > 0
          ? fmt::format("{}", fmt::join(nodes, ", "))
          : fmt::format("{} ({})", reservation.domain, fmt::join(nodes, ", "));
  const std::string message = fmt::format(
      "preempting {} ({} GPUs in {}) to make room; their GPUs on {} are reserved for this job "
      "for {} s",
      fmt::join(shown_victims, ", "),
      static_cast<double>(decision.plan->preempted_gpu_milli) / kMilliPerUnit,
      decision.plan->domain, where, kReservationSeconds);
  batch.AppendEvent(std::string(kJobsKind), name, message);
  if (const Status status = options_.store.Commit(batch); !status.ok()) {
    for (const std::string& victim : victims) {
      view_->ReadJobAgain(victim);
    }
    if (status.code() == StatusCode::kAborted || status.code() == StatusCode::kNotFound) {
      return std::optional<std::string>();
    }
    return status;
  }
  reservations_[name] = std::move(reservation);
  return std::optional<std::string>(
      fmt::format("GPUs reserved on {} after preempting {}; waiting for them to stop", where,
                  fmt::join(shown_victims, ", ")));
}

void ApiServer::DropEndedReservations() {
  if (held_placements_) {
    // The last cycle ended early with GPUs still held: read the snapshot again without them.
    held_placements_.reset();
    view_->ReadAllAgain();
    if (const Status status = view_->Refresh(); !status.ok()) {
      fmt::print(stderr, "gpufleet server: view after held GPUs: {}\n", status.ToString());
    }
  }
  store::WriteBatch events;
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    Reservation& reservation = it->second;
    reservation.placed_this_cycle = false;
    const auto job = view_->jobs().find(it->first);
    const bool pending = job != view_->jobs().end() && job->second.state == JobState::kPending;
    // The reservation lasts while its victims stop, however long their tasks take to exit.
    if (std::any_of(reservation.victims.begin(), reservation.victims.end(),
                    [&](const std::string& victim) {
                      const auto it_victim = view_->jobs().find(victim);
                      return it_victim != view_->jobs().end() &&
                             it_victim->second.state == JobState::kStopping;
                    })) {
      reservation.until_seconds =
          std::max(reservation.until_seconds, CycleSeconds() + kReservationSeconds);
    }
    const bool expired =
        CycleSeconds() >= reservation.until_seconds && cycle_count_ >= reservation.until_cycle;
    if (pending && !expired) {
      ++it;
      continue;
    }
    if (pending) {
      events.AppendEvent(std::string(kJobsKind), it->first,
                         fmt::format("reservation of GPUs on {} expired before the job started",
                                     reservation.domain));
    }
    // Jobs that did not fit beside the held GPUs may fit now.
    view_->BumpCapacityEpoch();
    it = reservations_.erase(it);
  }
  if (events.empty()) {
    return;
  }
  if (const Status status = options_.store.Commit(events); !status.ok()) {
    fmt::print(stderr, "gpufleet server: reservation event: {}\n", status.ToString());
  }
}

void ApiServer::HoldReservedGpus(const std::string& next_job) {
  if (held_placements_ || reservations_.empty() || reservations_.count(next_job) > 0) {
    return;
  }
  held_placements_.emplace();
  scheduler::ClusterSnapshot& snapshot = view_->snapshot();
  for (const auto& [preemptor, reservation] : reservations_) {
    if (reservation.placed_this_cycle) {
      continue;
    }
    for (size_t i = 0; i < reservation.placements.size(); ++i) {
      scheduler::TaskPlacement placement = reservation.placements[i];
      placement.node = view_->NodeIndex(reservation.placement_nodes[i]);
      // GPUs the victims still hold, or that went to another job before the reservation, or
      // on a node that is gone: nothing to hold there.
      if (placement.node >= 0 && snapshot.Apply(placement).ok()) {
        held_placements_->push_back(std::move(placement));
      }
    }
  }
}

void ApiServer::ReleaseReservedGpus() {
  if (held_placements_) {
    for (auto it = held_placements_->rbegin(); it != held_placements_->rend(); ++it) {
      view_->snapshot().Revert(*it);
    }
  }
  held_placements_.reset();
}

Result<bool> ApiServer::RequeuePreemptedJobs() {
  return CommitJobWrites(api::RequeuePreemptedJobs(view_->jobs()));
}

}  // namespace gpufleet::api
