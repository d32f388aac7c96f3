// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/os/command.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::os {
namespace {

using ::testing::HasSubstr;

TEST(RunCommand, CapturesOutputErrorsAndTheExitCodeWithOnlyTheGivenEnvironment) {
  SystemClock clock;
  CommandSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo out; echo err >&2; echo \"[$SECRET][$GIVEN]\"; exit 3"};
  spec.env = {"GIVEN=yes"};
  setenv("SECRET", "agent-token", 1);
  const Result<CommandOutcome> outcome = RunCommand(spec, clock);
  unsetenv("SECRET");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->exit_code, 3);
  EXPECT_FALSE(outcome->timed_out);
  EXPECT_EQ(outcome->output, "out\n[][yes]\n");
  EXPECT_EQ(outcome->errors, "err\n");
}

TEST(RunCommand, WritesToTheGivenDescriptorAndPassesInheritedOnes) {
  SystemClock clock;
  const std::string dir = ::testing::TempDir() + "/run_command_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/log";
  const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  ASSERT_GE(log_fd, 0);
  int extra[2];
  ASSERT_EQ(pipe2(extra, O_CLOEXEC), 0);
  ASSERT_EQ(write(extra[1], "piped", 5), 5);
  close(extra[1]);
  CommandSpec spec;
  spec.argv = {"/bin/sh", "-c",
               "echo to-log; echo err-to-log >&2; cat /dev/fd/" + std::to_string(extra[0])};
  spec.output_fd = log_fd;
  spec.inherited_fds = {extra[0]};
  const Result<CommandOutcome> outcome = RunCommand(spec, clock);
  close(log_fd);
  close(extra[0]);
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->exit_code, 0);
  EXPECT_EQ(outcome->output, "");
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "to-log\nerr-to-log\npiped");
  std::filesystem::remove_all(dir);
}

TEST(RunCommand, KillsAProgramThatOutlivesItsTimeout) {
  SystemClock clock;
  CommandSpec spec;
  spec.argv = {"/bin/sh", "-c", "exec sleep 30"};
  spec.timeout = std::chrono::milliseconds(200);
  const MonoTime start = clock.Now();
  const Result<CommandOutcome> outcome = RunCommand(spec, clock);
  ASSERT_OK(outcome);
  EXPECT_TRUE(outcome->timed_out);
  EXPECT_EQ(outcome->exit_code, -1);
  EXPECT_LT(clock.Now() - start, std::chrono::seconds(10));
}

TEST(RunCommand, AProgramThatIsNotFoundExits127) {
  SystemClock clock;
  CommandSpec spec;
  spec.argv = {"gpufleet-no-such-program"};
  spec.env = {"PATH=/nonexistent"};
  const Result<CommandOutcome> outcome = RunCommand(spec, clock);
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->exit_code, 127);
  EXPECT_THAT(outcome->errors, HasSubstr("cannot execute"));
}

TEST(LastLine, SkipsBlankLinesAndTrims) {
  EXPECT_EQ(LastLine("a\nError: image not known \n\n"), "Error: image not known");
  EXPECT_EQ(LastLine("one"), "one");
  EXPECT_EQ(LastLine("\n \n"), "");
}

}  // namespace
}  // namespace gpufleet::os
