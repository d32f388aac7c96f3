// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/svg_chart.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <utility>

#include <fmt/format.h>

namespace gpufleet::sim {
namespace {

// Okabe & Ito, "Color Universal Design": distinguishable with every common colour-vision
// deficiency. Yellow comes last; it is the hardest to see on white.
constexpr std::array<const char*, 8> kPalette = {"#0072B2", "#E69F00", "#009E73", "#D55E00",
                                                 "#CC79A7", "#56B4E9", "#000000", "#F0E442"};
// After every colour has been used once, the colours repeat with these dash patterns.
constexpr std::array<const char*, 4> kDashes = {"", "6 3", "2 3", "8 3 2 3"};

constexpr int kWidth = 800;
constexpr int kMinHeight = 400;
constexpr int kLeft = 72;    // room for the y tick labels and the y label
constexpr int kRight = 230;  // room for the legend
constexpr int kTop = 44;     // room for the title
constexpr int kBottom = 56;  // room for the x tick labels and the x label
constexpr int kLegendRow = 18;
constexpr int kMaxIntervals = 8;
constexpr int kLegendMaxChars = 30;

constexpr char kAxisColour[] = "#333333";
constexpr char kGridColour[] = "#e3e3e3";

// An axis from `lo` to `hi` (both tick values) with ticks every `step`.
struct Axis {
  double lo = 0;
  double hi = 1;
  double step = 0.2;
  int decimals = 1;
  std::vector<double> ticks;
};

// The smallest step of 1, 2 or 5 x 10^k that covers [lo, hi] with at most kMaxIntervals
// intervals. REQUIRES: lo < hi, both finite.
Axis NiceAxis(double lo, double hi) {
  const double raw = (hi - lo) / kMaxIntervals;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  double first = 0;
  double last = 1;
  for (double multiple : {1.0, 2.0, 5.0, 10.0, 20.0}) {
    step = multiple * magnitude;
    first = std::floor(lo / step + 1e-9);
    last = std::ceil(hi / step - 1e-9);
    if (last - first <= kMaxIntervals) {
      break;
    }
  }
  Axis axis;
  axis.step = step;
  axis.lo = first * step;
  axis.hi = last * step;
  axis.decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  const int intervals = static_cast<int>(last - first);
  for (int i = 0; i <= intervals; ++i) {
    axis.ticks.push_back((first + i) * step);
  }
  return axis;
}

// [lo, hi] of the data stretched so that it is never empty (and holds 0 when asked).
std::pair<double, double> Range(double lo, double hi, bool include_zero) {
  if (include_zero) {
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
  }
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= include_zero && lo >= 0 ? 0 : pad;
    hi += pad;
  }
  return {lo, hi};
}

std::string TickLabel(double value, const Axis& axis) {
  if (std::abs(value) < axis.step * 1e-6) {
    value = 0;  // no "-0"
  }
  return fmt::format("{:.{}f}", value, axis.decimals);
}

std::string Coord(double value) {
  if (std::abs(value) < 0.005) {
    value = 0;  // no "-0.00"
  }
  return fmt::format("{:.2f}", value);
}

// At most `max_chars` code points of `text`, with an ellipsis when cut.
std::string Truncate(const std::string& text, int max_chars) {
  int chars = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if ((byte & 0xC0) != 0x80) {
      if (chars == max_chars) {
        return text.substr(0, i) + "\u2026";
      }
      ++chars;
    }
  }
  return text;
}

// The length of the valid UTF-8 sequence at the start of `text`, or 0 when it is not one.
size_t Utf8SequenceLength(std::string_view text) {
  const auto lead = static_cast<unsigned char>(text[0]);
  size_t length = 0;
  uint32_t code_point = 0;
  if (lead < 0x80) {
    return 1;
  } else if ((lead & 0xE0) == 0xC0) {
    length = 2;
    code_point = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    code_point = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    code_point = lead & 0x07;
  } else {
    return 0;
  }
  if (text.size() < length) {
    return 0;
  }
  for (size_t i = 1; i < length; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if ((byte & 0xC0) != 0x80) {
      return 0;
    }
    code_point = (code_point << 6) | (byte & 0x3F);
  }
  constexpr std::array<uint32_t, 5> kMinCodePoint = {0, 0, 0x80, 0x800, 0x10000};
  const bool overlong = code_point < kMinCodePoint[length];
  const bool surrogate = code_point >= 0xD800 && code_point <= 0xDFFF;
  if (overlong || surrogate || code_point > 0x10FFFF || code_point == 0xFFFE ||
      code_point == 0xFFFF) {
    return 0;
  }
  return length;
}

}  // namespace

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default: {
        const auto byte = static_cast<unsigned char>(c);
        if (byte < 0x20) {
          if (c == '\t' || c == '\n' || c == '\r') {
            out += c;
          }
          break;
        }
        const size_t length = Utf8SequenceLength(text.substr(i));
        if (length == 0) {
          out += "\uFFFD";  // not UTF-8: an XML parser would reject the document
          break;
        }
        out.append(text.substr(i, length));
        i += length;
        continue;
      }
    }
    ++i;
  }
  return out;
}

Series CdfSeries(std::string name, std::vector<double> values) {
  Series series;
  series.name = std::move(name);
  values.erase(std::remove_if(values.begin(), values.end(),
                              [](double value) { return !std::isfinite(value); }),
               values.end());
  if (values.empty()) {
    return series;
  }
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  series.x.push_back(values.front());
  series.y.push_back(0.0);
  // Ranks (index + 1) to keep: all of them, or kMaxCdfPoints - 1 spread evenly up to n.
  const size_t kept = std::min(n, static_cast<size_t>(kMaxCdfPoints - 1));
  for (size_t k = 1; k <= kept; ++k) {
    const size_t rank = kept == n ? k : k * n / kept;
    series.x.push_back(values[rank - 1]);
    series.y.push_back(static_cast<double>(rank) / static_cast<double>(n));
  }
  return series;
}

std::string RenderLineChart(const ChartSpec& spec) {
  // The finite points of each series.
  std::vector<std::vector<std::pair<double, double>>> points(spec.series.size());
  constexpr double kInfinity = std::numeric_limits<double>::infinity();
  double x_lo = kInfinity;
  double x_hi = -kInfinity;
  double y_lo = kInfinity;
  double y_hi = -kInfinity;
  for (size_t s = 0; s < spec.series.size(); ++s) {
    const Series& series = spec.series[s];
    const size_t n = std::min(series.x.size(), series.y.size());
    for (size_t i = 0; i < n; ++i) {
      const double x = series.x[i];
      const double y = series.y[i];
      if (!std::isfinite(x) || !std::isfinite(y)) {
        continue;
      }
      points[s].emplace_back(x, y);
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  }
  const bool has_data = x_lo <= x_hi;
  if (!has_data) {
    x_lo = y_lo = 0;
    x_hi = y_hi = 1;
  }
  const auto [x_min, x_max] = Range(x_lo, x_hi, spec.include_zero);
  const auto [y_min, y_max] = Range(y_lo, y_hi, spec.include_zero);
  const Axis x_axis = NiceAxis(x_min, x_max);
  const Axis y_axis = NiceAxis(y_min, y_max);

  const int legend_height = kLegendRow * static_cast<int>(spec.series.size()) + 16;
  const int height = std::max(kMinHeight, kTop + legend_height + kBottom);
  const double plot_width = kWidth - kLeft - kRight;
  const double plot_height = height - kTop - kBottom;
  const double plot_bottom = kTop + plot_height;
  const double plot_right = kLeft + plot_width;
  auto px = [&](double x) {
    return kLeft + (x - x_axis.lo) / (x_axis.hi - x_axis.lo) * plot_width;
  };
  auto py = [&](double y) {
    return plot_bottom - (y - y_axis.lo) / (y_axis.hi - y_axis.lo) * plot_height;
  };

  std::string out;
  auto append = [&out]<typename... Args>(fmt::format_string<Args...> format, Args&&... args) {
    fmt::format_to(std::back_inserter(out), format, std::forward<Args>(args)...);
  };
  const std::string title = XmlEscape(spec.title);
  append(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" role=\"img\" font-family=\"Helvetica, Arial, sans-serif\" "
      "font-size=\"12\">\n",
      kWidth, height);
  append("<title>{}</title>\n", title);
  append("<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", kLeft, title);

  // Grid, axes, ticks and their labels.
  append("<g class=\"grid\" stroke=\"{}\" stroke-width=\"1\">\n", kGridColour);
  for (double tick : x_axis.ticks) {
    const std::string x = Coord(px(tick));
    append("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", x, Coord(kTop),
           Coord(plot_bottom));
  }
  for (double tick : y_axis.ticks) {
    const std::string y = Coord(py(tick));
    append("<line x1=\"{1}\" y1=\"{0}\" x2=\"{2}\" y2=\"{0}\"/>\n", y, Coord(kLeft),
           Coord(plot_right));
  }
  append("</g>\n");
  append("<g class=\"axes\" stroke=\"{}\" stroke-width=\"1\">\n", kAxisColour);
  append("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", Coord(kLeft), Coord(kTop),
         Coord(plot_bottom));
  append("<line x1=\"{1}\" y1=\"{0}\" x2=\"{2}\" y2=\"{0}\"/>\n", Coord(plot_bottom), Coord(kLeft),
         Coord(plot_right));
  for (double tick : x_axis.ticks) {
    const std::string x = Coord(px(tick));
    append("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\"/>\n", x, Coord(plot_bottom),
           Coord(plot_bottom + 5));
  }
  for (double tick : y_axis.ticks) {
    const std::string y = Coord(py(tick));
    append("<line x1=\"{1}\" y1=\"{0}\" x2=\"{2}\" y2=\"{0}\"/>\n", y, Coord(kLeft - 5),
           Coord(kLeft));
  }
  append("</g>\n");
  append("<g class=\"tick-labels\" fill=\"{}\">\n", kAxisColour);
  for (double tick : x_axis.ticks) {
    append("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", Coord(px(tick)),
           Coord(plot_bottom + 19), TickLabel(tick, x_axis));
  }
  for (double tick : y_axis.ticks) {
    append("<text x=\"{}\" y=\"{}\" dy=\"0.32em\" text-anchor=\"end\">{}</text>\n",
           Coord(kLeft - 8), Coord(py(tick)), TickLabel(tick, y_axis));
  }
  append("</g>\n");
  append("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
         Coord(kLeft + plot_width / 2), height - 14, XmlEscape(spec.x_label));
  const std::string y_label_y = Coord(kTop + plot_height / 2);
  append(
      "<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">{1}"
      "</text>\n",
      y_label_y, XmlEscape(spec.y_label));
  if (!has_data) {
    append("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#777777\">no data</text>\n",
           Coord(kLeft + plot_width / 2), Coord(kTop + plot_height / 2));
  }

  // One polyline per series, then the legend.
  append("<g class=\"series\" fill=\"none\" stroke-width=\"2\" stroke-linejoin=\"round\">\n");
  for (size_t s = 0; s < spec.series.size(); ++s) {
    const std::string name = XmlEscape(spec.series[s].name);
    const char* colour = kPalette[s % kPalette.size()];
    const char* dash = kDashes[(s / kPalette.size()) % kDashes.size()];
    std::string vertices;
    auto add_vertex = [&vertices](double x, double y) {
      if (!vertices.empty()) {
        vertices += ' ';
      }
      vertices += Coord(x);
      vertices += ',';
      vertices += Coord(y);
    };
    for (size_t i = 0; i < points[s].size(); ++i) {
      const auto [x, y] = points[s][i];
      if (spec.step && i > 0) {
        add_vertex(px(x), py(points[s][i - 1].second));
      }
      add_vertex(px(x), py(y));
    }
    append("<polyline data-series=\"{}\" stroke=\"{}\"", name, colour);
    if (*dash != '\0') {
      append(" stroke-dasharray=\"{}\"", dash);
    }
    append(" points=\"{}\"><title>{}</title></polyline>\n", vertices, name);
    if (points[s].size() == 1) {  // a lone point draws no line
      append("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\" stroke=\"none\"/>\n",
             Coord(px(points[s][0].first)), Coord(py(points[s][0].second)), colour);
    }
  }
  append("</g>\n");
  append("<g class=\"legend\">\n");
  const double legend_x = plot_right + 16;
  for (size_t s = 0; s < spec.series.size(); ++s) {
    const double y = kTop + 8 + kLegendRow * static_cast<double>(s);
    const char* dash = kDashes[(s / kPalette.size()) % kDashes.size()];
    append("<line x1=\"{0}\" y1=\"{2}\" x2=\"{1}\" y2=\"{2}\" stroke=\"{3}\" stroke-width=\"2\"",
           Coord(legend_x), Coord(legend_x + 22), Coord(y), kPalette[s % kPalette.size()]);
    if (*dash != '\0') {
      append(" stroke-dasharray=\"{}\"", dash);
    }
    append("/>\n");
    append("<text x=\"{}\" y=\"{}\" dy=\"0.32em\">{}</text>\n", Coord(legend_x + 28), Coord(y),
           XmlEscape(Truncate(spec.series[s].name, kLegendMaxChars)));
  }
  append("</g>\n");
  append("</svg>\n");
  return out;
}

}  // namespace gpufleet::sim
