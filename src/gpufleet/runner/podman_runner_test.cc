// SPDX-License-Identifier: Apache-2.0
// The container runner against real podman (label `podman`): a busybox-static image the tests
// import themselves, storage in a temporary directory, no network and nothing pulled from
// outside. The tests skip only when podman cannot run on this machine at all.
#include "gpufleet/runner/podman_runner.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/os/command.h"
#include "gpufleet/runner/process_runner.h"
#include "gpufleet/runner/testing/podman_testing.h"

namespace gpufleet::runner {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr Duration kPatience = std::chrono::seconds(60);
constexpr char kImage[] = "localhost/gpufleet-test-tiny:1";

using runner_testing::LoopbackRegistry;
using runner_testing::ReadFile;
using runner_testing::Shell;
using runner_testing::WriteFile;

class PodmanRunnerTest : public ::testing::Test {
 protected:
  // One storage and one image for the whole suite: importing it once keeps the tests quick.
  static void SetUpTestSuite() {
    suite_dir_ = fmt::format("{}/podman_runner_test_{}", ::testing::TempDir(), getpid());
    std::filesystem::remove_all(suite_dir_);
    std::filesystem::create_directories(suite_dir_ + "/rootfs/bin");
    // podman asks for ulimits above this machine's hard RLIMIT_NOFILE unless told not to.
    WriteFile(suite_dir_ + "/containers.conf", "[containers]\ndefault_ulimits = []\n");
    const std::string podman = PodmanPrefix() + " version";
    if (const std::string error = Shell(podman); !error.empty()) {
      skip_reason_ = "podman cannot run here (install it with scripts/setup): " + error;
      return;
    }
    setup_error_ = Shell(fmt::format(
        "set -e; cd {0}; cp /bin/busybox rootfs/bin/; "
        "for a in sh echo cat sleep env ls trap; do ln -sf busybox rootfs/bin/$a; done; "
        "tar -C rootfs -cf rootfs.tar .; {1} import rootfs.tar {2} >/dev/null",
        suite_dir_, PodmanPrefix(), kImage));
  }

  static void TearDownTestSuite() {
    if (skip_reason_.empty()) {
      // Not `podman system reset`: with the suite's own --tmpdir it would still do more than
      // this suite's cleaning.
      Shell(PodmanPrefix() + " rm --all --force >/dev/null 2>&1; " + PodmanPrefix() +
            " rmi --all --force >/dev/null 2>&1");
    }
    std::error_code ignored;
    std::filesystem::remove_all(suite_dir_, ignored);
  }

  static std::string PodmanPrefix() {
    return fmt::format(
        "CONTAINERS_CONF={0}/containers.conf podman --root {0}/storage --runroot {0}/run "
        "--tmpdir {0}/tmp --storage-driver vfs",
        suite_dir_);
  }

  void SetUp() override {
    if (!skip_reason_.empty()) {
      GTEST_SKIP() << skip_reason_;
    }
    ASSERT_EQ(setup_error_, "") << "cannot build the test image (busybox-static installed?)";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fmt::format("{}/{}", suite_dir_, info->name());
    std::filesystem::create_directories(dir_);
    options_.storage_root = suite_dir_ + "/storage";
    options_.run_root = suite_dir_ + "/run";
    options_.tmp_dir = suite_dir_ + "/tmp";
    options_.storage_driver = "vfs";
    options_.containers_conf = suite_dir_ + "/containers.conf";
    options_.instance = fmt::format("test-{}-{}", getpid(), info->name());
    options_.fence_dir = dir_ + "/fences";
    options_.pull_dir = dir_ + "/pulls";
    runner_ = OpenRunner(real_clock_);
  }

  void TearDown() override {
    if (runner_ != nullptr) {
      for (const TaskStatus& status : runner_->Poll()) {
        if (!IsFinal(status.state)) {
          EXPECT_OK(runner_->Stop(status.task_id, Duration::zero()));
        }
      }
    }
  }

  std::unique_ptr<PodmanRunner> OpenRunner(const Clock& clock) {
    Result<std::unique_ptr<ProcessRunner>> processes = ProcessRunner::Open(dir_ + "/tasks", clock);
    EXPECT_OK(processes);
    if (!processes.ok()) {
      return nullptr;
    }
    Result<std::unique_ptr<PodmanRunner>> runner =
        PodmanRunner::Open(options_, std::move(processes).value(), clock);
    EXPECT_OK(runner);
    return runner.ok() ? std::move(runner).value() : nullptr;
  }

  // Opens the runner again, pulling from `registry` ("HOST:PORT") over plain HTTP.
  void ReopenPullingFrom(const std::string& registry) {
    options_.insecure_registries = {registry};
    runner_.reset();
    runner_ = OpenRunner(real_clock_);
  }

  TaskLaunch Container(const std::string& task_id, const std::string& script) {
    TaskLaunch launch;
    launch.task_id = task_id;
    launch.argv = {"/bin/sh", "-c", script};
    launch.image = kImage;
    launch.image_pull_policy = ImagePullPolicy::kNever;
    launch.log_path = LogPath(task_id);
    return launch;
  }

  std::string LogPath(const std::string& task_id) {
    std::string stem = task_id;
    std::replace(stem.begin(), stem.end(), '/', '%');
    return fmt::format("{}/{}.log", dir_, stem);
  }

  static TaskStatus StatusOf(TaskRunner& runner, const std::string& task_id) {
    for (const TaskStatus& status : runner.Poll()) {
      if (status.task_id == task_id) {
        return status;
      }
    }
    ADD_FAILURE() << "the runner does not know task " << task_id;
    return {};
  }

  bool WaitUntil(const std::function<bool()>& condition) {
    const MonoTime deadline = real_clock_.Now() + kPatience;
    while (!condition()) {
      if (real_clock_.Now() > deadline) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return true;
  }

  TaskStatus WaitForEnd(TaskRunner& runner, const std::string& task_id) {
    TaskStatus status;
    EXPECT_TRUE(WaitUntil([&] {
      status = StatusOf(runner, task_id);
      return IsFinal(status.state);
    })) << task_id
        << " still " << DescribeTaskStatus(status);
    return status;
  }

  bool WaitForLog(const std::string& task_id, const std::string& text) {
    return WaitUntil([&] { return ReadFile(LogPath(task_id)).find(text) != std::string::npos; });
  }

  // podman with the suite's storage and `args`, with no runner needed: its output and errors.
  std::string PodmanOutput(const std::vector<std::string>& args) {
    SystemClock clock;
    os::CommandSpec spec;
    spec.argv = {"podman",
                 "--root",
                 suite_dir_ + "/storage",
                 "--runroot",
                 suite_dir_ + "/run",
                 "--tmpdir",
                 suite_dir_ + "/tmp",
                 "--storage-driver",
                 "vfs"};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.env = {"CONTAINERS_CONF=" + options_.containers_conf,
                fmt::format("PATH={}", getenv("PATH"))};
    const Result<os::CommandOutcome> outcome = os::RunCommand(spec, clock);
    return outcome.ok() ? outcome->output + outcome->errors : outcome.status().ToString();
  }

  // This instance's containers, as podman lists them: "NAME STATE" lines.
  std::string ListedContainers() {
    return PodmanOutput({"ps", "--all", "--filter",
                         fmt::format("label={}={}", kRunnerLabel, options_.instance), "--format",
                         "{{.Names}} {{.State}}"});
  }

  // This instance's running containers' names.
  std::string RunningContainers() {
    return PodmanOutput({"ps", "--filter",
                         fmt::format("label={}={}", kRunnerLabel, options_.instance), "--filter",
                         "status=running", "--format", "{{.Names}}"});
  }

  // The files of the fences' process runner other than its lock and lease: one set per fence.
  std::vector<std::string> FenceFiles() {
    std::vector<std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(options_.fence_dir)) {
      const std::string name = entry.path().filename().string();
      if (name != "lock" && name != "lease") {
        files.push_back(name);
      }
    }
    return files;
  }

  static inline std::string suite_dir_;
  static inline std::string skip_reason_;
  static inline std::string setup_error_;
  std::string dir_;
  PodmanRunnerOptions options_;
  SystemClock real_clock_;
  FakeClock fake_clock_{MonoTime{1'000'000'000}};
  std::unique_ptr<PodmanRunner> runner_;  // destroyed before the clocks
};

TEST_F(PodmanRunnerTest, RunsContainersToZeroAndNonZeroExitsWithTheirLogsAndNoNetwork) {
  ASSERT_NE(runner_, nullptr);
  ASSERT_OK(
      runner_->Start(Container("job/ok/1", "echo hello from the container; ls /sys/class/net")));
  ASSERT_OK(runner_->Start(Container("job/bad/1", "echo failing >&2; exit 3")));
  const TaskStatus ok = WaitForEnd(*runner_, "job/ok/1");
  EXPECT_EQ(ok.state, TaskState::kExited);
  EXPECT_EQ(ok.exit_code, 0);
  // --network none: the loopback device only.
  EXPECT_EQ(ReadFile(LogPath("job/ok/1")), "hello from the container\nlo\n");
  const TaskStatus bad = WaitForEnd(*runner_, "job/bad/1");
  EXPECT_EQ(bad.state, TaskState::kExited);
  EXPECT_EQ(bad.exit_code, 3);
  EXPECT_EQ(ReadFile(LogPath("job/bad/1")), "failing\n");
  EXPECT_THAT(ListedContainers(), HasSubstr(runner_->ContainerNameForTest("job/ok/1")));
  ASSERT_OK(runner_->Forget("job/ok/1"));
  ASSERT_OK(runner_->Forget("job/bad/1"));
  EXPECT_TRUE(WaitUntil([&] { return ListedContainers().empty(); }))
      << "Forget removes the containers: " << ListedContainers();
  EXPECT_THAT(runner_->Forget("job/ok/1"), StatusIs(StatusCode::kNotFound));
  EXPECT_TRUE(WaitUntil([&] {
    runner_->Poll();
    return FenceFiles().empty();
  })) << "the fences of forgotten containers are forgotten too: "
      << fmt::format("{}", fmt::join(FenceFiles(), " "));
}

// A shell command that fails, saying so, unless the fence of `container` runs. "[e]": the
// pattern does not match the shell that runs pgrep.
std::string FindFence(const std::string& container) {
  return fmt::format("pgrep -f -- 'gpufleet-fenc[e] {}' >/dev/null || {{ echo no fence; exit 1; }}",
                     container);
}

// The agent dies: nobody renews the lease and nobody stops the containers but their fences. A
// container that exits on SIGTERM ends at the lease's deadline; one that ignores SIGTERM is
// killed before the lease's grace is over, when the server may give its GPUs to another task.
// One fence is killed first: Poll starts it again.
TEST_F(PodmanRunnerTest, ListImagesReportsTheImportedImageWithItsDigestAndSize) {
  ASSERT_NE(runner_, nullptr);
  // The first call starts a listing beside the caller (kUnavailable); a later one answers.
  EXPECT_THAT(runner_->ListImages(), StatusIs(StatusCode::kUnavailable));
  Result<std::vector<CachedImage>> images = UnavailableError("not listed");
  EXPECT_TRUE(WaitUntil([&] {
    images = runner_->ListImages();
    return images.status().code() != StatusCode::kUnavailable;
  }));
  ASSERT_OK(images);
  const auto tiny = std::find_if(images->begin(), images->end(), [](const CachedImage& image) {
    return std::find(image.references.begin(), image.references.end(), kImage) !=
           image.references.end();
  });
  ASSERT_NE(tiny, images->end()) << "the suite's image is not listed";
  // podman's own view of it: `podman images --digests`.
  const std::string digest = PodmanOutput({"images", "--format", "{{.Digest}}", kImage});
  EXPECT_THAT(tiny->digest, ::testing::StartsWith("sha256:"));
  EXPECT_EQ(tiny->digest + "\n", digest);
  // The busybox binary and its links: about the size of /bin/busybox.
  const int64_t busybox = static_cast<int64_t>(std::filesystem::file_size("/bin/busybox"));
  EXPECT_GE(tiny->size_bytes, busybox);
  EXPECT_LT(tiny->size_bytes, busybox + (int64_t{1} << 20));
  // A container task reports the digest its container runs.
  ASSERT_OK(runner_->Start(Container("job/digest/1", "true")));
  EXPECT_EQ(WaitForEnd(*runner_, "job/digest/1").image_digest, tiny->digest);
}

TEST_F(PodmanRunnerTest, ContainersStopWhenTheLeaseRunsOutWithNoAgentLeft) {
  ASSERT_NE(runner_, nullptr);
  const char* kLoop = "echo ready; while true; do sleep 1; done";
  ASSERT_OK(runner_->Start(
      Container("job/polite/1", fmt::format("trap 'echo got TERM; exit 0' TERM; {}", kLoop))));
  ASSERT_OK(runner_->Start(
      Container("job/stubborn/1", fmt::format("trap 'echo got TERM' TERM; {}", kLoop))));
  ASSERT_TRUE(WaitForLog("job/polite/1", "ready"));
  ASSERT_TRUE(WaitForLog("job/stubborn/1", "ready"));
  EXPECT_TRUE(StatusOf(*runner_, "job/stubborn/1").enforces_lease);
  const std::string polite = runner_->ContainerNameForTest("job/polite/1");
  const std::string stubborn = runner_->ContainerNameForTest("job/stubborn/1");

  const std::string find_fence = FindFence(stubborn);
  ASSERT_EQ(Shell(find_fence), "") << "the container has a fence";
  EXPECT_EQ(Shell(fmt::format("pkill -KILL -f -- 'gpufleet-fenc[e] {}'", stubborn)), "");
  EXPECT_TRUE(WaitUntil([&] { return !Shell(find_fence).empty(); }));
  EXPECT_TRUE(WaitUntil([&] {
    runner_->Poll();
    return Shell(find_fence).empty();
  })) << "the killed fence is started again";

  const int64_t renewed = time(nullptr);
  constexpr int64_t kFenceIn = 2;
  constexpr int64_t kGrace = 5;
  ASSERT_OK(runner_->RenewLease(std::chrono::seconds(kFenceIn), std::chrono::seconds(kGrace)));
  runner_.reset();  // the agent dies; its containers and their fences run on

  EXPECT_TRUE(WaitUntil([&] { return RunningContainers().empty(); })) << RunningContainers();
  const auto finished = [&](const std::string& name) {
    return std::stoll("0" +
                      PodmanOutput({"inspect", "--format", "{{.State.FinishedAt.Unix}}", name}));
  };
  const auto exit_code = [&](const std::string& name) {
    return PodmanOutput({"inspect", "--format", "{{.State.ExitCode}}", name});
  };
  EXPECT_EQ(exit_code(polite), "0\n");
  EXPECT_EQ(exit_code(stubborn), "137\n") << "SIGKILL";
  EXPECT_THAT(ReadFile(LogPath("job/polite/1")), HasSubstr("got TERM"));
  EXPECT_THAT(ReadFile(LogPath("job/stubborn/1")), HasSubstr("got TERM"));
  // FinishedAt has whole seconds here: one second of rounding either way.
  EXPECT_GE(finished(polite), renewed + kFenceIn - 1) << "not before the lease ran out";
  EXPECT_LE(finished(stubborn), renewed + kFenceIn + kGrace + 1)
      << "killed before the grace was over";
}

// A new agent renews the lease in time: the fences it adopted leave the containers running.
TEST_F(PodmanRunnerTest, ALeaseRenewedByTheNextAgentKeepsTheContainersRunning) {
  ASSERT_NE(runner_, nullptr);
  ASSERT_OK(runner_->Start(Container("job/kept/1", "echo ready; exec sleep 300")));
  ASSERT_TRUE(WaitForLog("job/kept/1", "ready"));
  ASSERT_OK(runner_->RenewLease(std::chrono::seconds(2), std::chrono::seconds(2)));
  runner_.reset();
  runner_ = OpenRunner(real_clock_);
  ASSERT_NE(runner_, nullptr);
  ASSERT_OK(runner_->RenewLease(std::chrono::seconds(60), std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::seconds(6));  // past the first lease and its grace
  const TaskStatus kept = StatusOf(*runner_, "job/kept/1");
  EXPECT_EQ(kept.state, TaskState::kRunning) << DescribeTaskStatus(kept);
  EXPECT_TRUE(kept.enforces_lease);
  EXPECT_EQ(Shell(FindFence(runner_->ContainerNameForTest("job/kept/1"))), "")
      << "its fence runs on";
}

TEST_F(PodmanRunnerTest, TheContainerGetsTheAllowListedEnvironmentAndNotTheAgents) {
  ASSERT_NE(runner_, nullptr);
  setenv("GPUFLEET_TEST_AGENT_SECRET", "agent-secret-value", 1);
  TaskLaunch launch = Container("job/env/1", "env");
  launch.env = {{"MY_SETTING", "a value with spaces"}, {"EMPTY", ""}};
  const Status started = runner_->Start(launch);
  unsetenv("GPUFLEET_TEST_AGENT_SECRET");
  ASSERT_OK(started);
  EXPECT_EQ(WaitForEnd(*runner_, "job/env/1").exit_code, 0);
  const std::string env = ReadFile(LogPath("job/env/1"));
  EXPECT_THAT(env, HasSubstr("MY_SETTING=a value with spaces\n"));
  EXPECT_THAT(env, HasSubstr("\nEMPTY=\n"));
  EXPECT_THAT(env, HasSubstr("CUDA_VISIBLE_DEVICES=\n"));
  EXPECT_THAT(env, HasSubstr("NVIDIA_VISIBLE_DEVICES=void\n"));
  EXPECT_THAT(env, Not(HasSubstr("agent-secret-value")));
  EXPECT_THAT(env, Not(HasSubstr("GPUFLEET_TEST_AGENT_SECRET")));
}

TEST_F(PodmanRunnerTest, StopSendsSigtermToTheContainer) {
  ASSERT_NE(runner_, nullptr);
  ASSERT_OK(runner_->Start(Container("job/long/1", "echo started; exec sleep 300")));
  ASSERT_TRUE(WaitForLog("job/long/1", "started"));
  EXPECT_EQ(StatusOf(*runner_, "job/long/1").state, TaskState::kRunning);
  ASSERT_OK(runner_->Stop("job/long/1", std::chrono::seconds(60)));
  const TaskStatus status = WaitForEnd(*runner_, "job/long/1");
  EXPECT_EQ(status.state, TaskState::kKilled) << DescribeTaskStatus(status);
  EXPECT_EQ(status.signal, SIGTERM);
  EXPECT_TRUE(status.stop_requested);
  EXPECT_OK(runner_->Stop("job/long/1", std::chrono::seconds(1)));  // the task has ended
}

TEST_F(PodmanRunnerTest, SigkillFollowsTheGraceWhenTheTaskIgnoresSigterm) {
  runner_.reset();
  options_.list_interval = Duration::zero();  // the fake clock does not move between polls
  runner_ = OpenRunner(fake_clock_);
  ASSERT_NE(runner_, nullptr);
  ASSERT_OK(runner_->Start(Container(
      "job/stubborn/1", "trap 'echo got TERM' TERM; echo ready; while true; do sleep 1; done")));
  ASSERT_TRUE(WaitForLog("job/stubborn/1", "ready"));
  // The runner has seen the start (a stop before it would wait for it).
  ASSERT_TRUE(WaitUntil([&] { return !StatusOf(*runner_, "job/stubborn/1").starting_container; }));
  ASSERT_OK(runner_->Stop("job/stubborn/1", std::chrono::seconds(30)));
  ASSERT_TRUE(WaitForLog("job/stubborn/1", "got TERM"));
  EXPECT_EQ(StatusOf(*runner_, "job/stubborn/1").state, TaskState::kRunning)
      << "the task ignores SIGTERM and the grace has not passed";
  fake_clock_.Advance(std::chrono::seconds(30));
  const TaskStatus status = WaitForEnd(*runner_, "job/stubborn/1");
  EXPECT_EQ(status.state, TaskState::kKilled) << DescribeTaskStatus(status);
  EXPECT_EQ(status.signal, SIGKILL);
}

TEST_F(PodmanRunnerTest, ANewRunnerAdoptsRunningAndEndedContainers) {
  ASSERT_NE(runner_, nullptr);
  TaskLaunch running = Container("team/job/main-0/1", "echo up; exec sleep 300");
  ASSERT_OK(runner_->Start(running));
  ASSERT_OK(runner_->Start(Container("team/job/side-0/1", "exit 7")));
  ASSERT_TRUE(WaitForLog("team/job/main-0/1", "up"));
  EXPECT_EQ(WaitForEnd(*runner_, "team/job/side-0/1").exit_code, 7);
  // The task prints before `podman run` returns: its fence records the digest a moment later.
  ASSERT_TRUE(
      WaitUntil([&] { return !StatusOf(*runner_, "team/job/main-0/1").starting_container; }));
  const MonoTime started = StatusOf(*runner_, "team/job/main-0/1").start_time;
  const std::string digest = StatusOf(*runner_, "team/job/main-0/1").image_digest;
  EXPECT_THAT(digest, ::testing::StartsWith("sha256:"));
  // What the fence recorded at start is what the next runner reports, without asking podman
  // again (an inspect that fails under load would report no digest).
  const std::string recorded = "sha256:" + std::string(64, 'e');
  WriteFile(
      options_.fence_dir + "/" + runner_->ContainerNameForTest("team/job/side-0/1") + ".started",
      recorded + "\n");
  runner_.reset();  // the agent restarts; its containers run on

  runner_ = OpenRunner(real_clock_);
  ASSERT_NE(runner_, nullptr);
  const std::vector<TaskStatus> adopted = runner_->Poll();
  ASSERT_EQ(adopted.size(), 2u);
  EXPECT_EQ(adopted[0].task_id, "team/job/main-0/1");
  EXPECT_EQ(adopted[0].state, TaskState::kRunning);
  EXPECT_EQ(adopted[0].start_time, started);
  EXPECT_TRUE(adopted[0].enforces_lease) << "its fence was adopted too";
  EXPECT_EQ(adopted[0].image_digest, digest) << "reported again after the restart";
  EXPECT_EQ(adopted[1].image_digest, recorded);
  EXPECT_EQ(adopted[1].task_id, "team/job/side-0/1");
  EXPECT_EQ(adopted[1].state, TaskState::kExited);
  EXPECT_EQ(adopted[1].exit_code, 7);
  ASSERT_OK(runner_->Stop("team/job/main-0/1", std::chrono::seconds(60)));
  EXPECT_EQ(WaitForEnd(*runner_, "team/job/main-0/1").signal, SIGTERM);
  EXPECT_THAT(runner_->Start(running), StatusIs(StatusCode::kAlreadyExists));
  ASSERT_OK(runner_->Forget("team/job/main-0/1"));
  ASSERT_OK(runner_->Forget("team/job/side-0/1"));
  EXPECT_TRUE(WaitUntil([&] { return ListedContainers().empty(); })) << ListedContainers();
}

// A container podman made but never started (a `podman run` cut short by a lease that ran out,
// whose fence was killed before it removed it) is not a running task: the next runner reports it
// lost, and forgetting it removes the container.
TEST_F(PodmanRunnerTest, AContainerMadeButNeverStartedIsLostAndRemoved) {
  ASSERT_NE(runner_, nullptr);
  const std::string name = runner_->ContainerNameForTest("job/made/1");
  const std::string made = PodmanOutput(
      {"create", "--name", name, "--label", fmt::format("{}={}", kRunnerLabel, options_.instance),
       "--label", fmt::format("{}=job/made/1", kTaskIdLabel), kImage, "true"});
  ASSERT_THAT(ListedContainers(), HasSubstr(name + " Created")) << made;
  runner_.reset();
  runner_ = OpenRunner(real_clock_);
  ASSERT_NE(runner_, nullptr);
  const TaskStatus status = WaitForEnd(*runner_, "job/made/1");
  EXPECT_EQ(status.state, TaskState::kLost);
  EXPECT_EQ(status.reason, fmt::format("its container '{}' was made but never started", name));
  ASSERT_OK(runner_->Forget("job/made/1"));
  EXPECT_TRUE(WaitUntil([&] { return ListedContainers().empty(); })) << ListedContainers();
}

TEST_F(PodmanRunnerTest, AnImageThatIsNotThereFailsTheTaskWithAClearReason) {
  ASSERT_NE(runner_, nullptr);
  TaskLaunch never = Container("job/never/1", "true");
  never.image = "localhost/gpufleet-no-such-image:1";
  ASSERT_OK(runner_->Start(never));
  TaskStatus status = WaitForEnd(*runner_, "job/never/1");
  EXPECT_EQ(status.state, TaskState::kFailedToStart);
  EXPECT_EQ(status.reason,
            "image 'localhost/gpufleet-no-such-image:1' is not on this node and its "
            "imagePullPolicy is Never");

  // The pull goes to a registry on this machine's port 443, where nothing listens.
  TaskLaunch pull = never;
  pull.task_id = "job/pull/1";
  pull.image_pull_policy = ImagePullPolicy::kIfNotPresent;
  ASSERT_OK(runner_->Start(pull));
  status = WaitForEnd(*runner_, "job/pull/1");
  EXPECT_EQ(status.state, TaskState::kFailedToStart);
  EXPECT_THAT(status.reason,
              HasSubstr("cannot pull image 'localhost/gpufleet-no-such-image:1': Error: "));

  EXPECT_EQ(ListedContainers(), "") << "a failed start leaves no container behind";

  // The container starts; its PID 1 (catatonit) cannot run the command and says so in the log.
  TaskLaunch no_command = Container("job/no-command/1", "true");
  no_command.argv = {"/bin/no-such-program"};
  ASSERT_OK(runner_->Start(no_command));
  status = WaitForEnd(*runner_, "job/no-command/1");
  EXPECT_EQ(status.state, TaskState::kExited);
  EXPECT_EQ(status.exit_code, 1);
  EXPECT_THAT(ReadFile(LogPath("job/no-command/1")),
              HasSubstr("failed to exec pid1: No such file or directory"));
  ASSERT_OK(runner_->Forget("job/no-command/1"));
}

TEST_F(PodmanRunnerTest, CpuAndMemoryRequestsBecomeTheContainersLimits) {
  ASSERT_NE(runner_, nullptr);
  TaskLaunch launch = Container(
      "job/limits/1",
      "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat "
      "/sys/fs/cgroup/memory.max; "
      "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cat /sys/fs/cgroup/cpu.max");
  launch.cpu_milli = 500;
  launch.memory_mib = 64;
  ASSERT_OK(runner_->Start(launch));
  EXPECT_EQ(WaitForEnd(*runner_, "job/limits/1").exit_code, 0);
  const std::string limits = ReadFile(LogPath("job/limits/1"));
  EXPECT_THAT(limits, HasSubstr("67108864\n"));
  EXPECT_THAT(limits, HasSubstr("50000"));
}

// On a node `nvidia-ctk cdi generate` writes the nvidia.com/gpu devices; here a spec of our own
// names a made-up GPU UUID whose "device" is a plain file. podman 4.3 reads CDI specs from
// /etc/cdi and /var/run/cdi only, so the test writes its spec there (and removes it).
TEST_F(PodmanRunnerTest, GpusBecomeCdiDevicesByUuid) {
  ASSERT_NE(runner_, nullptr);
  const std::string uuid = fmt::format("GPU-00000000-0000-0000-0000-{:012}", getpid());
  const std::string device_file = dir_ + "/fake-gpu";
  WriteFile(device_file, "fake gpu\n");
  std::filesystem::create_directories("/var/run/cdi");
  const std::string spec_path = fmt::format("/var/run/cdi/gpufleet-test-{}.yaml", getpid());
  WriteFile(spec_path, fmt::format(R"(cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
- name: {}
  containerEdits:
    mounts:
    - {{hostPath: {}, containerPath: /dev/gpufleet-fake-gpu, options: [ro, bind]}}
)",
                                   uuid, device_file));
  ASSERT_TRUE(std::filesystem::exists(spec_path)) << "cannot write " << spec_path;
  TaskLaunch launch = Container("job/gpu/1", "cat /dev/gpufleet-fake-gpu; env");
  launch.gpu_uuids = {uuid};
  ASSERT_OK(runner_->Start(launch));
  const TaskStatus status = WaitForEnd(*runner_, "job/gpu/1");
  // An MPS client of that GPU: its daemon's pipe directory mounted at the host's path, and the
  // client's variables set.
  const std::string pipes = dir_ + "/mps-pipe";
  std::filesystem::create_directories(pipes);
  WriteFile(pipes + "/control", "the daemon's pipe\n");
  TaskLaunch client = Container("job/mps/1", "cat \"$CUDA_MPS_PIPE_DIRECTORY/control\"; env");
  client.gpu_uuids = {uuid};
  client.mps = MpsClient{pipes, 4096, 30};
  ASSERT_OK(runner_->Start(client));
  const TaskStatus client_status = WaitForEnd(*runner_, "job/mps/1");
  std::filesystem::remove(spec_path);
  EXPECT_EQ(client_status.state, TaskState::kExited) << DescribeTaskStatus(client_status);
  const std::string client_log = ReadFile(LogPath("job/mps/1"));
  EXPECT_THAT(client_log, HasSubstr("the daemon's pipe\n"));
  EXPECT_THAT(client_log, HasSubstr("CUDA_MPS_PIPE_DIRECTORY=" + pipes + "\n"));
  EXPECT_THAT(client_log, HasSubstr("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M\n"));
  EXPECT_THAT(client_log, HasSubstr("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30\n"));
  EXPECT_EQ(status.state, TaskState::kExited) << DescribeTaskStatus(status);
  const std::string log = ReadFile(LogPath("job/gpu/1"));
  EXPECT_THAT(log, HasSubstr("fake gpu\n"));
  EXPECT_THAT(log, HasSubstr("CUDA_VISIBLE_DEVICES=" + uuid + "\n"));
  EXPECT_EQ(status.gpu_uuids, std::vector<std::string>{uuid});

  // A GPU without a CDI device fails the start with podman's reason.
  TaskLaunch unknown = Container("job/gpu-unknown/1", "true");
  unknown.gpu_uuids = {"GPU-ffffffff-0000-0000-0000-000000000000"};
  ASSERT_OK(runner_->Start(unknown));
  EXPECT_THAT(WaitForEnd(*runner_, "job/gpu-unknown/1").reason,
              HasSubstr("podman run failed: Error: setting up CDI devices: unresolvable CDI "
                        "devices nvidia.com/gpu=GPU-ffffffff"));
}

TEST_F(PodmanRunnerTest, TasksWithoutAnImageRunAsProcesses) {
  ASSERT_NE(runner_, nullptr);
  TaskLaunch process;
  process.task_id = "job/process/1";
  process.argv = {"/bin/sh", "-c", "echo on the host; exit 4"};
  process.log_path = LogPath(process.task_id);
  ASSERT_OK(runner_->Start(process));
  ASSERT_OK(runner_->Start(Container("job/container/1", "exit 5")));
  EXPECT_EQ(WaitForEnd(*runner_, "job/process/1").exit_code, 4);
  EXPECT_EQ(WaitForEnd(*runner_, "job/container/1").exit_code, 5);
  EXPECT_EQ(ReadFile(process.log_path), "on the host\n");
  const std::vector<TaskStatus> statuses = runner_->Poll();
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_EQ(statuses[0].task_id, "job/container/1") << "sorted by task id";
  EXPECT_GT(statuses[1].process_group, 0) << "the process task is the process runner's";
  EXPECT_THAT(runner_->Start(Container("job/process/1", "true")),
              StatusIs(StatusCode::kAlreadyExists));
  process.task_id = "job/container/1";
  EXPECT_THAT(runner_->Start(process), StatusIs(StatusCode::kAlreadyExists));
  ASSERT_OK(runner_->Forget("job/process/1"));
  ASSERT_OK(runner_->Forget("job/container/1"));
  EXPECT_TRUE(runner_->Poll().empty());
}

// A loopback port that takes connections into its backlog and never answers: a registry that
// hangs.
class SilentRegistry {
 public:
  SilentRegistry() : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
        listen(fd_, 64) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      address_ = fmt::format("127.0.0.1:{}", ntohs(address.sin_port));
    }
  }
  ~SilentRegistry() {
    if (fd_ >= 0) {
      close(fd_);
    }
  }
  SilentRegistry(const SilentRegistry&) = delete;
  SilentRegistry& operator=(const SilentRegistry&) = delete;
  const std::string& address() const { return address_; }

 private:
  int fd_;
  std::string address_;
};

TEST_F(PodmanRunnerTest, PullsAnImageFromALoopbackRegistryBeforeTheStart) {
  ASSERT_NE(runner_, nullptr);
  LoopbackRegistry registry(dir_, PodmanPrefix(), kImage);
  ASSERT_EQ(registry.error(), "");
  const std::string image = registry.address() + "/tiny:1";
  ReopenPullingFrom(registry.address());
  ASSERT_NE(runner_, nullptr);
  TaskLaunch pulled = Container("job/pulled/1", "echo pulled and ran");
  pulled.image = image;
  pulled.image_pull_policy = ImagePullPolicy::kIfNotPresent;
  ASSERT_OK(runner_->Start(pulled));
  const TaskStatus status = WaitForEnd(*runner_, "job/pulled/1");
  EXPECT_EQ(status.state, TaskState::kExited) << DescribeTaskStatus(status);
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_TRUE(status.image_pull_time.has_value());
  EXPECT_FALSE(status.pulling_image);
  EXPECT_EQ(ReadFile(LogPath("job/pulled/1")), "pulled and ran\n");
  // The registry served the image's manifest to the pull.
  EXPECT_THAT(registry.log(), HasSubstr("GET /v2/tiny/manifests/1"));

  TaskLaunch present = pulled;
  present.task_id = "job/present/1";
  ASSERT_OK(runner_->Start(present));
  EXPECT_FALSE(StatusOf(*runner_, "job/present/1").pulling_image)
      << "IfNotPresent pulls nothing once the node holds the image";
  EXPECT_EQ(WaitForEnd(*runner_, "job/present/1").exit_code, 0);
  EXPECT_FALSE(StatusOf(*runner_, "job/present/1").image_pull_time.has_value());

  // Always pulls; with the registry gone the task fails with podman's reason.
  registry.Stop();
  TaskLaunch always = pulled;
  always.task_id = "job/always/1";
  always.image_pull_policy = ImagePullPolicy::kAlways;
  ASSERT_OK(runner_->Start(always));
  const TaskStatus down = WaitForEnd(*runner_, "job/always/1");
  EXPECT_EQ(down.state, TaskState::kFailedToStart);
  EXPECT_THAT(down.reason, HasSubstr("cannot pull image '" + image + "': Error: "));
  EXPECT_THAT(down.reason, HasSubstr("connection refused"));
  ASSERT_OK(runner_->Forget("job/always/1"));
  EXPECT_THAT(ListedContainers(), Not(HasSubstr("always"))) << "no container was created";
}

// Disk full on the image store: podman's storage is an 8 MiB tmpfs and the image holds 12 MiB of
// random bytes. The pull fails the task with podman's "no space left on device" before any
// container is made (so the server frees its GPUs like any failed start), and the next task, a
// small image into the same store, starts.
TEST_F(PodmanRunnerTest, AFullImageStoreFailsThePullWithItsReasonAndTheNextTaskStarts) {
  ASSERT_NE(runner_, nullptr);
  const std::string store = dir_ + "/small-store";
  std::filesystem::create_directories(store);
  if (!Shell(fmt::format("mount -t tmpfs -o size=8m gpufleet-test {}", store)).empty()) {
    GTEST_SKIP() << "cannot mount a tmpfs (the podman tests run as root)";
  }
  struct Unmount {
    std::string prefix;
    std::string store;
    ~Unmount() {
      Shell(prefix + " rm --all --force >/dev/null 2>&1; " + prefix +
            " rmi --all --force >/dev/null 2>&1; umount " + store);
    }
  };
  ASSERT_EQ(Shell(fmt::format("set -e; cd {0}; mkdir -p big; cp -a {1}/rootfs/. big/; "
                              "head -c 12M /dev/urandom > big/random; tar -C big -cf big.tar .; "
                              "rm -r big; {2} import big.tar localhost/gpufleet-test-big:1 "
                              ">/dev/null; rm big.tar",
                              dir_, suite_dir_, PodmanPrefix())),
            "");
  LoopbackRegistry registry(dir_, PodmanPrefix(), kImage);
  ASSERT_EQ(registry.error(), "");
  ASSERT_EQ(Shell(fmt::format("{} push --tls-verify=false localhost/gpufleet-test-big:1 {}/big:1; "
                              "{} rmi localhost/gpufleet-test-big:1 >/dev/null",
                              PodmanPrefix(), registry.address(), PodmanPrefix())),
            "");
  options_.storage_root = store + "/root";
  options_.run_root = suite_dir_ + "/small-run";  // podman wants runroots under 50 characters
  const Unmount unmount{fmt::format("CONTAINERS_CONF={} podman --root {} --runroot {} --tmpdir {} "
                                    "--storage-driver vfs",
                                    options_.containers_conf, options_.storage_root,
                                    options_.run_root, options_.tmp_dir),
                        store};
  ReopenPullingFrom(registry.address());
  ASSERT_NE(runner_, nullptr);

  TaskLaunch big = Container("job/big/1", "echo must not run");
  big.image = registry.address() + "/big:1";
  big.image_pull_policy = ImagePullPolicy::kIfNotPresent;
  ASSERT_OK(runner_->Start(big));
  const TaskStatus full = WaitForEnd(*runner_, "job/big/1");
  EXPECT_EQ(full.state, TaskState::kFailedToStart) << DescribeTaskStatus(full);
  EXPECT_THAT(full.reason, HasSubstr("cannot pull image '" + big.image + "'"));
  EXPECT_THAT(full.reason, HasSubstr("no space left on device"));
  EXPECT_EQ(ReadFile(LogPath("job/big/1")), "");
  ASSERT_OK(runner_->Forget("job/big/1"));
  EXPECT_THAT(ListedContainers(), Not(HasSubstr("big"))) << "no container was created";

  TaskLaunch next = Container("job/next/1", "echo next ran");
  next.image = registry.address() + "/tiny:1";
  next.image_pull_policy = ImagePullPolicy::kIfNotPresent;
  ASSERT_OK(runner_->Start(next));
  const TaskStatus ran = WaitForEnd(*runner_, "job/next/1");
  EXPECT_EQ(ran.state, TaskState::kExited) << DescribeTaskStatus(ran);
  EXPECT_EQ(ReadFile(LogPath("job/next/1")), "next ran\n");
  ASSERT_OK(runner_->Forget("job/next/1"));
}

// Pulls run beside the agent: Start returns while the registry hangs, the task shows that it is
// pulling, and a stop ends the pull before anything of the task ran.
TEST_F(PodmanRunnerTest, APullRunsBesideTheCallerAndAStopEndsItBeforeAnythingRuns) {
  ASSERT_NE(runner_, nullptr);
  const SilentRegistry silent;
  ASSERT_NE(silent.address(), "");
  ReopenPullingFrom(silent.address());
  ASSERT_NE(runner_, nullptr);
  TaskLaunch launch = Container("job/hanging/1", "echo must not run");
  launch.image = silent.address() + "/tiny:1";
  launch.image_pull_policy = ImagePullPolicy::kAlways;
  ASSERT_OK(runner_->Start(launch));
  TaskStatus pulling = StatusOf(*runner_, "job/hanging/1");
  EXPECT_EQ(pulling.state, TaskState::kRunning);
  EXPECT_TRUE(pulling.pulling_image);
  EXPECT_TRUE(pulling.enforces_lease) << "the pull ends with the agent's lease";
  EXPECT_THAT(pulling.image_pull_progress, Not(::testing::IsEmpty()));
  EXPECT_EQ(DescribeTaskStatus(pulling), "pulling its image");
  // A second Poll a moment later: still pulling, still no container.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  pulling = StatusOf(*runner_, "job/hanging/1");
  EXPECT_TRUE(pulling.pulling_image);
  EXPECT_THAT(runner_->Forget("job/hanging/1"), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(ListedContainers(), "");

  ASSERT_OK(runner_->Stop("job/hanging/1", std::chrono::seconds(30)));
  const TaskStatus stopped = WaitForEnd(*runner_, "job/hanging/1");
  EXPECT_EQ(stopped.state, TaskState::kFailedToStart);
  EXPECT_THAT(stopped.reason, HasSubstr("stopped while its image"));
  EXPECT_TRUE(stopped.image_pull_time.has_value());
  EXPECT_FALSE(stopped.pulling_image);
  EXPECT_FALSE(std::filesystem::exists(LogPath("job/hanging/1")) &&
               ReadFile(LogPath("job/hanging/1")).find("must not run") != std::string::npos);
  EXPECT_EQ(ListedContainers(), "");
  ASSERT_OK(runner_->Forget("job/hanging/1"));
  // Nothing of the pull is left: no process task, no log.
  for (const auto& entry : std::filesystem::directory_iterator(options_.pull_dir)) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(name == "lock" || name == "lease") << name;
  }
}

TEST_F(PodmanRunnerTest, APullPastItsTimeoutIsKilledAndTheTaskFails) {
  ASSERT_NE(runner_, nullptr);
  const SilentRegistry silent;
  ASSERT_NE(silent.address(), "");
  options_.pull_timeout = std::chrono::seconds(1);
  ReopenPullingFrom(silent.address());
  ASSERT_NE(runner_, nullptr);
  TaskLaunch launch = Container("job/slow/1", "true");
  launch.image = silent.address() + "/tiny:1";
  launch.image_pull_policy = ImagePullPolicy::kIfNotPresent;
  ASSERT_OK(runner_->Start(launch));
  const TaskStatus status = WaitForEnd(*runner_, "job/slow/1");
  EXPECT_EQ(status.state, TaskState::kFailedToStart);
  EXPECT_THAT(status.reason, HasSubstr("podman did not finish within 1s"));
  EXPECT_EQ(ListedContainers(), "");
}

// A pull an agent started goes on under the next agent's runner, which takes it over.
TEST_F(PodmanRunnerTest, APullOutlivesTheRunnerAndTheNextOneTakesItOver) {
  ASSERT_NE(runner_, nullptr);
  const SilentRegistry silent;
  ASSERT_NE(silent.address(), "");
  ReopenPullingFrom(silent.address());
  ASSERT_NE(runner_, nullptr);
  TaskLaunch launch = Container("job/restart/1", "true");
  launch.image = silent.address() + "/tiny:1";
  launch.image_pull_policy = ImagePullPolicy::kAlways;
  ASSERT_OK(runner_->Start(launch));
  const std::string pull_state = ReadFile(options_.pull_dir + "/job%restart%1.task");
  ASSERT_NE(pull_state, "");
  runner_.reset();
  runner_ = OpenRunner(real_clock_);
  ASSERT_NE(runner_, nullptr);
  ASSERT_OK(runner_->Start(launch));
  EXPECT_TRUE(StatusOf(*runner_, "job/restart/1").pulling_image);
  EXPECT_EQ(ReadFile(options_.pull_dir + "/job%restart%1.task"), pull_state)
      << "the same pull process, not a second one";
  ASSERT_OK(runner_->Stop("job/restart/1", Duration::zero()));
  EXPECT_EQ(WaitForEnd(*runner_, "job/restart/1").state, TaskState::kFailedToStart);
}

// What a registry can do wrong: an image it does not have, and a layer whose bytes do not match
// their digest. Each fails its task with the reason, and no container is created.
TEST_F(PodmanRunnerTest, AnUnknownImageAndACorruptLayerFailTheTaskWithTheRegistrysReason) {
  ASSERT_NE(runner_, nullptr);
  LoopbackRegistry registry(dir_, PodmanPrefix(), kImage);
  ASSERT_EQ(registry.error(), "");
  ReopenPullingFrom(registry.address());
  ASSERT_NE(runner_, nullptr);

  TaskLaunch unknown = Container("job/unknown/1", "true");
  unknown.image = registry.address() + "/tiny:nope";
  unknown.image_pull_policy = ImagePullPolicy::kIfNotPresent;
  ASSERT_OK(runner_->Start(unknown));
  const TaskStatus missing = WaitForEnd(*runner_, "job/unknown/1");
  EXPECT_EQ(missing.state, TaskState::kFailedToStart);
  EXPECT_THAT(missing.reason, HasSubstr("cannot pull image '" + unknown.image + "'"));
  EXPECT_THAT(missing.reason, HasSubstr("manifest unknown"));

  // An image whose layer this node does not hold (a pull of the suite's image would skip its
  // layer), pushed and then removed here. Its layer, the largest blob (the manifest and the
  // config are small), then gets other bytes of the same length: it no longer has its digest.
  const std::string other = registry.address() + "/other:1";
  ASSERT_EQ(Shell(fmt::format("set -e; cd {0}; mkdir -p other; head -c 4194304 /dev/urandom "
                              ">other/noise; tar -C other -cf other.tar .; "
                              "{1} import other.tar {2} >/dev/null; "
                              "{1} push --tls-verify=false {2} >/dev/null; {1} rmi {2} >/dev/null",
                              dir_, PodmanPrefix(), other)),
            "");
  std::vector<std::string> blobs = registry.BlobFiles();
  ASSERT_FALSE(blobs.empty());
  const std::string layer =
      *std::max_element(blobs.begin(), blobs.end(), [](const std::string& a, const std::string& b) {
        return std::filesystem::file_size(a) < std::filesystem::file_size(b);
      });
  std::string bytes = ReadFile(layer);
  for (char& c : bytes) {
    c = static_cast<char>(c ^ 0x5a);
  }
  WriteFile(layer, bytes);
  TaskLaunch corrupt = Container("job/corrupt/1", "true");
  corrupt.image = other;
  corrupt.image_pull_policy = ImagePullPolicy::kAlways;
  ASSERT_OK(runner_->Start(corrupt));
  const TaskStatus failed = WaitForEnd(*runner_, "job/corrupt/1");
  EXPECT_EQ(failed.state, TaskState::kFailedToStart);
  EXPECT_THAT(failed.reason, HasSubstr("cannot pull image '" + corrupt.image + "'"));
  EXPECT_THAT(failed.reason, ::testing::AnyOf(HasSubstr("digest"), HasSubstr("Digest")));
  EXPECT_EQ(ListedContainers(), "");
}

TEST_F(PodmanRunnerTest, RefusesBadLaunches) {
  ASSERT_NE(runner_, nullptr);
  TaskLaunch flag = Container("job/flag/1", "true");
  flag.image = "--privileged";
  EXPECT_THAT(runner_->Start(flag), StatusIs(StatusCode::kInvalidArgument, HasSubstr("image")));
  TaskLaunch no_log = Container("job/no-log/1", "true");
  no_log.log_path = "";
  EXPECT_THAT(runner_->Start(no_log), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(runner_->Poll().empty());
}

}  // namespace
}  // namespace gpufleet::runner
