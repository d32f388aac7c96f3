// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "gpufleet/sim/fill.h"

namespace gpufleet::sim {

// Per policy, over its seeds: the figures the FGD paper reports.
struct FillPolicySummary {
  std::string policy;
  int seeds = 0;
  double median_unallocated_gpus_at_100 = 0;
  double mean_unallocated_percent_at_100 = 0;
  double mean_allocation_at_80 = 0;
  double mean_allocation_at_90 = 0;
  double mean_allocation_at_100 = 0;
  double mean_allocation_at_130 = 0;
  double mean_fragmentation_percent_at_100 = 0;
  double mean_fragmentation_rate_at_90 = 0;
  // Median over the seeds that have a bound of (unallocated GPUs at 100 % - the seed's lower
  // bound from `gpufleet sim bound`); empty without bounds.
  std::optional<double> median_gap_to_bound;
};

// The median of `values`; 0 when empty.
double Median(std::vector<double> values);

// Per seed, the lower bound on unallocated GPUs at 100 % (`RunFillBound`).
using FillBoundsBySeed = std::map<uint64_t, double>;

// Groups `results` by policy, in first-seen order; with `bounds`, each policy's gap to them.
std::vector<FillPolicySummary> SummarizeFill(const std::vector<FillResult>& results,
                                             const FillBoundsBySeed& bounds = {});

// A fixed-width table of the summaries, one row per policy; a gap column when they have one.
void PrintFillSummary(const std::vector<FillPolicySummary>& summaries, std::ostream& out);

// One CSV row per (policy, seed, arrived percent):
// policy,seed,arrived_percent,allocation_percent,fragmentation_percent,fragmentation_rate.
void WriteFillSeries(const std::vector<FillResult>& results, std::ostream& out);

}  // namespace gpufleet::sim
