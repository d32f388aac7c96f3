// SPDX-License-Identifier: Apache-2.0
// The glue of QueueController (queue_controller.h): its writes committed with the server's
// outcome hook.
#include <fmt/format.h>

#include "gpufleet/api/server.h"
#include "gpufleet/control/lifecycle_controller.h"
#include "gpufleet/control/queue_controller.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/control/tenancy.h"

namespace gpufleet::api {

void ApiServer::UpdateQueues() {
  const store::WriteBatch events = queues_.Update(*view_, cycle_count_);
  if (events.empty()) {
    return;
  }
  if (const Status status = options_.store.Commit(events); !status.ok()) {
    fmt::print(stderr, "gpufleet server: reservation event: {}\n", status.ToString());
  }
}

Result<std::optional<std::string>> ApiServer::TryPreemption(const std::string& name,
                                                            const Job& preemptor,
                                                            const std::string& queue,
                                                            Random& random) {
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<control::PreemptionPlan> plan,
                            queues_.PlanPreemption(*view_, *scheduler_, name, preemptor, queue,
                                                   cycle_count_, NowText(), random));
  if (!plan) {
    return std::optional<std::string>();
  }
  // The victims stop together, or none does.
  store::WriteBatch batch;
  for (control::JobWrite& write : plan->victim_writes) {
    AddJobWrite(write.before, write.after, write.version, write.events.front(), batch);
  }
  batch.AppendEvent(std::string(control::kJobsKind), name, plan->preemptor_event);
  if (const Status status = options_.store.Commit(batch); !status.ok()) {
    for (const control::JobWrite& write : plan->victim_writes) {
      view_->ReadJobAgain(write.name);
    }
    if (status.code() == StatusCode::kAborted || status.code() == StatusCode::kNotFound) {
      return std::optional<std::string>();
    }
    return status;
  }
  queues_.Reserve(name);
  return std::optional<std::string>(std::move(plan->pending_reason));
}

Result<bool> ApiServer::RequeuePreemptedJobs() {
  return CommitJobWrites(
      control::RequeuePreemptedJobs(view_->JobsIn(control::JobState::kPreempted)));
}

}  // namespace gpufleet::api
