// SPDX-License-Identifier: Apache-2.0
// `gpufleet sim coldstart`: how long gangs wait for their container images, pulled from a
// registry, from peers, or placed where the image already is (docs/containers.md).
#include <cmath>
#include <iostream>
#include <memory>

#include <fmt/core.h>
#include <fmt/ostream.h>

#include "gpufleet/sim/coldstart_sim.h"

#include "flags.h"
#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct ColdStartFlags {
  sim::ColdStartOptions options;
  double image_gb = 0;
  double chunk_mib = 64;
  double cache_gb = 200;
  std::string json;
  std::string report;
};

int RunColdStartCommand(const ColdStartFlags& flags) {
  sim::ColdStartOptions options = flags.options;
  options.chunk_bytes = std::llround(flags.chunk_mib * (1 << 20));
  options.cache_bytes = std::llround(flags.cache_gb * 1e9);
  if (flags.image_gb > 0) {
    options.images = {sim::LayeredImage("image", std::llround(flags.image_gb * 1e9))};
  }
  Result<sim::ColdStartResult> result = sim::RunColdStartSim(std::move(options));
  if (!result.ok()) {
    fmt::print(std::cerr, "gpufleet sim coldstart: {}\n", result.status().ToString());
    return 1;
  }
  sim::PrintColdStartSummary(*result, std::cout);
  if (!flags.json.empty()) {
    const Status written = WriteOutputFile(flags.json, [&](std::ostream& out) {
      sim::WriteColdStartJson(*result, out);
      return Status::Ok();
    });
    if (!written.ok()) {
      fmt::print(std::cerr, "gpufleet sim coldstart: {}\n", written.ToString());
      return 1;
    }
  }
  if (!flags.report.empty()) {
    const Status written = WriteOutputFile(
        flags.report, [&](std::ostream& out) { return sim::WriteColdStartReport(*result, out); });
    if (!written.ok()) {
      fmt::print(std::cerr, "gpufleet sim coldstart: {}\n", written.ToString());
      return 1;
    }
  }
  return 0;
}

}  // namespace

SimSubcommand AddSimColdStartCommand(CLI::App& sim) {
  auto flags = std::make_shared<ColdStartFlags>();
  sim::ColdStartOptions& o = flags->options;
  CLI::App* command = sim.add_subcommand(
      "coldstart",
      "gang start time and registry bytes when images come from the registry, from peers, and "
      "with placement that prefers nodes holding the image");
  command->add_option("--seed", o.seed, "seed of the gangs and placements");
  command->add_option("--fleet-nodes", o.fleet_nodes, "nodes in the fleet")
      ->check(CLI::Range(1, 100000));
  command->add_option("--gangs", o.gangs, "gangs, one after another")->check(CLI::Range(1, 100000));
  command->add_option("--gang-nodes", o.gang_nodes,
                      "nodes per gang (0: drawn from 1 to 128, small gangs more often)");
  command->add_option("--image-gb", flags->image_gb,
                      "every gang uses one image of this size (0: a mix of NGC-sized images)");
  command->add_option("--registry-gbps", o.registry_gbps, "registry egress, Gb/s");
  command->add_option("--node-gbps", o.node_gbps, "each node's link, Gb/s each way");
  command->add_option("--chunk-mib", flags->chunk_mib, "transfer unit, MiB");
  command->add_option("--cache-gb", flags->cache_gb, "image cache per node, GB");
  command->add_option("--unpack-gbps", o.unpack_gbytes_per_second,
                      "unpacking rate per node, GB/s (0: not modelled)");
  command->add_option("--json", flags->json, "write the results, gang by gang, to this JSON file");
  command->add_option("--report", flags->report,
                      "write a self-contained HTML report with the start-time and egress charts");
  return SimSubcommand{command, [flags] { return RunColdStartCommand(*flags); }};
}

}  // namespace gpufleet::app
