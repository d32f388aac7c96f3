// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "gpufleet/core/status.h"
#include "gpufleet/fabric/fabric.h"

// Each subcommand registers its flags on `app` and returns the action to run when chosen.
namespace gpufleet::app {

using Action = std::function<int()>;

const char* BuildVersion();
const char* BuildCommit();

Action AddSimCommand(CLI::App& app);

// A subcommand of `gpufleet sim` defined in its own file: the command, and what to run when it
// was chosen.
struct SimSubcommand {
  CLI::App* command = nullptr;
  Action run;
};
// `gpufleet sim failures` (sim_failures_main.cc).
SimSubcommand AddSimFailuresCommand(CLI::App& sim);
// `gpufleet sim mig` (sim_mig_main.cc).
SimSubcommand AddSimMigCommand(CLI::App& sim);
// `gpufleet sim autoscale` (sim_autoscale_main.cc).
SimSubcommand AddSimAutoscaleCommand(CLI::App& sim);
// `gpufleet sim fairness` and `gpufleet sim backfill` (sim_queues_main.cc).
SimSubcommand AddSimFairnessCommand(CLI::App& sim);
SimSubcommand AddSimBackfillCommand(CLI::App& sim);
// `gpufleet sim interactive` (sim_interactive_main.cc).
SimSubcommand AddSimInteractiveCommand(CLI::App& sim);
// `gpufleet sim coldstart` (sim_coldstart_main.cc).
SimSubcommand AddSimColdStartCommand(CLI::App& sim);
// `gpufleet sim chaos` (sim_chaos_main.cc).
SimSubcommand AddSimChaosCommand(CLI::App& sim);
// `gpufleet sim fleet` (sim_fleet_main.cc).
SimSubcommand AddSimFleetCommand(CLI::App& sim);

// `gpufleet server`: the REST API and the scheduling loop (server_main.cc).
Action AddServerCommand(CLI::App& app);

// `gpufleet agent`: the node agent (agent_main.cc); `gpufleet dev`: a simulated fleet on this
// machine (dev_main.cc).
Action AddAgentCommand(CLI::App& app);
Action AddDevCommand(CLI::App& app);

// `gpufleet admin backup|restore`: the SQLite store copied out and back (admin_main.cc).
Action AddAdminCommand(CLI::App& app);

// `gpufleet probe`: one reading of the GPUs, NVML or simulated (probe_main.cc).
Action AddProbeCommand(CLI::App& app);

// `gpufleet fabric`: check, generate, import/export Slurm, ecmp, cost (fabric_main.cc).
Action AddFabricCommand(CLI::App& app);
// A fabric from a YAML description, or from a Slurm topology.conf when the name ends in ".conf";
// errors name the file and line.
Result<std::shared_ptr<const fabric::Fabric>> LoadFabricFile(const std::string& path);
// The description before it is built; `from_slurm` for a topology.conf, whose nodes' hardware
// the file does not say (SlurmImportOptions' defaults fill it in).
struct LoadedFabricSpec {
  fabric::FabricSpec spec;
  bool from_slurm = false;
};
Result<LoadedFabricSpec> LoadFabricSpecFile(const std::string& path);

// `gpufleet completion bash`: a completion script of every subcommand and flag
// (completion_main.cc).
Action AddCompletionCommand(CLI::App& app);

// The client verbs (`submit`, `get`, `describe`, `cancel`, `create`, `revoke`, node operations),
// all in the help group kCliGroup; the action runs whichever of them was chosen.
inline constexpr char kCliGroup[] = "Client commands";
Action AddCliCommands(CLI::App& app);

}  // namespace gpufleet::app
