// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/node_agent.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/mig.h"
#include "gpufleet/runner/process_runner.h"

namespace gpufleet::agent {
namespace {

constexpr char kJsonType[] = "application/json";

// Variables the agent adds to every task's environment.
constexpr char kJobEnv[] = "GPUFLEET_JOB";
constexpr char kTaskEnv[] = "GPUFLEET_TASK";
constexpr char kTaskIdEnv[] = "GPUFLEET_TASK_ID";

// A task id as the name of its files: '/' becomes '_'.
std::string TaskFileName(const std::string& task_id) {
  std::string file = task_id;
  std::replace(file.begin(), file.end(), '/', '_');
  return file;
}

// With the node's own credential once it has one, else the client's token.
Result<wire::AgentReply> Send(http::ApiClient& client, const std::string& node_token,
                              const std::string& path, const std::string& body) {
  GPUFLEET_ASSIGN_OR_RETURN(const nlohmann::json answer,
                            node_token.empty()
                                ? client.Post(path, body, kJsonType)
                                : client.PostWithToken(node_token, path, body, kJsonType));
  return wire::ParseAgentReply(answer.dump());
}

std::vector<wire::TaskReport> ReportsFor(const std::vector<runner::TaskStatus>& statuses,
                                         const std::vector<wire::GpuReport>& gpus,
                                         const std::map<std::string, int>& gpu_index_by_uuid) {
  std::map<int, int> utilization;
  for (const wire::GpuReport& gpu : gpus) {
    if (gpu.utilization_pct) {
      utilization[gpu.index] = *gpu.utilization_pct;
    }
  }
  std::vector<wire::TaskReport> out;
  for (const runner::TaskStatus& status : statuses) {
    wire::TaskReport report;
    report.id = status.task_id;
    switch (status.state) {
      case runner::TaskState::kRunning:
        report.phase = status.pulling_image ? wire::TaskPhase::kPulling : wire::TaskPhase::kRunning;
        report.message = status.pulling_image ? status.image_pull_progress : "";
        break;
      case runner::TaskState::kExited:
        report.phase =
            status.exit_code == 0 ? wire::TaskPhase::kSucceeded : wire::TaskPhase::kFailed;
        report.exit_code = status.exit_code;
        break;
      case runner::TaskState::kKilled:
      case runner::TaskState::kFailedToStart:
      case runner::TaskState::kLost:
        report.phase = wire::TaskPhase::kFailed;
        report.exit_code = status.state == runner::TaskState::kKilled ? 128 + status.signal : -1;
        break;
    }
    if (report.phase == wire::TaskPhase::kFailed) {
      report.message = runner::DescribeTaskStatus(status);
    }
    // The pull's time goes with the digest the container runs: once the container has started.
    if (status.image_pull_time.has_value() && !status.starting_container) {
      report.image_pull_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(*status.image_pull_time).count();
    }
    report.image_digest = status.image_digest;
    int sum = 0;
    int count = 0;
    for (const std::string& uuid : status.gpu_uuids) {
      const auto index = gpu_index_by_uuid.find(uuid);
      if (index == gpu_index_by_uuid.end()) {
        continue;
      }
      if (const auto util = utilization.find(index->second); util != utilization.end()) {
        sum += util->second;
        ++count;
      }
    }
    if (count > 0 && report.phase == wire::TaskPhase::kRunning) {
      report.gpu_utilization_pct = sum / count;
    }
    out.push_back(std::move(report));
  }
  return out;
}

wire::DrainAction ToProtocol(DrainAction drain) {
  switch (drain) {
    case DrainAction::kNone:
      return wire::DrainAction::kNone;
    case DrainAction::kAfterJob:
      return wire::DrainAction::kAfterJob;
    case DrainAction::kNow:
      return wire::DrainAction::kNow;
  }
  return wire::DrainAction::kNone;
}

}  // namespace

wire::GpuReport ToGpuReport(const GpuHealthReport& report, std::optional<int64_t> utilization_pct) {
  wire::GpuReport out;
  out.index = report.gpu_index;
  out.health = report.health;
  out.drain = ToProtocol(report.drain);
  for (const HealthFinding& finding : report.findings) {
    out.reasons.push_back(finding.reason);
  }
  if (report.thermal_headroom_c) {
    out.thermal_headroom_c = *report.thermal_headroom_c;
  }
  if (utilization_pct) {
    out.utilization_pct = static_cast<int>(std::clamp<int64_t>(*utilization_pct, 0, 100));
  }
  return out;
}

std::vector<wire::GpuReport> GpuReportsFrom(const TelemetrySnapshot& snapshot) {
  std::vector<wire::GpuReport> out;
  for (const GpuTelemetry& gpu : snapshot.gpus) {
    out.push_back(ToGpuReport(gpu.health, gpu.reading.sample.gpu_util_percent));
  }
  return out;
}

std::vector<MigDeviceInfo> WithPlacementStarts(const GpuModelInfo& model,
                                               std::vector<MigDeviceInfo> devices) {
  std::vector<MigInstance> known;
  for (const MigDeviceInfo& device : devices) {
    if (device.placement_start && model.FindMigProfile(device.profile) != nullptr) {
      known.push_back({device.profile, *device.placement_start});
    }
  }
  Result<MigLayout> layout = MigLayout::FromInstances(model, known);
  if (!layout.ok()) {
    return {};  // the probe's own starts do not make a layout: nothing reliable to report
  }
  std::sort(devices.begin(), devices.end(), [](const MigDeviceInfo& a, const MigDeviceInfo& b) {
    return a.gpu_instance_id < b.gpu_instance_id;
  });
  std::vector<MigDeviceInfo> out;
  for (MigDeviceInfo& device : devices) {
    const MigProfile* profile = model.FindMigProfile(device.profile);
    if (profile == nullptr) {
      continue;
    }
    if (!device.placement_start) {
      const std::optional<int> start = layout->FindStart(*profile);
      if (!start) {
        continue;
      }
      layout->Add(*profile, *start);
      device.placement_start = *start;
    }
    out.push_back(std::move(device));
  }
  return out;
}

NodeAgent::NodeAgent(NodeAgentOptions options, TelemetrySampler& telemetry, GpuProbe& probe,
                     runner::TaskRunner& runner, http::ApiClient& client, const GpuCatalog& catalog,
                     const Clock& clock)
    : options_(std::move(options)),
      telemetry_(telemetry),
      probe_(probe),
      runner_(runner),
      client_(client),
      catalog_(catalog),
      clock_(clock),
      renewed_at_(clock.Now()),
      node_token_(options_.node_token),
      mps_(options_.mps, clock) {}

Result<wire::AgentReply> NodeAgent::SendRenewing(const std::string& path, const std::string& body) {
  const MonoTime sent = clock_.Now();
  Result<wire::AgentReply> answer = Send(client_, node_token_, path, body);
  if (!answer.ok() && answer.status().code() == StatusCode::kUnauthenticated &&
      !node_token_.empty()) {
    // The node credential was revoked, or replaced by a registration whose answer reached us
    // late or never: the next registration goes with the client's own token (a join token),
    // which the server takes only while the node's credential is unclaimed.
    node_token_.clear();
  }
  GPUFLEET_ASSIGN_OR_RETURN(wire::AgentReply reply, std::move(answer));
  const Duration lease = std::chrono::milliseconds(reply.lease_ms);
  const Duration server_stop_grace = std::chrono::milliseconds(reply.stop_grace_ms);
  // The tasks enforce the lease themselves (they outlive a dead agent), so it counts as renewed
  // only once the runner has it: otherwise they keep the old deadline, and so does the agent.
  const Duration fence_in =
      std::max<Duration>(sent + (lease - FenceMargin(lease)) - clock_.Now(), Duration(0));
  GPUFLEET_RETURN_IF_ERROR(runner_.RenewLease(fence_in, FenceGrace(server_stop_grace)));
  renewed_at_ = sent;
  lease_ = lease;
  server_stop_grace_ = server_stop_grace;
  return reply;
}

Duration NodeAgent::FenceMargin(Duration lease) const {
  // A lease shorter than twice the margin (a test fleet's) keeps half of it.
  return std::min<Duration>(options_.fence_margin, lease / 2);
}

Duration NodeAgent::FenceGrace(Duration server_stop_grace) const {
  // SIGTERM comes a margin before the lease runs out, so a grace up to the server's own ends the
  // same margin before the server frees the GPUs (lease plus its stop grace).
  return std::clamp<Duration>(server_stop_grace, Duration(0), options_.stop_grace);
}

void NodeAgent::TendMpsDaemons() {
  if (mps_.daemons().empty()) {
    return;
  }
  std::set<std::string> wanted;
  for (const wire::DesiredTask& task : desired_) {
    if (task.mps) {
      wanted.insert(task.gpu_uuids.begin(), task.gpu_uuids.end());
    }
  }
  mps_.StopUnused(runner_.Poll(), wanted);
}

int NodeAgent::FenceIfLeaseExpired() {
  const MonoTime deadline = renewed_at_ + (lease_ - FenceMargin(lease_));
  if (clock_.Now() < deadline || fenced_deadline_ == deadline) {
    return 0;
  }
  fenced_deadline_ = deadline;
  // The runner stops the tasks at the deadline itself (TaskRunner::RenewLease): stopping them
  // here too would send a second SIGTERM, and a task's checkpoint handler would run twice. Only
  // a task an older runner started does not, and the agent stops it. These are the tasks the
  // lease stopped: those still running, or that ended since the deadline.
  const Duration grace = FenceGrace(server_stop_grace_);
  int stopped = 0;
  for (const runner::TaskStatus& status : runner_.Poll()) {
    if (!runner::IsFinal(status.state) && !status.enforces_lease && !status.stop_requested) {
      // Only kNotFound can come back, for a task forgotten since the Poll.
      static_cast<void>(runner_.Stop(status.task_id, grace));
    }
    if (!runner::IsFinal(status.state) || (status.end_time && *status.end_time >= deadline)) {
      ++stopped;
    }
  }
  if (stopped > 0) {
    fenced_ = fmt::format(
        "lease of {}s not renewed for {}s: stopped {} task{}",
        std::chrono::duration_cast<std::chrono::seconds>(lease_).count(),
        std::chrono::duration_cast<std::chrono::seconds>(clock_.Now() - renewed_at_).count(),
        stopped, stopped == 1 ? "" : "s");
  }
  return stopped;
}

std::vector<wire::GpuReport> NodeAgent::GpuReports() const {
  std::vector<wire::GpuReport> reports = GpuReportsFrom(*telemetry_.LatestSnapshot());
  for (wire::GpuReport& report : reports) {
    const auto devices = mig_devices_.find(report.index);
    if (devices == mig_devices_.end()) {
      continue;
    }
    std::vector<wire::MigDeviceReport> mig;
    for (const MigDeviceInfo& device : devices->second) {
      mig.push_back({device.uuid, device.profile, device.placement_start.value_or(0)});
    }
    report.mig_devices = std::move(mig);
    if (const auto error = mig_errors_.find(report.index); error != mig_errors_.end()) {
      report.mig_error = error->second;
    }
  }
  return reports;
}

std::vector<wire::TaskReport> NodeAgent::TaskReports(
    const std::vector<runner::TaskStatus>& statuses) const {
  std::vector<wire::TaskReport> reports =
      ReportsFor(statuses, GpuReportsFrom(*telemetry_.LatestSnapshot()), gpu_index_by_uuid_);
  for (const auto& [id, why] : refused_) {
    wire::TaskReport report;
    report.id = id;
    report.phase = wire::TaskPhase::kFailed;
    report.exit_code = -1;
    report.message = why;
    reports.push_back(std::move(report));
  }
  for (const auto& [id, why] : waiting_) {
    wire::TaskReport report;
    report.id = id;
    report.phase = wire::TaskPhase::kWaiting;
    report.message = why;
    reports.push_back(std::move(report));
  }
  for (wire::TaskReport& report : reports) {
    if (const auto it = checkpoints_.find(report.id); it != checkpoints_.end()) {
      report.last_checkpoint_unix_s = it->second.unix_seconds;
    }
  }
  return reports;
}

void NodeAgent::ReadCheckpoints(const std::vector<runner::TaskStatus>& statuses) {
  if (options_.checkpoint_dir.empty()) {
    return;
  }
  for (const runner::TaskStatus& status : statuses) {
    // Missing (a task started without one) or unreadable now: the last time read stands.
    const Result<CheckpointRead> read = ReadCheckpointFile(CheckpointPath(status.task_id));
    if (!read.ok()) {
      continue;
    }
    CheckpointRead& known = checkpoints_[status.task_id];
    if (read->size == known.size && read->mtime_ns == known.mtime_ns &&
        read->rejected == known.rejected) {
      continue;
    }
    if (!read->rejected.empty()) {
      ++checkpoint_rejections_[read->rejected];
    }
    known.size = read->size;
    known.mtime_ns = read->mtime_ns;
    known.rejected = read->rejected;
    if (read->unix_seconds) {
      known.unix_seconds = read->unix_seconds;
    }
  }
}

Status NodeAgent::Register() {
  // The daemons an earlier agent started, before its tasks are adopted: never a second one.
  GPUFLEET_RETURN_IF_ERROR(mps_.Adopt());
  const std::shared_ptr<const TelemetrySnapshot> snapshot = telemetry_.LatestSnapshot();
  wire::RegisterRequest request;
  request.agent_version = options_.agent_version;
  request.topology_levels = options_.topology_levels;
  Node& node = request.node;
  node.id = NodeId(options_.node_name);
  node.capacity = options_.capacity;
  node.labels = options_.labels;
  node.labels[std::string(kDriverVersionLabel)] = snapshot->driver_version;
  if (!snapshot->cuda_version.empty()) {
    node.labels[std::string(kCudaVersionLabel)] = snapshot->cuda_version;
  }
  if (!snapshot->nvml_version.empty()) {
    node.labels[std::string(wire::kNvmlVersionLabel)] = snapshot->nvml_version;
  }
  node.fault_domains = options_.fault_domains;
  node.topology = options_.topology_values;
  if (probe_.CanApplyMigLayouts()) {
    node.labels[std::string(wire::kMigLayoutsLabel)] = "true";
  }
  if (options_.diagnostics != nullptr) {
    node.labels[std::string(wire::kDiagnosticsLabel)] = "true";
  }
  // The runner's word, whatever --label said.
  if (const std::string runtime = runner_.ContainerRuntime(); !runtime.empty()) {
    node.labels[std::string(kContainerRuntimeLabel)] = runtime;
  } else {
    node.labels.erase(std::string(kContainerRuntimeLabel));
  }
  std::map<std::string, int> index_by_uuid;
  std::map<int, std::string> model_by_gpu;
  std::map<int, std::vector<MigDeviceInfo>> mig_devices;
  for (const GpuTelemetry& telemetry : snapshot->gpus) {
    const GpuStaticInfo& info = telemetry.reading.info;
    if (info.model.empty() || !catalog_.Contains(info.model)) {
      return InvalidArgumentError(fmt::format(
          "gpu {}: model \"{}\" is not in the GPU catalog (docs/architecture.md lists the models)",
          info.index, info.model.empty() ? info.nvml_name : info.model));
    }
    Gpu gpu;
    gpu.index = info.index;
    gpu.uuid = GpuUuid(info.uuid);
    gpu.model = catalog_.Canonical(info.model);
    gpu.memory_mib = info.memory_mib;
    gpu.nvlink_domain =
        options_.gpus_per_nvlink_domain > 0 ? info.index / options_.gpus_per_nvlink_domain : 0;
    gpu.mig_enabled = info.mig_enabled;
    if (info.mig_enabled) {
      std::vector<MigDeviceInfo> devices =
          WithPlacementStarts(**catalog_.Find(gpu.model), info.mig_devices);
      for (const MigDeviceInfo& device : devices) {
        gpu.mig_instances.push_back({device.profile, *device.placement_start});
      }
      model_by_gpu[info.index] = gpu.model;
      mig_devices[info.index] = std::move(devices);
    }
    node.gpus.push_back(std::move(gpu));
    index_by_uuid[info.uuid] = info.index;
  }
  gpu_index_by_uuid_ = std::move(index_by_uuid);
  model_by_gpu_ = std::move(model_by_gpu);
  mig_devices_ = std::move(mig_devices);
  mig_errors_.clear();
  request.gpus = GpuReports();
  const std::vector<runner::TaskStatus> statuses = runner_.Poll();
  ReadCheckpoints(statuses);
  request.tasks = TaskReports(statuses);
  request.sequence = clock_.Now().nanos;
  GPUFLEET_ASSIGN_OR_RETURN(const wire::AgentReply reply,
                            SendRenewing("/v1/agents/register", RegisterRequestToJson(request)));
  registered_ = true;
  images_sent_ = false;  // the first heartbeat after a registration carries them
  if (!reply.node_token.empty()) {
    node_token_ = reply.node_token;
  }
  const Status applied = Apply(reply, statuses);
  SendProvenance();
  return applied;
}

Status NodeAgent::Heartbeat() {
  if (!registered_) {
    return FailedPreconditionError("the agent has not registered yet");
  }
  FenceIfLeaseExpired();
  wire::HeartbeatRequest request;
  request.agent_version = options_.agent_version;
  request.gpus = GpuReports();
  for (const LinkFinding& finding : telemetry_.LatestSnapshot()->link_findings) {
    request.link_problems.push_back(finding.reason);
  }
  const std::vector<runner::TaskStatus> statuses = runner_.Poll();
  ReadCheckpoints(statuses);
  request.tasks = TaskReports(statuses);
  request.fenced = fenced_;
  request.diagnostics = DiagnosticReports();
  // A pull adds an image when it ends, which may be between two heartbeats.
  const bool pulling = std::any_of(statuses.begin(), statuses.end(),
                                   [](const runner::TaskStatus& s) { return s.pulling_image; });
  images_stale_ = images_stale_ || pulling || was_pulling_;
  was_pulling_ = pulling;
  // Sent before the report that may end the run: the server takes records of placed runs only.
  if (RecordPulledProvenance(statuses)) {
    SendProvenance();
  }
  request.images = ImagesToReport();
  request.sequence = clock_.Now().nanos;
  Result<wire::AgentReply> reply =
      SendRenewing(fmt::format("/v1/agents/{}/heartbeat", http::UrlEncode(options_.node_name)),
                   HeartbeatRequestToJson(request));
  if (!reply.ok()) {
    FenceIfLeaseExpired();
    return reply.status();
  }
  if (fenced_ == request.fenced) {
    fenced_.clear();
  }
  if (request.images) {
    images_sent_ = true;
  }
  const Status applied = Apply(*reply, statuses);
  SendProvenance();
  ShipLogs(statuses);
  return applied;
}

void NodeAgent::ShipLogs(const std::vector<runner::TaskStatus>& statuses) {
  if (options_.log_dir.empty()) {
    return;  // a simulated node: its runner writes no logs
  }
  const MonoTime now = clock_.Now();
  std::map<std::string, ShippedLog> still;
  for (const runner::TaskStatus& status : statuses) {
    ShippedLog shipped = shipped_logs_[status.task_id];
    const bool ended = status.state != runner::TaskState::kRunning;
    const std::string path = LogPath(status.task_id);
    std::error_code error;
    auto size = static_cast<int64_t>(std::filesystem::file_size(path, error));
    if (error) {
      still[status.task_id] = shipped;  // no log (yet): nothing to ship
      continue;
    }
    if (size > options_.max_log_bytes) {
      // The task's stdout is appended (O_APPEND): after the cut it writes on at the new end.
      std::filesystem::resize_file(path, 0, error);
      std::ofstream(path, std::ios::app) << fmt::format(
          "[gpufleet agent: the log passed {} bytes and was cut here]\n", options_.max_log_bytes);
      size = static_cast<int64_t>(std::filesystem::file_size(path, error));
    }
    const bool due =
        ended ? !shipped.final
              : size != shipped.size &&
                    (!shipped.tried_at || now - *shipped.tried_at >= options_.log_ship_interval);
    if (!due || error) {
      still[status.task_id] = shipped;
      continue;
    }
    wire::TaskLogReport report{.task_id = status.task_id, .size = size, .final = ended};
    std::ifstream log(path, std::ios::binary);
    const int64_t from = std::max<int64_t>(0, size - wire::kMaxTaskLogTailBytes);
    log.seekg(from);
    report.text.resize(static_cast<size_t>(size - from));
    log.read(report.text.data(), static_cast<std::streamsize>(report.text.size()));
    report.text.resize(static_cast<size_t>(std::max<std::streamsize>(0, log.gcount())));
    report.size = from + static_cast<int64_t>(report.text.size());
    const std::string logs_path =
        fmt::format("/v1/agents/{}/logs", http::UrlEncode(options_.node_name));
    const std::string body = wire::TaskLogReportToJson(report);
    const Result<nlohmann::json> answer =
        node_token_.empty() ? client_.Post(logs_path, body, kJsonType)
                            : client_.PostWithToken(node_token_, logs_path, body, kJsonType);
    shipped.tried_at = now;
    if (answer.ok()) {
      shipped.size = report.size;
      shipped.final = ended;
    }
    // An ended task is reported once: its entry goes with it, shipped or not.
    if (!ended) {
      still[status.task_id] = shipped;
    }
  }
  shipped_logs_ = std::move(still);
}

bool NodeAgent::RecordPulledProvenance(const std::vector<runner::TaskStatus>& statuses) {
  bool recorded = false;
  for (auto it = awaiting_pull_.begin(); it != awaiting_pull_.end();) {
    const auto status =
        std::find_if(statuses.begin(), statuses.end(),
                     [&](const runner::TaskStatus& s) { return s.task_id == it->first; });
    if (status != statuses.end() && (status->pulling_image || status->starting_container)) {
      ++it;
      continue;
    }
    // A task whose pull failed, or that was stopped while pulling, never ran: no record.
    if (status != statuses.end() && status->state != runner::TaskState::kFailedToStart) {
      provenance_pending_[it->first] = ProvenanceOf(it->second, *status);
      recorded = true;
    }
    it = awaiting_pull_.erase(it);
  }
  return recorded;
}

wire::ProvenanceReport NodeAgent::ProvenanceOf(const runner::TaskLaunch& launch,
                                               const runner::TaskStatus& status) const {
  const std::shared_ptr<const TelemetrySnapshot> snapshot = telemetry_.LatestSnapshot();
  wire::ProvenanceReport report;
  report.task_id = launch.task_id;
  report.image = launch.image;
  report.image_digest = status.image_digest;
  report.driver_version = snapshot->driver_version;
  report.cuda_version = snapshot->cuda_version;
  report.nvml_version = snapshot->nvml_version;
  for (const std::string& uuid : launch.gpu_uuids) {
    wire::ProvenanceGpu gpu{uuid, "", ""};
    // A MIG device carries the serial and VBIOS of the GPU it is on.
    for (const GpuTelemetry& telemetry : snapshot->gpus) {
      const GpuStaticInfo& info = telemetry.reading.info;
      const bool mig_of = std::any_of(info.mig_devices.begin(), info.mig_devices.end(),
                                      [&](const MigDeviceInfo& d) { return d.uuid == uuid; });
      if (info.uuid == uuid || mig_of) {
        gpu.serial = info.serial;
        gpu.vbios_version = info.vbios_version;
      }
    }
    report.gpus.push_back(std::move(gpu));
  }
  report.command = launch.argv;
  // Names only: the values (the spec's env may hold secrets) never leave the node this way.
  for (const std::string& entry : runner::TaskEnvironment(launch, std::nullopt)) {
    report.env_names.push_back(entry.substr(0, entry.find('=')));
  }
  std::sort(report.env_names.begin(), report.env_names.end());
  report.env_names.erase(std::unique(report.env_names.begin(), report.env_names.end()),
                         report.env_names.end());
  return report;
}

void NodeAgent::SendProvenance() {
  const std::string path =
      fmt::format("/v1/agents/{}/provenance", http::UrlEncode(options_.node_name));
  for (auto it = provenance_pending_.begin(); it != provenance_pending_.end();) {
    const std::string body = wire::ProvenanceReportToJson(it->second);
    const Result<nlohmann::json> answer =
        node_token_.empty() ? client_.Post(path, body, kJsonType)
                            : client_.PostWithToken(node_token_, path, body, kJsonType);
    if (!answer.ok() && (answer.status().code() == StatusCode::kUnavailable ||
                         answer.status().code() == StatusCode::kDeadlineExceeded ||
                         answer.status().code() == StatusCode::kInternal)) {
      ++it;  // tried again at the next heartbeat
      continue;
    }
    if (!answer.ok()) {
      // Refused for good (a record that differs from the stored one, a run no longer placed
      // here): sending it again would not change the answer.
      provenance_refused_ = fmt::format("{}: {}", it->first, answer.status().message());
    }
    it = provenance_pending_.erase(it);
  }
}

std::optional<std::vector<CachedImage>> NodeAgent::ImagesToReport() {
  const MonoTime now = clock_.Now();
  if (!images_listed_at_ || images_stale_ ||
      now - *images_listed_at_ >= options_.image_list_interval) {
    Result<std::vector<CachedImage>> listed = runner_.ListImages();
    // A runner that runs no containers (kUnimplemented, at no cost) is asked again at the next
    // due time; the server keeps the list it has meanwhile.
    images_listed_at_ = now;
    // kUnavailable: the runner lists them beside the agent (PodmanRunner), or cannot now; asked
    // again at the next heartbeat.
    images_stale_ = !listed.ok() && listed.status().code() == StatusCode::kUnavailable;
    if (!listed.ok()) {
      return std::nullopt;
    }
    if (!images_known_ || *listed != images_) {
      images_known_ = true;
      images_ = std::move(*listed);
      images_sent_ = false;
    }
  }
  if (!images_known_ || images_sent_) {
    return std::nullopt;
  }
  return images_;
}

std::optional<std::string> NodeAgent::ApplyMigLayout(const wire::WantedMigLayout& layout,
                                                     const std::vector<runner::TaskStatus>& tasks) {
  const auto devices = mig_devices_.find(layout.gpu_index);
  const auto model = model_by_gpu_.find(layout.gpu_index);
  if (devices == mig_devices_.end() || model == model_by_gpu_.end()) {
    return fmt::format("gpu {}: not a MIG-enabled GPU of this node", layout.gpu_index);
  }
  // A device a running task holds is never destroyed, whatever the probe would allow.
  std::set<std::string> held;
  for (const runner::TaskStatus& task : tasks) {
    if (!runner::IsFinal(task.state)) {
      held.insert(task.gpu_uuids.begin(), task.gpu_uuids.end());
    }
  }
  std::vector<MigInstance> unmatched = layout.instances;
  for (const MigDeviceInfo& device : devices->second) {
    const auto wanted =
        std::find_if(unmatched.begin(), unmatched.end(), [&](const MigInstance& instance) {
          return instance.profile == device.profile && device.placement_start == instance.start;
        });
    if (wanted != unmatched.end()) {
      unmatched.erase(wanted);
    } else if (held.count(device.uuid) > 0) {
      return fmt::format(
          "gpu {}: the {} instance at {} ({}) is in use by a task; layout {} not "
          "applied",
          layout.gpu_index, device.profile, device.placement_start.value_or(0), device.uuid,
          wire::DescribeMigInstances(layout.instances));
    }
  }
  Result<std::vector<MigDeviceInfo>> applied =
      probe_.ApplyMigLayout(layout.gpu_index, layout.instances);
  if (!applied.ok()) {
    return applied.status().message();
  }
  const Result<const GpuModelInfo*> info = catalog_.Find(model->second);
  devices->second = WithPlacementStarts(**info, std::move(applied).value());
  return std::nullopt;
}

std::string NodeAgent::LogPath(const std::string& task_id) const {
  return fmt::format("{}/{}.log", options_.log_dir, TaskFileName(task_id));
}

std::string NodeAgent::CheckpointPath(const std::string& task_id) const {
  return fmt::format("{}/{}.checkpoint", options_.checkpoint_dir, TaskFileName(task_id));
}

std::string NodeAgent::NoticePath(const std::string& task_id) const {
  return fmt::format("{}/{}.notice", options_.checkpoint_dir, TaskFileName(task_id));
}

void NodeAgent::DeliverNotices() {
  if (std::none_of(desired_.begin(), desired_.end(),
                   [](const wire::DesiredTask& task) { return task.notice.has_value(); })) {
    noticed_.clear();
    return;
  }
  std::set<std::string> known;
  for (const runner::TaskStatus& status : runner_.Poll()) {
    if (!runner::IsFinal(status.state)) {
      known.insert(status.task_id);
    }
  }
  std::map<std::string, int64_t> still;
  for (const wire::DesiredTask& task : desired_) {
    if (!task.notice || known.count(task.id) == 0) {
      continue;
    }
    const int64_t deadline = task.notice->deadline_unix_s;
    still[task.id] = deadline;
    if (const auto it = noticed_.find(task.id); it != noticed_.end() && it->second == deadline) {
      continue;
    }
    if (!options_.checkpoint_dir.empty()) {
      // Written whole under another name and renamed, so that the task never reads half of it;
      // readable by the task's user, who cannot write in the directory.
      const std::string path = NoticePath(task.id);
      const std::string temporary = path + ".new";
      {
        std::ofstream out(temporary, std::ios::trunc);
        out << deadline << " " << task.notice->signal << "\n";
      }
      std::error_code error;
      std::filesystem::permissions(temporary, std::filesystem::perms(0644), error);
      if (!error) {
        std::filesystem::rename(temporary, path, error);
      }
      if (error) {
        notice_error_ = fmt::format("notice file of task {}: {}", task.id, error.message());
      }
    }
    // Only kNotFound, for a task forgotten since the Poll: the stop at the deadline still comes.
    if (const Status sent = runner_.SendNotice(task.id, task.notice->signal); !sent.ok()) {
      notice_error_ = fmt::format("notice to task {}: {}", task.id, sent.message());
    }
  }
  noticed_ = std::move(still);
}

Status NodeAgent::Apply(const wire::AgentReply& reply,
                        const std::vector<runner::TaskStatus>& reported) {
  heartbeat_interval_ = std::chrono::milliseconds(reply.heartbeat_interval_ms);
  // The server has the final states now.
  for (const runner::TaskStatus& status : reported) {
    if (runner::IsFinal(status.state)) {
      if (Status forgotten = runner_.Forget(status.task_id);
          !forgotten.ok() && forgotten.code() != StatusCode::kNotFound) {
        return forgotten;
      }
      // The server has the task's last checkpoint; a missing file is already gone.
      checkpoints_.erase(status.task_id);
      if (!options_.checkpoint_dir.empty()) {
        unlink(CheckpointPath(status.task_id).c_str());
        unlink(NoticePath(status.task_id).c_str());
      }
    }
  }
  refused_.clear();
  desired_ = reply.tasks;
  std::vector<GpuTask> gpu_tasks;
  for (const wire::DesiredTask& task : desired_) {
    for (const std::string& uuid : task.gpu_uuids) {
      gpu_tasks.push_back({uuid, task.team.empty() ? task.job : task.team + "/" + task.job,
                           task.task, task.team, task.queue});
    }
  }
  telemetry_.SetGpuTasks(std::move(gpu_tasks));

  bool mig_changed = false;
  for (const wire::WantedMigLayout& layout : reply.mig_layouts) {
    const std::vector<MigDeviceInfo> before = mig_devices_[layout.gpu_index];
    if (std::optional<std::string> error = ApplyMigLayout(layout, reported)) {
      mig_errors_[layout.gpu_index] = std::move(*error);
    } else {
      mig_errors_.erase(layout.gpu_index);
    }
    mig_changed = mig_changed || mig_devices_[layout.gpu_index] != before;
  }
  if (mig_changed) {
    // The sampler's inventory (and /metrics) follow the new MIG devices from its next sample.
    GPUFLEET_RETURN_IF_ERROR(telemetry_.RefreshInventory());
  }

  // Stop before start: what is no longer wanted gets its SIGTERM first, and keeps its devices
  // until it has ended.
  std::set<std::string, std::less<>> desired_ids;
  for (const wire::DesiredTask& task : desired_) {
    desired_ids.insert(task.id);
  }
  GPUFLEET_RETURN_IF_ERROR(
      runner::StopUndesiredTasks(runner_, desired_ids, options_.stop_grace).status());
  waiting_.clear();
  // A record waits for a run the server still wants, no longer.
  std::erase_if(provenance_pending_,
                [&](const auto& entry) { return desired_ids.count(entry.first) == 0; });
  std::erase_if(awaiting_pull_,
                [&](const auto& entry) { return desired_ids.count(entry.first) == 0; });
  std::set<std::string> known;
  // The devices live tasks of other runs hold, by UUID, and the whole GPUs under held MIG
  // devices; a whole GPU that is held blocks its MIG devices too.
  std::map<std::string, std::string> held;
  std::map<std::string, std::string> held_parents;
  std::map<std::string, std::string> parent_of;  // MIG device UUID -> its GPU's UUID
  // The GPUs of every live task, desired or not (MIG devices count for their GPU): a diagnostic
  // waits for them to end.
  std::map<std::string, std::string> live;
  for (const auto& [uuid, index] : gpu_index_by_uuid_) {
    if (const auto devices = mig_devices_.find(index); devices != mig_devices_.end()) {
      for (const MigDeviceInfo& device : devices->second) {
        parent_of[device.uuid] = uuid;
      }
    }
  }
  for (const runner::TaskStatus& status : runner_.Poll()) {
    known.insert(status.task_id);
    if (!runner::IsFinal(status.state)) {
      for (const std::string& uuid : status.gpu_uuids) {
        const auto parent = parent_of.find(uuid);
        live[parent != parent_of.end() ? parent->second : uuid] = status.task_id;
      }
    }
    if (runner::IsFinal(status.state) || desired_ids.count(status.task_id) > 0) {
      continue;
    }
    for (const std::string& uuid : status.gpu_uuids) {
      held[uuid] = status.task_id;
      if (const auto parent = parent_of.find(uuid); parent != parent_of.end()) {
        held_parents[parent->second] = status.task_id;
      }
    }
  }
  const auto holder = [&](const std::string& uuid) -> std::optional<std::string> {
    if (const auto it = held.find(uuid); it != held.end()) {
      return it->second;
    }
    if (const auto it = held_parents.find(uuid); it != held_parents.end()) {
      return it->second;
    }
    if (const auto parent = parent_of.find(uuid); parent != parent_of.end()) {
      if (const auto it = held.find(parent->second); it != held.end()) {
        return it->second;
      }
    }
    return std::nullopt;
  };
  ApplyDiagnostics(reply.diagnostics, live);
  const std::map<std::string, std::string> diagnosed = DiagnosedGpus();
  std::vector<runner::TaskLaunch> started_launches;
  for (const wire::DesiredTask& task : desired_) {
    if (known.count(task.id) > 0) {
      continue;
    }
    std::optional<std::string> blocked;
    for (const std::string& uuid : task.gpu_uuids) {
      if (const std::optional<std::string> by = holder(uuid)) {
        blocked = fmt::format("{} is still held by task {}, which is stopping", uuid, *by);
        break;
      }
      const auto parent = parent_of.find(uuid);
      if (const auto by = diagnosed.find(parent != parent_of.end() ? parent->second : uuid);
          by != diagnosed.end()) {
        blocked = fmt::format("{} is under diagnostic {}", uuid, by->second);
        break;
      }
    }
    if (blocked) {
      waiting_[task.id] = std::move(*blocked);
      continue;
    }
    runner::TaskLaunch launch;
    launch.task_id = task.id;
    launch.run_id = wire::RunIdOfTask(task.id);
    launch.argv = task.command;
    launch.env = task.env;
    launch.env[kJobEnv] = task.job;
    launch.env[kTaskEnv] = task.task;
    launch.env[kTaskIdEnv] = task.id;
    launch.gpu_uuids = task.gpu_uuids;
    launch.log_path = LogPath(task.id);
    if (!options_.checkpoint_dir.empty()) {
      launch.checkpoint_path = CheckpointPath(task.id);
      launch.notice_path = NoticePath(task.id);
    }
    launch.cpu_milli = task.cpu_milli;
    launch.memory_mib = task.memory_mib;
    launch.image = task.image;
    launch.image_pull_policy = task.image_pull_policy;
    launch.host_network = task.host_network;
    if (task.mps) {
      // The daemon runs before its first client: a CUDA client that finds none runs without MPS
      // and without its limits.
      if (task.gpu_uuids.size() != 1) {
        refused_[task.id] =
            fmt::format("not started: an MPS share has one GPU, not {}", task.gpu_uuids.size());
        continue;
      }
      const Result<std::string> pipes = mps_.EnsureRunning(task.gpu_uuids[0]);
      if (!pipes.ok()) {
        if (pipes.status().code() == StatusCode::kUnavailable) {
          waiting_[task.id] = pipes.status().message();
        } else {
          refused_[task.id] = fmt::format("not started: {}", pipes.status().message());
        }
        continue;
      }
      launch.mps =
          runner::MpsClient{*pipes, task.gpu_memory_mib,
                            static_cast<int>(std::clamp<int64_t>(task.gpu_milli / 10, 1, 100))};
    }
    images_stale_ = images_stale_ || !launch.image.empty();
    if (Status started = runner_.Start(launch); !started.ok()) {
      if (started.code() == StatusCode::kAlreadyExists) {
        continue;
      }
      // Reported as Failed with the runner's reason at the next heartbeat.
      refused_[task.id] = fmt::format("not started: {}", started.message());
    } else {
      started_launches.push_back(std::move(launch));
    }
  }
  TendMpsDaemons();
  DeliverNotices();
  if (!started_launches.empty()) {
    std::map<std::string, runner::TaskStatus> statuses;
    for (runner::TaskStatus& status : runner_.Poll()) {
      statuses[status.task_id] = std::move(status);
    }
    for (runner::TaskLaunch& launch : started_launches) {
      const runner::TaskStatus& status = statuses[launch.task_id];
      // The record names the digest the container runs: it waits for the pull to end and the
      // container to start.
      if (status.pulling_image || status.starting_container) {
        awaiting_pull_[launch.task_id] = std::move(launch);
      } else {
        provenance_pending_[launch.task_id] = ProvenanceOf(launch, status);
      }
    }
  }
  return Status::Ok();
}

std::vector<wire::DiagnosticResult> NodeAgent::DiagnosticReports() {
  std::vector<wire::DiagnosticResult> reports;
  for (auto& [id, run] : diagnostics_) {
    if (run.running.valid() &&
        run.running.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      run.result = run.running.get();
    }
    reports.push_back(run.result);
  }
  return reports;
}

std::map<std::string, std::string> NodeAgent::DiagnosedGpus() const {
  std::map<std::string, std::string> diagnosed;
  for (const auto& [id, run] : diagnostics_) {
    if (run.running.valid() || run.result.phase == wire::DiagnosticPhase::kRunning) {
      diagnosed[run.wanted.gpu_uuid] = id;
    }
  }
  return diagnosed;
}

void NodeAgent::ApplyDiagnostics(const std::vector<wire::DesiredDiagnostic>& wanted,
                                 const std::map<std::string, std::string>& live) {
  std::set<std::string> wanted_ids;
  for (const wire::DesiredDiagnostic& diagnostic : wanted) {
    wanted_ids.insert(diagnostic.id);
  }
  std::erase_if(diagnostics_, [&](const auto& entry) {
    return wanted_ids.count(entry.first) == 0 && !entry.second.running.valid();
  });
  for (const wire::DesiredDiagnostic& diagnostic : wanted) {
    const std::map<std::string, std::string> diagnosed = DiagnosedGpus();
    auto [it, added] = diagnostics_.try_emplace(diagnostic.id);
    DiagnosticRun& run = it->second;
    if (!added && run.result.phase != wire::DiagnosticPhase::kWaiting) {
      continue;  // each id runs once
    }
    run.wanted = diagnostic;
    run.result = wire::DiagnosticResult{.id = diagnostic.id};
    const auto index = gpu_index_by_uuid_.find(diagnostic.gpu_uuid);
    if (options_.diagnostics == nullptr) {
      run.result.phase = wire::DiagnosticPhase::kUnavailable;
      run.result.summary = "this agent runs no diagnostics";
    } else if (index == gpu_index_by_uuid_.end() || index->second != diagnostic.gpu_index) {
      run.result.phase = wire::DiagnosticPhase::kUnavailable;
      run.result.summary = fmt::format("no GPU {} at index {} on this node", diagnostic.gpu_uuid,
                                       diagnostic.gpu_index);
    } else if (const auto task = live.find(diagnostic.gpu_uuid); task != live.end()) {
      run.result.phase = wire::DiagnosticPhase::kWaiting;
      run.result.summary = fmt::format("{} is held by task {}", diagnostic.gpu_uuid, task->second);
    } else if (const auto other = diagnosed.find(diagnostic.gpu_uuid); other != diagnosed.end()) {
      run.result.phase = wire::DiagnosticPhase::kWaiting;
      run.result.summary =
          fmt::format("{} is under diagnostic {}", diagnostic.gpu_uuid, other->second);
    } else if (options_.diagnostics_inline) {
      run.result = RunDiagnostic(diagnostic);
    } else {
      run.result.phase = wire::DiagnosticPhase::kRunning;
      run.running =
          std::async(std::launch::async, [this, diagnostic] { return RunDiagnostic(diagnostic); });
    }
  }
}

wire::DiagnosticResult NodeAgent::RunDiagnostic(const wire::DesiredDiagnostic& wanted) const {
  wire::DiagnosticResult result{.id = wanted.id, .phase = wire::DiagnosticPhase::kUnavailable};
  Result<DiagnosticKind> kind = ParseDiagnosticKind(wanted.kind, "kind");
  Result<DiagnosticReport> report =
      kind.ok() ? options_.diagnostics->Run(wanted.gpu_index, *kind) : kind.status();
  if (!report.ok()) {
    result.summary = report.status().message();
    return result;
  }
  switch (report->verdict) {
    case DiagnosticVerdict::kPassed:
      result.phase = wire::DiagnosticPhase::kPassed;
      break;
    case DiagnosticVerdict::kFailed:
      result.phase = wire::DiagnosticPhase::kFailed;
      break;
    case DiagnosticVerdict::kUnavailable:
      break;
  }
  result.summary = report->Summary().substr(0, wire::kMaxDiagnosticSummaryBytes);
  result.exit_code = report->exit_code;
  result.output = report->output;
  result.took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(report->took).count();
  return result;
}

}  // namespace gpufleet::agent
