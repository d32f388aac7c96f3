// SPDX-License-Identifier: Apache-2.0
// `gpufleet report failures`: the server's failure report (GET /v1/reports/failures, docs/api.md)
// for people or programs.
#pragma once

#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "gpufleet/http/client.h"

namespace gpufleet::cli {

// `report failures [-o table|wide|json|yaml]`; `report versions` (RenderVersionReport over GET
// /v1/nodes; json and yaml print the nodes).
struct ReportArgs {
  std::string kind;    // "failures" or "versions"
  std::string output;  // empty: table
};

// Prints the report; returns the exit code (0, or 1 after printing the error to `err`): an
// unknown report kind or output format is the client's error, anything the server answers is
// printed as `Error from server (...)`.
int RunReport(http::ApiClient& client, const ReportArgs& args, std::ostream& out,
              std::ostream& err);

// The report as text: the fleet line, the concentration sentence, the ranked suspects with their
// evidence (with `wide`, the runners-up too) and the quarantined devices. Pure function of the
// JSON; missing fields render as "<none>".
std::string RenderFailureReport(const nlohmann::json& report, bool wide);

}  // namespace gpufleet::cli
