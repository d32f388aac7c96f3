// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"

// `gpufleet sim bound`: a proven lower bound on the GPUs the fill experiment (fill.h) leaves
// unallocated. The pods that have arrived by the experiment's 100 % point are packed offline, in
// no order and by no policy, maximising the GPU milli-units placed; an upper bound on that
// maximum is an upper bound on what any online policy allocates. The packing is an integer
// program over identical node types and identical pod shapes (a per-GPU pattern model, a
// relaxation of the per-node problem) solved with COIN-OR CLP (its LP relaxation) and CBC (a
// time-limited branch and bound whose dual bound is taken). The argument for soundness is in
// docs/policies.md ("A lower bound on unallocated GPUs").
namespace gpufleet::sim {

// Nodes of one kind: same CPU, memory, GPU count and GPU model.
struct PackingNodeType {
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int gpus = 0;
  std::string model;  // canonical; empty for a node without GPUs
  int count = 0;
};

// Identical pods: `gpus` GPUs of `gpu_milli` each (whole GPUs have 1000; a share is one GPU of
// less), or no GPU (gpus 0).
struct PackingPodShape {
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int gpus = 0;
  int64_t gpu_milli = 0;
  std::vector<std::string> allowed_models;  // canonical, sorted; empty: any model
  int count = 0;

  int64_t GpuMilliEach() const { return gpus * gpu_milli; }
};

struct PackingProblem {
  std::vector<PackingNodeType> node_types;
  std::vector<PackingPodShape> pod_shapes;  // GPU pods only: a CPU-only pod places no GPU
  int64_t capacity_milli = 0;               // 1000 x the cluster's GPUs
  int64_t requested_milli = 0;              // GPU milli-units of all the pods
};

// Groups `cluster`'s nodes and `pods` into types and shapes. kInvalidArgument naming the node or
// the pod for what the model cannot express: a node with GPUs of two models, a pod of more than
// one task, a MIG request.
Result<PackingProblem> AggregatePacking(const Cluster& cluster, const std::vector<Job>& pods,
                                        const GpuCatalog& catalog);

struct PackingBoundOptions {
  // Only the LP relaxation; otherwise also a branch and bound stopped after
  // `time_limit_seconds` of wall time, whose dual bound can only tighten the LP's.
  bool lp_only = true;
  double time_limit_seconds = 10;
  // RunFillBound: how many arrival prefixes of the 100 % point to solve (see FillBound).
  int checkpoints = 8;
  int max_gpu_patterns = 100000;  // per node type; more is kResourceExhausted
};

struct PackingBound {
  // No placement of the problem's pods places more GPU milli-units than this.
  int64_t placed_milli_bound = 0;
  double lp_bound = 0;          // the LP relaxation's optimum
  double mip_dual_bound = -1;   // CBC's best possible objective; -1 when not run
  double mip_primal = -1;       // best integer solution of the relaxed model; not a bound
  bool proven_optimal = false;  // the branch and bound finished
  bool time_limited = false;    // it stopped on the time limit: the bound is its dual bound
  int variables = 0;
  int constraints = 0;
  int gpu_patterns = 0;
};

// The bound for `problem`. kResourceExhausted when the per-GPU share patterns of a node type
// exceed `max_gpu_patterns`; kInternal when a solver fails.
Result<PackingBound> SolvePackingBound(const PackingProblem& problem,
                                       const PackingBoundOptions& options);

// The bound against one seed of the fill experiment. Its metric, unallocated GPUs at 100 %, is
// GPUs - (mean over the point's events of the allocated milli-GPU) / 1000. The event after
// arrival i has allocated at most what the best packing of pods 0..i places, which grows with
// i; so `checkpoints` prefixes ending at events of the point are solved, and each event takes
// the bound of the first solved prefix at or after it.
struct FillBound {
  uint64_t seed = 0;
  int total_gpus = 0;
  int pods_packed = 0;  // the longest prefix: up to the last event of the 100 % point
  int events = 0;       // events averaged into the 100 % point
  int checkpoints = 0;  // prefixes solved
  // No policy leaves fewer GPUs unallocated at 100 % arrived load than this.
  double unallocated_gpus_bound = 0;
  // The same from the longest prefix alone (every event bounded by it): looser.
  double unallocated_gpus_bound_last = 0;
  bool time_limited = false;  // some branch and bound stopped on its time limit
  PackingBound solve;         // of the longest prefix
};

// kInvalidArgument when no event lands on the 100 % point (`load_target` below 1).
Result<FillBound> RunFillBound(const Cluster& cluster, const std::vector<Job>& pods,
                               const GpuCatalog& catalog, uint64_t seed, double load_target,
                               const PackingBoundOptions& options);

// Writes {"mode":"bound","runs":[{"seed","total_gpus","pods_packed","events",
// "checkpoints","unallocated_gpus_bound","unallocated_gpus_bound_last_prefix",
// and of the longest prefix "lp_bound_milli","mip_dual_bound_milli" (null when not run),
// "proven_optimal","time_limited" (of any prefix),"variables","constraints"}],
// "median_unallocated_gpus_bound","any_time_limited"} on one line.
void WriteBoundJson(const std::vector<FillBound>& bounds, std::ostream& out);

}  // namespace gpufleet::sim
