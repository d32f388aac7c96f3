// SPDX-License-Identifier: Apache-2.0
// The task sandbox's parts. ProcessRunner's tests (process_runner_test.cc) check what they add up
// to with real tasks of two runs.
#include "gpufleet/runner/task_sandbox.h"

#include <pwd.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/runner/run_as.h"

namespace gpufleet::runner {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Optional;

class TaskSandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/gpufleet_sandbox_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = std::filesystem::canonical(pattern).string();
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string dir_;
};

TEST(TaskUidRange, ParsesFirstAndLast) {
  Result<TaskUidRange> range = ParseTaskUidRange("2000000000-2000065535");
  ASSERT_OK(range);
  EXPECT_EQ(*range, (TaskUidRange{2000000000, 2000065535}));
  range = ParseTaskUidRange("7-7");
  ASSERT_OK(range);
  EXPECT_EQ(*range, (TaskUidRange{7, 7}));
  EXPECT_EQ(FormatTaskUidRange(kDefaultTaskUidRange), "2000000000-2000065535");
}

TEST(TaskUidRange, BadRangesNameTheFlagAndTheValue) {
  for (const char* text :
       {"", "5", "5-", "-5", "a-b", "5-4", "0-10", "1-4294967295", "1 -2", "1-99999999999"}) {
    SCOPED_TRACE(text);
    EXPECT_THAT(ParseTaskUidRange(text), StatusIs(StatusCode::kInvalidArgument,
                                                  AllOf(HasSubstr("--task-uid-range"),
                                                        HasSubstr(fmt::format("\"{}\"", text)))));
  }
}

TEST(TaskUidRange, PicksRoundRobinAndSkipsWhatIsUnavailable) {
  const TaskUidRange range{100, 103};
  EXPECT_THAT(PickTaskUid(range, 100, {}), Optional(100u));
  EXPECT_THAT(PickTaskUid(range, 102, {}), Optional(102u));
  EXPECT_THAT(PickTaskUid(range, 102, {102, 103}), Optional(100u));  // wraps around
  EXPECT_THAT(PickTaskUid(range, 101, {100, 101, 102, 103}), std::nullopt);
  EXPECT_THAT(PickTaskUid({5, 5}, 5, {}), Optional(5u));
}

TEST_F(TaskSandboxTest, ARangeAnAccountUsesIsRefused) {
  const std::string no_file = dir_ + "/missing";
  EXPECT_OK(CheckTaskUidRangeIsUnused(kDefaultTaskUidRange, no_file, no_file));
  const passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  EXPECT_THAT(CheckTaskUidRangeIsUnused({nobody->pw_uid - 1, nobody->pw_uid + 1}, no_file, no_file),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("--task-uid-range"), HasSubstr("is in the range"))));
  // A user namespace of a user with subordinate ids could run as them.
  const std::string subuid = dir_ + "/subuid";
  std::ofstream(subuid) << "# comment\nalice:100000:65536\nbob:165536:65536\n";
  EXPECT_OK(CheckTaskUidRangeIsUnused({231072, 300000}, subuid, no_file));
  EXPECT_THAT(CheckTaskUidRangeIsUnused({200000, 265535}, no_file, subuid),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("--task-uid-range 200000-265535"), HasSubstr(subuid),
                             HasSubstr("'bob' the ids 165536-231071"))));
}

TEST(TaskGroups, AreLookedUpByName) {
  Result<gid_t> root = LookUpGroup("root");
  ASSERT_OK(root);
  EXPECT_EQ(*root, 0u);
  EXPECT_THAT(LookUpGroup("no-such-group-gpufleet"),
              StatusIs(StatusCode::kNotFound,
                       AllOf(HasSubstr("--task-group"), HasSubstr("'no-such-group-gpufleet'"))));
}

TEST_F(TaskSandboxTest, RunsDirectoryMustBeReachableByTasks) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "the runs' directory belongs to root";
  }
  ASSERT_EQ(chmod(dir_.c_str(), 0700), 0);
  EXPECT_THAT(PrepareRunsDirectory(dir_ + "/runs"),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(dir_), HasSubstr("not searchable by other users"))));
  ASSERT_EQ(chmod(dir_.c_str(), 0711), 0);
  ASSERT_OK(PrepareRunsDirectory(dir_ + "/runs"));
  struct stat info = {};
  ASSERT_EQ(stat((dir_ + "/runs").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0711u);
  EXPECT_EQ(info.st_uid, 0u);
}

TEST_F(TaskSandboxTest, RunDirectoriesBelongToTheRunAndGoWithoutFollowingLinks) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "giving directories away needs root";
  }
  const std::string runs = dir_ + "/runs";
  ASSERT_EQ(chmod(dir_.c_str(), 0711), 0);
  ASSERT_OK(PrepareRunsDirectory(runs));
  const uid_t uid = 2000099999;
  Result<RunDirectories> dirs = CreateRunDirectories(runs, "r%1.run", uid, uid);
  ASSERT_OK(dirs);
  EXPECT_EQ(dirs->work, runs + "/r%1.run/work");
  EXPECT_EQ(dirs->tmp, runs + "/r%1.run/tmp");
  for (const std::string& path : {dirs->work, dirs->tmp}) {
    struct stat info = {};
    ASSERT_EQ(stat(path.c_str(), &info), 0) << path;
    EXPECT_EQ(info.st_mode & 07777, 0700u) << path;
    EXPECT_EQ(info.st_uid, uid) << path;
    EXPECT_EQ(info.st_gid, uid) << path;
  }
  // A second task of the run takes them over.
  ASSERT_OK(CreateRunDirectories(runs, "r%1.run", uid, uid));

  // A link a task planted towards something it must not touch.
  const std::string outside = dir_ + "/outside";
  std::filesystem::create_directory(outside);
  std::ofstream(outside + "/keep") << "keep";
  std::filesystem::create_directory_symlink(outside, dirs->work + "/link");
  std::ofstream(dirs->tmp + "/scratch") << "x";
  ASSERT_OK(RemoveRunDirectory(runs, "r%1.run"));
  EXPECT_FALSE(std::filesystem::exists(dirs->root));
  EXPECT_TRUE(std::filesystem::exists(outside + "/keep"));
  EXPECT_OK(RemoveRunDirectory(runs, "r%1.run"));  // already gone

  // A link in place of a run's directory is not taken over.
  std::filesystem::create_directory(dirs->root);
  std::filesystem::create_directory_symlink(outside, dirs->work);
  EXPECT_THAT(CreateRunDirectories(runs, "r%1.run", uid, uid),
              StatusIs(StatusCode::kUnavailable, HasSubstr(dirs->work)));
  struct stat info = {};
  ASSERT_EQ(stat(outside.c_str(), &info), 0);
  EXPECT_EQ(info.st_uid, 0u);
}

}  // namespace
}  // namespace gpufleet::runner
