// SPDX-License-Identifier: Apache-2.0
// The node agent's hands: the interface through which it starts, stops and watches the tasks the
// server assigns to its node. The agent receives a TaskRunner by reference, so a node runs real
// processes (ProcessRunner) while the simulated fleet and the agent's tests use SimulatedRunner.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/cluster.h"
#include "gpufleet/core/image_reference.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"

namespace gpufleet::runner {

// The variables that tell CUDA and the NVIDIA container runtime which devices a task may use.
// The runner sets both from TaskLaunch::gpu_uuids; a launch may not set them itself.
inline constexpr std::string_view kCudaVisibleDevicesEnv = "CUDA_VISIBLE_DEVICES";
inline constexpr std::string_view kNvidiaVisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES";
// A task without GPUs: CUDA treats an empty CUDA_VISIBLE_DEVICES as "no device", and the NVIDIA
// container toolkit treats NVIDIA_VISIBLE_DEVICES=void as "no GPU and no driver libraries" (the
// value "none" would still mount the driver).
inline constexpr std::string_view kNoCudaDevices = "";
inline constexpr std::string_view kNoNvidiaDevices = "void";

// A task that runs as a client of a GPU's NVIDIA MPS control daemon (docs/sharing.md). The runner
// sets the client's variables from it (MpsEnvironment) and gives a container the pipe directory;
// a launch may not set CUDA_MPS_* variables itself, so that no task picks another GPU's daemon or
// lifts its own limits.
struct MpsClient {
  // The daemon's CUDA_MPS_PIPE_DIRECTORY (an absolute path).
  std::string pipe_directory;
  // The most GPU memory the client may pin, in MiB; 0: no limit.
  int64_t memory_limit_mib = 0;
  // The share of the GPU's threads the client's kernels may use, 1..100.
  int active_thread_percentage = 100;

  friend bool operator==(const MpsClient&, const MpsClient&) = default;
};
inline constexpr std::string_view kMpsEnvPrefix = "CUDA_MPS_";
inline constexpr std::string_view kMpsPipeDirectoryEnv = "CUDA_MPS_PIPE_DIRECTORY";
inline constexpr std::string_view kMpsMemoryLimitEnv = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
inline constexpr std::string_view kMpsActiveThreadsEnv = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";

// One task of a job, as the agent asks a runner to start it.
// The variable that names a task's checkpoint file (TaskLaunch::checkpoint_path).
inline constexpr std::string_view kCheckpointFileEnv = "GPUFLEET_CHECKPOINT_FILE";
// The variable that names a task's preemption notice file (TaskLaunch::notice_path).
inline constexpr std::string_view kNoticeFileEnv = "GPUFLEET_PREEMPTION_NOTICE_FILE";

struct TaskLaunch {
  // Unique among the runner's tasks, e.g. "train-llm/group-0": 1 to kMaxTaskIdLength characters
  // from [A-Za-z0-9._:@+/-].
  std::string task_id;
  // The run the task belongs to (the agent's "JOB/ATTEMPT"), in the same characters: tasks of one
  // run may share what the runner gives a run (ProcessRunner's task sandbox: a user and
  // directories). Empty: the task is a run of its own.
  std::string run_id;
  // The program and its arguments; argv[0] is looked up in PATH when it has no '/'.
  std::vector<std::string> argv;
  // Added to the runner's own environment, overriding variables of the same name. Names are
  // [A-Za-z_][A-Za-z0-9_]*; CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES are not allowed.
  std::map<std::string, std::string> env;
  // GPU or MIG device UUIDs ("GPU-8932f937-...", "MIG-..."), in the order the task enumerates
  // them. Empty: the task gets no GPU.
  std::vector<std::string> gpu_uuids;
  // The file that receives the task's stdout and stderr (appended; created if missing, its
  // directory must exist). ProcessRunner requires it; SimulatedRunner ignores it.
  std::string log_path;
  // The file the task reports its checkpoints to (agent/checkpoint_file.h): ProcessRunner creates
  // it, empty, writable by the user the task runs as alone, and names it in the task's
  // environment as GPUFLEET_CHECKPOINT_FILE; its directory must exist and be one the task's user
  // cannot write to. Empty: none. PodmanRunner and SimulatedRunner give their tasks none.
  std::string checkpoint_path;
  // The file the agent writes the task's preemption notice to (docs/agent.md, "Preemption
  // notices"), named in the task's environment as GPUFLEET_PREEMPTION_NOTICE_FILE; the task only
  // reads it. ProcessRunner names it (the agent makes it); empty: none. PodmanRunner and
  // SimulatedRunner give their tasks none.
  std::string notice_path;
  // The directory the task starts in; empty: the runner's own working directory.
  std::string working_dir;
  // The task's CPU (milli-cores) and memory request, enforced as limits where the runner puts
  // tasks in cgroups; 0: no limit.
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  // The container image the task runs in (an OCI reference, checked by ValidateImageReference)
  // and how the node gets it; empty: the task runs as a process. Only PodmanRunner runs
  // containers: ProcessRunner refuses a launch with an image (it would run the command on the
  // host instead), SimulatedRunner ignores it. `host_network`: the container shares the node's
  // network namespace instead of having no network.
  std::string image;
  ImagePullPolicy image_pull_policy = ImagePullPolicy::kIfNotPresent;
  bool host_network = false;
  // Set: the task is an MPS client of its one GPU's daemon.
  std::optional<MpsClient> mps;
};

enum class TaskState {
  kRunning,
  kExited,         // ended by itself; TaskStatus::exit_code
  kKilled,         // ended by a signal; TaskStatus::signal
  kFailedToStart,  // its program never ran; TaskStatus::reason
  kLost,           // the runner cannot tell how it ended; TaskStatus::reason
};

// "running", "exited", "killed", "failed-to-start", "lost".
std::string_view TaskStateName(TaskState state);
// Every state but kRunning is final: the task holds no process and no GPU any more.
bool IsFinal(TaskState state);

// What a runner knows about one task.
struct TaskStatus {
  std::string task_id;
  TaskState state = TaskState::kRunning;
  int exit_code = 0;   // kExited
  int signal = 0;      // kKilled
  std::string reason;  // kFailedToStart, kLost
  std::vector<std::string> gpu_uuids;
  // From the runner's injected Clock: when Start accepted the task, and when the runner first
  // saw it end (a task that ended while no runner watched gets the time it was found).
  MonoTime start_time;
  std::optional<MonoTime> end_time;
  // Stop was called for this task.
  bool stop_requested = false;
  // The preemption notices SendNotice delivered to the task, by signal name, in order.
  std::vector<std::string> notices;
  // The task's process group; 0 when it has no process (SimulatedRunner, failed starts).
  int process_group = 0;
  // The task stops itself when the runner's lease runs out (RenewLease); false for a task an
  // older runner started and this one adopted, which only a Stop ends.
  bool enforces_lease = false;
  // PodmanRunner: how long pulling the task's image before its start took (on the runner's
  // Clock, failed pulls included); none when nothing was pulled.
  std::optional<Duration> image_pull_time;
  // PodmanRunner: the task is kRunning but its image is still being pulled, so nothing of it
  // runs yet; its container starts when the pull has ended. `image_pull_progress` is podman's
  // latest line of output while it pulls ("Copying blob sha256:..."), for people.
  bool pulling_image = false;
  std::string image_pull_progress;
  // PodmanRunner: the task is kRunning and its container is being made (`podman run` runs beside
  // the caller, in the container's fence); image_digest is known once it has started.
  bool starting_container = false;
  // PodmanRunner: the digest of the image the task's container runs ("sha256:..."), as podman
  // resolved it when it created the container; empty for a process or when podman did not say.
  std::string image_digest;

  friend bool operator==(const TaskStatus&, const TaskStatus&) = default;
};

// One line for people: "running", "exited with code 3", "killed by signal 15 (SIGTERM)",
// "failed to start: ...", "lost: ...".
std::string DescribeTaskStatus(const TaskStatus& status);

// The checks every runner applies to a launch: the task and run ids, argv (not empty, no NUL
// bytes), the environment names and values, the GPU UUIDs (no empty, duplicate, ',' or blank ones),
// the paths (no NUL or newline), the image (ValidateImageReference) and an MPS client's fields
// (one GPU, an absolute pipe directory, a percentage of 1..100, a limit not negative).
// kInvalidArgument naming the field and the value.
Status ValidateLaunch(const TaskLaunch& launch);

// The task's GPU variables for `gpu_uuids`: both joined with ',' or, without GPUs, the "no
// device" values above.
std::map<std::string, std::string> GpuEnvironment(const std::vector<std::string>& gpu_uuids);
// An MPS client's variables: the pipe directory, the memory limit of its one visible device
// ("0=2048M", device 0 being the one GPU CUDA_VISIBLE_DEVICES names; none without a limit) and
// the active-thread percentage.
std::map<std::string, std::string> MpsEnvironment(const MpsClient& client);

// Starts, stops and watches tasks. Implementations read time only through an injected Clock.
//
// Contracts, common to every implementation:
// - Start either registers the task (it then appears in every Poll until Forget) and returns OK,
//   or returns an error and the task id stays unknown. A well-formed launch whose program cannot
//   run is registered and ends kFailedToStart.
// - A task is kRunning until the runner sees it end; then it stays in its final state.
// - Stop and Forget of an unknown task id are kNotFound.
class TaskRunner {
 public:
  virtual ~TaskRunner() = default;

  // Errors: kInvalidArgument (see ValidateLaunch, and what the implementation adds),
  // kAlreadyExists for a task id the runner already knows (running or not yet forgotten).
  virtual Status Start(const TaskLaunch& launch) = 0;

  // Asks a running task to end: SIGTERM to its process group now, SIGKILL once `grace` has
  // passed on the runner's Clock (noticed by the first Poll after the deadline; a zero grace
  // sends SIGKILL at once). Idempotent: stopping a task again keeps the earlier deadline if it is
  // sooner, and stopping a task that already ended does nothing. kInvalidArgument for a negative
  // grace.
  virtual Status Stop(std::string_view task_id, Duration grace) = 0;

  // The status of every known task, sorted by task id. Also where the runner makes progress:
  // it notices ended tasks and sends the SIGKILLs that are due.
  virtual std::vector<TaskStatus> Poll() = 0;

  // A preemption notice (docs/agent.md, "Preemption notices"): sends `signal_name` (one
  // NoticeSignalNumber takes, "SIGUSR1") to the running task's process group or container, and
  // nothing else; the task runs on. A task that has ended, or whose container has not started
  // yet, gets nothing (OK). kNotFound for an unknown task id; kInvalidArgument for a signal name
  // that is not a notice's.
  virtual Status SendNotice(std::string_view task_id, std::string_view signal_name) = 0;

  // Drops a task that has ended, once the agent has reported its final state.
  // kFailedPrecondition while the task is still running.
  virtual Status Forget(std::string_view task_id) = 0;

  // The agent's lease, as the tasks themselves enforce it: unless renewed again, every task that
  // is running `fence_in` from now is stopped then (SIGTERM, SIGKILL after `grace`), whether or
  // not an agent still runs, since a dead agent can stop nothing and the server frees the GPUs
  // of a silent node after its lease and stop grace (docs/agent.md, "Leases and fencing").
  // Each call replaces the previous deadline; a task being stopped keeps its stop. Before the
  // first call tasks have no such deadline. kInvalidArgument for a negative duration;
  // kUnavailable when the lease cannot be recorded (the previous deadline then still holds).
  virtual Status RenewLease(Duration fence_in, Duration grace) = 0;

  // The container engine that runs the tasks with an image ("podman"); empty for a runner that
  // runs processes only (the default). The agent reports it as its node's
  // kContainerRuntimeLabel, and the server places container tasks only where it is set.
  virtual std::string ContainerRuntime() const { return ""; }

  // The container images the node holds, largest first (PodmanRunner); a runner that runs no
  // containers returns kUnimplemented (the default), and the agent then reports no images.
  // kUnavailable when the images cannot be listed now. Slow (it runs the container engine): the
  // agent calls it at a modest rate.
  virtual Result<std::vector<CachedImage>> ListImages() {
    return Status(StatusCode::kUnimplemented, "this runner holds no images");
  }
};

// Reconciles a runner with the server's desired state: stops, with `grace`, every running task
// whose id is not in `desired` and has not been stopped yet. Returns the ids it stopped, sorted.
Result<std::vector<std::string>> StopUndesiredTasks(
    TaskRunner& runner, const std::set<std::string, std::less<>>& desired, Duration grace);

}  // namespace gpufleet::runner
