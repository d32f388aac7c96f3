// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/mig_sim.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/scheduler/registry.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/scheduler/snapshot.h"
#include "gpufleet/sim/chart.h"
#include "gpufleet/sim/event_queue.h"
#include "gpufleet/sim/html_page.h"
#include "gpufleet/sim/parallel.h"

namespace gpufleet::sim {
namespace {

constexpr int64_t kDaySeconds = 86400;
constexpr double kPi = 3.14159265358979323846;
constexpr int kLargeSize = 3;  // sizes from here up count as "large" in the mix chart

// The instance profile of `size` compute slices on `model`: the one with the least memory.
const MigProfile* ProfileOfSize(const GpuModelInfo& model, int size) {
  for (const MigProfile& profile : model.mig_profiles) {
    if (profile.compute_slices == size && !profile.media_extensions) {
      return &profile;
    }
  }
  return nullptr;
}

int SizeIndex(int size) {
  const auto* found = std::find(kMigSizes.begin(), kMigSizes.end(), size);
  return found == kMigSizes.end() ? -1 : static_cast<int>(found - kMigSizes.begin());
}

std::array<double, 5> Normalized(const std::array<double, 5>& mix) {
  const double total = std::accumulate(mix.begin(), mix.end(), 0.0);
  std::array<double, 5> result = mix;
  for (double& share : result) {
    share /= total;
  }
  return result;
}

double MeanSize(const std::array<double, 5>& mix) {
  double mean = 0;
  for (size_t i = 0; i < mix.size(); ++i) {
    mean += mix[i] * kMigSizes[i];
  }
  return mean;
}

// The mix at `time`: the night mix at midnight, the day mix at noon.
std::array<double, 5> MixAt(const std::array<double, 5>& day, const std::array<double, 5>& night,
                            int64_t time) {
  const double phase = 2 * kPi * static_cast<double>(time % kDaySeconds) / kDaySeconds;
  const double night_weight = 0.5 + 0.5 * std::cos(phase);
  std::array<double, 5> mix{};
  for (size_t i = 0; i < mix.size(); ++i) {
    mix[i] = night_weight * night[i] + (1 - night_weight) * day[i];
  }
  return mix;
}

size_t Draw(Random& random, const double* weights, size_t count) {
  double total = 0;
  for (size_t i = 0; i < count; ++i) {
    total += weights[i];
  }
  double pick = random.UniformDouble() * total;
  for (size_t i = 0; i < count; ++i) {
    if (pick < weights[i]) {
      return i;
    }
    pick -= weights[i];
  }
  return count - 1;
}

double Exponential(Random& random, double mean) {
  return -mean * std::log(1.0 - random.UniformDouble());
}

struct TaskSpec {
  int64_t arrival = 0;
  int64_t duration = 0;
  int size = 0;
  int group = 0;  // index into node_groups
};

// Poisson arrivals thinned to the time-varying rate that offers `load` of the fleet's slices.
std::vector<TaskSpec> MakeArrivals(const MigSimOptions& options, const std::vector<int>& slices,
                                   int total_slices) {
  const std::array<double, 5> day = Normalized(options.day_mix);
  const std::array<double, 5> night = Normalized(options.night_mix);
  const double mean_duration = static_cast<double>(options.mean_duration_seconds);
  auto rate = [&](double mean_size) {
    return options.load * total_slices / (mean_size * mean_duration);
  };
  // The mean size moves linearly between the two mixes, so the rate peaks at one of them.
  const double peak = rate(std::min(MeanSize(day), MeanSize(night)));
  std::vector<double> weights(slices.begin(), slices.end());
  Random random(options.seed);
  std::vector<TaskSpec> tasks;
  double time = 0;
  while (true) {
    time += Exponential(random, 1 / peak);
    if (time >= static_cast<double>(options.duration_seconds)) {
      break;
    }
    const int64_t at = static_cast<int64_t>(time);
    const std::array<double, 5> mix = MixAt(day, night, at);
    const double accept = random.UniformDouble();
    const size_t size = Draw(random, mix.data(), mix.size());
    const size_t group = Draw(random, weights.data(), weights.size());
    const double run = Exponential(random, mean_duration);
    if (accept >= rate(MeanSize(mix)) / peak) {
      continue;
    }
    const auto duration =
        std::clamp<int64_t>(std::llround(run), 60, 12 * options.mean_duration_seconds);
    tasks.push_back({at, duration, kMigSizes[size], static_cast<int>(group)});
  }
  return tasks;
}

// Places sizes[next...] on `layout`, trying the allowed starts in order; false when they do not
// all fit.
bool PlaceSizes(const GpuModelInfo& model, const std::vector<int>& sizes, size_t next,
                MigLayout& layout, std::vector<MigInstance>& instances) {
  if (next == sizes.size()) {
    return true;
  }
  const MigProfile* profile = ProfileOfSize(model, sizes[next]);
  if (profile == nullptr) {
    return false;
  }
  for (int start : profile->starts) {
    if (!layout.CanAddAt(*profile, start)) {
      continue;
    }
    layout.Add(*profile, start);
    instances.push_back({profile->name, start, false});
    if (PlaceSizes(model, sizes, next + 1, layout, instances)) {
      return true;
    }
    instances.pop_back();
    layout.Remove(*profile, start);
  }
  return false;
}

// Instances of `sizes` on one GPU, each at the lowest start that lets the rest fit; nullopt if
// they cannot all fit.
std::optional<std::vector<MigInstance>> PatternLayout(const GpuModelInfo& model,
                                                      const std::vector<int>& sizes) {
  MigLayout layout;
  std::vector<MigInstance> instances;
  if (!PlaceSizes(model, sizes, 0, layout, instances)) {
    return std::nullopt;
  }
  return instances;
}

class MigSim {
 public:
  MigSim(const MigSimOptions& options, MigMode mode, std::vector<TaskSpec> tasks,
         std::vector<Job> jobs, Cluster cluster, scheduler::ClusterSnapshot snapshot,
         std::unique_ptr<scheduler::Scheduler> placer, int total_slices)
      : options_(options),
        mode_(mode),
        tasks_(std::move(tasks)),
        jobs_(std::move(jobs)),
        cluster_(std::move(cluster)),
        snapshot_(std::move(snapshot)),
        placer_(std::move(placer)),
        random_(options.seed ^ 0x5bd1e995U),
        total_slices_(total_slices),
        waits_(tasks_.size(), -1) {
    const int64_t buckets =
        (options.duration_seconds + options.sample_seconds - 1) / options.sample_seconds;
    buckets_.resize(static_cast<size_t>(buckets));
    busy_.assign(buckets_.size(), 0);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      buckets_[b].start_seconds = static_cast<int64_t>(b) * options.sample_seconds;
    }
    for (size_t n = 0; n < cluster_.nodes.size(); ++n) {
      node_index_[cluster_.nodes[n].id] = static_cast<int>(n);
    }
  }

  Result<MigSimResult> Run() {
    for (size_t t = 0; t < tasks_.size(); ++t) {
      const int task = static_cast<int>(t);
      queue_.ScheduleAt(tasks_[t].arrival, [this, task] { Arrive(task); });
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const int64_t end =
          std::min(options_.duration_seconds, buckets_[b].start_seconds + options_.sample_seconds);
      queue_.ScheduleAt(
          end, [this, b] { buckets_[b].pending_at_end = static_cast<int>(pending_.size()); });
    }
    if (mode_ == MigMode::kRepartition) {
      queue_.ScheduleAt(options_.replan_interval_seconds, [this] { Tick(); });
    }
    while (!queue_.empty() && queue_.next_time() <= options_.duration_seconds && error_.ok()) {
      queue_.RunNext();
      Accumulate(queue_.now());
    }
    GPUFLEET_RETURN_IF_ERROR(error_);
    Accumulate(options_.duration_seconds);
    return Collect();
  }

 private:
  void Accumulate(int64_t until) {
    until = std::min(until, options_.duration_seconds);
    while (accounted_until_ < until) {
      const size_t bucket = static_cast<size_t>(accounted_until_ / options_.sample_seconds);
      const int64_t end =
          std::min(until, static_cast<int64_t>(bucket + 1) * options_.sample_seconds);
      busy_[bucket] +=
          static_cast<double>(in_use_slices_) * static_cast<double>(end - accounted_until_);
      accounted_until_ = end;
    }
  }

  MigBucket& BucketAt(int64_t time) {
    const size_t bucket = static_cast<size_t>(time / options_.sample_seconds);
    return buckets_[std::min(bucket, buckets_.size() - 1)];
  }

  void Arrive(int task) {
    const TaskSpec& spec = tasks_[static_cast<size_t>(task)];
    MigBucket& bucket = BucketAt(spec.arrival);
    ++bucket.arrived;
    bucket.arrived_large += spec.size >= kLargeSize ? 1 : 0;
    pending_.push_back(task);
    queue_.ScheduleAfter(options_.patience_seconds, [this, task] { GiveUp(task); });
    SchedulePass();
  }

  void GiveUp(int task) {
    auto found = std::find(pending_.begin(), pending_.end(), task);
    if (found != pending_.end()) {
      pending_.erase(found);
      ++abandoned_;
    }
  }

  void Finish(int task) {
    auto found = running_.find(task);
    snapshot_.Release(found->second);
    running_.erase(found);
    in_use_slices_ -= tasks_[static_cast<size_t>(task)].size;
    SchedulePass();
  }

  void Start(int task, scheduler::TaskPlacement placement) {
    const TaskSpec& spec = tasks_[static_cast<size_t>(task)];
    // The instance exists from now on: a rebuilt snapshot must find it, not create it again.
    for (scheduler::GpuAssignment& assignment : placement.gpus) {
      assignment.mig_created = false;
    }
    running_.emplace(task, std::move(placement));
    in_use_slices_ += spec.size;
    waits_[static_cast<size_t>(task)] = queue_.now() - spec.arrival;
    ++BucketAt(queue_.now()).served;
    queue_.ScheduleAfter(spec.duration, [this, task] { Finish(task); });
  }

  // Tries every waiting task in arrival order, skipping those of a model and size that already
  // failed in this pass (they would fail again).
  void SchedulePass() {
    std::set<std::pair<int, int>> blocked;
    std::vector<int> still_waiting;
    for (int task : pending_) {
      const TaskSpec& spec = tasks_[static_cast<size_t>(task)];
      const std::pair<int, int> kind(spec.group, spec.size);
      if (blocked.count(kind) > 0 || !error_.ok()) {
        still_waiting.push_back(task);
        continue;
      }
      scheduler::ScheduleResult result =
          placer_->Schedule(jobs_[static_cast<size_t>(task)], snapshot_, random_);
      if (result.scheduled() && mode_ == MigMode::kFixed && CreatedInstances(result) > 0) {
        // A fixed layout gets no new instances.
        for (const scheduler::TaskPlacement& placement : result.placements) {
          snapshot_.Revert(placement);
        }
        result.outcome = scheduler::ScheduleOutcome::kUnschedulable;
      }
      if (result.outcome == scheduler::ScheduleOutcome::kError) {
        error_ =
            InternalError(fmt::format("scheduling task {}: {}", task, result.error.ToString()));
      }
      if (!result.scheduled()) {
        blocked.insert(kind);
        still_waiting.push_back(task);
        continue;
      }
      Start(task, std::move(result.placements[0]));
    }
    pending_ = std::move(still_waiting);
  }

  static int CreatedInstances(const scheduler::ScheduleResult& result) {
    int created = 0;
    for (const scheduler::TaskPlacement& placement : result.placements) {
      for (const scheduler::GpuAssignment& assignment : placement.gpus) {
        created += assignment.mig_created ? 1 : 0;
      }
    }
    return created;
  }

  void Tick() {
    if (!pending_.empty()) {
      const Status replanned = Replan();
      if (!replanned.ok()) {
        error_ = replanned;
        return;
      }
    }
    queue_.ScheduleAfter(options_.replan_interval_seconds, [this] { Tick(); });
  }

  Status Replan() {
    std::vector<policy::MigRequest> requests;
    for (int task : pending_) {
      if (static_cast<int>(requests.size()) >= options_.max_plan_requests) {
        break;
      }
      std::vector<policy::MigRequest> of_task =
          policy::MigRequestsOf(jobs_[static_cast<size_t>(task)]);
      requests.insert(requests.end(), of_task.begin(), of_task.end());
    }
    GPUFLEET_ASSIGN_OR_RETURN(
        const policy::MigPlan plan,
        policy::PlanMigLayouts(snapshot_.catalog(), policy::MigGpusOf(snapshot_), requests,
                               options_.planner));
    ++planner_runs_;
    planner_runs_not_optimal_ += plan.optimal ? 0 : 1;
    planner_steps_ += plan.search_steps;
    if (plan.gpus.empty()) {
      return Status::Ok();
    }
    // The layouts after the plan, per (node, GPU); the snapshot is rebuilt from them.
    std::map<std::pair<int, int>, std::vector<MigInstance>> changed;
    for (const policy::MigGpuPlan& gpu_plan : plan.gpus) {
      const int node = node_index_.at(gpu_plan.node);
      // This cluster numbers its GPUs by position, so `Gpu::index` is the slot.
      const scheduler::GpuSlot& slot =
          snapshot_.nodes()[static_cast<size_t>(node)].gpus[static_cast<size_t>(gpu_plan.gpu)];
      GPUFLEET_ASSIGN_OR_RETURN(
          std::vector<MigInstance> layout,
          policy::ApplyMigGpuPlan(snapshot_.Model(slot.model_id), slot.mig_instances, gpu_plan));
      changed[{node, gpu_plan.gpu}] = std::move(layout);
      ++gpus_reconfigured_;
      instances_destroyed_ += static_cast<int>(gpu_plan.destroy.size());
      instances_created_ += static_cast<int>(gpu_plan.create.size());
    }
    GPUFLEET_RETURN_IF_ERROR(Rebuild(changed));
    SchedulePass();
    return Status::Ok();
  }

  // A new snapshot with the current layouts (and `changed` ones), all instances free, then the
  // running tasks put back on their instances.
  Status Rebuild(const std::map<std::pair<int, int>, std::vector<MigInstance>>& changed) {
    Cluster cluster = cluster_;
    for (size_t n = 0; n < cluster.nodes.size(); ++n) {
      for (size_t g = 0; g < cluster.nodes[n].gpus.size(); ++g) {
        auto found = changed.find({static_cast<int>(n), static_cast<int>(g)});
        std::vector<MigInstance>& instances = cluster.nodes[n].gpus[g].mig_instances;
        instances =
            found != changed.end() ? found->second : snapshot_.nodes()[n].gpus[g].mig_instances;
        for (MigInstance& instance : instances) {
          instance.in_use = false;
        }
      }
    }
    GPUFLEET_ASSIGN_OR_RETURN(
        scheduler::ClusterSnapshot rebuilt,
        scheduler::ClusterSnapshot::Build(std::move(cluster), snapshot_.catalog()));
    for (const auto& [task, placement] : running_) {
      const Status applied = rebuilt.Apply(placement);
      if (!applied.ok()) {
        return InternalError(fmt::format("task {} lost its MIG instance in a repartition: {}", task,
                                         applied.ToString()));
      }
    }
    snapshot_ = std::move(rebuilt);
    return Status::Ok();
  }

  MigSimResult Collect() const {
    MigSimResult result;
    result.mode = mode_;
    result.seed = options_.seed;
    result.duration_seconds = options_.duration_seconds;
    result.total_slices = total_slices_;
    result.total_gpus = total_slices_ / kMigComputeSlices;
    result.submitted = static_cast<int>(tasks_.size());
    result.abandoned = abandoned_;
    result.waiting_at_end = static_cast<int>(pending_.size());
    std::vector<double> waits;
    for (int size : kMigSizes) {
      result.by_size.push_back({size, 0, 0, 0, 0});
    }
    std::set<int> still_waiting(pending_.begin(), pending_.end());
    for (size_t t = 0; t < tasks_.size(); ++t) {
      MigSizeStats& stats = result.by_size[static_cast<size_t>(SizeIndex(tasks_[t].size))];
      ++stats.submitted;
      if (waits_[t] >= 0) {
        ++stats.served;
        stats.mean_wait_seconds += static_cast<double>(waits_[t]);
        waits.push_back(static_cast<double>(waits_[t]));
      } else if (still_waiting.count(static_cast<int>(t)) == 0) {
        ++stats.abandoned;
      }
    }
    for (MigSizeStats& stats : result.by_size) {
      stats.mean_wait_seconds = stats.served > 0 ? stats.mean_wait_seconds / stats.served : 0;
    }
    result.served = static_cast<int>(waits.size());
    if (!waits.empty()) {
      result.mean_wait_seconds =
          std::accumulate(waits.begin(), waits.end(), 0.0) / static_cast<double>(waits.size());
      std::sort(waits.begin(), waits.end());
      const size_t rank = static_cast<size_t>(std::ceil(0.95 * static_cast<double>(waits.size())));
      result.p95_wait_seconds = waits[std::max<size_t>(rank, 1) - 1];
    }
    double busy = 0;
    result.buckets = buckets_;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const int64_t width =
          std::min(options_.sample_seconds, options_.duration_seconds - buckets_[b].start_seconds);
      result.buckets[b].slice_utilization =
          busy_[b] / (static_cast<double>(total_slices_) * static_cast<double>(width));
      busy += busy_[b];
    }
    result.slice_utilization = busy / (static_cast<double>(total_slices_) *
                                       static_cast<double>(options_.duration_seconds));
    result.planner_runs = planner_runs_;
    result.planner_runs_not_optimal = planner_runs_not_optimal_;
    result.planner_steps = planner_steps_;
    result.gpus_reconfigured = gpus_reconfigured_;
    result.instances_destroyed = instances_destroyed_;
    result.instances_created = instances_created_;
    return result;
  }

  const MigSimOptions& options_;
  const MigMode mode_;
  const std::vector<TaskSpec> tasks_;
  const std::vector<Job> jobs_;
  const Cluster cluster_;  // the nodes; layouts come from the snapshot
  scheduler::ClusterSnapshot snapshot_;
  std::unique_ptr<scheduler::Scheduler> placer_;
  Random random_;
  const int total_slices_;
  EventQueue queue_;
  std::map<NodeId, int> node_index_;
  std::vector<int> pending_;  // task indices, in arrival order
  std::map<int, scheduler::TaskPlacement> running_;
  std::vector<int64_t> waits_;  // per task; -1 while not started
  std::vector<MigBucket> buckets_;
  std::vector<double> busy_;  // slice-seconds per bucket
  int64_t accounted_until_ = 0;
  int in_use_slices_ = 0;
  int abandoned_ = 0;
  int planner_runs_ = 0;
  int planner_runs_not_optimal_ = 0;
  int64_t planner_steps_ = 0;
  int gpus_reconfigured_ = 0;
  int instances_destroyed_ = 0;
  int instances_created_ = 0;
  Status error_;
};

std::string PercentText(double share) {
  return fmt::format("{:.1f}%", 100 * share);
}

std::string MinutesText(double seconds) {
  return fmt::format("{:.1f} min", seconds / 60);
}

}  // namespace

const char* MigModeName(MigMode mode) {
  switch (mode) {
    case MigMode::kFixed:
      return "fixed";
    case MigMode::kCreateOnly:
      return "create-only";
    case MigMode::kRepartition:
      return "repartition";
  }
  return "unknown";
}

Status MigSimOptions::Validate(const GpuCatalog& catalog) const {
  if (duration_seconds <= 0) {
    return InvalidArgumentError(
        fmt::format("duration_seconds: {} (must be positive)", duration_seconds));
  }
  if (node_groups.empty()) {
    return InvalidArgumentError("node_groups: empty (need at least one MIG model)");
  }
  for (size_t i = 0; i < node_groups.size(); ++i) {
    Result<const GpuModelInfo*> model = catalog.Find(node_groups[i].model);
    if (!model.ok()) {
      return InvalidArgumentError(
          fmt::format("node_groups[{}].model: {}", i, model.status().message()));
    }
    if (!(*model)->SupportsMig()) {
      return InvalidArgumentError(
          fmt::format("node_groups[{}].model: {} has no MIG", i, (*model)->name));
    }
    if (node_groups[i].nodes < 1) {
      return InvalidArgumentError(
          fmt::format("node_groups[{}].nodes: {} (must be at least 1)", i, node_groups[i].nodes));
    }
    for (size_t p = 0; p < initial_layout.size(); ++p) {
      if (!PatternLayout(**model, initial_layout[p]).has_value()) {
        return InvalidArgumentError(fmt::format(
            "initial_layout[{}]: sizes {} do not fit on one {} (sizes are among 1, 2, 3, 4, 7)", p,
            fmt::join(initial_layout[p], ","), (*model)->name));
      }
    }
  }
  if (gpus_per_node < 1 || gpus_per_node > scheduler::kMaxGpusPerNode) {
    return InvalidArgumentError(fmt::format("gpus_per_node: {} (must be in [1, {}])", gpus_per_node,
                                            scheduler::kMaxGpusPerNode));
  }
  if (!(load > 0 && load <= 4)) {
    return InvalidArgumentError(fmt::format("load: {} (must be in (0, 4])", load));
  }
  if (mean_duration_seconds < 60) {
    return InvalidArgumentError(
        fmt::format("mean_duration_seconds: {} (must be at least 60)", mean_duration_seconds));
  }
  if (patience_seconds < 0) {
    return InvalidArgumentError(
        fmt::format("patience_seconds: {} (must not be negative)", patience_seconds));
  }
  for (const auto& [name, mix] :
       {std::pair("day_mix", &day_mix), std::pair("night_mix", &night_mix)}) {
    double total = 0;
    for (size_t i = 0; i < mix->size(); ++i) {
      if (!((*mix)[i] >= 0)) {
        return InvalidArgumentError(
            fmt::format("{}[{}]: {} (must not be negative)", name, i, (*mix)[i]));
      }
      total += (*mix)[i];
    }
    if (!(total > 0)) {
      return InvalidArgumentError(fmt::format("{}: all shares are zero", name));
    }
  }
  if (initial_layout.empty()) {
    return InvalidArgumentError("initial_layout: empty (give at least one pattern)");
  }
  if (replan_interval_seconds < 1) {
    return InvalidArgumentError(
        fmt::format("replan_interval_seconds: {} (must be at least 1)", replan_interval_seconds));
  }
  if (max_plan_requests < 1) {
    return InvalidArgumentError(
        fmt::format("max_plan_requests: {} (must be at least 1)", max_plan_requests));
  }
  if (planner.search_budget < 0) {
    return InvalidArgumentError(
        fmt::format("planner.search_budget: {} (must not be negative)", planner.search_budget));
  }
  if (sample_seconds < 60) {
    return InvalidArgumentError(
        fmt::format("sample_seconds: {} (must be at least 60)", sample_seconds));
  }
  return Status::Ok();
}

Result<MigSimResult> RunMigSim(const MigSimOptions& options, MigMode mode,
                               const GpuCatalog& catalog) {
  GPUFLEET_RETURN_IF_ERROR(options.Validate(catalog));
  Cluster cluster;
  std::vector<int> group_slices;
  std::vector<std::string> group_models;
  int total_slices = 0;
  for (size_t group = 0; group < options.node_groups.size(); ++group) {
    const GpuModelInfo& model = *catalog.Find(options.node_groups[group].model).value();
    group_models.push_back(model.name);
    group_slices.push_back(options.node_groups[group].nodes * options.gpus_per_node *
                           kMigComputeSlices);
    total_slices += group_slices.back();
    for (int n = 0; n < options.node_groups[group].nodes; ++n) {
      Node node;
      node.id = NodeId(fmt::format("{}-{}", model.name, n));
      node.capacity = {256000, 2097152};
      for (int g = 0; g < options.gpus_per_node; ++g) {
        Gpu gpu;
        gpu.uuid = GpuUuid(fmt::format("GPU-{}-{}", node.id.value(), g));
        gpu.index = g;
        gpu.model = model.name;
        gpu.mig_enabled = true;
        if (mode != MigMode::kCreateOnly) {
          const std::vector<int>& pattern =
              options.initial_layout[static_cast<size_t>(g) % options.initial_layout.size()];
          gpu.mig_instances = *PatternLayout(model, pattern);
        }
        node.gpus.push_back(std::move(gpu));
      }
      cluster.nodes.push_back(std::move(node));
    }
  }
  std::vector<TaskSpec> tasks = MakeArrivals(options, group_slices, total_slices);
  std::vector<Job> jobs;
  jobs.reserve(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t) {
    const GpuModelInfo& model =
        *catalog.Find(group_models[static_cast<size_t>(tasks[t].group)]).value();
    Job job;
    job.id = JobId(fmt::format("t{}", t));
    job.groups.push_back(
        {"task", 1, {{100, 64}, MigGpus{ProfileOfSize(model, tasks[t].size)->name, 1}}});
    job.allowed_gpu_models = {model.name};
    jobs.push_back(std::move(job));
  }
  GPUFLEET_ASSIGN_OR_RETURN(scheduler::ClusterSnapshot snapshot,
                            scheduler::ClusterSnapshot::Build(cluster, catalog));
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<scheduler::Scheduler> placer,
                            scheduler::Scheduler::Create(scheduler::SchedulerOptions{},
                                                         scheduler::PluginRegistry::Default()));
  MigSim sim(options, mode, std::move(tasks), std::move(jobs), std::move(cluster),
             std::move(snapshot), std::move(placer), total_slices);
  return sim.Run();
}

Result<std::vector<MigSimResult>> RunMigSims(const MigSimOptions& options,
                                             const GpuCatalog& catalog, int threads) {
  const std::vector<MigMode> modes = {MigMode::kFixed, MigMode::kCreateOnly, MigMode::kRepartition};
  return ParallelMap<MigSimResult>(
      modes.size(), threads, [&](size_t i) { return RunMigSim(options, modes[i], catalog); },
      nullptr);
}

void PrintMigSummary(const std::vector<MigSimResult>& results, std::ostream& out) {
  auto row = [&](const std::string& label, auto value) {
    std::string line = fmt::format("{:<30}", label);
    for (const MigSimResult& r : results) {
      line += fmt::format("{:>16}", value(r));
    }
    out << line << "\n";
  };
  row("", [](const MigSimResult& r) { return std::string(MigModeName(r.mode)); });
  row("tasks submitted", [](const MigSimResult& r) { return std::to_string(r.submitted); });
  row("served", [](const MigSimResult& r) {
    return fmt::format("{} ({})", r.served, PercentText(r.ServedShare()));
  });
  row("abandoned (patience)", [](const MigSimResult& r) { return std::to_string(r.abandoned); });
  row("waiting at the end", [](const MigSimResult& r) { return std::to_string(r.waiting_at_end); });
  row("mean wait of served",
      [](const MigSimResult& r) { return MinutesText(r.mean_wait_seconds); });
  row("p95 wait of served", [](const MigSimResult& r) { return MinutesText(r.p95_wait_seconds); });
  row("GPU-slice utilization",
      [](const MigSimResult& r) { return PercentText(r.slice_utilization); });
  for (size_t s = 0; s < kMigSizes.size(); ++s) {
    row(fmt::format("served {}g", kMigSizes[s]), [s](const MigSimResult& r) {
      const MigSizeStats& stats = r.by_size[s];
      return stats.submitted > 0 ? fmt::format("{}/{}", stats.served, stats.submitted)
                                 : std::string("-");
    });
  }
  row("GPUs reconfigured",
      [](const MigSimResult& r) { return std::to_string(r.gpus_reconfigured); });
  row("instances destroyed/created", [](const MigSimResult& r) {
    return fmt::format("{}/{}", r.instances_destroyed, r.instances_created);
  });
  row("planner runs (budget hit)", [](const MigSimResult& r) {
    return fmt::format("{} ({})", r.planner_runs, r.planner_runs_not_optimal);
  });
}

Status WriteMigReport(const std::vector<MigSimResult>& results, const MigSimOptions& options,
                      const std::string& title, std::ostream& out) {
  if (results.empty()) {
    return InvalidArgumentError("no runs to report");
  }
  std::string body;
  auto append = [&body]<typename... Args>(fmt::format_string<Args...> format, Args&&... args) {
    fmt::format_to(std::back_inserter(body), format, std::forward<Args>(args)...);
  };
  const MigSimResult& first = results.front();
  std::string groups;
  for (const MigNodeGroup& group : options.node_groups) {
    groups += fmt::format("{}{} x {} {}", groups.empty() ? "" : " + ", group.nodes,
                          options.gpus_per_node, group.model);
  }
  append(
      "<p class=\"note\">{} GPUs ({}), {} compute slices; {:.1f} days, seed {}; {} MIG tasks "
      "at an offered load of {} of the slices, mean run time {}, patience {}; the mix moves "
      "from small instances at noon to large ones at midnight.</p>\n",
      first.total_gpus, XmlEscape(groups), first.total_slices,
      static_cast<double>(first.duration_seconds) / kDaySeconds, first.seed, first.submitted,
      options.load, MinutesText(static_cast<double>(options.mean_duration_seconds)),
      MinutesText(static_cast<double>(options.patience_seconds)));
  std::string claim;
  for (const MigSimResult& r : results) {
    claim += fmt::format("{}{}: {} of tasks served, {} of slices busy", claim.empty() ? "" : "; ",
                         MigModeName(r.mode), PercentText(r.ServedShare()),
                         PercentText(r.slice_utilization));
  }
  append("<p class=\"claim\">{}.</p>\n", XmlEscape(claim));

  body +=
      "<h2>Runs</h2>\n<table>\n<tr><th>mode</th><th>submitted</th><th>served</th>"
      "<th>abandoned</th><th>waiting at end</th><th>mean wait</th><th>p95 wait</th>"
      "<th>slice utilization</th><th>GPUs reconfigured</th><th>destroyed</th>"
      "<th>created</th><th>planner runs</th><th>budget hit</th></tr>\n";
  for (const MigSimResult& r : results) {
    body += "<tr>" + HtmlCell(MigModeName(r.mode)) + HtmlNumCell(std::to_string(r.submitted)) +
            HtmlNumCell(fmt::format("{} ({})", r.served, PercentText(r.ServedShare()))) +
            HtmlNumCell(std::to_string(r.abandoned)) +
            HtmlNumCell(std::to_string(r.waiting_at_end)) +
            HtmlNumCell(MinutesText(r.mean_wait_seconds)) +
            HtmlNumCell(MinutesText(r.p95_wait_seconds)) +
            HtmlNumCell(PercentText(r.slice_utilization)) +
            HtmlNumCell(std::to_string(r.gpus_reconfigured)) +
            HtmlNumCell(std::to_string(r.instances_destroyed)) +
            HtmlNumCell(std::to_string(r.instances_created)) +
            HtmlNumCell(std::to_string(r.planner_runs)) +
            HtmlNumCell(std::to_string(r.planner_runs_not_optimal)) + "</tr>\n";
  }
  body += "</table>\n";

  body += "<h2>Served by instance size</h2>\n<table>\n<tr><th>size</th>";
  for (const MigSimResult& r : results) {
    append("<th>{} served</th><th>{} mean wait</th>", MigModeName(r.mode), MigModeName(r.mode));
  }
  body += "</tr>\n";
  for (size_t s = 0; s < kMigSizes.size(); ++s) {
    body += "<tr>" +
            HtmlCell(fmt::format("{}g ({} submitted)", kMigSizes[s], first.by_size[s].submitted));
    for (const MigSimResult& r : results) {
      const MigSizeStats& stats = r.by_size[s];
      body += HtmlNumCell(stats.submitted > 0
                              ? PercentText(static_cast<double>(stats.served) / stats.submitted)
                              : "-") +
              HtmlNumCell(MinutesText(stats.mean_wait_seconds));
    }
    body += "</tr>\n";
  }
  body += "</table>\n";

  auto hours = [&](const MigSimResult& r) {
    std::vector<double> x;
    for (const MigBucket& bucket : r.buckets) {
      x.push_back(static_cast<double>(bucket.start_seconds) / 3600);
    }
    return x;
  };
  ChartSpec utilization{"GPU-slice utilization", "hour", "compute slices busy (%)", {}, true, true};
  ChartSpec waiting{"Tasks waiting", "hour", "tasks", {}, true, true};
  for (const MigSimResult& r : results) {
    Series busy{MigModeName(r.mode), hours(r), {}};
    Series queued{MigModeName(r.mode), hours(r), {}};
    for (const MigBucket& bucket : r.buckets) {
      busy.y.push_back(100 * bucket.slice_utilization);
      queued.y.push_back(bucket.pending_at_end);
    }
    utilization.series.push_back(std::move(busy));
    waiting.series.push_back(std::move(queued));
  }
  ChartSpec mix{"Demand mix", "hour", "arrivals of 3g or larger (%)", {}, true, true};
  Series large{"share of large instances", hours(first), {}};
  for (const MigBucket& bucket : first.buckets) {
    large.y.push_back(bucket.arrived > 0 ? 100.0 * bucket.arrived_large / bucket.arrived : 0);
  }
  mix.series.push_back(std::move(large));
  ChartSpec by_size{
      "Served share by instance size", "compute slices", "tasks served (%)", {}, false, true};
  for (const MigSimResult& r : results) {
    Series served{MigModeName(r.mode), {}, {}};
    for (const MigSizeStats& stats : r.by_size) {
      if (stats.submitted > 0) {
        served.x.push_back(stats.size);
        served.y.push_back(100.0 * stats.served / stats.submitted);
      }
    }
    by_size.series.push_back(std::move(served));
  }
  body += "<h2>Over time</h2>\n" + FigureHtml(utilization) + FigureHtml(waiting) + FigureHtml(mix);
  body += "<h2>By size</h2>\n" + FigureHtml(by_size);
  body +=
      "<p class=\"note\">Fixed: the initial layout, never changed. Create-only: GPUs start empty; "
      "the scheduler creates instances in free slices and never destroys them. Repartition: the "
      "initial layout, then every replan interval while tasks wait the MIG planner lays out again "
      "the GPUs whose instances are free (instances in use are never touched). A reconfiguration "
      "takes effect at once here; on hardware it takes seconds, small against these run "
      "times.</p>\n";
  return WriteHtmlPage(title, body, out);
}

}  // namespace gpufleet::sim
