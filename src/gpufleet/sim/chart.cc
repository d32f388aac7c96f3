// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/chart.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>

namespace gpufleet::sim {
namespace {

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

nlohmann::json ChartData(const ChartSpec& spec) {
  nlohmann::json series = nlohmann::json::array();
  for (const Series& line : spec.series) {
    nlohmann::json x = nlohmann::json::array();
    nlohmann::json y = nlohmann::json::array();
    const size_t n = std::min(line.x.size(), line.y.size());
    for (size_t i = 0; i < n; ++i) {
      if (std::isfinite(line.x[i]) && std::isfinite(line.y[i])) {
        x.push_back(line.x[i]);
        y.push_back(line.y[i]);
      }
    }
    series.push_back({{"name", line.name}, {"x", std::move(x)}, {"y", std::move(y)}});
  }
  return {
      {"title", spec.title}, {"x_label", spec.x_label},           {"y_label", spec.y_label},
      {"step", spec.step},   {"include_zero", spec.include_zero}, {"series", std::move(series)}};
}

}  // namespace gpufleet::sim
