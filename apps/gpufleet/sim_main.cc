// SPDX-License-Identifier: Apache-2.0
// `gpufleet sim`: replays traces against placement policies.
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include <fmt/core.h>
#include <fmt/ostream.h>

#include "gpufleet/scheduler/registry.h"
#include "gpufleet/sim/fill.h"
#include "gpufleet/sim/fill_report.h"
#include "gpufleet/sim/openb.h"

#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct FillFlags {
  std::string data_dir = GPUFLEET_DEFAULT_DATA_DIR;
  std::string nodes;
  std::string pods;
  std::string policies = "all";
  std::string seeds = "42-51";
  double load = 1.3;
  int threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  std::string out;
};

// "42-51" or "1,2,7".
Result<std::vector<uint64_t>> ParseSeeds(const std::string& text) {
  std::vector<uint64_t> seeds;
  auto number = [&](std::string_view part) -> Result<uint64_t> {
    uint64_t value = 0;
    const auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || error != std::errc() || end != part.data() + part.size()) {
      return InvalidArgumentError(fmt::format("--seeds: \"{}\" is not a number", part));
    }
    return value;
  };
  if (const size_t dash = text.find('-'); dash != std::string::npos) {
    GPUFLEET_ASSIGN_OR_RETURN(const uint64_t first, number(std::string_view(text).substr(0, dash)));
    GPUFLEET_ASSIGN_OR_RETURN(const uint64_t last, number(std::string_view(text).substr(dash + 1)));
    if (last < first || last - first > 1000) {
      return InvalidArgumentError(fmt::format("--seeds: bad range \"{}\"", text));
    }
    for (uint64_t seed = first; seed <= last; ++seed) {
      seeds.push_back(seed);
    }
    return seeds;
  }
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    GPUFLEET_ASSIGN_OR_RETURN(const uint64_t seed,
                              number(std::string_view(text).substr(begin, comma - begin)));
    seeds.push_back(seed);
    begin = comma + 1;
  }
  return seeds;
}

Result<std::vector<std::string>> ParsePolicies(const std::string& text) {
  const std::vector<std::string>& known = scheduler::PlacementPolicyNames();
  if (text == "all") {
    return known;
  }
  std::vector<std::string> policies;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    std::string name = text.substr(begin, comma - begin);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return InvalidArgumentError(fmt::format("--policies: unknown policy \"{}\" (known: {})", name,
                                              fmt::join(known, ", ")));
    }
    policies.push_back(std::move(name));
    begin = comma + 1;
  }
  return policies;
}

int Fail(const Status& status) {
  fmt::print(std::cerr, "gpufleet sim: {}\n", status.ToString());
  return 1;
}

int RunFillCommand(const FillFlags& flags) {
  auto seeds = ParseSeeds(flags.seeds);
  if (!seeds.ok()) {
    return Fail(seeds.status());
  }
  auto policies = ParsePolicies(flags.policies);
  if (!policies.ok()) {
    return Fail(policies.status());
  }
  GpuCatalog catalog = GpuCatalog::Default();
  const std::string nodes_path =
      flags.nodes.empty() ? flags.data_dir + "/openb/openb_node_list_gpu_node.csv" : flags.nodes;
  const std::string pods_path =
      flags.pods.empty() ? flags.data_dir + "/openb/openb_pod_list_default.csv" : flags.pods;
  auto cluster = sim::LoadOpenbNodes(nodes_path, catalog);
  if (!cluster.ok()) {
    return Fail(cluster.status());
  }
  auto pods = sim::LoadOpenbPods(pods_path, catalog);
  if (!pods.ok()) {
    return Fail(pods.status());
  }
  fmt::print(
      "fill: {} nodes, {} pods from {}; policies {}; seeds {}; load target {}x; {} threads\n",
      cluster->nodes.size(), pods->size(), pods_path, fmt::join(*policies, ","), flags.seeds,
      flags.load, flags.threads);
  sim::FillOptions options;
  options.load_target = flags.load;
  auto results =
      sim::RunFillMatrix(*cluster, *pods, catalog, *policies, *seeds, options, flags.threads);
  if (!results.ok()) {
    return Fail(results.status());
  }
  const std::vector<sim::FillPolicySummary> summaries = sim::SummarizeFill(*results);
  sim::PrintFillSummary(summaries, std::cout);
  if (!flags.out.empty()) {
    std::error_code error;
    std::filesystem::create_directories(flags.out, error);
    std::ofstream series(flags.out + "/fill_series.csv");
    std::ofstream summary(flags.out + "/fill_summary.txt");
    if (error || !series || !summary) {
      return Fail(UnavailableError(fmt::format("--out: cannot write to {}", flags.out)));
    }
    sim::WriteFillSeries(*results, series);
    sim::PrintFillSummary(summaries, summary);
    fmt::print("wrote {}/fill_series.csv and {}/fill_summary.txt\n", flags.out, flags.out);
  }
  return 0;
}

}  // namespace

Action AddSimCommand(CLI::App& app) {
  CLI::App* sim = app.add_subcommand("sim", "replay traces against placement policies");
  sim->require_subcommand(1);
  auto flags = std::make_shared<FillFlags>();
  CLI::App* fill = sim->add_subcommand(
      "fill", "the FGD (ATC'23) experiment: fill the openb cluster to 130% of its GPUs");
  fill->add_option("--data-dir", flags->data_dir, "directory of the bundled traces");
  fill->add_option("--nodes", flags->nodes, "openb node list (default: the bundled one)");
  fill->add_option("--pods", flags->pods, "openb pod list (default: the bundled default trace)");
  fill->add_option("--policies", flags->policies,
                   "comma-separated policies or \"all\": random, dot-prod, gpu-clustering, "
                   "gpu-packing, best-fit, fgd");
  fill->add_option("--seeds", flags->seeds, "seeds: a range \"42-51\" or a list \"1,2\"");
  fill->add_option("--load", flags->load, "arrived load to stop at, times GPU capacity")
      ->check(CLI::Range(0.01, 10.0));
  fill->add_option("--threads", flags->threads, "runs in parallel")->check(CLI::Range(1, 256));
  fill->add_option("--out", flags->out, "directory for fill_series.csv and fill_summary.txt");
  return [flags, fill] {
    if (fill->parsed()) {
      return RunFillCommand(*flags);
    }
    return 2;
  };
}

}  // namespace gpufleet::app
