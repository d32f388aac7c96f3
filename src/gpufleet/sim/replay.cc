// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/replay.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "gpufleet/core/random.h"
#include "gpufleet/fabric/collective.h"
#include "gpufleet/policy/backfill.h"
#include "gpufleet/scheduler/fragmentation.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/sim/event_queue.h"
#include "gpufleet/sim/parallel.h"

namespace gpufleet::sim {
namespace {

using scheduler::ClusterSnapshot;
using scheduler::TaskPlacement;

// In QueuePolicyNames() order.
enum class QueuePolicy {
  kFifo,
  kSjf,
  kTiresias,
  kGpufleet,
  kStrictFifo,
  kEasyBackfill,
  kFairShare
};

constexpr char kDefaultQueue[] = "default";

// Jobs waiting longer than this go first under the gpufleet queue policy, so a large job is
// never starved by a stream of small ones.
constexpr int64_t kStarvationSeconds = 24 * 3600;

struct JobState {
  const TraceJob* trace = nullptr;
  int64_t gpu_milli = 0;  // whole job
  int64_t remaining_seconds = 0;
  int64_t executed_seconds = 0;  // attained service / GPUs
  int64_t started_at = -1;       // of the current run
  int64_t first_start = -1;
  int64_t end = -1;
  uint64_t epoch = 0;  // bumped on preemption; stale completions are ignored
  int preemptions = 0;
  double stretch = 1.0;  // wall seconds per second of work on the current placement
  int nodes = 0;         // of the current (or last) placement
  bool running = false;
  bool done = false;
  bool timed_out = false;
  bool charged = false;         // holds quota in the queue tree
  int64_t reserved_start = -1;  // first reservation's shadow time
  std::vector<TaskPlacement> placements;
};

const std::string& QueueName(const TraceJob& job) {
  static const std::string kDefault = kDefaultQueue;
  return job.job.queue.empty() ? kDefault : job.job.queue.value();
}

// True when `job` cannot fit where one of `failed` did not: both one group of whole GPUs under
// the same constraints, and `job` asks for no less of anything.
bool Dominated(const TraceJob& job, const std::vector<const TraceJob*>& failed) {
  for (const TraceJob* small : failed) {
    const Job& a = small->job;
    const Job& b = job.job;
    if (a.groups.size() == 1 && b.groups.size() == 1 && a.allowed_gpu_models.empty() &&
        b.allowed_gpu_models.empty() && a.node_selector.empty() && b.node_selector.empty() &&
        a.topology.required_level == b.topology.required_level &&
        b.groups[0].replicas >= a.groups[0].replicas &&
        b.groups[0].request.host.cpu_milli >= a.groups[0].request.host.cpu_milli &&
        b.groups[0].request.host.memory_mib >= a.groups[0].request.host.memory_mib &&
        std::holds_alternative<WholeGpus>(a.groups[0].request.gpus) &&
        std::holds_alternative<WholeGpus>(b.groups[0].request.gpus) &&
        std::get<WholeGpus>(b.groups[0].request.gpus).count >=
            std::get<WholeGpus>(a.groups[0].request.gpus).count) {
      return true;
    }
  }
  return false;
}

Distribution Summarize(std::vector<double> values) {
  Distribution out;
  if (values.empty()) {
    return out;
  }
  std::sort(values.begin(), values.end());
  out.mean = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
  auto at = [&](double q) {
    const size_t index = static_cast<size_t>(std::ceil(q * values.size())) - 1;
    return values[std::min(index, values.size() - 1)];
  };
  out.p50 = at(0.50);
  out.p90 = at(0.90);
  out.p99 = at(0.99);
  return out;
}

// The entry of `queue` in `queues`, kept sorted by name; added when missing.
ReplayQueueOutcome& QueueOutcome(const std::string& queue,
                                 std::vector<ReplayQueueOutcome>& queues) {
  auto at = std::lower_bound(
      queues.begin(), queues.end(), queue,
      [](const ReplayQueueOutcome& entry, const std::string& name) { return entry.queue < name; });
  if (at == queues.end() || at->queue != queue) {
    at = queues.insert(at, ReplayQueueOutcome{queue});
  }
  return *at;
}

// The replay itself; one object per run. Not thread-safe.
class Replay {
 public:
  Replay(const Trace& trace, const ReplayOptions& options, QueuePolicy policy,
         ClusterSnapshot snapshot, std::unique_ptr<scheduler::Scheduler> placer,
         scheduler::TargetWorkload workload, std::optional<policy::QueueTree> queues)
      : trace_(trace),
        options_(options),
        policy_(policy),
        snapshot_(std::move(snapshot)),
        placer_(std::move(placer)),
        planner_(*placer_, policy::BackfillOptions{options.overrun_grace_seconds}),
        queues_(std::move(queues)),
        workload_(std::move(workload)),
        fragmentation_(workload_, snapshot_),
        random_(options.seed) {}

  // kInternal when a policy's bookkeeping failed (a bug).
  Result<ReplayResult> Run();

 private:
  void Arrive(size_t job);
  void Complete(size_t job, uint64_t epoch);
  void TimeOut(size_t job, uint64_t epoch);
  void Sample();
  void ScheduleRound();
  void RunRound();
  // fifo, sjf, tiresias, gpufleet and strict-fifo: one pass in PriorityKey order.
  void PriorityRound();
  void BackfillRound();
  void FairShareRound();
  bool TryStart(size_t job);
  // Where the scheduler places the job now, applied to the snapshot; nullopt when it does not fit.
  std::optional<std::vector<TaskPlacement>> Place(size_t job);
  // Takes back placements from Place that were not started.
  void Unplace(const std::vector<TaskPlacement>& placements);
  // Starts the job on placements from Place.
  void Start(size_t job, std::vector<TaskPlacement> placements);
  void Stop(size_t job, bool preempted);
  // Wall seconds a run may last before it is killed; -1 for no limit.
  int64_t TimeLimit(const JobState& state) const;
  std::vector<policy::BackfillJob> RunningJobs() const;
  policy::BackfillJob AsRunning(size_t job, std::vector<TaskPlacement> placements) const;
  policy::GpuMilliByModel AllocationByModel(const std::vector<TaskPlacement>& placements) const;
  // Keeps the first bookkeeping error; Run returns it.
  void Fail(const Status& status);
  // Smaller is served first.
  std::pair<double, int64_t> PriorityKey(size_t job) const;
  void WatchLevel(size_t job);
  bool NeverFits(const JobState& state) const;
  void Touch(const std::vector<TaskPlacement>& placements);
  // How much longer than on the tightest placement the job runs on `placements`.
  double Stretch(const JobState& state, const std::vector<TaskPlacement>& placements) const;
  // Wall seconds the remaining work takes on the current placement.
  int64_t WallSeconds(const JobState& state) const {
    return static_cast<int64_t>(
        std::ceil(static_cast<double>(state.remaining_seconds) * state.stretch));
  }
  // Work done in `wall` seconds on the current placement.
  int64_t WorkDone(const JobState& state, int64_t wall) const {
    return std::min(state.remaining_seconds,
                    static_cast<int64_t>(std::floor(static_cast<double>(wall) / state.stretch)));
  }

  const Trace& trace_;
  const ReplayOptions& options_;
  QueuePolicy policy_;
  ClusterSnapshot snapshot_;
  std::unique_ptr<scheduler::Scheduler> placer_;
  policy::BackfillPlanner planner_;
  std::optional<policy::QueueTree> queues_;  // fair-share only
  scheduler::TargetWorkload workload_;
  scheduler::FragmentationModel fragmentation_;
  Random random_;
  EventQueue events_;
  std::vector<JobState> jobs_;
  std::vector<size_t> waiting_;  // arrived, not running, not done
  std::vector<size_t> running_jobs_;
  std::vector<size_t> preempted_;  // in the current round, to wait again after it
  std::vector<double> node_fragmentation_;
  double total_fragmentation_ = 0;
  int running_ = 0;
  int unplaceable_ = 0;
  int timed_out_ = 0;
  int max_gpus_per_node_ = 0;
  size_t finished_ = 0;
  size_t arrived_ = 0;
  bool round_pending_ = false;
  std::vector<ReplaySample> series_;
  double allocated_gpu_seconds_ = 0;
  int64_t last_change_ = 0;
  std::vector<int> fabric_node_;                 // per snapshot node; empty without a fabric
  std::unordered_map<JobId, size_t> job_index_;  // fair-share: trace job ids are unique
  Status error_;
};

std::pair<double, int64_t> Replay::PriorityKey(size_t job) const {
  const JobState& state = jobs_[job];
  const int64_t submit = state.trace->submit_seconds;
  switch (policy_) {
    case QueuePolicy::kFifo:
    case QueuePolicy::kStrictFifo:
    case QueuePolicy::kEasyBackfill:
    case QueuePolicy::kFairShare:  // ordered by the queue tree instead
      return {0.0, submit};
    case QueuePolicy::kSjf:
      return {static_cast<double>(state.trace->job.runtime_estimate.count()) / 1e9, submit};
    case QueuePolicy::kTiresias: {
      // Discretized 2D-LAS: the queue level grows with attained GPU-seconds; FIFO inside a level.
      const double attained =
          static_cast<double>(state.executed_seconds) * state.gpu_milli / kMilliPerUnit;
      int level = 0;
      for (double threshold : options_.tiresias_thresholds) {
        level += attained >= threshold ? 1 : 0;
      }
      return {static_cast<double>(level), submit};
    }
    case QueuePolicy::kGpufleet: {
      // Least remaining GPU-time first; long waiters first of all.
      const int64_t waited = events_.now() - submit;
      if (!state.running && state.first_start < 0 && waited >= kStarvationSeconds) {
        return {-1.0, submit};
      }
      return {static_cast<double>(state.remaining_seconds) * state.gpu_milli / kMilliPerUnit,
              submit};
    }
  }
  return {0.0, submit};
}

void Replay::Touch(const std::vector<TaskPlacement>& placements) {
  allocated_gpu_seconds_ += static_cast<double>(snapshot_.AllocatedGpuMilli()) / kMilliPerUnit *
                            static_cast<double>(events_.now() - last_change_);
  last_change_ = events_.now();
  for (const TaskPlacement& placement : placements) {
    const double now = fragmentation_.NodeFragmentation(snapshot_.nodes()[placement.node]);
    total_fragmentation_ += now - node_fragmentation_[placement.node];
    node_fragmentation_[placement.node] = now;
  }
}

std::optional<std::vector<TaskPlacement>> Replay::Place(size_t job) {
  scheduler::ScheduleResult result = placer_->Schedule(jobs_[job].trace->job, snapshot_, random_);
  if (!result.scheduled()) {
    return std::nullopt;
  }
  return std::move(result.placements);
}

void Replay::Unplace(const std::vector<TaskPlacement>& placements) {
  for (auto it = placements.rbegin(); it != placements.rend(); ++it) {
    snapshot_.Revert(*it);
  }
}

bool Replay::TryStart(size_t job) {
  std::optional<std::vector<TaskPlacement>> placements = Place(job);
  if (!placements) {
    return false;
  }
  Start(job, std::move(*placements));
  return true;
}

int64_t Replay::TimeLimit(const JobState& state) const {
  const int64_t estimate =
      std::chrono::duration_cast<std::chrono::seconds>(state.trace->job.runtime_estimate).count();
  const bool enforced = options_.enforce_time_limits || policy_ == QueuePolicy::kEasyBackfill;
  return enforced && estimate > 0 ? estimate + options_.overrun_grace_seconds : -1;
}

void Replay::Start(size_t job, std::vector<TaskPlacement> placements) {
  JobState& state = jobs_[job];
  Touch({});
  state.placements = std::move(placements);
  Touch(state.placements);
  state.stretch = Stretch(state, state.placements);
  std::vector<int> nodes;
  for (const TaskPlacement& placement : state.placements) {
    nodes.push_back(placement.node);
  }
  std::sort(nodes.begin(), nodes.end());
  state.nodes = static_cast<int>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
  state.running = true;
  state.started_at = events_.now();
  if (state.first_start < 0) {
    state.first_start = events_.now();
  }
  ++running_;
  running_jobs_.push_back(job);
  const uint64_t epoch = state.epoch;
  const int64_t wall = WallSeconds(state);
  const int64_t limit = TimeLimit(state);
  if (limit >= 0 && wall > limit) {
    events_.ScheduleAt(events_.now() + limit, [this, job, epoch] { TimeOut(job, epoch); });
  } else {
    events_.ScheduleAt(events_.now() + wall, [this, job, epoch] { Complete(job, epoch); });
  }
  WatchLevel(job);
}

// Under Tiresias a running job may drop a level while it runs; look again at that moment.
void Replay::WatchLevel(size_t job) {
  if (policy_ != QueuePolicy::kTiresias) {
    return;
  }
  const JobState& state = jobs_[job];
  const double gpus = static_cast<double>(state.gpu_milli) / kMilliPerUnit;
  const double attained = static_cast<double>(state.executed_seconds) * gpus;
  for (double threshold : options_.tiresias_thresholds) {
    if (attained < threshold && gpus > 0) {
      const int64_t delay = static_cast<int64_t>(std::ceil((threshold - attained) / gpus));
      if (delay < WallSeconds(state)) {
        const uint64_t epoch = state.epoch;
        events_.ScheduleAt(events_.now() + delay, [this, job, epoch] {
          if (jobs_[job].running && jobs_[job].epoch == epoch) {
            // Account the service so far, then let the round reconsider the order.
            JobState& crossing = jobs_[job];
            crossing.executed_seconds += events_.now() - crossing.started_at;
            crossing.remaining_seconds -= WorkDone(crossing, events_.now() - crossing.started_at);
            crossing.started_at = events_.now();
            ++crossing.epoch;
            const uint64_t next = crossing.epoch;
            events_.ScheduleAt(events_.now() + WallSeconds(crossing),
                               [this, job, next] { Complete(job, next); });
            WatchLevel(job);
            ScheduleRound();
          }
        });
      }
      return;
    }
  }
}

void Replay::Stop(size_t job, bool preempted) {
  JobState& state = jobs_[job];
  Touch({});
  for (const TaskPlacement& placement : state.placements) {
    snapshot_.Release(placement);
  }
  Touch(state.placements);
  state.placements.clear();
  const int64_t ran = events_.now() - state.started_at;
  state.executed_seconds += ran;
  state.remaining_seconds -= WorkDone(state, ran);
  state.running = false;
  ++state.epoch;
  --running_;
  running_jobs_.erase(std::find(running_jobs_.begin(), running_jobs_.end(), job));
  if (state.charged) {
    Fail(queues_->Advance(events_.now()));
    Fail(queues_->Release(state.trace->job.id));
    state.charged = false;
  }
  if (preempted) {
    ++state.preemptions;
    preempted_.push_back(job);
  }
}

// True when no node of the cluster, even empty, has as many GPUs as one task of the job asks for,
// or when the whole job asks for more GPUs than the cluster has.
bool Replay::NeverFits(const JobState& state) const {
  if (state.gpu_milli > snapshot_.TotalGpuMilli()) {
    return true;
  }
  for (const TaskGroup& group : state.trace->job.groups) {
    if (const auto* whole = std::get_if<WholeGpus>(&group.request.gpus);
        whole != nullptr && whole->count > max_gpus_per_node_) {
      return true;
    }
  }
  return false;
}

void Replay::Arrive(size_t job) {
  ++arrived_;
  JobState& state = jobs_[job];
  if (NeverFits(state)) {
    state.done = true;
    ++unplaceable_;
    return;
  }
  waiting_.push_back(job);
  ScheduleRound();
}

void Replay::Complete(size_t job, uint64_t epoch) {
  JobState& state = jobs_[job];
  if (!state.running || state.epoch != epoch) {
    return;
  }
  Stop(job, false);
  state.done = true;
  state.remaining_seconds = 0;
  state.end = events_.now();
  ++finished_;
  ScheduleRound();
}

void Replay::TimeOut(size_t job, uint64_t epoch) {
  JobState& state = jobs_[job];
  if (!state.running || state.epoch != epoch) {
    return;
  }
  Stop(job, false);
  state.done = true;
  state.timed_out = true;
  state.end = events_.now();
  ++timed_out_;
  ScheduleRound();
}

void Replay::Fail(const Status& status) {
  if (error_.ok() && !status.ok()) {
    error_ = status;
  }
}

void Replay::ScheduleRound() {
  if (round_pending_) {
    return;
  }
  // Several arrivals at one instant share one round, run after them.
  round_pending_ = true;
  events_.ScheduleAfter(0, [this] {
    round_pending_ = false;
    RunRound();
  });
}

void Replay::RunRound() {
  switch (policy_) {
    case QueuePolicy::kEasyBackfill:
      BackfillRound();
      return;
    case QueuePolicy::kFairShare:
      FairShareRound();
      return;
    default:
      PriorityRound();
      return;
  }
}

// Offers the waiting jobs to the scheduler in policy order. Preemptive policies first make room
// for a better-ranked waiting job by stopping the worst-ranked running ones.
void Replay::PriorityRound() {
  std::stable_sort(waiting_.begin(), waiting_.end(),
                   [this](size_t a, size_t b) { return PriorityKey(a) < PriorityKey(b); });
  const bool preemptive = policy_ == QueuePolicy::kTiresias || policy_ == QueuePolicy::kGpufleet;
  std::vector<size_t> still_waiting;
  // A job no smaller than one that just failed fails too (same constraints): skip it.
  std::vector<const TraceJob*> failed;
  bool blocked = false;  // strict-fifo: nothing passes a job that does not fit
  for (size_t job : waiting_) {
    const JobState& state = jobs_[job];
    const int64_t free = snapshot_.TotalGpuMilli() - snapshot_.AllocatedGpuMilli();
    bool started = false;
    if (!blocked && state.gpu_milli <= free && !Dominated(*state.trace, failed)) {
      started = TryStart(job);
    }
    if (!started && preemptive) {
      // Stop running jobs ranked after this one, worst first, until it fits.
      std::vector<size_t> victims;
      for (size_t other : running_jobs_) {
        if (PriorityKey(job) < PriorityKey(other)) {
          victims.push_back(other);
        }
      }
      std::stable_sort(victims.begin(), victims.end(),
                       [this](size_t a, size_t b) { return PriorityKey(a) > PriorityKey(b); });
      int64_t freeable = free;
      for (size_t victim : victims) {
        freeable += jobs_[victim].gpu_milli;
      }
      if (freeable >= state.gpu_milli) {
        for (size_t victim : victims) {
          Stop(victim, true);
          if (TryStart(job)) {
            started = true;
            break;
          }
        }
      }
    }
    if (!started) {
      still_waiting.push_back(job);
      failed.push_back(state.trace);
      blocked = policy_ == QueuePolicy::kStrictFifo;
    }
  }
  for (size_t job : preempted_) {
    if (!jobs_[job].running) {
      still_waiting.push_back(job);
    }
  }
  preempted_.clear();
  waiting_ = std::move(still_waiting);
}

policy::BackfillJob Replay::AsRunning(size_t job, std::vector<TaskPlacement> placements) const {
  const JobState& state = jobs_[job];
  const int64_t estimate =
      std::chrono::duration_cast<std::chrono::seconds>(state.trace->job.runtime_estimate).count();
  return {state.trace->job.id, std::move(placements),
          state.running ? state.started_at : events_.now(), std::max<int64_t>(0, estimate)};
}

std::vector<policy::BackfillJob> Replay::RunningJobs() const {
  std::vector<policy::BackfillJob> running;
  running.reserve(running_jobs_.size());
  for (size_t job : running_jobs_) {
    running.push_back(AsRunning(job, jobs_[job].placements));
  }
  return running;
}

// Arrival order. The first job that does not fit becomes the head: it gets a reservation, and a
// later job that fits now starts only if the head still fits at its reserved time.
void Replay::BackfillRound() {
  std::stable_sort(waiting_.begin(), waiting_.end(),
                   [this](size_t a, size_t b) { return PriorityKey(a) < PriorityKey(b); });
  std::vector<size_t> still_waiting;
  std::vector<const TraceJob*> failed;
  std::optional<size_t> head;
  policy::Reservation reservation;
  std::vector<policy::BackfillJob> running;  // while there is a head: the jobs holding resources
  for (size_t job : waiting_) {
    JobState& state = jobs_[job];
    const int64_t free = snapshot_.TotalGpuMilli() - snapshot_.AllocatedGpuMilli();
    std::optional<std::vector<TaskPlacement>> placements;
    if (state.gpu_milli <= free && !Dominated(*state.trace, failed)) {
      placements = Place(job);
    }
    if (!placements) {
      still_waiting.push_back(job);
      failed.push_back(state.trace);
      if (!head) {
        head = job;
        running = RunningJobs();
        Result<policy::Reservation> planned =
            planner_.Reserve(state.trace->job, running, events_.now(), snapshot_, random_);
        Fail(planned.status());
        if (planned.ok()) {
          reservation = std::move(planned).value();
        }
        if (reservation.exists() && state.reserved_start < 0) {
          state.reserved_start = reservation.shadow_seconds;
        }
      }
      continue;
    }
    if (head) {
      const policy::BackfillJob candidate = AsRunning(job, *placements);
      Result<bool> keeps =
          planner_.KeepsReservation(reservation, jobs_[*head].trace->job, candidate, running,
                                    events_.now(), snapshot_, random_);
      Fail(keeps.status());
      if (!keeps.ok() || !*keeps) {
        // It fits now but would delay the head: it waits, and is no reason to skip others.
        Unplace(*placements);
        still_waiting.push_back(job);
        continue;
      }
      running.push_back(candidate);
    }
    Start(job, std::move(*placements));
  }
  waiting_ = std::move(still_waiting);
}

policy::GpuMilliByModel Replay::AllocationByModel(
    const std::vector<TaskPlacement>& placements) const {
  policy::GpuMilliByModel allocation;
  for (const TaskPlacement& placement : placements) {
    const scheduler::NodeInfo& node = snapshot_.nodes()[placement.node];
    for (const scheduler::GpuAssignment& gpu : placement.gpus) {
      const scheduler::GpuSlot& slot = node.gpus[gpu.gpu];
      const int64_t milli =
          gpu.mig_profile.empty() ? gpu.milli : RequestedGpuMilli(MigGpus{gpu.mig_profile, 1});
      allocation[snapshot_.Model(slot.model_id).name] += milli;
    }
  }
  return allocation;
}

// The queue tree's order; each job is placed, then admitted by its queue's quota (with the
// models it was placed on) or taken back.
void Replay::FairShareRound() {
  Fail(queues_->Advance(events_.now()));
  std::vector<policy::PendingJob> pending;
  pending.reserve(waiting_.size());
  for (size_t job : waiting_) {
    const TraceJob& trace = *jobs_[job].trace;
    pending.push_back(
        {trace.job.id, QueueId(QueueName(trace)), trace.job.priority, trace.submit_seconds});
  }
  Fail(queues_->Order(pending));
  std::vector<size_t> still_waiting;
  std::vector<const TraceJob*> failed;
  for (const policy::PendingJob& entry : pending) {
    const size_t job = job_index_.at(entry.id);
    JobState& state = jobs_[job];
    const int64_t free = snapshot_.TotalGpuMilli() - snapshot_.AllocatedGpuMilli();
    std::optional<std::vector<TaskPlacement>> placements;
    if (state.gpu_milli <= free && !Dominated(*state.trace, failed)) {
      placements = Place(job);
    }
    if (!placements) {
      still_waiting.push_back(job);
      failed.push_back(state.trace);
      continue;
    }
    const policy::GpuMilliByModel allocation = AllocationByModel(*placements);
    Result<policy::Admission> admission = queues_->CheckAdmission(entry.queue, allocation);
    Fail(admission.status());
    if (!admission.ok() || !admission->admitted()) {
      Unplace(*placements);
      still_waiting.push_back(job);
      continue;
    }
    Start(job, std::move(*placements));
    Fail(queues_->Charge(entry.id, entry.queue, allocation));
    state.charged = true;
  }
  waiting_ = std::move(still_waiting);
}

void Replay::Sample() {
  ReplaySample sample;
  sample.time_seconds = events_.now();
  sample.gpus_allocated = static_cast<double>(snapshot_.AllocatedGpuMilli()) / kMilliPerUnit;
  sample.fragmentation_gpus = total_fragmentation_ / kMilliPerUnit;
  sample.queue_length = static_cast<int>(waiting_.size());
  sample.running = running_;
  series_.push_back(sample);
  if (arrived_ < jobs_.size() || running_ > 0 || !waiting_.empty()) {
    events_.ScheduleAfter(options_.sample_seconds, [this] { Sample(); });
  }
}

double Replay::Stretch(const JobState& state, const std::vector<TaskPlacement>& placements) const {
  std::map<int, int> gpus_per_node;
  for (const TaskPlacement& placement : placements) {
    gpus_per_node[placement.node] += static_cast<int>(placement.gpus.size());
  }
  if (fabric_node_.empty() || gpus_per_node.size() < 2) {
    return 1.0;
  }
  const fabric::Fabric& fabric = *options_.fabric;
  std::vector<fabric::PlacedGpus> placed;
  for (const auto& [node, gpus] : gpus_per_node) {
    if (fabric_node_[node] < 0 || gpus == 0) {
      return 1.0;  // a node the fabric does not know, or CPU-only tasks: no network model
    }
    placed.push_back({fabric_node_[node], gpus});
  }
  auto shape = fabric::ShapeOf(fabric, placed);
  if (!shape.ok()) {
    return 1.0;
  }
  const fabric::PlacementShape ideal = fabric::CompactShape(fabric, shape->ranks);
  const double actual =
      fabric::EstimateCollective(fabric::Collective::kAllReduce, options_.collective_bytes, *shape)
          .seconds;
  const double best =
      fabric::EstimateCollective(fabric::Collective::kAllReduce, options_.collective_bytes, ideal)
          .seconds;
  const double fraction = state.trace->communication_fraction >= 0
                              ? state.trace->communication_fraction
                              : options_.communication_fraction;
  return best > 0 ? 1.0 - fraction + fraction * std::max(1.0, actual / best) : 1.0;
}

Result<ReplayResult> Replay::Run() {
  if (options_.fabric != nullptr) {
    for (const scheduler::NodeInfo& node : snapshot_.nodes()) {
      fabric_node_.push_back(options_.fabric->FindNode(node.node->id.value()));
    }
  }
  jobs_.resize(trace_.jobs.size());
  for (size_t i = 0; i < trace_.jobs.size(); ++i) {
    JobState& state = jobs_[i];
    state.trace = &trace_.jobs[i];
    state.gpu_milli = state.trace->job.RequestedGpuMilliTotal();
    state.remaining_seconds = state.trace->duration_seconds;
    if (queues_) {
      job_index_.emplace(state.trace->job.id, i);
    }
    events_.ScheduleAt(state.trace->submit_seconds, [this, i] { Arrive(i); });
  }
  for (const scheduler::NodeInfo& node : snapshot_.nodes()) {
    max_gpus_per_node_ = std::max(max_gpus_per_node_, static_cast<int>(node.gpus.size()));
  }
  node_fragmentation_.resize(snapshot_.nodes().size());
  for (const scheduler::NodeInfo& node : snapshot_.nodes()) {
    node_fragmentation_[node.index] = fragmentation_.NodeFragmentation(node);
    total_fragmentation_ += node_fragmentation_[node.index];
  }
  events_.ScheduleAt(0, [this] { Sample(); });
  while (events_.RunNext()) {
    // A queue that can never drain (nothing running, nothing arriving) ends the run.
    if (running_ == 0 && arrived_ == jobs_.size() && !waiting_.empty() && !round_pending_ &&
        (events_.empty() || events_.next_time() > events_.now())) {
      break;
    }
  }
  Touch({});
  GPUFLEET_RETURN_IF_ERROR(error_);

  ReplayResult result;
  result.queue_policy = options_.queue_policy;
  result.placement_policy = options_.placement_policy;
  result.seed = options_.seed;
  result.total_gpus = snapshot_.TotalGpus();
  result.jobs_total = static_cast<int>(jobs_.size());
  result.jobs_finished = static_cast<int>(finished_);
  result.jobs_unplaceable = unplaceable_;
  result.jobs_timed_out = timed_out_;
  std::vector<double> delays;
  std::vector<double> completions;
  std::map<std::string, std::vector<double>> queue_delays;
  int64_t first_submit = trace_.jobs.empty() ? 0 : trace_.jobs.front().submit_seconds;
  int64_t last_end = first_submit;
  for (const JobState& state : jobs_) {
    ReplayJobOutcome outcome;
    outcome.id = state.trace->job.id.value();
    outcome.submit_seconds = state.trace->submit_seconds;
    outcome.first_start_seconds = state.first_start;
    outcome.end_seconds = state.end;
    outcome.gpus = static_cast<int>(state.gpu_milli / kMilliPerUnit);
    outcome.preemptions = state.preemptions;
    outcome.nodes = state.nodes;
    outcome.stretch = state.stretch;
    outcome.queue = QueueName(*state.trace);
    outcome.timed_out = state.timed_out;
    outcome.reserved_start_seconds = state.reserved_start;
    ReplayQueueOutcome& queue = QueueOutcome(outcome.queue, result.queues);
    ++queue.jobs;
    queue.finished += state.end >= 0 && !state.timed_out ? 1 : 0;
    queue_delays[outcome.queue];
    if (state.first_start >= 0) {
      delays.push_back(static_cast<double>(outcome.QueueingDelay()));
      queue_delays[outcome.queue].push_back(static_cast<double>(outcome.QueueingDelay()));
      ++queue.started;
    }
    if (state.reserved_start >= 0) {
      ++result.reservations;
      if (state.first_start > state.reserved_start) {
        ++result.reservations_delayed;
        result.max_reservation_delay_seconds = std::max(result.max_reservation_delay_seconds,
                                                        state.first_start - state.reserved_start);
      }
    }
    if (state.end >= 0 && !state.timed_out) {
      completions.push_back(static_cast<double>(outcome.CompletionTime()));
      last_end = std::max(last_end, state.end);
    }
    result.jobs.push_back(std::move(outcome));
  }
  result.makespan_seconds = last_end - first_submit;
  result.mean_gpus_allocated =
      last_change_ > 0 ? allocated_gpu_seconds_ / static_cast<double>(last_change_) : 0;
  result.queueing_delay = Summarize(std::move(delays));
  result.completion_time = Summarize(std::move(completions));
  result.series = std::move(series_);
  for (ReplayQueueOutcome& queue : result.queues) {
    queue.queueing_delay = Summarize(std::move(queue_delays[queue.queue]));
  }
  return result;
}

// The fair-share queue tree: the configured one, or one top-level queue per queue of the trace;
// its capacity is the cluster's GPUs by model.
Result<policy::QueueTree> BuildQueueTree(const Trace& trace, const ReplayOptions& options,
                                         const ClusterSnapshot& snapshot) {
  std::vector<policy::QueueSpec> specs = options.queues;
  if (specs.empty()) {
    std::set<std::string> names;
    for (const TraceJob& job : trace.jobs) {
      names.insert(QueueName(job));
    }
    for (const std::string& name : names) {
      specs.push_back({name});
    }
  }
  policy::QueueTreeOptions tree_options;
  tree_options.usage_half_life_seconds = options.fair_share_half_life_seconds;
  GPUFLEET_ASSIGN_OR_RETURN(policy::QueueTree tree,
                            policy::QueueTree::Create(std::move(specs), tree_options));
  const std::vector<QueueId> defined = tree.Queues();
  const std::set<QueueId> known(defined.begin(), defined.end());
  std::set<JobId> ids;
  for (const TraceJob& job : trace.jobs) {
    if (known.count(QueueId(QueueName(job))) == 0) {
      return InvalidArgumentError(fmt::format("job \"{}\": queue \"{}\" is not in the queue tree",
                                              job.job.id.value(), QueueName(job)));
    }
    if (!ids.insert(job.job.id).second) {
      return InvalidArgumentError(fmt::format(
          "job \"{}\": id used twice (fair-share needs unique ids)", job.job.id.value()));
    }
  }
  policy::GpuMilliByModel capacity;
  for (const scheduler::NodeInfo& node : snapshot.nodes()) {
    for (const scheduler::GpuSlot& gpu : node.gpus) {
      capacity[snapshot.Model(gpu.model_id).name] += kMilliPerUnit;
    }
  }
  tree.SetCapacity(std::move(capacity));
  return tree;
}

}  // namespace

Trace FitTasksToNodes(const Trace& trace, int max_gpus_per_node) {
  Trace fitted = trace;
  if (max_gpus_per_node <= 0) {
    return fitted;
  }
  for (TraceJob& job : fitted.jobs) {
    for (TaskGroup& group : job.job.groups) {
      auto* whole = std::get_if<WholeGpus>(&group.request.gpus);
      if (whole == nullptr || whole->count <= max_gpus_per_node) {
        continue;
      }
      const int64_t gpus = static_cast<int64_t>(whole->count) * group.replicas;
      int width = max_gpus_per_node;
      while (gpus % width != 0) {
        --width;
      }
      // Host resources follow the GPUs: a task half as wide asks for half as much.
      group.request.host.cpu_milli = group.request.host.cpu_milli * width / whole->count;
      group.request.host.memory_mib = group.request.host.memory_mib * width / whole->count;
      group.replicas = static_cast<int>(gpus / width);
      whole->count = width;
    }
  }
  return fitted;
}

const std::vector<std::string>& QueuePolicyNames() {
  static const std::vector<std::string> kNames = {
      "fifo", "sjf", "tiresias", "gpufleet", "strict-fifo", "easy-backfill", "fair-share"};
  return kNames;
}

Result<ReplayResult> RunReplay(const Cluster& cluster, const Trace& trace,
                               const GpuCatalog& catalog, const ReplayOptions& options) {
  const std::vector<std::string>& names = QueuePolicyNames();
  const auto found = std::find(names.begin(), names.end(), options.queue_policy);
  if (found == names.end()) {
    return InvalidArgumentError(fmt::format("queue policy: unknown \"{}\" (known: {})",
                                            options.queue_policy, fmt::join(names, ", ")));
  }
  if (options.sample_seconds <= 0) {
    return InvalidArgumentError(
        fmt::format("sample_seconds: {} (must be positive)", options.sample_seconds));
  }
  if (!(options.communication_fraction >= 0 && options.communication_fraction <= 1)) {
    return InvalidArgumentError(fmt::format("communication_fraction: {} (must be in [0, 1])",
                                            options.communication_fraction));
  }
  if (options.topology_aware && options.fabric == nullptr) {
    return InvalidArgumentError("topology_aware: needs a fabric");
  }
  if (options.overrun_grace_seconds < 0) {
    return InvalidArgumentError(
        fmt::format("overrun_grace_seconds: {} (must be >= 0)", options.overrun_grace_seconds));
  }
  GPUFLEET_ASSIGN_OR_RETURN(ClusterSnapshot snapshot, ClusterSnapshot::Build(cluster, catalog));
  int max_gpus_per_node = 0;
  for (const scheduler::NodeInfo& node : snapshot.nodes()) {
    max_gpus_per_node = std::max(max_gpus_per_node, static_cast<int>(node.gpus.size()));
  }
  const Trace adapted = FitTasksToNodes(trace, max_gpus_per_node);
  std::vector<scheduler::TaskShape> shapes;
  for (const TraceJob& job : adapted.jobs) {
    for (const TaskGroup& group : job.job.groups) {
      shapes.push_back(scheduler::ShapeOf(group.request, job.job.allowed_gpu_models));
    }
  }
  scheduler::TargetWorkload workload = scheduler::TargetWorkload::FromShapes(shapes);
  scheduler::SchedulerOptions scheduler_options;
  scheduler_options.policy = options.placement_policy;
  scheduler_options.plugin_args.target_workload = workload;
  scheduler_options.plugin_args.fabric = options.fabric;
  if (options.topology_aware) {
    // Outweighs the placement policy: a placement whose collectives are measurably slower loses
    // whatever its packing score.
    scheduler_options.extra_plugins.push_back("collective-cost");
    scheduler_options.extra_plugin_weights["collective-cost"] = 2;
  }
  GPUFLEET_ASSIGN_OR_RETURN(
      std::unique_ptr<scheduler::Scheduler> placer,
      scheduler::Scheduler::Create(scheduler_options, scheduler::PluginRegistry::Default()));
  const auto policy = static_cast<QueuePolicy>(found - names.begin());
  std::optional<policy::QueueTree> queues;
  if (policy == QueuePolicy::kFairShare) {
    GPUFLEET_ASSIGN_OR_RETURN(queues, BuildQueueTree(adapted, options, snapshot));
  }
  Replay replay(adapted, options, policy, std::move(snapshot), std::move(placer),
                std::move(workload), std::move(queues));
  return replay.Run();
}

}  // namespace gpufleet::sim

namespace gpufleet::sim {

Result<std::vector<ReplayResult>> RunReplayMatrix(const Cluster& cluster, const Trace& trace,
                                                  const GpuCatalog& catalog,
                                                  const std::vector<std::string>& queue_policies,
                                                  const ReplayOptions& options, int threads,
                                                  const std::function<void()>& on_run_done) {
  return ParallelMap<ReplayResult>(
      queue_policies.size(), threads,
      [&](size_t i) {
        ReplayOptions run = options;
        run.queue_policy = queue_policies[i];
        return RunReplay(cluster, trace, catalog, run);
      },
      on_run_done);
}

}  // namespace gpufleet::sim
