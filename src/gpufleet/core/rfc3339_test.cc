// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/rfc3339.h"

#include <cstdint>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kSecond = 1'000'000'000;
// 2026-11-29T21:00:00Z.
constexpr int64_t kNineOClock = int64_t{1'795'986'000} * kSecond;

TEST(ParseRfc3339, UtcTimes) {
  EXPECT_EQ(*ParseRfc3339("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(*ParseRfc3339("2026-11-29T21:00:00Z"), kNineOClock);
  EXPECT_EQ(*ParseRfc3339("2024-02-29T00:00:01Z"), int64_t{1'709'164'801} * kSecond);
  EXPECT_EQ(*ParseRfc3339("1969-12-31T23:59:59Z"), -kSecond);
}

TEST(ParseRfc3339, FractionsToTheNanosecond) {
  EXPECT_EQ(*ParseRfc3339("2026-11-29T21:00:00.5Z"), kNineOClock + kSecond / 2);
  EXPECT_EQ(*ParseRfc3339("2026-11-29T21:00:00.123Z"), kNineOClock + 123'000'000);
  EXPECT_EQ(*ParseRfc3339("2026-11-29T21:00:00.000000001Z"), kNineOClock + 1);
  // Beyond nanoseconds the digits are dropped, not rounded.
  EXPECT_EQ(*ParseRfc3339("2026-11-29T21:00:00.9999999999Z"), kNineOClock + 999'999'999);
}

TEST(ParseRfc3339, NumericOffsets) {
  EXPECT_EQ(*ParseRfc3339("2026-11-29T22:00:00+01:00"), kNineOClock);
  EXPECT_EQ(*ParseRfc3339("2026-11-29T15:30:00-05:30"), kNineOClock);
  EXPECT_EQ(*ParseRfc3339("2026-11-29T21:00:00+00:00"), kNineOClock);
  EXPECT_EQ(*ParseRfc3339("2026-11-29T21:00:00-00:00"), kNineOClock);
  // Across midnight and a month's end.
  EXPECT_EQ(*ParseRfc3339("2026-11-30T06:00:00.25+09:00"), kNineOClock + kSecond / 4);
}

TEST(ParseRfc3339, ALeapSecondIsTheNextMinutesFirstSecond) {
  EXPECT_EQ(*ParseRfc3339("2016-12-31T23:59:60Z"), *ParseRfc3339("2017-01-01T00:00:00Z"));
  EXPECT_THAT(ParseRfc3339("2016-12-31T23:59:61Z"), StatusIs(StatusCode::kInvalidArgument));
}

TEST(ParseRfc3339, BadInputIsRefusedQuotingTheText) {
  for (const char* bad :
       {"", "yesterday", "2026-11-29", "2026-11-29T21:00:00", "2026-02-30T00:00:00Z",
        "2026-13-01T10:00:00Z", "2026-11-29T24:00:00Z", "2026-11-29T21:60:00Z",
        "2026-11-29 21:00:00Z", "2026-11-29T21:00:00.Z", "x026-11-29T21:00:00Z",
        "2026-11-29T21:00:00+01", "2026-11-29T21:00:00+0100", "2026-11-29T21:00:00+24:00",
        "2026-11-29T21:00:00+01:60", "2026-11-29T21:00:00ZZ", "2026-11-29T21:00:00z",
        "2026-11-29T21:00:00.5", "2026-11-29T21:00:00Z "}) {
    EXPECT_THAT(ParseRfc3339(bad),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(fmt::format("\"{}\"", bad))))
        << bad;
  }
}

TEST(FormatRfc3339, UtcToTheSecondAndBack) {
  EXPECT_EQ(FormatRfc3339(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(FormatRfc3339(kNineOClock + 999'999'999), "2026-11-29T21:00:00Z");
  EXPECT_EQ(FormatRfc3339(-kSecond), "1969-12-31T23:59:59Z");
  EXPECT_EQ(*ParseRfc3339(FormatRfc3339(kNineOClock)), kNineOClock);
}

}  // namespace
}  // namespace gpufleet
