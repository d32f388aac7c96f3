// SPDX-License-Identifier: Apache-2.0
// `gpufleet sim interactive`: the interactive-mix scenario of docs/utilization.md, a window of a
// trace (the bundled Philly job list by default) plus notebook sessions, replayed without and
// with idle reclaim.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/core.h>
#include <fmt/ostream.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/policy/idle_reclaim.h"
#include "gpufleet/sim/interactive_mix.h"
#include "gpufleet/sim/trace_loaders.h"
#include "gpufleet/sim/utilization_scenarios.h"

#include "flags.h"
#include "subcommands.h"

namespace gpufleet::app {
namespace {

constexpr double kDaySeconds = 86400.0;

struct InteractiveFlags {
  std::string data_dir = GPUFLEET_DEFAULT_DATA_DIR;
  std::string trace;
  std::string format = "philly";
  double from_days = 35;
  double days = 2;
  double warmup_hours = 24;
  int nodes = 32;
  int gpus_per_node = 8;
  std::string gpu_model = "V100-32GB";
  std::string placement = "best-fit";
  std::string policy = "fifo";
  uint64_t seed = 42;
  int64_t sample_seconds = 300;
  double notebook_share = 0.2;
  double busy_fraction = 0.15;
  double busy_minutes = 10;
  double min_session_hours = 1;
  double max_session_hours = 8;
  std::string idle_minutes = "30,10";
  double warning_minutes = 15;
  int threshold_pct = 10;
  std::string action = "suspend";
  std::string report;
  int threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
};

int FailSimInteractive(const Status& status) {
  fmt::print(std::cerr, "gpufleet sim interactive: {}\n", status.ToString());
  return 1;
}

// "no reclaim", then one run per idle period and action.
Result<std::vector<sim::InteractiveMixRunSpec>> MakeRuns(const InteractiveFlags& flags) {
  std::vector<sim::InteractiveMixRunSpec> runs = {{"no reclaim", std::nullopt}};
  std::vector<policy::ReclaimAction> actions;
  for (const std::string& text : SplitList(flags.action)) {
    Result<policy::ReclaimAction> action = policy::ParseReclaimAction(text);
    if (!action.ok()) {
      return InvalidArgumentError("--action: " + action.status().message());
    }
    actions.push_back(*action);
  }
  for (const std::string& text : SplitList(flags.idle_minutes)) {
    char* end = nullptr;
    const double minutes = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !(minutes > 0 && minutes <= 10080)) {
      return InvalidArgumentError(
          fmt::format("--idle-minutes: \"{}\" (must be minutes in (0, 10080])", text));
    }
    for (policy::ReclaimAction action : actions) {
      policy::IdleReclaimOptions reclaim;
      reclaim.idle_seconds = std::max<int64_t>(1, std::llround(minutes * 60));
      reclaim.warning_seconds = std::max<int64_t>(1, std::llround(flags.warning_minutes * 60));
      reclaim.threshold_milli = flags.threshold_pct * 10;
      reclaim.action = action;
      runs.push_back({fmt::format("reclaim {}+{}m {}", text, flags.warning_minutes,
                                  policy::ReclaimActionName(action)),
                      reclaim});
    }
  }
  return runs;
}

int RunInteractiveCommand(const InteractiveFlags& flags) {
  auto runs = MakeRuns(flags);
  if (!runs.ok()) {
    return FailSimInteractive(runs.status());
  }
  // LoadTrace adds the GPU models an openb trace names.
  GpuCatalog catalog = GpuCatalog::Default();
  SyntheticClusterSpec spec;
  spec.nodes_per_leaf = 32;
  spec.leaves_per_block = (flags.nodes + spec.nodes_per_leaf - 1) / spec.nodes_per_leaf;
  spec.total_nodes = flags.nodes;
  spec.gpus_per_node = flags.gpus_per_node;
  spec.gpu_model = flags.gpu_model;
  Result<Cluster> cluster = MakeSyntheticCluster(spec, catalog);
  if (!cluster.ok()) {
    return FailSimInteractive(cluster.status());
  }
  const std::string trace_path =
      flags.trace.empty() ? flags.data_dir + "/philly/philly.csv" : flags.trace;
  Result<sim::Trace> trace = sim::LoadTrace(trace_path, flags.format, catalog);
  if (!trace.ok()) {
    return FailSimInteractive(trace.status());
  }
  // The replay starts with an empty cluster: it starts the warm-up earlier, and the figures
  // leave the warm-up out.
  const int64_t from_seconds = std::llround(flags.from_days * kDaySeconds);
  const int64_t warmup_seconds =
      std::min<int64_t>(from_seconds, std::llround(flags.warmup_hours * 3600));
  const int64_t window_seconds = warmup_seconds + std::llround(flags.days * kDaySeconds);
  const sim::Trace window = sim::SliceTrace(*trace, from_seconds - warmup_seconds, window_seconds);
  if (window.jobs.empty()) {
    return FailSimInteractive(InvalidArgumentError(fmt::format(
        "--from-days {} --days {}: no job in that window", flags.from_days, flags.days)));
  }
  sim::InteractiveMixOptions options;
  options.notebook_share = flags.notebook_share;
  options.busy_fraction = flags.busy_fraction;
  options.mean_busy_seconds = std::llround(flags.busy_minutes * 60);
  options.min_session_seconds = std::llround(flags.min_session_hours * 3600);
  options.max_session_seconds = std::llround(flags.max_session_hours * 3600);
  options.window_seconds = window_seconds;
  options.measure_from_seconds = warmup_seconds;
  options.seed = flags.seed;
  options.runs = std::move(*runs);
  options.replay.queue_policy = flags.policy;
  options.replay.placement_policy = flags.placement;
  options.replay.seed = flags.seed;
  options.replay.sample_seconds = flags.sample_seconds;
  fmt::print(
      "interactive: {} jobs of {} (days {} to {}, measured from day {}); {} nodes x {} {}; "
      "queue {}\n",
      window.jobs.size(), trace_path,
      static_cast<double>(from_seconds - warmup_seconds) / kDaySeconds,
      flags.from_days + flags.days, flags.from_days, flags.nodes, flags.gpus_per_node,
      flags.gpu_model, flags.policy);
  auto result = sim::RunInteractiveMix(*cluster, window, catalog, options, flags.threads);
  if (!result.ok()) {
    return FailSimInteractive(result.status());
  }
  sim::PrintInteractiveMixSummary(*result, std::cout);
  if (!flags.report.empty()) {
    const Status written = WriteOutputFile(flags.report, [&](std::ostream& out) {
      return sim::WriteInteractiveMixReport(*result, "gpufleet interactive mix: " + trace_path,
                                            out);
    });
    if (!written.ok()) {
      return FailSimInteractive(written);
    }
  }
  return 0;
}

}  // namespace

SimSubcommand AddSimInteractiveCommand(CLI::App& sim) {
  auto flags = std::make_shared<InteractiveFlags>();
  CLI::App* command = sim.add_subcommand(
      "interactive",
      "a trace window plus notebooks that hold GPUs but are rarely busy: GPUs allocated and busy "
      "without and with idle reclaim, and what reclaim costs the notebooks");
  command->add_option("--data-dir", flags->data_dir, "directory of the bundled traces");
  command->add_option("--trace", flags->trace, "the trace (default: the bundled Philly job list)");
  command->add_option("--format", flags->format, "format of --trace (default philly)");
  command->add_option("--from-days", flags->from_days, "start of the window, days into the trace")
      ->check(CLI::Range(0.0, 3650.0));
  command->add_option("--days", flags->days, "length of the measured window in days")
      ->check(CLI::Range(0.01, 3650.0));
  command
      ->add_option("--warmup-hours", flags->warmup_hours,
                   "replayed before the window (jobs and notebooks), left out of the figures")
      ->check(CLI::Range(0.0, 24.0 * 365));
  command->add_option("--nodes", flags->nodes, "nodes of the synthetic cluster")
      ->check(CLI::Range(1, 100000));
  command->add_option("--gpus-per-node", flags->gpus_per_node)->check(CLI::Range(1, 64));
  command->add_option("--gpu-model", flags->gpu_model, "GPU model of the synthetic cluster");
  command->add_option("--placement", flags->placement, "placement policy (default best-fit)");
  command->add_option("--policy", flags->policy, "queue policy (default fifo)");
  command->add_option("--seed", flags->seed, "seed for the notebooks and tie-breaks");
  command->add_option("--sample-seconds", flags->sample_seconds, "spacing of the time series")
      ->check(CLI::Range(1, 86400));
  command
      ->add_option("--notebook-share", flags->notebook_share,
                   "notebooks' reserved GPU-time over all GPU-time asked for (0.2)")
      ->check(CLI::Range(0.0, 1.0));
  command
      ->add_option("--busy-fraction", flags->busy_fraction,
                   "share of a session a notebook is busy (0.15)")
      ->check(CLI::Range(0.0, 1.0));
  command->add_option("--busy-minutes", flags->busy_minutes, "mean busy burst (10)")
      ->check(CLI::Range(0.1, 1440.0));
  command->add_option("--min-session-hours", flags->min_session_hours, "(1)")
      ->check(CLI::Range(0.01, 1000.0));
  command->add_option("--max-session-hours", flags->max_session_hours, "(8)")
      ->check(CLI::Range(0.01, 1000.0));
  command->add_option("--idle-minutes", flags->idle_minutes,
                      "idle time before a warning, comma-separated: one reclaim run each (30,10)");
  command->add_option("--warning-minutes", flags->warning_minutes, "warning before reclaim (15)")
      ->check(CLI::Range(0.02, 10080.0));
  command->add_option("--threshold-pct", flags->threshold_pct, "idle below this GPU utilization")
      ->check(CLI::Range(1, 100));
  command->add_option("--action", flags->action,
                      "suspend or preempt, comma-separated: one reclaim run each (suspend)");
  command->add_option("--report", flags->report, "write a self-contained HTML report with charts");
  command->add_option("--threads", flags->threads, "runs in parallel")->check(CLI::Range(1, 256));
  return SimSubcommand{command, [flags] { return RunInteractiveCommand(*flags); }};
}

}  // namespace gpufleet::app
