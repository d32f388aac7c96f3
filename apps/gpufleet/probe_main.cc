// SPDX-License-Identifier: Apache-2.0
// `gpufleet probe`: reads the GPUs once, as the agent would, and prints the readings either as
// dcgm-exporter text or as a table with each GPU's health. A diagnostic: read-only.
#include <unistd.h>

#include <chrono>
#include <climits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>

#include "gpufleet/agent/cuda_exercise.h"
#include "gpufleet/agent/dcgm_metrics.h"
#include "gpufleet/agent/diagnostics.h"
#include "gpufleet/agent/gpu_probe.h"
#include "gpufleet/agent/gres_conf.h"
#include "gpufleet/agent/health.h"
#include "gpufleet/agent/nvml_probe.h"
#include "gpufleet/agent/simulated_probe.h"
#include "gpufleet/agent/telemetry.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"

#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct ProbeFlags {
  std::string backend = "nvml";
  std::string nvml_library = agent::NvmlProbe::kDefaultLibrary;
  std::string format = "table";
  std::string model = "H100-80GB";
  int gpus = 8;
  uint64_t seed = 1;
  bool gres_conf = false;
  bool diagnose = false;
  std::string cuda_library = agent::CudaExercise::kDefaultLibrary;
  int64_t pattern_mib = 256;
};

// GPM ratios need two NVML samples at least 100 ms apart.
constexpr std::chrono::milliseconds kSampleGap{250};

int FailProbe(const Status& status) {
  fmt::print(stderr, "gpufleet probe: {}\n", status.ToString());
  return 1;
}

std::string ThisHostname() {
  char name[HOST_NAME_MAX + 1] = {};
  return gethostname(name, sizeof(name)) == 0 ? std::string(name) : std::string();
}

template <typename T>
std::string Or(const std::optional<T>& value, const std::string& absent = "-") {
  return value.has_value() ? fmt::format("{}", *value) : absent;
}

void PrintTable(const agent::TelemetrySnapshot& snapshot,
                const std::vector<std::string>& missing_functions) {
  fmt::print("driver {}, CUDA {}, {} GPU(s)\n", snapshot.driver_version,
             snapshot.cuda_version.empty() ? "-" : snapshot.cuda_version, snapshot.gpus.size());
  fmt::print("{:<4} {:<40} {:<12} {:>5} {:>5} {:>15} {:>5} {:>8} {:>11} {:>8} {:<10}\n", "GPU",
             "UUID", "MODEL", "UTIL%", "MEM%", "FB USED/TOTAL", "TEMP", "POWER W", "SM/MEM MHZ",
             "XIDS", "HEALTH");
  for (const agent::GpuTelemetry& gpu : snapshot.gpus) {
    const agent::GpuStaticInfo& info = gpu.reading.info;
    const agent::GpuSample& sample = gpu.reading.sample;
    std::vector<std::string> xids;
    for (const auto& [code, count] : gpu.xid_totals) {
      xids.push_back(count > 1 ? fmt::format("{}x{}", code, count) : fmt::format("{}", code));
    }
    const std::string power = sample.power_milliwatts.has_value()
                                  ? fmt::format("{:.1f}", *sample.power_milliwatts / 1000.0)
                                  : "-";
    fmt::print(
        "{:<4} {:<40} {:<12} {:>5} {:>5} {:>15} {:>5} {:>8} {:>11} {:>8} {:<10}\n", info.index,
        info.uuid.empty() ? "-" : info.uuid, info.model.empty() ? info.nvml_name : info.model,
        Or(sample.gpu_util_percent), Or(sample.memory_copy_util_percent),
        fmt::format("{}/{}", Or(sample.fb_used_mib), info.memory_mib), Or(sample.temperature_c),
        power, fmt::format("{}/{}", Or(sample.sm_clock_mhz), Or(sample.memory_clock_mhz)),
        xids.empty() ? "-" : fmt::format("{}", fmt::join(xids, ",")),
        sample.lost ? "Lost" : GpuHealthName(gpu.health.health));
  }
  for (const agent::GpuTelemetry& gpu : snapshot.gpus) {
    const agent::GpuSample& sample = gpu.reading.sample;
    const agent::GpuStaticInfo& info = gpu.reading.info;
    std::vector<std::string> details;
    if (info.mig_enabled) {
      std::vector<std::string> instances;
      for (const agent::MigDeviceInfo& mig : info.mig_devices) {
        instances.push_back(fmt::format("{} (GI {})", mig.profile, mig.gpu_instance_id));
      }
      details.push_back(fmt::format("MIG: {}", fmt::join(instances, ", ")));
    }
    if (sample.sm_active.has_value()) {
      details.push_back(fmt::format("SM active {:.2f}, DRAM active {:.2f}, tensor active {:.2f}",
                                    *sample.sm_active, sample.dram_active.value_or(0),
                                    sample.tensor_active.value_or(0)));
    }
    if (sample.clocks_event_reasons.value_or(0) != 0) {
      details.push_back(fmt::format(
          "clock events: {}",
          fmt::join(agent::ClocksEventReasonNames(*sample.clocks_event_reasons), ", ")));
    }
    if (!gpu.health.findings.empty()) {
      details.push_back(fmt::format("health: {} (drain {})", gpu.health.Summary(),
                                    agent::DrainActionName(gpu.health.drain)));
    }
    for (const std::string& error : sample.read_errors) {
      details.push_back(fmt::format("read error: {}", error));
    }
    for (const std::string& detail : details) {
      fmt::print("gpu {}: {}\n", info.index, detail);
    }
  }
  if (!missing_functions.empty()) {
    fmt::print("NVML functions this driver lacks (their readings are absent): {}\n",
               fmt::join(missing_functions, ", "));
  }
}

// The node's gres.conf lines on stdout; what a site appends to its gres.conf for the node.
int PrintGresConf(agent::GpuProbe& probe, const std::string& hostname) {
  Result<agent::ProbeInventory> inventory = probe.Inventory();
  if (!inventory.ok()) {
    return FailProbe(inventory.status());
  }
  Result<agent::CpuCoreMap> cores = agent::ReadCpuCoreMap();
  if (!cores.ok()) {
    return FailProbe(cores.status());
  }
  const std::string short_name = hostname.substr(0, hostname.find('.'));
  Result<std::string> conf = agent::RenderGresConf(*inventory, *cores, short_name);
  if (!conf.ok()) {
    return FailProbe(conf.status());
  }
  fmt::print("{}", *conf);
  return 0;
}

// `--diagnose`: the built-in diagnostic of every GPU, as the agent runs it when the server asks
// (NVML sanity, then the memory and compute check through the CUDA driver, or the simulated
// probe's fault model). Read-only but for the check's own device memory. Exit 0 when none
// failed, 1 when one did.
int PrintDiagnostics(agent::TelemetrySampler& sampler, agent::DeviceExercise& exercise,
                     const Clock& clock) {
  agent::DiagnosticRunner runner({}, sampler, &exercise, clock);
  const size_t gpus = sampler.LatestSnapshot()->gpus.size();
  bool failed = false;
  for (size_t index = 0; index < gpus; ++index) {
    Result<agent::DiagnosticReport> report =
        runner.Run(static_cast<int>(index), agent::DiagnosticKind::kBuiltIn);
    if (!report.ok()) {
      return FailProbe(report.status());
    }
    failed = failed || report->verdict == agent::DiagnosticVerdict::kFailed;
    fmt::print("gpu {} {}: {} in {} ms\n", index, report->gpu_uuid,
               agent::DiagnosticVerdictName(report->verdict),
               std::chrono::duration_cast<std::chrono::milliseconds>(report->took).count());
    for (const agent::DiagnosticCheck& check : report->checks) {
      fmt::print("  {:<20} {:<11} {}\n", check.name, agent::DiagnosticVerdictName(check.verdict),
                 check.detail);
    }
  }
  return failed ? 1 : 0;
}

int RunProbe(const ProbeFlags& flags) {
  if (flags.format != "dcgm" && flags.format != "table") {
    return FailProbe(
        InvalidArgumentError(fmt::format("--format: \"{}\" (want dcgm or table)", flags.format)));
  }
  SystemClock clock;
  const GpuCatalog catalog = GpuCatalog::Default();
  std::unique_ptr<agent::GpuProbe> probe;
  agent::SimulatedProbe* simulated_probe = nullptr;
  std::vector<std::string> missing_functions;
  if (flags.backend == "nvml") {
    Result<std::unique_ptr<agent::NvmlProbe>> nvml =
        agent::NvmlProbe::Open({.library_path = flags.nvml_library, .catalog = &catalog});
    if (!nvml.ok()) {
      if (nvml.status().code() == StatusCode::kUnavailable) {
        fmt::print(stderr, "gpufleet probe: without a GPU, try --backend simulated\n");
      }
      return FailProbe(nvml.status());
    }
    missing_functions = (*nvml)->missing_optional_functions();
    probe = std::move(nvml).value();
  } else if (flags.backend == "simulated") {
    Result<std::unique_ptr<agent::SimulatedProbe>> simulated = agent::SimulatedProbe::Create(
        clock, catalog, {.model = flags.model, .gpu_count = flags.gpus, .seed = flags.seed});
    if (!simulated.ok()) {
      return FailProbe(simulated.status());
    }
    simulated_probe = simulated->get();
    probe = std::move(simulated).value();
  } else {
    return FailProbe(InvalidArgumentError(
        fmt::format("--backend: \"{}\" (want nvml or simulated)", flags.backend)));
  }

  const std::string hostname = ThisHostname();
  if (flags.gres_conf) {
    return PrintGresConf(*probe, hostname);
  }
  Result<std::unique_ptr<agent::TelemetrySampler>> sampler =
      agent::TelemetrySampler::Create({.probe = *probe, .clock = clock, .hostname = hostname});
  if (!sampler.ok()) {
    return FailProbe(sampler.status());
  }
  if (flags.diagnose) {
    agent::CudaExercise cuda({.library = flags.cuda_library, .pattern_mib = flags.pattern_mib});
    // A simulated probe's fault model stands in for the CUDA check.
    return PrintDiagnostics(
        **sampler,
        simulated_probe != nullptr ? static_cast<agent::DeviceExercise&>(*simulated_probe) : cuda,
        clock);
  }
  // Two samples: the first primes GPM; XIDs of both count.
  for (int i = 0; i < 2; ++i) {
    if (i > 0) {
      std::this_thread::sleep_for(kSampleGap);
    }
    if (const Status status = (*sampler)->SampleOnce(); !status.ok()) {
      return FailProbe(status);
    }
  }
  const std::shared_ptr<const agent::TelemetrySnapshot> snapshot = (*sampler)->LatestSnapshot();
  if (flags.format == "dcgm") {
    std::vector<agent::GpuReading> readings;
    for (const agent::GpuTelemetry& gpu : snapshot->gpus) {
      readings.push_back(gpu.reading);
    }
    fmt::print("{}",
               agent::RenderDcgmMetrics(
                   readings, {.hostname = hostname, .driver_version = snapshot->driver_version}));
  } else {
    PrintTable(*snapshot, missing_functions);
  }
  return 0;
}

}  // namespace

Action AddProbeCommand(CLI::App& app) {
  auto flags = std::make_shared<ProbeFlags>();
  CLI::App* probe =
      app.add_subcommand("probe", "read the GPUs once (NVML or simulated) and print the readings");
  probe->add_option("--backend", flags->backend, "nvml or simulated")
      ->capture_default_str()
      ->check(CLI::IsMember({"nvml", "simulated"}));
  probe->add_option("--nvml-library", flags->nvml_library, "NVML library to dlopen")
      ->capture_default_str();
  probe->add_option("--format", flags->format, "table or dcgm (dcgm-exporter's /metrics text)")
      ->capture_default_str()
      ->check(CLI::IsMember({"table", "dcgm"}));
  probe->add_flag("--gres-conf", flags->gres_conf,
                  "print the node's Slurm gres.conf lines instead (Name=gpu Type= File= Cores= "
                  "Links=, from NVML; docs/slurm.md)");
  probe->add_flag("--diagnose", flags->diagnose,
                  "run the built-in diagnostic on each GPU instead: NVML sanity, then a memory "
                  "pattern and compute check through the CUDA driver (exit 1 if a GPU fails)");
  probe
      ->add_option("--cuda-library", flags->cuda_library,
                   "--diagnose: the CUDA driver library to dlopen")
      ->capture_default_str();
  probe
      ->add_option("--pattern-mib", flags->pattern_mib,
                   "--diagnose: device memory the pattern check writes and reads back")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  probe->add_option("--model", flags->model, "simulated: GPU model")->capture_default_str();
  probe->add_option("--gpus", flags->gpus, "simulated: number of GPUs")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  probe->add_option("--seed", flags->seed, "simulated: seed of UUIDs and noise")
      ->capture_default_str();
  return [flags] { return RunProbe(*flags); };
}

}  // namespace gpufleet::app
