// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/runner/simulated_runner.h"

#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::runner {
namespace {

using ::gpufleet::testing::StatusIs;
using ::std::chrono::milliseconds;
using ::std::chrono::seconds;
using ::testing::HasSubstr;

TaskLaunch SimTask(std::string id, std::optional<int> duration_ms, int exit_code = 0) {
  TaskLaunch launch;
  launch.task_id = std::move(id);
  launch.argv = {"train"};
  launch.gpu_uuids = {"GPU-sim-0"};
  if (duration_ms.has_value()) {
    launch.env[std::string(kSimDurationEnv)] = std::to_string(*duration_ms);
  }
  if (exit_code != 0) {
    launch.env[std::string(kSimExitCodeEnv)] = std::to_string(exit_code);
  }
  return launch;
}

class SimulatedRunnerTest : public ::testing::Test {
 protected:
  TaskStatus StatusOf(const std::string& id) {
    for (const TaskStatus& status : runner_.Poll()) {
      if (status.task_id == id) {
        return status;
      }
    }
    ADD_FAILURE() << "no task " << id;
    return {};
  }

  FakeClock clock_{MonoTime{1'000'000}};
  SimulatedRunner runner_{clock_};
};

TEST_F(SimulatedRunnerTest, TaskRunsForItsScriptedDurationThenExitsWithItsCode) {
  ASSERT_OK(runner_.Start(SimTask("job/0", 1500, 3)));
  clock_.Advance(milliseconds(1499));
  TaskStatus status = StatusOf("job/0");
  EXPECT_EQ(status.state, TaskState::kRunning);
  EXPECT_EQ(status.start_time, MonoTime{1'000'000});
  EXPECT_EQ(status.gpu_uuids, std::vector<std::string>{"GPU-sim-0"});
  EXPECT_FALSE(status.end_time.has_value());

  clock_.Advance(seconds(10));  // polled late: the end is still dated at the scripted time
  status = StatusOf("job/0");
  EXPECT_EQ(status.state, TaskState::kExited);
  EXPECT_EQ(status.exit_code, 3);
  EXPECT_EQ(status.end_time, MonoTime{1'000'000} + milliseconds(1500));
}

TEST_F(SimulatedRunnerTest, TaskWithoutDurationRunsUntilStoppedAndEndsBySigterm) {
  ASSERT_OK(runner_.Start(SimTask("serve", std::nullopt)));
  clock_.Advance(std::chrono::hours(24 * 30));
  EXPECT_EQ(StatusOf("serve").state, TaskState::kRunning);
  EXPECT_FALSE(runner_.NextEndTime().has_value());

  ASSERT_OK(runner_.Stop("serve", seconds(30)));
  const TaskStatus status = StatusOf("serve");
  EXPECT_EQ(status.state, TaskState::kKilled);
  EXPECT_EQ(status.signal, SIGTERM);
  EXPECT_TRUE(status.stop_requested);
  EXPECT_EQ(status.end_time, clock_.Now());
  EXPECT_EQ(DescribeTaskStatus(status), "killed by signal 15 (SIGTERM)");
}

TEST_F(SimulatedRunnerTest, StopAfterTheScriptedEndKeepsTheExit) {
  ASSERT_OK(runner_.Start(SimTask("short", 10)));
  clock_.Advance(milliseconds(20));
  ASSERT_OK(runner_.Stop("short", seconds(1)));
  const TaskStatus status = StatusOf("short");
  EXPECT_EQ(status.state, TaskState::kExited);
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_FALSE(status.stop_requested);
}

TEST_F(SimulatedRunnerTest, ScriptedStartErrorFailsTheTask) {
  TaskLaunch launch = SimTask("broken", 100);
  launch.env[std::string(kSimStartErrorEnv)] = "image not found";
  ASSERT_OK(runner_.Start(launch));
  const TaskStatus status = StatusOf("broken");
  EXPECT_EQ(status.state, TaskState::kFailedToStart);
  EXPECT_EQ(status.reason, "image not found");
  EXPECT_EQ(status.end_time, status.start_time);
}

TEST_F(SimulatedRunnerTest, NextEndTimeIsTheEarliestScriptedEnd) {
  ASSERT_OK(runner_.Start(SimTask("a", 500)));
  ASSERT_OK(runner_.Start(SimTask("b", 200)));
  ASSERT_OK(runner_.Start(SimTask("c", std::nullopt)));
  EXPECT_EQ(runner_.NextEndTime(), MonoTime{1'000'000} + milliseconds(200));
  clock_.Advance(milliseconds(200));
  runner_.Poll();
  EXPECT_EQ(runner_.NextEndTime(), MonoTime{1'000'000} + milliseconds(500));
}

TEST_F(SimulatedRunnerTest, ForgetDropsOnlyEndedTasks) {
  ASSERT_OK(runner_.Start(SimTask("job", 100)));
  EXPECT_THAT(runner_.Forget("job"),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("task 'job' is still running")));
  EXPECT_THAT(runner_.Start(SimTask("job", 100)),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("task 'job' is already known")));
  clock_.Advance(milliseconds(100));
  ASSERT_OK(runner_.Forget("job"));
  EXPECT_TRUE(runner_.Poll().empty());
  ASSERT_OK(runner_.Start(SimTask("job", 100)));  // the id is free again
}

TEST_F(SimulatedRunnerTest, RefusesBadScriptsAndUnknownTasks) {
  TaskLaunch launch = SimTask("job", std::nullopt);
  for (const char* bad : {"-1", "1.5", "abc", "", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    launch.env[std::string(kSimDurationEnv)] = bad;
    EXPECT_THAT(runner_.Start(launch),
                StatusIs(StatusCode::kInvalidArgument,
                         HasSubstr(std::string("env GPUFLEET_SIM_DURATION_MS of task 'job' is '") +
                                   bad + "'")));
  }
  launch = SimTask("job", 10);
  launch.env[std::string(kSimExitCodeEnv)] = "256";
  EXPECT_THAT(runner_.Start(launch),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("env GPUFLEET_SIM_EXIT_CODE of task 'job' is '256'")));
  launch.env.erase(std::string(kSimExitCodeEnv));
  launch.argv.clear();
  EXPECT_THAT(runner_.Start(launch), StatusIs(StatusCode::kInvalidArgument, HasSubstr("argv")));
  EXPECT_TRUE(runner_.Poll().empty());

  EXPECT_THAT(runner_.Stop("nope", seconds(1)),
              StatusIs(StatusCode::kNotFound, HasSubstr("task 'nope' is not known")));
  EXPECT_THAT(runner_.Forget("nope"), StatusIs(StatusCode::kNotFound));
  ASSERT_OK(runner_.Start(SimTask("job", 10)));
  EXPECT_THAT(runner_.Stop("job", milliseconds(-1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("negative")));
}

TEST_F(SimulatedRunnerTest, AScriptedStopDelayKeepsTheTaskRunningAfterSigterm) {
  TaskLaunch slow = SimTask("checkpointing", std::nullopt);
  slow.env[std::string(kSimStopDelayEnv)] = "15000";
  ASSERT_OK(runner_.Start(slow));
  ASSERT_OK(runner_.Stop("checkpointing", seconds(30)));
  TaskStatus status = StatusOf("checkpointing");
  EXPECT_EQ(status.state, TaskState::kRunning) << "writing its checkpoint";
  EXPECT_TRUE(status.stop_requested);
  EXPECT_EQ(runner_.NextEndTime(), MonoTime{1'000'000} + seconds(15));
  clock_.Advance(seconds(15));
  status = StatusOf("checkpointing");
  EXPECT_EQ(status.state, TaskState::kKilled);
  EXPECT_EQ(status.signal, SIGTERM);
  EXPECT_EQ(status.end_time, MonoTime{1'000'000} + seconds(15));

  // Longer than the grace: SIGKILL at the grace.
  TaskLaunch stuck = SimTask("stuck", std::nullopt);
  stuck.env[std::string(kSimStopDelayEnv)] = "60000";
  ASSERT_OK(runner_.Start(stuck));
  ASSERT_OK(runner_.Stop("stuck", seconds(5)));
  clock_.Advance(seconds(5));
  status = StatusOf("stuck");
  EXPECT_EQ(status.state, TaskState::kKilled);
  EXPECT_EQ(status.signal, SIGKILL);

  TaskLaunch bad = SimTask("bad", std::nullopt);
  bad.env[std::string(kSimStopDelayEnv)] = "soon";
  EXPECT_THAT(runner_.Start(bad),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("GPUFLEET_SIM_STOP_MS")));
}

TEST_F(SimulatedRunnerTest, TasksStopAtTheLeaseDeadlineUnlessItIsRenewed) {
  ASSERT_OK(runner_.RenewLease(seconds(10), seconds(5)));
  TaskLaunch slow = SimTask("slow/0", std::nullopt);
  slow.env[std::string(kSimStopDelayEnv)] = "8000";  // longer than the grace: killed
  ASSERT_OK(runner_.Start(slow));
  ASSERT_OK(runner_.Start(SimTask("quick/0", std::nullopt)));
  ASSERT_OK(runner_.Start(SimTask("short/0", 3000, 4)));  // ends before the deadline
  clock_.Advance(seconds(9));
  ASSERT_OK(runner_.RenewLease(seconds(10), seconds(5)));  // deadline now 19 s
  EXPECT_EQ(runner_.NextEndTime(), clock_.Now() + seconds(10));
  clock_.Advance(seconds(9));
  EXPECT_EQ(StatusOf("quick/0").state, TaskState::kRunning);

  clock_.Advance(seconds(3));  // 21 s: the lease ran out at 19 s
  const TaskStatus quick = StatusOf("quick/0");
  EXPECT_EQ(quick.state, TaskState::kKilled);
  EXPECT_EQ(quick.signal, SIGTERM);
  EXPECT_EQ(quick.end_time, MonoTime{1'000'000} + seconds(19));
  EXPECT_TRUE(StatusOf("slow/0").stop_requested);
  EXPECT_EQ(StatusOf("slow/0").state, TaskState::kRunning);
  EXPECT_EQ(StatusOf("short/0").exit_code, 4);

  clock_.Advance(seconds(3));  // 24 s: the grace (5 s) ended at 24 s
  const TaskStatus slow_status = StatusOf("slow/0");
  EXPECT_EQ(slow_status.state, TaskState::kKilled);
  EXPECT_EQ(slow_status.signal, SIGKILL);
  EXPECT_THAT(runner_.RenewLease(seconds(-1), seconds(1)), StatusIs(StatusCode::kInvalidArgument));
}

std::string ReadSimulatedLog(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// With write_logs, each task's log says what the simulation did to it, dated from its start:
// its script, its progress in tenths as the runner sees it, the stop and the end.
TEST(SimulatedRunnerLogs, EachTaskLogsItsStartProgressStopAndEnd) {
  std::string pattern = ::testing::TempDir() + "/gpufleet_simulated_logs_XXXXXX";
  ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
  const std::filesystem::path dir = pattern;
  FakeClock clock{MonoTime{1'000'000}};
  SimulatedRunner runner(clock, {.write_logs = true});
  TaskLaunch ends = SimTask("job/0", 10'000, 3);
  ends.log_path = (dir / "ends.log").string();
  TaskLaunch stopped = SimTask("job/1", std::nullopt);
  stopped.log_path = (dir / "stopped.log").string();
  stopped.env[std::string(kSimStopDelayEnv)] = "1500";
  ASSERT_OK(runner.Start(ends));
  ASSERT_OK(runner.Start(stopped));
  clock.Advance(milliseconds(2500));
  runner.Poll();
  clock.Advance(milliseconds(500));
  runner.Poll();
  runner.Poll();  // each tenth is said once, when the runner sees it
  ASSERT_OK(runner.Stop("job/1", seconds(5)));
  clock.Advance(seconds(8));
  runner.Poll();
  EXPECT_EQ(ReadSimulatedLog(ends.log_path),
            "[+0.0s] simulated task job/0 started on GPUs GPU-sim-0; its script: run 10.0s, then "
            "exit with code 3\n"
            "[+2.5s] 20% of its scripted 10.0s done\n"
            "[+3.0s] 30% of its scripted 10.0s done\n"
            "[+10.0s] done: exit code 3\n");
  EXPECT_EQ(ReadSimulatedLog(stopped.log_path),
            "[+0.0s] simulated task job/1 started on GPUs GPU-sim-0; its script: run until "
            "stopped\n"
            "[+3.0s] SIGTERM: writing its checkpoint (1.5s)\n"
            "[+4.5s] ended by SIGTERM\n");
  // Without write_logs a runner writes nothing, log_path or not.
  SimulatedRunner silent(clock);
  TaskLaunch quiet = SimTask("job/2", 100);
  quiet.log_path = (dir / "quiet.log").string();
  ASSERT_OK(silent.Start(quiet));
  clock.Advance(seconds(1));
  silent.Poll();
  EXPECT_FALSE(std::filesystem::exists(quiet.log_path));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpufleet::runner
