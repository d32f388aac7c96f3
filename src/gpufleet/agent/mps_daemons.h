// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/runner/task_runner.h"

// The NVIDIA MPS control daemons of a node's GPUs (docs/sharing.md): one `nvidia-cuda-mps-control
// -d` per GPU that has MPS shares, with its pipe and log directories under the agent's state
// directory and CUDA_VISIBLE_DEVICES naming that GPU alone, so that each GPU's clients get their
// own MPS server and their limits apply to that GPU. A daemon is found again by its pid file
// (nvidia-cuda-mps-control.pid in its pipe directory), so an agent that restarts adopts the
// daemons the previous one started and never starts a second one for a GPU.
namespace gpufleet::agent {

inline constexpr std::string_view kMpsPidFile = "nvidia-cuda-mps-control.pid";

struct MpsDaemonOptions {
  // The control daemon's program, looked up in PATH when it has no '/'. Tests name a script that
  // behaves like it (testing/fake_mps_control.sh): no GPU is needed to run them.
  std::string control_program = "nvidia-cuda-mps-control";
  // DIR/GPU-UUID/pipe and DIR/GPU-UUID/log for each GPU's daemon; must be an absolute path
  // without ':' or ',' (a container mounts the pipe directory).
  std::string state_dir;
  // How long a daemon that was told to quit may take before it gets SIGKILL.
  Duration quit_grace = std::chrono::seconds(10);
  // The longest a control command (the start with -d, a quit) may run.
  Duration command_timeout = std::chrono::seconds(10);
  // How long after a start the daemon may take to write its pid file; the share waits meanwhile
  // (EnsureRunning answers kUnavailable and is asked again at the agent's next pass), then the
  // start is given up and tried anew. Clients never start before the daemon runs, since a CUDA
  // client that finds no daemon runs without MPS and without its limits.
  Duration start_wait = std::chrono::seconds(2);
};

// Thread-compatible. Reads time only through the injected Clock.
class MpsDaemons {
 public:
  enum class State { kStarting, kRunning, kQuitting };

  MpsDaemons(MpsDaemonOptions options, const Clock& clock);

  // Adopts the daemons an earlier agent left running (a live daemon named by a GPU's pid file)
  // and clears the directories of those that are gone. kUnavailable when the state directory
  // cannot be read.
  Status Adopt();

  // The pipe directory of GPU `gpu_uuid`'s daemon, started first when none runs.
  // kUnavailable while that GPU's daemon is still quitting or has not written its pid file yet
  // (the share waits); kFailedPrecondition when MPS is off (no state directory) or the daemon
  // could not be started, with the reason.
  Result<std::string> EnsureRunning(const std::string& gpu_uuid);

  // Stops the daemons no task may still need: those of GPUs that no task in `tasks` holds
  // unless it has ended (any task, not only MPS clients: a task the runner cannot tell about is
  // taken to be one) and that no share in `wanted_gpus` is to run on. Sends "quit" once, then
  // SIGKILL when the daemon has outlived quit_grace (checked at each call), and forgets a daemon
  // once it is gone. Returns the GPUs whose daemon it told to quit at this call.
  std::vector<std::string> StopUnused(const std::vector<runner::TaskStatus>& tasks,
                                      const std::set<std::string>& wanted_gpus);

  // The daemons this agent knows of, by GPU UUID.
  std::map<std::string, State> daemons() const;

  // The pipe directory of `gpu_uuid`'s daemon, whether or not one runs.
  std::string PipeDirectory(const std::string& gpu_uuid) const;

 private:
  struct Daemon {
    int pid = 0;
    State state = State::kRunning;
    MonoTime since;  // when it entered `state`
  };

  std::string LogDirectory(const std::string& gpu_uuid) const;
  // The environment of the control program for `gpu_uuid`'s daemon.
  std::vector<std::string> ControlEnvironment(const std::string& gpu_uuid) const;
  // The pid in the GPU's pid file when that process is a live control daemon; 0 otherwise.
  int LiveDaemonPid(const std::string& gpu_uuid) const;
  Status Quit(const std::string& gpu_uuid);

  MpsDaemonOptions options_;
  const Clock& clock_;
  std::map<std::string, Daemon> daemons_;
};

}  // namespace gpufleet::agent
