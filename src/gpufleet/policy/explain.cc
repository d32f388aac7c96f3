// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/explain.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/policy/never_fits.h"
#include "gpufleet/scheduler/devices.h"

namespace gpufleet::policy {
namespace {

using scheduler::ClusterSnapshot;
using scheduler::GpuSlot;
using scheduler::NodeInfo;
using scheduler::TaskPlacement;

std::string Gpus(int64_t milli) {
  return milli % kMilliPerUnit == 0 ? fmt::format("{}", milli / kMilliPerUnit)
                                    : fmt::format("{:.3g}", static_cast<double>(milli) /
                                                                static_cast<double>(kMilliPerUnit));
}

// The conflict between MPS and time-sliced shares that the scheduler's reason names, if any:
// the room the job needs is free on GPUs whose shares run the other way.
std::optional<std::string_view> SharingConflict(std::string_view scheduler_reason) {
  for (const std::string_view conflict :
       {scheduler::kMpsMeetsTimeSlicedReason, scheduler::kTimeSlicedMeetsMpsReason}) {
    if (scheduler_reason.find(conflict) != std::string_view::npos) {
      return conflict;
    }
  }
  return std::nullopt;
}

// The group that asks for the most GPU per task: the one hardest to place.
int LargestGroup(const Job& job) {
  int best = 0;
  for (size_t g = 1; g < job.groups.size(); ++g) {
    if (RequestedGpuMilli(job.groups[g].request.gpus) >
        RequestedGpuMilli(job.groups[best].request.gpus)) {
      best = static_cast<int>(g);
    }
  }
  return best;
}

// What the job's constraints and GPU health say of each GPU and node, the way the scheduler's
// filters see them (plugins/filters.h), counted for the evidence.
class Eligibility {
 public:
  Eligibility(const Job& job, const ClusterSnapshot& snapshot) : job_(job) {
    model_allowed_.assign(snapshot.ModelCount(), job.allowed_gpu_models.empty());
    for (const std::string& name : job.allowed_gpu_models) {
      if (const int id = snapshot.ModelId(name); id >= 0) {
        model_allowed_[id] = true;
      }
    }
  }

  bool GpuAllowed(const GpuSlot& gpu) const {
    return gpu.model_id >= 0 && model_allowed_[gpu.model_id] &&
           gpu.memory_mib >= job_.min_gpu_memory_mib;
  }
  static bool GpuHealthy(const GpuSlot& gpu) {
    return gpu.health == GpuHealth::kHealthy || gpu.health == GpuHealth::kDegraded;
  }
  bool NodeAllowed(const NodeInfo& node, const TaskRequest& request) const {
    for (const auto& [key, value] : job_.node_selector) {
      const auto it = node.node->labels.find(key);
      if (it == node.node->labels.end() || it->second != value) {
        return false;
      }
    }
    for (const std::string& key : job_.identical_stack_labels) {
      if (key != kImageDigestStackKey && node.node->labels.count(key) == 0) {
        return false;
      }
    }
    return request.host.cpu_milli <= node.capacity.cpu_milli &&
           request.host.memory_mib <= node.capacity.memory_mib;
  }

 private:
  const Job& job_;
  std::vector<bool> model_allowed_;
};

// Whether one task of `request` fits on `node` now, on GPUs that pass every filter.
bool OneTaskFits(const NodeInfo& node, const TaskRequest& request, const Eligibility& eligible) {
  if (request.host.cpu_milli > node.free.cpu_milli ||
      request.host.memory_mib > node.free.memory_mib) {
    return false;
  }
  int idle = 0;
  bool share = false;
  for (const GpuSlot& gpu : node.gpus) {
    if (!eligible.GpuAllowed(gpu) || !Eligibility::GpuHealthy(gpu)) {
      continue;
    }
    idle += gpu.IsIdle() ? 1 : 0;
    if (const auto* fraction = std::get_if<FractionalGpu>(&request.gpus)) {
      share = share || (!gpu.mig_enabled && gpu.free_milli >= fraction->gpu_milli &&
                        gpu.free_memory_mib >= fraction->gpu_memory_mib);
    } else if (std::holds_alternative<MigGpus>(request.gpus)) {
      share = share || (gpu.mig_enabled && gpu.free_milli > 0) || gpu.IsIdle();
    }
  }
  if (const auto* whole = std::get_if<WholeGpus>(&request.gpus)) {
    return idle >= whole->count;
  }
  return std::holds_alternative<NoGpu>(request.gpus) || share;
}

// Whether one task of `request` would fit on `node` with every task gone, on GPUs its constraints
// allow (healthy or not): when not, freeing GPUs there cannot help it.
bool OneTaskFitsEmpty(const NodeInfo& node, const TaskRequest& request,
                      const Eligibility& eligible) {
  int whole_gpus = 0;
  bool share = false;
  for (const GpuSlot& gpu : node.gpus) {
    if (!eligible.GpuAllowed(gpu)) {
      continue;
    }
    whole_gpus += gpu.mig_enabled ? 0 : 1;
    if (const auto* fraction = std::get_if<FractionalGpu>(&request.gpus)) {
      share = share || (!gpu.mig_enabled && gpu.memory_mib >= fraction->gpu_memory_mib);
    } else if (std::holds_alternative<MigGpus>(request.gpus)) {
      share = true;
    }
  }
  if (const auto* whole = std::get_if<WholeGpus>(&request.gpus)) {
    return whole_gpus >= whole->count;
  }
  return std::holds_alternative<NoGpu>(request.gpus) || share;
}

// The `level` of Count for the required level "node".
constexpr int kByNode = -2;

struct Census {
  NodeCounts nodes;
  int64_t free_milli = 0;               // on allowed, healthy GPUs of allowed, Ready nodes
  int64_t allowed_total_milli = 0;      // of allowed GPUs on allowed nodes, whatever their health
  int64_t healthy_total_milli = 0;      // of those, healthy on Ready nodes
  std::map<int, int64_t> domain_free;   // by domain id of the required level
  std::map<int, int64_t> domain_total;  // healthy and allowed, free or not
};

Census Count(const Job& job, const ClusterSnapshot& snapshot, int level) {
  Census census;
  const Eligibility eligible(job, snapshot);
  const TaskRequest& request = job.groups[LargestGroup(job)].request;
  for (const NodeInfo& node : snapshot.nodes()) {
    const bool node_allowed = eligible.NodeAllowed(node, request);
    const bool ready = node.node->state == NodeState::kReady;
    bool any_allowed_gpu = false;
    bool any_usable_gpu = false;
    int64_t free = 0;
    int64_t usable_total = 0;
    for (const GpuSlot& gpu : node.gpus) {
      if (!eligible.GpuAllowed(gpu)) {
        continue;
      }
      any_allowed_gpu = true;
      if (node_allowed) {
        census.allowed_total_milli += kMilliPerUnit;
      }
      if (!Eligibility::GpuHealthy(gpu) || !ready) {
        continue;
      }
      any_usable_gpu = true;
      usable_total += kMilliPerUnit;
      free += gpu.free_milli;
    }
    const bool needs_gpus = !std::holds_alternative<NoGpu>(request.gpus);
    if (!node_allowed || (needs_gpus && !any_allowed_gpu)) {
      ++census.nodes.constraints;
      continue;
    }
    if (!ready || (needs_gpus && !any_usable_gpu)) {
      ++census.nodes.health;
      continue;
    }
    census.healthy_total_milli += usable_total;
    census.free_milli += free;
    // A declared level's domain, or the node itself for the level "node".
    const int domain = level >= 0 ? node.domains[level] : level == kByNode ? node.index : -1;
    if (domain >= 0) {
      census.domain_free[domain] += free;
      census.domain_total[domain] += usable_total;
    }
    if (OneTaskFits(node, request, eligible)) {
      ++census.nodes.fits;
    } else if (OneTaskFitsEmpty(node, request, eligible)) {
      ++census.nodes.capacity;
    } else {
      ++census.nodes.constraints;  // too small for one task: no job's end would make room
    }
  }
  return census;
}

// Where `job` would go now, the snapshot left as it was.
scheduler::ScheduleResult TrySchedule(scheduler::Scheduler& scheduler, const Job& job,
                                      ClusterSnapshot& snapshot, Random& random) {
  scheduler::ScheduleResult result = scheduler.Schedule(job, snapshot, random);
  for (auto it = result.placements.rbegin(); it != result.placements.rend(); ++it) {
    snapshot.Revert(*it);
  }
  return result;
}

// "3 nodes in leaf-2" or "node-7".
std::string Where(const std::vector<TaskPlacement>& placements, const ClusterSnapshot& snapshot) {
  std::set<std::string> nodes;
  for (const TaskPlacement& placement : placements) {
    nodes.insert(snapshot.nodes()[placement.node].node->id.value());
  }
  if (nodes.size() == 1) {
    return *nodes.begin();
  }
  return fmt::format(
      "{} nodes ({}{})", nodes.size(),
      fmt::join(nodes.begin(), std::next(nodes.begin(), std::min<size_t>(3, nodes.size())), ", "),
      nodes.size() > 3 ? ", ..." : "");
}

// Whether `job` would start now: placed by the scheduler and let through by the caller's quota
// and reservation; the detail says where, or why not.
std::pair<bool, std::string> WouldStart(scheduler::Scheduler& scheduler, const Job& job,
                                        ClusterSnapshot& snapshot, const ExplainInput& input,
                                        Random& random) {
  const scheduler::ScheduleResult result = TrySchedule(scheduler, job, snapshot, random);
  if (!result.scheduled()) {
    return {false, result.outcome == scheduler::ScheduleOutcome::kError ? result.error.message()
                                                                        : result.reason};
  }
  for (const PlacementCheck* check : {&input.quota, &input.reservation}) {
    if (*check) {
      if (std::optional<std::string> refused = (*check)(job, result.placements, snapshot)) {
        return {false, *refused};
      }
    }
  }
  return {true, fmt::format("it would start on {}", Where(result.placements, snapshot))};
}

// `snapshot` with every running job of `input` gone.
ClusterSnapshot WithoutRunningJobs(const ClusterSnapshot& snapshot, const ExplainInput& input) {
  ClusterSnapshot empty = snapshot.Clone();
  for (const RunningJob& running : input.running) {
    for (const TaskPlacement& placement : running.placements) {
      empty.Release(placement);
    }
  }
  return empty;
}

// The declared levels and the built-in ones, finest first: nvlink-domain, node, then the declared
// levels from the innermost out.
std::vector<std::string> LevelsFinestFirst(const Topology& topology) {
  std::vector<std::string> levels = {std::string(kNvlinkDomainLevel), std::string(kNodeLevel)};
  for (auto it = topology.levels().rbegin(); it != topology.levels().rend(); ++it) {
    if (*it != kNvlinkDomainLevel) {
      levels.push_back(*it);
    }
  }
  return levels;
}

void AddWhatIfs(scheduler::Scheduler& scheduler, ClusterSnapshot& snapshot,
                const ExplainInput& input, Random& random, Explanation& out) {
  const Job& job = *input.job;
  const auto ask = [&](std::string change, Job changed) {
    if (static_cast<int>(out.what_ifs.size()) >= input.max_what_ifs) {
      return false;
    }
    auto [starts, detail] = WouldStart(scheduler, changed, snapshot, input, random);
    out.what_ifs.push_back({std::move(change), starts, std::move(detail), std::move(changed)});
    return starts;
  };
  // A coarser required level, then none.
  if (!job.topology.required_level.empty()) {
    const std::vector<std::string> levels = LevelsFinestFirst(snapshot.topology());
    auto it = std::find(levels.begin(), levels.end(), job.topology.required_level);
    bool started = false;
    if (it != levels.end()) {
      for (++it; it != levels.end() && !started; ++it) {
        Job changed = job;
        changed.topology.required_level = *it;
        if (changed.topology.preferred_level == job.topology.required_level) {
          changed.topology.preferred_level.clear();
        }
        started = ask(fmt::format("topology.required={}", *it), std::move(changed));
      }
    }
    if (!started) {
      Job changed = job;
      changed.topology.required_level.clear();
      ask("without topology.required", std::move(changed));
    }
  }
  // Fewer GPUs: the largest group's replicas halved, or its GPUs per task when it has one task.
  const int group = LargestGroup(job);
  const int64_t total = job.RequestedGpuMilliTotal();
  Job smaller = job;
  for (int step = 0; step < 3; ++step) {
    TaskGroup& g = smaller.groups[group];
    auto* whole = std::get_if<WholeGpus>(&g.request.gpus);
    if (g.replicas > 1) {
      g.replicas /= 2;
    } else if (whole != nullptr && whole->count > 1) {
      whole->count /= 2;
    } else {
      break;
    }
    if (ask(fmt::format("with {} GPUs instead of {}", Gpus(smaller.RequestedGpuMilliTotal()),
                        Gpus(total)),
            smaller)) {
      break;
    }
  }
  // Another GPU model the cluster has, when the job names the models it takes.
  if (!job.allowed_gpu_models.empty()) {
    std::set<std::string> allowed;
    for (const std::string& name : job.allowed_gpu_models) {
      allowed.insert(snapshot.catalog().Canonical(name));
    }
    for (int m = 0; m < snapshot.ModelCount(); ++m) {
      const std::string& model = snapshot.Model(m).name;
      if (allowed.count(model) > 0) {
        continue;
      }
      Job changed = job;
      changed.allowed_gpu_models = {model};
      ask(fmt::format("on {}", model), std::move(changed));
    }
  }
}

// The plan of PlanEta below, counting the never-fitting jobs ahead it leaves out.
void PlanEtaOfFittingJobs(scheduler::Scheduler& scheduler, const ClusterSnapshot& snapshot,
                          const ExplainInput& input, Random& random, Explanation& out) {
  BackfillPlanner planner(scheduler, input.backfill);
  std::vector<RunningJob> holding = input.running;
  const int unknown =
      static_cast<int>(std::count_if(holding.begin(), holding.end(), [](const RunningJob& job) {
        return job.estimate_seconds <= 0;
      }));
  ClusterSnapshot plan = snapshot.Clone();
  std::vector<const Job*> waiting = input.ahead;
  waiting.push_back(input.job);
  std::set<const Job*> checked_never;
  int tries = 0;
  const auto give_up = [&] {
    out.eta_why = fmt::format("unknown: planning {} jobs ahead took more than {} placement tries",
                              input.ahead.size(), input.max_plan_tries);
  };
  for (int64_t now = input.now_seconds;;) {
    const Job* head = nullptr;
    Reservation reservation;
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (++tries > input.max_plan_tries) {
        return give_up();
      }
      scheduler::ScheduleResult placed = scheduler.Schedule(**it, plan, random);
      const auto revert = [&] {
        for (auto p = placed.placements.rbegin(); p != placed.placements.rend(); ++p) {
          plan.Revert(*p);
        }
      };
      if (!placed.scheduled()) {
        // Asked once per job, and only of those that do not fit: the check scans every node.
        if (*it != input.job && checked_never.insert(*it).second &&
            CheckNeverFits(**it, snapshot).has_value()) {
          ++out.ahead_never_start;
          it = waiting.erase(it);
          continue;
        }
        if (head == nullptr) {
          head = *it;
          Result<Reservation> reserved = planner.Reserve(*head, holding, now, plan, random);
          if (!reserved.ok()) {
            out.eta_why = fmt::format("unknown: {}", reserved.status().message());
            return;
          }
          reservation = std::move(*reserved);
        }
        ++it;
        continue;
      }
      // The quota counts what runs now, so it is asked only at the start: a job it refuses then
      // is left out of the plan.
      if (input.quota && now == input.now_seconds && *it != input.job &&
          input.quota(**it, placed.placements, plan)) {
        revert();
        it = waiting.erase(it);
        continue;
      }
      RunningJob started{
          .id = (*it)->id,
          .start_seconds = now,
          .estimate_seconds =
              std::chrono::duration_cast<std::chrono::seconds>((*it)->runtime_estimate).count(),
          .placements = std::move(placed.placements)};
      if (head != nullptr) {
        Result<bool> keeps =
            planner.KeepsReservation(reservation, *head, started, holding, now, plan, random);
        if (!keeps.ok() || !*keeps) {
          placed.placements = std::move(started.placements);
          revert();
          ++it;
          continue;
        }
      }
      if (*it == input.job) {
        out.eta_seconds = now;
        out.eta_why = now == input.now_seconds
                          ? "it fits now"
                          : "the backfill plan starts it when the jobs holding the GPUs it needs "
                            "reach their runtime estimates";
        return;
      }
      holding.push_back(std::move(started));
      it = waiting.erase(it);
    }
    // The next planned end; a job already past its estimate is about to end (a second later).
    int64_t next = kNeverEnds;
    for (const RunningJob& job : holding) {
      const int64_t end = PlannedEndSeconds(job, now, input.backfill);
      if (end != kNeverEnds) {
        next = std::min(next, std::max(end, now + 1));
      }
    }
    if (next == kNeverEnds) {
      out.eta_why =
          unknown > 0
              ? fmt::format(
                    "unknown: {} running job(s) without a runtimeEstimate hold GPUs it needs",
                    unknown)
              : std::string("unknown: it does not fit even once every job with an estimate ends");
      return;
    }
    now = next;
    for (auto job = holding.begin(); job != holding.end();) {
      if (PlannedEndSeconds(*job, now, input.backfill) <= now) {
        for (const TaskPlacement& placement : job->placements) {
          plan.Release(placement);
        }
        job = holding.erase(job);
      } else {
        ++job;
      }
    }
  }
}

// The ETA: the backfill plan played forward on a scratch copy, as the scheduling cycle would run
// it. At each planned end (PlannedEndSeconds) the jobs that ended leave; then the jobs ahead and
// this one are tried in queue order, EASY-style: the first that does not fit gets a reservation
// (BackfillPlanner::Reserve) and a later one starts only if it keeps it; each started job leaves
// at its own estimate. A job ahead that never fits is left out (it would never start, and its
// reservation would hold back everything behind it); the answer says how many were. The job's
// start in that plan is the ETA.
void PlanEta(scheduler::Scheduler& scheduler, const ClusterSnapshot& snapshot,
             const ExplainInput& input, Random& random, Explanation& out) {
  PlanEtaOfFittingJobs(scheduler, snapshot, input, random, out);
  if (out.ahead_never_start > 0) {
    out.eta_why +=
        fmt::format("; {} {} ahead cannot start (never fits) and {} left out of the plan",
                    out.ahead_never_start, out.ahead_never_start == 1 ? "job" : "jobs",
                    out.ahead_never_start == 1 ? "is" : "are");
  }
}

}  // namespace

const char* PendingReasonName(PendingReason reason) {
  switch (reason) {
    case PendingReason::kNone:
      return "none";
    case PendingReason::kNever:
      return "never";
    case PendingReason::kQuota:
      return "quota";
    case PendingReason::kCapacity:
      return "capacity";
    case PendingReason::kTopology:
      return "topology";
    case PendingReason::kConstraints:
      return "constraints";
    case PendingReason::kHealth:
      return "health";
    case PendingReason::kReservation:
      return "reservation";
  }
  return "none";
}

Result<Explanation> Explain(scheduler::Scheduler& scheduler, ClusterSnapshot& snapshot,
                            const ExplainInput& input, Random& random) {
  const Job& job = *input.job;
  Explanation out;
  if (job.groups.empty()) {
    return InvalidArgumentError("job: no task groups");
  }
  const std::string& required = job.topology.required_level;
  const int level = required.empty()         ? -1
                    : required == kNodeLevel ? kByNode
                                             : snapshot.topology().LevelIndex(required);
  Census census = Count(job, snapshot, level);
  out.nodes = census.nodes;
  out.needed_gpu_milli = job.RequestedGpuMilliTotal();
  out.free_gpu_milli = census.free_milli;
  if (!census.domain_free.empty()) {
    const auto best =
        std::max_element(census.domain_free.begin(), census.domain_free.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    out.best_domain =
        DomainEvidence{.level = required,
                       .name = level == kByNode ? snapshot.nodes()[best->first].node->id.value()
                                                : snapshot.DomainName(level, best->first),
                       .free_gpu_milli = best->second,
                       .needed_gpu_milli = out.needed_gpu_milli,
                       .total_gpu_milli = census.domain_total[best->first]};
  }

  bool topology_never = false;   // no domain of the required level can hold it, even empty
  bool fleet_too_small = false;  // the whole fleet has fewer GPUs it may use than it needs
  const scheduler::ScheduleResult now = TrySchedule(scheduler, job, snapshot, random);
  out.scheduler_reason =
      now.outcome == scheduler::ScheduleOutcome::kError ? now.error.message() : now.reason;
  if (now.scheduled()) {
    if (input.quota) {
      if (std::optional<std::string> refused = input.quota(job, now.placements, snapshot)) {
        out.reason = PendingReason::kQuota;
        out.message =
            fmt::format("GPUs are free for it, but its queue's quota refuses it: {}", *refused);
      }
    }
    if (out.reason == PendingReason::kNone && input.reservation) {
      if (std::optional<std::string> refused = input.reservation(job, now.placements, snapshot)) {
        out.reason = PendingReason::kReservation;
        out.message = fmt::format("it fits now, but {}", *refused);
      }
    }
    if (out.reason == PendingReason::kNone) {
      out.message = fmt::format("it fits now on {}; the next scheduling cycle starts it",
                                Where(now.placements, snapshot));
    }
  } else if (std::optional<NeverFits> never = CheckNeverFits(job, snapshot)) {
    out.reason = PendingReason::kNever;
    out.message = fmt::format("never fits: {}", never->message);
    // What a domain lacks is what running jobs would have to free: no help to this job.
    out.best_domain.reset();
  } else {
    // With every running job gone, would it fit?
    ClusterSnapshot empty = WithoutRunningJobs(snapshot, input);
    // The quota is not asked here: it counts what the running jobs hold, and they are gone in
    // this copy. A job the quota holds back once GPUs are free is told so then.
    const scheduler::ScheduleResult alone = TrySchedule(scheduler, job, empty, random);
    if (alone.scheduled()) {
      if (out.best_domain && census.free_milli >= out.needed_gpu_milli) {
        out.reason = PendingReason::kTopology;
        out.message = fmt::format(
            "{} GPUs are free in total, but no {} holds the whole gang of {} GPUs; the best, {}, "
            "has {} free and lacks {}",
            Gpus(census.free_milli), required, Gpus(out.needed_gpu_milli), out.best_domain->name,
            Gpus(out.best_domain->free_gpu_milli),
            Gpus(out.needed_gpu_milli - out.best_domain->free_gpu_milli));
      } else if (const std::optional<std::string_view> conflict =
                     SharingConflict(out.scheduler_reason)) {
        // The free milli-GPU is there, on GPUs whose shares run the other way (issue 40).
        out.reason = PendingReason::kCapacity;
        out.message = fmt::format(
            "it needs {} GPUs and {} of the GPUs it may use are free, but {}; it starts when "
            "those shares end",
            Gpus(out.needed_gpu_milli), Gpus(census.free_milli), *conflict);
      } else {
        out.reason = PendingReason::kCapacity;
        out.message = fmt::format(
            "it needs {} GPUs and {} of the GPUs it may use are free; it starts when running jobs "
            "free enough",
            Gpus(out.needed_gpu_milli), Gpus(census.free_milli));
      }
    } else {
      Job unconstrained = job;
      unconstrained.topology.required_level.clear();
      if (!required.empty() && TrySchedule(scheduler, unconstrained, empty, random).scheduled()) {
        out.reason = PendingReason::kTopology;
        topology_never = true;
        out.message = fmt::format(
            "no {} can ever hold the whole gang of {} GPUs{}", required, Gpus(out.needed_gpu_milli),
            out.best_domain
                ? fmt::format("; the largest, {}, has {} GPUs it may use", out.best_domain->name,
                              Gpus(out.best_domain->total_gpu_milli))
                : std::string());
      } else if (census.nodes.constraints == 0 &&
                 census.allowed_total_milli < out.needed_gpu_milli) {
        // No node is ruled out by the job's constraints: the fleet is smaller than the job.
        out.reason = PendingReason::kCapacity;
        fleet_too_small = true;
        out.message = fmt::format(
            "it needs {} GPUs and the whole fleet has {} it may use; it cannot start until GPUs "
            "are added or it asks for fewer",
            Gpus(out.needed_gpu_milli), Gpus(census.allowed_total_milli));
      } else if (census.healthy_total_milli < out.needed_gpu_milli &&
                 census.allowed_total_milli >= out.needed_gpu_milli) {
        out.reason = PendingReason::kHealth;
        out.message = fmt::format(
            "of the {} GPUs it may use, only {} are healthy on Ready nodes, fewer than the {} it "
            "needs ({} nodes unhealthy or not Ready)",
            Gpus(census.allowed_total_milli), Gpus(census.healthy_total_milli),
            Gpus(out.needed_gpu_milli), census.nodes.health);
      } else {
        out.reason = PendingReason::kConstraints;
        out.message = fmt::format(
            "no set of nodes it may use can hold it ({} of {} nodes excluded by its models, GPU "
            "memory, selector or size): {}",
            census.nodes.constraints, snapshot.nodes().size(), out.scheduler_reason);
      }
    }
  }
  if (out.reason == PendingReason::kNone) {
    // It fits, but the plan may hold it back for a job ahead that does not (EASY).
    PlanEta(scheduler, snapshot, input, random, out);
    if (out.eta_seconds == input.now_seconds) {
      return out;
    }
    out.reason = PendingReason::kReservation;
    out.message =
        "it fits now, but starting it would delay a job ahead of it that the backfill reserves "
        "GPUs for";
    AddWhatIfs(scheduler, snapshot, input, random, out);
    return out;
  }
  switch (out.reason) {
    case PendingReason::kNever:
      out.eta_why =
          "unknown: no node of the fleet can ever hold it; it is checked again when nodes join or "
          "change";
      break;
    case PendingReason::kConstraints:
    case PendingReason::kHealth:
      out.eta_why = "unknown: it cannot start until the job or the nodes change";
      break;
    case PendingReason::kQuota:
      out.eta_why = "unknown: it waits for its queue's quota, which running jobs of its queue free";
      break;
    default:
      if (topology_never) {
        out.eta_why = "unknown: no domain of the required level can ever hold it";
      } else if (fleet_too_small) {
        out.eta_why = "unknown: the fleet has fewer GPUs than it needs";
      } else {
        PlanEta(scheduler, snapshot, input, random, out);
      }
  }
  AddWhatIfs(scheduler, snapshot, input, random, out);
  if (out.reason == PendingReason::kNever || topology_never) {
    // Only changes after which the job could start once running jobs end: the rest cannot help
    // (a gang halved to 128 GPUs still fits no leaf of 64).
    ClusterSnapshot empty = WithoutRunningJobs(snapshot, input);
    std::erase_if(out.what_ifs, [&](const WhatIf& what_if) {
      return !what_if.would_start_now &&
             (CheckNeverFits(what_if.job, snapshot).has_value() ||
              !TrySchedule(scheduler, what_if.job, empty, random).scheduled());
    });
  }
  return out;
}

}  // namespace gpufleet::policy
