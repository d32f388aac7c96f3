// SPDX-License-Identifier: Apache-2.0
// The MPS daemons' lifecycle against testing/fake_mps_control.sh, a stand-in for the driver's
// nvidia-cuda-mps-control (no GPU here), with real client tasks of the process runner.
#include "gpufleet/agent/mps_daemons.h"

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/os/files.h"
#include "gpufleet/runner/process_runner.h"

namespace gpufleet::agent {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kGpuA[] = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6";
constexpr char kGpuB[] = "GPU-0b8e3f1a-4c2d-11ee-9a61-0242ac120003";

// The file's content; "" when it does not exist.
std::string ReadMpsTestFile(const std::string& path) {
  const Result<std::optional<std::string>> text = os::ReadSmallFile(path);
  return text.ok() && text->has_value() ? **text : "";
}

int CountOf(const std::string& text, const std::string& what) {
  int count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++count;
  }
  return count;
}

class MpsDaemonsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/gpufleet_mps_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = std::filesystem::canonical(pattern).string();
    options_.control_program = GPUFLEET_FAKE_MPS_CONTROL;
    options_.state_dir = dir_ + "/mps";
    options_.quit_grace = std::chrono::seconds(10);
  }

  void TearDown() override {
    // A failed test must not leave fake daemons behind.
    std::error_code ignored;
    for (const char* gpu : {kGpuA, kGpuB}) {
      const std::string pid =
          ReadMpsTestFile(options_.state_dir + "/" + gpu + "/pipe/" + std::string(kMpsPidFile));
      if (!pid.empty()) {
        kill(std::stoi(pid), SIGKILL);
      }
    }
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string ControlLog(const std::string& gpu) const {
    return ReadMpsTestFile(options_.state_dir + "/" + gpu + "/log/control.log");
  }

  // Polls `condition` every few milliseconds for up to ten seconds.
  bool WaitUntil(const std::function<bool()>& condition) {
    for (int i = 0; i < 2000; ++i) {
      if (condition()) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return condition();
  }

  // EnsureRunning asked again, as the agent's passes do, until the daemon it started has written
  // its pid file (the first answers are kUnavailable "starting").
  Result<std::string> StartedDaemon(MpsDaemons& daemons, const std::string& gpu) {
    Result<std::string> pipes = daemons.EnsureRunning(gpu);
    WaitUntil([&] {
      if (pipes.ok() || pipes.status().message().find("starting") == std::string::npos) {
        return true;
      }
      pipes = daemons.EnsureRunning(gpu);
      return false;
    });
    return pipes;
  }

  // Calls StopUnused until the daemons are all forgotten (they quit by themselves).
  bool WaitUntilForgotten(MpsDaemons& daemons, const std::vector<runner::TaskStatus>& tasks) {
    return WaitUntil([&] {
      daemons.StopUnused(tasks, {});
      return daemons.daemons().empty();
    });
  }

  std::string dir_;
  MpsDaemonOptions options_;
  FakeClock clock_{MonoTime{1'000'000'000}};
};

TEST_F(MpsDaemonsTest, OneDaemonPerGpuWithItsOwnDirectoriesAndDevice) {
  MpsDaemons daemons(options_, clock_);
  const Result<std::string> first = StartedDaemon(daemons, kGpuA);
  ASSERT_OK(first);
  EXPECT_EQ(*first, options_.state_dir + "/" + kGpuA + "/pipe");
  EXPECT_TRUE(std::filesystem::exists(*first + "/" + std::string(kMpsPidFile)));
  // A second share of the GPU uses the same daemon.
  const Result<std::string> second = StartedDaemon(daemons, kGpuA);
  ASSERT_OK(second);
  EXPECT_EQ(*second, *first);
  ASSERT_OK(StartedDaemon(daemons, kGpuB));
  EXPECT_EQ(CountOf(ControlLog(kGpuA), "started"), 1);
  EXPECT_THAT(ControlLog(kGpuA),
              HasSubstr(std::string("started CUDA_VISIBLE_DEVICES=") + kGpuA + " "));
  EXPECT_THAT(ControlLog(kGpuB),
              HasSubstr(std::string("started CUDA_VISIBLE_DEVICES=") + kGpuB + " "));
  EXPECT_EQ(daemons.daemons().size(), 2u);
  EXPECT_TRUE(WaitUntilForgotten(daemons, {}));
}

TEST_F(MpsDaemonsTest, TheDaemonStaysUntilItsLastClientIsKnownGone) {
  Result<std::unique_ptr<runner::ProcessRunner>> opened =
      runner::ProcessRunner::Open(dir_ + "/runner", clock_);
  ASSERT_OK(opened);
  runner::ProcessRunner& tasks = **opened;
  MpsDaemons daemons(options_, clock_);
  const Result<std::string> pipes = StartedDaemon(daemons, kGpuA);
  ASSERT_OK(pipes);

  // Each client prints what MPS reads from its environment, talks to the daemon through the pipe
  // directory it was given, and runs until its file "end-N" appears.
  const auto client = [&](const std::string& id, int64_t memory_mib, int percentage) {
    runner::TaskLaunch launch;
    launch.task_id = id;
    launch.argv = {"/bin/sh", "-c",
                   "echo \"pipe=$CUDA_MPS_PIPE_DIRECTORY mem=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT "
                   "threads=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE cuda=$CUDA_VISIBLE_DEVICES\"; "
                   "echo get_server_list | \"$0\"; "
                   "while [ ! -e \"$1\" ]; do sleep 0.01; done",
                   options_.control_program, dir_ + "/end-" + id};
    launch.gpu_uuids = {kGpuA};
    launch.log_path = dir_ + "/" + id + ".log";
    launch.mps = runner::MpsClient{*pipes, memory_mib, percentage};
    return launch;
  };
  ASSERT_OK(tasks.Start(client("one", 20480, 25)));
  ASSERT_OK(tasks.Start(client("two", 40960, 50)));
  ASSERT_TRUE(WaitUntil([&] { return CountOf(ControlLog(kGpuA), "command get_server_list") == 2; }))
      << ControlLog(kGpuA);
  EXPECT_EQ(ReadMpsTestFile(dir_ + "/one.log"),
            "pipe=" + *pipes + " mem=0=20480M threads=25 cuda=" + kGpuA + "\n");
  EXPECT_EQ(ReadMpsTestFile(dir_ + "/two.log"),
            "pipe=" + *pipes + " mem=0=40960M threads=50 cuda=" + kGpuA + "\n");

  // Neither client has ended, then one has: the daemon stays.
  EXPECT_THAT(daemons.StopUnused(tasks.Poll(), {}), IsEmpty());
  std::ofstream(dir_ + "/end-one").put('\n');
  ASSERT_TRUE(WaitUntil([&] {
    for (const runner::TaskStatus& status : tasks.Poll()) {
      if (status.task_id == "one") {
        return runner::IsFinal(status.state);
      }
    }
    return false;
  }));
  EXPECT_THAT(daemons.StopUnused(tasks.Poll(), {}), IsEmpty());
  // A share about to start on the GPU keeps it too, with no task running.
  ASSERT_OK(tasks.Stop("two", Duration(0)));
  ASSERT_TRUE(WaitUntil([&] {
    const std::vector<runner::TaskStatus> all = tasks.Poll();
    return std::all_of(all.begin(), all.end(), [](const runner::TaskStatus& status) {
      return runner::IsFinal(status.state);
    });
  }));
  EXPECT_THAT(daemons.StopUnused(tasks.Poll(), {kGpuA}), IsEmpty());
  EXPECT_THAT(ControlLog(kGpuA), ::testing::Not(HasSubstr("command quit")));

  // Both are known gone and none is wanted: quit, then forgotten once the daemon has ended.
  EXPECT_THAT(daemons.StopUnused(tasks.Poll(), {}), ElementsAre(kGpuA));
  EXPECT_THAT(daemons.EnsureRunning(kGpuA),
              StatusIs(StatusCode::kUnavailable, HasSubstr("quitting")));
  EXPECT_TRUE(WaitUntilForgotten(daemons, tasks.Poll()));
  EXPECT_THAT(ControlLog(kGpuA), HasSubstr("command quit\nquit pid="));
  EXPECT_FALSE(std::filesystem::exists(*pipes));
  // The next share starts a new daemon.
  ASSERT_OK(StartedDaemon(daemons, kGpuA));
  EXPECT_EQ(CountOf(ControlLog(kGpuA), "started"), 2);
  EXPECT_TRUE(WaitUntilForgotten(daemons, {}));
}

TEST_F(MpsDaemonsTest, ARestartedAgentAdoptsTheRunningDaemonAndStartsNoSecond) {
  {
    MpsDaemons before(options_, clock_);
    ASSERT_OK(StartedDaemon(before, kGpuA));
  }
  // A directory whose daemon is gone is cleared, not adopted.
  std::filesystem::create_directories(options_.state_dir + "/" + kGpuB + "/pipe");
  std::ofstream(options_.state_dir + "/" + kGpuB + "/pipe/" + std::string(kMpsPidFile))
      << "999999999\n";

  // Even without Adopt, a daemon of the GPU that runs is taken rather than started again.
  MpsDaemons unadopted(options_, clock_);
  ASSERT_OK(StartedDaemon(unadopted, kGpuA));
  EXPECT_EQ(CountOf(ControlLog(kGpuA), "started"), 1);

  MpsDaemons after(options_, clock_);
  ASSERT_OK(after.Adopt());
  EXPECT_EQ(after.daemons(),
            (std::map<std::string, MpsDaemons::State>{{kGpuA, MpsDaemons::State::kRunning}}));
  EXPECT_FALSE(std::filesystem::exists(options_.state_dir + "/" + kGpuB + "/pipe"));
  ASSERT_OK(StartedDaemon(after, kGpuA));
  EXPECT_EQ(CountOf(ControlLog(kGpuA), "started"), 1);
  // Adopted, it is stopped like one this agent started, once nothing holds its GPU.
  runner::TaskStatus client;
  client.task_id = "adopted-client";
  client.gpu_uuids = {kGpuA};
  EXPECT_THAT(after.StopUnused({client}, {}), IsEmpty());
  EXPECT_THAT(after.StopUnused({}, {}), ElementsAre(kGpuA));
  EXPECT_TRUE(WaitUntilForgotten(after, {}));
}

TEST_F(MpsDaemonsTest, ADaemonThatIgnoresQuitIsKilledAfterTheGrace) {
  MpsDaemons daemons(options_, clock_);
  ASSERT_OK(StartedDaemon(daemons, kGpuA));
  std::ofstream(options_.state_dir + "/" + kGpuA + "/log/ignore-quit").put('\n');
  EXPECT_THAT(daemons.StopUnused({}, {}), ElementsAre(kGpuA));
  ASSERT_TRUE(WaitUntil([&] { return CountOf(ControlLog(kGpuA), "command quit") == 1; }));
  clock_.Advance(std::chrono::seconds(9));
  daemons.StopUnused({}, {});
  EXPECT_EQ(daemons.daemons().size(), 1u);
  EXPECT_THAT(daemons.EnsureRunning(kGpuA), StatusIs(StatusCode::kUnavailable));
  clock_.Advance(std::chrono::seconds(1));
  daemons.StopUnused({}, {});  // SIGKILL
  EXPECT_TRUE(WaitUntilForgotten(daemons, {}));
  EXPECT_EQ(CountOf(ControlLog(kGpuA), "quit pid="), 0);  // killed, never quit by itself
}

// The agent's pass never waits for a daemon to come up: the share waits instead, and a start
// that writes no pid file within start_wait (on the agent's clock) is given up and made anew.
TEST_F(MpsDaemonsTest, AStartThatNeverComesUpIsGivenUpAfterTheStartWait) {
  std::filesystem::create_directories(options_.state_dir + "/" + kGpuA + "/log");
  std::ofstream(options_.state_dir + "/" + kGpuA + "/log/die-at-start").put('\n');
  MpsDaemons daemons(options_, clock_);
  EXPECT_THAT(daemons.EnsureRunning(kGpuA),
              StatusIs(StatusCode::kUnavailable, HasSubstr("is starting (no pid file yet)")));
  ASSERT_TRUE(WaitUntil([&] { return CountOf(ControlLog(kGpuA), "died at start") == 1; }));
  clock_.Advance(options_.start_wait);
  EXPECT_THAT(daemons.EnsureRunning(kGpuA),
              StatusIs(StatusCode::kUnavailable, HasSubstr("is starting (no pid file yet)")));
  EXPECT_EQ(daemons.daemons(),
            (std::map<std::string, MpsDaemons::State>{{kGpuA, MpsDaemons::State::kStarting}}));
  EXPECT_THAT(daemons.StopUnused({}, {}), IsEmpty()) << "a start under way is not told to quit";
  clock_.Advance(std::chrono::milliseconds(1));
  EXPECT_THAT(daemons.EnsureRunning(kGpuA),
              StatusIs(StatusCode::kUnavailable, HasSubstr("wrote no pid file in 2000 ms")));
  EXPECT_THAT(daemons.daemons(), IsEmpty());

  std::filesystem::remove(options_.state_dir + "/" + kGpuA + "/log/die-at-start");
  ASSERT_OK(StartedDaemon(daemons, kGpuA));
  EXPECT_EQ(CountOf(ControlLog(kGpuA), "started"), 1);
  EXPECT_TRUE(WaitUntilForgotten(daemons, {}));
}

// A daemon still starting when its share is no longer wanted is stopped once it is up.
TEST_F(MpsDaemonsTest, ADaemonStartedForAShareNoLongerWantedQuitsOnceUp) {
  MpsDaemons daemons(options_, clock_);
  const Result<std::string> asked = daemons.EnsureRunning(kGpuA);
  ASSERT_TRUE(asked.ok() || asked.status().code() == StatusCode::kUnavailable)
      << asked.status().message();
  ASSERT_TRUE(WaitUntil([&] { return CountOf(ControlLog(kGpuA), "started") == 1; }));
  EXPECT_TRUE(WaitUntilForgotten(daemons, {}));
  EXPECT_THAT(ControlLog(kGpuA), HasSubstr("command quit\nquit pid="));
}

TEST_F(MpsDaemonsTest, StartErrorsNameTheGpuAndTheReason) {
  MpsDaemons off({}, clock_);
  EXPECT_THAT(off.EnsureRunning(kGpuA),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("runs no MPS daemons")));
  MpsDaemons daemons(options_, clock_);
  EXPECT_THAT(daemons.EnsureRunning("../etc"),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("\"../etc\"")));
  options_.control_program = dir_ + "/no-such-program";
  MpsDaemons missing(options_, clock_);
  EXPECT_THAT(missing.EnsureRunning(kGpuA),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr(dir_ + "/no-such-program -d for " + kGpuA + " exited with 127")));
  EXPECT_THAT(missing.daemons(), IsEmpty());
}

}  // namespace
}  // namespace gpufleet::agent
