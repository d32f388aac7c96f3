// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"
#include "gpufleet/reliability/outcome.h"
#include "gpufleet/wire/json_fields.h"

// Outcome records as the server stores and serves them (docs/api.md, "Outcomes"), the body of an
// outcome reported from outside, and what an agent's GPU health reasons say about a run.
namespace gpufleet::control {

using wire::Json;

// Store kinds of the reliability side: one outcome per run, named "JOB/ATTEMPT", and one
// document per device that is or was quarantined, named "gpu:UUID" or "node:NAME".
inline constexpr std::string_view kOutcomesKind = "outcomes";
inline constexpr std::string_view kQuarantinesKind = "quarantines";

// "JOB/ATTEMPT", e.g. "bert/2".
std::string OutcomeName(std::string_view job, int64_t attempt);

// "succeeded", "cancelled", "preempted", "app-error", "infra-error", "hang" (the names of
// reliability::ExitReasonName); nullopt for anything else.
std::optional<reliability::ExitReason> ParseExitReason(std::string_view name);
// The names above joined by ", ", for error messages.
std::string ExitReasonNames();

// One run's outcome as stored: the record, why the run ended in the job's own words, and who set
// its exit reason last ("server", or the admin who reported it). Times are Unix nanoseconds (the
// server's monotonic clock when it has no wall clock).
struct StoredOutcome {
  // A task whose image its agent pulled before the run's start (the placements' image_pull_ms
  // and image_digest), for cold-start analysis.
  struct ImagePull {
    std::string task;
    std::string node;
    std::string image;
    std::string digest;  // "" when the agent did not report it
    int64_t pull_ms = 0;

    friend bool operator==(const ImagePull&, const ImagePull&) = default;
  };

  reliability::OutcomeRecord record;
  std::string cause;
  std::string reported_by = "server";
  std::vector<ImagePull> image_pulls;
};

// {"job", "attempt", "exit_reason", "start_ns", "end_ns", "duration_s", "size", "gpus", "nodes",
//  "xids": [{"gpu", "xid"}], "health_events": [{"node", "gpu", "check", "severity"}], "cause",
//  "reported_by", "image_pulls": [{"task", "node", "image", "digest", "pull_ms"}]}.
Json OutcomeToJson(const StoredOutcome& outcome);
// The inverse, strict: kInvalidArgument naming the field and the value for a missing or mistyped
// field. `duration_s` and `size` are derived and ignored; `image_pulls` may be absent (records
// written before it existed).
Result<StoredOutcome> OutcomeFromJson(const Json& json);

// The body of POST /v1/outcomes: a training framework or an operator says how a run really ended
// (a hang the task's exit code hid, say) and adds evidence the agents did not see.
struct OutcomeReport {
  std::string job;
  int64_t attempt = 0;
  reliability::ExitReason exit_reason = reliability::ExitReason::kSucceeded;
  std::vector<reliability::XidEvent> xids;
  std::vector<reliability::HealthEvent> health_events;
  std::string note;  // optional, for the job's event log
};

// Strict reader: a JSON object with "job" (string), "attempt" (integer >= 1), "exit_reason" (a
// name above), optional "xids" [{"gpu", "xid"}], "health_events" [{"node", "gpu"?, "check",
// "severity": "warn"|"fail"}] and "note" (at most 512 bytes); any other field is an error.
// kInvalidArgument naming the field and the value, e.g. `xids[1].xid: "79" (must be an integer)`.
Result<OutcomeReport> ParseOutcomeReport(std::string_view body);

// What the health reasons an agent reported for one GPU (the node document's `reasons`) say:
// the XIDs seen since the GPU's last reset with their counts ("XID 79 (x2): ..."), and the other
// findings as health checks. A check fails when the agent drains the GPU for it ("drain now",
// "drain after the running job") and warns otherwise.
struct GpuHealthReading {
  std::map<int, int> xids;  // XID -> times seen since the GPU's last reset
  struct Check {
    std::string name;  // "gpu-lost", "ecc", "row-remap", "thermal", "clocks" or "gpu-health"
    reliability::HealthSeverity severity = reliability::HealthSeverity::kWarn;
  };
  std::vector<Check> checks;
};
GpuHealthReading ReadHealthReasons(const Json& reasons);

// How a run ended, from the job document after the change that ended it: Succeeded, Cancelled
// and Preempted by their state; back to Pending with a reason that starts "preempted" is
// preempted too; Failed by a task ("task ... failed") is the application's error unless
// `hardware_evidence` (a blaming XID or a failing check on its GPUs during the run), which makes
// it an infrastructure error; anything else (requeued or failed because a node went NotReady or a
// GPU had to be drained) is an infrastructure error.
reliability::ExitReason InferExitReason(const Json& after, bool hardware_evidence);

}  // namespace gpufleet::control
