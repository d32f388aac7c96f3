// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/testing/cluster_builder.h"

#include <fmt/format.h>

namespace gpufleet::scheduler::testing {

Node MakeNode(const std::string& id, int gpus, const std::string& model,
              std::vector<std::string> topology, HostResources capacity) {
  Node node;
  node.id = NodeId(id);
  node.capacity = capacity;
  node.topology = std::move(topology);
  for (int g = 0; g < gpus; ++g) {
    Gpu gpu;
    gpu.uuid = GpuUuid(fmt::format("GPU-{}-{}", id, g));
    gpu.index = g;
    gpu.model = model;
    node.gpus.push_back(gpu);
  }
  return node;
}

Job MakeJob(const std::string& id, int replicas, GpuRequest gpus, HostResources host) {
  Job job;
  job.id = JobId(id);
  job.groups.push_back({"workers", replicas, {host, std::move(gpus)}});
  return job;
}

TaskPlacement IdleGpusPlacement(const ClusterSnapshot& snapshot, int node, int gpus) {
  TaskPlacement placement;
  placement.node = node;
  placement.host = {1000, 1024};
  for (const GpuSlot& gpu : snapshot.nodes()[node].gpus) {
    if (static_cast<int>(placement.gpus.size()) < gpus && gpu.IsIdle()) {
      placement.gpus.push_back({gpu.index, 1000, 0});
    }
  }
  return placement;
}

}  // namespace gpufleet::scheduler::testing
