// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/directory_lock.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::store {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

class DirectoryLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "gpufleet-lock-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string dir_;
};

TEST_F(DirectoryLockTest, ASecondHolderIsRefusedWithThePidOfTheFirst) {
  Result<DirectoryLock> first = DirectoryLock::Acquire(dir_);
  ASSERT_OK(first);
  // flock locks belong to open file descriptions: another process (a second server) is refused.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const Result<DirectoryLock> second = DirectoryLock::Acquire(dir_);
    const bool refused =
        !second.ok() && second.status().code() == StatusCode::kFailedPrecondition &&
        second.status().message().find(fmt::format("in use by process {}", getppid())) !=
            std::string::npos;
    _exit(refused ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST_F(DirectoryLockTest, ReleasedWhenTheHolderGoes) {
  {
    Result<DirectoryLock> first = DirectoryLock::Acquire(dir_);
    ASSERT_OK(first);
    Result<DirectoryLock> moved = std::move(first).value();
    ASSERT_OK(moved);
  }
  EXPECT_OK(DirectoryLock::Acquire(dir_).status());
}

TEST_F(DirectoryLockTest, AMissingDirectoryIsUnavailable) {
  EXPECT_THAT(DirectoryLock::Acquire(dir_ + "/missing").status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("missing/lock")));
}

}  // namespace
}  // namespace gpufleet::store
