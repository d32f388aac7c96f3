// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gpufleet/core/rfc3339.h"
#include "gpufleet/core/status.h"
#include "gpufleet/store/state_store.h"
#include "gpufleet/wire/job_record.h"
#include "gpufleet/wire/job_state.h"
#include "gpufleet/wire/json_fields.h"

// A job's lifecycle (docs/architecture.md, "The job lifecycle"): its typed states and the one
// function family that writes a job document's state, reason and stop record.
//
//   Pending -> Scheduled -> Running -> Stopping -> Succeeded | Failed | Cancelled
//                                              -> Preempted -> Pending | Suspended -> Pending
//                                              -> Pending (requeued)
//
// A run that ends for any reason but its own success passes through Stopping: the job keeps its
// placements, and so its GPUs, shares and MIG slices, until every task of the run is known to be
// gone (its agent reported it ended or no longer has it, or its node's lease expired plus the stop
// grace). Only then does it take the state the ending asked for (`stopping.then`).
namespace gpufleet::control {

using wire::Json;

// The states themselves live in wire/ (job_state.h), under the stored job record.
using wire::JobState;
using wire::JobStateName;
using wire::JobStateNames;
using wire::kJobStates;
using wire::ParseJobState;

// The state of a stored job document; nullopt when it has none or an unknown one.
std::optional<JobState> StoredJobState(const Json& job);

// Scheduled, Running and Stopping: the job's placements are counted as taken.
bool HoldsResources(JobState state);
// Scheduled and Running: the run's tasks should run.
bool RunIsWanted(JobState state);
// Succeeded, Failed and Cancelled: nothing happens to the job any more.
bool IsFinished(JobState state);
// The store listing of every job that is not finished, through the store's state index
// (`store.ListWhere(kJobsKind, UnfinishedJobs())`): it costs O(unfinished jobs), not O(history).
// A job whose state the index cannot read is listed: no listing that must see every active job
// (the scheduling view, GPUs held on a node) can miss one.
store::ListFilter UnfinishedJobs();

// Whether the task of a placement (an element of a job's "placements") is known to hold nothing:
// it ended (phase Succeeded or Failed) or it was found gone while its job was Stopping.
bool PlacementGone(const Json& placement);
bool PlacementGone(const wire::PlacementRecord& placement);
// Records that the task of `placement` is gone, with why ("exited with code 0", "not on node-3",
// "node node-3 lost: ...").
void MarkPlacementGone(Json& placement, std::string_view why);

// The plain transitions: Pending -> Scheduled, Scheduled -> Running, Preempted or Suspended ->
// Pending, Pending or Suspended -> Cancelled, Preempted -> Suspended, Pending -> Failed (a job that
// can never be placed or stored). Sets state and reason;
// returns the event text
// (`event` when given, else "STATE: REASON"). kFailedPrecondition naming both states for any
// other pair (an ended run goes through EndRun).
Result<std::string> TransitionJob(Json& job, JobState to, std::string reason,
                                  std::string event = "");

// Ends the run of a job that holds resources. `then` is what the job becomes once the run's tasks
// are gone: Pending (requeued), Preempted, Suspended, Failed, Cancelled or Succeeded (every task
// exited 0). When every task is already gone the job takes `then` at once and its placements are
// dropped; otherwise it becomes Stopping with `stopping: {"then", "reason", "since"}` (`since`: RFC
// 3339 time, empty without a wall clock). A Stopping job keeps stopping and takes the new `then` (a
// cancel overrides a requeue). Returns the event text. kFailedPrecondition when the job holds no
// resources or `then` is not one of those states.
Result<std::string> EndRun(Json& job, JobState then, std::string reason, std::string since);

// Whether a placement's task has started: it runs or ran (its agent reported it so).
bool TaskStarted(const Json& placement);
// Stamps on a placement, in the server's UsageNowNanos, kept in the job document so that any
// leader reads them: when its task was first reported started ("started_ns") and when its image
// pull ended ("image_pulled_ns"). The first stamp of a run stays.
void StampTaskStarted(Json& placement, int64_t now_ns);
void StampImagePulled(Json& placement, int64_t now_ns);

// The image of the task group a placement of `job` belongs to, from the job's stored spec; ""
// for a task without one.
std::string PlacementImage(const Json& job, const Json& placement);

// Why a job's run is a gang partly started ("1 of 2 tasks started; not started: workers-1 on
// node-b (Waiting)"); nullopt when all or none of its tasks have started.
std::optional<std::string> PartlyStartedGang(const Json& job);
// Since when a partly started gang has had to start together: its first task's start or the end
// of its last image pull, whichever is later (a stamp missing counts as the run's start,
// `usage_run.start_ns`). nullopt while a task pulls its image: it is on its way.
std::optional<int64_t> GangWindowStart(const Json& job);

// A Stopping job whose every task is gone takes its `stopping.then` state, drops its placements
// and its stop record; returns the event text. nullopt while a task may still run (or the job is
// not Stopping).
std::optional<std::string> FinishStoppingIfDone(Json& job);
// Ends the current run of an active job because a node or GPU it used failed: requeued or
// Failed, as its spec's onNodeFailure asks, once its tasks are gone (its old run fenced first). A
// requeued job is expedited ("expedited": `why`): it goes back ahead of the pending jobs of its
// priority until it is placed again (Pending -> Scheduled drops the mark). Returns the event
// text.
std::string EndRunOnFailure(Json& job, const std::string& why, const std::string& since);

// Marks a job whose run a device or node failure ended for an expedited requeue (see
// EndRunOnFailure).
void MarkExpedited(Json& job, const std::string& why);

// What a Stopping job waits for, for `describe job` and GET: "3 of 8 tasks still running;
// SIGTERM sent 12s ago, SIGKILL at 30s" (the times when `now_unix_nanos` is given and the stop
// record has its `since`).
std::string DescribeStopping(const Json& job, std::optional<int64_t> now_unix_nanos = std::nullopt,
                             std::chrono::seconds grace = std::chrono::seconds(30));

}  // namespace gpufleet::control
