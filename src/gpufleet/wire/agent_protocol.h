// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/image_reference.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"

// The agent <-> server protocol (docs/agent.md), JSON over HTTP:
//   POST /v1/agents/register          RegisterRequest  -> AgentReply
//   POST /v1/agents/NODE/heartbeat    HeartbeatRequest -> AgentReply
// The agent reports what it sees and runs; the server answers with the tasks the node should run
// (the desired state), and the agent starts what is missing and stops what is not wanted.
namespace gpufleet::wire {

// What the health rules ask for a GPU: nothing, no new work and drain once the running job ends,
// or stop its work now.
enum class DrainAction { kNone, kAfterJob, kNow };
const char* DrainActionName(DrainAction action);  // "none", "after-job", "now"

// The label an agent sets on its node ("true") when its GPU probe can change MIG layouts; the
// server plans new MIG layouts only on such nodes (the NVML probe only reads them).
inline constexpr std::string_view kMigLayoutsLabel = "gpufleet.io/mig-layouts";

// One MIG device of a MIG-enabled GPU as the agent sees it.
struct MigDeviceReport {
  std::string uuid;     // "MIG-...", what CUDA_VISIBLE_DEVICES names
  std::string profile;  // "3g.40gb"
  int start = 0;        // first memory slice of its placement

  friend bool operator==(const MigDeviceReport&, const MigDeviceReport&) = default;
};

// One GPU's health and telemetry summary as the agent judged it.
struct GpuReport {
  int index = 0;
  GpuHealth health = GpuHealth::kHealthy;  // Healthy, Degraded or Unhealthy
  std::vector<std::string> reasons;        // e.g. "XID 79: GPU has fallen off the bus"
  DrainAction drain = DrainAction::kNone;
  int thermal_headroom_c = 100;
  std::optional<int> utilization_pct;  // absent when not measured
  // MIG-enabled GPUs only: the instances that exist now. Absent for a GPU without MIG.
  std::optional<std::vector<MigDeviceReport>> mig_devices;
  // Why the GPU does not have the MIG layout the server last asked for; empty when it has it.
  std::string mig_error;
};

// kWaiting: the agent has not started the task because a live task of another run still holds one
// of its GPUs (it stops before it starts); `message` says which. kPulling: the task's image is
// being pulled and nothing of the task runs yet; `message` is the pull's progress.
enum class TaskPhase { kRunning, kSucceeded, kFailed, kWaiting, kPulling };
// "Running", "Succeeded", "Failed", "Waiting", "Pulling"
const char* TaskPhaseName(TaskPhase phase);

// The most of a Pulling report's progress message that the server keeps.
inline constexpr size_t kMaxPullProgressBytes = 200;

// A task the agent runs or ran. `id` is the id the server gave it (DesiredTask::id).
struct TaskReport {
  std::string id;
  TaskPhase phase = TaskPhase::kRunning;
  int exit_code = 0;
  std::string message;  // why it failed, e.g. "exit code 2", "killed by signal 9"
  std::optional<int> gpu_utilization_pct;
  // How long pulling the task's image took before its start (the podman runner); absent when
  // nothing was pulled.
  std::optional<int64_t> image_pull_ms;
  // The digest of the image the task's container runs ("sha256:<64 hex>"); empty for a process
  // or when the runner could not tell.
  std::string image_digest;
  // When the task last reported a checkpoint (its GPUFLEET_CHECKPOINT_FILE), in Unix seconds;
  // absent when it has not, or from an agent that does not read the file. Optional, so agents
  // of protocol 1.1 without it keep working.
  std::optional<int64_t> last_checkpoint_unix_s;
};

// The latest checkpoint time a task report may carry (in 2096): the server keeps it in Unix
// nanoseconds, which this keeps far from overflowing.
inline constexpr int64_t kMaxCheckpointUnixSeconds = 4'000'000'000;

// Bounds on a heartbeat's images, so that no agent can make its node document grow without
// limit: at most kMaxReportedImages images, kMaxReferencesPerImage references each, and
// kMaxImageReferenceBytes bytes of references in all.
inline constexpr size_t kMaxReportedImages = 256;
inline constexpr size_t kMaxReferencesPerImage = 8;
inline constexpr size_t kMaxImageReferenceBytes = 64 * 1024;

// The agent protocol's version (docs/operations.md, "Version skew"): the minor grows with each
// change an older server or agent must know about, the major only with a change that no server
// can bridge. An agent sends it in every registration and heartbeat.
struct ProtocolVersion {
  int major = 0;
  int minor = 0;

  friend auto operator<=>(const ProtocolVersion&, const ProtocolVersion&) = default;
};

// What this build speaks. 1.0 is the protocol of the agents released before versions were sent;
// 1.1 added "protocol" and "agent_version"; 1.2 added the desired task's "notice", which the
// server sends only to agents of 1.2 or later (kNoticeAgentProtocol).
inline constexpr ProtocolVersion kAgentProtocolVersion{1, 2};
// The first protocol whose agents take preemption notices (DesiredTask::notice): an older agent's
// strict reader would refuse the field, so it gets none, and its task the plain stop.
inline constexpr ProtocolVersion kNoticeAgentProtocol{1, 2};
// The version of a request without "protocol". Only agents released before 1.1 leave it out, and
// they speak exactly 1.0, so reading its absence as 1.0 serves them through the upgrade that
// brings 1.1 and refuses them, as too old, once a server no longer serves 1.0.
inline constexpr ProtocolVersion kUnversionedAgentProtocol{1, 0};

std::string ProtocolVersionName(ProtocolVersion version);  // "1.1"
// "MAJOR.MINOR"; kInvalidArgument naming the text otherwise.
Result<ProtocolVersion> ParseProtocolVersion(std::string_view text);

// The skew policy: a server serves agents of its own major and of its own minor or the one
// before; anything else is kFailedPrecondition naming both versions, the agent's build, and
// which side to upgrade (IsAgentProtocolRefusal).
Status CheckAgentProtocol(ProtocolVersion agent, std::string_view agent_version,
                          ProtocolVersion server);
// For a request the strict readers below refused: CheckAgentProtocol of the "protocol" (and
// "agent_version") `body` names. A newer agent's request may fail on a field this server does
// not know, and the agent should hear that its version is not served, not about the field. OK
// when `body` is not a JSON object or names no version outside the policy.
Status CheckProtocolOfRefusedRequest(std::string_view body, ProtocolVersion server);
// Whether `status` is a refusal by CheckAgentProtocol (also as the agent reads it back from the
// server's answer): the agent backs off instead of retrying at its usual pace.
bool IsAgentProtocolRefusal(const Status& status);

struct RegisterRequest {
  // The protocol the agent speaks and its build ("0.1.0 (commit 89cf5fc)"); a request without
  // "protocol" reads as kUnversionedAgentProtocol.
  ProtocolVersion protocol = kAgentProtocolVersion;
  std::string agent_version;

  // Inventory: name, capacity, labels (driver and CUDA versions under kDriverVersionLabel and
  // kCudaVersionLabel), fault domains, GPUs. node.topology[i] is the domain at topology_levels[i].
  Node node;
  std::vector<std::string> topology_levels;
  std::vector<GpuReport> gpus;
  std::vector<TaskReport> tasks;  // tasks still running from before an agent restart
  // Increasing from one report of an agent to the next (the agent's monotonic clock in
  // nanoseconds); 0: not given. The server takes no task's absence from a report older than one it
  // has already applied (a heartbeat that a slow network delivered late).
  int64_t sequence = 0;
};

// The label an agent sets on its node ("true") when it runs diagnostics: the server asks for
// them (AgentReply::diagnostics) only on such nodes, so an agent from before diagnostics never
// gets a field it would refuse.
inline constexpr std::string_view kDiagnosticsLabel = "gpufleet.io/diagnostics";

// A diagnostic the server wants run on one of the node's GPUs (docs/reliability.md, "The
// loop"). The server holds the GPU for it like for a task until the agent reports it ended.
struct DesiredDiagnostic {
  std::string id;  // unique: the agent runs each id once
  int gpu_index = 0;
  std::string gpu_uuid;  // the GPU the server means; a different GPU at the index is refused
  std::string kind = "builtin";  // "builtin" (NVML sanity and the device exercise) or "command"

  friend bool operator==(const DesiredDiagnostic&, const DesiredDiagnostic&) = default;
};

// kWaiting: not started, because a live task still holds the GPU; kUnavailable: it could not
// tell (no command configured, no driver), which says nothing of the device.
enum class DiagnosticPhase { kRunning, kWaiting, kPassed, kFailed, kUnavailable };
// "Running", "Waiting", "Passed", "Failed", "Unavailable"
const char* DiagnosticPhaseName(DiagnosticPhase phase);
inline bool IsFinal(DiagnosticPhase phase) {
  return phase != DiagnosticPhase::kRunning && phase != DiagnosticPhase::kWaiting;
}

struct DiagnosticResult {
  std::string id;  // DesiredDiagnostic::id
  DiagnosticPhase phase = DiagnosticPhase::kRunning;
  // The checks that decided, e.g. "nvml.ecc: XID 48 ...; cuda.pattern: 12 words differ".
  std::string summary;
  std::optional<int> exit_code;  // the site command's
  std::string output;            // the command's output, its last bytes
  int64_t took_ms = 0;

  friend bool operator==(const DiagnosticResult&, const DiagnosticResult&) = default;
};
inline constexpr size_t kMaxDiagnosticResults = 64;
inline constexpr size_t kMaxDiagnosticSummaryBytes = 1024;
inline constexpr size_t kMaxDiagnosticOutputBytes = 4096;

struct HeartbeatRequest {
  ProtocolVersion protocol = kAgentProtocolVersion;  // as RegisterRequest's
  std::string agent_version;
  std::vector<GpuReport> gpus;
  std::vector<TaskReport> tasks;
  // Set on the first heartbeat after the agent fenced itself (it could not renew its lease and
  // stopped its tasks): what it did, e.g. "lease of 40s not renewed: stopped 3 tasks". A node
  // event on the server.
  std::string fenced;
  int64_t sequence = 0;  // as RegisterRequest::sequence
  // The images the node holds, the whole list; absent: unchanged since the agent last sent it
  // (listing images is slow, so the agent sends them only when they change). The parser keeps
  // the server safe from a hostile list: entries past the bounds above, references that are not
  // valid OCI references and digests that are not sha256 digests are dropped, not refused (a
  // refused heartbeat would leave the node NotReady), and `images_dropped` says what was dropped
  // and why.
  std::optional<std::vector<CachedImage>> images;
  std::string images_dropped;
  // The node's NIC and link problems as the agent judged them ("mlx5_1/1: port DOWN ..."), the
  // whole list; empty when its links are healthy or not watched. The server labels the node
  // with kLinkDegradedLabel while there are any. The parser keeps the first
  // kMaxLinkProblems and cuts each at kMaxLinkProblemBytes, so a hostile list cannot grow the
  // node document.
  std::vector<std::string> link_problems;
  // The diagnostics the server asked for (AgentReply::diagnostics) that the agent still has: each
  // one running, waiting or with its result, until the server no longer asks for it. Sent only
  // when there are any, so a server from before diagnostics never sees the field. The parser
  // keeps the first kMaxDiagnosticResults and cuts summaries and outputs to their bounds.
  std::vector<DiagnosticResult> diagnostics;
};
inline constexpr size_t kMaxLinkProblems = 16;
inline constexpr size_t kMaxLinkProblemBytes = 200;

// The MIG instances one GPU must have: the full set, declarative like the tasks. The agent
// destroys the instances not listed and creates the missing ones at their start slots.
struct WantedMigLayout {
  int gpu_index = 0;
  std::vector<MigInstance> instances;  // profile and start; `in_use` is not carried
};

// The MIG instance a task runs on.
struct TaskMigInstance {
  int gpu_index = 0;
  std::string profile;  // "3g.40gb"
  int start = 0;
  std::string uuid;  // the MIG device as the agent reported it

  friend bool operator==(const TaskMigInstance&, const TaskMigInstance&) = default;
};

// A task the node should run.
// A task id: "JOB/TASK/ATTEMPT", JOB the job's key TEAM/NAME (it may hold a '/'), TASK
// "GROUP-REPLICA", e.g. "nlp/bert/workers-3/1", of at most kMaxTaskIdLength characters
// (core/workload.h), which is what the runner takes.
std::string MakeTaskId(std::string_view job, std::string_view task, int64_t attempt);
// The run a task id belongs to, the id without its TASK part ("JOB/ATTEMPT"): every task of one
// attempt of a job shares it (TaskLaunch::run_id). An id with fewer than three parts is its own
// run.
std::string RunIdOfTask(std::string_view task_id);
// kInvalidArgument naming metadata.name when a task id of `job`, stored under `key`, could
// exceed kMaxTaskIdLength (attempts of up to kAttemptDigits digits).
inline constexpr size_t kAttemptDigits = 6;
Status CheckTaskIdLength(std::string_view key, const Job& job);

// A preemption notice for a running task (docs/agent.md, "Preemption notices"): the agent sends
// the task `signal` once and writes `deadline_unix_s` to its notice file; the server stops the
// task at that deadline, or sooner once the task has reported a checkpoint.
struct TaskNotice {
  std::string signal;  // one NoticeSignalNumber takes, "SIGUSR1"
  int64_t deadline_unix_s = 0;

  friend bool operator==(const TaskNotice&, const TaskNotice&) = default;
};

struct DesiredTask {
  std::string id;    // MakeTaskId
  std::string job;   // the job's name, without its team
  std::string task;  // "workers-3"
  std::string team;  // the job's team and queue: labels of the GPU's metrics on the node
  std::string queue;
  std::vector<std::string> command;
  std::map<std::string, std::string> env;
  // Whole GPUs, the GPU a share is on, or the MIG devices ("MIG-...") of a MIG task.
  std::vector<std::string> gpu_uuids;
  int64_t gpu_milli = 0;  // GPU share in milli-GPU (1000 per whole GPU)
  // An MPS share (GpuSharing::kMps) of its one GPU: the agent starts it as a client of that GPU's
  // MPS control daemon, limited to `gpu_memory_mib` of GPU memory (0: no limit) and to
  // gpu_milli / 10 percent of the GPU's threads. Sent only for MPS shares.
  bool mps = false;
  int64_t gpu_memory_mib = 0;
  // The task's CPU and memory request: the limits of its cgroup on the node (0: none).
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  // A MIG task's instances, one per MIG device in `gpu_uuids`; empty for other tasks. The server
  // sends a MIG task once the agent has reported every one of its instances.
  std::vector<TaskMigInstance> mig_instances;
  // The container image the task runs in (an OCI reference, core/image_reference.h) and how the
  // node gets it; empty: the task runs as a process. `host_network` (a container task only):
  // the task shares the node's network instead of having none.
  std::string image;
  ImagePullPolicy image_pull_policy = ImagePullPolicy::kIfNotPresent;
  bool host_network = false;
  // Set while the task's job is under a preemption notice; sent to agents of
  // kNoticeAgentProtocol or later only.
  std::optional<TaskNotice> notice;
};

struct AgentReply {
  int64_t heartbeat_interval_ms = 10000;
  // The node's lease: an agent that has not renewed it (a heartbeat answered) for this long stops
  // its tasks (docs/agent.md, "Leases and fencing").
  int64_t lease_ms = 40000;
  // How long after the lease the server frees a lost node's GPUs: a fencing agent kills its tasks
  // well within it.
  int64_t stop_grace_ms = 30000;
  std::vector<DesiredTask> tasks;
  // The GPUs whose MIG instances must change, at most one entry per GPU.
  std::vector<WantedMigLayout> mig_layouts;
  // The diagnostics to run, each once, for nodes labelled kDiagnosticsLabel only; absent from
  // the JSON when empty.
  std::vector<DesiredDiagnostic> diagnostics;
  // Only in the answer to a registration with a fleet-wide join token: this node's own
  // credential, for every request from now on (the join token no longer acts for the node).
  std::string node_token;
};

// The label an agent sets on its node with the NVML library's version ("12.550.54.15"), beside
// kDriverVersionLabel and kCudaVersionLabel (`gpufleet report versions` reads all three).
inline constexpr std::string_view kNvmlVersionLabel = "gpufleet.io/nvml-version";

// The provenance of one run of one task (docs/provenance.md), what the agent saw when it started
// it: POST /v1/agents/NODE/provenance, once per task id (JOB/TASK/ATTEMPT). The server adds the
// node, the job's `provenance` map and labels, and stores it immutably.
struct ProvenanceGpu {
  std::string uuid;  // "GPU-..." or "MIG-..."
  std::string serial;
  std::string vbios_version;

  friend bool operator==(const ProvenanceGpu&, const ProvenanceGpu&) = default;
};

struct ProvenanceReport {
  std::string task_id;       // MakeTaskId
  std::string image;         // the reference the task was started with; empty for a process
  std::string image_digest;  // what the reference resolved to ("sha256:..."); empty if unknown
  std::string driver_version;
  std::string cuda_version;  // "12.4"
  std::string nvml_version;  // "12.550.54.15"
  std::vector<ProvenanceGpu> gpus;
  std::vector<std::string> command;
  // The names of the task's environment variables, sorted; never their values.
  std::vector<std::string> env_names;

  friend bool operator==(const ProvenanceReport&, const ProvenanceReport&) = default;
};

// Bounds of a provenance report, so that no agent can grow the store: the JSON body at most
// kMaxProvenanceReportBytes, at most kMaxProvenanceGpus GPUs and kMaxProvenanceEnvNames names,
// each version, serial, UUID and name at most kMaxProvenanceFieldBytes.
inline constexpr size_t kMaxProvenanceReportBytes = 64 * 1024;
inline constexpr size_t kMaxProvenanceGpus = 64;
inline constexpr size_t kMaxProvenanceEnvNames = 1024;
inline constexpr size_t kMaxProvenanceFieldBytes = 256;

// The tail of one task's log (its stdout and stderr), as the agent ships it (docs/agent.md,
// "Task logs"): POST /v1/agents/NODE/logs after a heartbeat, when the log grew. `text` is the
// last kMaxTaskLogTailBytes of the file at most (TaskLogReportToJson sends each byte that is not
// well-formed UTF-8 as '?'); `size` the file's whole size, so the reader knows how much came
// before; `final` once the task ended.
struct TaskLogReport {
  std::string task_id;  // MakeTaskId
  std::string text;
  int64_t size = 0;
  bool final = false;

  friend bool operator==(const TaskLogReport&, const TaskLogReport&) = default;
};
inline constexpr size_t kMaxTaskLogTailBytes = 16 * 1024;

std::string RegisterRequestToJson(const RegisterRequest& request);
std::string HeartbeatRequestToJson(const HeartbeatRequest& request);
std::string AgentReplyToJson(const AgentReply& reply);
std::string ProvenanceReportToJson(const ProvenanceReport& report);

// "3g.40gb at 0, 3g.40gb at 4" (events and errors); "none" for no instances.
std::string DescribeMigInstances(const std::vector<MigInstance>& instances);

// Strict readers: kInvalidArgument naming the field path and the value, e.g.
// `gpus[2].health: unknown "Sick" (valid: Healthy, Degraded, Unhealthy)`.
Result<RegisterRequest> ParseRegisterRequest(std::string_view text);
Result<HeartbeatRequest> ParseHeartbeatRequest(std::string_view text);
Result<AgentReply> ParseAgentReply(std::string_view text);
// Also refuses a report over the bounds above, an env name that is not [A-Za-z_][A-Za-z0-9_]*
// (so no "NAME=VALUE" passes), a duplicate name or GPU, and a bad image reference or digest.
Result<ProvenanceReport> ParseProvenanceReport(std::string_view text);
// Also refuses a text of more than kMaxTaskLogTailBytes, a negative size or one smaller than the
// text, and a task id that is empty or longer than kMaxTaskIdLength.
Result<TaskLogReport> ParseTaskLogReport(std::string_view text);
std::string TaskLogReportToJson(const TaskLogReport& report);

}  // namespace gpufleet::wire
