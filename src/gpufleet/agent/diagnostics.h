// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/agent/gpu_probe.h"
#include "gpufleet/agent/telemetry.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"

// Active diagnostics of one GPU (docs/reliability.md, "Active diagnostics"): the agent looks at a
// suspect instead of waiting for more failed jobs. A diagnostic is either the site's command
// (e.g. `dcgmi diag -r 2 -i {gpu_index}`: its exit code is the verdict) or the built-in check:
// NVML sanity from a fresh sample, then an exercise of the device (a memory pattern and a compute
// kernel through the CUDA driver, or the simulated probe's fault model).
namespace gpufleet::agent {

enum class DiagnosticVerdict { kPassed, kFailed, kUnavailable };
const char* DiagnosticVerdictName(DiagnosticVerdict verdict);  // "passed", "failed", "unavailable"

// One finding of a diagnostic, e.g. {"nvml.ecc", kFailed, "2 uncorrectable ECC errors"}.
struct DiagnosticCheck {
  std::string name;
  DiagnosticVerdict verdict = DiagnosticVerdict::kPassed;
  std::string detail;

  friend bool operator==(const DiagnosticCheck&, const DiagnosticCheck&) = default;
};

// Failed when any check failed, passed when any passed (and none failed), unavailable otherwise
// (no check could run: nothing is known of the device).
DiagnosticVerdict CombinedVerdict(const std::vector<DiagnosticCheck>& checks);

// The most of a site command's output a report keeps (its end, where tools print the verdict).
inline constexpr size_t kMaxDiagnosticOutputBytes = 4096;

enum class DiagnosticKind { kBuiltIn, kCommand };
const char* DiagnosticKindName(DiagnosticKind kind);  // "builtin", "command"
// kInvalidArgument naming `field` and the text for anything but the two names.
Result<DiagnosticKind> ParseDiagnosticKind(std::string_view text, std::string_view field);

struct DiagnosticReport {
  int gpu_index = 0;
  std::string gpu_uuid;
  DiagnosticKind kind = DiagnosticKind::kBuiltIn;
  DiagnosticVerdict verdict = DiagnosticVerdict::kUnavailable;
  std::vector<DiagnosticCheck> checks;
  std::optional<int> exit_code;  // the site command's; absent for the built-in check
  std::string output;            // the command's stdout and stderr, the last bytes only
  Duration took{0};

  // "failed: nvml.ecc: 2 uncorrectable ECC errors; cuda.pattern: 12 words differ"; the checks
  // that decided the verdict (all of them when it passed).
  std::string Summary() const;
};

// NVML sanity of one GPU from its latest telemetry: it answers (not lost, no failed reads), and
// the health rules' findings on ECC, row remapping and retired pages, XIDs since its last reset,
// and clock-event reasons. A finding that makes the GPU Unhealthy fails its check; a Degraded
// one passes with the finding as its detail (a diagnostic confirms faults, it does not invent
// them).
std::vector<DiagnosticCheck> NvmlSanityChecks(const GpuTelemetry& gpu);

// Exercises a device beyond reading it. Implementations: CudaExercise (cuda_exercise.h), the
// simulated probe's fault model (SimulatedProbe). Thread-safe: the node agent diagnoses
// different GPUs at once.
class DeviceExercise {
 public:
  virtual ~DeviceExercise() = default;
  // The checks of one run on `gpu`; an exercise that cannot run says so as an unavailable check.
  virtual std::vector<DiagnosticCheck> Exercise(const GpuStaticInfo& gpu) = 0;
};

struct DiagnosticOptions {
  // The site's diagnostic command, argv with {gpu_index}, {gpu_uuid} and {pci_bus_id} replaced
  // by the device's (other braces are left alone); empty: none configured (a command diagnostic
  // is then unavailable).
  std::vector<std::string> command;
  // SIGKILL after this; a command that ran out of time fails its diagnostic.
  Duration command_timeout = std::chrono::minutes(15);

  // kInvalidArgument naming diagnostic_command and the argument with a misspelt placeholder
  // ("{gpu...}" or "{pci...}" that is none of the three), or a timeout that is not positive.
  Status Validate() const;
};

// `argv` with the placeholders replaced for `gpu`. kInvalidArgument naming a misspelt one.
Result<std::vector<std::string>> SubstituteDiagnosticCommand(const std::vector<std::string>& argv,
                                                             const GpuStaticInfo& gpu);

// Runs diagnostics on the node's GPUs, each call to its end: the node agent calls it from a
// thread per diagnostic, `gpufleet probe --diagnose` directly. Thread-safe: it keeps no state of
// its own, and the sampler and the exercise are thread-safe.
class DiagnosticRunner {
 public:
  // REQUIRES: `options` validate. `telemetry`, `exercise` (nullable: the built-in check then
  // only reads NVML) and `clock` must outlive the runner.
  DiagnosticRunner(DiagnosticOptions options, TelemetrySampler& telemetry, DeviceExercise* exercise,
                   const Clock& clock);

  // One diagnostic of GPU `gpu_index`. kInvalidArgument for an index the node lacks; every
  // other trouble is a check in the report (a command that cannot start is unavailable).
  Result<DiagnosticReport> Run(int gpu_index, DiagnosticKind kind);

 private:
  std::vector<DiagnosticCheck> BuiltIn(const GpuTelemetry& gpu);
  std::vector<DiagnosticCheck> Command(const GpuStaticInfo& gpu, DiagnosticReport& report);

  const DiagnosticOptions options_;
  TelemetrySampler& telemetry_;
  DeviceExercise* exercise_;
  const Clock& clock_;
};

}  // namespace gpufleet::agent
