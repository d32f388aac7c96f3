// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/runner/podman_runner.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpufleet/os/files.h"
#include "gpufleet/runner/internal/task_table.h"
#include "gpufleet/runner/internal/text.h"
#include "gpufleet/runner/process_runner.h"

namespace gpufleet::runner {
namespace {

using internal::SplitCommas;
using os::ErrnoText;

using Json = nlohmann::json;

// How much of podman's error output a task's reason quotes.
constexpr size_t kMaxReasonBytes = 2048;

// How a fence that makes its container ends when `podman run` failed (having removed whatever
// podman made): the image is not on the node, or any other reason (in the task's log).
constexpr int kImageMissingExitCode = 100;
constexpr int kRunFailedExitCode = 101;

// The fence's environment variable that carries the container's environment to `podman run`.
constexpr char kContainerEnvVariable[] = "GPUFLEET_CONTAINER_ENV";

// "gpufleet-" and the task id with every character a container name cannot hold as '_', then a
// hash of the instance and the id, so that ids differing only there get different names.
std::string MakeContainerName(std::string_view instance, std::string_view task_id) {
  uint64_t hash = 14695981039346656037ULL;  // FNV-1a
  for (const char c : fmt::format("{}\n{}", instance, task_id)) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  }
  std::string readable(task_id.substr(0, 100));
  for (char& c : readable) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    c = allowed ? c : '_';
  }
  return fmt::format("gpufleet-{}-{:016x}", readable, hash);
}

// "1.5" for 1500 milli-CPU.
std::string FormatCpus(int64_t cpu_milli) {
  return cpu_milli % 1000 == 0 ? fmt::format("{}", cpu_milli / 1000)
                               : fmt::format("{}.{:03}", cpu_milli / 1000, cpu_milli % 1000);
}

std::string Reason(std::string_view what, const os::CommandOutcome& outcome) {
  if (outcome.timed_out) {
    return fmt::format("{}: podman did not finish in time", what);
  }
  std::string line = os::LastLine(outcome.errors);
  if (line.empty()) {
    line = fmt::format("podman exited with code {}", outcome.exit_code);
  }
  return fmt::format("{}: {}", what, line.substr(0, kMaxReasonBytes));
}

// What was appended to the file at `path` from `offset` on (at most kMaxReasonBytes of its end).
std::string ReadFrom(const std::string& path, off_t offset) {
  const os::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat info = {};
  if (fd.get() < 0 || fstat(fd.get(), &info) != 0 || info.st_size <= offset) {
    return "";
  }
  const off_t start = std::max<off_t>(offset, info.st_size - static_cast<off_t>(kMaxReasonBytes));
  std::string text(static_cast<size_t>(info.st_size - start), '\0');
  const ssize_t n = pread(fd.get(), text.data(), text.size(), start);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return text;
}

}  // namespace

PodmanRunner::PodmanRunner(PodmanRunnerOptions options, std::unique_ptr<TaskRunner> processes,
                           const Clock& clock)
    : options_(std::move(options)), processes_(std::move(processes)), clock_(clock) {}

Result<std::unique_ptr<PodmanRunner>> PodmanRunner::Open(PodmanRunnerOptions options,
                                                         std::unique_ptr<TaskRunner> processes,
                                                         const Clock& clock) {
  if (options.podman.empty() || options.instance.empty() || options.fence_dir.empty() ||
      options.pull_dir.empty()) {
    return InvalidArgumentError(
        "podman runner: the podman program, the instance, the fence directory and the pull "
        "directory must be set");
  }
  if (processes == nullptr) {
    return InvalidArgumentError("podman runner: a runner for tasks without an image is needed");
  }
  std::unique_ptr<PodmanRunner> runner(
      new PodmanRunner(std::move(options), std::move(processes), clock));
  GPUFLEET_ASSIGN_OR_RETURN(const os::CommandOutcome version,
                            runner->Podman({"version", "--format", "{{.Client.Version}}"},
                                           runner->options_.command_timeout));
  if (version.exit_code != 0) {
    return FailedPreconditionError(Reason("podman cannot be run", version));
  }
  // The fences run as the agent's user (podman's own) and in no cgroup of the tasks.
  GPUFLEET_ASSIGN_OR_RETURN(runner->fences_,
                            ProcessRunner::Open(runner->options_.fence_dir, clock));
  GPUFLEET_ASSIGN_OR_RETURN(runner->pulls_, ProcessRunner::Open(runner->options_.pull_dir, clock));
  GPUFLEET_ASSIGN_OR_RETURN(auto containers, runner->ListContainers());
  const MonoTime now = clock.Now();
  std::lock_guard<std::mutex> lock(runner->mu_);
  // Fences still making their containers (the last runner stopped meanwhile): the starts go on,
  // and this runner learns their outcome from the fences as the last one would have.
  std::set<std::string, std::less<>> starting;
  for (const TaskStatus& fence : runner->fences_->Poll()) {
    if (!IsFinal(fence.state) && access(runner->StartedPath(fence.task_id).c_str(), F_OK) != 0) {
      starting.insert(fence.task_id);
      Task task;
      task.container = runner->ContainerName(fence.task_id);
      task.status.task_id = fence.task_id;
      task.status.gpu_uuids = fence.gpu_uuids;
      task.status.start_time = fence.start_time;
      task.status.starting_container = true;
      task.status.enforces_lease = true;
      runner->tasks_.emplace(fence.task_id, std::move(task));
    }
  }
  for (const auto& [name, container] : containers) {
    const auto id = container.labels.find(std::string(kTaskIdLabel));
    if (id == container.labels.end() || id->second.empty() || starting.contains(id->second)) {
      continue;
    }
    Task task;
    task.container = name;
    task.status.task_id = id->second;
    task.status.start_time = now;
    if (const auto start = container.labels.find(std::string(kStartLabel));
        start != container.labels.end()) {
      int64_t nanos = 0;
      const std::string& text = start->second;
      if (std::from_chars(text.data(), text.data() + text.size(), nanos).ec == std::errc()) {
        task.status.start_time = MonoTime{nanos};
      }
    }
    if (const auto gpus = container.labels.find(std::string(kGpusLabel));
        gpus != container.labels.end()) {
      task.status.gpu_uuids = SplitCommas(gpus->second);
    }
    // The next agent reports the digest as the first one did: the one its fence wrote at start,
    // else (a container made without a fence's record) podman's.
    task.status.image_digest = runner->StartedDigest(task.status.task_id);
    if (task.status.image_digest.empty()) {
      task.status.image_digest = runner->ImageDigestOf(name);
    }
    if (!container.running) {
      runner->Finish(task, &container, now);
    }
    runner->tasks_.emplace(task.status.task_id, std::move(task));
  }
  runner->latest_listing_ = std::make_shared<const Listing>(Listing{0, std::move(containers)});
  runner->lister_ = std::thread([raw = runner.get()] { raw->ListerLoop(); });
  return runner;
}

PodmanRunner::~PodmanRunner() {
  {
    std::lock_guard<std::mutex> lock(list_mu_);
    stopping_ = true;
  }
  list_cv_.notify_all();
  if (lister_.joinable()) {
    lister_.join();
  }
}

void PodmanRunner::ListerLoop() {
  std::unique_lock<std::mutex> lock(list_mu_);
  for (;;) {
    list_cv_.wait(lock, [&] {
      return list_wanted_ || images_wanted_ || stopping_ || !signals_.empty() || !removals_.empty();
    });
    // Signals first (a stop waits for them), then listings, then removals. What is queued when
    // the runner is destroyed is still done.
    if (!signals_.empty()) {
      const QueuedSignal signal = std::move(signals_.front());
      signals_.pop_front();
      lock.unlock();
      const Result<os::CommandOutcome> killed =
          Podman({"kill", "--signal", signal.signal, signal.container}, options_.command_timeout);
      lock.lock();
      if ((!killed.ok() || killed->exit_code != 0) && signal.signal == "KILL") {
        failed_kills_.insert(signal.container);
      }
      continue;
    }
    if (list_wanted_ && !stopping_) {
      list_wanted_ = false;
      listing_ = true;
      const uint64_t number = next_listing_number_++;
      lock.unlock();
      Result<std::map<std::string, ContainerState>> listed = ListContainers();
      lock.lock();
      listing_ = false;
      // A failed listing leaves the last one: the tasks keep their states until podman answers.
      if (listed.ok()) {
        latest_listing_ =
            std::make_shared<const Listing>(Listing{number, std::move(listed).value()});
      }
      continue;
    }
    if (images_wanted_ && !stopping_) {
      images_wanted_ = false;
      const uint64_t after_call = image_calls_;
      lock.unlock();
      Result<std::vector<CachedImage>> images = ListImagesNow();
      lock.lock();
      image_listing_.emplace(after_call, std::move(images));
      continue;
    }
    if (!removals_.empty()) {
      std::vector<std::string> args = {"rm", "--force", "--ignore"};
      args.insert(args.end(), removals_.begin(), removals_.end());
      removals_.clear();
      lock.unlock();
      [[maybe_unused]] const auto removed = Podman(args, options_.command_timeout);
      lock.lock();
      continue;
    }
    if (stopping_) {
      return;
    }
  }
}

uint64_t PodmanRunner::NextListingNumber() {
  std::lock_guard<std::mutex> lock(list_mu_);
  return next_listing_number_;
}

std::shared_ptr<const PodmanRunner::Listing> PodmanRunner::RequestListing(MonoTime now) {
  std::lock_guard<std::mutex> lock(list_mu_);
  if (!listing_ && !list_wanted_ &&
      (!list_requested_at_.has_value() || now - *list_requested_at_ >= options_.list_interval)) {
    list_wanted_ = true;
    list_requested_at_ = now;
    list_cv_.notify_all();
  }
  return latest_listing_;
}

std::vector<std::string> PodmanRunner::PodmanCommand() const {
  std::vector<std::string> command = {options_.podman};
  if (!options_.storage_root.empty()) {
    command.insert(command.end(), {"--root", options_.storage_root});
  }
  if (!options_.run_root.empty()) {
    command.insert(command.end(), {"--runroot", options_.run_root});
  }
  if (!options_.tmp_dir.empty()) {
    command.insert(command.end(), {"--tmpdir", options_.tmp_dir});
  }
  if (!options_.storage_driver.empty()) {
    command.insert(command.end(), {"--storage-driver", options_.storage_driver});
  }
  return command;
}

std::vector<std::string> PodmanRunner::PodmanEnvironment() const {
  std::vector<std::string> env;
  for (const char* name : {"PATH", "HOME", "TMPDIR", "XDG_RUNTIME_DIR", "CONTAINERS_CONF"}) {
    if (std::string_view(name) == "CONTAINERS_CONF" && !options_.containers_conf.empty()) {
      continue;
    }
    if (const char* value = getenv(name); value != nullptr) {
      env.push_back(fmt::format("{}={}", name, value));
    }
  }
  if (!options_.containers_conf.empty()) {
    env.push_back("CONTAINERS_CONF=" + options_.containers_conf);
  }
  if (!options_.registries_conf.empty()) {
    env.push_back("CONTAINERS_REGISTRIES_CONF=" + options_.registries_conf);
  }
  return env;
}

std::string PodmanRunner::ContainerName(std::string_view task_id) const {
  return MakeContainerName(options_.instance, task_id);
}

Result<os::CommandOutcome> PodmanRunner::Podman(const std::vector<std::string>& args,
                                                Duration timeout) const {
  os::CommandSpec spec;
  spec.argv = PodmanCommand();
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = PodmanEnvironment();
  spec.timeout = timeout;
  return os::RunCommand(spec, clock_);
}

Result<std::map<std::string, PodmanRunner::ContainerState>> PodmanRunner::ListContainers() const {
  GPUFLEET_ASSIGN_OR_RETURN(
      const os::CommandOutcome listed,
      Podman({"ps", "--all", "--filter",
              fmt::format("label={}={}", kRunnerLabel, options_.instance), "--format", "json"},
             options_.command_timeout));
  if (listed.exit_code != 0) {
    return UnavailableError(Reason("cannot list the containers", listed));
  }
  const Json parsed = Json::parse(listed.output, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_array()) {
    return UnavailableError("cannot list the containers: podman ps printed no JSON list");
  }
  std::map<std::string, ContainerState> containers;
  for (const Json& item : parsed) {
    if (!item.is_object() || !item.contains("Names") || !item["Names"].is_array() ||
        item["Names"].empty() || !item["Names"][0].is_string()) {
      continue;
    }
    ContainerState state;
    state.name = item["Names"][0].get<std::string>();
    const std::string status = item.value("State", "");
    // "created" and "configured" are on their way to running; "exited" and "stopped" are over.
    state.running = status != "exited" && status != "stopped";
    state.never_started = status == "created" || status == "configured" || status == "initialized";
    if (item.contains("ExitCode") && item["ExitCode"].is_number_integer()) {
      state.exit_code = item["ExitCode"].get<int>();
    }
    if (item.contains("Labels") && item["Labels"].is_object()) {
      for (const auto& [key, value] : item["Labels"].items()) {
        if (value.is_string()) {
          state.labels[key] = value.get<std::string>();
        }
      }
    }
    containers.emplace(state.name, std::move(state));
  }
  return containers;
}

namespace {

// The registry an image reference names: its first component when that holds a '.' or a ':' or
// is "localhost", else Docker Hub.
std::string_view RegistryOf(std::string_view reference) {
  const size_t slash = reference.find('/');
  if (slash == std::string_view::npos) {
    return "docker.io";
  }
  const std::string_view first = reference.substr(0, slash);
  return first.find_first_of(".:") != std::string_view::npos || first == "localhost" ? first
                                                                                     : "docker.io";
}

}  // namespace

Result<std::vector<CachedImage>> PodmanRunner::ListImages() {
  std::lock_guard<std::mutex> lock(list_mu_);
  const uint64_t call = ++image_calls_;
  if (!first_unanswered_call_.has_value()) {
    first_unanswered_call_ = call;
  }
  // A listing that began at or after the first call left unanswered answers it.
  if (image_listing_.has_value() && image_listing_->first >= *first_unanswered_call_) {
    Result<std::vector<CachedImage>> images = std::move(image_listing_->second);
    image_listing_.reset();
    first_unanswered_call_.reset();
    return images;
  }
  images_wanted_ = true;
  list_cv_.notify_all();
  return UnavailableError("the node's images are being listed; ask again");
}

Result<std::vector<CachedImage>> PodmanRunner::ListImagesNow() const {
  GPUFLEET_ASSIGN_OR_RETURN(const os::CommandOutcome listed,
                            Podman({"images", "--format", "json"}, options_.command_timeout));
  if (listed.exit_code != 0) {
    return UnavailableError(Reason("cannot list the images", listed));
  }
  const Json parsed = Json::parse(listed.output, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_array()) {
    return UnavailableError("cannot list the images: podman images printed no JSON list");
  }
  std::vector<CachedImage> images;
  for (const Json& item : parsed) {
    if (!item.is_object() || !item.contains("Digest") || !item["Digest"].is_string()) {
      continue;
    }
    CachedImage image;
    image.digest = item["Digest"].get<std::string>();
    if (item.contains("Names") && item["Names"].is_array()) {
      for (const Json& name : item["Names"]) {
        if (name.is_string()) {
          image.references.push_back(name.get<std::string>());
        }
      }
    }
    if (item.contains("Size") && item["Size"].is_number_integer()) {
      image.size_bytes = item["Size"].get<int64_t>();
    }
    images.push_back(std::move(image));
  }
  // Largest first: a bounded report keeps the images whose pulls cost the most.
  std::stable_sort(images.begin(), images.end(), [](const CachedImage& a, const CachedImage& b) {
    return a.size_bytes > b.size_bytes;
  });
  return images;
}

std::string PodmanRunner::PullLogPath(std::string_view task_id) const {
  return fmt::format("{}/{}.log", options_.pull_dir, ContainerName(task_id));
}

std::optional<std::string> PodmanRunner::StartPull(Task& task, const TaskLaunch& launch) {
  // A pull of this task that an earlier runner started goes on; one that has ended is done with.
  bool adopted = false;
  for (const TaskStatus& pull : pulls_->Poll()) {
    if (pull.task_id != launch.task_id) {
      continue;
    }
    adopted = !IsFinal(pull.state);
    if (!adopted) {
      if (const Status forgotten = pulls_->Forget(pull.task_id); !forgotten.ok()) {
        return fmt::format("cannot clear an earlier pull of its image: {}", forgotten.message());
      }
    }
  }
  if (!adopted) {
    std::vector<std::string> argv = PodmanCommand();
    argv.push_back("pull");
    const std::string_view registry = RegistryOf(launch.image);
    if (std::find(options_.insecure_registries.begin(), options_.insecure_registries.end(),
                  registry) != options_.insecure_registries.end()) {
      argv.push_back("--tls-verify=false");
    }
    // podman reads no flag after the image, and a valid image cannot start with '-'.
    argv.push_back(launch.image);
    const TaskLaunch pull =
        OwnProcessTask(launch.task_id, std::move(argv), PullLogPath(launch.task_id));
    // The log of an earlier pull would read as this one's progress or reason.
    unlink(pull.log_path.c_str());
    if (const Status started = pulls_->Start(pull); !started.ok()) {
      return fmt::format("cannot start pulling image '{}': {}", launch.image, started.message());
    }
  }
  task.awaiting_pull = launch;
  task.status.pulling_image = true;
  task.status.image_pull_progress = fmt::format("pulling image '{}'", launch.image);
  // The pull ends with the agent's lease, as the container would.
  task.status.enforces_lease = true;
  return std::nullopt;
}

void PodmanRunner::TendPulls(MonoTime now) {
  std::map<std::string, TaskStatus, std::less<>> pulls;
  for (TaskStatus& pull : pulls_->Poll()) {
    pulls.emplace(pull.task_id, std::move(pull));
  }
  for (auto& [task_id, task] : tasks_) {
    if (!task.awaiting_pull.has_value()) {
      continue;
    }
    const auto pull = pulls.find(task_id);
    const std::string log = PullLogPath(task_id);
    if (pull != pulls.end() && !IsFinal(pull->second.state)) {
      if (now - pull->second.start_time >= options_.pull_timeout && !task.pull_timed_out) {
        task.pull_timed_out = pulls_->Stop(task_id, Duration(0)).ok();
      }
      if (std::string line = os::LastLine(ReadFrom(log, 0)); !line.empty()) {
        task.status.image_pull_progress = line.substr(0, kMaxReasonBytes);
      }
      continue;
    }
    const TaskLaunch launch = std::move(*task.awaiting_pull);
    task.awaiting_pull.reset();
    task.status.pulling_image = false;
    task.status.image_pull_progress.clear();
    std::optional<std::string> failure;
    if (pull == pulls.end()) {
      failure = fmt::format("the pull of image '{}' is gone", launch.image);
    } else {
      task.status.image_pull_time = pull->second.end_time.value_or(now) - pull->second.start_time;
      os::CommandOutcome outcome;
      outcome.exit_code = pull->second.state == TaskState::kExited ? pull->second.exit_code : -1;
      outcome.errors = ReadFrom(log, 0);
      if (task.status.stop_requested) {
        failure = fmt::format("stopped while its image '{}' was being pulled", launch.image);
      } else if (task.pull_timed_out) {
        failure = fmt::format(
            "cannot pull image '{}': podman did not finish within {}s", launch.image,
            std::chrono::duration_cast<std::chrono::seconds>(options_.pull_timeout).count());
      } else if (outcome.exit_code != 0) {
        failure = Reason(fmt::format("cannot pull image '{}'", launch.image), outcome);
      }
      [[maybe_unused]] const Status forgotten = pulls_->Forget(task_id);
    }
    unlink(log.c_str());
    if (failure.has_value()) {
      task.status.state = TaskState::kFailedToStart;
      task.status.reason = std::move(*failure);
      task.status.end_time = now;
      task.status.enforces_lease = false;
      continue;
    }
    LaunchContainer(task, launch);
  }
  // Pulls that no task took over (theirs is no longer wanted) are forgotten once they end.
  for (const auto& [task_id, pull] : pulls) {
    const auto task = tasks_.find(task_id);
    if (IsFinal(pull.state) && (task == tasks_.end() || !task->second.awaiting_pull.has_value())) {
      if (pulls_->Forget(task_id).ok()) {
        unlink(PullLogPath(task_id).c_str());
      }
    }
  }
}

Result<std::vector<std::string>> PodmanRunner::RunArguments(const TaskLaunch& launch,
                                                            const std::string& name,
                                                            MonoTime start_time,
                                                            std::string& env_text) const {
  // The environment reaches podman on a pipe that it reads as /dev/stdin: no value appears on a
  // command line or a disk. podman's --env-file takes one NAME=VALUE a line.
  env_text.clear();
  for (const std::string& entry : TaskEnvironment(launch, options_.run_as)) {
    if (entry.find('\n') != std::string::npos) {
      return FailedPreconditionError(fmt::format(
          "environment variable {} holds a newline, which podman's --env-file cannot carry",
          entry.substr(0, entry.find('='))));
    }
    env_text += entry + "\n";
  }
  std::vector<std::string> args = {"run",    "--detach",     "--replace",   "--name", name,
                                   "--init", "--log-driver", "passthrough", "--pull", "never"};
  if (!options_.oci_runtime.empty()) {
    args.insert(args.end(), {"--runtime", options_.oci_runtime});
  }
  args.insert(args.end(), {"--label", fmt::format("{}={}", kRunnerLabel, options_.instance),
                           "--label", fmt::format("{}={}", kTaskIdLabel, launch.task_id), "--label",
                           fmt::format("{}={}", kGpusLabel, fmt::join(launch.gpu_uuids, ",")),
                           "--label", fmt::format("{}={}", kStartLabel, start_time.nanos)});
  args.insert(args.end(), {"--network", launch.host_network ? "host" : "none"});
  for (const std::string& uuid : launch.gpu_uuids) {
    args.insert(args.end(), {"--device", "nvidia.com/gpu=" + uuid});
  }
  if (launch.mps.has_value()) {
    // An MPS client reaches its daemon through the pipe directory and shares memory with the MPS
    // server, which needs the host's IPC namespace (NVIDIA's MPS documentation, containers).
    const std::string& pipes = launch.mps->pipe_directory;
    args.insert(args.end(), {"--volume", fmt::format("{}:{}", pipes, pipes), "--ipc", "host"});
  }
  if (launch.cpu_milli > 0) {
    args.insert(args.end(), {"--cpus", FormatCpus(launch.cpu_milli)});
  }
  if (launch.memory_mib > 0) {
    args.insert(args.end(), {"--memory", fmt::format("{}m", launch.memory_mib)});
  }
  if (options_.run_as.has_value()) {
    args.insert(args.end(),
                {"--user", fmt::format("{}:{}", options_.run_as->uid, options_.run_as->gid)});
  }
  if (!launch.working_dir.empty()) {
    args.insert(args.end(), {"--workdir", launch.working_dir});
  }
  args.insert(args.end(), {"--env-file", "/dev/stdin"});
  // podman reads no flag after the image, and a valid image cannot start with '-'
  // (ValidateImageReference): nothing of the launch can pass for a podman flag.
  args.push_back(launch.image);
  args.insert(args.end(), launch.argv.begin(), launch.argv.end());
  return args;
}

Status PodmanRunner::Start(const TaskLaunch& launch) {
  if (launch.image.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    GPUFLEET_RETURN_IF_ERROR(internal::CheckNewTask(tasks_, launch.task_id));
    return processes_->Start(launch);
  }
  GPUFLEET_RETURN_IF_ERROR(ValidateLaunch(launch));
  if (launch.log_path.empty()) {
    return InvalidArgumentError(fmt::format("task '{}' has no log_path", launch.task_id));
  }
  std::lock_guard<std::mutex> lock(mu_);
  GPUFLEET_RETURN_IF_ERROR(internal::CheckNewTask(tasks_, launch.task_id));
  // The id must be new to the process runner too.
  internal::TaskTable<TaskStatus> processes;
  for (TaskStatus& process : processes_->Poll()) {
    processes.emplace(process.task_id, std::move(process));
  }
  GPUFLEET_RETURN_IF_ERROR(internal::CheckNewTask(processes, launch.task_id));
  if (const os::UniqueFd log(open(launch.log_path.c_str(),
                                  O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0600));
      log.get() < 0) {
    return InvalidArgumentError(
        fmt::format("log_path '{}' of task '{}' cannot be opened for appending: {}",
                    launch.log_path, launch.task_id, ErrnoText(errno)));
  }
  Task task;
  task.container = ContainerName(launch.task_id);
  task.status.task_id = launch.task_id;
  task.status.gpu_uuids = launch.gpu_uuids;
  task.status.start_time = clock_.Now();
  // IfNotPresent and Never find a missing image when the fence's `podman run` fails on it.
  std::optional<std::string> failure;
  if (launch.image_pull_policy == ImagePullPolicy::kAlways) {
    failure = StartPull(task, launch);
  } else {
    LaunchContainer(task, launch);
  }
  if (failure.has_value()) {
    task.status.state = TaskState::kFailedToStart;
    task.status.reason = std::move(*failure);
    task.status.end_time = clock_.Now();
  }
  tasks_.emplace(launch.task_id, std::move(task));
  return Status::Ok();
}

void PodmanRunner::LaunchContainer(Task& task, const TaskLaunch& launch) {
  struct stat log_info = {};
  task.log_offset = stat(launch.log_path.c_str(), &log_info) == 0 ? log_info.st_size : 0;
  // A started file of an earlier start of the task would read as this one's.
  unlink(StartedPath(task.status.task_id).c_str());
  Status fenced = fences_->Forget(task.status.task_id);  // an earlier start's, ended
  if (fenced.code() == StatusCode::kNotFound) {
    fenced = Status::Ok();
  }
  if (fenced.ok()) {
    fenced = StartFence(task, &launch);
  }
  if (!fenced.ok()) {
    // No podman ran: there is no container to remove.
    task.status.state = TaskState::kFailedToStart;
    // kFailedPrecondition: the launch cannot be made into `podman run` (RunArguments).
    task.status.reason =
        fenced.code() == StatusCode::kFailedPrecondition
            ? fenced.message()
            : fmt::format("cannot start its container's fence: {}", fenced.message());
    task.status.end_time = clock_.Now();
    task.status.enforces_lease = false;
    return;
  }
  task.launch = launch;
  task.status.starting_container = true;
  task.status.enforces_lease = true;
}

std::string PodmanRunner::StartedPath(std::string_view task_id) const {
  return fmt::format("{}/{}.started", options_.fence_dir, ContainerName(task_id));
}

std::string PodmanRunner::StartedDigest(std::string_view task_id) const {
  std::string digest = os::LastLine(ReadFrom(StartedPath(task_id), 0));
  return digest.starts_with("sha256:") ? digest : "";
}

bool PodmanRunner::NoteStarted(Task& task, MonoTime now) {
  if (access(StartedPath(task.status.task_id).c_str(), F_OK) != 0) {
    return false;
  }
  task.status.image_digest = StartedDigest(task.status.task_id);
  task.status.starting_container = false;
  task.launch.reset();
  task.listable_from = NextListingNumber();
  SendPendingSignal(task, now);
  return true;
}

void PodmanRunner::SendPendingSignal(Task& task, MonoTime now) {
  if (!task.signal_pending) {
    return;
  }
  task.signal_pending = false;
  task.kill_deadline = now + task.pending_grace;
  Signal(task, task.pending_grace <= Duration::zero() ? "KILL" : "TERM");
}

void PodmanRunner::TendStarts(const std::map<std::string, TaskStatus, std::less<>>& fences,
                              MonoTime now) {
  for (auto& [task_id, task] : tasks_) {
    if (!task.status.starting_container || NoteStarted(task, now)) {
      continue;
    }
    const auto fence = fences.find(task_id);
    if (fence != fences.end() && !IsFinal(fence->second.state)) {
      continue;  // podman still makes the container
    }
    // The fence ended before it wrote the started file: look again, it may have written it
    // since the fences were polled.
    if (NoteStarted(task, now)) {
      continue;
    }
    const int code = fence != fences.end() && fence->second.state == TaskState::kExited
                         ? fence->second.exit_code
                         : -1;
    std::optional<TaskLaunch> launch = std::move(task.launch);
    task.launch.reset();
    task.status.starting_container = false;
    const std::string log = launch.has_value() ? launch->log_path : "";
    if (code == kImageMissingExitCode && launch.has_value() &&
        launch->image_pull_policy == ImagePullPolicy::kIfNotPresent &&
        !task.status.stop_requested) {
      // podman's complaint about the missing image is no part of the task's log.
      [[maybe_unused]] const int truncated = truncate(log.c_str(), task.log_offset);
      [[maybe_unused]] const Status forgotten = fences_->Forget(task_id);
      if (std::optional<std::string> failure = StartPull(task, *launch)) {
        task.status.state = TaskState::kFailedToStart;
        task.status.reason = std::move(*failure);
        task.status.end_time = now;
        task.status.enforces_lease = false;
      }
      continue;
    }
    if (code == kImageMissingExitCode || code == kRunFailedExitCode) {
      // The fence removed what podman made of the container: nothing of the task ran.
      task.status.state = TaskState::kFailedToStart;
      task.status.end_time = now;
      task.status.enforces_lease = false;
      if (code == kImageMissingExitCode && launch.has_value() &&
          launch->image_pull_policy == ImagePullPolicy::kNever) {
        task.status.reason = fmt::format(
            "image '{}' is not on this node and its imagePullPolicy is Never", launch->image);
        [[maybe_unused]] const int truncated = truncate(log.c_str(), task.log_offset);
      } else {
        os::CommandOutcome failure;
        failure.exit_code = code;
        failure.errors = log.empty() ? "" : ReadFrom(log, task.log_offset);
        task.status.reason = Reason("podman run failed", failure);
      }
      continue;
    }
    // Fenced, killed or otherwise ended half-way: the container may be there. A listing from
    // now on says whether it is (and runs) or is gone.
    task.listable_from = NextListingNumber();
    SendPendingSignal(task, now);
  }
}

std::string PodmanRunner::ImageDigestOf(const std::string& container) const {
  const Result<os::CommandOutcome> inspected =
      Podman({"container", "inspect", "--format", "{{.ImageDigest}}", container},
             options_.command_timeout);
  if (!inspected.ok() || inspected->exit_code != 0) {
    return "";
  }
  std::string digest = inspected->output;
  while (!digest.empty() && (digest.back() == '\n' || digest.back() == ' ')) {
    digest.pop_back();
  }
  return digest.starts_with("sha256:") ? digest : "";
}

void PodmanRunner::Finish(Task& task, const ContainerState* container, MonoTime now) {
  task.status.end_time = now;
  if (container == nullptr) {
    task.status.state = TaskState::kLost;
    task.status.reason = fmt::format("its container '{}' is gone", task.container);
    return;
  }
  const int code = container->exit_code;
  const bool signalled =
      (task.sigkill_sent && code == 128 + SIGKILL) || (task.sigterm_sent && code == 128 + SIGTERM);
  if (signalled) {
    task.status.state = TaskState::kKilled;
    task.status.signal = code - 128;
    return;
  }
  task.status.state = TaskState::kExited;
  task.status.exit_code = code;
}

void PodmanRunner::Signal(Task& task, std::string_view signal_name) {
  (signal_name == "KILL" ? task.sigkill_sent : task.sigterm_sent) = true;
  QueueSignal(task.container, signal_name);
}

void PodmanRunner::QueueSignal(const std::string& container, std::string_view signal_name) {
  {
    std::lock_guard<std::mutex> lock(list_mu_);
    signals_.push_back({container, std::string(signal_name)});
  }
  list_cv_.notify_all();
}

Status PodmanRunner::SendNotice(std::string_view task_id, std::string_view signal_name) {
  if (!IsContainerTask(task_id)) {
    return processes_->SendNotice(task_id, signal_name);
  }
  GPUFLEET_RETURN_IF_ERROR(internal::NoticeSignal(task_id, signal_name).status());
  std::lock_guard<std::mutex> lock(mu_);
  GPUFLEET_ASSIGN_OR_RETURN(const auto it, internal::FindTask(tasks_, task_id));
  Task& task = it->second;
  if (IsFinal(task.status.state) || task.awaiting_pull.has_value() ||
      (task.status.starting_container && !NoteStarted(task, clock_.Now()))) {
    return Status::Ok();  // no container runs to take it
  }
  // podman's names are the signal's without "SIG", as the stops' are.
  QueueSignal(task.container, signal_name.starts_with("SIG") ? signal_name.substr(3) : signal_name);
  task.status.notices.emplace_back(signal_name);
  return Status::Ok();
}

bool PodmanRunner::IsContainerTask(std::string_view task_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.contains(task_id);
}

Status PodmanRunner::Stop(std::string_view task_id, Duration grace) {
  if (!IsContainerTask(task_id)) {
    return processes_->Stop(task_id, grace);
  }
  GPUFLEET_RETURN_IF_ERROR(internal::CheckStopGrace(task_id, grace));
  std::lock_guard<std::mutex> lock(mu_);
  GPUFLEET_ASSIGN_OR_RETURN(const auto it, internal::FindTask(tasks_, task_id));
  Task& task = it->second;
  if (IsFinal(task.status.state)) {
    return Status::Ok();
  }
  if (task.awaiting_pull.has_value()) {
    // Nothing of the task runs yet: the pull ends now, and the task with it (TendPulls).
    task.status.stop_requested = true;
    return pulls_->Stop(task.status.task_id, Duration(0));
  }
  const internal::DueSignal due = internal::RecordStop(task, clock_.Now(), grace);
  if (task.status.starting_container && !NoteStarted(task, clock_.Now())) {
    // No container to signal yet: it gets SIGTERM once it has started, and the whole grace from
    // then on (TendStarts), as if the stop had come then.
    if (!task.signal_pending || grace < task.pending_grace) {
      task.pending_grace = grace;
    }
    task.signal_pending = true;
    return Status::Ok();
  }
  switch (due) {
    case internal::DueSignal::kKill:
      Signal(task, "KILL");
      break;
    case internal::DueSignal::kTerm:
      Signal(task, "TERM");
      break;
    case internal::DueSignal::kNone:
      break;
  }
  return Status::Ok();
}

std::vector<TaskStatus> PodmanRunner::Poll() {
  std::vector<TaskStatus> statuses = processes_->Poll();
  std::lock_guard<std::mutex> lock(mu_);
  TendPulls(clock_.Now());
  std::map<std::string, TaskStatus, std::less<>> fences;
  for (TaskStatus& fence : fences_->Poll()) {
    fences.emplace(fence.task_id, std::move(fence));
  }
  TendStarts(fences, clock_.Now());
  TendFences(fences);
  const bool any_running = std::any_of(tasks_.begin(), tasks_.end(), [](const auto& entry) {
    return !IsFinal(entry.second.status.state) && !entry.second.awaiting_pull.has_value() &&
           !entry.second.status.starting_container;
  });
  const MonoTime now = clock_.Now();
  const std::shared_ptr<const Listing> listing =
      any_running ? RequestListing(now) : std::shared_ptr<const Listing>();
  std::set<std::string> failed_kills;
  {
    std::lock_guard<std::mutex> list_lock(list_mu_);
    failed_kills.swap(failed_kills_);
  }
  // Poll cannot return an error: without podman's answer the tasks keep their last state.
  std::vector<TaskStatus> container_statuses = internal::UpdatedStatuses(tasks_, [&](Task& task) {
    if (IsFinal(task.status.state) || task.awaiting_pull.has_value() ||
        task.status.starting_container) {
      return;
    }
    // A SIGKILL podman could not send is sent again (a container that has exited meanwhile
    // ends the task at the next listing).
    if (failed_kills.contains(task.container)) {
      task.sigkill_sent = false;
    }
    if (task.kill_deadline.has_value() && now >= *task.kill_deadline && !task.sigkill_sent) {
      Signal(task, "KILL");
    }
    // A listing that began before the container was known to be there says nothing of it.
    if (listing == nullptr || listing->number < task.listable_from) {
      return;
    }
    const auto it = listing->containers.find(task.container);
    if (it == listing->containers.end() || !it->second.running) {
      Finish(task, it == listing->containers.end() ? nullptr : &it->second, now);
    } else if (it->second.never_started) {
      // Its fence's `podman run` has returned (or the fence is gone), so nothing will start it:
      // a run cut short, by a lease that ran out, after podman made the container.
      Finish(task, nullptr, now);
      task.status.reason =
          fmt::format("its container '{}' was made but never started", task.container);
    }
  });
  statuses.insert(statuses.end(), std::make_move_iterator(container_statuses.begin()),
                  std::make_move_iterator(container_statuses.end()));
  std::sort(statuses.begin(), statuses.end(),
            [](const TaskStatus& a, const TaskStatus& b) { return a.task_id < b.task_id; });
  return statuses;
}

Status PodmanRunner::Forget(std::string_view task_id) {
  if (!IsContainerTask(task_id)) {
    return processes_->Forget(task_id);
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Poll brings container tasks up to date; Forget trusts the last one.
  GPUFLEET_ASSIGN_OR_RETURN(const auto it,
                            internal::FindEndedTask(tasks_, task_id, [](const Task&) {}));
  if (it->second.status.state != TaskState::kFailedToStart) {
    std::lock_guard<std::mutex> list_lock(list_mu_);
    removals_.push_back(it->second.container);
    list_cv_.notify_all();
  }
  unlink(StartedPath(task_id).c_str());
  tasks_.erase(it);
  return Status::Ok();
}

Status PodmanRunner::RenewLease(Duration fence_in, Duration grace) {
  GPUFLEET_RETURN_IF_ERROR(fences_->RenewLease(fence_in, grace));
  GPUFLEET_RETURN_IF_ERROR(pulls_->RenewLease(fence_in, grace));
  return processes_->RenewLease(fence_in, grace);
}

namespace {

// The fence of container $1. Its other arguments: $2 the lease file, $3 the started file, $4 the
// image, $5 the seconds `podman run` may take, $6 the number N of words of the podman command
// line that follow from $7, then `podman run`'s arguments (none: the container is there). It
// makes the container (its environment from $GPUFLEET_CONTAINER_ENV on podman's stdin), writes
// the image digest it runs to the started file, and waits for it. On SIGTERM (its shim's, when
// the lease has run out) it sends the container SIGTERM, waits for it until shortly before the
// lease's grace ends, sends SIGKILL, and removes a container made but never started. The shell
// runs the trap once the command in the foreground has returned, so a `podman run` under way
// when the lease runs out finishes first and its container is fenced too. P and R hold
// references to the arguments ("${7}"), never their values: eval quotes nothing of the task.
constexpr char kFenceScript[] = R"sh(c=$1 lease=$2 started=$3 image=$4 run_s=$5 n=$6
P= R= i=7
while [ "$i" -le $# ]; do
  if [ "$i" -lt $((7 + n)) ]; then P="$P \"\${$i}\""; else R="$R \"\${$i}\""; fi
  i=$((i + 1))
done
fence() {
  trap '' TERM
  eval "$P kill --signal TERM \"\$c\"" >/dev/null 2>&1
  grace=0
  if [ -r "$lease" ]; then read -r deadline grace < "$lease"; fi
  ms=$((grace / 1000000))
  margin=2000
  if [ "$ms" -lt 4000 ]; then margin=$((ms / 2)); fi
  ms=$((ms - margin))
  t=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
  eval "timeout \"\$t\" $P wait \"\$c\"" >/dev/null 2>&1
  eval "$P kill --signal KILL \"\$c\"" >/dev/null 2>&1
  case $(eval "$P container inspect --format '{{.State.Status}}' \"\$c\"" 2>/dev/null) in
    created | configured | initialized) eval "$P rm --force \"\$c\"" >/dev/null 2>&1 ;;
  esac
  exit 0
}
trap 'fence "$@"' TERM
if [ -n "$R" ]; then
  env_text=$GPUFLEET_CONTAINER_ENV
  unset GPUFLEET_CONTAINER_ENV
  printf '%s' "$env_text" | eval "timeout --foreground -k 5 \"\$run_s\" $P $R"
  if [ $? -ne 0 ]; then
    code=101
    eval "$P image exists \"\$image\"" >/dev/null 2>&1 || code=100
    eval "$P rm --force --ignore \"\$c\"" >/dev/null 2>&1 || code=102
    exit "$code"
  fi
  eval "$P container inspect --format '{{.ImageDigest}}' \"\$c\"" >"$started.part" 2>/dev/null
  mv -f "$started.part" "$started"
fi
eval "$P wait \"\$c\"" >/dev/null 2>&1 &
wait $!
exit 0
)sh";

}  // namespace

Status PodmanRunner::StartFence(const Task& task, const TaskLaunch* launch) {
  const std::vector<std::string> podman = PodmanCommand();
  std::vector<std::string> argv = {
      "/bin/sh",
      "-c",
      kFenceScript,
      "gpufleet-fence",
      task.container,
      fences_->lease_path(),
      StartedPath(task.status.task_id),
      launch != nullptr ? launch->image : "",
      fmt::format(
          "{}",
          std::max<int64_t>(
              1,
              std::chrono::duration_cast<std::chrono::seconds>(options_.command_timeout).count())),
      fmt::format("{}", podman.size())};
  argv.insert(argv.end(), podman.begin(), podman.end());
  std::string env_text;
  std::string log_path = "/dev/null";
  if (launch != nullptr) {
    GPUFLEET_ASSIGN_OR_RETURN(
        const std::vector<std::string> run,
        RunArguments(*launch, task.container, task.status.start_time, env_text));
    argv.insert(argv.end(), run.begin(), run.end());
    log_path = launch->log_path;
  }
  TaskLaunch fence = OwnProcessTask(task.status.task_id, std::move(argv), std::move(log_path));
  fence.gpu_uuids = task.status.gpu_uuids;
  if (launch != nullptr) {
    fence.env[kContainerEnvVariable] = std::move(env_text);
  }
  return fences_->Start(fence);
}

TaskLaunch PodmanRunner::OwnProcessTask(std::string_view task_id, std::vector<std::string> argv,
                                        std::string log_path) const {
  TaskLaunch launch;
  launch.task_id = std::string(task_id);
  launch.argv = std::move(argv);
  for (const std::string& entry : PodmanEnvironment()) {
    const size_t equals = entry.find('=');
    launch.env.emplace(entry.substr(0, equals), entry.substr(equals + 1));
  }
  launch.log_path = std::move(log_path);
  return launch;
}

void PodmanRunner::TendFences(const std::map<std::string, TaskStatus, std::less<>>& fences) {
  for (const auto& [task_id, fence] : fences) {
    const auto task = tasks_.find(task_id);
    const bool container_running = task != tasks_.end() && !IsFinal(task->second.status.state);
    if (IsFinal(fence.state) && !container_running) {
      if (fences_->Forget(task_id).ok()) {
        unlink(StartedPath(task_id).c_str());
      }
    }
  }
  for (auto& [task_id, task] : tasks_) {
    if (IsFinal(task.status.state) || task.awaiting_pull.has_value() ||
        task.status.starting_container) {
      continue;  // no container yet, or its fence is making it
    }
    const auto fence = fences.find(task_id);
    if (fence != fences.end() && !IsFinal(fence->second.state)) {
      task.status.enforces_lease = true;
      continue;
    }
    const bool restartable = fence == fences.end() || fences_->Forget(task_id).ok();
    task.status.enforces_lease = restartable && StartFence(task, nullptr).ok();
  }
}

}  // namespace gpufleet::runner
