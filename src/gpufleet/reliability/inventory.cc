// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/inventory.h"

#include <set>

#include <fmt/format.h>

namespace gpufleet::reliability {

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kGpu:
      return "gpu";
    case DeviceKind::kNode:
      return "node";
  }
  return "unknown";
}

std::string Device::ToString() const {
  return fmt::format("{} {}", DeviceKindName(kind), id);
}

Result<FleetInventory> FleetInventory::FromCluster(const Cluster& cluster) {
  FleetInventory inventory;
  for (const Node& node : cluster.nodes) {
    std::vector<GpuUuid> gpus;
    gpus.reserve(node.gpus.size());
    for (const Gpu& gpu : node.gpus) {
      gpus.push_back(gpu.uuid);
    }
    const std::string leaf = node.topology.empty() ? std::string() : node.topology.back();
    GPUFLEET_RETURN_IF_ERROR(inventory.AddNode(node.id, leaf, gpus));
  }
  return inventory;
}

Status FleetInventory::AddNode(const NodeId& node, const std::string& leaf,
                               const std::vector<GpuUuid>& gpus) {
  if (node.empty()) {
    return InvalidArgumentError("node: empty id");
  }
  if (node_index_.count(node.value()) > 0) {
    return AlreadyExistsError(fmt::format("node \"{}\" is already in the inventory", node.value()));
  }
  std::set<std::string> seen;
  for (const GpuUuid& gpu : gpus) {
    if (gpu.empty()) {
      return InvalidArgumentError(
          fmt::format("node \"{}\": a GPU has an empty uuid", node.value()));
    }
    if (gpu_index_.count(gpu.value()) > 0 || !seen.insert(gpu.value()).second) {
      return AlreadyExistsError(fmt::format("node \"{}\": GPU \"{}\" is already in the inventory",
                                            node.value(), gpu.value()));
    }
  }
  auto [leaf_it, inserted] = leaf_index_.emplace(leaf, static_cast<int>(leaves_.size()));
  if (inserted) {
    leaves_.push_back(LeafEntry{leaf, 0});
  }
  const int node_index = static_cast<int>(nodes_.size());
  NodeEntry entry{node, leaf_it->second, {}};
  for (const GpuUuid& gpu : gpus) {
    const int gpu_index = static_cast<int>(gpus_.size());
    gpus_.push_back(GpuEntry{gpu, node_index});
    gpu_index_.emplace(gpu.value(), gpu_index);
    entry.gpus.push_back(gpu_index);
  }
  leaves_[leaf_it->second].gpus += static_cast<int>(gpus.size());
  nodes_.push_back(std::move(entry));
  node_index_.emplace(node.value(), node_index);
  return Status::Ok();
}

int FleetInventory::GpuIndex(std::string_view uuid) const {
  const auto it = gpu_index_.find(std::string(uuid));
  return it == gpu_index_.end() ? -1 : it->second;
}

int FleetInventory::NodeIndex(std::string_view node) const {
  const auto it = node_index_.find(std::string(node));
  return it == node_index_.end() ? -1 : it->second;
}

int FleetInventory::IndexOf(const Device& device) const {
  return device.kind == DeviceKind::kGpu ? GpuIndex(device.id) : NodeIndex(device.id);
}

}  // namespace gpufleet::reliability
