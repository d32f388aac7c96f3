// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/chart.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace gpufleet::sim {
namespace {

ChartSpec TwoLines() {
  ChartSpec spec;
  spec.title = "allocation";
  spec.x_label = "arrived load (%)";
  spec.y_label = "allocated (%)";
  spec.series.push_back({"fgd", {0, 50, 100, 130}, {0, 50, 95, 97}});
  spec.series.push_back({"random", {0, 50, 100}, {0, 49, 85}});
  return spec;
}

TEST(ChartData, HoldsTitleAxesAndEverySeriesInOrder) {
  const nlohmann::json data = ChartData(TwoLines());
  EXPECT_EQ(data.at("title"), "allocation");
  EXPECT_EQ(data.at("x_label"), "arrived load (%)");
  EXPECT_EQ(data.at("y_label"), "allocated (%)");
  EXPECT_EQ(data.at("step"), false);
  EXPECT_EQ(data.at("include_zero"), true);
  ASSERT_EQ(data.at("series").size(), 2U);
  EXPECT_EQ(data.at("series")[0].at("name"), "fgd");
  EXPECT_EQ(data.at("series")[0].at("x"), nlohmann::json({0, 50, 100, 130}));
  EXPECT_EQ(data.at("series")[0].at("y"), nlohmann::json({0, 50, 95, 97}));
  EXPECT_EQ(data.at("series")[1].at("name"), "random");
  EXPECT_EQ(data.at("series")[1].at("x"), nlohmann::json({0, 50, 100}));
  EXPECT_EQ(data.at("series")[1].at("y"), nlohmann::json({0, 49, 85}));
}

TEST(ChartData, CarriesTheStepAndZeroChoices) {
  ChartSpec spec = TwoLines();
  spec.step = true;
  spec.include_zero = false;
  const nlohmann::json data = ChartData(spec);
  EXPECT_EQ(data.at("step"), true);
  EXPECT_EQ(data.at("include_zero"), false);
}

TEST(ChartData, LeavesOutNonFinitePointsAndUnpairedValues) {
  ChartSpec spec;
  spec.series.push_back({"gaps", {0, 1, 2, 3, 4}, {1, NAN, 3, INFINITY}});
  spec.series.push_back({"empty", {}, {}});
  const nlohmann::json data = ChartData(spec);
  EXPECT_EQ(data.at("series")[0].at("x"), nlohmann::json({0, 2}));
  EXPECT_EQ(data.at("series")[0].at("y"), nlohmann::json({1, 3}));
  EXPECT_EQ(data.at("series")[1].at("x"), nlohmann::json::array());
  EXPECT_EQ(data.at("series")[1].at("y"), nlohmann::json::array());
  EXPECT_EQ(data.dump().find("null"), std::string::npos);
}

TEST(ChartData, SameInputSameBytes) {
  EXPECT_EQ(ChartData(TwoLines()).dump(), ChartData(TwoLines()).dump());
}

TEST(XmlEscape, ReplacesMarkupDropsControlsAndRepairsUtf8) {
  EXPECT_EQ(XmlEscape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
  EXPECT_EQ(XmlEscape(std::string("t\x01\tx\n", 5)), "t\tx\n");
  EXPECT_EQ(XmlEscape("gr\xC3\xBC\xC3\x9F"), "gr\xC3\xBC\xC3\x9F");  // "grüß"
  EXPECT_EQ(XmlEscape("bad\xC3("), "bad\xEF\xBF\xBD(");              // cut sequence
  EXPECT_EQ(XmlEscape("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");      // overlong
}

TEST(CdfSeries, SortsAndCountsShares) {
  const Series cdf = CdfSeries("delay", {3, 1, NAN, 2, 2});
  EXPECT_EQ(cdf.name, "delay");
  EXPECT_EQ(cdf.x, (std::vector<double>{1, 1, 2, 2, 3}));
  EXPECT_EQ(cdf.y, (std::vector<double>{0, 0.25, 0.5, 0.75, 1}));
}

TEST(CdfSeries, EmptyInputGivesEmptySeries) {
  const Series cdf = CdfSeries("none", {});
  EXPECT_TRUE(cdf.x.empty());
  EXPECT_TRUE(cdf.y.empty());
}

TEST(CdfSeries, DownsamplesLongInputs) {
  std::vector<double> values;
  values.reserve(10'000);
  for (int i = 0; i < 10'000; ++i) {
    values.push_back(10'000 - i);
  }
  const Series cdf = CdfSeries("long", values);
  ASSERT_EQ(cdf.x.size(), static_cast<size_t>(kMaxCdfPoints));
  ASSERT_EQ(cdf.y.size(), cdf.x.size());
  EXPECT_EQ(cdf.x.front(), 1);
  EXPECT_EQ(cdf.y.front(), 0);
  EXPECT_EQ(cdf.x.back(), 10'000);
  EXPECT_EQ(cdf.y.back(), 1);
  for (size_t i = 1; i < cdf.x.size(); ++i) {
    EXPECT_LE(cdf.x[i - 1], cdf.x[i]);
    EXPECT_LT(cdf.y[i - 1], cdf.y[i]);
  }
}

}  // namespace
}  // namespace gpufleet::sim
