// SPDX-License-Identifier: Apache-2.0
// `gpufleet sim mig`: a MIG demand whose mix shifts over the day, served by a fixed layout, by
// the scheduler alone and by the scheduler with the MIG repartitioning planner.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <fmt/ostream.h>

#include "gpufleet/sim/mig_sim.h"

#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct MigFlags {
  std::string nodes = "H100-80GB:4,A100-40GB:2";
  int gpus_per_node = 8;
  double days = 3;
  uint64_t seed = 42;
  double load = 0.85;
  double mean_minutes = 60;
  double patience_minutes = 120;
  std::string layout = "7|4,3|7|3,2,1,1|4,3|7|3,2,1,1|2,2,2,1";
  double replan_minutes = 5;
  int max_plan_requests = 64;
  int64_t search_budget = 20000;
  std::string mode = "all";
  std::string report;
  int threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
};

int FailSimMig(const Status& status) {
  fmt::print(std::cerr, "gpufleet sim mig: {}\n", status.ToString());
  return 1;
}

int64_t WholeSeconds(double value) {
  return static_cast<int64_t>(std::llround(value));
}

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t from = 0;
  while (true) {
    const size_t at = text.find(separator, from);
    parts.push_back(text.substr(from, at == std::string::npos ? std::string::npos : at - from));
    if (at == std::string::npos) {
      return parts;
    }
    from = at + 1;
  }
}

Result<int> ParseCount(const std::string& flag, const std::string& text) {
  if (text.empty() || text.size() > 6 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" is not a whole number", flag, text));
  }
  return std::stoi(text);
}

// "H100-80GB:4,A100-40GB:2"
Result<std::vector<sim::MigNodeGroup>> ParseNodes(const std::string& text) {
  std::vector<sim::MigNodeGroup> groups;
  for (const std::string& part : Split(text, ',')) {
    const size_t colon = part.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return InvalidArgumentError(
          fmt::format("--nodes: \"{}\" is not MODEL:COUNT (e.g. H100-80GB:4)", part));
    }
    GPUFLEET_ASSIGN_OR_RETURN(const int count, ParseCount("--nodes", part.substr(colon + 1)));
    groups.push_back({part.substr(0, colon), count});
  }
  return groups;
}

// "7|4,3|3,2,1,1": instance sizes per GPU, patterns separated by '|'.
Result<std::vector<std::vector<int>>> ParseLayout(const std::string& text) {
  std::vector<std::vector<int>> patterns;
  for (const std::string& pattern : Split(text, '|')) {
    std::vector<int> sizes;
    for (const std::string& size : Split(pattern, ',')) {
      GPUFLEET_ASSIGN_OR_RETURN(const int value, ParseCount("--layout", size));
      sizes.push_back(value);
    }
    patterns.push_back(std::move(sizes));
  }
  return patterns;
}

int RunMigCommand(const MigFlags& flags) {
  std::vector<sim::MigMode> modes;
  if (flags.mode == "all") {
    modes = {sim::MigMode::kFixed, sim::MigMode::kCreateOnly, sim::MigMode::kRepartition};
  } else if (flags.mode == "fixed") {
    modes = {sim::MigMode::kFixed};
  } else if (flags.mode == "create-only") {
    modes = {sim::MigMode::kCreateOnly};
  } else if (flags.mode == "repartition") {
    modes = {sim::MigMode::kRepartition};
  } else {
    return FailSimMig(InvalidArgumentError(fmt::format(
        "--mode: \"{}\" (must be all, fixed, create-only or repartition)", flags.mode)));
  }
  sim::MigSimOptions options;
  Result<std::vector<sim::MigNodeGroup>> groups = ParseNodes(flags.nodes);
  if (!groups.ok()) {
    return FailSimMig(groups.status());
  }
  Result<std::vector<std::vector<int>>> layout = ParseLayout(flags.layout);
  if (!layout.ok()) {
    return FailSimMig(layout.status());
  }
  options.node_groups = *groups;
  options.initial_layout = *layout;
  options.seed = flags.seed;
  options.duration_seconds = WholeSeconds(flags.days * 86400);
  options.gpus_per_node = flags.gpus_per_node;
  options.load = flags.load;
  options.mean_duration_seconds = WholeSeconds(flags.mean_minutes * 60);
  options.patience_seconds = WholeSeconds(flags.patience_minutes * 60);
  options.replan_interval_seconds = WholeSeconds(flags.replan_minutes * 60);
  options.max_plan_requests = flags.max_plan_requests;
  options.planner.search_budget = flags.search_budget;

  const GpuCatalog catalog = GpuCatalog::Default();
  const Status valid = options.Validate(catalog);
  if (!valid.ok()) {
    return FailSimMig(valid);
  }
  fmt::print(
      "mig: {} x {} GPUs per node, {} days, seed {}, load {}, mean run {} min, patience {} "
      "min, replan every {} min\n",
      flags.nodes, flags.gpus_per_node, flags.days, flags.seed, flags.load, flags.mean_minutes,
      flags.patience_minutes, flags.replan_minutes);
  Result<std::vector<sim::MigSimResult>> results = std::vector<sim::MigSimResult>();
  if (modes.size() == 3) {
    results = sim::RunMigSims(options, catalog, flags.threads);
  } else {
    Result<sim::MigSimResult> run = sim::RunMigSim(options, modes[0], catalog);
    if (run.ok()) {
      results = std::vector<sim::MigSimResult>{std::move(run).value()};
    } else {
      results = run.status();
    }
  }
  if (!results.ok()) {
    return FailSimMig(results.status());
  }
  sim::PrintMigSummary(*results, std::cout);
  if (!flags.report.empty()) {
    std::ofstream out(flags.report);
    if (!out) {
      return FailSimMig(UnavailableError(fmt::format("{}: cannot open for writing", flags.report)));
    }
    const Status written = sim::WriteMigReport(*results, options, "gpufleet sim mig", out);
    if (!written.ok()) {
      return FailSimMig(UnavailableError(fmt::format("{}: {}", flags.report, written.message())));
    }
    fmt::print("wrote {}\n", flags.report);
  }
  return 0;
}

}  // namespace

SimSubcommand AddSimMigCommand(CLI::App& sim) {
  auto flags = std::make_shared<MigFlags>();
  CLI::App* command = sim.add_subcommand(
      "mig",
      "a MIG demand whose mix shifts over the day: a fixed layout, the scheduler alone, and the "
      "scheduler with MIG repartitioning");
  command->add_option("--nodes", flags->nodes,
                      "node groups MODEL:COUNT,... (default H100-80GB:4,A100-40GB:2)");
  command->add_option("--gpus-per-node", flags->gpus_per_node)->check(CLI::Range(1, 64));
  command->add_option("--days", flags->days, "simulated days")->check(CLI::Range(0.01, 365.0));
  command->add_option("--seed", flags->seed, "seed of every random draw");
  command->add_option("--load", flags->load, "offered compute slices / all slices");
  command->add_option("--mean-minutes", flags->mean_minutes, "mean task run time");
  command->add_option("--patience-minutes", flags->patience_minutes,
                      "a task that waits longer leaves unserved");
  command->add_option("--layout", flags->layout,
                      "initial layout: instance sizes per GPU, patterns in turn (7|4,3|3,2,1,1)");
  command->add_option("--replan-minutes", flags->replan_minutes,
                      "how often the planner runs while tasks wait");
  command->add_option("--max-plan-requests", flags->max_plan_requests,
                      "oldest waiting tasks the planner plans for");
  command->add_option("--search-budget", flags->search_budget, "planner search steps per plan");
  command->add_option("--mode", flags->mode, "all (default), fixed, create-only or repartition");
  command->add_option("--report", flags->report, "write a self-contained HTML report");
  command->add_option("--threads", flags->threads, "runs in parallel")->check(CLI::Range(1, 256));
  return SimSubcommand{command, [flags] { return RunMigCommand(*flags); }};
}

}  // namespace gpufleet::app
