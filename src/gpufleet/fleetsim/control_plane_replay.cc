// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/control_plane_replay.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/json_scan.h"
#include "gpufleet/fleetsim/sim_fleet.h"
#include "gpufleet/runner/simulated_runner.h"
#include "gpufleet/store/state_store.h"
#include "gpufleet/wire/job_record.h"
#include "gpufleet/wire/job_spec.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::fleetsim {
namespace {

// The fleet's timing for a replay. The agents heartbeat every half hour (a task end or new work
// wakes them at once, so the heartbeat only renews the lease; an hour is the longest lease the
// agent protocol allows, and the replay's links neither lose nor delay a message, so two renewals
// per lease are enough) and the server cycles every five minutes when nothing happened, for its
// deadlines: an idle node costs a heartbeat per half hour and an idle fleet a cycle per five
// minutes, over months of simulated time. The keepalives are most of a long replay's cost.
constexpr std::chrono::minutes kReplayHeartbeat{30};
constexpr std::chrono::minutes kReplayNodeTimeout{60};
constexpr std::chrono::minutes kReplayIdleCycle{5};

using control::HoldsResources;
using control::IsFinished;
using control::JobState;

// The state of the fleet between two changes: what the time series samples.
struct FleetLevel {
  int64_t time_seconds = 0;
  int64_t gpus_allocated = 0;
  int pending = 0;
  int running = 0;
};

// Follows every job write the store commits and keeps, per trace job, what the replay reports:
// first start, end, preemptions, and the fleet's allocation over time.
class OutcomeTracker final : public store::CommitObserver {
 public:
  OutcomeTracker(const SimFleet& fleet, MonoTime start, const sim::Trace& trace)
      : fleet_(fleet), start_(start) {
    jobs_.resize(trace.jobs.size());
    for (size_t i = 0; i < trace.jobs.size(); ++i) {
      by_name_.emplace(fmt::format("t{}", i), i);
      jobs_[i].gpus = static_cast<int>(trace.jobs[i].job.RequestedGpuMilliTotal() / 1000);
    }
  }

  void Committed(const store::WriteBatch& batch) override {
    for (const store::WriteOp& op : batch.ops()) {
      if (op.kind == control::kJobsKind &&
          (op.type == store::WriteOpType::kCreate || op.type == store::WriteOpType::kUpdate)) {
        Note(op.data);
      }
    }
  }

  struct JobProgress {
    int gpus = 0;
    std::optional<JobState> state;  // nullopt: not submitted yet
    int64_t first_start = -1;
    int64_t end = -1;
    int preemptions = 0;
    int nodes = 0;
    std::string reason;
  };
  const std::vector<JobProgress>& jobs() const { return jobs_; }
  const std::vector<FleetLevel>& levels() const { return levels_; }
  int64_t holding() const { return level_.gpus_allocated; }
  size_t ended() const { return ended_; }
  void NoteRefused(size_t index, std::string why) {
    jobs_[index].state = JobState::kFailed;
    jobs_[index].reason = std::move(why);
    ++ended_;
  }

 private:
  void Note(const std::string& data) {
    // Most writes of a long backlog only change a waiting job's reason: read without parsing.
    const std::optional<std::string> name = TopLevelString(data, "name");
    const auto named = name ? by_name_.find(*name) : by_name_.end();
    if (named != by_name_.end() && jobs_[named->second].state.has_value()) {
      JobProgress& known = jobs_[named->second];
      std::optional<std::string> reason;
      if (TopLevelString(data, "state") == wire::JobStateName(*known.state) &&
          (reason = TopLevelString(data, "reason")).has_value()) {
        known.reason = std::move(*reason);
        return;
      }
    }
    Result<wire::JobRecord> record = wire::JobRecordFromJson(wire::ParseDocument(data), nullptr);
    if (!record.ok()) {
      return;
    }
    const auto found = by_name_.find(record->name);
    if (found == by_name_.end()) {
      return;
    }
    JobProgress& job = jobs_[found->second];
    const int64_t now =
        std::chrono::duration_cast<std::chrono::seconds>(fleet_.Now() - start_).count();
    const std::optional<JobState> before = job.state;
    const JobState after = record->state;
    job.reason = record->reason;
    if (before == after) {
      return;
    }
    job.state = after;
    FleetLevel level = level_;
    level.time_seconds = now;
    const bool held = before.has_value() && HoldsResources(*before);
    if (held != HoldsResources(after)) {
      level.gpus_allocated += held ? -job.gpus : job.gpus;
    }
    level.pending += (after == JobState::kPending ? 1 : 0) - (before == JobState::kPending ? 1 : 0);
    level.running += (after == JobState::kRunning ? 1 : 0) - (before == JobState::kRunning ? 1 : 0);
    if (after == JobState::kRunning) {
      std::set<std::string> nodes;
      for (const wire::PlacementRecord& placement : record->placements) {
        nodes.insert(placement.node);
      }
      job.nodes = static_cast<int>(nodes.size());
      if (job.first_start < 0) {
        job.first_start = now;
      }
    }
    if (after == JobState::kStopping && record->preempted_by.has_value()) {
      ++job.preemptions;
    }
    if (IsFinished(after)) {
      ++ended_;
      if (after == JobState::kSucceeded) {
        job.end = now;
      }
    }
    if (!levels_.empty() && levels_.back().time_seconds == now) {
      levels_.back() = level;
    } else {
      levels_.push_back(level);
    }
    level_ = level;
  }

  const SimFleet& fleet_;
  MonoTime start_;
  std::map<std::string, size_t> by_name_;
  std::vector<JobProgress> jobs_;
  FleetLevel level_;
  std::vector<FleetLevel> levels_;
  size_t ended_ = 0;
};

// The server queue of a trace job: its own queue name under fair-share, else "default".
std::string ServerQueue(const sim::TraceJob& traced, bool queue_per_name) {
  return queue_per_name && !traced.job.queue.empty() ? traced.job.queue.value()
                                                     : std::string(control::kDefaultQueue);
}

// What the CLI would submit for trace job `index`: its spec under the name t<index>, in its
// server queue, its tasks scripted to run for the trace's duration.
std::string SubmissionBody(const sim::TraceJob& traced, size_t index, bool with_estimates,
                           bool queue_per_name) {
  Job job = traced.job;
  job.id = JobId(fmt::format("t{}", index));
  job.queue = QueueId(ServerQueue(traced, queue_per_name));
  if (!with_estimates) {
    job.runtime_estimate = Duration(0);
  }
  for (TaskGroup& group : job.groups) {
    group.env[std::string(runner::kSimDurationEnv)] =
        std::to_string(traced.duration_seconds * 1000);
    if (group.command.empty() && group.image.empty()) {
      group.command = {"replay"};
    }
  }
  return wire::JobSpecToJson(job).dump();
}

Status CheckSupported(const Cluster& cluster, const sim::ReplayOptions& options) {
  const std::vector<std::string>& policies = ControlPlaneQueuePolicies();
  if (std::find(policies.begin(), policies.end(), options.queue_policy) == policies.end()) {
    return InvalidArgumentError(fmt::format(
        "queue policy \"{}\": the control-plane engine has {} (docs/simulator.md says why not the "
        "others)",
        options.queue_policy, fmt::join(policies, ", ")));
  }
  if (options.fabric != nullptr || options.topology_aware || options.learn_workload_seconds > 0 ||
      options.interactive_activity || options.idle_reclaim || options.enforce_time_limits ||
      !options.queues.empty()) {
    return InvalidArgumentError(
        "the control-plane engine replays without a fabric, topology awareness, a learned "
        "workload, interactive activity, idle reclaim, time limits or a queue tree");
  }
  if (cluster.nodes.empty() || cluster.nodes.front().gpus.empty()) {
    return InvalidArgumentError("cluster: no nodes with GPUs");
  }
  const Node& first = cluster.nodes.front();
  for (const Node& node : cluster.nodes) {
    if (node.gpus.size() != first.gpus.size() ||
        node.gpus.front().model != first.gpus.front().model ||
        node.capacity.cpu_milli != first.capacity.cpu_milli ||
        node.capacity.memory_mib != first.capacity.memory_mib) {
      return InvalidArgumentError(fmt::format(
          "cluster: node {} ({} x {}) differs from node {} ({} x {}); the control-plane engine "
          "replays on nodes that are all alike",
          node.id.value(), node.gpus.size(), node.gpus.empty() ? "" : node.gpus.front().model,
          first.id.value(), first.gpus.size(), first.gpus.front().model));
    }
  }
  return Status::Ok();
}

// The series at every `spacing` seconds from 0 to `end`, each sample the level then.
std::vector<sim::ReplaySample> Sample(const std::vector<FleetLevel>& levels, int64_t spacing,
                                      int64_t end) {
  std::vector<sim::ReplaySample> series;
  size_t next = 0;
  FleetLevel level;
  for (int64_t time = 0; time <= end; time += spacing) {
    while (next < levels.size() && levels[next].time_seconds <= time) {
      level = levels[next++];
    }
    sim::ReplaySample sample;
    sample.time_seconds = time;
    sample.gpus_allocated = static_cast<double>(level.gpus_allocated);
    sample.gpus_busy = sample.gpus_allocated;
    sample.fragmentation_gpus = std::numeric_limits<double>::quiet_NaN();
    sample.queue_length = level.pending;
    sample.running = level.running;
    series.push_back(sample);
  }
  return series;
}

}  // namespace

const std::vector<std::string>& ControlPlaneQueuePolicies() {
  static const std::vector<std::string> kPolicies = {"fifo", "easy-backfill", "fair-share"};
  return kPolicies;
}

Result<sim::ReplayResult> RunReplayThroughControlPlane(const Cluster& cluster,
                                                       const sim::Trace& given,
                                                       const sim::ReplayOptions& options) {
  GPUFLEET_RETURN_IF_ERROR(CheckSupported(cluster, options));
  if (options.sample_seconds <= 0) {
    return InvalidArgumentError(
        fmt::format("sample_seconds: {} (must be > 0)", options.sample_seconds));
  }
  const Node& shape = cluster.nodes.front();
  // As the replay loops do: tasks wider than a node split into narrower ones.
  const sim::Trace trace = sim::FitTasksToNodes(given, static_cast<int>(shape.gpus.size()));
  FleetOptions fleet_options;
  fleet_options.nodes = static_cast<int>(cluster.nodes.size());
  fleet_options.gpus_per_node = static_cast<int>(shape.gpus.size());
  fleet_options.gpu_model = shape.gpus.front().model;
  fleet_options.node_capacity = shape.capacity;
  fleet_options.seed = options.seed;
  fleet_options.placement_policy = options.placement_policy;
  fleet_options.event_driven = true;
  fleet_options.heartbeat_interval = kReplayHeartbeat;
  fleet_options.node_timeout = kReplayNodeTimeout;
  fleet_options.cycle_interval = kReplayIdleCycle;
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<SimFleet> fleet, SimFleet::Create(fleet_options));
  // The agents register and the server takes them in before the first arrival.
  GPUFLEET_RETURN_IF_ERROR(fleet->Advance(Duration(0)));
  while (fleet->NextDue() <= fleet->Now()) {
    GPUFLEET_RETURN_IF_ERROR(fleet->Advance(Duration(0)));
  }
  const MonoTime start = fleet->Now();
  OutcomeTracker tracker(*fleet, start, trace);
  fleet->store().AddObserver(&tracker);
  struct Unobserve {
    SimFleet& fleet;
    OutcomeTracker& tracker;
    ~Unobserve() { fleet.store().RemoveObserver(&tracker); }
  } unobserve{*fleet, tracker};

  // Any schedule that keeps the fleet busy while jobs wait has run every job by the last arrival
  // plus the sum of the durations: a replay past that is stuck (a bug, not a slow schedule).
  Duration serial_bound =
      std::chrono::seconds(trace.jobs.empty() ? 0 : trace.jobs.back().submit_seconds);
  for (const sim::TraceJob& job : trace.jobs) {
    serial_bound += std::chrono::seconds(job.duration_seconds);
  }
  const bool with_estimates = options.queue_policy == "easy-backfill";
  // fair-share: as the replay loops build their tree (sim::BuildQueueTree), one top-level queue
  // per queue name of the trace, equal weights, no guarantees or limits, made as an administrator
  // makes them; the server's tree then orders, admits and preempts as it does for any queues.
  const bool queue_per_name = options.queue_policy == "fair-share";
  if (queue_per_name) {
    std::set<std::string> names;
    for (const sim::TraceJob& job : trace.jobs) {
      names.insert(ServerQueue(job, true));
    }
    for (const std::string& name : names) {
      if (name == std::string_view(control::kDefaultQueue)) {
        continue;  // made at the server's first start
      }
      GPUFLEET_ASSIGN_OR_RETURN(
          const api::ApiResponse made,
          fleet->AdminRequest("POST", "/v1/queues", wire::Json{{"name", name}}.dump()));
      if (made.status != 201) {
        return InvalidArgumentError(fmt::format("queue \"{}\": the server refused it: {} {}", name,
                                                made.status, made.body));
      }
    }
  }
  size_t next = 0;
  while (true) {
    const MonoTime now = fleet->Now();
    // The arrivals of this second, all before the server's next cycle.
    while (next < trace.jobs.size() &&
           start + std::chrono::seconds(trace.jobs[next].submit_seconds) <= now) {
      GPUFLEET_ASSIGN_OR_RETURN(
          const api::ApiResponse answer,
          fleet->AdminRequest(
              "POST", "/v1/jobs",
              SubmissionBody(trace.jobs[next], next, with_estimates, queue_per_name)));
      if (answer.status != 201) {
        tracker.NoteRefused(next,
                            fmt::format("refused at submit: {} {}", answer.status, answer.body));
      }
      ++next;
    }
    MonoTime due = fleet->NextDue();
    if (next < trace.jobs.size()) {
      due = std::min(due, start + std::chrono::seconds(trace.jobs[next].submit_seconds));
    } else if (tracker.ended() == trace.jobs.size() || (due > now && tracker.holding() == 0)) {
      // Every job ended, or the fleet is empty with nothing due now: what still waits never fits.
      break;
    }
    if (due - start > serial_bound) {
      return InternalError(
          fmt::format("replay stuck: {} of {} jobs ended when simulated time passed {} s, the last "
                      "arrival plus "
                      "every duration",
                      tracker.ended(), trace.jobs.size(),
                      std::chrono::duration_cast<std::chrono::seconds>(serial_bound).count()));
    }
    GPUFLEET_RETURN_IF_ERROR(fleet->Advance(due - now));
  }

  sim::ReplayResult result;
  result.queue_policy = options.queue_policy;
  result.placement_policy = options.placement_policy;
  result.seed = options.seed;
  result.total_gpus = static_cast<int>(cluster.nodes.size() * shape.gpus.size());
  result.jobs_total = static_cast<int>(trace.jobs.size());
  std::vector<double> delays;
  std::vector<double> completions;
  std::map<std::string, std::vector<double>> queue_delays;
  std::map<std::string, sim::ReplayQueueOutcome> queues;
  int64_t last_end = 0;
  for (size_t i = 0; i < trace.jobs.size(); ++i) {
    const sim::TraceJob& traced = trace.jobs[i];
    const OutcomeTracker::JobProgress& progress = tracker.jobs()[i];
    sim::ReplayJobOutcome outcome;
    outcome.id = traced.job.id.value();
    outcome.submit_seconds = traced.submit_seconds;
    outcome.first_start_seconds = progress.first_start;
    outcome.end_seconds = progress.end;
    outcome.gpus = progress.gpus;
    outcome.preemptions = progress.preemptions;
    outcome.nodes = progress.nodes;
    outcome.queue = traced.job.queue.empty() ? "default" : traced.job.queue.value();
    outcome.interactive = traced.job.kind == JobKind::kInteractive;
    outcome.duration_seconds = traced.duration_seconds;
    if (progress.first_start < 0) {
      outcome.unplaceable_reason = progress.reason.empty() ? "never placed" : progress.reason;
      ++result.jobs_unplaceable;
    }
    sim::ReplayQueueOutcome& queue = queues[outcome.queue];
    queue.queue = outcome.queue;
    ++queue.jobs;
    queue_delays[outcome.queue];
    if (progress.first_start >= 0) {
      ++queue.started;
      delays.push_back(static_cast<double>(outcome.QueueingDelay()));
      queue_delays[outcome.queue].push_back(static_cast<double>(outcome.QueueingDelay()));
    }
    if (progress.end >= 0) {
      ++result.jobs_finished;
      ++queue.finished;
      completions.push_back(static_cast<double>(outcome.CompletionTime()));
      last_end = std::max(last_end, progress.end);
    }
    result.preemptions += progress.preemptions;
    result.jobs.push_back(std::move(outcome));
  }
  const int64_t first_submit = trace.jobs.empty() ? 0 : trace.jobs.front().submit_seconds;
  result.makespan_seconds = last_end - first_submit;
  // The allocation integral over [0, last_end].
  const std::vector<FleetLevel>& levels = tracker.levels();
  for (size_t i = 0; i < levels.size() && levels[i].time_seconds < last_end; ++i) {
    const int64_t until =
        i + 1 < levels.size() ? std::min(levels[i + 1].time_seconds, last_end) : last_end;
    result.allocated_gpu_seconds += static_cast<double>(levels[i].gpus_allocated) *
                                    static_cast<double>(until - levels[i].time_seconds);
  }
  result.busy_gpu_seconds = result.allocated_gpu_seconds;
  result.mean_gpus_allocated =
      last_end > 0 ? result.allocated_gpu_seconds / static_cast<double>(last_end) : 0;
  result.queueing_delay = sim::Summarize(std::move(delays));
  result.completion_time = sim::Summarize(std::move(completions));
  result.series = Sample(levels, options.sample_seconds, last_end);
  for (auto& [name, queue] : queues) {
    queue.queueing_delay = sim::Summarize(std::move(queue_delays[name]));
    result.queues.push_back(std::move(queue));
  }
  return result;
}

}  // namespace gpufleet::fleetsim
