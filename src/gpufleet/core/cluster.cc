// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/cluster.h"

#include <set>

#include <fmt/format.h>

namespace gpufleet {

const char* NodeStateName(NodeState state) {
  switch (state) {
    case NodeState::kReady:
      return "Ready";
    case NodeState::kNotReady:
      return "NotReady";
    case NodeState::kCordoned:
      return "Cordoned";
    case NodeState::kDraining:
      return "Draining";
  }
  return "Unknown";
}

const char* GpuHealthName(GpuHealth health) {
  switch (health) {
    case GpuHealth::kHealthy:
      return "Healthy";
    case GpuHealth::kDegraded:
      return "Degraded";
    case GpuHealth::kUnhealthy:
      return "Unhealthy";
    case GpuHealth::kQuarantined:
      return "Quarantined";
  }
  return "Unknown";
}

int Topology::LevelIndex(std::string_view level) const {
  for (size_t i = 0; i < levels_.size(); ++i) {
    if (levels_[i] == level) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

bool Topology::IsKnownLevel(std::string_view level) const {
  return LevelIndex(level) >= 0 || level == kNodeLevel || level == kNvlinkDomainLevel;
}

std::string Topology::KnownLevelNames() const {
  std::string names;
  for (const std::string& level : levels_) {
    names += level + ", ";
  }
  names += std::string(kNodeLevel);
  if (LevelIndex(kNvlinkDomainLevel) < 0) {
    names += ", " + std::string(kNvlinkDomainLevel);
  }
  return names;
}

Status Cluster::Validate(const GpuCatalog& catalog) const {
  std::set<std::string_view> seen;
  for (size_t n = 0; n < nodes.size(); ++n) {
    const Node& node = nodes[n];
    const std::string where = fmt::format("nodes[{}] (\"{}\")", n, node.id.value());
    if (node.id.empty()) {
      return InvalidArgumentError(fmt::format("nodes[{}].id: empty", n));
    }
    if (!seen.insert(node.id.value()).second) {
      return InvalidArgumentError(fmt::format("{}.id: duplicate node id", where));
    }
    if (!node.capacity.IsNonNegative()) {
      return InvalidArgumentError(
          fmt::format("{}.capacity: negative value ({})", where, node.capacity.ToString()));
    }
    if (node.topology.size() != topology.levels().size()) {
      return InvalidArgumentError(
          fmt::format("{}.topology: {} domains given, the topology declares {} levels", where,
                      node.topology.size(), topology.levels().size()));
    }
    for (size_t g = 0; g < node.gpus.size(); ++g) {
      const Gpu& gpu = node.gpus[g];
      auto model = catalog.Find(gpu.model);
      if (!model.ok()) {
        return InvalidArgumentError(
            fmt::format("{}.gpus[{}].model: {}", where, g, model.status().message()));
      }
      if (gpu.memory_mib < 0) {
        return InvalidArgumentError(
            fmt::format("{}.gpus[{}].memory_mib: negative value {}", where, g, gpu.memory_mib));
      }
      if (gpu.mig_enabled) {
        if (!(*model)->SupportsMig()) {
          return InvalidArgumentError(fmt::format("{}.gpus[{}].mig_enabled: model {} has no MIG",
                                                  where, g, (*model)->name));
        }
        auto layout = MigLayout::FromInstances(**model, gpu.mig_instances);
        if (!layout.ok()) {
          return InvalidArgumentError(
              fmt::format("{}.gpus[{}].{}", where, g, layout.status().message()));
        }
      } else if (!gpu.mig_instances.empty()) {
        return InvalidArgumentError(fmt::format(
            "{}.gpus[{}].mig_instances: MIG instances on a GPU with MIG disabled", where, g));
      }
    }
  }
  return Status::Ok();
}

}  // namespace gpufleet
