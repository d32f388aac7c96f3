// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"

// `gpufleet sim fleet` (docs/simulator.md): a fleet of the production server and agents in one
// process (SimFleet) at a size of your choosing, fed a steady synthetic load, and what the control
// plane costs at that size: the wall time of each scheduling cycle and of each agent request.
namespace gpufleet::fleetsim {

struct FleetSimOptions {
  int nodes = 1000;
  int gpus_per_node = 8;
  int nodes_per_leaf = 32;
  uint64_t seed = 42;
  // Simulated time run; the load is offered from the start. The figures leave out the first
  // `warmup` (the first fill of the fleet).
  Duration duration = std::chrono::minutes(5);
  Duration warmup = std::chrono::minutes(1);
  // Jobs arrive so that, once running, they ask for this share of the fleet's GPUs.
  double load = 0.9;
  // Mean job duration (exponential).
  Duration mean_job_duration = std::chrono::minutes(30);
  // The real clock the figures are timed on (SystemClock in `gpufleet sim fleet`). Required.
  const Clock* timer = nullptr;
};

// p50, p99 and max of a sample, in seconds.
struct Spread {
  int64_t count = 0;
  double p50 = 0;
  double p99 = 0;
  double max = 0;
};

struct FleetSimResult {
  int nodes = 0;
  int gpus = 0;
  int64_t jobs_submitted = 0;
  int64_t task_runs = 0;
  // GPUs held by live tasks at the end, as a share of the fleet's.
  double allocated_pct = 0;
  // The real time one simulated second took (every agent due, then the cycle).
  Spread simulated_second;
  // By kind: the scheduling cycle ("cycle") and the agent requests ("register", "heartbeat",
  // "provenance").
  std::map<std::string, Spread> requests;
  // Real time the whole run took, and simulated seconds per real second.
  double wall_seconds = 0;
  double speedup = 0;
};

// kInvalidArgument naming a bad option; the fleet's errors.
Result<FleetSimResult> RunFleetSim(const FleetSimOptions& options);

nlohmann::json FleetSimResultJson(const FleetSimResult& result);

}  // namespace gpufleet::fleetsim
