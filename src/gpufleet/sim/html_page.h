// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <ostream>
#include <string>
#include <string_view>

#include "gpufleet/core/status.h"
#include "gpufleet/sim/chart.h"

// The frame shared by the simulator's self-contained HTML reports: one file with no external
// references, the same bytes for the same input. A page with charts carries their data as JSON
// and the dashboard's chart library (uPlot, embedded at build time), which draws them.
namespace gpufleet::sim {

// An HTML5 page: doctype, head with `title` (escaped) and the shared stylesheet, `<h1>` with the
// title, then `body` as it is (already HTML). When `body` holds a FigureHtml, the page also holds
// uPlot's script and stylesheet and a script that draws every figure.
std::string HtmlPage(std::string_view title, std::string_view body);

// Writes HtmlPage(title, body) to `out` and flushes it; kUnavailable when `out` fails.
Status WriteHtmlPage(std::string_view title, std::string_view body, std::ostream& out);

// `<figure class="chart">` holding the chart's data, ChartData(spec), as JSON
// in a `<script type="application/json" class="chart-data">`, which HtmlPage's script draws.
std::string FigureHtml(const ChartSpec& spec);

// A table cell with `text` escaped: `<td>`, or `<td class="num">` (right-aligned) for numbers.
std::string HtmlCell(std::string_view text);
std::string HtmlNumCell(std::string_view text);

// Seconds in the hours the reports print.
inline constexpr double kSecondsPerHour = 3600.0;

}  // namespace gpufleet::sim
