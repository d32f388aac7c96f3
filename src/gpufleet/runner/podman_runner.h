// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/os/command.h"
#include "gpufleet/runner/process_runner.h"
#include "gpufleet/runner/run_as.h"
#include "gpufleet/runner/task_runner.h"

namespace gpufleet::runner {

// The labels every container of a PodmanRunner carries: the runner's instance, the task id
// (JOB/TASK/ATTEMPT: it names the job, the task and the run), the task's GPUs and its start time
// on the runner's Clock. `podman ps --filter label=gpufleet.io/runner=INSTANCE` lists them.
inline constexpr std::string_view kRunnerLabel = "gpufleet.io/runner";
inline constexpr std::string_view kTaskIdLabel = "gpufleet.io/task-id";
inline constexpr std::string_view kGpusLabel = "gpufleet.io/gpus";
inline constexpr std::string_view kStartLabel = "gpufleet.io/start-ns";

struct PodmanRunnerOptions {
  // The podman program; a name is looked up in PATH.
  std::string podman = "podman";
  // `podman run --runtime`: runc by default, since crun refuses hosts whose cgroups are mounted in
  // hybrid mode (docs/containers.md); empty: podman's own default (crun on cgroup v2 hosts).
  std::string oci_runtime = "runc";
  // podman's --root, --runroot, --tmpdir and --storage-driver; empty: podman's defaults. Tests
  // keep their images, containers and podman's own state in a temporary directory this way.
  std::string storage_root;
  std::string run_root;
  std::string tmp_dir;
  std::string storage_driver;
  // A containers.conf podman reads (CONTAINERS_CONF); empty: the CONTAINERS_CONF of this
  // process's environment if set, else the system's. On hosts whose hard
  // RLIMIT_NOFILE is below podman's default ulimits it must say `default_ulimits = []`.
  std::string containers_conf;
  // A registries.conf podman reads (CONTAINERS_REGISTRIES_CONF): the one the agent writes for
  // its image mirror (agent/image_mirror.h), so that pulls go through the node's peers; empty:
  // the system's.
  std::string registries_conf;
  // Registries ("HOST:PORT", e.g. a registry on loopback) pulled from over plain HTTP
  // (`podman pull --tls-verify=false`); every other registry is pulled from over TLS.
  std::vector<std::string> insecure_registries;
  // The state directory of the container fences (created if missing; its parent must exist): a
  // ProcessRunner of the runner's own, running as the agent's user, whose tasks stop the
  // containers when the agent's lease runs out. Required.
  std::string fence_dir;
  // The state directory of the image pulls (created if missing; its parent must exist): a
  // ProcessRunner of the runner's own whose tasks are the `podman pull`s, so that a pull runs
  // beside the agent instead of holding it up, and ends with the agent's lease. Required.
  std::string pull_dir;
  // The value of kRunnerLabel on this runner's containers: a runner adopts and lists only its own.
  std::string instance = "gpufleet";
  // The user the container's process runs as (`--user UID:GID`); none: the image's user.
  std::optional<RunAs> run_as;
  // How long podman may take for anything but a pull, and for a pull.
  Duration command_timeout = std::chrono::seconds(60);
  Duration pull_timeout = std::chrono::minutes(30);
  // Poll starts a listing of the containers (`podman ps`, in the background) at most once per
  // list_interval: the polls of one heartbeat share one listing.
  Duration list_interval = std::chrono::seconds(1);
};

// A TaskRunner that runs each task with an image as an OCI container through podman, and hands
// every task without one to another runner (the node's ProcessRunner).
//
// A container task. Start makes sure the image is there (TaskLaunch::image_pull_policy:
// IfNotPresent pulls it when `podman run` finds it missing, Always pulls it first, Never refuses a
// missing image). A pull is a task of its own ProcessRunner over `pull_dir` and runs beside the
// agent: Start returns at once, and the task is kRunning with TaskStatus::pulling_image (and
// podman's latest line as image_pull_progress) until a Poll sees the pull end. Then the container
// starts, or the task fails to start with podman's reason; image_pull_time says how long the pull
// took. A pull that runs past `pull_timeout`, or whose task is stopped, is killed and the task
// fails to start without ever running. A pull outlives an agent restart: the next runner's Start
// of the same task id takes it over. Start (or the Poll after the pull) starts the container's
// fence (below), which runs `podman run --detach --init --log-driver passthrough` beside the
// caller: the task is kRunning with TaskStatus::starting_container until a Poll sees the fence
// report the start (with the image's digest) or its failure. The container is made with
// `--runtime` from the options; the task's GPUs as CDI devices (`--device nvidia.com/gpu=UUID`,
// MIG devices by their UUIDs); `--cpus` and `--memory` from TaskLaunch::cpu_milli and memory_mib;
// `--network none` unless TaskLaunch::host_network (then `--network host`); the environment
// TaskEnvironment builds (the process runner's allow-list; never the agent's own variables),
// passed as an --env-file on a pipe that never touches a disk; the working directory and the
// --run-as user
// when given; and the labels above. With passthrough logging the container's stdout and stderr
// are the task's log file itself, appended to as the process runner does. A pull or `podman run`
// that fails registers the task as kFailedToStart with podman's reason (an unknown image, a
// missing CDI device). A command that is not in the image is the container's PID 1's failure to
// run it: the task exits with code 1 and catatonit's message in its log.
//
// Ends and stops. A container that exited is kExited with its exit code, or kKilled when the
// runner signalled it and the code is 128 + that signal (catatonit, the container's PID 1 from
// --init, reports a signalled task that way). Stop sends SIGTERM to the container
// (`podman kill --signal TERM`) and SIGKILL once the grace has passed (noticed by Poll), so the
// container, not a process of the node, is the unit that is stopped.
//
// Surviving an agent restart. Containers run under podman's conmon, not under the agent; Open
// lists the containers labelled with the runner's instance and adopts them: running ones stay
// kRunning and Stop works on them, ended ones report their exit code. Forget removes the
// container (`podman rm --force`).
//
// Fencing. Each container has a fence: a shell task of a ProcessRunner over `fence_dir` that
// makes the container (`podman run`, only for a new task), writes the digest it runs to
// `fence_dir`/NAME.started, and waits for it (`podman wait`). RenewLease renews the lease of the
// process runners. A lease that runs out while podman makes the container fences it as soon as
// `podman run` has returned, so a container made after its lease never runs on. When the lease
// runs out with no agent to renew it, the fence's shim sends it
// SIGTERM, and the fence sends the container SIGTERM and, 2 s before the lease's grace ends (half
// the grace when it is under 4 s), SIGKILL: the container ends before the server gives its GPUs
// to another task; a container left made but never started is removed. A task whose fence cannot
// be started fails to start; Poll starts a (waiting) fence again for a started container whose
// fence has ended, and forgets the fences of ended containers. Fences survive an agent restart
// like process tasks do, and so does a start under way: Open adopts it from its fence.
//
// Start, Stop, Poll and Forget never wait for podman: a thread of the runner sends the signals
// (`podman kill`), removes forgotten containers (`podman rm`) and lists the containers
// (`podman ps --all --filter label=...`) when a Poll asks and none was started within
// `list_interval`; Poll uses the latest listing that began after it learned of each container's
// start (a listing that may predate a container never reads as its end), and lists the images for
// ListImages. Only Open runs podman in the caller. Thread-safe: a mutex guards the table.
class PodmanRunner final : public TaskRunner {
 public:
  // Checks that podman runs (`podman version`), opens the fences' ProcessRunner, then adopts
  // this instance's containers. `processes` runs the tasks without an image; `clock` must outlive
  // the runner. Errors: kInvalidArgument for an empty podman, instance or fence_dir,
  // kFailedPrecondition when podman cannot be run (with its reason), the errors of
  // ProcessRunner::Open for fence_dir, kUnavailable when its containers cannot be listed.
  static Result<std::unique_ptr<PodmanRunner>> Open(PodmanRunnerOptions options,
                                                    std::unique_ptr<TaskRunner> processes,
                                                    const Clock& clock);

  // Leaves every container running: a new runner with the same instance adopts them. Waits for
  // the podman command under way, then sends the queued signals and removes the queued containers.
  ~PodmanRunner() override;
  PodmanRunner(const PodmanRunner&) = delete;
  PodmanRunner& operator=(const PodmanRunner&) = delete;

  // A launch without an image goes to the process runner. For a container: the common errors,
  // kInvalidArgument when log_path cannot be opened for appending, kUnavailable when podman
  // cannot be started at all. An image that cannot be had, or a `podman run` that fails, makes
  // the task kFailedToStart with podman's reason.
  Status Start(const TaskLaunch& launch) override;
  // The signal goes to the container from the runner's podman thread (a SIGKILL podman could
  // not send is sent again at the next Poll); a container still being made gets it once it has
  // started.
  Status Stop(std::string_view task_id, Duration grace) override;
  // A container task's signal goes through `podman kill --signal` (queued as a stop's are); a
  // task whose container has not started yet gets none.
  Status SendNotice(std::string_view task_id, std::string_view signal_name) override;
  std::vector<TaskStatus> Poll() override;
  // Also has the runner's podman thread remove the container (`podman rm --force`).
  Status Forget(std::string_view task_id) override;
  Status RenewLease(Duration fence_in, Duration grace) override;
  // `podman images --format json`: each image's names, manifest digest and size. Images
  // without a digest (podman gives every pulled, imported or built image one) are left out. The
  // runner's podman thread lists them: a call answers with a listing that began at or after the
  // first call left unanswered, else kUnavailable (and a listing begins): ask again later.
  Result<std::vector<CachedImage>> ListImages() override;
  std::string ContainerRuntime() const override { return "podman"; }

  // The name of the container of `task_id`.
  std::string ContainerNameForTest(std::string_view task_id) const {
    return ContainerName(task_id);
  }

 private:
  // What `podman ps` says about one container.
  struct ContainerState {
    std::string name;
    bool running = false;
    bool never_started = false;  // made, not (yet) started: "created", "configured", "initialized"
    int exit_code = 0;
    std::map<std::string, std::string> labels;
  };
  struct Task {
    TaskStatus status;
    std::string container;
    bool sigterm_sent = false;
    bool sigkill_sent = false;
    std::optional<MonoTime> kill_deadline;
    // While its image is pulled: the launch whose container starts once the pull has ended.
    std::optional<TaskLaunch> awaiting_pull;
    bool pull_timed_out = false;
    // While its fence makes the container (status.starting_container): the launch, to pull the
    // image and start again when IfNotPresent finds it missing (none for a start adopted from
    // an earlier runner), and the size of the log before, whose growth is a failure's reason.
    std::optional<TaskLaunch> launch;
    int64_t log_offset = 0;
    // A stop that came while the container was being made, and its grace (the shortest asked):
    // the container gets SIGTERM once it has started, and SIGKILL after that grace.
    bool signal_pending = false;
    Duration pending_grace{0};
    // The listings of the containers numbered from this one on tell the container's state (it
    // existed when they began); earlier ones may predate it.
    uint64_t listable_from = 0;
  };
  // A listing of this instance's containers, by name, numbered in the order they began.
  struct Listing {
    uint64_t number = 0;
    std::map<std::string, ContainerState> containers;
  };

  PodmanRunner(PodmanRunnerOptions options, std::unique_ptr<TaskRunner> processes,
               const Clock& clock);

  std::vector<std::string> PodmanCommand() const;
  // `podman images`, in the caller.
  Result<std::vector<CachedImage>> ListImagesNow() const;
  // podman's environment: PATH, HOME, TMPDIR, XDG_RUNTIME_DIR, CONTAINERS_CONF and
  // CONTAINERS_REGISTRIES_CONF only.
  std::vector<std::string> PodmanEnvironment() const;
  std::string ContainerName(std::string_view task_id) const;
  // Runs podman with `args` after the global flags, capturing its output.
  Result<os::CommandOutcome> Podman(const std::vector<std::string>& args, Duration timeout) const;
  // This instance's containers, by name.
  Result<std::map<std::string, ContainerState>> ListContainers() const;
  // Starts pulling the launch's image (or takes over the pull an earlier runner started for the
  // task); the reason it cannot otherwise. REQUIRES: mu_ held.
  std::optional<std::string> StartPull(Task& task, const TaskLaunch& launch);
  // Brings every pulling task up to date: progress, the pull timeout, and the container's start
  // (or the task's failure) once its pull has ended. REQUIRES: mu_ held.
  void TendPulls(MonoTime now);
  // Starts the task's fence, which makes the container; a task whose fence cannot start ends
  // kFailedToStart. REQUIRES: mu_ held.
  void LaunchContainer(Task& task, const TaskLaunch& launch);
  // Brings every task whose container is being made up to date from its fence: started (with
  // its digest), failed to start with podman's reason, or (IfNotPresent, image missing) pulling.
  // REQUIRES: mu_ held.
  void TendStarts(const std::map<std::string, TaskStatus, std::less<>>& fences, MonoTime now);
  // Where the fence of `task_id` writes the digest of the container it started.
  std::string StartedPath(std::string_view task_id) const;
  // The digest in the started file of `task_id`; empty when there is none.
  std::string StartedDigest(std::string_view task_id) const;
  // Reads the started file of a task whose container is being made: when it is there, the task
  // has started (status.image_digest from it). REQUIRES: mu_ held.
  bool NoteStarted(Task& task, MonoTime now);
  // Sends a stop that waited for the container. REQUIRES: mu_ held.
  void SendPendingSignal(Task& task, MonoTime now);
  // Asks the lister thread for a listing unless one runs or began within list_interval; returns
  // the latest one. Thread-safe.
  std::shared_ptr<const Listing> RequestListing(MonoTime now);
  // The number the next listing to begin will have. Thread-safe.
  uint64_t NextListingNumber();
  void ListerLoop();
  // The digest of the image `container` runs ("sha256:..."), as podman resolved it when it made
  // the container: what the run really got, whatever the tag points at later. Empty when podman
  // cannot say.
  std::string ImageDigestOf(const std::string& container) const;
  // A task of the runner's own process runners (a fence, a pull): `argv` with podman's
  // environment, its output to `log_path`.
  TaskLaunch OwnProcessTask(std::string_view task_id, std::vector<std::string> argv,
                            std::string log_path) const;
  // Where the pull of `task_id` writes podman's output.
  std::string PullLogPath(std::string_view task_id) const;
  // `podman run`'s arguments for the task's container, labelled with `start_time`, reading its
  // environment from stdin; the environment's text (NAME=VALUE lines) goes to `env_text`. The
  // reason it cannot run otherwise.
  Result<std::vector<std::string>> RunArguments(const TaskLaunch& launch, const std::string& name,
                                                MonoTime start_time, std::string& env_text) const;
  // Records the end of a task whose container has exited, or is gone. REQUIRES: mu_ held.
  void Finish(Task& task, const ContainerState* container, MonoTime now);
  // Has `signal_name` ("TERM", "KILL") sent to the task's container by the runner's podman
  // thread, and records it as sent. REQUIRES: mu_ held.
  void Signal(Task& task, std::string_view signal_name);
  // Queues `podman kill --signal SIGNAL` of the container for the podman thread.
  void QueueSignal(const std::string& container, std::string_view signal_name);
  bool IsContainerTask(std::string_view task_id);
  // Starts the fence of the task's container (under the task's id in fences_): with `launch`, one
  // that makes the container first; without, one that waits for the container there is.
  Status StartFence(const Task& task, const TaskLaunch* launch);
  // Gives every running container a running fence and forgets the fences of ended containers;
  // what fails is tried again at the next Poll. REQUIRES: mu_ held.
  void TendFences(const std::map<std::string, TaskStatus, std::less<>>& fences);

  const PodmanRunnerOptions options_;
  const std::unique_ptr<TaskRunner> processes_;
  std::unique_ptr<ProcessRunner> fences_;  // set by Open
  std::unique_ptr<ProcessRunner> pulls_;   // set by Open
  const Clock& clock_;
  std::mutex mu_;
  std::map<std::string, Task, std::less<>> tasks_;  // guarded by mu_

  // The runner's podman thread (ListerLoop) and what it shares with the callers, guarded by
  // list_mu_ (taken after mu_): signals to send, containers to remove, listings.
  struct QueuedSignal {
    std::string container;
    std::string signal;
  };
  std::mutex list_mu_;
  std::deque<QueuedSignal> signals_;
  std::vector<std::string> removals_;
  std::set<std::string> failed_kills_;  // containers a queued SIGKILL did not reach
  // ListImages: calls so far, the first one not answered yet, whether a listing is wanted, and
  // the last one with the number of calls made when it began.
  uint64_t image_calls_ = 0;
  std::optional<uint64_t> first_unanswered_call_;
  bool images_wanted_ = false;
  std::optional<std::pair<uint64_t, Result<std::vector<CachedImage>>>> image_listing_;
  std::condition_variable list_cv_;
  bool list_wanted_ = false;
  bool listing_ = false;  // a listing runs
  bool stopping_ = false;
  std::optional<MonoTime> list_requested_at_;
  uint64_t next_listing_number_ = 1;  // 0: Open's
  std::shared_ptr<const Listing> latest_listing_;
  std::thread lister_;  // started by Open
};

}  // namespace gpufleet::runner
