// SPDX-License-Identifier: Apache-2.0
// `gpufleet fabric`: checks, generates, converts and simulates network fabrics (docs/fabric.md).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include "gpufleet/core/random.h"
#include "gpufleet/fabric/analysis.h"
#include "gpufleet/fabric/collective.h"
#include "gpufleet/fabric/ecmp.h"
#include "gpufleet/fabric/fabric.h"
#include "gpufleet/fabric/fabric_yaml.h"
#include "gpufleet/fabric/generators.h"
#include "gpufleet/fabric/hostlist.h"
#include "gpufleet/fabric/slurm.h"
#include "gpufleet/fabric/units.h"

#include "subcommands.h"

namespace gpufleet::app {
namespace {

int FailFabric(const Status& status) {
  fmt::print(std::cerr, "gpufleet fabric: {}\n", status.message());
  return 1;
}

Result<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return NotFoundError(fmt::format("{}: cannot open", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes `text` to `path`, or to stdout when `path` is empty or "-".
Status Emit(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    fmt::print("{}", text);
    return Status::Ok();
  }
  std::ofstream out(path);
  out << text;
  out.flush();
  if (!out) {
    return UnavailableError(fmt::format("{}: cannot write", path));
  }
  fmt::print(std::cerr, "wrote {}\n", path);
  return Status::Ok();
}

bool IsSlurmFile(const std::string& path) {
  return path.size() >= 5 && path.substr(path.size() - 5) == ".conf";
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "1GiB", "512MiB", "8G", "4096" (bytes).
Result<int64_t> ParseBytes(const std::string& text) {
  static const std::pair<std::string_view, int64_t> kUnits[] = {{"GiB", int64_t{1} << 30},
                                                                {"MiB", int64_t{1} << 20},
                                                                {"KiB", int64_t{1} << 10},
                                                                {"GB", 1000000000},
                                                                {"MB", 1000000},
                                                                {"KB", 1000},
                                                                {"G", 1000000000},
                                                                {"M", 1000000},
                                                                {"K", 1000},
                                                                {"B", 1}};
  std::string_view number = text;
  int64_t scale = 1;
  for (const auto& [suffix, bytes] : kUnits) {
    if (number.size() > suffix.size() && number.substr(number.size() - suffix.size()) == suffix) {
      number.remove_suffix(suffix.size());
      scale = bytes;
      break;
    }
  }
  double value = 0;
  const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || error != std::errc() || end != number.data() + number.size() ||
      !(value > 0) || value * static_cast<double>(scale) > 1e15) {
    return InvalidArgumentError(fmt::format("--size: \"{}\" is not a size (e.g. 1GiB)", text));
  }
  return static_cast<int64_t>(value * static_cast<double>(scale));
}

struct GenerateFlags {
  std::string output;
  // yaml, slurm-tree or slurm-block: what `generate` writes.
  std::string format = "yaml";
  fabric::SuperpodOptions superpod;
  bool no_ufm = false;
  fabric::ClosOptions clos;
  std::string nic_speed = "400G";
  std::string uplink_speed = "400G";
  fabric::Nvl72Options nvl72;
};

struct SlurmFlags {
  std::string input;
  std::string output;
  std::string kind = "tree";
  fabric::SlurmImportOptions import;
  std::string link_speed = "400G";
};

// Which GPUs a collective runs on.
struct PlacementFlags {
  std::string file;
  std::string nodes;      // hostlist
  int gpus = 0;           // or: this many GPUs chosen by `placement`
  int gpus_per_node = 0;  // 0: every GPU of each node
  std::string placement = "packed";
  uint64_t seed = 1;
  std::string collective = "all-reduce";
};

struct EcmpFlags : PlacementFlags {
  int queue_pairs = 1;
  int trials = 10;
  std::string hash = "per-tier";
};

struct CostFlags : PlacementFlags {
  std::string size = "1GiB";
};

// --nodes, or --gpus with packed (fabric order), spread (round-robin over leaf domains) or random.
Result<std::vector<fabric::PlacedGpus>> ChoosePlacement(const fabric::Fabric& fabric,
                                                        const PlacementFlags& flags,
                                                        std::string* description) {
  std::vector<fabric::PlacedGpus> placement;
  auto per_node = [&](int node) {
    const int gpus = fabric.nodes()[node].gpus;
    return flags.gpus_per_node > 0 ? std::min(gpus, flags.gpus_per_node) : gpus;
  };
  if (!flags.nodes.empty()) {
    GPUFLEET_ASSIGN_OR_RETURN(const std::vector<std::string> names,
                              fabric::ExpandHostlist(flags.nodes));
    for (const std::string& name : names) {
      const int node = fabric.FindNode(name);
      if (node < 0) {
        return InvalidArgumentError(fmt::format("--nodes: unknown node \"{}\"", name));
      }
      if (per_node(node) > 0) {
        placement.push_back({node, per_node(node)});
      }
    }
    *description = fmt::format("nodes {}", flags.nodes);
    return placement;
  }
  if (flags.gpus < 1) {
    return InvalidArgumentError("give --nodes HOSTLIST or --gpus N");
  }
  std::vector<int> order;
  for (size_t n = 0; n < fabric.nodes().size(); ++n) {
    if (per_node(static_cast<int>(n)) > 0) {
      order.push_back(static_cast<int>(n));
    }
  }
  if (flags.placement == "spread" && fabric.TierCount() > 0) {
    // Deal nodes round-robin over the leaf domains.
    std::vector<std::vector<int>> by_domain(fabric.DomainCount(0));
    for (int n : order) {
      by_domain[fabric.DomainOf(0, n)].push_back(n);
    }
    order.clear();
    for (size_t i = 0; order.size() < fabric.nodes().size(); ++i) {
      bool any = false;
      for (const std::vector<int>& domain : by_domain) {
        if (i < domain.size()) {
          order.push_back(domain[i]);
          any = true;
        }
      }
      if (!any) {
        break;
      }
    }
  } else if (flags.placement == "random") {
    Random random(flags.seed);
    random.Shuffle(order);
  } else if (flags.placement != "packed" && flags.placement != "spread") {
    return InvalidArgumentError(fmt::format(
        "--placement: unknown \"{}\" (known: packed, spread, random)", flags.placement));
  }
  int left = flags.gpus;
  for (int n : order) {
    if (left == 0) {
      break;
    }
    const int take = std::min(left, per_node(n));
    placement.push_back({n, take});
    left -= take;
  }
  if (left > 0) {
    return InvalidArgumentError(
        fmt::format("--gpus: {} asked, the fabric has {}", flags.gpus, flags.gpus - left));
  }
  *description = fmt::format("{} GPUs, {}", flags.gpus, flags.placement);
  return placement;
}

int RunCheck(const std::string& path) {
  auto loaded = LoadFabricFile(path);
  if (!loaded.ok()) {
    return FailFabric(loaded.status());
  }
  fmt::print("{}", fabric::FormatReport(fabric::Analyze(**loaded)));
  return 0;
}

// Writes `spec` after checking that it builds: as YAML with `origin` as the first comment line,
// or as the Slurm topology.conf (`slurm-tree`, `slurm-block`) a site would install for it.
int WriteSpec(const Result<fabric::FabricSpec>& spec, const std::string& origin,
              const std::string& output, const std::string& format = "yaml") {
  if (!spec.ok()) {
    return FailFabric(spec.status());
  }
  auto built = fabric::Fabric::Build(*spec);
  if (!built.ok()) {
    return FailFabric(built.status());
  }
  std::string text;
  if (format == "yaml") {
    text = fmt::format("# {}\n{}", origin, fabric::WriteFabricYaml(*spec));
  } else {
    auto exported = fabric::ExportSlurmTopology(*built, format == "slurm-block"
                                                            ? fabric::SlurmTopologyKind::kBlock
                                                            : fabric::SlurmTopologyKind::kTree);
    if (!exported.ok()) {
      return FailFabric(exported.status());
    }
    text = fmt::format("# {}\n{}", origin, *exported);
  }
  const Status written = Emit(output, text);
  return written.ok() ? 0 : FailFabric(written);
}

int RunImportSlurm(const SlurmFlags& flags) {
  auto text = ReadText(flags.input);
  if (!text.ok()) {
    return FailFabric(text.status());
  }
  fabric::SlurmImportOptions options = flags.import;
  auto speed = fabric::ParseSpeedMbps(flags.link_speed, "--link-speed");
  if (!speed.ok()) {
    return FailFabric(speed.status());
  }
  options.link_speed_mbps = *speed;
  return WriteSpec(
      fabric::ImportSlurmTopology(*text, BaseName(flags.input), options),
      fmt::format("imported from Slurm {} by gpufleet fabric import-slurm", flags.input),
      flags.output);
}

int RunExportSlurm(const SlurmFlags& flags) {
  if (flags.kind != "tree" && flags.kind != "block") {
    return FailFabric(InvalidArgumentError(
        fmt::format("--kind: unknown \"{}\" (known: tree, block)", flags.kind)));
  }
  auto loaded = LoadFabricFile(flags.input);
  if (!loaded.ok()) {
    return FailFabric(loaded.status());
  }
  auto text = fabric::ExportSlurmTopology(**loaded, flags.kind == "tree"
                                                        ? fabric::SlurmTopologyKind::kTree
                                                        : fabric::SlurmTopologyKind::kBlock);
  if (!text.ok()) {
    return FailFabric(text.status());
  }
  const Status written = Emit(flags.output, *text);
  return written.ok() ? 0 : FailFabric(written);
}

// The highest uplinks a placement's traffic climbs through.
std::string TierLabel(const fabric::Fabric& fabric, int common_tier) {
  if (common_tier < 0) {
    return "none, one NVLink domain";
  }
  if (common_tier == 0) {
    return fmt::format("none, every rank under one {} domain", fabric.tiers()[0]);
  }
  if (common_tier >= fabric.TierCount()) {
    return "all, and no tier joins the ranks";
  }
  return fabric.tiers()[common_tier - 1];
}

int RunEcmp(const EcmpFlags& flags) {
  auto loaded = LoadFabricFile(flags.file);
  if (!loaded.ok()) {
    return FailFabric(loaded.status());
  }
  const fabric::Fabric& fabric = **loaded;
  auto collective = fabric::ParseCollective(flags.collective);
  if (!collective.ok()) {
    return FailFabric(collective.status());
  }
  if (flags.hash != "per-tier" && flags.hash != "per-switch") {
    return FailFabric(InvalidArgumentError(
        fmt::format("--hash: unknown \"{}\" (known: per-tier, per-switch)", flags.hash)));
  }
  std::string description;
  auto placement = ChoosePlacement(fabric, flags, &description);
  if (!placement.ok()) {
    return FailFabric(placement.status());
  }
  const std::vector<fabric::Flow> flows = fabric::CollectiveFlows(fabric, *placement, *collective);
  fmt::print(
      "ecmp: {} on {} nodes ({}); {} flows, {} queue pair(s) per connection, hash seeds {}, "
      "{} trial(s)\n",
      fabric::CollectiveName(*collective), placement->size(), description, flows.size(),
      flags.queue_pairs, flags.hash, flags.trials);
  if (flows.empty()) {
    fmt::print("no network traffic: the placement is one node\n");
    return 0;
  }
  struct Stat {
    double sum = 0;
    double low = 1e300;
    double high = -1e300;
    void Add(double value) {
      sum += value;
      low = std::min(low, value);
      high = std::max(high, value);
    }
  };
  Stat slowest;
  Stat mean;
  Stat ideal;
  Stat collective_ratio;
  Stat aggregate_ratio;
  Stat used;
  Stat shared;
  Stat busiest;
  Stat colliding;
  int network_flows = 0;
  int candidates = 0;
  for (int trial = 0; trial < flags.trials; ++trial) {
    fabric::EcmpOptions options;
    options.queue_pairs = flags.queue_pairs;
    options.seed = flags.seed + static_cast<uint64_t>(trial);
    options.seeds =
        flags.hash == "per-tier" ? fabric::HashSeeds::kPerTier : fabric::HashSeeds::kPerSwitch;
    auto result = fabric::SimulateEcmp(fabric, flows, options);
    if (!result.ok()) {
      return FailFabric(result.status());
    }
    network_flows = result->network_flows;
    candidates = result->fabric_links;
    slowest.Add(result->min_flow_gbps);
    mean.Add(result->mean_flow_gbps);
    ideal.Add(result->ideal_flow_gbps);
    collective_ratio.Add(result->collective_ratio);
    aggregate_ratio.Add(result->aggregate_ratio);
    used.Add(result->fabric_links_used);
    shared.Add(result->fabric_links_shared);
    busiest.Add(result->max_subflows_per_link);
    colliding.Add(result->colliding_flows);
  }
  const double trials = flags.trials;
  fmt::print(
      "{} of the {} flows leave their leaf; {} switch-to-switch links are ECMP "
      "candidates\n\n",
      network_flows, flows.size(), candidates);
  fmt::print("{:<34} {:>10} {:>10} {:>10}\n", "per trial", "mean", "min", "max");
  auto row = [&](const char* label, const Stat& stat, const char* format) {
    fmt::print("{:<34} {:>10} {:>10} {:>10}\n", label,
               fmt::format(fmt::runtime(format), stat.sum / trials),
               fmt::format(fmt::runtime(format), stat.low),
               fmt::format(fmt::runtime(format), stat.high));
  };
  row("ideal per-flow rate (Gb/s)", ideal, "{:.1f}");
  row("slowest flow, ECMP (Gb/s)", slowest, "{:.1f}");
  row("mean flow, ECMP (Gb/s)", mean, "{:.1f}");
  row("collective throughput / ideal", collective_ratio, "{:.3f}");
  row("aggregate throughput / ideal", aggregate_ratio, "{:.3f}");
  row("links used", used, "{:.1f}");
  row("links with 2+ subflows", shared, "{:.1f}");
  row("subflows on the busiest link", busiest, "{:.1f}");
  row("flows sharing a link", colliding, "{:.1f}");
  fmt::print(
      "\nideal = traffic spread evenly over every equal-cost path (adaptive routing, packet "
      "spraying); the collective moves at its slowest flow\n");
  return 0;
}

int RunCost(const CostFlags& flags) {
  auto loaded = LoadFabricFile(flags.file);
  if (!loaded.ok()) {
    return FailFabric(loaded.status());
  }
  const fabric::Fabric& fabric = **loaded;
  auto collective = fabric::ParseCollective(flags.collective);
  if (!collective.ok()) {
    return FailFabric(collective.status());
  }
  auto bytes = ParseBytes(flags.size);
  if (!bytes.ok()) {
    return FailFabric(bytes.status());
  }
  std::string description;
  auto placement = ChoosePlacement(fabric, flags, &description);
  if (!placement.ok()) {
    return FailFabric(placement.status());
  }
  auto shape = fabric::ShapeOf(fabric, *placement);
  if (!shape.ok()) {
    return FailFabric(shape.status());
  }
  const fabric::CollectiveEstimate estimate =
      fabric::EstimateCollective(*collective, *bytes, *shape);
  const fabric::PlacementShape ideal_shape = fabric::CompactShape(fabric, shape->ranks);
  const fabric::CollectiveEstimate ideal =
      fabric::EstimateCollective(*collective, *bytes, ideal_shape);
  fmt::print("{} of {} per rank on {} GPUs ({}): {} NVLink domain(s) of >= {} GPUs\n",
             fabric::CollectiveName(*collective), flags.size, shape->ranks, description,
             shape->domains, shape->gpus_per_domain);
  fmt::print("  highest uplinks crossed: {}; path oversubscription {}\n",
             TierLabel(fabric, shape->common_tier),
             fabric::FormatRatio(shape->path_oversubscription));
  fmt::print("  {}: {:.3f} ms, algbw {:.1f} GB/s, busbw {:.1f} GB/s", estimate.algorithm,
             estimate.seconds * 1e3, estimate.algbw_gbytes, estimate.busbw_gbytes);
  if (estimate.network_gbytes_per_gpu > 0) {
    fmt::print(", network {:.1f} GB/s per GPU", estimate.network_gbytes_per_gpu);
  }
  fmt::print("\n  tightest placement of {} GPUs: {:.3f} ms ({}); this one takes {:.2f}x\n",
             shape->ranks, ideal.seconds * 1e3, ideal.algorithm,
             ideal.seconds > 0 ? estimate.seconds / ideal.seconds : 1.0);
  return 0;
}

void AddPlacementFlags(CLI::App* command, PlacementFlags& flags) {
  command->add_option("file", flags.file, "fabric (YAML, or Slurm topology.conf)")->required();
  command->add_option("--nodes", flags.nodes, "the nodes, as a hostlist, in rank order");
  command->add_option("--gpus", flags.gpus, "or this many GPUs, chosen by --placement");
  command->add_option("--gpus-per-node", flags.gpus_per_node, "GPUs used per node (default all)");
  command->add_option("--placement", flags.placement,
                      "packed (fabric order), spread (round-robin over leaf domains) or random");
  command->add_option("--seed", flags.seed, "seed for random placement and source ports");
  command->add_option("--collective", flags.collective,
                      "all-reduce, all-gather, reduce-scatter or all-to-all");
}

}  // namespace

Result<LoadedFabricSpec> LoadFabricSpecFile(const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(const std::string text, ReadText(path));
  const std::string name = BaseName(path);
  const bool from_slurm = IsSlurmFile(path);
  GPUFLEET_ASSIGN_OR_RETURN(fabric::FabricSpec spec, from_slurm
                                                         ? fabric::ImportSlurmTopology(text, name)
                                                         : fabric::ParseFabricYaml(text, name));
  return LoadedFabricSpec{std::move(spec), from_slurm};
}

Result<std::shared_ptr<const fabric::Fabric>> LoadFabricFile(const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(LoadedFabricSpec loaded, LoadFabricSpecFile(path));
  GPUFLEET_ASSIGN_OR_RETURN(fabric::Fabric built, fabric::Fabric::Build(std::move(loaded.spec)));
  return std::make_shared<const fabric::Fabric>(std::move(built));
}

Action AddFabricCommand(CLI::App& app) {
  CLI::App* command =
      app.add_subcommand("fabric", "check, generate, convert and simulate network fabrics");
  command->require_subcommand(1);

  auto check_file = std::make_shared<std::string>();
  CLI::App* check = command->add_subcommand(
      "check", "oversubscription per tier, bisection bandwidth, switch and cable counts");
  check->add_option("file", *check_file, "fabric (YAML, or Slurm topology.conf)")->required();

  auto generate_flags = std::make_shared<GenerateFlags>();
  CLI::App* generate = command->add_subcommand(
      "generate", "write a reference design as YAML or Slurm topology.conf");
  generate->require_subcommand(1);
  CLI::App* superpod =
      generate->add_subcommand("superpod", "NVIDIA DGX H100 SuperPOD, rail-optimized");
  superpod->add_option("--sus", generate_flags->superpod.scalable_units,
                       "scalable units of 32 nodes (1 to 8)");
  superpod->add_option("--radix", generate_flags->superpod.radix, "switch ports (default 64)");
  superpod->add_flag("--no-ufm", generate_flags->no_ufm, "no UFM appliance in SU 1");
  CLI::App* clos = generate->add_subcommand("clos", "2- or 3-tier folded Clos");
  fabric::ClosOptions& c = generate_flags->clos;
  clos->add_option("--tiers", c.tiers, "2 or 3");
  clos->add_option("--pods", c.pods, "pods under the core (3 tiers)");
  clos->add_option("--leaves", c.leaves_per_pod, "leaves (per pod)");
  clos->add_option("--nodes-per-leaf", c.nodes_per_leaf, "nodes under each leaf");
  clos->add_option("--gpus-per-node", c.gpus_per_node, "GPUs per node");
  clos->add_option("--nics-per-node", c.nics_per_node, "NIC ports per node");
  clos->add_option("--nic-speed", generate_flags->nic_speed, "NIC port speed (400G)");
  clos->add_option("--uplink-speed", generate_flags->uplink_speed, "switch-to-switch speed");
  clos->add_option("--oversubscription", c.leaf_oversubscription, "leaf down:up, e.g. 3 for 3:1");
  clos->add_option("--spine-oversubscription", c.spine_oversubscription, "spine down:up (3 tiers)");
  clos->add_option("--radix", c.radix, "switch ports");
  clos->add_option("--gpu-model", c.gpu_model, "GPU model");
  clos->add_option("--name", c.name, "fabric name");
  CLI::App* nvl72 = generate->add_subcommand("nvl72", "GB200 NVL72 racks, rail-optimized");
  nvl72->add_option("--racks", generate_flags->nvl72.racks, "racks of 18 trays x 4 GPUs");
  nvl72->add_option("--radix", generate_flags->nvl72.radix, "switch ports");
  nvl72->add_option("--oversubscription", generate_flags->nvl72.leaf_oversubscription,
                    "leaf down:up");
  for (CLI::App* sub : {superpod, clos, nvl72}) {
    sub->add_option("-o,--output", generate_flags->output, "write here instead of stdout");
    sub->add_option("--format", generate_flags->format,
                    "yaml (default), slurm-tree (topology.conf for topology/tree) or slurm-block "
                    "(topology/block, Slurm 23.11+: a block per NVLink domain, else per leaf)")
        ->check(CLI::IsMember({"yaml", "slurm-tree", "slurm-block"}));
  }

  auto slurm_flags = std::make_shared<SlurmFlags>();
  CLI::App* import_slurm =
      command->add_subcommand("import-slurm", "Slurm topology.conf (tree or block) to YAML");
  import_slurm->add_option("file", slurm_flags->input, "topology.conf")->required();
  import_slurm->add_option("-o,--output", slurm_flags->output, "write here instead of stdout");
  import_slurm->add_option("--gpus-per-node", slurm_flags->import.gpus_per_node, "GPUs per node");
  import_slurm->add_option("--gpu-model", slurm_flags->import.gpu_model, "GPU model");
  import_slurm->add_option("--nics-per-node", slurm_flags->import.nics_per_node, "NICs per node");
  import_slurm->add_option("--link-speed", slurm_flags->link_speed, "speed of every cable");
  CLI::App* export_slurm =
      command->add_subcommand("export-slurm", "a fabric as Slurm topology.conf");
  export_slurm->add_option("file", slurm_flags->input, "fabric")->required();
  export_slurm->add_option("--kind", slurm_flags->kind, "tree (default) or block");
  export_slurm->add_option("-o,--output", slurm_flags->output, "write here instead of stdout");

  auto ecmp_flags = std::make_shared<EcmpFlags>();
  CLI::App* ecmp = command->add_subcommand(
      "ecmp", "hash a collective's flows onto ECMP paths; compare with ideal spreading");
  AddPlacementFlags(ecmp, *ecmp_flags);
  ecmp->add_option("--qps", ecmp_flags->queue_pairs, "queue pairs per connection (1 to 128)");
  ecmp->add_option("--trials", ecmp_flags->trials, "runs with different source ports")
      ->check(CLI::Range(1, 10000));
  ecmp->add_option("--hash", ecmp_flags->hash, "per-tier (switches hash alike) or per-switch");

  auto cost_flags = std::make_shared<CostFlags>();
  CLI::App* cost =
      command->add_subcommand("cost", "estimated collective time and bus bandwidth of a placement");
  AddPlacementFlags(cost, *cost_flags);
  cost->add_option("--size", cost_flags->size, "bytes per rank, e.g. 1GiB");

  return [=] {
    if (check->parsed()) {
      return RunCheck(*check_file);
    }
    if (superpod->parsed()) {
      fabric::SuperpodOptions options = generate_flags->superpod;
      options.ufm = !generate_flags->no_ufm;
      return WriteSpec(fabric::GenerateSuperpod(options),
                       fmt::format("NVIDIA DGX H100 SuperPOD, {} scalable unit(s): gpufleet fabric "
                                   "generate superpod --sus {}",
                                   options.scalable_units, options.scalable_units),
                       generate_flags->output, generate_flags->format);
    }
    if (clos->parsed()) {
      fabric::ClosOptions options = generate_flags->clos;
      auto nic = fabric::ParseSpeedMbps(generate_flags->nic_speed, "--nic-speed");
      auto uplink = fabric::ParseSpeedMbps(generate_flags->uplink_speed, "--uplink-speed");
      if (!nic.ok() || !uplink.ok()) {
        return FailFabric(nic.ok() ? uplink.status() : nic.status());
      }
      options.nic_speed_mbps = *nic;
      options.uplink_speed_mbps = *uplink;
      return WriteSpec(
          fabric::GenerateClos(options),
          fmt::format("{}-tier folded Clos, leaves {}:1{}: gpufleet fabric generate clos",
                      options.tiers, options.leaf_oversubscription,
                      options.tiers == 3
                          ? fmt::format(", spines {}:1", options.spine_oversubscription)
                          : ""),
          generate_flags->output, generate_flags->format);
    }
    if (nvl72->parsed()) {
      return WriteSpec(
          fabric::GenerateNvl72(generate_flags->nvl72),
          fmt::format("GB200 NVL72, {} rack(s): gpufleet fabric generate nvl72 --racks {}",
                      generate_flags->nvl72.racks, generate_flags->nvl72.racks),
          generate_flags->output, generate_flags->format);
    }
    if (import_slurm->parsed()) {
      return RunImportSlurm(*slurm_flags);
    }
    if (export_slurm->parsed()) {
      return RunExportSlurm(*slurm_flags);
    }
    if (ecmp->parsed()) {
      return RunEcmp(*ecmp_flags);
    }
    if (cost->parsed()) {
      return RunCost(*cost_flags);
    }
    return 2;
  };
}

}  // namespace gpufleet::app
