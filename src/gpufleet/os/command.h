// SPDX-License-Identifier: Apache-2.0
// Runs a helper program (podman, scontrol) to its end and collects what it printed: the one way
// the runners and the agent run a command.
#pragma once

#include <string>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"

namespace gpufleet::os {

struct CommandOutcome {
  // The exit status; -1 when a signal ended the program (the timeout's SIGKILL among them).
  int exit_code = -1;
  bool timed_out = false;
  std::string output;  // stdout, unless redirected
  std::string errors;  // stderr, unless redirected; the last kMaxCapturedBytes
};

inline constexpr size_t kMaxCapturedBytes = 1 << 20;

struct CommandSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH when it has no '/'
  // The program's whole environment, "NAME=VALUE" entries.
  std::vector<std::string> env;
  // When >= 0: the program's stdout and stderr (nothing is captured then); stdin is /dev/null.
  int output_fd = -1;
  // Descriptors the program inherits besides 0, 1 and 2 (e.g. an --env-file as /dev/fd/N).
  std::vector<int> inherited_fds;
  Duration timeout = std::chrono::seconds(60);
};

// Starts the program and waits for its end, at most `timeout` on `clock` (then SIGKILL; the
// outcome says timed_out). kUnavailable when it cannot be started at all (fork, pipes); a program
// that is not found exits 127 with the reason in `errors`. Thread-safe; reaps only its own child.
Result<CommandOutcome> RunCommand(const CommandSpec& spec, const Clock& clock);

// The last non-empty line of `text`, trimmed; "" when there is none. For error messages.
std::string LastLine(std::string_view text);

}  // namespace gpufleet::os
