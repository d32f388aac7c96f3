// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/queue_controller.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/policy/preemption.h"
#include "gpufleet/wire/job_spec.h"

namespace gpufleet::control {
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

QueueController::QueueController(Options options) : options_(std::move(options)) {}

int64_t QueueController::CycleSeconds() const {
  return std::chrono::duration_cast<std::chrono::seconds>(options_.clock.Now() -
                                                          options_.started_at)
      .count();
}

store::WriteBatch QueueController::Update(SchedulingView& view, uint64_t cycle) {
  store::WriteBatch events = DropEndedReservations(view, cycle);
  const int64_t now = CycleSeconds();
  // When each job was first charged, across a rebuild of the tree (the minimum-runtime guard).
  std::map<std::string, int64_t> since_before_rebuild;
  FollowStoredQueues(view, since_before_rebuild);
  if (!tree_) {
    return events;
  }
  policy::QueueTree& tree = *tree_;
  (void)tree.Advance(std::max(now, tree.last_advance_seconds()));
  if (!usage_loaded_) {
    if (const Status loaded = LoadUsage(); loaded.ok()) {
      usage_loaded_ = true;
    } else {
      fmt::print(stderr, "gpufleet server: queue usage not loaded yet: {}\n", loaded.ToString());
    }
  }
  const scheduler::ClusterSnapshot& snapshot = view.snapshot();
  // The snapshot counts the GPUs per model as nodes change: no walk of every GPU of the fleet.
  policy::GpuMilliByModel capacity;
  for (int id = 0; id < snapshot.ModelCount(); ++id) {
    if (const int gpus = snapshot.GpuCount(id); gpus > 0) {
      capacity[snapshot.Model(id).name] += int64_t{gpus} * kMilliPerUnit;
    }
  }
  tree.SetCapacity(std::move(capacity));
  // Follow the view: charge what holds resources, release what no longer does. Both maps are
  // ordered by job name, so each walk keeps a cursor into the other instead of searching it.
  static_assert(std::is_same_v<decltype(charged_)::key_compare,
                               std::decay_t<decltype(view.jobs())>::key_compare>);
  auto view_job = view.jobs().begin();
  for (auto it = charged_.begin(); it != charged_.end();) {
    while (view_job != view.jobs().end() && view_job->first < it->first) {
      ++view_job;
    }
    if (view_job == view.jobs().end() || view_job->first != it->first ||
        !view_job->second.applied) {
      (void)tree.Release(JobId(it->first));
      it = charged_.erase(it);
    } else {
      ++it;
    }
  }
  auto charged_cursor = charged_.begin();
  for (const auto& [name, job] : view.jobs()) {
    if (!job.applied) {
      continue;
    }
    while (charged_cursor != charged_.end() && charged_cursor->first < name) {
      ++charged_cursor;
    }
    auto it = charged_cursor != charged_.end() && charged_cursor->first == name ? charged_cursor
                                                                                : charged_.end();
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
  return events;
}

void QueueController::FollowStoredQueues(SchedulingView& view,
                                         std::map<std::string, int64_t>& since_before_rebuild) {
  if (!view.TakeQueuesChanged() && tree_) {
    return;
  }
  const int64_t now = CycleSeconds();
  const Result<std::vector<store::StoredObject>> stored = options_.store.List(kQueuesKind);
  std::vector<Queue> queues;
  if (stored.ok()) {
    for (const store::StoredObject& object : *stored) {
      queues.push_back(QueueFromJson(wire::ParseDocument(object.data)));
    }
  }
  Result<policy::QueueTree> tree = BuildQueueTree(
      queues, {.usage_half_life_seconds = std::max<int64_t>(1, options_.usage_half_life.count())});
  if (!stored.ok() || !tree.ok()) {
    // Keep the tree we have (or order by priority alone) until the queues are readable again.
    fmt::print(stderr, "gpufleet server: queue tree: {}\n",
               (stored.ok() ? tree.status() : stored.status()).ToString());
    view.ReadAllAgain();
  } else {
    // A changed quota keeps the usage recorded so far, queue by queue (a queue that is gone
    // takes its usage with it).
    (void)tree->Advance(now);
    if (tree_) {
      (void)tree_->Advance(std::max(now, tree_->last_advance_seconds()));
      for (const QueueId& queue : tree_->Queues()) {
        if (const Result<policy::QueueStatus> old = tree_->StatusOf(queue); old.ok()) {
          (void)tree->AddUsage(queue, old->usage_gpu_seconds);
        }
      }
    }
    tree_.emplace(std::move(*tree));
    queue_min_runtime_.clear();
    for (const Queue& queue : queues) {
      if (queue.min_runtime_seconds) {
        queue_min_runtime_[queue.name] = *queue.min_runtime_seconds;
      }
    }
    // Jobs refused by the old quota are tried again under the new one.
    view.BumpCapacityEpoch();
    for (const auto& [name, charged] : charged_) {
      since_before_rebuild[name] = charged.since_seconds;
    }
    charged_.clear();
  }
}

void QueueController::Publish() {
  if (!tree_) {
    return;
  }
  std::map<std::string, policy::QueueStatus> status;
  for (const QueueId& queue : tree_->Queues()) {
    if (Result<policy::QueueStatus> one = tree_->StatusOf(queue); one.ok()) {
      status[queue.value()] = std::move(*one);
    }
  }
  {
    std::lock_guard<std::mutex> lock(status_mu_);
    status_ = std::move(status);
  }
  SaveUsageIfDue();
}

Status QueueController::LoadUsage() {
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
    (void)tree_->AddUsage(QueueId(queue), usage);
  }
  return Status::Ok();
}

void QueueController::SaveUsageIfDue() {
  // Fair share moves on a scale of days (the half-life): a minute of usage lost in a crash does
  // not change the order, and one small commit a minute costs nothing next to the cycles'.
  constexpr Duration kSaveInterval = std::chrono::minutes(1);
  if (usage_saved_at_ && options_.clock.Now() - *usage_saved_at_ < kSaveInterval) {
    return;
  }
  SaveUsage();
}

void QueueController::SaveUsage() {
  const MonoTime now = options_.clock.Now();
  if (!tree_ || !usage_loaded_) {
    return;
  }
  Json queues = Json::object();
  for (const QueueId& queue : tree_->Queues()) {
    const Result<policy::QueueStatus> status = tree_->StatusOf(queue);
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
      usage_saved_at_ = now;  // nothing used, nothing decayed: no write
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
  usage_saved_at_ = now;
}

void QueueController::SaveUsageNow() {
  // Whatever the minute rule says, and with the usage up to now, so that a clean restart loses
  // none of it.
  if (tree_) {
    (void)tree_->Advance(std::max(CycleSeconds(), tree_->last_advance_seconds()));
  }
  SaveUsage();
}

std::map<std::string, policy::QueueStatus> QueueController::Statuses() {
  std::lock_guard<std::mutex> lock(status_mu_);
  return status_;
}

std::vector<PendingEntry> PendingEntries(SchedulingView& view) {
  const JobEntries& entries = view.JobsIn(JobState::kPending);
  std::vector<PendingEntry> pending;
  pending.reserve(entries.size());
  for (ViewJobEntry* entry : entries) {
    pending.push_back({&entry->first, &entry->second});
  }
  return pending;
}

void QueueController::OrderPending(std::vector<PendingEntry>& pending) const {
  // Sorted first even with a queue tree: the tree's stable sort leaves jobs whose queues tie on
  // fair share at a level in this order, so its result depends on where it starts.
  // Within a priority, an expedited job (a gang a failure requeued) goes first.
  std::sort(pending.begin(), pending.end(), [](const PendingEntry& a, const PendingEntry& b) {
    return std::tie(b.job->priority, b.job->expedited, a.job->submit_seq, *a.name) <
           std::tie(a.job->priority, a.job->expedited, b.job->submit_seq, *b.name);
  });
  OrderByFairShare(pending);
  // A preemptor whose victims were stopped for it goes before every other job, whatever their
  // priority or fair share, so that what it preempted for is not taken by another.
  std::stable_partition(pending.begin(), pending.end(), [&](const PendingEntry& entry) {
    return reservations_.count(*entry.name) > 0;
  });
  // A job requeued after a preemption (or an idle reclaim) for a job that still waits goes right
  // behind that job: its stop freed the GPUs for the other, not for its own next run.
  // (Read from the view, not the documents: with 10,000 jobs pending this runs every cycle.)
  if (std::none_of(pending.begin(), pending.end(),
                   [](const PendingEntry& entry) { return !entry.job->preempted_by.empty(); })) {
    return;
  }
  std::map<std::string, std::vector<PendingEntry>> behind;
  std::set<std::string> names;
  for (const PendingEntry& entry : pending) {
    names.insert(*entry.name);
  }
  std::vector<PendingEntry> kept;
  for (const PendingEntry& entry : pending) {
    const std::string& preemptor = entry.job->preempted_by;
    if (!preemptor.empty() && preemptor != *entry.name && names.count(preemptor) > 0) {
      behind[preemptor].push_back(entry);
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

void QueueController::OrderByFairShare(std::vector<PendingEntry>& pending) const {
  if (!tree_) {
    return;
  }
  // Runs every cycle over every pending job (10,000 in issue 15's target): each queue is looked
  // up once, and entries are put in order by position, not found again by name.
  std::map<std::string_view, QueueId> queue_of;
  std::vector<policy::PendingJob> jobs;
  jobs.reserve(pending.size());
  for (const PendingEntry& entry : pending) {
    auto [queue, added] = queue_of.try_emplace(entry.job->queue);
    if (added) {
      const QueueId named(entry.job->queue);
      queue->second = tree_->StatusOf(named).ok() ? named : QueueId(std::string(kDefaultQueue));
    }
    jobs.push_back({JobId(*entry.name), queue->second, entry.job->priority, entry.job->submit_seq,
                    entry.job->expedited});
  }
  const Result<std::vector<size_t>> order = tree_->OrderedPositions(jobs);
  if (!order.ok()) {
    return;
  }
  const std::vector<PendingEntry> unordered = pending;
  for (size_t i = 0; i < order->size(); ++i) {
    pending[i] = unordered[(*order)[i]];
  }
}

std::optional<std::string> QueueController::Admit(
    const std::string& name, const ViewJob& job,
    const std::vector<scheduler::TaskPlacement>& placed,
    const scheduler::ClusterSnapshot& snapshot) {
  std::optional<std::string> refused = AdmitByQuota(name, job, placed, snapshot);
  if (const auto reservation = reservations_.find(name);
      !refused && reservation != reservations_.end()) {
    reservation->second.placed_this_cycle = true;
  }
  return refused;
}

std::optional<std::string> QueueController::QuotaRefusal(
    const std::string& queue, const std::vector<scheduler::TaskPlacement>& placed,
    const scheduler::ClusterSnapshot& snapshot) const {
  if (!tree_) {
    return std::nullopt;
  }
  const Result<policy::Admission> admission =
      tree_->CheckAdmission(QueueId(queue), AllocationOf(placed, snapshot));
  if (!admission.ok() || admission->admitted()) {
    return std::nullopt;
  }
  return admission->reason;
}

std::optional<int64_t> QueueController::ChargedSince(const std::string& name) const {
  const auto it = charged_.find(name);
  return it == charged_.end() ? std::nullopt : std::optional<int64_t>(it->second.since_seconds);
}

std::optional<std::string> QueueController::AdmitByQuota(
    const std::string& name, const ViewJob& job,
    const std::vector<scheduler::TaskPlacement>& placed,
    const scheduler::ClusterSnapshot& snapshot) {
  if (!tree_) {
    return std::nullopt;
  }
  policy::GpuMilliByModel allocation = AllocationOf(placed, snapshot);
  const QueueId queue(job.queue);
  const Result<policy::Admission> admission = tree_->CheckAdmission(queue, allocation);
  if (!admission.ok()) {
    return std::nullopt;  // a queue the tree does not know: the submission checks guard that
  }
  if (!admission->admitted()) {
    return admission->reason;
  }
  // Charged now, so the next admission in this cycle sees it.
  if (tree_->Charge(JobId(name), queue, allocation).ok()) {
    // The version the job has once the cycle's write lands.
    charged_[name] = {std::move(allocation), CycleSeconds(), job.version + 1};
  }
  return std::nullopt;
}

Result<std::optional<PreemptionPlan>> QueueController::PlanPreemption(
    SchedulingView& view, scheduler::Scheduler& scheduler, const std::string& name,
    const Job& preemptor, const std::string& queue, uint64_t cycle, const std::string& now_text,
    int64_t now_ns, Random& random) {
  planned_.reset();
  // Within the queue a higher priority; across queues only reclaiming the queue's guarantee,
  // the same rule as the simulator's (policy::QueueTreeRule).
  policy::PreemptionRule rule = policy::HigherPriorityInSameQueue();
  if (tree_) {
    if (Result<policy::PreemptionRule> tree_rule = policy::QueueTreeRule(*tree_, QueueId(queue));
        tree_rule.ok()) {
      rule = std::move(*tree_rule);
    }
  }
  // Their placements are copied only once some job may be a victim: the cycle asks this for a
  // job that did not fit, with thousands running, and most times none may be preempted for it.
  std::vector<policy::RunningJob> running;
  std::vector<const ViewJob*> running_jobs;
  const int64_t now_seconds = CycleSeconds();
  // A checkpoint (wall-clock time, as the agents report it) on the cycle's time line: as long
  // before now. Without a wall clock none is known, and a victim loses its whole run.
  const auto checkpoint_seconds = [&](const ViewJob& job) -> std::optional<int64_t> {
    if (!job.last_checkpoint_ns || options_.wall_clock == nullptr) {
      return std::nullopt;
    }
    const int64_t age_ns =
        std::max<int64_t>(0, options_.wall_clock->UnixNanos() - *job.last_checkpoint_ns);
    return now_seconds - age_ns / 1'000'000'000;
  };
  for (auto& [other, job] : view.jobs()) {
    // A job already stopping, or under a notice, is no victim: its GPUs come free without
    // another preemption.
    if (!job.applied || other == name || !RunIsWanted(job.state) || job.notice ||
        job.releasing > 0) {
      continue;
    }
    ViewJobSpec(job, options_.catalog);
    const auto charged = charged_.find(other);
    // The job's own minimum runtime, else its queue's or the nearest parent's; else the
    // search's, the server's.
    std::optional<int64_t> min_runtime;
    if (job.spec->ok() && (*job.spec)->min_runtime) {
      min_runtime =
          std::chrono::duration_cast<std::chrono::seconds>(*(*job.spec)->min_runtime).count();
    }
    std::string_view path = job.queue;
    while (!min_runtime && !path.empty()) {
      if (const auto it = queue_min_runtime_.find(path); it != queue_min_runtime_.end()) {
        min_runtime = it->second;
      }
      const size_t slash = path.rfind('/');
      path = slash == std::string_view::npos ? std::string_view() : path.substr(0, slash);
    }
    running.push_back({.id = JobId(other),
                       .queue = QueueId(job.queue),
                       .priority = job.priority,
                       .preemptible = job.spec->ok() && (*job.spec)->preemptible,
                       .start_seconds = charged != charged_.end()
                                            ? std::min(charged->second.since_seconds, now_seconds)
                                            : now_seconds,
                       .last_checkpoint_seconds = checkpoint_seconds(job),
                       .min_runtime_seconds = min_runtime,
                       .releasable_tasks = ReleasableTasks(job)});
    running_jobs.push_back(&job);
  }
  // Nothing to ask the search when no running job may be preempted by this one.
  if (std::none_of(running.begin(), running.end(), [&](const policy::RunningJob& victim) {
        return victim.preemptible && rule(preemptor, victim);
      })) {
    return std::optional<PreemptionPlan>();
  }
  for (size_t i = 0; i < running.size(); ++i) {
    running[i].placements = running_jobs[i]->placements;
  }
  GPUFLEET_ASSIGN_OR_RETURN(
      policy::PreemptionSearch search,
      policy::PreemptionSearch::Create(
          scheduler, rule,
          {.min_runtime_seconds = std::chrono::duration_cast<std::chrono::seconds>(
                                      options_.min_runtime_before_preemption)
                                      .count()}));
  GPUFLEET_ASSIGN_OR_RETURN(const policy::PreemptionDecision decision,
                            search.Find(view.snapshot(), preemptor, running, now_seconds, random));
  if (!decision.plan || (decision.plan->victims.empty() && decision.plan->shrinks.empty())) {
    return std::optional<PreemptionPlan>();
  }
  // The victims stop now; the preemptor is placed by a later cycle, once their GPUs are free.
  PreemptionPlan plan;
  std::vector<std::string> victims;
  std::vector<std::string> shown_victims;
  int other_teams_victims = 0;
  const std::string preemptor_team =
      wire::StrOr(wire::ParseDocument(view.jobs().at(name).data), "team");
  for (const JobId& victim_id : decision.plan->victims) {
    const std::string& victim = victim_id.value();
    const ViewJob& job = view.jobs().at(victim);
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
    // A victim that asks for a checkpoint grace is told first; its run ends by EndNoticedRuns.
    const std::optional<wire::NoticeRecord> notice =
        job.spec && job.spec->ok()
            ? PreemptionNotice(**job.spec, job.state, options_.max_checkpoint_grace, now_ns, why)
            : std::nullopt;
    Result<std::string> event = notice ? Result<std::string>(NoticeEvent(*notice))
                                       : EndRun(doc, JobState::kPreempted, why, now_text);
    if (!event.ok()) {
      continue;
    }
    if (notice) {
      doc["notice"] = wire::NoticeRecordToJson(*notice);
    }
    doc["preempted_by"] = name;
    doc["preempted_by_team"] = preemptor_team;
    plan.victim_writes.push_back({.name = victim,
                                  .version = job.version,
                                  .before = before,
                                  .after = std::move(doc),
                                  .events = {std::move(*event)}});
    victims.push_back(victim);
    // The preemptor's team reads its reason and events: another team's victim is not named.
    if (wire::StrOr(before, "team") == preemptor_team) {
      shown_victims.emplace_back(NameOfKey(victim));
    } else {
      ++other_teams_victims;
    }
  }
  for (const policy::Shrink& shrink : decision.plan->shrinks) {
    const std::string& victim = shrink.job.value();
    const ViewJob& job = view.jobs().at(victim);
    const Json before = wire::ParseDocument(job.data);
    const std::string by = wire::StrOr(before, "team") == preemptor_team
                               ? fmt::format("job {}", NameOfKey(name))
                               : std::string("a job of another team");
    Json doc = before;
    const std::string event = ShrinkRun(
        doc, job, shrink.tasks,
        fmt::format("shrunk for {} (priority {} over {})", by, preemptor.priority, job.priority),
        now_ns);
    plan.victim_writes.push_back({.name = victim,
                                  .version = job.version,
                                  .before = before,
                                  .after = std::move(doc),
                                  .events = {event}});
    victims.push_back(victim);
    const std::string shown = fmt::format("{} of the tasks of ", shrink.tasks);
    if (wire::StrOr(before, "team") == preemptor_team) {
      shown_victims.push_back(shown + std::string(NameOfKey(victim)));
    } else {
      shown_victims.push_back(shown + "a job of another team");
    }
  }
  if (other_teams_victims > 0) {
    shown_victims.push_back(fmt::format("{} job(s) of other teams", other_teams_victims));
  }
  Reservation reservation{.domain = decision.plan->domain,
                          .victims = victims,
                          .placements = decision.plan->placements,
                          .until_seconds = CycleSeconds() + kReservationSeconds,
                          .until_cycle = cycle + kReservationCycles};
  std::set<std::string> nodes;
  for (const scheduler::TaskPlacement& placement : reservation.placements) {
    reservation.placement_nodes.push_back(view.snapshot().nodes()[placement.node].node->id.value());
    nodes.insert(reservation.placement_nodes.back());
  }
  const std::string where =
      reservation.domain == "cluster" || nodes.count(reservation.domain) > 0
          ? fmt::format("{}", fmt::join(nodes, ", "))
          : fmt::format("{} ({})", reservation.domain, fmt::join(nodes, ", "));
  plan.preemptor_event = fmt::format(
      "preempting {} ({} GPUs in {}) to make room; their GPUs on {} are reserved for this job "
      "for {} s",
      fmt::join(shown_victims, ", "),
      static_cast<double>(decision.plan->preempted_gpu_milli) / kMilliPerUnit,
      decision.plan->domain, where, kReservationSeconds);
  plan.pending_reason =
      fmt::format("GPUs reserved on {} after preempting {}; waiting for them to stop", where,
                  fmt::join(shown_victims, ", "));
  planned_.emplace(name, std::move(reservation));
  return std::optional<PreemptionPlan>(std::move(plan));
}

int QueueController::ReleasableTasks(const ViewJob& job) const {
  if (job.world_size <= 0 || !job.spec || !job.spec->ok() || !(*job.spec)->IsElastic()) {
    return 0;
  }
  const int64_t above_min = job.world_size - (*job.spec)->groups[0].min_replicas;
  return static_cast<int>(std::clamp<int64_t>(
      above_min, 0, std::max<int64_t>(0, static_cast<int64_t>(job.placements.size()) - 1)));
}

std::string QueueController::ShrinkRun(Json& doc, const ViewJob& job, int tasks,
                                       const std::string& why, int64_t now_ns) const {
  // The notice a whole victim would get, or a release at once for a job that asks for none.
  const std::optional<wire::NoticeRecord> notice =
      PreemptionNotice(**job.spec, job.state, options_.max_checkpoint_grace, now_ns, why);
  const wire::NoticeRecord release =
      notice.value_or(wire::NoticeRecord{.signal = (*job.spec)->notice_signal,
                                         .since_ns = now_ns,
                                         .deadline_ns = now_ns,
                                         .reason = why});
  std::vector<Json*> by_rank;
  for (Json& placement : doc["placements"]) {
    by_rank.push_back(&placement);
  }
  std::stable_sort(by_rank.begin(), by_rank.end(), [](const Json* a, const Json* b) {
    return wire::IntOr(*a, "replica", 0) > wire::IntOr(*b, "replica", 0);
  });
  std::vector<std::string> released;
  for (int i = 0; i < tasks && i < static_cast<int>(by_rank.size()); ++i) {
    (*by_rank[i])["release"] = wire::NoticeRecordToJson(release);
    released.push_back(wire::StrOr(*by_rank[i], "task"));
  }
  const int64_t size = job.world_size - static_cast<int64_t>(released.size());
  doc["world_size"] = size;
  return fmt::format("shrinking from {} to {} tasks: {}; {} stop{}", job.world_size, size, why,
                     fmt::join(released, ", "),
                     notice
                         ? fmt::format(" after a notice ({}), at the latest in {}s", notice->signal,
                                       (notice->deadline_ns - notice->since_ns) / 1'000'000'000)
                         : " now");
}

void QueueController::Reserve(const std::string& name) {
  if (planned_ && planned_->first == name) {
    reservations_[name] = std::move(planned_->second);
  }
  planned_.reset();
}

store::WriteBatch QueueController::DropEndedReservations(SchedulingView& view, uint64_t cycle) {
  if (held_placements_) {
    // The last cycle ended early with GPUs still held: read the snapshot again without them.
    held_placements_.reset();
    view.ReadAllAgain();
    if (const Status status = view.Refresh(); !status.ok()) {
      fmt::print(stderr, "gpufleet server: view after held GPUs: {}\n", status.ToString());
    }
  }
  store::WriteBatch events;
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    Reservation& reservation = it->second;
    reservation.placed_this_cycle = false;
    const auto job = view.jobs().find(it->first);
    const bool pending = job != view.jobs().end() && job->second.state == JobState::kPending;
    // The reservation lasts while its victims save their work under a notice (bounded by the
    // checkpoint grace) and stop, however long their tasks take to exit.
    if (std::any_of(reservation.victims.begin(), reservation.victims.end(),
                    [&](const std::string& victim) {
                      const auto it_victim = view.jobs().find(victim);
                      return it_victim != view.jobs().end() &&
                             (it_victim->second.state == JobState::kStopping ||
                              it_victim->second.releasing > 0 ||
                              (it_victim->second.notice && RunIsWanted(it_victim->second.state)));
                    })) {
      reservation.until_seconds =
          std::max(reservation.until_seconds, CycleSeconds() + kReservationSeconds);
    }
    const bool expired =
        CycleSeconds() >= reservation.until_seconds && cycle >= reservation.until_cycle;
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
    view.BumpCapacityEpoch();
    it = reservations_.erase(it);
  }
  return events;
}

void QueueController::HoldReservedGpus(SchedulingView& view, const std::string& next_job) {
  if (held_placements_ || reservations_.empty() || reservations_.count(next_job) > 0) {
    return;
  }
  held_placements_.emplace();
  scheduler::ClusterSnapshot& snapshot = view.snapshot();
  for (const auto& [preemptor, reservation] : reservations_) {
    if (reservation.placed_this_cycle) {
      continue;
    }
    for (size_t i = 0; i < reservation.placements.size(); ++i) {
      scheduler::TaskPlacement placement = reservation.placements[i];
      placement.node = view.NodeIndex(reservation.placement_nodes[i]);
      // GPUs the victims still hold, or that went to another job before the reservation, or
      // on a node that is gone: nothing to hold there.
      if (placement.node >= 0 && snapshot.Apply(placement).ok()) {
        held_placements_->push_back(std::move(placement));
      }
    }
  }
}

void QueueController::ReleaseReservedGpus(SchedulingView& view) {
  if (held_placements_) {
    for (auto it = held_placements_->rbegin(); it != held_placements_->rend(); ++it) {
      view.snapshot().Revert(*it);
    }
  }
  held_placements_.reset();
}

}  // namespace gpufleet::control
