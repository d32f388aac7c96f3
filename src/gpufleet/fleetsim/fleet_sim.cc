// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/fleet_sim.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include <fmt/core.h>

#include "gpufleet/core/random.h"
#include "gpufleet/fleetsim/sim_fleet.h"

namespace gpufleet::fleetsim {
namespace {

Spread SpreadOf(std::vector<double> values) {
  Spread spread;
  spread.count = static_cast<int64_t>(values.size());
  if (values.empty()) {
    return spread;
  }
  std::sort(values.begin(), values.end());
  const auto at = [&](double share) {
    const size_t rank = static_cast<size_t>(std::ceil(share * static_cast<double>(values.size())));
    return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
  };
  spread.p50 = at(0.5);
  spread.p99 = at(0.99);
  spread.max = values.back();
  return spread;
}

nlohmann::json SpreadJson(const Spread& spread) {
  return {{"count", spread.count},
          {"p50_ms", spread.p50 * 1e3},
          {"p99_ms", spread.p99 * 1e3},
          {"max_ms", spread.max * 1e3}};
}

// One GPU, a few, a whole node, or a gang of whole nodes, weighted towards the small.
std::string DrawJob(Random& random, int64_t index, int gpus_per_node, int64_t duration_ms,
                    int& gpus) {
  const double shape = random.UniformDouble();
  int replicas = 1;
  if (shape < 0.4) {
    gpus = 1;
  } else if (shape < 0.7) {
    gpus = std::min(gpus_per_node, 2 << random.Uniform(2));  // 2 or 4
  } else if (shape < 0.9) {
    gpus = gpus_per_node;
  } else {
    gpus = gpus_per_node;
    replicas = 2 << random.Uniform(3);  // 2, 4 or 8 nodes
  }
  const int per_task = gpus;
  gpus *= replicas;
  return fmt::format(
      R"({{"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {{"name": "job-{}"}},
"spec": {{"tasks": [{{"name": "main", "replicas": {}, "command": ["train"],
"env": {{"GPUFLEET_SIM_DURATION_MS": "{}"}}, "resources": {{"gpus": {{"count": {}}}}}}}]}}}})",
      index, replicas, duration_ms, per_task);
}

}  // namespace

Result<FleetSimResult> RunFleetSim(const FleetSimOptions& options) {
  if (options.load <= 0 || options.load > 2) {
    return InvalidArgumentError(fmt::format("load: {} (must be in (0, 2])", options.load));
  }
  if (options.mean_job_duration <= Duration(0) || options.duration <= options.warmup ||
      options.warmup < Duration(0)) {
    return InvalidArgumentError(
        "the duration must be longer than the warm-up, the mean job duration positive");
  }
  if (options.timer == nullptr) {
    return InvalidArgumentError("timer: none (the real clock the figures are timed on)");
  }
  const Clock& timer = *options.timer;
  const MonoTime wall_start = timer.Now();
  FleetOptions fleet_options;
  fleet_options.nodes = options.nodes;
  fleet_options.gpus_per_node = options.gpus_per_node;
  fleet_options.nodes_per_leaf = options.nodes_per_leaf;
  fleet_options.seed = options.seed;
  fleet_options.request_timer = &timer;
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<SimFleet> fleet, SimFleet::Create(fleet_options));
  Random random(options.seed ^ 0x5DEECE66DULL);

  const double fleet_gpus = static_cast<double>(options.nodes) * options.gpus_per_node;
  const double mean_seconds = std::chrono::duration<double>(options.mean_job_duration).count();
  // Little's law: GPUs in use = arrival rate (GPUs/s) x mean duration. A job asks for about
  // kMeanJobGpus on average (the shape mix above, with 8-GPU nodes).
  const double mean_job_gpus =
      0.4 * 1 + 0.3 * 3 + 0.2 * options.gpus_per_node + 0.1 * options.gpus_per_node * (14.0 / 3.0);
  const double jobs_per_second = options.load * fleet_gpus / mean_seconds / mean_job_gpus;

  FleetSimResult result;
  result.nodes = options.nodes;
  result.gpus = static_cast<int>(fleet_gpus);
  std::vector<double> seconds;
  double arrivals_due = 0;
  // Fill the fleet to its load at the start, as if it had been running for a while.
  double backlog = options.load * fleet_gpus / mean_job_gpus;
  // Submitted over the first half of the warm-up (at least 200 a second).
  const double fill_per_second = std::max(
      200.0, backlog / std::max(1.0, std::chrono::duration<double>(options.warmup).count() / 2));
  const MonoTime measured_from = fleet->Now() + options.warmup;
  const MonoTime end = fleet->Now() + options.duration;
  bool measuring = false;
  while (fleet->Now() < end) {
    if (!measuring && fleet->Now() >= measured_from) {
      measuring = true;
      fleet->ClearRequestTimes();
    }
    arrivals_due += jobs_per_second;
    int submit = static_cast<int>(arrivals_due);
    arrivals_due -= submit;
    if (backlog > 0) {
      const int now_due = static_cast<int>(std::ceil(std::min(backlog, fill_per_second)));
      submit += now_due;
      backlog -= now_due;
    }
    for (int i = 0; i < submit; ++i) {
      const int64_t duration_ms =
          static_cast<int64_t>(-std::log(1 - random.UniformDouble()) * mean_seconds * 1000);
      int gpus = 0;
      const std::string body = DrawJob(random, result.jobs_submitted, options.gpus_per_node,
                                       std::max<int64_t>(duration_ms, 1000), gpus);
      GPUFLEET_ASSIGN_OR_RETURN(const api::ApiResponse answer,
                                fleet->AdminRequest("POST", "/v1/jobs", body));
      if (answer.status != 201) {
        return InternalError(fmt::format("submitting job-{}: {} {}", result.jobs_submitted,
                                         answer.status, answer.body));
      }
      ++result.jobs_submitted;
    }
    const MonoTime second_start = timer.Now();
    GPUFLEET_RETURN_IF_ERROR(fleet->Advance(std::chrono::seconds(1)));
    if (measuring) {
      seconds.push_back(std::chrono::duration<double>(timer.Now() - second_start).count());
    }
  }
  result.task_runs = static_cast<int64_t>(fleet->task_runs());
  fleet->LiveTasks();
  int64_t held = 0;
  for (const TaskSpan& span : fleet->ledger().spans()) {
    if (!span.end.has_value()) {
      held += static_cast<int64_t>(span.gpu_uuids.size());
    }
  }
  result.allocated_pct = 100.0 * static_cast<double>(held) / fleet_gpus;
  result.simulated_second = SpreadOf(std::move(seconds));
  for (const auto& [kind, times] : fleet->request_seconds()) {
    result.requests[kind] = SpreadOf(times);
  }
  result.wall_seconds = std::chrono::duration<double>(timer.Now() - wall_start).count();
  result.speedup = std::chrono::duration<double>(options.duration).count() / result.wall_seconds;
  return result;
}

nlohmann::json FleetSimResultJson(const FleetSimResult& result) {
  nlohmann::json requests = nlohmann::json::object();
  for (const auto& [kind, spread] : result.requests) {
    requests[kind] = SpreadJson(spread);
  }
  return {{"nodes", result.nodes},
          {"gpus", result.gpus},
          {"jobs_submitted", result.jobs_submitted},
          {"task_runs", result.task_runs},
          {"allocated_pct", result.allocated_pct},
          {"simulated_second", SpreadJson(result.simulated_second)},
          {"requests", requests},
          {"wall_seconds", result.wall_seconds},
          {"speedup", result.speedup}};
}

}  // namespace gpufleet::fleetsim
