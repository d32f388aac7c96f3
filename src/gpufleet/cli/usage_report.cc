// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/usage_report.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpufleet/cli/commands.h"
#include "gpufleet/cli/config.h"
#include "gpufleet/cli/format.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/rfc3339.h"

namespace gpufleet::cli {
namespace {

using json = nlohmann::json;

constexpr int64_t kMicros = 1'000'000;
// More than any GPU-hour costs (10^9 a GPU-hour), and small enough that hours x price stays exact
// in a double.
constexpr int64_t kMaxPriceMicros = int64_t{1'000'000'000} * kMicros;

// A non-negative decimal with at most 6 decimals, as millionths; nullopt otherwise.
std::optional<int64_t> ParsePriceMicros(std::string_view text) {
  int64_t whole = 0;
  int64_t fraction = 0;
  int fraction_digits = 0;
  bool seen_point = false;
  bool seen_digit = false;
  for (const char c : text) {
    if (c == '.' && !seen_point) {
      seen_point = true;
      continue;
    }
    if (c < '0' || c > '9') {
      return std::nullopt;
    }
    seen_digit = true;
    if (seen_point) {
      if (++fraction_digits > 6) {
        return std::nullopt;
      }
      fraction = fraction * 10 + (c - '0');
    } else {
      whole = whole * 10 + (c - '0');
      if (whole * kMicros > kMaxPriceMicros) {
        return std::nullopt;
      }
    }
  }
  if (!seen_digit) {
    return std::nullopt;
  }
  for (int i = fraction_digits; i < 6; ++i) {
    fraction *= 10;
  }
  return whole * kMicros + fraction;
}

std::string Hours(const json& value) {
  return value.is_number() ? fmt::format("{:.3f}", value.get<double>()) : "-";
}

std::string Money(const json& value) {
  return value.is_number() ? fmt::format("{:.2f}", value.get<double>()) : "-";
}

std::string BusyPercent(const json& row) {
  const json& allocated = row.contains("allocatedGpuHours") ? row["allocatedGpuHours"] : json();
  const json& busy = row.contains("busyGpuHours") ? row["busyGpuHours"] : json();
  if (!allocated.is_number() || !busy.is_number() || allocated.get<double>() <= 0) {
    return "-";
  }
  return fmt::format("{:.0f}%", 100 * busy.get<double>() / allocated.get<double>());
}

std::string CsvField(std::string text) {
  if (!text.empty() && (text[0] == '=' || text[0] == '+' || text[0] == '-' || text[0] == '@')) {
    text.insert(text.begin(), '\'');
  }
  return QuoteCsvField(text);
}

std::string CsvNumber(const json& value) {
  return value.is_number() ? fmt::format("{:.6f}", value.get<double>()) : "";
}

std::string Key(const json& row) {
  return row.contains("key") && row["key"].is_string() ? row["key"].get<std::string>() : "";
}

std::string By(const json& report) {
  return report.contains("by") && report["by"].is_string() ? report["by"].get<std::string>()
                                                           : "team";
}

// The row of jobs without a key: "(no team)" for jobs of no team (an admin's own), as the
// dashboard says it.
std::string NoKey(std::string_view by) {
  return by == "team" ? "(no team)" : "(none)";
}

const json& Rows(const json& report) {
  static const json kEmpty = json::array();
  return report.contains("rows") && report["rows"].is_array() ? report["rows"] : kEmpty;
}

}  // namespace

Result<wire::PriceTable> ParsePriceTable(std::string_view text, std::string_view source) {
  const GpuCatalog catalog = GpuCatalog::Default();
  wire::PriceTable table;
  std::map<std::string, int> defined_at;
  std::optional<bool> csv;
  int line_number = 0;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view raw = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    const std::string_view line = Trim(raw.substr(0, raw.find('#')));
    if (line.empty()) {
      if (end == text.size()) {
        break;
      }
      continue;
    }
    if (!csv) {
      csv = line.find(',') != std::string_view::npos;
      if (*csv && line == "model,price_per_gpu_hour") {
        continue;  // the header
      }
    }
    const char separator = *csv ? ',' : ':';
    const size_t at = line.find(separator);
    if (at == std::string_view::npos || line.find(separator, at + 1) != std::string_view::npos) {
      return InvalidArgumentError(fmt::format(
          "{}:{}: \"{}\" is not {}", source, line_number, line,
          *csv ? "MODEL,PRICE (the file is CSV: its first line has a comma)" : "MODEL: PRICE"));
    }
    std::string model(Unquote(Trim(line.substr(0, at))));
    const std::string_view price_text = Trim(line.substr(at + 1));
    if (model.empty()) {
      return InvalidArgumentError(fmt::format(
          "{}:{}: model: empty (expected a GPU model such as H100-80GB)", source, line_number));
    }
    if (const Result<const GpuModelInfo*> known = catalog.Find(model); known.ok()) {
      model = (*known)->name;
    }
    const std::optional<int64_t> price = ParsePriceMicros(price_text);
    if (!price) {
      return InvalidArgumentError(fmt::format(
          "{}:{}: price of {}: \"{}\" is not a price per GPU-hour (a non-negative number with "
          "at most 6 decimals, e.g. 2.49)",
          source, line_number, model, price_text));
    }
    if (const auto [it, inserted] = defined_at.try_emplace(model, line_number); !inserted) {
      return InvalidArgumentError(fmt::format("{}:{}: model: {} has a price already (line {})",
                                              source, line_number, model, it->second));
    }
    table.micros_per_gpu_hour[model] = *price;
    if (end == text.size()) {
      break;
    }
  }
  if (table.micros_per_gpu_hour.empty()) {
    return InvalidArgumentError(
        fmt::format("{}: no prices (expected MODEL,PRICE or MODEL: PRICE "
                    "lines)",
                    source));
  }
  return table;
}

std::string RenderUsageTable(const json& report, bool with_cost) {
  std::string by = By(report);
  std::transform(by.begin(), by.end(), by.begin(), [](unsigned char c) { return std::toupper(c); });
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {by, "ALLOCATED GPU-H", "BUSY GPU-H", "IDLE GPU-H", "BUSY"};
  if (with_cost) {
    header.emplace_back("COST");
  }
  rows.push_back(std::move(header));
  for (const json& row : Rows(report)) {
    const std::string key = Key(row);
    std::vector<std::string> line = {key.empty() ? NoKey(By(report)) : key,
                                     Hours(row.value("allocatedGpuHours", json())),
                                     Hours(row.value("busyGpuHours", json())),
                                     Hours(row.value("idleGpuHours", json())), BusyPercent(row)};
    if (with_cost) {
      line.push_back(Money(row.value("cost", json())));
    }
    rows.push_back(std::move(line));
  }
  std::string out =
      fmt::format("Usage from {} to {}\n", report.value("from", ""), report.value("to", ""));
  out += RenderTable(rows);
  if (report.contains("unallocatedGpuHours") && report["unallocatedGpuHours"].is_number()) {
    out += fmt::format("Unallocated (the fleet's GPUs no run held): {} GPU-h\n",
                       Hours(report["unallocatedGpuHours"]));
  }
  return out;
}

std::string RenderUsageCsv(const json& report, bool with_cost) {
  std::string out = CsvField(By(report)) + ",allocated_gpu_hours,busy_gpu_hours,idle_gpu_hours";
  out += with_cost ? ",cost\n" : "\n";
  for (const json& row : Rows(report)) {
    out += fmt::format(
        "{},{},{},{}", CsvField(Key(row)), CsvNumber(row.value("allocatedGpuHours", json())),
        CsvNumber(row.value("busyGpuHours", json())), CsvNumber(row.value("idleGpuHours", json())));
    if (with_cost) {
      const json cost = row.value("cost", json());
      out += "," + (cost.is_number() ? fmt::format("{:.2f}", cost.get<double>()) : "");
    }
    out += "\n";
  }
  if (report.contains("unallocatedGpuHours") && report["unallocatedGpuHours"].is_number()) {
    out += fmt::format("(unallocated),{},,{}\n", CsvNumber(report["unallocatedGpuHours"]),
                       with_cost ? "," : "");
  }
  return out;
}

int RunUsageReport(http::ApiClient& client, const UsageReportArgs& given, const WallClock& clock,
                   std::ostream& out, std::ostream& err) {
  UsageReportArgs args = given;
  const std::string format = args.format.empty() ? "table" : args.format;
  if (format != "table" && format != "csv" && format != "json") {
    err << "error: --format: \"" << format << "\" (expected table, csv or json)\n";
    return 1;
  }
  if (args.to.empty()) {
    args.to = FormatRfc3339(clock.UnixNanos());
  }
  if (args.from.empty()) {
    const Result<int64_t> to = ParseRfc3339(args.to);
    if (!to.ok()) {
      err << "error: --to: \"" << args.to
          << "\" is not an RFC 3339 time (e.g. 2026-12-01T00:00:00Z)\n";
      return 1;
    }
    args.from = FormatRfc3339(*to - kDefaultUsageDays * 24 * 3600 * int64_t{1'000'000'000});
  }
  std::optional<wire::PriceTable> prices;
  if (!args.prices.empty()) {
    Result<std::string> text = ReadTextFile(args.prices, "prices");
    Result<wire::PriceTable> parsed =
        text.ok() ? ParsePriceTable(*text, args.prices) : Result<wire::PriceTable>(text.status());
    if (!parsed.ok()) {
      err << "error: " << parsed.status().message() << "\n";
      return 1;
    }
    prices = *std::move(parsed);
  }
  // The values are RFC 3339 times and grouping names; the server checks them (400 naming the
  // field), and nothing in them needs escaping but '+' (a numeric offset).
  const auto escape = [](const std::string& value) {
    std::string escaped;
    for (const char c : value) {
      escaped += c == '+' ? std::string("%2B") : c == '&' ? std::string("%26") : std::string(1, c);
    }
    return escaped;
  };
  std::string path = fmt::format("/v1/usage?from={}&to={}", escape(args.from), escape(args.to));
  if (!args.by.empty()) {
    path += "&by=" + escape(args.by);
  }
  Result<json> report = client.Get(path);
  if (!report.ok()) {
    return PrintError(client, report.status(), err);
  }
  if (prices) {
    const std::vector<std::string> unpriced = wire::AddCosts(*report, *prices);
    if (!unpriced.empty()) {
      err << "warning: no price in " << args.prices << " for "
          << fmt::format("{}", fmt::join(unpriced, ", ")) << "; their rows have no cost\n";
    }
  }
  // A server given prices (`gpufleet server --prices`) answers with the cost; --prices here
  // overrides it.
  const json& rows = Rows(*report);
  const bool with_cost =
      prices.has_value() || std::any_of(rows.begin(), rows.end(), [](const json& row) {
        return row.is_object() && row.contains("cost");
      });
  if (format == "json") {
    out << report->dump(2, ' ', false, json::error_handler_t::replace) << "\n";
  } else if (format == "csv") {
    out << RenderUsageCsv(*report, with_cost);
  } else {
    out << RenderUsageTable(*report, with_cost);
  }
  return 0;
}

}  // namespace gpufleet::cli
