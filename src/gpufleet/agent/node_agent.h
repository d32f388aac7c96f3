// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gpufleet/agent/checkpoint_file.h"
#include "gpufleet/agent/diagnostics.h"
#include "gpufleet/agent/gpu_probe.h"
#include "gpufleet/agent/health.h"
#include "gpufleet/agent/mps_daemons.h"
#include "gpufleet/agent/telemetry.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/resources.h"
#include "gpufleet/core/status.h"
#include "gpufleet/http/client.h"
#include "gpufleet/runner/task_runner.h"
#include "gpufleet/wire/agent_protocol.h"

// The node agent's protocol side (docs/agent.md): it registers the node with the server, sends
// heartbeats with the GPUs' health, MIG devices and the tasks' states, makes the GPUs' MIG
// layouts match the ones the server wants, and makes the task runner match the tasks the server
// wants on this node.
namespace gpufleet::agent {

// A health verdict and the GPU's latest utilization, as the protocol carries them.
wire::GpuReport ToGpuReport(const GpuHealthReport& report, std::optional<int64_t> utilization_pct);
// Every GPU of the sampler's latest snapshot, as the protocol carries them.
std::vector<wire::GpuReport> GpuReportsFrom(const TelemetrySnapshot& snapshot);

// `devices` with a start slot each: the probe's when it read one, otherwise (the NVML probe does
// not read placements) the lowest start where the device fits, in GPU instance id order, which
// is where a GPU puts instances created in that order. A device of a profile the model does not
// have, or that fits nowhere, is left out.
std::vector<MigDeviceInfo> WithPlacementStarts(const GpuModelInfo& model,
                                               std::vector<MigDeviceInfo> devices);

struct NodeAgentOptions {
  std::string node_name;
  // This build's version, sent with every registration and heartbeat beside the protocol version
  // ("0.1.0 (commit 89cf5fc393b8)"); empty: not sent.
  std::string agent_version;
  // The node's place in the cluster: topology_values[i] is its domain at topology_levels[i]
  // (outermost first), e.g. {"block", "leaf"} and {"block-0", "leaf-3"}.
  std::vector<std::string> topology_levels;
  std::vector<std::string> topology_values;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> fault_domains;
  HostResources capacity;
  // GPUs of one node sharing NVLink: all of them unless told otherwise (one domain per node).
  int gpus_per_nvlink_domain = 0;
  // Per-task log files go here as TASK-ID.log ('/' in the id becomes '_'). The agent ships
  // each log's tail to the server (docs/agent.md, "Task logs"), at most every log_ship_interval
  // while the task runs and once when it ends, and cuts a log that passes max_log_bytes back to
  // nothing (with a line saying so) so that no task fills the node's disk.
  std::string log_dir;
  Duration log_ship_interval = std::chrono::seconds(30);
  int64_t max_log_bytes = int64_t{64} * 1024 * 1024;
  // Per-task checkpoint files (agent/checkpoint_file.h) go here as TASK-ID.checkpoint, read at
  // each report, and the agent's preemption notices as TASK-ID.notice; a directory that only the
  // agent can write to and task users can search (0711). Empty: tasks get neither file (a notice
  // is then the signal alone).
  std::string checkpoint_dir;
  // SIGTERM to SIGKILL when the server no longer wants a task.
  Duration stop_grace = std::chrono::seconds(30);
  // Fencing: the agent stops its tasks once its lease (AgentReply::lease_ms, renewed by every
  // answered heartbeat) is within fence_margin of running out, counted from when the renewing
  // heartbeat was sent; the runner's tasks hold the same deadline themselves
  // (TaskRunner::RenewLease), so they stop even if the agent has died. The margin covers the
  // longest a heartbeat can block before the agent checks again (three 5 s HTTP timeouts and
  // the one-second check period of `gpufleet agent`), so its tasks are gone by the time the
  // server frees their GPUs (lease + stop grace after it last heard from the node;
  // docs/agent.md, "Leases and fencing"). A lease shorter than twice the margin is cut by half
  // of it instead.
  Duration fence_margin = std::chrono::seconds(16);
  // The node credential an earlier run of the agent was given (NodeAgent::node_token); empty: the
  // client's token is a join token to exchange at registration.
  std::string node_token;
  // How often the agent lists the node's images again (TaskRunner::ListImages, a run of the
  // container engine) when it started no container meanwhile; after a container start (whose
  // pull may have added an image) it lists them at the next heartbeat. A heartbeat carries the
  // images only when they differ from what the server last took.
  Duration image_list_interval = std::chrono::minutes(5);
  // The MPS control daemons of the GPUs with MPS shares (mps_daemons.h); an empty state_dir:
  // the agent runs none, and an MPS share it is given fails with that reason.
  MpsDaemonOptions mps;
  // Runs the diagnostics the server asks for (AgentReply::diagnostics); null: none, and the node
  // is not labelled wire::kDiagnosticsLabel, so the server asks for none. Must outlive the agent,
  // whose destruction waits for a diagnostic still running (a command, at most its timeout).
  DiagnosticRunner* diagnostics = nullptr;
  // Runs each diagnostic within the heartbeat that asks for it, instead of on a thread of its
  // own: for simulated nodes, whose exercise takes no time and whose runs must repeat exactly.
  bool diagnostics_inline = false;
};

class NodeAgent {
 public:
  // Everything passed by reference must outlive the agent. The telemetry sampler is the probe's
  // one reader (so that every XID is seen once): the agent takes the inventory, health and
  // utilization from its latest snapshot, and uses `probe` only to change MIG layouts (then
  // asks the sampler to read the inventory again).
  NodeAgent(NodeAgentOptions options, TelemetrySampler& telemetry, GpuProbe& probe,
            runner::TaskRunner& runner, http::ApiClient& client, const GpuCatalog& catalog,
            const Clock& clock);

  // Registers the node (inventory from telemetry with the MIG instances, labels with the driver
  // and CUDA versions, and wire::kMigLayoutsLabel when the probe can change MIG layouts) and
  // the tasks the runner still has from before a restart, then applies the answer: tasks the
  // server still wants are adopted, the others stopped. kInvalidArgument for a GPU model the
  // catalog does not know; the server's error as it wrote it.
  Status Register();

  // One heartbeat: reports GPU health, MIG devices and every task's state, then applies the MIG
  // layouts the server wants (an error is reported in the next heartbeat, as the GPU's
  // mig_error), stops the tasks that are not wanted and then starts the wanted ones that are
  // missing, except a task whose GPU or MIG device a live task of another run still holds: that
  // one is reported Waiting until the holder has ended. Final states are forgotten once the
  // server has taken them. A heartbeat that fails fences the node when the lease has run out
  // (FenceIfLeaseExpired). kFailedPrecondition before Register succeeded.
  Status Heartbeat();

  // Once per lease that ran out (not renewed for lease - fence_margin): the runner stops every
  // task at that deadline by itself (TaskRunner::RenewLease: SIGTERM, then SIGKILL after the
  // grace, which ends fence_margin before the server's own stop grace, AgentReply::stop_grace_ms);
  // the agent counts the tasks it stopped and says so at the next heartbeat
  // (HeartbeatRequest::fenced). Returns that count (0 while the lease holds, and after the first
  // call for a deadline). `gpufleet agent` calls it every second as well, so a server that stays
  // silent is noticed without a heartbeat.
  int FenceIfLeaseExpired();

  // Stops the MPS daemons of GPUs that no task may still use (MpsDaemons::StopUnused: none of
  // the runner's tasks holds the GPU unless it has ended, and no wanted MPS share is on it), and
  // kills those that outlived their quit grace. Heartbeat calls it, and `gpufleet agent` every
  // second, so a daemon is killed on time without a heartbeat.
  void TendMpsDaemons();
  const MpsDaemons& mps_daemons() const { return mps_; }

  // The node credential the server gave this agent for its join token at registration (it uses
  // it from then on); empty while it has none. `gpufleet agent` keeps it in its state directory.
  const std::string& node_token() const { return node_token_; }

  // Provenance records (docs/provenance.md) of started tasks that the server has not taken yet,
  // by task id; each heartbeat sends them again until the server stores or refuses them.
  const std::map<std::string, wire::ProvenanceReport>& pending_provenance() const {
    return provenance_pending_;
  }
  // Why the server refused the last record it refused for good; empty if none was.
  const std::string& provenance_refused() const { return provenance_refused_; }

  // Checkpoint lines ignored and checkpoint files refused, by reason ("not a number", "a
  // symbolic link", ...): each counted once, when the file changes.
  const std::map<std::string, int64_t>& checkpoint_rejections() const {
    return checkpoint_rejections_;
  }

  // Why the last notice that failed was not delivered whole (its file or its signal); empty if
  // none failed. The server stops the task at the notice's deadline all the same.
  const std::string& notice_error() const { return notice_error_; }

  // What the server asked for at the last answer.
  Duration heartbeat_interval() const { return heartbeat_interval_; }
  const std::vector<wire::DesiredTask>& desired_tasks() const { return desired_; }
  // GPU UUID -> NVML index, from the inventory at registration.
  const std::map<std::string, int>& gpu_index_by_uuid() const { return gpu_index_by_uuid_; }
  // The MIG devices of each MIG-enabled GPU, by index, as last read or made; with start slots.
  const std::map<int, std::vector<MigDeviceInfo>>& mig_devices() const { return mig_devices_; }

 private:
  std::vector<wire::TaskReport> TaskReports(const std::vector<runner::TaskStatus>& statuses) const;
  std::vector<wire::GpuReport> GpuReports() const;
  // Every diagnostic the agent still has, with the results of those that ended since the last
  // call collected from their threads.
  std::vector<wire::DiagnosticResult> DiagnosticReports();
  // Starts the wanted diagnostics not started yet, unless a live task (`live`: GPU UUID -> task
  // id) or another diagnostic holds the GPU (then Waiting), and forgets ended ones the server no
  // longer asks for. One still running stays, reported Running, until it ends.
  void ApplyDiagnostics(const std::vector<wire::DesiredDiagnostic>& wanted,
                        const std::map<std::string, std::string>& live);
  // The GPUs under a running diagnostic: UUID -> diagnostic id.
  std::map<std::string, std::string> DiagnosedGpus() const;
  wire::DiagnosticResult RunDiagnostic(const wire::DesiredDiagnostic& wanted) const;
  Status Apply(const wire::AgentReply& reply, const std::vector<runner::TaskStatus>& reported);
  // Applies one wanted layout through the probe; the error to report when it was not applied.
  std::optional<std::string> ApplyMigLayout(const wire::WantedMigLayout& layout,
                                            const std::vector<runner::TaskStatus>& tasks);
  std::string LogPath(const std::string& task_id) const;
  std::string CheckpointPath(const std::string& task_id) const;
  // Where a task's preemption notice is written, beside its checkpoint file.
  std::string NoticePath(const std::string& task_id) const;
  // Delivers the notices of the desired tasks that have not had theirs: the notice file first
  // (so that the task's handler finds it), then the signal, once per task and deadline.
  void DeliverNotices();
  // Reads the checkpoint files of the runner's tasks that changed since the last read.
  void ReadCheckpoints(const std::vector<runner::TaskStatus>& statuses);
  // The provenance record of a task this agent just started (`status` is the runner's, for the
  // image digest), from the telemetry's inventory.
  wire::ProvenanceReport ProvenanceOf(const runner::TaskLaunch& launch,
                                      const runner::TaskStatus& status) const;
  // Makes the records of the tasks whose image pull has ended and whose container started;
  // whether it made any.
  bool RecordPulledProvenance(const std::vector<runner::TaskStatus>& statuses);
  // Posts the pending records; keeps those the server could not take now (unavailable).
  void SendProvenance();
  // Ships the tail of each reported task's log that grew since it was last shipped (at most
  // every log_ship_interval while it runs; once more when it ended), cutting a log past
  // max_log_bytes first. A refused or failed shipment is tried again at the next interval.
  void ShipLogs(const std::vector<runner::TaskStatus>& statuses);

  // Sends a register or heartbeat request; a success renews the lease from the time of sending,
  // in the agent and in the runner (TaskRunner::RenewLease), whose error it returns.
  Result<wire::AgentReply> SendRenewing(const std::string& path, const std::string& body);
  // Lists the runner's images when they are due (image_list_interval, or a container started);
  // returns them when the server has not taken this list yet.
  std::optional<std::vector<CachedImage>> ImagesToReport();
  // How long before a lease runs out the agent fences, and the grace it then gives its tasks.
  Duration FenceMargin(Duration lease) const;
  Duration FenceGrace(Duration server_stop_grace) const;

  NodeAgentOptions options_;
  TelemetrySampler& telemetry_;
  GpuProbe& probe_;
  runner::TaskRunner& runner_;
  http::ApiClient& client_;
  const GpuCatalog& catalog_;
  const Clock& clock_;

  bool registered_ = false;
  // When the heartbeat that last renewed the lease was sent; before the first renewal, when this
  // agent was made (a restarted agent may have adopted tasks whose lease ran meanwhile).
  MonoTime renewed_at_;
  Duration lease_ = std::chrono::seconds(40);
  Duration server_stop_grace_ = std::chrono::seconds(30);
  std::string fenced_;  // what the last fencing did, until a heartbeat has reported it
  std::optional<MonoTime> fenced_deadline_;  // the lease deadline fenced_ was made for
  std::string node_token_;
  Duration heartbeat_interval_ = std::chrono::seconds(10);
  std::vector<wire::DesiredTask> desired_;
  std::map<std::string, int> gpu_index_by_uuid_;
  std::map<int, std::string> model_by_gpu_;  // canonical catalog names of MIG-enabled GPUs
  std::map<int, std::vector<MigDeviceInfo>> mig_devices_;
  std::map<int, std::string> mig_errors_;  // why a wanted layout was not applied, by GPU
  // Tasks the runner refused (bad launch): reported as Failed once, then dropped.
  std::map<std::string, std::string> refused_;
  // Wanted tasks not started because a live task of another run holds one of their devices:
  // reported as Waiting with why, and tried again at the next answer.
  std::map<std::string, std::string> waiting_;
  // The node's images as last listed, when; whether the server has taken that list; whether a
  // container started since (its pull may have added an image).
  std::vector<CachedImage> images_;
  bool images_known_ = false;  // a list succeeded once
  std::optional<MonoTime> images_listed_at_;
  bool images_sent_ = false;
  bool images_stale_ = false;
  bool was_pulling_ = false;  // a task's image was being pulled at the last heartbeat
  std::map<std::string, wire::ProvenanceReport> provenance_pending_;
  // Per task: the log size last shipped, whether the final tail was, and when it was last tried.
  struct ShippedLog {
    int64_t size = -1;
    bool final = false;
    std::optional<MonoTime> tried_at;
  };
  std::map<std::string, ShippedLog> shipped_logs_;
  // Each task's checkpoint file as last read, by task id; `unix_seconds` keeps the last
  // well-formed line's time when a later line is ignored.
  std::map<std::string, CheckpointRead> checkpoints_;
  std::map<std::string, int64_t> checkpoint_rejections_;
  // The deadline of the notice each task last got, by task id.
  std::map<std::string, int64_t> noticed_;
  std::string notice_error_;
  // The launches of tasks whose image is being pulled or whose container is being made: their
  // record is made once the container has started (the runner knows the digest then).
  std::map<std::string, runner::TaskLaunch> awaiting_pull_;
  MpsDaemons mps_;
  std::string provenance_refused_;
  // The diagnostics the server asked for, by id: the result (Running or Waiting until it ends)
  // and, while it runs on a thread of its own, that thread's answer to come.
  struct DiagnosticRun {
    wire::DesiredDiagnostic wanted;
    wire::DiagnosticResult result;
    std::future<wire::DiagnosticResult> running;
  };
  std::map<std::string, DiagnosticRun> diagnostics_;
};

}  // namespace gpufleet::agent
