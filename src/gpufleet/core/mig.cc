// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/mig.h"

#include <algorithm>
#include <bit>

#include <fmt/format.h>

namespace gpufleet {

uint8_t MigLayout::SliceMask(int start, int size) {
  return static_cast<uint8_t>(((1U << size) - 1U) << start);
}

int MigLayout::CountOf(int profile_id) const {
  for (const auto& [id, count] : profile_counts_) {
    if (id == profile_id) {
      return count;
    }
  }
  return 0;
}

int MigLayout::free_memory_slices() const {
  return kMigMemorySlices - std::popcount(static_cast<unsigned>(used_slices_));
}

bool MigLayout::CanAddAt(const MigProfile& profile, int start) const {
  const bool allowed =
      std::find(profile.starts.begin(), profile.starts.end(), start) != profile.starts.end();
  return allowed && HasRoomFor(profile) &&
         (used_slices_ & SliceMask(start, profile.memory_slices)) == 0;
}

bool MigLayout::HasRoomFor(const MigProfile& profile) const {
  return used_compute_slices_ + profile.compute_slices <= kMigComputeSlices &&
         CountOf(profile.profile_id) < profile.max_instances &&
         !(profile.media_extensions && media_extensions_used_);
}

std::optional<int> MigLayout::FindStart(const MigProfile& profile) const {
  if (!HasRoomFor(profile)) {
    return std::nullopt;
  }
  for (int start : profile.starts) {
    if ((used_slices_ & SliceMask(start, profile.memory_slices)) == 0) {
      return start;
    }
  }
  return std::nullopt;
}

void MigLayout::Add(const MigProfile& profile, int start) {
  used_slices_ |= SliceMask(start, profile.memory_slices);
  used_compute_slices_ += profile.compute_slices;
  media_extensions_used_ = media_extensions_used_ || profile.media_extensions;
  for (auto& [id, count] : profile_counts_) {
    if (id == profile.profile_id) {
      ++count;
      return;
    }
  }
  profile_counts_.emplace_back(profile.profile_id, 1);
}

void MigLayout::Remove(const MigProfile& profile, int start) {
  used_slices_ &= static_cast<uint8_t>(~SliceMask(start, profile.memory_slices));
  used_compute_slices_ -= profile.compute_slices;
  if (profile.media_extensions) {
    media_extensions_used_ = false;
  }
  for (auto& [id, count] : profile_counts_) {
    if (id == profile.profile_id) {
      --count;
    }
  }
  std::erase_if(profile_counts_, [](const auto& entry) { return entry.second == 0; });
}

Result<MigLayout> MigLayout::FromInstances(const GpuModelInfo& model,
                                           const std::vector<MigInstance>& instances) {
  MigLayout layout;
  for (size_t i = 0; i < instances.size(); ++i) {
    const MigInstance& instance = instances[i];
    const MigProfile* profile = model.FindMigProfile(instance.profile);
    if (profile == nullptr) {
      return InvalidArgumentError(
          fmt::format("mig_instances[{}].profile: unknown profile \"{}\" for {} (valid: {})", i,
                      instance.profile, model.name, model.MigProfileNames()));
    }
    const bool start_allowed = std::find(profile->starts.begin(), profile->starts.end(),
                                         instance.start) != profile->starts.end();
    if (!start_allowed) {
      return InvalidArgumentError(
          fmt::format("mig_instances[{}].start: {} is not a valid start slot for {} on {}", i,
                      instance.start, instance.profile, model.name));
    }
    if ((layout.used_slices_ & SliceMask(instance.start, profile->memory_slices)) != 0) {
      return InvalidArgumentError(
          fmt::format("mig_instances[{}]: {} at slot {} overlaps another instance", i,
                      instance.profile, instance.start));
    }
    if (layout.CountOf(profile->profile_id) >= profile->max_instances ||
        layout.used_compute_slices_ + profile->compute_slices > kMigComputeSlices ||
        (profile->media_extensions && layout.media_extensions_used_)) {
      return InvalidArgumentError(
          fmt::format("mig_instances[{}]: {} exceeds the instance or compute-slice limit of {}", i,
                      instance.profile, model.name));
    }
    layout.Add(*profile, instance.start);
  }
  return layout;
}

}  // namespace gpufleet
