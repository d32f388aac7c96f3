// SPDX-License-Identifier: Apache-2.0
#pragma once

// `gpufleet export jobs`: the server's job log as a trace `gpufleet sim replay --format native`
// reads (docs/traces.md, "native"; docs/policies.md, "In production"), so that a site can replay
// its own jobs against other policies.

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpufleet/core/status.h"
#include "gpufleet/http/client.h"

namespace gpufleet::cli {

struct ExportArgs {
  std::string kind;    // "jobs"
  std::string output;  // a file; empty: stdout
};

// The native CSV of `jobs`: each a job document as GET /v1/jobs lists it, with its events as GET
// /v1/jobs/NAME/events answers them. A row per job that ran and finished (Succeeded, Failed, or
// Cancelled after it was placed): id TEAM/NAME, submit_time its `created_at`, duration from its
// first "scheduled on" event to its last event, its one task group's tasks and GPUs, gpuModels,
// queue, priority, kind and submitter. Left out, and counted in `skipped` by reason: jobs not
// finished, never placed, without times (a server without a wall clock), of several task groups
// or of MIG instances (the native format has one group of whole GPUs or a share).
struct NativeExport {
  std::string csv;
  int rows = 0;
  std::vector<std::pair<std::string, int>> skipped;  // reason, count; in first-seen order
};
NativeExport JobsToNativeCsv(const std::vector<std::pair<nlohmann::json, nlohmann::json>>& jobs);

// Fetches every job the token sees and writes the CSV to `args.output` (or `out`); a summary
// line goes to `err`. Returns the exit code.
int RunExport(http::ApiClient& client, const ExportArgs& args, std::ostream& out,
              std::ostream& err);

}  // namespace gpufleet::cli
