// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/scheduler/snapshot.h"

// Whether a job could ever start on the fleet as it is built: every node empty, healthy and Ready.
// A job that no node could hold (more GPUs per task than any node it may use has, a GPU model or
// MIG profile the fleet lacks, a node selector no node matches, more GPUs in all than the fleet
// has) waits for nothing that running jobs could free. The server warns at submit, states it as
// the job's reason ("never fits: ...") and explain gives `never` (docs/explain.md). The fleet may
// grow: the answer holds for this snapshot only, and the caller asks again when nodes change.
// Pure: no IO, no clock.
namespace gpufleet::policy {

struct NeverFits {
  // What is missing, in the units of the spec, naming the largest node or the missing label:
  // `16 GPUs per task: the largest node it may use, node-3, has 8 (H100-80GB)`.
  std::string message;
  // The spec field it concerns: "spec.tasks[0].resources.gpus", "spec.gpuModels",
  // "spec.nodeSelector", ...
  std::string field;
};

// nullopt when some set of nodes of `snapshot` could hold `job` once empty (what is taken now,
// GPU health and node state are not asked); otherwise the first thing missing, groups in order.
std::optional<NeverFits> CheckNeverFits(const Job& job, const scheduler::ClusterSnapshot& snapshot);

// CheckNeverFits for a stream of jobs on one fleet. Jobs come in few shapes (what CheckNeverFits
// reads of a job): a job of a shape already checked is not walked over every node again until
// the fleet's shape moves (`shape_epoch`, which must move whenever SameShapeForNeverFits would
// say false for some node, or a node joins or leaves). "Could fit" is remembered by shape alone;
// "never fits" by shape and task names, which its message quotes. Thread-compatible.
class NeverFitsCheck {
 public:
  std::optional<NeverFits> Check(const Job& job, const scheduler::ClusterSnapshot& snapshot,
                                 uint64_t shape_epoch);

 private:
  // Shapes beyond this are forgotten all at once: a stream of distinct shapes costs at most
  // what it cost without the memory.
  static constexpr size_t kMaxShapes = 4096;

  std::optional<uint64_t> epoch_;
  std::unordered_set<std::string> fitting_shapes_;
  std::unordered_map<std::string, NeverFits> never_fitting_;  // by shape and task names
};

// True when CheckNeverFits reads the same from `a` as from `b`: capacity, labels and each GPU's
// model, memory and MIG mode. A node that changes in nothing else (state, health, images, what is
// free) cannot change an answer, so a fleet's never-fitting jobs need no check again.
bool SameShapeForNeverFits(const Node& a, const Node& b);

}  // namespace gpufleet::policy
