// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/report.h"

#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/cli/commands.h"
#include "gpufleet/cli/format.h"

namespace gpufleet::cli {
namespace {

using nlohmann::json;

constexpr char kNone[] = "<none>";

const json& Field(const json& object, std::string_view key) {
  static const json kNull;
  if (!object.is_object()) {
    return kNull;
  }
  const auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

std::string Text(const json& value) {
  if (value.is_string()) {
    return value.get<std::string>();
  }
  return value.is_null() ? kNone : value.dump();
}

// `spec` is a {fmt} spec for one double, e.g. "{:.3g}".
std::string Num(const json& value, std::string_view spec) {
  if (!value.is_number()) {
    return kNone;
  }
  return fmt::format(fmt::runtime(spec), value.get<double>());
}

// {"79": 3, "48": 1} -> "48x1 79x3".
std::string Xids(const json& xids) {
  std::vector<std::string> parts;
  if (xids.is_object()) {
    for (const auto& [xid, count] : xids.items()) {
      parts.push_back(fmt::format("{}x{}", xid, Text(count)));
    }
  }
  return parts.empty() ? "-" : fmt::format("{}", fmt::join(parts, " "));
}

std::string Where(const json& device) {
  const json& gpu = Field(device, "gpu");
  return gpu.is_number_integer() ? fmt::format("{}/gpu{}", Text(Field(device, "node")), Text(gpu))
                                 : Text(Field(device, "node"));
}

void AddEvidenceRows(const json& devices, std::vector<std::vector<std::string>>& rows) {
  if (!devices.is_array()) {
    return;
  }
  for (const json& d : devices) {
    rows.push_back({Text(Field(d, "rank")),
                    fmt::format("{} {}", Text(Field(d, "device")), Text(Field(d, "id"))), Where(d),
                    Text(Field(d, "leaf")), Text(Field(d, "runs")), Text(Field(d, "failures")),
                    Text(Field(d, "named_failures")), Num(Field(d, "gpu_hours"), "{:.2f}"),
                    Num(Field(d, "expected"), "{:.3g}"), Num(Field(d, "p_value"), "{:.2g}"),
                    Num(Field(d, "q_value"), "{:.2g}"), Xids(Field(d, "xids")),
                    Field(d, "flagged") == true ? "yes" : "no",
                    Field(d, "quarantined") == true ? "yes" : "no"});
  }
}

std::string Shorten(std::string text) {
  if (text.size() > kReasonWidth) {
    text.resize(kReasonWidth - 3);
    text += "...";
  }
  return text;
}

}  // namespace

std::string RenderFailureReport(const json& report, bool wide) {
  std::string text;
  const json& fleet = Field(report, "fleet");
  text += fmt::format(
      "Fleet: {} GPUs on {} nodes; {} runs in the last {} h, {} failed ({} naming no device), "
      "{} application errors\n",
      Text(Field(fleet, "gpus")), Text(Field(fleet, "nodes")), Text(Field(report, "runs")),
      Num(Field(report, "window_hours"), "{:.0f}"), Text(Field(report, "failed_runs")),
      Text(Field(report, "unattributed_failed_runs")),
      Text(Field(report, "application_failed_runs")));
  const json& suspects = Field(report, "suspects");
  if (!suspects.is_array() || suspects.empty()) {
    text += "No suspects: no device fails more jobs than its exposure explains.\n";
  } else {
    text += Text(Field(report, "summary")) + "\n";
  }
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "DEVICE", "WHERE", "LEAF", "RUNS", "FAILURES", "NAMED", "GPU-HOURS", "EXPECTED",
       "P-VALUE", "Q-VALUE", "XIDS", "FLAGGED", "QUARANTINED"}};
  AddEvidenceRows(suspects, rows);
  if (wide) {
    AddEvidenceRows(Field(report, "runners_up"), rows);
  }
  if (rows.size() > 1) {
    text += "\n" + RenderTable(rows);
  }
  const json& quarantines = Field(report, "quarantines");
  if (quarantines.is_array() && !quarantines.empty()) {
    std::vector<std::vector<std::string>> out = {
        {"QUARANTINED", "WHERE", "SOURCE", "MODE", "ACTOR", "REASON"}};
    for (const json& q : quarantines) {
      std::string reason = Text(Field(q, "reason"));
      out.push_back({fmt::format("{} {}", Text(Field(q, "device")), Text(Field(q, "id"))), Where(q),
                     Text(Field(q, "source")), Text(Field(q, "mode")), Text(Field(q, "actor")),
                     wide ? reason : Shorten(reason)});
    }
    text += "\n" + RenderTable(out);
  }
  return text;
}

int RunReport(ApiClient& client, const ReportArgs& args, std::ostream& out, std::ostream& err) {
  if (args.kind != "failures") {
    err << "error: unknown report \"" << args.kind << "\" (expected failures)\n";
    return 1;
  }
  Result<OutputFormat> format = ParseOutputFormat(args.output);
  if (!format.ok()) {
    err << "error: " << format.status().message() << "\n";
    return 1;
  }
  Result<json> report = client.Get("/v1/reports/failures");
  if (!report.ok()) {
    return PrintError(client, report.status(), err);
  }
  switch (*format) {
    case OutputFormat::kJson:
      out << report->dump(2, ' ', false, json::error_handler_t::replace) << "\n";
      break;
    case OutputFormat::kYaml:
      out << ToYaml(*report);
      break;
    case OutputFormat::kTable:
    case OutputFormat::kWide:
      out << RenderFailureReport(*report, *format == OutputFormat::kWide);
      break;
  }
  return 0;
}

}  // namespace gpufleet::cli
