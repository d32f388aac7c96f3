// SPDX-License-Identifier: Apache-2.0
// What the process runner costs the agent: (a) a task from Start until a Poll sees its exit
// (fork of the shim, fork and execve of /bin/true, the exit record), (b) one Poll over N running
// tasks, which the agent does at every heartbeat.
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include <benchmark/benchmark.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/runner/process_runner.h"

namespace gpufleet::runner {
namespace {

// A state directory and a log directory under the temp dir, removed at the end.
class Scratch {
 public:
  Scratch() {
    std::string pattern = std::filesystem::temp_directory_path().string() + "/runner_bench_XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) {
      dir_ = pattern;
    }
  }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

TaskLaunch Launch(const Scratch& scratch, const std::string& task_id,
                  std::vector<std::string> argv) {
  TaskLaunch launch;
  launch.task_id = task_id;
  launch.argv = std::move(argv);
  launch.gpu_uuids = {"GPU-0"};
  launch.log_path = scratch.dir() + "/" + task_id + ".log";
  return launch;
}

TaskStatus PollUntilFinal(ProcessRunner& runner, const std::string& task_id) {
  while (true) {
    for (const TaskStatus& status : runner.Poll()) {
      if (status.task_id == task_id && IsFinal(status.state)) {
        return status;
      }
    }
  }
}

void BM_StartUntilExitSeen(benchmark::State& state) {
  Scratch scratch;
  SystemClock clock;
  Result<std::unique_ptr<ProcessRunner>> runner =
      ProcessRunner::Open(scratch.dir() + "/state", clock);
  if (!runner.ok()) {
    state.SkipWithError(runner.status().ToString().c_str());
    return;
  }
  const TaskLaunch launch = Launch(scratch, "true", {"/bin/true"});
  for (auto _ : state) {
    if (!(*runner)->Start(launch).ok()) {
      state.SkipWithError("start failed");
      return;
    }
    benchmark::DoNotOptimize(PollUntilFinal(**runner, "true"));
    if (!(*runner)->Forget("true").ok()) {
      state.SkipWithError("forget failed");
      return;
    }
  }
}
BENCHMARK(BM_StartUntilExitSeen)->Unit(benchmark::kMillisecond);

void BM_PollRunningTasks(benchmark::State& state) {
  Scratch scratch;
  SystemClock clock;
  Result<std::unique_ptr<ProcessRunner>> runner =
      ProcessRunner::Open(scratch.dir() + "/state", clock);
  if (!runner.ok()) {
    state.SkipWithError(runner.status().ToString().c_str());
    return;
  }
  const int64_t count = state.range(0);
  for (int64_t i = 0; i < count; ++i) {
    if (!(*runner)->Start(Launch(scratch, "sleep-" + std::to_string(i), {"sleep", "600"})).ok()) {
      state.SkipWithError("start failed");
      return;
    }
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize((*runner)->Poll());
  }
  for (int64_t i = 0; i < count; ++i) {
    const std::string task_id = "sleep-" + std::to_string(i);
    if ((*runner)->Stop(task_id, Duration::zero()).ok()) {
      PollUntilFinal(**runner, task_id);
    }
  }
}
BENCHMARK(BM_PollRunningTasks)->Arg(8)->Arg(64)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace gpufleet::runner

BENCHMARK_MAIN();
