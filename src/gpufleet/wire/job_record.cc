// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/job_record.h"

#include <limits>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/wire/job_spec.h"

namespace gpufleet::wire {
namespace {

// Takes the known members out of a copy of one stored object: what is left is the object's
// `extra`. A member missing (or null) leaves the default; one of the wrong type is an error
// naming its path and value.
class MemberTaker {
 public:
  MemberTaker(Json object, std::string path) : rest_(std::move(object)), path_(std::move(path)) {}

  static Result<MemberTaker> Open(Json object, std::string path) {
    if (!object.is_object()) {
      return InvalidArgumentError(fmt::format("{}: expected an object, got {}",
                                              path.empty() ? "job" : path, ShownValue(object)));
    }
    return MemberTaker(std::move(object), std::move(path));
  }

  std::string Path(std::string_view key) const {
    return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
  }

  // The member `key`, taken out of the rest; nullopt when missing or null.
  std::optional<Json> Take(std::string_view key) {
    const auto it = rest_.find(key);
    if (it == rest_.end()) {
      return std::nullopt;
    }
    std::optional<Json> value;
    if (!it->is_null()) {
      value = std::move(*it);
    }
    rest_.erase(it);
    return value;
  }

  Status String(std::string_view key, std::string& out) {
    std::optional<std::string> value;
    GPUFLEET_RETURN_IF_ERROR(String(key, value));
    if (value) {
      out = std::move(*value);
    }
    return Status::Ok();
  }
  Status String(std::string_view key, std::optional<std::string>& out) {
    const std::optional<Json> value = Take(key);
    if (!value) {
      return Status::Ok();
    }
    if (!value->is_string()) {
      return Mistyped(key, "a string", *value);
    }
    out = value->get<std::string>();
    return Status::Ok();
  }
  template <typename Int>
  Status Integer(std::string_view key, Int& out) {
    std::optional<int64_t> value;
    GPUFLEET_RETURN_IF_ERROR(Integer(key, value));
    if (value) {
      if (*value < std::numeric_limits<Int>::min() || *value > std::numeric_limits<Int>::max()) {
        return InvalidArgumentError(fmt::format("{}: {} is out of range", Path(key), *value));
      }
      out = static_cast<Int>(*value);
    }
    return Status::Ok();
  }
  Status Integer(std::string_view key, std::optional<int64_t>& out) {
    const std::optional<Json> value = Take(key);
    if (!value) {
      return Status::Ok();
    }
    if (!value->is_number_integer() ||
        (value->is_number_unsigned() &&
         value->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      return Mistyped(key, "an integer", *value);
    }
    out = value->get<int64_t>();
    return Status::Ok();
  }
  Status Bool(std::string_view key, bool& out) {
    const std::optional<Json> value = Take(key);
    if (!value) {
      return Status::Ok();
    }
    if (!value->is_boolean()) {
      return Mistyped(key, "a boolean", *value);
    }
    out = value->get<bool>();
    return Status::Ok();
  }
  Status State(std::string_view key, JobState& out) {
    std::optional<std::string> name;
    GPUFLEET_RETURN_IF_ERROR(String(key, name));
    if (!name) {
      return Status::Ok();
    }
    const std::optional<JobState> state = ParseJobState(*name);
    if (!state) {
      return InvalidArgumentError(
          fmt::format("{}: unknown \"{}\" (valid: {})", Path(key), *name, JobStateNames()));
    }
    out = *state;
    return Status::Ok();
  }
  // An array, each element read by `read(element, path)`.
  template <typename T, typename Read>
  Status Array(std::string_view key, std::vector<T>& out, Read read) {
    const std::optional<Json> value = Take(key);
    if (!value) {
      return Status::Ok();
    }
    if (!value->is_array()) {
      return Mistyped(key, "an array", *value);
    }
    out.clear();
    for (size_t i = 0; i < value->size(); ++i) {
      GPUFLEET_ASSIGN_OR_RETURN(T element, read((*value)[i], fmt::format("{}[{}]", Path(key), i)));
      out.push_back(std::move(element));
    }
    return Status::Ok();
  }
  Status StringMap(std::string_view key, std::map<std::string, std::string>& out) {
    const std::optional<Json> value = Take(key);
    if (!value) {
      return Status::Ok();
    }
    if (!value->is_object()) {
      return Mistyped(key, "an object", *value);
    }
    for (const auto& [name, text] : value->items()) {
      if (!text.is_string()) {
        return InvalidArgumentError(
            fmt::format("{}.{}: expected a string, got {}", Path(key), name, ShownValue(text)));
      }
      out[name] = text.get<std::string>();
    }
    return Status::Ok();
  }

  // What was not taken.
  Json TakeRest() && { return std::move(rest_); }

 private:
  Status Mistyped(std::string_view key, std::string_view want, const Json& value) const {
    return InvalidArgumentError(
        fmt::format("{}: expected {}, got {}", Path(key), want, ShownValue(value)));
  }

  Json rest_;
  std::string path_;
};

Result<int64_t> IntegerElement(const Json& value, const std::string& path) {
  if (!value.is_number_integer()) {
    return InvalidArgumentError(
        fmt::format("{}: expected an integer, got {}", path, ShownValue(value)));
  }
  return value.get<int64_t>();
}

Result<std::string> StringElement(const Json& value, const std::string& path) {
  if (!value.is_string()) {
    return InvalidArgumentError(
        fmt::format("{}: expected a string, got {}", path, ShownValue(value)));
  }
  return value.get<std::string>();
}

Result<PlacedAssignment> AssignmentFromJson(Json object, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(MemberTaker taker, MemberTaker::Open(std::move(object), path));
  PlacedAssignment out;
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("milli", out.milli));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("memory_mib", out.memory_mib));
  GPUFLEET_RETURN_IF_ERROR(taker.String("mig_profile", out.mig_profile));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("mig_start", out.mig_start));
  GPUFLEET_RETURN_IF_ERROR(taker.Bool("mig_created", out.mig_created));
  GPUFLEET_RETURN_IF_ERROR(taker.String("model", out.model));
  GPUFLEET_RETURN_IF_ERROR(taker.Bool("mps", out.mps));
  out.extra = std::move(taker).TakeRest();
  return out;
}

Json AssignmentToJson(const PlacedAssignment& assignment) {
  Json out = assignment.extra;
  out["milli"] = assignment.milli;
  out["memory_mib"] = assignment.memory_mib;
  out["mig_profile"] = assignment.mig_profile;
  out["mig_start"] = assignment.mig_start;
  out["mig_created"] = assignment.mig_created;
  out["model"] = assignment.model;
  if (assignment.mps) {
    out["mps"] = true;
  }
  return out;
}

Result<StopRecord> StopRecordFromJson(Json object, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(MemberTaker taker, MemberTaker::Open(std::move(object), path));
  StopRecord out;
  GPUFLEET_RETURN_IF_ERROR(taker.State("then", out.then));
  GPUFLEET_RETURN_IF_ERROR(taker.String("reason", out.reason));
  GPUFLEET_RETURN_IF_ERROR(taker.String("since", out.since));
  out.extra = std::move(taker).TakeRest();
  return out;
}

Result<NoticeRecord> NoticeRecordFromJson(Json object, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(MemberTaker taker, MemberTaker::Open(std::move(object), path));
  NoticeRecord out;
  GPUFLEET_RETURN_IF_ERROR(taker.String("signal", out.signal));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("since_ns", out.since_ns));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("deadline_ns", out.deadline_ns));
  GPUFLEET_RETURN_IF_ERROR(taker.String("reason", out.reason));
  out.extra = std::move(taker).TakeRest();
  return out;
}

Result<UsageRunStamp> UsageRunFromJson(Json object, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(MemberTaker taker, MemberTaker::Open(std::move(object), path));
  UsageRunStamp out;
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("attempt", out.attempt));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("start_ns", out.start_ns));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("busy", out.busy));
  out.extra = std::move(taker).TakeRest();
  return out;
}

// Sets `key` only when the record has it, so that a document without it stays without it.
void SetIfAny(Json& out, std::string_view key, const std::string& value) {
  if (!value.empty()) {
    out[std::string(key)] = value;
  }
}
void SetIfAny(Json& out, std::string_view key, const std::optional<int64_t>& value) {
  if (value) {
    out[std::string(key)] = *value;
  }
}

// The stored "spec" member; its errors name the spec's own field paths.
Result<Job> SpecFromMember(const Json* spec, const GpuCatalog& catalog) {
  if (spec == nullptr) {
    return InvalidArgumentError("spec: required field missing");
  }
  return JobSpecFromJson(*spec, catalog);
}

Result<PlacementRecord> PlacementFromJson(Json placement, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(MemberTaker taker, MemberTaker::Open(std::move(placement), path));
  PlacementRecord out;
  GPUFLEET_RETURN_IF_ERROR(taker.String("task", out.task));
  GPUFLEET_RETURN_IF_ERROR(taker.String("node", out.node));
  GPUFLEET_RETURN_IF_ERROR(taker.Array("gpus", out.gpu_indices, IntegerElement));
  GPUFLEET_RETURN_IF_ERROR(taker.Array("gpu_uuids", out.gpu_uuids, StringElement));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("group", out.group));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("replica", out.replica));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("cpu_milli", out.cpu_milli));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("memory_mib", out.memory_mib));
  GPUFLEET_RETURN_IF_ERROR(taker.Array("assignments", out.assignments, AssignmentFromJson));
  GPUFLEET_RETURN_IF_ERROR(taker.String("phase", out.phase));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("exit_code", out.exit_code));
  GPUFLEET_RETURN_IF_ERROR(taker.Bool("gone", out.gone));
  GPUFLEET_RETURN_IF_ERROR(taker.String("gone_reason", out.gone_reason));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("started_ns", out.started_ns));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("image_pulled_ns", out.image_pulled_ns));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("image_pull_ms", out.image_pull_ms));
  GPUFLEET_RETURN_IF_ERROR(taker.String("image_pull_progress", out.image_pull_progress));
  GPUFLEET_RETURN_IF_ERROR(taker.String("image_digest", out.image_digest));
  if (const std::optional<Json> release = taker.Take("release")) {
    GPUFLEET_ASSIGN_OR_RETURN(out.release, NoticeRecordFromJson(*release, path + ".release"));
  }
  out.extra = std::move(taker).TakeRest();
  return out;
}

}  // namespace

Result<Job> StoredJobSpec(const Json& doc, const GpuCatalog& catalog) {
  const auto it = doc.is_object() ? doc.find("spec") : doc.end();
  return SpecFromMember(it == doc.end() || it->is_null() ? nullptr : &*it, catalog);
}

Result<PlacementRecord> PlacementRecordFromJson(const Json& placement, const std::string& path) {
  return PlacementFromJson(placement, path);
}

Json NoticeRecordToJson(const NoticeRecord& notice) {
  Json out = notice.extra;
  out["signal"] = notice.signal;
  out["since_ns"] = notice.since_ns;
  out["deadline_ns"] = notice.deadline_ns;
  out["reason"] = notice.reason;
  return out;
}

Json PlacementRecordToJson(const PlacementRecord& placement) {
  Json out = placement.extra;
  out["task"] = placement.task;
  out["node"] = placement.node;
  out["gpus"] = placement.gpu_indices;
  out["gpu_uuids"] = placement.gpu_uuids;
  out["group"] = placement.group;
  out["replica"] = placement.replica;
  out["cpu_milli"] = placement.cpu_milli;
  out["memory_mib"] = placement.memory_mib;
  Json assignments = Json::array();
  for (const PlacedAssignment& assignment : placement.assignments) {
    assignments.push_back(AssignmentToJson(assignment));
  }
  out["assignments"] = std::move(assignments);
  SetIfAny(out, "phase", placement.phase);
  SetIfAny(out, "exit_code", placement.exit_code);
  if (placement.gone) {
    out["gone"] = true;
  }
  SetIfAny(out, "gone_reason", placement.gone_reason);
  SetIfAny(out, "started_ns", placement.started_ns);
  SetIfAny(out, "image_pulled_ns", placement.image_pulled_ns);
  SetIfAny(out, "image_pull_ms", placement.image_pull_ms);
  SetIfAny(out, "image_pull_progress", placement.image_pull_progress);
  SetIfAny(out, "image_digest", placement.image_digest);
  if (placement.release) {
    out["release"] = NoticeRecordToJson(*placement.release);
  }
  return out;
}

Result<JobRecord> JobRecordFromJson(const Json& doc, const GpuCatalog* catalog) {
  return JobRecordFromJson(Json(doc), catalog);
}

Result<JobRecord> JobRecordFromJson(Json&& doc, const GpuCatalog* catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(MemberTaker taker, MemberTaker::Open(std::move(doc), ""));
  JobRecord out;
  GPUFLEET_RETURN_IF_ERROR(taker.String("name", out.name));
  GPUFLEET_RETURN_IF_ERROR(taker.String("team", out.team));
  GPUFLEET_RETURN_IF_ERROR(taker.String("queue", out.queue));
  GPUFLEET_RETURN_IF_ERROR(taker.String("submitted_by", out.submitted_by));
  GPUFLEET_RETURN_IF_ERROR(taker.StringMap("labels", out.labels));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("priority", out.priority));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("submit_seq", out.submit_seq));
  GPUFLEET_RETURN_IF_ERROR(taker.String("created_at", out.created_at));
  if (catalog != nullptr) {
    const std::optional<Json> spec = taker.Take("spec");
    GPUFLEET_ASSIGN_OR_RETURN(out.spec, SpecFromMember(spec ? &*spec : nullptr, *catalog));
  }
  GPUFLEET_RETURN_IF_ERROR(taker.State("state", out.state));
  GPUFLEET_RETURN_IF_ERROR(taker.String("reason", out.reason));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("attempt", out.attempt));
  GPUFLEET_RETURN_IF_ERROR(taker.Array("placements", out.placements, PlacementFromJson));
  if (const std::optional<Json> stopping = taker.Take("stopping")) {
    GPUFLEET_ASSIGN_OR_RETURN(out.stopping, StopRecordFromJson(*stopping, "stopping"));
  }
  GPUFLEET_RETURN_IF_ERROR(taker.String("preempted_by", out.preempted_by));
  GPUFLEET_RETURN_IF_ERROR(taker.String("preempted_by_team", out.preempted_by_team));
  GPUFLEET_RETURN_IF_ERROR(taker.String("expedited", out.expedited));
  if (const std::optional<Json> usage_run = taker.Take("usage_run")) {
    GPUFLEET_ASSIGN_OR_RETURN(out.usage_run, UsageRunFromJson(*usage_run, "usage_run"));
  }
  GPUFLEET_RETURN_IF_ERROR(taker.Array("warnings", out.warnings, StringElement));
  GPUFLEET_RETURN_IF_ERROR(taker.String("warning", out.idle_warning));
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("last_checkpoint_ns", out.last_checkpoint_ns));
  if (const std::optional<Json> notice = taker.Take("notice")) {
    GPUFLEET_ASSIGN_OR_RETURN(out.notice, NoticeRecordFromJson(*notice, "notice"));
  }
  GPUFLEET_RETURN_IF_ERROR(taker.Integer("world_size", out.world_size));
  out.extra = std::move(taker).TakeRest();
  return out;
}

Json JobRecordToJson(const JobRecord& record) {
  Json out = record.extra;
  out["name"] = record.name;
  out["team"] = record.team;
  out["queue"] = record.queue;
  out["submitted_by"] = record.submitted_by;
  out["labels"] = record.labels;
  out["priority"] = record.priority;
  out["submit_seq"] = record.submit_seq;
  SetIfAny(out, "created_at", record.created_at);
  if (record.spec) {
    out["spec"] = JobSpecToJson(*record.spec);
  }
  out["state"] = JobStateName(record.state);
  out["reason"] = record.reason;
  if (record.attempt != 0) {
    out["attempt"] = record.attempt;
  }
  Json placements = Json::array();
  for (const PlacementRecord& placement : record.placements) {
    placements.push_back(PlacementRecordToJson(placement));
  }
  out["placements"] = std::move(placements);
  if (record.stopping) {
    Json stopping = record.stopping->extra;
    stopping["then"] = JobStateName(record.stopping->then);
    stopping["reason"] = record.stopping->reason;
    stopping["since"] = record.stopping->since;
    out["stopping"] = std::move(stopping);
  }
  if (record.preempted_by) {
    out["preempted_by"] = *record.preempted_by;
  }
  if (record.preempted_by_team) {
    out["preempted_by_team"] = *record.preempted_by_team;
  }
  if (record.expedited) {
    out["expedited"] = *record.expedited;
  }
  if (record.usage_run) {
    Json stamp = record.usage_run->extra;
    stamp["attempt"] = record.usage_run->attempt;
    stamp["start_ns"] = record.usage_run->start_ns;
    SetIfAny(stamp, "busy", record.usage_run->busy);
    out["usage_run"] = std::move(stamp);
  }
  if (!record.warnings.empty()) {
    out["warnings"] = record.warnings;
  }
  SetIfAny(out, "warning", record.idle_warning);
  SetIfAny(out, "last_checkpoint_ns", record.last_checkpoint_ns);
  if (record.notice) {
    out["notice"] = NoticeRecordToJson(*record.notice);
  }
  SetIfAny(out, "world_size", record.world_size);
  return out;
}

}  // namespace gpufleet::wire
