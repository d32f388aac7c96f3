// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/usage_ledger.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/tenancy.h"

namespace gpufleet::control {
namespace {

constexpr int64_t kNanosPerMilli = 1'000'000;
constexpr int64_t kMilliPerGpu = 1000;

// The job's `usage_run` stamp when it is the stamp of the job's current attempt; null otherwise.
const Json* StampOf(const Json& job) {
  if (!job.is_object()) {
    return nullptr;
  }
  const auto it = job.find("usage_run");
  if (it == job.end() || !it->is_object() ||
      wire::IntOr(*it, "attempt", -1) != wire::IntOr(job, "attempt", 0)) {
    return nullptr;
  }
  return &*it;
}

bool HoldsPlacements(const Json& job) {
  return !wire::ArrayOr(job, "placements").empty();
}

// GCC's and Clang's 128-bit integer (-Wpedantic asks for the marker).
__extension__ typedef __int128 Wide;

// a * b / c without overflow of the product. REQUIRES: c > 0.
int64_t MulDiv(int64_t a, int64_t b, int64_t c) {
  return static_cast<int64_t>(static_cast<Wide>(a) * b / c);
}

double Hours(int64_t unit_ms) {
  // Six decimals: a GPU-second is 0.000278 h; more digits would only show rounding noise.
  return std::round(GpuHours(unit_ms) * 1e6) / 1e6;
}

Json TotalsJson(const UsageTotals& totals) {
  return {{"allocatedGpuHours", Hours(totals.allocated)},
          {"busyGpuHours", Hours(totals.busy)},
          {"idleGpuHours", Hours(totals.allocated - totals.busy)}};
}

Status FieldError(std::string_view field, const Json& value, std::string_view want) {
  return InvalidArgumentError(fmt::format("usage record: {}: {} (must be {})", field,
                                          value.is_null() ? "missing" : value.dump(), want));
}

Result<int64_t> IntField(const Json& json, std::string_view field) {
  const auto it = json.find(field);
  if (it == json.end() || !it->is_number_integer()) {
    return FieldError(field, it == json.end() ? Json() : *it, "an integer");
  }
  return it->get<int64_t>();
}

Result<std::string> StrField(const Json& json, std::string_view field) {
  const auto it = json.find(field);
  if (it == json.end() || !it->is_string()) {
    return FieldError(field, it == json.end() ? Json() : *it, "a string");
  }
  return it->get<std::string>();
}

Result<int64_t> ParseTime(std::string_view field, std::optional<std::string_view> text) {
  if (!text) {
    return InvalidArgumentError(
        fmt::format("{}: missing (an RFC 3339 time in UTC, e.g. 2026-12-01T00:00:00Z)", field));
  }
  const Result<int64_t> nanos = ParseRfc3339(*text);
  // The query is in UTC to the second: round-tripping refuses a fraction or an offset.
  if (!nanos.ok() || FormatRfc3339(*nanos) != *text) {
    return InvalidArgumentError(fmt::format(
        "{}: \"{}\" is not an RFC 3339 time in UTC to the second (e.g. 2026-12-01T00:00:00Z)",
        field, *text));
  }
  return *nanos;
}

}  // namespace

std::string UsageRecordName(std::string_view job_key, int64_t attempt) {
  return fmt::format("{}/{}", job_key, attempt);
}

int64_t AssignmentShareUnits(const Json& assignment) {
  const std::string profile = wire::StrOr(assignment, "mig_profile");
  if (!profile.empty()) {
    // "3g.40gb", "1g.10gb+me": the compute slices lead the name.
    int slices = 0;
    size_t i = 0;
    while (i < profile.size() && profile[i] >= '0' && profile[i] <= '9' && slices <= 7) {
      slices = slices * 10 + (profile[i] - '0');
      ++i;
    }
    if (i == 0 || i >= profile.size() || profile[i] != 'g' || slices < 1 || slices > 7) {
      return 0;
    }
    return slices * (kShareUnitsPerGpu / 7);
  }
  const int64_t milli = std::clamp<int64_t>(wire::IntOr(assignment, "milli", 0), 0, kMilliPerGpu);
  return milli * (kShareUnitsPerGpu / kMilliPerGpu);
}

int64_t RunUsage::units() const {
  int64_t total = 0;
  for (const auto& [model, units] : units_by_model) {
    total += units;
  }
  return total;
}

std::optional<RunUsage> RunUsageOfJob(const Json& job, int64_t now_ns, int64_t known_busy) {
  const Json* stamp = StampOf(job);
  if (stamp == nullptr || !HoldsPlacements(job)) {
    return std::nullopt;
  }
  RunUsage run;
  run.job = TeamScopedKeyOf(job);
  run.team = wire::StrOr(job, "team");
  run.queue = wire::StrOr(job, "queue");
  run.user = wire::StrOr(job, "submitted_by");
  run.attempt = wire::IntOr(job, "attempt", 0);
  run.start_ns = wire::IntOr(*stamp, "start_ns", now_ns);
  run.end_ns = std::max(run.start_ns, now_ns);
  run.open = true;
  run.busy_unit_ms = std::max(wire::IntOr(*stamp, "busy", 0), known_busy);
  for (const Json& placement : wire::ArrayOr(job, "placements")) {
    for (const Json& assignment : wire::ArrayOr(placement, "assignments")) {
      const int64_t units = AssignmentShareUnits(assignment);
      if (units > 0) {
        run.units_by_model[wire::StrOr(assignment, "model", "unknown")] += units;
      }
    }
  }
  return run;
}

void StampRunStart(Json& job, int64_t now_ns) {
  job["usage_run"] = {{"attempt", wire::IntOr(job, "attempt", 0)}, {"start_ns", now_ns}};
}

std::optional<StampedRun> StampedRunOf(const Json& job) {
  const Json* stamp = StampOf(job);
  if (stamp == nullptr) {
    return std::nullopt;
  }
  return StampedRun{UsageRecordName(TeamScopedKeyOf(job), wire::IntOr(job, "attempt", 0)),
                    wire::IntOr(*stamp, "start_ns", 0), wire::IntOr(*stamp, "busy", 0)};
}

std::optional<RunUsage> NoteUsageChange(const Json& before, Json& after, int64_t now_ns,
                                        int64_t known_busy) {
  const bool ran = StampOf(before) != nullptr && HoldsPlacements(before);
  const int64_t attempt = wire::IntOr(before, "attempt", 0);
  const bool ended =
      ran && (!HoldsPlacements(after) || wire::IntOr(after, "attempt", 0) != attempt);
  if (ended) {
    std::optional<RunUsage> run = RunUsageOfJob(before, now_ns, known_busy);
    if (run) {
      run->open = false;
    }
    // The ended run's stamp goes (a new attempt's, if any, stays).
    if (after.is_object() && after.contains("usage_run") &&
        wire::IntOr(after["usage_run"], "attempt", -1) == attempt) {
      after.erase("usage_run");
    }
    return run;
  }
  if (after.is_object() && after.contains("usage_run") && StampOf(after) != nullptr) {
    Json& stamp = after["usage_run"];
    if (known_busy > wire::IntOr(stamp, "busy", 0)) {
      stamp["busy"] = known_busy;
    }
  }
  return std::nullopt;
}

Json RunUsageToJson(const RunUsage& run) {
  Json gpus = Json::object();
  for (const auto& [model, units] : run.units_by_model) {
    gpus[model] = units;
  }
  return {{"job", run.job},       {"team", run.team},        {"queue", run.queue},
          {"user", run.user},     {"attempt", run.attempt},  {"start_ns", run.start_ns},
          {"end_ns", run.end_ns}, {"gpus", std::move(gpus)}, {"busy_unit_ms", run.busy_unit_ms}};
}

Result<RunUsage> RunUsageFromJson(const Json& json) {
  if (!json.is_object()) {
    return InvalidArgumentError("usage record: not a JSON object");
  }
  RunUsage run;
  GPUFLEET_ASSIGN_OR_RETURN(run.job, StrField(json, "job"));
  GPUFLEET_ASSIGN_OR_RETURN(run.team, StrField(json, "team"));
  GPUFLEET_ASSIGN_OR_RETURN(run.queue, StrField(json, "queue"));
  GPUFLEET_ASSIGN_OR_RETURN(run.user, StrField(json, "user"));
  GPUFLEET_ASSIGN_OR_RETURN(run.attempt, IntField(json, "attempt"));
  GPUFLEET_ASSIGN_OR_RETURN(run.start_ns, IntField(json, "start_ns"));
  GPUFLEET_ASSIGN_OR_RETURN(run.end_ns, IntField(json, "end_ns"));
  GPUFLEET_ASSIGN_OR_RETURN(run.busy_unit_ms, IntField(json, "busy_unit_ms"));
  if (run.end_ns < run.start_ns) {
    return FieldError("end_ns", json["end_ns"], "at or after start_ns");
  }
  const auto gpus = json.find("gpus");
  if (gpus == json.end() || !gpus->is_object()) {
    return FieldError("gpus", gpus == json.end() ? Json() : *gpus, "an object MODEL: units");
  }
  for (const auto& [model, units] : gpus->items()) {
    if (!units.is_number_integer() || units.get<int64_t>() < 0) {
      return FieldError(fmt::format("gpus.{}", model), units, "a non-negative integer");
    }
    run.units_by_model[model] = units.get<int64_t>();
  }
  return run;
}

int64_t BusyCredit(const Json& job, std::string_view node,
                   const std::map<int64_t, int>& utilization_pct, int64_t interval_ms) {
  if (interval_ms <= 0) {
    return 0;
  }
  int64_t credit = 0;
  for (const Json& placement : wire::ArrayOr(job, "placements")) {
    if (wire::StrOr(placement, "node") != node) {
      continue;
    }
    const Json& assignments = wire::ArrayOr(placement, "assignments");
    const Json& indices = wire::ArrayOr(placement, "gpus");
    for (size_t i = 0; i < assignments.size() && i < indices.size(); ++i) {
      if (!indices[i].is_number_integer()) {
        continue;
      }
      const auto util = utilization_pct.find(indices[i].get<int64_t>());
      if (util == utilization_pct.end()) {
        continue;
      }
      const int64_t pct = std::clamp(util->second, 0, 100);
      credit += MulDiv(AssignmentShareUnits(assignments[i]) * pct, interval_ms, 100);
    }
  }
  return credit;
}

void UsageMeter::Credit(const std::string& run, int64_t stored_busy, int64_t busy_unit_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = busy_.try_emplace(run, stored_busy);
  it->second = std::max(it->second, stored_busy) + std::max<int64_t>(0, busy_unit_ms);
}

int64_t UsageMeter::Busy(const std::string& run, int64_t stored_busy) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = busy_.find(run);
  return it == busy_.end() ? stored_busy : std::max(stored_busy, it->second);
}

void UsageMeter::Forget(const std::string& run) {
  std::lock_guard<std::mutex> lock(mu_);
  busy_.erase(run);
}

std::map<std::string, int64_t> UsageMeter::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

size_t UsageMeter::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_.size();
}

const char* UsageGroupingName(UsageGrouping by) {
  switch (by) {
    case UsageGrouping::kTeam:
      return "team";
    case UsageGrouping::kQueue:
      return "queue";
    case UsageGrouping::kUser:
      return "user";
    case UsageGrouping::kModel:
      return "model";
  }
  return "team";
}

Result<UsageGrouping> ParseUsageGrouping(std::string_view text) {
  for (const UsageGrouping by :
       {UsageGrouping::kTeam, UsageGrouping::kQueue, UsageGrouping::kUser, UsageGrouping::kModel}) {
    if (text == UsageGroupingName(by)) {
      return by;
    }
  }
  return InvalidArgumentError(
      fmt::format("by: \"{}\" (expected team, queue, user or model)", text));
}

Result<UsageQuery> ParseUsageQuery(std::optional<std::string_view> from,
                                   std::optional<std::string_view> to,
                                   std::optional<std::string_view> by) {
  UsageQuery query;
  GPUFLEET_ASSIGN_OR_RETURN(query.from_ns, ParseTime("from", from));
  GPUFLEET_ASSIGN_OR_RETURN(query.to_ns, ParseTime("to", to));
  if (query.to_ns <= query.from_ns) {
    return InvalidArgumentError(fmt::format("to: \"{}\" is not after from \"{}\"", *to, *from));
  }
  if (by) {
    GPUFLEET_ASSIGN_OR_RETURN(query.by, ParseUsageGrouping(*by));
  }
  return query;
}

UsageReport ComputeUsage(const std::vector<RunUsage>& runs, int64_t fleet_capacity,
                         const UsageQuery& query) {
  UsageReport report;
  report.query = query;
  std::map<std::string, UsageRow> rows;
  int64_t fleet_allocated = 0;
  for (const RunUsage& run : runs) {
    const int64_t start = std::max(run.start_ns, query.from_ns);
    const int64_t end = std::min(run.end_ns, query.to_ns);
    const int64_t inside_ms = (end - start) / kNanosPerMilli;
    const int64_t run_ms = (run.end_ns - run.start_ns) / kNanosPerMilli;
    const int64_t units = run.units();
    if (inside_ms <= 0 || units <= 0) {
      continue;
    }
    // Busy time is known per run: the part inside the period is in proportion to the time.
    const int64_t busy_run = std::min(run.busy_unit_ms, MulDiv(units, run_ms, 1));
    const int64_t busy_inside = MulDiv(busy_run, inside_ms, run_ms);
    const bool visible = !query.team || run.team == *query.team;
    for (const auto& [model, model_units] : run.units_by_model) {
      const UsageTotals part{MulDiv(model_units, inside_ms, 1),
                             MulDiv(busy_inside, model_units, units)};
      fleet_allocated += part.allocated;
      if (!visible) {
        continue;
      }
      std::string key;
      switch (query.by) {
        case UsageGrouping::kTeam:
          key = run.team;
          break;
        case UsageGrouping::kQueue:
          key = run.queue;
          break;
        case UsageGrouping::kUser:
          key = run.user;
          break;
        case UsageGrouping::kModel:
          key = model;
          break;
      }
      UsageRow& row = rows[key];
      row.key = key;
      row.totals.allocated += part.allocated;
      row.totals.busy += part.busy;
      row.by_model[model].allocated += part.allocated;
      row.by_model[model].busy += part.busy;
    }
  }
  for (auto& [key, row] : rows) {
    report.rows.push_back(std::move(row));
  }
  report.unallocated = std::max<int64_t>(0, fleet_capacity - fleet_allocated);
  return report;
}

double GpuHours(int64_t unit_ms) {
  return static_cast<double>(unit_ms) / static_cast<double>(kShareUnitsPerGpu) / 3'600'000.0;
}

Json UsageReportToJson(const UsageReport& report, bool with_fleet) {
  Json rows = Json::array();
  for (const UsageRow& row : report.rows) {
    Json out = TotalsJson(row.totals);
    out["key"] = row.key;
    Json models = Json::array();
    for (const auto& [model, totals] : row.by_model) {
      Json one = TotalsJson(totals);
      one["model"] = model;
      models.push_back(std::move(one));
    }
    out["models"] = std::move(models);
    rows.push_back(std::move(out));
  }
  return {{"from", FormatRfc3339(report.query.from_ns)},
          {"to", FormatRfc3339(report.query.to_ns)},
          {"by", UsageGroupingName(report.query.by)},
          {"rows", std::move(rows)},
          {"unallocatedGpuHours", with_fleet ? Json(Hours(report.unallocated)) : Json()}};
}

int64_t FleetCapacity(const std::vector<Json>& node_docs, const UsageQuery& query, int64_t now_ns) {
  const int64_t end = std::min(query.to_ns, now_ns);
  int64_t capacity = 0;
  for (const Json& doc : node_docs) {
    const int64_t start = std::max(query.from_ns, wire::IntOr(doc, "registered_ns", query.from_ns));
    if (start >= end) {
      continue;
    }
    const auto gpus = static_cast<int64_t>(wire::ArrayOr(doc, "gpus").size());
    capacity += gpus * kShareUnitsPerGpu * ((end - start) / kNanosPerMilli);
  }
  return capacity;
}

}  // namespace gpufleet::control
