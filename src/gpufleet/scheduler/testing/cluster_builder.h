// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/workload.h"

// Small hand-made clusters and jobs for scheduler tests and benchmarks.
namespace gpufleet::scheduler::testing {

// A Ready node with `gpus` idle GPUs of `model` (all in NVLink domain 0) under `topology`.
Node MakeNode(const std::string& id, int gpus, const std::string& model = "H100-80GB",
              std::vector<std::string> topology = {}, HostResources capacity = {96000, 1048576});

// A job of one group: `replicas` tasks asking for `gpus` and `host`.
Job MakeJob(const std::string& id, int replicas, GpuRequest gpus,
            HostResources host = {1000, 1024});

}  // namespace gpufleet::scheduler::testing
