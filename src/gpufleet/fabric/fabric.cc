// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/fabric.h"

#include <algorithm>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "gpufleet/fabric/hostlist.h"
#include "gpufleet/fabric/units.h"

namespace gpufleet::fabric {
namespace {

// Most NIC ports one node may have.
constexpr int kMaxNics = 64;

// Union-find over nodes and switches, for domains.
class Components {
 public:
  explicit Components(size_t size) : parent_(size) { std::iota(parent_.begin(), parent_.end(), 0); }
  int Find(int x) {
    while (parent_[x] != x) {
      parent_[x] = parent_[parent_[x]];
      x = parent_[x];
    }
    return x;
  }
  void Join(int a, int b) {
    a = Find(a);
    b = Find(b);
    if (a != b) {
      parent_[std::max(a, b)] = std::min(a, b);
    }
  }

 private:
  std::vector<int> parent_;
};

}  // namespace

const char* LinkPatternName(LinkPattern pattern) {
  switch (pattern) {
    case LinkPattern::kMesh:
      return "mesh";
    case LinkPattern::kRails:
      return "rails";
    case LinkPattern::kZip:
      return "zip";
  }
  return "mesh";
}

std::string Locate(const FabricSpec& spec, const SourceRef& source) {
  std::string where;
  if (!spec.source_file.empty()) {
    where = spec.source_file;
    if (source.line > 0) {
      where += fmt::format(":{}", source.line);
    }
  } else if (source.line > 0) {
    where = fmt::format("line {}", source.line);
  }
  if (!source.path.empty()) {
    where += where.empty() ? source.path : ": " + source.path;
  }
  return where;
}

Result<Fabric> Fabric::Build(FabricSpec spec) {
  Fabric fabric;
  fabric.spec_ = std::move(spec);
  GPUFLEET_RETURN_IF_ERROR(fabric.Expand());
  fabric.ComputeDomains();
  return fabric;
}

Status Fabric::Expand() {
  const FabricSpec& spec = spec_;
  auto error = [&](const SourceRef& source, std::string_view field, const std::string& message) {
    std::string where = Locate(spec, source);
    if (!field.empty()) {
      where += where.empty() ? std::string(field) : "." + std::string(field);
    }
    return InvalidArgumentError(fmt::format("{}: {}", where, message));
  };

  std::map<std::string, int, std::less<>> tier_index;
  for (size_t t = 0; t < spec.tiers.size(); ++t) {
    const std::string& tier = spec.tiers[t];
    const SourceRef where{0, fmt::format("tiers[{}]", t)};
    if (tier.empty()) {
      return error(where, "", "empty tier name");
    }
    if (tier == kNodeLevel || tier == kNvlinkDomainLevel) {
      return error(where, "",
                   fmt::format("\"{}\" is reserved for the scheduler's own level", tier));
    }
    if (!tier_index.emplace(tier, static_cast<int>(t)).second) {
      return error(where, "", fmt::format("duplicate tier \"{}\"", tier));
    }
  }

  // Nodes.
  for (const NodeGroupSpec& group : spec.nodes) {
    auto names = ExpandHostlist(group.names);
    if (!names.ok()) {
      return error(group.source, "names", names.status().message());
    }
    if (group.gpus < 0) {
      return error(group.source, "gpus", fmt::format("{} is negative", group.gpus));
    }
    if (group.gpus > 0 && group.gpu_model.empty()) {
      return error(group.source, "gpu_model", "missing (the node has GPUs)");
    }
    if (group.nics < 0 || group.nics > kMaxNics) {
      return error(group.source, "nics",
                   fmt::format("{} is out of range [0, {}]", group.nics, kMaxNics));
    }
    if (group.nic_speed_mbps <= 0) {
      return error(group.source, "nic_speed",
                   fmt::format("{} Mb/s (a speed must be positive)", group.nic_speed_mbps));
    }
    if (group.nvlink_mbps <= 0) {
      return error(group.source, "nvlink_bandwidth",
                   fmt::format("{} Mb/s (a bandwidth must be positive)", group.nvlink_mbps));
    }
    if (group.cpu_milli < 0 || group.memory_mib < 0) {
      return error(group.source, group.cpu_milli < 0 ? "cpus" : "memory", "negative value");
    }
    for (std::string& name : *names) {
      FabricNode node;
      node.name = std::move(name);
      node.gpus = group.gpus;
      node.gpu_model = group.gpu_model;
      node.nics = group.nics;
      node.nic_speed_mbps = group.nic_speed_mbps;
      node.nvlink_mbps = group.nvlink_mbps;
      node.cpu_milli = group.cpu_milli;
      node.memory_mib = group.memory_mib;
      node.nic_switch.assign(group.nics, -1);
      node.nic_link.assign(group.nics, -1);
      if (!node_index_.emplace(node.name, static_cast<int>(nodes_.size())).second) {
        return error(group.source, "names", fmt::format("duplicate node \"{}\"", node.name));
      }
      total_gpus_ += node.gpus;
      nodes_.push_back(std::move(node));
    }
  }

  // Switches.
  if (!spec.switches.empty() && spec.tiers.empty()) {
    return error(spec.switches.front().source, "tier", "the fabric declares no tiers");
  }
  for (const SwitchGroupSpec& group : spec.switches) {
    auto names = ExpandHostlist(group.names);
    if (!names.ok()) {
      return error(group.source, "names", names.status().message());
    }
    const auto tier = tier_index.find(group.tier);
    if (tier == tier_index.end()) {
      return error(
          group.source, "tier",
          fmt::format("unknown tier \"{}\" (tiers: {})", group.tier, fmt::join(spec.tiers, ", ")));
    }
    if (group.ports <= 0) {
      return error(group.source, "ports", fmt::format("{} (must be positive)", group.ports));
    }
    if (group.port_speed_mbps <= 0) {
      return error(group.source, "port_speed",
                   fmt::format("{} Mb/s (a speed must be positive)", group.port_speed_mbps));
    }
    for (std::string& name : *names) {
      if (node_index_.count(name) > 0 || switch_index_.count(name) > 0) {
        return error(group.source, "names", fmt::format("duplicate name \"{}\"", name));
      }
      FabricSwitch fabric_switch;
      fabric_switch.name = std::move(name);
      fabric_switch.tier = tier->second;
      fabric_switch.ports = group.ports;
      fabric_switch.port_speed_mbps = group.port_speed_mbps;
      fabric_switch.group = group.group;
      fabric_switch.slurm_link_speed = group.slurm_link_speed;
      switch_index_.emplace(fabric_switch.name, static_cast<int>(switches_.size()));
      switches_.push_back(std::move(fabric_switch));
    }
  }

  // NVLink domains.
  std::set<std::string> domain_names;
  for (const NvlinkDomainSpec& domain_spec : spec.nvlink_domains) {
    if (domain_spec.name.empty()) {
      return error(domain_spec.source, "name", "empty");
    }
    if (!domain_names.insert(domain_spec.name).second) {
      return error(domain_spec.source, "name",
                   fmt::format("duplicate NVLink domain \"{}\"", domain_spec.name));
    }
    if (domain_spec.bandwidth_mbps <= 0) {
      return error(
          domain_spec.source, "bandwidth",
          fmt::format("{} Mb/s (a bandwidth must be positive)", domain_spec.bandwidth_mbps));
    }
    auto names = ExpandHostlist(domain_spec.nodes);
    if (!names.ok()) {
      return error(domain_spec.source, "nodes", names.status().message());
    }
    NvlinkDomain domain;
    domain.name = domain_spec.name;
    domain.bandwidth_mbps = domain_spec.bandwidth_mbps;
    const int index = static_cast<int>(nvlink_domains_.size());
    for (const std::string& name : *names) {
      const int node = FindNode(name);
      if (node < 0) {
        return error(domain_spec.source, "nodes", fmt::format("unknown node \"{}\"", name));
      }
      if (nodes_[node].nvlink_domain >= 0) {
        return error(domain_spec.source, "nodes",
                     fmt::format("node \"{}\" is already in NVLink domain \"{}\"", name,
                                 nvlink_domains_[nodes_[node].nvlink_domain].name));
      }
      nodes_[node].nvlink_domain = index;
      nodes_[node].nvlink_mbps = domain.bandwidth_mbps;
      domain.nodes.push_back(node);
    }
    nvlink_domains_.push_back(std::move(domain));
  }

  // Links.
  for (const LinkSpec& link : spec.links) {
    const SourceRef& source = link.source;
    if (link.count < 1) {
      return error(source, "count", fmt::format("{} (must be at least 1)", link.count));
    }
    if (link.speed_mbps < 0) {
      return error(source, "speed",
                   fmt::format("{} Mb/s is negative (a speed must be positive)", link.speed_mbps));
    }
    auto from = ExpandHostlist(link.from);
    if (!from.ok()) {
      return error(source, "from", from.status().message());
    }
    auto to = ExpandHostlist(link.to);
    if (!to.ok()) {
      return error(source, "to", to.status().message());
    }
    std::vector<int> to_switches;
    for (const std::string& name : *to) {
      const int s = FindSwitch(name);
      if (s < 0) {
        return error(source, "to",
                     FindNode(name) >= 0
                         ? fmt::format("\"{}\" is a node; a link goes up to a switch", name)
                         : fmt::format("unknown switch \"{}\"", name));
      }
      to_switches.push_back(s);
    }
    bool from_nodes = false;
    bool from_switches = false;
    std::vector<int> from_index;
    for (const std::string& name : *from) {
      if (const int n = FindNode(name); n >= 0) {
        from_nodes = true;
        from_index.push_back(n);
      } else if (const int s = FindSwitch(name); s >= 0) {
        from_switches = true;
        from_index.push_back(s);
      } else {
        return error(source, "from", fmt::format("unknown node or switch \"{}\"", name));
      }
    }
    if (from_nodes && from_switches) {
      return error(source, "from", "mixes nodes and switches; write one link entry for each");
    }
    if (link.pattern == LinkPattern::kZip && from_index.size() != to_switches.size()) {
      return error(source, "pattern",
                   fmt::format("zip pairs {} from-ends with {} to-ends; the counts must match",
                               from_index.size(), to_switches.size()));
    }
    if (from_switches && link.pattern == LinkPattern::kRails) {
      return error(source, "pattern", "rails connects node NICs; `from` lists switches");
    }
    if (from_switches && !link.nics.empty()) {
      return error(source, "nics", "only links from nodes name NICs");
    }

    auto take_ports = [&](int s, int cables) -> Status {
      FabricSwitch& target = switches_[s];
      if (target.used_ports + cables > target.ports) {
        return error(source, "",
                     fmt::format("switch \"{}\" has {} ports; this link needs port {}", target.name,
                                 target.ports, target.used_ports + cables));
      }
      target.used_ports += cables;
      return Status::Ok();
    };
    auto add_node_cable = [&](int n, int nic, int s) -> Status {
      FabricNode& node = nodes_[n];
      if (nic < 0 || nic >= node.nics) {
        return error(source, "nics",
                     fmt::format("NIC {} of node \"{}\" does not exist (it has {})", nic, node.name,
                                 node.nics));
      }
      if (node.nic_switch[nic] >= 0) {
        return error(source, "",
                     fmt::format("NIC {} of node \"{}\" is already cabled to \"{}\"", nic,
                                 node.name, switches_[node.nic_switch[nic]].name));
      }
      GPUFLEET_RETURN_IF_ERROR(take_ports(s, 1));
      FabricLink cable;
      cable.node = n;
      cable.nic = nic;
      cable.upper_switch = s;
      cable.count = 1;
      cable.speed_mbps = link.speed_mbps > 0 ? link.speed_mbps : node.nic_speed_mbps;
      node.nic_switch[nic] = s;
      node.nic_link[nic] = static_cast<int>(links_.size());
      switches_[s].down_mbps += cable.speed_mbps;
      switches_[s].down_links.push_back(static_cast<int>(links_.size()));
      links_.push_back(cable);
      return Status::Ok();
    };
    auto add_switch_cables = [&](int a, int b) -> Status {
      if (switches_[a].tier == switches_[b].tier) {
        return error(
            source, "",
            fmt::format("\"{}\" and \"{}\" are both in tier \"{}\": a link inside a tier "
                        "would make a loop",
                        switches_[a].name, switches_[b].name, spec.tiers[switches_[a].tier]));
      }
      const int lower = switches_[a].tier < switches_[b].tier ? a : b;
      const int upper = lower == a ? b : a;
      GPUFLEET_RETURN_IF_ERROR(take_ports(lower, link.count));
      GPUFLEET_RETURN_IF_ERROR(take_ports(upper, link.count));
      FabricLink cables;
      cables.lower_switch = lower;
      cables.upper_switch = upper;
      cables.count = link.count;
      cables.speed_mbps = link.speed_mbps > 0 ? link.speed_mbps : switches_[lower].port_speed_mbps;
      const int64_t total = cables.speed_mbps * cables.count;
      switches_[lower].up_mbps += total;
      switches_[upper].down_mbps += total;
      switches_[lower].up_links.push_back(static_cast<int>(links_.size()));
      switches_[upper].down_links.push_back(static_cast<int>(links_.size()));
      links_.push_back(cables);
      return Status::Ok();
    };

    if (from_nodes) {
      if (link.count != 1) {
        return error(source, "count", fmt::format("{}: a NIC takes one cable", link.count));
      }
      for (size_t i = 0; i < from_index.size(); ++i) {
        const int n = from_index[i];
        const FabricNode& node = nodes_[n];
        if (link.pattern == LinkPattern::kRails) {
          if (static_cast<int>(to_switches.size()) > node.nics) {
            return error(source, "to",
                         fmt::format("{} rail switches but node \"{}\" has {} NICs",
                                     to_switches.size(), node.name, node.nics));
          }
          for (size_t r = 0; r < to_switches.size(); ++r) {
            GPUFLEET_RETURN_IF_ERROR(add_node_cable(n, static_cast<int>(r), to_switches[r]));
          }
          continue;
        }
        std::vector<int> nics = link.nics;
        if (nics.empty()) {
          nics.resize(node.nics);
          std::iota(nics.begin(), nics.end(), 0);
        }
        const std::vector<int> targets =
            link.pattern == LinkPattern::kZip ? std::vector<int>{to_switches[i]} : to_switches;
        for (int s : targets) {
          for (int nic : nics) {
            GPUFLEET_RETURN_IF_ERROR(add_node_cable(n, nic, s));
          }
        }
      }
    } else if (link.pattern == LinkPattern::kZip) {
      for (size_t i = 0; i < from_index.size(); ++i) {
        GPUFLEET_RETURN_IF_ERROR(add_switch_cables(from_index[i], to_switches[i]));
      }
    } else {
      for (int a : from_index) {
        for (int b : to_switches) {
          if (a == b) {
            return error(source, "", fmt::format("\"{}\" is linked to itself", switches_[a].name));
          }
          GPUFLEET_RETURN_IF_ERROR(add_switch_cables(a, b));
        }
      }
    }
  }
  return Status::Ok();
}

void Fabric::ComputeDomains() {
  const int tiers = TierCount();
  const int node_count = static_cast<int>(nodes_.size());
  Components components(nodes_.size() + switches_.size());
  auto vertex_of_switch = [&](int s) { return node_count + s; };
  domain_of_.assign(tiers, std::vector<int>(nodes_.size(), 0));
  domain_names_.assign(tiers, {});
  domain_gpus_.assign(tiers, {});
  std::vector<int64_t> down(tiers, 0);
  std::vector<int64_t> up(tiers, 0);
  for (const FabricSwitch& entry : switches_) {
    down[entry.tier] += entry.down_mbps;
    up[entry.tier] += entry.up_mbps;
  }
  tier_oversubscription_.assign(tiers, 1.0);
  for (int t = 0; t < tiers; ++t) {
    if (up[t] > 0) {
      tier_oversubscription_[t] = std::max(1.0, static_cast<double>(down[t]) / up[t]);
    }
  }
  // NVLink domains that span nodes count as joined below every tier.
  for (const NvlinkDomain& domain : nvlink_domains_) {
    for (int n : domain.nodes) {
      components.Join(domain.nodes.front(), n);
    }
  }
  for (int t = 0; t < tiers; ++t) {
    for (const FabricLink& link : links_) {
      if (switches_[link.upper_switch].tier != t) {
        continue;
      }
      const int lower = link.from_node() ? link.node : vertex_of_switch(link.lower_switch);
      components.Join(lower, vertex_of_switch(link.upper_switch));
    }
    // Switches of tier t per component root.
    std::map<int, std::vector<int>> tier_switches;
    for (size_t s = 0; s < switches_.size(); ++s) {
      if (switches_[s].tier == t) {
        tier_switches[components.Find(vertex_of_switch(static_cast<int>(s)))].push_back(
            static_cast<int>(s));
      }
    }
    std::map<int, int> domain_of_root;
    std::set<std::string> used;
    for (int n = 0; n < node_count; ++n) {
      const int root = components.Find(n);
      auto [it, inserted] = domain_of_root.try_emplace(root, DomainCount(t));
      domain_of_[t][n] = it->second;
      if (!inserted) {
        domain_gpus_[t][it->second] += nodes_[n].gpus;
        continue;
      }
      std::string name;
      auto found = tier_switches.find(root);
      if (found == tier_switches.end()) {
        // Nothing of this tier joins the domain: it is the one below, or the node itself.
        name = t > 0 ? domain_names_[t - 1][domain_of_[t - 1][n]] : nodes_[n].name;
        if (t == 0 && nodes_[n].nvlink_domain >= 0) {
          name = nvlink_domains_[nodes_[n].nvlink_domain].name;
        }
      } else {
        const std::vector<int>& members = found->second;
        const std::string& group = switches_[members.front()].group;
        const bool one_group =
            !group.empty() && std::all_of(members.begin(), members.end(),
                                          [&](int s) { return switches_[s].group == group; });
        if (one_group) {
          name = group;
        } else if (members.size() == 1) {
          name = switches_[members.front()].name;
        } else {
          name = fmt::format("{}+{}", switches_[members.front()].name, members.size() - 1);
        }
      }
      std::string unique = name;
      for (int k = 2; !used.insert(unique).second; ++k) {
        unique = fmt::format("{}#{}", name, k);
      }
      domain_names_[t].push_back(unique);
      domain_gpus_[t].push_back(nodes_[n].gpus);
    }
  }
}

int Fabric::FindNode(std::string_view name) const {
  const auto it = node_index_.find(name);
  return it == node_index_.end() ? -1 : it->second;
}

int Fabric::FindSwitch(std::string_view name) const {
  const auto it = switch_index_.find(name);
  return it == switch_index_.end() ? -1 : it->second;
}

int Fabric::CommonTier(const std::vector<int>& nodes) const {
  if (nodes.empty()) {
    return -1;
  }
  const int first = nodes.front();
  const bool one_nvlink = std::all_of(nodes.begin(), nodes.end(), [&](int n) {
    return n == first || (nodes_[first].nvlink_domain >= 0 &&
                          nodes_[n].nvlink_domain == nodes_[first].nvlink_domain);
  });
  if (one_nvlink) {
    return -1;
  }
  for (int t = 0; t < TierCount(); ++t) {
    const int domain = domain_of_[t][first];
    if (std::all_of(nodes.begin(), nodes.end(),
                    [&](int n) { return domain_of_[t][n] == domain; })) {
      return t;
    }
  }
  return TierCount();
}

int Fabric::NvlinkDomainGpus(int node) const {
  const int domain = nodes_[node].nvlink_domain;
  if (domain < 0) {
    return nodes_[node].gpus;
  }
  int gpus = 0;
  for (int n : nvlink_domains_[domain].nodes) {
    gpus += nodes_[n].gpus;
  }
  return gpus;
}

Result<Cluster> BuildCluster(const Fabric& fabric, const GpuCatalog& catalog) {
  Cluster cluster;
  std::vector<std::string> levels(fabric.tiers().rbegin(), fabric.tiers().rend());
  const bool shared_nvlink =
      std::any_of(fabric.nvlink_domains().begin(), fabric.nvlink_domains().end(),
                  [](const NvlinkDomain& domain) { return domain.nodes.size() > 1; });
  if (shared_nvlink) {
    levels.emplace_back(kNvlinkDomainLevel);
  }
  cluster.topology = Topology(levels);
  for (size_t n = 0; n < fabric.nodes().size(); ++n) {
    const FabricNode& fabric_node = fabric.nodes()[n];
    if (fabric_node.gpus == 0) {
      continue;  // management appliances such as UFM
    }
    auto model = catalog.Find(fabric_node.gpu_model);
    if (!model.ok()) {
      return InvalidArgumentError(
          fmt::format("node \"{}\": gpu_model: {}", fabric_node.name, model.status().message()));
    }
    Node node;
    node.id = NodeId(fabric_node.name);
    node.capacity = {fabric_node.cpu_milli, fabric_node.memory_mib};
    for (int t = fabric.TierCount() - 1; t >= 0; --t) {
      node.topology.push_back(fabric.DomainName(t, fabric.DomainOf(t, static_cast<int>(n))));
    }
    const std::string nvlink_name = fabric_node.nvlink_domain >= 0
                                        ? fabric.nvlink_domains()[fabric_node.nvlink_domain].name
                                        : fabric_node.name;
    if (shared_nvlink) {
      node.topology.push_back(nvlink_name);
    }
    if (fabric_node.nvlink_domain >= 0) {
      node.fault_domains["rack"] = nvlink_name;
    } else if (fabric.TierCount() > 0) {
      node.fault_domains["rack"] = fabric.DomainName(0, fabric.DomainOf(0, static_cast<int>(n)));
    }
    for (int g = 0; g < fabric_node.gpus; ++g) {
      Gpu gpu;
      gpu.uuid = GpuUuid(fmt::format("GPU-{}-{}", fabric_node.name, g));
      gpu.index = g;
      gpu.model = (*model)->name;
      gpu.memory_mib = (*model)->memory_mib;
      node.gpus.push_back(std::move(gpu));
    }
    cluster.nodes.push_back(std::move(node));
  }
  return cluster;
}

}  // namespace gpufleet::fabric
