// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/reliability/attribution.h"
#include "gpufleet/reliability/monitor.h"
#include "gpufleet/reliability/quarantine.h"
#include "gpufleet/sim/trace.h"

// "Failures" mode: a job stream on a cluster whose GPUs fail at injected, heavy-tailed rates,
// with the reliability monitor (attribution + quarantine) running online, and one large
// checkpointing training job whose effective training time ratio (ETTR) is measured. Run with
// and without quarantine on the same seed to see what quarantine buys.
namespace gpufleet::sim {

// A job to sample arrivals from: its GPUs and how long it runs without interruption.
struct JobShape {
  int gpus = 1;
  int64_t duration_seconds = 0;
};

// The whole-GPU jobs of `trace` (GPUs summed over task groups); CPU-only, fractional and MIG
// jobs are left out.
std::vector<JobShape> JobShapesFromTrace(const Trace& trace);

// Where failures come from. A healthy GPU fails the job it runs at `base_rate_per_gpu_hour`;
// `bad_gpu_share` of the GPUs, chosen at random, fail it at a multiple of that drawn
// log-uniformly from [bad_multiplier_min, bad_multiplier_max]. A GPU failure reports a blaming
// XID on the GPU with probability `xid_share` (else the job hangs or dies naming nothing). Jobs
// also fail on their own (application errors) at `app_failure_rate_per_job_hour`, reporting an
// application XID with probability `app_xid_share`. On top of that reference (issue 8's model),
// docs/reliability.md gives the sources of the defaults below:
// - `slow_gpu_share` of the other GPUs fail slow: they never fail a job, but every gang they are
//   in runs `slow_factor` times slower (a synchronous gang waits for its slowest member);
// - node faults (PSU, CPU, memory, SSD, chassis) at `node_rate_per_node_hour` fail every job on
//   the node, with a failing node-level health check;
// - NIC and link faults at `nic_rate_per_node_hour` fail the jobs on the node that span several
//   nodes (single-node jobs do not use the NIC);
// after either the node is fenced for `node_repair_seconds` (a reboot or a link reset).
struct FaultModel {
  double base_rate_per_gpu_hour = 2.5e-4;
  double bad_gpu_share = 0.01;
  double bad_multiplier_min = 50;
  double bad_multiplier_max = 100;
  double xid_share = 0.6;
  double app_failure_rate_per_job_hour = 0.005;
  double app_xid_share = 0.5;
  double slow_gpu_share = 0.005;
  double slow_factor = 1.34;
  double node_rate_per_node_hour = 2e-4;
  double nic_rate_per_node_hour = 6e-4;
  int64_t node_repair_seconds = 600;
};

// The closed loop of the run with quarantine (issue 36): a suspect is held for an active
// diagnostic (`dcgmi diag -r 2` takes about 2 minutes), quarantined only when the diagnostic
// fails and readmitted when it passes. A diagnostic fails a failure-prone GPU with probability
// `bad_sensitivity`, a fail-slow GPU with `slow_sensitivity` and a sound one with
// `false_positive_rate`, independently each time (assumptions, not measurements). Suspects:
// - a GPU that a failure's XID names (a stop-time check);
// - a GPU the attribution flags, or ranks with at least `suspect_min_failures` failures and
//   p <= `suspect_max_p` (a looser threshold than the flag's), once per new failure;
// - a member of a gang that runs slower than its peers: every analysis interval the telemetry
//   comparison names each fail-slow GPU of a running gang of 2 or more GPUs with probability
//   `straggler_accuracy`, and a sound member with `straggler_false_per_gpu_hour` per hour;
//   suspected again no sooner than `resuspect_seconds` after a clean diagnostic.
// A busy suspect is diagnosed when its job ends; the large job is stopped at its next
// checkpoint (no work lost) and restarts without it. enabled = false: the attribution
// quarantines flagged devices itself, as before this loop.
struct DiagnosticsModel {
  bool enabled = true;
  int64_t diagnostic_seconds = 120;
  double bad_sensitivity = 0.9;
  double slow_sensitivity = 0.95;
  double false_positive_rate = 0.01;
  int suspect_min_failures = 2;
  double suspect_max_p = 1e-3;
  double straggler_accuracy = 0.99;
  double straggler_false_per_gpu_hour = 1e-5;
  int64_t resuspect_seconds = int64_t{24} * 3600;
};

// The large training job: `gpus` GPUs (tasks of one full node each), submitted at `start` and
// running to the end, writing a checkpoint after every `checkpoint_interval` of progress (taking
// `checkpoint_write`), and paying `restart` to reload after each (re)start. Work since the last
// checkpoint is lost when a run fails or is drained. Placed ahead of every other job: while it
// waits, nothing else starts. A restart keeps the nodes of the previous run that are still whole
// and free, and the scheduler replaces the others. Its ETTR counts from its first start (the
// wait for that is queueing, not training time). While it runs, up to `spare_nodes` whole free
// nodes are held back from the stream so that a restart need not wait for nodes to drain. With
// `checkpoint_from_failure_rate`, each run's checkpoint interval is Young/Daly's
// sqrt(2 x checkpoint_write x MTBF), the MTBF measured from the job's own failures so far (the
// fleet's measured rate counts as one failure of prior).
struct LargeJobSpec {
  int gpus = 1024;  // 0: no large job
  int64_t start_seconds = 0;
  int64_t checkpoint_interval_seconds = int64_t{30} * 60;
  int64_t checkpoint_write_seconds = 30;
  int64_t restart_seconds = int64_t{10} * 60;
  int spare_nodes = 8;
  bool checkpoint_from_failure_rate = false;
};

struct FailureSimOptions {
  uint64_t seed = 42;
  int64_t duration_seconds = int64_t{14} * 24 * 3600;
  // Arriving GPU-seconds per second over the GPUs the large job leaves to the stream.
  double target_load = 0.8;
  // Sampled jobs longer than this are cut to it.
  int64_t max_job_seconds = int64_t{7} * 24 * 3600;
  // Stream jobs resume from their last checkpoint too, taken this often (no overheads).
  int64_t stream_checkpoint_seconds = int64_t{30} * 60;
  FaultModel faults;
  DiagnosticsModel diagnostics;
  LargeJobSpec large_job;
  // How often the monitor runs the attribution and applies the quarantine rules.
  int64_t analysis_interval_seconds = 3600;
  reliability::AttributionOptions attribution;
  reliability::QuarantineBudget budget;
  reliability::QuarantineRules rules;  // rules.enabled = false: the run without quarantine
  std::string placement_policy = "best-fit";

  // kInvalidArgument naming the field and value for a bad option.
  Status Validate() const;
};

// Totals of one hour of simulated time.
struct HourStats {
  int runs_ended = 0;
  int failed_runs = 0;        // hardware failures (whatever the job reported)
  int app_failed_runs = 0;    // application errors
  double busy_gpu_hours = 0;  // GPU-hours of running jobs (holds for quarantine excluded)
};

// An injected bad GPU and what became of it.
struct BadGpu {
  std::string uuid;
  double multiplier = 0;
  int failures_caused = 0;
  double busy_hours = 0;
  int64_t found_seconds = -1;        // first flagged by the attribution or failed a diagnostic
  int64_t quarantined_seconds = -1;  // taken out of service; -1: never
};

// An injected fail-slow GPU and what became of it.
struct SlowGpu {
  std::string uuid;
  double slow_factor = 0;
  int64_t found_seconds = -1;        // first named by the gang comparison; -1: never
  int64_t quarantined_seconds = -1;  // taken out of service after a failed diagnostic
};

// A device the attribution flagged at some point.
struct FlaggedDevice {
  reliability::Device device;
  int64_t first_flagged_seconds = 0;
  int bad_gpus = 0;      // injected bad GPUs it covers (a node counts its GPUs)
  int healthy_gpus = 0;  // healthy GPUs it covers
  bool quarantined = false;
};

// The large job's time, in hours; the shares sum to the wall time.
struct LargeJobStats {
  int gpus = 0;                 // 0: no large job ran
  double wall_hours = 0;        // from its first start to the end
  double useful_hours = 0;      // progress kept (checkpointed, or still held at the end)
  double lost_hours = 0;        // progress lost to failures and drains
  double restart_hours = 0;     // reloading after (re)starts
  double checkpoint_hours = 0;  // writing checkpoints
  double waiting_hours = 0;     // waiting for GPUs
  int runs = 0;
  int failures = 0;  // hardware and application
  int drains = 0;    // stopped by a quarantine that drained at once, or for a suspect
  // Computing slower than full speed (a fail-slow GPU in the gang); a share of the wall time.
  double slowed_hours = 0;
  // The interval of its last run, and Young/Daly's from its failure rate measured at the end.
  int64_t checkpoint_interval_seconds = 0;
  int64_t suggested_checkpoint_seconds = 0;
  double Ettr() const { return wall_hours > 0 ? useful_hours / wall_hours : 0; }
};

// Infrastructure failures per 1,000 busy GPU-hours and per run ended, over a span of hours.
struct FailureRates {
  int64_t from_hour = 0;
  int64_t to_hour = 0;  // exclusive
  int runs_ended = 0;
  int failed_runs = 0;
  double busy_gpu_hours = 0;
  double PerThousandGpuHours() const {
    return busy_gpu_hours > 0 ? 1000.0 * failed_runs / busy_gpu_hours : 0;
  }
  double FailedShare() const {
    return runs_ended > 0 ? static_cast<double>(failed_runs) / runs_ended : 0;
  }
};

struct FailureSimResult {
  bool quarantine = false;
  uint64_t seed = 0;
  int total_gpus = 0;
  int64_t duration_seconds = 0;
  // What was injected.
  int hardware_failures = 0;
  int bad_gpu_failures = 0;  // of which on injected bad GPUs
  int app_failures = 0;
  int node_faults = 0;    // node fault events
  int nic_faults = 0;     // NIC or link fault events
  int node_failures = 0;  // runs they failed
  int nic_failures = 0;
  std::vector<BadGpu> bad_gpus;    // in inventory order
  std::vector<SlowGpu> slow_gpus;  // in inventory order
  // What the monitor found.
  std::vector<FlaggedDevice> flagged;  // by first flag time, then device
  int bad_found = 0;
  int bad_quarantined = 0;
  int slow_found = 0;
  int slow_quarantined = 0;
  int diagnostics = 0;               // diagnostics run
  int diagnostics_failed = 0;        // of which failed (sound GPUs included)
  int healthy_gpus_flagged = 0;      // healthy GPUs covered by a flagged device
  int healthy_gpus_quarantined = 0;  // healthy GPUs taken out of service
  int64_t found_90_seconds = -1;     // when 90 % of the bad GPUs had been found; -1: never
  std::vector<reliability::AuditEntry> audit_log;
  // The job stream.
  int jobs_arrived = 0;
  int jobs_finished = 0;
  int runs_started = 0;
  int requeues = 0;
  int drains = 0;  // runs stopped because a quarantine drained at once
  double mean_busy_gpus = 0;
  std::vector<HourStats> hours;
  LargeJobStats large_job;
  // The attribution at the end, and what the devices it holds responsible cost.
  reliability::AttributionReport final_report;
  reliability::FailureConcentration concentration;  // of `flagged`
  std::vector<int> failed_runs_by_gpu_rank;         // most first, GPUs with >= 1
  // (share of the fleet's GPUs, share of failed runs involving them) for the top-k GPUs.
  std::vector<std::pair<double, double>> concentration_curve;

  FailureRates RatesBetween(int64_t from_hour, int64_t to_hour) const;
};

// One run. kInvalidArgument for bad options, a cluster that does not validate, no job shapes,
// or a large job wider than the cluster.
Result<FailureSimResult> RunFailureSim(const Cluster& cluster, const std::vector<JobShape>& shapes,
                                       const GpuCatalog& catalog, const FailureSimOptions& options);

// The run with quarantine (options.rules.enabled = true) and the one without (false), on up to
// two threads; results in that order.
Result<std::vector<FailureSimResult>> RunFailureSimPair(const Cluster& cluster,
                                                        const std::vector<JobShape>& shapes,
                                                        const GpuCatalog& catalog,
                                                        const FailureSimOptions& options,
                                                        int threads);

}  // namespace gpufleet::sim
