// SPDX-License-Identifier: Apache-2.0
// Provenance records for people (docs/provenance.md): the section `describe job` adds, `diff job`
// (two jobs, or two attempts of one) and `report versions` (the fleet's driver, CUDA, NVML and
// image skew from what the agents report).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpufleet/http/client.h"

namespace gpufleet::cli {

// The `Provenance:` section of `describe job` for the records of GET /v1/provenance ("items"):
// the latest attempt's records, a row per task, then each task's GPUs, command and environment
// names, and the job's provenance map once. "" when there are none.
std::string DescribeProvenance(const nlohmann::json& records);

// `diff job A B` (each job's latest attempt), `diff job A --attempt N --attempt M` (two attempts
// of one job) or `diff job A B --attempt N --attempt M` (attempt N of A, M of B).
struct DiffArgs {
  std::string kind;  // "job"
  std::vector<std::string> names;
  std::vector<int64_t> attempts;
};
int RunDiff(http::ApiClient& client, const DiffArgs& args, std::ostream& out, std::ostream& err);

// What differs between two runs' records, field by field ("FIELD  A  B" rows; tasks are matched
// by name, and a task only one side has is one row); "no differences" when nothing does. The
// labels head the two value columns.
std::string RenderProvenanceDiff(const nlohmann::json& a, const std::string& a_label,
                                 const nlohmann::json& b, const std::string& b_label);

// `report versions`: for the driver, CUDA and NVML version labels and each image reference more
// than one node holds, the value most nodes have and the nodes off it. From GET /v1/nodes.
std::string RenderVersionReport(const nlohmann::json& nodes);

}  // namespace gpufleet::cli
