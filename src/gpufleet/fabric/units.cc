// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/units.h"

#include <array>
#include <charconv>
#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace gpufleet::fabric {
namespace {

struct Unit {
  std::string_view suffix;
  double mbps;  // one unit in Mb/s
};

// Longest suffixes first, so "Gb/s" wins over "G".
constexpr std::array<Unit, 16> kUnits = {{{"Tb/s", 1e6},
                                          {"Gb/s", 1e3},
                                          {"Mb/s", 1},
                                          {"TB/s", 8e6},
                                          {"GB/s", 8e3},
                                          {"MB/s", 8},
                                          {"Tbps", 1e6},
                                          {"Gbps", 1e3},
                                          {"Mbps", 1},
                                          {"Tb", 1e6},
                                          {"Gb", 1e3},
                                          {"Mb", 1},
                                          {"T", 1e6},
                                          {"G", 1e3},
                                          {"M", 1},
                                          {"", 1e3}}};

}  // namespace

Result<int64_t> ParseSpeedMbps(std::string_view text, std::string_view field) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" {}", field, text, why));
  };
  std::string_view trimmed = text;
  while (!trimmed.empty() && trimmed.front() == ' ') {
    trimmed.remove_prefix(1);
  }
  while (!trimmed.empty() && trimmed.back() == ' ') {
    trimmed.remove_suffix(1);
  }
  for (const Unit& unit : kUnits) {
    if (trimmed.size() <= unit.suffix.size() ||
        trimmed.substr(trimmed.size() - unit.suffix.size()) != unit.suffix) {
      continue;
    }
    std::string_view number = trimmed.substr(0, trimmed.size() - unit.suffix.size());
    while (!number.empty() && number.back() == ' ') {
      number.remove_suffix(1);
    }
    double value = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (number.empty() || error != std::errc() || end != number.data() + number.size() ||
        !std::isfinite(value)) {
      continue;
    }
    if (value < 0) {
      return bad("is negative (a speed must be positive)");
    }
    const double mbps = std::round(value * unit.mbps);
    if (mbps < 1) {
      return bad("is zero (a speed must be positive)");
    }
    if (mbps > 1e15) {
      return bad("is out of range");
    }
    return static_cast<int64_t>(mbps);
  }
  return bad("is not a speed (e.g. 400G, 400Gb/s, 1.6T, 450GB/s)");
}

std::string FormatSpeed(int64_t mbps) {
  if (mbps % 1000000 == 0) {
    return fmt::format("{}T", mbps / 1000000);
  }
  if (mbps >= 1000000 && mbps % 100000 == 0) {
    return fmt::format("{}T", static_cast<double>(mbps) / 1e6);
  }
  if (mbps % 1000 == 0) {
    return fmt::format("{}G", mbps / 1000);
  }
  if (mbps >= 1000 && mbps % 100 == 0) {
    return fmt::format("{}G", static_cast<double>(mbps) / 1e3);
  }
  return fmt::format("{}M", mbps);
}

std::string FormatByteSpeed(int64_t mbps) {
  if (mbps % 8000 == 0) {
    return fmt::format("{}GB/s", mbps / 8000);
  }
  if (mbps % 8 == 0) {
    return fmt::format("{}MB/s", mbps / 8);
  }
  return FormatSpeed(mbps);
}

std::string FormatBandwidth(double mbps) {
  if (mbps >= 1e6) {
    return fmt::format("{:.1f} Tb/s", mbps / 1e6);
  }
  if (mbps >= 1e3) {
    return fmt::format("{:g} Gb/s", std::round(mbps / 1e2) / 10.0);
  }
  return fmt::format("{:g} Mb/s", mbps);
}

}  // namespace gpufleet::fabric
