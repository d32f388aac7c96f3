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

}  // namespace gpufleet::app
