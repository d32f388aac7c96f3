// SPDX-License-Identifier: Apache-2.0
// GET /v1/jobs/NAME/logs (docs/agent.md, "Task logs"): the tails of a job's task logs that the
// agents shipped (ControlPlane::RecordTaskLog), with the visibility of GET /v1/jobs/NAME: a
// member reads its own team's jobs only, another team's job is "not found".
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/api/routes.h"
#include "gpufleet/control/control_plane.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/rfc3339.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {
namespace {

// A task as the agent protocol names it, GROUP-REPLICA ("workers-3"): letters, digits, '.',
// '_' and '-', so that the name given cannot reach another job's records.
bool IsTaskName(std::string_view name) {
  return !name.empty() && name.size() <= kMaxTaskIdLength &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
         });
}

}  // namespace

ApiResponse ApiRoutes::JobLogs(const control::Principal& who, std::string_view name,
                               const ApiRequest& request) {
  const Result<store::StoredObject> object = ReadVisible(
      who, control::kJobsKind, name, NotFoundError(fmt::format("job \"{}\" not found", name)));
  if (!object.ok()) {
    return ErrorResponse(object.status());
  }
  std::optional<std::string> task;
  if (const auto it = request.query.find("task"); it != request.query.end()) {
    if (!IsTaskName(it->second)) {
      return ErrorResponse(InvalidArgumentError(fmt::format(
          "task: \"{}\" is not a task name (GROUP-REPLICA of letters, digits, '.', '_' and '-', "
          "e.g. main-0)",
          it->second.substr(0, 100))));
    }
    task = it->second;
  }
  Result<std::vector<control::ControlPlane::TaskRunLog>> runs =
      control_->TaskRunLogs(std::string(name));
  if (!runs.ok()) {
    return ErrorResponse(runs.status());
  }
  const Json doc = wire::ParseDocument(object->data);
  Json items = Json::array();
  std::vector<std::string> tasks;
  for (const control::ControlPlane::TaskRunLog& run : *runs) {
    tasks.push_back(run.task);
    if (task && run.task != *task) {
      continue;
    }
    Json item = {{"task", run.task}, {"attempt", run.attempt}, {"node", run.node}};
    if (run.log) {
      const wire::TaskLogReport& log = run.log->report;
      item["text"] = log.text;
      item["size"] = log.size;
      // Where the tail starts in the whole log: what came before it is on the node only.
      item["from"] = log.size - static_cast<int64_t>(log.text.size());
      item["final"] = log.final;
      item["received_at"] = FormatRfc3339(run.log->received_ns);
    } else {
      item["text"] = nullptr;
      item["why"] = "no log received yet: the agent ships it after a heartbeat once the log grows";
    }
    items.push_back(std::move(item));
  }
  if (task && items.empty()) {
    std::sort(tasks.begin(), tasks.end());
    tasks.erase(std::unique(tasks.begin(), tasks.end()), tasks.end());
    return ErrorResponse(NotFoundError(
        fmt::format("task: job \"{}\" has no run of task \"{}\"{}", control::NameOfKey(name), *task,
                    tasks.empty() ? std::string(" (it has no runs yet)")
                                  : fmt::format(" (its tasks: {})", fmt::join(tasks, ", ")))));
  }
  Json out = {{"job", std::string(control::NameOfKey(name))},
              {"state", wire::StrOr(doc, "state")},
              {"items", std::move(items)}};
  if (runs->empty()) {
    out["why"] = "the job has no runs yet: no task of it has started";
  }
  return JsonResponse(200, out);
}

}  // namespace gpufleet::api
