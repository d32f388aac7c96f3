// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/fill.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "gpufleet/core/random.h"
#include "gpufleet/policy/workload_history.h"
#include "gpufleet/scheduler/fragmentation.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/sim/parallel.h"

namespace gpufleet::sim {
namespace {

using scheduler::ClusterSnapshot;
using scheduler::FragmentationModel;
using scheduler::TargetWorkload;

TargetWorkload WorkloadOf(const std::vector<Job>& pods, double coverage) {
  std::vector<scheduler::TaskShape> shapes;
  shapes.reserve(pods.size());
  for (const Job& pod : pods) {
    shapes.push_back(scheduler::ShapeOf(pod.groups[0].request, pod.allowed_gpu_models));
  }
  return TargetWorkload::FromShapes(shapes, coverage);
}

struct Bucket {
  double allocation = 0;
  double fragmentation = 0;
  double rate = 0;
  int events = 0;
};

}  // namespace

const FillPoint* FillResult::At(int percent) const {
  for (const FillPoint& point : points) {
    if (point.arrived_percent == percent) {
      return &point;
    }
  }
  return nullptr;
}

double FillResult::UnallocatedGpusAt(int percent) const {
  const FillPoint* point = At(percent);
  return point == nullptr ? -1 : (100.0 - point->allocation_percent) * total_gpus / 100.0;
}

std::vector<Job> FillArrivalOrder(const std::vector<Job>& pods, int64_t capacity_milli,
                                  double load_target, uint64_t seed) {
  std::vector<Job> sorted = pods;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Job& a, const Job& b) { return a.id < b.id; });
  Random random(seed);
  std::vector<Job> order = sorted;
  random.Shuffle(order);
  int64_t requested = 0;
  for (const Job& pod : order) {
    requested += pod.RequestedGpuMilliTotal();
  }
  const double target = load_target * static_cast<double>(capacity_milli);
  for (int copy = 0; !sorted.empty(); ++copy) {
    Job extra = sorted[random.Uniform(sorted.size())];
    if (static_cast<double>(requested + extra.RequestedGpuMilliTotal()) > target) {
      break;
    }
    requested += extra.RequestedGpuMilliTotal();
    extra.id = JobId(fmt::format("{}-copy-{}", extra.id.value(), copy));
    order.push_back(std::move(extra));
  }
  return order;
}

int ArrivedPercent(int64_t arrived_milli, int64_t capacity_milli) {
  return static_cast<int>(std::nearbyint(100.0 * static_cast<double>(arrived_milli) /
                                         static_cast<double>(capacity_milli)));
}

std::vector<size_t> FillEventsAt(const std::vector<Job>& order, int64_t capacity_milli,
                                 int percent) {
  std::vector<int> percents;
  percents.reserve(order.size());
  int64_t arrived = 0;
  for (const Job& pod : order) {
    arrived += pod.RequestedGpuMilliTotal();
    percents.push_back(ArrivedPercent(arrived, capacity_milli));
  }
  // The same rule as RunFill's points: the percent's own events, else its neighbours'.
  std::vector<size_t> events;
  for (size_t i = 0; i < percents.size(); ++i) {
    if (percents[i] == percent) {
      events.push_back(i);
    }
  }
  if (events.empty()) {
    for (size_t i = 0; i < percents.size(); ++i) {
      if (percents[i] == percent - 1 || percents[i] == percent + 1) {
        events.push_back(i);
      }
    }
  }
  return events;
}

Result<FillResult> RunFill(const Cluster& cluster, const std::vector<Job>& pods,
                           const GpuCatalog& catalog, const FillOptions& options) {
  // The reference simulator renames nodes with a seeded random prefix, which puts them in a
  // seeded random order; ties between equal scores go to the first node in that order.
  Cluster ordered = cluster;
  Random node_order(options.seed ^ 0x0dde0dde0dde0ddeULL);
  node_order.Shuffle(ordered.nodes);
  GPUFLEET_ASSIGN_OR_RETURN(ClusterSnapshot snapshot,
                            ClusterSnapshot::Build(std::move(ordered), catalog));
  const TargetWorkload workload = WorkloadOf(pods, options.workload_coverage);
  scheduler::SchedulerOptions scheduler_options;
  scheduler_options.policy = options.policy;
  scheduler_options.plugin_args.target_workload = workload;
  scheduler_options.tie_break = options.tie_break;
  GPUFLEET_ASSIGN_OR_RETURN(
      std::unique_ptr<scheduler::Scheduler> placer,
      scheduler::Scheduler::Create(scheduler_options, scheduler::PluginRegistry::Default()));

  const int64_t capacity = snapshot.TotalGpuMilli();
  if (capacity == 0) {
    return InvalidArgumentError("cluster: no GPUs to fill");
  }
  const std::vector<Job> order =
      FillArrivalOrder(pods, capacity, options.load_target, options.seed);
  std::optional<policy::WorkloadHistory> learnt;
  if (options.learn_every > 0 && policy::NeedsTargetWorkload(options.policy)) {
    learnt.emplace(policy::WorkloadHistoryOptions{.coverage = options.workload_coverage});
  }
  const FragmentationModel fragmentation(workload, snapshot);
  std::vector<double> node_fragmentation(snapshot.nodes().size());
  double total_fragmentation = 0;
  for (const scheduler::NodeInfo& node : snapshot.nodes()) {
    node_fragmentation[node.index] = fragmentation.NodeFragmentation(node);
    total_fragmentation += node_fragmentation[node.index];
  }

  FillResult result;
  result.policy = options.policy;
  result.seed = options.seed;
  result.total_gpus = snapshot.TotalGpus();
  std::map<int, Bucket> buckets;
  // The scheduler draws its tie-breaks from a stream of its own, so the arrival order does not
  // depend on the policy.
  Random tie_breaks(options.seed ^ 0x5eed5eed5eed5eedULL);
  int64_t arrived = 0;
  for (const Job& pod : order) {
    // The fill has no clock: arrival i happens at i seconds, so the default day-long half-life
    // barely decays anything, as no pod ever leaves.
    const MonoTime arrival{int64_t{result.pods_arrived} * 1000000000};
    if (learnt && result.pods_arrived % options.learn_every == 0) {
      policy::WorkloadHistory seen = *learnt;
      if (seen.empty()) {
        seen.Record(pod, arrival);
      }
      scheduler_options.plugin_args.target_workload = seen.Target();
      scheduler_options.policy =
          scheduler_options.plugin_args.target_workload.empty() ? "best-fit" : options.policy;
      GPUFLEET_ASSIGN_OR_RETURN(
          placer,
          scheduler::Scheduler::Create(scheduler_options, scheduler::PluginRegistry::Default()));
    }
    arrived += pod.RequestedGpuMilliTotal();
    ++result.pods_arrived;
    const scheduler::ScheduleResult placed = placer->Schedule(pod, snapshot, tie_breaks);
    if (learnt && placed.scheduled()) {
      learnt->Record(pod, arrival);
    }
    if (placed.outcome == scheduler::ScheduleOutcome::kError) {
      return Status(placed.error.code(),
                    fmt::format("pod {}: {}", pod.id.value(), placed.error.message()));
    }
    if (!placed.scheduled()) {
      ++result.pods_failed;
    }
    for (const scheduler::TaskPlacement& placement : placed.placements) {
      const double now = fragmentation.NodeFragmentation(snapshot.nodes()[placement.node]);
      total_fragmentation += now - node_fragmentation[placement.node];
      node_fragmentation[placement.node] = now;
    }
    const double allocated = static_cast<double>(snapshot.AllocatedGpuMilli());
    const double idle = static_cast<double>(capacity) - allocated;
    const int percent = ArrivedPercent(arrived, capacity);
    Bucket& bucket = buckets[percent];
    bucket.allocation += 100.0 * allocated / static_cast<double>(capacity);
    bucket.fragmentation += 100.0 * total_fragmentation / static_cast<double>(capacity);
    bucket.rate += idle > 0 ? 100.0 * total_fragmentation / idle : 0.0;
    ++bucket.events;
  }
  const int last = static_cast<int>(std::floor(100.0 * options.load_target + 1e-9));
  for (int percent = 0; percent <= last; ++percent) {
    // As the reference analysis does: a percent no event rounded to takes its neighbours.
    Bucket sum;
    if (auto it = buckets.find(percent); it != buckets.end()) {
      sum = it->second;
    } else {
      for (int near : {percent - 1, percent + 1}) {
        if (auto neighbour = buckets.find(near); neighbour != buckets.end()) {
          sum.allocation += neighbour->second.allocation;
          sum.fragmentation += neighbour->second.fragmentation;
          sum.rate += neighbour->second.rate;
          sum.events += neighbour->second.events;
        }
      }
    }
    if (sum.events == 0) {
      continue;
    }
    result.points.push_back({percent, sum.allocation / sum.events, sum.fragmentation / sum.events,
                             sum.rate / sum.events});
  }
  return result;
}

Result<std::vector<FillResult>> RunFillMatrix(const Cluster& cluster, const std::vector<Job>& pods,
                                              const GpuCatalog& catalog,
                                              const std::vector<std::string>& policies,
                                              const std::vector<uint64_t>& seeds,
                                              const FillOptions& options, int threads,
                                              const std::function<void()>& on_run_done) {
  std::vector<FillOptions> runs;
  for (const std::string& policy : policies) {
    for (uint64_t seed : seeds) {
      FillOptions run = options;
      run.policy = policy;
      run.seed = seed;
      runs.push_back(std::move(run));
    }
  }
  return ParallelMap<FillResult>(
      runs.size(), threads, [&](size_t i) { return RunFill(cluster, pods, catalog, runs[i]); },
      on_run_done);
}

}  // namespace gpufleet::sim
