// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/sim_report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpufleet/sim/chart.h"
#include "gpufleet/sim/fill_report.h"
#include "gpufleet/sim/html_page.h"

namespace gpufleet::sim {
namespace {

constexpr size_t kMaxChartPoints = 1000;

// Keys keep their insertion order, so the bytes follow the code, not a hash.
using Json = nlohmann::ordered_json;

// The ratio arrays cover at least 0 .. 130 % of arrived load (the FGD experiment's range).
constexpr int kMinRatioEntries = 131;

// `value` rounded to 4 decimals, or null when it is not finite.
Json Number(double value) {
  if (!std::isfinite(value)) {
    return nullptr;
  }
  const double scaled = value * 1e4;
  if (!std::isfinite(scaled)) {
    return value;
  }
  const double rounded = std::round(scaled) / 1e4;
  return rounded == 0 ? 0.0 : rounded;  // no "-0.0"
}

void Dump(const Json& json, std::ostream& out) {
  // Invalid UTF-8 in a policy name is replaced instead of throwing.
  out << json.dump(-1, ' ', false, Json::error_handler_t::replace) << '\n';
}

Json DistributionJson(const Distribution& distribution) {
  Json json = Json::object();
  json["mean"] = Number(distribution.mean);
  json["p50"] = Number(distribution.p50);
  json["p90"] = Number(distribution.p90);
  json["p99"] = Number(distribution.p99);
  return json;
}

// Text for a table cell.
std::string Fixed(double value, int decimals) {
  if (!std::isfinite(value)) {
    return "n/a";
  }
  return fmt::format("{:.{}f}", value, decimals);
}

// Seconds as a person reads them: "45 s", "12.5 min", "3.20 h".
std::string Duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) {
    return "n/a";
  }
  if (seconds < 120) {
    return fmt::format("{:.0f} s", seconds);
  }
  if (seconds < 2 * kSecondsPerHour) {
    return fmt::format("{:.1f} min", seconds / 60);
  }
  return fmt::format("{:.2f} h", seconds / kSecondsPerHour);
}

void AppendFigure(const ChartSpec& spec, std::string& body) {
  body += FigureHtml(spec);
}

// Per policy (first-seen order), the mean over its runs of `field` at each arrived percent.
std::vector<Series> MeanFillSeries(const std::vector<FillResult>& results,
                                   double FillPoint::*field) {
  std::vector<std::string> order;
  std::map<std::string, std::map<int, std::pair<double, int>>> sums;
  for (const FillResult& result : results) {
    if (sums.find(result.policy) == sums.end()) {
      order.push_back(result.policy);
    }
    auto& by_percent = sums[result.policy];
    for (const FillPoint& point : result.points) {
      auto& [sum, count] = by_percent[point.arrived_percent];
      sum += point.*field;
      ++count;
    }
  }
  std::vector<Series> series;
  for (const std::string& policy : order) {
    Series line;
    line.name = policy;
    for (const auto& [percent, sum_count] : sums[policy]) {
      line.x.push_back(percent);
      line.y.push_back(sum_count.first / sum_count.second);
    }
    series.push_back(std::move(line));
  }
  return series;
}

// "fifo/best-fit", with " s<seed>" when another run has the same policies.
std::vector<std::string> RunLabels(const std::vector<ReplayResult>& results) {
  std::map<std::pair<std::string, std::string>, int> count;
  for (const ReplayResult& result : results) {
    ++count[{result.queue_policy, result.placement_policy}];
  }
  std::vector<std::string> labels;
  for (const ReplayResult& result : results) {
    std::string label = result.queue_policy + "/" + result.placement_policy;
    if (count[{result.queue_policy, result.placement_policy}] > 1) {
      label += fmt::format(" s{}", result.seed);
    }
    labels.push_back(std::move(label));
  }
  return labels;
}

}  // namespace

void WriteFillJson(const std::vector<FillResult>& results, std::ostream& out,
                   const FillBoundsBySeed& bounds) {
  Json json = Json::object();
  json["mode"] = "fill";
  Json runs = Json::array();
  for (const FillResult& result : results) {
    int entries = kMinRatioEntries;
    for (const FillPoint& point : result.points) {
      entries = std::max(entries, point.arrived_percent + 1);
    }
    Json allocation(Json::value_t::array);
    Json fragmentation(Json::value_t::array);
    for (int i = 0; i < entries; ++i) {
      allocation.push_back(nullptr);
      fragmentation.push_back(nullptr);
    }
    for (const FillPoint& point : result.points) {
      if (point.arrived_percent < 0) {
        continue;
      }
      allocation[point.arrived_percent] = Number(point.allocation_percent);
      fragmentation[point.arrived_percent] = Number(point.fragmentation_percent);
    }
    const double unallocated = result.UnallocatedGpusAt(100);
    Json run = Json::object();
    run["policy"] = result.policy;
    run["seed"] = result.seed;
    run["total_gpus"] = result.total_gpus;
    run["allocation_ratio"] = std::move(allocation);
    run["fragmentation_ratio"] = std::move(fragmentation);
    run["unallocated_gpus_at_100"] = result.At(100) == nullptr ? Json() : Number(unallocated);
    runs.push_back(std::move(run));
  }
  json["runs"] = std::move(runs);
  Json summary = Json::array();
  for (const FillPolicySummary& policy : SummarizeFill(results, bounds)) {
    Json entry = Json::object();
    entry["policy"] = policy.policy;
    entry["median_unallocated_gpus_at_100"] = Number(policy.median_unallocated_gpus_at_100);
    entry["mean_allocation_ratio_at_100"] = Number(policy.mean_allocation_at_100);
    if (policy.median_gap_to_bound) {
      entry["median_gap_to_bound"] = Number(*policy.median_gap_to_bound);
    }
    summary.push_back(std::move(entry));
  }
  json["summary"] = std::move(summary);
  if (!bounds.empty()) {
    Json entries = Json::array();
    for (const auto& [seed, value] : bounds) {
      Json entry = Json::object();
      entry["seed"] = seed;
      entry["unallocated_gpus_bound"] = Number(value);
      entries.push_back(std::move(entry));
    }
    json["bounds"] = std::move(entries);
  }
  Dump(json, out);
}

void WriteReplayJson(const std::vector<ReplayResult>& results, std::ostream& out) {
  Json json = Json::object();
  json["mode"] = "replay";
  Json runs = Json::array();
  for (const ReplayResult& result : results) {
    Json run = Json::object();
    run["queue_policy"] = result.queue_policy;
    run["placement_policy"] = result.placement_policy;
    run["seed"] = result.seed;
    run["total_gpus"] = result.total_gpus;
    run["jobs_total"] = result.jobs_total;
    run["jobs_finished"] = result.jobs_finished;
    run["jobs_unplaceable"] = result.jobs_unplaceable;
    Json never = Json::array();
    Json jobs = Json::array();
    for (const ReplayJobOutcome& job : result.jobs) {
      if (!job.unplaceable_reason.empty()) {
        never.push_back(Json{{"id", job.id}, {"reason", job.unplaceable_reason}});
      }
      jobs.push_back(Json{{"id", job.id},
                          {"gpus", job.gpus},
                          {"start_seconds", job.first_start_seconds},
                          {"end_seconds", job.end_seconds}});
    }
    run["never"] = std::move(never);
    run["jobs"] = std::move(jobs);
    run["makespan_seconds"] = result.makespan_seconds;
    run["mean_gpus_allocated"] = Number(result.mean_gpus_allocated);
    run["queueing_delay"] = DistributionJson(result.queueing_delay);
    run["completion_time"] = DistributionJson(result.completion_time);
    Json time = Json::array();
    Json allocated = Json::array();
    Json fragmentation = Json::array();
    Json queue = Json::array();
    for (const ReplaySample& sample : result.series) {
      time.push_back(sample.time_seconds);
      allocated.push_back(Number(sample.gpus_allocated));
      fragmentation.push_back(Number(sample.fragmentation_gpus));
      queue.push_back(sample.queue_length);
    }
    Json series = Json::object();
    series["time_seconds"] = std::move(time);
    series["gpus_allocated"] = std::move(allocated);
    series["fragmentation_gpus"] = std::move(fragmentation);
    series["queue_length"] = std::move(queue);
    run["series"] = std::move(series);
    runs.push_back(std::move(run));
  }
  json["runs"] = std::move(runs);
  Dump(json, out);
}

Status WriteFillReport(const std::vector<FillResult>& results, const std::string& title,
                       std::ostream& out, const FillBoundsBySeed& bounds) {
  if (results.empty()) {
    return InvalidArgumentError("no fill runs to report");
  }
  const std::vector<FillPolicySummary> summaries = SummarizeFill(results, bounds);
  std::set<uint64_t> seeds;
  std::set<int> gpus;
  for (const FillResult& result : results) {
    seeds.insert(result.seed);
    gpus.insert(result.total_gpus);
  }
  std::string body;
  auto append = [&body]<typename... Args>(fmt::format_string<Args...> format, Args&&... args) {
    fmt::format_to(std::back_inserter(body), format, std::forward<Args>(args)...);
  };
  append(
      "<p class=\"note\">Fill experiment: {} run(s), {} polic{} x {} seed(s), on {} GPUs. Pods "
      "arrive one by one and never leave; figures are means over each policy's seeds unless "
      "marked median.</p>\n",
      results.size(), summaries.size(), summaries.size() == 1 ? "y" : "ies", seeds.size(),
      gpus.size() == 1 ? std::to_string(*gpus.begin()) : std::string("varying numbers of"));

  body +=
      "<h2>Summary</h2>\n<table>\n<tr><th rowspan=\"2\">policy</th>"
      "<th rowspan=\"2\">seeds</th><th rowspan=\"2\">unallocated GPUs at 100 % (median)</th>"
      "<th rowspan=\"2\">unallocated at 100 % (% of GPUs)</th>"
      "<th colspan=\"4\">allocation (% of capacity) at arrived load</th>"
      "<th rowspan=\"2\">fragmentation at 100 % (% of capacity)</th>"
      "<th rowspan=\"2\">fragmentation rate at 90 % (% of idle)</th>" +
      std::string(bounds.empty() ? ""
                                 : "<th rowspan=\"2\">gap to the lower bound at 100 % (GPUs, "
                                   "median)</th>") +
      "</tr>\n<tr><th>80 %</th><th>90 %</th><th>100 %</th><th>130 %</th></tr>\n";
  for (const FillPolicySummary& s : summaries) {
    body += "<tr>" + HtmlCell(s.policy) + HtmlNumCell(std::to_string(s.seeds)) +
            HtmlNumCell(Fixed(s.median_unallocated_gpus_at_100, 1)) +
            HtmlNumCell(Fixed(s.mean_unallocated_percent_at_100, 2)) +
            HtmlNumCell(Fixed(s.mean_allocation_at_80, 2)) +
            HtmlNumCell(Fixed(s.mean_allocation_at_90, 2)) +
            HtmlNumCell(Fixed(s.mean_allocation_at_100, 2)) +
            HtmlNumCell(Fixed(s.mean_allocation_at_130, 2)) +
            HtmlNumCell(Fixed(s.mean_fragmentation_percent_at_100, 2)) +
            HtmlNumCell(Fixed(s.mean_fragmentation_rate_at_90, 1)) +
            (bounds.empty()          ? std::string()
             : s.median_gap_to_bound ? HtmlNumCell(Fixed(*s.median_gap_to_bound, 1))
                                     : HtmlNumCell("-")) +
            "</tr>\n";
  }
  body += "</table>\n";
  if (!bounds.empty()) {
    std::vector<double> values;
    for (const auto& [seed, value] : bounds) {
      values.push_back(value);
    }
    append(
        "<p class=\"note\">Lower bound (gpufleet sim bound, {} seed(s)): no policy can leave "
        "fewer than a median of {} GPUs unallocated at 100 % arrived load "
        "(docs/policies.md).</p>\n",
        values.size(), Fixed(Median(values), 1));
  }

  body += "<h2>GPU allocation</h2>\n";
  AppendFigure({.title = "GPU allocation ratio vs arrived load",
                .x_label = "arrived GPU load (% of capacity)",
                .y_label = "allocated GPU (% of capacity)",
                .series = MeanFillSeries(results, &FillPoint::allocation_percent)},
               body);
  body += "<h2>Fragmentation</h2>\n";
  AppendFigure({.title = "GPU fragmentation vs arrived load",
                .x_label = "arrived GPU load (% of capacity)",
                .y_label = "fragmented GPU (% of capacity)",
                .series = MeanFillSeries(results, &FillPoint::fragmentation_percent)},
               body);
  return WriteHtmlPage(title, body, out);
}

Status WriteReplayReport(const std::vector<ReplayResult>& results, const std::string& title,
                         std::ostream& out) {
  if (results.empty()) {
    return InvalidArgumentError("no replay runs to report");
  }
  const std::vector<std::string> labels = RunLabels(results);
  std::string body;
  auto append = [&body]<typename... Args>(fmt::format_string<Args...> format, Args&&... args) {
    fmt::format_to(std::back_inserter(body), format, std::forward<Args>(args)...);
  };
  append(
      "<p class=\"note\">Trace replay: {} run(s). Jobs arrive at their submit times, run for "
      "their durations once placed and leave. Queueing delay: submit to first start; job "
      "completion time: submit to end, over the jobs that finished.</p>\n",
      results.size());

  body +=
      "<h2>Summary</h2>\n<table>\n<tr><th rowspan=\"2\">queue policy</th>"
      "<th rowspan=\"2\">placement policy</th><th rowspan=\"2\">seed</th>"
      "<th rowspan=\"2\">GPUs</th><th rowspan=\"2\">jobs</th><th rowspan=\"2\">finished</th>"
      "<th rowspan=\"2\">unplaceable</th><th rowspan=\"2\">makespan</th>"
      "<th rowspan=\"2\">mean GPUs allocated</th><th colspan=\"4\">queueing delay</th>"
      "<th colspan=\"4\">job completion time</th></tr>\n<tr><th>mean</th><th>p50</th>"
      "<th>p90</th><th>p99</th><th>mean</th><th>p50</th><th>p90</th><th>p99</th></tr>\n";
  for (const ReplayResult& r : results) {
    const double share =
        r.total_gpus > 0 ? 100.0 * r.mean_gpus_allocated / r.total_gpus : std::nan("");
    body += "<tr>" + HtmlCell(r.queue_policy) + HtmlCell(r.placement_policy) +
            HtmlNumCell(std::to_string(r.seed)) + HtmlNumCell(std::to_string(r.total_gpus)) +
            HtmlNumCell(std::to_string(r.jobs_total)) +
            HtmlNumCell(std::to_string(r.jobs_finished)) +
            HtmlNumCell(std::to_string(r.jobs_unplaceable)) +
            HtmlNumCell(Duration(static_cast<double>(r.makespan_seconds))) +
            HtmlNumCell(Fixed(r.mean_gpus_allocated, 1) + " (" + Fixed(share, 1) + " %)");
    for (const Distribution* d : {&r.queueing_delay, &r.completion_time}) {
      body += HtmlNumCell(Duration(d->mean)) + HtmlNumCell(Duration(d->p50)) +
              HtmlNumCell(Duration(d->p90)) + HtmlNumCell(Duration(d->p99));
    }
    body += "</tr>\n";
  }
  body += "</table>\n";

  ChartSpec allocated{
      .title = "GPUs allocated over time", .x_label = "time (hours)", .y_label = "GPUs allocated"};
  ChartSpec queue{.title = "Queue length over time",
                  .x_label = "time (hours)",
                  .y_label = "jobs waiting",
                  .step = true};
  ChartSpec delay{.title = "CDF of queueing delay",
                  .x_label = "queueing delay (hours)",
                  .y_label = "share of started jobs",
                  .step = true};
  ChartSpec completion{.title = "CDF of job completion time",
                       .x_label = "job completion time (hours)",
                       .y_label = "share of finished jobs",
                       .step = true};
  for (size_t i = 0; i < results.size(); ++i) {
    const ReplayResult& r = results[i];
    Series gpus{.name = labels[i]};
    Series waiting{.name = labels[i]};
    // A chart needs no more than kMaxChartPoints points: average consecutive samples (the JSON
    // keeps every one).
    const size_t stride = (r.series.size() + kMaxChartPoints - 1) / kMaxChartPoints;
    for (size_t begin = 0; begin < r.series.size(); begin += std::max<size_t>(stride, 1)) {
      const size_t end = std::min(r.series.size(), begin + std::max<size_t>(stride, 1));
      double allocated_sum = 0;
      double queue_sum = 0;
      for (size_t k = begin; k < end; ++k) {
        allocated_sum += r.series[k].gpus_allocated;
        queue_sum += r.series[k].queue_length;
      }
      const double hours = static_cast<double>(r.series[begin].time_seconds) / kSecondsPerHour;
      const double count = static_cast<double>(end - begin);
      gpus.x.push_back(hours);
      gpus.y.push_back(allocated_sum / count);
      waiting.x.push_back(hours);
      waiting.y.push_back(queue_sum / count);
    }
    allocated.series.push_back(std::move(gpus));
    queue.series.push_back(std::move(waiting));
    std::vector<double> delays;
    std::vector<double> completions;
    for (const ReplayJobOutcome& job : r.jobs) {
      if (job.first_start_seconds >= 0) {
        delays.push_back(static_cast<double>(job.QueueingDelay()) / kSecondsPerHour);
      }
      if (job.end_seconds >= 0) {
        completions.push_back(static_cast<double>(job.CompletionTime()) / kSecondsPerHour);
      }
    }
    delay.series.push_back(CdfSeries(labels[i], std::move(delays)));
    completion.series.push_back(CdfSeries(labels[i], std::move(completions)));
  }
  body += "<h2>Cluster over time</h2>\n";
  AppendFigure(allocated, body);
  AppendFigure(queue, body);
  body += "<h2>Job latency</h2>\n";
  AppendFigure(delay, body);
  AppendFigure(completion, body);
  return WriteHtmlPage(title, body, out);
}

ProgressBar::ProgressBar(std::ostream& err, bool enabled, std::string label, int total)
    : err_(err), enabled_(enabled), label_(std::move(label)), total_(std::max(total, 0)) {}

ProgressBar::~ProgressBar() {
  Finish();
}

void ProgressBar::Advance(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) {
    return;
  }
  done_ = static_cast<int>(
      std::clamp<int64_t>(static_cast<int64_t>(done_) + n, 0, static_cast<int64_t>(total_)));
  DrawLocked();
}

void ProgressBar::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) {
    return;
  }
  finished_ = true;
  if (enabled_) {
    DrawLocked();
    err_ << '\n';
    err_.flush();
  }
}

int ProgressBar::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void ProgressBar::DrawLocked() {
  if (!enabled_) {
    return;
  }
  const int filled =
      total_ == 0 ? kWidth : static_cast<int>(static_cast<int64_t>(done_) * kWidth / total_);
  err_ << '\r' << '[' << std::string(filled, '#') << std::string(kWidth - filled, ' ') << "] "
       << done_ << '/' << total_ << ' ' << label_;
  err_.flush();
}

}  // namespace gpufleet::sim
