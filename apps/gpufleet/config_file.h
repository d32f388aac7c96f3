// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "gpufleet/core/status.h"

// YAML configuration files for the long-running subcommands (`gpufleet server`, `gpufleet agent`;
// docs/operations.md, "Configure"). A file is one YAML mapping whose keys are the subcommand's
// long flag names without the leading dashes (`listen: 0.0.0.0:8080` for `--listen`), so every
// flag has a key and the flags' own checks apply to the file's values.
namespace gpufleet::app {

// Flags that configure the file handling itself and have no key in a file.
inline constexpr const char* kConfigFlag = "--config";
inline constexpr const char* kPrintConfigFlag = "--print-config";

// Adds --config FILE and --print-config to `command`, and makes its options record their
// defaults so that RenderEffectiveConfig can show them. REQUIRES: called before any other option
// is added to `command`.
void AddConfigFlags(CLI::App& command);

// Applies the mapping in the YAML file `path` to the options of `command` (already parsed from
// the command line) that the command line left unset: flags override the file. A scalar sets an
// option, a sequence a repeatable option, `true` a flag (`false` leaves it unset). Each value
// passes the option's own checks, and an option's `needs` must be met by the file or the command
// line. kInvalidArgument naming the file, the line, the key and the value for an unknown key, a
// bad value or a malformed file; kNotFound naming the file when it cannot be read.
Status ApplyConfigFile(CLI::App& command, const std::string& path);

// The effective configuration of `command` as a YAML mapping in the file's format (every key,
// command line and file applied, defaults otherwise), which ApplyConfigFile reads back. Passwords
// in URLs (`postgresql://user:secret@host/db`) are shown as `***`.
std::string RenderEffectiveConfig(const CLI::App& command);

// What --config and --print-config ask of a parsed `command`: applies the file if --config named
// one, then prints the effective configuration to stdout if --print-config was given. Returns
// the exit status when the subcommand is to stop here (1 after printing the error to stderr, 0
// after printing the configuration), or nullopt when it is to run.
std::optional<int> HandleConfigFlags(CLI::App& command);

}  // namespace gpufleet::app
