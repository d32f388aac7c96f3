// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/devices.h"

#include <algorithm>
#include <limits>
#include <map>

namespace gpufleet::scheduler {
namespace {

bool WholeGpuFree(const GpuSlot& gpu) {
  return !gpu.mig_enabled && gpu.free_milli == kMilliPerUnit &&
         gpu.free_memory_mib == gpu.memory_mib;
}

bool ShareFits(const FractionalGpu& share, const GpuSlot& gpu) {
  return !gpu.mig_enabled && gpu.free_milli >= share.gpu_milli &&
         gpu.free_memory_mib >= share.gpu_memory_mib &&
         SharingFits(RunsAsMps(share.sharing, gpu), gpu);
}

int FreeMigInstances(const GpuSlot& gpu, const std::string& profile) {
  int count = 0;
  for (const MigInstance& instance : gpu.mig_instances) {
    count += (!instance.in_use && instance.profile == profile) ? 1 : 0;
  }
  return count;
}

// MIG instances of `profile` one GPU can still hand out: free existing ones plus new ones.
int MigCapacity(const GpuSlot& gpu, const MigProfile& profile, int cap) {
  int count = FreeMigInstances(gpu, profile.name);
  MigLayout layout = gpu.mig;
  while (count < cap) {
    auto start = layout.FindStart(profile);
    if (!start) {
      break;
    }
    layout.Add(profile, *start);
    ++count;
  }
  return std::min(count, cap);
}

int64_t Ratio(int64_t free, int64_t need) {
  return need <= 0 ? std::numeric_limits<int64_t>::max() : free / need;
}

std::optional<std::vector<GpuAssignment>> PickWhole(const TaskContext& task, const NodeInfo& node,
                                                    GpuMask gpus, int count) {
  std::map<int, std::vector<int>> by_domain;  // NVLink domain -> idle GPU indices, ascending
  std::vector<int> all;
  for (size_t g = 0; g < node.gpus.size(); ++g) {
    if (MaskHas(gpus, static_cast<int>(g)) && WholeGpuFree(node.gpus[g])) {
      by_domain[node.gpus[g].nvlink_domain].push_back(static_cast<int>(g));
      all.push_back(static_cast<int>(g));
    }
  }
  if (static_cast<int>(all.size()) < count) {
    return std::nullopt;
  }
  const std::vector<int>* chosen = &all;
  for (const auto& [domain, members] : by_domain) {
    if (static_cast<int>(members.size()) >= count &&
        (chosen == &all || members.size() < chosen->size())) {
      chosen = &members;
    }
  }
  std::vector<GpuAssignment> picked;
  for (int i = 0; i < count; ++i) {
    picked.push_back(ShareOf(task, node, (*chosen)[i]));
  }
  return picked;
}

std::optional<std::vector<GpuAssignment>> PickMig(const TaskContext& task, const NodeInfo& node,
                                                  GpuMask gpus, const MigGpus& request) {
  std::vector<GpuAssignment> picked;
  // Free existing instances first: no reconfiguration needed.
  for (size_t g = 0; g < node.gpus.size() && static_cast<int>(picked.size()) < request.count; ++g) {
    const GpuSlot& gpu = node.gpus[g];
    if (!MaskHas(gpus, static_cast<int>(g)) || !gpu.mig_enabled) {
      continue;
    }
    for (const MigInstance& instance : gpu.mig_instances) {
      if (!instance.in_use && instance.profile == request.profile &&
          static_cast<int>(picked.size()) < request.count) {
        picked.push_back({static_cast<int>(g), 0, 0, instance.profile, instance.start, false});
      }
    }
  }
  // Then new instances, on the fullest GPU that still has a valid start slot.
  std::vector<MigLayout> layouts;
  for (const GpuSlot& gpu : node.gpus) {
    layouts.push_back(gpu.mig);
  }
  while (static_cast<int>(picked.size()) < request.count) {
    int best = -1;
    int best_start = 0;
    for (size_t g = 0; g < node.gpus.size(); ++g) {
      const GpuSlot& gpu = node.gpus[g];
      const MigProfile* profile = task.mig_profile[gpu.model_id];
      if (!MaskHas(gpus, static_cast<int>(g)) || !gpu.mig_enabled || profile == nullptr) {
        continue;
      }
      auto start = layouts[g].FindStart(*profile);
      if (start &&
          (best < 0 || layouts[g].free_memory_slices() < layouts[best].free_memory_slices())) {
        best = static_cast<int>(g);
        best_start = *start;
      }
    }
    if (best < 0) {
      return std::nullopt;
    }
    layouts[best].Add(*task.mig_profile[node.gpus[best].model_id], best_start);
    picked.push_back({best, 0, 0, request.profile, best_start, true});
  }
  return picked;
}

}  // namespace

GpuAssignment ShareOf(const TaskContext& task, const NodeInfo& node, int gpu) {
  if (const auto* share = std::get_if<FractionalGpu>(&task.request->gpus)) {
    return {gpu,
            share->gpu_milli,
            share->gpu_memory_mib,
            "",
            -1,
            false,
            RunsAsMps(share->sharing, node.gpus[static_cast<size_t>(gpu)])};
  }
  return {gpu, kMilliPerUnit, 0, "", -1, false, false};
}

bool GpuCanServe(const TaskContext& task, const GpuSlot& gpu) {
  const GpuRequest& request = task.request->gpus;
  if (std::holds_alternative<WholeGpus>(request)) {
    return WholeGpuFree(gpu);
  }
  if (const auto* share = std::get_if<FractionalGpu>(&request)) {
    return ShareFits(*share, gpu);
  }
  if (std::holds_alternative<MigGpus>(request)) {
    const MigProfile* profile = task.mig_profile[gpu.model_id];
    return gpu.mig_enabled && profile != nullptr && MigCapacity(gpu, *profile, 1) > 0;
  }
  return true;
}

std::string_view NoFreeGpusReason(const TaskContext& task, const NodeInfo& node, GpuMask gpus) {
  const GpuRequest& request = task.request->gpus;
  if (std::holds_alternative<MigGpus>(request)) {
    return kNoMigSlotReason;
  }
  if (const auto* share = std::get_if<FractionalGpu>(&request)) {
    for (size_t g = 0; g < node.gpus.size(); ++g) {
      const GpuSlot& gpu = node.gpus[g];
      const bool mps = RunsAsMps(share->sharing, gpu);
      if (MaskHas(gpus, static_cast<int>(g)) && !gpu.mig_enabled &&
          gpu.free_milli >= share->gpu_milli && gpu.free_memory_mib >= share->gpu_memory_mib &&
          !SharingFits(mps, gpu)) {
        return mps ? kMpsMeetsTimeSlicedReason : kTimeSlicedMeetsMpsReason;
      }
    }
  }
  return kNoFreeGpusReason;
}

bool GpusFit(const TaskContext& task, const NodeInfo& node, GpuMask gpus) {
  return GpuTaskCapacity(task, node, gpus, 1) >= 1;
}

int GpuTaskCapacity(const TaskContext& task, const NodeInfo& node, GpuMask gpus, int cap) {
  const GpuRequest& request = task.request->gpus;
  int64_t tasks = cap;
  if (const auto* whole = std::get_if<WholeGpus>(&request)) {
    int idle = 0;
    for (size_t g = 0; g < node.gpus.size(); ++g) {
      idle += (MaskHas(gpus, static_cast<int>(g)) && WholeGpuFree(node.gpus[g])) ? 1 : 0;
    }
    tasks = idle / whole->count;
  } else if (const auto* share = std::get_if<FractionalGpu>(&request)) {
    tasks = 0;
    for (size_t g = 0; g < node.gpus.size() && tasks < cap; ++g) {
      const GpuSlot& gpu = node.gpus[g];
      if (MaskHas(gpus, static_cast<int>(g)) && !gpu.mig_enabled &&
          SharingFits(RunsAsMps(share->sharing, gpu), gpu)) {
        tasks += std::min(Ratio(gpu.free_milli, share->gpu_milli),
                          Ratio(gpu.free_memory_mib, share->gpu_memory_mib));
      }
    }
  } else if (const auto* mig = std::get_if<MigGpus>(&request)) {
    int instances = 0;
    for (size_t g = 0; g < node.gpus.size(); ++g) {
      const GpuSlot& gpu = node.gpus[g];
      const MigProfile* profile = task.mig_profile[gpu.model_id];
      if (MaskHas(gpus, static_cast<int>(g)) && gpu.mig_enabled && profile != nullptr) {
        instances += MigCapacity(gpu, *profile, kMigComputeSlices);
      }
    }
    tasks = instances / mig->count;
  }
  return static_cast<int>(std::clamp<int64_t>(tasks, 0, cap));
}

int MaxTasksOnNode(const TaskContext& task, const NodeInfo& node, GpuMask gpus, int cap) {
  const HostResources& need = task.request->host;
  const int64_t host_tasks = std::min(Ratio(node.free.cpu_milli, need.cpu_milli),
                                      Ratio(node.free.memory_mib, need.memory_mib));
  return std::min<int>(static_cast<int>(std::clamp<int64_t>(host_tasks, 0, cap)),
                       GpuTaskCapacity(task, node, gpus, cap));
}

std::optional<std::vector<GpuAssignment>> DefaultGpuPick(const TaskContext& task,
                                                         const NodeInfo& node, GpuMask gpus) {
  const GpuRequest& request = task.request->gpus;
  if (std::holds_alternative<NoGpu>(request)) {
    return std::vector<GpuAssignment>{};
  }
  if (const auto* whole = std::get_if<WholeGpus>(&request)) {
    return PickWhole(task, node, gpus, whole->count);
  }
  if (const auto* share = std::get_if<FractionalGpu>(&request)) {
    int best = -1;
    for (size_t g = 0; g < node.gpus.size(); ++g) {
      const GpuSlot& gpu = node.gpus[g];
      if (MaskHas(gpus, static_cast<int>(g)) && ShareFits(*share, gpu) &&
          (best < 0 || gpu.free_milli < node.gpus[best].free_milli)) {
        best = static_cast<int>(g);
      }
    }
    if (best < 0) {
      return std::nullopt;
    }
    return std::vector<GpuAssignment>{ShareOf(task, node, best)};
  }
  return PickMig(task, node, gpus, std::get<MigGpus>(request));
}

}  // namespace gpufleet::scheduler
