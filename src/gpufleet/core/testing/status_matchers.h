// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/status.h"

namespace gpufleet::testing {

inline const Status& GetStatus(const Status& status) {
  return status;
}
template <typename T>
Status GetStatus(const Result<T>& result) {
  return result.status();
}

MATCHER_P(StatusIs, code, "has status code " + std::string(StatusCodeName(code))) {
  const Status status = ::gpufleet::testing::GetStatus(arg);
  *result_listener << "status is " << status.ToString();
  return status.code() == code;
}

MATCHER_P2(StatusIs, code, message_matcher, "") {
  const Status status = ::gpufleet::testing::GetStatus(arg);
  *result_listener << "status is " << status.ToString();
  return status.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, status.message(), result_listener);
}

}  // namespace gpufleet::testing

#define EXPECT_OK(expr)                                                                     \
  do {                                                                                      \
    const ::gpufleet::Status gpufleet_expect_status = ::gpufleet::testing::GetStatus(expr); \
    EXPECT_TRUE(gpufleet_expect_status.ok()) << gpufleet_expect_status.ToString();          \
  } while (false)
#define ASSERT_OK(expr)                                                                     \
  do {                                                                                      \
    const ::gpufleet::Status gpufleet_assert_status = ::gpufleet::testing::GetStatus(expr); \
    ASSERT_TRUE(gpufleet_assert_status.ok()) << gpufleet_assert_status.ToString();          \
  } while (false)
