// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/failure_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "gpufleet/core/random.h"
#include "gpufleet/reliability/inventory.h"
#include "gpufleet/scheduler/registry.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/sim/event_queue.h"
#include "gpufleet/sim/parallel.h"

namespace gpufleet::sim {
namespace {

using reliability::Device;
using reliability::DeviceKind;
using reliability::ExitReason;
using scheduler::TaskPlacement;

constexpr int64_t kHourSeconds = 3600;
constexpr int64_t kNanosPerSecond = 1'000'000'000;

// The event queue as the monitor's clock: simulated seconds as nanoseconds.
class EventQueueClock final : public Clock {
 public:
  explicit EventQueueClock(const EventQueue& events) : events_(events) {}
  MonoTime Now() const override { return MonoTime{events_.now() * kNanosPerSecond}; }

 private:
  const EventQueue& events_;
};

// The XIDs a failing GPU reports, weighted roughly after the Llama 3 interruption causes (GPU
// and NVLink faults, HBM, GSP) and the catalog's drain classes.
struct WeightedXid {
  int xid;
  double weight;
};
constexpr WeightedXid kHardwareXids[] = {{79, 0.25}, {48, 0.20},  {94, 0.15}, {74, 0.15},
                                         {63, 0.10}, {119, 0.10}, {95, 0.05}};
constexpr int kApplicationXids[] = {13, 31, 43};

// Seeds for the independent random streams of a run, so that the job stream is the same with
// and without quarantine whatever the failures do.
enum class Stream : uint64_t {
  kFaults = 1,
  kArrivals = 2,
  kFailures = 3,
  kPlacement = 4,
  kNodeFaults = 5,
  kDiagnostics = 6,
};

// Why a GPU is kept out of the scheduler's snapshot; a GPU can be held for several at once.
enum HoldReason : uint8_t {
  kHoldQuarantine = 1,
  kHoldDiagnostic = 2,
  kHoldRepair = 4,
};

uint64_t StreamSeed(uint64_t seed, Stream stream) {
  return seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(stream);
}

// An exponential draw with the given rate per second; infinity for a zero rate.
double ExponentialSeconds(Random& random, double rate_per_second) {
  if (rate_per_second <= 0) {
    return std::numeric_limits<double>::infinity();
  }
  return -std::log1p(-random.UniformDouble()) / rate_per_second;
}

// `gpus` whole GPUs as one task, or as equal tasks of the widest size a node holds that divides
// `gpus`.
Job WholeGpuJob(const std::string& id, int gpus, int gpus_per_node) {
  int width = std::min(gpus, gpus_per_node);
  while (gpus % width != 0) {
    --width;
  }
  Job job;
  job.id = JobId(id);
  job.groups.push_back(TaskGroup{"workers", gpus / width, TaskRequest{{}, WholeGpus{width}}});
  return job;
}

struct SimJob {
  std::string id;
  Job spec;
  int gpus = 0;
  bool large = false;
  int64_t arrival = 0;
  int64_t remaining_seconds = 0;  // stream jobs: work left
  int runs = 0;
  bool running = false;
  uint64_t epoch = 0;  // bumped when a run stops; stale events are ignored
  int64_t started_at = 0;
  std::vector<TaskPlacement> placements;
  std::vector<TaskPlacement> previous_placements;  // the large job's last run
  std::vector<int> gpus_held;                      // inventory indices of the current run
  double speed = 1;                                // of the current run: its slowest GPU's
  int64_t checkpoint_interval_seconds = 0;         // the large job's, for the current run
};

// One run of the failure simulator. Not thread-safe; not movable (the monitor holds references
// into it).
class FailureSim {
 public:
  FailureSim(const std::vector<JobShape>& shapes, const FailureSimOptions& options,
             scheduler::ClusterSnapshot snapshot, reliability::FleetInventory inventory,
             std::unique_ptr<scheduler::Scheduler> placer)
      : shapes_(shapes),
        options_(options),
        snapshot_(std::move(snapshot)),
        inventory_(std::move(inventory)),
        placer_(std::move(placer)),
        clock_(events_),
        fault_random_(StreamSeed(options.seed, Stream::kFaults)),
        arrival_random_(StreamSeed(options.seed, Stream::kArrivals)),
        failure_random_(StreamSeed(options.seed, Stream::kFailures)),
        placement_random_(StreamSeed(options.seed, Stream::kPlacement)),
        node_fault_random_(StreamSeed(options.seed, Stream::kNodeFaults)),
        diagnostic_random_(StreamSeed(options.seed, Stream::kDiagnostics)) {}

  FailureSim(const FailureSim&) = delete;
  FailureSim& operator=(const FailureSim&) = delete;

  Result<FailureSimResult> Run();

 private:
  void InjectFaults();
  Status CreateJobs();
  void Arrive(size_t job);
  void RequestRound();
  void Round();
  // Where the next run of `job` goes (applied to the snapshot), or nullopt when it does not fit.
  std::optional<std::vector<TaskPlacement>> Place(size_t job);
  bool TryStart(size_t job);
  void DrawEnd(size_t job);
  void Fail(size_t job, uint64_t epoch);
  void Complete(size_t job, uint64_t epoch);
  // Ends the current run of `job` now.
  void StopRun(size_t job, ExitReason reason, std::vector<reliability::XidEvent> xids,
               std::vector<reliability::HealthEvent> health = {});
  void Requeue(size_t job);
  void AccountLargeRun(const SimJob& job, bool kept_in_progress);
  void Evaluate();
  void Quarantined(const reliability::QuarantineDecision& decision);
  // Holds: AddHold blocks an idle GPU in the snapshot at once and a busy one when its job ends;
  // DropHold gives it back when no reason is left.
  void AddHold(int gpu, uint8_t reason);
  void DropHold(int gpu, uint8_t reason);
  void Hold(int gpu);
  void Unhold(int gpu);
  TaskPlacement HoldOf(int gpu) const;
  // Spare nodes for the large job: whole free nodes held back from the stream.
  void ReserveSpare(int node);
  void ReleaseSpare(int node);
  void ReleaseSpares();
  void TopUpSpares(const std::vector<int>& nodes);
  bool WholeAndFree(int node) const;
  // Node and NIC faults: a Poisson stream over the fleet.
  void ScheduleNodeFault();
  void NodeFault();
  // The loop: suspect, diagnose, quarantine or readmit.
  bool LoopEnabled() const;
  void Suspect(int gpu, bool new_evidence);
  void StartDiagnostic(int gpu);
  void DiagnosticDone(int gpu);
  void DrainLargeAtCheckpoint();
  void CompareGangs();
  void Found(int gpu);
  int64_t SuggestedCheckpointSeconds() const;
  int64_t LargeCheckpointInterval() const;
  // Wall seconds one checkpoint interval of progress takes at the run's speed.
  int64_t LargeComputeSeconds(const SimJob& job) const;
  void AccrueBusy();
  void Finish();
  // Keeps the first error of a monitor call that cannot fail unless the simulator has a bug.
  void Check(const Status& status);
  std::vector<int> GpusOf(const Device& device) const;
  HourStats& HourOf(int64_t time);

  const std::vector<JobShape>& shapes_;
  const FailureSimOptions& options_;
  scheduler::ClusterSnapshot snapshot_;
  reliability::FleetInventory inventory_;
  std::unique_ptr<scheduler::Scheduler> placer_;
  EventQueue events_;
  EventQueueClock clock_;
  std::optional<reliability::ReliabilityMonitor> monitor_;
  Random fault_random_;
  Random arrival_random_;
  Random failure_random_;
  Random placement_random_;
  Random node_fault_random_;
  Random diagnostic_random_;

  int gpus_per_node_ = 0;
  std::vector<std::vector<int>> node_gpus_;  // snapshot node -> inventory GPU index per slot
  std::vector<double> rate_per_hour_;        // per GPU
  std::vector<int> bad_index_;               // per GPU: index into result_.bad_gpus, or -1
  std::vector<int> slow_index_;              // per GPU: index into result_.slow_gpus, or -1
  std::vector<double> speed_;                // per GPU: 1, or 1 / slow_factor
  std::vector<int> owner_;                   // per GPU: job running on it, or -1
  std::vector<uint8_t> hold_reasons_;        // per GPU: HoldReason bits
  std::vector<bool> held_;                   // per GPU: blocked in the snapshot
  std::vector<std::optional<TaskPlacement>> spare_;  // per node: its hold as a spare
  int spares_held_ = 0;
  std::vector<int64_t> repair_until_;  // per node
  // Per GPU: a diagnostic is wanted (once the job ends) or running; when it last passed; the
  // attribution's failure count at its last suspicion.
  std::vector<bool> diagnostic_wanted_;
  std::vector<bool> diagnosing_;
  std::vector<int64_t> last_clean_;
  std::vector<int> suspected_failures_;
  uint64_t large_drain_epoch_ = std::numeric_limits<uint64_t>::max();
  double large_run_hours_ = 0;  // the large job's runs so far, for its measured failure rate
  reliability::FleetRates last_rates_;

  std::vector<SimJob> jobs_;
  std::vector<size_t> waiting_;
  std::optional<size_t> large_;
  bool large_waiting_ = false;
  int64_t large_waiting_since_ = 0;
  int64_t large_first_start_ = -1;
  bool round_pending_ = false;

  int busy_gpus_ = 0;
  int64_t busy_since_ = 0;
  double busy_gpu_seconds_ = 0;
  std::map<Device, size_t> flagged_index_;
  Status internal_error_;
  FailureSimResult result_;
};

void FailureSim::Check(const Status& status) {
  if (!status.ok() && internal_error_.ok()) {
    internal_error_ = InternalError("failure simulator: " + status.ToString());
  }
}

std::vector<int> FailureSim::GpusOf(const Device& device) const {
  const int index = inventory_.IndexOf(device);
  if (index < 0) {
    return {};
  }
  return device.kind == DeviceKind::kGpu ? std::vector<int>{index} : inventory_.gpus_of_node(index);
}

HourStats& FailureSim::HourOf(int64_t time) {
  const size_t hour = std::min(static_cast<size_t>(std::max<int64_t>(time, 0) / kHourSeconds),
                               result_.hours.size() - 1);
  return result_.hours[hour];
}

void FailureSim::AccrueBusy() {
  // Spread busy GPU-seconds over the hours they fall in.
  int64_t from = busy_since_;
  const int64_t to = events_.now();
  busy_gpu_seconds_ += static_cast<double>(busy_gpus_) * static_cast<double>(to - from);
  while (from < to) {
    const int64_t hour_end = (from / kHourSeconds + 1) * kHourSeconds;
    const int64_t until = std::min(hour_end, to);
    HourOf(from).busy_gpu_hours +=
        static_cast<double>(busy_gpus_) * static_cast<double>(until - from) / kHourSeconds;
    from = until;
  }
  busy_since_ = to;
}

void FailureSim::InjectFaults() {
  const FaultModel& faults = options_.faults;
  const int gpus = inventory_.gpu_count();
  rate_per_hour_.assign(gpus, faults.base_rate_per_gpu_hour);
  bad_index_.assign(gpus, -1);
  std::vector<int> order(gpus);
  for (int i = 0; i < gpus; ++i) {
    order[i] = i;
  }
  fault_random_.Shuffle(order);
  const int bad = static_cast<int>(std::llround(faults.bad_gpu_share * gpus));
  std::vector<int> chosen(order.begin(), order.begin() + bad);
  std::sort(chosen.begin(), chosen.end());
  const double log_min = std::log(faults.bad_multiplier_min);
  const double log_max = std::log(faults.bad_multiplier_max);
  for (int gpu : chosen) {
    const double multiplier =
        std::exp(log_min + (log_max - log_min) * fault_random_.UniformDouble());
    rate_per_hour_[gpu] *= multiplier;
    bad_index_[gpu] = static_cast<int>(result_.bad_gpus.size());
    result_.bad_gpus.push_back(BadGpu{inventory_.gpu_uuid(gpu).value(), multiplier});
  }
  // Fail-slow GPUs come from the rest, so that a GPU is bad, slow or sound.
  slow_index_.assign(gpus, -1);
  speed_.assign(gpus, 1.0);
  const int slow =
      std::min(gpus - bad, static_cast<int>(std::llround(faults.slow_gpu_share * gpus)));
  std::vector<int> slow_chosen(order.begin() + bad, order.begin() + bad + slow);
  std::sort(slow_chosen.begin(), slow_chosen.end());
  for (int gpu : slow_chosen) {
    speed_[gpu] = 1.0 / faults.slow_factor;
    slow_index_[gpu] = static_cast<int>(result_.slow_gpus.size());
    result_.slow_gpus.push_back(SlowGpu{inventory_.gpu_uuid(gpu).value(), faults.slow_factor});
  }
}

Status FailureSim::CreateJobs() {
  const int stream_gpus = inventory_.gpu_count() - options_.large_job.gpus;
  std::vector<JobShape> usable;
  for (const JobShape& shape : shapes_) {
    if (shape.gpus >= 1 && shape.gpus <= stream_gpus && shape.duration_seconds > 0) {
      usable.push_back(
          JobShape{shape.gpus, std::min(shape.duration_seconds, options_.max_job_seconds)});
    }
  }
  if (usable.empty()) {
    return InvalidArgumentError(
        fmt::format("shapes: no job of 1..{} GPUs with a positive duration", stream_gpus));
  }
  if (options_.large_job.gpus > 0) {
    SimJob large;
    large.id = "large-training";
    large.large = true;
    large.gpus = options_.large_job.gpus;
    large.spec = WholeGpuJob(large.id, large.gpus, gpus_per_node_);
    large_ = jobs_.size();
    jobs_.push_back(std::move(large));
    events_.ScheduleAt(options_.large_job.start_seconds, [this] {
      large_waiting_ = true;
      RequestRound();
    });
  }
  double mean_gpu_seconds = 0;
  for (const JobShape& shape : usable) {
    mean_gpu_seconds +=
        static_cast<double>(shape.gpus) * static_cast<double>(shape.duration_seconds);
  }
  mean_gpu_seconds /= static_cast<double>(usable.size());
  // Poisson arrivals carrying target_load x the stream's GPUs of work per second.
  const double arrivals_per_second = options_.target_load * stream_gpus / mean_gpu_seconds;
  double time = ExponentialSeconds(arrival_random_, arrivals_per_second);
  while (time < static_cast<double>(options_.duration_seconds)) {
    const JobShape& shape = usable[arrival_random_.Uniform(usable.size())];
    SimJob job;
    job.id = fmt::format("job-{}", jobs_.size());
    job.gpus = shape.gpus;
    job.spec = WholeGpuJob(job.id, shape.gpus, gpus_per_node_);
    job.arrival = static_cast<int64_t>(time);
    job.remaining_seconds = shape.duration_seconds;
    jobs_.push_back(std::move(job));
    time += ExponentialSeconds(arrival_random_, arrivals_per_second);
  }
  for (size_t i = 0; i < jobs_.size(); ++i) {
    if (!jobs_[i].large) {
      events_.ScheduleAt(jobs_[i].arrival, [this, i] { Arrive(i); });
    }
  }
  return Status::Ok();
}

void FailureSim::Arrive(size_t job) {
  ++result_.jobs_arrived;
  waiting_.push_back(job);
  RequestRound();
}

void FailureSim::RequestRound() {
  if (round_pending_) {
    return;
  }
  // Every change at one instant shares one round, run after them.
  round_pending_ = true;
  events_.ScheduleAfter(0, [this] {
    round_pending_ = false;
    Round();
  });
}

void FailureSim::Round() {
  if (large_waiting_) {
    ReleaseSpares();
    if (!TryStart(*large_)) {
      return;  // nothing starts ahead of the large job
    }
    large_waiting_ = false;
    // Spares near the job first: nodes of the leaves it runs in, then any.
    std::set<int> leaves;
    for (const TaskPlacement& placement : jobs_[*large_].placements) {
      leaves.insert(inventory_.leaf_of_node(placement.node));
    }
    std::vector<int> near;
    std::vector<int> far;
    for (int node = 0; node < inventory_.node_count(); ++node) {
      (leaves.count(inventory_.leaf_of_node(node)) > 0 ? near : far).push_back(node);
    }
    TopUpSpares(near);
    TopUpSpares(far);
    // Waiting before the first start is queueing, not lost training time.
    if (large_first_start_ < 0) {
      large_first_start_ = events_.now();
    } else {
      result_.large_job.waiting_hours +=
          static_cast<double>(events_.now() - large_waiting_since_) / kHourSeconds;
    }
  }
  int64_t free = (snapshot_.TotalGpuMilli() - snapshot_.AllocatedGpuMilli()) / kMilliPerUnit;
  int smallest_failed = std::numeric_limits<int>::max();
  std::vector<size_t> still_waiting;
  still_waiting.reserve(waiting_.size());
  for (size_t job : waiting_) {
    const int gpus = jobs_[job].gpus;
    // A job no smaller than one that did not fit does not fit either.
    if (gpus > free || gpus >= smallest_failed || free == 0) {
      still_waiting.push_back(job);
      continue;
    }
    if (TryStart(job)) {
      free -= gpus;
    } else {
      smallest_failed = gpus;
      still_waiting.push_back(job);
    }
  }
  waiting_ = std::move(still_waiting);
}

std::optional<std::vector<TaskPlacement>> FailureSim::Place(size_t index) {
  SimJob& job = jobs_[index];
  std::vector<TaskPlacement> kept;
  if (job.large) {
    // A restarted training job keeps the nodes it had that are still whole and free; the
    // scheduler replaces the rest (a node with a quarantined GPU, say).
    for (const TaskPlacement& placement : job.previous_placements) {
      if (snapshot_.Apply(placement).ok()) {
        kept.push_back(placement);
      }
    }
  }
  const int missing = job.spec.TaskCount() - static_cast<int>(kept.size());
  if (missing == 0) {
    return kept;
  }
  Job rest = job.spec;
  rest.groups.front().replicas = missing;
  const scheduler::ScheduleResult placed = placer_->Schedule(rest, snapshot_, placement_random_);
  if (!placed.scheduled()) {
    for (const TaskPlacement& placement : kept) {
      snapshot_.Revert(placement);
    }
    return std::nullopt;
  }
  kept.insert(kept.end(), placed.placements.begin(), placed.placements.end());
  return kept;
}

bool FailureSim::TryStart(size_t index) {
  SimJob& job = jobs_[index];
  std::optional<std::vector<TaskPlacement>> placements = Place(index);
  if (!placements) {
    return false;
  }
  AccrueBusy();
  job.placements = std::move(*placements);
  job.gpus_held.clear();
  std::vector<GpuUuid> uuids;
  for (const TaskPlacement& placement : job.placements) {
    for (const scheduler::GpuAssignment& assignment : placement.gpus) {
      const int gpu = node_gpus_[placement.node][assignment.gpu];
      job.gpus_held.push_back(gpu);
      owner_[gpu] = static_cast<int>(index);
      uuids.push_back(inventory_.gpu_uuid(gpu));
    }
  }
  busy_gpus_ += static_cast<int>(job.gpus_held.size());
  job.speed = 1;
  for (int gpu : job.gpus_held) {
    job.speed = std::min(job.speed, speed_[gpu]);
  }
  if (job.large) {
    job.checkpoint_interval_seconds = LargeCheckpointInterval();
  }
  job.running = true;
  job.started_at = events_.now();
  Check(monitor_->engine().JobStarted(JobId(job.id), job.runs, uuids));
  ++job.runs;
  ++result_.runs_started;
  if (job.large) {
    ++result_.large_job.runs;
  }
  DrawEnd(index);
  return true;
}

// Draws when the run fails (the GPUs' and the application's hazards add up) and schedules that,
// or its completion, whichever comes first before the end of the run.
void FailureSim::DrawEnd(size_t index) {
  SimJob& job = jobs_[index];
  double hazard_per_hour = options_.faults.app_failure_rate_per_job_hour;
  for (int gpu : job.gpus_held) {
    hazard_per_hour += rate_per_hour_[gpu];
  }
  const double until_failure = ExponentialSeconds(failure_random_, hazard_per_hour / kHourSeconds);
  const int64_t now = events_.now();
  const uint64_t epoch = job.epoch;
  const double horizon = static_cast<double>(options_.duration_seconds);
  // A gang runs at the speed of its slowest GPU.
  const double completion =
      job.large ? std::numeric_limits<double>::infinity()
                : static_cast<double>(now) +
                      std::ceil(static_cast<double>(job.remaining_seconds) / job.speed);
  const double failure = static_cast<double>(now) + std::max(1.0, std::ceil(until_failure));
  if (failure < completion && failure < horizon) {
    events_.ScheduleAt(static_cast<int64_t>(failure), [this, index, epoch] { Fail(index, epoch); });
  } else if (completion < horizon) {
    events_.ScheduleAt(static_cast<int64_t>(completion),
                       [this, index, epoch] { Complete(index, epoch); });
  }
}

void FailureSim::Fail(size_t index, uint64_t epoch) {
  SimJob& job = jobs_[index];
  if (!job.running || job.epoch != epoch) {
    return;
  }
  double hardware = 0;
  for (int gpu : job.gpus_held) {
    hardware += rate_per_hour_[gpu];
  }
  const double app = options_.faults.app_failure_rate_per_job_hour;
  double draw = failure_random_.UniformDouble() * (hardware + app);
  std::vector<reliability::XidEvent> xids;
  ExitReason reason = ExitReason::kAppError;
  if (draw < hardware) {
    int culprit = job.gpus_held.back();
    for (int gpu : job.gpus_held) {
      if (draw < rate_per_hour_[gpu]) {
        culprit = gpu;
        break;
      }
      draw -= rate_per_hour_[gpu];
    }
    ++result_.hardware_failures;
    if (bad_index_[culprit] >= 0) {
      ++result_.bad_gpu_failures;
      ++result_.bad_gpus[bad_index_[culprit]].failures_caused;
    }
    if (failure_random_.UniformDouble() < options_.faults.xid_share) {
      double pick = failure_random_.UniformDouble();
      int xid = kHardwareXids[0].xid;
      for (const WeightedXid& weighted : kHardwareXids) {
        if (pick < weighted.weight) {
          xid = weighted.xid;
          break;
        }
        pick -= weighted.weight;
      }
      xids.push_back(reliability::XidEvent{inventory_.gpu_uuid(culprit), xid});
      reason = ExitReason::kInfraError;
    } else {
      reason = failure_random_.Uniform(2) == 0 ? ExitReason::kHang : ExitReason::kInfraError;
    }
  } else {
    ++result_.app_failures;
    if (failure_random_.UniformDouble() < options_.faults.app_xid_share) {
      const int gpu = job.gpus_held[failure_random_.Uniform(job.gpus_held.size())];
      const int xid = kApplicationXids[failure_random_.Uniform(std::size(kApplicationXids))];
      xids.push_back(reliability::XidEvent{inventory_.gpu_uuid(gpu), xid});
    }
  }
  if (job.large) {
    ++result_.large_job.failures;
  }
  std::vector<int> named;
  for (const reliability::XidEvent& xid : xids) {
    if (reason == ExitReason::kInfraError) {
      named.push_back(inventory_.GpuIndex(xid.gpu.value()));
    }
  }
  StopRun(index, reason, std::move(xids));
  // A stop-time check of the GPU the failure names, before the job is placed again.
  for (int gpu : named) {
    Suspect(gpu, true);
  }
  Requeue(index);
}

void FailureSim::Complete(size_t index, uint64_t epoch) {
  SimJob& job = jobs_[index];
  if (!job.running || job.epoch != epoch) {
    return;
  }
  StopRun(index, ExitReason::kSucceeded, {});
  job.remaining_seconds = 0;
  ++result_.jobs_finished;
  RequestRound();
}

void FailureSim::AccountLargeRun(const SimJob& job, bool kept_in_progress) {
  const LargeJobSpec& spec = options_.large_job;
  const int64_t elapsed = events_.now() - job.started_at;
  const int64_t restart = std::min(elapsed, spec.restart_seconds);
  const int64_t span = elapsed - restart;
  // Each cycle computes one interval of progress (slower with a fail-slow GPU) and writes it.
  const int64_t compute = LargeComputeSeconds(job);
  const int64_t cycle = compute + spec.checkpoint_write_seconds;
  const int64_t cycles = span / cycle;
  const int64_t rest = span - cycles * cycle;
  const int64_t in_progress = std::min(rest, compute);
  const int64_t writing = cycles * spec.checkpoint_write_seconds + (rest - in_progress);
  const double in_progress_work = static_cast<double>(in_progress) * job.speed;
  LargeJobStats& stats = result_.large_job;
  const double hour = kHourSeconds;
  stats.restart_hours += static_cast<double>(restart) / hour;
  stats.checkpoint_hours += static_cast<double>(writing) / hour;
  stats.useful_hours += (static_cast<double>(cycles * job.checkpoint_interval_seconds) +
                         (kept_in_progress ? in_progress_work : 0)) /
                        hour;
  stats.slowed_hours += (static_cast<double>(cycles * (compute - job.checkpoint_interval_seconds)) +
                         static_cast<double>(in_progress) - in_progress_work) /
                        hour;
  if (!kept_in_progress) {
    stats.lost_hours += in_progress_work / hour;
  }
}

void FailureSim::StopRun(size_t index, ExitReason reason, std::vector<reliability::XidEvent> xids,
                         std::vector<reliability::HealthEvent> health) {
  SimJob& job = jobs_[index];
  AccrueBusy();
  std::vector<int> nodes;
  for (const TaskPlacement& placement : job.placements) {
    snapshot_.Release(placement);
    nodes.push_back(placement.node);
  }
  if (job.large) {
    job.previous_placements = std::move(job.placements);
  }
  job.placements.clear();
  busy_gpus_ -= static_cast<int>(job.gpus_held.size());
  for (int gpu : job.gpus_held) {
    owner_[gpu] = -1;
    if (bad_index_[gpu] >= 0) {
      result_.bad_gpus[bad_index_[gpu]].busy_hours +=
          static_cast<double>(events_.now() - job.started_at) / kHourSeconds;
    }
    if (hold_reasons_[gpu] != 0) {
      Hold(gpu);
    }
    if (diagnostic_wanted_[gpu]) {
      StartDiagnostic(gpu);
    }
  }
  job.gpus_held.clear();
  job.running = false;
  ++job.epoch;
  TopUpSpares(nodes);
  const bool hardware = reason == ExitReason::kInfraError || reason == ExitReason::kHang;
  HourStats& hour = HourOf(events_.now());
  ++hour.runs_ended;
  hour.failed_runs += hardware;
  hour.app_failed_runs += reason == ExitReason::kAppError;
  const int64_t ran = events_.now() - job.started_at;
  if (job.large) {
    AccountLargeRun(job, false);
    large_run_hours_ += static_cast<double>(ran) / kHourSeconds;
  } else if (reason != ExitReason::kSucceeded) {
    // Resume from the last checkpoint of the work done at the run's speed.
    const auto done = static_cast<int64_t>(static_cast<double>(ran) * job.speed);
    job.remaining_seconds -=
        done / options_.stream_checkpoint_seconds * options_.stream_checkpoint_seconds;
  }
  Check(
      monitor_->engine()
          .JobEnded(reliability::JobEnd{JobId(job.id), reason, std::move(xids), std::move(health)})
          .status());
}

void FailureSim::Requeue(size_t index) {
  ++result_.requeues;
  if (jobs_[index].large) {
    large_waiting_ = true;
    large_waiting_since_ = events_.now();
  } else {
    // Back at the head of the queue: it was admitted before anything waiting now.
    waiting_.insert(waiting_.begin(), index);
  }
  RequestRound();
}

// The placement that blocks `gpu`'s slot in the snapshot.
TaskPlacement FailureSim::HoldOf(int gpu) const {
  const int node = inventory_.node_of_gpu(gpu);
  int slot = 0;
  while (node_gpus_[node][slot] != gpu) {
    ++slot;
  }
  TaskPlacement hold;
  hold.node = node;
  hold.gpus.push_back(
      scheduler::GpuAssignment{slot, kMilliPerUnit, snapshot_.nodes()[node].gpus[slot].memory_mib});
  return hold;
}

void FailureSim::AddHold(int gpu, uint8_t reason) {
  hold_reasons_[gpu] |= reason;
  if (owner_[gpu] < 0) {
    Hold(gpu);
  }
}

void FailureSim::DropHold(int gpu, uint8_t reason) {
  hold_reasons_[gpu] &= static_cast<uint8_t>(~reason);
  if (hold_reasons_[gpu] == 0 && held_[gpu]) {
    Unhold(gpu);
    TopUpSpares({inventory_.node_of_gpu(gpu)});
    RequestRound();
  }
}

void FailureSim::Hold(int gpu) {
  if (held_[gpu]) {
    return;
  }
  const int node = inventory_.node_of_gpu(gpu);
  if (spare_[node]) {
    ReleaseSpare(node);
  }
  // The GPU is idle (no owner, no spare), so the hold fits.
  const Status applied = snapshot_.Apply(HoldOf(gpu));
  Check(applied);
  held_[gpu] = applied.ok();
}

void FailureSim::Unhold(int gpu) {
  snapshot_.Release(HoldOf(gpu));
  held_[gpu] = false;
}

bool FailureSim::WholeAndFree(int node) const {
  if (spare_[node]) {
    return false;
  }
  for (int gpu : node_gpus_[node]) {
    if (owner_[gpu] >= 0 || hold_reasons_[gpu] != 0 || held_[gpu]) {
      return false;
    }
  }
  return true;
}

void FailureSim::ReserveSpare(int node) {
  TaskPlacement hold;
  hold.node = node;
  const std::vector<scheduler::GpuSlot>& slots = snapshot_.nodes()[node].gpus;
  for (size_t slot = 0; slot < slots.size(); ++slot) {
    hold.gpus.push_back(
        scheduler::GpuAssignment{static_cast<int>(slot), kMilliPerUnit, slots[slot].memory_mib});
  }
  const Status applied = snapshot_.Apply(hold);
  Check(applied);
  if (applied.ok()) {
    spare_[node] = std::move(hold);
    ++spares_held_;
  }
}

void FailureSim::ReleaseSpare(int node) {
  snapshot_.Release(*spare_[node]);
  spare_[node].reset();
  --spares_held_;
}

void FailureSim::ReleaseSpares() {
  for (int node = 0; node < inventory_.node_count() && spares_held_ > 0; ++node) {
    if (spare_[node]) {
      ReleaseSpare(node);
    }
  }
}

void FailureSim::TopUpSpares(const std::vector<int>& nodes) {
  if (!large_ || !jobs_[*large_].running) {
    return;
  }
  for (int node : nodes) {
    if (spares_held_ >= options_.large_job.spare_nodes) {
      return;
    }
    if (WholeAndFree(node)) {
      ReserveSpare(node);
    }
  }
}

void FailureSim::ScheduleNodeFault() {
  const FaultModel& faults = options_.faults;
  const double per_hour =
      (faults.node_rate_per_node_hour + faults.nic_rate_per_node_hour) * inventory_.node_count();
  const double at =
      static_cast<double>(events_.now()) +
      std::max(1.0, std::ceil(ExponentialSeconds(node_fault_random_, per_hour / kHourSeconds)));
  if (at < static_cast<double>(options_.duration_seconds)) {
    events_.ScheduleAt(static_cast<int64_t>(at), [this] { NodeFault(); });
  }
}

void FailureSim::NodeFault() {
  const FaultModel& faults = options_.faults;
  const int node = static_cast<int>(node_fault_random_.Uniform(inventory_.node_count()));
  const bool nic = node_fault_random_.UniformDouble() *
                       (faults.node_rate_per_node_hour + faults.nic_rate_per_node_hour) <
                   faults.nic_rate_per_node_hour;
  ++(nic ? result_.nic_faults : result_.node_faults);
  // A node fault fails every job on the node; a NIC fault only those that talk to other nodes.
  std::set<size_t> hit;
  for (int gpu : node_gpus_[node]) {
    if (owner_[gpu] < 0) {
      continue;
    }
    const SimJob& job = jobs_[owner_[gpu]];
    std::set<int> job_nodes;
    for (const TaskPlacement& placement : job.placements) {
      job_nodes.insert(placement.node);
    }
    if (!nic || job_nodes.size() > 1) {
      hit.insert(static_cast<size_t>(owner_[gpu]));
    }
  }
  // Fenced while it reboots or its link resets, so that the failed jobs restart elsewhere.
  if (faults.node_repair_seconds > 0) {
    for (int gpu : node_gpus_[node]) {
      AddHold(gpu, kHoldRepair);
    }
    repair_until_[node] = events_.now() + faults.node_repair_seconds;
    events_.ScheduleAt(repair_until_[node], [this, node] {
      if (events_.now() < repair_until_[node]) {
        return;  // a later fault of the node extended the repair
      }
      for (int gpu : node_gpus_[node]) {
        DropHold(gpu, kHoldRepair);
      }
    });
  }
  const reliability::HealthEvent event{inventory_.node_id(node), GpuUuid{},
                                       nic ? "ib-link-down" : "node-fault",
                                       reliability::HealthSeverity::kFail};
  for (size_t job : hit) {
    ++(nic ? result_.nic_failures : result_.node_failures);
    if (jobs_[job].large) {
      ++result_.large_job.failures;
    }
    StopRun(job, ExitReason::kInfraError, {}, {event});
    Requeue(job);
  }
  ScheduleNodeFault();
}

bool FailureSim::LoopEnabled() const {
  return options_.rules.enabled && options_.diagnostics.enabled;
}

void FailureSim::Suspect(int gpu, bool new_evidence) {
  if (!LoopEnabled() || diagnosing_[gpu] || diagnostic_wanted_[gpu] ||
      !monitor_->quarantine().AcceptsWork(inventory_.gpu_uuid(gpu))) {
    return;
  }
  if (!new_evidence && last_clean_[gpu] >= 0 &&
      events_.now() - last_clean_[gpu] < options_.diagnostics.resuspect_seconds) {
    return;
  }
  diagnostic_wanted_[gpu] = true;
  if (owner_[gpu] < 0) {
    StartDiagnostic(gpu);
  } else if (jobs_[owner_[gpu]].large) {
    DrainLargeAtCheckpoint();
  }
}

void FailureSim::StartDiagnostic(int gpu) {
  diagnostic_wanted_[gpu] = false;
  diagnosing_[gpu] = true;
  ++result_.diagnostics;
  AddHold(gpu, kHoldDiagnostic);
  events_.ScheduleAfter(options_.diagnostics.diagnostic_seconds,
                        [this, gpu] { DiagnosticDone(gpu); });
}

void FailureSim::DiagnosticDone(int gpu) {
  diagnosing_[gpu] = false;
  const DiagnosticsModel& model = options_.diagnostics;
  const double fails = bad_index_[gpu] >= 0    ? model.bad_sensitivity
                       : slow_index_[gpu] >= 0 ? model.slow_sensitivity
                                               : model.false_positive_rate;
  if (diagnostic_random_.UniformDouble() < fails) {
    ++result_.diagnostics_failed;
    const reliability::Device device = reliability::Device::OfGpu(inventory_.gpu_uuid(gpu));
    const Status quarantined = monitor_->Quarantine(reliability::QuarantineRequest{
        device, reliability::DrainMode::kAfterJob, reliability::QuarantineSource::kHealthRule,
        "diagnostic", "active diagnostic failed"});
    if (quarantined.ok()) {
      AddHold(gpu, kHoldQuarantine);
      Found(gpu);
      if (bad_index_[gpu] >= 0) {
        result_.bad_gpus[bad_index_[gpu]].quarantined_seconds = events_.now();
      }
      if (slow_index_[gpu] >= 0) {
        result_.slow_gpus[slow_index_[gpu]].quarantined_seconds = events_.now();
      }
      const auto flagged = flagged_index_.find(device);
      if (flagged != flagged_index_.end()) {
        result_.flagged[flagged->second].quarantined = true;
      }
    } else if (quarantined.code() != StatusCode::kResourceExhausted) {
      Check(quarantined);  // a denial by the budget readmits it; anything else is a bug
    }
  } else {
    last_clean_[gpu] = events_.now();
  }
  DropHold(gpu, kHoldDiagnostic);
}

void FailureSim::Found(int gpu) {
  if (bad_index_[gpu] >= 0 && result_.bad_gpus[bad_index_[gpu]].found_seconds < 0) {
    result_.bad_gpus[bad_index_[gpu]].found_seconds = events_.now();
  }
  if (slow_index_[gpu] >= 0 && result_.slow_gpus[slow_index_[gpu]].found_seconds < 0) {
    result_.slow_gpus[slow_index_[gpu]].found_seconds = events_.now();
  }
}

// A suspect in the large job: the job writes its next checkpoint, stops (no work lost) and
// restarts at the head without it.
void FailureSim::DrainLargeAtCheckpoint() {
  const SimJob& job = jobs_[*large_];
  if (!job.running || large_drain_epoch_ == job.epoch) {
    return;
  }
  large_drain_epoch_ = job.epoch;
  const int64_t work_start = job.started_at + options_.large_job.restart_seconds;
  const int64_t cycle = LargeComputeSeconds(job) + options_.large_job.checkpoint_write_seconds;
  const int64_t since = std::max<int64_t>(events_.now() - work_start, 0);
  const int64_t boundary = work_start + (since / cycle + 1) * cycle;
  const uint64_t epoch = job.epoch;
  events_.ScheduleAt(boundary, [this, epoch] {
    const SimJob& large = jobs_[*large_];
    if (!large.running || large.epoch != epoch) {
      return;
    }
    ++result_.drains;
    ++result_.large_job.drains;
    StopRun(*large_, ExitReason::kPreempted, {});
    Requeue(*large_);
  });
}

// The telemetry comparison of each running gang's members (the simulator knows their speeds).
void FailureSim::CompareGangs() {
  const DiagnosticsModel& model = options_.diagnostics;
  const double false_suspect = model.straggler_false_per_gpu_hour *
                               static_cast<double>(options_.analysis_interval_seconds) /
                               kHourSeconds;
  for (int gpu = 0; gpu < inventory_.gpu_count(); ++gpu) {
    if (owner_[gpu] < 0 || jobs_[owner_[gpu]].gpus_held.size() < 2) {
      continue;
    }
    const bool named = slow_index_[gpu] >= 0
                           ? diagnostic_random_.UniformDouble() < model.straggler_accuracy
                           : diagnostic_random_.UniformDouble() < false_suspect;
    if (named) {
      if (slow_index_[gpu] >= 0 && result_.slow_gpus[slow_index_[gpu]].found_seconds < 0) {
        result_.slow_gpus[slow_index_[gpu]].found_seconds = events_.now();
      }
      Suspect(gpu, false);
    }
  }
}

int64_t FailureSim::SuggestedCheckpointSeconds() const {
  const LargeJobSpec& spec = options_.large_job;
  const reliability::FleetRates& rates = last_rates_;
  const double fleet_per_gpu_hour = rates.gpu_hours > 0
                                        ? rates.gpu_rate + rates.node_rate + rates.unattributed_rate
                                        : options_.attribution.prior_rate_per_gpu_hour;
  // The job's own failures per hour, the fleet's rate counting as one failure of prior.
  const double prior_hours = 1.0 / (fleet_per_gpu_hour * spec.gpus);
  const double mtbf_seconds =
      (large_run_hours_ + prior_hours) / (result_.large_job.failures + 1) * kHourSeconds;
  const double young_daly =
      std::sqrt(2.0 * static_cast<double>(spec.checkpoint_write_seconds) * mtbf_seconds);
  return std::clamp<int64_t>(std::llround(young_daly), 60, 24 * kHourSeconds);
}

int64_t FailureSim::LargeCheckpointInterval() const {
  return options_.large_job.checkpoint_from_failure_rate
             ? SuggestedCheckpointSeconds()
             : options_.large_job.checkpoint_interval_seconds;
}

int64_t FailureSim::LargeComputeSeconds(const SimJob& job) const {
  return static_cast<int64_t>(
      std::ceil(static_cast<double>(job.checkpoint_interval_seconds) / job.speed));
}

void FailureSim::Quarantined(const reliability::QuarantineDecision& decision) {
  std::set<size_t> drained;
  for (int gpu : GpusOf(decision.device)) {
    if (bad_index_[gpu] >= 0 && result_.bad_gpus[bad_index_[gpu]].quarantined_seconds < 0) {
      result_.bad_gpus[bad_index_[gpu]].quarantined_seconds = events_.now();
    }
    if (owner_[gpu] >= 0 && decision.mode == reliability::DrainMode::kNow) {
      drained.insert(static_cast<size_t>(owner_[gpu]));
    }
    AddHold(gpu, kHoldQuarantine);
  }
  for (size_t job : drained) {
    ++result_.drains;
    if (jobs_[job].large) {
      ++result_.large_job.drains;
    }
    StopRun(job, ExitReason::kPreempted, {});
    Requeue(job);
  }
}

void FailureSim::Evaluate() {
  const reliability::Evaluation evaluation = monitor_->Evaluate();
  for (const reliability::DeviceEvidence& suspect : evaluation.report.suspects) {
    if (flagged_index_.count(suspect.device) > 0) {
      continue;
    }
    FlaggedDevice flagged{suspect.device, events_.now()};
    for (int gpu : GpusOf(suspect.device)) {
      if (bad_index_[gpu] >= 0) {
        ++flagged.bad_gpus;
        BadGpu& bad = result_.bad_gpus[bad_index_[gpu]];
        if (bad.found_seconds < 0) {
          bad.found_seconds = events_.now();
        }
      } else {
        ++flagged.healthy_gpus;
      }
    }
    flagged_index_.emplace(suspect.device, result_.flagged.size());
    result_.flagged.push_back(flagged);
  }
  for (const reliability::QuarantineDecision& decision : evaluation.decisions) {
    if (decision.status.ok()) {
      result_.flagged[flagged_index_.at(decision.device)].quarantined = true;
      Quarantined(decision);
    }
  }
  last_rates_ = evaluation.report.rates;
  if (LoopEnabled()) {
    // Flagged GPUs, and those past the looser suspect threshold, once per new failure.
    const DiagnosticsModel& model = options_.diagnostics;
    auto consider = [&](const reliability::DeviceEvidence& evidence, bool flagged) {
      if (evidence.device.kind != DeviceKind::kGpu || evidence.singling_failures < 1) {
        return;
      }
      if (!flagged && (evidence.failures < model.suspect_min_failures ||
                       evidence.p_value > model.suspect_max_p)) {
        return;
      }
      const int gpu = inventory_.IndexOf(evidence.device);
      if (evidence.failures > suspected_failures_[gpu]) {
        suspected_failures_[gpu] = evidence.failures;
        Suspect(gpu, true);
      }
    };
    for (const reliability::DeviceEvidence& suspect : evaluation.report.suspects) {
      consider(suspect, true);
    }
    for (const reliability::DeviceEvidence& runner_up : evaluation.report.runners_up) {
      consider(runner_up, false);
    }
  }
  CompareGangs();
  const int64_t next = events_.now() + options_.analysis_interval_seconds;
  if (next < options_.duration_seconds) {
    events_.ScheduleAt(next, [this] { Evaluate(); });
  }
}

void FailureSim::Finish() {
  AccrueBusy();
  if (large_) {
    SimJob& large = jobs_[*large_];
    if (large.running) {
      AccountLargeRun(large, true);
      for (int gpu : large.gpus_held) {
        if (bad_index_[gpu] >= 0) {
          result_.bad_gpus[bad_index_[gpu]].busy_hours +=
              static_cast<double>(events_.now() - large.started_at) / kHourSeconds;
        }
      }
    } else if (large_waiting_ && large_first_start_ >= 0) {
      result_.large_job.waiting_hours +=
          static_cast<double>(events_.now() - large_waiting_since_) / kHourSeconds;
    }
    if (large_first_start_ >= 0) {
      result_.large_job.wall_hours =
          static_cast<double>(events_.now() - large_first_start_) / kHourSeconds;
    }
  }
  for (const SimJob& job : jobs_) {
    if (job.running && !job.large) {
      for (int gpu : job.gpus_held) {
        if (bad_index_[gpu] >= 0) {
          result_.bad_gpus[bad_index_[gpu]].busy_hours +=
              static_cast<double>(events_.now() - job.started_at) / kHourSeconds;
        }
      }
    }
  }
  result_.mean_busy_gpus =
      events_.now() > 0 ? busy_gpu_seconds_ / static_cast<double>(events_.now()) : 0;

  // Detection.
  std::vector<int64_t> found;
  for (const BadGpu& bad : result_.bad_gpus) {
    if (bad.found_seconds >= 0) {
      found.push_back(bad.found_seconds);
    }
  }
  std::sort(found.begin(), found.end());
  result_.bad_found = static_cast<int>(found.size());
  const size_t needed = (result_.bad_gpus.size() * 9 + 9) / 10;  // 90 %, rounded up
  if (needed > 0 && found.size() >= needed) {
    result_.found_90_seconds = found[needed - 1];
  }
  for (const BadGpu& bad : result_.bad_gpus) {
    result_.bad_quarantined += bad.quarantined_seconds >= 0;
  }
  for (const SlowGpu& slow : result_.slow_gpus) {
    result_.slow_found += slow.found_seconds >= 0;
    result_.slow_quarantined += slow.quarantined_seconds >= 0;
  }
  if (large_) {
    result_.large_job.checkpoint_interval_seconds = jobs_[*large_].checkpoint_interval_seconds;
    result_.large_job.suggested_checkpoint_seconds = SuggestedCheckpointSeconds();
  }
  // Sound GPUs: neither bad nor slow.
  auto sound = [this](int gpu) { return bad_index_[gpu] < 0 && slow_index_[gpu] < 0; };
  std::set<int> healthy_flagged;
  std::vector<Device> devices;
  for (const FlaggedDevice& flagged : result_.flagged) {
    devices.push_back(flagged.device);
    for (int gpu : GpusOf(flagged.device)) {
      if (sound(gpu)) {
        healthy_flagged.insert(gpu);
      }
    }
  }
  result_.healthy_gpus_flagged = static_cast<int>(healthy_flagged.size());
  for (int gpu = 0; gpu < inventory_.gpu_count(); ++gpu) {
    result_.healthy_gpus_quarantined +=
        sound(gpu) && !monitor_->quarantine().AcceptsWork(inventory_.gpu_uuid(gpu));
  }
  result_.audit_log = monitor_->quarantine().audit_log();

  // What the flagged devices cost, and how failures concentrate.
  const reliability::AttributionEngine& engine = monitor_->engine();
  result_.final_report = engine.Analyze();
  result_.concentration = engine.Concentration(devices, result_.final_report.rates);
  const std::vector<reliability::DeviceFailures> ranked = engine.FailuresByDevice(DeviceKind::kGpu);
  for (const reliability::DeviceFailures& entry : ranked) {
    result_.failed_runs_by_gpu_rank.push_back(entry.failed_runs);
  }
  for (size_t k : {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000}) {
    if (k > ranked.size()) {
      break;
    }
    std::vector<Device> top;
    for (size_t i = 0; i < k; ++i) {
      top.push_back(ranked[i].device);
    }
    const reliability::FailureConcentration share =
        engine.Concentration(top, result_.final_report.rates);
    result_.concentration_curve.emplace_back(share.fleet_share, share.failed_share);
  }
}

Result<FailureSimResult> FailureSim::Run() {
  // With the diagnostics loop the attribution names suspects; only a failed diagnostic
  // quarantines, and the looser threshold needs the runners-up.
  reliability::AttributionOptions attribution = options_.attribution;
  reliability::QuarantineRules rules = options_.rules;
  if (LoopEnabled()) {
    rules.enabled = false;
    attribution.report_top = std::max(attribution.report_top, 200);
  }
  GPUFLEET_ASSIGN_OR_RETURN(reliability::ReliabilityMonitor monitor,
                            reliability::ReliabilityMonitor::Create(inventory_, clock_, attribution,
                                                                    options_.budget, rules));
  monitor_.emplace(std::move(monitor));
  for (const scheduler::NodeInfo& node : snapshot_.nodes()) {
    gpus_per_node_ = std::max(gpus_per_node_, static_cast<int>(node.gpus.size()));
  }
  for (int node = 0; node < inventory_.node_count(); ++node) {
    node_gpus_.push_back(inventory_.gpus_of_node(node));
  }
  const int gpus = inventory_.gpu_count();
  owner_.assign(gpus, -1);
  hold_reasons_.assign(gpus, 0);
  held_.assign(gpus, false);
  diagnostic_wanted_.assign(gpus, false);
  diagnosing_.assign(gpus, false);
  last_clean_.assign(gpus, -1);
  suspected_failures_.assign(gpus, 0);
  spare_.assign(static_cast<size_t>(inventory_.node_count()), std::nullopt);
  repair_until_.assign(static_cast<size_t>(inventory_.node_count()), 0);
  result_.quarantine = options_.rules.enabled;
  result_.seed = options_.seed;
  result_.total_gpus = gpus;
  result_.duration_seconds = options_.duration_seconds;
  result_.large_job.gpus = options_.large_job.gpus;
  result_.hours.resize(
      static_cast<size_t>((options_.duration_seconds + kHourSeconds - 1) / kHourSeconds));
  InjectFaults();
  GPUFLEET_RETURN_IF_ERROR(CreateJobs());
  ScheduleNodeFault();
  events_.ScheduleAt(std::min(options_.analysis_interval_seconds, options_.duration_seconds - 1),
                     [this] { Evaluate(); });
  while (!events_.empty() && events_.next_time() < options_.duration_seconds) {
    events_.RunNext();
  }
  // The last instant: advance the clock to the end of the run.
  events_.ScheduleAt(options_.duration_seconds, [] {});
  events_.RunNext();
  Finish();
  GPUFLEET_RETURN_IF_ERROR(internal_error_);
  return std::move(result_);
}

}  // namespace

std::vector<JobShape> JobShapesFromTrace(const Trace& trace) {
  std::vector<JobShape> shapes;
  for (const TraceJob& job : trace.jobs) {
    int gpus = 0;
    bool whole = true;
    for (const TaskGroup& group : job.job.groups) {
      if (const auto* request = std::get_if<WholeGpus>(&group.request.gpus)) {
        gpus += request->count * group.replicas;
      } else if (!std::holds_alternative<NoGpu>(group.request.gpus)) {
        whole = false;
      }
    }
    if (whole && gpus > 0 && job.duration_seconds > 0) {
      shapes.push_back(JobShape{gpus, job.duration_seconds});
    }
  }
  return shapes;
}

Status FailureSimOptions::Validate() const {
  auto positive = [](const char* field, int64_t value) {
    return value > 0 ? Status::Ok()
                     : InvalidArgumentError(fmt::format("{}: {} (must be positive)", field, value));
  };
  auto share = [](const char* field, double value) {
    return value >= 0 && value <= 1
               ? Status::Ok()
               : InvalidArgumentError(fmt::format("{}: {} (must be in [0, 1])", field, value));
  };
  GPUFLEET_RETURN_IF_ERROR(positive("duration_seconds", duration_seconds));
  GPUFLEET_RETURN_IF_ERROR(positive("max_job_seconds", max_job_seconds));
  GPUFLEET_RETURN_IF_ERROR(positive("stream_checkpoint_seconds", stream_checkpoint_seconds));
  GPUFLEET_RETURN_IF_ERROR(positive("analysis_interval_seconds", analysis_interval_seconds));
  GPUFLEET_RETURN_IF_ERROR(
      positive("large_job.checkpoint_interval_seconds", large_job.checkpoint_interval_seconds));
  if (!(target_load > 0 && target_load <= 10)) {
    return InvalidArgumentError(fmt::format("target_load: {} (must be in (0, 10])", target_load));
  }
  if (large_job.gpus < 0 || large_job.checkpoint_write_seconds < 0 ||
      large_job.restart_seconds < 0) {
    return InvalidArgumentError(fmt::format(
        "large_job: gpus {}, checkpoint_write_seconds {}, restart_seconds {} (must be >= 0)",
        large_job.gpus, large_job.checkpoint_write_seconds, large_job.restart_seconds));
  }
  if (large_job.start_seconds < 0 || large_job.start_seconds >= duration_seconds) {
    return InvalidArgumentError(fmt::format(
        "large_job.start_seconds: {} (must be in [0, duration_seconds))", large_job.start_seconds));
  }
  if (!(faults.base_rate_per_gpu_hour >= 0 && faults.base_rate_per_gpu_hour < 1)) {
    return InvalidArgumentError(fmt::format("faults.base_rate_per_gpu_hour: {} (must be in [0, 1))",
                                            faults.base_rate_per_gpu_hour));
  }
  if (!(faults.bad_multiplier_min >= 1 && faults.bad_multiplier_max >= faults.bad_multiplier_min &&
        faults.bad_multiplier_max <= 1e6)) {
    return InvalidArgumentError(
        fmt::format("faults.bad_multiplier: {}-{} (need 1 <= min <= max <= 1e6)",
                    faults.bad_multiplier_min, faults.bad_multiplier_max));
  }
  if (!(faults.app_failure_rate_per_job_hour >= 0 && faults.app_failure_rate_per_job_hour < 100)) {
    return InvalidArgumentError(
        fmt::format("faults.app_failure_rate_per_job_hour: {} (must be in [0, 100))",
                    faults.app_failure_rate_per_job_hour));
  }
  GPUFLEET_RETURN_IF_ERROR(share("faults.bad_gpu_share", faults.bad_gpu_share));
  GPUFLEET_RETURN_IF_ERROR(share("faults.xid_share", faults.xid_share));
  GPUFLEET_RETURN_IF_ERROR(share("faults.app_xid_share", faults.app_xid_share));
  GPUFLEET_RETURN_IF_ERROR(share("faults.slow_gpu_share", faults.slow_gpu_share));
  if (faults.bad_gpu_share + faults.slow_gpu_share > 1) {
    return InvalidArgumentError(
        fmt::format("faults.slow_gpu_share: {} (with bad_gpu_share {}, more than every GPU)",
                    faults.slow_gpu_share, faults.bad_gpu_share));
  }
  if (!(faults.slow_factor >= 1 && faults.slow_factor <= 100)) {
    return InvalidArgumentError(
        fmt::format("faults.slow_factor: {} (must be in [1, 100])", faults.slow_factor));
  }
  for (const auto& [field, rate] :
       {std::pair{"faults.node_rate_per_node_hour", faults.node_rate_per_node_hour},
        std::pair{"faults.nic_rate_per_node_hour", faults.nic_rate_per_node_hour}}) {
    if (!(rate >= 0 && rate < 1)) {
      return InvalidArgumentError(fmt::format("{}: {} (must be in [0, 1))", field, rate));
    }
  }
  if (faults.node_repair_seconds < 0) {
    return InvalidArgumentError(
        fmt::format("faults.node_repair_seconds: {} (must be >= 0)", faults.node_repair_seconds));
  }
  GPUFLEET_RETURN_IF_ERROR(
      positive("diagnostics.diagnostic_seconds", diagnostics.diagnostic_seconds));
  GPUFLEET_RETURN_IF_ERROR(share("diagnostics.bad_sensitivity", diagnostics.bad_sensitivity));
  GPUFLEET_RETURN_IF_ERROR(share("diagnostics.slow_sensitivity", diagnostics.slow_sensitivity));
  GPUFLEET_RETURN_IF_ERROR(
      share("diagnostics.false_positive_rate", diagnostics.false_positive_rate));
  GPUFLEET_RETURN_IF_ERROR(share("diagnostics.suspect_max_p", diagnostics.suspect_max_p));
  GPUFLEET_RETURN_IF_ERROR(share("diagnostics.straggler_accuracy", diagnostics.straggler_accuracy));
  GPUFLEET_RETURN_IF_ERROR(
      share("diagnostics.straggler_false_per_gpu_hour", diagnostics.straggler_false_per_gpu_hour));
  GPUFLEET_RETURN_IF_ERROR(
      positive("diagnostics.suspect_min_failures", diagnostics.suspect_min_failures));
  if (diagnostics.resuspect_seconds < 0 || large_job.spare_nodes < 0) {
    return InvalidArgumentError(
        fmt::format("diagnostics.resuspect_seconds {}, large_job.spare_nodes {} (must be >= 0)",
                    diagnostics.resuspect_seconds, large_job.spare_nodes));
  }
  GPUFLEET_RETURN_IF_ERROR(attribution.Validate());
  GPUFLEET_RETURN_IF_ERROR(budget.Validate());
  const std::vector<std::string>& policies = scheduler::PlacementPolicyNames();
  if (std::find(policies.begin(), policies.end(), placement_policy) == policies.end()) {
    return InvalidArgumentError(fmt::format("placement_policy: unknown \"{}\" (known: {})",
                                            placement_policy, fmt::join(policies, ", ")));
  }
  return Status::Ok();
}

FailureRates FailureSimResult::RatesBetween(int64_t from_hour, int64_t to_hour) const {
  FailureRates rates;
  rates.from_hour = std::max<int64_t>(from_hour, 0);
  rates.to_hour = std::min<int64_t>(to_hour, static_cast<int64_t>(hours.size()));
  for (int64_t hour = rates.from_hour; hour < rates.to_hour; ++hour) {
    rates.runs_ended += hours[hour].runs_ended;
    rates.failed_runs += hours[hour].failed_runs;
    rates.busy_gpu_hours += hours[hour].busy_gpu_hours;
  }
  return rates;
}

Result<FailureSimResult> RunFailureSim(const Cluster& cluster, const std::vector<JobShape>& shapes,
                                       const GpuCatalog& catalog,
                                       const FailureSimOptions& options) {
  GPUFLEET_RETURN_IF_ERROR(options.Validate());
  GPUFLEET_ASSIGN_OR_RETURN(scheduler::ClusterSnapshot snapshot,
                            scheduler::ClusterSnapshot::Build(cluster, catalog));
  GPUFLEET_ASSIGN_OR_RETURN(reliability::FleetInventory inventory,
                            reliability::FleetInventory::FromCluster(cluster));
  if (options.large_job.gpus >= inventory.gpu_count()) {
    return InvalidArgumentError(fmt::format("large_job.gpus: {} (the cluster has {} GPUs)",
                                            options.large_job.gpus, inventory.gpu_count()));
  }
  std::vector<scheduler::TaskShape> task_shapes;
  for (int gpus = 1; gpus <= scheduler::kMaxGpusPerNode; gpus *= 2) {
    task_shapes.push_back(scheduler::ShapeOf(TaskRequest{{}, WholeGpus{gpus}}, {}));
  }
  scheduler::SchedulerOptions scheduler_options;
  scheduler_options.policy = options.placement_policy;
  scheduler_options.tie_break = scheduler::TieBreak::kRandom;
  scheduler_options.plugin_args.target_workload =
      scheduler::TargetWorkload::FromShapes(task_shapes);
  GPUFLEET_ASSIGN_OR_RETURN(
      std::unique_ptr<scheduler::Scheduler> placer,
      scheduler::Scheduler::Create(scheduler_options, scheduler::PluginRegistry::Default()));
  auto sim = std::make_unique<FailureSim>(shapes, options, std::move(snapshot),
                                          std::move(inventory), std::move(placer));
  return sim->Run();
}

Result<std::vector<FailureSimResult>> RunFailureSimPair(const Cluster& cluster,
                                                        const std::vector<JobShape>& shapes,
                                                        const GpuCatalog& catalog,
                                                        const FailureSimOptions& options,
                                                        int threads) {
  return ParallelMap<FailureSimResult>(2, threads,
                                       [&](size_t i) {
                                         FailureSimOptions run = options;
                                         run.rules.enabled = i == 0;
                                         return RunFailureSim(cluster, shapes, catalog, run);
                                       },
                                       {});
}

}  // namespace gpufleet::sim
