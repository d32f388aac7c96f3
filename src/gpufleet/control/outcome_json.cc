// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/outcome_json.h"

#include <array>
#include <charconv>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpufleet/reliability/xid_catalog.h"

namespace gpufleet::control {
namespace {

using reliability::ExitReason;
using reliability::HealthEvent;
using reliability::HealthSeverity;
using reliability::XidEvent;

constexpr std::array<ExitReason, 6> kExitReasons = {ExitReason::kSucceeded,  ExitReason::kCancelled,
                                                    ExitReason::kPreempted,  ExitReason::kAppError,
                                                    ExitReason::kInfraError, ExitReason::kHang};

constexpr size_t kMaxNoteBytes = 512;

std::string Path(std::string_view parent, std::string_view field) {
  return parent.empty() ? std::string(field) : fmt::format("{}.{}", parent, field);
}

// The member `field` of `object`, which must be there (strict readers).
Result<const Json*> Member(const Json& object, std::string_view parent, std::string_view field) {
  const auto it = object.find(field);
  if (it == object.end()) {
    return InvalidArgumentError(fmt::format("{}: missing", Path(parent, field)));
  }
  return &*it;
}

Result<std::string> StringMember(const Json& object, std::string_view parent,
                                 std::string_view field, bool allow_empty = false) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json* value, Member(object, parent, field));
  if (!value->is_string()) {
    return InvalidArgumentError(
        fmt::format("{}: {} (must be a string)", Path(parent, field), value->dump()));
  }
  std::string text = value->get<std::string>();
  if (text.empty() && !allow_empty) {
    return InvalidArgumentError(fmt::format("{}: empty", Path(parent, field)));
  }
  return text;
}

Result<int64_t> IntMember(const Json& object, std::string_view parent, std::string_view field) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json* value, Member(object, parent, field));
  if (!value->is_number_integer()) {
    return InvalidArgumentError(
        fmt::format("{}: {} (must be an integer)", Path(parent, field), value->dump()));
  }
  return value->get<int64_t>();
}

// `object` must be a JSON object whose members are all in `allowed`.
Status OnlyFields(const Json& object, std::string_view path,
                  const std::set<std::string_view>& allowed) {
  if (!object.is_object()) {
    return InvalidArgumentError(
        fmt::format("{}: {} (must be an object)", path.empty() ? "body" : path, object.dump()));
  }
  for (const auto& [key, value] : object.items()) {
    if (allowed.count(key) == 0) {
      return InvalidArgumentError(
          fmt::format("{}: unknown field (valid: {})", Path(path, key), fmt::join(allowed, ", ")));
    }
  }
  return Status::Ok();
}

Result<const Json*> ArrayMember(const Json& object, std::string_view field, bool required) {
  const auto it = object.find(field);
  if (it == object.end()) {
    if (required) {
      return InvalidArgumentError(fmt::format("{}: missing", field));
    }
    static const Json kEmpty = Json::array();
    return &kEmpty;
  }
  if (!it->is_array()) {
    return InvalidArgumentError(fmt::format("{}: {} (must be an array)", field, it->dump()));
  }
  return &*it;
}

Result<ExitReason> ExitReasonMember(const Json& object) {
  GPUFLEET_ASSIGN_OR_RETURN(const std::string name, StringMember(object, "", "exit_reason", true));
  const std::optional<ExitReason> reason = ParseExitReason(name);
  if (!reason) {
    return InvalidArgumentError(
        fmt::format("exit_reason: unknown \"{}\" (valid: {})", name, ExitReasonNames()));
  }
  return *reason;
}

Result<std::vector<XidEvent>> XidsMember(const Json& object, bool required) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json* array, ArrayMember(object, "xids", required));
  std::vector<XidEvent> out;
  for (size_t i = 0; i < array->size(); ++i) {
    const Json& entry = (*array)[i];
    const std::string path = fmt::format("xids[{}]", i);
    GPUFLEET_RETURN_IF_ERROR(OnlyFields(entry, path, {"gpu", "xid"}));
    GPUFLEET_ASSIGN_OR_RETURN(std::string gpu, StringMember(entry, path, "gpu"));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t xid, IntMember(entry, path, "xid"));
    if (xid < 1 || xid > 1023) {
      return InvalidArgumentError(fmt::format("{}.xid: {} (must be 1..1023)", path, xid));
    }
    out.push_back(XidEvent{GpuUuid(std::move(gpu)), static_cast<int>(xid)});
  }
  return out;
}

Result<std::vector<HealthEvent>> HealthEventsMember(const Json& object, bool required) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json* array, ArrayMember(object, "health_events", required));
  std::vector<HealthEvent> out;
  for (size_t i = 0; i < array->size(); ++i) {
    const Json& entry = (*array)[i];
    const std::string path = fmt::format("health_events[{}]", i);
    GPUFLEET_RETURN_IF_ERROR(OnlyFields(entry, path, {"node", "gpu", "check", "severity"}));
    HealthEvent event;
    GPUFLEET_ASSIGN_OR_RETURN(std::string node, StringMember(entry, path, "node"));
    event.node = NodeId(std::move(node));
    if (entry.contains("gpu")) {
      GPUFLEET_ASSIGN_OR_RETURN(std::string gpu, StringMember(entry, path, "gpu", true));
      event.gpu = GpuUuid(std::move(gpu));
    }
    GPUFLEET_ASSIGN_OR_RETURN(event.check, StringMember(entry, path, "check"));
    GPUFLEET_ASSIGN_OR_RETURN(const std::string severity,
                              StringMember(entry, path, "severity", true));
    if (severity == "fail") {
      event.severity = HealthSeverity::kFail;
    } else if (severity == "warn") {
      event.severity = HealthSeverity::kWarn;
    } else {
      return InvalidArgumentError(
          fmt::format("{}.severity: unknown \"{}\" (valid: warn, fail)", path, severity));
    }
    out.push_back(std::move(event));
  }
  return out;
}

Result<std::vector<std::string>> StringArrayMember(const Json& object, std::string_view field) {
  GPUFLEET_ASSIGN_OR_RETURN(const Json* array, ArrayMember(object, field, true));
  std::vector<std::string> out;
  for (size_t i = 0; i < array->size(); ++i) {
    const Json& entry = (*array)[i];
    if (!entry.is_string() || entry.get_ref<const std::string&>().empty()) {
      return InvalidArgumentError(
          fmt::format("{}[{}]: {} (must be a non-empty string)", field, i, entry.dump()));
    }
    out.push_back(entry.get<std::string>());
  }
  return out;
}

// "XID 79: ..." or "XID 79 (x3): ..." -> (79, 3).
std::optional<std::pair<int, int>> ParseXidReason(std::string_view reason) {
  constexpr std::string_view kPrefix = "XID ";
  if (reason.substr(0, kPrefix.size()) != kPrefix) {
    return std::nullopt;
  }
  reason.remove_prefix(kPrefix.size());
  int xid = 0;
  auto [end, error] = std::from_chars(reason.data(), reason.data() + reason.size(), xid);
  if (error != std::errc() || xid < 1) {
    return std::nullopt;
  }
  reason.remove_prefix(static_cast<size_t>(end - reason.data()));
  int count = 1;
  constexpr std::string_view kCount = " (x";
  if (reason.substr(0, kCount.size()) == kCount) {
    reason.remove_prefix(kCount.size());
    auto [count_end, count_error] =
        std::from_chars(reason.data(), reason.data() + reason.size(), count);
    if (count_error != std::errc() || count < 1) {
      count = 1;
    }
  }
  return std::make_pair(xid, count);
}

bool Contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The agent's health finding a reason text comes from (agent/health.cc writes them).
std::string CheckName(std::string_view reason) {
  if (Contains(reason, "GPU lost")) {
    return "gpu-lost";
  }
  if (Contains(reason, "ECC")) {
    return "ecc";
  }
  if (Contains(reason, "remap")) {
    return "row-remap";
  }
  if (Contains(reason, "temperature")) {
    return "thermal";
  }
  if (Contains(reason, "clocks")) {
    return "clocks";
  }
  return "gpu-health";
}

}  // namespace

std::string OutcomeName(std::string_view job, int64_t attempt) {
  return fmt::format("{}/{}", job, attempt);
}

std::optional<ExitReason> ParseExitReason(std::string_view name) {
  for (const ExitReason reason : kExitReasons) {
    if (name == reliability::ExitReasonName(reason)) {
      return reason;
    }
  }
  return std::nullopt;
}

std::string ExitReasonNames() {
  std::vector<std::string_view> names;
  for (const ExitReason reason : kExitReasons) {
    names.push_back(reliability::ExitReasonName(reason));
  }
  return fmt::format("{}", fmt::join(names, ", "));
}

Json OutcomeToJson(const StoredOutcome& outcome) {
  const reliability::OutcomeRecord& r = outcome.record;
  Json gpus = Json::array();
  for (const GpuUuid& gpu : r.gpus) {
    gpus.push_back(gpu.value());
  }
  Json nodes = Json::array();
  for (const NodeId& node : r.nodes) {
    nodes.push_back(node.value());
  }
  Json xids = Json::array();
  for (const XidEvent& event : r.xids) {
    xids.push_back({{"gpu", event.gpu.value()}, {"xid", event.xid}});
  }
  Json health = Json::array();
  for (const HealthEvent& event : r.health_events) {
    Json entry = {{"node", event.node.value()},
                  {"check", event.check},
                  {"severity", reliability::HealthSeverityName(event.severity)}};
    if (!event.gpu.empty()) {
      entry["gpu"] = event.gpu.value();
    }
    health.push_back(std::move(entry));
  }
  Json pulls = Json::array();
  for (const StoredOutcome::ImagePull& pull : outcome.image_pulls) {
    pulls.push_back({{"task", pull.task},
                     {"node", pull.node},
                     {"image", pull.image},
                     {"digest", pull.digest},
                     {"pull_ms", pull.pull_ms}});
  }
  return {{"job", r.job.value()},
          {"attempt", r.attempt},
          {"exit_reason", reliability::ExitReasonName(r.exit_reason)},
          {"start_ns", r.start.nanos},
          {"end_ns", r.end.nanos},
          {"duration_s", static_cast<double>(r.duration().count()) / 1e9},
          {"size", r.size()},
          {"gpus", std::move(gpus)},
          {"nodes", std::move(nodes)},
          {"xids", std::move(xids)},
          {"health_events", std::move(health)},
          {"cause", outcome.cause},
          {"reported_by", outcome.reported_by},
          {"image_pulls", std::move(pulls)}};
}

Result<StoredOutcome> OutcomeFromJson(const Json& json) {
  if (!json.is_object()) {
    return InvalidArgumentError(fmt::format("outcome: {} (must be an object)", json.dump()));
  }
  StoredOutcome outcome;
  reliability::OutcomeRecord& r = outcome.record;
  GPUFLEET_ASSIGN_OR_RETURN(std::string job, StringMember(json, "", "job"));
  r.job = JobId(std::move(job));
  GPUFLEET_ASSIGN_OR_RETURN(const int64_t attempt, IntMember(json, "", "attempt"));
  r.attempt = static_cast<int>(attempt);
  GPUFLEET_ASSIGN_OR_RETURN(r.exit_reason, ExitReasonMember(json));
  GPUFLEET_ASSIGN_OR_RETURN(r.start.nanos, IntMember(json, "", "start_ns"));
  GPUFLEET_ASSIGN_OR_RETURN(r.end.nanos, IntMember(json, "", "end_ns"));
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<std::string> gpus, StringArrayMember(json, "gpus"));
  for (const std::string& gpu : gpus) {
    r.gpus.push_back(GpuUuid(gpu));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<std::string> nodes, StringArrayMember(json, "nodes"));
  for (const std::string& node : nodes) {
    r.nodes.push_back(NodeId(node));
  }
  GPUFLEET_ASSIGN_OR_RETURN(r.xids, XidsMember(json, true));
  GPUFLEET_ASSIGN_OR_RETURN(r.health_events, HealthEventsMember(json, true));
  outcome.cause = wire::StrOr(json, "cause");
  outcome.reported_by = wire::StrOr(json, "reported_by", "server");
  GPUFLEET_ASSIGN_OR_RETURN(const Json* pulls, ArrayMember(json, "image_pulls", false));
  for (size_t i = 0; i < pulls->size(); ++i) {
    const Json& entry = (*pulls)[i];
    const std::string path = fmt::format("image_pulls[{}]", i);
    GPUFLEET_RETURN_IF_ERROR(
        OnlyFields(entry, path, {"task", "node", "image", "digest", "pull_ms"}));
    StoredOutcome::ImagePull pull;
    GPUFLEET_ASSIGN_OR_RETURN(pull.task, StringMember(entry, path, "task"));
    GPUFLEET_ASSIGN_OR_RETURN(pull.node, StringMember(entry, path, "node"));
    GPUFLEET_ASSIGN_OR_RETURN(pull.image, StringMember(entry, path, "image", true));
    GPUFLEET_ASSIGN_OR_RETURN(pull.digest, StringMember(entry, path, "digest", true));
    GPUFLEET_ASSIGN_OR_RETURN(pull.pull_ms, IntMember(entry, path, "pull_ms"));
    outcome.image_pulls.push_back(std::move(pull));
  }
  return outcome;
}

Result<OutcomeReport> ParseOutcomeReport(std::string_view body) {
  Result<Json> parsed = wire::ParseJson(body);
  if (!parsed.ok()) {
    return InvalidArgumentError(
        fmt::format("body: {} (want {{\"job\": ..., \"attempt\": ..., \"exit_reason\": ...}})",
                    parsed.status().message()));
  }
  const Json& json = *parsed;
  GPUFLEET_RETURN_IF_ERROR(
      OnlyFields(json, "", {"job", "attempt", "exit_reason", "xids", "health_events", "note"}));
  OutcomeReport report;
  GPUFLEET_ASSIGN_OR_RETURN(report.job, StringMember(json, "", "job"));
  GPUFLEET_ASSIGN_OR_RETURN(report.attempt, IntMember(json, "", "attempt"));
  if (report.attempt < 1) {
    return InvalidArgumentError(
        fmt::format("attempt: {} (must be >= 1; a job's first run is 1)", report.attempt));
  }
  GPUFLEET_ASSIGN_OR_RETURN(report.exit_reason, ExitReasonMember(json));
  GPUFLEET_ASSIGN_OR_RETURN(report.xids, XidsMember(json, false));
  GPUFLEET_ASSIGN_OR_RETURN(report.health_events, HealthEventsMember(json, false));
  if (json.contains("note")) {
    GPUFLEET_ASSIGN_OR_RETURN(report.note, StringMember(json, "", "note", true));
    if (report.note.size() > kMaxNoteBytes) {
      return InvalidArgumentError(
          fmt::format("note: {} bytes (at most {})", report.note.size(), kMaxNoteBytes));
    }
  }
  return report;
}

GpuHealthReading ReadHealthReasons(const Json& reasons) {
  GpuHealthReading reading;
  if (!reasons.is_array()) {
    return reading;
  }
  for (const Json& entry : reasons) {
    if (!entry.is_string()) {
      continue;
    }
    const std::string& reason = entry.get_ref<const std::string&>();
    if (const std::optional<std::pair<int, int>> xid = ParseXidReason(reason)) {
      reading.xids[xid->first] += xid->second;
      continue;
    }
    const bool drains = Contains(reason, "drain now") || Contains(reason, "drain after");
    reading.checks.push_back(GpuHealthReading::Check{
        CheckName(reason), drains ? HealthSeverity::kFail : HealthSeverity::kWarn});
  }
  return reading;
}

ExitReason InferExitReason(const Json& after, bool hardware_evidence) {
  // A run that is stopping ends as its stop record says.
  std::string state = wire::StrOr(after, "state");
  if (state == "Stopping" && after.contains("stopping")) {
    state = wire::StrOr(after["stopping"], "then");
  }
  const std::string reason = wire::StrOr(after, "reason");
  if (state == "Succeeded") {
    return ExitReason::kSucceeded;
  }
  if (state == "Cancelled") {
    return ExitReason::kCancelled;
  }
  if (state == "Preempted" || state == "Suspended" ||
      (state == "Pending" && reason.starts_with("preempted"))) {
    return ExitReason::kPreempted;
  }
  if (state == "Failed" && reason.starts_with("task ")) {
    return hardware_evidence ? ExitReason::kInfraError : ExitReason::kAppError;
  }
  return ExitReason::kInfraError;
}

}  // namespace gpufleet::control
