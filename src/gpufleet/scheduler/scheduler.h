// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpufleet/core/random.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/scheduler/framework.h"
#include "gpufleet/scheduler/registry.h"
#include "gpufleet/scheduler/snapshot.h"

namespace gpufleet::scheduler {

enum class TieBreak { kNodeOrder, kRandom };

struct SchedulerOptions {
  // The placement policy (a score plugin): random, dot-prod, gpu-clustering, gpu-packing,
  // best-fit or fgd.
  std::string policy = "best-fit";
  int64_t policy_weight = 1;
  // Weight of the preferred-topology score against the policy's; both are scaled to [0, 100].
  int64_t topology_preference_weight = 2;
  // Among nodes with the best score: the first in node order, which keeps packing onto the same
  // nodes (the FGD reference simulator's published numbers behave this way), or a uniformly
  // random one, as upstream kube-scheduler does.
  TieBreak tie_break = TieBreak::kNodeOrder;
  // Weight of the image-locality score (plugins/image_locality.h); 0 leaves it out. It is a
  // tie-break score: it orders only the nodes that the weighted sum of every other score ranks
  // equal, so no weight lets it override a filter, the topology or the policy. That is the
  // bound: a pull costs the gang minutes once, while a worse topology or fragmentation lasts as
  // long as the run.
  int64_t image_locality_weight = 1;
  // Keep each node's filter verdict and raw scores for the first task of a job, per job shape,
  // while the node is unchanged (ScorePlugin::ScoresNodeAlone): a job of a shape seen before
  // then costs a version check per unchanged node. Off: every filter and score runs for every
  // job (the placements are the same; tests compare the two).
  bool reuse_unchanged_nodes = true;
  // Adds the container-runtime filter: a task with an image goes only to a node labelled
  // kContainerRuntimeLabel (its agent runs containers). The server sets it, since its agents
  // say what they run; the simulator's nodes run anything.
  bool require_container_runtime = false;
  // Extra plugins by registry name, added to every extension point they implement.
  std::vector<std::string> extra_plugins;
  // Score weight of an extra plugin, by name; 1 when not given.
  std::map<std::string, int64_t> extra_plugin_weights;
  PluginArgs plugin_args;

  // Adds the collective-cost score on `fabric` (docs/fabric.md), weighted 2 against the policy's
  // 1: a placement whose collectives are measurably slower loses whatever its packing score.
  void AddCollectiveCost(std::shared_ptr<const fabric::Fabric> fabric);
};

enum class ScheduleOutcome { kScheduled, kUnschedulable, kError };

// What happened to one job. "Does not fit" is kUnschedulable with a reason a person can act on;
// kError is for a job that is invalid or a Bind that failed.
struct ScheduleResult {
  ScheduleOutcome outcome = ScheduleOutcome::kUnschedulable;
  std::vector<TaskPlacement> placements;
  std::string reason;                // one line, e.g. "no leaf can hold all 128 tasks ..."
  std::vector<std::string> details;  // per-constraint node counts
  Status error;                      // set for kError

  bool scheduled() const { return outcome == ScheduleOutcome::kScheduled; }
};

// Confines one Schedule call to some nodes and, on them, to some GPUs, so that a what-if search
// (which victims would let this job fit in leaf-3?) asks about one domain without the scheduler
// moving the job to another. The job's topology levels still apply inside the scope.
struct PlacementScope {
  std::vector<int> nodes;      // indices into ClusterSnapshot::nodes()
  GpuMask gpus = ~GpuMask{0};  // GPUs usable on each of those nodes
};

// The scheduler: a pure function of a snapshot, a job and a random source. It places gangs all
// or nothing: it picks the smallest domain at the job's required topology level that can hold the
// whole gang, prefers one domain of the preferred level inside it, chooses inside that the fewest
// domains at each level below (blocks, racks, nodes, NVLink domains; docs/policies.md, "Compact
// gangs"), then places task by task with the filters and the scoring policy, rolling back
// everything if any task fails. No IO, no threads, no clock. Thread-compatible: one Scheduler per
// thread.
class Scheduler {
 public:
  // kNotFound / kInvalidArgument when a plugin is unknown or cannot be built.
  static Result<std::unique_ptr<Scheduler>> Create(const SchedulerOptions& options,
                                                   const PluginRegistry& registry);
  ~Scheduler();

  // Places `job` in `snapshot`. On kScheduled the snapshot holds the placements (applied) and
  // `binder`, when given, has accepted them; otherwise the snapshot is as it was. With `scope`,
  // only its nodes and GPUs are used, and the reasons count only its nodes (kError for a node
  // index out of range).
  ScheduleResult Schedule(const Job& job, ClusterSnapshot& snapshot, Random& random,
                          Binder* binder = nullptr, const PlacementScope* scope = nullptr);

  const SchedulerOptions& options() const { return options_; }

 private:
  struct Impl;
  explicit Scheduler(SchedulerOptions options);

  SchedulerOptions options_;
  std::unique_ptr<Impl> impl_;
};

// True when `job` cannot fit wherever `smaller` did not: both are one group of whole GPUs under
// the same constraints (models, memory, selectors, required topology level, identical stacks; no
// spread), and `job` asks for no fewer tasks, GPUs per task, CPU or memory. A queue that saw
// `smaller` fail may skip `job` in the same cycle without asking the scheduler.
bool CannotFitWhereSmallerFailed(const Job& job, const Job& smaller);

}  // namespace gpufleet::scheduler
