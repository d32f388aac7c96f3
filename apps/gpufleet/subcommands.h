// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

// Each subcommand registers its flags on `app` and returns the action to run when chosen.
namespace gpufleet::app {

using Action = std::function<int()>;

const char* BuildVersion();
const char* BuildCommit();

Action AddSimCommand(CLI::App& app);

// `gpufleet server`: the REST API and the scheduling loop (server_main.cc).
Action AddServerCommand(CLI::App& app);

// The client verbs (`submit`, `get`, `describe`, `cancel`, node operations), all in the help
// group kCliGroup; the action runs whichever of them was chosen.
inline constexpr char kCliGroup[] = "Client commands";
Action AddCliCommands(CLI::App& app);

}  // namespace gpufleet::app
