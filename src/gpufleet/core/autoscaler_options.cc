// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/autoscaler_options.h"

#include <utility>

#include <fmt/format.h>

namespace gpufleet {
namespace {

constexpr int64_t kMaxUtilizationMilli = 1000;

}  // namespace

Status AutoscalerOptions::Validate() const {
  if (min_replicas < 1) {
    return InvalidArgumentError(fmt::format("min_replicas: {} (must be >= 1)", min_replicas));
  }
  if (max_replicas < min_replicas) {
    return InvalidArgumentError(
        fmt::format("max_replicas: {} (must be >= min_replicas {})", max_replicas, min_replicas));
  }
  if (target_utilization_milli < 1 || target_utilization_milli > kMaxUtilizationMilli) {
    return InvalidArgumentError(
        fmt::format("target_utilization_milli: {} (must be in 1..1000)", target_utilization_milli));
  }
  if (tolerance_milli < 0 || tolerance_milli >= kMaxUtilizationMilli) {
    return InvalidArgumentError(
        fmt::format("tolerance_milli: {} (must be in 0..999)", tolerance_milli));
  }
  const std::pair<const char*, int64_t> spans[] = {
      {"scale_up_stabilization_seconds", scale_up_stabilization_seconds},
      {"scale_down_stabilization_seconds", scale_down_stabilization_seconds},
      {"scale_up_cooldown_seconds", scale_up_cooldown_seconds},
      {"scale_down_cooldown_seconds", scale_down_cooldown_seconds},
  };
  for (const auto& [name, value] : spans) {
    if (value < 0) {
      return InvalidArgumentError(fmt::format("{}: {} (must be >= 0)", name, value));
    }
  }
  return Status::Ok();
}

}  // namespace gpufleet
