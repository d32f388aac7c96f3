// SPDX-License-Identifier: Apache-2.0
// Renders the REST API's answers (`docs/api.md`) for people: kubectl-like tables, `describe`
// pages, pretty JSON and YAML. Pure functions of the JSON; unknown or missing fields render as
// "<none>", never as an error.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpufleet/core/status.h"

namespace gpufleet::cli {

// `-o table|wide|json|yaml`.
enum class OutputFormat { kTable, kWide, kJson, kYaml };

// kInvalidArgument naming the value and the choices for anything else; "" is kTable.
Result<OutputFormat> ParseOutputFormat(std::string_view text);

enum class ResourceKind { kJob, kNode, kQueue, kTeam, kToken };

// "job", "jobs", "node", "nodes", "queue", "queues", "team", "teams", "token", "tokens"
// (kInvalidArgument otherwise).
Result<ResourceKind> ParseResourceKind(std::string_view text);

// What tables and reports print for a missing value.
inline constexpr char kNone[] = "<none>";

// Longest REASON shown by `-o table` (`-o wide` shows it whole).
inline constexpr size_t kReasonWidth = 60;

// A list answer (`{"items": [...]}`): a table with a header (table and wide; "" when there are
// no items), or the whole answer as JSON or YAML. `now_unix_seconds` is the time the AGE column
// counts to (jobs' `created_at`).
// object[key]; null when `object` is not an object or has no such key.
const nlohmann::json& Member(const nlohmann::json& object, std::string_view key);
// A scalar as text: strings bare, other values as JSON, null as "".
std::string Text(const nlohmann::json& value);

std::string RenderList(ResourceKind kind, const nlohmann::json& answer, OutputFormat format,
                       int64_t now_unix_seconds);

// One object (`GET /v1/jobs/NAME`): a one-row table, or the object as JSON or YAML.
std::string RenderObject(ResourceKind kind, const nlohmann::json& object, OutputFormat format,
                         int64_t now_unix_seconds);

// The parts of `describe` pages. `Field`: "Label:" padded so that values line up, as `kubectl
// describe` does. `Indent`: `prefix` before every line of `text`. `EventsSection`: "Events:" and
// a table of an object's events (the answer of `/v1/KIND/NAME/events`), or "Events:      <none>",
// with a TIME column when the server says when they happened (events written before servers did
// have no time).
std::string Field(std::string_view label, std::string_view value);
std::string Indent(const std::string& text, std::string_view prefix);
std::string EventsSection(const nlohmann::json& events);

// `describe job`: the job's fields and labels, its pending reason, placements and events (the
// answer of `/v1/jobs/NAME/events`), and how long before `now_unix_seconds` it last reported a
// checkpoint, when it has.
std::string DescribeJob(const nlohmann::json& job, const nlohmann::json& events,
                        int64_t now_unix_seconds);

// `describe node`: the node's fields, labels, topology and its GPUs with their health.
std::string DescribeNode(const nlohmann::json& node, const nlohmann::json& events);

// Left-aligned columns three spaces apart; the first row is the header. Every line ends in "\n".
std::string RenderTable(const std::vector<std::vector<std::string>>& rows);

// A block-style YAML document: mappings, sequences and scalars, strings quoted when a plain
// scalar would read as something else. Ends in "\n".
std::string ToYaml(const nlohmann::json& value);

// Milli-units as a decimal: 1000 -> "1", 250 -> "0.25", 1500 -> "1.5".
std::string FormatMilli(int64_t milli);

// An age as kubectl shows it, two units at most where it matters: "45s", "2m30s", "17m", "3h12m",
// "20h", "2d5h", "40d", "1y20d"; a negative age (clock skew) is "0s".
std::string FormatAge(int64_t seconds);

// `text` as one CSV field (RFC 4180): quoted, with its quotes doubled, when it holds a comma, a
// quote or a line break; as it is otherwise.
std::string QuoteCsvField(const std::string& text);

}  // namespace gpufleet::cli
