// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/telemetry.h"

#include <utility>

#include <fmt/core.h>

#include "gpufleet/http/server.h"

namespace gpufleet::agent {
namespace {

constexpr std::chrono::milliseconds kMinInterval{10};
constexpr std::chrono::hours kMaxInterval{1};
// The Prometheus text exposition format's content type.
constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";
// Scrapes are rare (every 15-30 s); two workers keep the agent's footprint small.
constexpr int kHttpThreads = 2;

int HealthValue(GpuHealth health) {
  switch (health) {
    case GpuHealth::kHealthy:
      return 0;
    case GpuHealth::kDegraded:
      return 1;
    case GpuHealth::kUnhealthy:
      return 2;
    case GpuHealth::kQuarantined:
      return 3;
  }
  return 2;
}

void AppendHeader(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

Result<std::unique_ptr<TelemetrySampler>> TelemetrySampler::Create(Options options) {
  if (options.interval < kMinInterval || options.interval > kMaxInterval) {
    return InvalidArgumentError(
        fmt::format("telemetry: interval {} ms outside [10 ms, 1 h]", options.interval.count()));
  }
  GPUFLEET_ASSIGN_OR_RETURN(ProbeInventory inventory, options.probe.Inventory());
  return std::unique_ptr<TelemetrySampler>(
      new TelemetrySampler(std::move(options), std::move(inventory)));
}

TelemetrySampler::TelemetrySampler(Options options, ProbeInventory inventory)
    : options_(std::move(options)), inventory_(std::move(inventory)) {
  xid_state_.resize(inventory_.gpus.size());
  auto first = std::make_shared<TelemetrySnapshot>();
  first->sampled_at = options_.clock.Now();
  first->driver_version = inventory_.driver_version;
  first->cuda_version = inventory_.cuda_version;
  first->nvml_version = inventory_.nvml_version;
  for (const GpuStaticInfo& info : inventory_.gpus) {
    GpuTelemetry gpu;
    gpu.reading.info = info;
    gpu.reading.sample.index = info.index;
    gpu.health.gpu_index = info.index;
    first->gpus.push_back(std::move(gpu));
  }
  snapshot_ = std::move(first);
}

TelemetrySampler::~TelemetrySampler() {
  Stop();
}

Status TelemetrySampler::ReadInventoryLocked() {
  GPUFLEET_ASSIGN_OR_RETURN(ProbeInventory inventory, options_.probe.Inventory());
  inventory_ = std::move(inventory);
  xid_state_.resize(inventory_.gpus.size());
  inventory_stale_ = false;
  return Status();
}

void TelemetrySampler::Judge(const XidState& state, GpuTelemetry& gpu) const {
  gpu.xids_since_reset = state.since_reset;
  gpu.xid_totals = state.totals;
  // A GPU that cannot report XIDs has no DCGM_FI_DEV_XID_ERRORS series, unless one came anyway.
  if (gpu.reading.sample.xid_events_supported || state.last_xid != 0) {
    gpu.reading.last_xid = state.last_xid;
  } else {
    gpu.reading.last_xid.reset();
  }
  gpu.health = EvaluateGpuHealth(gpu.reading.info, gpu.reading.sample, gpu.xids_since_reset,
                                 options_.health);
}

void TelemetrySampler::Publish(std::shared_ptr<const TelemetrySnapshot> snapshot) {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  snapshot_ = std::move(snapshot);
}

Status TelemetrySampler::SampleOnce() {
  std::lock_guard<std::mutex> lock(sample_mu_);
  if (options_.links != nullptr) {
    // A link read error is the monitor's to count; the GPUs are sampled all the same.
    static_cast<void>(options_.links->SampleOnce());
  }
  Status status;
  if (inventory_stale_) {
    status = ReadInventoryLocked();
  }
  Result<std::vector<GpuSample>> samples =
      status.ok() ? options_.probe.Sample() : Result<std::vector<GpuSample>>(status);
  if (samples.ok() && samples->size() != inventory_.gpus.size()) {
    // The probe sees a different set of GPUs than the inventory: read it again next time.
    inventory_stale_ = true;
    samples = UnavailableError(fmt::format("telemetry: the probe returned {} samples for {} GPUs",
                                           samples->size(), inventory_.gpus.size()));
  }
  if (!samples.ok()) {
    std::lock_guard<std::mutex> snapshot_lock(snapshot_mu_);
    ++sample_errors_;
    return samples.status();
  }

  auto snapshot = std::make_shared<TelemetrySnapshot>();
  snapshot->sampled_at = options_.clock.Now();
  snapshot->driver_version = inventory_.driver_version;
  snapshot->cuda_version = inventory_.cuda_version;
  snapshot->nvml_version = inventory_.nvml_version;
  if (options_.links != nullptr) {
    snapshot->link_findings = options_.links->Findings();
  }
  {
    std::lock_guard<std::mutex> snapshot_lock(snapshot_mu_);
    snapshot->sample_count = snapshot_->sample_count + 1;
  }
  for (size_t i = 0; i < samples->size(); ++i) {
    GpuSample& sample = (*samples)[i];
    XidState& state = xid_state_[i];
    for (const XidEvent& xid : sample.xids) {
      state.last_xid = xid.code;
      ++state.since_reset[xid.code];
      ++state.totals[xid.code];
    }
    GpuTelemetry gpu;
    gpu.reading.info = inventory_.gpus[i];
    gpu.reading.sample = std::move(sample);
    Judge(state, gpu);
    snapshot->gpus.push_back(std::move(gpu));
  }
  Publish(std::move(snapshot));
  return Status();
}

std::shared_ptr<const TelemetrySnapshot> TelemetrySampler::LatestSnapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  return snapshot_;
}

Status TelemetrySampler::ClearXidHistory(int gpu_index) {
  std::lock_guard<std::mutex> lock(sample_mu_);
  if (gpu_index < 0 || gpu_index >= static_cast<int>(xid_state_.size())) {
    return InvalidArgumentError(
        fmt::format("telemetry: gpu index {} outside [0, {})", gpu_index, xid_state_.size()));
  }
  xid_state_[static_cast<size_t>(gpu_index)].since_reset.clear();
  // Republish so that readers see the new verdict before the next sample.
  auto snapshot = std::make_shared<TelemetrySnapshot>(*LatestSnapshot());
  for (GpuTelemetry& gpu : snapshot->gpus) {
    if (gpu.reading.info.index == gpu_index) {
      Judge(xid_state_[static_cast<size_t>(gpu_index)], gpu);
    }
  }
  Publish(std::move(snapshot));
  return Status();
}

Status TelemetrySampler::RefreshInventory() {
  std::lock_guard<std::mutex> lock(sample_mu_);
  return ReadInventoryLocked();
}

void TelemetrySampler::SetGpuTasks(std::vector<GpuTask> tasks) {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  gpu_tasks_ = std::move(tasks);
}

std::string TelemetrySampler::RenderMetrics() const {
  const std::shared_ptr<const TelemetrySnapshot> snapshot = LatestSnapshot();
  int64_t sample_errors = 0;
  std::vector<GpuTask> tasks;
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    sample_errors = sample_errors_;
    if (options_.job_labels) {
      tasks = gpu_tasks_;
    }
  }
  std::vector<GpuReading> readings;
  readings.reserve(snapshot->gpus.size());
  std::vector<std::string> labels;
  for (const GpuTelemetry& gpu : snapshot->gpus) {
    readings.push_back(gpu.reading);
    labels.push_back(DcgmGpuLabels(gpu.reading.info, nullptr, options_.hostname));
  }
  std::string out = snapshot->sample_count == 0
                        ? std::string()
                        : RenderDcgmMetrics(readings, {.hostname = options_.hostname,
                                                       .driver_version = snapshot->driver_version,
                                                       .tasks = std::move(tasks)});
  if (snapshot->sample_count > 0) {
    AppendHeader(out, "gpufleet_gpu_xid_errors_total", "counter",
                 "XID errors the driver reported since the agent started, by XID.");
    for (size_t i = 0; i < snapshot->gpus.size(); ++i) {
      for (const auto& [code, count] : snapshot->gpus[i].xid_totals) {
        out += fmt::format("gpufleet_gpu_xid_errors_total{{{},xid=\"{}\"}} {}\n", labels[i], code,
                           count);
      }
    }
    AppendHeader(out, "gpufleet_gpu_health", "gauge",
                 "Health verdict of the GPU: 0 healthy, 1 degraded, 2 unhealthy.");
    for (size_t i = 0; i < snapshot->gpus.size(); ++i) {
      out += fmt::format("gpufleet_gpu_health{{{}}} {}\n", labels[i],
                         HealthValue(snapshot->gpus[i].health.health));
    }
    AppendHeader(out, "gpufleet_gpu_drain", "gauge",
                 "Drain the health rules ask for: 0 none, 1 after the running job, 2 now.");
    for (size_t i = 0; i < snapshot->gpus.size(); ++i) {
      out += fmt::format("gpufleet_gpu_drain{{{}}} {}\n", labels[i],
                         static_cast<int>(snapshot->gpus[i].health.drain));
    }
    AppendHeader(out, "gpufleet_gpu_lost", "gauge",
                 "Whether the GPU has stopped answering (NVML_ERROR_GPU_IS_LOST).");
    for (size_t i = 0; i < snapshot->gpus.size(); ++i) {
      out += fmt::format("gpufleet_gpu_lost{{{}}} {}\n", labels[i],
                         snapshot->gpus[i].reading.sample.lost ? 1 : 0);
    }
    AppendHeader(out, "gpufleet_gpu_clocks_event_reasons", "gauge",
                 "Current clock event (throttle) reasons, a bitmask of nvmlClocksEventReason "
                 "values.");
    for (size_t i = 0; i < snapshot->gpus.size(); ++i) {
      const std::optional<uint64_t>& reasons =
          snapshot->gpus[i].reading.sample.clocks_event_reasons;
      if (reasons.has_value()) {
        out += fmt::format("gpufleet_gpu_clocks_event_reasons{{{}}} {}\n", labels[i], *reasons);
      }
    }
  }
  AppendHeader(out, "gpufleet_agent_samples_total", "counter",
               "GPU samples the telemetry sampler has taken.");
  out += fmt::format("gpufleet_agent_samples_total {}\n", snapshot->sample_count);
  AppendHeader(out, "gpufleet_agent_sample_errors_total", "counter",
               "GPU samples that failed because the probe could not be read.");
  out += fmt::format("gpufleet_agent_sample_errors_total {}\n", sample_errors);
  if (options_.links != nullptr) {
    out += options_.links->RenderMetrics();
  }
  return out;
}

Result<int> TelemetrySampler::Start(const std::string& host, int port) {
  if (sampling_.running()) {
    return FailedPreconditionError("telemetry: already started");
  }
  http::ServerOptions http_options;
  http_options.host = host;
  http_options.port = port;
  http_options.io_threads = 1;
  http_options.agent_threads = 1;
  http_options.user_threads = kHttpThreads;
  Result<std::unique_ptr<http::Server>> server = http::Server::Start(
      std::move(http_options),
      [this](const http::Request& request) {
        if (request.method == "GET" && request.path == "/metrics") {
          return http::Response{200, kMetricsContentType, RenderMetrics()};
        }
        return http::Response{404, "text/plain",
                              fmt::format("no route {} {}\n", request.method, request.path)};
      },
      [](std::string_view, std::string_view) { return http::Lane::kUser; },
      [](int status, const std::string& message) {
        return http::Response{status, "text/plain", message + "\n"};
      });
  if (!server.ok()) {
    return UnavailableError(fmt::format("telemetry: {}", server.status().message()));
  }
  http_ = std::move(server).value();
  // A failed sample is counted in the metrics; the next one tries again.
  sampling_.Start(options_.interval, [this] { static_cast<void>(SampleOnce()); });
  return http_->port();
}

void TelemetrySampler::Stop() {
  if (!sampling_.running()) {
    return;
  }
  sampling_.Stop();
  http_->Stop();
  http_.reset();
}

}  // namespace gpufleet::agent
