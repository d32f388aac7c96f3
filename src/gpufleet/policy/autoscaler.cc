// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/autoscaler.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/policy/format.h"

namespace gpufleet::policy {
namespace {

constexpr int64_t kMaxUtilizationMilli = 1000;

}  // namespace

Result<Autoscaler> Autoscaler::Create(const AutoscalerOptions& options) {
  GPUFLEET_RETURN_IF_ERROR(options.Validate());
  return Autoscaler(options);
}

std::pair<int, std::string> Autoscaler::Recommend(const AutoscalerInput& input) const {
  const int current = input.current_replicas;
  const int clamped = std::clamp(current, options_.min_replicas, options_.max_replicas);
  if (input.ready_replicas == 0) {
    return {clamped, "no ready replica to measure"};
  }
  const int64_t measured = input.utilization_milli;
  const int64_t target = options_.target_utilization_milli;
  const std::string measurement =
      fmt::format("utilization {} of {} ready against a target of {}", FormatPercentMilli(measured),
                  input.ready_replicas, FormatPercentMilli(target));
  // |measured / target - 1| <= tolerance, in integers.
  const int64_t distance = measured > target ? measured - target : target - measured;
  if (distance * kMaxUtilizationMilli <= options_.tolerance_milli * target) {
    return {clamped, measurement + ", within the tolerance"};
  }
  // ceil(ready * measured / target); starting replicas serve nothing yet, so a scale-up that
  // they already cover, or a scale-down that would add replicas, keeps the current count.
  const int64_t needed =
      (static_cast<int64_t>(input.ready_replicas) * measured + target - 1) / target;
  const int64_t recommendation =
      measured > target ? std::max<int64_t>(needed, current) : std::min<int64_t>(needed, current);
  const int64_t bounded =
      std::clamp<int64_t>(recommendation, options_.min_replicas, options_.max_replicas);
  std::string reason = fmt::format("{}, needs {}", measurement, needed);
  if (bounded != recommendation) {
    reason += fmt::format(" (bounded to {}..{})", options_.min_replicas, options_.max_replicas);
  }
  return {static_cast<int>(bounded), std::move(reason)};
}

Result<ScaleDecision> Autoscaler::Decide(const AutoscalerInput& input) {
  if (input.current_replicas < 0) {
    return InvalidArgumentError(
        fmt::format("current_replicas: {} (must be >= 0)", input.current_replicas));
  }
  if (input.ready_replicas < 0 || input.ready_replicas > input.current_replicas) {
    return InvalidArgumentError(
        fmt::format("ready_replicas: {} (must be in 0..current_replicas {})", input.ready_replicas,
                    input.current_replicas));
  }
  if (input.utilization_milli < 0 || input.utilization_milli > kMaxUtilizationMilli) {
    return InvalidArgumentError(
        fmt::format("utilization_milli: {} (must be in 0..1000)", input.utilization_milli));
  }
  if (last_now_seconds_ && input.now_seconds < *last_now_seconds_) {
    return InvalidArgumentError(fmt::format("now_seconds: {} is before the previous call's {}",
                                            input.now_seconds, *last_now_seconds_));
  }
  const int64_t now = input.now_seconds;
  const int current = input.current_replicas;
  if (!last_now_seconds_) {
    // The count found on the first call stands as a recommendation, so that a new autoscaler
    // waits a full window before it scales down.
    history_.push_back({now, std::clamp(current, options_.min_replicas, options_.max_replicas)});
  }
  last_now_seconds_ = now;

  auto [recommendation, reason] = Recommend(input);
  history_.push_back({now, recommendation});
  const int64_t longest =
      std::max(options_.scale_up_stabilization_seconds, options_.scale_down_stabilization_seconds);
  while (!history_.empty() && history_.front().time_seconds <= now - longest) {
    history_.pop_front();
  }
  // The HPA's stabilization: go up no further than the lowest recommendation of the scale-up
  // window, down no further than the highest of the scale-down window. The window (now - w, now]
  // always holds this recommendation.
  int lowest_up = recommendation;
  int highest_down = recommendation;
  for (const Recommendation& past : history_) {
    if (past.time_seconds > now - options_.scale_up_stabilization_seconds) {
      lowest_up = std::min(lowest_up, past.replicas);
    }
    if (past.time_seconds > now - options_.scale_down_stabilization_seconds) {
      highest_down = std::max(highest_down, past.replicas);
    }
  }
  int desired = current;
  if (desired < lowest_up) {
    desired = lowest_up;
  }
  if (desired > highest_down) {
    desired = highest_down;
  }
  if (recommendation > current && desired < recommendation) {
    reason += fmt::format("; scale-up held at {} by the {} stabilization window", desired,
                          FormatSpan(options_.scale_up_stabilization_seconds));
  } else if (recommendation < current && desired > recommendation) {
    reason += fmt::format("; scale-down held at {} by the {} stabilization window", desired,
                          FormatSpan(options_.scale_down_stabilization_seconds));
  }

  // Cooldowns never keep the count outside [min_replicas, max_replicas].
  const bool out_of_bounds = current < options_.min_replicas || current > options_.max_replicas;
  if (desired != current && !out_of_bounds && last_change_seconds_) {
    const int64_t cooldown = desired > current ? options_.scale_up_cooldown_seconds
                                               : options_.scale_down_cooldown_seconds;
    const int64_t left = *last_change_seconds_ + cooldown - now;
    if (left > 0) {
      reason +=
          fmt::format("; {} to {} waits {} for the cooldown",
                      desired > current ? "scale-up" : "scale-down", desired, FormatSpan(left));
      desired = current;
    }
  }
  if (desired != current) {
    last_change_seconds_ = now;
    reason += fmt::format("; {} -> {}", current, desired);
  } else {
    reason += fmt::format("; stays at {}", current);
  }
  return ScaleDecision{
      .desired_replicas = desired, .recommendation = recommendation, .reason = std::move(reason)};
}

}  // namespace gpufleet::policy
