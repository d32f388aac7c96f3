// SPDX-License-Identifier: Apache-2.0
// `gpufleet sim fleet`: the production server and agents in one process at a size of your choosing
// under a steady load, and the wall time of the scheduling cycle and of each agent request.
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include <fmt/core.h>
#include <fmt/ostream.h>

#include "gpufleet/fleetsim/fleet_sim.h"

#include "flags.h"
#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct FleetFlags {
  fleetsim::FleetSimOptions options;
  double minutes = 5;
  double warmup_minutes = 1;
  double mean_job_minutes = 30;
  std::string json;
};

int RunFleetCommand(const FleetFlags& flags) {
  fleetsim::FleetSimOptions options = flags.options;
  const SystemClock timer;
  options.timer = &timer;
  options.duration = std::chrono::duration_cast<Duration>(
      std::chrono::duration<double, std::ratio<60>>(flags.minutes));
  options.warmup = std::chrono::duration_cast<Duration>(
      std::chrono::duration<double, std::ratio<60>>(flags.warmup_minutes));
  options.mean_job_duration = std::chrono::duration_cast<Duration>(
      std::chrono::duration<double, std::ratio<60>>(flags.mean_job_minutes));
  Result<fleetsim::FleetSimResult> result = fleetsim::RunFleetSim(options);
  if (!result.ok()) {
    fmt::print(std::cerr, "gpufleet sim fleet: {}\n", result.status().ToString());
    return 1;
  }
  fmt::print(
      "{} nodes, {} GPUs: {} jobs submitted, {} task runs, {:.1f} % of GPUs held at the "
      "end; {:.0f} simulated s in {:.1f} s ({:.2f}x)\n",
      result->nodes, result->gpus, result->jobs_submitted, result->task_runs, result->allocated_pct,
      std::chrono::duration<double>(options.duration).count(), result->wall_seconds,
      result->speedup);
  fmt::print("after the first {:.1f} simulated minutes:\n{:<16} {:>8} {:>10} {:>10} {:>10}\n",
             flags.warmup_minutes, "wall time of", "count", "p50 ms", "p99 ms", "max ms");
  const auto row = [](const std::string& name, const fleetsim::Spread& spread) {
    fmt::print("{:<16} {:>8} {:>10.2f} {:>10.2f} {:>10.2f}\n", name, spread.count, spread.p50 * 1e3,
               spread.p99 * 1e3, spread.max * 1e3);
  };
  row("simulated second", result->simulated_second);
  for (const auto& [kind, spread] : result->requests) {
    row(kind, spread);
  }
  if (!flags.json.empty()) {
    std::ofstream out(flags.json);
    out << fleetsim::FleetSimResultJson(*result).dump(2) << "\n";
    if (!out) {
      fmt::print(std::cerr, "gpufleet sim fleet: --json: cannot write {}\n", flags.json);
      return 1;
    }
  }
  return 0;
}

}  // namespace

SimSubcommand AddSimFleetCommand(CLI::App& sim) {
  auto flags = std::make_shared<FleetFlags>();
  fleetsim::FleetSimOptions& o = flags->options;
  CLI::App* command = sim.add_subcommand(
      "fleet",
      "the server and agents in one process on simulated time at a given size, under a steady "
      "load: the wall time of each cycle and agent request");
  command->add_option("--nodes", o.nodes, "nodes")->check(CLI::Range(1, 1000000));
  command->add_option("--gpus-per-node", o.gpus_per_node, "GPUs per node")
      ->check(CLI::Range(1, 64));
  command->add_option("--nodes-per-leaf", o.nodes_per_leaf, "nodes per leaf (8 leaves a block)")
      ->check(CLI::Range(1, 100000));
  command->add_option("--seed", o.seed, "seed of the load");
  command->add_option("--minutes", flags->minutes, "simulated minutes")
      ->check(CLI::Range(0.1, 10000.0));
  command
      ->add_option("--warmup-minutes", flags->warmup_minutes,
                   "simulated minutes left out of the figures (the first fill)")
      ->check(CLI::Range(0.0, 10000.0));
  command->add_option("--load", o.load, "share of the GPUs the arriving jobs ask for")
      ->check(CLI::Range(0.01, 2.0));
  command->add_option("--mean-job-minutes", flags->mean_job_minutes, "mean job duration")
      ->check(CLI::Range(0.1, 100000.0));
  command->add_option("--json", flags->json, "write the figures to this JSON file");
  return SimSubcommand{command, [flags] { return RunFleetCommand(*flags); }};
}

}  // namespace gpufleet::app
