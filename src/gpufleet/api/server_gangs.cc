// SPDX-License-Identifier: Apache-2.0
// Gangs start together or not at all: the cycle's check of Scheduled jobs whose tasks have started
// on some nodes but not on others (an agent that holds a task Waiting for a GPU, or that has not
// answered), ended and requeued once they have been part-started for the gang start timeout.
#include <chrono>
#include <map>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "gpufleet/api/job_lifecycle.h"
#include "gpufleet/api/json_fields.h"
#include "gpufleet/api/scheduling_view.h"
#include "gpufleet/api/server.h"

namespace gpufleet::api {

Result<bool> ApiServer::RequeuePartlyStartedGangs() {
  const MonoTime now = options_.clock.Now();
  std::map<std::string, PartialGang> still_partial;
  bool wrote = false;
  for (const auto& [name, job] : view_->jobs()) {
    if (job.state != JobState::kScheduled || job.placements.size() < 2) {
      continue;
    }
    Json doc = ParseDocument(job.data);
    const std::optional<std::string> partial = PartlyStartedGang(doc);
    if (!partial) {
      continue;
    }
    const int64_t attempt = IntOr(doc, "attempt", 0);
    const auto known = partial_gangs_.find(name);
    const MonoTime since = known != partial_gangs_.end() && known->second.attempt == attempt
                               ? known->second.since
                               : now;
    if (now - since < options_.gang_start_timeout) {
      still_partial[name] = {attempt, since};
      continue;
    }
    const Json before = doc;
    Result<std::string> event = EndRun(
        doc, JobState::kPending,
        fmt::format(
            "requeued: the gang did not start together within {}s: {}",
            std::chrono::duration_cast<std::chrono::seconds>(options_.gang_start_timeout).count(),
            *partial),
        NowText());
    if (!event.ok()) {
      continue;  // not an active run after all; the next cycle sees it as it is
    }
    store::WriteBatch batch;
    AddJobWrite(before, doc, job.version, *event, batch);
    const Result<bool> written = CommitCycleJobWrite(name, batch);
    if (!written.ok() && written.status().code() == StatusCode::kUnavailable) {
      return written.status();  // the store is down: the cycle cannot go on
    }
    if (!written.ok()) {
      // This job's own write is refused: it alone stays as it is, and is tried again.
      fmt::print(stderr, "gpufleet server: jobs/{}: {}\n", name, written.status().ToString());
      continue;
    }
    wrote = wrote || *written;
  }
  partial_gangs_ = std::move(still_partial);
  return wrote;
}

}  // namespace gpufleet::api
