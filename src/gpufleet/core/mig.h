// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"

namespace gpufleet {

// One GPU instance on a MIG-enabled GPU: which profile, where it starts, and whether a task holds
// it. An instance that exists but is free can be handed to a task without reconfiguring the GPU.
struct MigInstance {
  std::string profile;
  int start = 0;
  bool in_use = false;

  friend bool operator==(const MigInstance&, const MigInstance&) = default;
};

// The occupancy of one MIG-enabled GPU: an 8-bit memory-slice bitmap, the SM slices used and a
// count per profile. A new instance fits iff one of its profile's allowed starts has all its
// memory slices free, the SM budget holds and the profile's instance limit is not reached.
// Thread-compatible value type.
class MigLayout {
 public:
  MigLayout() = default;

  // Builds the layout of `instances` on a GPU of `model`. kInvalidArgument naming the instance for
  // an unknown profile, a start that is not allowed, overlapping slices or too many instances.
  static Result<MigLayout> FromInstances(const GpuModelInfo& model,
                                         const std::vector<MigInstance>& instances);

  // The lowest allowed start where `profile` fits now, or nullopt.
  std::optional<int> FindStart(const MigProfile& profile) const;
  // True when `profile` fits now at `start` (an allowed start with its slices free).
  bool CanAddAt(const MigProfile& profile, int start) const;
  // REQUIRES: `start` came from FindStart(profile) on this layout.
  void Add(const MigProfile& profile, int start);
  void Remove(const MigProfile& profile, int start);

  uint8_t used_slices() const { return used_slices_; }
  int used_compute_slices() const { return used_compute_slices_; }
  int free_memory_slices() const;
  bool empty() const { return used_slices_ == 0; }

 private:
  static uint8_t SliceMask(int start, int size);
  bool HasRoomFor(const MigProfile& profile) const;
  int CountOf(int profile_id) const;

  uint8_t used_slices_ = 0;
  int used_compute_slices_ = 0;
  bool media_extensions_used_ = false;
  std::vector<std::pair<int, int>> profile_counts_;  // (profile id, count), small
};

}  // namespace gpufleet
