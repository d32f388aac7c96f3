// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpufleet/core/status.h"
#include "gpufleet/wire/usage_cost.h"

// Flag parsing and process plumbing shared by the subcommands.
namespace gpufleet::app {

// The price table of `--prices FILE` (`server`, `dev`) in the format `report usage --prices`
// reads (cli::ParsePriceTable); nullopt for an empty path. Errors start with "--prices: ".
Result<std::optional<wire::PriceTable>> LoadPricesFlag(const std::string& path);

// The parts of a comma-separated list, empty ones included ("a,,b" has three).
std::vector<std::string> SplitList(const std::string& text);

// "all" (every name of `known`) or a comma-separated subset of `known`; kInvalidArgument naming
// --policy and the unknown name otherwise.
Result<std::vector<std::string>> ParsePolicies(const std::string& text,
                                               const std::vector<std::string>& known);

// A decimal int; kInvalidArgument naming `what` and the text otherwise.
Result<int> ParseInt(std::string_view text, std::string_view what);

// "HOST:PORT" (port 0: any free port); `flag` names the flag in errors.
Result<std::pair<std::string, int>> ParseHostPort(const std::string& text,
                                                  std::string_view flag = "--listen");

// The contents of a secret file (a token), without surrounding white space. kInvalidArgument
// naming `flag` and the path when it cannot be read or is empty.
Result<std::string> ReadSecretFile(const std::string& path, std::string_view flag);
// Writes `secret` to `path`, readable by its owner only (mode 0600, replaced atomically);
// kUnavailable naming the path.
Status WriteSecretFile(const std::string& path, std::string_view secret);

// SIGINT and SIGTERM are taken by WaitForStopSignal: call this before any thread starts so that
// every thread inherits the mask.
void BlockStopSignals();

// Waits for SIGINT or SIGTERM and returns its number; with a timeout, nullopt when it passed
// without one (a loop's tick).
int WaitForStopSignal();
std::optional<int> WaitForStopSignal(std::chrono::milliseconds timeout);

// Writes `write(stream)` to `path` and prints "wrote PATH"; a failure to open or write is
// kUnavailable naming the path.
Status WriteOutputFile(const std::string& path, const std::function<Status(std::ostream&)>& write);

}  // namespace gpufleet::app
