// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/report.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/cli/commands.h"
#include "gpufleet/cli/format.h"
#include "gpufleet/cli/provenance.h"

namespace gpufleet::cli {
namespace {

using nlohmann::json;

// A scalar as text, "<none>" for null.
std::string Shown(const json& value) {
  return value.is_null() ? kNone : Text(value);
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
      parts.push_back(fmt::format("{}x{}", xid, Shown(count)));
    }
  }
  return parts.empty() ? "-" : fmt::format("{}", fmt::join(parts, " "));
}

std::string Where(const json& device) {
  const json& gpu = Member(device, "gpu");
  return gpu.is_number_integer()
             ? fmt::format("{}/gpu{}", Shown(Member(device, "node")), Shown(gpu))
             : Shown(Member(device, "node"));
}

void AddEvidenceRows(const json& devices, std::vector<std::vector<std::string>>& rows) {
  if (!devices.is_array()) {
    return;
  }
  for (const json& d : devices) {
    rows.push_back({Shown(Member(d, "rank")),
                    fmt::format("{} {}", Shown(Member(d, "device")), Shown(Member(d, "id"))),
                    Where(d), Shown(Member(d, "leaf")), Shown(Member(d, "runs")),
                    Shown(Member(d, "failures")), Shown(Member(d, "named_failures")),
                    Num(Member(d, "gpu_hours"), "{:.2f}"), Num(Member(d, "expected"), "{:.3g}"),
                    Num(Member(d, "p_value"), "{:.2g}"), Num(Member(d, "q_value"), "{:.2g}"),
                    Xids(Member(d, "xids")), Member(d, "flagged") == true ? "yes" : "no",
                    Member(d, "quarantined") == true ? "yes" : "no"});
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
  const json& fleet = Member(report, "fleet");
  text += fmt::format(
      "Fleet: {} GPUs on {} nodes; {} runs in the last {} h, {} failed ({} naming no device), "
      "{} application errors\n",
      Shown(Member(fleet, "gpus")), Shown(Member(fleet, "nodes")), Shown(Member(report, "runs")),
      Num(Member(report, "window_hours"), "{:.0f}"), Shown(Member(report, "failed_runs")),
      Shown(Member(report, "unattributed_failed_runs")),
      Shown(Member(report, "application_failed_runs")));
  const json& suspects = Member(report, "suspects");
  if (!suspects.is_array() || suspects.empty()) {
    text += "No suspects: no device fails more jobs than its exposure explains.\n";
  } else {
    text += Shown(Member(report, "summary")) + "\n";
  }
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "DEVICE", "WHERE", "LEAF", "RUNS", "FAILURES", "NAMED", "GPU-HOURS", "EXPECTED",
       "P-VALUE", "Q-VALUE", "XIDS", "FLAGGED", "QUARANTINED"}};
  AddEvidenceRows(suspects, rows);
  if (wide) {
    AddEvidenceRows(Member(report, "runners_up"), rows);
  }
  if (rows.size() > 1) {
    text += "\n" + RenderTable(rows);
  }
  const json& quarantines = Member(report, "quarantines");
  if (quarantines.is_array() && !quarantines.empty()) {
    std::vector<std::vector<std::string>> out = {
        {"QUARANTINED", "WHERE", "SOURCE", "MODE", "ACTOR", "REASON"}};
    for (const json& q : quarantines) {
      std::string reason = Shown(Member(q, "reason"));
      out.push_back({fmt::format("{} {}", Shown(Member(q, "device")), Shown(Member(q, "id"))),
                     Where(q), Shown(Member(q, "source")), Shown(Member(q, "mode")),
                     Shown(Member(q, "actor")), wide ? reason : Shorten(reason)});
    }
    text += "\n" + RenderTable(out);
  }
  // The loop (docs/reliability.md, "The loop"): its breaker and each GPU it has looked at, with
  // its latest audit event (all of them with -o wide).
  const json& breaker = Member(report, "breaker");
  if (Member(breaker, "open") == true) {
    text += fmt::format(
        "\nCircuit breaker OPEN: {} of {} GPUs went out within {} s; no automatic drain or "
        "quarantine until the share falls\n",
        Shown(Member(breaker, "out")), Shown(Member(breaker, "gpus")),
        Shown(Member(breaker, "window_s")));
  }
  const json& loop = Member(report, "loop");
  if (loop.is_array() && !loop.empty()) {
    std::vector<std::vector<std::string>> out = {
        {"LOOP", "WHERE", "PHASE", "REMEDIATIONS", "EVENT"}};
    for (const json& entry : loop) {
      const json& events = Member(entry, "events");
      std::vector<std::string> shown;
      if (events.is_array()) {
        for (size_t i = wide ? 0 : (events.empty() ? 0 : events.size() - 1); i < events.size();
             ++i) {
          shown.push_back(Shown(events[i]));
        }
      }
      for (size_t i = 0; i < std::max<size_t>(shown.size(), 1); ++i) {
        const std::string event = i < shown.size() ? shown[i] : "";
        out.push_back(
            {i == 0
                 ? fmt::format("{} {}", Shown(Member(entry, "device")), Shown(Member(entry, "id")))
                 : "",
             i == 0 ? Where(entry) : "", i == 0 ? Shown(Member(entry, "phase")) : "",
             i == 0 ? Shown(Member(entry, "remediations")) : "", wide ? event : Shorten(event)});
      }
    }
    text += "\n" + RenderTable(out);
  }
  return text;
}

int RunReport(http::ApiClient& client, const ReportArgs& args, std::ostream& out,
              std::ostream& err) {
  if (args.kind != "failures" && args.kind != "versions") {
    err << "error: unknown report \"" << args.kind << "\" (expected failures, versions or usage)\n";
    return 1;
  }
  Result<OutputFormat> format = ParseOutputFormat(args.output);
  if (!format.ok()) {
    err << "error: " << format.status().message() << "\n";
    return 1;
  }
  const bool versions = args.kind == "versions";
  Result<json> report = client.Get(versions ? "/v1/nodes" : "/v1/reports/failures");
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
      out << (versions ? RenderVersionReport(*report)
                       : RenderFailureReport(*report, *format == OutputFormat::kWide));
      break;
  }
  return 0;
}

}  // namespace gpufleet::cli
