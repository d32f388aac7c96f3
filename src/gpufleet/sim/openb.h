// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <istream>
#include <string>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"

// Loaders for the Alibaba GPU v2023 "openb" trace (FGD, USENIX ATC'23): the node list and the pod
// lists. GPU models first seen in the trace (G2, G3) are added to the catalog.
namespace gpufleet::sim {

// `sn,cpu_milli,memory_mib,gpu,model`: one node per row, no topology levels.
Result<Cluster> ReadOpenbNodes(std::istream& in, const std::string& source, GpuCatalog& catalog);
Result<Cluster> LoadOpenbNodes(const std::string& path, GpuCatalog& catalog);

// `name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`: one single-task job per pod.
// num_gpu 0 is a CPU-only task, num_gpu 1 with gpu_milli < 1000 a fractional share, gpu_milli 1000
// whole GPUs; gpu_spec lists the allowed models separated by '|'.
Result<std::vector<Job>> ReadOpenbPods(std::istream& in, const std::string& source,
                                       GpuCatalog& catalog);
Result<std::vector<Job>> LoadOpenbPods(const std::string& path, GpuCatalog& catalog);

}  // namespace gpufleet::sim
