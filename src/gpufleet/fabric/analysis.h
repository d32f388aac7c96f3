// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpufleet/fabric/fabric.h"

// `gpufleet fabric check`: what a fabric design delivers.
namespace gpufleet::fabric {

struct TierReport {
  std::string name;
  int switches = 0;
  int64_t down_mbps = 0;  // toward nodes and lower tiers, all switches of the tier
  int64_t up_mbps = 0;    // toward higher tiers
  // down / up; 0 for the top tier (nothing above). > 1 is oversubscribed.
  double oversubscription = 0;
  std::string worst_switch;  // the switch with the highest down:up ratio
  double worst_oversubscription = 0;
  int domains = 0;              // see Fabric::DomainOf
  int largest_domain_gpus = 0;  // GPUs of the largest domain
};

// Cables between two layers: "node" -> "leaf", "leaf" -> "spine".
struct CableCount {
  std::string lower;
  std::string upper;
  int64_t cables = 0;
};

struct FabricReport {
  std::string name;
  int nodes = 0;  // with GPUs
  int other_nodes = 0;
  int gpus = 0;
  int switches = 0;
  int64_t cables = 0;
  std::vector<TierReport> tiers;
  std::vector<CableCount> cables_by_layer;
  // The narrowest cut between tiers, per direction: half the up-facing bandwidth of the tier
  // that has least of it (for a tree that is non-blocking but for tier t, N r / (2 o_t)); host
  // links alone for a fabric of one switch tier.
  double bisection_mbps = 0;
  // The largest job, in GPUs, whose traffic stays below the lowest oversubscribed tier: the
  // largest domain of that tier (the whole fabric when every tier is 1:1).
  int largest_nonblocking_job_gpus = 0;
  std::string nonblocking_limit;  // why: "one leaf domain below tier leaf (3:1)"
  std::vector<std::string> warnings;
  std::vector<std::string> notes;
};

FabricReport Analyze(const Fabric& fabric);

// A down:up ratio as people write it: "1:1", "3:1", "1.07:1".
std::string FormatRatio(double oversubscription);

// The report as `gpufleet fabric check` prints it.
std::string FormatReport(const FabricReport& report);

}  // namespace gpufleet::fabric
