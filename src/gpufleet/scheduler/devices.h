// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "gpufleet/scheduler/framework.h"
#include "gpufleet/scheduler/snapshot.h"

// How a task's GPU request meets a node's GPUs: whether it fits, how many tasks would fit, and
// the default choice of GPUs. Shared by the filters, the policies and the gang search.
namespace gpufleet::scheduler {

// True when GPU `gpu` of `node` can take one more task's share on its own (whole: idle;
// fractional: enough free milli-GPU and memory; MIG: a free instance or a valid start slot).
bool GpuCanServe(const TaskContext& task, const GpuSlot& gpu);

// True when the GPUs in `gpus` can serve one task of `task` (host resources not included).
bool GpusFit(const TaskContext& task, const NodeInfo& node, GpuMask gpus);

// How many more tasks of `task` the GPUs in `gpus` could serve, GPUs only; capped at `cap`.
int GpuTaskCapacity(const TaskContext& task, const NodeInfo& node, GpuMask gpus, int cap);

// An upper bound on how many more tasks of `task` the node could take, host and GPUs together;
// used to rank and prune topology domains before trying them. Capped at `cap`.
int MaxTasksOnNode(const TaskContext& task, const NodeInfo& node, GpuMask gpus, int cap);

// The default choice of GPUs: whole GPUs from one NVLink domain when one can hold them (the
// fullest such domain, lowest indices), fractional shares on the fitting GPU with the least free
// compute (lowest index on ties), MIG instances on free existing instances first, then created on
// the fullest GPU at its lowest valid start. nullopt when the request does not fit.
std::optional<std::vector<GpuAssignment>> DefaultGpuPick(const TaskContext& task,
                                                         const NodeInfo& node, GpuMask gpus);

// A fractional or whole-GPU assignment of GPU `gpu` (an index into node.gpus) for `task`; a
// share runs as an MPS client when it asks for MPS or its node runs shares that way by default.
GpuAssignment ShareOf(const TaskContext& task, const NodeInfo& node, int gpu);

// Why a node cannot take a task's GPUs now.
inline constexpr std::string_view kNoFreeGpusReason = "insufficient free GPUs";
inline constexpr std::string_view kNoMigSlotReason = "no free MIG instance or valid MIG start slot";
// A share that has the room on a GPU but not the kind of sharing its shares run (SharingFits).
inline constexpr std::string_view kMpsMeetsTimeSlicedReason =
    "the GPUs with room hold time-sliced shares, which an MPS share cannot join";
inline constexpr std::string_view kTimeSlicedMeetsMpsReason =
    "the GPUs with room hold MPS shares, which a time-sliced share cannot join";
// Why the GPUs in `gpus` of `node` cannot serve one task of `task` (REQUIRES: !GpusFit): the
// sharing conflict when a GPU has the room a share needs but runs the other kind of shares.
std::string_view NoFreeGpusReason(const TaskContext& task, const NodeInfo& node, GpuMask gpus);

inline bool MaskHas(GpuMask mask, int gpu) {
  return (mask >> gpu) & 1U;
}

}  // namespace gpufleet::scheduler
