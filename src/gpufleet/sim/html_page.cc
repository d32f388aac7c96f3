// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/html_page.h"

#include <iterator>

#include <fmt/format.h>

#include "gpufleet/sim/internal/report_assets.h"

namespace gpufleet::sim {
namespace {

constexpr char kStyle[] = R"css(
body { font-family: Helvetica, Arial, sans-serif; color: #222; max-width: 1100px;
       margin: 2rem auto; padding: 0 1rem; line-height: 1.4; }
h1 { font-size: 1.5rem; margin-bottom: 0.3rem; }
h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
p.note { color: #555; font-size: 0.9rem; margin-top: 0; }
p.claim { font-size: 1.05rem; }
table { border-collapse: collapse; font-size: 0.85rem; }
th, td { border: 1px solid #ccc; padding: 3px 8px; }
th { background: #f3f3f3; text-align: center; font-weight: 600; }
td { text-align: left; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1.5rem 0; }
figure svg { max-width: 100%; height: auto; }
figure.chart .no-data { color: #777; }
)css";

// The attribute of a figure's data script: its presence makes HtmlPage add uPlot and kDrawCharts
// (escaped text cannot hold it: XmlEscape replaces the quotes).
constexpr char kChartDataAttribute[] = "class=\"chart-data\"";

// Draws every figure's chart with uPlot: a colour-blind-safe palette (Okabe & Ito, "Color
// Universal Design"; yellow, the hardest to see on white, last) that repeats with dashes after
// eight series; series joined on one x axis (uPlot's aligned data), each line spanning the x
// values of the others; step charts hold each value until the next x.
constexpr char kDrawCharts[] = R"js(
(() => {
  const palette = ['#0072B2', '#E69F00', '#009E73', '#D55E00', '#CC79A7', '#56B4E9', '#000000',
                   '#F0E442'];
  const dashes = [undefined, [6, 3], [2, 3], [8, 3, 2, 3]];
  const withZero = (u, min, max) => uPlot.rangeNum(Math.min(min ?? 0, 0), Math.max(max ?? 0, 0),
                                                   0.1, true);
  for (const data of document.querySelectorAll('script.chart-data')) {
    const chart = JSON.parse(data.textContent);
    const figure = data.parentElement;
    const lines = chart.series;
    const aligned = lines.length ? uPlot.join(lines.map((s) => [s.x, s.y])) : [[]];
    const range = chart.include_zero ? withZero : undefined;
    new uPlot({
      title: chart.title,
      width: Math.min(800, figure.clientWidth || 800),
      height: 400,
      scales: {x: {time: false, range}, y: {range}},
      axes: [{label: chart.x_label}, {label: chart.y_label, size: 60}],
      series: [{label: chart.x_label}].concat(lines.map((s, i) => ({
        label: s.name,
        stroke: palette[i % palette.length],
        dash: dashes[Math.floor(i / palette.length) % dashes.length],
        width: 2,
        spanGaps: true,
        paths: chart.step ? uPlot.paths.stepped({align: 1}) : undefined,
        points: {show: s.x.length === 1},  // a lone point draws no line
      }))),
    }, aligned, figure);
    if (aligned[0].length === 0) {
      const note = document.createElement('p');
      note.className = 'no-data';
      note.textContent = 'no data';
      figure.append(note);
    }
  }
})();
)js";

std::string_view EmbeddedAsset(std::string_view name) {
  for (const EmbeddedFile& file : internal::EmbeddedFiles()) {
    if (file.path == name) {
      return file.bytes;
    }
  }
  return {};
}

}  // namespace

std::string HtmlPage(std::string_view title, std::string_view body) {
  const bool has_charts = body.find(kChartDataAttribute) != std::string_view::npos;
  std::string page;
  fmt::format_to(std::back_inserter(page),
                 "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                 "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                 "<title>{0}</title>\n<style>{1}</style>\n",
                 XmlEscape(title), kStyle);
  if (has_charts) {
    fmt::format_to(std::back_inserter(page), "<style>{}</style>\n", EmbeddedAsset("uPlot.min.css"));
  }
  fmt::format_to(std::back_inserter(page), "</head>\n<body>\n<h1>{}</h1>\n", XmlEscape(title));
  page += body;
  if (has_charts) {
    fmt::format_to(std::back_inserter(page), "<script>{}</script>\n<script>{}</script>\n",
                   EmbeddedAsset("uPlot.iife.min.js"), kDrawCharts);
  }
  page += "</body>\n</html>\n";
  return page;
}

Status WriteHtmlPage(std::string_view title, std::string_view body, std::ostream& out) {
  out << HtmlPage(title, body);
  out.flush();
  if (!out) {
    return UnavailableError("writing the report failed");
  }
  return Status::Ok();
}

std::string FigureHtml(const ChartSpec& spec) {
  // Bytes that are not UTF-8 (a trace's job names) become U+FFFD instead of an exception.
  const std::string data =
      ChartData(spec).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // "<" appears only inside JSON strings, where \u003c stands for it: no "</script>" can end
  // the script early.
  std::string escaped;
  escaped.reserve(data.size());
  for (const char c : data) {
    if (c == '<') {
      escaped += "\\u003c";
    } else {
      escaped += c;
    }
  }
  return fmt::format(
      "<figure class=\"chart\">\n<script type=\"application/json\" {}>{}</script>\n</figure>\n",
      kChartDataAttribute, escaped);
}

std::string HtmlCell(std::string_view text) {
  return "<td>" + XmlEscape(text) + "</td>";
}

std::string HtmlNumCell(std::string_view text) {
  return "<td class=\"num\">" + XmlEscape(text) + "</td>";
}

}  // namespace gpufleet::sim
