// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/interactive_mix.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <utility>

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "gpufleet/core/random.h"
#include "gpufleet/sim/chart.h"
#include "gpufleet/sim/html_page.h"
#include "gpufleet/sim/parallel.h"

namespace gpufleet::sim {
namespace {

constexpr double kSecondsPerMinute = 60.0;
// The target for busy GPUs over allocated GPUs with reclaim.
constexpr double kTargetBusyOfAllocated = 0.85;

// GPUs per notebook session and how often each is drawn, in per-mille.
struct NotebookSize {
  int gpus;
  uint64_t per_mille;
};
constexpr NotebookSize kNotebookSizes[] = {{1, 800}, {2, 150}, {4, 50}};

// The GPU-time a job asks for inside the window [0, window_seconds), were it to start on arrival:
// a long batch job mostly runs after a short window, a notebook session mostly inside it.
double GpuSecondsInWindow(const TraceJob& job, int64_t window_seconds) {
  const int64_t inside =
      std::clamp<int64_t>(window_seconds - job.submit_seconds, 0, job.duration_seconds);
  return static_cast<double>(job.job.RequestedGpuMilliTotal()) / kMilliPerUnit *
         static_cast<double>(inside);
}

int DrawNotebookGpus(Random& random) {
  uint64_t draw = random.Uniform(1000);
  for (const NotebookSize& size : kNotebookSizes) {
    if (draw < size.per_mille) {
      return size.gpus;
    }
    draw -= size.per_mille;
  }
  return kNotebookSizes[0].gpus;
}

TraceJob NotebookSession(int number, int64_t submit, int64_t duration, int gpus) {
  TraceJob session;
  session.job.id = JobId(fmt::format("notebook-{}", number));
  session.job.kind = JobKind::kInteractive;
  session.job.queue = QueueId("notebooks");
  TaskGroup group;
  group.name = "notebook";
  group.replicas = 1;
  group.request.gpus = WholeGpus{gpus};
  session.job.groups.push_back(std::move(group));
  session.job.runtime_estimate = std::chrono::seconds(duration);
  session.submit_seconds = submit;
  session.duration_seconds = duration;
  return session;
}

int64_t WindowOf(const Trace& batch, const InteractiveMixOptions& options) {
  if (options.window_seconds > 0) {
    return options.window_seconds;
  }
  return batch.jobs.empty() ? 1 : batch.jobs.back().submit_seconds + 1;
}

// The run's figures over the measurement span [from, to): samples in it, jobs submitted in it.
void Measure(InteractiveMixRun& run, int64_t from, int64_t to) {
  double allocated = 0;
  double busy = 0;
  int samples = 0;
  for (const ReplaySample& sample : run.replay.series) {
    if (sample.time_seconds >= from && sample.time_seconds < to) {
      allocated += sample.gpus_allocated;
      busy += sample.gpus_busy;
      ++samples;
    }
  }
  run.mean_gpus_allocated = samples > 0 ? allocated / samples : 0;
  run.mean_gpus_busy = samples > 0 ? busy / samples : 0;
  std::vector<double> delays;
  std::vector<double> completions;
  std::vector<double> session_waits;
  std::vector<double> session_stretches;
  InteractiveOutcome& notebooks = run.notebooks;
  for (const ReplayJobOutcome& job : run.replay.jobs) {
    if (job.submit_seconds < from || job.submit_seconds >= to) {
      continue;
    }
    if (job.interactive) {
      ++notebooks.sessions;
      notebooks.reclaims += job.reclaims;
      notebooks.reclaimed += job.reclaims > 0 ? 1 : 0;
      notebooks.resume_wait_seconds += job.resume_wait_seconds;
      if (job.first_start_seconds >= 0) {
        session_waits.push_back(static_cast<double>(job.resume_wait_seconds));
      }
      if (job.end_seconds >= 0 && !job.timed_out) {
        ++notebooks.finished;
        session_stretches.push_back(job.SessionStretch());
      }
      continue;
    }
    if (job.first_start_seconds >= 0) {
      delays.push_back(static_cast<double>(job.QueueingDelay()));
    }
    if (job.end_seconds >= 0 && !job.timed_out) {
      completions.push_back(static_cast<double>(job.CompletionTime()));
    }
  }
  run.batch_queueing_delay = Summarize(std::move(delays));
  run.batch_completion_time = Summarize(std::move(completions));
  notebooks.mean_resume_wait_seconds =
      notebooks.reclaims > 0
          ? static_cast<double>(notebooks.resume_wait_seconds) / notebooks.reclaims
          : 0.0;
  notebooks.session_resume_wait = Summarize(std::move(session_waits));
  notebooks.session_stretch = Summarize(std::move(session_stretches));
}

std::string Hours(double seconds) {
  return fmt::format("{:.2f} h", seconds / kSecondsPerHour);
}

std::string Minutes(double seconds) {
  return fmt::format("{:.1f} min", seconds / kSecondsPerMinute);
}

std::string Percent(double share) {
  return fmt::format("{:.1f} %", 100.0 * share);
}

std::string ReclaimDescription(const InteractiveMixRunSpec& spec) {
  if (!spec.reclaim) {
    return "off";
  }
  const policy::IdleReclaimOptions& reclaim = *spec.reclaim;
  return fmt::format("idle {:.0f} min + warning {:.0f} min, {}",
                     static_cast<double>(reclaim.idle_seconds) / kSecondsPerMinute,
                     static_cast<double>(reclaim.warning_seconds) / kSecondsPerMinute,
                     policy::ReclaimActionName(reclaim.action));
}

// A grouped bar chart (GPUs allocated and busy per run) as a standalone <svg>; chart.h's uPlot
// charts are lines only.
std::string RenderAllocatedBusyBars(const InteractiveMixResult& result) {
  constexpr int kHeight = 400;
  constexpr int kGroupWidth = 170;  // room for a run's name under its bars
  constexpr int kLeft = 72;
  constexpr int kRight = 160;
  constexpr int kTop = 44;
  constexpr int kBottom = 72;
  constexpr const char* kColours[2] = {"#0072B2", "#E69F00"};  // Okabe-Ito, as html_page.cc
  constexpr const char* kNames[2] = {"GPUs allocated", "GPUs busy"};
  const int width = kLeft + kRight + std::max<int>(560, kGroupWidth * result.runs.size());
  const int total_gpus = result.runs.front().replay.total_gpus;
  const double top = std::max(1, total_gpus);
  const double plot_width = width - kLeft - kRight;
  const double plot_height = kHeight - kTop - kBottom;
  auto y_of = [&](double value) { return kTop + plot_height * (1.0 - value / top); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<text x=\"{2}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">Mean GPUs allocated and "
      "busy in the window (of {3})</text>\n",
      width, kHeight, kLeft + plot_width / 2, total_gpus);
  for (int tick = 0; tick <= 4; ++tick) {
    const double value = top * tick / 4;
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#e3e3e3\"/>\n"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:.0f}</text>\n",
        kLeft, y_of(value), kLeft + plot_width, kLeft - 6, y_of(value) + 4, value);
  }
  const double group_width = plot_width / result.runs.size();
  const double bar_width = std::min(60.0, group_width / 3);
  for (size_t i = 0; i < result.runs.size(); ++i) {
    const InteractiveMixRun& run = result.runs[i];
    const double values[2] = {run.mean_gpus_allocated, run.mean_gpus_busy};
    const double center = kLeft + group_width * (static_cast<double>(i) + 0.5);
    for (int bar = 0; bar < 2; ++bar) {
      const double x = center - bar_width + bar * bar_width;
      const double y = y_of(std::clamp(values[bar], 0.0, top));
      svg += fmt::format(
          "<rect data-series=\"{0}\" x=\"{1:.1f}\" y=\"{2:.1f}\" width=\"{3:.1f}\" "
          "height=\"{4:.1f}\" fill=\"{5}\"><title>{6}: {0} {7:.1f}</title></rect>\n"
          "<text x=\"{8:.1f}\" y=\"{9:.1f}\" text-anchor=\"middle\">{7:.1f}</text>\n",
          kNames[bar], x, y, bar_width, kTop + plot_height - y, kColours[bar],
          XmlEscape(run.spec.name), values[bar], x + bar_width / 2, y - 4);
    }
    svg += fmt::format(
        "<text x=\"{0:.1f}\" y=\"{1}\" text-anchor=\"middle\">{2}</text>\n"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">busy/allocated {4}</text>\n",
        center, kTop + plot_height + 18, XmlEscape(run.spec.name), kTop + plot_height + 36,
        Percent(run.BusyOfAllocated()));
  }
  svg += fmt::format(
      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#333333\"/>\n"
      "<line x1=\"{0}\" y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" stroke=\"#333333\"/>\n",
      kLeft, kTop, kTop + plot_height, kLeft + plot_width);
  for (int bar = 0; bar < 2; ++bar) {
    const int y = kTop + 8 + bar * 18;
    svg += fmt::format(
        "<rect x=\"{0}\" y=\"{1}\" width=\"12\" height=\"12\" fill=\"{2}\"/>\n"
        "<text x=\"{3}\" y=\"{4}\">{5}</text>\n",
        kLeft + plot_width + 16, y, kColours[bar], kLeft + plot_width + 34, y + 10, kNames[bar]);
  }
  svg += "</svg>\n";
  return svg;
}

Series WindowSeries(std::string name, const ReplayResult& replay, int64_t window_seconds,
                    double ReplaySample::*field) {
  Series series{std::move(name), {}, {}};
  for (const ReplaySample& sample : replay.series) {
    if (sample.time_seconds <= window_seconds) {
      series.x.push_back(static_cast<double>(sample.time_seconds) / kSecondsPerHour);
      series.y.push_back(sample.*field);
    }
  }
  return series;
}

}  // namespace

Status InteractiveMixOptions::Validate() const {
  if (!(notebook_share > 0 && notebook_share < 1)) {
    return InvalidArgumentError(
        fmt::format("notebook_share: {} (must be in (0, 1))", notebook_share));
  }
  if (!(busy_fraction > 0 && busy_fraction <= 1)) {
    return InvalidArgumentError(
        fmt::format("busy_fraction: {} (must be in (0, 1])", busy_fraction));
  }
  if (mean_busy_seconds <= 0) {
    return InvalidArgumentError(
        fmt::format("mean_busy_seconds: {} (must be positive)", mean_busy_seconds));
  }
  if (min_session_seconds <= 0 || max_session_seconds < min_session_seconds) {
    return InvalidArgumentError(
        fmt::format("session length: {} to {} s (must be positive, minimum no more than maximum)",
                    min_session_seconds, max_session_seconds));
  }
  if (window_seconds < 0) {
    return InvalidArgumentError(fmt::format("window_seconds: {} (must be >= 0)", window_seconds));
  }
  if (measure_from_seconds < 0 || (window_seconds > 0 && measure_from_seconds >= window_seconds)) {
    return InvalidArgumentError(
        fmt::format("measure_from_seconds: {} (must be >= 0 and before window_seconds {})",
                    measure_from_seconds, window_seconds));
  }
  if (runs.empty()) {
    return InvalidArgumentError("runs: none (need at least one)");
  }
  for (const InteractiveMixRunSpec& run : runs) {
    if (run.reclaim) {
      const Status valid = run.reclaim->Validate();
      if (!valid.ok()) {
        return InvalidArgumentError(fmt::format("run \"{}\": {}", run.name, valid.message()));
      }
    }
  }
  return Status::Ok();
}

double InteractiveMixRun::BusyOfAllocated() const {
  return mean_gpus_allocated > 0 ? mean_gpus_busy / mean_gpus_allocated : 0.0;
}

double InteractiveMixRun::BusyOfTotal() const {
  return replay.total_gpus > 0 ? mean_gpus_busy / replay.total_gpus : 0.0;
}

Result<Trace> AddNotebookSessions(const Trace& batch, const InteractiveMixOptions& options) {
  GPUFLEET_RETURN_IF_ERROR(options.Validate());
  const int64_t window = WindowOf(batch, options);
  double batch_gpu_seconds = 0;
  for (const TraceJob& job : batch.jobs) {
    batch_gpu_seconds += GpuSecondsInWindow(job, window);
  }
  if (batch_gpu_seconds <= 0) {
    return InvalidArgumentError("trace: no GPU-time in the window to add notebooks to");
  }
  // share = notebooks / (batch + notebooks), both inside the window.
  const double target = options.notebook_share / (1.0 - options.notebook_share) * batch_gpu_seconds;
  Random random(options.seed);
  std::vector<TraceJob> sessions;
  double reserved = 0;
  while (reserved < target) {
    const int gpus = DrawNotebookGpus(random);
    const int64_t duration = options.min_session_seconds +
                             static_cast<int64_t>(random.Uniform(static_cast<uint64_t>(
                                 options.max_session_seconds - options.min_session_seconds + 1)));
    const int64_t submit = static_cast<int64_t>(random.Uniform(static_cast<uint64_t>(window)));
    sessions.push_back(
        NotebookSession(static_cast<int>(sessions.size()) + 1, submit, duration, gpus));
    reserved += GpuSecondsInWindow(sessions.back(), window);
  }
  Trace mix;
  mix.source = batch.source;
  mix.jobs = batch.jobs;
  mix.jobs.insert(mix.jobs.end(), sessions.begin(), sessions.end());
  std::stable_sort(mix.jobs.begin(), mix.jobs.end(), [](const TraceJob& a, const TraceJob& b) {
    return a.submit_seconds < b.submit_seconds;
  });
  return mix;
}

Result<InteractiveMixResult> RunInteractiveMix(const Cluster& cluster, const Trace& batch,
                                               const GpuCatalog& catalog,
                                               const InteractiveMixOptions& options, int threads) {
  GPUFLEET_ASSIGN_OR_RETURN(const Trace mix, AddNotebookSessions(batch, options));
  InteractiveMixResult result;
  result.options = options;
  result.options.window_seconds = WindowOf(batch, options);
  for (const TraceJob& job : mix.jobs) {
    if (job.job.kind == JobKind::kInteractive) {
      ++result.notebook_sessions;
      result.notebook_gpu_seconds += GpuSecondsInWindow(job, result.options.window_seconds);
    } else {
      ++result.batch_jobs;
      result.batch_gpu_seconds += GpuSecondsInWindow(job, result.options.window_seconds);
    }
  }
  GPUFLEET_ASSIGN_OR_RETURN(
      std::vector<ReplayResult> replays,
      ParallelMap<ReplayResult>(options.runs.size(), threads,
                                [&](size_t i) {
                                  ReplayOptions run = options.replay;
                                  run.interactive_activity = InteractiveActivity{
                                      options.busy_fraction, options.mean_busy_seconds};
                                  run.idle_reclaim = options.runs[i].reclaim;
                                  return RunReplay(cluster, mix, catalog, run);
                                },
                                {}));
  for (size_t i = 0; i < options.runs.size(); ++i) {
    InteractiveMixRun run;
    run.spec = options.runs[i];
    run.replay = std::move(replays[i]);
    Measure(run, options.measure_from_seconds, result.options.window_seconds);
    result.runs.push_back(std::move(run));
  }
  return result;
}

void PrintInteractiveMixSummary(const InteractiveMixResult& result, std::ostream& out) {
  const double total = result.batch_gpu_seconds + result.notebook_gpu_seconds;
  fmt::print(out,
             "{} batch jobs + {} notebook sessions; GPU-time asked for in the first {}: batch "
             "{:.0f} GPU-h, notebooks {:.0f} GPU-h ({:.1f}%, busy {:.0f}% of it); figures from "
             "{} on\n",
             result.batch_jobs, result.notebook_sessions, Hours(result.options.window_seconds),
             result.batch_gpu_seconds / kSecondsPerHour,
             result.notebook_gpu_seconds / kSecondsPerHour,
             total > 0 ? 100.0 * result.notebook_gpu_seconds / total : 0.0,
             100.0 * result.options.busy_fraction,
             Hours(static_cast<double>(result.options.measure_from_seconds)));
  fmt::print(out, "{:<22} {:>7} {:>7} {:>10} {:>10} {:>10} {:>10} {:>8} {:>9} {:>9} {:>10} {:>8}\n",
             "run", "alloc", "busy", "busy/alloc", "busy/total", "batch wait", "batch JCT",
             "reclaims", "nb wait50", "nb wait90", "per resume", "stretch");
  for (const InteractiveMixRun& run : result.runs) {
    const InteractiveOutcome& notebooks = run.notebooks;
    fmt::print(out,
               "{:<22} {:>7.1f} {:>7.1f} {:>9.1f}% {:>9.1f}% {:>9.0f}s {:>9.0f}s {:>8} {:>8.0f}s "
               "{:>8.0f}s {:>9.0f}s {:>7.2f}x\n",
               run.spec.name, run.mean_gpus_allocated, run.mean_gpus_busy,
               100.0 * run.BusyOfAllocated(), 100.0 * run.BusyOfTotal(),
               run.batch_queueing_delay.mean, run.batch_completion_time.mean, notebooks.reclaims,
               notebooks.session_resume_wait.p50, notebooks.session_resume_wait.p90,
               notebooks.mean_resume_wait_seconds, notebooks.session_stretch.mean);
  }
}

Status WriteInteractiveMixReport(const InteractiveMixResult& result, const std::string& title,
                                 std::ostream& out) {
  if (result.runs.empty()) {
    return InvalidArgumentError("no interactive-mix runs to report");
  }
  const InteractiveMixOptions& options = result.options;
  const double total = result.batch_gpu_seconds + result.notebook_gpu_seconds;
  std::string body;
  auto append = [&body]<typename... Args>(fmt::format_string<Args...> format, Args&&... args) {
    fmt::format_to(std::back_inserter(body), format, std::forward<Args>(args)...);
  };
  append(
      "<p class=\"note\">{} batch jobs ({:.0f} GPU-hours asked for in the window) and {} notebook "
      "sessions ({:.0f} GPU-hours reserved in the window, {} of the demand) on {} GPUs, queue "
      "policy {}. GPU-time in the window counts the part of each job's run before the window "
      "ends, were it to start on arrival. A notebook holds its "
      "GPUs for its session but is busy only in bursts ({} of the time, bursts of {} on "
      "average). GPUs busy: a batch job's GPUs while it runs, a notebook's only in its bursts. "
      "Busy/allocated is the mean of GPUs busy over the mean of GPUs allocated, busy/total the "
      "mean of GPUs busy over the cluster's GPUs, both over the samples (every {}) from {} (the "
      "warm-up before it is left out) to {}, while sessions open; the job figures are of the "
      "jobs submitted in that span. A reclaimed notebook's owner comes back at the next burst; the "
      "wait from then until its GPUs are placed is the notebook's slowdown, and stretch is a "
      "finished session's first start to end over its length. Target: busy/allocated at least "
      "{} with reclaim.</p>\n",
      result.batch_jobs, result.batch_gpu_seconds / kSecondsPerHour, result.notebook_sessions,
      result.notebook_gpu_seconds / kSecondsPerHour,
      Percent(total > 0 ? result.notebook_gpu_seconds / total : 0.0),
      result.runs.front().replay.total_gpus, XmlEscape(options.replay.queue_policy),
      Percent(options.busy_fraction), Minutes(static_cast<double>(options.mean_busy_seconds)),
      Minutes(static_cast<double>(options.replay.sample_seconds)),
      Hours(static_cast<double>(options.measure_from_seconds)),
      Hours(static_cast<double>(options.window_seconds)), Percent(kTargetBusyOfAllocated));
  body +=
      "<h2>Summary</h2>\n<table>\n<tr><th rowspan=\"2\">run</th><th rowspan=\"2\">idle "
      "reclaim</th><th colspan=\"4\">GPUs (mean)</th><th colspan=\"2\">batch jobs</th>"
      "<th colspan=\"6\">notebooks</th></tr>\n<tr><th>allocated</th><th>busy</th>"
      "<th>busy/allocated</th><th>busy/total</th><th>mean queueing delay</th><th>mean JCT</th>"
      "<th>reclaims</th><th>sessions reclaimed</th><th>wait on resume per session, p50</th>"
      "<th>p90</th><th>mean wait per resume</th><th>mean stretch</th></tr>\n";
  for (const InteractiveMixRun& run : result.runs) {
    const InteractiveOutcome& notebooks = run.notebooks;
    body += "<tr>" + HtmlCell(run.spec.name) + HtmlCell(ReclaimDescription(run.spec)) +
            HtmlNumCell(fmt::format("{:.1f}", run.mean_gpus_allocated)) +
            HtmlNumCell(fmt::format("{:.1f}", run.mean_gpus_busy)) +
            HtmlNumCell(Percent(run.BusyOfAllocated())) + HtmlNumCell(Percent(run.BusyOfTotal())) +
            HtmlNumCell(Hours(run.batch_queueing_delay.mean)) +
            HtmlNumCell(Hours(run.batch_completion_time.mean)) +
            HtmlNumCell(std::to_string(notebooks.reclaims)) +
            HtmlNumCell(fmt::format("{} of {}", notebooks.reclaimed, notebooks.sessions)) +
            HtmlNumCell(Minutes(notebooks.session_resume_wait.p50)) +
            HtmlNumCell(Minutes(notebooks.session_resume_wait.p90)) +
            HtmlNumCell(Minutes(notebooks.mean_resume_wait_seconds)) +
            HtmlNumCell(fmt::format("{:.2f}x", notebooks.session_stretch.mean)) + "</tr>\n";
  }
  body += "</table>\n";

  body += "<h2>GPUs allocated and busy</h2>\n<figure>" + RenderAllocatedBusyBars(result) +
          "</figure>\n";
  ChartSpec over_time{.title = "GPUs allocated and busy over the window",
                      .x_label = "time (hours)",
                      .y_label = "GPUs"};
  ChartSpec waits{.title = "CDF of a notebook session's wait on resuming",
                  .x_label = "wait (minutes, all resumes of the session)",
                  .y_label = "share of started sessions",
                  .step = true};
  for (const InteractiveMixRun& run : result.runs) {
    over_time.series.push_back(WindowSeries(run.spec.name + " allocated", run.replay,
                                            options.window_seconds, &ReplaySample::gpus_allocated));
    over_time.series.push_back(WindowSeries(run.spec.name + " busy", run.replay,
                                            options.window_seconds, &ReplaySample::gpus_busy));
    if (run.spec.reclaim) {
      std::vector<double> minutes;
      for (const ReplayJobOutcome& job : run.replay.jobs) {
        if (job.interactive && job.first_start_seconds >= 0 &&
            job.submit_seconds >= options.measure_from_seconds &&
            job.submit_seconds < options.window_seconds) {
          minutes.push_back(static_cast<double>(job.resume_wait_seconds) / kSecondsPerMinute);
        }
      }
      waits.series.push_back(CdfSeries(run.spec.name, std::move(minutes)));
    }
  }
  body += FigureHtml(over_time);
  if (!waits.series.empty()) {
    body += "<h2>Notebook slowdown</h2>\n" + FigureHtml(waits);
  }
  return WriteHtmlPage(title, body, out);
}

}  // namespace gpufleet::sim
