// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/scheduler/framework.h"

namespace gpufleet::scheduler {

// Prefers the nodes that already hold the task's image (Node::cached_images, from the agents'
// heartbeats), so that the gang starts without waiting for a pull. kube-scheduler's
// ImageLocality scores one pod on one node; this plugin scores the gang: a gang starts when its
// last task has its image, so a node holding the image saves the whole gang's wait only while
// every task of the gang with that image placed so far is on a node that holds it too. Such a
// node scores its image's size times the number of the gang's tasks with that image; once some
// task is on a node that must pull, a holder saves only its own pull (the registry's bytes) and
// scores the size once, as does a node that will pull the image anyway for an earlier task of
// the gang. Sizes count from kMinImageBytes (a smaller image costs little to pull and never
// moves a task) up to kMaxImageBytes. Tasks without an image score 0 everywhere.
//
// The Scheduler runs it as a tie-break score (SchedulerOptions::image_locality_weight): it orders
// only the nodes that every other score ranks equal, so it can never override a filter, the
// required or preferred topology, or the placement policy. Not thread-safe (one per Scheduler).
class ImageLocalityScore final : public ScorePlugin {
 public:
  // kube-scheduler's floor: 23 MB.
  static constexpr int64_t kMinImageBytes = 23 * 1000 * 1000;
  // NGC's GPU images are 10 to 30 GB; at 20 GiB and above a pull costs the most.
  static constexpr int64_t kMaxImageBytes = int64_t{20} << 30;

  std::string_view Name() const override { return "image-locality"; }
  // With nothing reserved a node scores by the image it holds alone.
  bool ScoresNodeAlone() const override { return true; }
  void PreScore(const CycleState& state, const TaskContext& task,
                const std::vector<const NodeInfo*>& feasible, Random& random) override;
  int64_t Score(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                GpuMask gpus) override;
  void NormalizeScores(std::vector<int64_t>& scores) const override;

  // The image `node` holds for `reference` (an OCI reference, ValidateImageReference): by
  // digest when the reference pins one, else by its canonical name (CanonicalImageReference);
  // nullptr when it holds none.
  static const CachedImage* FindImage(const Node& node, std::string_view reference);

 private:
  // A reference as FindImage matches it, worked out once per task rather than once per node.
  struct ImageKey {
    std::string reference;
    std::string digest;     // the digest the reference pins; empty when it pins none
    std::string canonical;  // the canonical name, when no digest is pinned
  };
  static ImageKey KeyOf(std::string_view reference);
  static const CachedImage* FindImage(const Node& node, const ImageKey& key);

  // What PreScore works out for the task being placed.
  std::string image_;           // the task's image; empty: no image, every node scores 0
  ImageKey key_;                // image_ as FindImage matches it
  bool gang_warm_ = false;      // every reserved task with this image is on a holder
  int64_t gang_tasks_ = 0;      // the gang's tasks with this image
  int64_t known_bytes_ = 0;     // the image's size as a holder reports it
  std::set<int> paying_nodes_;  // nodes an earlier task of the gang will pull the image on
};

}  // namespace gpufleet::scheduler
