// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/runner/task_runner.h"

#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/runner/simulated_runner.h"

namespace gpufleet::runner {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TaskLaunch ValidLaunch() {
  TaskLaunch launch;
  launch.task_id = "train-llm/group-0";
  launch.argv = {"python3", "train.py"};
  launch.env = {{"EPOCHS", "3"}};
  launch.gpu_uuids = {"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "MIG-0a1b2c3d"};
  launch.log_path = "/var/log/gpufleet/train-llm.log";
  return launch;
}

TEST(ValidateLaunch, AcceptsAWellFormedLaunch) {
  EXPECT_OK(ValidateLaunch(ValidLaunch()));
  TaskLaunch minimal;
  minimal.task_id = "a";
  minimal.argv = {"true"};
  EXPECT_OK(ValidateLaunch(minimal));
}

TEST(ValidateLaunch, NamesTheBadFieldAndValue) {
  struct Case {
    const char* what;
    void (*spoil)(TaskLaunch&);
    const char* message;
  };
  const Case cases[] = {
      {"empty id", [](TaskLaunch& l) { l.task_id.clear(); }, "task_id is empty"},
      {"id with a blank", [](TaskLaunch& l) { l.task_id = "a b"; },
       "task_id 'a b' has the character ' '"},
      {"id with a percent sign", [](TaskLaunch& l) { l.task_id = "a%2F"; },
       "task_id 'a%2F' has the character '%'"},
      {"id too long", [](TaskLaunch& l) { l.task_id = std::string(kMaxTaskIdLength + 1, 'x'); },
       "characters long, more than 200"},
      {"empty argv", [](TaskLaunch& l) { l.argv.clear(); },
       "argv of task 'train-llm/group-0' is empty"},
      {"empty program", [](TaskLaunch& l) { l.argv[0].clear(); }, "argv[0] (the program)"},
      {"program with a newline", [](TaskLaunch& l) { l.argv[0] = "a\nb"; },
       "contains a newline: 'a\\x0ab'"},
      {"argument with NUL", [](TaskLaunch& l) { l.argv[1] = std::string("a\0b", 3); },
       "argv[1] of task 'train-llm/group-0' contains a NUL byte: 'a\\x00b'"},
      {"env name", [](TaskLaunch& l) { l.env["1X"] = "v"; }, "env name '1X'"},
      {"env name with '='", [](TaskLaunch& l) { l.env["A=B"] = "v"; }, "env name 'A=B'"},
      {"env sets CUDA_VISIBLE_DEVICES", [](TaskLaunch& l) { l.env["CUDA_VISIBLE_DEVICES"] = "0"; },
       "env CUDA_VISIBLE_DEVICES of task 'train-llm/group-0' is set by the runner"},
      {"env sets NVIDIA_VISIBLE_DEVICES",
       [](TaskLaunch& l) { l.env["NVIDIA_VISIBLE_DEVICES"] = "all"; },
       "env NVIDIA_VISIBLE_DEVICES"},
      {"env value with NUL", [](TaskLaunch& l) { l.env["X"] = std::string("\0", 1); },
       "env X of task 'train-llm/group-0' contains a NUL byte"},
      {"empty uuid", [](TaskLaunch& l) { l.gpu_uuids.emplace_back(); }, "gpu_uuids[2]"},
      {"uuid with a comma", [](TaskLaunch& l) { l.gpu_uuids[1] = "GPU-1,GPU-2"; },
       "gpu_uuids[1] of task 'train-llm/group-0' is 'GPU-1,GPU-2'"},
      {"uuid with a blank", [](TaskLaunch& l) { l.gpu_uuids[0] = "GPU 1"; }, "'GPU 1'"},
      {"repeated uuid", [](TaskLaunch& l) { l.gpu_uuids.push_back(l.gpu_uuids[0]); },
       "gpu_uuids[2] of task 'train-llm/group-0' repeats 'GPU-8932f937"},
      {"log path with a newline", [](TaskLaunch& l) { l.log_path = "/tmp/a\n.log"; },
       "log_path '/tmp/a\\x0a.log' contains a NUL byte or a newline"},
      {"working dir with NUL", [](TaskLaunch& l) { l.working_dir = std::string("/a\0", 3); },
       "working_dir '/a\\x00'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TaskLaunch launch = ValidLaunch();
    c.spoil(launch);
    EXPECT_THAT(ValidateLaunch(launch),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(GpuEnvironment, JoinsUuidsInOrderForBothVariables) {
  EXPECT_THAT(GpuEnvironment({"GPU-b", "MIG-a"}),
              ElementsAre(Pair("CUDA_VISIBLE_DEVICES", "GPU-b,MIG-a"),
                          Pair("NVIDIA_VISIBLE_DEVICES", "GPU-b,MIG-a")));
}

TEST(GpuEnvironment, NoGpuHidesEveryDevice) {
  EXPECT_THAT(GpuEnvironment({}), ElementsAre(Pair("CUDA_VISIBLE_DEVICES", ""),
                                              Pair("NVIDIA_VISIBLE_DEVICES", "void")));
}

TEST(DescribeTaskStatus, SaysHowTheTaskEnded) {
  TaskStatus status;
  EXPECT_EQ(DescribeTaskStatus(status), "running");
  status.stop_requested = true;
  EXPECT_EQ(DescribeTaskStatus(status), "running, stop requested");
  status.state = TaskState::kExited;
  status.exit_code = 3;
  EXPECT_EQ(DescribeTaskStatus(status), "exited with code 3");
  status.state = TaskState::kKilled;
  status.signal = SIGTERM;
  EXPECT_EQ(DescribeTaskStatus(status), "killed by signal 15 (SIGTERM)");
  status.signal = 200;
  EXPECT_EQ(DescribeTaskStatus(status), "killed by signal 200");
  status.state = TaskState::kFailedToStart;
  status.reason = "command 'x' not found";
  EXPECT_EQ(DescribeTaskStatus(status), "failed to start: command 'x' not found");
  status.state = TaskState::kLost;
  status.reason = "gone";
  EXPECT_EQ(DescribeTaskStatus(status), "lost: gone");
}

TEST(TaskState, OnlyRunningIsNotFinal) {
  EXPECT_FALSE(IsFinal(TaskState::kRunning));
  for (const TaskState state :
       {TaskState::kExited, TaskState::kKilled, TaskState::kFailedToStart, TaskState::kLost}) {
    EXPECT_TRUE(IsFinal(state)) << TaskStateName(state);
  }
  EXPECT_EQ(TaskStateName(TaskState::kFailedToStart), "failed-to-start");
}

TEST(StopUndesiredTasks, StopsRunningTasksTheServerNoLongerWants) {
  FakeClock clock;
  SimulatedRunner runner(clock);
  for (const char* id : {"keep", "drop-1", "drop-2", "done"}) {
    TaskLaunch launch;
    launch.task_id = id;
    launch.argv = {"train"};
    if (std::string(id) == "done") {
      launch.env[std::string(kSimDurationEnv)] = "10";
    }
    ASSERT_OK(runner.Start(launch));
  }
  clock.Advance(std::chrono::seconds(1));

  const Result<std::vector<std::string>> stopped =
      StopUndesiredTasks(runner, {"keep"}, std::chrono::seconds(30));
  ASSERT_OK(stopped);
  EXPECT_THAT(*stopped, ElementsAre("drop-1", "drop-2"));  // "done" had already exited
  std::vector<std::string> running;
  for (const TaskStatus& status : runner.Poll()) {
    if (status.state == TaskState::kRunning) {
      running.push_back(status.task_id);
    }
  }
  EXPECT_THAT(running, ElementsAre("keep"));

  const Result<std::vector<std::string>> again =
      StopUndesiredTasks(runner, {"keep"}, std::chrono::seconds(30));
  ASSERT_OK(again);
  EXPECT_TRUE(again->empty());
}

}  // namespace
}  // namespace gpufleet::runner
