// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/format.h"

#include <fmt/format.h>

namespace gpufleet::policy {
namespace {

constexpr uint64_t kSecondsPerMinute = 60;
constexpr uint64_t kSecondsPerHour = 3600;
constexpr uint64_t kSecondsPerDay = 86400;

}  // namespace

std::string FormatSpan(int64_t seconds) {
  // The magnitude as unsigned, so that even INT64_MIN has one.
  uint64_t left = seconds < 0 ? 0 - static_cast<uint64_t>(seconds) : static_cast<uint64_t>(seconds);
  struct Unit {
    uint64_t seconds;
    const char* suffix;
  };
  static constexpr Unit kUnits[] = {
      {kSecondsPerDay, "d"}, {kSecondsPerHour, "h"}, {kSecondsPerMinute, "m"}, {1, "s"}};
  std::string text = seconds < 0 ? "-" : "";
  int shown = 0;
  for (const Unit& unit : kUnits) {
    const uint64_t count = left / unit.seconds;
    left %= unit.seconds;
    if (count > 0) {
      text += fmt::format("{}{}", count, unit.suffix);
    }
    // Two units from the first non-zero one, so "1h0m" is shown as "1h".
    if (count > 0 || shown > 0) {
      ++shown;
    }
    if (shown == 2) {
      break;
    }
  }
  return seconds == 0 ? "0s" : text;
}

std::string FormatClock(int64_t seconds) {
  constexpr int64_t kDay = kSecondsPerDay;
  int64_t of_day = seconds % kDay;
  if (of_day < 0) {
    of_day += kDay;
  }
  const auto of_day_unsigned = static_cast<uint64_t>(of_day);
  return fmt::format("{:02}:{:02}", of_day_unsigned / kSecondsPerHour,
                     (of_day_unsigned % kSecondsPerHour) / kSecondsPerMinute);
}

std::string FormatPercentMilli(int64_t milli) {
  if (milli % 10 == 0) {
    return fmt::format("{}%", milli / 10);
  }
  return fmt::format("{:.1f}%", static_cast<double>(milli) / 10.0);
}

}  // namespace gpufleet::policy
