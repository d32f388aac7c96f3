// SPDX-License-Identifier: Apache-2.0
// The files TaskCgroups writes, on a plain directory laid out like each cgroup version. The real
// hierarchies (v1 controllers and the v2 mount of these machines) are exercised with real
// processes in process_runner_test.cc.
#include "gpufleet/runner/cgroup.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::runner {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

class TaskCgroupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/gpufleet_cgroup_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    for (const char* controller : {"memory", "cpu", "pids"}) {
      std::filesystem::create_directory(root_ + "/" + controller);
    }
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::string root_;
};

TEST_F(TaskCgroupsTest, V1WritesLimitsPerController) {
  Result<TaskCgroups> cgroups = TaskCgroups::Open(CgroupVersion::kV1, root_, "gpufleet");
  ASSERT_OK(cgroups);
  EXPECT_TRUE(cgroups->enforces_limits());
  EXPECT_THAT(cgroups->Describe(), HasSubstr("cgroup v1"));
  Result<std::vector<std::string>> join =
      cgroups->Create("train.task", {.cpu_milli = 1500, .memory_bytes = 256 << 20});
  ASSERT_OK(join);
  EXPECT_THAT(*join, ElementsAre(root_ + "/memory/gpufleet/train.task/cgroup.procs",
                                 root_ + "/cpu/gpufleet/train.task/cgroup.procs",
                                 root_ + "/pids/gpufleet/train.task/cgroup.procs"));
  EXPECT_EQ(ReadWholeFile(root_ + "/memory/gpufleet/train.task/memory.limit_in_bytes"),
            "268435456");
  EXPECT_EQ(ReadWholeFile(root_ + "/cpu/gpufleet/train.task/cpu.cfs_period_us"), "100000");
  EXPECT_EQ(ReadWholeFile(root_ + "/cpu/gpufleet/train.task/cpu.cfs_quota_us"), "150000");
  EXPECT_EQ(cgroups->MembersFile("train.task"), root_ + "/pids/gpufleet/train.task/cgroup.procs");

  ASSERT_OK(cgroups->Create("free.task", {}));
  EXPECT_EQ(ReadWholeFile(root_ + "/memory/gpufleet/free.task/memory.limit_in_bytes"), "-1");
  EXPECT_EQ(ReadWholeFile(root_ + "/cpu/gpufleet/free.task/cpu.cfs_quota_us"), "-1");
}

TEST_F(TaskCgroupsTest, V2WritesLimitsInOneDirectory) {
  Result<TaskCgroups> cgroups = TaskCgroups::Open(CgroupVersion::kV2, root_, "gpufleet");
  ASSERT_OK(cgroups);
  EXPECT_EQ(ReadWholeFile(root_ + "/gpufleet/cgroup.subtree_control"), "+cpu +memory");
  Result<std::vector<std::string>> join =
      cgroups->Create("train.task", {.cpu_milli = 250, .memory_bytes = 1 << 30});
  ASSERT_OK(join);
  EXPECT_THAT(*join, ElementsAre(root_ + "/gpufleet/train.task/cgroup.procs"));
  EXPECT_EQ(ReadWholeFile(root_ + "/gpufleet/train.task/memory.max"), "1073741824");
  EXPECT_EQ(ReadWholeFile(root_ + "/gpufleet/train.task/cpu.max"), "25000 100000");
  ASSERT_OK(cgroups->Create("free.task", {}));
  EXPECT_EQ(ReadWholeFile(root_ + "/gpufleet/free.task/memory.max"), "max");
  EXPECT_EQ(ReadWholeFile(root_ + "/gpufleet/free.task/cpu.max"), "max 100000");
}

TEST_F(TaskCgroupsTest, RefusesNamesThatAreNotOneComponent) {
  Result<TaskCgroups> cgroups = TaskCgroups::Open(CgroupVersion::kV2, root_, "gpufleet");
  ASSERT_OK(cgroups);
  for (const char* name : {"", ".", "..", "a/b"}) {
    EXPECT_THAT(cgroups->Create(name, {}).status(), StatusIs(StatusCode::kInvalidArgument)) << name;
  }
}

TEST_F(TaskCgroupsTest, DetectNamesWhatIsMissing) {
  std::filesystem::remove(root_ + "/pids");
  EXPECT_THAT(TaskCgroups::Detect(root_, "gpufleet").status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("no v1 'pids' controller")));
  EXPECT_THAT(TaskCgroups::Detect(root_ + "/missing", "gpufleet").status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("cannot read")));
}

}  // namespace
}  // namespace gpufleet::runner
