// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/html_page.h"

#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/core/embedded_file.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/sim/internal/report_assets.h"
#include "gpufleet/sim/testing/charts.h"
#include "gpufleet/sim/testing/text.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using testing::ChartsIn;
using testing::CountOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

TEST(HtmlPage, FramesTheBodyWithAnEscapedTitle) {
  const std::string page = HtmlPage("load <peak> & \"more\"", "<p>body</p>\n");
  EXPECT_THAT(page, StartsWith("<!DOCTYPE html>\n<html lang=\"en\">"));
  EXPECT_THAT(page, HasSubstr("<title>load &lt;peak&gt; &amp; &quot;more&quot;</title>"));
  EXPECT_THAT(page, HasSubstr("<h1>load &lt;peak&gt; &amp; &quot;more&quot;</h1>\n<p>body</p>\n"));
  EXPECT_THAT(page, EndsWith("</body>\n</html>\n"));
  EXPECT_EQ(CountOf(page, "<style>"), 1);
  EXPECT_EQ(CountOf(page, "<script"), 0);
}

TEST(HtmlPage, WritesThePageAndReportsAFailedStream) {
  std::ostringstream out;
  ASSERT_OK(WriteHtmlPage("t", "<p>x</p>", out));
  EXPECT_EQ(out.str(), HtmlPage("t", "<p>x</p>"));
  std::ostringstream broken;
  broken.setstate(std::ios::badbit);
  EXPECT_THAT(WriteHtmlPage("t", "", broken), StatusIs(StatusCode::kUnavailable));
}

TEST(HtmlPage, FigureHoldsTheChartsDataAsJson) {
  const ChartSpec spec{.title = "c", .series = {Series{.name = "s", .x = {0, 1}, .y = {1, 2}}}};
  const std::string figure = FigureHtml(spec);
  EXPECT_THAT(figure, StartsWith("<figure class=\"chart\">\n<script type=\"application/json\""));
  EXPECT_THAT(figure, EndsWith("</script>\n</figure>\n"));
  const std::vector<nlohmann::json> charts = ChartsIn(figure);
  ASSERT_EQ(charts.size(), 1U);
  EXPECT_EQ(charts[0], ChartData(spec));
}

TEST(HtmlPage, FigureTextCannotEndItsScript) {
  const ChartSpec spec{.title = "</script><b>",
                       .x_label = "x<",
                       .series = {Series{.name = "<&>", .x = {0}, .y = {1}}}};
  const std::string figure = FigureHtml(spec);
  EXPECT_EQ(CountOf(figure, "<"), CountOf("<figure><script></script></figure>", "<"));
  const std::vector<nlohmann::json> charts = ChartsIn(figure);
  ASSERT_EQ(charts.size(), 1U);
  EXPECT_EQ(charts[0].at("title"), "</script><b>");
  EXPECT_EQ(charts[0].at("series")[0].at("name"), "<&>");
}

TEST(HtmlPage, FigureDataOfBytesThatAreNotUtf8IsStillJson) {
  const ChartSpec spec{.title = "bad\xC3(", .series = {}};
  const std::vector<nlohmann::json> charts = ChartsIn(FigureHtml(spec));
  ASSERT_EQ(charts.size(), 1U);
  EXPECT_EQ(charts[0].at("title"), "bad\xEF\xBF\xBD(");
}

TEST(HtmlPage, PageWithChartsCarriesUplotAndDrawsEveryFigure) {
  const ChartSpec spec{.title = "c", .series = {Series{.name = "s", .x = {0, 1}, .y = {1, 2}}}};
  const std::string page = HtmlPage("t", FigureHtml(spec) + FigureHtml(spec));
  // uPlot's own script and stylesheet, embedded whole: the page needs no network.
  ASSERT_EQ(internal::EmbeddedFiles().size(), 2U);
  for (const EmbeddedFile& file : internal::EmbeddedFiles()) {
    EXPECT_GT(file.bytes.size(), 1000U) << file.path;
    EXPECT_THAT(page, HasSubstr(std::string(file.bytes))) << file.path;
  }
  EXPECT_THAT(page, HasSubstr("new uPlot("));
  EXPECT_EQ(CountOf(page, "<style>"), 2);
  EXPECT_EQ(CountOf(page, "<script>"), 2);  // uPlot and the drawing script
  EXPECT_EQ(ChartsIn(page).size(), 2U);
  EXPECT_THAT(page, Not(HasSubstr("http://")));
  EXPECT_THAT(page, Not(HasSubstr(" src=")));
  EXPECT_THAT(page, EndsWith("</script>\n</body>\n</html>\n"));
}

}  // namespace
}  // namespace gpufleet::sim
