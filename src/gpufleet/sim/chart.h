// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

// The line charts of the simulator's reports, as data: the page (html_page.h) embeds each chart's
// data as JSON and draws it in the browser with uPlot, the dashboard's chart library.
namespace gpufleet::sim {

// One line of a chart. Points are (x[i], y[i]) for i < min(x.size(), y.size()); points with a
// non-finite coordinate are left out. uPlot draws a line's points in the order of x.
struct Series {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;
};

struct ChartSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<Series> series;
  // Draw each series as a step function that holds a value until the next x (queue lengths,
  // empirical CDFs) instead of joining the points with straight lines.
  bool step = false;
  // Stretch both axes to include zero.
  bool include_zero = true;
};

// The chart as the page's drawing script reads it: {"title", "x_label", "y_label", "step",
// "include_zero", "series": [{"name", "x": [...], "y": [...]}]}, each series with its finite
// points only, in their order.
nlohmann::json ChartData(const ChartSpec& spec);

// The empirical CDF of `values` (non-finite values left out): x the sorted values, y the share
// of values <= x, starting at (smallest value, 0) and ending at (largest value, 1). Long inputs
// are downsampled evenly to at most kMaxCdfPoints points (the first and last values are kept).
// Draw it with `ChartSpec::step`.
inline constexpr int kMaxCdfPoints = 500;
Series CdfSeries(std::string name, std::vector<double> values);

// `text` with &, <, >, " and ' replaced by entities, the control characters XML 1.0 forbids
// (all below 0x20 but tab, newline and carriage return) dropped and bytes that are not UTF-8
// replaced by U+FFFD; safe in HTML text and attributes.
std::string XmlEscape(std::string_view text);

}  // namespace gpufleet::sim
