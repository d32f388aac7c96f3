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
  double slow_share = 0.005;
  double slow_factor = 1.34;
  double node_rate = 2e-4;
  double nic_rate = 6e-4;
  double node_repair_minutes = 10;
  bool no_diagnostics = false;
  double diag_minutes = 2;
  double diag_bad_sensitivity = 0.9;
  double diag_slow_sensitivity = 0.95;
  double diag_false_positive = 0.01;
  int suspect_min_failures = 2;
  double suspect_p = 1e-3;
  double straggler_accuracy = 0.99;
  double straggler_false_rate = 1e-5;
  int spare_nodes = 8;
  bool checkpoint_auto = false;
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
  options.faults.slow_gpu_share = flags.slow_share;
  options.faults.slow_factor = flags.slow_factor;
  options.faults.node_rate_per_node_hour = flags.node_rate;
  options.faults.nic_rate_per_node_hour = flags.nic_rate;
  options.faults.node_repair_seconds = Seconds(flags.node_repair_minutes * 60);
  options.diagnostics.enabled = !flags.no_diagnostics;
  options.diagnostics.diagnostic_seconds = Seconds(flags.diag_minutes * 60);
  options.diagnostics.bad_sensitivity = flags.diag_bad_sensitivity;
  options.diagnostics.slow_sensitivity = flags.diag_slow_sensitivity;
  options.diagnostics.false_positive_rate = flags.diag_false_positive;
  options.diagnostics.suspect_min_failures = flags.suspect_min_failures;
  options.diagnostics.suspect_max_p = flags.suspect_p;
  options.diagnostics.straggler_accuracy = flags.straggler_accuracy;
  options.diagnostics.straggler_false_per_gpu_hour = flags.straggler_false_rate;
  options.large_job.spare_nodes = flags.spare_nodes;
  options.large_job.checkpoint_from_failure_rate = flags.checkpoint_auto;
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
      "{:.1f}% bad GPUs at {}-{}x a base rate of {} per GPU-hour; {:.1f}% fail-slow at {}x; "
      "node / NIC faults {} / {} per node-hour; large job {} GPUs\n",
      flags.nodes * flags.gpus_per_node, flags.nodes, flags.gpus_per_node, flags.days, flags.seed,
      shapes.size(), trace_path, flags.load, 100 * flags.bad_share, flags.bad_min, flags.bad_max,
      flags.base_rate, 100 * flags.slow_share, flags.slow_factor, flags.node_rate, flags.nic_rate,
      flags.large_gpus);
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
  command->add_option("--slow-share", flags->slow_share, "share of GPUs that fail slow");
  command->add_option("--slow-factor", flags->slow_factor,
                      "how many times slower a gang with a fail-slow GPU runs");
  command->add_option("--node-rate", flags->node_rate,
                      "node faults per node-hour (every job on the node fails)");
  command->add_option("--nic-rate", flags->nic_rate,
                      "NIC or link faults per node-hour (multi-node jobs on the node fail)");
  command->add_option("--node-repair-minutes", flags->node_repair_minutes,
                      "a node is fenced this long after a node or NIC fault");
  command->add_flag("--no-diagnostics", flags->no_diagnostics,
                    "quarantine flagged devices at once instead of diagnosing suspects");
  command->add_option("--diag-minutes", flags->diag_minutes,
                      "how long a diagnostic holds a GPU (dcgmi diag -r 2: about 2)");
  command->add_option("--diag-bad-sensitivity", flags->diag_bad_sensitivity,
                      "chance a diagnostic fails a failure-prone GPU (assumed)");
  command->add_option("--diag-slow-sensitivity", flags->diag_slow_sensitivity,
                      "chance a diagnostic fails a fail-slow GPU (assumed)");
  command->add_option("--diag-false-positive", flags->diag_false_positive,
                      "chance a diagnostic fails a sound GPU (assumed)");
  command->add_option("--suspect-min-failures", flags->suspect_min_failures,
                      "failures that make a GPU a suspect, with --suspect-p");
  command->add_option("--suspect-p", flags->suspect_p,
                      "p-value under which a GPU with enough failures is a suspect");
  command->add_option("--straggler-accuracy", flags->straggler_accuracy,
                      "chance per analysis that the gang comparison names a fail-slow member");
  command->add_option("--straggler-false-rate", flags->straggler_false_rate,
                      "sound gang members wrongly named per GPU-hour");
  command->add_option("--spare-nodes", flags->spare_nodes,
                      "whole nodes held free for the large job's restarts");
  command->add_flag("--checkpoint-auto", flags->checkpoint_auto,
                    "large job checkpoints at Young/Daly's interval from its measured failures");
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
