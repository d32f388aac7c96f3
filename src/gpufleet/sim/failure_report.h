// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "gpufleet/core/status.h"
#include "gpufleet/reliability/attribution.h"
#include "gpufleet/sim/failure_sim.h"

// The outputs of `gpufleet sim failures`: a comparison of the runs with and without quarantine,
// a summary for the terminal, JSON for programs and a self-contained HTML report for people.
// The same input always gives the same bytes.
namespace gpufleet::sim {

// The two runs side by side, over the hours after the quarantine run found 90 % of the bad GPUs
// (short of that, 90 % of those it found).
struct FailureComparison {
  int64_t detection_hour = 0;
  FailureRates with_quarantine_after;
  FailureRates without_quarantine_after;
  FailureRates with_quarantine_before;
  FailureRates without_quarantine_before;
  // After detection, with / without: infrastructure failures per busy GPU-hour and per run.
  double rate_ratio = 0;
  double failed_share_ratio = 0;
  // The second half of the runs (a longer, fixed window), with / without.
  FailureRates with_quarantine_second_half;
  FailureRates without_quarantine_second_half;
  double second_half_rate_ratio = 0;
};

// REQUIRES: `with_quarantine.quarantine` and not `without_quarantine.quarantine`, same length.
FailureComparison CompareFailureRuns(const FailureSimResult& with_quarantine,
                                     const FailureSimResult& without_quarantine);

// "these 97 GPUs (0.97% of the fleet) were involved in 46.1% of failed jobs; quarantining them
// would have avoided 412 failures".
std::string ConcentrationSentence(const reliability::FailureConcentration& concentration);

// A fixed-width table: one column per run.
void PrintFailureSummary(const std::vector<FailureSimResult>& results, std::ostream& out);

// Writes {"mode":"failures","runs":[...],"comparison":{...}} on one line (comparison only for a
// with/without pair); hours and shares rounded to 4 decimals.
void WriteFailureJson(const std::vector<FailureSimResult>& results, std::ostream& out);

// An HTML5 page titled `title`: the summary table, the concentration sentence, charts of failed
// runs by GPU rank, of the share of failed runs against the share of the fleet, of failures per
// busy GPU-hour by day and of the detection time of the bad GPUs, the large job's time, the
// suspects with their evidence and the start of the audit log. kInvalidArgument when `results`
// is empty; kUnavailable when `out` fails.
Status WriteFailureReport(const std::vector<FailureSimResult>& results, const std::string& title,
                          std::ostream& out);

}  // namespace gpufleet::sim
