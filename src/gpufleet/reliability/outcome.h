// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/ids.h"
#include "gpufleet/core/status.h"
#include "gpufleet/reliability/inventory.h"

// Outcome records: how one run (attempt) of a job ended and what the devices it held reported
// meanwhile. They are the evidence the attribution engine weighs.
namespace gpufleet::reliability {

enum class ExitReason {
  kSucceeded,
  kCancelled,   // by its owner
  kPreempted,   // by the scheduler, or to drain a device
  kAppError,    // the job's code failed (non-zero exit, out of memory, ...)
  kInfraError,  // the platform failed it: device error, node lost, network
  kHang,        // stopped making progress (watchdog, NCCL timeout) with no cause of its own
};
const char* ExitReasonName(ExitReason reason);  // "succeeded", "app-error", ...

// An XID a GPU of the job reported during the run.
struct XidEvent {
  GpuUuid gpu;
  int xid = 0;
};

enum class HealthSeverity { kWarn, kFail };
const char* HealthSeverityName(HealthSeverity severity);

// A health check of a node (or of one GPU of it) that warned or failed during the run, e.g.
// "nvlink-down", "ib-link-flap", "ecc-dbe".
struct HealthEvent {
  NodeId node;
  GpuUuid gpu;  // empty: the node as a whole
  std::string check;
  HealthSeverity severity = HealthSeverity::kFail;
};

// One run of a job from start to end. Thread-compatible value type.
struct OutcomeRecord {
  JobId job;
  int attempt = 0;  // 0 for the first run, +1 for each requeue
  ExitReason exit_reason = ExitReason::kSucceeded;
  MonoTime start;
  MonoTime end;
  std::vector<GpuUuid> gpus;  // the GPUs it held
  std::vector<NodeId> nodes;  // the nodes of those GPUs (or the nodes of a CPU-only job)
  std::vector<XidEvent> xids;
  std::vector<HealthEvent> health_events;

  int size() const { return static_cast<int>(gpus.size()); }
  Duration duration() const { return end - start; }
};

// Checks `record` against the fleet: a job id, attempt >= 0, end not before start, known and
// distinct GPUs and nodes, `nodes` equal to the nodes of `gpus` (in any order; non-empty for a
// CPU-only job), XIDs in 1..1023 on GPUs the job held, health events on nodes (and GPUs) it held
// with a check name. kInvalidArgument naming the field and the value, e.g.
// `xids[2].gpu: "GPU-9" is not one of the job's GPUs`.
Status ValidateOutcome(const OutcomeRecord& record, const FleetInventory& inventory);

// What a record says about the cause of its end.
enum class FailureKind {
  kNone,          // not a failure: succeeded, cancelled or preempted
  kApplication,   // the job's own fault: says nothing about the devices
  kAttributed,    // a failure with devices named by hardware XIDs or failing health checks
  kUnattributed,  // an infrastructure failure (or hang) that names no device
};
const char* FailureKindName(FailureKind kind);

struct FailureAttribution {
  FailureKind kind = FailureKind::kNone;
  std::vector<GpuUuid> gpus;  // named by an XID that blames the GPU, or a failing GPU check
  std::vector<NodeId> nodes;  // named by a failing node check
};

// A succeeded, cancelled or preempted run is no failure whatever it reported. A failed run
// (application error, infrastructure error, hang) with a blaming XID (see xid_catalog.h) or a
// failing health check is attributed to those devices: hardware evidence outweighs an exit code
// that calls it an application error. Without such evidence an application error stays the
// job's, and an infrastructure error or hang is unattributed. Named devices are distinct and in
// first-seen order. REQUIRES: ValidateOutcome(record) is ok.
FailureAttribution AttributeFailure(const OutcomeRecord& record);

}  // namespace gpufleet::reliability
