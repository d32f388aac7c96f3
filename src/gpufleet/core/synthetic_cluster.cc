// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/synthetic_cluster.h"

#include <fmt/format.h>

namespace gpufleet {

Result<Cluster> MakeSyntheticCluster(const SyntheticClusterSpec& spec, const GpuCatalog& catalog) {
  const std::pair<const char*, int> counts[] = {{"blocks", spec.blocks},
                                                {"leaves_per_block", spec.leaves_per_block},
                                                {"nodes_per_leaf", spec.nodes_per_leaf}};
  for (const auto& [field, value] : counts) {
    if (value < 1) {
      return InvalidArgumentError(fmt::format("{}: {} (must be at least 1)", field, value));
    }
  }
  if (spec.gpus_per_node < 0) {
    return InvalidArgumentError(
        fmt::format("gpus_per_node: negative value {}", spec.gpus_per_node));
  }
  auto model = catalog.Find(spec.gpu_model);
  if (!model.ok()) {
    return InvalidArgumentError("gpu_model: " + model.status().message());
  }
  Cluster cluster;
  cluster.topology = Topology({"block", "leaf"});
  int node_number = 0;
  for (int b = 0; b < spec.blocks; ++b) {
    for (int l = 0; l < spec.leaves_per_block; ++l) {
      const int leaf = b * spec.leaves_per_block + l;
      for (int n = 0; n < spec.nodes_per_leaf; ++n) {
        if (spec.total_nodes > 0 && node_number >= spec.total_nodes) {
          break;
        }
        Node node;
        node.id = NodeId(fmt::format("node-{:04d}", node_number++));
        node.capacity = {spec.cpu_milli_per_node, spec.memory_mib_per_node};
        node.topology = {fmt::format("block-{}", b), fmt::format("leaf-{}", leaf)};
        node.fault_domains["rack"] = fmt::format("rack-{}", leaf);
        for (int g = 0; g < spec.gpus_per_node; ++g) {
          Gpu gpu;
          gpu.uuid = GpuUuid(fmt::format("GPU-{}-{}", node.id.value(), g));
          gpu.index = g;
          gpu.model = (*model)->name;
          gpu.memory_mib = (*model)->memory_mib;
          node.gpus.push_back(gpu);
        }
        cluster.nodes.push_back(std::move(node));
      }
    }
  }
  return cluster;
}

}  // namespace gpufleet
