// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/plugins/image_locality.h"

#include <algorithm>

#include "gpufleet/core/image_reference.h"

namespace gpufleet::scheduler {
namespace {

// 0 below kMinImageBytes, kMaxNodeScore at kMaxImageBytes and above, linear between.
int64_t SizeScore(int64_t bytes) {
  const int64_t clamped =
      std::clamp(bytes, ImageLocalityScore::kMinImageBytes, ImageLocalityScore::kMaxImageBytes);
  // In MiB, so that the product stays far from overflowing.
  const int64_t range_mib =
      (ImageLocalityScore::kMaxImageBytes - ImageLocalityScore::kMinImageBytes) >> 20;
  return ((clamped - ImageLocalityScore::kMinImageBytes) >> 20) * kMaxNodeScore / range_mib;
}

}  // namespace

ImageLocalityScore::ImageKey ImageLocalityScore::KeyOf(std::string_view reference) {
  ImageKey key{std::string(reference), std::string(ImageReferenceDigest(reference)), ""};
  if (key.digest.empty()) {
    key.canonical = CanonicalImageReference(reference);
  }
  return key;
}

const CachedImage* ImageLocalityScore::FindImage(const Node& node, std::string_view reference) {
  return FindImage(node, KeyOf(reference));
}

const CachedImage* ImageLocalityScore::FindImage(const Node& node, const ImageKey& key) {
  for (const CachedImage& image : node.cached_images) {
    if (!key.digest.empty()) {
      if (image.digest == key.digest) {
        return &image;
      }
      continue;
    }
    // Container engines list the names they hold fully qualified.
    for (const std::string& held : image.references) {
      if (held == key.reference || held == key.canonical) {
        return &image;
      }
    }
  }
  return nullptr;
}

void ImageLocalityScore::PreScore(const CycleState& state, const TaskContext& task,
                                  const std::vector<const NodeInfo*>& feasible,
                                  Random& /*random*/) {
  const Job& job = *task.job;
  image_ = job.groups[task.group].image;
  paying_nodes_.clear();
  gang_warm_ = true;
  gang_tasks_ = 0;
  known_bytes_ = 0;
  if (image_.empty()) {
    return;
  }
  key_ = KeyOf(image_);
  for (const TaskGroup& group : job.groups) {
    gang_tasks_ += group.image == image_ ? group.replicas : 0;
  }
  for (const TaskPlacement& placed : state.reserved()) {
    if (job.groups[placed.group].image != image_) {
      continue;
    }
    const NodeInfo& node = task.snapshot->nodes()[placed.node];
    if (const CachedImage* held = FindImage(*node.node, key_)) {
      known_bytes_ = std::max(known_bytes_, held->size_bytes);
    } else {
      gang_warm_ = false;
      paying_nodes_.insert(placed.node);
    }
  }
  for (const NodeInfo* node : feasible) {
    if (const CachedImage* held = FindImage(*node->node, key_)) {
      known_bytes_ = std::max(known_bytes_, held->size_bytes);
    }
  }
}

int64_t ImageLocalityScore::Score(const CycleState& /*state*/, const TaskContext& /*task*/,
                                  const NodeInfo& node, GpuMask /*gpus*/) {
  if (image_.empty()) {
    return 0;
  }
  if (const CachedImage* held = FindImage(*node.node, key_)) {
    return SizeScore(held->size_bytes) * (gang_warm_ ? gang_tasks_ : 1);
  }
  // The gang pulls the image here anyway: another task saves that node a second pull.
  return paying_nodes_.count(node.index) > 0 ? SizeScore(known_bytes_) : 0;
}

void ImageLocalityScore::NormalizeScores(std::vector<int64_t>& scores) const {
  ScaleToMaxNodeScore(scores);
}

}  // namespace gpufleet::scheduler
