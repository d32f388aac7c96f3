// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/wire/job_record.h"
#include "gpufleet/wire/json_fields.h"

// The job lifecycle's controllers: steps of the scheduling cycle that read the view's jobs and
// return the job writes they decide; the server commits them (ApiServer::CommitJobWrites, with
// the outcome hook, a compare-and-set at the version read and the events). None of them does IO.
namespace gpufleet::control {

using wire::Json;

// One change of a stored job a controller decided.
struct JobWrite {
  std::string name;     // the store key
  int64_t version = 0;  // of the document read
  Json before;
  Json after;
  std::vector<std::string> events;  // at least one
};

// Stopping runs whose tasks are gone: every task on a node in `lost` (key: node, value: why its
// tasks are surely gone) or on a node the view no longer has is marked gone, and a Stopping job
// whose every task is gone takes the state its ending asked for.
std::vector<JobWrite> EndGoneTasksOfStoppingRuns(const std::map<std::string, ViewJob>& jobs,
                                                 const std::map<std::string, ViewNode>& nodes,
                                                 const std::map<std::string, std::string>& lost);

// The runs of jobs that still want to run (Scheduled, Running) with a task on a node of
// `not_ready` (SchedulingView::not_ready_nodes) end: requeued or Failed as each job's
// onNodeFailure asks, through Stopping (their GPUs stay taken until the tasks are gone).
// `now_text`: when the stop starts.
std::vector<JobWrite> EndRunsOnNotReadyNodes(const std::map<std::string, ViewJob>& jobs,
                                             const std::set<std::string>& not_ready,
                                             const std::string& now_text);

// Preempted jobs (SchedulingView::JobsIn(kPreempted); others are left alone) back to Pending (a
// member is not told the name of another team's preemptor).
std::vector<JobWrite> RequeuePreemptedJobs(const JobEntries& preempted);

// Preemption notices (docs/job-spec.md, "Preemption notices"). The notice a Running victim gets
// instead of a stop now: its spec's checkpointGraceSeconds, cut to `max_grace`, from `now_ns`
// (the server's UsageNowNanos), with the stop's `reason`; nullopt when the job asks for no grace,
// the server allows none, or the run is not Running (no task of it has started to save anything).
std::optional<wire::NoticeRecord> PreemptionNotice(const Job& spec, JobState state,
                                                   std::chrono::seconds max_grace, int64_t now_ns,
                                                   std::string reason);
// The event of a notice given.
std::string NoticeEvent(const wire::NoticeRecord& notice);

// Whether a task reported a checkpoint from the notice's second on (checkpoints are reported in
// whole seconds).
bool SavedSinceNotice(const wire::NoticeRecord& notice, std::optional<int64_t> last_checkpoint_ns);
// Whether a notice (a run's, or a released rank's) is done waiting at `now_ns`: saved since it, or
// at its deadline.
bool NoticeOver(const wire::NoticeRecord& notice, std::optional<int64_t> last_checkpoint_ns,
                int64_t now_ns);

// Runs under a notice (of `running`, SchedulingView::JobsIn(kRunning)) that are done waiting end
// as preempted, through Stopping: once a task has reported a checkpoint from the notice's second
// on (checkpoints are reported in whole seconds), or at the notice's deadline. `now_ns` on the
// notice's clock; `now_text` the wall time the stop starts.
std::vector<JobWrite> EndNoticedRuns(const JobEntries& running, int64_t now_ns,
                                     const std::string& now_text);

// A gang runs whole or not at all: a Scheduled gang whose tasks have started on some nodes but
// not on others (an agent holds a task Waiting for a GPU a stopping task still has, or has not
// answered) for `timeout` is ended and requeued, its started tasks stopped. The time counts from
// the first task's start or the end of the last pull of an image of the gang, whichever is later
// (GangWindowStart), by stamps in the job document: a new leader goes on counting where the last
// one was.
class GangStartController {
 public:
  explicit GangStartController(Duration timeout) : timeout_(timeout) {}

  // Looks at `scheduled` (SchedulingView::JobsIn(kScheduled); others are left alone). `now_ns`
  // on the clock of the stamps (the server's UsageNowNanos); `now_text` the wall time the stop
  // starts (RFC 3339, or empty).
  std::vector<JobWrite> Step(const JobEntries& scheduled, int64_t now_ns,
                             const std::string& now_text) const;

 private:
  Duration timeout_;
};

}  // namespace gpufleet::control
