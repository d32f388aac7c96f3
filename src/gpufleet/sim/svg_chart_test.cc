// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/svg_chart.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/sim/testing/text.h"

namespace gpufleet::sim {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using ::gpufleet::sim::testing::CountOf;

// The vertices of the polyline whose data-series is `escaped_name`; -1 when there is none.
int CountPolylineVertices(const std::string& svg, const std::string& escaped_name) {
  const size_t start = svg.find("<polyline data-series=\"" + escaped_name + "\"");
  if (start == std::string::npos) {
    return -1;
  }
  const size_t points = svg.find("points=\"", start) + 8;
  const std::string list = svg.substr(points, svg.find('"', points) - points);
  if (list.empty()) {
    return 0;
  }
  return CountOf(list, " ") + 1;
}

// The attribute `name` of the polyline for `escaped_name`.
std::string PolylineAttribute(const std::string& svg, const std::string& escaped_name,
                              const std::string& name) {
  const size_t start = svg.find("<polyline data-series=\"" + escaped_name + "\"");
  const size_t end = svg.find('>', start);
  const size_t at = svg.find(name + "=\"", start);
  if (at == std::string::npos || at > end) {
    return "";
  }
  const size_t value = at + name.size() + 2;
  return svg.substr(value, svg.find('"', value) - value);
}

ChartSpec TwoLines() {
  ChartSpec spec;
  spec.title = "allocation";
  spec.x_label = "arrived load (%)";
  spec.y_label = "allocated (%)";
  spec.series.push_back({"fgd", {0, 50, 100, 130}, {0, 50, 95, 97}});
  spec.series.push_back({"random", {0, 50, 100}, {0, 49, 85}});
  return spec;
}

TEST(SvgChart, IsOneStandaloneSvgElement) {
  const std::string svg = RenderLineChart(TwoLines());
  EXPECT_THAT(svg, StartsWith("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, EndsWith("</svg>\n"));
  EXPECT_EQ(CountOf(svg, "<svg"), 1);
  EXPECT_EQ(CountOf(svg, "</svg>"), 1);
  EXPECT_THAT(svg, HasSubstr("<title>allocation</title>"));
  EXPECT_THAT(svg, HasSubstr(">arrived load (%)</text>"));
  EXPECT_THAT(svg, HasSubstr(">allocated (%)</text>"));
  EXPECT_THAT(svg, Not(HasSubstr("<script")));
}

TEST(SvgChart, OnePolylinePerSeriesWithOneVertexPerPoint) {
  const std::string svg = RenderLineChart(TwoLines());
  EXPECT_EQ(CountOf(svg, "<polyline"), 2);
  EXPECT_EQ(CountPolylineVertices(svg, "fgd"), 4);
  EXPECT_EQ(CountPolylineVertices(svg, "random"), 3);
  EXPECT_THAT(svg, HasSubstr("<title>fgd</title></polyline>"));
  EXPECT_THAT(svg, HasSubstr("<title>random</title></polyline>"));
}

TEST(SvgChart, StepChartsHoldEachValueUntilTheNextPoint) {
  ChartSpec spec = TwoLines();
  spec.step = true;
  const std::string svg = RenderLineChart(spec);
  EXPECT_EQ(CountPolylineVertices(svg, "fgd"), 7);
  EXPECT_EQ(CountPolylineVertices(svg, "random"), 5);
}

TEST(SvgChart, LeavesOutNonFinitePointsAndUnpairedValues) {
  ChartSpec spec;
  spec.series.push_back({"gaps", {0, 1, 2, 3, 4}, {1, NAN, 3, INFINITY}});
  const std::string svg = RenderLineChart(spec);
  EXPECT_EQ(CountPolylineVertices(svg, "gaps"), 2);
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
  EXPECT_THAT(svg, Not(HasSubstr("inf")));
}

TEST(SvgChart, TicksAreRoundValues) {
  const std::string svg = RenderLineChart(TwoLines());
  // x spans 0 .. 130: steps of 20 up to 140; y spans 0 .. 97: steps of 20 up to 100.
  for (const char* label :
       {">0</text>", ">20</text>", ">60</text>", ">100</text>", ">140</text>"}) {
    EXPECT_THAT(svg, HasSubstr(label));
  }
  EXPECT_THAT(svg, Not(HasSubstr(">130</text>")));
  EXPECT_THAT(svg, Not(HasSubstr(">97</text>")));

  ChartSpec shares;
  shares.series.push_back({"cdf", {0, 2.5}, {0, 1}});
  const std::string cdf = RenderLineChart(shares);
  for (const char* label : {">0.0</text>", ">0.2</text>", ">1.0</text>", ">2.5</text>"}) {
    EXPECT_THAT(cdf, HasSubstr(label));
  }
}

TEST(SvgChart, SeriesGetDistinctPaletteColours) {
  ChartSpec spec;
  for (int i = 0; i < 9; ++i) {
    spec.series.push_back({"s" + std::to_string(i), {0, 1}, {0, static_cast<double>(i)}});
  }
  const std::string svg = RenderLineChart(spec);
  std::set<std::string> colours;
  for (int i = 0; i < 8; ++i) {
    colours.insert(PolylineAttribute(svg, "s" + std::to_string(i), "stroke"));
    EXPECT_EQ(PolylineAttribute(svg, "s" + std::to_string(i), "stroke-dasharray"), "");
  }
  EXPECT_EQ(colours.size(), 8U);
  EXPECT_EQ(PolylineAttribute(svg, "s8", "stroke"), PolylineAttribute(svg, "s0", "stroke"));
  EXPECT_NE(PolylineAttribute(svg, "s8", "stroke-dasharray"), "");
}

TEST(SvgChart, EscapesAllText) {
  ChartSpec spec;
  spec.title = "a <b> & \"c\"";
  spec.x_label = "x<";
  spec.y_label = "y&";
  spec.series.push_back({"<&>", {0, 1}, {0, 1}});
  const std::string svg = RenderLineChart(spec);
  EXPECT_THAT(svg, HasSubstr("<title>a &lt;b&gt; &amp; &quot;c&quot;</title>"));
  EXPECT_THAT(svg, HasSubstr(">x&lt;</text>"));
  EXPECT_THAT(svg, HasSubstr(">y&amp;</text>"));
  EXPECT_EQ(CountPolylineVertices(svg, "&lt;&amp;&gt;"), 2);
  EXPECT_THAT(svg, Not(HasSubstr("<&>")));
  EXPECT_THAT(svg, Not(HasSubstr("<b>")));
}

TEST(SvgChart, EmptyChartSaysNoData) {
  ChartSpec spec;
  spec.title = "nothing";
  spec.series.push_back({"empty", {}, {}});
  const std::string svg = RenderLineChart(spec);
  EXPECT_THAT(svg, HasSubstr(">no data</text>"));
  EXPECT_EQ(CountPolylineVertices(svg, "empty"), 0);
}

TEST(SvgChart, SameInputSameBytes) {
  EXPECT_EQ(RenderLineChart(TwoLines()), RenderLineChart(TwoLines()));
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
