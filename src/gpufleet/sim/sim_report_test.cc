// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/sim_report.h"

#include <algorithm>
#include <cstdint>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/sim/internal/report_assets.h"
#include "gpufleet/sim/testing/charts.h"
#include "gpufleet/sim/testing/text.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

using ::gpufleet::sim::testing::ChartsIn;
using ::gpufleet::sim::testing::ChartsWithSeries;
using ::gpufleet::sim::testing::CountOf;
using ::gpufleet::sim::testing::SeriesNamed;

// `html` with the text of every script left out (a script's code may hold "<" and tag names).
std::string WithoutScriptText(std::string html) {
  for (size_t open = html.find("<script"); open != std::string::npos;
       open = html.find("<script", open + 1)) {
    const size_t text = html.find('>', open) + 1;
    html.erase(text, html.find("</script>", text) - text);
  }
  return html;
}

// Empty when every html, head, body, table, tr, td, th, figure, script, svg, g, polyline, path,
// text and title element opened in `html` is closed, in order; otherwise what went wrong.
std::string CheckNesting(const std::string& page) {
  static const std::set<std::string> kChecked = {"html", "head",     "body",   "table",  "tr",
                                                 "td",   "th",       "figure", "script", "svg",
                                                 "g",    "polyline", "path",   "text",   "title"};
  static const std::regex kTag(R"(<(/?)([A-Za-z][A-Za-z0-9]*)([^>]*)>)");
  const std::string html = WithoutScriptText(page);
  std::vector<std::string> open;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), kTag); it != std::sregex_iterator();
       ++it) {
    const std::string name = (*it)[2];
    const std::string attributes = (*it)[3];
    if (kChecked.count(name) == 0) {
      continue;
    }
    const bool closing = (*it)[1] == "/";
    const bool self_closing = !attributes.empty() && attributes.back() == '/';
    if (self_closing) {
      continue;
    }
    if (!closing) {
      open.push_back(name);
    } else if (open.empty() || open.back() != name) {
      return "</" + name + "> closes <" + (open.empty() ? std::string("nothing") : open.back()) +
             "> at offset " + std::to_string(it->position());
    } else {
      open.pop_back();
    }
  }
  if (!open.empty()) {
    return "<" + open.back() + "> is never closed";
  }
  return "";
}

// `html` without the bytes of the embedded chart library (whose licence comment names its home
// page) and the SVG namespace: what is left may reference nothing outside the page.
std::string WithoutUplot(std::string html) {
  for (const EmbeddedFile& file : internal::EmbeddedFiles()) {
    for (size_t pos = html.find(file.bytes); pos != std::string::npos;
         pos = html.find(file.bytes, pos)) {
      html.erase(pos, file.bytes.size());
    }
  }
  const std::string xmlns = "xmlns=\"http://www.w3.org/2000/svg\"";
  for (size_t pos = html.find(xmlns); pos != std::string::npos; pos = html.find(xmlns, pos)) {
    html.erase(pos, xmlns.size());
  }
  return html;
}

// No reference outside the page; the only scripts are the charts' data, uPlot and the script
// that draws the charts.
void ExpectSelfContained(const std::string& html) {
  const std::string rest = WithoutUplot(html);
  EXPECT_THAT(rest, Not(HasSubstr("http://")));
  EXPECT_THAT(rest, Not(HasSubstr("https://")));
  EXPECT_THAT(rest, Not(HasSubstr("src=")));
  EXPECT_THAT(rest, Not(HasSubstr("href=")));
  EXPECT_THAT(rest, Not(HasSubstr("url(")));
  const int charts = static_cast<int>(ChartsIn(html).size());
  EXPECT_EQ(CountOf(html, "<script"), charts + (charts > 0 ? 2 : 0));
  EXPECT_EQ(CountOf(html, "<script>"), charts > 0 ? 2 : 0);
}

// The points of the `index`-th series (0-based, in page order) named `name`; -1 when there is
// none.
int SeriesPoints(const std::string& html, const std::string& name, int index = 0) {
  int seen = 0;
  for (const nlohmann::json& chart : ChartsIn(html)) {
    const nlohmann::json series = SeriesNamed(chart, name);
    if (!series.is_null() && seen++ == index) {
      return static_cast<int>(series.at("x").size());
    }
  }
  return -1;
}

FillResult MakeFill(const std::string& policy, uint64_t seed, int last_percent) {
  FillResult result;
  result.policy = policy;
  result.seed = seed;
  result.total_gpus = 1000;
  for (int percent = 0; percent <= last_percent; ++percent) {
    const double allocation = std::min<double>(percent, 90.0 + static_cast<double>(seed % 5));
    result.points.push_back({percent, allocation, percent / 20.0, percent / 10.0});
  }
  return result;
}

std::vector<FillResult> FillRuns() {
  return {MakeFill("fgd", 42, 130), MakeFill("fgd", 43, 120), MakeFill("random", 42, 130)};
}

ReplayResult MakeReplay(const std::string& queue, const std::string& placement, uint64_t seed) {
  ReplayResult result;
  result.queue_policy = queue;
  result.placement_policy = placement;
  result.seed = seed;
  result.total_gpus = 16;
  result.jobs_total = 4;
  result.jobs_finished = 3;
  result.jobs_unplaceable = 1;
  result.makespan_seconds = 7200;
  result.mean_gpus_allocated = 9.5;
  result.queueing_delay = {600, 300, 1200, 1500};
  result.completion_time = {4000, 3600, 7000, 7100};
  for (int i = 0; i < 5; ++i) {
    result.series.push_back({int64_t{1800} * i, 4.0 * i, 0.5 * i, 4 - i, i});
  }
  result.jobs = {{"a", 0, 0, 3600, 4, 0},
                 {"b", 0, 600, 7200, 8, 1},
                 {"c", 100, 1600, 4000, 2, 0},
                 {"d", 200, -1, -1, 64, 0}};
  result.jobs[3].unplaceable_reason = "asks for 64 GPUs, the cluster has 16";
  return result;
}

std::vector<ReplayResult> ReplayRuns() {
  return {MakeReplay("fifo", "best-fit", 42), MakeReplay("tiresias", "fgd", 42)};
}

TEST(CheckNesting, FindsMisnestedAndUnclosedTags) {
  EXPECT_EQ(CheckNesting("<table><tr><td>a</td></tr></table><svg><line/></svg>"), "");
  EXPECT_EQ(CheckNesting("<figure><script>if (i<g.length) {}</script></figure>"), "");
  EXPECT_NE(CheckNesting("<table><tr><td>a</tr></table>"), "");
  EXPECT_NE(CheckNesting("<svg><g></svg>"), "");
  EXPECT_NE(CheckNesting("<html><body>"), "");
}

TEST(FillJson, HasTheRequiredShape) {
  std::ostringstream out;
  WriteFillJson(FillRuns(), out);
  const nlohmann::json json = nlohmann::json::parse(out.str(), nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << out.str();
  EXPECT_EQ(json["mode"], "fill");
  ASSERT_EQ(json["runs"].size(), 3U);
  const nlohmann::json& run = json["runs"][1];
  EXPECT_EQ(run["policy"], "fgd");
  EXPECT_EQ(run["seed"], 43);
  EXPECT_EQ(run["total_gpus"], 1000);
  ASSERT_EQ(run["allocation_ratio"].size(), 131U);
  ASSERT_EQ(run["fragmentation_ratio"].size(), 131U);
  EXPECT_EQ(run["allocation_ratio"][50], 50.0);
  EXPECT_EQ(run["allocation_ratio"][100], 93.0);
  EXPECT_TRUE(run["allocation_ratio"][121].is_null());
  EXPECT_TRUE(run["allocation_ratio"][130].is_null());
  EXPECT_EQ(run["fragmentation_ratio"][100], 5.0);
  EXPECT_DOUBLE_EQ(run["unallocated_gpus_at_100"].get<double>(), 70.0);
  ASSERT_EQ(json["summary"].size(), 2U);
  EXPECT_EQ(json["summary"][0]["policy"], "fgd");
  EXPECT_DOUBLE_EQ(json["summary"][0]["median_unallocated_gpus_at_100"].get<double>(), 75.0);
  EXPECT_DOUBLE_EQ(json["summary"][0]["mean_allocation_ratio_at_100"].get<double>(), 92.5);
  EXPECT_EQ(json["summary"][1]["policy"], "random");
}

TEST(FillJson, NullWhereNotRecordedAndLongerPastOneHundredThirty) {
  FillResult short_run = MakeFill("fgd", 42, 80);
  FillResult long_run = MakeFill("fgd", 43, 150);
  std::ostringstream out;
  WriteFillJson({short_run, long_run}, out);
  const nlohmann::json json = nlohmann::json::parse(out.str(), nullptr, false);
  ASSERT_FALSE(json.is_discarded());
  EXPECT_TRUE(json["runs"][0]["unallocated_gpus_at_100"].is_null());
  EXPECT_EQ(json["runs"][0]["allocation_ratio"].size(), 131U);
  EXPECT_EQ(json["runs"][1]["allocation_ratio"].size(), 151U);
}

TEST(FillJson, KeysInDocumentedOrderAndRoundedNumbers) {
  FillResult run = MakeFill("fgd", 42, 100);
  run.points[100].allocation_percent = 93.123456789;
  std::ostringstream out;
  WriteFillJson({run}, out);
  const std::string text = out.str();
  EXPECT_EQ(text.rfind("{\"mode\":\"fill\",\"runs\":[{\"policy\":\"fgd\",\"seed\":42,"
                       "\"total_gpus\":1000,\"allocation_ratio\":[0.0,1.0,",
                       0),
            0U)
      << text.substr(0, 200);
  EXPECT_THAT(text, HasSubstr(",93.1235,null,"));
  EXPECT_THAT(text, HasSubstr("],\"unallocated_gpus_at_100\":"));
  EXPECT_THAT(text,
              HasSubstr("\"summary\":[{\"policy\":\"fgd\",\"median_unallocated_gpus_at_100\":"));
  EXPECT_EQ(text.back(), '\n');
}

TEST(FillJson, SameInputSameBytes) {
  std::ostringstream first;
  std::ostringstream second;
  WriteFillJson(FillRuns(), first);
  WriteFillJson(FillRuns(), second);
  EXPECT_EQ(first.str(), second.str());
}

TEST(ReplayJson, HasTheRequiredShape) {
  std::ostringstream out;
  WriteReplayJson(ReplayRuns(), out);
  const nlohmann::json json = nlohmann::json::parse(out.str(), nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << out.str();
  EXPECT_EQ(json["mode"], "replay");
  ASSERT_EQ(json["runs"].size(), 2U);
  const nlohmann::json& run = json["runs"][1];
  for (const char* key : {"queue_policy", "placement_policy", "seed", "total_gpus", "jobs_total",
                          "jobs_finished", "jobs_unplaceable", "makespan_seconds",
                          "mean_gpus_allocated", "queueing_delay", "completion_time", "series"}) {
    EXPECT_TRUE(run.contains(key)) << key;
  }
  EXPECT_EQ(run["jobs"].size(), run["jobs_total"].get<size_t>());
  EXPECT_EQ(run["jobs"][1]["gpus"], 8);
  ASSERT_EQ(run["never"].size(), 1U);
  EXPECT_EQ(run["never"][0]["id"], "d");
  EXPECT_EQ(run["never"][0]["reason"], "asks for 64 GPUs, the cluster has 16");
  EXPECT_EQ(run["queue_policy"], "tiresias");
  EXPECT_EQ(run["placement_policy"], "fgd");
  EXPECT_EQ(run["makespan_seconds"], 7200);
  EXPECT_EQ(run["mean_gpus_allocated"], 9.5);
  EXPECT_EQ(run["queueing_delay"]["mean"], 600.0);
  EXPECT_EQ(run["queueing_delay"]["p99"], 1500.0);
  EXPECT_EQ(run["completion_time"]["p50"], 3600.0);
  const nlohmann::json& series = run["series"];
  EXPECT_EQ(series["time_seconds"], nlohmann::json({0, 1800, 3600, 5400, 7200}));
  EXPECT_EQ(series["gpus_allocated"], nlohmann::json({0.0, 4.0, 8.0, 12.0, 16.0}));
  EXPECT_EQ(series["fragmentation_gpus"], nlohmann::json({0.0, 0.5, 1.0, 1.5, 2.0}));
  EXPECT_EQ(series["queue_length"], nlohmann::json({4, 3, 2, 1, 0}));
}

TEST(ReplayJson, SameInputSameBytes) {
  std::ostringstream first;
  std::ostringstream second;
  WriteReplayJson(ReplayRuns(), first);
  WriteReplayJson(ReplayRuns(), second);
  EXPECT_EQ(first.str(), second.str());
}

TEST(FillHtmlReport, IsWellFormedAndSelfContained) {
  std::ostringstream out;
  ASSERT_OK(WriteFillReport(FillRuns(), "fill on openb", out));
  const std::string html = out.str();
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0U);
  EXPECT_EQ(CheckNesting(html), "");
  EXPECT_EQ(ChartsIn(html).size(), 2U);
  EXPECT_EQ(CountOf(html, "<figure class=\"chart\">"), 2);
  ExpectSelfContained(html);
  EXPECT_THAT(html, HasSubstr("<title>fill on openb</title>"));
}

TEST(FillHtmlReport, GapToTheBoundPerPolicyWhenGiven) {
  // fgd leaves 80 (seed 42) and 70 (seed 43) GPUs, random 80 (seed 42).
  const FillBoundsBySeed bounds = {{42, 30.0}, {43, 40.0}};
  std::ostringstream out;
  ASSERT_OK(WriteFillReport(FillRuns(), "fill", out, bounds));
  const std::string html = out.str();
  EXPECT_EQ(CheckNesting(html), "");
  EXPECT_THAT(html, HasSubstr("gap to the lower bound at 100 %"));
  EXPECT_THAT(html, HasSubstr("<td class=\"num\">40.0</td></tr>"));  // fgd: gaps 50 and 30
  EXPECT_THAT(html, HasSubstr("<td class=\"num\">50.0</td></tr>"));  // random: 80 - 30
  EXPECT_THAT(html, HasSubstr("fewer than a median of 35.0 GPUs unallocated"));
  std::ostringstream json;
  WriteFillJson(FillRuns(), json, bounds);
  EXPECT_THAT(json.str(), HasSubstr("\"median_gap_to_bound\":40"));
  EXPECT_THAT(json.str(), HasSubstr("\"bounds\":[{\"seed\":42,\"unallocated_gpus_bound\":30"));
  std::ostringstream plain;
  ASSERT_OK(WriteFillReport(FillRuns(), "fill", plain));
  EXPECT_THAT(plain.str(), ::testing::Not(HasSubstr("lower bound")));
}

TEST(FillHtmlReport, ChartsOneMeanSeriesPerPolicy) {
  std::ostringstream out;
  ASSERT_OK(WriteFillReport(FillRuns(), "fill", out));
  const std::string html = out.str();
  // fgd's seeds reach 130 and 120 %: their mean has a point at each of 0 .. 130.
  EXPECT_EQ(SeriesPoints(html, "fgd", 0), 131);
  EXPECT_EQ(SeriesPoints(html, "random", 0), 131);
  EXPECT_EQ(SeriesPoints(html, "fgd", 1), 131);
  EXPECT_EQ(SeriesPoints(html, "fgd", 2), -1);
  EXPECT_EQ(ChartsWithSeries(ChartsIn(html), "fgd"), 2);
  EXPECT_EQ(ChartsWithSeries(ChartsIn(html), "random"), 2);
  // The summary table: the median unallocated GPUs of fgd (70 and 80) and random (80).
  EXPECT_THAT(html, HasSubstr("<td>fgd</td><td class=\"num\">2</td><td class=\"num\">75.0</td>"));
  EXPECT_THAT(html,
              HasSubstr("<td>random</td><td class=\"num\">1</td><td class=\"num\">80.0</td>"));
}

TEST(FillHtmlReport, EscapesPolicyNames) {
  std::vector<FillResult> runs = FillRuns();
  runs[2].policy = "<&>";
  std::ostringstream html;
  ASSERT_OK(WriteFillReport(runs, "a <title> & more", html));
  EXPECT_THAT(html.str(), Not(HasSubstr("<&>")));
  EXPECT_THAT(html.str(), HasSubstr("<td>&lt;&amp;&gt;</td>"));
  EXPECT_EQ(ChartsWithSeries(ChartsIn(html.str()), "<&>"), 2);
  EXPECT_THAT(html.str(), HasSubstr("<h1>a &lt;title&gt; &amp; more</h1>"));
  EXPECT_EQ(CheckNesting(html.str()), "");

  std::ostringstream json;
  WriteFillJson(runs, json);
  const nlohmann::json parsed = nlohmann::json::parse(json.str(), nullptr, false);
  ASSERT_FALSE(parsed.is_discarded());
  EXPECT_EQ(parsed["runs"][2]["policy"], "<&>");
}

TEST(FillHtmlReport, SameInputSameBytes) {
  std::ostringstream first;
  std::ostringstream second;
  ASSERT_OK(WriteFillReport(FillRuns(), "fill", first));
  ASSERT_OK(WriteFillReport(FillRuns(), "fill", second));
  EXPECT_EQ(first.str(), second.str());
}

TEST(FillHtmlReport, RejectsNoRunsAndReportsFailedStreams) {
  std::ostringstream out;
  EXPECT_THAT(WriteFillReport({}, "fill", out), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(WriteReplayReport({}, "replay", out), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(out.str(), IsEmpty());
  std::ostringstream broken;
  broken.setstate(std::ios::badbit);
  EXPECT_THAT(WriteFillReport(FillRuns(), "fill", broken), StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(WriteReplayReport(ReplayRuns(), "replay", broken),
              StatusIs(StatusCode::kUnavailable));
}

TEST(ReplayHtmlReport, IsWellFormedAndSelfContained) {
  std::ostringstream out;
  ASSERT_OK(WriteReplayReport(ReplayRuns(), "replay", out));
  const std::string html = out.str();
  EXPECT_EQ(CheckNesting(html), "");
  EXPECT_EQ(ChartsIn(html).size(), 4U);
  ExpectSelfContained(html);
  EXPECT_EQ(ChartsIn(html)[0].at("x_label"), "time (hours)");
}

TEST(ReplayHtmlReport, ChartsEveryRun) {
  std::ostringstream out;
  ASSERT_OK(WriteReplayReport(ReplayRuns(), "replay", out));
  const std::string html = out.str();
  for (const char* label : {"fifo/best-fit", "tiresias/fgd"}) {
    SCOPED_TRACE(label);
    EXPECT_EQ(ChartsWithSeries(ChartsIn(html), label), 4);
    EXPECT_EQ(SeriesPoints(html, label, 0), 5);  // GPUs allocated: 5 samples
    EXPECT_EQ(SeriesPoints(html, label, 1), 5);  // queue length
    // Queueing delay of the 3 jobs that started: (min, 0) and 3 ranks.
    EXPECT_EQ(SeriesPoints(html, label, 2), 4);
    // Completion time of the 3 jobs that finished.
    EXPECT_EQ(SeriesPoints(html, label, 3), 4);
  }
  EXPECT_THAT(html, HasSubstr("<td>fifo</td><td>best-fit</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"num\">2.00 h</td>"));        // makespan
  EXPECT_THAT(html, HasSubstr("<td class=\"num\">9.5 (59.4 %)</td>"));  // mean GPUs
  EXPECT_THAT(html, HasSubstr("<td class=\"num\">10.0 min</td>"));      // mean delay
}

TEST(ReplayHtmlReport, SeedsTellRunsWithTheSamePoliciesApart) {
  std::vector<ReplayResult> runs = {MakeReplay("fifo", "fgd", 1), MakeReplay("fifo", "fgd", 2),
                                    MakeReplay("sjf", "fgd", 1)};
  std::ostringstream out;
  ASSERT_OK(WriteReplayReport(runs, "replay", out));
  const std::vector<nlohmann::json> charts = ChartsIn(out.str());
  EXPECT_EQ(ChartsWithSeries(charts, "fifo/fgd s1"), 4);
  EXPECT_EQ(ChartsWithSeries(charts, "fifo/fgd s2"), 4);
  EXPECT_EQ(ChartsWithSeries(charts, "sjf/fgd"), 4);
}

TEST(ReplayHtmlReport, SameInputSameBytes) {
  std::ostringstream first;
  std::ostringstream second;
  ASSERT_OK(WriteReplayReport(ReplayRuns(), "replay", first));
  ASSERT_OK(WriteReplayReport(ReplayRuns(), "replay", second));
  EXPECT_EQ(first.str(), second.str());
}

TEST(ProgressBar, DisabledWritesNothing) {
  std::ostringstream err;
  {
    ProgressBar bar(err, /*enabled=*/false, "runs", 3);
    bar.Advance();
    bar.Finish();
    EXPECT_EQ(bar.done(), 1);
  }
  EXPECT_THAT(err.str(), IsEmpty());
}

TEST(ProgressBar, DrawsCountsAndEndsTheLineOnce) {
  std::ostringstream err;
  ProgressBar bar(err, /*enabled=*/true, "fill runs", 4);
  bar.Advance();
  EXPECT_EQ(err.str(), "\r[#######                       ] 1/4 fill runs");
  err.str("");
  bar.Advance(10);  // clamped
  EXPECT_EQ(err.str(), "\r[##############################] 4/4 fill runs");
  err.str("");
  bar.Finish();
  bar.Finish();
  bar.Advance();
  EXPECT_EQ(err.str(), "\r[##############################] 4/4 fill runs\n");
}

TEST(ProgressBar, DestructorEndsTheLine) {
  std::ostringstream err;
  { ProgressBar bar(err, /*enabled=*/true, "x", 2); }
  EXPECT_EQ(err.str(), "\r[                              ] 0/2 x\n");
}

TEST(ProgressBar, AdvanceIsThreadSafe) {
  std::ostringstream err;
  ProgressBar bar(err, /*enabled=*/true, "runs", 400);
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&bar] {
      for (int i = 0; i < 100; ++i) {
        bar.Advance();
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(bar.done(), 400);
  EXPECT_EQ(CountOf(err.str(), "\r["), 400);
  EXPECT_THAT(err.str(), HasSubstr("] 400/400 runs"));
}

}  // namespace
}  // namespace gpufleet::sim
