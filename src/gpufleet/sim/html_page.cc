// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/html_page.h"

#include <iterator>

#include <fmt/format.h>

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
)css";

}  // namespace

std::string HtmlPage(std::string_view title, std::string_view body) {
  std::string page;
  fmt::format_to(std::back_inserter(page),
                 "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                 "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                 "<title>{0}</title>\n<style>{1}</style>\n</head>\n<body>\n<h1>{0}</h1>\n",
                 XmlEscape(title), kStyle);
  page += body;
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
  return "<figure>\n" + RenderLineChart(spec) + "</figure>\n";
}

std::string HtmlCell(std::string_view text) {
  return "<td>" + XmlEscape(text) + "</td>";
}

std::string HtmlNumCell(std::string_view text) {
  return "<td class=\"num\">" + XmlEscape(text) + "</td>";
}

}  // namespace gpufleet::sim
