// SPDX-License-Identifier: Apache-2.0
// The steps of the control plane's cycle around its controllers: each gathers a controller's
// inputs from the view and the agents' reports and commits what it decides through the one job
// writer (control_plane.h).
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/control/control_plane.h"
#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/lifecycle_controller.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/scheduler/elastic.h"
#include "gpufleet/wire/job_record.h"

namespace gpufleet::control {

void ControlPlane::IndexActiveJobs() {
  // The view keeps the index as jobs change; only the nodes whose entry changed are copied (a
  // whole copy after a full load, or when the heartbeats' index was dropped).
  std::optional<std::set<std::string>> changed = view_->TakeActiveJobChanges();
  const std::map<std::string, std::set<std::string>>& index = view_->ActiveJobsByNode();
  std::lock_guard<std::mutex> lock(agents_mu_);
  if (!changed || !active_index_built_) {
    active_jobs_by_node_ = index;
    active_index_built_ = true;
    indexed_before_commit_.clear();
    return;
  }
  changed->merge(indexed_before_commit_);
  indexed_before_commit_.clear();
  for (const std::string& node : *changed) {
    if (const auto entry = index.find(node); entry != index.end()) {
      active_jobs_by_node_[node] = entry->second;
    } else {
      active_jobs_by_node_.erase(node);
    }
  }
}

void ControlPlane::IndexScheduledJob(const std::string& job, const std::set<std::string>& nodes) {
  std::lock_guard<std::mutex> lock(agents_mu_);
  for (const std::string& node : nodes) {
    active_jobs_by_node_[node].insert(job);
    indexed_before_commit_.insert(node);
  }
}

Result<bool> ControlPlane::EndRunsOnNotReadyNodes() {
  return CommitJobWrites(
      control::EndRunsOnNotReadyNodes(view_->jobs(), view_->not_ready_nodes(), NowText()));
}

Result<bool> ControlPlane::FinishStoppingRuns() {
  // Most cycles have no run stopping: nothing to look at on any node.
  if (view_->JobsInState(JobState::kStopping) == 0) {
    return false;
  }
  const std::map<std::string, std::string> lost = leases_.LostNodes(view_->nodes());
  return CommitJobWrites(EndGoneTasksOfStoppingRuns(view_->jobs(), view_->nodes(), lost));
}

void ControlPlane::UpdateQueues() {
  const store::WriteBatch events = queues_.Update(*view_, cycle_count_);
  if (events.empty()) {
    return;
  }
  if (const Status status = options_.store.Commit(events); !status.ok()) {
    fmt::print(stderr, "gpufleet server: reservation event: {}\n", status.ToString());
  }
}

Result<std::optional<std::string>> ControlPlane::TryPreemption(const std::string& name,
                                                               const Job& preemptor,
                                                               const std::string& queue,
                                                               Random& random) {
  GPUFLEET_ASSIGN_OR_RETURN(
      std::optional<PreemptionPlan> plan,
      queues_.PlanPreemption(*view_, *scheduler_, name, preemptor, queue, cycle_count_, NowText(),
                             UsageNowNanos(), random));
  if (!plan) {
    return std::optional<std::string>();
  }
  // The victims stop together, or none does.
  store::WriteBatch batch;
  for (JobWrite& write : plan->victim_writes) {
    AddJobWrite(write.before, write.after, write.version, write.events.front(), batch);
  }
  batch.AppendEvent(std::string(kJobsKind), name, plan->preemptor_event);
  if (const Status status = options_.store.Commit(batch); !status.ok()) {
    for (const JobWrite& write : plan->victim_writes) {
      view_->ReadJobAgain(write.name);
    }
    if (status.code() == StatusCode::kAborted || status.code() == StatusCode::kNotFound) {
      return std::optional<std::string>();
    }
    return status;
  }
  queues_.Reserve(name);
  return std::optional<std::string>(std::move(plan->pending_reason));
}

Result<bool> ControlPlane::EndNoticedRuns() {
  return CommitJobWrites(
      control::EndNoticedRuns(view_->JobsIn(JobState::kRunning), UsageNowNanos(), NowText()));
}

Status ControlPlane::GrowElasticJobs(Random& random) {
  // GPUs freed for a preemptor are not idle.
  if (queues_.HasReservations()) {
    return Status::Ok();
  }
  GPUFLEET_RETURN_IF_ERROR(view_->Refresh());
  std::vector<ViewJobEntry*> below_max;
  for (ViewJobEntry* entry : view_->JobsIn(JobState::kRunning)) {
    ViewJob& job = entry->second;
    if (job.world_size <= 0 || job.notice || job.releasing > 0 || !job.applied) {
      continue;
    }
    const Result<Job>& spec = ViewJobSpec(job, options_.catalog);
    if (spec.ok() && spec->IsElastic() && job.world_size < spec->groups[0].replicas) {
      below_max.push_back(entry);
    }
  }
  if (below_max.empty()) {
    return Status::Ok();  // most cycles: the pending jobs are not read
  }
  // A job that never fits waits for nothing an elastic job holds.
  std::optional<int> waiting_priority;
  for (const ViewJobEntry* entry : view_->JobsIn(JobState::kPending)) {
    if (!entry->second.reason.starts_with("never fits: ")) {
      waiting_priority =
          std::max(waiting_priority.value_or(entry->second.priority), entry->second.priority);
    }
  }
  std::erase_if(below_max, [&](const ViewJobEntry* entry) {
    return waiting_priority && *waiting_priority >= entry->second.priority;
  });
  // Each check places the job at up to 3 + log2(max - min) sizes: a few jobs a cycle, the
  // highest priority first, the others in later cycles.
  constexpr size_t kGrowChecksPerCycle = 2;
  std::stable_sort(below_max.begin(), below_max.end(),
                   [](const ViewJobEntry* a, const ViewJobEntry* b) {
                     return a->second.priority > b->second.priority;
                   });
  below_max.resize(std::min(below_max.size(), kGrowChecksPerCycle));
  scheduler::ClusterSnapshot& snapshot = view_->snapshot();
  std::vector<JobWrite> writes;
  for (ViewJobEntry* entry : below_max) {
    const auto& [name, job] = *entry;
    const Job& spec = **job.spec;
    // The size it would run at now, its own GPUs counted free.
    for (auto it = job.placements.rbegin(); it != job.placements.rend(); ++it) {
      snapshot.Release(*it);
    }
    const scheduler::SizedSchedule larger =
        scheduler::ScheduleLargestSize(*scheduler_, spec, snapshot, random);
    for (auto it = larger.result.placements.rbegin(); it != larger.result.placements.rend(); ++it) {
      snapshot.Revert(*it);
    }
    for (scheduler::TaskPlacement placement : job.placements) {
      // Its MIG instances stay on their GPUs while released: taken back, not created.
      for (scheduler::GpuAssignment& gpu : placement.gpus) {
        gpu.mig_created = false;
      }
      if (const Status applied = snapshot.Apply(placement); !applied.ok()) {
        // Never expected; the view reads every object again rather than let one job's state
        // stop the cycle, and no job grows before it has.
        fmt::print(stderr, "gpufleet server: growing {}: {}\n", name, applied.ToString());
        view_->ReadAllAgain();
        return Status::Ok();
      }
    }
    if (larger.size <= job.world_size) {
      continue;
    }
    // A run at the new size: torchrun's elastic agents restart the worker group on a change of
    // members anyway, so the job stops (after its notice) and is placed again, larger.
    JobWrite write{.name = name, .version = job.version, .before = wire::ParseDocument(job.data)};
    write.after = write.before;
    const std::string why =
        fmt::format("growing from {} to {} tasks into idle GPUs", job.world_size, larger.size);
    const std::optional<wire::NoticeRecord> notice =
        PreemptionNotice(spec, job.state, options_.max_checkpoint_grace, UsageNowNanos(), why);
    Result<std::string> event = notice ? Result<std::string>(NoticeEvent(*notice))
                                       : EndRun(write.after, JobState::kPreempted, why, NowText());
    if (!event.ok()) {
      continue;
    }
    if (notice) {
      write.after["notice"] = wire::NoticeRecordToJson(*notice);
    }
    // No preemptor: the job is requeued for itself (RequeuePreemptedJobs).
    write.after.erase("preempted_by");
    write.after.erase("preempted_by_team");
    write.events.push_back(std::move(*event));
    writes.push_back(std::move(write));
  }
  return CommitJobWrites(std::move(writes)).status();
}

Result<bool> ControlPlane::RequeuePreemptedJobs() {
  return CommitJobWrites(control::RequeuePreemptedJobs(view_->JobsIn(JobState::kPreempted)));
}

Status ControlPlane::ReclaimIdleJobs() {
  if (!options_.idle_reclaim) {
    return Status::Ok();
  }
  if (!idle_reclaim_) {
    GPUFLEET_ASSIGN_OR_RETURN(
        IdleReclaimController controller,
        IdleReclaimController::Create(*options_.idle_reclaim, options_.catalog));
    idle_reclaim_.emplace(std::move(controller));
  }
  const MonoTime now = options_.clock.Now();
  const int64_t now_nanos = options_.wall_clock != nullptr ? options_.wall_clock->UnixNanos()
                                                           : (now - started_at_).count();
  IdleReclaimInputs inputs{
      .now = now,
      .now_seconds =
          std::chrono::floor<std::chrono::seconds>(std::chrono::nanoseconds(now_nanos)).count(),
      .now_text = NowText()};
  const scheduler::ClusterSnapshot& snapshot = view_->snapshot();
  std::vector<PendingEntry> pending = PendingEntries(*view_);
  inputs.pending_jobs = static_cast<int>(pending.size());
  if (idle_reclaim_->preempts() && !pending.empty()) {
    queues_.OrderPending(pending);
    inputs.first_pending = *pending.front().name;
  }
  inputs.reports = ReportsForRunningJobs();

  GPUFLEET_ASSIGN_OR_RETURN(IdleReclaimStep step,
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

GpuUtilizationReports ControlPlane::ReportsForRunningJobs() {
  const scheduler::ClusterSnapshot& snapshot = view_->snapshot();
  std::set<std::string> running_nodes;
  for (const ViewJobEntry* entry : view_->JobsIn(JobState::kRunning)) {
    if (const ViewJob& job = entry->second; job.applied) {
      for (const scheduler::TaskPlacement& placement : job.placements) {
        running_nodes.insert(snapshot.nodes()[placement.node].node->id.value());
      }
    }
  }
  GpuUtilizationReports reports;
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

int64_t ControlPlane::UsageNowNanos() const {
  return options_.wall_clock != nullptr ? options_.wall_clock->UnixNanos()
                                        : options_.clock.Now().nanos;
}

void ControlPlane::NoteUsageChange(const Json& before, Json& after, store::WriteBatch& batch) {
  const std::optional<StampedRun> stamped = StampedRunOf(before);
  if (!stamped) {
    return;
  }
  const int64_t busy = usage_meter_.Busy(stamped->name, stamped->busy);
  const std::optional<RunUsage> ended =
      control::NoteUsageChange(before, after, UsageNowNanos(), busy);
  if (!ended) {
    return;
  }
  // A run ends once; a record already there (an earlier try of this write committed) stays.
  if (!options_.store.Get(kUsageKind, stamped->name).ok()) {
    batch.Create(std::string(kUsageKind), stamped->name, RunUsageToJson(*ended).dump());
  }
  usage_meter_.Forget(stamped->name);
}

int64_t ControlPlane::UsageHeartbeatInterval(const std::string& node) {
  const MonoTime now = options_.clock.Now();
  std::lock_guard<std::mutex> lock(usage_mu_);
  auto [it, first] = usage_last_heartbeat_.try_emplace(node, now);
  if (first) {
    return 0;
  }
  const Duration since = std::min<Duration>(now - it->second, options_.node_timeout);
  it->second = now;
  return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(since).count());
}

void ControlPlane::CreditBusy(const Json& job, const std::string& node,
                              const std::map<int64_t, int>& utilization_pct, int64_t interval_ms) {
  if (interval_ms <= 0 || utilization_pct.empty()) {
    return;
  }
  const std::optional<StampedRun> stamped = StampedRunOf(job);
  if (!stamped || StoredJobState(job) == JobState::kScheduled) {
    return;  // a run whose tasks have not started keeps nothing busy
  }
  const int64_t credit = BusyCredit(job, node, utilization_pct, interval_ms);
  if (credit > 0) {
    usage_meter_.Credit(stamped->name, stamped->busy, credit);
  }
}

Result<bool> ControlPlane::FlushUsageIfDue() {
  const MonoTime now = options_.clock.Now();
  if (last_usage_flush_ && now - *last_usage_flush_ < options_.usage_flush_interval) {
    return false;
  }
  last_usage_flush_ = now;
  std::vector<JobWrite> writes;
  for (const auto& [run, busy] : usage_meter_.Snapshot()) {
    // "TEAM/NAME/ATTEMPT": the job's key is all before the last '/'.
    const size_t slash = run.rfind('/');
    const auto job =
        slash == std::string::npos ? view_->jobs().end() : view_->jobs().find(run.substr(0, slash));
    if (job == view_->jobs().end() || !HoldsResources(job->second.state)) {
      usage_meter_.Forget(run);  // ended without this server (or deleted): nothing to write to
      continue;
    }
    Json doc = wire::ParseDocument(job->second.data);
    const std::optional<StampedRun> stamped = StampedRunOf(doc);
    if (!stamped || stamped->name != run) {
      usage_meter_.Forget(run);
      continue;
    }
    if (stamped->busy >= busy) {
      continue;
    }
    // The same document: NoteUsageChange writes the busy time into it.
    writes.push_back(JobWrite{job->first, job->second.version, doc, doc, {""}});
  }
  if (writes.empty()) {
    return false;
  }
  // One commit for all of them; if one job changed under us, one by one (the rest still land).
  store::WriteBatch batch;
  for (JobWrite& write : writes) {
    Json after = write.after;
    AddJobWrite(write.before, after, write.version, "", batch);
  }
  if (const Status status = options_.store.Commit(batch); status.ok()) {
    return true;
  } else if (status.code() != StatusCode::kAborted && status.code() != StatusCode::kNotFound) {
    return status;
  }
  return CommitJobWrites(std::move(writes));
}

Status ControlPlane::RunDeploymentsIfDue() {
  const MonoTime now = options_.clock.Now();
  if (options_.replica_jobs == nullptr || !deployments_.Due(now)) {
    return Status::Ok();
  }
  GPUFLEET_ASSIGN_OR_RETURN(
      const bool changed, deployments_.Step(view_->jobs(), view_->snapshot(),
                                            ReportsForRunningJobs(), now, *options_.replica_jobs));
  return changed ? view_->Refresh() : Status::Ok();
}

void ControlPlane::RunReliabilityIfDue() {
  std::set<std::string> lost;
  for (const auto& [node, why] : leases_.LostNodes(view_->nodes())) {
    lost.insert(node);
  }
  const std::optional<Result<ReliabilityStepResult>> step = reliability_->RunIfDue(lost);
  if (!step) {
    return;
  }
  if (!step->ok()) {
    fmt::print(stderr, "gpufleet server: reliability step failed: {}\n", step->status().ToString());
    return;
  }
  // Rare decisions an operator wants to see; the audit events are on the nodes.
  for (const std::string& device : (*step)->quarantined) {
    fmt::print(stderr, "gpufleet server: quarantined {}\n", device);
  }
  for (const std::string& device : (*step)->needs_person) {
    fmt::print(stderr, "gpufleet server: {} needs a person\n", device);
  }
  for (const std::string& device : (*step)->released) {
    fmt::print(stderr, "gpufleet server: {} released, its evidence starts again\n", device);
  }
}

std::optional<std::set<std::string>> ControlPlane::ActiveJobsOn(const std::string& node) {
  std::lock_guard<std::mutex> lock(agents_mu_);
  if (!active_index_built_) {
    return std::nullopt;
  }
  const auto found = active_jobs_by_node_.find(node);
  return found == active_jobs_by_node_.end() ? std::set<std::string>() : found->second;
}

void ControlPlane::RecordGpuUtilization(const std::string& node,
                                        const std::map<int64_t, int>& percent) {
  std::lock_guard<std::mutex> lock(agents_mu_);
  // The report replaces the node's utilization: a GPU it no longer measures has none, rather
  // than an old value that idle reclaim would act on.
  for (auto it = gpu_utilization_.lower_bound({node, std::numeric_limits<int>::min()});
       it != gpu_utilization_.end() && it->first.first == node;) {
    it = gpu_utilization_.erase(it);
  }
  for (const auto& [gpu, pct] : percent) {
    gpu_utilization_[{node, static_cast<int>(gpu)}] = pct;
  }
}

int64_t ControlPlane::BusyMilli() {
  std::lock_guard<std::mutex> lock(agents_mu_);
  int64_t busy = 0;
  for (const auto& [gpu, percent] : gpu_utilization_) {
    busy += std::clamp(percent, 0, 100) * 10;
  }
  return busy;
}

std::map<std::pair<std::string, int>, int> ControlPlane::GpuUtilization() {
  std::lock_guard<std::mutex> lock(agents_mu_);
  return gpu_utilization_;
}

std::map<std::string, std::string> ControlPlane::ExcludedNodes() {
  std::lock_guard<std::mutex> lock(agents_mu_);
  return excluded_nodes_;
}

}  // namespace gpufleet::control
