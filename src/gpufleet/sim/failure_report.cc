// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/failure_report.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <nlohmann/json.hpp>

#include "gpufleet/sim/chart.h"
#include "gpufleet/sim/html_page.h"

namespace gpufleet::sim {
namespace {

// Keys keep their insertion order, so the bytes follow the code, not a hash.
using Json = nlohmann::ordered_json;

constexpr double kHoursPerDay = 24.0;
constexpr size_t kRankChartGpus = 300;
constexpr size_t kAuditRows = 40;

Json RoundedNumber(double value) {
  if (!std::isfinite(value)) {
    return nullptr;
  }
  const double rounded = std::round(value * 1e4) / 1e4;
  return rounded == 0 ? 0.0 : rounded;  // no "-0.0"
}

std::string RunName(const FailureSimResult& result) {
  return result.quarantine ? "quarantine" : "no quarantine";
}

double ToHours(int64_t seconds) {
  return static_cast<double>(seconds) / kSecondsPerHour;
}

double ToDays(int64_t seconds) {
  return ToHours(seconds) / kHoursPerDay;
}

double Percent(double part, double whole) {
  return whole > 0 ? 100.0 * part / whole : 0.0;
}

std::string Days(int64_t seconds) {
  return seconds < 0 ? "never" : fmt::format("{:.2f} d", ToDays(seconds));
}

FailureRates WholeRun(const FailureSimResult& result) {
  return result.RatesBetween(0, static_cast<int64_t>(result.hours.size()));
}

// Neither bad nor fail-slow.
int HealthyGpus(const FailureSimResult& result) {
  return result.total_gpus - static_cast<int>(result.bad_gpus.size()) -
         static_cast<int>(result.slow_gpus.size());
}

// The rows of the summary table, one value per run.
std::vector<std::pair<std::string, std::vector<std::string>>> SummaryRows(
    const std::vector<FailureSimResult>& results) {
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  auto add = [&](std::string label, auto cell) {
    std::vector<std::string> values;
    values.reserve(results.size());
    for (const FailureSimResult& r : results) {
      values.push_back(cell(r));
    }
    rows.emplace_back(std::move(label), std::move(values));
  };
  add("GPUs", [](const FailureSimResult& r) { return std::to_string(r.total_gpus); });
  add("simulated days",
      [](const FailureSimResult& r) { return fmt::format("{:.1f}", ToDays(r.duration_seconds)); });
  add("bad GPUs injected",
      [](const FailureSimResult& r) { return std::to_string(r.bad_gpus.size()); });
  add("hardware failures (on bad GPUs)", [](const FailureSimResult& r) {
    return fmt::format("{} ({:.1f}%)", r.hardware_failures,
                       Percent(r.bad_gpu_failures, r.hardware_failures));
  });
  add("application failures",
      [](const FailureSimResult& r) { return std::to_string(r.app_failures); });
  add("bad GPUs found", [](const FailureSimResult& r) {
    return fmt::format("{} ({:.1f}%)", r.bad_found,
                       Percent(r.bad_found, static_cast<double>(r.bad_gpus.size())));
  });
  add("90% of bad GPUs found after",
      [](const FailureSimResult& r) { return Days(r.found_90_seconds); });
  add("bad GPUs quarantined", [](const FailureSimResult& r) {
    return fmt::format("{} ({:.1f}%)", r.bad_quarantined,
                       Percent(r.bad_quarantined, static_cast<double>(r.bad_gpus.size())));
  });
  add("fail-slow GPUs found / quarantined", [](const FailureSimResult& r) {
    return fmt::format("{} / {} of {} ({:.1f}%)", r.slow_found, r.slow_quarantined,
                       r.slow_gpus.size(),
                       Percent(r.slow_found, static_cast<double>(r.slow_gpus.size())));
  });
  add("node / NIC faults (runs failed)", [](const FailureSimResult& r) {
    return fmt::format("{} ({}) / {} ({})", r.node_faults, r.node_failures, r.nic_faults,
                       r.nic_failures);
  });
  add("diagnostics (failed)", [](const FailureSimResult& r) {
    return fmt::format("{} ({})", r.diagnostics, r.diagnostics_failed);
  });
  add("healthy GPUs flagged", [](const FailureSimResult& r) {
    return fmt::format("{} ({:.3f}%)", r.healthy_gpus_flagged,
                       Percent(r.healthy_gpus_flagged, HealthyGpus(r)));
  });
  add("healthy GPUs quarantined", [](const FailureSimResult& r) {
    return fmt::format("{} ({:.3f}%)", r.healthy_gpus_quarantined,
                       Percent(r.healthy_gpus_quarantined, HealthyGpus(r)));
  });
  add("failures / 1,000 busy GPU-h", [](const FailureSimResult& r) {
    return fmt::format("{:.3f}", WholeRun(r).PerThousandGpuHours());
  });
  add("runs failed (hardware)", [](const FailureSimResult& r) {
    const FailureRates rates = WholeRun(r);
    return fmt::format("{} of {} ({:.2f}%)", rates.failed_runs, rates.runs_ended,
                       100 * rates.FailedShare());
  });
  add("mean GPUs busy", [](const FailureSimResult& r) {
    return fmt::format("{:.0f} ({:.1f}%)", r.mean_busy_gpus,
                       Percent(r.mean_busy_gpus, r.total_gpus));
  });
  add("large job ETTR", [](const FailureSimResult& r) {
    return r.large_job.wall_hours > 0 ? fmt::format("{:.3f}", r.large_job.Ettr()) : "n/a";
  });
  add("large job failures / drains", [](const FailureSimResult& r) {
    return fmt::format("{} / {}", r.large_job.failures, r.large_job.drains);
  });
  add("large job checkpoint (Young/Daly)", [](const FailureSimResult& r) {
    return fmt::format("{:.1f} min ({:.1f} min)",
                       static_cast<double>(r.large_job.checkpoint_interval_seconds) / 60,
                       static_cast<double>(r.large_job.suggested_checkpoint_seconds) / 60);
  });
  return rows;
}

Json RatesJson(const FailureRates& rates) {
  Json json = Json::object();
  json["from_hour"] = rates.from_hour;
  json["to_hour"] = rates.to_hour;
  json["runs_ended"] = rates.runs_ended;
  json["failed_runs"] = rates.failed_runs;
  json["busy_gpu_hours"] = RoundedNumber(rates.busy_gpu_hours);
  json["failures_per_1000_gpu_hours"] = RoundedNumber(rates.PerThousandGpuHours());
  json["failed_share"] = RoundedNumber(rates.FailedShare());
  return json;
}

Json RunJson(const FailureSimResult& r) {
  Json run = Json::object();
  run["quarantine"] = r.quarantine;
  run["seed"] = r.seed;
  run["total_gpus"] = r.total_gpus;
  run["duration_hours"] = RoundedNumber(ToHours(r.duration_seconds));
  run["injected"] = {
      {"bad_gpus", r.bad_gpus.size()},          {"hardware_failures", r.hardware_failures},
      {"bad_gpu_failures", r.bad_gpu_failures}, {"app_failures", r.app_failures},
      {"slow_gpus", r.slow_gpus.size()},        {"node_faults", r.node_faults},
      {"node_failures", r.node_failures},       {"nic_faults", r.nic_faults},
      {"nic_failures", r.nic_failures}};
  run["detection"] = {
      {"bad_found", r.bad_found},
      {"healthy_gpus_flagged", r.healthy_gpus_flagged},
      {"healthy_gpus_quarantined", r.healthy_gpus_quarantined},
      {"found_90_hours",
       r.found_90_seconds < 0 ? Json(nullptr) : RoundedNumber(ToHours(r.found_90_seconds))},
      {"bad_quarantined", r.bad_quarantined},
      {"slow_found", r.slow_found},
      {"slow_quarantined", r.slow_quarantined},
      {"diagnostics", r.diagnostics},
      {"diagnostics_failed", r.diagnostics_failed}};
  run["stream"] = {{"jobs_arrived", r.jobs_arrived},
                   {"jobs_finished", r.jobs_finished},
                   {"runs_started", r.runs_started},
                   {"requeues", r.requeues},
                   {"drains", r.drains},
                   {"mean_busy_gpus", RoundedNumber(r.mean_busy_gpus)}};
  run["rates"] = RatesJson(WholeRun(r));
  const LargeJobStats& large = r.large_job;
  run["large_job"] = {{"ettr", RoundedNumber(large.Ettr())},
                      {"wall_hours", RoundedNumber(large.wall_hours)},
                      {"useful_hours", RoundedNumber(large.useful_hours)},
                      {"lost_hours", RoundedNumber(large.lost_hours)},
                      {"restart_hours", RoundedNumber(large.restart_hours)},
                      {"checkpoint_hours", RoundedNumber(large.checkpoint_hours)},
                      {"waiting_hours", RoundedNumber(large.waiting_hours)},
                      {"slowed_hours", RoundedNumber(large.slowed_hours)},
                      {"checkpoint_minutes",
                       RoundedNumber(static_cast<double>(large.checkpoint_interval_seconds) / 60)},
                      {"suggested_checkpoint_minutes",
                       RoundedNumber(static_cast<double>(large.suggested_checkpoint_seconds) / 60)},
                      {"runs", large.runs},
                      {"failures", large.failures},
                      {"drains", large.drains}};
  const reliability::FailureConcentration& c = r.concentration;
  run["concentration"] = {{"devices", c.devices},
                          {"gpus", c.gpus},
                          {"fleet_share", RoundedNumber(c.fleet_share)},
                          {"failed_runs", c.failed_runs},
                          {"failed_runs_involving", c.failed_runs_involving},
                          {"failed_share", RoundedNumber(c.failed_share)},
                          {"expected_involving", RoundedNumber(c.expected_involving)},
                          {"avoidable", RoundedNumber(c.avoidable)}};
  Json days = Json::array();
  for (size_t begin = 0; begin < r.hours.size(); begin += 24) {
    const FailureRates day =
        r.RatesBetween(static_cast<int64_t>(begin), static_cast<int64_t>(begin + 24));
    Json entry = RatesJson(day);
    int app = 0;
    for (size_t h = begin; h < std::min(begin + 24, r.hours.size()); ++h) {
      app += r.hours[h].app_failed_runs;
    }
    entry["app_failed_runs"] = app;
    days.push_back(std::move(entry));
  }
  run["days"] = std::move(days);
  Json flagged = Json::array();
  for (const FlaggedDevice& device : r.flagged) {
    flagged.push_back(
        {{"device", device.device.ToString()},
         {"first_flagged_hours", RoundedNumber(ToHours(device.first_flagged_seconds))},
         {"bad_gpus", device.bad_gpus},
         {"healthy_gpus", device.healthy_gpus},
         {"quarantined", device.quarantined}});
  }
  run["flagged"] = std::move(flagged);
  return run;
}

void AppendChart(const ChartSpec& spec, std::string& body) {
  body += FigureHtml(spec);
}

// Whether `device` covers an injected bad GPU, for the suspects table.
std::string Truth(const FailureSimResult& r, const reliability::Device& device) {
  for (const FlaggedDevice& flagged : r.flagged) {
    if (flagged.device == device) {
      return flagged.bad_gpus > 0 ? fmt::format("bad ({} of {})", flagged.bad_gpus,
                                                flagged.bad_gpus + flagged.healthy_gpus)
                                  : "healthy";
    }
  }
  std::set<std::string> bad;
  for (const BadGpu& gpu : r.bad_gpus) {
    bad.insert(gpu.uuid);
  }
  return device.kind == reliability::DeviceKind::kGpu && bad.count(device.id) > 0 ? "bad"
                                                                                  : "healthy";
}

void AppendSuspects(const FailureSimResult& r, std::string& body) {
  body += fmt::format("<h3>{}: flagged at the end ({}), best-ranked first</h3>\n",
                      XmlEscape(RunName(r)), r.final_report.suspects.size());
  body +=
      "<table>\n<tr><th>device</th><th>leaf</th><th>runs</th><th>failures</th>"
      "<th>named it</th><th>GPU-hours</th><th>expected</th><th>p-value</th><th>q-value</th>"
      "<th>XIDs</th><th>injected</th></tr>\n";
  size_t shown = 0;
  for (const auto* list : {&r.final_report.suspects, &r.final_report.runners_up}) {
    for (const reliability::DeviceEvidence& e : *list) {
      if (shown++ >= 25) {
        break;
      }
      std::string xids;
      for (const auto& [xid, count] : e.xids) {
        xids += fmt::format("{}{}x{}", xids.empty() ? "" : " ", xid, count);
      }
      body += "<tr>" + HtmlCell(e.device.ToString() + (e.flagged ? "" : " (not flagged)")) +
              HtmlCell(e.leaf) + HtmlNumCell(std::to_string(e.runs)) +
              HtmlNumCell(std::to_string(e.failures)) +
              HtmlNumCell(std::to_string(e.attributed_failures)) +
              HtmlNumCell(fmt::format("{:.1f}", e.gpu_hours)) +
              HtmlNumCell(fmt::format("{:.3g}", e.expected)) +
              HtmlNumCell(fmt::format("{:.2g}", e.p_value)) +
              HtmlNumCell(fmt::format("{:.2g}", e.q_value)) + HtmlCell(xids) +
              HtmlCell(Truth(r, e.device)) + "</tr>\n";
    }
  }
  body += "</table>\n";
}

}  // namespace

FailureComparison CompareFailureRuns(const FailureSimResult& with_quarantine,
                                     const FailureSimResult& without_quarantine) {
  FailureComparison out;
  // When 90 % of the injected bad GPUs were found; short of that, when 90 % of those found were.
  int64_t detected = with_quarantine.found_90_seconds;
  if (detected < 0) {
    std::vector<int64_t> found;
    for (const BadGpu& bad : with_quarantine.bad_gpus) {
      if (bad.found_seconds >= 0) {
        found.push_back(bad.found_seconds);
      }
    }
    std::sort(found.begin(), found.end());
    if (!found.empty()) {
      detected = found[(found.size() * 9 + 9) / 10 - 1];
    }
  }
  const int64_t hours = static_cast<int64_t>(with_quarantine.hours.size());
  out.detection_hour =
      std::clamp<int64_t>((std::max<int64_t>(detected, 0) + 3599) / 3600, 0, hours);
  out.with_quarantine_after = with_quarantine.RatesBetween(out.detection_hour, hours);
  out.without_quarantine_after = without_quarantine.RatesBetween(out.detection_hour, hours);
  out.with_quarantine_before = with_quarantine.RatesBetween(0, out.detection_hour);
  out.without_quarantine_before = without_quarantine.RatesBetween(0, out.detection_hour);
  const double without_rate = out.without_quarantine_after.PerThousandGpuHours();
  const double without_share = out.without_quarantine_after.FailedShare();
  out.rate_ratio =
      without_rate > 0 ? out.with_quarantine_after.PerThousandGpuHours() / without_rate : 0;
  out.failed_share_ratio =
      without_share > 0 ? out.with_quarantine_after.FailedShare() / without_share : 0;
  out.with_quarantine_second_half = with_quarantine.RatesBetween(hours / 2, hours);
  out.without_quarantine_second_half = without_quarantine.RatesBetween(hours / 2, hours);
  const double without_half = out.without_quarantine_second_half.PerThousandGpuHours();
  out.second_half_rate_ratio =
      without_half > 0 ? out.with_quarantine_second_half.PerThousandGpuHours() / without_half : 0;
  return out;
}

std::string ConcentrationSentence(const reliability::FailureConcentration& c) {
  return fmt::format(
      "these {} GPUs ({:.2f}% of the fleet) were involved in {:.1f}% of failed jobs; "
      "quarantining them would have avoided {:.0f} failures",
      c.gpus, 100 * c.fleet_share, 100 * c.failed_share, c.avoidable);
}

void PrintFailureSummary(const std::vector<FailureSimResult>& results, std::ostream& out) {
  fmt::print(out, "{:<34}", "");
  for (const FailureSimResult& r : results) {
    fmt::print(out, " {:>24}", RunName(r));
  }
  fmt::print(out, "\n");
  for (const auto& [label, values] : SummaryRows(results)) {
    fmt::print(out, "{:<34}", label);
    for (const std::string& value : values) {
      fmt::print(out, " {:>24}", value);
    }
    fmt::print(out, "\n");
  }
  for (const FailureSimResult& r : results) {
    fmt::print(out, "{}: {}\n", RunName(r), ConcentrationSentence(r.concentration));
  }
  if (results.size() == 2 && results[0].quarantine && !results[1].quarantine) {
    const FailureComparison c = CompareFailureRuns(results[0], results[1]);
    fmt::print(out,
               "after detection (hour {} on): {:.3f} vs {:.3f} failures / 1,000 busy GPU-h "
               "(x{:.2f}); runs failed {:.2f}% vs {:.2f}% (x{:.2f})\n",
               c.detection_hour, c.with_quarantine_after.PerThousandGpuHours(),
               c.without_quarantine_after.PerThousandGpuHours(), c.rate_ratio,
               100 * c.with_quarantine_after.FailedShare(),
               100 * c.without_quarantine_after.FailedShare(), c.failed_share_ratio);
    fmt::print(out,
               "second half (hour {} on): {:.3f} vs {:.3f} failures / 1,000 busy GPU-h (x{:.2f})\n",
               c.with_quarantine_second_half.from_hour,
               c.with_quarantine_second_half.PerThousandGpuHours(),
               c.without_quarantine_second_half.PerThousandGpuHours(), c.second_half_rate_ratio);
  }
}

void WriteFailureJson(const std::vector<FailureSimResult>& results, std::ostream& out) {
  Json json = Json::object();
  json["mode"] = "failures";
  Json runs = Json::array();
  for (const FailureSimResult& r : results) {
    runs.push_back(RunJson(r));
  }
  json["runs"] = std::move(runs);
  if (results.size() == 2 && results[0].quarantine && !results[1].quarantine) {
    const FailureComparison c = CompareFailureRuns(results[0], results[1]);
    json["comparison"] = {
        {"detection_hour", c.detection_hour},
        {"with_quarantine_after", RatesJson(c.with_quarantine_after)},
        {"without_quarantine_after", RatesJson(c.without_quarantine_after)},
        {"with_quarantine_before", RatesJson(c.with_quarantine_before)},
        {"without_quarantine_before", RatesJson(c.without_quarantine_before)},
        {"rate_ratio", RoundedNumber(c.rate_ratio)},
        {"failed_share_ratio", RoundedNumber(c.failed_share_ratio)},
        {"with_quarantine_second_half", RatesJson(c.with_quarantine_second_half)},
        {"without_quarantine_second_half", RatesJson(c.without_quarantine_second_half)},
        {"second_half_rate_ratio", RoundedNumber(c.second_half_rate_ratio)}};
  }
  out << json.dump(-1, ' ', false, Json::error_handler_t::replace) << '\n';
}

Status WriteFailureReport(const std::vector<FailureSimResult>& results, const std::string& title,
                          std::ostream& out) {
  if (results.empty()) {
    return InvalidArgumentError("no failure runs to report");
  }
  std::string body;
  auto append = [&body]<typename... Args>(fmt::format_string<Args...> format, Args&&... args) {
    fmt::format_to(std::back_inserter(body), format, std::forward<Args>(args)...);
  };
  const FailureSimResult& first = results.front();
  append(
      "<p class=\"note\">Failure injection: {} GPUs for {:.1f} simulated days, seed {}. {} of "
      "the GPUs were made to fail jobs at a multiple of the base rate; the attribution engine "
      "ran every hour on the job outcomes and, in the run with quarantine, the quarantine "
      "policy took the devices it flagged out of service.</p>\n",
      first.total_gpus, ToDays(first.duration_seconds), first.seed, first.bad_gpus.size());

  body += "<h2>Summary</h2>\n<table>\n<tr><th></th>";
  for (const FailureSimResult& r : results) {
    body += "<th>" + XmlEscape(RunName(r)) + "</th>";
  }
  body += "</tr>\n";
  for (const auto& [label, values] : SummaryRows(results)) {
    body += "<tr>" + HtmlCell(label);
    for (const std::string& value : values) {
      body += HtmlNumCell(value);
    }
    body += "</tr>\n";
  }
  body += "</table>\n";
  if (results.size() == 2 && results[0].quarantine && !results[1].quarantine) {
    const FailureComparison c = CompareFailureRuns(results[0], results[1]);
    append(
        "<p>After detection (from hour {}): {:.3f} failures per 1,000 busy GPU-hours with "
        "quarantine against {:.3f} without (x{:.2f}); {:.2f}% of runs failed against {:.2f}% "
        "(x{:.2f}).</p>\n",
        c.detection_hour, c.with_quarantine_after.PerThousandGpuHours(),
        c.without_quarantine_after.PerThousandGpuHours(), c.rate_ratio,
        100 * c.with_quarantine_after.FailedShare(), 100 * c.without_quarantine_after.FailedShare(),
        c.failed_share_ratio);
    append(
        "<p>Second half (from hour {}): {:.3f} failures per 1,000 busy GPU-hours with quarantine "
        "against {:.3f} without (x{:.2f}).</p>\n",
        c.with_quarantine_second_half.from_hour,
        c.with_quarantine_second_half.PerThousandGpuHours(),
        c.without_quarantine_second_half.PerThousandGpuHours(), c.second_half_rate_ratio);
  }

  body += "<h2>Where failures come from</h2>\n";
  for (const FailureSimResult& r : results) {
    append("<p class=\"claim\">{}: {}.</p>\n", XmlEscape(RunName(r)),
           XmlEscape(ConcentrationSentence(r.concentration)));
  }
  body +=
      "<p class=\"note\">The GPUs are the devices the attribution engine flagged. A failed job "
      "involves a GPU when it named the GPU (an XID) or named nothing and ran on it; the "
      "failures avoided are those beyond what the same runs would have seen at the fleet's "
      "rates.</p>\n";
  ChartSpec by_rank{.title = "Failed runs by GPU rank",
                    .x_label = "GPU rank (most failed runs first)",
                    .y_label = "failed runs involving the GPU",
                    .step = true};
  ChartSpec curve{.title = "Share of failed runs against share of the fleet (top GPUs)",
                  .x_label = "top GPUs (% of the fleet)",
                  .y_label = "failed runs involving them (%)"};
  ChartSpec daily{.title = "Hardware failures per 1,000 busy GPU-hours, by day",
                  .x_label = "day",
                  .y_label = "failures / 1,000 GPU-h"};
  ChartSpec found{.title = "When the bad GPUs were found (CDF)",
                  .x_label = "days",
                  .y_label = "share of the bad GPUs found",
                  .step = true};
  for (const FailureSimResult& r : results) {
    Series rank{.name = RunName(r)};
    for (size_t i = 0; i < std::min(kRankChartGpus, r.failed_runs_by_gpu_rank.size()); ++i) {
      rank.x.push_back(static_cast<double>(i + 1));
      rank.y.push_back(r.failed_runs_by_gpu_rank[i]);
    }
    by_rank.series.push_back(std::move(rank));
    Series share{.name = RunName(r)};
    share.x.push_back(0);
    share.y.push_back(0);
    for (const auto& [fleet, failed] : r.concentration_curve) {
      share.x.push_back(100 * fleet);
      share.y.push_back(100 * failed);
    }
    curve.series.push_back(std::move(share));
    Series per_day{.name = RunName(r)};
    for (size_t begin = 0; begin < r.hours.size(); begin += 24) {
      per_day.x.push_back(static_cast<double>(begin) / 24 + 0.5);  // the middle of the day
      per_day.y.push_back(
          r.RatesBetween(static_cast<int64_t>(begin), static_cast<int64_t>(begin + 24))
              .PerThousandGpuHours());
    }
    daily.series.push_back(std::move(per_day));
    // Bad GPUs never found stay off the curve, so it ends below 1 when some were missed.
    Series when{.name = RunName(r)};
    std::vector<double> times;
    for (const BadGpu& bad : r.bad_gpus) {
      if (bad.found_seconds >= 0) {
        times.push_back(ToDays(bad.found_seconds));
      }
    }
    std::sort(times.begin(), times.end());
    when.x.push_back(0);
    when.y.push_back(0);
    for (size_t i = 0; i < times.size(); ++i) {
      when.x.push_back(times[i]);
      when.y.push_back(static_cast<double>(i + 1) / static_cast<double>(r.bad_gpus.size()));
    }
    found.series.push_back(std::move(when));
  }
  AppendChart(by_rank, body);
  AppendChart(curve, body);
  body += "<h2>Failures over time and detection</h2>\n";
  AppendChart(daily, body);
  AppendChart(found, body);

  body +=
      "<h2>The large training job</h2>\n<table>\n<tr><th>run</th><th>GPUs</th><th>ETTR</th>"
      "<th>useful h</th><th>lost h</th><th>restart h</th><th>checkpoint h</th>"
      "<th>waiting h</th><th>slowed h</th><th>runs</th><th>failures</th><th>drains</th></tr>\n";
  for (const FailureSimResult& r : results) {
    const LargeJobStats& l = r.large_job;
    body += "<tr>" + HtmlCell(RunName(r)) + HtmlNumCell(std::to_string(l.gpus)) +
            HtmlNumCell(fmt::format("{:.3f}", l.Ettr())) +
            HtmlNumCell(fmt::format("{:.1f}", l.useful_hours)) +
            HtmlNumCell(fmt::format("{:.1f}", l.lost_hours)) +
            HtmlNumCell(fmt::format("{:.1f}", l.restart_hours)) +
            HtmlNumCell(fmt::format("{:.1f}", l.checkpoint_hours)) +
            HtmlNumCell(fmt::format("{:.1f}", l.waiting_hours)) +
            HtmlNumCell(fmt::format("{:.1f}", l.slowed_hours)) +
            HtmlNumCell(std::to_string(l.runs)) + HtmlNumCell(std::to_string(l.failures)) +
            HtmlNumCell(std::to_string(l.drains)) + "</tr>\n";
  }
  body += "</table>\n";

  body += "<h2>Suspects and their evidence</h2>\n";
  for (const FailureSimResult& r : results) {
    AppendSuspects(r, body);
  }
  for (const FailureSimResult& r : results) {
    if (r.audit_log.empty()) {
      continue;
    }
    append("<h2>Audit log ({}, first {} of {})</h2>\n", XmlEscape(RunName(r)),
           std::min(kAuditRows, r.audit_log.size()), r.audit_log.size());
    body +=
        "<table>\n<tr><th>#</th><th>hour</th><th>action</th><th>device</th><th>leaf</th>"
        "<th>drain</th><th>by</th><th>GPUs out</th><th>reason</th></tr>\n";
    for (size_t i = 0; i < std::min(kAuditRows, r.audit_log.size()); ++i) {
      const reliability::AuditEntry& e = r.audit_log[i];
      body += "<tr>" + HtmlNumCell(std::to_string(e.sequence)) +
              HtmlNumCell(fmt::format("{:.1f}",
                                      static_cast<double>(e.time.nanos) / 1e9 / kSecondsPerHour)) +
              HtmlCell(reliability::AuditActionName(e.action)) + HtmlCell(e.device.ToString()) +
              HtmlCell(e.leaf) + HtmlCell(reliability::DrainModeName(e.mode)) + HtmlCell(e.actor) +
              HtmlNumCell(std::to_string(e.gpus_out)) + HtmlCell(e.reason) + "</tr>\n";
    }
    body += "</table>\n";
  }

  return WriteHtmlPage(title, body, out);
}

}  // namespace gpufleet::sim
