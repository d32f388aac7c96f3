// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/generators.h"

#include <cmath>

#include <fmt/format.h>

namespace gpufleet::fabric {
namespace {

// DGX H100: two 56-core Xeon 8480C, 2 TiB.
constexpr int64_t kDgxCpuMilli = 112000;
constexpr int64_t kDgxMemoryMib = 2048 * 1024;
constexpr int64_t kH100NvlinkMbps = 3600000;  // 450 GB/s per direction
constexpr int64_t kNdrMbps = 400000;
// GB200 compute tray: two 72-core Grace, 2 x 480 GiB LPDDR5X.
constexpr int64_t kGb200TrayCpuMilli = 144000;
constexpr int64_t kGb200TrayMemoryMib = 960 * 1024;
constexpr int64_t kGb200NvlinkMbps = 7200000;  // 900 GB/s per direction
constexpr int kTraysPerRack = 18;
constexpr int kGpusPerTray = 4;

// The fewest upper switches that take `lowers` x `uplinks` cables, the same number from every
// lower switch to each of them, within `radix` ports. 0 when none does.
int UpperSwitchCount(int lowers, int uplinks, int radix) {
  for (int count = 1; count <= uplinks; ++count) {
    if (uplinks % count == 0 && static_cast<int64_t>(lowers) * (uplinks / count) <= radix) {
      return count;
    }
  }
  return 0;
}

Status CheckPositive(std::string_view field, double value) {
  if (!(value > 0)) {
    return InvalidArgumentError(fmt::format("{}: {} (must be positive)", field, value));
  }
  return Status::Ok();
}

// Uplink cables a switch needs for `down_mbps` at `oversubscription`.
int Uplinks(int64_t down_mbps, double oversubscription, int64_t uplink_mbps) {
  return std::max(
      1, static_cast<int>(
             std::ceil(static_cast<double>(down_mbps) / (oversubscription * uplink_mbps) - 1e-9)));
}

std::string RatioText(double ratio) {
  return std::fabs(ratio - std::round(ratio)) < 1e-9 ? fmt::format("{}", std::lround(ratio))
                                                     : fmt::format("{:.2f}", ratio);
}

}  // namespace

Result<FabricSpec> GenerateSuperpod(const SuperpodOptions& options) {
  constexpr int kSlotsPerSu = 32;
  constexpr int kRails = 8;
  if (options.scalable_units < 1) {
    return InvalidArgumentError(
        fmt::format("scalable_units: {} (must be at least 1)", options.scalable_units));
  }
  if (options.radix < 2 || options.radix % 2 != 0) {
    return InvalidArgumentError(
        fmt::format("radix: {} (must be even and at least 2)", options.radix));
  }
  const int down = kSlotsPerSu;  // each rail leaf serves the 32 slots of its SU
  if (down * 2 > options.radix) {
    return InvalidArgumentError(fmt::format(
        "radix: {} ports cannot serve 32 nodes and 32 uplinks per rail leaf", options.radix));
  }
  const int leaves = options.scalable_units * kRails;
  const int spines = UpperSwitchCount(leaves, down, options.radix);
  if (spines == 0) {
    return InvalidArgumentError(fmt::format(
        "scalable_units: {} SUs need {} leaf uplinks, more than two tiers of {}-port switches "
        "hold (at most {} SUs); larger SuperPODs add a core tier",
        options.scalable_units, leaves * down, options.radix,
        options.radix * options.radix / 2 / (kSlotsPerSu * kRails)));
  }
  FabricSpec spec;
  spec.name = fmt::format("dgx-h100-superpod-{}su", options.scalable_units);
  spec.tiers = {"leaf", "spine"};
  for (int su = 1; su <= options.scalable_units; ++su) {
    const int last_slot = su == 1 && options.ufm ? kSlotsPerSu - 1 : kSlotsPerSu;
    const std::string nodes = fmt::format("su{}-dgx[01-{:02d}]", su, last_slot);
    NodeGroupSpec group;
    group.names = nodes;
    group.gpus = 8;
    group.gpu_model = options.gpu_model;
    group.nics = kRails;
    group.nic_speed_mbps = kNdrMbps;
    group.nvlink_mbps = kH100NvlinkMbps;
    group.cpu_milli = kDgxCpuMilli;
    group.memory_mib = kDgxMemoryMib;
    group.source.path = fmt::format("nodes[{}]", spec.nodes.size());
    spec.nodes.push_back(group);

    SwitchGroupSpec leaf;
    leaf.names = fmt::format("su{}-leaf[1-{}]", su, kRails);
    leaf.tier = "leaf";
    leaf.ports = options.radix;
    leaf.port_speed_mbps = kNdrMbps;
    leaf.group = fmt::format("su{}", su);
    leaf.source.path = fmt::format("switches[{}]", spec.switches.size());
    spec.switches.push_back(leaf);

    LinkSpec rails;
    rails.from = nodes;
    rails.to = leaf.names;
    rails.pattern = LinkPattern::kRails;
    rails.source.path = fmt::format("links[{}]", spec.links.size());
    spec.links.push_back(rails);
  }
  if (options.ufm) {
    NodeGroupSpec ufm;
    ufm.names = "ufm";
    ufm.gpus = 0;
    ufm.gpu_model = "";
    ufm.nics = 4;
    ufm.nic_speed_mbps = kNdrMbps;
    ufm.cpu_milli = 0;
    ufm.memory_mib = 0;
    ufm.source.path = fmt::format("nodes[{}]", spec.nodes.size());
    spec.nodes.push_back(ufm);
    LinkSpec link;
    link.from = "ufm";
    link.to = "su1-leaf[1-4]";
    link.pattern = LinkPattern::kRails;
    link.source.path = fmt::format("links[{}]", spec.links.size());
    spec.links.push_back(link);
  }
  SwitchGroupSpec spine;
  spine.names = fmt::format("spine[01-{:02d}]", spines);
  spine.tier = "spine";
  spine.ports = options.radix;
  spine.port_speed_mbps = kNdrMbps;
  spine.group = "superpod";
  spine.source.path = fmt::format("switches[{}]", spec.switches.size());
  spec.switches.push_back(spine);
  LinkSpec uplinks;
  uplinks.from = fmt::format("su[1-{}]-leaf[1-{}]", options.scalable_units, kRails);
  uplinks.to = spine.names;
  uplinks.count = down / spines;
  uplinks.source.path = fmt::format("links[{}]", spec.links.size());
  spec.links.push_back(uplinks);
  return spec;
}

Result<FabricSpec> GenerateClos(const ClosOptions& options) {
  if (options.tiers != 2 && options.tiers != 3) {
    return InvalidArgumentError(fmt::format("tiers: {} (2 or 3)", options.tiers));
  }
  const std::pair<const char*, int> counts[] = {{"pods", options.pods},
                                                {"leaves_per_pod", options.leaves_per_pod},
                                                {"nodes_per_leaf", options.nodes_per_leaf},
                                                {"nics_per_node", options.nics_per_node},
                                                {"radix", options.radix}};
  for (const auto& [field, value] : counts) {
    if (value < 1) {
      return InvalidArgumentError(fmt::format("{}: {} (must be at least 1)", field, value));
    }
  }
  if (options.gpus_per_node < 0) {
    return InvalidArgumentError(
        fmt::format("gpus_per_node: {} is negative", options.gpus_per_node));
  }
  if (options.tiers == 2 && options.pods != 1) {
    return InvalidArgumentError(fmt::format("pods: {} (pods need 3 tiers)", options.pods));
  }
  GPUFLEET_RETURN_IF_ERROR(CheckPositive("leaf_oversubscription", options.leaf_oversubscription));
  GPUFLEET_RETURN_IF_ERROR(CheckPositive("spine_oversubscription", options.spine_oversubscription));
  GPUFLEET_RETURN_IF_ERROR(CheckPositive("nic_speed", static_cast<double>(options.nic_speed_mbps)));
  GPUFLEET_RETURN_IF_ERROR(
      CheckPositive("uplink_speed", static_cast<double>(options.uplink_speed_mbps)));

  const int leaf_down = options.nodes_per_leaf * options.nics_per_node;
  const int leaf_up = Uplinks(static_cast<int64_t>(leaf_down) * options.nic_speed_mbps,
                              options.leaf_oversubscription, options.uplink_speed_mbps);
  if (leaf_down + leaf_up > options.radix) {
    return InvalidArgumentError(fmt::format(
        "radix: a leaf needs {} ports ({} to nodes, {} up) but has {}; fewer nodes_per_leaf or a "
        "larger radix",
        leaf_down + leaf_up, leaf_down, leaf_up, options.radix));
  }
  const int spines = UpperSwitchCount(options.leaves_per_pod, leaf_up,
                                      options.tiers == 3 ? options.radix / 2 : options.radix);
  if (spines == 0) {
    return InvalidArgumentError(
        fmt::format("leaves_per_pod: {} leaves with {} uplinks each do not fit spines of {} ports",
                    options.leaves_per_pod, leaf_up, options.radix));
  }
  const int spine_down = options.leaves_per_pod * (leaf_up / spines);

  FabricSpec spec;
  spec.name = !options.name.empty() ? options.name
              : options.tiers == 2
                  ? fmt::format("clos2-{}x{}-{}to1", options.leaves_per_pod, options.nodes_per_leaf,
                                RatioText(options.leaf_oversubscription))
                  : fmt::format("clos3-{}x{}x{}-{}to1-{}to1", options.pods, options.leaves_per_pod,
                                options.nodes_per_leaf, RatioText(options.leaf_oversubscription),
                                RatioText(options.spine_oversubscription));
  spec.tiers = options.tiers == 2 ? std::vector<std::string>{"leaf", "spine"}
                                  : std::vector<std::string>{"leaf", "spine", "core"};
  const int total_leaves = options.pods * options.leaves_per_pod;
  const int node_digits =
      static_cast<int>(std::to_string(total_leaves * options.nodes_per_leaf).size());
  const int leaf_digits = static_cast<int>(std::to_string(total_leaves).size());
  int next_node = 1;
  for (int pod = 1; pod <= options.pods; ++pod) {
    const std::string prefix = options.tiers == 3 ? fmt::format("pod{}-", pod) : "";
    for (int l = 1; l <= options.leaves_per_pod; ++l) {
      const int leaf_number = (pod - 1) * options.leaves_per_pod + l;
      const std::string leaf_name = fmt::format("leaf{:0{}d}", leaf_number, leaf_digits);
      const std::string nodes = fmt::format("node[{:0{}d}-{:0{}d}]", next_node, node_digits,
                                            next_node + options.nodes_per_leaf - 1, node_digits);
      next_node += options.nodes_per_leaf;
      NodeGroupSpec group;
      group.names = nodes;
      group.gpus = options.gpus_per_node;
      group.gpu_model = options.gpu_model;
      group.nics = options.nics_per_node;
      group.nic_speed_mbps = options.nic_speed_mbps;
      group.source.path = fmt::format("nodes[{}]", spec.nodes.size());
      spec.nodes.push_back(group);
      LinkSpec link;
      link.from = nodes;
      link.to = leaf_name;
      link.source.path = fmt::format("links[{}]", spec.links.size());
      spec.links.push_back(link);
    }
    const int first_leaf = (pod - 1) * options.leaves_per_pod + 1;
    SwitchGroupSpec leaves;
    leaves.names = options.leaves_per_pod == 1
                       ? fmt::format("leaf{:0{}d}", first_leaf, leaf_digits)
                       : fmt::format("leaf[{:0{}d}-{:0{}d}]", first_leaf, leaf_digits,
                                     first_leaf + options.leaves_per_pod - 1, leaf_digits);
    leaves.tier = "leaf";
    leaves.ports = options.radix;
    leaves.port_speed_mbps = options.uplink_speed_mbps;
    leaves.source.path = fmt::format("switches[{}]", spec.switches.size());
    spec.switches.push_back(leaves);
    SwitchGroupSpec spine;
    spine.names = fmt::format("{}spine[1-{}]", prefix, spines);
    if (spines == 1) {
      spine.names = fmt::format("{}spine1", prefix);
    }
    spine.tier = "spine";
    spine.ports = options.radix;
    spine.port_speed_mbps = options.uplink_speed_mbps;
    spine.group = options.tiers == 3 ? fmt::format("pod{}", pod) : spec.name;
    spine.source.path = fmt::format("switches[{}]", spec.switches.size());
    spec.switches.push_back(spine);
    LinkSpec up;
    up.from = leaves.names;
    up.to = spine.names;
    up.count = leaf_up / spines;
    up.source.path = fmt::format("links[{}]", spec.links.size());
    spec.links.push_back(up);
  }
  if (options.tiers == 3) {
    const int spine_up = Uplinks(static_cast<int64_t>(spine_down) * options.uplink_speed_mbps,
                                 options.spine_oversubscription, options.uplink_speed_mbps);
    if (spine_down + spine_up > options.radix) {
      return InvalidArgumentError(
          fmt::format("radix: a spine needs {} ports ({} down, {} up) but has {}",
                      spine_down + spine_up, spine_down, spine_up, options.radix));
    }
    // Fat-tree wiring: spine j of every pod goes up to core group j.
    const int group_size = UpperSwitchCount(options.pods, spine_up, options.radix);
    if (group_size == 0) {
      return InvalidArgumentError(
          fmt::format("pods: {} pods with {} spine uplinks each do not fit core switches of {} "
                      "ports",
                      options.pods, spine_up, options.radix));
    }
    const int cores = spines * group_size;
    const int core_digits = static_cast<int>(std::to_string(cores).size());
    SwitchGroupSpec core;
    core.names = cores == 1 ? "core1" : fmt::format("core[{:0{}d}-{}]", 1, core_digits, cores);
    core.tier = "core";
    core.ports = options.radix;
    core.port_speed_mbps = options.uplink_speed_mbps;
    core.group = spec.name;
    core.source.path = fmt::format("switches[{}]", spec.switches.size());
    spec.switches.push_back(core);
    for (int j = 1; j <= spines; ++j) {
      const int first = (j - 1) * group_size + 1;
      LinkSpec up;
      up.from = options.pods == 1 ? fmt::format("pod1-spine{}", j)
                                  : fmt::format("pod[1-{}]-spine{}", options.pods, j);
      up.to = group_size == 1 ? fmt::format("core{:0{}d}", first, core_digits)
                              : fmt::format("core[{:0{}d}-{:0{}d}]", first, core_digits,
                                            first + group_size - 1, core_digits);
      up.count = spine_up / group_size;
      up.source.path = fmt::format("links[{}]", spec.links.size());
      spec.links.push_back(up);
    }
  }
  return spec;
}

Result<FabricSpec> GenerateNvl72(const Nvl72Options& options) {
  constexpr int kRails = 4;
  if (options.racks < 1) {
    return InvalidArgumentError(fmt::format("racks: {} (must be at least 1)", options.racks));
  }
  GPUFLEET_RETURN_IF_ERROR(CheckPositive("leaf_oversubscription", options.leaf_oversubscription));
  const int leaf_down = kTraysPerRack;
  const int leaf_up =
      Uplinks(static_cast<int64_t>(leaf_down) * kNdrMbps, options.leaf_oversubscription, kNdrMbps);
  if (leaf_down + leaf_up > options.radix) {
    return InvalidArgumentError(fmt::format("radix: {} ports cannot serve {} trays and {} uplinks",
                                            options.radix, leaf_down, leaf_up));
  }
  const int leaves = options.racks * kRails;
  const int spines = UpperSwitchCount(leaves, leaf_up, options.radix);
  if (spines == 0) {
    return InvalidArgumentError(fmt::format(
        "racks: {} racks need {} leaf uplinks, more than one tier of {}-port spines takes",
        options.racks, leaves * leaf_up, options.radix));
  }
  FabricSpec spec;
  spec.name = fmt::format("gb200-nvl72-{}racks", options.racks);
  spec.tiers = {"leaf", "spine"};
  const int digits = std::max<int>(2, static_cast<int>(std::to_string(options.racks).size()));
  for (int rack = 1; rack <= options.racks; ++rack) {
    const std::string rack_name = fmt::format("rack{:0{}d}", rack, digits);
    const std::string trays = fmt::format("{}-tray[01-{}]", rack_name, kTraysPerRack);
    NodeGroupSpec group;
    group.names = trays;
    group.gpus = kGpusPerTray;
    group.gpu_model = "GB200";
    group.nics = kRails;
    group.nic_speed_mbps = kNdrMbps;
    group.nvlink_mbps = kGb200NvlinkMbps;
    group.cpu_milli = kGb200TrayCpuMilli;
    group.memory_mib = kGb200TrayMemoryMib;
    group.source.path = fmt::format("nodes[{}]", spec.nodes.size());
    spec.nodes.push_back(group);
    NvlinkDomainSpec domain;
    domain.name = rack_name;
    domain.nodes = trays;
    domain.bandwidth_mbps = kGb200NvlinkMbps;
    domain.source.path = fmt::format("nvlink_domains[{}]", spec.nvlink_domains.size());
    spec.nvlink_domains.push_back(domain);
    SwitchGroupSpec leaf;
    leaf.names = fmt::format("{}-leaf[1-{}]", rack_name, kRails);
    leaf.tier = "leaf";
    leaf.ports = options.radix;
    leaf.port_speed_mbps = kNdrMbps;
    leaf.group = rack_name;
    leaf.source.path = fmt::format("switches[{}]", spec.switches.size());
    spec.switches.push_back(leaf);
    LinkSpec rails;
    rails.from = trays;
    rails.to = leaf.names;
    rails.pattern = LinkPattern::kRails;
    rails.source.path = fmt::format("links[{}]", spec.links.size());
    spec.links.push_back(rails);
  }
  SwitchGroupSpec spine;
  spine.names = spines == 1 ? "spine01" : fmt::format("spine[01-{:02d}]", spines);
  spine.tier = "spine";
  spine.ports = options.radix;
  spine.port_speed_mbps = kNdrMbps;
  spine.group = spec.name;
  spine.source.path = fmt::format("switches[{}]", spec.switches.size());
  spec.switches.push_back(spine);
  LinkSpec up;
  up.from =
      fmt::format("rack[{:0{}d}-{:0{}d}]-leaf[1-{}]", 1, digits, options.racks, digits, kRails);
  up.to = spine.names;
  up.count = leaf_up / spines;
  up.source.path = fmt::format("links[{}]", spec.links.size());
  spec.links.push_back(up);
  return spec;
}

}  // namespace gpufleet::fabric
