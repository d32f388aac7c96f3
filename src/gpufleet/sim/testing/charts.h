// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/core/status.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::sim::testing {

// The data of each chart of a report page (html_page.h's FigureHtml), in page order; a chart
// whose data is not JSON fails the test.
inline std::vector<nlohmann::json> ChartsIn(const std::string& html) {
  constexpr std::string_view kOpen = "<script type=\"application/json\" class=\"chart-data\">";
  std::vector<nlohmann::json> charts;
  for (size_t at = html.find(kOpen); at != std::string::npos; at = html.find(kOpen, at)) {
    at += kOpen.size();
    const size_t end = html.find("</script>", at);
    Result<nlohmann::json> chart = wire::ParseJson(std::string_view(html).substr(at, end - at));
    if (!chart.ok()) {
      ADD_FAILURE() << "chart " << charts.size() << ": " << chart.status().ToString();
      charts.emplace_back();
      continue;
    }
    charts.push_back(std::move(chart).value());
  }
  return charts;
}

// The series of `chart` named `name`, or null.
inline nlohmann::json SeriesNamed(const nlohmann::json& chart, std::string_view name) {
  for (const nlohmann::json& series : chart.at("series")) {
    if (series.at("name") == name) {
      return series;
    }
  }
  return nullptr;
}

// How many charts of `charts` have a series named `name`.
inline int ChartsWithSeries(const std::vector<nlohmann::json>& charts, std::string_view name) {
  int count = 0;
  for (const nlohmann::json& chart : charts) {
    count += SeriesNamed(chart, name).is_null() ? 0 : 1;
  }
  return count;
}

}  // namespace gpufleet::sim::testing
