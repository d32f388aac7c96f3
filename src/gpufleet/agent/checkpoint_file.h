// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gpufleet/core/status.h"

// A task's checkpoint reports (docs/job-spec.md, "Checkpoints"): after each checkpoint it saves,
// the task appends a line "UNIX_SECONDS[ ANYTHING]" to the file named in its environment
// (runner::kCheckpointFileEnv); the agent reads the file's last complete line at each report and
// sends the time in its heartbeat. The file is the task's to write, so the reader trusts nothing in
// it: it reads a bounded tail, never follows a symbolic link and never waits on a FIFO.
namespace gpufleet::agent {

// A line longer than this is ignored ("line too long"); the reader reads at most twice this
// much of the file's end.
inline constexpr size_t kMaxCheckpointLineBytes = 256;

// What the last read of a checkpoint file found.
struct CheckpointRead {
  // The file's size and modification time: a file with the same ones is not read again.
  int64_t size = 0;
  int64_t mtime_ns = 0;
  // The time of the last complete line, when it is well formed.
  std::optional<int64_t> unix_seconds;
  // Why the last complete line was ignored ("not a number", "out of range", "line too long"), or
  // the file refused ("a symbolic link", "not a regular file"); empty when neither, or when the
  // file has no complete line yet.
  std::string rejected;
};

// The time a checkpoint line gives: decimal Unix seconds in 1..wire::kMaxCheckpointUnixSeconds,
// perhaps with a fraction (dropped), then the line's end or a space or tab and anything. The
// error's message is the reason, e.g. "not a number", "out of range".
Result<int64_t> ParseCheckpointLine(std::string_view line);

// Reads the last complete ('\n'-ended) line of the checkpoint file at `path`; a last line still
// being written is left for the next read. A symbolic link or a file that is not a regular file
// is refused, not read (CheckpointRead::rejected). kNotFound when there is no file; kUnavailable
// when it cannot be read.
Result<CheckpointRead> ReadCheckpointFile(const std::string& path);

}  // namespace gpufleet::agent
