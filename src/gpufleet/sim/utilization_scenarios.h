// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/sim/replay.h"
#include "gpufleet/sim/trace.h"

// The queue scenarios of `gpufleet sim fairness` and `gpufleet sim backfill` (docs/utilization.md):
// replays of a trace window under several queue policies, a summary for the terminal and a
// self-contained HTML report with charts. The same input always gives the same bytes.
namespace gpufleet::sim {

// The jobs of `trace` submitted in [start_seconds, start_seconds + length_seconds), moved to
// arrive from 0 on (submit - start_seconds), in the same order. length_seconds <= 0: to the end.
Trace SliceTrace(const Trace& trace, int64_t start_seconds, int64_t length_seconds);

struct FairnessOptions {
  // Queue names of the two teams; they have equal weight and each a guarantee of half the
  // cluster's GPUs of every model, with borrowing.
  std::string flooder = "team-a";
  std::string victim = "team-b";
  // Most of the cluster's GPUs either team may hold, borrowing included (a limit per model):
  // 0.5 forbids borrowing, 1 leaves only the cluster's size as the bound.
  double team_limit_share = 1.0;
  // The flooder submits each of its jobs this many times...
  int flood_copies = 3;
  // ...all within this long from the start of the window (its submit times squeezed in
  // proportion); 0 keeps its own submit times.
  int64_t flood_burst_seconds = 3600;
  std::vector<std::string> policies = {"fifo", "fair-share-no-preempt", "fair-share"};
  // Cluster-independent replay settings; queue_policy and queues are set per run.
  ReplayOptions replay;
};

// The trace's jobs dealt to the two teams alternately in submit order (so both get the same mix
// of sizes and durations): the victim's jobs alone, and the victim's with the flooder's copies.
struct FairnessWorkloads {
  Trace victim_alone;
  Trace flooded;
};
// kInvalidArgument when flood_copies < 1, flood_burst_seconds < 0, team_limit_share is outside
// [0.5, 1] or the team names are empty or equal.
Result<FairnessWorkloads> MakeFairnessWorkloads(const Trace& trace, const FairnessOptions& options);

// One queue policy, with the victim alone and flooded.
struct FairnessComparison {
  std::string policy;
  ReplayResult alone;
  ReplayResult flooded;
  double victim_alone_mean_delay = 0;    // seconds
  double victim_flooded_mean_delay = 0;  // seconds
  double flooder_mean_delay = 0;         // seconds, in the flooded run
  // victim_flooded_mean_delay / victim_alone_mean_delay; the target is <= 2.
  double DelayRatio() const;
};

struct FairnessResult {
  FairnessOptions options;
  int victim_jobs = 0;
  int flooder_jobs = 0;                         // copies included
  std::vector<FairnessComparison> comparisons;  // in options.policies order
};

// Runs every policy on both workloads, on up to `threads` threads. Errors of RunReplay pass
// through; kInvalidArgument for the options (see MakeFairnessWorkloads).
Result<FairnessResult> RunFairnessScenario(const Cluster& cluster, const Trace& trace,
                                           const GpuCatalog& catalog,
                                           const FairnessOptions& options, int threads);

void PrintFairnessSummary(const FairnessResult& result, std::ostream& out);

// An HTML5 page titled `title`: the summary table, the CDFs of the victim's queueing delay alone
// and flooded under each policy, and the queue length of the flooded runs over time.
// kInvalidArgument when there is no comparison; kUnavailable when `out` fails.
Status WriteFairnessReport(const FairnessResult& result, const std::string& title,
                           std::ostream& out);

// Runtime estimates as users give them, for traces whose estimates are the exact run times.
// Overestimates follow Mu'alem and Feitelson's f-model (IEEE TPDS 12(6), 2001): the run time times
// a factor drawn uniformly from [1, overestimate_factor]. A share of the jobs underestimate
// instead (a factor from [0.5, 1)): under enforced time limits they are killed at their limit,
// as Slurm does.
struct EstimateModel {
  double overestimate_factor = 1;  // [1, 100]; 1 with no underestimates: exact estimates
  double underestimate_share = 0;  // [0, 1]

  bool Exact() const { return overestimate_factor == 1 && underestimate_share == 0; }
  // kInvalidArgument naming the field and its value.
  Status Validate() const;
};

// `trace` with every job's runtime estimate drawn from `model` (seeded, in job order).
// kInvalidArgument when `model` does not validate.
Result<Trace> WithRuntimeEstimates(const Trace& trace, const EstimateModel& model, uint64_t seed);

struct BackfillScenarioOptions {
  std::vector<std::string> policies = {"strict-fifo", "fifo", "easy-backfill"};
  EstimateModel estimates;  // drawn with replay.seed
  ReplayOptions replay;     // queue_policy is set per run
};

struct BackfillScenarioResult {
  EstimateModel estimates;
  std::vector<ReplayResult> runs;  // in options.policies order
};

Result<BackfillScenarioResult> RunBackfillScenario(const Cluster& cluster, const Trace& trace,
                                                   const GpuCatalog& catalog,
                                                   const BackfillScenarioOptions& options,
                                                   int threads);

void PrintBackfillSummary(const BackfillScenarioResult& result, std::ostream& out);

// An HTML5 page titled `title`: the summary table (queueing delay, completion time, GPUs busy,
// reservations and how many were delayed, timed-out jobs), the CDFs of the queueing delay, and
// the queue length and GPUs allocated over time. kInvalidArgument when there is no run;
// kUnavailable when `out` fails.
Status WriteBackfillReport(const BackfillScenarioResult& result, const std::string& title,
                           std::ostream& out);

}  // namespace gpufleet::sim
