// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/ids.h"
#include "gpufleet/reliability/inventory.h"
#include "gpufleet/reliability/outcome.h"

// Small fleets and outcome records for the reliability tests.
namespace gpufleet::reliability::testing {

// Nodes "n0".. with GPUs "n0-g0".., `nodes_per_leaf` nodes per leaf "leaf0"...
inline FleetInventory MakeFleet(int nodes, int gpus_per_node, int nodes_per_leaf) {
  FleetInventory inventory;
  for (int n = 0; n < nodes; ++n) {
    std::vector<GpuUuid> gpus;
    for (int g = 0; g < gpus_per_node; ++g) {
      gpus.push_back(GpuUuid(fmt::format("n{}-g{}", n, g)));
    }
    const Status added = inventory.AddNode(NodeId(fmt::format("n{}", n)),
                                           fmt::format("leaf{}", n / nodes_per_leaf), gpus);
    if (!added.ok()) {
      return FleetInventory();
    }
  }
  return inventory;
}

inline GpuUuid Gpu(int node, int gpu) {
  return GpuUuid(fmt::format("n{}-g{}", node, gpu));
}

inline MonoTime Hours(double hours) {
  return MonoTime{static_cast<int64_t>(hours * 3.6e12)};
}

// A run of `job` on `gpus` (of the fleet above) from `start_hours` for `hours`; nodes filled in.
inline OutcomeRecord MakeRun(const std::string& job, const std::vector<GpuUuid>& gpus,
                             double start_hours, double hours, ExitReason exit_reason) {
  OutcomeRecord record;
  record.job = JobId(job);
  record.exit_reason = exit_reason;
  record.start = Hours(start_hours);
  record.end = Hours(start_hours + hours);
  record.gpus = gpus;
  for (const GpuUuid& gpu : gpus) {
    const NodeId node(gpu.value().substr(0, gpu.value().find('-')));
    bool seen = false;
    for (const NodeId& known : record.nodes) {
      seen = seen || known == node;
    }
    if (!seen) {
      record.nodes.push_back(node);
    }
  }
  return record;
}

// A run that failed with `xid` on its first GPU.
inline OutcomeRecord FailedWithXid(const std::string& job, const std::vector<GpuUuid>& gpus,
                                   double start_hours, double hours, int xid) {
  OutcomeRecord record = MakeRun(job, gpus, start_hours, hours, ExitReason::kInfraError);
  record.xids.push_back(XidEvent{gpus.front(), xid});
  return record;
}

}  // namespace gpufleet::reliability::testing
