// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpufleet/core/workload.h"

namespace gpufleet::sim {

// One job of a time-based trace: what it asks for (`job`: its id, task groups, queue, priority,
// kind, allowed GPU models, runtime estimate) plus when it arrives and how long it runs once all
// its tasks are placed.
struct TraceJob {
  Job job;
  int64_t submit_seconds = 0;    // since the start of the trace, >= 0
  int64_t duration_seconds = 0;  // run time on its GPUs, > 0
  std::string user;
  // Share of the run time spent in collectives on an ideal placement, in [0, 1]; negative: the
  // replay's default (ReplayOptions::communication_fraction).
  double communication_fraction = -1;
};

// A trace in submit order (ties keep file order).
struct Trace {
  std::string source;  // file name, for reports
  std::vector<TraceJob> jobs;
};

}  // namespace gpufleet::sim
