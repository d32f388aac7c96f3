// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <compare>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/ids.h"
#include "gpufleet/core/status.h"

// The devices the reliability module reasons about: GPUs, the nodes that hold them and the leaf
// switches the nodes hang off (the unit of the quarantine budget).
namespace gpufleet::reliability {

enum class DeviceKind { kGpu, kNode };
const char* DeviceKindName(DeviceKind kind);  // "gpu", "node"

// A GPU (by UUID) or a node (by id): what the attribution engine tests and the quarantine policy
// takes out of service. Thread-compatible value type.
struct Device {
  DeviceKind kind = DeviceKind::kGpu;
  std::string id;

  static Device OfGpu(const GpuUuid& uuid) { return Device{DeviceKind::kGpu, uuid.value()}; }
  static Device OfNode(const NodeId& node) { return Device{DeviceKind::kNode, node.value()}; }
  // "gpu GPU-1234" or "node node-0007".
  std::string ToString() const;

  friend auto operator<=>(const Device&, const Device&) = default;
};

// Every GPU and node of the fleet with dense indices (GPUs 0..gpu_count()-1, nodes
// 0..node_count()-1, leaves 0..leaf_count()-1) so that per-device statistics live in arrays.
// Built once, then read-only: thread-compatible, and safe to share between threads once built.
class FleetInventory {
 public:
  FleetInventory() = default;

  // Every node of `cluster` with its GPUs; a node's leaf is the innermost domain of its topology
  // path, or "" when the cluster declares no levels. Errors as for AddNode.
  static Result<FleetInventory> FromCluster(const Cluster& cluster);

  // kInvalidArgument for an empty node id or GPU UUID; kAlreadyExists for a node or GPU that is
  // already known (naming it). Nothing is added on error.
  Status AddNode(const NodeId& node, const std::string& leaf, const std::vector<GpuUuid>& gpus);

  int gpu_count() const { return static_cast<int>(gpus_.size()); }
  int node_count() const { return static_cast<int>(nodes_.size()); }
  int leaf_count() const { return static_cast<int>(leaves_.size()); }

  // Dense index of a GPU or node, or -1 when unknown.
  int GpuIndex(std::string_view uuid) const;
  int NodeIndex(std::string_view node) const;
  // -1 when unknown; for a GPU the GPU index, for a node the node index.
  int IndexOf(const Device& device) const;
  bool Contains(const Device& device) const { return IndexOf(device) >= 0; }

  // REQUIRES: indices in range.
  const GpuUuid& gpu_uuid(int gpu) const { return gpus_[gpu].uuid; }
  int node_of_gpu(int gpu) const { return gpus_[gpu].node; }
  const NodeId& node_id(int node) const { return nodes_[node].id; }
  int leaf_of_node(int node) const { return nodes_[node].leaf; }
  const std::vector<int>& gpus_of_node(int node) const { return nodes_[node].gpus; }
  const std::string& leaf_name(int leaf) const { return leaves_[leaf].name; }
  int gpus_in_leaf(int leaf) const { return leaves_[leaf].gpus; }

 private:
  struct GpuEntry {
    GpuUuid uuid;
    int node = 0;
  };
  struct NodeEntry {
    NodeId id;
    int leaf = 0;
    std::vector<int> gpus;
  };
  struct LeafEntry {
    std::string name;
    int gpus = 0;
  };

  std::vector<GpuEntry> gpus_;
  std::vector<NodeEntry> nodes_;
  std::vector<LeafEntry> leaves_;
  std::unordered_map<std::string, int> gpu_index_;
  std::unordered_map<std::string, int> node_index_;
  std::unordered_map<std::string, int> leaf_index_;
};

}  // namespace gpufleet::reliability
