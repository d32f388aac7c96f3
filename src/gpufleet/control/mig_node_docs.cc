// SPDX-License-Identifier: Apache-2.0
// MIG layouts in node documents (docs/agent.md, "MIG layouts"): the layout each MIG GPU should
// have and what agents are told to apply.
#include "gpufleet/control/mig_node_docs.h"

#include <algorithm>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/control/placement_gpus.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/policy/mig_planner.h"
#include "gpufleet/scheduler/devices.h"
#include "gpufleet/store/read_modify_write.h"

namespace gpufleet::control {
namespace {

std::vector<std::pair<std::string, int>> Keys(const std::vector<MigInstance>& instances) {
  std::vector<std::pair<std::string, int>> keys;
  for (const MigInstance& instance : instances) {
    keys.emplace_back(instance.profile, instance.start);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace

std::vector<MigInstance> MigInstancesFromJson(const Json& list) {
  std::vector<MigInstance> out;
  if (!list.is_array()) {
    return out;
  }
  for (const Json& instance : list) {
    out.push_back(
        {wire::StrOr(instance, "profile"), static_cast<int>(wire::IntOr(instance, "start", 0))});
  }
  return out;
}

Json MigInstancesToJsonList(const std::vector<MigInstance>& instances) {
  Json out = Json::array();
  for (const MigInstance& instance : instances) {
    out.push_back({{"profile", instance.profile}, {"start", instance.start}});
  }
  return out;
}

bool SameMigInstances(const std::vector<MigInstance>& a, const std::vector<MigInstance>& b) {
  return Keys(a) == Keys(b);
}

void AddCreatedMigInstances(const wire::JobRecord& job, const std::string& node,
                            const Json& node_doc,
                            std::map<int, std::vector<MigInstance>>& created) {
  if (!HoldsResources(job.state)) {
    return;
  }
  for (const wire::PlacementRecord& placement : job.placements) {
    if (placement.node != node || placement.phase == "Succeeded" || placement.phase == "Failed") {
      continue;
    }
    const std::vector<PlacedGpu> placed = PlacedGpus(placement);
    for (size_t i = 0; i < placed.size(); ++i) {
      const wire::PlacedAssignment& assignment = placement.assignments[i];
      const Json* gpu = FindPlacedGpu(wire::ArrayOr(node_doc, "gpus"), placed[i]);
      if (assignment.mig_created && gpu != nullptr) {
        created[static_cast<int>(wire::IntOr(*gpu, "index", -1))].push_back(
            {assignment.mig_profile, assignment.mig_start});
      }
    }
  }
}

std::vector<wire::WantedMigLayout> MigLayoutsToApply(
    const Json& node_doc, const std::map<int, std::vector<MigInstance>>& created) {
  std::vector<wire::WantedMigLayout> out;
  for (const Json& gpu : wire::ArrayOr(node_doc, "gpus")) {
    if (!wire::BoolOr(gpu, "mig_enabled", false)) {
      continue;
    }
    wire::WantedMigLayout layout;
    layout.gpu_index = static_cast<int>(wire::IntOr(gpu, "index", -1));
    layout.instances = MigInstancesFromJson(wire::ArrayOr(gpu, "mig_instances"));
    if (const auto it = created.find(layout.gpu_index); it != created.end()) {
      layout.instances.insert(layout.instances.end(), it->second.begin(), it->second.end());
    }
    if (SameMigInstances(layout.instances,
                         MigInstancesFromJson(wire::ArrayOr(gpu, "mig_devices")))) {
      continue;
    }
    std::sort(layout.instances.begin(), layout.instances.end(),
              [](const MigInstance& a, const MigInstance& b) {
                return std::tie(a.start, a.profile) < std::tie(b.start, b.profile);
              });
    out.push_back(std::move(layout));
  }
  return out;
}

const Json* FindMigDevice(const Json& gpu_doc, const std::string& profile, int start) {
  for (const Json& device : wire::ArrayOr(gpu_doc, "mig_devices")) {
    if (wire::StrOr(device, "profile") == profile && wire::IntOr(device, "start", -1) == start) {
      return &device;
    }
  }
  return nullptr;
}

}  // namespace gpufleet::control
