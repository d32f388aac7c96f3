// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/ecmp.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

namespace gpufleet::fabric {
namespace {

constexpr uint32_t kCrcPolynomial = 0xEDB88320U;  // IEEE 802.3, reflected
constexpr uint32_t kBaseIp = 0x0A000000U;         // 10.0.0.0
constexpr uint16_t kFirstEphemeralPort = 49152;
constexpr int kEphemeralPorts = 16384;

constexpr std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) {
      c = (c & 1U) != 0 ? kCrcPolynomial ^ (c >> 1) : c >> 1;
    }
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrcTable = MakeCrcTable();

uint32_t NicAddress(int node, int nic) {
  return kBaseIp + static_cast<uint32_t>(node) * 64U + static_cast<uint32_t>(nic);
}

// One way a switch can forward toward a destination: a directed cable and where it leads.
struct Hop {
  int channel = 0;
  int next = 0;  // switch
};

// The fabric as directed channels (two per cable) with up*/down* reachability, so that a route
// is: up until the destination leaf is below, then down.
class Router {
 public:
  explicit Router(const Fabric& fabric) : fabric_(fabric) {
    const std::vector<FabricLink>& links = fabric.links();
    first_cable_.resize(links.size());
    int cables = 0;
    for (size_t l = 0; l < links.size(); ++l) {
      first_cable_[l] = cables;
      cables += links[l].count;
    }
    capacity_.resize(static_cast<size_t>(cables) * 2);
    const size_t switch_count = fabric.switches().size();
    up_.resize(switch_count);
    down_.resize(switch_count);
    for (size_t l = 0; l < links.size(); ++l) {
      const FabricLink& link = links[l];
      for (int k = 0; k < link.count; ++k) {
        const int up = UpChannel(static_cast<int>(l), k);
        capacity_[up] = static_cast<double>(link.speed_mbps);
        capacity_[up + 1] = static_cast<double>(link.speed_mbps);
        if (!link.from_node()) {
          up_[link.lower_switch].push_back(Hop{up, link.upper_switch});
          down_[link.upper_switch].push_back(Hop{up + 1, link.lower_switch});
        }
      }
    }
    words_ = (switch_count + 63) / 64;
    below_.assign(switch_count * words_, 0);
    reach_.assign(switch_count * words_, 0);
    std::vector<int> order(switch_count);
    for (size_t s = 0; s < switch_count; ++s) {
      order[s] = static_cast<int>(s);
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return fabric.switches()[a].tier < fabric.switches()[b].tier;
    });
    for (int s : order) {
      Set(below_, s, s);
      for (const Hop& hop : down_[s]) {
        Merge(below_, s, hop.next);
      }
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const int s = *it;
      Merge(reach_, s, s, below_);
      for (const Hop& hop : up_[s]) {
        Merge(reach_, s, hop.next);
      }
    }
  }

  int UpChannel(int link, int cable) const { return 2 * (first_cable_[link] + cable); }
  int ChannelCount() const { return static_cast<int>(capacity_.size()); }
  double Capacity(int channel) const { return capacity_[channel]; }
  bool IsFabricChannel(int channel) const {
    const int cable = channel / 2;
    const auto it = std::upper_bound(first_cable_.begin(), first_cable_.end(), cable);
    return !fabric_.links()[static_cast<size_t>(it - first_cable_.begin()) - 1].from_node();
  }

  // The equal-cost next hops from switch `at` toward leaf `target`; empty when none leads there.
  const std::vector<Hop>& Candidates(int at, int target) {
    const int64_t key = static_cast<int64_t>(at) * static_cast<int64_t>(up_.size()) + target;
    auto [it, inserted] = candidates_.try_emplace(key);
    if (inserted) {
      if (Has(below_, at, target)) {
        for (const Hop& hop : down_[at]) {
          if (Has(below_, hop.next, target)) {
            it->second.push_back(hop);
          }
        }
      } else {
        for (const Hop& hop : up_[at]) {
          if (Has(reach_, hop.next, target)) {
            it->second.push_back(hop);
          }
        }
      }
    }
    return it->second;
  }

 private:
  bool Has(const std::vector<uint64_t>& sets, int s, int member) const {
    return (sets[s * words_ + member / 64] >> (member % 64) & 1U) != 0;
  }
  void Set(std::vector<uint64_t>& sets, int s, int member) {
    sets[s * words_ + member / 64] |= uint64_t{1} << (member % 64);
  }
  void Merge(std::vector<uint64_t>& sets, int into, int from) { Merge(sets, into, from, sets); }
  void Merge(std::vector<uint64_t>& sets, int into, int from, const std::vector<uint64_t>& source) {
    for (size_t w = 0; w < words_; ++w) {
      sets[into * words_ + w] |= source[from * words_ + w];
    }
  }

  const Fabric& fabric_;
  std::vector<int> first_cable_;  // per link
  std::vector<double> capacity_;  // per channel, Mb/s
  std::vector<std::vector<Hop>> up_;
  std::vector<std::vector<Hop>> down_;
  size_t words_ = 0;
  std::vector<uint64_t> below_;  // per switch: switches reachable going down (itself included)
  std::vector<uint64_t> reach_;  // per switch: switches reachable up then down
  std::unordered_map<int64_t, std::vector<Hop>> candidates_;
};

}  // namespace

uint32_t Crc32(std::string_view bytes, uint32_t seed) {
  uint32_t crc = ~seed;
  for (char byte : bytes) {
    crc = kCrcTable[(crc ^ static_cast<uint8_t>(byte)) & 0xFFU] ^ (crc >> 8);
  }
  return ~crc;
}

uint32_t HashFiveTuple(const FiveTuple& tuple, uint32_t seed) {
  const char bytes[13] = {static_cast<char>(tuple.source_ip >> 24),
                          static_cast<char>(tuple.source_ip >> 16),
                          static_cast<char>(tuple.source_ip >> 8),
                          static_cast<char>(tuple.source_ip),
                          static_cast<char>(tuple.destination_ip >> 24),
                          static_cast<char>(tuple.destination_ip >> 16),
                          static_cast<char>(tuple.destination_ip >> 8),
                          static_cast<char>(tuple.destination_ip),
                          static_cast<char>(tuple.protocol),
                          static_cast<char>(tuple.source_port >> 8),
                          static_cast<char>(tuple.source_port),
                          static_cast<char>(tuple.destination_port >> 8),
                          static_cast<char>(tuple.destination_port)};
  return Crc32(std::string_view(bytes, sizeof(bytes)), seed);
}

std::vector<Flow> CollectiveFlows(const Fabric& fabric, const std::vector<PlacedGpus>& placement,
                                  Collective collective) {
  std::vector<int> nodes;
  std::vector<int> rails;
  for (const PlacedGpus& placed : placement) {
    if (std::find(nodes.begin(), nodes.end(), placed.node) != nodes.end()) {
      continue;
    }
    const FabricNode& node = fabric.nodes()[placed.node];
    nodes.push_back(placed.node);
    // The NICs that serve the placed GPUs (NIC i sits next to GPU i x gpus / nics).
    const int used = node.gpus > 0 ? (placed.gpus * node.nics + node.gpus - 1) / node.gpus : 0;
    rails.push_back(std::max(1, std::min(node.nics, used)));
  }
  std::vector<Flow> flows;
  const size_t k = nodes.size();
  if (k < 2) {
    return flows;
  }
  auto connect = [&](size_t a, size_t b) {
    const int shared_rails = std::min(rails[a], rails[b]);
    for (int r = 0; r < shared_rails; ++r) {
      flows.push_back(Flow{nodes[a], r, nodes[b], r});
    }
  };
  if (collective == Collective::kAllToAll) {
    for (size_t a = 0; a < k; ++a) {
      for (size_t b = 0; b < k; ++b) {
        if (a != b) {
          connect(a, b);
        }
      }
    }
  } else {
    for (size_t a = 0; a < k; ++a) {
      connect(a, (a + 1) % k);
    }
  }
  return flows;
}

Result<EcmpResult> SimulateEcmp(const Fabric& fabric, const std::vector<Flow>& flows,
                                const EcmpOptions& options) {
  if (options.queue_pairs < 1 || options.queue_pairs > 128) {
    return InvalidArgumentError(
        fmt::format("queue_pairs: {} (NCCL allows 1 to 128)", options.queue_pairs));
  }
  Router router(fabric);
  Random random(options.seed);
  std::vector<uint32_t> tier_seed(std::max(1, fabric.TierCount()));
  for (uint32_t& seed : tier_seed) {
    seed = static_cast<uint32_t>(random.Next());
  }
  std::vector<uint32_t> switch_seed(fabric.switches().size());
  for (size_t s = 0; s < switch_seed.size(); ++s) {
    switch_seed[s] = options.seeds == HashSeeds::kPerTier ? tier_seed[fabric.switches()[s].tier]
                                                          : static_cast<uint32_t>(random.Next());
  }

  const int q = options.queue_pairs;
  const int channels = router.ChannelCount();
  EcmpResult result;
  result.flows = static_cast<int>(flows.size());
  result.subflows = result.flows * q;
  std::vector<int> path_start;
  std::vector<int> path_channels;
  std::vector<double> ideal_load(channels, 0.0);
  std::vector<char> candidate(channels, 0);
  std::vector<int> subflows_on(channels, 0);

  auto endpoint = [&](const Flow& flow, bool source) -> Result<std::pair<int, int>> {
    const int node = source ? flow.source_node : flow.destination_node;
    const int nic = source ? flow.source_nic : flow.destination_nic;
    if (node < 0 || node >= static_cast<int>(fabric.nodes().size()) || nic < 0 ||
        nic >= fabric.nodes()[node].nics || fabric.nodes()[node].nic_switch[nic] < 0) {
      return InvalidArgumentError(fmt::format(
          "flow {} NIC {} of node {}: no such NIC or no cable", source ? "from" : "to", nic,
          node >= 0 && node < static_cast<int>(fabric.nodes().size()) ? fabric.nodes()[node].name
                                                                      : std::to_string(node)));
    }
    return std::pair<int, int>{fabric.nodes()[node].nic_switch[nic],
                               router.UpChannel(fabric.nodes()[node].nic_link[nic], 0)};
  };

  for (const Flow& flow : flows) {
    GPUFLEET_ASSIGN_OR_RETURN(const auto source, endpoint(flow, true));
    GPUFLEET_ASSIGN_OR_RETURN(const auto destination, endpoint(flow, false));
    const int target = destination.first;
    result.network_flows += source.first != target ? 1 : 0;
    // Ideal spreading: the flow's unit of traffic divides evenly at every choice.
    ideal_load[source.second] += 1;
    ideal_load[destination.second + 1] += 1;
    std::map<int, double> frontier = {{source.first, 1.0}};
    while (!(frontier.size() == 1 && frontier.begin()->first == target)) {
      std::map<int, double> next;
      for (const auto& [at, mass] : frontier) {
        if (at == target) {
          next[at] += mass;
          continue;
        }
        const std::vector<Hop>& hops = router.Candidates(at, target);
        if (hops.empty()) {
          return InvalidArgumentError(fmt::format("no path from switch \"{}\" to \"{}\"",
                                                  fabric.switches()[at].name,
                                                  fabric.switches()[target].name));
        }
        const double share = mass / static_cast<double>(hops.size());
        for (const Hop& hop : hops) {
          ideal_load[hop.channel] += share;
          candidate[hop.channel] = 1;
          next[hop.next] += share;
        }
      }
      frontier = std::move(next);
    }
    // ECMP: each queue pair its own source port, one path.
    for (int qp = 0; qp < q; ++qp) {
      FiveTuple tuple;
      tuple.source_ip = NicAddress(flow.source_node, flow.source_nic);
      tuple.destination_ip = NicAddress(flow.destination_node, flow.destination_nic);
      tuple.source_port =
          static_cast<uint16_t>(kFirstEphemeralPort + random.Uniform(kEphemeralPorts));
      path_start.push_back(static_cast<int>(path_channels.size()));
      path_channels.push_back(source.second);
      int at = source.first;
      while (at != target) {
        const std::vector<Hop>& hops = router.Candidates(at, target);
        const Hop& hop = hops[HashFiveTuple(tuple, switch_seed[at]) % hops.size()];
        path_channels.push_back(hop.channel);
        at = hop.next;
      }
      path_channels.push_back(destination.second + 1);
    }
  }
  path_start.push_back(static_cast<int>(path_channels.size()));
  const int subflows = result.subflows;

  // Ideal: the common rate every flow gets when its traffic is spread perfectly.
  double ideal = std::numeric_limits<double>::infinity();
  for (int c = 0; c < channels; ++c) {
    if (ideal_load[c] > 0) {
      ideal = std::min(ideal, router.Capacity(c) / ideal_load[c]);
    }
  }

  // Max-min fair rates by progressive filling.
  std::vector<int> active(channels, 0);
  std::vector<std::vector<int>> through(channels);
  for (int f = 0; f < subflows; ++f) {
    for (int i = path_start[f]; i < path_start[f + 1]; ++i) {
      const int c = path_channels[i];
      ++active[c];
      ++subflows_on[c];
      through[c].push_back(f);
    }
  }
  std::vector<int> busy;
  for (int c = 0; c < channels; ++c) {
    if (active[c] > 0) {
      busy.push_back(c);
    }
  }
  std::vector<double> remaining(channels);
  for (int c = 0; c < channels; ++c) {
    remaining[c] = router.Capacity(c);
  }
  std::vector<double> rate(subflows, -1.0);
  double level = 0;
  int unfrozen = subflows;
  while (unfrozen > 0) {
    double step = std::numeric_limits<double>::infinity();
    for (int c : busy) {
      if (active[c] > 0) {
        step = std::min(step, remaining[c] / active[c]);
      }
    }
    if (!std::isfinite(step)) {
      break;  // every path has channels, so this does not happen; it guards the loop
    }
    level += step;
    for (int c : busy) {
      if (active[c] > 0) {
        remaining[c] -= step * active[c];
      }
    }
    for (int c : busy) {
      if (active[c] == 0 || remaining[c] > 1e-9 * router.Capacity(c)) {
        continue;
      }
      for (int f : through[c]) {
        if (rate[f] >= 0) {
          continue;
        }
        rate[f] = level;
        --unfrozen;
        for (int i = path_start[f]; i < path_start[f + 1]; ++i) {
          --active[path_channels[i]];
        }
      }
    }
  }

  // Per flow: the synchronised rate (q x slowest subflow) and the elastic sum.
  double sum_elastic = 0;
  result.min_flow_gbps = flows.empty() ? 0 : std::numeric_limits<double>::infinity();
  for (int f = 0; f < result.flows; ++f) {
    double slowest = std::numeric_limits<double>::infinity();
    double total = 0;
    for (int qp = 0; qp < q; ++qp) {
      slowest = std::min(slowest, rate[f * q + qp]);
      total += rate[f * q + qp];
    }
    const double gbps = slowest * q / 1000.0;
    result.flow_gbps.push_back(gbps);
    result.min_flow_gbps = std::min(result.min_flow_gbps, gbps);
    sum_elastic += total / 1000.0;
  }
  result.mean_flow_gbps = flows.empty() ? 0 : sum_elastic / result.flows;
  result.ideal_flow_gbps = flows.empty() ? 0 : ideal / 1000.0;
  if (result.ideal_flow_gbps > 0) {
    result.collective_ratio = result.min_flow_gbps / result.ideal_flow_gbps;
    result.aggregate_ratio = result.mean_flow_gbps / result.ideal_flow_gbps;
  }

  // Collisions on switch-to-switch links.
  std::vector<int> owner(channels, -1);  // a flow on the channel, or -2 when several
  for (int f = 0; f < subflows; ++f) {
    const int flow = f / q;
    for (int i = path_start[f] + 1; i + 1 < path_start[f + 1]; ++i) {
      const int c = path_channels[i];
      owner[c] = owner[c] == -1 || owner[c] == flow ? flow : -2;
    }
  }
  std::vector<char> colliding(result.flows, 0);
  for (int f = 0; f < subflows; ++f) {
    for (int i = path_start[f] + 1; i + 1 < path_start[f + 1]; ++i) {
      if (owner[path_channels[i]] == -2) {
        colliding[f / q] = 1;
      }
    }
  }
  for (char c : colliding) {
    result.colliding_flows += c;
  }
  for (int c = 0; c < channels; ++c) {
    if (!candidate[c] || !router.IsFabricChannel(c)) {
      continue;
    }
    ++result.fabric_links;
    result.fabric_links_used += subflows_on[c] > 0 ? 1 : 0;
    result.fabric_links_shared += subflows_on[c] > 1 ? 1 : 0;
    result.max_subflows_per_link = std::max(result.max_subflows_per_link, subflows_on[c]);
  }
  return result;
}

PathUse SimulatePathUse(int paths, int flows, int trials, uint64_t seed) {
  PathUse use;
  if (paths < 1 || flows < 0 || trials < 1) {
    return use;
  }
  Random random(seed);
  // One switch: one hash seed for the whole run, as a switch has.
  const uint32_t switch_seed = static_cast<uint32_t>(random.Next());
  std::vector<int> load(paths);
  double used_sum = 0;
  double max_sum = 0;
  int clean = 0;
  for (int trial = 0; trial < trials; ++trial) {
    std::fill(load.begin(), load.end(), 0);
    int used = 0;
    int busiest = 0;
    for (int f = 0; f < flows; ++f) {
      FiveTuple tuple;
      tuple.source_ip = NicAddress(f, 0);
      tuple.destination_ip = NicAddress(flows + f, 0);
      tuple.source_port =
          static_cast<uint16_t>(kFirstEphemeralPort + random.Uniform(kEphemeralPorts));
      int& slot = load[HashFiveTuple(tuple, switch_seed) % static_cast<uint32_t>(paths)];
      used += slot == 0 ? 1 : 0;
      busiest = std::max(busiest, ++slot);
    }
    used_sum += used;
    max_sum += busiest;
    clean += busiest <= 1 ? 1 : 0;
  }
  use.mean_paths_used = used_sum / trials;
  use.no_collision_fraction = static_cast<double>(clean) / trials;
  use.mean_max_load = max_sum / trials;
  return use;
}

double ExpectedPathsUsed(int paths, int flows) {
  const double n = paths;
  return n * (1 - std::pow(1 - 1 / n, flows));
}

double NoCollisionProbability(int paths, int flows) {
  if (flows > paths) {
    return 0;
  }
  double p = 1;
  for (int i = 0; i < flows; ++i) {
    p *= static_cast<double>(paths - i) / paths;
  }
  return p;
}

}  // namespace gpufleet::fabric
