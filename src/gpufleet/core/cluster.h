// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/ids.h"
#include "gpufleet/core/mig.h"
#include "gpufleet/core/resources.h"
#include "gpufleet/core/status.h"

namespace gpufleet {

enum class NodeState { kReady, kNotReady, kCordoned, kDraining };
enum class GpuHealth { kHealthy, kDegraded, kUnhealthy, kQuarantined };

const char* NodeStateName(NodeState state);
const char* GpuHealthName(GpuHealth health);

// Topology level names with a fixed meaning: "node" is the node itself, "nvlink-domain" the set
// of GPUs of one node joined by NVLink (unless the topology declares it as a level above nodes,
// as GB200 NVL72 racks do).
inline constexpr std::string_view kNodeLevel = "node";
inline constexpr std::string_view kNvlinkDomainLevel = "nvlink-domain";

// Common label keys a node carries.
inline constexpr std::string_view kDriverVersionLabel = "gpufleet.io/driver-version";
inline constexpr std::string_view kCudaVersionLabel = "gpufleet.io/cuda-version";
// The container engine that runs the node's tasks with an image ("podman"), as its agent reports
// it at registration; a node without the label (an agent with the process runner, or one from
// before the label) runs processes only, and the server places no container task on it.
inline constexpr std::string_view kContainerRuntimeLabel = "gpufleet.io/container-runtime";
// How a node runs the fractional shares that do not say (GpuSharing): "time-slicing" (also when
// absent) or "mps". Set by `gpufleet agent --gpu-sharing`.
inline constexpr std::string_view kGpuSharingLabel = "gpufleet.io/gpu-sharing";

// The label the server sets on a node ("true") while its agent reports NIC or link problems (a
// port down, a rate below the node's best, link errors growing; wire::HeartbeatRequest::
// link_problems). A gang across nodes runs at its slowest link's pace.
inline constexpr std::string_view kLinkDegradedLabel = "gpufleet.io/link-degraded";

// One GPU of a node. Thread-compatible value type.
struct Gpu {
  GpuUuid uuid;
  int index = 0;      // NVML index on the node
  std::string model;  // canonical catalog name
  int64_t memory_mib = 0;
  int nvlink_domain = 0;  // GPUs of one node with the same value share NVLink
  GpuHealth health = GpuHealth::kHealthy;
  int thermal_headroom_c = 100;  // slowdown threshold minus current temperature
  bool mig_enabled = false;
  std::vector<MigInstance> mig_instances;
};

// One machine. `topology` holds its domain at each level the cluster's Topology declares, outermost
// first (e.g. {"zone-a", "block-2", "leaf-17"}); `fault_domains` maps a fault-domain kind to its
// value (e.g. "rack" -> "r12", "power-feed" -> "pdu-3"). Thread-compatible value type.
// An image a node holds, as its agent last reported it; the scheduler's image locality reads
// these (references like "nvcr.io/nvidia/pytorch:24.05-py3", the manifest digest, the size).
struct CachedImage {
  std::vector<std::string> references;
  std::string digest;
  int64_t size_bytes = 0;

  friend bool operator==(const CachedImage&, const CachedImage&) = default;
};

struct Node {
  NodeId id;
  HostResources capacity;
  NodeState state = NodeState::kReady;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> fault_domains;
  std::vector<std::string> topology;
  std::vector<CachedImage> cached_images;
  std::vector<Gpu> gpus;
};

// Named levels of the network tree above nodes, outermost first, e.g. {"zone", "block", "leaf"}.
class Topology {
 public:
  Topology() = default;
  explicit Topology(std::vector<std::string> levels) : levels_(std::move(levels)) {}

  const std::vector<std::string>& levels() const { return levels_; }
  // Index of a declared level, or -1.
  int LevelIndex(std::string_view level) const;
  // True for a declared level, "node" and "nvlink-domain".
  bool IsKnownLevel(std::string_view level) const;
  // Declared levels plus the built-in ones, for error messages.
  std::string KnownLevelNames() const;

 private:
  std::vector<std::string> levels_;
};

// The whole fleet as the scheduler sees it. Thread-compatible value type.
struct Cluster {
  Topology topology;
  std::vector<Node> nodes;

  // Checks what the scheduler relies on: unique node ids, known GPU models, a topology path per
  // node, non-negative capacity, MIG layouts that are valid for the model. The error names the
  // node, the field and the value.
  Status Validate(const GpuCatalog& catalog) const;
};

}  // namespace gpufleet
