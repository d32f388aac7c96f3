// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"
#include "gpufleet/store/state_store.h"
#include "gpufleet/wire/json_fields.h"

// The usage ledger (issue 17, item 5; docs/usage.md): GPU-hours allocated, busy and idle per
// team, queue, user or GPU model over a period, and the fleet's unallocated GPU-hours.
//
// Where it comes from. A run (one attempt of a job) holds GPUs from the cycle that places it until
// the job drops its placements, which is when every task of the run is known gone (a preempted or
// cancelled run is Stopping until then, and keeps counting). The placing cycle stamps the job
// document with `usage_run: {"attempt", "start_ns", "busy"}`; the write that drops the placements
// turns the stamp and the placements into one compact record in kind "usage", named
// "TEAM/NAME/ATTEMPT", in the same commit. A run still going is read from its job document, up to
// now. Retention (`--retain-finished`) deletes job documents, never usage records, so old periods
// keep their GPU-hours after their jobs are gone.
//
// Shares. Amounts are integer share units: kShareUnitsPerGpu units are one whole GPU, so a
// 250-milli share is 1750 units (a quarter) and a MIG slice is its compute slices out of 7
// ("3g.40gb": 3000 units, three sevenths), both exact. GPU-time is share units x milliseconds.
//
// Busy time. Agents report each GPU's utilization in their heartbeats. Each heartbeat credits a
// run with utilization x its share of the GPU x the time since the node's previous heartbeat
// (sample and hold, at most the node's lease): a GPU shared by several runs is measured as a
// whole, so each share is credited the GPU's utilization in proportion to its size. The credits
// are kept in memory (UsageMeter) and written into the job's `usage_run.busy` whenever the job
// document is written anyway, by the loop's periodic flush, and into the usage record when the run
// ends; so busy time costs no store write per heartbeat. A server that stops loses the credits
// since the job's last write (at most the flush interval).
namespace gpufleet::control {

using wire::Json;

inline constexpr std::string_view kUsageKind = "usage";
// The least common multiple of milli-GPUs (1000) and MIG compute slices (7).
inline constexpr int64_t kShareUnitsPerGpu = 7000;

// "TEAM/NAME/ATTEMPT", e.g. "nlp/bert/2".
std::string UsageRecordName(std::string_view job_key, int64_t attempt);

// The share units of one element of a placement's "assignments": a MIG slice's compute slices
// ("3g.40gb" -> 3000), else its milli-GPUs x 7 (a whole GPU is 1000 milli). 0 for an assignment
// with neither.
int64_t AssignmentShareUnits(const Json& assignment);

// One run's usage: who, when, what it held per GPU model, and how busy it kept it.
// Thread-compatible value type.
struct RunUsage {
  std::string job;  // TEAM/NAME
  std::string team;
  std::string queue;
  std::string user;  // who submitted it
  int64_t attempt = 0;
  int64_t start_ns = 0;  // Unix nanoseconds (the server's monotonic clock without a wall clock)
  int64_t end_ns = 0;    // for a run still going: the time it was read at
  bool open = false;     // still going
  std::map<std::string, int64_t> units_by_model;  // share units held, per GPU model
  int64_t busy_unit_ms = 0;                       // share units x milliseconds busy

  int64_t units() const;

  friend bool operator==(const RunUsage&, const RunUsage&) = default;
};

// The run a job document holds now, from its `usage_run` stamp and placements, as if it ended at
// `now_ns` (marked open), with busy time `known_busy` (UsageMeter::Busy; the stored one when
// less); nullopt when the job holds no placements or has no stamp.
std::optional<RunUsage> RunUsageOfJob(const Json& job, int64_t now_ns, int64_t known_busy = 0);

// The stamp the placing cycle writes into a job document it places: `usage_run` with the job's
// current "attempt", `start_ns` and no busy time yet.
void StampRunStart(Json& job, int64_t now_ns);

// Where a job document changes from `before` to `after`: when `before` held placements and `after`
// holds none or belongs to a new attempt, the run ended: returns its usage record, ended at
// `now_ns` with busy time `known_busy`, and drops `usage_run` from `after`. Otherwise, when
// `after` keeps the stamp, writes `known_busy` into its `usage_run.busy` if that is more, and
// returns nullopt. `known_busy` is UsageMeter::Busy of the run.
std::optional<RunUsage> NoteUsageChange(const Json& before, Json& after, int64_t now_ns,
                                        int64_t known_busy);

// The record name of the run a job document's `usage_run` stamps, when it started and the busy
// time it stores; nullopt without a stamp.
struct StampedRun {
  std::string name;
  int64_t start_ns = 0;
  int64_t busy = 0;
};
std::optional<StampedRun> StampedRunOf(const Json& job);

// The stored form of a record: {"job", "team", "queue", "user", "attempt", "start_ns", "end_ns",
// "gpus": {MODEL: units}, "busy_unit_ms"}, and the strict inverse (kInvalidArgument naming the
// field for a missing or mistyped one).
Json RunUsageToJson(const RunUsage& run);
Result<RunUsage> RunUsageFromJson(const Json& json);

// The share units x milliseconds busy that one heartbeat credits to `job` on `node`: for each of
// its placements on the node, each GPU (by the index the placement names) with a utilization in
// `utilization_pct` (index -> percent, clamped to 0..100) adds units x percent x `interval_ms` /
// 100. 0 for a negative interval.
int64_t BusyCredit(const Json& job, std::string_view node,
                   const std::map<int64_t, int>& utilization_pct, int64_t interval_ms);

// Busy credits of the runs going, as this server counted them. Each run's busy time is what its
// job document stored when this server first credited it plus the credits since; the value never
// goes backwards, so writing it is idempotent (a retried or failed write loses nothing).
// Thread-safe.
class UsageMeter {
 public:
  // Credits `busy_unit_ms` to `run`, whose job document stores `stored_busy` now.
  void Credit(const std::string& run, int64_t stored_busy, int64_t busy_unit_ms);
  // The run's busy time as known here: the larger of `stored_busy` and the meter's count.
  int64_t Busy(const std::string& run, int64_t stored_busy) const;
  // Drops an ended run.
  void Forget(const std::string& run);
  // The runs credited, with their busy time, for the periodic flush.
  std::map<std::string, int64_t> Snapshot() const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, int64_t> busy_;  // guarded by mu_
};

enum class UsageGrouping { kTeam, kQueue, kUser, kModel };
const char* UsageGroupingName(UsageGrouping by);  // "team", "queue", "user", "model"
// kInvalidArgument naming `by` and the value for anything else.
Result<UsageGrouping> ParseUsageGrouping(std::string_view text);

struct UsageQuery {
  int64_t from_ns = 0;
  int64_t to_ns = 0;  // > from_ns
  UsageGrouping by = UsageGrouping::kTeam;
  // Members: only runs of this team make rows; nullopt: every team's (admins).
  std::optional<std::string> team;
};

// Parses the query of GET /v1/usage: `from` and `to` RFC 3339 (required, to after from), `by`
// (default team). kInvalidArgument naming the field and the value.
Result<UsageQuery> ParseUsageQuery(std::optional<std::string_view> from,
                                   std::optional<std::string_view> to,
                                   std::optional<std::string_view> by);

// GPU-time of one group (share units x milliseconds), whole and per GPU model.
struct UsageTotals {
  int64_t allocated = 0;
  int64_t busy = 0;

  friend bool operator==(const UsageTotals&, const UsageTotals&) = default;
};
struct UsageRow {
  std::string key;
  UsageTotals totals;
  std::map<std::string, UsageTotals> by_model;

  friend bool operator==(const UsageRow&, const UsageRow&) = default;
};
struct UsageReport {
  UsageQuery query;
  std::vector<UsageRow> rows;  // by key
  // The fleet's GPU-time not allocated to any run (every team's) over the period: its capacity
  // minus what runs held, at least 0.
  int64_t unallocated = 0;
};

// The ledger over `runs` in [query.from_ns, query.to_ns): each run counts the part of it inside
// the period; its busy time counts in the same proportion (busy time is known per run, not per
// instant). `fleet_capacity` is the fleet's GPU-time over the period in share units x
// milliseconds (FleetCapacity). Busy is capped at allocated per run. Pure.
UsageReport ComputeUsage(const std::vector<RunUsage>& runs, int64_t fleet_capacity,
                         const UsageQuery& query);

// GPU-hours of share units x milliseconds.
double GpuHours(int64_t unit_ms);

// The JSON of GET /v1/usage: {"from", "to", "by", "rows": [{"key", "allocatedGpuHours",
// "busyGpuHours", "idleGpuHours", "models": [{"model", ...the three}]}], "unallocatedGpuHours"}.
// `unallocatedGpuHours` is null when `with_fleet` is false (members do not see the fleet).
Json UsageReportToJson(const UsageReport& report, bool with_fleet);

// The fleet's GPU-time in [query.from_ns, query.to_ns) in share units x milliseconds: every GPU
// of `node_docs` (node documents) is a whole GPU from its node's registration ("registered_ns";
// a node stored without one counts from the period's start) until `now_ns`, never before nor
// after: a fleet 90 s old has 90 s of capacity in a day's report, a period in the future none.
int64_t FleetCapacity(const std::vector<Json>& node_docs, const UsageQuery& query, int64_t now_ns);

}  // namespace gpufleet::control
