// SPDX-License-Identifier: Apache-2.0
// `gpufleet sim chaos`: the production control plane and agents in one process on simulated time,
// under thousands of seeded fault schedules, checked against the control plane's invariants
// (docs/simulation.md).
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include "gpufleet/fleetsim/chaos.h"

#include "flags.h"
#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct ChaosFlags {
  std::string seeds = "1-100";
  std::string plant = "none";
  std::string json;
  bool events = false;
  double fault_minutes = 10;
  int threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
};

int FailChaos(const Status& status) {
  fmt::print(std::cerr, "gpufleet sim chaos: {}\n", status.ToString());
  return 2;
}

// "A-B" or "A".
Result<std::pair<uint64_t, uint64_t>> ParseSeedRange(const std::string& text) {
  const size_t dash = text.find('-');
  try {
    size_t used = 0;
    const uint64_t first = std::stoull(text.substr(0, dash), &used);
    if (used != (dash == std::string::npos ? text.size() : dash)) {
      throw std::invalid_argument(text);
    }
    if (dash == std::string::npos) {
      return std::make_pair(first, first);
    }
    const std::string rest = text.substr(dash + 1);
    const uint64_t last = std::stoull(rest, &used);
    if (used != rest.size() || last < first) {
      throw std::invalid_argument(text);
    }
    return std::make_pair(first, last);
  } catch (const std::exception&) {
    return InvalidArgumentError(
        fmt::format("--seeds: \"{}\" (want FIRST-LAST with FIRST <= LAST, or one seed)", text));
  }
}

int RunChaosCommand(const ChaosFlags& flags) {
  Result<std::pair<uint64_t, uint64_t>> seeds = ParseSeedRange(flags.seeds);
  if (!seeds.ok()) {
    return FailChaos(seeds.status());
  }
  Result<fleetsim::PlantedBug> planted = fleetsim::ParsePlantedBug(flags.plant);
  if (!planted.ok()) {
    return FailChaos(planted.status());
  }
  fleetsim::ChaosOptions options;
  options.planted = *planted;
  options.keep_events = flags.events;
  options.fault_phase = std::chrono::duration_cast<Duration>(
      std::chrono::duration<double, std::ratio<60>>(flags.fault_minutes));
  if (flags.events && seeds->first == seeds->second) {
    // One seed replayed: its events, whether or not it fails.
    Result<fleetsim::SeedOutcome> outcome = fleetsim::RunChaosSeed(seeds->first, options);
    if (!outcome.ok()) {
      return FailChaos(outcome.status());
    }
    fmt::print("{}seed {}: {} violations\n  {}\n", outcome->events, outcome->seed,
               outcome->violations.size(), fmt::join(outcome->violations, "\n  "));
    return outcome->violations.empty() ? 0 : 1;
  }
  Result<fleetsim::ChaosReport> report =
      fleetsim::RunChaos(seeds->first, seeds->second, options, flags.threads);
  if (!report.ok()) {
    return FailChaos(report.status());
  }
  for (const fleetsim::SeedOutcome& outcome : report->failing) {
    fmt::print("seed {} FAILED:\n  {}\nreplay: {}\nlast events:\n{}\n", outcome.seed,
               fmt::join(outcome.violations, "\n  "), outcome.replay, outcome.events);
  }
  std::string faults;
  for (const auto& [kind, count] : report->faults) {
    faults += fmt::format("{}{} {}", faults.empty() ? "" : ", ", kind, count);
  }
  fmt::print("seeds {}-{}: {} violations in {} seeds; {} jobs, {} task runs; faults: {}\n",
             seeds->first, seeds->second, report->violations, report->failing.size(), report->jobs,
             report->task_runs, faults);
  if (!flags.json.empty()) {
    std::ofstream out(flags.json);
    out << fleetsim::ChaosReportJson(*report).dump(2) << "\n";
    if (!out) {
      return FailChaos(UnavailableError(fmt::format("--json: cannot write {}", flags.json)));
    }
  }
  return report->violations == 0 ? 0 : 1;
}

}  // namespace

SimSubcommand AddSimChaosCommand(CLI::App& sim) {
  auto flags = std::make_shared<ChaosFlags>();
  CLI::App* command = sim.add_subcommand(
      "chaos",
      "the control plane and agents under seeded faults on simulated time, checked against its "
      "invariants (exit 1 on a violation)");
  command->add_option("--seeds", flags->seeds, "seeds to run, FIRST-LAST (default 1-100)");
  command->add_option("--json", flags->json,
                      "write {seeds, violations, faults, jobs, task_runs, failing} to this file");
  command->add_flag("--events", flags->events,
                    "print the events of a single seed (with --seeds N-N), failing or not");
  command->add_option("--plant", flags->plant,
                      "run with a planted bug (none, early-release, skipped-fence, lost-write, "
                      "unfenced-commits, short-fence-grace): "
                      "the harness must catch it");
  command
      ->add_option("--fault-minutes", flags->fault_minutes,
                   "simulated minutes of faults and submissions per seed (then it heals)")
      ->check(CLI::Range(0.5, 600.0));
  command->add_option("--threads", flags->threads, "seeds run on this many threads")
      ->check(CLI::Range(1, 256));
  return SimSubcommand{command, [flags] { return RunChaosCommand(*flags); }};
}

}  // namespace gpufleet::app
