// SPDX-License-Identifier: Apache-2.0
// What a deployment asks of its autoscaler: the `autoscaling` block of a deployment spec
// (wire/deployment_spec.h), which policy::Autoscaler runs. Here, below both, so that the wire
// formats do not depend on the policies.
#pragma once

#include <cstdint>

#include "gpufleet/core/status.h"

namespace gpufleet {

// Validated by policy::Autoscaler::Create. Utilizations are milli (1000 = every GPU of every
// replica busy all the time); times are integer seconds.
struct AutoscalerOptions {
  int min_replicas = 1;                    // >= 1: with no replica there is nothing to measure
  int max_replicas = 10;                   // >= min_replicas
  int64_t target_utilization_milli = 700;  // 1..1000
  // No change while |measured / target - 1| <= tolerance (the HPA's default 10%). 0..999.
  int64_t tolerance_milli = 100;
  int64_t scale_up_stabilization_seconds = 0;
  int64_t scale_down_stabilization_seconds = 300;
  int64_t scale_up_cooldown_seconds = 0;
  int64_t scale_down_cooldown_seconds = 0;

  // kInvalidArgument naming the field and its value, e.g. "max_replicas: 2 (must be >=
  // min_replicas 3)".
  Status Validate() const;
};

}  // namespace gpufleet
