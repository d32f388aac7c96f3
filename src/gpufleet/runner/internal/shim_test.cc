// SPDX-License-Identifier: Apache-2.0
// The shim's exit record and lease formats. The shim itself runs in process_runner_test.cc.
#include "gpufleet/runner/internal/shim.h"

#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace gpufleet::runner::internal {
namespace {

TEST(ParseExitRecord, ReadsEachKind) {
  const std::optional<ExitRecord> exited = ParseExitRecord("exited 3\n");
  ASSERT_TRUE(exited.has_value());
  EXPECT_EQ(exited->kind, ExitRecord::Kind::kExited);
  EXPECT_EQ(exited->value, 3);

  const std::optional<ExitRecord> signaled = ParseExitRecord("signaled 15\n");
  ASSERT_TRUE(signaled.has_value());
  EXPECT_EQ(signaled->kind, ExitRecord::Kind::kSignaled);
  EXPECT_EQ(signaled->value, 15);

  const std::optional<ExitRecord> failed = ParseExitRecord("start-failed 3 2\n");
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->kind, ExitRecord::Kind::kStartFailed);
  EXPECT_EQ(failed->stage, StartStage::kExec);
  EXPECT_EQ(failed->value, 2);
}

TEST(ParseExitRecord, RefusesMalformedRecords) {
  for (const std::string text :
       {"", "exited 3", "exited\n", "exited \n", "exited x\n", "exited 3 4\n", "signaled 9x\n",
        "start-failed 3\n", "start-failed 9 2\n", "start-failed 0 2\n", "finished 0\n"}) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(ParseExitRecord(text).has_value());
  }
}

TEST(ParseLease, ReadsWhatFormatLeaseWrites) {
  const Lease lease{.deadline_nanos = 123'456'789'012, .grace_nanos = 30'000'000'000};
  EXPECT_EQ(FormatLease(lease), "123456789012 30000000000\n");
  const std::optional<Lease> parsed = ParseLease(FormatLease(lease));
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->deadline_nanos, lease.deadline_nanos);
  EXPECT_EQ(parsed->grace_nanos, lease.grace_nanos);
}

TEST(ParseLease, RefusesMalformedLeases) {
  for (const std::string text : {"", "1 2", "1\n", "1 \n", " 2\n", "x 2\n", "1 2 3\n", "1 -2\n",
                                 "1  2\n", "99999999999999999999 1\n"}) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(ParseLease(text).has_value());
  }
}

}  // namespace
}  // namespace gpufleet::runner::internal
