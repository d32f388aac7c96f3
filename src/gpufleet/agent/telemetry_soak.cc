// SPDX-License-Identifier: Apache-2.0
// The telemetry sampler as the agent runs it, for bench/agent_telemetry.sh: NVML (the fake
// library by default, scripted with healthy H100s) sampled at an interval by the sampler's
// thread, /metrics served on loopback, until SIGINT or SIGTERM. Prints "port N" once serving.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "gpufleet/agent/nvml_probe.h"
#include "gpufleet/agent/telemetry.h"
#include "gpufleet/agent/testing/fake_nvml.h"
#include "gpufleet/core/clock.h"

int main(int argc, char** argv) {
  using namespace std::chrono_literals;  // NOLINT(google-build-using-namespace)
  CLI::App app{"agent_telemetry_soak: the telemetry sampler over the fake NVML"};
  int gpus = 8;
  int interval_ms = 1000;
  std::string library = GPUFLEET_FAKE_NVML_PATH;
  app.add_option("--gpus", gpus, "GPUs in the fake's script")->check(CLI::Range(1, 64));
  app.add_option("--interval-ms", interval_ms, "sampling interval")->check(CLI::Range(10, 60000));
  app.add_option("--nvml-library", library, "the fake NVML library");
  CLI11_PARSE(app, argc, argv);

  auto fake = gpufleet::agent::testing::FakeNvml::Open(library);
  if (!fake.ok()) {
    fmt::print(stderr, "{}\n", fake.status().ToString());
    return 1;
  }
  if (const gpufleet::Status loaded =
          (*fake)->LoadScript(gpufleet::agent::testing::HealthyH100Script(gpus));
      !loaded.ok()) {
    fmt::print(stderr, "{}\n", loaded.ToString());
    return 1;
  }
  auto probe = gpufleet::agent::NvmlProbe::Open({.library_path = library});
  if (!probe.ok()) {
    fmt::print(stderr, "{}\n", probe.status().ToString());
    return 1;
  }
  gpufleet::SystemClock clock;
  auto sampler =
      gpufleet::agent::TelemetrySampler::Create({.probe = **probe,
                                                 .clock = clock,
                                                 .interval = std::chrono::milliseconds(interval_ms),
                                                 .hostname = "soak"});
  if (!sampler.ok()) {
    fmt::print(stderr, "{}\n", sampler.status().ToString());
    return 1;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto port = (*sampler)->Start("127.0.0.1", 0);
  if (!port.ok()) {
    fmt::print(stderr, "{}\n", port.status().ToString());
    return 1;
  }
  fmt::print("port {}\n", *port);
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  (*sampler)->Stop();
  fmt::print("samples {}\n", (*sampler)->LatestSnapshot()->sample_count);
  return 0;
}
