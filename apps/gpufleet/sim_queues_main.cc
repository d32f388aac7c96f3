// SPDX-License-Identifier: Apache-2.0
// `gpufleet sim fairness` and `gpufleet sim backfill`: the queue scenarios of docs/utilization.md
// on a window of a trace (the bundled Philly job list by default).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/core.h>
#include <fmt/ostream.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/sim/trace_loaders.h"
#include "gpufleet/sim/utilization_scenarios.h"

#include "flags.h"
#include "subcommands.h"

namespace gpufleet::app {
namespace {

constexpr double kSecondsPerDay = 86400.0;

// What both scenarios share: the trace window, the cluster and the outputs.
struct QueueScenarioFlags {
  std::string data_dir = GPUFLEET_DEFAULT_DATA_DIR;
  std::string trace;
  std::string format = "philly";
  double from_days = 0;
  double days = 0;
  int nodes = 0;
  int gpus_per_node = 8;
  int nodes_per_leaf = 32;
  std::string gpu_model = "V100-32GB";
  std::string placement = "best-fit";
  uint64_t seed = 42;
  int64_t sample_seconds = 1800;
  int64_t min_runtime_seconds = sim::ReplayOptions{}.min_runtime_before_preemption_seconds;
  int64_t checkpoint_seconds = sim::ReplayOptions{}.checkpoint_interval_seconds;
  std::string policy;
  std::string report;
  int threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
};

struct FairnessFlags : QueueScenarioFlags {
  int copies = 3;
  double burst_hours = 1;
  double team_limit = 1.0;
};

struct BackfillFlags : QueueScenarioFlags {
  int64_t grace_seconds = 0;
  double estimate_factor = 1;
  double underestimate_share = 0;
};

int FailSimQueues(const std::string& command, const Status& status) {
  fmt::print(std::cerr, "gpufleet sim {}: {}\n", command, status.ToString());
  return 1;
}

// The cluster, the trace window and the replay options the flags describe.
struct Setup {
  GpuCatalog catalog = GpuCatalog::Default();
  Cluster cluster;
  sim::Trace window;
  std::string trace_path;
  sim::ReplayOptions replay;
};

Result<std::unique_ptr<Setup>> Prepare(const QueueScenarioFlags& flags) {
  auto setup = std::make_unique<Setup>();
  SyntheticClusterSpec spec;
  spec.nodes_per_leaf = flags.nodes_per_leaf;
  spec.leaves_per_block = (flags.nodes + flags.nodes_per_leaf - 1) / flags.nodes_per_leaf;
  spec.total_nodes = flags.nodes;
  spec.gpus_per_node = flags.gpus_per_node;
  spec.gpu_model = flags.gpu_model;
  GPUFLEET_ASSIGN_OR_RETURN(setup->cluster, MakeSyntheticCluster(spec, setup->catalog));
  setup->trace_path = flags.trace.empty() ? flags.data_dir + "/philly/philly.csv" : flags.trace;
  GPUFLEET_ASSIGN_OR_RETURN(const sim::Trace trace,
                            sim::LoadTrace(setup->trace_path, flags.format, setup->catalog));
  setup->window = sim::SliceTrace(trace, std::llround(flags.from_days * kSecondsPerDay),
                                  std::llround(flags.days * kSecondsPerDay));
  if (setup->window.jobs.empty()) {
    return InvalidArgumentError(fmt::format("--from-days {} --days {}: no job in that window",
                                            flags.from_days, flags.days));
  }
  setup->replay.placement_policy = flags.placement;
  setup->replay.seed = flags.seed;
  setup->replay.sample_seconds = flags.sample_seconds;
  setup->replay.min_runtime_before_preemption_seconds = flags.min_runtime_seconds;
  setup->replay.checkpoint_interval_seconds = flags.checkpoint_seconds;
  return setup;
}

void PrintSetup(const char* name, const QueueScenarioFlags& flags, const Setup& setup) {
  fmt::print("{}: {} jobs of {} (days {} to {}); {} nodes x {} {}; placement {}\n", name,
             setup.window.jobs.size(), setup.trace_path, flags.from_days,
             flags.days > 0 ? fmt::format("{}", flags.from_days + flags.days) : "end", flags.nodes,
             flags.gpus_per_node, flags.gpu_model, flags.placement);
}

int RunFairnessCommand(const FairnessFlags& flags) {
  auto policies = ParsePolicies(flags.policy, sim::QueuePolicyNames());
  if (!policies.ok()) {
    return FailSimQueues("fairness", policies.status());
  }
  auto setup = Prepare(flags);
  if (!setup.ok()) {
    return FailSimQueues("fairness", setup.status());
  }
  sim::FairnessOptions options;
  options.flood_copies = flags.copies;
  options.flood_burst_seconds = std::llround(flags.burst_hours * 3600);
  options.team_limit_share = flags.team_limit;
  options.policies = *policies;
  options.replay = (*setup)->replay;
  PrintSetup("fairness", flags, **setup);
  auto result = sim::RunFairnessScenario((*setup)->cluster, (*setup)->window, (*setup)->catalog,
                                         options, flags.threads);
  if (!result.ok()) {
    return FailSimQueues("fairness", result.status());
  }
  sim::PrintFairnessSummary(*result, std::cout);
  if (!flags.report.empty()) {
    const Status written = WriteOutputFile(flags.report, [&](std::ostream& out) {
      return sim::WriteFairnessReport(*result, "gpufleet fairness: " + (*setup)->trace_path, out);
    });
    if (!written.ok()) {
      return FailSimQueues("fairness", written);
    }
  }
  return 0;
}

int RunBackfillCommand(const BackfillFlags& flags) {
  auto policies = ParsePolicies(flags.policy, sim::QueuePolicyNames());
  if (!policies.ok()) {
    return FailSimQueues("backfill", policies.status());
  }
  auto setup = Prepare(flags);
  if (!setup.ok()) {
    return FailSimQueues("backfill", setup.status());
  }
  sim::BackfillScenarioOptions options;
  options.policies = *policies;
  options.replay = (*setup)->replay;
  options.replay.overrun_grace_seconds = flags.grace_seconds;
  options.estimates = {.overestimate_factor = flags.estimate_factor,
                       .underestimate_share = flags.underestimate_share};
  PrintSetup("backfill", flags, **setup);
  auto result = sim::RunBackfillScenario((*setup)->cluster, (*setup)->window, (*setup)->catalog,
                                         options, flags.threads);
  if (!result.ok()) {
    return FailSimQueues("backfill", result.status());
  }
  sim::PrintBackfillSummary(*result, std::cout);
  if (!flags.report.empty()) {
    const Status written = WriteOutputFile(flags.report, [&](std::ostream& out) {
      return sim::WriteBackfillReport(*result, "gpufleet backfill: " + (*setup)->trace_path, out);
    });
    if (!written.ok()) {
      return FailSimQueues("backfill", written);
    }
  }
  return 0;
}

void AddScenarioFlags(CLI::App* command, QueueScenarioFlags& flags) {
  command->add_option("--data-dir", flags.data_dir, "directory of the bundled traces");
  command->add_option("--trace", flags.trace, "the trace (default: the bundled Philly job list)");
  command->add_option("--format", flags.format, "format of --trace (default philly)");
  command->add_option("--from-days", flags.from_days, "start of the window, days into the trace")
      ->check(CLI::Range(0.0, 3650.0));
  command->add_option("--days", flags.days, "length of the window in days (0: to the end)")
      ->check(CLI::Range(0.0, 3650.0));
  command->add_option("--nodes", flags.nodes, "nodes of the synthetic cluster")
      ->check(CLI::Range(1, 100000));
  command->add_option("--gpus-per-node", flags.gpus_per_node)->check(CLI::Range(1, 64));
  command->add_option("--gpu-model", flags.gpu_model, "GPU model of the synthetic cluster");
  command->add_option("--placement", flags.placement, "placement policy (default best-fit)");
  command->add_option("--seed", flags.seed, "seed for tie-breaks");
  command->add_option("--sample-seconds", flags.sample_seconds, "spacing of the time series")
      ->check(CLI::Range(1, 86400 * 30));
  command
      ->add_option("--min-runtime-seconds", flags.min_runtime_seconds,
                   "fair-share: how long a job runs before it may be preempted")
      ->check(CLI::Range(int64_t{0}, int64_t{86400 * 30}));
  command
      ->add_option("--checkpoint-seconds", flags.checkpoint_seconds,
                   "fair-share: a preempted job resumes from its last checkpoint, taken this "
                   "often (0: no work is lost)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400 * 30}));
  command->add_option("--report", flags.report, "write a self-contained HTML report with charts");
  command->add_option("--threads", flags.threads, "runs in parallel")->check(CLI::Range(1, 256));
}

}  // namespace

SimSubcommand AddSimFairnessCommand(CLI::App& sim) {
  auto flags = std::make_shared<FairnessFlags>();
  flags->from_days = 35;
  flags->days = 2;
  flags->nodes = 24;
  flags->policy = "fifo,fair-share-no-preempt,fair-share";
  CLI::App* command = sim.add_subcommand(
      "fairness",
      "two teams of equal weight, one flooding the queue: the other team's queueing delay alone "
      "and flooded, per queue policy");
  AddScenarioFlags(command, *flags);
  command->add_option("--policy", flags->policy, "queue policies, comma-separated");
  command->add_option("--copies", flags->copies, "the flooding team submits each job this often")
      ->check(CLI::Range(1, 100));
  command
      ->add_option("--burst-hours", flags->burst_hours,
                   "the flooding team's jobs all arrive within this many hours (0: at their "
                   "own times)")
      ->check(CLI::Range(0.0, 10000.0));
  command
      ->add_option("--team-limit", flags->team_limit,
                   "share of the cluster either team may hold, borrowing included (0.5: no "
                   "borrowing; 1: no limit)")
      ->check(CLI::Range(0.5, 1.0));
  return SimSubcommand{command, [flags] { return RunFairnessCommand(*flags); }};
}

SimSubcommand AddSimBackfillCommand(CLI::App& sim) {
  auto flags = std::make_shared<BackfillFlags>();
  flags->from_days = 35;
  flags->days = 2;
  flags->nodes = 24;
  flags->policy = "strict-fifo,fifo,easy-backfill";
  CLI::App* command = sim.add_subcommand(
      "backfill",
      "strict FIFO against EASY backfill: queueing delay, and whether any reserved job started "
      "late");
  AddScenarioFlags(command, *flags);
  command->add_option("--policy", flags->policy, "queue policies, comma-separated");
  command
      ->add_option("--grace-seconds", flags->grace_seconds,
                   "how long a job may outrun its runtime estimate before it is killed")
      ->check(CLI::Range(int64_t{0}, int64_t{86400 * 30}));
  command
      ->add_option("--estimate-factor", flags->estimate_factor,
                   "runtime estimates are the run time times a factor drawn from [1, F] "
                   "(1: exact)")
      ->check(CLI::Range(1.0, 100.0));
  command
      ->add_option("--underestimate-share", flags->underestimate_share,
                   "share of the jobs whose estimate is below their run time (killed at their "
                   "limit)")
      ->check(CLI::Range(0.0, 1.0));
  return SimSubcommand{command, [flags] { return RunBackfillCommand(*flags); }};
}

}  // namespace gpufleet::app
