// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/analysis.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "gpufleet/fabric/units.h"

namespace gpufleet::fabric {
namespace {

// Ratios closer to 1 than this are 1:1 (rounding in generated designs).
constexpr double kRatioTolerance = 1e-6;

std::string WithThousands(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) {
    digits.insert(static_cast<size_t>(i), ",");
  }
  return value < 0 ? "-" + digits : digits;
}

}  // namespace

std::string FormatRatio(double oversubscription) {
  if (oversubscription <= 0) {
    return "-";
  }
  if (oversubscription >= 1) {
    const double rounded = std::round(oversubscription * 100) / 100;
    return std::fabs(rounded - std::round(rounded)) < 1e-9
               ? fmt::format("{}:1", std::lround(rounded))
               : fmt::format("{:.2f}:1", rounded);
  }
  const double inverse = std::round(100 / oversubscription) / 100;
  return std::fabs(inverse - std::round(inverse)) < 1e-9 ? fmt::format("1:{}", std::lround(inverse))
                                                         : fmt::format("1:{:.2f}", inverse);
}

FabricReport Analyze(const Fabric& fabric) {
  FabricReport report;
  report.name = fabric.name();
  for (const FabricNode& node : fabric.nodes()) {
    (node.gpus > 0 ? report.nodes : report.other_nodes) += 1;
  }
  report.gpus = fabric.TotalGpus();
  report.switches = static_cast<int>(fabric.switches().size());
  const int tiers = fabric.TierCount();
  report.tiers.resize(tiers);
  for (int t = 0; t < tiers; ++t) {
    TierReport& tier = report.tiers[t];
    tier.name = fabric.tiers()[t];
    tier.domains = fabric.DomainCount(t);
    for (int d = 0; d < tier.domains; ++d) {
      tier.largest_domain_gpus = std::max(tier.largest_domain_gpus, fabric.DomainGpus(t, d));
    }
  }
  for (const FabricSwitch& entry : fabric.switches()) {
    TierReport& tier = report.tiers[entry.tier];
    ++tier.switches;
    tier.down_mbps += entry.down_mbps;
    tier.up_mbps += entry.up_mbps;
    if (entry.up_mbps > 0) {
      const double ratio = static_cast<double>(entry.down_mbps) / entry.up_mbps;
      if (ratio > tier.worst_oversubscription) {
        tier.worst_oversubscription = ratio;
        tier.worst_switch = entry.name;
      }
    }
  }
  std::map<std::pair<int, int>, int64_t> cables;  // (lower tier or -1 for nodes, upper tier)
  for (const FabricLink& link : fabric.links()) {
    const int lower = link.from_node() ? -1 : fabric.switches()[link.lower_switch].tier;
    cables[{lower, fabric.switches()[link.upper_switch].tier}] += link.count;
    report.cables += link.count;
  }
  for (const auto& [layers, count] : cables) {
    report.cables_by_layer.push_back({layers.first < 0 ? "node" : fabric.tiers()[layers.first],
                                      fabric.tiers()[layers.second], count});
  }

  int lowest_oversubscribed = -1;
  for (int t = 0; t < tiers; ++t) {
    TierReport& tier = report.tiers[t];
    if (tier.up_mbps == 0) {
      continue;
    }
    tier.oversubscription = static_cast<double>(tier.down_mbps) / tier.up_mbps;
    if (tier.oversubscription > 1 + kRatioTolerance) {
      report.warnings.push_back(fmt::format(
          "tier {} is not 1:1: oversubscribed {} (down {}, up {}); when every node sends, traffic "
          "leaving a {} domain gets 1/{:.2f} of its rate",
          tier.name, FormatRatio(tier.oversubscription), FormatBandwidth(tier.down_mbps),
          FormatBandwidth(tier.up_mbps), tier.name, tier.oversubscription));
      if (lowest_oversubscribed < 0) {
        lowest_oversubscribed = t;
      }
    } else if (tier.oversubscription < 1 - kRatioTolerance) {
      report.notes.push_back(fmt::format("tier {} has spare uplink bandwidth (down {}, up {})",
                                         tier.name, FormatBandwidth(tier.down_mbps),
                                         FormatBandwidth(tier.up_mbps)));
    }
    if (tier.worst_oversubscription > 1 + kRatioTolerance &&
        tier.worst_oversubscription > tier.oversubscription + kRatioTolerance) {
      report.warnings.push_back(fmt::format("switch {} in tier {} is oversubscribed {}",
                                            tier.worst_switch, tier.name,
                                            FormatRatio(tier.worst_oversubscription)));
    }
  }

  // Bisection: the tier with the least up-facing bandwidth below the top.
  double narrowest = -1;
  for (int t = 0; t < tiers; ++t) {
    if (report.tiers[t].up_mbps > 0 && (narrowest < 0 || report.tiers[t].up_mbps < narrowest)) {
      narrowest = static_cast<double>(report.tiers[t].up_mbps);
    }
  }
  if (narrowest < 0) {
    narrowest = 0;
    for (const FabricLink& link : fabric.links()) {
      narrowest += link.from_node() ? static_cast<double>(link.speed_mbps) * link.count : 0;
    }
  }
  report.bisection_mbps = narrowest / 2;
  if (tiers > 0 && report.tiers[tiers - 1].domains > 1) {
    report.warnings.push_back(
        fmt::format("the fabric is not connected: {} separate parts at tier {}",
                    report.tiers[tiers - 1].domains, report.tiers[tiers - 1].name));
    report.bisection_mbps = 0;
  }

  int largest_nvlink = 0;
  for (size_t n = 0; n < fabric.nodes().size(); ++n) {
    largest_nvlink = std::max(largest_nvlink, fabric.NvlinkDomainGpus(static_cast<int>(n)));
  }
  if (tiers == 0) {
    report.largest_nonblocking_job_gpus = largest_nvlink;
    report.nonblocking_limit = "one NVLink domain (the fabric has no switches)";
  } else if (lowest_oversubscribed < 0) {
    report.largest_nonblocking_job_gpus = report.tiers[tiers - 1].largest_domain_gpus;
    report.nonblocking_limit = "every tier is 1:1 or better";
  } else {
    const TierReport& tier = report.tiers[lowest_oversubscribed];
    report.largest_nonblocking_job_gpus = std::max(largest_nvlink, tier.largest_domain_gpus);
    report.nonblocking_limit = fmt::format("one {} domain, below the {} uplinks ({})", tier.name,
                                           tier.name, FormatRatio(tier.oversubscription));
  }
  return report;
}

std::string FormatReport(const FabricReport& report) {
  std::string out;
  out += fmt::format("fabric {}: {} nodes ({} GPUs){}, {} switches, {} cables\n", report.name,
                     WithThousands(report.nodes), WithThousands(report.gpus),
                     report.other_nodes > 0 ? fmt::format(" + {} other", report.other_nodes) : "",
                     WithThousands(report.switches), WithThousands(report.cables));
  out += fmt::format("\n{:<8} {:>8} {:>12} {:>12} {:>9} {:>8} {:>12}\n", "tier", "switches", "down",
                     "up", "ratio", "domains", "domain GPUs");
  for (const TierReport& tier : report.tiers) {
    out += fmt::format("{:<8} {:>8} {:>12} {:>12} {:>9} {:>8} {:>12}\n", tier.name, tier.switches,
                       FormatBandwidth(tier.down_mbps),
                       tier.up_mbps > 0 ? FormatBandwidth(tier.up_mbps) : "-",
                       tier.up_mbps > 0 ? FormatRatio(tier.oversubscription) : "top", tier.domains,
                       WithThousands(tier.largest_domain_gpus));
  }
  out += "\ncables:";
  for (const CableCount& count : report.cables_by_layer) {
    out += fmt::format(" {}-{} {};", count.lower, count.upper, WithThousands(count.cables));
  }
  if (!report.cables_by_layer.empty()) {
    out.pop_back();
  }
  out += "\n";
  out += fmt::format("bisection bandwidth: {} per direction\n",
                     FormatBandwidth(report.bisection_mbps));
  out += fmt::format("largest job without crossing an oversubscribed tier: {} GPUs ({})\n",
                     WithThousands(report.largest_nonblocking_job_gpus), report.nonblocking_limit);
  for (const std::string& note : report.notes) {
    out += "note: " + note + "\n";
  }
  for (const std::string& warning : report.warnings) {
    out += "warning: " + warning + "\n";
  }
  return out;
}

}  // namespace gpufleet::fabric
