// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpufleet/agent/dcgm_metrics.h"
#include "gpufleet/agent/gpu_probe.h"
#include "gpufleet/agent/health.h"
#include "gpufleet/agent/link_health.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/periodic_thread.h"
#include "gpufleet/core/status.h"
#include "gpufleet/http/server.h"

namespace gpufleet::agent {

// One GPU as of the latest sample.
struct GpuTelemetry {
  GpuReading reading;  // identity, sample and the last XID (what /metrics shows)
  // XIDs seen since the agent started or the GPU was last reset (ClearXidHistory): code ->
  // count. Health rules read these, because an XID's verdict outlives the sample it came in.
  std::map<int, int64_t> xids_since_reset;
  // XIDs seen since the agent started, never cleared: what the per-XID counter exports.
  std::map<int, int64_t> xid_totals;
  GpuHealthReport health;
};

// Everything the sampler knows after one sample. Immutable once published.
struct TelemetrySnapshot {
  MonoTime sampled_at;
  int64_t sample_count = 0;  // samples taken so far, this one included
  std::string driver_version;
  std::string cuda_version;
  std::string nvml_version;
  std::vector<GpuTelemetry> gpus;  // by index
  // The node's NIC and link findings as of this sample; empty without a LinkMonitor.
  std::vector<LinkFinding> link_findings;
};

// Samples a GpuProbe at a fixed interval on its own thread, keeps the latest readings, XID
// history and health verdicts, and serves them as dcgm-exporter-compatible Prometheus text on
// /metrics. The node agent composes it with registration, heartbeats and the task runner; the
// loop is thin and calls SampleOnce(), which tests call directly.
//
// Thread-safe: every public method may be called from any thread (Start and Stop from the
// owning thread, not racing each other).
class TelemetrySampler {
 public:
  struct Options {
    GpuProbe& probe;     // must outlive the sampler
    const Clock& clock;  // timestamps of samples
    std::chrono::milliseconds interval{1000};
    std::string hostname;  // the Hostname label; empty leaves it out
    HealthOptions health;
    // Whether the GPU series carry the job, task, team and queue on them (SetGpuTasks): off by
    // default, as in dcgm-exporter, whose job labels need its HPC or Kubernetes mapping
    // configured. /metrics has no authentication, and the labels name every team's jobs.
    bool job_labels = false;
    // The node's NIC and link health, read at each sample and served after the GPUs' metrics;
    // null leaves links out. Must outlive the sampler.
    LinkMonitor* links = nullptr;
  };

  // Reads the probe's inventory. kInvalidArgument for an interval outside [10 ms, 1 h]; the
  // probe's error when the inventory cannot be read.
  static Result<std::unique_ptr<TelemetrySampler>> Create(Options options);
  ~TelemetrySampler();
  TelemetrySampler(const TelemetrySampler&) = delete;
  TelemetrySampler& operator=(const TelemetrySampler&) = delete;

  // Takes one sample (the links' too) and publishes a new snapshot. On a probe error the previous
  // snapshot stays and the error is counted (gpufleet_agent_sample_errors_total) and returned.
  // Samples never overlap.
  Status SampleOnce();

  // The latest snapshot; before the first sample, one with the inventory and no readings.
  std::shared_ptr<const TelemetrySnapshot> LatestSnapshot() const;

  // Forgets a GPU's XIDs for health purposes, after an operator reset it. kInvalidArgument for
  // an unknown index.
  Status ClearXidHistory(int gpu_index);

  // Re-reads the probe's inventory (after a MIG change). The next sample uses it.
  Status RefreshInventory();

  // The tasks now on the node's GPUs, for the job labels of the GPU series (DcgmRenderOptions);
  // rendered only with Options::job_labels.
  void SetGpuTasks(std::vector<GpuTask> tasks);

  // The /metrics body: dcgm-exporter's metrics, then gpufleet's own (per-XID counters, health,
  // clock-event reasons, sampler counters), then the links' (LinkMonitor::RenderMetrics).
  std::string RenderMetrics() const;

  // Binds host:port (0: an ephemeral port), starts the HTTP server and the sampling thread (which
  // samples at once, then every interval). Returns the bound port. kUnavailable when binding
  // fails; kFailedPrecondition when already started.
  Result<int> Start(const std::string& host, int port);
  // Stops both threads and joins them. Idempotent.
  void Stop();

 private:
  explicit TelemetrySampler(Options options, ProbeInventory inventory);

  Options options_;

  // Per-GPU XID state carried from sample to sample.
  struct XidState {
    int64_t last_xid = 0;
    std::map<int, int64_t> since_reset;
    std::map<int, int64_t> totals;
  };

  // REQUIRES: sample_mu_ held.
  Status ReadInventoryLocked();
  // Sets the XID fields and the health of `gpu` from its XID state.
  void Judge(const XidState& state, GpuTelemetry& gpu) const;
  void Publish(std::shared_ptr<const TelemetrySnapshot> snapshot);

  std::mutex sample_mu_;             // serialises samples and the state below
  ProbeInventory inventory_;         // guarded by sample_mu_
  std::vector<XidState> xid_state_;  // guarded by sample_mu_, by GPU index
  bool inventory_stale_ = false;     // guarded by sample_mu_

  mutable std::mutex snapshot_mu_;
  std::shared_ptr<const TelemetrySnapshot> snapshot_;  // guarded by snapshot_mu_
  int64_t sample_errors_ = 0;                          // guarded by snapshot_mu_
  std::vector<GpuTask> gpu_tasks_;                     // guarded by snapshot_mu_

  std::unique_ptr<http::Server> http_;
  PeriodicThread sampling_;
};

}  // namespace gpufleet::agent
