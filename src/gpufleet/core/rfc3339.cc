// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/rfc3339.h"

#include <chrono>
#include <cstddef>

#include <fmt/format.h>

namespace gpufleet {
namespace {

bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}

// Whether `text` matches `shape`, where 'd' stands for a digit and any other character for itself.
bool Matches(std::string_view text, std::string_view shape) {
  if (text.size() != shape.size()) {
    return false;
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 'd' ? !IsDigit(text[i]) : text[i] != shape[i]) {
      return false;
    }
  }
  return true;
}

// The decimal number of `digits` digits at `at`. REQUIRES: they are digits.
int Number(std::string_view text, size_t at, size_t digits) {
  int value = 0;
  for (size_t i = at; i < at + digits; ++i) {
    value = value * 10 + (text[i] - '0');
  }
  return value;
}

}  // namespace

std::string FormatRfc3339(int64_t unix_nanos) {
  const auto time = std::chrono::floor<std::chrono::seconds>(
      std::chrono::sys_time<std::chrono::nanoseconds>(std::chrono::nanoseconds(unix_nanos)));
  const auto day = std::chrono::floor<std::chrono::days>(time);
  const std::chrono::year_month_day date(day);
  const std::chrono::hh_mm_ss clock_time(time - day);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", static_cast<int>(date.year()),
                     static_cast<unsigned>(date.month()), static_cast<unsigned>(date.day()),
                     clock_time.hours().count(), clock_time.minutes().count(),
                     clock_time.seconds().count());
}

Result<int64_t> ParseRfc3339(std::string_view text) {
  const auto bad = [text] {
    return InvalidArgumentError(
        fmt::format("\"{}\" is not an RFC 3339 time like 2026-11-29T20:39:00Z", text));
  };
  constexpr std::string_view kDateTime = "dddd-dd-ddTdd:dd:dd";
  if (text.size() < kDateTime.size() || !Matches(text.substr(0, kDateTime.size()), kDateTime)) {
    return bad();
  }
  std::string_view rest = text.substr(kDateTime.size());
  int64_t fraction_nanos = 0;
  if (rest.starts_with('.')) {
    size_t digits = 1;
    while (digits < rest.size() && IsDigit(rest[digits])) {
      if (digits <= 9) {
        fraction_nanos = fraction_nanos * 10 + (rest[digits] - '0');
      }
      ++digits;
    }
    if (digits == 1) {
      return bad();
    }
    for (size_t scale = digits; scale <= 9; ++scale) {
      fraction_nanos *= 10;
    }
    rest.remove_prefix(digits);
  }
  int offset_minutes = 0;
  if (rest != "Z") {
    if (!Matches(rest, "+dd:dd") && !Matches(rest, "-dd:dd")) {
      return bad();
    }
    const int hours = Number(rest, 1, 2);
    const int minutes = Number(rest, 4, 2);
    if (hours > 23 || minutes > 59) {
      return bad();
    }
    offset_minutes = (rest[0] == '-' ? -1 : 1) * (hours * 60 + minutes);
  }
  const std::chrono::year_month_day date{
      std::chrono::year(Number(text, 0, 4)),
      std::chrono::month(static_cast<unsigned>(Number(text, 5, 2))),
      std::chrono::day(static_cast<unsigned>(Number(text, 8, 2)))};
  const int hour = Number(text, 11, 2);
  const int minute = Number(text, 14, 2);
  const int second = Number(text, 17, 2);
  if (!date.ok() || hour > 23 || minute > 59 || second > 60) {
    return bad();
  }
  const int64_t days = std::chrono::sys_days(date).time_since_epoch().count();
  const int64_t seconds = days * 86400 + hour * 3600 + (minute - offset_minutes) * 60 + second;
  return seconds * 1'000'000'000 + fraction_nanos;
}

}  // namespace gpufleet
