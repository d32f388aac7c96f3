// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/node_json.h"

#include <fmt/format.h>

namespace gpufleet::wire {

std::optional<NodeState> ParseNodeState(std::string_view text) {
  for (const NodeState state :
       {NodeState::kReady, NodeState::kNotReady, NodeState::kCordoned, NodeState::kDraining}) {
    if (text == NodeStateName(state)) {
      return state;
    }
  }
  return std::nullopt;
}

std::optional<GpuHealth> ParseGpuHealth(std::string_view text) {
  for (const GpuHealth health : {GpuHealth::kHealthy, GpuHealth::kDegraded, GpuHealth::kUnhealthy,
                                 GpuHealth::kQuarantined}) {
    if (text == GpuHealthName(health)) {
      return health;
    }
  }
  return std::nullopt;
}

Json NodeToJson(const Node& node, const std::vector<std::string>& levels) {
  Json topology = Json::object();
  for (size_t i = 0; i < levels.size() && i < node.topology.size(); ++i) {
    topology[levels[i]] = node.topology[i];
  }
  Json gpus = Json::array();
  for (const Gpu& gpu : node.gpus) {
    Json j = {{"index", gpu.index},
              {"uuid", gpu.uuid.value()},
              {"model", gpu.model},
              {"memory_mib", gpu.memory_mib},
              {"nvlink_domain", gpu.nvlink_domain},
              {"health", GpuHealthName(gpu.health)},
              {"thermal_headroom_c", gpu.thermal_headroom_c},
              {"mig_enabled", gpu.mig_enabled}};
    if (gpu.mig_enabled) {
      // The layout the scheduler sees; which instances are in use follows from the placements.
      Json instances = Json::array();
      for (const MigInstance& instance : gpu.mig_instances) {
        instances.push_back({{"profile", instance.profile}, {"start", instance.start}});
      }
      j["mig_instances"] = std::move(instances);
    }
    gpus.push_back(std::move(j));
  }
  Json j = {{"name", node.id.value()},
            {"state", NodeStateName(node.state)},
            {"labels", node.labels},
            {"fault_domains", node.fault_domains},
            {"topology", std::move(topology)},
            {"cpu_milli", node.capacity.cpu_milli},
            {"memory_mib", node.capacity.memory_mib},
            {"gpus", std::move(gpus)}};
  if (!node.cached_images.empty()) {
    j["images"] = CachedImagesToJson(node.cached_images);
  }
  return j;
}

Json CachedImagesToJson(const std::vector<CachedImage>& images) {
  Json out = Json::array();
  for (const CachedImage& image : images) {
    out.push_back({{"references", image.references},
                   {"digest", image.digest},
                   {"size_bytes", image.size_bytes}});
  }
  return out;
}

std::vector<CachedImage> CachedImagesFromJson(const Json& images) {
  std::vector<CachedImage> out;
  if (!images.is_array()) {
    return out;
  }
  for (const Json& entry : images) {
    CachedImage image;
    for (const Json& reference : ArrayOr(entry, "references")) {
      if (reference.is_string()) {
        image.references.push_back(reference.get<std::string>());
      }
    }
    image.digest = StrOr(entry, "digest");
    image.size_bytes = IntOr(entry, "size_bytes", 0);
    out.push_back(std::move(image));
  }
  return out;
}

Result<Node> NodeFromJson(const Json& j, const std::vector<std::string>& levels) {
  Node node;
  node.id = NodeId(StrOr(j, "name"));
  const std::string state = StrOr(j, "state", "Ready");
  const std::optional<NodeState> parsed_state = ParseNodeState(state);
  if (!parsed_state) {
    return InvalidArgumentError(
        fmt::format("nodes/{}: state: unknown \"{}\"", node.id.value(), state));
  }
  node.state = *parsed_state;
  node.labels = StringMapOr(j, "labels");
  node.fault_domains = StringMapOr(j, "fault_domains");
  const std::map<std::string, std::string> topology = StringMapOr(j, "topology");
  for (const std::string& level : levels) {
    const auto it = topology.find(level);
    node.topology.push_back(it == topology.end() ? "" : it->second);
  }
  node.capacity.cpu_milli = IntOr(j, "cpu_milli", 0);
  node.capacity.memory_mib = IntOr(j, "memory_mib", 0);
  for (const Json& g : ArrayOr(j, "gpus")) {
    Gpu gpu;
    gpu.index = static_cast<int>(IntOr(g, "index", 0));
    gpu.uuid = GpuUuid(StrOr(g, "uuid"));
    gpu.model = StrOr(g, "model");
    gpu.memory_mib = IntOr(g, "memory_mib", 0);
    gpu.nvlink_domain = static_cast<int>(IntOr(g, "nvlink_domain", 0));
    const std::string health = StrOr(g, "health", "Healthy");
    const std::optional<GpuHealth> parsed_health = ParseGpuHealth(health);
    if (!parsed_health) {
      return InvalidArgumentError(fmt::format("nodes/{}: gpus[{}].health: unknown \"{}\"",
                                              node.id.value(), gpu.index, health));
    }
    gpu.health = *parsed_health;
    gpu.thermal_headroom_c = static_cast<int>(IntOr(g, "thermal_headroom_c", 100));
    gpu.mig_enabled = BoolOr(g, "mig_enabled", false);
    for (const Json& instance : ArrayOr(g, "mig_instances")) {
      gpu.mig_instances.push_back(
          {StrOr(instance, "profile"), static_cast<int>(IntOr(instance, "start", 0))});
    }
    node.gpus.push_back(std::move(gpu));
  }
  node.cached_images = CachedImagesFromJson(j.contains("images") ? j["images"] : Json());
  return node;
}

}  // namespace gpufleet::wire
