// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/html_page.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/sim/testing/text.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using testing::CountOf;
using ::testing::EndsWith;
using ::testing::HasSubstr;
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

TEST(HtmlPage, FigureHoldsTheChart) {
  const ChartSpec spec{.title = "c", .series = {Series{.name = "s", .x = {0, 1}, .y = {1, 2}}}};
  const std::string figure = FigureHtml(spec);
  EXPECT_THAT(figure, StartsWith("<figure>\n<svg"));
  EXPECT_THAT(figure, EndsWith("</figure>\n"));
  EXPECT_THAT(figure, HasSubstr("data-series=\"s\""));
}

}  // namespace
}  // namespace gpufleet::sim
