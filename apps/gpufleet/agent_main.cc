// SPDX-License-Identifier: Apache-2.0
// `gpufleet agent`: the node agent (docs/agent.md). Samples the GPUs (NVML, or a simulation),
// serves dcgm-exporter-compatible /metrics, registers the node, heartbeats, and runs the tasks
// the server places on it.
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
#include <vector>

#include <fmt/format.h>

#include "gpufleet/agent/agent_loop.h"
#include "gpufleet/agent/cuda_exercise.h"
#include "gpufleet/agent/diagnostics.h"
#include "gpufleet/agent/image_mirror.h"
#include "gpufleet/agent/link_health.h"
#include "gpufleet/agent/node_agent.h"
#include "gpufleet/agent/nvml_probe.h"
#include "gpufleet/agent/simulated_node.h"
#include "gpufleet/agent/simulated_probe.h"
#include "gpufleet/agent/slurm_health.h"
#include "gpufleet/agent/telemetry.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/http/client.h"
#include "gpufleet/runner/podman_runner.h"
#include "gpufleet/runner/process_runner.h"
#include "gpufleet/runner/simulated_runner.h"

#include "config_file.h"
#include "flags.h"
#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct AgentFlags {
  std::string server;
  std::string token_file;
  std::string ca_cert;
  std::string node_name;
  std::string topology;  // "block=block-0,leaf=leaf-3"
  std::string labels;
  std::string fault_domains;
  std::string backend = "nvml";
  std::string nvml_library = agent::NvmlProbe::kDefaultLibrary;
  std::string gpu_model = "H100-80GB";
  int simulated_gpus = 8;
  std::string runner = "process";
  std::string podman = "podman";
  std::string podman_runtime = "runc";
  std::vector<std::string> podman_insecure_registries;
  std::string image_mirror_listen;  // empty: no image mirror
  std::string image_mirror_advertise;
  std::vector<std::string> image_mirror_peers;
  std::vector<std::string> image_mirror_registries;
  int64_t image_mirror_cache_gib = 64;
  std::string state_dir = "gpufleet-agent";
  std::string gpu_sharing;
  std::string mps_control = "nvidia-cuda-mps-control";
  std::string metrics_listen = "0.0.0.0:9400";
  bool metrics_job_labels = false;
  int64_t sample_interval_ms = 1000;
  std::string sysfs_root = "/sys";
  double link_rate_gbps = 0;
  int gpus_per_nvlink_domain = 0;
  int64_t stop_grace_s = 30;
  std::string run_as;  // empty: a user per run when the agent is root, else the agent's own user
  std::string task_uid_range;  // empty: runner::kDefaultTaskUidRange
  std::vector<std::string> task_groups;
  bool no_cgroups = false;
  bool once = false;
  bool slurm_health = false;
  std::string slurm_node;  // empty: SLURMD_NODENAME, else the short host name
  std::string scontrol = "scontrol";
  // Active diagnostics (docs/reliability.md): the site's command, run by /bin/sh, with
  // {gpu_index}, {gpu_uuid} and {pci_bus_id}; the CUDA driver of the built-in exercise.
  std::string diagnostic_command;
  int64_t diagnostic_timeout_s = 900;
  std::string cuda_library = agent::CudaExercise::kDefaultLibrary;
  bool no_diagnostics = false;
};

// The node's image mirror from the --image-mirror-* flags (docs/containers.md), its cache in
// STATE_DIR/image-mirror.
Result<std::unique_ptr<agent::ImageMirror>> StartImageMirror(const AgentFlags& flags) {
  GPUFLEET_ASSIGN_OR_RETURN(auto listen,
                            ParseHostPort(flags.image_mirror_listen, "--image-mirror-listen"));
  if (flags.image_mirror_registries.empty()) {
    return InvalidArgumentError("--image-mirror-registry: at least one registry to mirror");
  }
  if (listen.first == "0.0.0.0" && flags.image_mirror_advertise.empty()) {
    return InvalidArgumentError(
        "--image-mirror-advertise: required when --image-mirror-listen is 0.0.0.0 (peers need "
        "this node's address)");
  }
  agent::ImageMirrorOptions options;
  options.host = listen.first;
  options.port = listen.second;
  options.self = flags.image_mirror_advertise;
  options.peers = flags.image_mirror_peers;
  options.registries = flags.image_mirror_registries;
  options.insecure_registries = flags.podman_insecure_registries;
  options.cache_dir = (std::filesystem::path(flags.state_dir) / "image-mirror").string();
  options.cache_bytes = flags.image_mirror_cache_gib << 30;
  return agent::ImageMirror::Start(std::move(options));
}

// The process runner's containment from the flags: a user of its own for each run (the task
// sandbox, when the agent is root) or the --run-as user (root only when asked for by name), and a
// cgroup per task where the node offers them.
Result<runner::ProcessRunnerOptions> ContainmentOptions(const AgentFlags& flags) {
  runner::ProcessRunnerOptions options;
  const bool root = geteuid() == 0;
  if (!flags.run_as.empty()) {
    if (!root) {
      return InvalidArgumentError(fmt::format(
          "--run-as {}: the agent must run as root to run tasks as another user", flags.run_as));
    }
    if (!flags.task_uid_range.empty() || !flags.task_groups.empty()) {
      return InvalidArgumentError(fmt::format(
          "--run-as {}: every task runs as that user, so --task-uid-range and --task-group (a "
          "user per run) do not apply; give one or the other",
          flags.run_as));
    }
    GPUFLEET_ASSIGN_OR_RETURN(options.run_as, runner::LookUpUser(flags.run_as));
  } else if (root) {
    runner::TaskSandboxOptions sandbox;
    if (!flags.task_uid_range.empty()) {
      GPUFLEET_ASSIGN_OR_RETURN(sandbox.uids, runner::ParseTaskUidRange(flags.task_uid_range));
    }
    for (const std::string& group : flags.task_groups) {
      GPUFLEET_ASSIGN_OR_RETURN(const gid_t gid, runner::LookUpGroup(group));
      sandbox.groups.push_back(gid);
    }
    sandbox.runs_dir = (std::filesystem::path(flags.state_dir) / "runs").string();
    options.sandbox = std::move(sandbox);
  } else if (!flags.task_uid_range.empty() || !flags.task_groups.empty()) {
    return InvalidArgumentError(fmt::format(
        "{}: the agent must run as root to run tasks as users of their own (it runs them as "
        "itself)",
        !flags.task_uid_range.empty() ? "--task-uid-range " + flags.task_uid_range
                                      : "--task-group " + flags.task_groups.front()));
  }
  if (!flags.no_cgroups) {
    Result<runner::TaskCgroups> cgroups = runner::TaskCgroups::Detect();
    if (cgroups.ok()) {
      options.cgroups = std::move(cgroups).value();
    } else {
      fmt::print(stderr,
                 "gpufleet agent: warning: tasks run without cgroups (no CPU or memory limits, a "
                 "daemonized child can outlive its task): {}\n",
                 cgroups.status().message());
    }
  }
  return options;
}

int FailAgent(const Status& status) {
  fmt::print(stderr, "gpufleet agent: {}\n", status.ToString());
  return 1;
}

// "k=v,k=v" -> ordered pairs; `flag` names the flag in errors.
Result<std::vector<std::pair<std::string, std::string>>> ParsePairs(const std::string& text,
                                                                    std::string_view flag) {
  std::vector<std::pair<std::string, std::string>> out;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    const size_t equals = item.find('=');
    if (equals == std::string::npos || equals == 0) {
      return InvalidArgumentError(fmt::format("{}: \"{}\" (want KEY=VALUE)", flag, item));
    }
    out.emplace_back(item.substr(0, equals), item.substr(equals + 1));
  }
  return out;
}

std::string Hostname() {
  std::string name(256, '\0');
  if (gethostname(name.data(), name.size()) != 0) {
    return "localhost";
  }
  name.resize(name.find('\0'));
  return name;
}

// The host's CPU and memory, for the node's capacity.
HostResources HostCapacity() {
  HostResources capacity;
  capacity.cpu_milli = std::max<int64_t>(1, sysconf(_SC_NPROCESSORS_ONLN)) * 1000;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    int64_t kib = 0;
    meminfo >> kib;
    if (key == "MemTotal:") {
      capacity.memory_mib = kib / 1024;
      break;
    }
    meminfo.ignore(256, '\n');
  }
  return capacity;
}

// `--once --slurm-health`: one health check as Slurm's HealthCheckProgram (docs/slurm.md). Exit 0
// when the node is as it should be (drained, resumed or left alone); 1 when scontrol failed.
int RunSlurmHealth(const AgentFlags& flags) {
  std::string node = flags.slurm_node;
  if (node.empty()) {
    // slurmd gives its health check the name it runs as (several slurmd may share a host).
    const char* slurmd_name = std::getenv("SLURMD_NODENAME");
    node = slurmd_name != nullptr && *slurmd_name != '\0' ? std::string(slurmd_name) : Hostname();
    node = node.substr(0, node.find('.'));
  }
  SystemClock clock;
  const GpuCatalog catalog = GpuCatalog::Default();
  std::unique_ptr<agent::GpuProbe> probe;
  Status probe_error;
  if (flags.backend == "nvml") {
    Result<std::unique_ptr<agent::NvmlProbe>> nvml =
        agent::NvmlProbe::Open({.library_path = flags.nvml_library, .catalog = &catalog});
    if (nvml.ok()) {
      probe = std::move(nvml).value();
    } else {
      probe_error = nvml.status();
    }
  } else {
    Result<std::unique_ptr<agent::SimulatedProbe>> simulated = agent::SimulatedProbe::Create(
        clock, catalog, {.model = flags.gpu_model, .gpu_count = flags.simulated_gpus, .seed = 1});
    if (!simulated.ok()) {
      return FailAgent(simulated.status());
    }
    probe = std::move(simulated).value();
  }
  std::unique_ptr<agent::SlurmControl> slurm = agent::NewScontrol(flags.scontrol, clock);
  Result<agent::SlurmHealthOutcome> outcome =
      agent::RunSlurmHealthCheck(probe.get(), probe_error, *slurm, node);
  if (!outcome.ok()) {
    return FailAgent(outcome.status());
  }
  for (const agent::GpuHealthReport& gpu : outcome->gpus) {
    if (!gpu.findings.empty()) {
      fmt::print("gpu {}: {}\n", gpu.gpu_index, gpu.Summary());
    }
  }
  fmt::print("gpufleet agent: slurm node {}: {}{}\n", node,
             agent::SlurmHealthActionName(outcome->action),
             outcome->reason.empty() ? "" : fmt::format(" ({})", outcome->reason));
  return 0;
}

int RunAgent(const AgentFlags& flags) {
  if (flags.once != flags.slurm_health) {
    return FailAgent(InvalidArgumentError(
        flags.once ? "--once: only with --slurm-health (one health check for Slurm)"
                   : "--slurm-health: runs once, as Slurm's HealthCheckProgram: add --once"));
  }
  if (flags.slurm_health) {
    return RunSlurmHealth(flags);
  }
  const std::string server = !flags.server.empty() ? flags.server
                             : std::getenv("GPUFLEET_ADDR") != nullptr
                                 ? std::getenv("GPUFLEET_ADDR")
                                 : "http://127.0.0.1:8080";
  std::string token;
  if (!flags.token_file.empty()) {
    Result<std::string> read = ReadSecretFile(flags.token_file, "--token-file");
    if (!read.ok()) {
      return FailAgent(read.status());
    }
    token = *read;
  } else if (const char* env = std::getenv("GPUFLEET_AGENT_TOKEN"); env != nullptr) {
    token = env;
    // Read once: the token leaves the environment, so no child of the agent can inherit it.
    unsetenv("GPUFLEET_AGENT_TOKEN");
  } else {
    return FailAgent(
        InvalidArgumentError("no token: give --token-file or GPUFLEET_AGENT_TOKEN (gpufleet create "
                             "token --role agent)"));
  }
  agent::NodeAgentOptions options;
  options.node_name = flags.node_name.empty() ? Hostname() : flags.node_name;
  options.agent_version = fmt::format("{} (commit {})", BuildVersion(), BuildCommit());
  Result<std::vector<std::pair<std::string, std::string>>> topology =
      ParsePairs(flags.topology, "--topology");
  Result<std::vector<std::pair<std::string, std::string>>> labels =
      ParsePairs(flags.labels, "--labels");
  Result<std::vector<std::pair<std::string, std::string>>> fault_domains =
      ParsePairs(flags.fault_domains, "--fault-domains");
  for (const Status& status : {topology.status(), labels.status(), fault_domains.status()}) {
    if (!status.ok()) {
      return FailAgent(status);
    }
  }
  for (const auto& [level, value] : *topology) {
    options.topology_levels.push_back(level);
    options.topology_values.push_back(value);
  }
  options.labels = {labels->begin(), labels->end()};
  if (!flags.gpu_sharing.empty()) {
    const Result<GpuSharing> sharing = ParseGpuSharing(flags.gpu_sharing);
    if (!sharing.ok()) {
      return FailAgent(InvalidArgumentError("--gpu-sharing: " + sharing.status().message()));
    }
    options.labels[std::string(kGpuSharingLabel)] = flags.gpu_sharing;
  }
  // Absolute: a container client mounts its GPU's pipe directory by this path.
  options.mps.control_program = flags.mps_control;
  options.mps.state_dir =
      std::filesystem::absolute(std::filesystem::path(flags.state_dir) / "mps").string();
  options.fault_domains = {fault_domains->begin(), fault_domains->end()};
  options.capacity = HostCapacity();
  options.gpus_per_nvlink_domain = flags.gpus_per_nvlink_domain;
  options.log_dir = (std::filesystem::path(flags.state_dir) / "logs").string();
  options.stop_grace = std::chrono::seconds(flags.stop_grace_s);
  // The node credential a join token was exchanged for at an earlier registration goes first.
  const std::string node_token_file =
      (std::filesystem::path(flags.state_dir) / "node-token").string();
  if (std::filesystem::exists(node_token_file)) {
    Result<std::string> read = ReadSecretFile(node_token_file, "the node credential");
    if (!read.ok()) {
      return FailAgent(read.status());
    }
    options.node_token = *read;
  }
  std::error_code error;
  std::filesystem::create_directories(options.log_dir, error);
  // The logs are the agent's alone: their names name every team's jobs.
  std::filesystem::permissions(options.log_dir, std::filesystem::perms::owner_all, error);
  if (error) {
    return FailAgent(UnavailableError(fmt::format("--state-dir: cannot create \"{}\" (0700): {}",
                                                  options.log_dir, error.message())));
  }
  // The tasks' checkpoint files (docs/job-spec.md, "Checkpoints"), which the process runner
  // makes: a task reaches its own by the name in its environment but lists nobody's, and only the
  // agent adds or removes files.
  if (flags.runner == "process" || flags.runner == "podman") {
    options.checkpoint_dir = (std::filesystem::path(flags.state_dir) / "checkpoints").string();
    std::filesystem::create_directories(options.checkpoint_dir, error);
    std::filesystem::permissions(options.checkpoint_dir,
                                 std::filesystem::perms::owner_all |
                                     std::filesystem::perms::group_exec |
                                     std::filesystem::perms::others_exec,
                                 error);
    if (error) {
      return FailAgent(UnavailableError(fmt::format("--state-dir: cannot create \"{}\" (0711): {}",
                                                    options.checkpoint_dir, error.message())));
    }
  }

  SystemClock clock;
  const GpuCatalog catalog = GpuCatalog::Default();
  std::unique_ptr<agent::GpuProbe> probe;
  agent::SimulatedProbe* simulated_probe = nullptr;
  if (flags.backend == "nvml") {
    Result<std::unique_ptr<agent::NvmlProbe>> nvml =
        agent::NvmlProbe::Open({.library_path = flags.nvml_library});
    if (!nvml.ok()) {
      return FailAgent(nvml.status());
    }
    probe = std::move(nvml).value();
  } else if (flags.backend == "simulated") {
    Result<std::unique_ptr<agent::SimulatedProbe>> simulated =
        agent::SimulatedProbe::Create(clock, catalog,
                                      {.model = flags.gpu_model,
                                       .gpu_count = flags.simulated_gpus,
                                       .seed = std::hash<std::string>{}(options.node_name)});
    if (!simulated.ok()) {
      return FailAgent(simulated.status());
    }
    simulated_probe = simulated->get();
    probe = std::move(simulated).value();
  } else {
    return FailAgent(InvalidArgumentError(
        fmt::format("--backend: \"{}\" (valid: nvml, simulated)", flags.backend)));
  }
  // Declared before the runner, so that it outlives the pulls that go through it.
  std::unique_ptr<agent::ImageMirror> image_mirror;
  std::unique_ptr<runner::TaskRunner> task_runner;
  if (flags.runner == "process" || flags.runner == "podman") {
    Result<runner::ProcessRunnerOptions> containment = ContainmentOptions(flags);
    if (!containment.ok()) {
      return FailAgent(containment.status());
    }
    fmt::print("gpufleet agent: tasks run as {}, {}\n",
               containment->run_as ? containment->run_as->user
               : containment->sandbox
                   ? fmt::format("a user per run (uids {})",
                                 runner::FormatTaskUidRange(containment->sandbox->uids))
                   : "the agent's user",
               containment->cgroups ? containment->cgroups->Describe() : "without cgroups");
    Result<std::unique_ptr<runner::ProcessRunner>> process =
        runner::ProcessRunner::Open((std::filesystem::path(flags.state_dir) / "tasks").string(),
                                    clock, std::move(containment).value());
    if (!process.ok()) {
      return FailAgent(process.status());
    }
    task_runner = std::move(process).value();
    if (flags.runner == "podman") {
      // Tasks with an image run as containers (docs/containers.md); the process runner keeps the
      // others. A container runs as the image's user unless --run-as names one.
      runner::PodmanRunnerOptions podman;
      podman.podman = flags.podman;
      podman.oci_runtime = flags.podman_runtime;
      podman.instance = options.node_name;
      podman.fence_dir = (std::filesystem::path(flags.state_dir) / "container-fences").string();
      podman.pull_dir = (std::filesystem::path(flags.state_dir) / "image-pulls").string();
      podman.insecure_registries = flags.podman_insecure_registries;
      if (!flags.image_mirror_listen.empty()) {
        Result<std::unique_ptr<agent::ImageMirror>> mirror = StartImageMirror(flags);
        if (!mirror.ok()) {
          return FailAgent(mirror.status());
        }
        image_mirror = std::move(mirror).value();
        podman.registries_conf =
            (std::filesystem::path(flags.state_dir) / "image-mirror" / "registries.conf").string();
        if (const Status written =
                WriteSecretFile(podman.registries_conf, image_mirror->RegistriesConf());
            !written.ok()) {
          return FailAgent(written);
        }
        fmt::print("gpufleet agent: image mirror on port {} as {}, {} peer(s)\n",
                   image_mirror->port(), image_mirror->self(), flags.image_mirror_peers.size());
      }
      if (!flags.run_as.empty()) {
        Result<runner::RunAs> user = runner::LookUpUser(flags.run_as);
        if (!user.ok()) {
          return FailAgent(user.status());
        }
        podman.run_as = std::move(user).value();
      }
      Result<std::unique_ptr<runner::PodmanRunner>> containers =
          runner::PodmanRunner::Open(std::move(podman), std::move(task_runner), clock);
      if (!containers.ok()) {
        return FailAgent(containers.status());
      }
      task_runner = std::move(containers).value();
    }
  } else if (flags.runner == "simulated") {
    task_runner = std::make_unique<runner::SimulatedRunner>(clock);
  } else {
    return FailAgent(InvalidArgumentError(
        fmt::format("--runner: \"{}\" (valid: process, podman, simulated)", flags.runner)));
  }
  std::unique_ptr<agent::LinkMonitor> links;
  if (!flags.sysfs_root.empty()) {
    links = std::make_unique<agent::LinkMonitor>(
        agent::LinkMonitor::Options{.clock = clock,
                                    .sysfs_root = flags.sysfs_root,
                                    .health = {.expected_rate_gbps = flags.link_rate_gbps}});
  }
  Result<std::unique_ptr<agent::TelemetrySampler>> sampler = agent::TelemetrySampler::Create(
      {.probe = *probe,
       .clock = clock,
       .interval = std::chrono::milliseconds(flags.sample_interval_ms),
       .hostname = options.node_name,
       .job_labels = flags.metrics_job_labels,
       .links = links.get()});
  if (!sampler.ok()) {
    return FailAgent(sampler.status());
  }
  Result<std::pair<std::string, int>> metrics =
      ParseHostPort(flags.metrics_listen, "--metrics-listen");
  if (!metrics.ok()) {
    return FailAgent(metrics.status());
  }

  BlockStopSignals();
  Result<int> metrics_port = (*sampler)->Start(metrics->first, metrics->second);
  if (!metrics_port.ok()) {
    return FailAgent(metrics_port.status());
  }
  // Short timeouts bound how long a heartbeat can block the lease check (fence_margin).
  http::ApiClient client(server, token, flags.ca_cert, std::chrono::seconds(5));
  agent::CudaExercise cuda_exercise({.library = flags.cuda_library});
  agent::DiagnosticOptions diagnostic_options{
      .command = flags.diagnostic_command.empty()
                     ? std::vector<std::string>{}
                     : std::vector<std::string>{"/bin/sh", "-c", flags.diagnostic_command},
      .command_timeout = std::chrono::seconds(flags.diagnostic_timeout_s)};
  if (Status valid = diagnostic_options.Validate(); !valid.ok()) {
    return FailAgent(valid);
  }
  // A simulated probe's fault model stands in for the CUDA exercise.
  agent::DiagnosticRunner diagnostics(std::move(diagnostic_options), **sampler,
                                      simulated_probe != nullptr
                                          ? static_cast<agent::DeviceExercise*>(simulated_probe)
                                          : &cuda_exercise,
                                      clock);
  if (!flags.no_diagnostics) {
    options.diagnostics = &diagnostics;
  }
  agent::NodeAgent node_agent(options, **sampler, *probe, *task_runner, client, catalog, clock);
  fmt::print("gpufleet agent: node {} -> {}, metrics on http://{}:{}/metrics\n", options.node_name,
             server, metrics->first, *metrics_port);
  std::fflush(stdout);

  agent::AgentLoop loop(node_agent, clock);
  Duration wait{0};
  while (
      !WaitForStopSignal(std::chrono::duration_cast<std::chrono::milliseconds>(wait)).has_value()) {
    const agent::AgentLoop::Step step = loop.RunOnce();
    wait = step.wait;
    if (step.fenced > 0) {
      fmt::print(stderr, "gpufleet agent: lease expired: stopped {} tasks\n", step.fenced);
    }
    if (!step.called_server) {
      continue;
    }
    if (step.registered_now) {
      fmt::print("gpufleet agent: registered\n");
      std::fflush(stdout);
      if (!node_agent.node_token().empty()) {
        if (Status saved = WriteSecretFile(node_token_file, node_agent.node_token()); !saved.ok()) {
          fmt::print(stderr, "gpufleet agent: {}\n", saved.ToString());
        }
      }
    }
    if (!step.call.ok()) {
      fmt::print(stderr, "gpufleet agent: {} (retrying in {} s)\n", step.call.ToString(),
                 std::chrono::duration_cast<std::chrono::seconds>(step.retry_in).count());
    }
    if (simulated_probe != nullptr) {
      if (Status loads = agent::ApplyTaskLoads(node_agent, *task_runner, *simulated_probe);
          !loads.ok()) {
        fmt::print(stderr, "gpufleet agent: {}\n", loads.ToString());
      }
    }
  }
  fmt::print("gpufleet agent: stopping; tasks keep running and are adopted at the next start\n");
  (*sampler)->Stop();
  return 0;
}

}  // namespace

Action AddAgentCommand(CLI::App& app) {
  auto flags = std::make_shared<AgentFlags>();
  CLI::App* cmd = app.add_subcommand("agent", "run the node agent (docs/agent.md)");
  AddConfigFlags(*cmd);
  cmd->add_option("--server", flags->server,
                  "server address, or several comma-separated (the leader is followed; "
                  "docs/ha.md) (default: GPUFLEET_ADDR, else http://127.0.0.1:8080)");
  cmd->add_option("--token-file", flags->token_file,
                  "file holding an agent token (default: GPUFLEET_AGENT_TOKEN)");
  cmd->add_option("--ca-cert", flags->ca_cert, "PEM CA certificate for an https:// server");
  cmd->add_option("--node-name", flags->node_name, "node name (default: the host name)");
  cmd->add_option("--topology", flags->topology,
                  "the node's domains, outermost first: LEVEL=VALUE,... (e.g. "
                  "block=block-0,leaf=leaf-3)");
  cmd->add_option("--labels", flags->labels, "node labels KEY=VALUE,...");
  cmd->add_option("--fault-domains", flags->fault_domains, "fault domains KIND=VALUE,...");
  cmd->add_option("--backend", flags->backend, "GPU probe: nvml or simulated")
      ->capture_default_str();
  cmd->add_option("--nvml-library", flags->nvml_library, "NVML library to dlopen")
      ->capture_default_str();
  cmd->add_option("--gpu-model", flags->gpu_model, "simulated backend: GPU model")
      ->capture_default_str();
  cmd->add_option("--simulated-gpus", flags->simulated_gpus, "simulated backend: GPU count")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--runner", flags->runner,
                  "task runner: process, podman (tasks with an image run as containers, the "
                  "others as processes) or simulated")
      ->capture_default_str();
  cmd->add_option("--podman", flags->podman, "podman runner: the podman program")
      ->capture_default_str();
  cmd->add_option("--podman-insecure-registry", flags->podman_insecure_registries,
                  "podman runner: HOST:PORT of a registry pulled from over plain HTTP (a local "
                  "registry on loopback); repeatable");
  cmd->add_option("--image-mirror-listen", flags->image_mirror_listen,
                  "podman runner: HOST:PORT of this node's image mirror, a read-only registry "
                  "mirror its podman and its peers pull layers through (docs/containers.md); "
                  "empty: none");
  cmd->add_option("--image-mirror-advertise", flags->image_mirror_advertise,
                  "image mirror: HOST:PORT the peers reach this node's mirror at, as it is in "
                  "their --image-mirror-peer (default: --image-mirror-listen)");
  cmd->add_option("--image-mirror-peer", flags->image_mirror_peers,
                  "image mirror: HOST:PORT of a peer's mirror (the nodes of this leaf); "
                  "repeatable");
  cmd->add_option("--image-mirror-registry", flags->image_mirror_registries,
                  "image mirror: a registry (HOST or HOST:PORT) pulled through the mirror; "
                  "repeatable, at least one");
  cmd->add_option("--image-mirror-cache-gib", flags->image_mirror_cache_gib,
                  "image mirror: the most GiB of layers it keeps")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--podman-runtime", flags->podman_runtime,
                  "podman runner: OCI runtime (runc; crun refuses hybrid cgroup hosts; empty: "
                  "podman's default)")
      ->capture_default_str();
  cmd->add_option("--state-dir", flags->state_dir, "task state files and logs")
      ->capture_default_str();
  cmd->add_option("--gpu-sharing", flags->gpu_sharing,
                  "how this node runs the fractional GPU shares that do not say: time-slicing "
                  "(the default) or mps (docs/sharing.md)");
  cmd->add_option("--mps-control", flags->mps_control,
                  "the NVIDIA MPS control daemon's program, run once per GPU with MPS shares")
      ->capture_default_str();
  cmd->add_option("--metrics-listen", flags->metrics_listen, "HOST:PORT of /metrics")
      ->capture_default_str();
  cmd->add_flag("--metrics-job-labels", flags->metrics_job_labels,
                "label GPU series with the job, task, team and queue on them (/metrics has no "
                "authentication: whoever reaches it sees every team's job names)");
  cmd->add_option("--sample-interval-ms", flags->sample_interval_ms, "GPU sampling interval")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}));
  cmd->add_option("--sysfs-root", flags->sysfs_root,
                  "where the kernel's class/infiniband and class/net trees are read for NIC and "
                  "link health (empty: links not watched)")
      ->capture_default_str();
  cmd->add_option("--link-rate-gbps", flags->link_rate_gbps,
                  "the rate every active RDMA port should run at (0: the node's best port)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--gpus-per-nvlink-domain", flags->gpus_per_nvlink_domain,
                  "GPUs per NVLink domain (0: all GPUs of the node)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--diagnostic-command", flags->diagnostic_command,
                  "the site's GPU diagnostic, run by /bin/sh when the server asks for a command "
                  "diagnostic, "
                  "e.g. \"dcgmi diag -r 2 -i {gpu_index}\" (also {gpu_uuid}, {pci_bus_id}); its "
                  "exit code is the verdict");
  cmd->add_option("--diagnostic-timeout-s", flags->diagnostic_timeout_s,
                  "seconds before the diagnostic command is killed (and fails)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--cuda-library", flags->cuda_library,
                  "CUDA driver library the built-in diagnostic's memory and compute check "
                  "opens (without it the check is unavailable)")
      ->capture_default_str();
  cmd->add_flag("--no-diagnostics", flags->no_diagnostics,
                "run no diagnostics (the server then asks this node for none)");
  cmd->add_option("--stop-grace-s", flags->stop_grace_s, "seconds from SIGTERM to SIGKILL")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--run-as", flags->run_as,
                  "one user every task runs as (process runner; weaker than the default: the "
                  "tasks of all teams share it; tasks run as root only with --run-as root)");
  cmd->add_option("--task-uid-range", flags->task_uid_range,
                  fmt::format("FIRST-LAST: the uids (and gids of the same numbers) the tasks of "
                              "each run get one of, when the agent is root and there is no "
                              "--run-as; no account may use one (docs/agent.md) (default: {})",
                              runner::FormatTaskUidRange(runner::kDefaultTaskUidRange)));
  cmd->add_option("--task-group", flags->task_groups,
                  "a supplementary group of every task under --task-uid-range, e.g. one that "
                  "may open /dev/nvidia* where the driver restricts them; repeatable (default: "
                  "none)");
  cmd->add_flag("--no-cgroups", flags->no_cgroups,
                "do not put tasks in cgroups of their own (no CPU or memory limits)");
  cmd->add_flag("--once", flags->once, "check once and exit (with --slurm-health)");
  cmd->add_flag("--slurm-health", flags->slurm_health,
                "as Slurm's HealthCheckProgram: read the GPUs once, drain the node through "
                "scontrol when one is unhealthy (reason \"gpufleet: XID 79 on GPU 3\"), resume "
                "it when gpufleet drained it and the GPUs are clean; a node drained for another "
                "reason is left alone (docs/slurm.md)");
  cmd->add_option("--slurm-node", flags->slurm_node,
                  "--slurm-health: the node's Slurm name (default: SLURMD_NODENAME, else the "
                  "short host name)");
  cmd->add_option("--scontrol", flags->scontrol, "--slurm-health: the scontrol program")
      ->capture_default_str();
  return [flags, cmd] {
    if (std::optional<int> exit_code = HandleConfigFlags(*cmd)) {
      return *exit_code;
    }
    return RunAgent(*flags);
  };
}

}  // namespace gpufleet::app
