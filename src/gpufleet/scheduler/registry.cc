// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/registry.h"

#include <fmt/format.h>

#include "gpufleet/scheduler/plugins/collective_cost.h"
#include "gpufleet/scheduler/plugins/filters.h"
#include "gpufleet/scheduler/plugins/image_locality.h"
#include "gpufleet/scheduler/plugins/policies.h"

namespace gpufleet::scheduler {
namespace {

template <typename T>
PluginFactory Simple() {
  return [](const PluginArgs&) -> Result<std::unique_ptr<Plugin>> {
    return std::unique_ptr<Plugin>(std::make_unique<T>());
  };
}

}  // namespace

const std::vector<std::string>& PlacementPolicyNames() {
  static const std::vector<std::string> kNames = {
      "random", "dot-prod", "gpu-clustering", "gpu-packing", "best-fit", "fgd", "gpufleet"};
  return kNames;
}

PluginRegistry PluginRegistry::Default() {
  PluginRegistry registry;
  auto add = [&registry](std::string name, PluginFactory factory) {
    // Names below are distinct, so registration cannot fail.
    (void)registry.Register(std::move(name), std::move(factory));
  };
  add("gpu-model", Simple<GpuModelFilter>());
  add("gpu-health", Simple<GpuHealthFilter>());
  add("thermal-headroom", [](const PluginArgs& args) -> Result<std::unique_ptr<Plugin>> {
    return std::unique_ptr<Plugin>(
        std::make_unique<ThermalHeadroomFilter>(args.min_thermal_headroom_c));
  });
  add("node-ready", Simple<NodeReadyFilter>());
  add("node-selector", Simple<NodeSelectorFilter>());
  add("identical-stack", Simple<StackLabelsFilter>());
  add("container-runtime", Simple<ContainerRuntimeFilter>());
  add("link-health", Simple<LinkHealthFilter>());
  add("host-resources", Simple<HostResourcesFit>());
  add("gpu-resources", Simple<GpuResourcesFit>());
  add("fault-domain-spread", Simple<FaultDomainSpread>());
  add("topology-levels", Simple<TopologyLevelsCheck>());
  add("topology-preference", Simple<TopologyPreferenceScore>());
  add("image-locality", Simple<ImageLocalityScore>());
  add("collective-cost", [](const PluginArgs& args) -> Result<std::unique_ptr<Plugin>> {
    if (args.fabric == nullptr) {
      return InvalidArgumentError(
          "plugin collective-cost: needs a fabric (the network whose collectives it estimates)");
    }
    return std::unique_ptr<Plugin>(std::make_unique<CollectiveCostScore>(args.fabric));
  });
  add("random", Simple<RandomPolicy>());
  add("dot-prod", Simple<DotProdPolicy>());
  add("gpu-clustering", Simple<GpuClusteringPolicy>());
  add("gpu-packing", Simple<GpuPackingPolicy>());
  add("best-fit", Simple<BestFitPolicy>());
  add("fgd", [](const PluginArgs& args) -> Result<std::unique_ptr<Plugin>> {
    if (args.target_workload.empty()) {
      return InvalidArgumentError(
          "policy fgd: needs a target workload (the task mix to keep the cluster open for)");
    }
    return std::unique_ptr<Plugin>(std::make_unique<FgdPolicy>("fgd", args.target_workload));
  });
  add("gpufleet", [](const PluginArgs& args) -> Result<std::unique_ptr<Plugin>> {
    if (args.target_workload.empty()) {
      return InvalidArgumentError(
          "policy gpufleet: needs a target workload (the task mix to keep the cluster open for)");
    }
    FgdScoring scoring;
    scoring.fragmentation = FragmentationModel::Kind::kPackedShares;
    scoring.quantum_milli = GpufleetScoreQuantum(args.target_workload);
    return std::unique_ptr<Plugin>(
        std::make_unique<FgdPolicy>("gpufleet", args.target_workload, scoring));
  });
  return registry;
}

Status PluginRegistry::Register(std::string name, PluginFactory factory) {
  if (factories_.find(name) != factories_.end()) {
    return AlreadyExistsError(fmt::format("plugin \"{}\" is registered already", name));
  }
  factories_.emplace(std::move(name), std::move(factory));
  return Status::Ok();
}

Result<std::unique_ptr<Plugin>> PluginRegistry::Create(std::string_view name,
                                                       const PluginArgs& args) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    return NotFoundError(
        fmt::format("unknown plugin \"{}\" (known: {})", name, fmt::join(Names(), ", ")));
  }
  return it->second(args);
}

std::vector<std::string> PluginRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, factory] : factories_) {
    names.push_back(name);
  }
  return names;
}

}  // namespace gpufleet::scheduler
