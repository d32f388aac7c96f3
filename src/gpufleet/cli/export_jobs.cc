// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/export_jobs.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <string_view>
#include <variant>

#include <fmt/format.h>

#include "gpufleet/cli/commands.h"
#include "gpufleet/cli/format.h"
#include "gpufleet/core/rfc3339.h"

namespace gpufleet::cli {
namespace {

using nlohmann::json;

// Fields are quoted as RFC 4180 only (QuoteCsvField), with no spreadsheet escaping: the native
// loader reads a negative priority as a number.
std::string StringOr(const json& object, std::string_view key, std::string fallback = "") {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}

std::optional<int64_t> IntOf(const json& object, std::string_view key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer()) {
    return std::nullopt;
  }
  return it->get<int64_t>();
}

std::optional<int64_t> SecondsOf(const json& object, std::string_view key) {
  const std::string text = StringOr(object, key);
  if (text.empty()) {
    return std::nullopt;
  }
  const Result<int64_t> nanos = ParseRfc3339(text);
  return nanos.ok() ? std::optional<int64_t>(*nanos / 1'000'000'000) : std::nullopt;
}

// The row of one job, or why it has none.
std::variant<std::string, std::string> RowOf(const json& job, const json& events) {
  const std::string state = StringOr(job, "state");
  if (state != "Succeeded" && state != "Failed" && state != "Cancelled") {
    return std::variant<std::string, std::string>(std::in_place_index<1>, "not finished");
  }
  std::optional<int64_t> start;
  std::optional<int64_t> end;
  const auto items = events.find("items");
  if (items != events.end() && items->is_array()) {
    for (const json& event : *items) {
      const std::optional<int64_t> at = SecondsOf(event, "at");
      if (!at) {
        continue;
      }
      if (!start && StringOr(event, "message").starts_with("scheduled on")) {
        start = at;
      }
      end = at;
    }
  }
  const std::optional<int64_t> submit = SecondsOf(job, "created_at");
  if (!start) {
    return std::variant<std::string, std::string>(std::in_place_index<1>, "never placed");
  }
  if (!submit || !end) {
    return std::variant<std::string, std::string>(std::in_place_index<1>, "without times");
  }
  const json empty = json::object();
  const auto spec_it = job.find("spec");
  const json& outer = spec_it != job.end() && spec_it->is_object() ? *spec_it : empty;
  const auto inner_it = outer.find("spec");
  const json& spec = inner_it != outer.end() && inner_it->is_object() ? *inner_it : empty;
  const auto tasks = spec.find("tasks");
  if (tasks == spec.end() || !tasks->is_array() || tasks->size() != 1 || !(*tasks)[0].is_object()) {
    return std::variant<std::string, std::string>(std::in_place_index<1>, "several task groups");
  }
  const json& task = (*tasks)[0];
  const int64_t replicas = IntOf(task, "replicas").value_or(1);
  const json resources = task.value("resources", json::object());
  const json gpus = resources.is_object() ? resources.value("gpus", json::object()) : json();
  int64_t gpus_per_task = 0;
  int64_t gpu_milli = 0;
  if (gpus.is_object() && gpus.contains("migProfile")) {
    return std::variant<std::string, std::string>(std::in_place_index<1>, "MIG instances");
  }
  if (gpus.is_object()) {
    if (const std::optional<int64_t> count = IntOf(gpus, "count"); count && *count > 0) {
      gpus_per_task = *count;
      gpu_milli = 1000;
    } else if (const std::optional<int64_t> milli = IntOf(gpus, "milli"); milli && *milli > 0) {
      gpus_per_task = 1;
      gpu_milli = *milli;
    }
  }
  std::string models;
  if (const auto it = spec.find("gpuModels"); it != spec.end() && it->is_array()) {
    for (const json& model : *it) {
      if (model.is_string()) {
        models += (models.empty() ? "" : "|") + model.get<std::string>();
      }
    }
  }
  const std::string team = StringOr(job, "team");
  const std::string name = StringOr(job, "name");
  return std::variant<std::string, std::string>(
      std::in_place_index<0>,
      fmt::format("{},{},{},{},{},{},{},{},{},{},{}\n",
                  QuoteCsvField(team.empty() ? name : team + "/" + name), *submit,
                  std::max<int64_t>(1, *end - *start), replicas, gpus_per_task,
                  gpus_per_task > 0 ? std::to_string(gpu_milli) : std::string(),
                  QuoteCsvField(models), QuoteCsvField(StringOr(job, "queue")),
                  IntOf(spec, "priority").value_or(0),
                  QuoteCsvField(StringOr(spec, "kind", "batch")),
                  QuoteCsvField(StringOr(job, "submitted_by"))));
}

}  // namespace

NativeExport JobsToNativeCsv(const std::vector<std::pair<json, json>>& jobs) {
  NativeExport exported;
  exported.csv =
      "id,submit_time,duration,tasks,gpus_per_task,gpu_milli,allowed_models,queue,priority,kind,"
      "user\n";
  for (const auto& [job, events] : jobs) {
    const auto row = RowOf(job, events);
    if (row.index() == 0) {
      exported.csv += std::get<0>(row);
      ++exported.rows;
      continue;
    }
    const std::string& why = std::get<1>(row);
    auto it = std::find_if(exported.skipped.begin(), exported.skipped.end(),
                           [&](const auto& entry) { return entry.first == why; });
    if (it == exported.skipped.end()) {
      exported.skipped.emplace_back(why, 1);
    } else {
      ++it->second;
    }
  }
  return exported;
}

int RunExport(http::ApiClient& client, const ExportArgs& args, std::ostream& out,
              std::ostream& err) {
  if (args.kind != "jobs") {
    err << "error: export: unknown kind \"" << args.kind << "\" (known: jobs)\n";
    return 1;
  }
  Result<json> list = client.Get("/v1/jobs");
  if (!list.ok()) {
    return PrintError(client, list.status(), err);
  }
  std::vector<std::pair<json, json>> jobs;
  const json& items = Member(*list, "items");
  for (const json& job : items.is_array() ? items : json::array()) {
    std::string path = "/v1/jobs/";
    if (const std::string team = StringOr(job, "team"); !team.empty()) {
      path += http::UrlEncode(team) + "/";
    }
    path += http::UrlEncode(StringOr(job, "name")) + "/events";
    Result<json> events = client.Get(path);
    if (!events.ok()) {
      return PrintError(client, events.status(), err);
    }
    jobs.emplace_back(job, std::move(events).value());
  }
  const NativeExport exported = JobsToNativeCsv(jobs);
  if (args.output.empty()) {
    out << exported.csv;
  } else {
    std::ofstream file(args.output, std::ios::binary | std::ios::trunc);
    file << exported.csv;
    file.close();
    if (!file) {
      err << "error: --output: cannot write \"" << args.output << "\"\n";
      return 1;
    }
  }
  std::string skipped;
  for (const auto& [why, count] : exported.skipped) {
    skipped += fmt::format("{}{} {}", skipped.empty() ? "; left out: " : ", ", count, why);
  }
  err << fmt::format("exported {} of {} jobs{}\n", exported.rows, jobs.size(), skipped);
  return 0;
}

}  // namespace gpufleet::cli
