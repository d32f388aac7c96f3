// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/ids.h"
#include "gpufleet/core/mig.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/scheduler/snapshot.h"

// MIG repartitioning: when pending MIG requests fit no current layout, choose new layouts for
// GPUs whose instances are free, so that the scheduler can then place those requests. The
// scheduler itself only creates instances in free slices; this planner also destroys free
// instances that stand in the way. Instances in use are never touched.
namespace gpufleet::policy {

// A pending request for `count` instances of `profile` that no current layout can serve. The
// planner puts all of one request's instances on one GPU (the scheduler may spread them over a
// node, but one GPU keeps the plan per GPU). `models` lists the GPU models the request may run
// on (catalog names or aliases); empty means any model that has `profile`.
struct MigRequest {
  std::string id;
  std::string profile;  // "3g.40gb"
  int count = 1;
  std::vector<std::string> models;
};

// A MIG-enabled GPU as the planner sees it: where it is, its model and its instances, in use or
// free.
struct MigGpu {
  NodeId node;
  int gpu = 0;        // `Gpu::index` on the node
  std::string model;  // catalog name or alias
  std::vector<MigInstance> instances;
};

// The new layout of one GPU. Applying it means destroying `destroy` (all free) and then creating
// `create` at their start slots; `layout` is the result: the instances kept (in use or free, with
// their flags) followed by the new ones (free).
struct MigGpuPlan {
  NodeId node;
  int gpu = 0;
  std::string model;  // canonical name
  std::vector<MigInstance> destroy;
  std::vector<MigInstance> create;
  std::vector<MigInstance> layout;
  std::vector<std::string> serves;  // ids of the requests this GPU's new instances are for
};

// A request the plan does not serve, and why.
struct MigUnserved {
  std::string request;
  std::string reason;
};

struct MigPlan {
  std::vector<MigGpuPlan> gpus;       // the GPUs to reconfigure, in input order
  std::vector<std::string> served;    // request ids, in input order
  std::vector<MigUnserved> unserved;  // in input order
  int64_t compute_slices_served = 0;  // sum over served requests of count x compute slices
  // True when the search proved the plan best; false when the step budget ran out first (the
  // plan is then the best one found, at least as good as the greedy one).
  bool optimal = true;
  int64_t search_steps = 0;
};

struct MigPlannerOptions {
  // Most search steps (one step tries one layout on one GPU) spent on the exact search; past
  // it the best plan found so far is returned. Counted in steps, not time, so that a plan is the
  // same on every machine.
  int64_t search_budget = 200000;
};

// Plans new layouts that serve as many requests as possible, then as many compute slices as
// possible, reconfiguring as few GPUs as possible; ties between equal plans are broken by a fixed
// search order, so the result depends only on the arguments.
//
// Each GPU keeps its instances in use and may lose free ones; new instances go only to allowed
// start slots, within the profile limits (validated with MigLayout). Instances already free and
// kept count for the requests too. The search is exact (branch and bound over GPUs, started from
// a greedy plan) when it finishes within `options.search_budget`; requests of one instance are
// matched to instances exactly, and a request of several instances takes them from one GPU.
//
// kInvalidArgument naming the field and value for: a GPU of an unknown model, of a model without
// MIG, or with an invalid layout; a request with an empty or duplicate id, a count below 1, an
// unknown model, or a profile that none of its models has. A request that is valid but cannot be
// served is not an error: it is in `unserved` with the reason.
Result<MigPlan> PlanMigLayouts(const GpuCatalog& catalog, const std::vector<MigGpu>& gpus,
                               const std::vector<MigRequest>& requests,
                               const MigPlannerOptions& options = {});

// The MIG-enabled GPUs of a snapshot, in node and GPU order, with their current instances.
std::vector<MigGpu> MigGpusOf(const scheduler::ClusterSnapshot& snapshot);

// One request per MIG task of `job` ("<job>/<group>/<replica>"), allowed on the job's GPU models.
std::vector<MigRequest> MigRequestsOf(const Job& job);

// `instances` after `plan`: its destroyed instances removed, its new ones added free.
// kFailedPrecondition when an instance to destroy is missing or in use; kInvalidArgument naming
// the instance when the result is not a valid layout of `model`.
Result<std::vector<MigInstance>> ApplyMigGpuPlan(const GpuModelInfo& model,
                                                 const std::vector<MigInstance>& instances,
                                                 const MigGpuPlan& plan);

}  // namespace gpufleet::policy
