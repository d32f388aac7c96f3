// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/sim/trace.h"

namespace gpufleet::sim::testing {

// A job of `gpus` whole GPUs (tasks of 8 beyond 8 GPUs), 1 CPU and 1 GiB per task, arriving at
// `submit` and running `duration` seconds, with that run time as its estimate.
inline TraceJob MakeTraceJob(const std::string& id, int64_t submit, int64_t duration, int gpus) {
  TraceJob job;
  job.job.id = JobId(id);
  const int tasks = gpus > 8 ? gpus / 8 : 1;
  job.job.groups.push_back({"task", tasks, {{1000, 1024}, WholeGpus{gpus / tasks}}});
  job.job.runtime_estimate = std::chrono::seconds(duration);
  job.submit_seconds = submit;
  job.duration_seconds = duration;
  return job;
}

// 2 nodes x 8 GPUs.
inline Cluster SixteenGpus(const GpuCatalog& catalog) {
  return MakeSyntheticCluster({1, 1, 2, 8, "V100-32GB"}, catalog).value();
}

}  // namespace gpufleet::sim::testing
