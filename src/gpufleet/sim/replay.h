// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/fabric/fabric.h"
#include "gpufleet/policy/idle_reclaim.h"
#include "gpufleet/policy/queues.h"
#include "gpufleet/sim/trace.h"

// "Replay" mode: jobs arrive at their submit times, run for their durations once placed, and
// leave; a queue policy orders the waiting jobs and the production scheduler places them.
namespace gpufleet::sim {

// The order in which waiting jobs are offered to the scheduler.
//   fifo      arrival order; a job that does not fit is skipped, later ones may start
//   sjf       shortest runtime estimate first, not preemptive
//   tiresias  discretized two-dimensional least-attained-service (GPUs x seconds) with
//             preemption, as in Tiresias (NSDI'19)
//   gpufleet  ours: least remaining GPU-time first with preemption and an ageing guard
//   strict-fifo    arrival order; the first job that does not fit blocks every job behind it
//   easy-backfill  arrival order; the first job that does not fit gets a reservation from the
//                  runtime estimates, and later jobs start only if they keep it (EASY backfill,
//                  policy/backfill.h); runtime estimates are enforced as time limits
//   fair-share     the queue tree's order (priority, hierarchical fair share of decayed usage,
//                  age) and admission (limits, borrowing of idle quota), policy/queues.h; a job
//                  refused by its quota is skipped; for the first job in that order that does not
//                  fit, one victim search per round (policy/preemption.h) under the queue tree's
//                  rule (policy::QueueTreeRule: a queue within its guarantee reclaims from queues
//                  that borrow; within a queue a higher priority preempts a lower one), as the
//                  server does
//   fair-share-no-preempt  fair-share without preemption: a job that does not fit is skipped
const std::vector<std::string>& QueuePolicyNames();

// How an interactive job (JobKind::kInteractive, a notebook) uses the GPUs it holds: its session
// (TraceJob::duration_seconds of wall time on its GPUs) alternates busy bursts and idle periods,
// busy first, as a person working in a notebook does. Busy and idle lengths are exponential with
// means mean_busy_seconds and mean_busy_seconds * (1 - busy_fraction) / busy_fraction (10 min
// busy, 57 min idle at the defaults), drawn from the replay's seed, the same whatever the queue
// policy or reclaim, so runs compare the same sessions.
struct InteractiveActivity {
  double busy_fraction = 0.15;          // expected busy share of a session, (0, 1]
  int64_t mean_busy_seconds = 10 * 60;  // > 0
};

struct ReplayOptions {
  std::string queue_policy = "fifo";
  std::string placement_policy = "best-fit";
  // > 0: a placement policy that needs a target workload (fgd, gpufleet) does not get the
  // trace's; it learns it as `gpufleet server` does (policy::WorkloadHistory of the jobs placed so
  // far; before the first placement, the shapes of the first 1,000 waiting jobs), rebuilt at most
  // every `learn_workload_seconds` of simulated time. Backfill and preemption what-ifs keep the
  // scheduler of the start (best-fit then).
  int64_t learn_workload_seconds = 0;
  uint64_t seed = 42;
  int64_t sample_seconds = 600;                        // spacing of the time series
  int64_t tiresias_quantum_seconds = 60;               // how often service is re-evaluated
  std::vector<double> tiresias_thresholds = {3600.0};  // GPU-seconds between queue levels
  // The network under the cluster (node names match). With one, a job's run time stretches with
  // its placement's collective cost (see communication_fraction); nullptr: no network model.
  std::shared_ptr<const fabric::Fabric> fabric;
  // Adds the scheduler's collective-cost plugin, which steers gangs to fast placements.
  bool topology_aware = false;
  // Share of a job's run time spent in collectives on the tightest placement the fabric offers,
  // for jobs whose trace entry gives none (TraceJob::communication_fraction). On a placement whose
  // all-reduce of `collective_bytes` takes r times longer, the job runs (1 - f) + f r times as
  // long. 0.3: data-parallel training at scale typically spends a fifth to two fifths of a step
  // in exposed communication (docs/fabric.md).
  double communication_fraction = 0.3;
  int64_t collective_bytes = int64_t{1} << 30;
  // The queue tree of fair-share. A job belongs to the queue TraceJob::job.queue names (the
  // queue "default" when it names none), which must be in the tree. Empty: one top-level queue
  // per queue name of the trace, weight 1, no guarantee, borrowing allowed.
  std::vector<policy::QueueSpec> queues;
  int64_t fair_share_half_life_seconds = 7 * 24 * 3600;
  // fair-share preempts no job that has run less than this (the server's
  // min_runtime_before_preemption): a borrowed job keeps the progress it makes, and a job is not
  // stopped again and again. 10 minutes: on the order of a checkpoint of a large model and of
  // the start-up it throws away (loading, warm-up), so a victim always gets more than it loses.
  // >= 0.
  int64_t min_runtime_before_preemption_seconds = 600;
  // A preempted job resumes from its last checkpoint, taken every checkpoint_interval_seconds of
  // wall time since its run started; the work since is lost and done again. 0: it checkpoints
  // when preempted and loses nothing, as the tiresias and gpufleet policies here assume (and
  // Tiresias does). Applies to fair-share's preemptions. >= 0.
  int64_t checkpoint_interval_seconds = 0;
  // Runtime estimates as time limits, as Slurm enforces them: a run still going at its estimate
  // plus overrun_grace_seconds (Slurm's OverTimeLimit) is killed and ends "timed out". Always on
  // under easy-backfill, whose reservations rely on it. An estimate of 0 sets no limit.
  bool enforce_time_limits = false;
  int64_t overrun_grace_seconds = 0;
  // The activity model of interactive jobs; nullopt: they are busy throughout, like batch jobs.
  std::optional<InteractiveActivity> interactive_activity;
  // Idle reclaim of interactive jobs (policy/idle_reclaim.h); nullopt: off. Needs
  // interactive_activity. Every reclaim_check_seconds each running notebook gives the reclaimer a
  // sample (busy: 90%, idle: 0%) and the reclaimer decides, with the waiting jobs as pending work.
  // A reclaimed notebook gives its GPUs back; its owner is away until the next busy burst of
  // the session, then it is queued again (in its submission order) with the rest of its session,
  // and its busy work waits until it is placed: that wait is the notebook's slowdown. `preempt`
  // differs from `suspend` only in counting the reclaim as a preemption. A notebook reclaimed in
  // the idle period that ends its session is simply over at the session's end.
  std::optional<policy::IdleReclaimOptions> idle_reclaim;
  int64_t reclaim_check_seconds = 60;  // 1..idle_reclaim->max_sample_gap_seconds
};

// One point of the time series.
struct ReplaySample {
  int64_t time_seconds = 0;
  double gpus_allocated = 0;      // whole GPUs (allocated milli-GPU / 1000)
  double fragmentation_gpus = 0;  // idle GPUs the waiting jobs' shapes cannot use
  int queue_length = 0;           // jobs waiting
  int running = 0;
  // Allocated GPUs doing work: all of a batch job's, a notebook's only in its busy bursts.
  double gpus_busy = 0;
};

struct ReplayJobOutcome {
  std::string id;
  int64_t submit_seconds = 0;
  int64_t first_start_seconds = -1;  // -1: never started
  int64_t end_seconds = -1;          // -1: did not finish
  int gpus = 0;                      // whole GPUs the job asks for (milli-GPU / 1000)
  int preemptions = 0;
  int nodes = 0;           // nodes of its last placement
  double stretch = 1.0;    // run-time factor of its last placement's communication cost
  std::string queue;       // TraceJob::job.queue, "default" when empty
  bool timed_out = false;  // killed at its time limit; end_seconds is then the kill time
  // easy-backfill: the start time of the first reservation the job got as the head of the
  // queue; -1 when it never needed one.
  int64_t reserved_start_seconds = -1;
  bool interactive = false;      // JobKind::kInteractive
  int64_t duration_seconds = 0;  // TraceJob::duration_seconds
  // Idle reclaim: how often the job was reclaimed, and the seconds its owner waited in all, from
  // coming back to a reclaimed notebook to its GPUs being placed again.
  int reclaims = 0;
  int64_t resume_wait_seconds = 0;
  // Why the job never ran: it cannot fit the cluster (counted in jobs_unplaceable), or, for a
  // job still waiting when the run ended, why none of its tries placed it. Empty otherwise.
  std::string unplaceable_reason;
  int64_t QueueingDelay() const { return first_start_seconds - submit_seconds; }
  int64_t CompletionTime() const { return end_seconds - submit_seconds; }
  // First start to end over the duration: 1 for a session never interrupted. REQUIRES: ended.
  double SessionStretch() const {
    return duration_seconds > 0
               ? static_cast<double>(end_seconds - first_start_seconds) / duration_seconds
               : 1.0;
  }
};

// Mean and percentiles of a distribution, in seconds.
struct Distribution {
  double mean = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
};
// Of `values`; all zero when there are none. Percentiles are nearest-rank.
Distribution Summarize(std::vector<double> values);

// The interactive jobs (notebooks) of a replay and what idle reclaim cost them.
struct InteractiveOutcome {
  int sessions = 0;
  int finished = 0;
  int reclaims = 0;                     // suspended or preempted by idle reclaim
  int reclaimed = 0;                    // sessions reclaimed at least once
  int64_t resume_wait_seconds = 0;      // total, see ReplayJobOutcome::resume_wait_seconds
  double mean_resume_wait_seconds = 0;  // per reclaim
  Distribution session_resume_wait;     // per started session (most are 0)
  Distribution session_stretch;         // of the finished sessions, a ratio (not seconds)
};

// The jobs of one queue.
struct ReplayQueueOutcome {
  std::string queue;
  int jobs = 0;
  int started = 0;
  int finished = 0;
  Distribution queueing_delay;  // of the jobs that started
};

struct ReplayResult {
  std::string queue_policy;
  std::string placement_policy;
  uint64_t seed = 0;
  int total_gpus = 0;
  int jobs_total = 0;
  int jobs_finished = 0;
  // Larger than the cluster, or a task no node holds (GPUs of an allowed model, CPUs, memory);
  // ReplayJobOutcome::unplaceable_reason says which.
  int jobs_unplaceable = 0;
  int jobs_timed_out = 0;  // killed at their time limit; not in jobs_finished
  int64_t makespan_seconds = 0;
  double mean_gpus_allocated = 0;
  // Integrals over the run (0 to the last job's end): GPUs allocated and GPUs busy (see
  // ReplaySample::gpus_busy) times seconds.
  double allocated_gpu_seconds = 0;
  double busy_gpu_seconds = 0;
  InteractiveOutcome interactive;
  Distribution queueing_delay;
  Distribution completion_time;
  std::vector<ReplaySample> series;
  std::vector<ReplayJobOutcome> jobs;
  std::vector<ReplayQueueOutcome> queues;  // by queue name
  // easy-backfill: jobs that got a reservation, those that started after the first one they
  // got (0 with exact runtime estimates), and by how much at most.
  int reservations = 0;
  int reservations_delayed = 0;
  int64_t max_reservation_delay_seconds = 0;
  // Preemptions of all jobs (the sum of ReplayJobOutcome::preemptions); fair-share: the victim
  // searches that preempted, and the work their victims lost (GPUs x seconds since the last
  // checkpoint; 0 with checkpoint_interval_seconds 0).
  int preemptions = 0;
  int preemption_rounds = 0;
  int64_t lost_work_gpu_seconds = 0;
};

// `trace` with every task of whole GPUs wider than `max_gpus_per_node` split into narrower tasks
// (the largest divisor of the group's GPUs that fits a node, host resources in proportion): a
// trace made for 8-GPU nodes replayed on 4-GPU nodes. RunReplay applies it.
Trace FitTasksToNodes(const Trace& trace, int max_gpus_per_node);

// kInvalidArgument for an unknown policy, an invalid cluster, an invalid queue tree or a job whose
// queue is not in it.
Result<ReplayResult> RunReplay(const Cluster& cluster, const Trace& trace,
                               const GpuCatalog& catalog, const ReplayOptions& options);

// One replay per queue policy, on up to `threads` threads, results in `queue_policies` order.
// `on_run_done` (thread-safe) follows progress.
Result<std::vector<ReplayResult>> RunReplayMatrix(const Cluster& cluster, const Trace& trace,
                                                  const GpuCatalog& catalog,
                                                  const std::vector<std::string>& queue_policies,
                                                  const ReplayOptions& options, int threads,
                                                  const std::function<void()>& on_run_done = {});

}  // namespace gpufleet::sim
