// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/core/random.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/policy/backfill.h"
#include "gpufleet/policy/running_job.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/scheduler/snapshot.h"

// "Why is my job pending?" answered by the scheduler itself (docs/explain.md): the dominant
// reason with its evidence, an ETA from the backfill reservation model and what-if answers, each
// one a real Schedule call on the very snapshot the scheduling cycle uses. Pure: no IO, no clock;
// the caller passes the time, the queue order, the running jobs and its quota and reservation
// rules.
namespace gpufleet::policy {

// The dominant reason a job waits, in the order it is looked for.
enum class PendingReason {
  kNone,         // it does not wait (running, finished, or it fits now)
  kNever,        // no node of the fleet could ever hold it, even empty (never_fits.h)
  kQuota,        // its queue's quota refuses it, even where GPUs are free
  kCapacity,     // it fits an empty cluster, but the GPUs it needs are taken now
  kTopology,     // GPUs are free in total, but no domain of the required level holds the gang
  kConstraints,  // no set of nodes it may use (models, memory, selector, stack) can hold it
  kHealth,       // it would fit but for unhealthy GPUs and nodes that are not Ready
  kReservation,  // it fits now, but starting it would delay the job the backfill reserved for
};
// "none", "never", "quota", "capacity", "topology", "constraints", "health", "reservation".
const char* PendingReasonName(PendingReason reason);

// Nodes counted by why they cannot take one task of the job's largest group now.
struct NodeCounts {
  int fits = 0;         // one task fits now
  int capacity = 0;     // it could, once resources there are freed
  int constraints = 0;  // never for this job: model, GPU memory, selector, size, stack label
  int health = 0;       // node not Ready, or every GPU it could use unhealthy or quarantined
};

// The domain of the job's required topology level that comes closest to holding the gang.
struct DomainEvidence {
  std::string level;
  std::string name;
  int64_t free_gpu_milli = 0;    // free now on GPUs the job may use
  int64_t needed_gpu_milli = 0;  // the whole gang's
  int64_t total_gpu_milli = 0;   // of GPUs the job may use, free or not
};

struct WhatIf {
  std::string change;  // "topology.required=block", "with 32 GPUs instead of 64", "on H200-141GB"
  bool would_start_now = false;
  std::string detail;  // where it would go, or why it still would not
  Job job;             // the changed job, as asked of the scheduler
};

struct Explanation {
  PendingReason reason = PendingReason::kNone;
  std::string message;           // one sentence a person can act on
  std::string scheduler_reason;  // the scheduler's own line for the job as it is
  NodeCounts nodes;
  int64_t needed_gpu_milli = 0;
  int64_t free_gpu_milli = 0;  // free now on GPUs the job may use, in the whole cluster
  std::optional<DomainEvidence> best_domain;
  // When the backfill plan starts the job, on the caller's time line; nullopt: unknown.
  std::optional<int64_t> eta_seconds;
  std::string eta_why;
  // Jobs ahead that no node could ever hold (never_fits.h), left out of the ETA plan: they would
  // hold a reservation forever and start nothing behind them.
  int ahead_never_start = 0;
  std::vector<WhatIf> what_ifs;
};

// Why a placement of `job` would be refused now, or nullopt: the caller's quota, or its backfill
// reservation (a job that would start now but delay the reserved head job).
using PlacementCheck = std::function<std::optional<std::string>(
    const Job& job, const std::vector<scheduler::TaskPlacement>& placements,
    const scheduler::ClusterSnapshot& snapshot)>;

struct ExplainInput {
  const Job* job = nullptr;
  // The Pending jobs before it in queue order, first first.
  std::vector<const Job*> ahead;
  // Every job that holds resources in the snapshot, with its start and estimate.
  std::vector<RunningJob> running;
  int64_t now_seconds = 0;
  PlacementCheck quota;        // empty: no quota
  PlacementCheck reservation;  // empty: no reservation held
  BackfillOptions backfill;
  // Bounds on the work of one answer, so that it stays within tens of milliseconds on thousands
  // of nodes: Schedule calls of the ETA plan, and what-ifs asked.
  int max_plan_tries = 400;
  int max_what_ifs = 8;
};

// Explains why `input.job` (REQUIRES: non-null) waits in `snapshot`, which holds every running
// job's placements (`input.running`); the snapshot is left as it was. kInvalidArgument for a job
// without task groups.
Result<Explanation> Explain(scheduler::Scheduler& scheduler, scheduler::ClusterSnapshot& snapshot,
                            const ExplainInput& input, Random& random);

}  // namespace gpufleet::policy
