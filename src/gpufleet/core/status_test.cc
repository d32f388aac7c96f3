// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

Result<int> ParsePositive(int value) {
  if (value <= 0) {
    return InvalidArgumentError("value: must be positive");
  }
  return value;
}

Result<int> Doubled(int value) {
  GPUFLEET_ASSIGN_OR_RETURN(int parsed, ParsePositive(value));
  return parsed * 2;
}

Status CheckBoth(int a, int b) {
  GPUFLEET_RETURN_IF_ERROR(ParsePositive(a).status());
  GPUFLEET_RETURN_IF_ERROR(ParsePositive(b).status());
  return Status::Ok();
}

TEST(Status, DefaultIsOkAndPrintsOk) {
  Status status;
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.ToString(), "OK");
}

TEST(Status, ErrorCarriesCodeAndMessage) {
  Status status = NotFoundError("node 'n7'");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.ToString(), "NOT_FOUND: node 'n7'");
}

TEST(Result, HoldsValueOrError) {
  EXPECT_EQ(*Doubled(4), 8);
  EXPECT_THAT(Doubled(-1), StatusIs(StatusCode::kInvalidArgument, HasSubstr("positive")));
}

TEST(Result, BuiltFromOkStatusBecomesInternalError) {
  Result<int> result(Status::Ok());
  EXPECT_THAT(result, StatusIs(StatusCode::kInternal));
}

TEST(StatusMacros, ReturnIfErrorStopsAtFirstError) {
  EXPECT_OK(CheckBoth(1, 2));
  EXPECT_THAT(CheckBoth(1, -2), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace gpufleet
