// SPDX-License-Identifier: Apache-2.0
// ProcessRunner with real processes (/bin/sh scripts). The runner reads time from a FakeClock, so
// grace periods pass when a test says so; the tests themselves wait for processes with bounded
// polling loops on the real clock.
#include "gpufleet/runner/process_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::runner {
namespace {

using ::gpufleet::testing::StatusIs;
using ::std::chrono::seconds;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Optional;
using ::testing::StartsWith;

// Long enough for a loaded 2-core CI machine; a passing test never waits this long.
constexpr Duration kPatience = std::chrono::seconds(10);

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::trunc);
  out << content;
}

// Fields of /proc/PID/stat after the command name: [0] is the state, [1] the parent pid.
std::vector<std::string> ProcStatFields(pid_t pid) {
  const std::string line = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t name_end = line.rfind(')');
  std::vector<std::string> fields;
  if (name_end == std::string::npos) {
    return fields;
  }
  std::istringstream rest(line.substr(name_end + 1));
  std::string field;
  while (rest >> field) {
    fields.push_back(field);
  }
  return fields;
}

// Gone, or a zombie that nobody reaped yet: either way it runs no more.
bool ProcessGone(pid_t pid) {
  const std::vector<std::string> fields = ProcStatFields(pid);
  return fields.empty() || fields[0] == "Z" || fields[0] == "X";
}

bool IsChildOfThisProcess(pid_t pid) {
  const std::vector<std::string> fields = ProcStatFields(pid);
  return fields.size() > 1 && fields[1] == std::to_string(getpid());
}

std::set<std::string> OpenDescriptors(pid_t pid) {
  std::set<std::string> names;
  std::error_code error;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", error)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

std::string DescriptorTarget(pid_t pid, int fd) {
  std::error_code error;
  return std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd),
                                       error)
      .string();
}

class ProcessRunnerTestBase : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/gpufleet_runner_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = std::filesystem::canonical(pattern).string();
    state_dir_ = dir_ + "/state";
  }

  void TearDown() override {
    // A failed test must not leave processes behind. Every shim here is a child of the test
    // process, which rules out signalling a reused group id.
    for (const pid_t group : groups_) {
      if (IsChildOfThisProcess(group)) {
        kill(-group, SIGKILL);
        waitpid(group, nullptr, 0);
      }
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::unique_ptr<ProcessRunner> OpenRunner() {
    Result<std::unique_ptr<ProcessRunner>> runner = ProcessRunner::Open(state_dir_, clock_);
    EXPECT_OK(runner);
    return runner.ok() ? std::move(runner).value() : nullptr;
  }

  std::string LogPath(const std::string& name) const { return dir_ + "/" + name + ".log"; }

  TaskLaunch Shell(const std::string& task_id, const std::string& script) const {
    TaskLaunch launch;
    launch.task_id = task_id;
    launch.argv = {"/bin/sh", "-c", script};
    std::string name = task_id;
    std::replace(name.begin(), name.end(), '/', '_');
    launch.log_path = LogPath(name);
    launch.working_dir = dir_;
    return launch;
  }

  // Starts the task and remembers its process group for TearDown.
  void StartOrFail(ProcessRunner& runner, const TaskLaunch& launch) {
    ASSERT_OK(runner.Start(launch));
    const TaskStatus status = StatusOf(runner, launch.task_id);
    if (status.process_group > 0) {
      groups_.insert(status.process_group);
    }
  }

  TaskStatus StatusOf(ProcessRunner& runner, const std::string& task_id) {
    for (const TaskStatus& status : runner.Poll()) {
      if (status.task_id == task_id) {
        return status;
      }
    }
    ADD_FAILURE() << "the runner does not know task " << task_id;
    return {};
  }

  // Polls `condition` every millisecond until it holds or kPatience has passed.
  bool WaitUntil(const std::function<bool()>& condition) {
    const MonoTime deadline = real_clock_.Now() + kPatience;
    while (!condition()) {
      if (real_clock_.Now() > deadline) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  TaskStatus WaitForEnd(ProcessRunner& runner, const std::string& task_id) {
    TaskStatus status;
    EXPECT_TRUE(WaitUntil([&] {
      status = StatusOf(runner, task_id);
      return IsFinal(status.state);
    })) << "task "
        << task_id << " still " << DescribeTaskStatus(status);
    return status;
  }

  bool WaitForLog(const std::string& path, const std::string& text) {
    return WaitUntil([&] { return ReadFile(path).find(text) != std::string::npos; });
  }

  std::string dir_;
  std::string state_dir_;
  FakeClock clock_{MonoTime{5'000'000'000}};
  SystemClock real_clock_;
  std::set<pid_t> groups_;
};

class ProcessRunnerTest : public ProcessRunnerTestBase {};
class ProcessRunnerIntegrationTest : public ProcessRunnerTestBase {};

TEST_F(ProcessRunnerTest, RunsTaskWithItsGpusEnvironmentAndLog) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  TaskLaunch launch = Shell("train/group-0",
                            "echo \"cuda=$CUDA_VISIBLE_DEVICES nvidia=$NVIDIA_VISIBLE_DEVICES "
                            "epochs=$EPOCHS\"; echo oops >&2");
  launch.gpu_uuids = {"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "MIG-0a1b2c3d-aaaa"};
  launch.env = {{"EPOCHS", "3"}};
  StartOrFail(*runner, launch);
  clock_.Advance(seconds(2));

  const TaskStatus status = WaitForEnd(*runner, "train/group-0");
  EXPECT_EQ(status.state, TaskState::kExited);
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_EQ(status.start_time, MonoTime{5'000'000'000});
  // The end is dated when a Poll first saw it: StartOrFail's own Poll may already have.
  EXPECT_THAT(status.end_time, Optional(AnyOf(MonoTime{5'000'000'000}, clock_.Now())));
  EXPECT_EQ(status.gpu_uuids, launch.gpu_uuids);
  EXPECT_GT(status.process_group, 0);
  EXPECT_EQ(ReadFile(launch.log_path),
            "cuda=GPU-8932f937-d72c-4106-c12f-20bd9faed9f6,MIG-0a1b2c3d-aaaa "
            "nvidia=GPU-8932f937-d72c-4106-c12f-20bd9faed9f6,MIG-0a1b2c3d-aaaa epochs=3\n"
            "oops\n");
}

// Issue 37: the task reports checkpoints to a file the runner made for it alone.
TEST_F(ProcessRunnerTest, ATaskAppendsItsCheckpointsToTheFileItsEnvironmentNames) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  TaskLaunch launch = Shell("train/group-0",
                            "echo \"file=$GPUFLEET_CHECKPOINT_FILE\"; "
                            "echo '1765119600 step=100' >> \"$GPUFLEET_CHECKPOINT_FILE\"");
  launch.checkpoint_path = dir_ + "/train.checkpoint";
  StartOrFail(*runner, launch);
  EXPECT_EQ(WaitForEnd(*runner, "train/group-0").exit_code, 0);
  EXPECT_EQ(ReadFile(launch.log_path), "file=" + launch.checkpoint_path + "\n");
  EXPECT_EQ(ReadFile(launch.checkpoint_path), "1765119600 step=100\n");
  struct stat info = {};
  ASSERT_EQ(stat(launch.checkpoint_path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0600U);

  // A link in the file's place is not followed.
  const std::string target = dir_ + "/elsewhere";
  TaskLaunch linked = Shell("train/group-1", "true");
  linked.checkpoint_path = dir_ + "/linked.checkpoint";
  ASSERT_EQ(symlink(target.c_str(), linked.checkpoint_path.c_str()), 0);
  EXPECT_THAT(runner->Start(linked),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("linked.checkpoint")));
  EXPECT_FALSE(std::filesystem::exists(target));
}

// Issue 37 item 4: a notice is the signal alone, to the task's process group; the task runs on
// until it ends by itself (or is stopped), and a signal that would stop it is refused.
TEST_F(ProcessRunnerTest, ANoticeReachesTheTaskWhichRunsOn) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  TaskLaunch launch = Shell("train/group-0",
                            "trap 'echo \"notice $GPUFLEET_PREEMPTION_NOTICE_FILE\"; done=1' USR2; "
                            "done=0; echo ready; "
                            // Builtins only: a child of the group without a handler (sleep)
                            // would die of the signal.
                            "while [ $done = 0 ]; do :; done; echo saved");
  launch.notice_path = dir_ + "/train.notice";
  StartOrFail(*runner, launch);
  ASSERT_TRUE(WaitForLog(launch.log_path, "ready"));
  EXPECT_THAT(runner->SendNotice("train/group-0", "SIGKILL"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"SIGKILL\" is not a notice")));
  EXPECT_THAT(runner->SendNotice("train/other", "SIGUSR2"), StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(StatusOf(*runner, "train/group-0").state, TaskState::kRunning);
  ASSERT_OK(runner->SendNotice("train/group-0", "SIGUSR2"));
  const TaskStatus status = WaitForEnd(*runner, "train/group-0");
  EXPECT_EQ(status.state, TaskState::kExited) << "the notice does not stop it";
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_FALSE(status.stop_requested);
  EXPECT_EQ(status.notices, std::vector<std::string>{"SIGUSR2"});
  EXPECT_EQ(ReadFile(launch.log_path), "ready\nnotice " + launch.notice_path + "\nsaved\n");
  // An ended task gets nothing.
  ASSERT_OK(runner->SendNotice("train/group-0", "SIGUSR2"));
  EXPECT_EQ(StatusOf(*runner, "train/group-0").notices, std::vector<std::string>{"SIGUSR2"});
}

TEST_F(ProcessRunnerTest, TaskWithoutGpusSeesNoDevice) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  const TaskLaunch launch = Shell(
      "cpu-only", "echo \"cuda=[${CUDA_VISIBLE_DEVICES-unset}] nvidia=$NVIDIA_VISIBLE_DEVICES\"");
  StartOrFail(*runner, launch);
  EXPECT_EQ(WaitForEnd(*runner, "cpu-only").state, TaskState::kExited);
  EXPECT_EQ(ReadFile(launch.log_path), "cuda=[] nvidia=void\n");
}

TEST_F(ProcessRunnerTest, ATaskGetsOnlyTheAllowListedPartOfTheRunnersEnvironment) {
  // The agent's own secrets (its token) and anything else it was started with stay with it.
  ASSERT_EQ(setenv("GPUFLEET_AGENT_TOKEN", "secret-of-the-agent", 1), 0);
  ASSERT_EQ(setenv("AWS_SECRET_ACCESS_KEY", "secret-of-the-host", 1), 0);
  ASSERT_EQ(setenv("TZ", "Europe/Paris", 1), 0);
  ASSERT_EQ(setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3", 1), 0);
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  TaskLaunch launch =
      Shell("env",
            "echo \"[${GPUFLEET_AGENT_TOKEN-}][${AWS_SECRET_ACCESS_KEY-}] $TZ $EPOCHS "
            "$CUDA_VISIBLE_DEVICES\"; test -n \"$PATH\"");
  launch.env = {{"EPOCHS", "3"}, {"TZ", "UTC"}};
  launch.gpu_uuids = {"GPU-1"};
  StartOrFail(*runner, launch);
  const TaskStatus status = WaitForEnd(*runner, "env");
  unsetenv("GPUFLEET_AGENT_TOKEN");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  unsetenv("TZ");
  unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(status.state, TaskState::kExited);
  EXPECT_EQ(ReadFile(launch.log_path), "[][] UTC 3 GPU-1\n");
}

TEST_F(ProcessRunnerTest, AppendsToAnExistingLogAndStartsInTheWorkingDirectory) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  const std::string work = dir_ + "/work";
  ASSERT_EQ(mkdir(work.c_str(), 0755), 0);
  TaskLaunch launch = Shell("pwd", "pwd");
  launch.working_dir = work;
  WriteFile(launch.log_path, "earlier run\n");
  StartOrFail(*runner, launch);
  EXPECT_EQ(WaitForEnd(*runner, "pwd").state, TaskState::kExited);
  EXPECT_EQ(ReadFile(launch.log_path), "earlier run\n" + work + "\n");
}

TEST_F(ProcessRunnerTest, ReportsZeroAndNonZeroExitCodes) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  StartOrFail(*runner, Shell("ok", "exit 0"));
  StartOrFail(*runner, Shell("bad", "exit 3"));
  const TaskStatus ok = WaitForEnd(*runner, "ok");
  const TaskStatus bad = WaitForEnd(*runner, "bad");
  EXPECT_EQ(DescribeTaskStatus(ok), "exited with code 0");
  EXPECT_EQ(DescribeTaskStatus(bad), "exited with code 3");
}

TEST_F(ProcessRunnerTest, CommandNotInPathFailsToStart) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  TaskLaunch launch = Shell("missing", "");
  launch.argv = {"gpufleet-no-such-command", "--flag"};
  launch.env = {{"PATH", "/usr/bin:/bin"}};
  ASSERT_OK(runner->Start(launch));
  const TaskStatus status = StatusOf(*runner, "missing");
  EXPECT_EQ(status.state, TaskState::kFailedToStart);
  EXPECT_EQ(status.reason, "command 'gpufleet-no-such-command' not found in PATH '/usr/bin:/bin'");
  EXPECT_EQ(status.process_group, 0);
  EXPECT_EQ(status.end_time, status.start_time);
  ASSERT_OK(runner->Forget("missing"));
}

TEST_F(ProcessRunnerTest, ProgramThatCannotBeExecutedFailsToStart) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  TaskLaunch missing = Shell("missing-path", "");
  missing.argv = {dir_ + "/no-such-program"};
  StartOrFail(*runner, missing);
  const std::string not_executable = dir_ + "/script.sh";
  WriteFile(not_executable, "#!/bin/sh\necho hello\n");
  ASSERT_EQ(chmod(not_executable.c_str(), 0644), 0);
  TaskLaunch denied = Shell("denied", "");
  denied.argv = {not_executable};
  StartOrFail(*runner, denied);

  const TaskStatus missing_status = WaitForEnd(*runner, "missing-path");
  EXPECT_EQ(missing_status.state, TaskState::kFailedToStart);
  EXPECT_EQ(missing_status.reason,
            "cannot execute '" + dir_ + "/no-such-program': No such file or directory");
  const TaskStatus denied_status = WaitForEnd(*runner, "denied");
  EXPECT_EQ(denied_status.state, TaskState::kFailedToStart);
  EXPECT_EQ(denied_status.reason, "cannot execute '" + not_executable + "': Permission denied");
  EXPECT_THAT(ReadFile(missing.log_path), IsEmpty());
}

TEST_F(ProcessRunnerTest, AnMpsClientGetsItsPipeDirectoryAndLimits) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  TaskLaunch launch =
      Shell("share",
            "echo \"cuda=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY "
            "mem=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT threads=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\"");
  launch.gpu_uuids = {"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"};
  launch.mps = MpsClient{dir_ + "/mps/pipe", 20480, 25};
  StartOrFail(*runner, launch);
  EXPECT_EQ(WaitForEnd(*runner, "share").state, TaskState::kExited);
  EXPECT_EQ(ReadFile(launch.log_path), "cuda=GPU-8932f937-d72c-4106-c12f-20bd9faed9f6 pipe=" +
                                           dir_ + "/mps/pipe mem=0=20480M threads=25\n");

  // Without a memory limit the variable is not set; a task that is no MPS client gets none.
  TaskLaunch unlimited = Shell("unlimited", "echo \"[${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT-unset}]\"");
  unlimited.gpu_uuids = launch.gpu_uuids;
  unlimited.mps = MpsClient{dir_ + "/mps/pipe", 0, 50};
  StartOrFail(*runner, unlimited);
  EXPECT_EQ(WaitForEnd(*runner, "unlimited").state, TaskState::kExited);
  EXPECT_EQ(ReadFile(unlimited.log_path), "[unset]\n");
  ASSERT_EQ(setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/the-agents-own", 1), 0);
  const TaskLaunch sliced = Shell("sliced", "echo \"[${CUDA_MPS_PIPE_DIRECTORY-unset}]\"");
  StartOrFail(*runner, sliced);
  EXPECT_EQ(WaitForEnd(*runner, "sliced").state, TaskState::kExited);
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  EXPECT_EQ(ReadFile(sliced.log_path), "[unset]\n");
}

TEST_F(ProcessRunnerTest, RefusesBadMpsClients) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  TaskLaunch launch = Shell("share", "exit 0");
  launch.gpu_uuids = {"GPU-a"};
  launch.env = {{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=80G"}};
  EXPECT_THAT(runner->Start(launch),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT of task 'share' is set by "
                                 "the runner for MPS clients")));
  launch.env.clear();
  launch.mps = MpsClient{dir_ + "/pipe", 0, 0};
  EXPECT_THAT(runner->Start(launch),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("mps.active_thread_percentage of task 'share' is 0: not 1..100")));
  launch.mps = MpsClient{"relative/pipe", 0, 10};
  EXPECT_THAT(runner->Start(launch),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("mps.pipe_directory of task 'share' is 'relative/pipe'")));
  launch.mps = MpsClient{dir_ + "/pipe", 0, 10};
  launch.gpu_uuids = {"GPU-a", "GPU-b"};
  EXPECT_THAT(runner->Start(launch), StatusIs(StatusCode::kInvalidArgument,
                                              HasSubstr("an MPS client has one GPU, not 2")));
  EXPECT_THAT(runner->Poll(), IsEmpty());
}

TEST_F(ProcessRunnerTest, RefusesBadLaunches) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  TaskLaunch launch = Shell("job", "exit 0");

  launch.log_path.clear();
  EXPECT_THAT(runner->Start(launch),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("log_path of task 'job' is empty")));
  launch.log_path = dir_ + "/no-such-dir/job.log";
  EXPECT_THAT(runner->Start(launch),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("log_path '" + dir_ +
                                 "/no-such-dir/job.log' of task 'job' cannot be opened for "
                                 "appending: No such file or directory")));
  launch.log_path = dir_;  // a directory
  EXPECT_THAT(runner->Start(launch),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("Is a directory")));
  launch.log_path = LogPath("job");
  launch.working_dir = dir_ + "/no-such-dir";
  EXPECT_THAT(runner->Start(launch),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("working_dir '" + dir_ +
                                 "/no-such-dir' of task 'job' is unusable: No such file")));
  launch.working_dir = LogPath("job");  // exists now, but is a file
  WriteFile(launch.working_dir, "");
  EXPECT_THAT(runner->Start(launch),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("is not a directory")));
  launch.working_dir = dir_;
  launch.image = "Not-An-Image";
  EXPECT_THAT(runner->Start(launch),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("image of task 'job': ")));
  launch.image = "localhost/tiny:1";  // valid, but a container: not run on the host instead
  EXPECT_THAT(runner->Start(launch), StatusIs(StatusCode::kInvalidArgument,
                                              HasSubstr("the process runner runs no containers")));
  launch.image.clear();
  launch.argv.clear();
  EXPECT_THAT(runner->Start(launch),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("argv of task 'job' is empty")));
  EXPECT_THAT(runner->Poll(), IsEmpty());  // none of them was registered

  StartOrFail(*runner, Shell("job", "exit 0"));
  EXPECT_THAT(runner->Start(Shell("job", "exit 0")),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("task 'job' is already known")));
  WaitForEnd(*runner, "job");
  EXPECT_THAT(runner->Start(Shell("job", "exit 0")), StatusIs(StatusCode::kAlreadyExists));
}

TEST_F(ProcessRunnerTest, StopAndForgetFollowTheirContracts) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  EXPECT_THAT(runner->Stop("nope", seconds(1)),
              StatusIs(StatusCode::kNotFound, HasSubstr("task 'nope' is not known")));
  EXPECT_THAT(runner->Forget("nope"), StatusIs(StatusCode::kNotFound));

  const TaskLaunch launch = Shell("sleeper", "exec sleep 30");
  StartOrFail(*runner, launch);
  EXPECT_THAT(runner->Stop("sleeper", seconds(-1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(runner->Forget("sleeper"),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("still running")));

  ASSERT_OK(runner->Stop("sleeper", seconds(30)));
  const TaskStatus status = WaitForEnd(*runner, "sleeper");
  EXPECT_EQ(DescribeTaskStatus(status), "killed by signal 15 (SIGTERM)");
  EXPECT_TRUE(status.stop_requested);
  ASSERT_OK(runner->Stop("sleeper", seconds(30)));  // already over: nothing to do

  const std::string state_file = runner->StateFilePathForTest("sleeper");
  EXPECT_TRUE(std::filesystem::exists(state_file));
  ASSERT_OK(runner->Forget("sleeper"));
  EXPECT_THAT(runner->Poll(), IsEmpty());
  EXPECT_FALSE(std::filesystem::exists(state_file));
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(state_dir_)) {
    left.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(left, ElementsAre("lock"));
  StartOrFail(*runner, launch);  // the id is free again
  ASSERT_OK(runner->Stop("sleeper", Duration::zero()));
  EXPECT_EQ(DescribeTaskStatus(WaitForEnd(*runner, "sleeper")), "killed by signal 9 (SIGKILL)");
}

TEST_F(ProcessRunnerTest, OpenRefusesUnusableStateDirectories) {
  EXPECT_THAT(ProcessRunner::Open("", clock_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("state_dir")));
  const std::string file = dir_ + "/file";
  WriteFile(file, "");
  EXPECT_THAT(ProcessRunner::Open(file, clock_),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("is not a directory")));
  EXPECT_THAT(ProcessRunner::Open(dir_ + "/no/such/dir", clock_),
              StatusIs(StatusCode::kUnavailable, HasSubstr("cannot create state_dir")));

  std::unique_ptr<ProcessRunner> first = OpenRunner();
  ASSERT_NE(first, nullptr);
  EXPECT_THAT(
      ProcessRunner::Open(state_dir_, clock_),
      StatusIs(StatusCode::kFailedPrecondition, HasSubstr("is in use by another task runner")));
  first.reset();
  EXPECT_NE(OpenRunner(), nullptr);
}

// Sets a signal to "ignore" for the scope, as agents commonly do with SIGPIPE or SIGCHLD.
class IgnoreSignalInScope {
 public:
  explicit IgnoreSignalInScope(int signal_number)
      : signal_number_(signal_number), previous_(signal(signal_number, SIG_IGN)) {}
  ~IgnoreSignalInScope() { signal(signal_number_, previous_); }
  IgnoreSignalInScope(const IgnoreSignalInScope&) = delete;
  IgnoreSignalInScope& operator=(const IgnoreSignalInScope&) = delete;

 private:
  int signal_number_;
  sighandler_t previous_;
};

TEST_F(ProcessRunnerTest, SignalsTheHostIgnoresStillReachTheTask) {
  const IgnoreSignalInScope ignore_term(SIGTERM);
  // With SIGCHLD ignored the kernel reaps the shims itself; the runner must still see the end.
  const IgnoreSignalInScope ignore_child(SIGCHLD);
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  StartOrFail(*runner, Shell("plain", "exec sleep 30"));
  ASSERT_OK(runner->Stop("plain", seconds(30)));
  EXPECT_EQ(DescribeTaskStatus(WaitForEnd(*runner, "plain")), "killed by signal 15 (SIGTERM)");
  StartOrFail(*runner, Shell("exits", "exit 5"));
  EXPECT_EQ(DescribeTaskStatus(WaitForEnd(*runner, "exits")), "exited with code 5");
}

TEST_F(ProcessRunnerTest, TaskAndShimHoldNoDescriptorsOfTheRunner) {
  // A descriptor the hosting process forgot to mark close-on-exec, like a listening socket.
  const int leaked = open(dir_.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(leaked, 3);
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  const TaskLaunch launch = Shell("fds", "echo $$; exec sleep 30");
  StartOrFail(*runner, launch);
  ASSERT_TRUE(WaitForLog(launch.log_path, "\n"));
  const pid_t task = std::stoi(ReadFile(launch.log_path));
  const pid_t shim = StatusOf(*runner, "fds").process_group;
  close(leaked);
  // Right after an execve the kernel and the new program may still hold a descriptor for a
  // moment; what counts is what stays open.
  const std::set<std::string> stdio = {"0", "1", "2"};
  EXPECT_TRUE(WaitUntil([&] { return OpenDescriptors(shim) == stdio; }))
      << ::testing::PrintToString(OpenDescriptors(shim));
  EXPECT_TRUE(WaitUntil([&] {
    return ReadFile("/proc/" + std::to_string(task) + "/comm") == "sleep\n" &&
           OpenDescriptors(task) == stdio;
  })) << ::testing::PrintToString(OpenDescriptors(task));
  for (const int fd : {0, 1, 2}) {
    EXPECT_EQ(DescriptorTarget(shim, fd), "/dev/null") << fd;
  }
  EXPECT_EQ(DescriptorTarget(task, 0), "/dev/null");
  EXPECT_EQ(DescriptorTarget(task, 1), launch.log_path);
  EXPECT_EQ(DescriptorTarget(task, 2), launch.log_path);
  EXPECT_EQ(ReadFile("/proc/" + std::to_string(shim) + "/comm"), "gpufleet-shim\n");
  ASSERT_OK(runner->Stop("fds", Duration::zero()));
  WaitForEnd(*runner, "fds");
}

TEST_F(ProcessRunnerIntegrationTest, SigkillFollowsTheGraceWhenTheTaskIgnoresSigterm) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  // The shell handles SIGTERM and goes on; its background child ignores it altogether.
  const TaskLaunch launch =
      Shell("stubborn",
            "trap '' TERM; sleep 30 & echo \"child $!\"; trap 'echo got-term' TERM; echo ready; "
            "while :; do sleep 0.01; done");
  StartOrFail(*runner, launch);
  ASSERT_TRUE(WaitForLog(launch.log_path, "ready"));
  const std::string log = ReadFile(launch.log_path);
  const pid_t child = std::stoi(log.substr(log.find("child ") + 6));

  ASSERT_OK(runner->Stop("stubborn", seconds(10)));
  ASSERT_TRUE(WaitForLog(launch.log_path, "got-term"));
  clock_.Advance(seconds(9));
  TaskStatus status = StatusOf(*runner, "stubborn");
  EXPECT_EQ(DescribeTaskStatus(status), "running, stop requested");
  EXPECT_FALSE(ProcessGone(child));

  clock_.Advance(seconds(1));  // the grace is over: this Poll sends SIGKILL
  status = WaitForEnd(*runner, "stubborn");
  EXPECT_EQ(DescribeTaskStatus(status), "killed by signal 9 (SIGKILL)");
  EXPECT_EQ(status.end_time, clock_.Now());
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(child); })) << "child " << child;
}

TEST_F(ProcessRunnerIntegrationTest, TasksFenceThemselvesWhenTheLeaseIsNotRenewed) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  ASSERT_OK(runner->RenewLease(seconds(60), seconds(1)));
  // One task writes its checkpoint at SIGTERM and exits; the other ignores SIGTERM.
  const TaskLaunch polite = Shell(
      "polite", "trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.01; done");
  const TaskLaunch stubborn =
      Shell("stubborn", "trap 'echo got-term' TERM; echo ready; while :; do sleep 0.01; done");
  StartOrFail(*runner, polite);
  StartOrFail(*runner, stubborn);
  ASSERT_TRUE(WaitForLog(polite.log_path, "ready"));
  ASSERT_TRUE(WaitForLog(stubborn.log_path, "ready"));
  const pid_t polite_shim = StatusOf(*runner, "polite").process_group;
  const pid_t stubborn_shim = StatusOf(*runner, "stubborn").process_group;

  // The last renewal, then the agent dies: nothing polls or stops the tasks any more.
  ASSERT_OK(runner->RenewLease(std::chrono::milliseconds(200), std::chrono::milliseconds(700)));
  runner.reset();
  EXPECT_TRUE(WaitForLog(stubborn.log_path, "got-term"));
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(polite_shim) && ProcessGone(stubborn_shim); }))
      << "tasks outlived their lease";

  std::unique_ptr<ProcessRunner> next = OpenRunner();
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(DescribeTaskStatus(StatusOf(*next, "polite")), "exited with code 3");
  EXPECT_EQ(DescribeTaskStatus(StatusOf(*next, "stubborn")), "killed by signal 9 (SIGKILL)");
  EXPECT_THAT(ReadFile(polite.log_path), HasSubstr("got-term"));
}

TEST_F(ProcessRunnerIntegrationTest, ATaskAnOlderRunnerStartedDoesNotEnforceTheLease) {
  std::unique_ptr<ProcessRunner> first = OpenRunner();
  ASSERT_NE(first, nullptr);
  StartOrFail(*first, Shell("old", "echo ready; exec sleep 30"));
  EXPECT_TRUE(StatusOf(*first, "old").enforces_lease);
  const std::string path = first->StateFilePathForTest("old");
  first.reset();
  // An older runner's state file has no enforces_lease line (its shim never reads the lease) and
  // no takes_notices line (its shim does not ignore a notice's signal).
  std::string record = ReadFile(path);
  for (const std::string newer : {"enforces_lease=1\n", "takes_notices=1\n"}) {
    const size_t line = record.find(newer);
    ASSERT_NE(line, std::string::npos) << record;
    record.erase(line, newer.size());
  }
  WriteFile(path, record);

  std::unique_ptr<ProcessRunner> second = OpenRunner();
  ASSERT_NE(second, nullptr);
  const TaskStatus adopted = StatusOf(*second, "old");
  EXPECT_EQ(adopted.state, TaskState::kRunning);
  EXPECT_FALSE(adopted.enforces_lease);
  EXPECT_THAT(second->SendNotice("old", "SIGUSR1"),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("older runner")));
  EXPECT_EQ(StatusOf(*second, "old").state, TaskState::kRunning);
  ASSERT_OK(second->Stop("old", Duration::zero()));
  WaitForEnd(*second, "old");
}

TEST_F(ProcessRunnerIntegrationTest, RenewedLeaseKeepsTasksRunning) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  ASSERT_OK(runner->RenewLease(std::chrono::milliseconds(400), Duration::zero()));
  const TaskLaunch launch = Shell("renewed", "echo ready; exec sleep 30");
  StartOrFail(*runner, launch);
  ASSERT_TRUE(WaitForLog(launch.log_path, "ready"));
  // Renewed every 100 ms for 2.5 s: six times the lease, and past two of the shims' checks.
  for (int i = 0; i < 25; ++i) {
    ASSERT_OK(runner->RenewLease(std::chrono::milliseconds(400), Duration::zero()));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(StatusOf(*runner, "renewed").state, TaskState::kRunning);
  EXPECT_THAT(runner->RenewLease(seconds(-1), Duration::zero()),
              StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK(runner->Stop("renewed", Duration::zero()));
  WaitForEnd(*runner, "renewed");
}

TEST_F(ProcessRunnerIntegrationTest, StopReachesTheTasksChildren) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  const TaskLaunch launch = Shell("tree", "sleep 30 & echo \"child $!\"; wait");
  StartOrFail(*runner, launch);
  ASSERT_TRUE(WaitForLog(launch.log_path, "child "));
  const std::string log = ReadFile(launch.log_path);
  const pid_t child = std::stoi(log.substr(log.find("child ") + 6));
  EXPECT_FALSE(ProcessGone(child));

  ASSERT_OK(runner->Stop("tree", seconds(30)));
  EXPECT_EQ(DescribeTaskStatus(WaitForEnd(*runner, "tree")), "killed by signal 15 (SIGTERM)");
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(child); })) << "child " << child;
}

TEST_F(ProcessRunnerIntegrationTest, ProcessesLeftBehindEndWithTheTask) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  const TaskLaunch launch = Shell("leaky", "sleep 30 & echo \"child $!\"; exit 4");
  StartOrFail(*runner, launch);
  EXPECT_EQ(DescribeTaskStatus(WaitForEnd(*runner, "leaky")), "exited with code 4");
  const std::string log = ReadFile(launch.log_path);
  ASSERT_THAT(log, StartsWith("child "));
  const pid_t child = std::stoi(log.substr(6));
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(child); })) << "child " << child;
}

TEST_F(ProcessRunnerIntegrationTest, NewRunnerAdoptsARunningTaskAndCanStopIt) {
  std::unique_ptr<ProcessRunner> first = OpenRunner();
  ASSERT_NE(first, nullptr);
  TaskLaunch launch = Shell("train/group-1", "echo ready; exec sleep 30");
  launch.gpu_uuids = {"GPU-a", "GPU-b"};
  StartOrFail(*first, launch);
  ASSERT_TRUE(WaitForLog(launch.log_path, "ready"));
  const TaskStatus before = StatusOf(*first, "train/group-1");
  first.reset();  // the agent restarts
  clock_.Advance(seconds(60));

  std::unique_ptr<ProcessRunner> second = OpenRunner();
  ASSERT_NE(second, nullptr);
  const TaskStatus adopted = StatusOf(*second, "train/group-1");
  EXPECT_EQ(adopted.state, TaskState::kRunning);
  EXPECT_EQ(adopted.process_group, before.process_group);
  EXPECT_EQ(adopted.start_time, before.start_time);
  EXPECT_EQ(adopted.gpu_uuids, launch.gpu_uuids);

  ASSERT_OK(second->Stop("train/group-1", seconds(30)));
  const TaskStatus ended = WaitForEnd(*second, "train/group-1");
  EXPECT_EQ(DescribeTaskStatus(ended), "killed by signal 15 (SIGTERM)");
  EXPECT_EQ(ended.end_time, clock_.Now());
  ASSERT_OK(second->Forget("train/group-1"));
  second.reset();
  std::unique_ptr<ProcessRunner> third = OpenRunner();
  ASSERT_NE(third, nullptr);
  EXPECT_THAT(third->Poll(), IsEmpty());
}

TEST_F(ProcessRunnerIntegrationTest, NewRunnerReportsAnExitThatHappenedWhileNoneWatched) {
  std::unique_ptr<ProcessRunner> first = OpenRunner();
  ASSERT_NE(first, nullptr);
  const TaskLaunch launch = Shell("batch", "while [ ! -e go ]; do sleep 0.01; done; exit 7");
  StartOrFail(*first, launch);
  const pid_t shim = StatusOf(*first, "batch").process_group;
  first.reset();
  WriteFile(dir_ + "/go", "");
  ASSERT_TRUE(WaitUntil([&] { return ProcessGone(shim); }));

  std::unique_ptr<ProcessRunner> second = OpenRunner();
  ASSERT_NE(second, nullptr);
  const TaskStatus status = StatusOf(*second, "batch");
  EXPECT_EQ(DescribeTaskStatus(status), "exited with code 7");
  EXPECT_EQ(status.end_time, clock_.Now());
}

TEST_F(ProcessRunnerIntegrationTest, TaskGoneWithoutARecordIsLost) {
  std::unique_ptr<ProcessRunner> first = OpenRunner();
  ASSERT_NE(first, nullptr);
  StartOrFail(*first, Shell("victim", "exec sleep 30"));
  const pid_t shim = StatusOf(*first, "victim").process_group;
  first.reset();
  ASSERT_EQ(kill(-shim, SIGKILL), 0);  // e.g. the OOM killer took the shim and the task
  ASSERT_TRUE(WaitUntil([&] { return ProcessGone(shim); }));

  std::unique_ptr<ProcessRunner> second = OpenRunner();
  ASSERT_NE(second, nullptr);
  const TaskStatus status = StatusOf(*second, "victim");
  EXPECT_EQ(status.state, TaskState::kLost);
  EXPECT_EQ(status.reason,
            "its process (pid " + std::to_string(shim) + ") is gone and left no exit status");
}

TEST_F(ProcessRunnerIntegrationTest, TaskDoesNotOutliveAShimThatDiedEarly) {
  std::unique_ptr<ProcessRunner> runner = OpenRunner();
  ASSERT_NE(runner, nullptr);
  const TaskLaunch launch = Shell("orphan", "echo $$; exec sleep 30");
  StartOrFail(*runner, launch);
  ASSERT_TRUE(WaitForLog(launch.log_path, "\n"));
  const pid_t task = std::stoi(ReadFile(launch.log_path));
  const pid_t shim = StatusOf(*runner, "orphan").process_group;
  ASSERT_EQ(kill(shim, SIGKILL), 0);  // the shim alone, e.g. by the OOM killer

  const TaskStatus status = WaitForEnd(*runner, "orphan");
  EXPECT_EQ(status.state, TaskState::kLost);
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(task); })) << "task " << task;
}

// The state file names a pid that now belongs to another process (here: the same pid with a
// different start time). The new runner must neither adopt nor signal it.
TEST_F(ProcessRunnerIntegrationTest, ReusedPidIsNeverAdoptedOrSignalled) {
  std::unique_ptr<ProcessRunner> first = OpenRunner();
  ASSERT_NE(first, nullptr);
  const TaskLaunch launch = Shell("old", "echo ready; exec sleep 30");
  StartOrFail(*first, launch);
  ASSERT_TRUE(WaitForLog(launch.log_path, "ready"));
  const pid_t shim = StatusOf(*first, "old").process_group;
  const std::string state_file = first->StateFilePathForTest("old");
  first.reset();

  std::string state = ReadFile(state_file);
  const size_t at = state.find("shim_start_ticks=") + std::string("shim_start_ticks=").size();
  const size_t end = state.find('\n', at);
  const uint64_t ticks = std::stoull(state.substr(at, end - at));
  state.replace(at, end - at, std::to_string(ticks + 1));
  WriteFile(state_file, state);

  std::unique_ptr<ProcessRunner> second = OpenRunner();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(StatusOf(*second, "old").state, TaskState::kLost);
  ASSERT_OK(second->Stop("old", Duration::zero()));
  EXPECT_FALSE(ProcessGone(shim)) << "the runner signalled a process that is not its own";
}

TEST_F(ProcessRunnerIntegrationTest, StateFromAnotherBootOrUnreadableIsLost) {
  std::unique_ptr<ProcessRunner> first = OpenRunner();
  ASSERT_NE(first, nullptr);
  StartOrFail(*first, Shell("before-reboot", "exec sleep 30"));
  const pid_t shim = StatusOf(*first, "before-reboot").process_group;
  const std::string state_file = first->StateFilePathForTest("before-reboot");
  first.reset();
  std::string state = ReadFile(state_file);
  const size_t at = state.find("boot_id=") + std::string("boot_id=").size();
  state.replace(at, state.find('\n', at) - at, "another-boot");
  WriteFile(state_file, state);
  WriteFile(state_dir_ + "/garbled%0.task", "not a state file\n");

  std::unique_ptr<ProcessRunner> second = OpenRunner();
  ASSERT_NE(second, nullptr);
  const std::vector<TaskStatus> statuses = second->Poll();
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_EQ(statuses[0].task_id, "before-reboot");
  EXPECT_EQ(DescribeTaskStatus(statuses[0]), "lost: the node restarted since the task started");
  EXPECT_EQ(statuses[1].task_id, "garbled/0");
  EXPECT_EQ(statuses[1].state, TaskState::kLost);
  EXPECT_THAT(statuses[1].reason, HasSubstr("garbled%0.task' is unreadable: the first line is "
                                            "'not a state file'"));
  ASSERT_OK(second->Stop("before-reboot", Duration::zero()));
  EXPECT_FALSE(ProcessGone(shim)) << "a pid from another boot was signalled";
  ASSERT_OK(second->Forget("garbled/0"));
  EXPECT_FALSE(std::filesystem::exists(state_dir_ + "/garbled%0.task"));
}

}  // namespace
}  // namespace gpufleet::runner

namespace gpufleet::runner {
namespace {

// Containment with the real kernel: needs root (setuid, cgroup directories). Skipped otherwise;
// CI runs as root.
class ProcessRunnerIntegrationContainmentTest : public ProcessRunnerTestBase {
 protected:
  void TearDown() override {
    ProcessRunnerTestBase::TearDown();
    for (const pid_t pid : strays_) {
      kill(pid, SIGKILL);
    }
    // Detect creates the parent wherever it finds a hierarchy.
    for (const char* hierarchy : {"memory/", "cpu/", "pids/", "unified/", ""}) {
      rmdir(fmt::format("/sys/fs/cgroup/{}{}", hierarchy, CgroupParent()).c_str());
    }
  }

  std::unique_ptr<ProcessRunner> OpenContained(ProcessRunnerOptions options) {
    Result<std::unique_ptr<ProcessRunner>> runner =
        ProcessRunner::Open(state_dir_, clock_, std::move(options));
    EXPECT_OK(runner);
    return runner.ok() ? std::move(runner).value() : nullptr;
  }

  std::string CgroupParent() const { return "gpufleet-test-" + std::to_string(getpid()); }

  // A task whose child leaves the process group (setsid) and records its pid, then ends.
  TaskLaunch Daemonizing(const std::string& task_id) const {
    TaskLaunch launch = Shell(task_id,
                              "cat /proc/self/cgroup > cgroup.txt; setsid sleep 300 & "
                              "echo $! > daemon.pid; sleep 0.3");
    launch.cpu_milli = 1500;
    launch.memory_mib = 64;
    return launch;
  }

  pid_t DaemonPid() {
    pid_t pid = 0;
    EXPECT_TRUE(WaitUntil([&] {
      std::istringstream(ReadFile(dir_ + "/daemon.pid")) >> pid;
      return pid > 0;
    }));
    if (pid > 0) {
      strays_.insert(pid);
    }
    return pid;
  }

  // Runs Daemonizing under `cgroups` and checks the physical outcome: the task's processes were
  // in its cgroup with its limits, and the daemonized child died with the task.
  void ExpectDaemonDiesWithTask(TaskCgroups cgroups, const std::string& limit_file,
                                const std::string& limit_value) {
    std::unique_ptr<ProcessRunner> runner = OpenContained({.cgroups = cgroups});
    ASSERT_NE(runner, nullptr);
    StartOrFail(*runner, Daemonizing("daemon/0"));
    const pid_t daemon = DaemonPid();
    ASSERT_GT(daemon, 0);
    EXPECT_THAT(cgroups.Members("daemon%0.task"), ::testing::Contains(daemon));
    if (!limit_file.empty()) {
      EXPECT_EQ(ReadFile(limit_file), limit_value);
    }
    EXPECT_THAT(ReadFile(dir_ + "/cgroup.txt"), HasSubstr(CgroupParent() + "/daemon%0.task"));
    const TaskStatus status = WaitForEnd(*runner, "daemon/0");
    EXPECT_EQ(status.state, TaskState::kExited) << DescribeTaskStatus(status);
    EXPECT_TRUE(WaitUntil([&] { return ProcessGone(daemon); }))
        << "the daemonized child " << daemon << " outlived its task";
    ASSERT_OK(runner->Forget("daemon/0"));
    EXPECT_TRUE(cgroups.Members("daemon%0.task").empty());
  }

  std::set<pid_t> strays_;
};

TEST_F(ProcessRunnerIntegrationContainmentTest, WithoutCgroupsADaemonizedChildEscapes) {
  // The control: what the cgroup tests below prevent.
  std::unique_ptr<ProcessRunner> runner = OpenContained({});
  ASSERT_NE(runner, nullptr);
  StartOrFail(*runner, Daemonizing("daemon/0"));
  const pid_t daemon = DaemonPid();
  ASSERT_GT(daemon, 0);
  EXPECT_EQ(WaitForEnd(*runner, "daemon/0").state, TaskState::kExited);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(ProcessGone(daemon));
}

TEST_F(ProcessRunnerIntegrationContainmentTest, CgroupV1EndsEveryProcessOfTheTask) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "cgroups need root";
  }
  Result<TaskCgroups> cgroups = TaskCgroups::Detect("/sys/fs/cgroup", CgroupParent());
  if (!cgroups.ok() || cgroups->version() != CgroupVersion::kV1) {
    GTEST_SKIP() << "no cgroup v1 hierarchy here";
  }
  ExpectDaemonDiesWithTask(
      *cgroups,
      fmt::format("/sys/fs/cgroup/memory/{}/daemon%0.task/memory.limit_in_bytes", CgroupParent()),
      "67108864\n");
}

TEST_F(ProcessRunnerIntegrationContainmentTest, CgroupV2EndsEveryProcessOfTheTask) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "cgroups need root";
  }
  // A v2-only host mounts it at /sys/fs/cgroup; a hybrid one (these machines) at .../unified,
  // where no controller is enabled: membership and cgroup.kill work, limits do not.
  for (const std::string root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    Result<TaskCgroups> cgroups = TaskCgroups::Detect(root, CgroupParent());
    if (cgroups.ok() && cgroups->version() == CgroupVersion::kV2) {
      const std::string limit_file =
          cgroups->enforces_limits()
              ? fmt::format("{}/{}/daemon%0.task/memory.max", root, CgroupParent())
              : "";
      ExpectDaemonDiesWithTask(*cgroups, limit_file, "67108864\n");
      return;
    }
  }
  GTEST_SKIP() << "no cgroup v2 mount here";
}

TEST_F(ProcessRunnerIntegrationContainmentTest, RunsAsTheRunAsUserWithAPrivateLog) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "changing user needs root";
  }
  Result<RunAs> nobody = LookUpUser("nobody");
  ASSERT_OK(nobody);
  std::unique_ptr<ProcessRunner> runner = OpenContained({.run_as = *nobody});
  ASSERT_NE(runner, nullptr);
  TaskLaunch launch = Shell("who/0", "echo \"uid=$(id -u) groups=$(id -G) user=$USER home=$HOME\"");
  launch.working_dir = "/";
  StartOrFail(*runner, launch);
  EXPECT_EQ(WaitForEnd(*runner, "who/0").state, TaskState::kExited);
  EXPECT_EQ(ReadFile(launch.log_path),
            fmt::format("uid={} groups={} user=nobody home={}\n", nobody->uid,
                        fmt::join(nobody->groups, " "), nobody->home));
  struct stat info = {};
  ASSERT_EQ(stat(launch.log_path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u) << "logs are not world-readable";

  // The ids change before the working directory is entered: root's private directory is closed
  // to the task.
  TaskLaunch private_dir = Shell("who/1", "true");
  ASSERT_EQ(chmod(dir_.c_str(), 0700), 0);
  StartOrFail(*runner, private_dir);
  const TaskStatus refused = WaitForEnd(*runner, "who/1");
  EXPECT_EQ(refused.state, TaskState::kFailedToStart);
  EXPECT_THAT(refused.reason, HasSubstr("cannot enter working directory"));
  EXPECT_THAT(LookUpUser("no-such-user-gpufleet").status(),
              StatusIs(StatusCode::kNotFound, HasSubstr("no user 'no-such-user-gpufleet'")));
}

// The task sandbox with real tasks of two runs, as two teams' jobs on one node. Each test process
// takes uids of its own (by its pid), so tests running side by side never share one.
class ProcessRunnerIntegrationSandboxTest : public ProcessRunnerTestBase {
 protected:
  void SetUp() override {
    ProcessRunnerTestBase::SetUp();
    if (geteuid() != 0) {
      GTEST_SKIP() << "running tasks as other users needs root";
    }
    // Tasks reach their run's directories through the test's own (mkdtemp makes it 0700).
    ASSERT_EQ(chmod(dir_.c_str(), 0711), 0);
    const uid_t first = 2000100000 + static_cast<uid_t>(getpid() % 1000000) * 4;
    sandbox_.uids = {first, first + 3};
    sandbox_.runs_dir = dir_ + "/runs";
  }

  void TearDown() override {
    ProcessRunnerTestBase::TearDown();
    for (uid_t uid = sandbox_.uids.first; uid != 0 && uid <= sandbox_.uids.last; ++uid) {
      KillProcessesOfUid(uid);
    }
  }

  std::unique_ptr<ProcessRunner> OpenSandboxed(TaskUidRange uids) {
    TaskSandboxOptions sandbox = sandbox_;
    sandbox.uids = uids;
    Result<std::unique_ptr<ProcessRunner>> runner =
        ProcessRunner::Open(state_dir_, clock_, {.sandbox = sandbox});
    EXPECT_OK(runner);
    return runner.ok() ? std::move(runner).value() : nullptr;
  }

  TaskLaunch InRun(const std::string& task_id, const std::string& run_id,
                   const std::string& script) const {
    TaskLaunch launch = Shell(task_id, script);
    launch.run_id = run_id;
    launch.working_dir.clear();  // the run's own
    return launch;
  }

  // "KEY=VALUE" words of the task's log line that starts with `prefix`.
  std::map<std::string, std::string> LogValues(const std::string& log_path) {
    std::map<std::string, std::string> values;
    std::istringstream words(ReadFile(log_path));
    for (std::string word; words >> word;) {
      if (const size_t equals = word.find('='); equals != std::string::npos) {
        values[word.substr(0, equals)] = word.substr(equals + 1);
      }
    }
    return values;
  }

  TaskSandboxOptions sandbox_;
};

// What team A's task tries against team B's: every attempt writes its outcome to A's log.
constexpr char kProbeScript[] = R"sh(
try() {
  if "$@" >/dev/null 2>"$TMPDIR/err"; then echo "$1=done"; else echo "$1=$(tr ' ' _ <"$TMPDIR/err")"; fi
}
try cat "/proc/$OTHER_PID/environ"
try ls "$OTHER_TMP"
try cat "$OTHER_TMP/secret.txt"
try cat "$OTHER_WORK/secret.txt"
try cat "$OTHER_LOG"
try kill -0 "$OTHER_PID"
try kill -STOP "$OTHER_PID"
echo "uid=$(id -u) gid=$(id -g) groups=$(id -G | tr ' ' ,) home=$HOME user=$USER tmp=$TMPDIR pwd=$(pwd)"
)sh";

// Issue 37: a sandboxed task writes its own checkpoint file, owned by its run's user; a task of
// another run can write neither that file nor a new one beside it.
TEST_F(ProcessRunnerIntegrationSandboxTest, ATaskWritesItsOwnCheckpointFileOnly) {
  std::unique_ptr<ProcessRunner> runner = OpenSandboxed(sandbox_.uids);
  ASSERT_NE(runner, nullptr);
  const std::string checkpoints = dir_ + "/checkpoints";
  ASSERT_EQ(mkdir(checkpoints.c_str(), 0711), 0);
  TaskLaunch saver = InRun("team-a/train/main-0/1", "team-a/train/1",
                           "echo 1765119600 >> \"$GPUFLEET_CHECKPOINT_FILE\"");
  saver.checkpoint_path = checkpoints + "/saver.checkpoint";
  StartOrFail(*runner, saver);
  EXPECT_EQ(WaitForEnd(*runner, saver.task_id).exit_code, 0);
  EXPECT_EQ(ReadFile(saver.checkpoint_path), "1765119600\n");
  struct stat info = {};
  ASSERT_EQ(stat(saver.checkpoint_path.c_str(), &info), 0);
  EXPECT_GE(info.st_uid, sandbox_.uids.first);
  EXPECT_LE(info.st_uid, sandbox_.uids.last);
  EXPECT_EQ(info.st_mode & 07777, 0600U);

  TaskLaunch other = InRun("team-b/train/main-0/1", "team-b/train/1",
                           fmt::format("echo 1 >> {0}/saver.checkpoint || echo file=refused; "
                                       "echo 1 > {0}/forged.checkpoint || echo dir=refused",
                                       checkpoints));
  other.checkpoint_path = checkpoints + "/other.checkpoint";
  StartOrFail(*runner, other);
  WaitForEnd(*runner, other.task_id);
  EXPECT_THAT(ReadFile(other.log_path), HasSubstr("file=refused"));
  EXPECT_THAT(ReadFile(other.log_path), HasSubstr("dir=refused"));
  EXPECT_EQ(ReadFile(saver.checkpoint_path), "1765119600\n");
}

TEST_F(ProcessRunnerIntegrationSandboxTest, TasksOfTwoRunsCannotReachEachOther) {
  std::unique_ptr<ProcessRunner> runner = OpenSandboxed(sandbox_.uids);
  ASSERT_NE(runner, nullptr);
  // Team B's task: a secret in its environment, its TMPDIR and its working directory.
  TaskLaunch secret = InRun("team-b/train/main-0/1", "team-b/train/1",
                            "echo secret > \"$TMPDIR/secret.txt\"; echo secret > secret.txt; "
                            "echo \"pid=$$ tmp=$TMPDIR work=$(pwd)\"; exec sleep 300");
  secret.env["WANDB_API_KEY"] = "team-b-secret";
  StartOrFail(*runner, secret);
  ASSERT_TRUE(WaitForLog(secret.log_path, "work="));
  std::map<std::string, std::string> b = LogValues(secret.log_path);
  const pid_t b_pid = std::stoi(b["pid"]);
  EXPECT_EQ(b["tmp"], dir_ + "/runs/team-b%train%1.run/tmp");
  EXPECT_EQ(b["work"], dir_ + "/runs/team-b%train%1.run/work");

  // Team A's task tries, and so does a second task of B's own run (the control: the same
  // commands work within a run).
  TaskLaunch probe = InRun("team-a/eval/main-0/1", "team-a/eval/1", kProbeScript);
  TaskLaunch sibling = InRun("team-b/train/main-1/1", "team-b/train/1", kProbeScript);
  for (TaskLaunch* launch : {&probe, &sibling}) {
    launch->env = {{"OTHER_PID", std::to_string(b_pid)},
                   {"OTHER_TMP", b["tmp"]},
                   {"OTHER_WORK", b["work"]},
                   {"OTHER_LOG", secret.log_path}};
  }
  sibling.argv[2] += "kill -CONT $OTHER_PID";
  StartOrFail(*runner, probe);
  EXPECT_EQ(WaitForEnd(*runner, probe.task_id).state, TaskState::kExited);
  EXPECT_NE(ProcStatFields(b_pid).at(0), "T") << "team A's task stopped team B's";
  StartOrFail(*runner, sibling);
  EXPECT_EQ(WaitForEnd(*runner, sibling.task_id).state, TaskState::kExited);

  const std::map<std::string, std::string> a = LogValues(probe.log_path);
  SCOPED_TRACE(ReadFile(probe.log_path));
  SCOPED_TRACE(ReadFile(sibling.log_path));
  EXPECT_THAT(a.at("cat"), HasSubstr("Permission_denied"));  // the last cat: the log
  EXPECT_THAT(a.at("ls"), HasSubstr("Permission_denied"));
  EXPECT_THAT(a.at("kill"), HasSubstr("Operation_not_permitted"));
  EXPECT_THAT(ReadFile(probe.log_path),
              AllOf(HasSubstr(fmt::format("cat:_/proc/{}/environ:_Permission_denied", b_pid)),
                    HasSubstr(fmt::format("cat:_{}/secret.txt:_Permission_denied", b["tmp"])),
                    HasSubstr(fmt::format("cat:_{}/secret.txt:_Permission_denied", b["work"])),
                    HasSubstr(fmt::format("cat:_{}:_Permission_denied", secret.log_path)),
                    Not(HasSubstr("=done"))));

  // Team B's own second task reads all but the log (the agent's), and shares B's user.
  const std::map<std::string, std::string> own = LogValues(sibling.log_path);
  const std::string own_log = ReadFile(sibling.log_path);
  EXPECT_EQ(own_log.substr(0, own_log.find("cat=cat:")), "cat=done\nls=done\ncat=done\ncat=done\n")
      << own_log;
  EXPECT_THAT(own_log, HasSubstr("kill=done\nkill=done\n"));
  EXPECT_THAT(own_log, HasSubstr(fmt::format("cat:_{}:_Permission_denied", secret.log_path)));
  EXPECT_EQ(own.at("tmp"), b["tmp"]);
  EXPECT_EQ(own.at("pwd"), b["work"]);
  EXPECT_EQ(own.at("home"), b["work"]);

  // Two users of the range, one per run, with no other group.
  const uid_t a_uid = std::stoul(a.at("uid"));
  const uid_t b_uid = std::stoul(own.at("uid"));
  EXPECT_NE(a_uid, b_uid);
  for (const uid_t uid : {a_uid, b_uid}) {
    EXPECT_GE(uid, sandbox_.uids.first);
    EXPECT_LE(uid, sandbox_.uids.last);
  }
  EXPECT_EQ(a.at("gid"), a.at("uid"));
  EXPECT_EQ(a.at("groups"), a.at("uid"));
  EXPECT_EQ(a.at("user"), "gpufleet-" + a.at("uid"));
  EXPECT_EQ(a.at("pwd"), dir_ + "/runs/team-a%eval%1.run/work");
  struct stat info = {};
  ASSERT_EQ(stat(b["tmp"].c_str(), &info), 0);
  EXPECT_EQ(info.st_uid, b_uid);
  EXPECT_EQ(info.st_mode & 07777, 0700u);
  ASSERT_EQ(stat(secret.log_path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0600u);
  EXPECT_EQ(info.st_uid, 0u) << "the log stays the agent's";

  // A run's directories go with its last task.
  ASSERT_OK(runner->Forget(probe.task_id));
  EXPECT_TRUE(WaitUntil([&] {
    runner->Poll();
    return !std::filesystem::exists(dir_ + "/runs/team-a%eval%1.run");
  }));
  ASSERT_OK(runner->Stop(secret.task_id, Duration::zero()));
  WaitForEnd(*runner, secret.task_id);
  ASSERT_OK(runner->Forget(secret.task_id));
  EXPECT_TRUE(std::filesystem::exists(b["work"])) << "the run still has a task";
  ASSERT_OK(runner->Forget(sibling.task_id));
  EXPECT_TRUE(WaitUntil([&] {
    runner->Poll();
    return !std::filesystem::exists(dir_ + "/runs/team-b%train%1.run");
  }));
}

TEST_F(ProcessRunnerIntegrationSandboxTest, AUidServesOneRunAtATimeAcrossRestarts) {
  const TaskUidRange one{sandbox_.uids.first, sandbox_.uids.first};
  std::unique_ptr<ProcessRunner> runner = OpenSandboxed(one);
  ASSERT_NE(runner, nullptr);
  // Run 1 leaves a child behind that escaped its process group (no cgroups here to catch it).
  TaskLaunch first = InRun("r1/main-0/1", "r1/1",
                           "setsid sleep 300 & echo \"left=$! uid=$(id -u)\"; exec sleep 300");
  StartOrFail(*runner, first);
  ASSERT_TRUE(WaitForLog(first.log_path, "uid="));
  const std::map<std::string, std::string> values = LogValues(first.log_path);
  const pid_t left = std::stoi(values.at("left"));
  EXPECT_EQ(values.at("uid"), std::to_string(one.first));
  TaskLaunch other = InRun("r2/main-0/1", "r2/1", "echo \"uid=$(id -u)\"");
  EXPECT_THAT(runner->Start(other),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("--task-uid-range " + FormatTaskUidRange(one))));

  // A new runner adopts run 1 with its uid: a second task of run 1 gets it, run 2 still waits.
  runner.reset();
  // A run directory no task names any more (the agent died before removing it) goes.
  // A run directory no task names any more (the agent died before removing it) goes, but not
  // before its uid's processes, which belong to a live run now, are gone.
  ASSERT_OK(CreateRunDirectories(sandbox_.runs_dir, "stray%1.run", one.first, one.first));
  runner = OpenSandboxed(one);
  ASSERT_NE(runner, nullptr);
  EXPECT_TRUE(std::filesystem::exists(sandbox_.runs_dir + "/stray%1.run"));
  EXPECT_EQ(StatusOf(*runner, first.task_id).state, TaskState::kRunning);
  TaskLaunch second = InRun("r1/main-1/1", "r1/1", "echo \"uid=$(id -u)\"");
  StartOrFail(*runner, second);
  EXPECT_EQ(WaitForEnd(*runner, second.task_id).state, TaskState::kExited);
  EXPECT_EQ(ReadFile(second.log_path), fmt::format("uid={}\n", one.first));
  EXPECT_THAT(runner->Start(other), StatusIs(StatusCode::kResourceExhausted));

  // Run 1 ends; its uid is free once nothing of it is left, the escaped child included.
  ASSERT_OK(runner->Stop(first.task_id, Duration::zero()));
  WaitForEnd(*runner, first.task_id);
  ASSERT_OK(runner->Forget(first.task_id));
  EXPECT_THAT(runner->Start(other), StatusIs(StatusCode::kResourceExhausted))
      << "run 1 still has a task";
  ASSERT_OK(runner->Forget(second.task_id));
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(left); })) << "run 1's escaped child lives on";
  Status started;
  EXPECT_TRUE(WaitUntil([&] {
    runner->Poll();
    started = runner->Start(other);
    return started.code() != StatusCode::kResourceExhausted;
  }));
  ASSERT_OK(started);
  EXPECT_EQ(WaitForEnd(*runner, other.task_id).state, TaskState::kExited);
  EXPECT_EQ(ReadFile(other.log_path), fmt::format("uid={}\n", one.first));
  EXPECT_FALSE(std::filesystem::exists(sandbox_.runs_dir + "/r1%1.run"));
  EXPECT_FALSE(std::filesystem::exists(sandbox_.runs_dir + "/stray%1.run"));
}

TEST_F(ProcessRunnerIntegrationSandboxTest, TasksGetTheConfiguredGroupsAndNoOther) {
  sandbox_.groups = {4242};  // e.g. the group of /dev/nvidia* where the driver restricts them
  std::unique_ptr<ProcessRunner> runner = OpenSandboxed(sandbox_.uids);
  ASSERT_NE(runner, nullptr);
  TaskLaunch launch = InRun("groups/main-0/1", "groups/1", "echo \"$(id -u) $(id -G)\"");
  StartOrFail(*runner, launch);
  EXPECT_EQ(WaitForEnd(*runner, launch.task_id).state, TaskState::kExited);
  std::istringstream words(ReadFile(launch.log_path));
  uid_t uid = 0;
  std::string rest;
  words >> uid;
  std::getline(words, rest);
  EXPECT_EQ(rest, fmt::format(" {} 4242", uid));
}

TEST_F(ProcessRunnerIntegrationSandboxTest, OpenRefusesASandboxItCannotKeep) {
  Result<RunAs> nobody = LookUpUser("nobody");
  ASSERT_OK(nobody);
  EXPECT_THAT(ProcessRunner::Open(state_dir_, clock_, {.run_as = *nobody, .sandbox = sandbox_}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("exclude each other")));
  TaskSandboxOptions taken = sandbox_;
  taken.uids = {nobody->uid, nobody->uid};
  EXPECT_THAT(ProcessRunner::Open(state_dir_, clock_, {.sandbox = taken}),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr(fmt::format("--task-uid-range {0}-{0}: user '", nobody->uid))));
}

}  // namespace
}  // namespace gpufleet::runner
