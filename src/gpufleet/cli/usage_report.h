// SPDX-License-Identifier: Apache-2.0
// `gpufleet report usage`: the usage ledger (GET /v1/usage, docs/usage.md) as a table, CSV or
// JSON, with the cost of each group from a price table per GPU model.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/http/client.h"
#include "gpufleet/wire/usage_cost.h"

namespace gpufleet::cli {

// Reads a price table. Two forms, chosen by the first line that is not blank or a comment
// ('#'):
//   CSV   "model,price_per_gpu_hour" (that header optional), then one "MODEL,PRICE" per line;
//   YAML  a flat mapping, one "MODEL: PRICE" per line.
// PRICE is a non-negative decimal with at most 6 decimals ("2.49", "40"); MODEL a GPU model name
// or alias of the catalog ("H100" is H100-80GB) or any other name (kept as written). `source`
// names the file in errors, which are kInvalidArgument "SOURCE:LINE: FIELD ..." for a malformed
// line, a bad price and a model given twice; an empty table is an error too.
Result<wire::PriceTable> ParsePriceTable(std::string_view text, std::string_view source);

// The report as text: one line per group (KEY ALLOCATED BUSY IDLE BUSY% [COST]) and the fleet's
// unallocated GPU-hours as its own line (when the answer has them).
std::string RenderUsageTable(const nlohmann::json& report, bool with_cost);
// The same as CSV (RFC 4180, "\r\n" line ends not used: "\n"): a header line
// "KEY,allocated_gpu_hours,busy_gpu_hours,idle_gpu_hours[,cost]" with KEY the grouping, a line
// per group and a last line "(unallocated),HOURS,,," when the answer has them. Keys are quoted
// when they hold a comma, quote or line break, and prefixed with ' when they start with = + - @
// (so that a spreadsheet does not run them as formulas).
std::string RenderUsageCsv(const nlohmann::json& report, bool with_cost);

// The period's default length: the last 7 days.
inline constexpr int64_t kDefaultUsageDays = 7;

struct UsageReportArgs {
  std::string from;    // RFC 3339; empty: 7 days before `to`
  std::string to;      // RFC 3339; empty: now
  std::string by;      // team (default), queue, user or model
  std::string prices;  // a price table file; empty: no cost
  std::string format;  // table (default), csv or json
};

// Prints the usage report; returns the exit code (0, or 1 after printing the error to `err`).
// Bad arguments and a bad price file are the client's errors (printed before any request);
// anything the server answers is printed as `Error from server (...)`. Models without a price
// are named on `err` (the report is still printed).
// Without --to the period ends at `clock`'s now; without --from it starts 7 days before its end.
int RunUsageReport(http::ApiClient& client, const UsageReportArgs& args, const WallClock& clock,
                   std::ostream& out, std::ostream& err);

}  // namespace gpufleet::cli
