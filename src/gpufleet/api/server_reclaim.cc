// SPDX-License-Identifier: Apache-2.0
// The resume of a job idle reclaim suspended (docs/utilization.md, "Idle reclaim in the server");
// the reclaim itself is a step of the control plane's cycle (control/control_plane_steps.cc).
#include <string>

#include <fmt/format.h>

#include "gpufleet/api/routes.h"
#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/store/read_modify_write.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {

ApiResponse ApiRoutes::ResumeJob(const control::Principal& who, std::string_view name) {
  const Status not_found = NotFoundError(fmt::format("job \"{}\" not found", name));
  ApiResponse response;
  const Status committed = store::CommitWithRetries(
      options_.store, control::kCasAttempts,
      fmt::format("job \"{}\" kept changing; retry the resume", name),
      [&]() -> store::AttemptResult {
        const Result<store::StoredObject> object =
            ReadVisible(who, control::kJobsKind, name, not_found);
        if (!object.ok()) {
          response = ErrorResponse(object.status());
          return store::NoWrite();
        }
        const Json before = wire::ParseDocument(object->data);
        Json doc = before;
        const std::string state = wire::StrOr(doc, "state");
        if (control::StoredJobState(doc) != control::JobState::kSuspended) {
          response = ErrorResponse(FailedPreconditionError(fmt::format(
              "job \"{}\" is {}, not Suspended; only a suspended job resumes", name, state)));
          return store::NoWrite();
        }
        const std::string by = who.name.empty() ? control::RoleName(who.role) : who.name;
        const Result<std::string> event = control::TransitionJob(
            doc, control::JobState::kPending, fmt::format("resumed by {}", by),
            fmt::format("resumed by {}; waits to be scheduled", by));
        if (!event.ok()) {
          response = ErrorResponse(event.status());
          return store::NoWrite();
        }
        store::WriteBatch batch;
        control_->AddJobWrite(before, doc, object->version, *event, batch);
        doc["version"] = object->version + 1;
        response = JsonResponse(200, doc);
        return store::Write(std::move(batch));
      });
  return committed.ok() ? response : ErrorResponse(committed);
}

}  // namespace gpufleet::api
