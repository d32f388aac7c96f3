// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/slurm.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/fabric/hostlist.h"

namespace gpufleet::fabric {
namespace {

std::string Lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

struct SlurmSwitch {
  std::string name;
  std::string switches;  // hostlist of children, as written
  std::string nodes;     // hostlist, as written
  std::string link_speed;
  int line = 0;
  std::vector<int> children;
  int height = -1;
};

struct SlurmBlock {
  std::string name;
  std::string nodes;
  int line = 0;
};

std::string TierName(int height, int tiers) {
  static const char* const kNames[] = {"leaf", "spine", "core"};
  return tiers <= 3 ? kNames[height] : fmt::format("level-{}", height + 1);
}

}  // namespace

Result<FabricSpec> ImportSlurmTopology(std::string_view text, std::string_view file_name,
                                       const SlurmImportOptions& options) {
  std::vector<SlurmSwitch> switches;
  std::map<std::string, int, std::less<>> switch_index;
  std::vector<SlurmBlock> blocks;
  std::vector<int> block_sizes;
  int line_number = 0;
  auto fail = [&](int line, const std::string& message) {
    return InvalidArgumentError(fmt::format("{}:{}: {}", file_name, line, message));
  };

  std::vector<std::string_view> lines;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  for (std::string_view line : lines) {
    ++line_number;
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<std::pair<std::string, std::string>> pairs;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) {
        ++i;
      }
      if (i >= line.size()) {
        break;
      }
      size_t j = i;
      while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) {
        ++j;
      }
      const std::string_view token = line.substr(i, j - i);
      i = j;
      const size_t equals = token.find('=');
      if (equals == std::string_view::npos || equals == 0) {
        return fail(
            line_number,
            fmt::format("malformed \"{}\" (expected Key=Value, e.g. SwitchName=s0)", token));
      }
      const std::string_view value = token.substr(equals + 1);
      if (value.empty()) {
        return fail(line_number, fmt::format("{}: empty value", token.substr(0, equals)));
      }
      pairs.emplace_back(std::string(token.substr(0, equals)), std::string(value));
    }
    if (pairs.empty()) {
      continue;
    }
    const std::string first = Lower(pairs.front().first);
    if (first == "switchname") {
      SlurmSwitch entry;
      entry.name = pairs.front().second;
      entry.line = line_number;
      for (size_t p = 1; p < pairs.size(); ++p) {
        const std::string key = Lower(pairs[p].first);
        std::string* target = key == "switches"    ? &entry.switches
                              : key == "nodes"     ? &entry.nodes
                              : key == "linkspeed" ? &entry.link_speed
                                                   : nullptr;
        if (target == nullptr) {
          return fail(line_number, fmt::format("{}: unknown key on a SwitchName line (known: "
                                               "Switches, Nodes, LinkSpeed)",
                                               pairs[p].first));
        }
        if (!target->empty()) {
          return fail(line_number, fmt::format("{}: given twice", pairs[p].first));
        }
        *target = pairs[p].second;
      }
      if (!switch_index.emplace(entry.name, static_cast<int>(switches.size())).second) {
        return fail(line_number, fmt::format("SwitchName: duplicate switch \"{}\" (first on line "
                                             "{})",
                                             entry.name, switches[switch_index[entry.name]].line));
      }
      switches.push_back(std::move(entry));
    } else if (first == "blockname") {
      SlurmBlock block;
      block.name = pairs.front().second;
      block.line = line_number;
      for (size_t p = 1; p < pairs.size(); ++p) {
        if (Lower(pairs[p].first) != "nodes" || !block.nodes.empty()) {
          return fail(line_number, fmt::format("{}: unexpected on a BlockName line (known: Nodes)",
                                               pairs[p].first));
        }
        block.nodes = pairs[p].second;
      }
      if (block.nodes.empty()) {
        return fail(line_number, fmt::format("BlockName={}: missing Nodes=", block.name));
      }
      blocks.push_back(std::move(block));
    } else if (first == "blocksizes") {
      if (pairs.size() > 1) {
        return fail(line_number, fmt::format("{}: unexpected after BlockSizes", pairs[1].first));
      }
      const std::string& list = pairs.front().second;
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        const std::string_view item = std::string_view(list).substr(start, comma - start);
        int size = 0;
        const auto [ptr, error] = std::from_chars(item.data(), item.data() + item.size(), size);
        if (item.empty() || error != std::errc() || ptr != item.data() + item.size() || size < 1) {
          return fail(line_number,
                      fmt::format("BlockSizes: \"{}\" is not a positive number", item));
        }
        block_sizes.push_back(size);
        start = comma + 1;
      }
    } else {
      return fail(line_number, fmt::format("{}: a line starts with SwitchName, BlockName or "
                                           "BlockSizes",
                                           pairs.front().first));
    }
  }
  if (!switches.empty() && (!blocks.empty() || !block_sizes.empty())) {
    return fail(blocks.empty() ? line_number : blocks.front().line,
                "tree (SwitchName) and block (BlockName) lines in one file; the plugins are "
                "separate");
  }

  FabricSpec spec;
  spec.source_file = std::string(file_name);
  spec.name = std::string(file_name);
  spec.slurm_block_sizes = block_sizes;
  auto node_group = [&](const std::string& names, int line, const std::string& path) {
    NodeGroupSpec group;
    group.names = names;
    group.gpus = options.gpus_per_node;
    group.gpu_model = options.gpu_model;
    group.nics = options.nics_per_node;
    group.nic_speed_mbps = options.link_speed_mbps;
    group.source = {line, path};
    return group;
  };

  if (!blocks.empty()) {
    std::set<std::string> seen_nodes;
    std::set<std::string> seen_blocks;
    for (const SlurmBlock& block : blocks) {
      if (!seen_blocks.insert(block.name).second) {
        return fail(block.line, fmt::format("BlockName: duplicate block \"{}\"", block.name));
      }
      auto names = ExpandHostlist(block.nodes);
      if (!names.ok()) {
        return fail(block.line, "Nodes: " + names.status().message());
      }
      for (const std::string& name : *names) {
        if (!seen_nodes.insert(name).second) {
          return fail(block.line, fmt::format("Nodes: node \"{}\" is in two blocks", name));
        }
      }
      spec.nodes.push_back(node_group(block.nodes, block.line, "BlockName=" + block.name));
      NvlinkDomainSpec domain;
      domain.name = block.name;
      domain.nodes = block.nodes;
      domain.bandwidth_mbps = options.block_nvlink_mbps;
      domain.source = {block.line, "BlockName=" + block.name};
      spec.nvlink_domains.push_back(std::move(domain));
    }
    return spec;
  }

  // Tree: children, loops, heights.
  for (SlurmSwitch& entry : switches) {
    if (entry.switches.empty()) {
      continue;
    }
    auto names = ExpandHostlist(entry.switches);
    if (!names.ok()) {
      return fail(entry.line, "Switches: " + names.status().message());
    }
    for (const std::string& name : *names) {
      const auto it = switch_index.find(name);
      if (it == switch_index.end()) {
        return fail(entry.line,
                    fmt::format("Switches: unknown switch \"{}\" under \"{}\"", name, entry.name));
      }
      entry.children.push_back(it->second);
    }
  }
  // Depth-first heights; a switch met again while on the stack closes a loop.
  std::vector<int> state(switches.size(), 0);  // 0 new, 1 on the stack, 2 done
  std::vector<int> stack;
  std::function<Status(int)> visit = [&](int s) -> Status {
    state[s] = 1;
    stack.push_back(s);
    int height = 0;
    for (int child : switches[s].children) {
      if (state[child] == 1) {
        std::vector<std::string> cycle;
        auto from = std::find(stack.begin(), stack.end(), child);
        for (auto it = from; it != stack.end(); ++it) {
          cycle.push_back(switches[*it].name);
        }
        cycle.push_back(switches[child].name);
        return fail(switches[s].line,
                    fmt::format("Switches: loop in the tree: {}", fmt::join(cycle, " -> ")));
      }
      if (state[child] == 0) {
        GPUFLEET_RETURN_IF_ERROR(visit(child));
      }
      height = std::max(height, switches[child].height + 1);
    }
    switches[s].height = height;
    state[s] = 2;
    stack.pop_back();
    return Status::Ok();
  };
  for (size_t s = 0; s < switches.size(); ++s) {
    if (state[s] == 0) {
      GPUFLEET_RETURN_IF_ERROR(visit(static_cast<int>(s)));
    }
  }
  int tiers = 0;
  for (const SlurmSwitch& entry : switches) {
    tiers = std::max(tiers, entry.height + 1);
  }
  for (int t = 0; t < tiers; ++t) {
    spec.tiers.push_back(TierName(t, tiers));
  }

  std::map<std::string, int> node_switch;  // node -> switch that lists it
  std::map<int, int> cables;               // switch -> cables used
  for (size_t s = 0; s < switches.size(); ++s) {
    const SlurmSwitch& entry = switches[s];
    const std::string path = "SwitchName=" + entry.name;
    if (!entry.nodes.empty()) {
      auto names = ExpandHostlist(entry.nodes);
      if (!names.ok()) {
        return fail(entry.line, "Nodes: " + names.status().message());
      }
      for (const std::string& name : *names) {
        auto [it, inserted] = node_switch.emplace(name, static_cast<int>(s));
        if (!inserted) {
          return fail(
              entry.line,
              fmt::format("Nodes: node \"{}\" is under \"{}\" (line {}) and \"{}\"; a "
                          "node has one leaf switch",
                          name, switches[it->second].name, switches[it->second].line, entry.name));
        }
      }
      spec.nodes.push_back(node_group(entry.nodes, entry.line, path));
      LinkSpec link;
      link.from = entry.nodes;
      link.to = entry.name;
      link.source = {entry.line, path + " Nodes"};
      spec.links.push_back(std::move(link));
      cables[static_cast<int>(s)] += static_cast<int>(names->size()) * options.nics_per_node;
    }
  }
  for (size_t s = 0; s < switches.size(); ++s) {
    const SlurmSwitch& entry = switches[s];
    for (int child : entry.children) {
      LinkSpec link;
      link.from = switches[child].name;
      link.to = entry.name;
      link.speed_mbps = options.link_speed_mbps;
      link.source = {entry.line, "SwitchName=" + entry.name + " Switches"};
      spec.links.push_back(std::move(link));
      ++cables[child];
      ++cables[static_cast<int>(s)];
    }
  }
  for (size_t s = 0; s < switches.size(); ++s) {
    const SlurmSwitch& entry = switches[s];
    SwitchGroupSpec group;
    group.names = entry.name;
    group.tier = spec.tiers[entry.height];
    group.ports = std::max(1, cables[static_cast<int>(s)]);
    group.port_speed_mbps = options.link_speed_mbps;
    group.slurm_link_speed = entry.link_speed;
    group.source = {entry.line, "SwitchName=" + entry.name};
    spec.switches.push_back(std::move(group));
  }
  return spec;
}

Result<std::string> ExportSlurmTopology(const Fabric& fabric, SlurmTopologyKind kind) {
  std::string out =
      fmt::format("# topology.conf for fabric \"{}\", written by gpufleet\n", fabric.name());
  const std::vector<FabricNode>& nodes = fabric.nodes();
  if (kind == SlurmTopologyKind::kBlock) {
    out.insert(0, "# TopologyPlugin=topology/block\n");
    std::vector<std::pair<std::string, std::vector<std::string>>> blocks;
    for (const NvlinkDomain& domain : fabric.nvlink_domains()) {
      if (domain.nodes.size() < 2) {
        continue;
      }
      std::vector<std::string> names;
      for (int n : domain.nodes) {
        if (nodes[n].gpus > 0) {
          names.push_back(nodes[n].name);
        }
      }
      blocks.emplace_back(domain.name, std::move(names));
    }
    if (blocks.empty()) {
      if (fabric.TierCount() == 0) {
        return FailedPreconditionError(
            "block topology: the fabric has neither NVLink domains spanning nodes nor switches");
      }
      std::map<int, size_t> index;
      for (size_t n = 0; n < nodes.size(); ++n) {
        if (nodes[n].gpus == 0) {
          continue;
        }
        const int domain = fabric.DomainOf(0, static_cast<int>(n));
        auto [it, inserted] = index.try_emplace(domain, blocks.size());
        if (inserted) {
          blocks.emplace_back(fabric.DomainName(0, domain), std::vector<std::string>{});
        }
        blocks[it->second].second.push_back(nodes[n].name);
      }
    }
    size_t base = 0;
    size_t total = 0;
    for (const auto& [name, members] : blocks) {
      out += fmt::format("BlockName={} Nodes={}\n", name, CompressHostlist(members));
      base = base == 0 ? members.size() : std::min(base, members.size());
      total += members.size();
    }
    std::vector<int> sizes = fabric.spec().slurm_block_sizes;
    if (sizes.empty() && base > 0) {
      for (size_t size = base; size <= base * blocks.size() && size <= total; size *= 2) {
        sizes.push_back(static_cast<int>(size));
      }
    }
    if (!sizes.empty()) {
      out += fmt::format("BlockSizes={}\n", fmt::join(sizes, ","));
    }
    return out;
  }

  if (fabric.TierCount() == 0 || fabric.switches().empty()) {
    return FailedPreconditionError("tree topology: the fabric has no switches");
  }
  out.insert(0, "# TopologyPlugin=topology/tree\n");
  // The name Slurm sees for each switch: its own, or its leaf domain's when several leaves serve
  // the same nodes.
  const std::vector<FabricSwitch>& switches = fabric.switches();
  std::vector<std::string> unit(switches.size());
  std::map<std::string, int> leaves_per_unit;
  std::vector<std::vector<std::string>> unit_nodes(switches.size());
  std::map<std::string, std::vector<std::string>> domain_nodes;
  for (size_t s = 0; s < switches.size(); ++s) {
    unit[s] = switches[s].name;
  }
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (nodes[n].gpus == 0) {
      continue;
    }
    std::set<int> attached(nodes[n].nic_switch.begin(), nodes[n].nic_switch.end());
    attached.erase(-1);
    if (attached.size() > 1 && fabric.TierCount() > 0) {
      const std::string domain = fabric.DomainName(0, fabric.DomainOf(0, static_cast<int>(n)));
      for (int s : attached) {
        if (switches[s].tier == 0) {
          unit[s] = domain;
        }
      }
      domain_nodes[domain].push_back(nodes[n].name);
    } else if (attached.size() == 1) {
      unit_nodes[*attached.begin()].push_back(nodes[n].name);
    }
  }
  std::set<std::string> written;
  for (int tier = 0; tier < fabric.TierCount(); ++tier) {
    for (size_t s = 0; s < switches.size(); ++s) {
      const FabricSwitch& entry = switches[s];
      if (entry.tier != tier || !written.insert(unit[s]).second) {
        continue;
      }
      std::string line = "SwitchName=" + unit[s];
      std::vector<std::string> children;
      std::set<std::string> seen;
      for (int l : entry.down_links) {
        const FabricLink& link = fabric.links()[l];
        if (!link.from_node() && seen.insert(unit[link.lower_switch]).second) {
          children.push_back(unit[link.lower_switch]);
        }
      }
      if (!children.empty()) {
        line += " Switches=" + CompressHostlist(children);
      }
      std::vector<std::string> members =
          unit[s] != entry.name ? domain_nodes[unit[s]] : unit_nodes[s];
      if (!members.empty()) {
        line += " Nodes=" + CompressHostlist(members);
      }
      if (!entry.slurm_link_speed.empty()) {
        line += " LinkSpeed=" + entry.slurm_link_speed;
      }
      out += line + "\n";
    }
  }
  return out;
}

}  // namespace gpufleet::fabric
