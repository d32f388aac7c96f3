// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/autoscaler_options.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"

// `gpufleet sim autoscale`: one inference deployment under a diurnal load, its replicas scaled by
// policy::Autoscaler on measured GPU utilization, against static provisioning for the peak.
//
// Time advances in fixed intervals. In each interval the load brings work (GPU-seconds of one
// whole GPU, kept as milli-GPU-seconds), which joins a FIFO queue; the ready replicas serve up to
// their capacity (replica GPU share x interval), oldest work first; work still waiting
// `max_queue_seconds` after the interval it arrived in is dropped (the request timed out). The
// measured utilization is served work / capacity of the ready replicas. At the end of each
// interval the autoscaler decides the replica count for the next one; new replicas serve only
// after `startup_seconds`, removed ones stop at once (starting ones first). Deterministic: the
// same options give the same result and the same bytes.
namespace gpufleet::sim {

// What one replica holds: a whole GPU, a share of one, or a MIG instance (its compute share).
struct ReplicaShape {
  int64_t gpu_milli = 1000;  // 1..1000
  std::string label = "1 GPU";
};

// "gpu" (a whole GPU), "fraction:MILLI" (e.g. "fraction:500") or "mig:PROFILE" (e.g.
// "mig:3g.40gb", a profile of `gpu_model`, holding its compute slices out of 7). kInvalidArgument
// naming the text, or kNotFound for an unknown model or profile.
Result<ReplicaShape> ParseReplicaShape(std::string_view text, const GpuCatalog& catalog,
                                       std::string_view gpu_model);

// Validated by RunAutoscaleSim.
struct AutoscaleSimOptions {
  uint64_t seed = 42;
  int64_t duration_seconds = 7 * 86400;  // > 0
  int64_t interval_seconds = 60;         // 1..duration_seconds
  // The load: mean * (1 + amplitude * cos(2 pi (hour - peak_hour) / 24)) * (1 + noise), where
  // the noise is a seeded AR(1) series with standard deviation `noise` and lag-1 correlation
  // `noise_correlation`; never below zero.
  int64_t mean_load_gpu_milli = 16000;  // > 0: work per second, in milli-GPUs
  double daily_amplitude = 0.6;         // 0..1
  double peak_hour = 14;                // 0..24
  double noise = 0.1;                   // 0..1
  double noise_correlation = 0.8;       // 0..<1
  ReplicaShape replica;
  int64_t startup_seconds = 180;    // >= 0
  int64_t max_queue_seconds = 120;  // >= 0
  AutoscalerOptions autoscaler{.min_replicas = 2, .max_replicas = 100};

  // kInvalidArgument naming the field and its value.
  Status Validate() const;
};

// One interval of one run. Work in milli-GPU-seconds.
struct AutoscaleInterval {
  int64_t start_seconds = 0;
  int64_t arrived = 0;
  int replicas = 0;  // holding GPUs: ready and starting
  int ready_replicas = 0;
  int64_t capacity = 0;
  int64_t served = 0;
  int64_t dropped = 0;
  int64_t backlog = 0;            // waiting at the end of the interval
  int64_t utilization_milli = 0;  // served / capacity; 0 without capacity
};

// Totals of one run.
struct AutoscaleRunSummary {
  std::string name;
  double gpu_hours = 0;  // replicas held x their GPU share, starting ones included
  int64_t intervals = 0;
  int64_t overload_intervals = 0;  // measured utilization above the target
  // Above the target's tolerance band (target x (1 + tolerance)), where the autoscaler acts.
  int64_t above_band_intervals = 0;
  int64_t saturated_intervals = 0;  // work still waiting at the end of the interval
  int64_t arrived = 0;
  int64_t served = 0;
  int64_t dropped = 0;
  int64_t delayed = 0;  // served in a later interval than it arrived in
  // Mean over served work of the intervals it waited, in seconds (whole intervals).
  double mean_wait_seconds = 0;
  double mean_utilization = 0;  // served / capacity over the run
  int scale_ups = 0;
  int scale_downs = 0;
  int min_replicas = 0;
  int max_replicas = 0;
};

struct AutoscaleSimResult {
  AutoscaleSimOptions options;
  int64_t peak_load_gpu_milli = 0;  // the busiest interval's work per second
  int static_replicas = 0;  // ceil(peak / (replica share x target)): the target met at the peak
  std::vector<AutoscaleInterval> autoscaled;
  std::vector<AutoscaleInterval> static_peak;
  AutoscaleRunSummary autoscaled_summary;
  AutoscaleRunSummary static_summary;
  // The autoscaler's reasons for its first changes of the count, for the report.
  std::vector<std::string> first_decisions;
};

// The load in milli-GPU-seconds per interval, one entry per interval.
std::vector<int64_t> DiurnalLoad(const AutoscaleSimOptions& options);

// Runs the autoscaled deployment and the static one on the same load. kInvalidArgument when the
// options do not validate.
Result<AutoscaleSimResult> RunAutoscaleSim(const AutoscaleSimOptions& options);

// A fixed-width table of both runs and the saving.
void PrintAutoscaleSummary(const AutoscaleSimResult& result, std::ostream& out);

// {"mode":"autoscale","options":{...},"runs":[...],"gpu_hours_ratio":...} on one line.
void WriteAutoscaleJson(const AutoscaleSimResult& result, std::ostream& out);

// An HTML5 page titled `title`: the summary, charts of replicas and load over the run and over
// one day, utilization against the target, and the CDF of utilization. kUnavailable when `out`
// fails.
Status WriteAutoscaleReport(const AutoscaleSimResult& result, const std::string& title,
                            std::ostream& out);

}  // namespace gpufleet::sim
