// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/status.h"

namespace gpufleet {

// A uniform cluster on a block > leaf tree: `blocks` x `leaves_per_block` x `nodes_per_leaf`
// nodes with `gpus_per_node` GPUs of one model each, NVLink joining all GPUs of a node. Node ids
// are "node-0000".., domains "block-0", "leaf-0"..; each leaf is also a rack fault domain.
struct SyntheticClusterSpec {
  int blocks = 1;
  int leaves_per_block = 1;
  int nodes_per_leaf = 1;
  int gpus_per_node = 8;
  std::string gpu_model = "H100-80GB";
  int64_t cpu_milli_per_node = 192000;
  int64_t memory_mib_per_node = 2048 * 1024;
  int total_nodes = 0;  // > 0: stop after this many nodes (the last leaf is partial)
};

// kInvalidArgument naming the field for a non-positive count or an unknown model.
Result<Cluster> MakeSyntheticCluster(const SyntheticClusterSpec& spec, const GpuCatalog& catalog);

}  // namespace gpufleet
