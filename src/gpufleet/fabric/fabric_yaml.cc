// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/fabric_yaml.h"

#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "gpufleet/fabric/units.h"

namespace gpufleet::fabric {
namespace {

// Reads one document; every error carries "file:line: path".
class Reader {
 public:
  explicit Reader(std::string_view file) : file_(file) {}

  Status Fail(const YAML::Node& at, const std::string& path, const std::string& message) const {
    return InvalidArgumentError(fmt::format("{}:{}: {}: {}", file_, Line(at), path, message));
  }

  static int Line(const YAML::Node& node) {
    const int line = node.Mark().line;
    return line >= 0 ? line + 1 : 0;
  }

  // kInvalidArgument for keys not in `known`.
  Status CheckKeys(const YAML::Node& map, const std::string& path,
                   std::initializer_list<std::string_view> known) const {
    if (!map.IsMap()) {
      return Fail(map, path, "expected a mapping");
    }
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string key = it->first.Scalar();
      bool ok = false;
      for (std::string_view name : known) {
        ok = ok || key == name;
      }
      if (!ok) {
        return Fail(it->first, path.empty() ? key : path + "." + key,
                    fmt::format("unknown field (known: {})", fmt::join(known, ", ")));
      }
      if (!seen.insert(key).second) {
        return Fail(it->first, path.empty() ? key : path + "." + key, "duplicate field");
      }
    }
    return Status::Ok();
  }

  Result<std::string> String(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar()) {
      return Fail(node, path, "expected a string");
    }
    return node.Scalar();
  }

  Result<int64_t> Integer(const YAML::Node& node, const std::string& path, int64_t low,
                          int64_t high) const {
    if (!node.IsScalar()) {
      return Fail(node, path, "expected an integer");
    }
    const std::string& text = node.Scalar();
    int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
      return Fail(node, path, fmt::format("\"{}\" is not an integer", text));
    }
    if (value < low || value > high) {
      return Fail(node, path, fmt::format("{} is out of range [{}, {}]", value, low, high));
    }
    return value;
  }

  Result<int64_t> Speed(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar()) {
      return Fail(node, path, "expected a speed such as 400G");
    }
    auto speed = ParseSpeedMbps(node.Scalar(), path);
    if (!speed.ok()) {
      return InvalidArgumentError(
          fmt::format("{}:{}: {}", file_, Line(node), speed.status().message()));
    }
    return *speed;
  }

  // "2048Gi", "2Ti", "512Mi" or a number of MiB.
  Result<int64_t> MemoryMib(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar()) {
      return Fail(node, path, "expected a size such as 2048Gi");
    }
    std::string_view text = node.Scalar();
    int64_t scale = 1;
    for (const auto& [suffix, mib] :
         {std::pair<std::string_view, int64_t>{"Ti", 1024 * 1024}, {"Gi", 1024}, {"Mi", 1}}) {
      if (text.size() > suffix.size() && text.substr(text.size() - suffix.size()) == suffix) {
        text.remove_suffix(suffix.size());
        scale = mib;
        break;
      }
    }
    int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
      return Fail(node, path, fmt::format("\"{}\" is not a size (e.g. 2048Gi)", node.Scalar()));
    }
    if (value < 0 || value > std::numeric_limits<int64_t>::max() / scale) {
      return Fail(node, path, fmt::format("\"{}\" is out of range", node.Scalar()));
    }
    return value * scale;
  }

  // Cores, possibly fractional ("224", "0.5"), to milli-CPU.
  Result<int64_t> CpuMilli(const YAML::Node& node, const std::string& path) const {
    if (!node.IsScalar()) {
      return Fail(node, path, "expected a number of cores");
    }
    const std::string& text = node.Scalar();
    double value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || end != text.data() + text.size() ||
        !std::isfinite(value) || value < 0 || value > 1e9) {
      return Fail(node, path, fmt::format("\"{}\" is not a number of cores", text));
    }
    return static_cast<int64_t>(std::llround(value * 1000));
  }

  template <typename T, typename ParseItem>
  Status Sequence(const YAML::Node& node, const std::string& path, std::vector<T>& out,
                  ParseItem parse_item) const {
    if (!node.IsSequence()) {
      return Fail(node, path, "expected a list");
    }
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string item_path = fmt::format("{}[{}]", path, i);
      GPUFLEET_ASSIGN_OR_RETURN(T item, parse_item(node[i], item_path));
      out.push_back(std::move(item));
    }
    return Status::Ok();
  }

  Result<std::string> Required(const YAML::Node& map, const std::string& path,
                               const char* key) const {
    const YAML::Node value = map[key];
    if (!value) {
      return Fail(map, path + "." + key, "missing");
    }
    return String(value, path + "." + key);
  }

  Result<NodeGroupSpec> NodeGroup(const YAML::Node& map, const std::string& path) const {
    GPUFLEET_RETURN_IF_ERROR(CheckKeys(
        map, path,
        {"names", "gpus", "gpu_model", "nics", "nic_speed", "nvlink_bandwidth", "cpus", "memory"}));
    NodeGroupSpec group;
    group.source = {Line(map), path};
    GPUFLEET_ASSIGN_OR_RETURN(group.names, Required(map, path, "names"));
    if (const YAML::Node v = map["gpus"]) {
      GPUFLEET_ASSIGN_OR_RETURN(const int64_t gpus, Integer(v, path + ".gpus", 0, 64));
      group.gpus = static_cast<int>(gpus);
    }
    if (const YAML::Node v = map["gpu_model"]) {
      GPUFLEET_ASSIGN_OR_RETURN(group.gpu_model, String(v, path + ".gpu_model"));
    }
    if (const YAML::Node v = map["nics"]) {
      GPUFLEET_ASSIGN_OR_RETURN(const int64_t nics, Integer(v, path + ".nics", 0, 64));
      group.nics = static_cast<int>(nics);
    }
    if (const YAML::Node v = map["nic_speed"]) {
      GPUFLEET_ASSIGN_OR_RETURN(group.nic_speed_mbps, Speed(v, path + ".nic_speed"));
    }
    if (const YAML::Node v = map["nvlink_bandwidth"]) {
      GPUFLEET_ASSIGN_OR_RETURN(group.nvlink_mbps, Speed(v, path + ".nvlink_bandwidth"));
    }
    if (const YAML::Node v = map["cpus"]) {
      GPUFLEET_ASSIGN_OR_RETURN(group.cpu_milli, CpuMilli(v, path + ".cpus"));
    }
    if (const YAML::Node v = map["memory"]) {
      GPUFLEET_ASSIGN_OR_RETURN(group.memory_mib, MemoryMib(v, path + ".memory"));
    }
    return group;
  }

  Result<SwitchGroupSpec> SwitchGroup(const YAML::Node& map, const std::string& path) const {
    GPUFLEET_RETURN_IF_ERROR(CheckKeys(
        map, path, {"names", "tier", "ports", "port_speed", "group", "slurm_link_speed"}));
    SwitchGroupSpec group;
    group.source = {Line(map), path};
    GPUFLEET_ASSIGN_OR_RETURN(group.names, Required(map, path, "names"));
    GPUFLEET_ASSIGN_OR_RETURN(group.tier, Required(map, path, "tier"));
    if (const YAML::Node v = map["ports"]) {
      GPUFLEET_ASSIGN_OR_RETURN(const int64_t ports, Integer(v, path + ".ports", 1, 100000));
      group.ports = static_cast<int>(ports);
    }
    if (const YAML::Node v = map["port_speed"]) {
      GPUFLEET_ASSIGN_OR_RETURN(group.port_speed_mbps, Speed(v, path + ".port_speed"));
    }
    if (const YAML::Node v = map["group"]) {
      GPUFLEET_ASSIGN_OR_RETURN(group.group, String(v, path + ".group"));
    }
    if (const YAML::Node v = map["slurm_link_speed"]) {
      GPUFLEET_ASSIGN_OR_RETURN(group.slurm_link_speed, String(v, path + ".slurm_link_speed"));
    }
    return group;
  }

  Result<LinkSpec> Link(const YAML::Node& map, const std::string& path) const {
    GPUFLEET_RETURN_IF_ERROR(
        CheckKeys(map, path, {"from", "to", "pattern", "nics", "count", "speed"}));
    LinkSpec link;
    link.source = {Line(map), path};
    GPUFLEET_ASSIGN_OR_RETURN(link.from, Required(map, path, "from"));
    GPUFLEET_ASSIGN_OR_RETURN(link.to, Required(map, path, "to"));
    if (const YAML::Node v = map["pattern"]) {
      GPUFLEET_ASSIGN_OR_RETURN(const std::string pattern, String(v, path + ".pattern"));
      if (pattern == "mesh") {
        link.pattern = LinkPattern::kMesh;
      } else if (pattern == "rails") {
        link.pattern = LinkPattern::kRails;
      } else if (pattern == "zip") {
        link.pattern = LinkPattern::kZip;
      } else {
        return Fail(v, path + ".pattern",
                    fmt::format("unknown pattern \"{}\" (known: mesh, rails, zip)", pattern));
      }
    }
    if (const YAML::Node v = map["nics"]) {
      if (v.IsScalar() && v.Scalar() == "all") {
        link.nics.clear();
      } else if (v.IsScalar()) {
        GPUFLEET_ASSIGN_OR_RETURN(const int64_t nic, Integer(v, path + ".nics", 0, 63));
        link.nics.push_back(static_cast<int>(nic));
      } else {
        GPUFLEET_RETURN_IF_ERROR(Sequence(
            v, path + ".nics", link.nics,
            [this](const YAML::Node& item, const std::string& item_path) -> Result<int> {
              GPUFLEET_ASSIGN_OR_RETURN(const int64_t nic, Integer(item, item_path, 0, 63));
              return static_cast<int>(nic);
            }));
      }
    }
    if (const YAML::Node v = map["count"]) {
      GPUFLEET_ASSIGN_OR_RETURN(const int64_t count, Integer(v, path + ".count", 1, 100000));
      link.count = static_cast<int>(count);
    }
    if (const YAML::Node v = map["speed"]) {
      GPUFLEET_ASSIGN_OR_RETURN(link.speed_mbps, Speed(v, path + ".speed"));
    }
    return link;
  }

  Result<NvlinkDomainSpec> Domain(const YAML::Node& map, const std::string& path) const {
    GPUFLEET_RETURN_IF_ERROR(CheckKeys(map, path, {"name", "nodes", "bandwidth"}));
    NvlinkDomainSpec domain;
    domain.source = {Line(map), path};
    GPUFLEET_ASSIGN_OR_RETURN(domain.name, Required(map, path, "name"));
    GPUFLEET_ASSIGN_OR_RETURN(domain.nodes, Required(map, path, "nodes"));
    if (const YAML::Node v = map["bandwidth"]) {
      GPUFLEET_ASSIGN_OR_RETURN(domain.bandwidth_mbps, Speed(v, path + ".bandwidth"));
    }
    return domain;
  }

  Result<FabricSpec> Document(const YAML::Node& root) const {
    FabricSpec spec;
    spec.source_file = std::string(file_);
    if (!root.IsMap()) {
      return Fail(root, "(document)", "expected a mapping with tiers, nodes, switches and links");
    }
    GPUFLEET_RETURN_IF_ERROR(CheckKeys(
        root, "", {"name", "tiers", "nodes", "switches", "links", "nvlink_domains", "slurm"}));
    if (const YAML::Node v = root["name"]) {
      GPUFLEET_ASSIGN_OR_RETURN(spec.name, String(v, "name"));
    }
    if (const YAML::Node v = root["tiers"]) {
      GPUFLEET_RETURN_IF_ERROR(Sequence(
          v, "tiers", spec.tiers,
          [this](const YAML::Node& item, const std::string& path) { return String(item, path); }));
    }
    auto each = [&](const char* key, auto& out, auto parse) -> Status {
      if (const YAML::Node v = root[key]) {
        return Sequence(v, key, out, parse);
      }
      return Status::Ok();
    };
    GPUFLEET_RETURN_IF_ERROR(
        each("nodes", spec.nodes,
             [this](const YAML::Node& n, const std::string& p) { return NodeGroup(n, p); }));
    GPUFLEET_RETURN_IF_ERROR(
        each("switches", spec.switches,
             [this](const YAML::Node& n, const std::string& p) { return SwitchGroup(n, p); }));
    GPUFLEET_RETURN_IF_ERROR(
        each("links", spec.links,
             [this](const YAML::Node& n, const std::string& p) { return Link(n, p); }));
    GPUFLEET_RETURN_IF_ERROR(
        each("nvlink_domains", spec.nvlink_domains,
             [this](const YAML::Node& n, const std::string& p) { return Domain(n, p); }));
    if (const YAML::Node slurm = root["slurm"]) {
      GPUFLEET_RETURN_IF_ERROR(CheckKeys(slurm, "slurm", {"block_sizes"}));
      if (const YAML::Node v = slurm["block_sizes"]) {
        GPUFLEET_RETURN_IF_ERROR(Sequence(
            v, "slurm.block_sizes", spec.slurm_block_sizes,
            [this](const YAML::Node& item, const std::string& path) -> Result<int> {
              GPUFLEET_ASSIGN_OR_RETURN(const int64_t size, Integer(item, path, 1, 1000000));
              return static_cast<int>(size);
            }));
      }
    }
    return spec;
  }

 private:
  std::string_view file_;
};

}  // namespace

Result<FabricSpec> ParseFabricYaml(std::string_view text, std::string_view file_name) {
  const Reader reader(file_name);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(
        fmt::format("{}:{}: malformed YAML: {}", file_name, e.mark.line + 1, e.msg));
  }
  try {
    return reader.Document(root);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(
        fmt::format("{}:{}: malformed YAML: {}", file_name, e.mark.line + 1, e.msg));
  }
}

std::string WriteFabricYaml(const FabricSpec& spec) {
  YAML::Emitter out;
  out.SetIndent(2);
  out << YAML::BeginMap;
  if (!spec.name.empty()) {
    out << YAML::Key << "name" << YAML::Value << spec.name;
  }
  out << YAML::Key << "tiers" << YAML::Value << YAML::Flow << spec.tiers;
  if (!spec.nodes.empty()) {
    out << YAML::Key << "nodes" << YAML::Value << YAML::BeginSeq;
    for (const NodeGroupSpec& group : spec.nodes) {
      out << YAML::BeginMap;
      out << YAML::Key << "names" << YAML::Value << group.names;
      out << YAML::Key << "gpus" << YAML::Value << group.gpus;
      out << YAML::Key << "gpu_model" << YAML::Value << group.gpu_model;
      out << YAML::Key << "nics" << YAML::Value << group.nics;
      out << YAML::Key << "nic_speed" << YAML::Value << FormatSpeed(group.nic_speed_mbps);
      out << YAML::Key << "nvlink_bandwidth" << YAML::Value << FormatByteSpeed(group.nvlink_mbps);
      out << YAML::Key << "cpus" << YAML::Value
          << (group.cpu_milli % 1000 == 0 ? fmt::format("{}", group.cpu_milli / 1000)
                                          : fmt::format("{}", group.cpu_milli / 1000.0));
      out << YAML::Key << "memory" << YAML::Value
          << (group.memory_mib % 1024 == 0 ? fmt::format("{}Gi", group.memory_mib / 1024)
                                           : fmt::format("{}Mi", group.memory_mib));
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  if (!spec.nvlink_domains.empty()) {
    out << YAML::Key << "nvlink_domains" << YAML::Value << YAML::BeginSeq;
    for (const NvlinkDomainSpec& domain : spec.nvlink_domains) {
      out << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "name" << YAML::Value << domain.name;
      out << YAML::Key << "nodes" << YAML::Value << domain.nodes;
      out << YAML::Key << "bandwidth" << YAML::Value << FormatByteSpeed(domain.bandwidth_mbps);
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  if (!spec.switches.empty()) {
    out << YAML::Key << "switches" << YAML::Value << YAML::BeginSeq;
    for (const SwitchGroupSpec& group : spec.switches) {
      out << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "names" << YAML::Value << group.names;
      out << YAML::Key << "tier" << YAML::Value << group.tier;
      out << YAML::Key << "ports" << YAML::Value << group.ports;
      out << YAML::Key << "port_speed" << YAML::Value << FormatSpeed(group.port_speed_mbps);
      if (!group.group.empty()) {
        out << YAML::Key << "group" << YAML::Value << group.group;
      }
      if (!group.slurm_link_speed.empty()) {
        out << YAML::Key << "slurm_link_speed" << YAML::Value << group.slurm_link_speed;
      }
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  if (!spec.links.empty()) {
    out << YAML::Key << "links" << YAML::Value << YAML::BeginSeq;
    for (const LinkSpec& link : spec.links) {
      out << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "from" << YAML::Value << link.from;
      out << YAML::Key << "to" << YAML::Value << link.to;
      if (link.pattern != LinkPattern::kMesh) {
        out << YAML::Key << "pattern" << YAML::Value << LinkPatternName(link.pattern);
      }
      if (!link.nics.empty()) {
        out << YAML::Key << "nics" << YAML::Value << YAML::Flow << link.nics;
      }
      if (link.count != 1) {
        out << YAML::Key << "count" << YAML::Value << link.count;
      }
      if (link.speed_mbps > 0) {
        out << YAML::Key << "speed" << YAML::Value << FormatSpeed(link.speed_mbps);
      }
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  if (!spec.slurm_block_sizes.empty()) {
    out << YAML::Key << "slurm" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "block_sizes" << YAML::Value << YAML::Flow << spec.slurm_block_sizes;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace gpufleet::fabric
