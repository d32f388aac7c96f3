// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/scheduler/snapshot.h"

// Small hand-made clusters and jobs for scheduler tests and benchmarks.
namespace gpufleet::scheduler::testing {

// A Ready node with `gpus` idle GPUs of `model` (all in NVLink domain 0) under `topology`.
Node MakeNode(const std::string& id, int gpus, const std::string& model = "H100-80GB",
              std::vector<std::string> topology = {}, HostResources capacity = {96000, 1048576});

// A job of one group: `replicas` tasks asking for `gpus` and `host`.
Job MakeJob(const std::string& id, int replicas, GpuRequest gpus,
            HostResources host = {1000, 1024});

// A task on node `node` of `snapshot` holding `gpus` of its idle GPUs (lowest indices first),
// 1 CPU and 1 GiB; not applied. Fewer GPUs when the node has fewer idle.
TaskPlacement IdleGpusPlacement(const ClusterSnapshot& snapshot, int node, int gpus);

}  // namespace gpufleet::scheduler::testing
