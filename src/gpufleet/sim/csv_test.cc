// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/csv.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CsvReader, ReadsRecordsWithQuotesAndBlankLines) {
  std::istringstream in("a,b\n1,\"x,\"\"y\"\"\"\n\n2,z\r\n");
  CsvReader csv(in, "t.csv");
  ASSERT_OK(csv.Open());
  ASSERT_TRUE(*csv.Next());
  EXPECT_EQ(*csv.Int(0), 1);
  EXPECT_EQ(csv.Field(1), "x,\"y\"");
  ASSERT_TRUE(*csv.Next());
  EXPECT_EQ(csv.Field(1), "z");
  EXPECT_EQ(csv.line(), 4);
  EXPECT_FALSE(*csv.Next());
}

TEST(CsvReader, ErrorsNameFileLineAndColumn) {
  std::istringstream in("a,b\n1,2\n3\n");
  CsvReader csv(in, "t.csv");
  ASSERT_OK(csv.Open());
  EXPECT_THAT(csv.Column("c"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("missing column \"c\"")));
  ASSERT_TRUE(*csv.Next());
  EXPECT_THAT(csv.Next(), StatusIs(StatusCode::kInvalidArgument,
                                   HasSubstr("t.csv:3: 1 fields, the header has 2")));
}

TEST(CsvReader, RejectsBadIntegers) {
  std::istringstream in("n\n12x\n-3\n\"\"\n");
  CsvReader csv(in, "t.csv");
  ASSERT_OK(csv.Open());
  for (const char* value : {"12x", "-3", ""}) {
    ASSERT_TRUE(*csv.Next());
    EXPECT_THAT(csv.Int(0), StatusIs(StatusCode::kInvalidArgument,
                                     HasSubstr("column \"n\": \"" + std::string(value) + "\"")));
  }
}

TEST(CsvReader, EmptyFileAndUnterminatedQuote) {
  std::istringstream empty("");
  CsvReader none(empty, "e.csv");
  EXPECT_THAT(none.Open(), StatusIs(StatusCode::kInvalidArgument, HasSubstr("empty file")));
  std::istringstream bad("a\n\"open\n");
  CsvReader quote(bad, "q.csv");
  ASSERT_OK(quote.Open());
  EXPECT_THAT(quote.Next(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("q.csv:2: unterminated quote")));
}

}  // namespace
}  // namespace gpufleet::sim
