// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/ids.h"
#include "gpufleet/core/image_reference.h"
#include "gpufleet/core/resources.h"
#include "gpufleet/core/status.h"

namespace gpufleet {

// A task asks for GPUs in exactly one of these forms (or none: a CPU-only task).
struct NoGpu {
  friend bool operator==(const NoGpu&, const NoGpu&) = default;
};
// `count` whole GPUs, exclusively.
struct WholeGpus {
  int count = 1;
  friend bool operator==(const WholeGpus&, const WholeGpus&) = default;
};
// How the shares of one GPU run beside each other. Time-slicing: the driver switches between
// them and nothing holds a share to its fraction. MPS: one NVIDIA MPS control daemon per GPU, and
// each share's task is an MPS client limited to its memory and to its milli-GPU of the GPU's
// threads (docs/sharing.md). The scheduler never puts shares of both kinds on one GPU.
// kNodeDefault: the node's kGpuSharingLabel decides (time-slicing without one).
enum class GpuSharing { kNodeDefault, kTimeSlicing, kMps };
// "time-slicing", "mps"; "" for kNodeDefault.
std::string_view GpuSharingName(GpuSharing sharing);
// kInvalidArgument quoting `text` unless it is "time-slicing" or "mps".
Result<GpuSharing> ParseGpuSharing(std::string_view text);

// A share of one GPU: compute in milli-GPU (1..999) and, optionally, GPU memory in MiB.
struct FractionalGpu {
  int64_t gpu_milli = 0;
  int64_t gpu_memory_mib = 0;
  GpuSharing sharing = GpuSharing::kNodeDefault;
  friend bool operator==(const FractionalGpu&, const FractionalGpu&) = default;
};
// `count` MIG instances of one profile, e.g. {"3g.40gb", 2}.
struct MigGpus {
  std::string profile;
  int count = 1;
  friend bool operator==(const MigGpus&, const MigGpus&) = default;
};
using GpuRequest = std::variant<NoGpu, WholeGpus, FractionalGpu, MigGpus>;

// Milli-GPU a request holds: whole GPUs count 1000 each, a MIG instance its compute share.
int64_t RequestedGpuMilli(const GpuRequest& request);
std::string GpuRequestToString(const GpuRequest& request);

struct TaskRequest {
  HostResources host;
  GpuRequest gpus;
};

// `replicas` identical tasks. `command` and `env` are what the agent runs for each task; the
// scheduler ignores them. An empty command is allowed (the simulated fleet runs such tasks).
// With an `image` (an OCI reference, ValidateImageReference), each task runs in a container of
// that image (docs/containers.md); without one, as a process of the node.
struct TaskGroup {
  std::string name;
  int replicas = 1;
  TaskRequest request;
  std::vector<std::string> command;
  std::map<std::string, std::string> env;
  std::string image;
  ImagePullPolicy image_pull_policy = ImagePullPolicy::kIfNotPresent;
  // A container task shares the node's network namespace; otherwise it has no network at all.
  bool host_network = false;
  // An elastic group (`replicas: {min: M, max: N}`, docs/job-spec.md "Elastic jobs") runs at any
  // size from min_replicas to `replicas`; 0: always `replicas`. Last, so that positional
  // initializers of the fields above still compile.
  int min_replicas = 0;
};

// "All tasks inside one leaf, prefer one NVLink domain": required_level = "leaf",
// preferred_level = "nvlink-domain". Empty strings mean no constraint.
struct TopologyConstraint {
  std::string required_level;
  std::string preferred_level;
};

// Spread the tasks across the values of a fault-domain kind (e.g. "rack"): the task counts of any
// two eligible domains differ by at most `max_skew`.
struct SpreadConstraint {
  std::string fault_domain;
  int max_skew = 1;
};

enum class JobKind { kBatch, kInteractive, kInference };
const char* JobKindName(JobKind kind);

// What happens to a job when a node holding one of its tasks fails (NotReady, GPU lost): the
// whole gang goes back to Pending, or the job ends as Failed.
enum class NodeFailurePolicy { kRequeue, kFail };
const char* NodeFailurePolicyName(NodeFailurePolicy policy);  // "requeue", "fail"

// The signal a preemption victim gets as its notice (`spec.preemption.noticeSignal`), SIGUSR1
// unless the job names another.
inline constexpr std::string_view kDefaultNoticeSignal = "SIGUSR1";
// The most checkpoint grace a job may ask for (`spec.preemption.checkpointGraceSeconds`); the
// server may allow less (its --max-checkpoint-grace-s).
inline constexpr int64_t kMaxCheckpointGraceSeconds = 3600;
// The number of a signal a notice may be ("SIGUSR1" or "USR1": SIGHUP, SIGINT, SIGQUIT, SIGUSR1,
// SIGUSR2, SIGALRM, SIGTERM, SIGCONT, SIGURG, SIGWINCH); nullopt for any other name, among them
// the signals that stop a task or cannot be caught (SIGKILL, SIGSTOP, SIGTSTP, ...).
std::optional<int> NoticeSignalNumber(std::string_view name);
// The names NoticeSignalNumber takes, with the "SIG" prefix, for error messages.
std::string NoticeSignalNames();

inline constexpr size_t kMaxProvenanceEntries = 64;
inline constexpr size_t kMaxProvenanceBytes = 16 * 1024;

// The pseudo label key of `identicalStack` that stands for the digests a node holds the job's
// images at (from what its agent reports), not for a node label.
inline constexpr std::string_view kImageDigestStackKey = "gpufleet.io/image-digest";

// The longest id of one run of a task on a node (JOB/TASK/ATTEMPT) that agents and runners take.
inline constexpr size_t kMaxTaskIdLength = 200;

// A gang: every task of every group is placed, or none is. Thread-compatible value type.
struct Job {
  JobId id;
  std::vector<TaskGroup> groups;
  std::vector<std::string> allowed_gpu_models;  // empty: any model
  int64_t min_gpu_memory_mib = 0;
  std::map<std::string, std::string> node_selector;
  TopologyConstraint topology;
  SpreadConstraint spread;
  // Label keys (e.g. driver and CUDA versions) whose values must be equal on every node of the
  // gang. kImageDigestStackKey among them: the gang's nodes hold each task image at the same
  // digest, or none holds it (docs/provenance.md).
  std::vector<std::string> identical_stack_labels;
  // A digest the task images must resolve to (`identicalStack: {imageDigest: ...}`): nodes that
  // hold an image at another digest are left out, and agents pull it by this digest.
  std::string identical_image_digest;
  // The job's own labels (`metadata.labels`): shown to people and kept for selection; the
  // scheduler does not read them.
  std::map<std::string, std::string> labels;
  // What the user records about the run (code commit, dataset hash, hyperparameters): free-form,
  // kept with the job, read by no scheduler or agent decision. At most kMaxProvenanceEntries
  // entries and kMaxProvenanceBytes of keys and values together.
  std::map<std::string, std::string> provenance;
  int priority = 0;
  QueueId queue;
  bool preemptible = true;
  JobKind kind = JobKind::kBatch;
  Duration runtime_estimate{0};
  // How long the job runs before it may be preempted (`spec.preemption.minRuntime`); nullopt: its
  // queue's default, else the server's (docs/utilization.md, "Queues in the server").
  std::optional<Duration> min_runtime;
  // A preemption's notice (`spec.preemption.checkpointGraceSeconds` and `noticeSignal`): with a
  // grace above 0 a running victim first gets `notice_signal` (canonical "SIG..." name) and up to
  // that long to save a checkpoint before its stop (docs/job-spec.md, "Preemption notices").
  int64_t checkpoint_grace_seconds = 0;
  std::string notice_signal = std::string(kDefaultNoticeSignal);
  NodeFailurePolicy on_node_failure = NodeFailurePolicy::kRequeue;

  int TaskCount() const;
  int64_t RequestedGpuMilliTotal() const;

  // An elastic job has one task group, whose size may range (TaskGroup::min_replicas).
  bool IsElastic() const { return groups.size() == 1 && groups[0].min_replicas > 0; }
  // The job at `replicas` tasks of its elastic group, what the scheduler places for one size.
  // REQUIRES: IsElastic().
  Job AtSize(int replicas) const;

  // Checks the spec on its own: counts, ranges, known GPU models and MIG profiles. The error
  // names the field path and the bad value, e.g.
  // `groups[1].request.gpus.mig_profile: unknown profile "3g.45gb" for H100-80GB (valid: ...)`.
  Status Validate(const GpuCatalog& catalog) const;
};

}  // namespace gpufleet
