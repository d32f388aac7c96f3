// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/diagnostics.h"

#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>

#include "gpufleet/agent/health.h"
#include "gpufleet/os/command.h"

extern char** environ;  // NOLINT: POSIX's

namespace gpufleet::agent {
namespace {

constexpr std::string_view kPlaceholders[] = {"{gpu_index}", "{gpu_uuid}", "{pci_bus_id}"};

std::string PlaceholderValue(std::string_view placeholder, const GpuStaticInfo& gpu) {
  if (placeholder == "{gpu_index}") {
    return std::to_string(gpu.index);
  }
  return placeholder == "{gpu_uuid}" ? gpu.uuid : gpu.pci_bus_id;
}

// `argument` with each known placeholder replaced (through `gpu` when given). Other braces stay
// (a shell command's own, `awk '{print $1}'`), except one that looks like a placeholder of ours
// misspelt ("{gpu_id}"): that is an error.
Result<std::string> Substitute(std::string_view argument, const GpuStaticInfo* gpu) {
  std::string out;
  size_t at = 0;
  while (at < argument.size()) {
    const size_t open = argument.find('{', at);
    if (open == std::string_view::npos) {
      out.append(argument.substr(at));
      break;
    }
    out.append(argument.substr(at, open - at));
    const size_t close = argument.find('}', open);
    const std::string_view braced = argument.substr(
        open, close == std::string_view::npos ? std::string_view::npos : close - open + 1);
    const bool known = std::find(std::begin(kPlaceholders), std::end(kPlaceholders), braced) !=
                       std::end(kPlaceholders);
    if (known) {
      out.append(gpu != nullptr ? PlaceholderValue(braced, *gpu) : std::string(braced));
    } else if (braced.starts_with("{gpu") || braced.starts_with("{pci")) {
      return InvalidArgumentError(fmt::format(
          "diagnostic_command: \"{}\": unknown placeholder \"{}\" (valid: {{gpu_index}}, "
          "{{gpu_uuid}}, {{pci_bus_id}})",
          argument, braced));
    } else {
      out.append(braced);
    }
    at = open + braced.size();
  }
  return out;
}

std::string LastBytes(std::string text, size_t limit) {
  return text.size() <= limit ? text : text.substr(text.size() - limit);
}

}  // namespace

const char* DiagnosticVerdictName(DiagnosticVerdict verdict) {
  switch (verdict) {
    case DiagnosticVerdict::kPassed:
      return "passed";
    case DiagnosticVerdict::kFailed:
      return "failed";
    case DiagnosticVerdict::kUnavailable:
      break;
  }
  return "unavailable";
}

const char* DiagnosticKindName(DiagnosticKind kind) {
  return kind == DiagnosticKind::kCommand ? "command" : "builtin";
}

Result<DiagnosticKind> ParseDiagnosticKind(std::string_view text, std::string_view field) {
  if (text == "builtin") {
    return DiagnosticKind::kBuiltIn;
  }
  if (text == "command") {
    return DiagnosticKind::kCommand;
  }
  return InvalidArgumentError(
      fmt::format("{}: unknown \"{}\" (valid: builtin, command)", field, text));
}

DiagnosticVerdict CombinedVerdict(const std::vector<DiagnosticCheck>& checks) {
  DiagnosticVerdict verdict = DiagnosticVerdict::kUnavailable;
  for (const DiagnosticCheck& check : checks) {
    if (check.verdict == DiagnosticVerdict::kFailed) {
      return DiagnosticVerdict::kFailed;
    }
    if (check.verdict == DiagnosticVerdict::kPassed) {
      verdict = DiagnosticVerdict::kPassed;
    }
  }
  return verdict;
}

std::string DiagnosticReport::Summary() const {
  std::vector<std::string> parts;
  for (const DiagnosticCheck& check : checks) {
    if (verdict == DiagnosticVerdict::kPassed || check.verdict == verdict) {
      parts.push_back(check.detail.empty() ? check.name
                                           : fmt::format("{}: {}", check.name, check.detail));
    }
  }
  return fmt::format("{}: {}", DiagnosticVerdictName(verdict), fmt::join(parts, "; "));
}

std::vector<DiagnosticCheck> NvmlSanityChecks(const GpuTelemetry& gpu) {
  const GpuSample& sample = gpu.reading.sample;
  std::vector<DiagnosticCheck> checks;
  if (sample.lost) {
    checks.push_back({"nvml.responds", DiagnosticVerdict::kFailed,
                      "the GPU does not answer (fallen off the bus)"});
  } else if (!sample.temperature_c.has_value() && !sample.power_milliwatts.has_value() &&
             !sample.fb_used_mib.has_value()) {
    checks.push_back({"nvml.responds", DiagnosticVerdict::kFailed,
                      sample.read_errors.empty()
                          ? std::string("no reading: temperature, power and memory all absent")
                          : fmt::format("no reading: {}", fmt::join(sample.read_errors, "; "))});
  } else {
    checks.push_back({"nvml.responds", DiagnosticVerdict::kPassed,
                      sample.temperature_c.has_value()
                          ? fmt::format("temperature {} C", *sample.temperature_c)
                          : std::string("readings present")});
  }
  for (const HealthFinding& finding : gpu.health.findings) {
    if (finding.rule == "lost") {
      continue;  // nvml.responds said it
    }
    checks.push_back({"nvml." + finding.rule,
                      finding.health == GpuHealth::kUnhealthy ? DiagnosticVerdict::kFailed
                                                              : DiagnosticVerdict::kPassed,
                      finding.reason});
  }
  if (gpu.health.findings.empty()) {
    checks.push_back({"nvml.health", DiagnosticVerdict::kPassed,
                      "no ECC, row-remap, XID, thermal or clock-event finding"});
  }
  return checks;
}

Status DiagnosticOptions::Validate() const {
  if (command_timeout <= Duration::zero()) {
    return InvalidArgumentError(fmt::format(
        "diagnostic_timeout: {} ms (must be positive)",
        std::chrono::duration_cast<std::chrono::milliseconds>(command_timeout).count()));
  }
  for (const std::string& argument : command) {
    GPUFLEET_RETURN_IF_ERROR(Substitute(argument, nullptr).status());
  }
  return Status();
}

Result<std::vector<std::string>> SubstituteDiagnosticCommand(const std::vector<std::string>& argv,
                                                             const GpuStaticInfo& gpu) {
  std::vector<std::string> out;
  for (const std::string& argument : argv) {
    GPUFLEET_ASSIGN_OR_RETURN(std::string replaced, Substitute(argument, &gpu));
    out.push_back(std::move(replaced));
  }
  return out;
}

DiagnosticRunner::DiagnosticRunner(DiagnosticOptions options, TelemetrySampler& telemetry,
                                   DeviceExercise* exercise, const Clock& clock)
    : options_(std::move(options)), telemetry_(telemetry), exercise_(exercise), clock_(clock) {}

Result<DiagnosticReport> DiagnosticRunner::Run(int gpu_index, DiagnosticKind kind) {
  const MonoTime start = clock_.Now();
  // A fresh sample for the built-in check: the verdict is about the GPU now.
  const Status sampled = kind == DiagnosticKind::kBuiltIn ? telemetry_.SampleOnce() : Status();
  const std::shared_ptr<const TelemetrySnapshot> snapshot = telemetry_.LatestSnapshot();
  if (gpu_index < 0 || static_cast<size_t>(gpu_index) >= snapshot->gpus.size()) {
    return InvalidArgumentError(fmt::format("diagnostic: gpu_index: {} (the node has {} GPUs)",
                                            gpu_index, snapshot->gpus.size()));
  }
  const GpuTelemetry& gpu = snapshot->gpus[static_cast<size_t>(gpu_index)];
  DiagnosticReport report;
  report.gpu_index = gpu_index;
  report.gpu_uuid = gpu.reading.info.uuid;
  report.kind = kind;
  if (kind == DiagnosticKind::kCommand) {
    report.checks = Command(gpu.reading.info, report);
  } else if (!sampled.ok()) {
    report.checks.push_back({"nvml.responds", DiagnosticVerdict::kUnavailable,
                             fmt::format("no sample: {}", sampled.message())});
  } else {
    report.checks = BuiltIn(gpu);
  }
  report.verdict = CombinedVerdict(report.checks);
  report.took = clock_.Now() - start;
  return report;
}

std::vector<DiagnosticCheck> DiagnosticRunner::BuiltIn(const GpuTelemetry& gpu) {
  std::vector<DiagnosticCheck> checks = NvmlSanityChecks(gpu);
  if (checks.front().verdict != DiagnosticVerdict::kPassed) {
    return checks;  // a GPU that does not answer cannot be exercised
  }
  if (exercise_ == nullptr) {
    checks.push_back(
        {"exercise", DiagnosticVerdict::kUnavailable, "no device exercise on this node"});
    return checks;
  }
  for (DiagnosticCheck& check : exercise_->Exercise(gpu.reading.info)) {
    checks.push_back(std::move(check));
  }
  return checks;
}

std::vector<DiagnosticCheck> DiagnosticRunner::Command(const GpuStaticInfo& gpu,
                                                       DiagnosticReport& report) {
  if (options_.command.empty()) {
    return {{"command", DiagnosticVerdict::kUnavailable,
             "no diagnostic command configured (--diagnostic-command)"}};
  }
  Result<std::vector<std::string>> argv = SubstituteDiagnosticCommand(options_.command, gpu);
  if (!argv.ok()) {
    return {{"command", DiagnosticVerdict::kUnavailable, argv.status().message()}};
  }
  os::CommandSpec spec;
  spec.argv = *std::move(argv);
  // The tool finds its own libraries and daemons (dcgmi, nv-hostengine) through our environment;
  // the GPU under test is the only one CUDA shows it.
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (!std::string_view(*entry).starts_with("CUDA_VISIBLE_DEVICES=")) {
      spec.env.emplace_back(*entry);
    }
  }
  spec.env.push_back("CUDA_VISIBLE_DEVICES=" + gpu.uuid);
  spec.timeout = options_.command_timeout;
  const std::string command = fmt::format("{}", fmt::join(spec.argv, " "));
  Result<os::CommandOutcome> outcome = os::RunCommand(spec, clock_);
  if (!outcome.ok()) {
    return {{"command", DiagnosticVerdict::kUnavailable,
             fmt::format("{}: {}", command, outcome.status().message())}};
  }
  report.exit_code = outcome->exit_code;
  report.output = LastBytes(outcome->output + outcome->errors, kMaxDiagnosticOutputBytes);
  if (outcome->exit_code == 127) {
    return {{"command", DiagnosticVerdict::kUnavailable,
             fmt::format("{}: {}", command, os::LastLine(outcome->errors))}};
  }
  if (outcome->timed_out) {
    return {
        {"command", DiagnosticVerdict::kFailed,
         fmt::format(
             "{}: timed out after {} s", command,
             std::chrono::duration_cast<std::chrono::seconds>(options_.command_timeout).count())}};
  }
  if (outcome->exit_code != 0) {
    const std::string why = os::LastLine(report.output);
    return {{"command", DiagnosticVerdict::kFailed,
             why.empty() ? fmt::format("{}: exit {}", command, outcome->exit_code)
                         : fmt::format("{}: exit {}: {}", command, outcome->exit_code, why)}};
  }
  return {{"command", DiagnosticVerdict::kPassed, fmt::format("{}: exit 0", command)}};
}

}  // namespace gpufleet::agent
