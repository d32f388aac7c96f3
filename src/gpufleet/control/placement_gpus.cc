// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/placement_gpus.h"

#include <fmt/format.h>

namespace gpufleet::control {

std::string PlacedGpu::Describe() const {
  return uuid.empty() ? fmt::format("gpu {}", index) : fmt::format("gpu {} ({})", index, uuid);
}

std::vector<PlacedGpu> PlacedGpus(const Json& placement) {
  const Json& assignments = wire::ArrayOr(placement, "assignments");
  const Json& uuids = wire::ArrayOr(placement, "gpu_uuids");
  const Json& indices = wire::ArrayOr(placement, "gpus");
  std::vector<PlacedGpu> out(assignments.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (i < uuids.size() && uuids[i].is_string()) {
      out[i].uuid = uuids[i].get<std::string>();
    }
    if (i < indices.size() && indices[i].is_number_integer()) {
      out[i].index = indices[i].get<int64_t>();
    }
  }
  return out;
}

std::vector<PlacedGpu> PlacedGpus(const wire::PlacementRecord& placement) {
  std::vector<PlacedGpu> out(placement.assignments.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (i < placement.gpu_uuids.size()) {
      out[i].uuid = placement.gpu_uuids[i];
    }
    if (i < placement.gpu_indices.size()) {
      out[i].index = placement.gpu_indices[i];
    }
  }
  return out;
}

int PlacedGpuPosition(const Json& node_gpus, const PlacedGpu& gpu) {
  if (!node_gpus.is_array()) {
    return -1;
  }
  for (size_t i = 0; i < node_gpus.size(); ++i) {
    if (gpu.Is(wire::StrOr(node_gpus[i], "uuid"), wire::IntOr(node_gpus[i], "index", -1))) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

const Json* FindPlacedGpu(const Json& node_gpus, const PlacedGpu& gpu) {
  const int position = PlacedGpuPosition(node_gpus, gpu);
  return position < 0 ? nullptr : &node_gpus[static_cast<size_t>(position)];
}

std::optional<PlacedGpu> RenamePlacedGpus(Json& placement, const Json& named_by,
                                          const Json& node_gpus) {
  Json uuids = Json::array();
  Json indices = Json::array();
  for (PlacedGpu gpu : PlacedGpus(placement)) {
    if (gpu.uuid.empty()) {
      if (const Json* then = FindPlacedGpu(named_by, gpu)) {
        gpu.uuid = wire::StrOr(*then, "uuid");
      }
    }
    const Json* now = FindPlacedGpu(node_gpus, gpu);
    if (now == nullptr) {
      return gpu;
    }
    uuids.push_back(gpu.uuid);
    indices.push_back(wire::IntOr(*now, "index", -1));
  }
  placement["gpu_uuids"] = std::move(uuids);
  placement["gpus"] = std::move(indices);
  return std::nullopt;
}

}  // namespace gpufleet::control
