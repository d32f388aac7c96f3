// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/control_plane.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/control/event_groups.h"
#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/placement_gpus.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/rfc3339.h"
#include "gpufleet/policy/never_fits.h"
#include "gpufleet/scheduler/elastic.h"
#include "gpufleet/scheduler/registry.h"
#include "gpufleet/scheduler/snapshot.h"
#include "gpufleet/wire/job_record.h"
#include "gpufleet/wire/job_spec.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::control {
namespace {

Json PlacementsToJson(const std::vector<scheduler::TaskPlacement>& placements, const Job& job,
                      const scheduler::ClusterSnapshot& snapshot) {
  Json out = Json::array();
  for (const scheduler::TaskPlacement& placement : placements) {
    const scheduler::NodeInfo& info = snapshot.nodes()[placement.node];
    const std::string group_name =
        placement.group >= 0 && placement.group < static_cast<int>(job.groups.size())
            ? job.groups[placement.group].name
            : fmt::format("group{}", placement.group);
    wire::PlacementRecord record{.task = fmt::format("{}-{}", group_name, placement.replica),
                                 .node = info.node->id.value(),
                                 .group = placement.group,
                                 .replica = placement.replica,
                                 .cpu_milli = placement.host.cpu_milli,
                                 .memory_mib = placement.host.memory_mib};
    // The GPUs by UUID; their position in the node's list means nothing once it registers again
    // (placement_gpus.h).
    for (const scheduler::GpuAssignment& a : placement.gpus) {
      const Gpu& gpu = info.node->gpus[a.gpu];
      record.gpu_indices.push_back(gpu.index);
      record.gpu_uuids.push_back(gpu.uuid.value());
      record.assignments.push_back({.milli = a.milli,
                                    .memory_mib = a.memory_mib,
                                    .mig_profile = a.mig_profile,
                                    .mig_start = a.mig_start,
                                    .mig_created = a.mig_created,
                                    .model = gpu.model,
                                    .mps = a.mps});
    }
    out.push_back(wire::PlacementRecordToJson(record));
  }
  return out;
}

// The scheduler of `options` scoring against `target`: a policy that needs a target workload and
// has none yet places as best-fit does.
Result<std::unique_ptr<scheduler::Scheduler>> MakeScheduler(
    const ControlPlaneOptions& options, const scheduler::TargetWorkload& target) {
  scheduler::SchedulerOptions scheduler_options;
  // Agents report whether they run containers (kContainerRuntimeLabel).
  scheduler_options.require_container_runtime = true;
  scheduler_options.policy =
      policy::NeedsTargetWorkload(options.policy) && target.empty() ? "best-fit" : options.policy;
  scheduler_options.plugin_args.target_workload = target;
  if (options.fabric != nullptr) {
    scheduler_options.AddCollectiveCost(options.fabric);
  }
  return scheduler::Scheduler::Create(scheduler_options, scheduler::PluginRegistry::Default());
}

bool SameClasses(const scheduler::TargetWorkload& a, const scheduler::TargetWorkload& b) {
  return std::equal(
      a.classes().begin(), a.classes().end(), b.classes().begin(), b.classes().end(),
      [](const auto& x, const auto& y) { return x.shape == y.shape && x.weight == y.weight; });
}

// The queue "default", created at the first start.
Status EnsureDefaultQueue(store::StateStore& store) {
  const Result<store::StoredObject> existing = store.Get(kQueuesKind, kDefaultQueue);
  if (existing.ok()) {
    return Status::Ok();
  }
  if (existing.status().code() != StatusCode::kNotFound) {
    return existing.status();
  }
  store::WriteBatch batch;
  batch.Create(std::string(kQueuesKind), std::string(kDefaultQueue),
               QueueToJson({.name = std::string(kDefaultQueue)}).dump());
  batch.AppendEvent(std::string(kQueuesKind), std::string(kDefaultQueue), "created at first start");
  const Status status = store.Commit(batch);
  // Another server on the same store may have created it first.
  return status.code() == StatusCode::kAlreadyExists ? Status::Ok() : status;
}

// Moves jobs and deployments stored under a bare NAME by an older server, with their events, to
// their TEAM/NAME key.
Status MigrateToTeamScopedNames(store::StateStore& store) {
  // Done once per store: a complete pass leaves a marker, so that a restart with a million jobs
  // stored does not list and parse every one of them again (that was 3/4 of the start-up time).
  constexpr std::string_view kMigrationsKind = "migrations";
  constexpr std::string_view kTeamScopedNames = "team-scoped-names";
  if (const Result<store::StoredObject> done = store.Get(kMigrationsKind, kTeamScopedNames);
      done.ok() || done.status().code() != StatusCode::kNotFound) {
    return done.status();
  }
  bool all_moved = true;
  for (const std::string_view kind : {kJobsKind, kDeploymentsKind}) {
    GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> objects, store.List(kind));
    for (const store::StoredObject& object : objects) {
      Json doc = wire::ParseDocument(object.data);
      const std::string key = TeamScopedKeyOf(doc);
      if (key == object.name || wire::StrOr(doc, "name").empty()) {
        continue;
      }
      // A preemptor named by an older server is of the team recorded beside it.
      if (const std::string by = wire::StrOr(doc, "preempted_by");
          !by.empty() && by.find(kTeamSeparator) == std::string::npos) {
        doc["preempted_by"] = TeamScopedKey(wire::StrOr(doc, "preempted_by_team"), by);
      }
      GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredEvent> events,
                                store.Events(kind, object.name));
      store::WriteBatch batch;
      batch.Create(std::string(kind), key, doc.dump());
      for (const store::StoredEvent& event : events) {
        batch.AppendEvent(std::string(kind), key, event.text);
      }
      batch.AppendEvent(std::string(kind), key,
                        fmt::format("renamed from \"{}\": names are scoped by team", object.name));
      batch.Delete(std::string(kind), object.name, object.version);
      if (const Status moved = store.Commit(batch); !moved.ok()) {
        if (moved.code() == StatusCode::kUnavailable) {
          return moved;
        }
        // One object that cannot move (its new key taken, say) stays where it is, unlost, and
        // the server starts: an administrator moves or deletes it.
        fmt::print(stderr, "gpufleet server: {}/{} not moved to {}: {}\n", kind, object.name, key,
                   moved.ToString());
        all_moved = false;
      }
    }
  }
  if (!all_moved) {
    return Status::Ok();  // tried again at the next start
  }
  const Status marked = store.Commit(store::WriteBatch().Create(
      std::string(kMigrationsKind), std::string(kTeamScopedNames), R"({"done":true})"));
  return marked.code() == StatusCode::kAlreadyExists ? Status::Ok() : marked;
}

// The job at its smallest size: an elastic job's minimum (what preemption frees room for, and
// what "never fits" is about), any other job itself (a copy: for the rare paths only).
Job SmallestSize(const Job& spec) {
  return spec.IsElastic() ? spec.AtSize(spec.groups[0].min_replicas) : spec;
}

}  // namespace

Result<std::unique_ptr<ControlPlane>> ControlPlane::Create(ControlPlaneOptions options) {
  GPUFLEET_RETURN_IF_ERROR(options.workload_history.Validate());
  if (options.target_workload_refresh < Duration::zero()) {
    return InvalidArgumentError("target_workload_refresh must not be negative");
  }
  GPUFLEET_RETURN_IF_ERROR(options.reliability.Validate());
  if (options.idle_reclaim) {
    GPUFLEET_RETURN_IF_ERROR(options.idle_reclaim->Validate());
  }
  if (options.mig_apply_timeout.count() <= 0 || options.mig_replan_delay.count() < 0) {
    return InvalidArgumentError(
        fmt::format("mig_apply_timeout {}s must be positive and mig_replan_delay {}s not negative",
                    options.mig_apply_timeout.count(), options.mig_replan_delay.count()));
  }
  if (policy::NeedsTargetWorkload(options.policy)) {
    // Checks the policy with a target workload, as the cycles will make it.
    scheduler::TargetWorkload one = scheduler::TargetWorkload::FromShapes(
        {scheduler::TaskShape{.cpu_milli = 1000, .gpu_milli = kMilliPerUnit, .num_gpus = 1}});
    GPUFLEET_RETURN_IF_ERROR(MakeScheduler(options, one).status());
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<scheduler::Scheduler> sched,
                            MakeScheduler(options, scheduler::TargetWorkload()));
  auto control =
      std::unique_ptr<ControlPlane>(new ControlPlane(std::move(options), std::move(sched)));
  if (policy::NeedsTargetWorkload(control->options_.policy)) {
    control->workload_history_.emplace(control->options_.workload_history);
  }
  return control;
}

ControlPlane::ControlPlane(ControlPlaneOptions options, std::unique_ptr<scheduler::Scheduler> sched)
    : options_(std::move(options)),
      started_at_(options_.clock.Now()),
      leases_({.store = options_.store,
               .clock = options_.clock,
               .started_at = started_at_,
               .lease = options_.node_timeout,
               .stop_grace = options_.stop_grace}),
      reliability_(std::make_unique<ReliabilityController>(
          options_.store, options_.clock, options_.wall_clock, options_.reliability,
          [this](const Json& before, Json& after, int64_t version, const std::string& event,
                 store::WriteBatch& batch) { AddJobWrite(before, after, version, event, batch); })),
      scheduler_(std::move(sched)),
      view_(std::make_unique<SchedulingView>(options_.store, options_.catalog)),
      last_full_retry_(started_at_),
      queues_({.store = options_.store,
               .catalog = options_.catalog,
               .clock = options_.clock,
               .wall_clock = options_.wall_clock,
               .started_at = started_at_,
               .usage_half_life = options_.usage_half_life,
               .min_runtime_before_preemption = options_.min_runtime_before_preemption,
               .max_checkpoint_grace = options_.max_checkpoint_grace}),
      mig_layouts_({.store = options_.store,
                    .catalog = options_.catalog,
                    .clock = options_.clock,
                    .apply_timeout = options_.mig_apply_timeout,
                    .replan_delay = options_.mig_replan_delay}),
      gang_start_(options_.gang_start_timeout),
      deployments_(options_.store, options_.catalog),
      retention_({.store = options_.store,
                  .clock = options_.clock,
                  .wall_clock = options_.wall_clock,
                  .retain_finished = options_.retain_finished}),
      backfill_(options_.catalog) {}

ControlPlane::~ControlPlane() = default;

CycleReport ControlPlane::RunCycle() {
  std::lock_guard<std::mutex> lock(cycle_mu_);
  const MonoTime start = options_.clock.Now();
  cycle_step_mark_ = start;
  cycle_steps_.clear();
  CycleReport report{.scheduled = RunCycleLocked()};
  report.elapsed = options_.clock.Now() - start;
  report.steps = cycle_steps_;
  RunReliabilityIfDue();
  ++cycle_count_;
  return report;
}

Status ControlPlane::Restart() {
  leases_.Restart(options_.clock.Now());
  view_->ReadAllAgain();
  reliability_->ReadAllAgain();
  GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  {
    std::lock_guard<std::mutex> lock(agents_mu_);
    gpu_owners_loaded_ = false;
    active_index_built_ = false;
  }
  last_full_retry_ = options_.clock.Now();
  return Status::Ok();
}

Status ControlPlane::PrepareStore() {
  GPUFLEET_RETURN_IF_ERROR(EnsureDefaultQueue(options_.store));
  return MigrateToTeamScopedNames(options_.store);
}

FleetGauges ControlPlane::Gauges() {
  std::lock_guard<std::mutex> lock(gauges_mu_);
  return gauges_;
}

std::optional<policy::NeverFits> ControlPlane::CheckNeverFits(const Job& job) {
  // An elastic job never fits only when its minimum does not.
  if (job.IsElastic()) {
    return never_fits_.Check(SmallestSize(job), view_->snapshot(), view_->shape_epoch());
  }
  return never_fits_.Check(job, view_->snapshot(), view_->shape_epoch());
}

int64_t ControlPlane::RunningJobs() {
  std::lock_guard<std::mutex> lock(cycle_mu_);
  int64_t running = 0;
  for (const auto& [name, job] : view_->jobs()) {
    running += job.applied && !job.placements.empty() ? 1 : 0;
  }
  return running;
}

std::vector<std::pair<std::string_view, Duration>> ControlPlane::LastCycleSteps() {
  std::lock_guard<std::mutex> lock(cycle_mu_);
  return cycle_steps_;
}

void ControlPlane::MarkCycleStep(std::string_view step) {
  const MonoTime now = options_.clock.Now();
  cycle_steps_.emplace_back(step, now - cycle_step_mark_);
  cycle_step_mark_ = now;
}

Result<int> ControlPlane::RunCycleLocked() {
  // One cheap read every cycle, so that a store that cannot be reached (a database down) shows on
  // /readyz even when nothing changed and the view reads nothing.
  GPUFLEET_RETURN_IF_ERROR(options_.store.Revision().status());
  // The view follows the store's commits, and reads again the objects of a commit that failed
  // (it may have been written all the same): no periodic reload of every job, which with tens of
  // thousands pending cost more than the cycles between (bench/RESULTS.md, "Philly through the
  // control plane").
  GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  PublishExcludedNodes();
  MarkCycleStep("read");
  GPUFLEET_ASSIGN_OR_RETURN(const bool marked, leases_.MarkSilentNodesNotReady(*view_));
  if (marked) {
    GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  }
  MarkCycleStep("node-leases");
  GPUFLEET_ASSIGN_OR_RETURN(const bool ended, EndRunsOnNotReadyNodes());
  if (ended) {
    GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  }
  GPUFLEET_ASSIGN_OR_RETURN(const bool noticed_ended, EndNoticedRuns());
  if (noticed_ended) {
    GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  }
  GPUFLEET_ASSIGN_OR_RETURN(const bool stopped, FinishStoppingRuns());
  if (stopped) {
    GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  }
  GPUFLEET_ASSIGN_OR_RETURN(const bool mig_requeued, RequeueJobsWaitingForMigInstances());
  if (mig_requeued) {
    GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  }
  GPUFLEET_ASSIGN_OR_RETURN(const bool gangs_requeued, RequeuePartlyStartedGangs());
  if (gangs_requeued) {
    GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  }
  IndexActiveJobs();
  MarkCycleStep("run-ends");
  // A job that did not fit is tried again when resources are freed, and at least this often
  // (placement is greedy, so fit is not perfectly monotone in free resources).
  constexpr Duration kFullRetryInterval = std::chrono::seconds(60);
  if (options_.clock.Now() - last_full_retry_ >= kFullRetryInterval) {
    last_full_retry_ = options_.clock.Now();
    view_->BumpCapacityEpoch();
  }

  GPUFLEET_ASSIGN_OR_RETURN(const bool requeued, RequeuePreemptedJobs());
  if (requeued) {
    GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  }
  GPUFLEET_RETURN_IF_ERROR(PlanMigLayoutsForPendingJobs());
  UpdateQueues();
  MarkCycleStep("queues");
  GPUFLEET_RETURN_IF_ERROR(ReclaimIdleJobs());
  MarkCycleStep("idle-reclaim");
  GPUFLEET_RETURN_IF_ERROR(RunDeploymentsIfDue());
  MarkCycleStep("deployments");
  // Finished jobs past the retention leave, a bounded batch per cycle; a failure here is
  // retried by a later scan and does not hold up scheduling.
  if (const Result<RetentionController::StepResult> collected = retention_.Step();
      !collected.ok()) {
    fmt::print(stderr, "gpufleet server: collecting finished jobs failed: {}\n",
               collected.status().ToString());
  }
  MarkCycleStep("retention");
  // Busy time into running jobs' documents now and then; a failure is retried by the next flush
  // and does not hold up scheduling.
  if (const Result<bool> flushed = FlushUsageIfDue(); !flushed.ok()) {
    fmt::print(stderr, "gpufleet server: writing busy time failed: {}\n",
               flushed.status().ToString());
  } else if (*flushed) {
    GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  }
  MarkCycleStep("usage");
  std::vector<PendingEntry> pending = PendingEntries(*view_);
  queues_.OrderPending(pending);
  GPUFLEET_RETURN_IF_ERROR(RefreshTargetWorkload(pending));
  MarkCycleStep("order");

  scheduler::ClusterSnapshot& snapshot = view_->snapshot();
  Random random(options_.seed + cycle_count_);
  // Jobs that did not fit in this cycle, to skip larger jobs of the same shape. With thousands
  // pending, most are such larger jobs: the reason they quote is made once per failed job.
  struct FailedJob {
    const std::string* name;
    const ViewJob* job;
    std::string quote_for_team;    // for jobs of its team, which may see its name
    std::string quote_for_others;  // for other teams' jobs
  };
  std::vector<FailedJob> failed;
  std::vector<CycleWrite> writes;
  bool preemption_tried = false;
  backfill_.BeginCycle(queues_.CycleSeconds());
  // The first job in queue order that does not fit gets the backfill reservation (EASY).
  const auto set_backfill_head = [&](const std::string& name, const Job& spec) {
    if (const Status planned = backfill_.SetHead(name, spec, *view_, queues_, *scheduler_, random);
        !planned.ok()) {
      fmt::print(stderr, "gpufleet server: backfill reservation for {}: {}\n", name,
                 planned.ToString());
    }
  };
  for (const PendingEntry& entry : pending) {
    const std::string& name = *entry.name;
    ViewJob& job = *entry.job;
    queues_.HoldReservedGpus(*view_, name);
    if (job.unschedulable_epoch == view_->capacity_epoch()) {
      // Unchanged since it last did not fit: still the head, it keeps its reservation.
      if (backfill_.LookingForHead() && backfill_.DidNotFit(name) && job.spec && job.spec->ok()) {
        set_backfill_head(name, **job.spec);
      }
      continue;
    }
    if (job.never_fits_epoch == view_->shape_epoch() && job.reason.starts_with("never fits: ")) {
      // No node changed in what could hold it since it was found never to fit: what was freed
      // meanwhile cannot help it, and the check walks every node.
      job.unschedulable_epoch = view_->capacity_epoch();
      continue;
    }
    // Parsed when it is written: with thousands of jobs pending, most are only skipped.
    Json doc;
    ViewJobSpec(job, options_.catalog);
    std::string reason;
    std::vector<scheduler::TaskPlacement> placed;
    std::set<std::string> node_names;
    bool held_back = false;
    if (!job.spec->ok()) {
      reason = fmt::format("stored spec is invalid: {}", job.spec->status().message());
    } else if (const std::optional<policy::NeverFits> again = job.reason.starts_with("never fits: ")
                                                                  ? CheckNeverFits(**job.spec)
                                                                  : std::nullopt) {
      // Named at submit and nodes changed since (it is checked again when it comes up, before the
      // shortcut that quotes a smaller job's reason): still nothing could hold it.
      reason = fmt::format("never fits: {}", again->message);
      job.never_fits_epoch = view_->shape_epoch();
    } else if (const auto dominating = std::find_if(
                   failed.begin(), failed.end(),
                   [&](const FailedJob& smaller) {
                     // An elastic job fits at any of its sizes: no shortcut either way.
                     return !(*job.spec)->IsElastic() && !(*smaller.job->spec)->IsElastic() &&
                            scheduler::CannotFitWhereSmallerFailed(**job.spec, **smaller.job->spec);
                   });
               dominating != failed.end()) {
      // Another team's job is not named to this one's team. Its reason is final by now: it was
      // set in its own turn of this loop.
      const std::string& other = *dominating->name;
      const bool same_team = TeamOfKey(other) == TeamOfKey(name);
      std::string& quote = same_team ? dominating->quote_for_team : dominating->quote_for_others;
      if (quote.empty()) {
        quote = fmt::format("{} (as for {}, which asks for no more)", dominating->job->reason,
                            same_team ? fmt::format("job {}", NameOfKey(other))
                                      : std::string("a job of another team"));
      }
      reason = quote;
      if (dominating->job->never_fits_epoch == view_->shape_epoch() &&
          dominating->job->reason.starts_with("never fits: ")) {
        // Asking for no less than a job no node could ever hold, it never fits either: its quote
        // stands until the fleet's shape moves on.
        job.never_fits_epoch = view_->shape_epoch();
      }
    } else {
      // An elastic job at the largest size that fits, placed and charged as that size.
      std::optional<Job> sized;
      scheduler::ScheduleResult result;
      if ((*job.spec)->IsElastic()) {
        scheduler::SizedSchedule largest =
            scheduler::ScheduleLargestSize(*scheduler_, **job.spec, snapshot, random);
        result = std::move(largest.result);
        if (largest.size > 0) {
          sized = (*job.spec)->AtSize(largest.size);
        }
      } else {
        result = scheduler_->Schedule(**job.spec, snapshot, random);
      }
      const Job& placed_spec = sized ? *sized : **job.spec;
      // Larger jobs of its shape need not be asked only when this one did not fit: a refusal by
      // its queue's quota says nothing about jobs of other queues.
      const bool did_not_fit = result.outcome == scheduler::ScheduleOutcome::kUnschedulable;
      backfill_.NoteTried(name, did_not_fit);
      if (result.scheduled()) {
        // Backfill first: a job held back for the head is not charged to its queue.
        Result<std::optional<std::string>> held =
            backfill_.Refusal(name, placed_spec, result.placements, *view_, *scheduler_, random);
        if (!held.ok()) {
          fmt::print(stderr, "gpufleet server: backfill check for {}: {}\n", name,
                     held.status().ToString());
          held = std::optional<std::string>();
        }
        held_back = held->has_value();
        if (std::optional<std::string> refused =
                held_back ? std::move(*held)
                          : queues_.Admit(name, job, result.placements, snapshot)) {
          for (auto it = result.placements.rbegin(); it != result.placements.rend(); ++it) {
            snapshot.Revert(*it);
          }
          result.outcome = scheduler::ScheduleOutcome::kUnschedulable;
          result.reason = std::move(*refused);
        }
      } else if (result.outcome == scheduler::ScheduleOutcome::kUnschedulable &&
                 !preemption_tried && !queues_.HasReservation(name)) {
        // A preemptor with a reservation waits for the victims it has; it preempts no more.
        // One victim search per cycle, for the first job in queue order that needs one.
        preemption_tried = true;
        Result<std::optional<std::string>> waiting =
            TryPreemption(name, SmallestSize(**job.spec), job.queue, random);
        if (!waiting.ok()) {
          // The store failed (busy, gone): nothing of this cycle is committed, so nothing of it
          // may stay in the view, or its GPUs would look taken until the next full reload.
          for (auto it = writes.rbegin(); it != writes.rend(); ++it) {
            UndoCycleWrite(*it);
          }
          queues_.ReleaseReservedGpus(*view_);
          return waiting.status();
        }
        if (*waiting) {
          result.reason = std::move(**waiting);
        }
      }
      if (result.scheduled()) {
        backfill_.NoteStarted(name, placed_spec, result.placements);
        placed = std::move(result.placements);
        doc = wire::ParseDocument(job.data);
        // The view holds only Pending jobs here, so the transition is legal.
        (void)TransitionJob(doc, JobState::kScheduled, "");
        doc["attempt"] = wire::IntOr(doc, "attempt", 0) + 1;
        doc["placements"] = PlacementsToJson(placed, placed_spec, snapshot);
        if (sized) {
          doc["world_size"] = sized->groups[0].replicas;
        } else {
          doc.erase("world_size");
        }
        for (const scheduler::TaskPlacement& placement : placed) {
          node_names.insert(snapshot.nodes()[placement.node].node->id.value());
        }
      } else {
        reason = result.outcome == scheduler::ScheduleOutcome::kError ? result.error.message()
                                                                      : result.reason;
        if (did_not_fit) {
          // Waiting cannot help a job no node could ever hold: say what is missing.
          if (const std::optional<policy::NeverFits> never = CheckNeverFits(**job.spec)) {
            reason = fmt::format("never fits: {}", never->message);
            job.never_fits_epoch = view_->shape_epoch();
          }
          failed.push_back(FailedJob{&name, &job, "", ""});
          if (backfill_.LookingForHead()) {
            set_backfill_head(name, **job.spec);
          }
        }
      }
    }
    CycleWrite write{&name, &job};
    // Parsed only for a write: a long queue whose reasons stand costs no parse per job.
    Json before;
    std::string event;
    if (placed.empty()) {
      // A job held back for the head may start once the head has: it is tried every cycle.
      if (!held_back) {
        job.unschedulable_epoch = view_->capacity_epoch();
      }
      if (reason == job.reason) {
        continue;
      }
      // Later jobs quoting this one see the new reason now.
      job.reason = reason;
      before = wire::ParseDocument(job.data);
      doc = before;
      doc["reason"] = reason;
      event = fmt::format("unschedulable: {}", reason);
      // A repeat of the same reason with other figures only counts (event_groups.h).
      if (!CountGroupedEvent(doc, event, NowText())) {
        event.clear();
      }
    } else {
      before = wire::ParseDocument(job.data);
      ForgetEventGroups(doc);
      reliability_->NoteRunStarted(doc);
      StampRunStart(doc, UsageNowNanos());
      event = fmt::format("scheduled on {}", fmt::join(node_names, ", "));
      if (doc.contains("world_size")) {
        event += fmt::format(" at {} tasks", wire::IntOr(doc, "world_size", 0));
      }
      write.placed = std::move(placed);
      write.nodes = std::move(node_names);
    }
    write.data = AddJobWrite(before, doc, job.version, event, write.batch);
    writes.push_back(std::move(write));
  }
  queues_.ReleaseReservedGpus(*view_);
  MarkCycleStep("place");
  Result<int> scheduled = CommitCycleWrites(writes);
  MarkCycleStep("commit");
  if (scheduled.ok()) {
    GPUFLEET_RETURN_IF_ERROR(GrowElasticJobs(random));
    MarkCycleStep("grow");
  }
  queues_.Publish();
  PublishFleetGauges();
  MarkCycleStep("publish");
  return scheduled;
}

Status ControlPlane::RefreshTargetWorkload(const std::vector<PendingEntry>& pending) {
  if (!workload_history_) {
    return Status::Ok();
  }
  const MonoTime now = options_.clock.Now();
  if (target_source_ == TargetSource::kHistory &&
      now - target_built_at_ < options_.target_workload_refresh) {
    return Status::Ok();
  }
  scheduler::TargetWorkload target;
  TargetSource source = TargetSource::kNone;
  if (!workload_history_->empty()) {
    target = workload_history_->Target();
    source = TargetSource::kHistory;
  } else {
    // Nothing started yet (a fresh server, or one restarted: the history lives in memory): the
    // mix waiting is the best guess of the mix to come. The first jobs in queue order bound the
    // cost with thousands pending; their specs are parsed once and kept, as the cycle does.
    constexpr size_t kMaxPendingSampled = 1000;
    policy::WorkloadHistory waiting(options_.workload_history);
    for (size_t i = 0; i < pending.size() && i < kMaxPendingSampled; ++i) {
      ViewJob& job = *pending[i].job;
      if (const Result<Job>& spec = ViewJobSpec(job, options_.catalog); spec.ok()) {
        waiting.Record(*spec, now);
      }
    }
    target = waiting.Target();
    source = target.empty() ? TargetSource::kNone : TargetSource::kPending;
  }
  target_built_at_ = now;
  if (source == target_source_ && SameClasses(target, target_)) {
    return Status::Ok();
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<scheduler::Scheduler> remade,
                            MakeScheduler(options_, target));
  scheduler_ = std::move(remade);
  target_ = std::move(target);
  target_source_ = source;
  return Status::Ok();
}

Result<int> ControlPlane::CommitCycleWrites(std::vector<CycleWrite>& writes) {
  // One durable commit for the whole cycle: a commit costs an fsync, which would otherwise be
  // most of a busy cycle. If it fails (one job changed under us, or one job's write cannot be
  // stored), the jobs are committed one by one, so that only the job at fault is left out.
  store::WriteBatch all;
  for (const CycleWrite& write : writes) {
    all.Append(write.batch);
    if (!write.placed.empty()) {
      // Indexed before the commit, so that a node registering again meanwhile sees the job
      // (EndRunsBrokenByReregistration); a write that then fails leaves a harmless extra entry
      // until the next cycle rebuilds the index.
      IndexScheduledJob(*write.name, write.nodes);
    }
  }
  Status status = options_.store.Commit(all);
  const bool one_by_one = !status.ok();
  int scheduled = 0;
  Status first_error = Status::Ok();
  for (CycleWrite& write : writes) {
    if (one_by_one) {
      status = options_.store.Commit(write.batch);
    }
    ViewJob& job = *write.job;
    if (!status.ok()) {
      UndoCycleWrite(write);
      if (status.code() == StatusCode::kInvalidArgument) {
        // This job's own write cannot be stored (its document would be too large): it fails
        // alone, with the reason, and the cycle goes on.
        FailUnstorableJob(*write.name, job, status);
      } else if (status.code() != StatusCode::kAborted && status.code() != StatusCode::kNotFound &&
                 first_error.ok()) {
        first_error = status;
      }
      continue;
    }
    if (!write.placed.empty()) {
      if (workload_history_ && job.spec && job.spec->ok()) {
        workload_history_->Record(**job.spec, options_.clock.Now());
      }
      view_->MarkScheduled(*write.name, job.version + 1, std::move(write.data),
                           std::move(write.placed), std::move(write.nodes));
      ++scheduled;
    } else {
      view_->MarkReasonWritten(*write.name, job.version + 1, std::move(write.data));
    }
  }
  if (!first_error.ok()) {
    return first_error;
  }
  return scheduled;
}

void ControlPlane::UndoCycleWrite(CycleWrite& write) {
  // The next cycle sees the job as stored; its resources go back now.
  view_->ReadJobAgain(*write.name);
  for (auto it = write.placed.rbegin(); it != write.placed.rend(); ++it) {
    view_->snapshot().Revert(*it);
  }
  if (!write.placed.empty()) {
    view_->BumpCapacityEpoch();
  }
}

void ControlPlane::FailUnstorableJob(const std::string& name, const ViewJob& job,
                                     const Status& why) {
  const Json before = wire::ParseDocument(job.data);
  Json doc = before;
  // A Pending job holds nothing: it ends at once, as a cancel would, but Failed.
  const Result<std::string> event =
      TransitionJob(doc, JobState::kFailed,
                    fmt::format("its scheduled document cannot be stored: {}", why.message()));
  if (!event.ok()) {
    return;
  }
  store::WriteBatch batch;
  AddJobWrite(before, doc, job.version, *event, batch);
  if (const Status status = options_.store.Commit(batch); !status.ok()) {
    fmt::print(stderr, "gpufleet server: jobs/{}: {}\n", name, status.ToString());
  }
}

void ControlPlane::PublishExcludedNodes() {
  store::WriteBatch events;
  for (const auto& [name, reason] : view_->TakeNewlyExcludedNodes()) {
    events.AppendEvent(std::string(kNodesKind), name, reason);
  }
  if (Status status = options_.store.Commit(events); !status.ok()) {
    fmt::print(stderr, "gpufleet server: node events: {}\n", status.ToString());
  }
  std::lock_guard<std::mutex> lock(agents_mu_);
  excluded_nodes_ = view_->excluded_nodes();
}

Result<bool> ControlPlane::CommitCycleJobWrite(const std::string& name,
                                               const store::WriteBatch& batch) {
  const Status status = options_.store.Commit(batch);
  if (status.ok()) {
    return true;
  }
  view_->ReadJobAgain(name);
  if (status.code() == StatusCode::kAborted || status.code() == StatusCode::kNotFound) {
    return false;  // the job changed under us: the next cycle looks again
  }
  return status;
}

Result<bool> ControlPlane::CommitJobWrites(std::vector<JobWrite> writes) {
  bool wrote = false;
  for (JobWrite& write : writes) {
    store::WriteBatch batch;
    AddJobWrite(write.before, write.after, write.version, write.events.front(), batch);
    for (size_t i = 1; i < write.events.size(); ++i) {
      batch.AppendEvent(std::string(kJobsKind), write.name, write.events[i]);
    }
    const Result<bool> written = CommitCycleJobWrite(write.name, batch);
    if (!written.ok() && written.status().code() == StatusCode::kUnavailable) {
      return written.status();
    }
    if (!written.ok()) {
      fmt::print(stderr, "gpufleet server: jobs/{}: {}\n", write.name, written.status().ToString());
      continue;
    }
    wrote = wrote || *written;
  }
  return wrote;
}

Status ControlPlane::PlanMigLayoutsForPendingJobs() {
  GPUFLEET_ASSIGN_OR_RETURN(const bool wrote, mig_layouts_.PlanForPendingJobs(*view_));
  if (wrote) {
    // The new instances are in the snapshot now, and the epoch has moved: the jobs are tried
    // again in this cycle.
    GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  }
  return Status::Ok();
}

Result<bool> ControlPlane::RequeueJobsWaitingForMigInstances() {
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<MigRequeue> requeue,
                            mig_layouts_.PlanRequeue(*view_, NowText()));
  if (!requeue) {
    return false;
  }
  store::WriteBatch batch = std::move(requeue->node_writes);
  for (JobWrite& write : requeue->job_writes) {
    AddJobWrite(write.before, write.after, write.version, write.events.front(), batch);
  }
  if (const Status status = options_.store.Commit(batch); !status.ok()) {
    // A job or node changed under us (a task report, a heartbeat): the next cycle looks again.
    for (const JobWrite& write : requeue->job_writes) {
      view_->ReadJobAgain(write.name);
    }
    if (status.code() == StatusCode::kAborted || status.code() == StatusCode::kNotFound) {
      return false;
    }
    return status;
  }
  mig_layouts_.Requeued();
  return true;
}

Result<bool> ControlPlane::RequeuePartlyStartedGangs() {
  return CommitJobWrites(
      gang_start_.Step(view_->JobsIn(JobState::kScheduled), UsageNowNanos(), NowText()));
}

std::string ControlPlane::AddJobWrite(const Json& before, Json& after, int64_t version,
                                      const std::string& event, store::WriteBatch& batch) {
  reliability_->NoteJobChange(before, after, batch);
  NoteUsageChange(before, after, batch);
  const std::string name = TeamScopedKeyOf(before);
  std::string data = after.dump();
  batch.Update(std::string(kJobsKind), name, data, version);
  if (!event.empty()) {
    batch.AppendEvent(std::string(kJobsKind), name, event);
  }
  return data;
}

std::string ControlPlane::NowText() const {
  return options_.wall_clock != nullptr ? FormatRfc3339(options_.wall_clock->UnixNanos()) : "";
}

void ControlPlane::PublishFleetGauges() {
  FleetGauges gauges;
  const scheduler::ClusterSnapshot& snapshot = view_->snapshot();
  // By the catalog's model names, as queue quotas count them. The snapshot counts the GPUs per
  // model and the view the pending jobs per queue as they change: no walk of the fleet here.
  for (int id = 0; id < snapshot.ModelCount(); ++id) {
    if (const int gpus = snapshot.GpuCount(id); gpus > 0) {
      gauges.gpus_by_model[snapshot.Model(id).name] += gpus;
      gauges.allocated_milli_by_model.emplace(snapshot.Model(id).name, 0);
    }
  }
  for (const auto& [queue, count] : view_->PendingByQueue()) {
    gauges.pending_by_queue[queue.empty() ? std::string("default") : queue] +=
        static_cast<int64_t>(count);
  }
  for (const JobState state : kJobStates) {
    if (!HoldsResources(state)) {
      continue;
    }
    for (const ViewJobEntry* entry : view_->JobsIn(state)) {
      const ViewJob& job = entry->second;
      if (!job.applied) {
        continue;
      }
      for (const scheduler::TaskPlacement& placement : job.placements) {
        const scheduler::NodeInfo& node = snapshot.nodes()[placement.node];
        for (const scheduler::GpuAssignment& assignment : placement.gpus) {
          gauges
              .allocated_milli_by_model[snapshot.Model(node.gpus[assignment.gpu].model_id).name] +=
              assignment.milli;
        }
      }
    }
  }
  if (workload_history_) {
    gauges.target_shapes = target_.classes().size();
    gauges.target_source = target_source_ == TargetSource::kHistory   ? "history"
                           : target_source_ == TargetSource::kPending ? "pending"
                                                                      : "none";
  }
  std::lock_guard<std::mutex> lock(gauges_mu_);
  gauges_ = std::move(gauges);
}

}  // namespace gpufleet::control
