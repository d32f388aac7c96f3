// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <string_view>
#include <vector>

// A small writer of standalone SVG line charts for the simulator's reports: no scripts, no
// external references, deterministic bytes for the same input.
namespace gpufleet::sim {

// One line of a chart. Points are (x[i], y[i]) for i < min(x.size(), y.size()), drawn in the
// given order; points with a non-finite coordinate are left out.
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

// A standalone `<svg>` element (with the SVG xmlns) holding a title, axes with round tick values
// and labels, a legend and one `<polyline data-series="NAME">` with a `<title>` per series, each
// in a distinct colour of a fixed colour-blind-safe palette (Okabe-Ito; after eight series the
// colours repeat with dashes). A polyline has one vertex per point, or 2n - 1 for n points when
// `spec.step`. All text is XML-escaped.
std::string RenderLineChart(const ChartSpec& spec);

// The empirical CDF of `values` (non-finite values left out): x the sorted values, y the share
// of values <= x, starting at (smallest value, 0) and ending at (largest value, 1). Long inputs
// are downsampled evenly to at most kMaxCdfPoints points (the first and last values are kept).
// Draw it with `ChartSpec::step`.
inline constexpr int kMaxCdfPoints = 500;
Series CdfSeries(std::string name, std::vector<double> values);

// `text` with &, <, >, " and ' replaced by entities and the control characters XML 1.0 forbids
// (all below 0x20 but tab, newline and carriage return) dropped; safe in text and attributes.
std::string XmlEscape(std::string_view text);

}  // namespace gpufleet::sim
