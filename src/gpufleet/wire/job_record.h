// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/wire/job_state.h"
#include "gpufleet/wire/json_fields.h"

// The stored job: the one C++ type of a job document under the store's "jobs" kind, and its JSON
// codec (docs/architecture.md, "The job record"). The field names are those the server has always
// stored, so a document written by an older server loads; a member the record does not know is
// kept in `extra` and written back, so a read-modify-write loses nothing stored. Thread-compatible
// values; the functions are thread-safe.
namespace gpufleet::wire {

// One GPU (or a share or MIG slice of one) that a placement's task holds: an element of a
// placement's "assignments".
struct PlacedAssignment {
  int64_t milli = 0;
  int64_t memory_mib = 0;
  std::string mig_profile;  // empty: a whole GPU or a share
  int mig_start = -1;       // the MIG slice's first memory slice; -1 without one
  bool mig_created = false;
  std::string model;
  // A share run as an MPS client (GpuSharing::kMps, the node's default resolved); stored only
  // when true, so that documents of shares from before MPS read as time-sliced.
  bool mps = false;
  Json extra = Json::object();

  friend bool operator==(const PlacedAssignment&, const PlacedAssignment&) = default;
};

// A running job's preemption notice ("notice"; docs/job-spec.md, "Preemption notices"): the
// queue controller gave it, and its run ends as a preemption once a task reports a checkpoint
// taken after `since_ns` or at `deadline_ns`, whichever comes first (control/preemption_notice.h).
// Both times are the server's UsageNowNanos, as last_checkpoint_ns is.
struct NoticeRecord {
  std::string signal;  // "SIGUSR1"
  int64_t since_ns = 0;
  int64_t deadline_ns = 0;
  std::string reason;  // the preemption's, for the stop that follows
  Json extra = Json::object();

  friend bool operator==(const NoticeRecord&, const NoticeRecord&) = default;
};

// Where one task of a run is placed and what its agent reported of it: an element of a job's
// "placements". Its GPUs are named by UUID, with each one's NVML index beside it (old documents
// have only the indices): `gpu_uuids[i]` and `gpu_indices[i]` name the GPU of `assignments[i]`
// (control/placement_gpus.h reads them).
struct PlacementRecord {
  std::string task;  // GROUP-REPLICA
  std::string node;
  std::vector<int64_t> gpu_indices;    // "gpus"
  std::vector<std::string> gpu_uuids;  // "gpu_uuids"
  int group = 0;
  int replica = 0;
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  std::vector<PlacedAssignment> assignments;
  // What the task's agent reported: "Waiting", "Running", "Succeeded", "Failed"; empty before.
  std::string phase;
  std::optional<int64_t> exit_code;
  // Found gone while its job was Stopping (control::MarkPlacementGone), and why.
  bool gone = false;
  std::string gone_reason;
  std::optional<int64_t> started_ns;
  std::optional<int64_t> image_pulled_ns;
  std::optional<int64_t> image_pull_ms;
  std::string image_pull_progress;
  std::string image_digest;
  // Set on the highest ranks of an elastic job that shrinks ("release"; docs/job-spec.md,
  // "Elastic jobs"): the task gets the notice and stops once it is over (ReleaseNoticeOver); the
  // placement, and with it its GPUs, leaves the job once its task is known gone.
  std::optional<NoticeRecord> release;
  Json extra = Json::object();

  friend bool operator==(const PlacementRecord&, const PlacementRecord&) = default;
};

// What a Stopping job becomes once its tasks are gone ("stopping").
struct StopRecord {
  JobState then = JobState::kPending;
  std::string reason;
  std::string since;  // RFC 3339; empty without a wall clock
  Json extra = Json::object();

  friend bool operator==(const StopRecord&, const StopRecord&) = default;
};

// The usage stamp of the job's current run ("usage_run"; control/usage_ledger.h).
struct UsageRunStamp {
  int64_t attempt = 0;
  int64_t start_ns = 0;
  std::optional<int64_t> busy;
  Json extra = Json::object();

  friend bool operator==(const UsageRunStamp&, const UsageRunStamp&) = default;
};

struct JobRecord {
  // Identity.
  std::string name;
  std::string team;
  std::string queue;
  std::string submitted_by;
  std::map<std::string, std::string> labels;
  int priority = 0;
  int64_t submit_seq = 0;
  std::string created_at;  // RFC 3339; empty without a wall clock
  // The spec, parsed once; nullopt when the record was read without it (JobRecordFromJson with
  // no catalog), and then the stored spec stays in `extra` untouched.
  std::optional<Job> spec;
  // The lifecycle.
  JobState state = JobState::kPending;
  std::string reason;
  int64_t attempt = 0;  // runs started; 0 before the first
  std::vector<PlacementRecord> placements;
  std::optional<StopRecord> stopping;
  // The job (TEAM/NAME) and the team that its last stop was for, if any.
  std::optional<std::string> preempted_by;
  std::optional<std::string> preempted_by_team;
  // Expedited requeue (docs/reliability.md, "The loop"): why a run a device or node failure ended
  // goes back ahead of the pending work of its priority. Dropped when the job is placed again.
  std::optional<std::string> expedited;
  std::optional<UsageRunStamp> usage_run;
  std::vector<std::string> warnings;
  // The idle reclaim's warning to an idle interactive job ("warning"), empty without one.
  std::string idle_warning;
  // The newest checkpoint any task of the job reported (docs/job-spec.md, "Checkpoints"), in
  // Unix nanoseconds, never after the server's time when it took the report; kept across runs,
  // since the next run resumes from it. nullopt: none reported.
  std::optional<int64_t> last_checkpoint_ns;
  // Set while the running job is under a preemption notice; EndRun drops it.
  std::optional<NoticeRecord> notice;
  // An elastic job's size, the tasks of its run less those released by a shrink ("world_size");
  // nullopt for a job that is not elastic or not placed.
  std::optional<int64_t> world_size;
  // Every stored member the record does not know, written back as it was.
  Json extra = Json::object();
};

// The record of a stored job document. With `catalog` the spec is parsed (JobSpecFromJson, with
// its errors); without one it is left in `extra`, for readers that never look at
// it (the scheduling view reads every active job's state and placements each cycle). Fields
// missing take the defaults above. kInvalidArgument naming the field and its value for a member
// of the wrong type or an unknown state, e.g. `placements[1].replica: expected an integer, got
// "one"` or `state: unknown "Running2" (valid: Pending, ...)`.
Result<JobRecord> JobRecordFromJson(const Json& doc, const GpuCatalog* catalog);
// The same, taking the members out of `doc` instead of copying them (the view's hot path).
Result<JobRecord> JobRecordFromJson(Json&& doc, const GpuCatalog* catalog);
// The document back: a document the server wrote reads and writes back to the same JSON.
Json JobRecordToJson(const JobRecord& record);

// The spec of a stored job document alone, as JobRecordFromJson reads it with a catalog: for the
// readers that keep the document's JSON and need its spec (the cycle's Pending jobs, a heartbeat's
// desired tasks). kInvalidArgument as JobSpecFromJson gives it, or "spec: required field missing".
Result<Job> StoredJobSpec(const Json& doc, const GpuCatalog& catalog);

Json PlacementRecordToJson(const PlacementRecord& placement);
// The "notice" member as JobRecordToJson writes it.
Json NoticeRecordToJson(const NoticeRecord& notice);
// `path` names the placement in errors ("placements[3]").
Result<PlacementRecord> PlacementRecordFromJson(const Json& placement, const std::string& path);

}  // namespace gpufleet::wire
