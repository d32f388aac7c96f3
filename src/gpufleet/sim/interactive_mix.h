// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/policy/idle_reclaim.h"
#include "gpufleet/sim/replay.h"
#include "gpufleet/sim/trace.h"

// The interactive-mix scenario of `gpufleet sim interactive` (docs/utilization.md): a batch trace
// window plus generated notebook sessions that reserve a share of the GPU demand but are busy only
// a fraction of the time, replayed without and with idle reclaim. Reports GPUs allocated against
// GPUs busy, the batch jobs' waits and the notebooks' slowdown, as a summary for the terminal and
// a self-contained HTML report with charts. The same input always gives the same bytes.
namespace gpufleet::sim {

// One replay of the mix.
struct InteractiveMixRunSpec {
  std::string name;
  std::optional<policy::IdleReclaimOptions> reclaim;  // nullopt: no idle reclaim
};

struct InteractiveMixOptions {
  // Notebooks' reserved GPU-time over all GPU-time asked for, batch included, both counted
  // inside the window (GPUs x the part of the job's duration before window_seconds, as if it
  // started on arrival: most of a long batch job's time falls after a short window); in (0, 1).
  double notebook_share = 0.2;
  // Busy share and mean busy burst of a session (InteractiveActivity).
  double busy_fraction = 0.15;
  int64_t mean_busy_seconds = 10 * 60;
  // Session lengths are uniform in [min, max]; 0 < min <= max.
  int64_t min_session_seconds = 3600;
  int64_t max_session_seconds = 8 * 3600;
  // Sessions open uniformly over [0, window_seconds), which is also the span the utilization
  // figures are measured over; 0: up to the batch trace's last submit time (inclusive).
  int64_t window_seconds = 0;
  // The figures leave out the warm-up [0, measure_from_seconds) (a replay starts with an empty
  // cluster): time series samples and jobs submitted before it. < window_seconds.
  int64_t measure_from_seconds = 0;
  uint64_t seed = 42;  // for the sessions; the replays use replay.seed
  std::vector<InteractiveMixRunSpec> runs = {{"no reclaim", std::nullopt},
                                             {"reclaim", policy::IdleReclaimOptions{}}};
  // Queue and placement policy, sampling and the rest; interactive_activity and idle_reclaim
  // are set per run.
  ReplayOptions replay;

  // kInvalidArgument naming the field and its value.
  Status Validate() const;
};

// Notebook sessions added to `batch` (a trace window starting at 0) until their reserved
// GPU-time reaches notebook_share of the total inside the window: ids "notebook-N", queue
// "notebooks", kind interactive, 1 GPU (80%), 2 (15%) or 4 (5%), runtime estimate = session length.
// In submit order, batch jobs first at equal times. kInvalidArgument for bad options or a trace
// without GPU-time.
Result<Trace> AddNotebookSessions(const Trace& batch, const InteractiveMixOptions& options);

struct InteractiveMixRun {
  InteractiveMixRunSpec spec;
  ReplayResult replay;
  // Over the measurement span [measure_from_seconds, window_seconds): the means of the time
  // series' samples in it, and the figures of the jobs submitted in it.
  double mean_gpus_allocated = 0;
  double mean_gpus_busy = 0;
  Distribution batch_queueing_delay;   // batch jobs that started, seconds
  Distribution batch_completion_time;  // batch jobs that finished, seconds
  InteractiveOutcome notebooks;
  // "Busy-GPU utilization": mean_gpus_busy / mean_gpus_allocated, the share of allocated
  // GPU-time that does work; 0 when nothing is allocated.
  double BusyOfAllocated() const;
  // mean_gpus_busy / the cluster's GPUs.
  double BusyOfTotal() const;
};

struct InteractiveMixResult {
  InteractiveMixOptions options;  // window_seconds resolved
  int batch_jobs = 0;
  int notebook_sessions = 0;
  // Inside the window, see InteractiveMixOptions::notebook_share.
  double batch_gpu_seconds = 0;         // asked for
  double notebook_gpu_seconds = 0;      // reserved
  std::vector<InteractiveMixRun> runs;  // in options.runs order
};

// Runs every run spec on the mix, on up to `threads` threads. kInvalidArgument for the options;
// errors of RunReplay pass through.
Result<InteractiveMixResult> RunInteractiveMix(const Cluster& cluster, const Trace& batch,
                                               const GpuCatalog& catalog,
                                               const InteractiveMixOptions& options, int threads);

void PrintInteractiveMixSummary(const InteractiveMixResult& result, std::ostream& out);

// An HTML5 page titled `title`: the summary table, bars of GPUs allocated and busy per run, the
// GPUs allocated and busy over the window, and the CDF of the notebooks' wait on resuming.
// kInvalidArgument when there is no run; kUnavailable when `out` fails.
Status WriteInteractiveMixReport(const InteractiveMixResult& result, const std::string& title,
                                 std::ostream& out);

}  // namespace gpufleet::sim
