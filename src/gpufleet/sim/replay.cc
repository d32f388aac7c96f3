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
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "gpufleet/core/random.h"
#include "gpufleet/fabric/collective.h"
#include "gpufleet/policy/backfill.h"
#include "gpufleet/policy/preemption.h"
#include "gpufleet/policy/workload_history.h"
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
  kFairShare,
  kFairShareNoPreempt
};

// What FairSharePreempt did.
enum class PreemptionAttempt {
  kNoCandidates,  // no search: even every eligible victim would not free enough GPUs
  kUnchanged,     // no search: the last one for the job found no plan, and nothing changed
  kNoPlan,        // searched, nothing started
  kStarted,       // victims stopped, the job started on their GPUs
};

constexpr char kDefaultQueue[] = "default";

// Jobs waiting longer than this go first under the gpufleet queue policy, so a large job is
// never starved by a stream of small ones.
constexpr int64_t kStarvationSeconds = 24 * 3600;

// What a notebook's GPUs report to the idle reclaimer in a busy burst and in an idle period.
constexpr int64_t kBusyUtilizationMilli = 900;
constexpr int64_t kIdleUtilizationMilli = 0;
// Mixed into the seed for the notebooks' activity, so that it does not share a stream with the
// scheduler's tie-breaks (and is the same whatever the scheduler draws).
constexpr uint64_t kActivitySeedSalt = 0x6e6f7465626f6f6bULL;  // "notebook"

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
  std::string unplaceable_reason;  // set when it can never run on the cluster
  int64_t allocated_milli = 0;     // of the current placements
  int64_t busy_since = -1;         // start of the current run, for the busy GPU-time of batch jobs
  // A notebook under the activity model: wall seconds of alternating busy and idle periods (even
  // indexes busy) and the position in them, as of activity_at. Empty for every other job.
  std::vector<int64_t> activity;
  size_t activity_segment = 0;
  int64_t activity_offset = 0;
  int64_t activity_at = 0;
  // Idle reclaim: when the owner came back to the reclaimed notebook (-1: not waiting for
  // that); reclaims and the total wait on coming back.
  int64_t resume_requested_at = -1;
  int reclaims = 0;
  int64_t resume_wait = 0;
};

// Alternating busy and idle wall seconds, busy first, summing to `duration`, with busy periods
// summing to busy_fraction of it (to the second; see InteractiveActivity). The session has one
// busy-idle cycle per mean cycle (mean busy / busy_fraction) that fits, at least one; the lengths
// of its busy periods, and of its idle periods, are exponential draws scaled to their totals.
// A period may round to zero seconds.
std::vector<int64_t> DrawActivity(int64_t duration, const InteractiveActivity& model,
                                  Random& random) {
  if (model.busy_fraction >= 1.0) {
    return {duration};
  }
  const double cycle = static_cast<double>(model.mean_busy_seconds) / model.busy_fraction;
  const size_t cycles = std::max<size_t>(1, static_cast<size_t>(std::llround(duration / cycle)));
  std::vector<double> draws(2 * cycles);
  double sums[2] = {0, 0};
  for (size_t i = 0; i < draws.size(); ++i) {
    draws[i] = -std::log(1.0 - random.UniformDouble());
    sums[i % 2] += draws[i];
  }
  const int64_t busy_total = std::llround(model.busy_fraction * static_cast<double>(duration));
  const int64_t totals[2] = {busy_total, duration - busy_total};
  // Cumulative rounding keeps each kind's total exact.
  double cumulative[2] = {0, 0};
  int64_t placed[2] = {0, 0};
  std::vector<int64_t> periods;
  periods.reserve(draws.size());
  for (size_t i = 0; i < draws.size(); ++i) {
    const size_t kind = i % 2;
    cumulative[kind] += draws[i];
    const int64_t end =
        sums[kind] > 0
            ? std::llround(static_cast<double>(totals[kind]) * cumulative[kind] / sums[kind])
            : totals[kind];
    const int64_t length = std::min(end, totals[kind]) - placed[kind];
    periods.push_back(std::max<int64_t>(0, length));
    placed[kind] += periods.back();
  }
  // Rounding at the last period of a kind.
  periods[draws.size() - 2] += totals[0] - placed[0];
  periods[draws.size() - 1] += totals[1] - placed[1];
  return periods;
}

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
         scheduler::TargetWorkload workload, std::optional<policy::QueueTree> queues,
         scheduler::SchedulerOptions placer_options)
      : trace_(trace),
        options_(options),
        policy_(policy),
        snapshot_(std::move(snapshot)),
        placer_(std::move(placer)),
        planner_(*placer_, policy::BackfillOptions{options.overrun_grace_seconds}),
        queues_(std::move(queues)),
        workload_(std::move(workload)),
        fragmentation_(workload_, snapshot_),
        random_(options.seed),
        placer_options_(std::move(placer_options)) {
    // (`policy` is the queue policy here; the namespace needs its full name.)
    if (options.learn_workload_seconds > 0 &&
        gpufleet::policy::NeedsTargetWorkload(placer_options_.policy)) {
      learnt_.emplace(gpufleet::policy::WorkloadHistoryOptions{});
    }
  }

  // kInternal when a policy's bookkeeping failed (a bug).
  Result<ReplayResult> Run();

 private:
  void Arrive(size_t job);
  void Complete(size_t job, uint64_t epoch);
  // Moves a running notebook's activity position to now, counting its busy GPU-time.
  void AdvanceActivity(size_t job);
  // Whether a job's GPUs are busy now. REQUIRES: running, activity advanced to now.
  bool BusyNow(const JobState& state) const;
  // Idle reclaim: samples the running notebooks, asks the reclaimer and carries out its reclaims.
  void ReclaimTick();
  void Reclaim(size_t job);
  // The owner of a reclaimed notebook is back: it waits for GPUs again.
  void Resume(size_t job);
  // A reclaimed notebook's session ran out while its owner was away.
  void EndSuspendedSession(size_t job);
  void SessionOver(const JobState& state);
  JobId ReclaimId(size_t job) const;
  void TimeOut(size_t job, uint64_t epoch);
  void Sample();
  void ScheduleRound();
  void RunRound();
  // fifo, sjf, tiresias, gpufleet and strict-fifo: one pass in PriorityKey order.
  void PriorityRound();
  void BackfillRound();
  void FairShareRound();
  // fair-share: one victim search for `job` of `queue`, which does not fit; on a plan, stops the
  // victims and starts the job on their GPUs, charged to its queue.
  PreemptionAttempt FairSharePreempt(size_t job, const QueueId& queue);
  // Where a preempted run resumes from: its last checkpoint (see checkpoint_interval_seconds).
  int64_t LastCheckpoint(const JobState& state) const;
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
  std::vector<policy::RunningJob> RunningJobs() const;
  policy::RunningJob AsRunning(size_t job, std::vector<TaskPlacement> placements) const;
  policy::GpuMilliByModel AllocationByModel(const std::vector<TaskPlacement>& placements) const;
  // Keeps the first bookkeeping error; Run returns it.
  void Fail(const Status& status);
  // Smaller is served first.
  std::pair<double, int64_t> PriorityKey(size_t job) const;
  void WatchLevel(size_t job);
  std::optional<std::string> NeverFits(const JobState& state) const;
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
  // Learning the target workload (ReplayOptions::learn_workload_seconds): the history, the
  // placer scoring against it, when it was built and whether from the history.
  scheduler::SchedulerOptions placer_options_;
  std::optional<policy::WorkloadHistory> learnt_;
  std::unique_ptr<scheduler::Scheduler> learnt_placer_;
  int64_t learnt_built_ = 0;
  bool learnt_from_history_ = false;
  // The scheduler placing `job` now: the learning one, remade when due.
  scheduler::Scheduler& PlacerFor(size_t job);
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
  int preemption_rounds_ = 0;
  int64_t preemption_check_at_ = -1;  // a round asked for when a victim comes of age
  // fair-share: jobs whose last victim search found no plan, with the free GPUs, the GPUs of
  // the eligible victims and the running jobs then. The server marks such a job unschedulable
  // until the cluster changes; here it is not searched again while these stay the same.
  std::unordered_map<size_t, std::tuple<int64_t, int64_t, size_t>> no_plan_;
  int64_t lost_work_gpu_seconds_ = 0;
  Status error_;
  double busy_gpu_seconds_ = 0;
  std::optional<policy::IdleReclaimer> reclaimer_;
  int notebooks_left_ = 0;  // under the activity model, not done
  int suspended_ = 0;       // reclaimed, owner not back yet
};

std::pair<double, int64_t> Replay::PriorityKey(size_t job) const {
  const JobState& state = jobs_[job];
  const int64_t submit = state.trace->submit_seconds;
  switch (policy_) {
    case QueuePolicy::kFifo:
    case QueuePolicy::kStrictFifo:
    case QueuePolicy::kEasyBackfill:
    case QueuePolicy::kFairShare:  // ordered by the queue tree instead
    case QueuePolicy::kFairShareNoPreempt:
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

scheduler::Scheduler& Replay::PlacerFor(size_t job) {
  if (!learnt_) {
    return *placer_;
  }
  const int64_t now = events_.now();
  const bool due = learnt_placer_ == nullptr || (!learnt_from_history_ && !learnt_->empty()) ||
                   (learnt_from_history_ && now - learnt_built_ >= options_.learn_workload_seconds);
  if (due) {
    scheduler::TargetWorkload target;
    if (!learnt_->empty()) {
      target = learnt_->Target();
    } else {
      // As the server: the waiting jobs' shapes before anything has started.
      constexpr size_t kMaxPendingSampled = 1000;
      policy::WorkloadHistory waiting(learnt_->options());
      waiting.Record(jobs_[job].trace->job, MonoTime{now * 1000000000});
      for (size_t i = 0; i < waiting_.size() && i < kMaxPendingSampled; ++i) {
        waiting.Record(jobs_[waiting_[i]].trace->job, MonoTime{now * 1000000000});
      }
      target = waiting.Target();
    }
    scheduler::SchedulerOptions options = placer_options_;
    options.policy = target.empty() ? "best-fit" : placer_options_.policy;
    options.plugin_args.target_workload = std::move(target);
    Result<std::unique_ptr<scheduler::Scheduler>> made =
        scheduler::Scheduler::Create(options, scheduler::PluginRegistry::Default());
    Fail(made.status());
    if (!made.ok()) {
      return *placer_;
    }
    learnt_placer_ = std::move(made).value();
    learnt_built_ = now;
    learnt_from_history_ = !learnt_->empty();
  }
  return *learnt_placer_;
}

std::optional<std::vector<TaskPlacement>> Replay::Place(size_t job) {
  scheduler::ScheduleResult result =
      PlacerFor(job).Schedule(jobs_[job].trace->job, snapshot_, random_);
  if (!result.scheduled()) {
    return std::nullopt;
  }
  if (learnt_) {
    learnt_->Record(jobs_[job].trace->job, MonoTime{events_.now() * 1000000000});
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
  state.allocated_milli = 0;
  for (const auto& [model, milli] : AllocationByModel(placements)) {
    state.allocated_milli += milli;
  }
  // Place() has applied the placements to the snapshot already: the time since the last change
  // is integrated without them.
  allocated_gpu_seconds_ +=
      static_cast<double>(snapshot_.AllocatedGpuMilli() - state.allocated_milli) / kMilliPerUnit *
      static_cast<double>(events_.now() - last_change_);
  last_change_ = events_.now();
  state.placements = std::move(placements);
  Touch(state.placements);
  state.stretch = Stretch(state, state.placements);
  state.busy_since = events_.now();
  if (!state.activity.empty()) {
    // A session's periods are wall time: a notebook does not run collectives.
    state.stretch = 1.0;
    state.activity_at = events_.now();
    if (state.resume_requested_at >= 0) {
      state.resume_wait += events_.now() - state.resume_requested_at;
      state.resume_requested_at = -1;
    }
    if (reclaimer_) {
      Fail(reclaimer_->Track(ReclaimId(job), state.trace->job.kind));
    }
  }
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
  if (state.activity.empty()) {
    busy_gpu_seconds_ += static_cast<double>(state.allocated_milli) / kMilliPerUnit *
                         static_cast<double>(events_.now() - state.busy_since);
  } else {
    AdvanceActivity(job);
    if (reclaimer_) {
      reclaimer_->Untrack(ReclaimId(job));
    }
  }
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

// Why the job cannot run even on the empty cluster, or nullopt when it might: the whole job asks
// for more GPUs than the cluster has, or a task group's tasks (whole GPUs of an allowed model,
// CPUs, memory) fit no node, or fewer of them fit the whole cluster at once than the group has.
std::optional<std::string> Replay::NeverFits(const JobState& state) const {
  const Job& job = state.trace->job;
  if (state.gpu_milli > snapshot_.TotalGpuMilli()) {
    return fmt::format("asks for {} GPUs, the cluster has {}", state.gpu_milli / kMilliPerUnit,
                       snapshot_.TotalGpus());
  }
  const std::string models = job.allowed_gpu_models.empty()
                                 ? std::string()
                                 : fmt::format(" {}", fmt::join(job.allowed_gpu_models, "|"));
  for (const TaskGroup& group : job.groups) {
    const auto* whole = std::get_if<WholeGpus>(&group.request.gpus);
    const bool no_gpu = std::holds_alternative<NoGpu>(group.request.gpus);
    if (whole == nullptr && !no_gpu) {
      if (const auto* share = std::get_if<FractionalGpu>(&group.request.gpus);
          share != nullptr && max_gpus_per_node_ == 0) {
        return std::string("asks for a GPU share, the cluster has no GPUs");
      }
      continue;
    }
    const int per_task = whole != nullptr ? whole->count : 0;
    const HostResources& host = group.request.host;
    int64_t fitting = 0;
    int widest = 0;
    HostResources roomiest;  // of the nodes with enough GPUs
    for (const scheduler::NodeInfo& node : snapshot_.nodes()) {
      int allowed = 0;
      for (const scheduler::GpuSlot& slot : node.gpus) {
        const std::string& name = snapshot_.Model(slot.model_id).name;
        if (job.allowed_gpu_models.empty() ||
            std::find(job.allowed_gpu_models.begin(), job.allowed_gpu_models.end(), name) !=
                job.allowed_gpu_models.end()) {
          ++allowed;
        }
      }
      widest = std::max(widest, allowed);
      if (allowed >= per_task) {
        roomiest.cpu_milli = std::max(roomiest.cpu_milli, node.capacity.cpu_milli);
        roomiest.memory_mib = std::max(roomiest.memory_mib, node.capacity.memory_mib);
      }
      int64_t tasks = per_task > 0 ? allowed / per_task : group.replicas;
      if (host.cpu_milli > 0) {
        tasks = std::min(tasks, node.capacity.cpu_milli / host.cpu_milli);
      }
      if (host.memory_mib > 0) {
        tasks = std::min(tasks, node.capacity.memory_mib / host.memory_mib);
      }
      fitting += tasks;
    }
    if (fitting >= group.replicas) {
      continue;
    }
    const std::string task =
        fmt::format("{} x ({} GPU{}{}, {} mCPU, {} MiB)", group.replicas, per_task,
                    per_task == 1 ? "" : "s", models, host.cpu_milli, host.memory_mib);
    if (fitting == 0 && widest < per_task) {
      return fmt::format("{}: no node has {} GPU{}{} (most on one node: {})", task, per_task,
                         per_task == 1 ? "" : "s", models, widest);
    }
    if (fitting == 0) {
      return fmt::format(
          "{}: no node with the GPUs has the CPUs and memory for one task (most: {} mCPU, {} MiB)",
          task, roomiest.cpu_milli, roomiest.memory_mib);
    }
    return fmt::format("{}: the whole cluster holds only {} such tasks at once", task, fitting);
  }
  return std::nullopt;
}

void Replay::Arrive(size_t job) {
  ++arrived_;
  JobState& state = jobs_[job];
  if (std::optional<std::string> reason = NeverFits(state)) {
    state.unplaceable_reason = *std::move(reason);
    state.done = true;
    ++unplaceable_;
    SessionOver(state);
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
  SessionOver(state);
  ScheduleRound();
}

void Replay::SessionOver(const JobState& state) {
  if (!state.activity.empty()) {
    --notebooks_left_;
  }
}

JobId Replay::ReclaimId(size_t job) const {
  // Trace ids need not be unique; the index is.
  return JobId(fmt::format("job#{:08}", job));
}

void Replay::AdvanceActivity(size_t job) {
  JobState& state = jobs_[job];
  int64_t elapsed = events_.now() - state.activity_at;
  state.activity_at = events_.now();
  int64_t busy = 0;
  // Also steps over periods that are over (or empty) when no time passed.
  while (state.activity_segment < state.activity.size()) {
    if (state.activity_offset == state.activity[state.activity_segment]) {
      ++state.activity_segment;
      state.activity_offset = 0;
      continue;
    }
    if (elapsed == 0) {
      break;
    }
    const int64_t step =
        std::min(elapsed, state.activity[state.activity_segment] - state.activity_offset);
    busy += state.activity_segment % 2 == 0 ? step : 0;
    state.activity_offset += step;
    elapsed -= step;
  }
  busy_gpu_seconds_ +=
      static_cast<double>(state.allocated_milli) / kMilliPerUnit * static_cast<double>(busy);
}

bool Replay::BusyNow(const JobState& state) const {
  return state.activity.empty() ||
         (state.activity_segment < state.activity.size() && state.activity_segment % 2 == 0);
}

void Replay::ReclaimTick() {
  for (size_t job : running_jobs_) {
    if (jobs_[job].activity.empty()) {
      continue;
    }
    AdvanceActivity(job);
    Fail(reclaimer_->Observe(ReclaimId(job), events_.now(),
                             BusyNow(jobs_[job]) ? kBusyUtilizationMilli : kIdleUtilizationMilli));
  }
  Result<std::vector<policy::ReclaimEvent>> decided =
      reclaimer_->Decide(events_.now(), static_cast<int>(waiting_.size()));
  Fail(decided.status());
  if (decided.ok()) {
    for (const policy::ReclaimEvent& event : *decided) {
      if (event.kind != policy::ReclaimEventKind::kReclaim) {
        continue;
      }
      const auto running = std::find_if(running_jobs_.begin(), running_jobs_.end(),
                                        [&](size_t job) { return ReclaimId(job) == event.job; });
      if (running == running_jobs_.end()) {
        Fail(InternalError(fmt::format("idle reclaim of {}: not running", event.job.value())));
        continue;
      }
      Reclaim(*running);
    }
  }
  if (notebooks_left_ > 0) {
    events_.ScheduleAfter(options_.reclaim_check_seconds, [this] { ReclaimTick(); });
  }
}

void Replay::Reclaim(size_t job) {
  Stop(job, false);
  JobState& state = jobs_[job];
  ++state.reclaims;
  if (reclaimer_->options().action == policy::ReclaimAction::kPreempt) {
    ++state.preemptions;
  }
  // The owner is away for the rest of the idle period (none when the reclaimer acted on a sample
  // a burst has since overtaken): that time passes without GPUs and costs the session nothing.
  int64_t away = 0;
  if (state.activity_segment < state.activity.size() && state.activity_segment % 2 == 1) {
    away = state.activity[state.activity_segment] - state.activity_offset;
    state.remaining_seconds -= away;
    ++state.activity_segment;
    state.activity_offset = 0;
  }
  ++suspended_;
  if (state.activity_segment < state.activity.size()) {
    events_.ScheduleAfter(away, [this, job] { Resume(job); });
  } else {
    events_.ScheduleAfter(away, [this, job] { EndSuspendedSession(job); });
  }
  ScheduleRound();
}

void Replay::Resume(size_t job) {
  JobState& state = jobs_[job];
  --suspended_;
  state.resume_requested_at = events_.now();
  waiting_.push_back(job);
  ScheduleRound();
}

void Replay::EndSuspendedSession(size_t job) {
  JobState& state = jobs_[job];
  --suspended_;
  state.done = true;
  state.remaining_seconds = 0;
  state.end = events_.now();
  ++finished_;
  SessionOver(state);
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
  SessionOver(state);
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
    case QueuePolicy::kFairShareNoPreempt:
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

policy::RunningJob Replay::AsRunning(size_t job, std::vector<TaskPlacement> placements) const {
  const JobState& state = jobs_[job];
  const Job& spec = state.trace->job;
  const int64_t estimate =
      std::chrono::duration_cast<std::chrono::seconds>(spec.runtime_estimate).count();
  return {.id = spec.id,
          .queue = QueueId(QueueName(*state.trace)),
          .priority = spec.priority,
          .preemptible = spec.preemptible,
          .start_seconds = state.running ? state.started_at : events_.now(),
          .estimate_seconds = std::max<int64_t>(0, estimate),
          .placements = std::move(placements)};
}

std::vector<policy::RunningJob> Replay::RunningJobs() const {
  std::vector<policy::RunningJob> running;
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
  std::vector<policy::RunningJob> running;  // while there is a head: the jobs holding resources
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
      const policy::RunningJob candidate = AsRunning(job, *placements);
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
// models it was placed on) or taken back. Under fair-share, the first job that does not fit and
// has victims to search among gets the round's one victim search (not a job whose last search
// found nothing while nothing has changed since).
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
  bool searched = policy_ != QueuePolicy::kFairShare;
  // By queue and priority, the smallest job with no victims to search among in this round: the
  // rule allows a larger job of the same queue and priority no more victims.
  std::map<std::pair<QueueId, int>, int64_t> without_victims;
  for (const policy::PendingJob& entry : pending) {
    const size_t job = job_index_.at(entry.id);
    JobState& state = jobs_[job];
    const int64_t free = snapshot_.TotalGpuMilli() - snapshot_.AllocatedGpuMilli();
    std::optional<std::vector<TaskPlacement>> placements;
    if (state.gpu_milli <= free && !Dominated(*state.trace, failed)) {
      placements = Place(job);
    }
    if (!placements) {
      // A refusal by quota is not tried: a job that fits has idle quota to borrow, and a limit
      // is the job's own queue's to respect.
      const auto smallest = without_victims.find({entry.queue, entry.priority});
      if (!searched && (smallest == without_victims.end() || state.gpu_milli < smallest->second)) {
        const PreemptionAttempt attempt = FairSharePreempt(job, entry.queue);
        searched = attempt == PreemptionAttempt::kNoPlan || attempt == PreemptionAttempt::kStarted;
        if (attempt == PreemptionAttempt::kNoCandidates) {
          without_victims[{entry.queue, entry.priority}] = state.gpu_milli;
        }
        if (attempt == PreemptionAttempt::kStarted) {
          continue;
        }
      }
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
  for (size_t job : preempted_) {
    if (!jobs_[job].running) {
      still_waiting.push_back(job);
    }
  }
  preempted_.clear();
  waiting_ = std::move(still_waiting);
}

int64_t Replay::LastCheckpoint(const JobState& state) const {
  const int64_t interval = options_.checkpoint_interval_seconds;
  if (interval <= 0) {
    return events_.now();
  }
  return state.started_at + (events_.now() - state.started_at) / interval * interval;
}

PreemptionAttempt Replay::FairSharePreempt(size_t job, const QueueId& queue) {
  const JobState& state = jobs_[job];
  const Job& preemptor = state.trace->job;
  const int64_t now = events_.now();
  Result<policy::PreemptionRule> rule = policy::QueueTreeRule(*queues_, queue);
  Fail(rule.status());
  if (!rule.ok()) {
    return PreemptionAttempt::kNoCandidates;
  }
  std::vector<policy::RunningJob> running;
  running.reserve(running_jobs_.size());
  // What the eligible victims could free at most: no search when even that is too little.
  const int64_t free = snapshot_.TotalGpuMilli() - snapshot_.AllocatedGpuMilli();
  int64_t freeable = free;
  // When the first victim still too young to preempt comes of age.
  int64_t next_of_age = std::numeric_limits<int64_t>::max();
  for (size_t other : running_jobs_) {
    const JobState& victim = jobs_[other];
    // Placements only once a search is worth it, below.
    policy::RunningJob entry = AsRunning(other, {});
    entry.last_checkpoint_seconds = LastCheckpoint(victim);
    if (entry.preemptible && (*rule)(preemptor, entry)) {
      const int64_t of_age = entry.start_seconds + options_.min_runtime_before_preemption_seconds;
      if (of_age <= now) {
        freeable += victim.gpu_milli;
      } else {
        next_of_age = std::min(next_of_age, of_age);
      }
    }
    running.push_back(std::move(entry));
  }
  // Rounds follow arrivals and ends; the server's cycles would also come when a victim comes of
  // age, so ask for a round then.
  if (next_of_age < std::numeric_limits<int64_t>::max() &&
      (preemption_check_at_ <= now || next_of_age < preemption_check_at_)) {
    preemption_check_at_ = next_of_age;
    events_.ScheduleAt(next_of_age, [this] { ScheduleRound(); });
  }
  const std::tuple<int64_t, int64_t, size_t> situation{free, freeable, running.size()};
  if (freeable == free || freeable < state.gpu_milli) {
    return PreemptionAttempt::kNoCandidates;
  }
  if (const auto last = no_plan_.find(job); last != no_plan_.end() && last->second == situation) {
    return PreemptionAttempt::kUnchanged;
  }
  for (size_t i = 0; i < running.size(); ++i) {
    running[i].placements = jobs_[running_jobs_[i]].placements;
  }
  Result<policy::PreemptionSearch> search = policy::PreemptionSearch::Create(
      *placer_, std::move(*rule),
      {.min_runtime_seconds = options_.min_runtime_before_preemption_seconds});
  Fail(search.status());
  if (!search.ok()) {
    return PreemptionAttempt::kNoPlan;
  }
  const Result<policy::PreemptionDecision> decision =
      search->Find(snapshot_, preemptor, running, now, random_);
  Fail(decision.status());
  if (!decision.ok() || !decision->plan || decision->plan->victims.empty()) {
    // The next round, at once, is the server's next cycle: it searches for the next job.
    no_plan_[job] = situation;
    ScheduleRound();
    return PreemptionAttempt::kNoPlan;
  }
  no_plan_.erase(job);
  for (const JobId& id : decision->plan->victims) {
    const size_t victim = job_index_.at(id);
    JobState& stopped = jobs_[victim];
    // Stop keeps all the work done; the run resumes from its last checkpoint instead.
    const int64_t resumes_with =
        stopped.remaining_seconds - WorkDone(stopped, LastCheckpoint(stopped) - stopped.started_at);
    Stop(victim, /*preempted=*/true);
    stopped.remaining_seconds = resumes_with;
  }
  ++preemption_rounds_;
  lost_work_gpu_seconds_ += decision->plan->lost_work_gpu_seconds;
  // The victims wait again; the next round, at once, is the server's next cycle: it may restart
  // them on GPUs the preemptor left, or search for the next job.
  ScheduleRound();
  std::optional<std::vector<TaskPlacement>> placements = Place(job);
  if (!placements) {
    Fail(InternalError(fmt::format("job \"{}\": does not fit on the GPUs its {} victims freed",
                                   preemptor.id.value(), decision->plan->victims.size())));
    return PreemptionAttempt::kNoPlan;
  }
  const policy::GpuMilliByModel allocation = AllocationByModel(*placements);
  const Result<policy::Admission> admission = queues_->CheckAdmission(queue, allocation);
  Fail(admission.status());
  if (!admission.ok() || !admission->admitted()) {
    // A same-queue victim's priority does not lift the queue's limit: the job waits.
    Unplace(*placements);
    return PreemptionAttempt::kNoPlan;
  }
  Start(job, std::move(*placements));
  Fail(queues_->Charge(preemptor.id, queue, allocation));
  jobs_[job].charged = true;
  return PreemptionAttempt::kStarted;
}

void Replay::Sample() {
  ReplaySample sample;
  sample.time_seconds = events_.now();
  sample.gpus_allocated = static_cast<double>(snapshot_.AllocatedGpuMilli()) / kMilliPerUnit;
  int64_t busy_milli = 0;
  for (size_t job : running_jobs_) {
    if (!jobs_[job].activity.empty()) {
      AdvanceActivity(job);
    }
    busy_milli += BusyNow(jobs_[job]) ? jobs_[job].allocated_milli : 0;
  }
  sample.gpus_busy = static_cast<double>(busy_milli) / kMilliPerUnit;
  sample.fragmentation_gpus = total_fragmentation_ / kMilliPerUnit;
  sample.queue_length = static_cast<int>(waiting_.size());
  sample.running = running_;
  series_.push_back(sample);
  if (arrived_ < jobs_.size() || running_ > 0 || !waiting_.empty() || suspended_ > 0) {
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
  Random activity_random(options_.seed ^ kActivitySeedSalt);
  for (size_t i = 0; i < trace_.jobs.size(); ++i) {
    JobState& state = jobs_[i];
    state.trace = &trace_.jobs[i];
    state.gpu_milli = state.trace->job.RequestedGpuMilliTotal();
    state.remaining_seconds = state.trace->duration_seconds;
    if (options_.interactive_activity && state.trace->job.kind == JobKind::kInteractive &&
        state.remaining_seconds > 0) {
      state.activity =
          DrawActivity(state.remaining_seconds, *options_.interactive_activity, activity_random);
      ++notebooks_left_;
    }
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
  if (options_.idle_reclaim) {
    GPUFLEET_ASSIGN_OR_RETURN(reclaimer_, policy::IdleReclaimer::Create(*options_.idle_reclaim));
    if (notebooks_left_ > 0) {
      events_.ScheduleAt(0, [this] { ReclaimTick(); });
    }
  }
  while (events_.RunNext()) {
    // A queue that can never drain (nothing running, nothing arriving, no reclaimed notebook to
    // come back) ends the run.
    if (running_ == 0 && arrived_ == jobs_.size() && !waiting_.empty() && !round_pending_ &&
        suspended_ == 0 && (events_.empty() || events_.next_time() > events_.now())) {
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
  result.preemption_rounds = preemption_rounds_;
  result.lost_work_gpu_seconds = lost_work_gpu_seconds_;
  std::vector<double> delays;
  std::vector<double> completions;
  std::vector<double> session_waits;
  std::vector<double> session_stretches;
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
    result.preemptions += state.preemptions;
    outcome.nodes = state.nodes;
    outcome.stretch = state.stretch;
    outcome.queue = QueueName(*state.trace);
    outcome.timed_out = state.timed_out;
    outcome.reserved_start_seconds = state.reserved_start;
    outcome.interactive = state.trace->job.kind == JobKind::kInteractive;
    outcome.duration_seconds = state.trace->duration_seconds;
    outcome.reclaims = state.reclaims;
    outcome.resume_wait_seconds = state.resume_wait;
    outcome.unplaceable_reason = state.unplaceable_reason;
    if (outcome.interactive) {
      InteractiveOutcome& notebooks = result.interactive;
      ++notebooks.sessions;
      notebooks.reclaims += state.reclaims;
      notebooks.reclaimed += state.reclaims > 0 ? 1 : 0;
      notebooks.resume_wait_seconds += state.resume_wait;
      if (state.first_start >= 0) {
        session_waits.push_back(static_cast<double>(state.resume_wait));
      }
      if (state.end >= 0 && !state.timed_out) {
        ++notebooks.finished;
        session_stretches.push_back(outcome.SessionStretch());
      }
    }
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
  result.allocated_gpu_seconds = allocated_gpu_seconds_;
  result.busy_gpu_seconds = busy_gpu_seconds_;
  result.interactive.mean_resume_wait_seconds =
      result.interactive.reclaims > 0
          ? static_cast<double>(result.interactive.resume_wait_seconds) /
                result.interactive.reclaims
          : 0.0;
  result.interactive.session_resume_wait = Summarize(std::move(session_waits));
  result.interactive.session_stretch = Summarize(std::move(session_stretches));
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

Status ValidateInteractiveOptions(const ReplayOptions& options) {
  if (options.interactive_activity) {
    const InteractiveActivity& activity = *options.interactive_activity;
    if (!(activity.busy_fraction > 0 && activity.busy_fraction <= 1)) {
      return InvalidArgumentError(fmt::format(
          "interactive_activity.busy_fraction: {} (must be in (0, 1])", activity.busy_fraction));
    }
    if (activity.mean_busy_seconds <= 0) {
      return InvalidArgumentError(
          fmt::format("interactive_activity.mean_busy_seconds: {} (must be positive)",
                      activity.mean_busy_seconds));
    }
  }
  if (options.idle_reclaim) {
    GPUFLEET_RETURN_IF_ERROR(options.idle_reclaim->Validate());
    if (!options.interactive_activity) {
      return InvalidArgumentError("idle_reclaim: needs interactive_activity");
    }
    if (options.reclaim_check_seconds < 1 ||
        options.reclaim_check_seconds > options.idle_reclaim->max_sample_gap_seconds) {
      return InvalidArgumentError(
          fmt::format("reclaim_check_seconds: {} (must be in 1..{}, the reclaimer's "
                      "max_sample_gap_seconds)",
                      options.reclaim_check_seconds, options.idle_reclaim->max_sample_gap_seconds));
    }
  }
  return Status::Ok();
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

const std::vector<std::string>& QueuePolicyNames() {
  static const std::vector<std::string> kNames = {
      "fifo",        "sjf",           "tiresias",   "gpufleet",
      "strict-fifo", "easy-backfill", "fair-share", "fair-share-no-preempt"};
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
  if (options.min_runtime_before_preemption_seconds < 0) {
    return InvalidArgumentError(
        fmt::format("min_runtime_before_preemption_seconds: {} (must be >= 0)",
                    options.min_runtime_before_preemption_seconds));
  }
  if (options.checkpoint_interval_seconds < 0) {
    return InvalidArgumentError(fmt::format("checkpoint_interval_seconds: {} (must be >= 0)",
                                            options.checkpoint_interval_seconds));
  }
  GPUFLEET_RETURN_IF_ERROR(ValidateInteractiveOptions(options));
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
    scheduler_options.AddCollectiveCost(options.fabric);
  }
  scheduler::SchedulerOptions first_options = scheduler_options;
  if (options.learn_workload_seconds > 0 && policy::NeedsTargetWorkload(scheduler_options.policy)) {
    // The trace's mix is not known to a learning policy; its what-ifs place as best-fit.
    first_options.policy = "best-fit";
  }
  GPUFLEET_ASSIGN_OR_RETURN(
      std::unique_ptr<scheduler::Scheduler> placer,
      scheduler::Scheduler::Create(first_options, scheduler::PluginRegistry::Default()));
  const auto policy = static_cast<QueuePolicy>(found - names.begin());
  std::optional<policy::QueueTree> queues;
  if (policy == QueuePolicy::kFairShare || policy == QueuePolicy::kFairShareNoPreempt) {
    GPUFLEET_ASSIGN_OR_RETURN(queues, BuildQueueTree(adapted, options, snapshot));
  }
  Replay replay(adapted, options, policy, std::move(snapshot), std::move(placer),
                std::move(workload), std::move(queues), scheduler_options);
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
