// SPDX-License-Identifier: Apache-2.0
// `gpufleet sim failures`: failure injection, online attribution and quarantine, and the ETTR of
// a large training job, with and without quarantine.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/core.h>
#include <fmt/ostream.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/sim/failure_report.h"
#include "gpufleet/sim/failure_sim.h"
#include "gpufleet/sim/trace_loaders.h"

#include "flags.h"
#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct FailuresFlags {
  int nodes = 1250;
  int gpus_per_node = 8;
  int nodes_per_leaf = 32;
  std::string gpu_model = "H100-80GB";
  double days = 14;
  uint64_t seed = 42;
  std::string data_dir = GPUFLEET_DEFAULT_DATA_DIR;
  std::string trace;
  std::string format = "philly";
  double load = 0.8;
  double base_rate = 2.5e-4;
  double bad_share = 0.01;
  double bad_min = 50;
  double bad_max = 100;
  double xid_share = 0.6;
  double app_rate = 0.005;
  int large_gpus = 1024;
  double large_start_days = 0;
  double checkpoint_minutes = 30;
  double checkpoint_write_seconds = 30;
  double restart_minutes = 10;
  double alpha = 0.05;
  int min_failures = 3;
  double min_ratio = 4;
  double analysis_minutes = 60;
  double fleet_budget = 0.02;
  double leaf_budget = 0.05;
  std::string mode = "both";
  std::string json;
  std::string report;
  int threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
};

int FailSimFailures(const Status& status) {
  fmt::print(std::cerr, "gpufleet sim failures: {}\n", status.ToString());
  return 1;
}

int64_t Seconds(double value) {
  return static_cast<int64_t>(std::llround(value));
}

int RunFailuresCommand(const FailuresFlags& flags) {
  if (flags.mode != "both" && flags.mode != "quarantine" && flags.mode != "none") {
    return FailSimFailures(InvalidArgumentError(
        fmt::format("--mode: \"{}\" (must be both, quarantine or none)", flags.mode)));
  }
  GpuCatalog catalog = GpuCatalog::Default();
  SyntheticClusterSpec spec;
  spec.nodes_per_leaf = flags.nodes_per_leaf;
  spec.leaves_per_block = (flags.nodes + flags.nodes_per_leaf - 1) / flags.nodes_per_leaf;
  spec.total_nodes = flags.nodes;
  spec.gpus_per_node = flags.gpus_per_node;
  spec.gpu_model = flags.gpu_model;
  auto cluster = MakeSyntheticCluster(spec, catalog);
  if (!cluster.ok()) {
    return FailSimFailures(cluster.status());
  }
  const std::string trace_path =
      flags.trace.empty() ? flags.data_dir + "/philly/philly.csv" : flags.trace;
  auto trace = sim::LoadTrace(trace_path, flags.format, catalog);
  if (!trace.ok()) {
    return FailSimFailures(trace.status());
  }
  const std::vector<sim::JobShape> shapes = sim::JobShapesFromTrace(*trace);

  sim::FailureSimOptions options;
  options.seed = flags.seed;
  options.duration_seconds = Seconds(flags.days * 86400);
  options.target_load = flags.load;
  options.faults.base_rate_per_gpu_hour = flags.base_rate;
  options.faults.bad_gpu_share = flags.bad_share;
  options.faults.bad_multiplier_min = flags.bad_min;
  options.faults.bad_multiplier_max = flags.bad_max;
  options.faults.xid_share = flags.xid_share;
  options.faults.app_failure_rate_per_job_hour = flags.app_rate;
  options.large_job.gpus = flags.large_gpus;
  options.large_job.start_seconds = Seconds(flags.large_start_days * 86400);
  options.large_job.checkpoint_interval_seconds = Seconds(flags.checkpoint_minutes * 60);
  options.large_job.checkpoint_write_seconds = Seconds(flags.checkpoint_write_seconds);
  options.large_job.restart_seconds = Seconds(flags.restart_minutes * 60);
  options.stream_checkpoint_seconds = options.large_job.checkpoint_interval_seconds;
  options.attribution.alpha = flags.alpha;
  options.attribution.min_failures = flags.min_failures;
  options.attribution.min_rate_ratio = flags.min_ratio;
  options.analysis_interval_seconds = Seconds(flags.analysis_minutes * 60);
  options.budget = {flags.fleet_budget, flags.leaf_budget};

  fmt::print(
      "failures: {} GPUs ({} nodes x {}), {} days, seed {}; {} job shapes from {}; load {}; "
      "{:.1f}% bad GPUs at {}-{}x a base rate of {} per GPU-hour; large job {} GPUs\n",
      flags.nodes * flags.gpus_per_node, flags.nodes, flags.gpus_per_node, flags.days, flags.seed,
      shapes.size(), trace_path, flags.load, 100 * flags.bad_share, flags.bad_min, flags.bad_max,
      flags.base_rate, flags.large_gpus);
  Result<std::vector<sim::FailureSimResult>> results = std::vector<sim::FailureSimResult>();
  if (flags.mode == "both") {
    results = sim::RunFailureSimPair(*cluster, shapes, catalog, options, flags.threads);
  } else {
    options.rules.enabled = flags.mode == "quarantine";
    auto run = sim::RunFailureSim(*cluster, shapes, catalog, options);
    if (run.ok()) {
      results = std::vector<sim::FailureSimResult>{std::move(run).value()};
    } else {
      results = run.status();
    }
  }
  if (!results.ok()) {
    return FailSimFailures(results.status());
  }
  sim::PrintFailureSummary(*results, std::cout);
  if (!flags.json.empty()) {
    const Status written = WriteOutputFile(flags.json, [&](std::ostream& out) {
      sim::WriteFailureJson(*results, out);
      return Status::Ok();
    });
    if (!written.ok()) {
      return FailSimFailures(written);
    }
  }
  if (!flags.report.empty()) {
    const Status written = WriteOutputFile(flags.report, [&](std::ostream& out) {
      return sim::WriteFailureReport(*results, "gpufleet failures: " + trace_path, out);
    });
    if (!written.ok()) {
      return FailSimFailures(written);
    }
  }
  return 0;
}

}  // namespace

SimSubcommand AddSimFailuresCommand(CLI::App& sim) {
  auto flags = std::make_shared<FailuresFlags>();
  CLI::App* command = sim.add_subcommand(
      "failures",
      "inject heavy-tailed GPU faults into a job stream; attribution, quarantine and the ETTR of "
      "a large checkpointing job, with and without quarantine");
  command->add_option("--nodes", flags->nodes, "nodes of the synthetic cluster")
      ->check(CLI::Range(1, 100000));
  command->add_option("--gpus-per-node", flags->gpus_per_node)->check(CLI::Range(1, 64));
  command->add_option("--nodes-per-leaf", flags->nodes_per_leaf)->check(CLI::Range(1, 10000));
  command->add_option("--gpu-model", flags->gpu_model, "GPU model of the synthetic cluster");
  command->add_option("--days", flags->days, "simulated days")->check(CLI::Range(0.01, 365.0));
  command->add_option("--seed", flags->seed, "seed of every random draw");
  command->add_option("--data-dir", flags->data_dir, "directory of the bundled traces");
  command->add_option("--trace", flags->trace, "job sizes and durations (default: bundled Philly)");
  command->add_option("--format", flags->format, "format of --trace (default philly)");
  command->add_option("--load", flags->load, "arriving GPU demand / GPUs left to the stream")
      ->check(CLI::Range(0.01, 10.0));
  command->add_option("--base-rate", flags->base_rate, "failures per healthy GPU-hour");
  command->add_option("--bad-share", flags->bad_share, "share of GPUs that are bad");
  command->add_option("--bad-min", flags->bad_min, "smallest bad GPU rate multiplier");
  command->add_option("--bad-max", flags->bad_max, "largest bad GPU rate multiplier");
  command->add_option("--xid-share", flags->xid_share, "GPU failures that report a blaming XID");
  command->add_option("--app-rate", flags->app_rate, "application failures per job-hour");
  command->add_option("--large-job-gpus", flags->large_gpus, "GPUs of the large job (0: none)");
  command->add_option("--large-job-start-days", flags->large_start_days,
                      "when the large job is submitted");
  command->add_option("--checkpoint-minutes", flags->checkpoint_minutes,
                      "progress between checkpoints");
  command->add_option("--checkpoint-write-seconds", flags->checkpoint_write_seconds,
                      "time to write a checkpoint");
  command->add_option("--restart-minutes", flags->restart_minutes, "time to restart the job");
  command->add_option("--alpha", flags->alpha, "false-discovery rate of the attribution");
  command->add_option("--min-failures", flags->min_failures, "fewest failures to flag a device");
  command->add_option("--min-ratio", flags->min_ratio, "smallest failures / expected to flag");
  command->add_option("--analysis-minutes", flags->analysis_minutes, "attribution interval");
  command->add_option("--fleet-budget", flags->fleet_budget, "largest share of GPUs out at once");
  command->add_option("--leaf-budget", flags->leaf_budget, "largest share of a leaf out at once");
  command->add_option("--mode", flags->mode, "both (default), quarantine or none");
  command->add_option("--json", flags->json, "write the results to this JSON file");
  command->add_option("--report", flags->report, "write a self-contained HTML report");
  command->add_option("--threads", flags->threads, "runs in parallel")->check(CLI::Range(1, 256));
  return SimSubcommand{command, [flags] { return RunFailuresCommand(*flags); }};
}

}  // namespace gpufleet::app
