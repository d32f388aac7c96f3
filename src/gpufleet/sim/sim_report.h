// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "gpufleet/core/status.h"
#include "gpufleet/sim/fill.h"
#include "gpufleet/sim/fill_report.h"
#include "gpufleet/sim/replay.h"

// The simulator's outputs beyond the CSV series: JSON for programs, a self-contained HTML page
// (inline CSS, the charts' data drawn by the embedded uPlot, no network references) for people, and
// a progress bar for the command line. The same input always gives the same bytes.
namespace gpufleet::sim {

// Writes
//   {"mode":"fill",
//    "runs":[{"policy","seed","total_gpus",
//             "allocation_ratio":[...],     // index = arrived load %, value = allocation %
//             "fragmentation_ratio":[...],  // index = arrived load %, value = fragmentation %
//                                           //   of the capacity
//             "unallocated_gpus_at_100"}],
//    "summary":[{"policy","median_unallocated_gpus_at_100","mean_allocation_ratio_at_100",
//                "median_gap_to_bound" (with bounds)}],
//    "bounds":[{"seed","unallocated_gpus_bound"}] (with bounds)}
// on one line. The ratio arrays have 131 entries (0 .. 130 %), more when a run recorded points
// past 130 %, with null where a run recorded no point; unallocated_gpus_at_100 is null when the
// run did not reach 100 %. Numbers are rounded to 4 decimals. Runs are in the given order,
// summaries in the order of `SummarizeFill`.
void WriteFillJson(const std::vector<FillResult>& results, std::ostream& out,
                   const FillBoundsBySeed& bounds = {});

// Writes
//   {"mode":"replay",
//    "runs":[{"queue_policy","placement_policy","seed","total_gpus","jobs_total",
//             "jobs_finished","jobs_unplaceable","never":[{"id","reason"}],
//             "jobs":[{"id","gpus","start_seconds","end_seconds"}] (-1: never started/ended),
//             "makespan_seconds","mean_gpus_allocated",
//             "queueing_delay":{"mean","p50","p90","p99"},"completion_time":{...},
//             "series":{"time_seconds":[...],"gpus_allocated":[...],
//                       "fragmentation_gpus":[...],"queue_length":[...]}}]}
// on one line; durations in seconds, numbers rounded to 4 decimals.
void WriteReplayJson(const std::vector<ReplayResult>& results, std::ostream& out);

// An HTML5 page titled `title`: the `SummarizeFill` table (with each policy's gap to `bounds`
// when given), the mean allocation (% of capacity) over each policy's seeds against the arrived
// load, and the mean fragmentation likewise. kInvalidArgument when `results` is empty;
// kUnavailable when `out` fails.
Status WriteFillReport(const std::vector<FillResult>& results, const std::string& title,
                       std::ostream& out, const FillBoundsBySeed& bounds = {});

// An HTML5 page titled `title`: a table of every run (policies, seed, jobs, makespan, mean GPUs
// allocated, mean/p50/p90/p99 queueing delay and job completion time) and charts of the GPUs
// allocated and the queue length over time (hours) per run, and the CDFs of the queueing delay
// (jobs that started) and of the job completion time (jobs that finished), in hours.
// kInvalidArgument when `results` is empty; kUnavailable when `out` fails.
Status WriteReplayReport(const std::vector<ReplayResult>& results, const std::string& title,
                         std::ostream& out);

// A one-line progress bar, "\r[#####     ] 12/60 label", redrawn on each `Advance` and ended
// with a newline by `Finish` (or the destructor). When not `enabled` it writes nothing: the
// caller enables it when `err` is a terminal and the work is long enough to watch. It never
// reads a clock. Thread-safe.
class ProgressBar {
 public:
  static constexpr int kWidth = 30;  // characters between the brackets

  // REQUIRES: `err` outlives the bar.
  ProgressBar(std::ostream& err, bool enabled, std::string label, int total);
  ~ProgressBar();

  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Counts `n` more units done (clamped to [0, total]) and redraws. No effect after `Finish`.
  void Advance(int n = 1);
  // Redraws once more and ends the line. Idempotent.
  void Finish();

  int done() const;

 private:
  void DrawLocked();  // REQUIRES: mu_ held.

  std::ostream& err_;
  const bool enabled_;
  const std::string label_;
  const int total_;
  mutable std::mutex mu_;
  int done_ = 0;           // guarded by mu_
  bool finished_ = false;  // guarded by mu_
};

}  // namespace gpufleet::sim
