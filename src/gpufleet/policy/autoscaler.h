// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "gpufleet/core/autoscaler_options.h"
#include "gpufleet/core/status.h"

// Inference autoscaling on MEASURED GPU utilization (not request counts), after the Kubernetes
// Horizontal Pod Autoscaler:
//
//   recommendation = ceil(ready * measured / target), clamped to [min_replicas, max_replicas]
//
// where `ready` replicas are those serving and measured. Nothing changes while measured / target
// is within the tolerance band around 1. Replicas still starting count as serving nothing, so a
// scale-up is not repeated for capacity that is on its way (the HPA treats unready pods as 0%).
// Recommendations are stabilized as in the HPA's `behavior`: a scale-down goes only to the
// highest recommendation of the scale-down window (the last 5 minutes by default), a scale-up
// only to the lowest of the scale-up window (none by default). Cooldowns add a minimum time since
// the last change of the replica count before the next scale-up or scale-down. The count found
// on the first call counts as a recommendation made then, so a new autoscaler does not scale down
// before a full scale-down window has passed.
namespace gpufleet::policy {

// One measurement of the deployment.
struct AutoscalerInput {
  int64_t now_seconds = 0;
  int current_replicas = 0;  // replicas that exist, starting or ready
  int ready_replicas = 0;    // of those, the ones serving; 0..current_replicas
  // Mean GPU utilization of the ready replicas over the last interval, 0..1000; ignored when
  // no replica is ready.
  int64_t utilization_milli = 0;
};

struct ScaleDecision {
  int desired_replicas = 0;  // what the deployment should run now
  // This measurement's own recommendation (after the tolerance band and clamping), before
  // stabilization and cooldowns.
  int recommendation = 0;
  // Why, for events and `describe`: "utilization 91% against a target of 70%: 4 -> 6".
  std::string reason;

  friend bool operator==(const ScaleDecision&, const ScaleDecision&) = default;
};

// The replica count controller of one deployment. Deterministic: the same inputs give the same
// decisions. Not thread-safe (thread-compatible): the owner serialises the calls. The caller is
// expected to apply each decision; the autoscaler remembers the time of the last change it
// asked for (for the cooldowns) and its recent recommendations (for the stabilization windows).
class Autoscaler {
 public:
  // kInvalidArgument when `options` do not validate.
  static Result<Autoscaler> Create(const AutoscalerOptions& options);

  const AutoscalerOptions& options() const { return options_; }

  // The replica count for `input`. kInvalidArgument naming the field for a negative replica
  // count, ready > current, a utilization outside 0..1000 or a time before the previous call's.
  Result<ScaleDecision> Decide(const AutoscalerInput& input);

 private:
  struct Recommendation {
    int64_t time_seconds = 0;
    int replicas = 0;
  };

  explicit Autoscaler(const AutoscalerOptions& options) : options_(options) {}

  // The measurement's own recommendation and the words for it.
  std::pair<int, std::string> Recommend(const AutoscalerInput& input) const;

  AutoscalerOptions options_;
  std::deque<Recommendation> history_;  // oldest first, within the longer window
  std::optional<int64_t> last_now_seconds_;
  std::optional<int64_t> last_change_seconds_;
};

}  // namespace gpufleet::policy
