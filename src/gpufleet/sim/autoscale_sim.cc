// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/autoscale_sim.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <deque>
#include <iterator>
#include <numbers>
#include <utility>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <nlohmann/json.hpp>

#include "gpufleet/core/random.h"
#include "gpufleet/policy/autoscaler.h"
#include "gpufleet/policy/format.h"
#include "gpufleet/sim/chart.h"
#include "gpufleet/sim/html_page.h"

namespace gpufleet::sim {
namespace {

// Keys keep their insertion order, so the bytes follow the code, not a hash.
using Json = nlohmann::ordered_json;

constexpr int64_t kMilli = 1000;
constexpr int64_t kSecondsPerDay = 86400;
constexpr size_t kMaxAutoscaleChartPoints = 1500;
constexpr size_t kDecisionsShown = 12;

// A standard normal draw (Box-Muller) from our own uniform draws, so that the load is the same
// with every standard library.
double Normal(Random& random) {
  const double u1 = 1.0 - random.UniformDouble();  // (0, 1]: the log is finite
  const double u2 = random.UniformDouble();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

Json RoundedJsonNumber(double value) {
  if (!std::isfinite(value)) {
    return nullptr;
  }
  const double rounded = std::round(value * 1e4) / 1e4;
  return rounded == 0 ? 0.0 : rounded;  // no "-0.0"
}

double PercentOf(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// Work that arrived in one interval and is still waiting.
struct Chunk {
  size_t interval = 0;
  int64_t work = 0;
};

// The FIFO queue of one run.
class WorkQueue {
 public:
  // Serves up to `capacity` of the work of interval `now` and earlier, oldest first, then drops
  // what can no longer be served within `max_wait_intervals` of its arrival.
  void Step(size_t now, int64_t arrived, int64_t capacity, size_t max_wait_intervals,
            AutoscaleInterval& interval, AutoscaleRunSummary& summary, double interval_seconds) {
    if (arrived > 0) {
      chunks_.push_back({now, arrived});
    }
    int64_t left = capacity;
    while (left > 0 && !chunks_.empty()) {
      Chunk& oldest = chunks_.front();
      const int64_t take = std::min(left, oldest.work);
      oldest.work -= take;
      left -= take;
      interval.served += take;
      if (oldest.interval < now) {
        summary.delayed += take;
        wait_sum_ += static_cast<double>(take) * static_cast<double>(now - oldest.interval) *
                     interval_seconds;
      }
      if (oldest.work == 0) {
        chunks_.pop_front();
      }
    }
    while (!chunks_.empty() && now - chunks_.front().interval >= max_wait_intervals) {
      interval.dropped += chunks_.front().work;
      chunks_.pop_front();
    }
    for (const Chunk& chunk : chunks_) {
      interval.backlog += chunk.work;
    }
  }

  double wait_sum() const { return wait_sum_; }

 private:
  std::deque<Chunk> chunks_;
  double wait_sum_ = 0;  // work x seconds waited
};

void Finish(const std::vector<AutoscaleInterval>& intervals, const AutoscaleSimOptions& options,
            double wait_sum, AutoscaleRunSummary& summary) {
  summary.intervals = static_cast<int64_t>(intervals.size());
  int64_t capacity = 0;
  int64_t replica_seconds = 0;
  summary.min_replicas = intervals.empty() ? 0 : intervals.front().replicas;
  const int64_t band_milli_squared =
      options.autoscaler.target_utilization_milli * (kMilli + options.autoscaler.tolerance_milli);
  for (const AutoscaleInterval& interval : intervals) {
    summary.arrived += interval.arrived;
    summary.served += interval.served;
    summary.dropped += interval.dropped;
    capacity += interval.capacity;
    replica_seconds += interval.replicas * options.interval_seconds;
    if (interval.utilization_milli > options.autoscaler.target_utilization_milli) {
      ++summary.overload_intervals;
    }
    // utilization > target * (1 + tolerance), in integers.
    if (interval.utilization_milli * kMilli > band_milli_squared) {
      ++summary.above_band_intervals;
    }
    if (interval.backlog > 0) {
      ++summary.saturated_intervals;
    }
    summary.min_replicas = std::min(summary.min_replicas, interval.replicas);
    summary.max_replicas = std::max(summary.max_replicas, interval.replicas);
  }
  summary.gpu_hours = static_cast<double>(replica_seconds) *
                      static_cast<double>(options.replica.gpu_milli) / kMilli / kSecondsPerHour;
  summary.mean_utilization =
      capacity > 0 ? static_cast<double>(summary.served) / static_cast<double>(capacity) : 0;
  summary.mean_wait_seconds =
      summary.served > 0 ? wait_sum / static_cast<double>(summary.served) : 0;
}

void MeasureInterval(AutoscaleInterval& interval) {
  interval.utilization_milli =
      interval.capacity > 0 ? interval.served * kMilli / interval.capacity : 0;
}

size_t MaxWaitIntervals(const AutoscaleSimOptions& options) {
  // Work that arrived in interval j may still be served in interval i when
  // (i - j) * interval <= max_queue_seconds; after interval i it is dropped when it could not
  // be served in i + 1, i.e. when i - j >= max_queue_seconds / interval.
  return static_cast<size_t>(options.max_queue_seconds / options.interval_seconds);
}

std::vector<AutoscaleInterval> RunStatic(const AutoscaleSimOptions& options,
                                         const std::vector<int64_t>& load, int replicas,
                                         AutoscaleRunSummary& summary) {
  summary.name = "static peak";
  WorkQueue queue;
  std::vector<AutoscaleInterval> intervals;
  intervals.reserve(load.size());
  const int64_t capacity = replicas * options.replica.gpu_milli * options.interval_seconds;
  for (size_t i = 0; i < load.size(); ++i) {
    AutoscaleInterval interval{.start_seconds = static_cast<int64_t>(i) * options.interval_seconds,
                               .arrived = load[i],
                               .replicas = replicas,
                               .ready_replicas = replicas,
                               .capacity = capacity};
    queue.Step(i, load[i], capacity, MaxWaitIntervals(options), interval, summary,
               static_cast<double>(options.interval_seconds));
    MeasureInterval(interval);
    intervals.push_back(interval);
  }
  Finish(intervals, options, queue.wait_sum(), summary);
  return intervals;
}

Result<std::vector<AutoscaleInterval>> RunAutoscaled(const AutoscaleSimOptions& options,
                                                     const std::vector<int64_t>& load,
                                                     AutoscaleRunSummary& summary,
                                                     std::vector<std::string>& decisions) {
  summary.name = "autoscaled";
  GPUFLEET_ASSIGN_OR_RETURN(policy::Autoscaler autoscaler,
                            policy::Autoscaler::Create(options.autoscaler));
  const int64_t replica_capacity = options.replica.gpu_milli * options.interval_seconds;
  const int64_t target = options.autoscaler.target_utilization_milli;
  // A warm start: enough ready replicas for the first interval at the target.
  int ready = static_cast<int>(std::clamp<int64_t>(
      load.empty() ? 0 : CeilDiv(load.front() * kMilli, replica_capacity * target),
      options.autoscaler.min_replicas, options.autoscaler.max_replicas));
  std::deque<int64_t> starting;  // times the starting replicas become ready, soonest first
  WorkQueue queue;
  std::vector<AutoscaleInterval> intervals;
  intervals.reserve(load.size());
  for (size_t i = 0; i < load.size(); ++i) {
    const int64_t start = static_cast<int64_t>(i) * options.interval_seconds;
    while (!starting.empty() && starting.front() <= start) {
      starting.pop_front();
      ++ready;
    }
    const int replicas = ready + static_cast<int>(starting.size());
    AutoscaleInterval interval{.start_seconds = start,
                               .arrived = load[i],
                               .replicas = replicas,
                               .ready_replicas = ready,
                               .capacity = ready * replica_capacity};
    queue.Step(i, load[i], interval.capacity, MaxWaitIntervals(options), interval, summary,
               static_cast<double>(options.interval_seconds));
    MeasureInterval(interval);
    intervals.push_back(interval);

    const int64_t end = start + options.interval_seconds;
    GPUFLEET_ASSIGN_OR_RETURN(policy::ScaleDecision decision,
                              autoscaler.Decide({.now_seconds = end,
                                                 .current_replicas = replicas,
                                                 .ready_replicas = ready,
                                                 .utilization_milli = interval.utilization_milli}));
    if (decision.desired_replicas > replicas) {
      ++summary.scale_ups;
      for (int n = replicas; n < decision.desired_replicas; ++n) {
        starting.push_back(end + options.startup_seconds);
      }
    } else if (decision.desired_replicas < replicas) {
      ++summary.scale_downs;
      // Replicas still starting go first, the last started first; then ready ones.
      for (int n = decision.desired_replicas; n < replicas; ++n) {
        if (!starting.empty()) {
          starting.pop_back();
        } else {
          --ready;
        }
      }
    }
    if (decision.desired_replicas != replicas && decisions.size() < kDecisionsShown) {
      decisions.push_back(fmt::format("day {} {}: {}", end / kSecondsPerDay,
                                      policy::FormatClock(end), decision.reason));
    }
  }
  Finish(intervals, options, queue.wait_sum(), summary);
  return intervals;
}

}  // namespace

Result<ReplicaShape> ParseReplicaShape(std::string_view text, const GpuCatalog& catalog,
                                       std::string_view gpu_model) {
  if (text == "gpu") {
    return ReplicaShape{.gpu_milli = kMilli, .label = "1 GPU"};
  }
  constexpr std::string_view kFraction = "fraction:";
  constexpr std::string_view kMig = "mig:";
  if (text.starts_with(kFraction)) {
    const std::string_view number = text.substr(kFraction.size());
    int64_t milli = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), milli);
    if (error != std::errc() || end != number.data() + number.size() || milli < 1 ||
        milli > kMilli) {
      return InvalidArgumentError(
          fmt::format("replica: \"{}\" (the share must be a milli-GPU count in 1..1000)", text));
    }
    return ReplicaShape{.gpu_milli = milli, .label = fmt::format("{} milli-GPU", milli)};
  }
  if (text.starts_with(kMig)) {
    const std::string_view profile = text.substr(kMig.size());
    GPUFLEET_ASSIGN_OR_RETURN(const GpuModelInfo* model, catalog.Find(gpu_model));
    const MigProfile* found = model->FindMigProfile(profile);
    if (found == nullptr) {
      return NotFoundError(fmt::format("replica: unknown MIG profile \"{}\" for {} (valid: {})",
                                       profile, model->name, model->MigProfileNames()));
    }
    return ReplicaShape{.gpu_milli = found->compute_slices * kMilli / kMigComputeSlices,
                        .label = fmt::format("MIG {} on {}", found->name, model->name)};
  }
  return InvalidArgumentError(
      fmt::format("replica: \"{}\" (must be gpu, fraction:MILLI or mig:PROFILE)", text));
}

Status AutoscaleSimOptions::Validate() const {
  if (duration_seconds <= 0) {
    return InvalidArgumentError(
        fmt::format("duration_seconds: {} (must be > 0)", duration_seconds));
  }
  if (interval_seconds <= 0 || interval_seconds > duration_seconds) {
    return InvalidArgumentError(
        fmt::format("interval_seconds: {} (must be in 1..duration_seconds {})", interval_seconds,
                    duration_seconds));
  }
  if (mean_load_gpu_milli <= 0) {
    return InvalidArgumentError(
        fmt::format("mean_load_gpu_milli: {} (must be > 0)", mean_load_gpu_milli));
  }
  if (!(daily_amplitude >= 0 && daily_amplitude <= 1)) {
    return InvalidArgumentError(
        fmt::format("daily_amplitude: {} (must be in 0..1)", daily_amplitude));
  }
  if (!(peak_hour >= 0 && peak_hour <= 24)) {
    return InvalidArgumentError(fmt::format("peak_hour: {} (must be in 0..24)", peak_hour));
  }
  if (!(noise >= 0 && noise <= 1)) {
    return InvalidArgumentError(fmt::format("noise: {} (must be in 0..1)", noise));
  }
  if (!(noise_correlation >= 0 && noise_correlation < 1)) {
    return InvalidArgumentError(
        fmt::format("noise_correlation: {} (must be in 0..<1)", noise_correlation));
  }
  if (replica.gpu_milli < 1 || replica.gpu_milli > kMilli) {
    return InvalidArgumentError(
        fmt::format("replica.gpu_milli: {} (must be in 1..1000)", replica.gpu_milli));
  }
  if (startup_seconds < 0) {
    return InvalidArgumentError(fmt::format("startup_seconds: {} (must be >= 0)", startup_seconds));
  }
  if (max_queue_seconds < 0) {
    return InvalidArgumentError(
        fmt::format("max_queue_seconds: {} (must be >= 0)", max_queue_seconds));
  }
  const Status autoscaler_status = autoscaler.Validate();
  if (!autoscaler_status.ok()) {
    return InvalidArgumentError("autoscaler." + autoscaler_status.message());
  }
  return Status::Ok();
}

std::vector<int64_t> DiurnalLoad(const AutoscaleSimOptions& options) {
  Random random(options.seed);
  const size_t count =
      static_cast<size_t>(CeilDiv(options.duration_seconds, options.interval_seconds));
  std::vector<int64_t> load;
  load.reserve(count);
  const double innovation = std::sqrt(1.0 - options.noise_correlation * options.noise_correlation);
  double noise = Normal(random);  // stationary from the start
  for (size_t i = 0; i < count; ++i) {
    const double middle =
        (static_cast<double>(i) + 0.5) * static_cast<double>(options.interval_seconds);
    const double hour = std::fmod(middle / kSecondsPerHour, 24.0);
    const double daily =
        1.0 + options.daily_amplitude *
                  std::cos(2.0 * std::numbers::pi * (hour - options.peak_hour) / 24.0);
    const double factor = std::max(0.0, daily * (1.0 + options.noise * noise));
    load.push_back(std::llround(static_cast<double>(options.mean_load_gpu_milli) * factor *
                                static_cast<double>(options.interval_seconds)));
    noise = options.noise_correlation * noise + innovation * Normal(random);
  }
  return load;
}

Result<AutoscaleSimResult> RunAutoscaleSim(const AutoscaleSimOptions& options) {
  GPUFLEET_RETURN_IF_ERROR(options.Validate());
  AutoscaleSimResult result;
  result.options = options;
  const std::vector<int64_t> load = DiurnalLoad(options);
  const int64_t peak = load.empty() ? 0 : *std::max_element(load.begin(), load.end());
  result.peak_load_gpu_milli = peak / options.interval_seconds;
  // The target met in the busiest interval.
  const int64_t replica_capacity = options.replica.gpu_milli * options.interval_seconds;
  result.static_replicas = static_cast<int>(std::max<int64_t>(
      1, CeilDiv(peak * kMilli, replica_capacity * options.autoscaler.target_utilization_milli)));
  result.static_peak = RunStatic(options, load, result.static_replicas, result.static_summary);
  GPUFLEET_ASSIGN_OR_RETURN(
      result.autoscaled,
      RunAutoscaled(options, load, result.autoscaled_summary, result.first_decisions));
  return result;
}

namespace {

// The top of the tolerance band, target x (1 + tolerance), in milli (rounded down).
int64_t BandMilli(const AutoscaleSimResult& result) {
  const AutoscalerOptions& autoscaler = result.options.autoscaler;
  return autoscaler.target_utilization_milli * (kMilli + autoscaler.tolerance_milli) / kMilli;
}

double GpuHoursRatio(const AutoscaleSimResult& result) {
  return result.static_summary.gpu_hours > 0
             ? result.autoscaled_summary.gpu_hours / result.static_summary.gpu_hours
             : 0;
}

// The rows of the summary table, one value per run.
std::vector<std::pair<std::string, std::vector<std::string>>> AutoscaleSummaryRows(
    const AutoscaleSimResult& result) {
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  const double work_unit = kMilli * kSecondsPerHour;  // milli-GPU-seconds in a GPU-hour
  auto add = [&](std::string label, auto cell) {
    rows.emplace_back(std::move(label), std::vector<std::string>{cell(result.autoscaled_summary),
                                                                 cell(result.static_summary)});
  };
  add("GPU-hours", [](const AutoscaleRunSummary& s) { return fmt::format("{:.1f}", s.gpu_hours); });
  add("replicas (min-max)", [](const AutoscaleRunSummary& s) {
    return fmt::format("{}-{}", s.min_replicas, s.max_replicas);
  });
  add("mean utilization", [](const AutoscaleRunSummary& s) {
    return fmt::format("{:.1f}%", 100 * s.mean_utilization);
  });
  add(fmt::format("intervals above {} (target)",
                  policy::FormatPercentMilli(result.options.autoscaler.target_utilization_milli)),
      [](const AutoscaleRunSummary& s) {
        return fmt::format("{} of {} ({:.2f}%)", s.overload_intervals, s.intervals,
                           PercentOf(s.overload_intervals, s.intervals));
      });
  add(fmt::format("intervals above {} (band)", policy::FormatPercentMilli(BandMilli(result))),
      [](const AutoscaleRunSummary& s) {
        return fmt::format("{} ({:.2f}%)", s.above_band_intervals,
                           PercentOf(s.above_band_intervals, s.intervals));
      });
  add("intervals with work waiting", [](const AutoscaleRunSummary& s) {
    return fmt::format("{} ({:.2f}%)", s.saturated_intervals,
                       PercentOf(s.saturated_intervals, s.intervals));
  });
  add("work delayed (GPU-h)", [&](const AutoscaleRunSummary& s) {
    return fmt::format("{:.2f} ({:.3f}%)", static_cast<double>(s.delayed) / work_unit,
                       PercentOf(s.delayed, s.arrived));
  });
  add("work dropped (GPU-h)", [&](const AutoscaleRunSummary& s) {
    return fmt::format("{:.2f} ({:.3f}%)", static_cast<double>(s.dropped) / work_unit,
                       PercentOf(s.dropped, s.arrived));
  });
  add("mean wait of served work",
      [](const AutoscaleRunSummary& s) { return fmt::format("{:.2f} s", s.mean_wait_seconds); });
  add("scale-ups / scale-downs", [](const AutoscaleRunSummary& s) {
    return fmt::format("{} / {}", s.scale_ups, s.scale_downs);
  });
  return rows;
}

std::string Headline(const AutoscaleSimResult& result) {
  const AutoscaleRunSummary& a = result.autoscaled_summary;
  return fmt::format(
      "autoscaled: {:.1f} GPU-hours against {:.1f} for {} static replicas ({:.1f}% of static, "
      "{:.1f}% saved); {} of {} intervals ({:.2f}%) above the {} target, {} ({:.2f}%) above its "
      "tolerance band; {:.3f}% of the work dropped",
      a.gpu_hours, result.static_summary.gpu_hours, result.static_replicas,
      100 * GpuHoursRatio(result), 100 * (1 - GpuHoursRatio(result)), a.overload_intervals,
      a.intervals, PercentOf(a.overload_intervals, a.intervals),
      policy::FormatPercentMilli(result.options.autoscaler.target_utilization_milli),
      a.above_band_intervals, PercentOf(a.above_band_intervals, a.intervals),
      PercentOf(a.dropped, a.arrived));
}

Json SummaryJson(const AutoscaleRunSummary& s) {
  Json json = Json::object();
  json["name"] = s.name;
  json["gpu_hours"] = RoundedJsonNumber(s.gpu_hours);
  json["intervals"] = s.intervals;
  json["overload_intervals"] = s.overload_intervals;
  json["above_band_intervals"] = s.above_band_intervals;
  json["saturated_intervals"] = s.saturated_intervals;
  json["arrived_gpu_milli_seconds"] = s.arrived;
  json["served_gpu_milli_seconds"] = s.served;
  json["dropped_gpu_milli_seconds"] = s.dropped;
  json["delayed_gpu_milli_seconds"] = s.delayed;
  json["mean_wait_seconds"] = RoundedJsonNumber(s.mean_wait_seconds);
  json["mean_utilization"] = RoundedJsonNumber(s.mean_utilization);
  json["scale_ups"] = s.scale_ups;
  json["scale_downs"] = s.scale_downs;
  json["min_replicas"] = s.min_replicas;
  json["max_replicas"] = s.max_replicas;
  return json;
}

// Evenly spaced buckets of at most kMaxAutoscaleChartPoints: the mean of `value` per bucket, at the
// bucket's first day of the run when `in_days`, else its first hour since interval `from`.
template <typename Value>
Series Bucketed(std::string name, const std::vector<AutoscaleInterval>& intervals, size_t from,
                size_t to, bool in_days, Value value) {
  Series series{.name = std::move(name)};
  const size_t count = to - from;
  const size_t step =
      std::max<size_t>(1, (count + kMaxAutoscaleChartPoints - 1) / kMaxAutoscaleChartPoints);
  const double unit = in_days ? kSecondsPerHour * 24 : kSecondsPerHour;
  const int64_t origin_seconds = in_days || from >= to ? 0 : intervals[from].start_seconds;
  for (size_t begin = from; begin < to; begin += step) {
    const size_t end = std::min(to, begin + step);
    double sum = 0;
    for (size_t i = begin; i < end; ++i) {
      sum += value(intervals[i]);
    }
    series.x.push_back(static_cast<double>(intervals[begin].start_seconds - origin_seconds) / unit);
    series.y.push_back(sum / static_cast<double>(end - begin));
  }
  return series;
}

ChartSpec ReplicaChart(const AutoscaleSimResult& result, size_t from, size_t to, bool in_days,
                       std::string title) {
  const double per_replica = static_cast<double>(result.options.replica.gpu_milli) *
                             static_cast<double>(result.options.interval_seconds);
  ChartSpec chart{.title = std::move(title),
                  .x_label = in_days ? "day" : "hour of the day",
                  .y_label = "replicas",
                  .step = true};
  chart.series.push_back(Bucketed("load (replicas at 100%)", result.autoscaled, from, to, in_days,
                                  [&](const AutoscaleInterval& interval) {
                                    return static_cast<double>(interval.arrived) / per_replica;
                                  }));
  chart.series.push_back(Bucketed(
      "replicas (autoscaled)", result.autoscaled, from, to, in_days,
      [](const AutoscaleInterval& interval) { return static_cast<double>(interval.replicas); }));
  chart.series.push_back(Bucketed("ready replicas (autoscaled)", result.autoscaled, from, to,
                                  in_days, [](const AutoscaleInterval& interval) {
                                    return static_cast<double>(interval.ready_replicas);
                                  }));
  chart.series.push_back(Bucketed(
      "static peak replicas", result.static_peak, from, to, in_days,
      [](const AutoscaleInterval& interval) { return static_cast<double>(interval.replicas); }));
  return chart;
}

}  // namespace

void PrintAutoscaleSummary(const AutoscaleSimResult& result, std::ostream& out) {
  fmt::print(out, "{:<30} {:>24} {:>24}\n", "", result.autoscaled_summary.name,
             result.static_summary.name);
  for (const auto& [label, values] : AutoscaleSummaryRows(result)) {
    fmt::print(out, "{:<30} {:>24} {:>24}\n", label, values[0], values[1]);
  }
  fmt::print(out, "{}\n", Headline(result));
}

void WriteAutoscaleJson(const AutoscaleSimResult& result, std::ostream& out) {
  const AutoscaleSimOptions& o = result.options;
  Json json = Json::object();
  json["mode"] = "autoscale";
  json["options"] = {
      {"seed", o.seed},
      {"duration_seconds", o.duration_seconds},
      {"interval_seconds", o.interval_seconds},
      {"mean_load_gpu_milli", o.mean_load_gpu_milli},
      {"daily_amplitude", RoundedJsonNumber(o.daily_amplitude)},
      {"peak_hour", RoundedJsonNumber(o.peak_hour)},
      {"noise", RoundedJsonNumber(o.noise)},
      {"noise_correlation", RoundedJsonNumber(o.noise_correlation)},
      {"replica", o.replica.label},
      {"replica_gpu_milli", o.replica.gpu_milli},
      {"startup_seconds", o.startup_seconds},
      {"max_queue_seconds", o.max_queue_seconds},
      {"min_replicas", o.autoscaler.min_replicas},
      {"max_replicas", o.autoscaler.max_replicas},
      {"target_utilization_milli", o.autoscaler.target_utilization_milli},
      {"tolerance_milli", o.autoscaler.tolerance_milli},
      {"scale_up_stabilization_seconds", o.autoscaler.scale_up_stabilization_seconds},
      {"scale_down_stabilization_seconds", o.autoscaler.scale_down_stabilization_seconds},
      {"scale_up_cooldown_seconds", o.autoscaler.scale_up_cooldown_seconds},
      {"scale_down_cooldown_seconds", o.autoscaler.scale_down_cooldown_seconds}};
  json["peak_load_gpu_milli"] = result.peak_load_gpu_milli;
  json["static_replicas"] = result.static_replicas;
  json["runs"] =
      Json::array({SummaryJson(result.autoscaled_summary), SummaryJson(result.static_summary)});
  json["gpu_hours_ratio"] = RoundedJsonNumber(GpuHoursRatio(result));
  out << json.dump(-1, ' ', false, Json::error_handler_t::replace) << '\n';
}

Status WriteAutoscaleReport(const AutoscaleSimResult& result, const std::string& title,
                            std::ostream& out) {
  const AutoscaleSimOptions& o = result.options;
  std::string body;
  auto append = [&body]<typename... Args>(fmt::format_string<Args...> format, Args&&... args) {
    fmt::format_to(std::back_inserter(body), format, std::forward<Args>(args)...);
  };
  append(
      "<p class=\"note\">One inference deployment for {:.1f} days in {} s intervals, seed {}. "
      "Load: a mean of {:.1f} GPUs of work, &#177;{:.0f}% over the day (peak at {:.1f} h), with "
      "{:.0f}% AR(1) noise (correlation {:.2f}); its busiest interval needed {:.1f} GPUs. "
      "Replica: {}; new replicas serve after {} s; work waiting over {} s beyond its interval is "
      "dropped. Autoscaler: target {} &#177;{}, {}..{} replicas, stabilization {} up / {} down, "
      "cooldown {} up / {} down. Static: {} replicas, the target met at the peak.</p>\n",
      static_cast<double>(o.duration_seconds) / kSecondsPerDay, o.interval_seconds, o.seed,
      static_cast<double>(o.mean_load_gpu_milli) / kMilli, 100 * o.daily_amplitude, o.peak_hour,
      100 * o.noise, o.noise_correlation, static_cast<double>(result.peak_load_gpu_milli) / kMilli,
      XmlEscape(o.replica.label), o.startup_seconds, o.max_queue_seconds,
      policy::FormatPercentMilli(o.autoscaler.target_utilization_milli),
      policy::FormatPercentMilli(o.autoscaler.tolerance_milli), o.autoscaler.min_replicas,
      o.autoscaler.max_replicas, policy::FormatSpan(o.autoscaler.scale_up_stabilization_seconds),
      policy::FormatSpan(o.autoscaler.scale_down_stabilization_seconds),
      policy::FormatSpan(o.autoscaler.scale_up_cooldown_seconds),
      policy::FormatSpan(o.autoscaler.scale_down_cooldown_seconds), result.static_replicas);
  append("<p class=\"claim\">{}.</p>\n", XmlEscape(Headline(result)));

  body += "<h2>Summary</h2>\n<table>\n<tr><th></th>";
  for (const AutoscaleRunSummary* s : {&result.autoscaled_summary, &result.static_summary}) {
    body += "<th>" + XmlEscape(s->name) + "</th>";
  }
  body += "</tr>\n";
  for (const auto& [label, values] : AutoscaleSummaryRows(result)) {
    body += "<tr><td>" + XmlEscape(label) + "</td>";
    for (const std::string& value : values) {
      body += "<td class=\"num\">" + XmlEscape(value) + "</td>";
    }
    body += "</tr>\n";
  }
  body += "</table>\n";

  const size_t count = result.autoscaled.size();
  body += "<h2>Replicas and load</h2>\n";
  body += FigureHtml(ReplicaChart(result, 0, count, true, "Replicas and load over the run"));
  // One day at full resolution: the second when there is one (past the warm start).
  const size_t per_day = static_cast<size_t>(CeilDiv(kSecondsPerDay, o.interval_seconds));
  const size_t day_from = count >= 2 * per_day ? per_day : 0;
  const size_t day_to = std::min(count, day_from + per_day);
  body += FigureHtml(ReplicaChart(result, day_from, day_to, false,
                                  fmt::format("Replicas and load on day {}", day_from / per_day)));
  body +=
      "<p class=\"note\">Load in replicas at 100% utilization: the work of each interval "
      "divided by what one replica serves in it. The gap between replicas and ready replicas is "
      "the start-up delay.</p>\n";

  body += "<h2>Utilization against the target</h2>\n";
  ChartSpec utilization{.title = "Measured utilization",
                        .x_label = "day",
                        .y_label = "utilization (%)",
                        .step = true};
  for (const auto* run : {&result.autoscaled, &result.static_peak}) {
    utilization.series.push_back(Bucketed(
        run == &result.autoscaled ? "autoscaled" : "static peak", *run, 0, count, true,
        [](const AutoscaleInterval& i) { return static_cast<double>(i.utilization_milli) / 10; }));
  }
  const double target_percent = static_cast<double>(o.autoscaler.target_utilization_milli) / 10;
  utilization.series.push_back(
      Series{.name = "target",
             .x = {0, static_cast<double>(o.duration_seconds) / kSecondsPerDay},
             .y = {target_percent, target_percent}});
  body += FigureHtml(utilization);
  ChartSpec cdf{.title = "Utilization per interval (CDF)",
                .x_label = "utilization (%)",
                .y_label = "share of intervals",
                .step = true};
  for (const auto* run : {&result.autoscaled, &result.static_peak}) {
    std::vector<double> values;
    values.reserve(run->size());
    for (const AutoscaleInterval& i : *run) {
      values.push_back(static_cast<double>(i.utilization_milli) / 10);
    }
    cdf.series.push_back(
        CdfSeries(run == &result.autoscaled ? "autoscaled" : "static peak", std::move(values)));
  }
  body += FigureHtml(cdf);

  if (!result.first_decisions.empty()) {
    append("<h2>The autoscaler's first {} changes</h2>\n<table>\n<tr><th>reason</th></tr>\n",
           result.first_decisions.size());
    for (const std::string& decision : result.first_decisions) {
      body += "<tr><td>" + XmlEscape(decision) + "</td></tr>\n";
    }
    body += "</table>\n";
  }
  return WriteHtmlPage(title, body, out);
}

}  // namespace gpufleet::sim
