// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/outcome.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpufleet/reliability/xid_catalog.h"

namespace gpufleet::reliability {

const char* ExitReasonName(ExitReason reason) {
  switch (reason) {
    case ExitReason::kSucceeded:
      return "succeeded";
    case ExitReason::kCancelled:
      return "cancelled";
    case ExitReason::kPreempted:
      return "preempted";
    case ExitReason::kAppError:
      return "app-error";
    case ExitReason::kInfraError:
      return "infra-error";
    case ExitReason::kHang:
      return "hang";
  }
  return "unknown";
}

const char* HealthSeverityName(HealthSeverity severity) {
  return severity == HealthSeverity::kFail ? "fail" : "warn";
}

const char* FailureKindName(FailureKind kind) {
  switch (kind) {
    case FailureKind::kNone:
      return "none";
    case FailureKind::kApplication:
      return "application";
    case FailureKind::kAttributed:
      return "attributed";
    case FailureKind::kUnattributed:
      return "unattributed";
  }
  return "unknown";
}

Status ValidateOutcome(const OutcomeRecord& record, const FleetInventory& inventory) {
  if (record.job.empty()) {
    return InvalidArgumentError("job: empty id");
  }
  if (record.attempt < 0) {
    return InvalidArgumentError(fmt::format("attempt: {} (must be >= 0)", record.attempt));
  }
  if (record.end < record.start) {
    return InvalidArgumentError(
        fmt::format("end: {} ns is before start {} ns", record.end.nanos, record.start.nanos));
  }
  std::set<std::string> gpus;
  std::set<std::string> nodes_of_gpus;
  for (size_t i = 0; i < record.gpus.size(); ++i) {
    const std::string& uuid = record.gpus[i].value();
    const int index = inventory.GpuIndex(uuid);
    if (index < 0) {
      return InvalidArgumentError(fmt::format("gpus[{}]: unknown GPU \"{}\"", i, uuid));
    }
    if (!gpus.insert(uuid).second) {
      return InvalidArgumentError(fmt::format("gpus[{}]: GPU \"{}\" listed twice", i, uuid));
    }
    nodes_of_gpus.insert(inventory.node_id(inventory.node_of_gpu(index)).value());
  }
  std::set<std::string> nodes;
  for (size_t i = 0; i < record.nodes.size(); ++i) {
    const std::string& id = record.nodes[i].value();
    if (inventory.NodeIndex(id) < 0) {
      return InvalidArgumentError(fmt::format("nodes[{}]: unknown node \"{}\"", i, id));
    }
    if (!nodes.insert(id).second) {
      return InvalidArgumentError(fmt::format("nodes[{}]: node \"{}\" listed twice", i, id));
    }
  }
  if (record.gpus.empty() && record.nodes.empty()) {
    return InvalidArgumentError("gpus, nodes: the record holds no device");
  }
  if (!record.gpus.empty() && nodes != nodes_of_gpus) {
    return InvalidArgumentError(fmt::format("nodes: [{}] are not the nodes of the job's GPUs [{}]",
                                            fmt::join(nodes, ", "),
                                            fmt::join(nodes_of_gpus, ", ")));
  }
  for (size_t i = 0; i < record.xids.size(); ++i) {
    const XidEvent& event = record.xids[i];
    if (gpus.count(event.gpu.value()) == 0) {
      return InvalidArgumentError(
          fmt::format("xids[{}].gpu: \"{}\" is not one of the job's GPUs", i, event.gpu.value()));
    }
    if (event.xid < 1 || event.xid > 1023) {
      return InvalidArgumentError(fmt::format("xids[{}].xid: {} (must be 1..1023)", i, event.xid));
    }
  }
  for (size_t i = 0; i < record.health_events.size(); ++i) {
    const HealthEvent& event = record.health_events[i];
    if (nodes.count(event.node.value()) == 0) {
      return InvalidArgumentError(fmt::format(
          "health_events[{}].node: \"{}\" is not one of the job's nodes", i, event.node.value()));
    }
    if (!event.gpu.empty()) {
      const int index = inventory.GpuIndex(event.gpu.value());
      if (gpus.count(event.gpu.value()) == 0 ||
          inventory.node_id(inventory.node_of_gpu(index)) != event.node) {
        return InvalidArgumentError(
            fmt::format("health_events[{}].gpu: \"{}\" is not a GPU the job held on node \"{}\"", i,
                        event.gpu.value(), event.node.value()));
      }
    }
    if (event.check.empty()) {
      return InvalidArgumentError(fmt::format("health_events[{}].check: empty", i));
    }
  }
  return Status::Ok();
}

FailureAttribution AttributeFailure(const OutcomeRecord& record) {
  FailureAttribution attribution;
  switch (record.exit_reason) {
    case ExitReason::kSucceeded:
    case ExitReason::kCancelled:
    case ExitReason::kPreempted:
      return attribution;
    case ExitReason::kAppError:
    case ExitReason::kInfraError:
    case ExitReason::kHang:
      break;
  }
  auto add_gpu = [&](const GpuUuid& gpu) {
    if (std::find(attribution.gpus.begin(), attribution.gpus.end(), gpu) ==
        attribution.gpus.end()) {
      attribution.gpus.push_back(gpu);
    }
  };
  for (const XidEvent& event : record.xids) {
    if (XidBlamesGpu(event.xid)) {
      add_gpu(event.gpu);
    }
  }
  for (const HealthEvent& event : record.health_events) {
    if (event.severity != HealthSeverity::kFail) {
      continue;
    }
    if (!event.gpu.empty()) {
      add_gpu(event.gpu);
    } else if (std::find(attribution.nodes.begin(), attribution.nodes.end(), event.node) ==
               attribution.nodes.end()) {
      attribution.nodes.push_back(event.node);
    }
  }
  if (!attribution.gpus.empty() || !attribution.nodes.empty()) {
    attribution.kind = FailureKind::kAttributed;
  } else if (record.exit_reason == ExitReason::kAppError) {
    attribution.kind = FailureKind::kApplication;
  } else {
    attribution.kind = FailureKind::kUnattributed;
  }
  return attribution;
}

}  // namespace gpufleet::reliability
