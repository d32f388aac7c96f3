// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/fill_report.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ostream.h>

namespace gpufleet::sim {
namespace {

double Mean(const std::vector<double>& values) {
  if (values.empty()) {
    return 0;
  }
  double sum = 0;
  for (double value : values) {
    sum += value;
  }
  return sum / static_cast<double>(values.size());
}

double AllocationAt(const FillResult& result, int percent) {
  const FillPoint* point = result.At(percent);
  return point == nullptr ? 0 : point->allocation_percent;
}

}  // namespace

double Median(std::vector<double> values) {
  if (values.empty()) {
    return 0;
  }
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2.0;
}

std::vector<FillPolicySummary> SummarizeFill(const std::vector<FillResult>& results,
                                             const FillBoundsBySeed& bounds) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const FillResult*>> by_policy;
  for (const FillResult& result : results) {
    if (by_policy.find(result.policy) == by_policy.end()) {
      order.push_back(result.policy);
    }
    by_policy[result.policy].push_back(&result);
  }
  std::vector<FillPolicySummary> summaries;
  for (const std::string& policy : order) {
    const auto& runs = by_policy[policy];
    std::vector<double> unallocated, unallocated_percent, a80, a90, a100, a130, frag100, rate90;
    std::vector<double> gaps;
    for (const FillResult* run : runs) {
      unallocated.push_back(run->UnallocatedGpusAt(100));
      if (auto bound = bounds.find(run->seed); bound != bounds.end() && run->At(100) != nullptr) {
        gaps.push_back(run->UnallocatedGpusAt(100) - bound->second);
      }
      unallocated_percent.push_back(100.0 - AllocationAt(*run, 100));
      a80.push_back(AllocationAt(*run, 80));
      a90.push_back(AllocationAt(*run, 90));
      a100.push_back(AllocationAt(*run, 100));
      a130.push_back(AllocationAt(*run, 130));
      const FillPoint* at100 = run->At(100);
      const FillPoint* at90 = run->At(90);
      frag100.push_back(at100 == nullptr ? 0 : at100->fragmentation_percent);
      rate90.push_back(at90 == nullptr ? 0 : at90->fragmentation_rate);
    }
    summaries.push_back({policy, static_cast<int>(runs.size()), Median(unallocated),
                         Mean(unallocated_percent), Mean(a80), Mean(a90), Mean(a100), Mean(a130),
                         Mean(frag100), Mean(rate90)});
    if (!gaps.empty()) {
      summaries.back().median_gap_to_bound = Median(gaps);
    }
  }
  return summaries;
}

void PrintFillSummary(const std::vector<FillPolicySummary>& summaries, std::ostream& out) {
  const bool gaps = std::any_of(summaries.begin(), summaries.end(),
                                [](const FillPolicySummary& s) { return s.median_gap_to_bound; });
  fmt::print(out, "{:<16} {:>5} {:>13} {:>9} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10}{}\n", "policy",
             "seeds", "unalloc@100", "unalloc%", "alloc@80", "alloc@90", "alloc@100", "alloc@130",
             "frag%@100", "fragrate@90", gaps ? fmt::format(" {:>10}", "gap@100") : "");
  for (const FillPolicySummary& s : summaries) {
    fmt::print(out,
               "{:<16} {:>5} {:>13.1f} {:>9.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>10.2f} "
               "{:>10.1f}{}\n",
               s.policy, s.seeds, s.median_unallocated_gpus_at_100,
               s.mean_unallocated_percent_at_100, s.mean_allocation_at_80, s.mean_allocation_at_90,
               s.mean_allocation_at_100, s.mean_allocation_at_130,
               s.mean_fragmentation_percent_at_100, s.mean_fragmentation_rate_at_90,
               !gaps                   ? std::string()
               : s.median_gap_to_bound ? fmt::format(" {:>10.1f}", *s.median_gap_to_bound)
                                       : fmt::format(" {:>10}", "-"));
  }
}

void WriteFillSeries(const std::vector<FillResult>& results, std::ostream& out) {
  out << "policy,seed,arrived_percent,allocation_percent,fragmentation_percent,"
         "fragmentation_rate\n";
  for (const FillResult& result : results) {
    for (const FillPoint& point : result.points) {
      fmt::print(out, "{},{},{},{:.4f},{:.4f},{:.4f}\n", result.policy, result.seed,
                 point.arrived_percent, point.allocation_percent, point.fragmentation_percent,
                 point.fragmentation_rate);
    }
  }
}

}  // namespace gpufleet::sim
