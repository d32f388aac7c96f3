// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/utilization_scenarios.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "gpufleet/core/random.h"
#include "gpufleet/sim/chart.h"
#include "gpufleet/sim/html_page.h"
#include "gpufleet/sim/parallel.h"

namespace gpufleet::sim {
namespace {

// Jobs of at least this many GPUs are the ones a queue without reservations starves.
constexpr int kLargeJobGpus = 8;

std::string HoursText(double seconds) {
  return fmt::format("{:.2f} h", seconds / kSecondsPerHour);
}

double BusyPercent(const ReplayResult& r) {
  return r.total_gpus > 0 ? 100.0 * r.mean_gpus_allocated / r.total_gpus : 0.0;
}

const ReplayQueueOutcome* FindQueue(const ReplayResult& result, const std::string& queue) {
  for (const ReplayQueueOutcome& outcome : result.queues) {
    if (outcome.queue == queue) {
      return &outcome;
    }
  }
  return nullptr;
}

double MeanDelay(const ReplayResult& result, const std::string& queue) {
  const ReplayQueueOutcome* outcome = FindQueue(result, queue);
  return outcome == nullptr ? 0.0 : outcome->queueing_delay.mean;
}

// Mean queueing delay of the started jobs of at least `min_gpus` GPUs; 0 when there is none.
double MeanDelayOfLargeJobs(const ReplayResult& result, int min_gpus) {
  double sum = 0;
  int count = 0;
  for (const ReplayJobOutcome& job : result.jobs) {
    if (job.first_start_seconds >= 0 && job.gpus >= min_gpus) {
      sum += static_cast<double>(job.QueueingDelay());
      ++count;
    }
  }
  return count > 0 ? sum / count : 0.0;
}

// Queueing delays in hours of the jobs of `queue` (every job when empty) that started.
std::vector<double> DelayHours(const ReplayResult& result, const std::string& queue) {
  std::vector<double> hours;
  for (const ReplayJobOutcome& job : result.jobs) {
    if (job.first_start_seconds >= 0 && (queue.empty() || job.queue == queue)) {
      hours.push_back(static_cast<double>(job.QueueingDelay()) / kSecondsPerHour);
    }
  }
  return hours;
}

Series OverTime(std::string name, const ReplayResult& result, double ReplaySample::*field) {
  Series series{std::move(name), {}, {}};
  for (const ReplaySample& sample : result.series) {
    series.x.push_back(static_cast<double>(sample.time_seconds) / kSecondsPerHour);
    series.y.push_back(sample.*field);
  }
  return series;
}

Series QueueLengthOverTime(std::string name, const ReplayResult& result) {
  Series series{std::move(name), {}, {}};
  for (const ReplaySample& sample : result.series) {
    series.x.push_back(static_cast<double>(sample.time_seconds) / kSecondsPerHour);
    series.y.push_back(sample.queue_length);
  }
  return series;
}

// Equal weights, half the cluster's GPUs of every model guaranteed to each team, and each team
// limited to team_limit_share of them.
std::vector<policy::QueueSpec> TwoTeams(const Cluster& cluster, const FairnessOptions& options) {
  policy::GpuMilliByModel capacity;
  for (const Node& node : cluster.nodes) {
    for (const Gpu& gpu : node.gpus) {
      capacity[gpu.model] += kMilliPerUnit;
    }
  }
  policy::GpuMilliByModel half;
  policy::GpuMilliByModel limit;
  for (const auto& [model, milli] : capacity) {
    half[model] = milli / 2;
    limit[model] = std::max<int64_t>(
        half[model], std::llround(options.team_limit_share * static_cast<double>(milli)));
  }
  if (options.team_limit_share >= 1.0) {
    limit.clear();
  }
  return {{options.flooder, half, limit}, {options.victim, half, limit}};
}

TraceJob InQueue(TraceJob job, const std::string& queue) {
  job.job.queue = QueueId(queue);
  return job;
}

}  // namespace

Trace SliceTrace(const Trace& trace, int64_t start_seconds, int64_t length_seconds) {
  Trace slice;
  slice.source = trace.source;
  for (const TraceJob& job : trace.jobs) {
    const int64_t offset = job.submit_seconds - start_seconds;
    if (offset >= 0 && (length_seconds <= 0 || offset < length_seconds)) {
      slice.jobs.push_back(job);
      slice.jobs.back().submit_seconds = offset;
    }
  }
  return slice;
}

Result<FairnessWorkloads> MakeFairnessWorkloads(const Trace& trace,
                                                const FairnessOptions& options) {
  if (options.flood_copies < 1) {
    return InvalidArgumentError(
        fmt::format("flood_copies: {} (must be at least 1)", options.flood_copies));
  }
  if (options.flood_burst_seconds < 0) {
    return InvalidArgumentError(
        fmt::format("flood_burst_seconds: {} (must be >= 0)", options.flood_burst_seconds));
  }
  if (!(options.team_limit_share >= 0.5 && options.team_limit_share <= 1.0)) {
    return InvalidArgumentError(
        fmt::format("team_limit_share: {} (must be in [0.5, 1])", options.team_limit_share));
  }
  if (options.flooder.empty() || options.victim.empty() || options.flooder == options.victim) {
    return InvalidArgumentError(
        fmt::format("teams: \"{}\" and \"{}\" (must be two different non-empty queue names)",
                    options.flooder, options.victim));
  }
  FairnessWorkloads workloads;
  workloads.victim_alone.source = trace.source;
  workloads.flooded.source = trace.source;
  const int64_t span = trace.jobs.empty() ? 1 : trace.jobs.back().submit_seconds + 1;
  for (size_t i = 0; i < trace.jobs.size(); ++i) {
    const TraceJob& job = trace.jobs[i];
    if (i % 2 == 1) {
      workloads.victim_alone.jobs.push_back(InQueue(job, options.victim));
      workloads.flooded.jobs.push_back(InQueue(job, options.victim));
      continue;
    }
    TraceJob flood = InQueue(job, options.flooder);
    if (options.flood_burst_seconds > 0) {
      flood.submit_seconds = job.submit_seconds * options.flood_burst_seconds / span;
    }
    for (int copy = 1; copy <= options.flood_copies; ++copy) {
      workloads.flooded.jobs.push_back(flood);
      if (copy > 1) {
        workloads.flooded.jobs.back().job.id =
            JobId(fmt::format("{}~{}", job.job.id.value(), copy));
      }
    }
  }
  std::stable_sort(
      workloads.flooded.jobs.begin(), workloads.flooded.jobs.end(),
      [](const TraceJob& a, const TraceJob& b) { return a.submit_seconds < b.submit_seconds; });
  return workloads;
}

double FairnessComparison::DelayRatio() const {
  if (victim_alone_mean_delay > 0) {
    return victim_flooded_mean_delay / victim_alone_mean_delay;
  }
  return victim_flooded_mean_delay > 0 ? std::numeric_limits<double>::infinity() : 1.0;
}

Result<FairnessResult> RunFairnessScenario(const Cluster& cluster, const Trace& trace,
                                           const GpuCatalog& catalog,
                                           const FairnessOptions& options, int threads) {
  GPUFLEET_ASSIGN_OR_RETURN(const FairnessWorkloads workloads,
                            MakeFairnessWorkloads(trace, options));
  const std::vector<policy::QueueSpec> teams = TwoTeams(cluster, options);
  // Run 2i: policy i alone; 2i + 1: policy i flooded.
  GPUFLEET_ASSIGN_OR_RETURN(
      std::vector<ReplayResult> runs,
      ParallelMap<ReplayResult>(
          2 * options.policies.size(), threads,
          [&](size_t i) {
            ReplayOptions run = options.replay;
            run.queue_policy = options.policies[i / 2];
            run.queues = teams;
            return RunReplay(cluster, i % 2 == 0 ? workloads.victim_alone : workloads.flooded,
                             catalog, run);
          },
          {}));
  FairnessResult result;
  result.options = options;
  result.victim_jobs = static_cast<int>(workloads.victim_alone.jobs.size());
  result.flooder_jobs =
      static_cast<int>(workloads.flooded.jobs.size() - workloads.victim_alone.jobs.size());
  for (size_t i = 0; i < options.policies.size(); ++i) {
    FairnessComparison comparison;
    comparison.policy = options.policies[i];
    comparison.alone = std::move(runs[2 * i]);
    comparison.flooded = std::move(runs[2 * i + 1]);
    comparison.victim_alone_mean_delay = MeanDelay(comparison.alone, options.victim);
    comparison.victim_flooded_mean_delay = MeanDelay(comparison.flooded, options.victim);
    comparison.flooder_mean_delay = MeanDelay(comparison.flooded, options.flooder);
    result.comparisons.push_back(std::move(comparison));
  }
  return result;
}

void PrintFairnessSummary(const FairnessResult& result, std::ostream& out) {
  fmt::print(out, "{} jobs of {} alone; {} more of {} in the flooded runs\n", result.victim_jobs,
             result.options.victim, result.flooder_jobs, result.options.flooder);
  fmt::print(out, "{:<22} {:>12} {:>12} {:>8} {:>12} {:>10} {:>10} {:>11}\n", "queue", "B alone",
             "B flooded", "ratio", "A flooded", "busy alone", "busy flood", "preemptions");
  for (const FairnessComparison& c : result.comparisons) {
    fmt::print(
        out, "{:<22} {:>11.0f}s {:>11.0f}s {:>7.2f}x {:>11.0f}s {:>9.1f}% {:>9.1f}% {:>11}\n",
        c.policy, c.victim_alone_mean_delay, c.victim_flooded_mean_delay, c.DelayRatio(),
        c.flooder_mean_delay, BusyPercent(c.alone), BusyPercent(c.flooded), c.flooded.preemptions);
  }
}

Status WriteFairnessReport(const FairnessResult& result, const std::string& title,
                           std::ostream& out) {
  if (result.comparisons.empty()) {
    return InvalidArgumentError("no fairness runs to report");
  }
  const FairnessOptions& options = result.options;
  std::string body;
  auto append = [&body]<typename... Args>(fmt::format_string<Args...> format, Args&&... args) {
    fmt::format_to(std::back_inserter(body), format, std::forward<Args>(args)...);
  };
  append(
      "<p class=\"note\">Two teams of equal weight, each guaranteed half of the {} GPUs. The "
      "trace's jobs are dealt to them alternately; {} ({} jobs) is measured alone and then with "
      "{} flooding the queue ({} jobs: each of its jobs {} times{}). Queueing delay: submit to "
      "first start. Target: {}'s mean queueing delay flooded within 2x of alone.</p>\n",
      result.comparisons.front().alone.total_gpus, XmlEscape(options.victim), result.victim_jobs,
      XmlEscape(options.flooder), result.flooder_jobs, options.flood_copies,
      options.flood_burst_seconds > 0
          ? fmt::format(", all within the first {}", HoursText(options.flood_burst_seconds))
          : std::string(),
      XmlEscape(options.victim));
  append(
      "<h2>Summary</h2>\n<table>\n<tr><th rowspan=\"2\">queue policy</th><th colspan=\"4\">{} "
      "mean queueing delay</th><th rowspan=\"2\">{} mean queueing delay (flooded)</th>"
      "<th colspan=\"2\">GPUs busy</th><th rowspan=\"2\">preemptions (flooded)</th></tr>\n"
      "<tr><th>alone</th><th>flooded</th><th>ratio</th><th>within 2x</th><th>alone</th>"
      "<th>flooded</th></tr>\n",
      XmlEscape(options.victim), XmlEscape(options.flooder));
  for (const FairnessComparison& c : result.comparisons) {
    body += "<tr>" + HtmlCell(c.policy) + HtmlNumCell(HoursText(c.victim_alone_mean_delay)) +
            HtmlNumCell(HoursText(c.victim_flooded_mean_delay)) +
            HtmlNumCell(fmt::format("{:.2f}x", c.DelayRatio())) +
            HtmlCell(c.DelayRatio() <= 2.0 ? "yes" : "no") +
            HtmlNumCell(HoursText(c.flooder_mean_delay)) +
            HtmlNumCell(fmt::format("{:.1f} %", BusyPercent(c.alone))) +
            HtmlNumCell(fmt::format("{:.1f} %", BusyPercent(c.flooded))) +
            HtmlNumCell(std::to_string(c.flooded.preemptions)) + "</tr>\n";
  }
  body += "</table>\n";

  ChartSpec delay{.title = fmt::format("CDF of {}'s queueing delay", options.victim),
                  .x_label = "queueing delay (hours)",
                  .y_label = "share of started jobs",
                  .step = true};
  ChartSpec queue{.title = "Jobs waiting over time, flooded runs",
                  .x_label = "time (hours)",
                  .y_label = "jobs waiting",
                  .step = true};
  for (const FairnessComparison& c : result.comparisons) {
    delay.series.push_back(CdfSeries(c.policy + " alone", DelayHours(c.alone, options.victim)));
    delay.series.push_back(CdfSeries(c.policy + " flooded", DelayHours(c.flooded, options.victim)));
    queue.series.push_back(QueueLengthOverTime(c.policy, c.flooded));
  }
  body += "<h2>Queueing delay</h2>\n" + FigureHtml(delay);
  body += "<h2>Queue</h2>\n" + FigureHtml(queue);
  return WriteHtmlPage(title, body, out);
}

Status EstimateModel::Validate() const {
  if (!(overestimate_factor >= 1 && overestimate_factor <= 100)) {
    return InvalidArgumentError(
        fmt::format("overestimate_factor: {} (must be in [1, 100])", overestimate_factor));
  }
  if (!(underestimate_share >= 0 && underestimate_share <= 1)) {
    return InvalidArgumentError(
        fmt::format("underestimate_share: {} (must be in [0, 1])", underestimate_share));
  }
  return Status::Ok();
}

Result<Trace> WithRuntimeEstimates(const Trace& trace, const EstimateModel& model, uint64_t seed) {
  GPUFLEET_RETURN_IF_ERROR(model.Validate());
  Trace estimated = trace;
  Random random(seed);
  for (TraceJob& job : estimated.jobs) {
    // Both draws for every job, so that one job's estimate does not depend on the model's
    // parameters for the others.
    const bool under = random.UniformDouble() < model.underestimate_share;
    const double u = random.UniformDouble();
    const double factor = under ? 0.5 + 0.5 * u : 1 + (model.overestimate_factor - 1) * u;
    const int64_t seconds = std::max<int64_t>(
        1, static_cast<int64_t>(std::floor(static_cast<double>(job.duration_seconds) * factor)));
    // An underestimate stays below the run time, but never 0, which would set no limit.
    job.job.runtime_estimate = std::chrono::seconds(
        under ? std::max<int64_t>(1, std::min(seconds, job.duration_seconds - 1)) : seconds);
  }
  return estimated;
}

Result<BackfillScenarioResult> RunBackfillScenario(const Cluster& cluster, const Trace& trace,
                                                   const GpuCatalog& catalog,
                                                   const BackfillScenarioOptions& options,
                                                   int threads) {
  GPUFLEET_ASSIGN_OR_RETURN(const Trace estimated,
                            WithRuntimeEstimates(trace, options.estimates, options.replay.seed));
  GPUFLEET_ASSIGN_OR_RETURN(
      std::vector<ReplayResult> runs,
      RunReplayMatrix(cluster, estimated, catalog, options.policies, options.replay, threads));
  return BackfillScenarioResult{options.estimates, std::move(runs)};
}

namespace {

std::string EstimatesText(const EstimateModel& model) {
  if (model.Exact()) {
    return "exact runtime estimates";
  }
  return fmt::format(
      "runtime estimates: run time x U[1, {:g}], {:g}% of the jobs underestimated (x U[0.5, 1))",
      model.overestimate_factor, model.underestimate_share * 100);
}

}  // namespace

void PrintBackfillSummary(const BackfillScenarioResult& result, std::ostream& out) {
  fmt::print(out, "{}\n", EstimatesText(result.estimates));
  fmt::print(out, "{:<14} {:>6} {:>10} {:>10} {:>10} {:>11} {:>10} {:>9} {:>9} {:>8} {:>9}\n",
             "queue", "jobs", "wait mean", "wait p50", "wait p99", "wait >=8GPU", "JCT mean",
             "GPUs busy", "reserved", "delayed", "timed out");
  for (const ReplayResult& r : result.runs) {
    fmt::print(out,
               "{:<14} {:>6} {:>9.0f}s {:>9.0f}s {:>9.0f}s {:>10.0f}s {:>9.0f}s {:>8.1f}% {:>9} "
               "{:>8} {:>9}\n",
               r.queue_policy, r.jobs_total, r.queueing_delay.mean, r.queueing_delay.p50,
               r.queueing_delay.p99, MeanDelayOfLargeJobs(r, kLargeJobGpus), r.completion_time.mean,
               BusyPercent(r), r.reservations, r.reservations_delayed, r.jobs_timed_out);
  }
}

Status WriteBackfillReport(const BackfillScenarioResult& result, const std::string& title,
                           std::ostream& out) {
  if (result.runs.empty()) {
    return InvalidArgumentError("no backfill runs to report");
  }
  std::string body;
  auto append = [&body]<typename... Args>(fmt::format_string<Args...> format, Args&&... args) {
    fmt::format_to(std::back_inserter(body), format, std::forward<Args>(args)...);
  };
  append(
      "<p class=\"note\">{} jobs on {} GPUs. strict-fifo: the first job that does not fit "
      "blocks every job behind it. fifo: later jobs that fit start anyway (no reservation). "
      "easy-backfill: the first job that does not fit gets a reservation from the runtime "
      "estimates; a later job starts only if the reserved job still fits at its reserved time. "
      "\"delayed\": reserved jobs that started after their first reservation. {}.</p>\n",
      result.runs.front().jobs_total, result.runs.front().total_gpus,
      EstimatesText(result.estimates));
  body +=
      "<h2>Summary</h2>\n<table>\n<tr><th rowspan=\"2\">queue policy</th>"
      "<th colspan=\"5\">queueing delay</th><th colspan=\"2\">job completion time</th>"
      "<th rowspan=\"2\">GPUs busy</th><th rowspan=\"2\">reservations</th>"
      "<th rowspan=\"2\">delayed</th><th rowspan=\"2\">timed out</th></tr>\n"
      "<tr><th>mean</th><th>p50</th><th>p90</th><th>p99</th><th>mean, jobs of 8+ GPUs</th>"
      "<th>mean</th><th>p99</th></tr>\n";
  for (const ReplayResult& r : result.runs) {
    body += "<tr>" + HtmlCell(r.queue_policy) + HtmlNumCell(HoursText(r.queueing_delay.mean)) +
            HtmlNumCell(HoursText(r.queueing_delay.p50)) +
            HtmlNumCell(HoursText(r.queueing_delay.p90)) +
            HtmlNumCell(HoursText(r.queueing_delay.p99)) +
            HtmlNumCell(HoursText(MeanDelayOfLargeJobs(r, kLargeJobGpus))) +
            HtmlNumCell(HoursText(r.completion_time.mean)) +
            HtmlNumCell(HoursText(r.completion_time.p99)) +
            HtmlNumCell(fmt::format("{:.1f} %", BusyPercent(r))) +
            HtmlNumCell(std::to_string(r.reservations)) +
            HtmlNumCell(std::to_string(r.reservations_delayed)) +
            HtmlNumCell(std::to_string(r.jobs_timed_out)) + "</tr>\n";
  }
  body += "</table>\n";

  ChartSpec delay{.title = "CDF of queueing delay",
                  .x_label = "queueing delay (hours)",
                  .y_label = "share of started jobs",
                  .step = true};
  ChartSpec queue{.title = "Jobs waiting over time",
                  .x_label = "time (hours)",
                  .y_label = "jobs waiting",
                  .step = true};
  ChartSpec allocated{
      .title = "GPUs allocated over time", .x_label = "time (hours)", .y_label = "GPUs allocated"};
  for (const ReplayResult& r : result.runs) {
    delay.series.push_back(CdfSeries(r.queue_policy, DelayHours(r, "")));
    queue.series.push_back(QueueLengthOverTime(r.queue_policy, r));
    allocated.series.push_back(OverTime(r.queue_policy, r, &ReplaySample::gpus_allocated));
  }
  body += "<h2>Queueing delay</h2>\n" + FigureHtml(delay);
  body += "<h2>Queue and allocation</h2>\n" + FigureHtml(queue) + FigureHtml(allocated);
  return WriteHtmlPage(title, body, out);
}

}  // namespace gpufleet::sim
