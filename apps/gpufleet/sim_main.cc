// SPDX-License-Identifier: Apache-2.0
// `gpufleet sim`: replays traces against placement and queue policies.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/core.h>
#include <fmt/ostream.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/fabric/fabric.h"
#include "gpufleet/fabric/hostlist.h"
#include "gpufleet/fleetsim/control_plane_replay.h"
#include "gpufleet/scheduler/registry.h"
#include "gpufleet/sim/bound.h"
#include "gpufleet/sim/fill.h"
#include "gpufleet/sim/fill_report.h"
#include "gpufleet/sim/openb.h"
#include "gpufleet/sim/replay.h"
#include "gpufleet/sim/sim_report.h"
#include "gpufleet/sim/slurm_history.h"
#include "gpufleet/sim/trace_loaders.h"

#include "flags.h"
#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct CommonFlags {
  std::string policy = "all";
  std::string json;
  std::string report;
  int threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
};

// The openb trace and seeds of the fill experiment, for `sim fill` and `sim bound`.
struct OpenbFlags {
  std::string data_dir = GPUFLEET_DEFAULT_DATA_DIR;
  std::string nodes;
  std::string pods;
  std::string seeds = "42-51";
  double load = 1.3;
};

struct FillFlags : CommonFlags, OpenbFlags {
  bool bound = false;      // also the LP lower bound per seed and each policy's gap to it
  int learn_workload = 0;  // > 0: fgd and gpufleet learn their target as the server does
};

struct BoundFlags : OpenbFlags {
  double time_limit = 10;
  bool mip = false;
  int checkpoints = 8;
  std::string json;
};

struct ReplayFlags : CommonFlags {
  std::string trace;
  std::string format;
  std::string cluster = "250x8";
  std::string nodes;
  std::string gpu_model = "V100-32GB";
  std::string placement = "best-fit";
  int64_t learn_workload = 0;  // > 0: fgd and gpufleet learn their target as the server does
  uint64_t seed = 42;
  int64_t sample_seconds = 600;
  std::string fabric;    // a fabric file: the cluster is its nodes and jobs pay for communication
  std::string gres_map;  // sacct: TYPE=MODEL,...
  std::string slurm_nodes;     // sacct: `scontrol show nodes` output
  bool cluster_given = false;  // --cluster or --nodes on the command line
  bool gpu_model_given = false;
  bool topology_aware = false;
  double communication_fraction = 0.3;
  // "loops": the replay's own scheduling loops (sim/replay.h); "control-plane": the trace through
  // the server and agents on simulated time (fleetsim/control_plane_replay.h).
  std::string engine = "loops";
  size_t max_jobs = 0;  // > 0: only the first this many jobs by submit time
};

Result<uint64_t> ParseNumber(std::string_view text, std::string_view flag) {
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" is not a number", flag, text));
  }
  return value;
}

// "42-51" or "1,2,7".
Result<std::vector<uint64_t>> ParseSeeds(const std::string& text) {
  std::vector<uint64_t> seeds;
  if (const size_t dash = text.find('-'); dash != std::string::npos) {
    GPUFLEET_ASSIGN_OR_RETURN(const uint64_t first,
                              ParseNumber(std::string_view(text).substr(0, dash), "--seeds"));
    GPUFLEET_ASSIGN_OR_RETURN(const uint64_t last,
                              ParseNumber(std::string_view(text).substr(dash + 1), "--seeds"));
    if (last < first || last - first > 1000) {
      return InvalidArgumentError(fmt::format("--seeds: bad range \"{}\"", text));
    }
    for (uint64_t seed = first; seed <= last; ++seed) {
      seeds.push_back(seed);
    }
    return seeds;
  }
  for (const std::string& part : SplitList(text)) {
    GPUFLEET_ASSIGN_OR_RETURN(const uint64_t seed, ParseNumber(part, "--seeds"));
    seeds.push_back(seed);
  }
  return seeds;
}

// "250x8": nodes x GPUs per node, 32 nodes per leaf.
Result<Cluster> ParseSyntheticCluster(const std::string& text, const std::string& model,
                                      const GpuCatalog& catalog) {
  const size_t x = text.find('x');
  if (x == std::string::npos) {
    return InvalidArgumentError(
        fmt::format("--cluster: \"{}\" is not NODESxGPUS (e.g. 250x8)", text));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const uint64_t nodes,
                            ParseNumber(std::string_view(text).substr(0, x), "--cluster"));
  GPUFLEET_ASSIGN_OR_RETURN(const uint64_t gpus,
                            ParseNumber(std::string_view(text).substr(x + 1), "--cluster"));
  if (nodes < 1 || nodes > 100000 || gpus < 1 || gpus > 64) {
    return InvalidArgumentError(fmt::format("--cluster: \"{}\" out of range", text));
  }
  SyntheticClusterSpec spec;
  spec.nodes_per_leaf = 32;
  spec.leaves_per_block = static_cast<int>((nodes + 31) / 32);
  spec.total_nodes = static_cast<int>(nodes);
  spec.gpus_per_node = static_cast<int>(gpus);
  spec.gpu_model = model;
  return MakeSyntheticCluster(spec, catalog);
}

int FailSim(const Status& status) {
  fmt::print(std::cerr, "gpufleet sim: {}\n", status.ToString());
  return 1;
}

// The --json and --report files of a run, when asked for; 0 or 1 as the command's exit code.
template <typename JsonWriter, typename ReportWriter>
int WriteOutputs(const CommonFlags& flags, JsonWriter write_json, ReportWriter write_report) {
  if (!flags.json.empty()) {
    const Status written = WriteOutputFile(flags.json, [&](std::ostream& out) {
      write_json(out);
      return Status::Ok();
    });
    if (!written.ok()) {
      return FailSim(written);
    }
  }
  if (!flags.report.empty()) {
    const Status written = WriteOutputFile(flags.report, write_report);
    if (!written.ok()) {
      return FailSim(written);
    }
  }
  return 0;
}

std::unique_ptr<sim::ProgressBar> MakeProgress(const std::string& label, int runs) {
  // Only a person at a terminal wants it, and only for runs that take a while.
  const bool enabled = isatty(STDERR_FILENO) == 1 && runs > 1;
  return std::make_unique<sim::ProgressBar>(std::cerr, enabled, label, runs);
}

// The seeds, node list and pod list of `sim fill` and `sim bound`: the bundled lists unless given.
struct OpenbInputs {
  std::vector<uint64_t> seeds;
  std::string pods_path;
  Cluster cluster;
  std::vector<Job> pods;
};

Result<OpenbInputs> LoadOpenbInputs(const OpenbFlags& flags, GpuCatalog& catalog) {
  OpenbInputs inputs;
  GPUFLEET_ASSIGN_OR_RETURN(inputs.seeds, ParseSeeds(flags.seeds));
  const std::string nodes_path =
      flags.nodes.empty() ? flags.data_dir + "/openb/openb_node_list_gpu_node.csv" : flags.nodes;
  inputs.pods_path =
      flags.pods.empty() ? flags.data_dir + "/openb/openb_pod_list_default.csv" : flags.pods;
  GPUFLEET_ASSIGN_OR_RETURN(inputs.cluster, sim::LoadOpenbNodes(nodes_path, catalog));
  GPUFLEET_ASSIGN_OR_RETURN(inputs.pods, sim::LoadOpenbPods(inputs.pods_path, catalog));
  return inputs;
}

// --data-dir, --nodes, --pods and --seeds.
void AddOpenbFlags(CLI::App* command, OpenbFlags& flags) {
  command->add_option("--data-dir", flags.data_dir, "directory of the bundled traces");
  command->add_option("--nodes", flags.nodes, "openb node list (default: the bundled one)");
  command->add_option("--pods", flags.pods, "openb pod list (default: the bundled default)");
  command->add_option("--seeds", flags.seeds, "a range \"42-51\" or a list \"1,2\"");
}

int RunFillCommand(const FillFlags& flags) {
  auto policies = ParsePolicies(flags.policy, scheduler::PlacementPolicyNames());
  if (!policies.ok()) {
    return FailSim(policies.status());
  }
  GpuCatalog catalog = GpuCatalog::Default();
  auto inputs = LoadOpenbInputs(flags, catalog);
  if (!inputs.ok()) {
    return FailSim(inputs.status());
  }
  const std::vector<uint64_t>& seeds = inputs->seeds;
  const std::string& pods_path = inputs->pods_path;
  const Cluster& cluster = inputs->cluster;
  const std::vector<Job>& pods = inputs->pods;
  fmt::print("fill: {} nodes, {} pods from {}; policies {}; seeds {}; load target {}x\n",
             cluster.nodes.size(), pods.size(), pods_path, fmt::join(*policies, ","), flags.seeds,
             flags.load);
  sim::FillOptions options;
  options.load_target = flags.load;
  options.learn_every = flags.learn_workload;
  auto progress = MakeProgress("fill runs", static_cast<int>(policies->size() * seeds.size()));
  auto results = sim::RunFillMatrix(cluster, pods, catalog, *policies, seeds, options,
                                    flags.threads, [&] { progress->Advance(); });
  progress->Finish();
  if (!results.ok()) {
    return FailSim(results.status());
  }
  sim::FillBoundsBySeed bounds;
  if (flags.bound) {
    // The LP relaxation at 8 prefixes, seconds per seed; `sim bound --mip` adds branch and bound.
    sim::PackingBoundOptions bound_options;
    for (const uint64_t seed : seeds) {
      auto bound = sim::RunFillBound(cluster, pods, catalog, seed, flags.load, bound_options);
      if (!bound.ok()) {
        return FailSim(bound.status());
      }
      bounds[seed] = bound->unallocated_gpus_bound;
    }
  }
  sim::PrintFillSummary(sim::SummarizeFill(*results, bounds), std::cout);
  if (flags.bound) {
    std::vector<double> values;
    for (const auto& [seed, value] : bounds) {
      values.push_back(value);
    }
    fmt::print("lower bound (LP, gpufleet sim bound): median {:.1f} unallocated GPUs at 100 %\n",
               sim::Median(values));
  }
  return WriteOutputs(
      flags, [&](std::ostream& out) { sim::WriteFillJson(*results, out, bounds); },
      [&](std::ostream& out) {
        return sim::WriteFillReport(*results, "gpufleet fill: " + pods_path, out, bounds);
      });
}

// `gpufleet sim bound`: per seed, no policy leaves fewer GPUs unallocated at 100 % arrived load
// of `gpufleet sim fill` than the bound printed (docs/policies.md). The solves run one after
// another: CBC's solver driver is not documented as safe on two threads.
int RunBoundCommand(const BoundFlags& flags) {
  GpuCatalog catalog = GpuCatalog::Default();
  auto inputs = LoadOpenbInputs(flags, catalog);
  if (!inputs.ok()) {
    return FailSim(inputs.status());
  }
  const std::vector<uint64_t>& seeds = inputs->seeds;
  const std::string& pods_path = inputs->pods_path;
  const Cluster& cluster = inputs->cluster;
  const std::vector<Job>& pods = inputs->pods;
  sim::PackingBoundOptions options;
  options.lp_only = !flags.mip;
  options.time_limit_seconds = flags.time_limit;
  options.checkpoints = flags.checkpoints;
  fmt::print("bound: {} nodes, {} pods from {}; seeds {}; load target {}x; {}; {} prefixes\n",
             cluster.nodes.size(), pods.size(), pods_path, flags.seeds, flags.load,
             flags.mip
                 ? fmt::format("LP and branch and bound ({} s limit per solve)", flags.time_limit)
                 : std::string("LP relaxation"),
             flags.checkpoints);
  fmt::print("{:>6} {:>7} {:>7} {:>9} {:>9} {:>10} {:>9}  {}\n", "seed", "pods", "events",
             "LP last", "MIP last", "MIP primal", "bound", "status");
  auto progress = MakeProgress("bound solves", static_cast<int>(seeds.size()));
  std::vector<sim::FillBound> bounds;
  for (const uint64_t seed : seeds) {
    auto bound = sim::RunFillBound(cluster, pods, catalog, seed, flags.load, options);
    if (!bound.ok()) {
      progress->Finish();
      return FailSim(bound.status());
    }
    // Unallocated GPUs for a placed milli-GPU figure of the longest prefix; "-" when not run.
    const auto gpus = [&](double milli) {
      return milli < 0 ? std::string("-")
                       : fmt::format("{:.1f}", bound->total_gpus - milli / kMilliPerUnit);
    };
    const sim::PackingBound& solve = bound->solve;
    fmt::print("{:>6} {:>7} {:>7} {:>9} {:>9} {:>10} {:>9.1f}  {}\n", seed, bound->pods_packed,
               bound->events, gpus(solve.lp_bound), gpus(solve.mip_dual_bound),
               gpus(solve.mip_primal), bound->unallocated_gpus_bound,
               !flags.mip            ? "LP"
               : bound->time_limited ? "time limit hit: dual bound"
                                     : "branch and bound finished");
    bounds.push_back(*std::move(bound));
    progress->Advance();
  }
  progress->Finish();
  std::vector<double> values;
  bool time_limited = false;
  for (const sim::FillBound& bound : bounds) {
    values.push_back(bound.unallocated_gpus_bound);
    time_limited = time_limited || bound.time_limited;
  }
  fmt::print("median lower bound on unallocated GPUs at 100 %: {:.1f}{}\n", sim::Median(values),
             time_limited ? " (some solves hit the time limit: dual bounds)" : "");
  if (flags.json.empty()) {
    return 0;
  }
  const Status written = WriteOutputFile(flags.json, [&](std::ostream& out) {
    sim::WriteBoundJson(bounds, out);
    return Status::Ok();
  });
  return written.ok() ? 0 : FailSim(written);
}

void PrintReplaySummary(const std::vector<sim::ReplayResult>& results) {
  fmt::print("{:<10} {:<10} {:>7} {:>7} {:>7} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9}\n",
             "queue", "placement", "jobs", "done", "never", "makespan", "wait mean", "wait p99",
             "JCT mean", "JCT p50", "JCT p99", "GPUs busy");
  for (const sim::ReplayResult& r : results) {
    fmt::print(
        "{:<10} {:<10} {:>7} {:>7} {:>7} {:>8.1f}h {:>9.0f}s {:>9.0f}s {:>9.0f}s {:>9.0f}s "
        "{:>9.0f}s {:>8.1f}%\n",
        r.queue_policy, r.placement_policy, r.jobs_total, r.jobs_finished, r.jobs_unplaceable,
        r.makespan_seconds / 3600.0, r.queueing_delay.mean, r.queueing_delay.p99,
        r.completion_time.mean, r.completion_time.p50, r.completion_time.p99,
        r.total_gpus > 0 ? 100.0 * r.mean_gpus_allocated / r.total_gpus : 0.0);
  }
}

// Jobs that ran on more than one node, where the fabric model stretches run times.
void PrintMultiNodeSummary(const std::vector<sim::ReplayResult>& results, bool topology_aware) {
  fmt::print("\nmulti-node jobs on the fabric (placement {}):\n",
             topology_aware ? "topology-aware" : "topology-blind");
  fmt::print("{:<10} {:>7} {:>10} {:>10} {:>12} {:>12}\n", "queue", "jobs", "JCT mean", "JCT p50",
             "stretch mean", "stretched");
  for (const sim::ReplayResult& r : results) {
    std::vector<double> jct;
    double stretch = 0;
    int stretched = 0;
    for (const sim::ReplayJobOutcome& job : r.jobs) {
      if (job.nodes < 2 || job.end_seconds < 0) {
        continue;
      }
      jct.push_back(static_cast<double>(job.CompletionTime()));
      stretch += job.stretch;
      stretched += job.stretch > 1.0 + 1e-9 ? 1 : 0;
    }
    std::sort(jct.begin(), jct.end());
    const double mean = jct.empty() ? 0 : std::accumulate(jct.begin(), jct.end(), 0.0) / jct.size();
    fmt::print("{:<10} {:>7} {:>9.0f}s {:>9.0f}s {:>12.3f} {:>12}\n", r.queue_policy, jct.size(),
               mean, jct.empty() ? 0.0 : jct[jct.size() / 2],
               jct.empty() ? 1.0 : stretch / static_cast<double>(jct.size()), stretched);
  }
}

// The trace and cluster of a Slurm history: the cluster from --fabric (a topology.conf's nodes
// get the GPUs of --slurm-nodes or the history), --slurm-nodes, --cluster/--nodes, or else the
// history itself. Prints what the loader skipped, and warns of GPU types it could not map.
struct SlurmReplay {
  sim::Trace trace;
  Cluster cluster;
  std::shared_ptr<const fabric::Fabric> network;
};

Result<SlurmReplay> LoadSlurmReplay(const ReplayFlags& flags, GpuCatalog& catalog) {
  sim::SacctOptions options;
  GPUFLEET_ASSIGN_OR_RETURN(options.gres_map, sim::ParseGresMap(flags.gres_map, catalog));
  if (flags.gpu_model_given) {
    options.untyped_gpu_model = catalog.Canonical(flags.gpu_model);
    if (options.untyped_gpu_model.empty()) {
      return catalog.Find(flags.gpu_model).status();
    }
  }
  GPUFLEET_ASSIGN_OR_RETURN(sim::SacctHistory history,
                            sim::LoadSacctHistory(flags.trace, options, catalog));
  fmt::print("sacct: {} rows, {} jobs to replay; left out or folded: {}\n", history.rows,
             history.trace.jobs.size(), history.skipped.ToString());
  for (const auto& [type, jobs] : history.unmapped_gpu_types) {
    fmt::print(std::cerr,
               "gpufleet sim: warning: GPU type \"{}\" of {} job{} maps to no catalog model; "
               "replayed as a model of its own (map it with --gres-map {}=MODEL)\n",
               type, jobs, jobs == 1 ? "" : "s", type);
  }
  std::vector<sim::SlurmNodeShape> shapes = history.nodes;
  std::string shapes_from = history.nodes_named ? "the history's NodeList"
                                                : "the history's allocations (no NodeList column)";
  if (!flags.slurm_nodes.empty()) {
    GPUFLEET_ASSIGN_OR_RETURN(std::ifstream in, sim::OpenInputFile(flags.slurm_nodes));
    std::stringstream text;
    text << in.rdbuf();
    GPUFLEET_ASSIGN_OR_RETURN(
        shapes, sim::ParseScontrolNodes(text.str(), flags.slurm_nodes, options, catalog));
    shapes_from = flags.slurm_nodes;
  }
  SlurmReplay replay;
  replay.trace = std::move(history.trace);
  if (!flags.fabric.empty()) {
    GPUFLEET_ASSIGN_OR_RETURN(LoadedFabricSpec loaded, LoadFabricSpecFile(flags.fabric));
    if (loaded.from_slurm) {
      GPUFLEET_ASSIGN_OR_RETURN(const sim::FabricShapeMismatch mismatch,
                                sim::ApplySlurmNodeShapes(loaded.spec, shapes));
      if (!mismatch.not_in_nodes.empty()) {
        fmt::print(std::cerr,
                   "gpufleet sim: warning: {} node(s) of {} not in {}, given no GPUs: {}\n",
                   mismatch.not_in_nodes.size(), flags.fabric, shapes_from,
                   fabric::CompressHostlist(mismatch.not_in_nodes));
      }
      if (!mismatch.not_in_file.empty()) {
        fmt::print(std::cerr,
                   "gpufleet sim: warning: {} node(s) of {} not in {}, added without a "
                   "network link: {}\n",
                   mismatch.not_in_file.size(), shapes_from, flags.fabric,
                   fabric::CompressHostlist(mismatch.not_in_file));
      }
    }
    fmt::print("cluster: the nodes of {}{}\n", flags.fabric,
               loaded.from_slurm ? fmt::format(" with the GPUs of {}", shapes_from) : "");
    GPUFLEET_ASSIGN_OR_RETURN(fabric::Fabric built, fabric::Fabric::Build(std::move(loaded.spec)));
    replay.network = std::make_shared<const fabric::Fabric>(std::move(built));
    GPUFLEET_ASSIGN_OR_RETURN(replay.cluster, fabric::BuildCluster(*replay.network, catalog));
    return replay;
  }
  if (flags.cluster_given && flags.slurm_nodes.empty()) {
    GPUFLEET_ASSIGN_OR_RETURN(replay.cluster,
                              flags.nodes.empty()
                                  ? ParseSyntheticCluster(flags.cluster, flags.gpu_model, catalog)
                                  : sim::LoadOpenbNodes(flags.nodes, catalog));
    return replay;
  }
  fmt::print("cluster: {} nodes from {}\n", shapes.size(), shapes_from);
  GPUFLEET_ASSIGN_OR_RETURN(replay.cluster, sim::BuildSlurmCluster(shapes, catalog));
  return replay;
}

// 0, or 1 after saying why when no run completed a job.
int CheckSomeJobFinished(const std::vector<sim::ReplayResult>& results) {
  for (const sim::ReplayResult& result : results) {
    if (result.jobs_finished > 0) {
      return 0;
    }
  }
  if (results.empty()) {
    return 0;
  }
  const sim::ReplayResult& first = results.front();
  std::map<std::string, int> reasons;
  for (const sim::ReplayJobOutcome& job : first.jobs) {
    if (!job.unplaceable_reason.empty()) {
      ++reasons[job.unplaceable_reason];
    }
  }
  std::string why;
  if (reasons.empty()) {
    why = fmt::format("none of the {} jobs was placed before the queue stalled", first.jobs_total);
  } else {
    const auto most =
        std::max_element(reasons.begin(), reasons.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    why = fmt::format(
        "{} of {} jobs can never fit the cluster; the most common reason ({} "
        "jobs): {}",
        first.jobs_unplaceable, first.jobs_total, most->second, most->first);
  }
  fmt::print(std::cerr, "gpufleet sim: replay completed no job: {}\n", why);
  return 1;
}

// "sacct" when the first line of `path` is a sacct --parsable2 header; the only format a
// replay may leave unsaid, since a Slurm history is a file a site has, not one we ship.
Result<std::string> DetectTraceFormat(const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(std::ifstream in, sim::OpenInputFile(path));
  std::string header;
  std::getline(in, header);
  if (header.starts_with("JobID|")) {
    return std::string("sacct");
  }
  return InvalidArgumentError(fmt::format(
      "{}: --format is required (philly, openb, native, sacct, gavel or pollux); only sacct "
      "output is recognised by its header",
      path));
}

// One replay per queue policy through the control plane, one after another (each runs a whole
// simulated fleet on this thread).
Result<std::vector<sim::ReplayResult>> ReplayThroughControlPlane(
    const Cluster& cluster, const sim::Trace& trace, const std::vector<std::string>& policies,
    const sim::ReplayOptions& options, sim::ProgressBar& progress) {
  std::vector<sim::ReplayResult> results;
  for (const std::string& policy : policies) {
    sim::ReplayOptions run = options;
    run.queue_policy = policy;
    GPUFLEET_ASSIGN_OR_RETURN(sim::ReplayResult result,
                              fleetsim::RunReplayThroughControlPlane(cluster, trace, run));
    results.push_back(std::move(result));
    progress.Advance();
  }
  return results;
}

int RunReplayCommand(ReplayFlags flags) {
  if (flags.format.empty()) {
    auto detected = DetectTraceFormat(flags.trace);
    if (!detected.ok()) {
      return FailSim(detected.status());
    }
    flags.format = *detected;
  }
  auto policies = ParsePolicies(flags.policy, sim::QueuePolicyNames());
  if (!policies.ok()) {
    return FailSim(policies.status());
  }
  const std::vector<std::string>& placements = scheduler::PlacementPolicyNames();
  if (std::find(placements.begin(), placements.end(), flags.placement) == placements.end()) {
    return FailSim(
        InvalidArgumentError(fmt::format("--placement: unknown policy \"{}\" (known: {})",
                                         flags.placement, fmt::join(placements, ", "))));
  }
  GpuCatalog catalog = GpuCatalog::Default();
  std::shared_ptr<const fabric::Fabric> network;
  std::optional<Cluster> slurm_cluster;
  Result<sim::Trace> trace = InvalidArgumentError("no trace");
  if (flags.format == "sacct") {
    auto loaded = LoadSlurmReplay(flags, catalog);
    if (!loaded.ok()) {
      return FailSim(loaded.status());
    }
    network = loaded->network;
    slurm_cluster = std::move(loaded->cluster);
    trace = std::move(loaded->trace);
  } else if (!flags.gres_map.empty() || !flags.slurm_nodes.empty()) {
    return FailSim(InvalidArgumentError("--gres-map and --slurm-nodes are for --format sacct"));
  } else if (!flags.fabric.empty()) {
    auto loaded = LoadFabricFile(flags.fabric);
    if (!loaded.ok()) {
      return FailSim(loaded.status());
    }
    network = *loaded;
  }
  Result<Cluster> cluster = slurm_cluster        ? Result<Cluster>(*std::move(slurm_cluster))
                            : network != nullptr ? fabric::BuildCluster(*network, catalog)
                            : flags.nodes.empty()
                                ? ParseSyntheticCluster(flags.cluster, flags.gpu_model, catalog)
                                : sim::LoadOpenbNodes(flags.nodes, catalog);
  if (!cluster.ok()) {
    return FailSim(cluster.status());
  }
  if (flags.format != "sacct") {
    trace = sim::LoadTrace(flags.trace, flags.format, catalog);
  }
  if (!trace.ok()) {
    return FailSim(trace.status());
  }
  if (flags.max_jobs > 0 && trace->jobs.size() > flags.max_jobs) {
    trace->jobs.resize(flags.max_jobs);
  }
  int gpus = 0;
  for (const Node& node : cluster->nodes) {
    gpus += static_cast<int>(node.gpus.size());
  }
  fmt::print("replay: {} jobs from {} ({}); {} nodes, {} GPUs; queue policies {}; placement {}\n",
             trace->jobs.size(), flags.trace, flags.format, cluster->nodes.size(), gpus,
             fmt::join(*policies, ","), flags.placement);
  sim::ReplayOptions options;
  options.placement_policy = flags.placement;
  options.learn_workload_seconds = flags.learn_workload;
  options.seed = flags.seed;
  options.sample_seconds = flags.sample_seconds;
  options.fabric = network;
  options.topology_aware = flags.topology_aware;
  options.communication_fraction = flags.communication_fraction;
  auto progress = MakeProgress("replays", static_cast<int>(policies->size()));
  Result<std::vector<sim::ReplayResult>> results =
      flags.engine == "control-plane"
          ? ReplayThroughControlPlane(*cluster, *trace, *policies, options, *progress)
          : sim::RunReplayMatrix(*cluster, *trace, catalog, *policies, options, flags.threads,
                                 [&] { progress->Advance(); });
  progress->Finish();
  if (!results.ok()) {
    return FailSim(results.status());
  }
  PrintReplaySummary(*results);
  if (network != nullptr) {
    PrintMultiNodeSummary(*results, flags.topology_aware);
  }
  const int written = WriteOutputs(
      flags, [&](std::ostream& out) { sim::WriteReplayJson(*results, out); },
      [&](std::ostream& out) {
        return sim::WriteReplayReport(*results, "gpufleet replay: " + flags.trace, out);
      });
  if (written != 0) {
    return written;
  }
  return CheckSomeJobFinished(*results);
}

void AddCommonFlags(CLI::App* command, CommonFlags& flags, const std::string& policy_help) {
  command->add_option("--policy", flags.policy, policy_help);
  command->add_option("--json", flags.json, "write every series to this JSON file");
  command->add_option("--report", flags.report, "write a self-contained HTML report with charts");
  command->add_option("--threads", flags.threads, "runs in parallel")->check(CLI::Range(1, 256));
}

}  // namespace

Action AddSimCommand(CLI::App& app) {
  CLI::App* sim = app.add_subcommand("sim", "replay traces against scheduling policies");
  sim->require_subcommand(1);

  auto fill_flags = std::make_shared<FillFlags>();
  CLI::App* fill = sim->add_subcommand(
      "fill", "the FGD (ATC'23) experiment: fill the openb cluster to 130% of its GPUs");
  AddCommonFlags(fill, *fill_flags,
                 "\"all\" or placement policies, comma-separated: random, dot-prod, "
                 "gpu-clustering, gpu-packing, best-fit, fgd, gpufleet");
  AddOpenbFlags(fill, *fill_flags);
  fill->add_option("--load", fill_flags->load, "arrived load to stop at, times GPU capacity")
      ->check(CLI::Range(0.01, 10.0));
  fill->add_flag("--bound", fill_flags->bound,
                 "also each seed's lower bound (`sim bound`, LP) and each policy's gap to it");
  fill->add_option("--learn-workload", fill_flags->learn_workload,
                   "N > 0: fgd and gpufleet learn their target workload from the pods placed so "
                   "far, as `gpufleet server` does, rebuilt every N arrivals")
      ->check(CLI::Range(0, 1000000));

  auto bound_flags = std::make_shared<BoundFlags>();
  CLI::App* bound = sim->add_subcommand(
      "bound", "a proven lower bound on the GPUs `sim fill` leaves unallocated at 100% load");
  AddOpenbFlags(bound, *bound_flags);
  bound->add_option("--load", bound_flags->load, "the fill experiment's load target")
      ->check(CLI::Range(1.0, 10.0));
  bound->add_flag("--mip", bound_flags->mip,
                  "also run CBC's branch and bound after the LP; its dual bound counts");
  bound
      ->add_option("--time-limit", bound_flags->time_limit,
                   "with --mip: wall seconds of branch and bound per solve (default 10)")
      ->check(CLI::Range(0.01, 86400.0));
  bound
      ->add_option("--checkpoints", bound_flags->checkpoints,
                   "arrival prefixes solved within the 100% point (default 8)")
      ->check(CLI::Range(1, 1000));
  bound->add_option("--json", bound_flags->json, "write the bounds to this JSON file");

  auto replay_flags = std::make_shared<ReplayFlags>();
  CLI::App* replay =
      sim->add_subcommand("replay", "replay a job trace over time: arrivals, queueing, departures");
  AddCommonFlags(replay, *replay_flags,
                 "\"all\" or queue policies, comma-separated: fifo, sjf, tiresias, gpufleet, "
                 "strict-fifo, easy-backfill, fair-share");
  CLI::Option* trace_flag =
      replay->add_option("--trace", replay_flags->trace, "the trace file (or give it as FILE)");
  CLI::Option* trace_positional =
      replay->add_option("FILE", replay_flags->trace, "the trace file (same as --trace)");
  trace_flag->excludes(trace_positional);
  replay->add_option("--format", replay_flags->format,
                     "philly|openb|native|sacct|gavel|pollux (default: sacct for a file whose "
                     "header is sacct's, else required)");
  CLI::Option* cluster_flag = replay->add_option(
      "--cluster", replay_flags->cluster,
      "synthetic cluster NODESxGPUS on a leaf/spine tree (default 250x8; sacct: the cluster of "
      "the history)");
  CLI::Option* gpu_model_flag = replay->add_option(
      "--gpu-model", replay_flags->gpu_model,
      "GPU model of the synthetic cluster (sacct: of untyped gres/gpu, default H100-80GB)");
  CLI::Option* nodes_flag =
      replay->add_option("--nodes", replay_flags->nodes, "an openb node list instead of --cluster");
  replay->add_option("--gres-map", replay_flags->gres_map,
                     "sacct: GPU types to catalog models, TYPE=MODEL,... (docs/slurm.md)");
  replay->add_option("--slurm-nodes", replay_flags->slurm_nodes,
                     "sacct: `scontrol show nodes` output for the cluster (docs/slurm.md)");
  replay->callback(
      [replay_flags, trace_flag, trace_positional, cluster_flag, nodes_flag, gpu_model_flag] {
        if (trace_flag->count() == 0 && trace_positional->count() == 0) {
          throw CLI::RequiredError("--trace or FILE");
        }
        replay_flags->cluster_given = cluster_flag->count() > 0 || nodes_flag->count() > 0;
        replay_flags->gpu_model_given = gpu_model_flag->count() > 0;
      });
  replay->add_option("--placement", replay_flags->placement, "placement policy (default best-fit)");
  replay
      ->add_option("--learn-workload", replay_flags->learn_workload,
                   "SECONDS > 0: fgd and gpufleet learn their target workload from the jobs "
                   "placed so far, as `gpufleet server` does, rebuilt at most this often")
      ->check(CLI::Range(int64_t{0}, int64_t{365} * 86400));
  replay->add_option("--seed", replay_flags->seed, "seed for tie-breaks");
  replay
      ->add_option("--engine", replay_flags->engine,
                   "loops (default: the replay's own scheduling loops) or control-plane (the "
                   "trace through the server and agents on simulated time; queue policies fifo, "
                   "easy-backfill and fair-share)")
      ->check(CLI::IsMember({"loops", "control-plane"}));
  replay->add_option("--fabric", replay_flags->fabric,
                     "a fabric (YAML or topology.conf): its nodes are the cluster, and multi-node "
                     "jobs run longer on slow placements (docs/fabric.md)");
  replay->add_flag("--topology-aware", replay_flags->topology_aware,
                   "add the collective-cost score plugin (needs --fabric)");
  replay
      ->add_option("--comm-fraction", replay_flags->communication_fraction,
                   "share of a job's run time in collectives on its best placement (0.3)")
      ->check(CLI::Range(0.0, 1.0));
  replay
      ->add_option("--max-jobs", replay_flags->max_jobs,
                   "replay only the first N jobs by submit time (a quick look at a long trace)")
      ->check(CLI::PositiveNumber);
  replay->add_option("--sample-seconds", replay_flags->sample_seconds, "spacing of the time series")
      ->check(CLI::Range(1, 86400 * 30));

  const SimSubcommand failures = AddSimFailuresCommand(*sim);
  const SimSubcommand mig = AddSimMigCommand(*sim);
  const SimSubcommand autoscale = AddSimAutoscaleCommand(*sim);
  const SimSubcommand fairness = AddSimFairnessCommand(*sim);
  const SimSubcommand backfill = AddSimBackfillCommand(*sim);
  const SimSubcommand interactive = AddSimInteractiveCommand(*sim);
  const SimSubcommand coldstart = AddSimColdStartCommand(*sim);
  const SimSubcommand chaos = AddSimChaosCommand(*sim);
  const SimSubcommand fleet = AddSimFleetCommand(*sim);

  return [fill, fill_flags, bound, bound_flags, replay, replay_flags, failures, autoscale, mig,
          fairness, backfill, interactive, coldstart, chaos, fleet] {
    if (fill->parsed()) {
      return RunFillCommand(*fill_flags);
    }
    if (bound->parsed()) {
      return RunBoundCommand(*bound_flags);
    }
    if (replay->parsed()) {
      return RunReplayCommand(*replay_flags);
    }
    if (failures.command->parsed()) {
      return failures.run();
    }
    if (mig.command->parsed()) {
      return mig.run();
    }
    if (autoscale.command->parsed()) {
      return autoscale.run();
    }
    if (fairness.command->parsed()) {
      return fairness.run();
    }
    if (backfill.command->parsed()) {
      return backfill.run();
    }
    if (interactive.command->parsed()) {
      return interactive.run();
    }
    if (coldstart.command->parsed()) {
      return coldstart.run();
    }
    if (chaos.command->parsed()) {
      return chaos.run();
    }
    if (fleet.command->parsed()) {
      return fleet.run();
    }
    return 2;
  };
}

}  // namespace gpufleet::app
