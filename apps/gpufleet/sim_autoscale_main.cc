// SPDX-License-Identifier: Apache-2.0
// `gpufleet sim autoscale`: an inference deployment under a diurnal load, scaled on measured GPU
// utilization, against static provisioning for the peak.
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>

#include <fmt/core.h>
#include <fmt/ostream.h>

#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/sim/autoscale_sim.h"

#include "flags.h"
#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct AutoscaleFlags {
  double days = 7;
  int64_t interval_seconds = 60;
  uint64_t seed = 42;
  double mean_gpus = 16;
  double amplitude = 0.6;
  double peak_hour = 14;
  double noise = 0.1;
  double noise_correlation = 0.8;
  std::string replica = "gpu";
  std::string gpu_model = "H100-80GB";
  int64_t startup_seconds = 180;
  int64_t max_queue_seconds = 120;
  int min_replicas = 2;
  int max_replicas = 100;
  double target = 0.7;
  double tolerance = 0.1;
  int64_t up_window_seconds = 0;
  int64_t down_window_seconds = 300;
  int64_t up_cooldown_seconds = 0;
  int64_t down_cooldown_seconds = 0;
  std::string json;
  std::string report;
};

int FailSimAutoscale(const Status& status) {
  fmt::print(std::cerr, "gpufleet sim autoscale: {}\n", status.ToString());
  return 1;
}

int64_t Milli(double value) {
  return std::llround(value * 1000);
}

int RunAutoscaleCommand(const AutoscaleFlags& flags) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Result<sim::ReplicaShape> replica =
      sim::ParseReplicaShape(flags.replica, catalog, flags.gpu_model);
  if (!replica.ok()) {
    return FailSimAutoscale(replica.status());
  }
  sim::AutoscaleSimOptions options;
  options.seed = flags.seed;
  options.duration_seconds = std::llround(flags.days * 86400);
  options.interval_seconds = flags.interval_seconds;
  options.mean_load_gpu_milli = Milli(flags.mean_gpus);
  options.daily_amplitude = flags.amplitude;
  options.peak_hour = flags.peak_hour;
  options.noise = flags.noise;
  options.noise_correlation = flags.noise_correlation;
  options.replica = *replica;
  options.startup_seconds = flags.startup_seconds;
  options.max_queue_seconds = flags.max_queue_seconds;
  options.autoscaler.min_replicas = flags.min_replicas;
  options.autoscaler.max_replicas = flags.max_replicas;
  options.autoscaler.target_utilization_milli = Milli(flags.target);
  options.autoscaler.tolerance_milli = Milli(flags.tolerance);
  options.autoscaler.scale_up_stabilization_seconds = flags.up_window_seconds;
  options.autoscaler.scale_down_stabilization_seconds = flags.down_window_seconds;
  options.autoscaler.scale_up_cooldown_seconds = flags.up_cooldown_seconds;
  options.autoscaler.scale_down_cooldown_seconds = flags.down_cooldown_seconds;

  fmt::print(
      "autoscale: {} days in {} s intervals, seed {}; mean load {} GPUs +-{:.0f}% (peak at {} h), "
      "noise {:.0f}%; replica {}; target {:.0f}% +-{:.0f}%\n",
      flags.days, flags.interval_seconds, flags.seed, flags.mean_gpus, 100 * flags.amplitude,
      flags.peak_hour, 100 * flags.noise, replica->label, 100 * flags.target,
      100 * flags.tolerance);
  Result<sim::AutoscaleSimResult> result = sim::RunAutoscaleSim(options);
  if (!result.ok()) {
    return FailSimAutoscale(result.status());
  }
  sim::PrintAutoscaleSummary(*result, std::cout);
  if (!flags.json.empty()) {
    const Status written = WriteOutputFile(flags.json, [&](std::ostream& out) {
      sim::WriteAutoscaleJson(*result, out);
      return Status::Ok();
    });
    if (!written.ok()) {
      return FailSimAutoscale(written);
    }
  }
  if (!flags.report.empty()) {
    const Status written = WriteOutputFile(flags.report, [&](std::ostream& out) {
      return sim::WriteAutoscaleReport(*result, "gpufleet autoscale: diurnal inference load", out);
    });
    if (!written.ok()) {
      return FailSimAutoscale(written);
    }
  }
  return 0;
}

}  // namespace

SimSubcommand AddSimAutoscaleCommand(CLI::App& sim) {
  auto flags = std::make_shared<AutoscaleFlags>();
  CLI::App* command = sim.add_subcommand(
      "autoscale",
      "an inference deployment under a diurnal load, its replicas scaled on measured GPU "
      "utilization, against static provisioning for the peak");
  command->add_option("--days", flags->days, "simulated days")->check(CLI::Range(0.01, 365.0));
  command
      ->add_option("--interval-seconds", flags->interval_seconds,
                   "measurement and decision interval")
      ->check(CLI::Range(1, 86400));
  command->add_option("--seed", flags->seed, "seed of the load noise");
  command->add_option("--mean-gpus", flags->mean_gpus, "mean load, in GPUs of work")
      ->check(CLI::Range(0.001, 1e6));
  command->add_option("--amplitude", flags->amplitude, "daily swing, as a share of the mean");
  command->add_option("--peak-hour", flags->peak_hour, "hour of the daily peak");
  command->add_option("--noise", flags->noise, "relative standard deviation of the noise");
  command->add_option("--noise-correlation", flags->noise_correlation,
                      "lag-1 correlation of the noise");
  command->add_option("--replica", flags->replica,
                      "what one replica holds: gpu, fraction:MILLI or mig:PROFILE");
  command->add_option("--gpu-model", flags->gpu_model, "GPU model for mig:PROFILE");
  command->add_option("--startup-seconds", flags->startup_seconds,
                      "time before a new replica serves");
  command->add_option("--max-queue-seconds", flags->max_queue_seconds,
                      "longest wait before work is dropped");
  command->add_option("--min-replicas", flags->min_replicas);
  command->add_option("--max-replicas", flags->max_replicas);
  command->add_option("--target", flags->target, "target GPU utilization (0.7 = 70%)");
  command->add_option("--tolerance", flags->tolerance, "no change within this share of the target");
  command->add_option("--up-window-seconds", flags->up_window_seconds,
                      "scale-up stabilization window");
  command->add_option("--down-window-seconds", flags->down_window_seconds,
                      "scale-down stabilization window");
  command->add_option("--up-cooldown-seconds", flags->up_cooldown_seconds,
                      "least time since the last change before a scale-up");
  command->add_option("--down-cooldown-seconds", flags->down_cooldown_seconds,
                      "least time since the last change before a scale-down");
  command->add_option("--json", flags->json, "write the results to this JSON file");
  command->add_option("--report", flags->report, "write a self-contained HTML report");
  return SimSubcommand{command, [flags] { return RunAutoscaleCommand(*flags); }};
}

}  // namespace gpufleet::app
