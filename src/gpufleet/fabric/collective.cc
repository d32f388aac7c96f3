// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/collective.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "gpufleet/fabric/units.h"

namespace gpufleet::fabric {
namespace {

double PathOversubscription(const Fabric& fabric, int common_tier) {
  double product = 1;
  for (int t = 0; t < std::min(common_tier, fabric.TierCount()); ++t) {
    product *= fabric.TierOversubscription(t);
  }
  return product;
}

int64_t NicMbpsPerGpu(const FabricNode& node) {
  if (node.gpus == 0) {
    return 0;
  }
  int cabled = 0;
  for (int s : node.nic_switch) {
    cabled += s >= 0 ? 1 : 0;
  }
  return node.nic_speed_mbps * cabled / node.gpus;
}

}  // namespace

const char* CollectiveName(Collective collective) {
  switch (collective) {
    case Collective::kAllReduce:
      return "all-reduce";
    case Collective::kAllGather:
      return "all-gather";
    case Collective::kReduceScatter:
      return "reduce-scatter";
    case Collective::kAllToAll:
      return "all-to-all";
  }
  return "all-reduce";
}

Result<Collective> ParseCollective(std::string_view name) {
  for (Collective collective : {Collective::kAllReduce, Collective::kAllGather,
                                Collective::kReduceScatter, Collective::kAllToAll}) {
    std::string plain = CollectiveName(collective);
    plain.erase(std::remove(plain.begin(), plain.end(), '-'), plain.end());
    if (name == CollectiveName(collective) || name == plain) {
      return collective;
    }
  }
  return InvalidArgumentError(fmt::format(
      "collective: unknown \"{}\" (known: all-reduce, all-gather, reduce-scatter, all-to-all)",
      name));
}

double BusBandwidthFactor(Collective collective, int ranks) {
  if (ranks <= 1) {
    return 0;
  }
  const double n = ranks;
  return collective == Collective::kAllReduce ? 2 * (n - 1) / n : (n - 1) / n;
}

Result<PlacementShape> ShapeOf(const Fabric& fabric, const std::vector<PlacedGpus>& placement) {
  PlacementShape shape;
  shape.ranks = 0;
  std::map<int, int> per_domain;  // NVLink domain key -> ranks
  std::set<int> seen;
  std::vector<int> nodes;
  int64_t nvlink = 0;
  int64_t nic = 0;
  for (const PlacedGpus& placed : placement) {
    if (placed.node < 0 || placed.node >= static_cast<int>(fabric.nodes().size())) {
      return InvalidArgumentError(
          fmt::format("placement: node index {} out of range", placed.node));
    }
    const FabricNode& node = fabric.nodes()[placed.node];
    if (!seen.insert(placed.node).second) {
      return InvalidArgumentError(fmt::format("placement: node \"{}\" given twice", node.name));
    }
    if (placed.gpus < 1 || placed.gpus > node.gpus) {
      return InvalidArgumentError(fmt::format("placement: {} GPUs on node \"{}\", which has {}",
                                              placed.gpus, node.name, node.gpus));
    }
    shape.ranks += placed.gpus;
    // Nodes of a shared NVLink domain count together; a node alone is its own domain.
    const int key = node.nvlink_domain >= 0 ? node.nvlink_domain : -1 - placed.node;
    per_domain[key] += placed.gpus;
    nodes.push_back(placed.node);
    nvlink = nvlink == 0 ? node.nvlink_mbps : std::min(nvlink, node.nvlink_mbps);
    const int64_t node_nic = NicMbpsPerGpu(node);
    nic = nic == 0 ? node_nic : std::min(nic, node_nic);
  }
  if (shape.ranks == 0) {
    return InvalidArgumentError("placement: no GPUs");
  }
  shape.domains = static_cast<int>(per_domain.size());
  shape.gpus_per_domain = shape.ranks;
  for (const auto& [key, ranks] : per_domain) {
    shape.gpus_per_domain = std::min(shape.gpus_per_domain, ranks);
  }
  shape.nvlink_mbps = nvlink;
  shape.nic_mbps = nic;
  shape.common_tier = shape.domains == 1 ? -1 : fabric.CommonTier(nodes);
  shape.path_oversubscription = PathOversubscription(fabric, shape.common_tier);
  return shape;
}

PlacementShape UniformShape(const Fabric& fabric, int like_node, int ranks, int gpus_per_domain,
                            int common_tier) {
  const FabricNode& node = fabric.nodes()[like_node];
  PlacementShape shape;
  shape.ranks = ranks;
  shape.gpus_per_domain = std::max(1, std::min(gpus_per_domain, ranks));
  shape.domains = (ranks + shape.gpus_per_domain - 1) / shape.gpus_per_domain;
  shape.nvlink_mbps = node.nvlink_mbps;
  shape.nic_mbps = NicMbpsPerGpu(node);
  shape.common_tier = shape.domains == 1 ? -1 : common_tier;
  shape.path_oversubscription = PathOversubscription(fabric, shape.common_tier);
  return shape;
}

PlacementShape CompactShape(const Fabric& fabric, int ranks) {
  int like = 0;
  int largest = 0;
  for (size_t n = 0; n < fabric.nodes().size(); ++n) {
    const int gpus = fabric.NvlinkDomainGpus(static_cast<int>(n));
    if (gpus > largest) {
      largest = gpus;
      like = static_cast<int>(n);
    }
  }
  int tier = fabric.TierCount();
  for (int t = 0; t < fabric.TierCount() && tier == fabric.TierCount(); ++t) {
    for (int d = 0; d < fabric.DomainCount(t); ++d) {
      if (fabric.DomainGpus(t, d) >= ranks) {
        tier = t;
        break;
      }
    }
  }
  return UniformShape(fabric, like, ranks, largest, tier);
}

CollectiveEstimate EstimateCollective(Collective collective, int64_t bytes,
                                      const PlacementShape& shape,
                                      const CostModelOptions& options) {
  CollectiveEstimate estimate;
  const int p = shape.ranks;
  if (p <= 1 || bytes <= 0) {
    estimate.algorithm = "none";
    return estimate;
  }
  const double size = static_cast<double>(bytes);
  const double factor = BusBandwidthFactor(collective, p);
  const double nvlink = GigabytesPerSecond(shape.nvlink_mbps) * 1e9 * options.nvlink_efficiency;
  const double us = 1e-6;
  // Ring steps: all-reduce sends 2(p-1) times, the others p-1.
  auto steps = [&](int ranks) {
    return collective == Collective::kAllReduce ? 2 * (ranks - 1) : ranks - 1;
  };
  auto finish = [&](double seconds, std::string algorithm) {
    estimate.seconds = seconds;
    estimate.algbw_gbytes = size / seconds / 1e9;
    estimate.busbw_gbytes = estimate.algbw_gbytes * factor;
    estimate.algorithm = std::move(algorithm);
    return estimate;
  };

  if (shape.domains <= 1) {
    const double latency =
        (options.base_latency_us + steps(p) * options.nvlink_step_latency_us) * us;
    return finish(latency + size * factor / nvlink, "nvlink ring");
  }

  const double ecmp = shape.common_tier > 0 ? options.ecmp_efficiency : 1.0;
  const double network = GigabytesPerSecond(shape.nic_mbps) * 1e9 * options.nic_efficiency /
                         shape.path_oversubscription * ecmp;
  estimate.network_gbytes_per_gpu = network / 1e9;
  const int g = shape.gpus_per_domain;
  const int m = shape.domains;

  if (collective == Collective::kAllToAll) {
    // Pairwise exchange: the part for peers in other domains crosses the network.
    const double inside = size * (g - 1) / p / nvlink;
    const double across = size * (p - g) / p / network;
    const double latency = (options.base_latency_us + (g - 1) * options.nvlink_step_latency_us +
                            (p - g) * options.network_step_latency_us) *
                           us;
    return finish(latency + std::max(inside, across), "pairwise");
  }

  // Flat rail-aligned ring: g rings leave each domain, one per GPU and NIC.
  const double ring_busbw = std::min(nvlink, g * network);
  const int network_steps = collective == Collective::kAllReduce ? 2 * m : m;
  const double ring_latency =
      (options.base_latency_us + (steps(p) - network_steps) * options.nvlink_step_latency_us +
       network_steps * options.network_step_latency_us) *
      us;
  const double ring = ring_latency + size * factor / ring_busbw;
  if (collective != Collective::kAllReduce || g <= 1) {
    return finish(ring, "ring");
  }
  // Hierarchical: reduce-scatter inside each domain, all-reduce of 1/g of the data per GPU
  // across domains on its own rail, all-gather inside. NCCL pipelines the stages over its
  // channels, so the slower of the NVLink and the network part sets the pace.
  const double inside = 2.0 * (g - 1) / g * size / nvlink;
  const double across = 2.0 * (m - 1) / m * (size / g) / network;
  const double hierarchical_latency =
      (options.base_latency_us + 2 * (g - 1) * options.nvlink_step_latency_us +
       2 * (m - 1) * options.network_step_latency_us) *
      us;
  const double hierarchical = hierarchical_latency + std::max(inside, across);
  return hierarchical < ring ? finish(hierarchical, "hierarchical") : finish(ring, "ring");
}

}  // namespace gpufleet::fabric
