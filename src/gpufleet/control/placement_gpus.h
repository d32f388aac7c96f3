// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/wire/job_record.h"
#include "gpufleet/wire/json_fields.h"

// GPU identity in a stored placement (an element of a job document's "placements"): the GPUs its
// task holds are named by UUID, "gpu_uuids", one per element of "assignments", with each GPU's
// NVML index beside it in "gpus" for people to read. Every reader finds a placement's GPUs on its
// node by UUID, never by position or index, so a node that registers again with its GPUs in
// another order keeps each run on the same physical GPUs, and a GPU that is gone is never taken
// for another. A document stored before placements named UUIDs has only the indices ("gpus"),
// which are read as the GPU with that index; so is a GPU registered without a UUID (nodes
// registered by an admin, without an agent).
namespace gpufleet::control {

using wire::Json;

// One GPU a placement's task holds, as the placement names it.
struct PlacedGpu {
  std::string uuid;    // empty for an old document or a GPU registered without a UUID
  int64_t index = -1;  // the NVML index stored beside it; -1 when absent

  // Whether this is the node's GPU with `gpu_uuid` and `gpu_index`: by UUID when it names one.
  bool Is(std::string_view gpu_uuid, int64_t gpu_index) const {
    return uuid.empty() ? index >= 0 && index == gpu_index : uuid == gpu_uuid;
  }
  // "gpu 3 (GPU-5e1c...)", or "gpu 3" without a UUID, for events and reasons.
  std::string Describe() const;
};

// The GPUs of `placement`, one per element of its "assignments" (in that order).
std::vector<PlacedGpu> PlacedGpus(const Json& placement);
std::vector<PlacedGpu> PlacedGpus(const wire::PlacementRecord& placement);

// The position in `node_gpus` (a node document's "gpus") of the GPU `gpu` names; -1 when the node
// no longer has that GPU.
int PlacedGpuPosition(const Json& node_gpus, const PlacedGpu& gpu);
// That element of `node_gpus`; nullptr when the node no longer has the GPU.
const Json* FindPlacedGpu(const Json& node_gpus, const PlacedGpu& gpu);

// Writes "gpu_uuids" and "gpus" of `placement` for the GPUs it holds as `node_gpus` lists them
// now: the UUIDs the placement names (for an old document, those its indices give in `named_by`,
// the node's GPUs when it was placed) and their current indices. Returns the first GPU not on the
// node any more, if any, and then changes nothing.
std::optional<PlacedGpu> RenamePlacedGpus(Json& placement, const Json& named_by,
                                          const Json& node_gpus);

}  // namespace gpufleet::control
