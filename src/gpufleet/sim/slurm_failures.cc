// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/slurm_failures.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpufleet/core/clock.h"
#include "gpufleet/reliability/monitor.h"
#include "gpufleet/reliability/outcome.h"

namespace gpufleet::sim {
namespace {

using reliability::DeviceEvidence;
using reliability::DeviceKind;
using reliability::ExitReason;

constexpr int64_t kNanosecondsPerSecond = 1'000'000'000;

// One run as the attribution sees it, before the fleet is known.
struct SlurmRun {
  std::string id;
  int64_t start = 0;
  int64_t end = 0;
  ExitReason reason = ExitReason::kSucceeded;
  bool names_node = false;  // a one-node NODE_FAIL or BOOT_FAIL: Slurm blamed that node
  std::string state;
  std::vector<std::pair<std::string, int>> gpus_on_node;  // node -> GPUs, nodes with GPUs only
  int gpus() const {
    int total = 0;
    for (const auto& [node, count] : gpus_on_node) {
      total += count;
    }
    return total;
  }
};

// How Slurm's end of a job reads as an outcome (docs/slurm.md, "Lemon nodes").
ExitReason ReasonOf(const SacctJob& job, const SlurmFailureOptions& options) {
  const std::string& state = job.state;
  if (state == "COMPLETED") {
    return ExitReason::kSucceeded;
  }
  if (state == "CANCELLED" || state == "DEADLINE") {
    return ExitReason::kCancelled;
  }
  if (state == "PREEMPTED") {
    return ExitReason::kPreempted;
  }
  if (state == "NODE_FAIL" || state == "BOOT_FAIL") {
    return ExitReason::kInfraError;
  }
  if (state == "TIMEOUT") {
    return options.timeouts_are_hangs ? ExitReason::kHang : ExitReason::kAppError;
  }
  if (state == "FAILED") {
    // Killed by a signal Slurm did not send, or a site's infrastructure exit code: not the job's
    // own error. A plain non-zero exit is.
    if (job.has_exit_code &&
        (job.exit_signal != 0 || options.infra_exit_codes.contains(job.exit_code))) {
      return ExitReason::kInfraError;
    }
    return ExitReason::kAppError;
  }
  return ExitReason::kAppError;  // OUT_OF_MEMORY
}

void Count(ExitReason reason, SlurmOutcomeCounts& counts) {
  switch (reason) {
    case ExitReason::kSucceeded:
      ++counts.succeeded;
      break;
    case ExitReason::kCancelled:
      ++counts.cancelled;
      break;
    case ExitReason::kPreempted:
      ++counts.preempted;
      break;
    case ExitReason::kAppError:
      ++counts.application;
      break;
    case ExitReason::kInfraError:
      ++counts.infrastructure;
      break;
    case ExitReason::kHang:
      ++counts.hangs;
      break;
  }
}

MonoTime At(int64_t seconds) {
  return MonoTime{seconds * kNanosecondsPerSecond};
}

}  // namespace

reliability::AttributionOptions SlurmFailureOptions::DefaultAttribution() {
  reliability::AttributionOptions attribution;
  attribution.window = Duration(0);
  attribution.flag_gpus = false;
  attribution.min_node_spread_gpus = 1;
  return attribution;
}

Result<SlurmFailureReport> AnalyzeSacctFailures(std::istream& in, const std::string& source,
                                                const SacctOptions& sacct,
                                                const SlurmFailureOptions& options,
                                                GpuCatalog& catalog) {
  GPUFLEET_RETURN_IF_ERROR(options.attribution.Validate());
  if (in.peek() == std::char_traits<char>::eof()) {
    return InvalidArgumentError(fmt::format("{}:1: empty file, expected a header row", source));
  }
  SacctReader reader(in, source, sacct, catalog);
  GPUFLEET_RETURN_IF_ERROR(reader.Open());
  if (!reader.has_node_list()) {
    return InvalidArgumentError(fmt::format(
        "{}:1: no NodeList column: failures cannot be attributed to nodes (run sacct with "
        "--format=JobID,JobIDRaw,Submit,Eligible,Start,End,Elapsed,Timelimit,State,ExitCode,"
        "NNodes,NodeList,AllocTRES)",
        source));
  }
  SlurmFailureReport report;
  report.source = source;
  SlurmNodeInference inference(sacct.untyped_gpu_model);
  std::vector<SlurmRun> runs;
  int64_t last_end = 0;
  while (true) {
    GPUFLEET_ASSIGN_OR_RETURN(std::optional<SacctJob> job, reader.Next());
    if (!job) {
      break;
    }
    SlurmRun run;
    run.id = job->id;
    run.start = job->start;
    run.end = job->end;
    run.state = job->state;
    run.reason = ReasonOf(*job, options);
    std::map<std::string, int> per_node;
    for (const SacctJob::Component& component : job->components) {
      for (const std::string& node : component.node_names) {
        per_node[node] += static_cast<int>(component.gpus / component.nodes);
      }
    }
    for (const auto& [node, gpus] : per_node) {
      if (gpus > 0) {
        run.gpus_on_node.emplace_back(node, gpus);
      }
    }
    if (run.gpus_on_node.empty()) {
      ++report.outcomes.without_nodes;
      continue;
    }
    run.names_node = run.reason == ExitReason::kInfraError && per_node.size() == 1 &&
                     (run.state == "NODE_FAIL" || run.state == "BOOT_FAIL");
    report.outcomes.node_named += run.names_node ? 1 : 0;
    Count(run.reason, report.outcomes);
    inference.Add(*job);
    last_end = std::max(last_end, run.end);
    runs.push_back(std::move(run));
  }
  report.rows = reader.rows();
  report.skipped = reader.skipped();
  if (runs.empty()) {
    return InvalidArgumentError(
        fmt::format("{}:{}: no GPU job with a NodeList to attribute failures to ({} rows; "
                    "skipped: {})",
                    source, std::max(reader.line(), 1), reader.rows(), report.skipped.ToString()));
  }

  // The fleet: every node a job ran on, with the most GPUs the history or the nodes file gives.
  std::map<std::string, int> node_gpus;
  for (const SlurmNodeShape& shape : inference.Nodes()) {
    node_gpus[shape.name] = static_cast<int>(shape.gpu_models.size());
  }
  for (const SlurmNodeShape& shape : options.nodes) {
    int& gpus = node_gpus[shape.name];
    gpus = std::max(gpus, static_cast<int>(shape.gpu_models.size()));
  }
  reliability::FleetInventory inventory;
  for (const auto& [node, gpus] : node_gpus) {
    std::vector<GpuUuid> uuids;
    for (int i = 0; i < gpus; ++i) {
      uuids.emplace_back(fmt::format("{}-gpu{}", node, i));
    }
    GPUFLEET_RETURN_IF_ERROR(inventory.AddNode(NodeId(node), "", uuids));
  }
  report.nodes = inventory.node_count();
  report.gpus = inventory.gpu_count();

  FakeClock clock(At(last_end + 1));
  GPUFLEET_ASSIGN_OR_RETURN(
      reliability::AttributionEngine engine,
      reliability::AttributionEngine::Create(inventory, clock, options.attribution));
  // sacct does not say which GPUs of a node a job held: give each job the next slots of each
  // node in turn, so that the node's exposure is right and no slot collects its failures.
  std::map<std::string, int> next_slot;
  for (const SlurmRun& run : runs) {
    reliability::OutcomeRecord record;
    record.job = JobId(run.id);
    record.exit_reason = run.reason;
    record.start = At(run.start);
    record.end = At(run.end);
    for (const auto& [node, count] : run.gpus_on_node) {
      const int gpus = node_gpus.at(node);
      int& slot = next_slot[node];
      for (int i = 0; i < std::min(count, gpus); ++i) {
        record.gpus.emplace_back(fmt::format("{}-gpu{}", node, slot));
        slot = (slot + 1) % gpus;
      }
      record.nodes.emplace_back(node);
    }
    if (run.names_node) {
      record.health_events.push_back(
          reliability::HealthEvent{NodeId(run.gpus_on_node.front().first), GpuUuid(),
                                   "slurm-" + run.state, reliability::HealthSeverity::kFail});
    }
    const Status added = engine.AddOutcome(record);
    if (!added.ok()) {
      return InternalError(fmt::format("{}: job {}: {}", source, run.id, added.message()));
    }
  }
  report.jobs = static_cast<int>(runs.size());
  report.attribution = engine.Analyze();

  // Per node: the failed runs it was part of and their GPU-hours (what a drain would have
  // spared them), and the failures above its expectation.
  std::map<std::string, std::pair<int, double>> failed_on_node;
  for (const SlurmRun& run : runs) {
    if (run.reason != ExitReason::kInfraError && run.reason != ExitReason::kHang) {
      continue;
    }
    const double gpu_hours = run.gpus() * static_cast<double>(run.end - run.start) / 3600.0;
    for (const auto& [node, count] : run.gpus_on_node) {
      ++failed_on_node[node].first;
      failed_on_node[node].second += gpu_hours;
    }
  }
  std::vector<reliability::Device> flagged;
  auto add_ranked = [&](const DeviceEvidence& evidence) {
    if (evidence.device.kind != DeviceKind::kNode) {
      return;
    }
    SlurmNodeFailures node;
    node.evidence = evidence;
    if (const auto found = failed_on_node.find(evidence.device.id); found != failed_on_node.end()) {
      node.failed_runs = found->second.first;
      node.failed_gpu_hours = found->second.second;
    }
    node.avoidable = std::max(0.0, evidence.failures - evidence.expected);
    if (evidence.flagged) {
      flagged.push_back(evidence.device);
    }
    report.ranked.push_back(std::move(node));
  };
  for (const DeviceEvidence& evidence : report.attribution.suspects) {
    add_ranked(evidence);
  }
  for (const DeviceEvidence& evidence : report.attribution.runners_up) {
    add_ranked(evidence);
  }
  report.drained = engine.Concentration(flagged, report.attribution.rates);
  for (const SlurmRun& run : runs) {
    if (run.reason != ExitReason::kInfraError && run.reason != ExitReason::kHang) {
      continue;
    }
    const bool involved = std::any_of(
        run.gpus_on_node.begin(), run.gpus_on_node.end(), [&flagged](const auto& entry) {
          return std::find(flagged.begin(), flagged.end(),
                           reliability::Device::OfNode(NodeId(entry.first))) != flagged.end();
        });
    if (involved) {
      report.drained_failed_gpu_hours +=
          run.gpus() * static_cast<double>(run.end - run.start) / 3600.0;
    }
  }
  return report;
}

std::string RenderSlurmFailureReport(const SlurmFailureReport& report, int top) {
  std::string text;
  const SlurmOutcomeCounts& o = report.outcomes;
  text += fmt::format("{}: {} rows, {} GPU jobs on {} nodes ({} GPUs); left out or folded: {}\n",
                      report.source, report.rows, report.jobs, report.nodes, report.gpus,
                      report.skipped.ToString());
  text += fmt::format(
      "outcomes: {} completed, {} cancelled, {} preempted, {} the jobs' own errors (FAILED with "
      "an exit code, OUT_OF_MEMORY), {} infrastructure failures (NODE_FAIL, BOOT_FAIL, killed by "
      "a signal; {} naming their node), {} hangs (TIMEOUT)\n",
      o.succeeded, o.cancelled, o.preempted, o.application, o.infrastructure, o.node_named,
      o.hangs);
  if (o.without_nodes > 0) {
    text += fmt::format("{} jobs without a NodeList left out\n", o.without_nodes);
  }
  const reliability::AttributionReport& a = report.attribution;
  text += fmt::format(
      "fleet rates: {:.3g} unattributed failures per GPU-hour over {:.0f} GPU-hours; {} failed "
      "runs counted against devices\n",
      a.rates.unattributed_rate, a.rates.gpu_hours, a.failed_runs);
  const reliability::FailureConcentration& d = report.drained;
  if (d.devices == 0) {
    text += "No lemon nodes: no node fails more jobs than its exposure explains.\n";
  } else {
    text += fmt::format(
        "Draining these {} nodes ({} GPUs, {:.1f}% of the fleet) would have spared {} of {} "
        "failed runs ({:.1f}%), {:.1f} failures more than average nodes would have had, and "
        "{:.1f} GPU-hours of failed work.\n",
        d.devices, d.gpus, 100 * d.fleet_share, d.failed_runs_involving, d.failed_runs,
        100 * d.failed_share, d.avoidable, report.drained_failed_gpu_hours);
  }
  text += fmt::format("\n{:<4} {:<16} {:>6} {:>8} {:>6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10} {}\n",
                      "RANK", "NODE", "RUNS", "FAILURES", "NAMED", "GPU-HOURS", "EXPECTED",
                      "P-VALUE", "Q-VALUE", "AVOIDABLE", "FAILED-GPUH", "FLAGGED");
  int rank = 0;
  for (const SlurmNodeFailures& node : report.ranked) {
    if (rank >= top && !node.evidence.flagged) {
      break;
    }
    const DeviceEvidence& e = node.evidence;
    text += fmt::format(
        "{:<4} {:<16} {:>6} {:>8} {:>6} {:>10.1f} {:>9.3g} {:>9.2g} {:>9.2g} {:>9.1f} {:>10.1f} "
        "{}\n",
        ++rank, e.device.id, e.runs, e.failures, e.attributed_failures, e.gpu_hours, e.expected,
        e.p_value, e.q_value, node.avoidable, node.failed_gpu_hours, e.flagged ? "yes" : "no");
  }
  return text;
}

void WriteSlurmFailureJson(const SlurmFailureReport& report, std::ostream& out) {
  using nlohmann::json;
  const reliability::AttributionReport& a = report.attribution;
  auto number = [](double value) { return std::isfinite(value) ? json(value) : json(nullptr); };
  int rank = 0;
  auto node_json = [&](const SlurmNodeFailures& node) {
    const DeviceEvidence& e = node.evidence;
    json health = json::object();
    for (const auto& [check, count] : e.health_checks) {
      health[check] = count;
    }
    return json{{"rank", ++rank},
                {"device", "node"},
                {"id", e.device.id},
                {"node", e.device.id},
                {"runs", e.runs},
                {"failures", e.failures},
                {"named_failures", e.attributed_failures},
                {"gpu_hours", e.gpu_hours},
                {"expected", e.expected},
                {"rate_ratio", number(e.RateRatio())},
                {"p_value", e.p_value},
                {"q_value", e.q_value},
                {"flagged", e.flagged},
                {"health_checks", std::move(health)},
                {"failed_runs", node.failed_runs},
                {"failed_gpu_hours", node.failed_gpu_hours},
                {"avoidable", node.avoidable}};
  };
  json suspects = json::array();
  json runners_up = json::array();
  for (const SlurmNodeFailures& node : report.ranked) {
    (node.evidence.flagged ? suspects : runners_up).push_back(node_json(node));
  }
  const reliability::FailureConcentration& d = report.drained;
  const SlurmOutcomeCounts& o = report.outcomes;
  const SacctSkipCounts& s = report.skipped;
  json doc = {{"source", report.source},
              {"fleet", {{"gpus", report.gpus}, {"nodes", report.nodes}}},
              {"rows", report.rows},
              {"runs", a.runs},
              {"failed_runs", a.failed_runs},
              {"unattributed_failed_runs", a.unattributed_failed_runs},
              {"application_failed_runs", a.application_failed_runs},
              {"outcomes",
               {{"completed", o.succeeded},
                {"cancelled", o.cancelled},
                {"preempted", o.preempted},
                {"application", o.application},
                {"infrastructure", o.infrastructure},
                {"infrastructure_naming_node", o.node_named},
                {"hangs", o.hangs},
                {"without_nodes", o.without_nodes}}},
              {"skipped",
               {{"steps", s.steps},
                {"batch_extern", s.batch_extern},
                {"cpu_only", s.cpu_only},
                {"cancelled_before_start", s.cancelled_before_start},
                {"not_started", s.not_started},
                {"not_ended", s.not_ended},
                {"het_components_folded", s.het_components_folded},
                {"array_tasks", s.array_tasks}}},
              {"rates",
               {{"gpu_hours", a.rates.gpu_hours},
                {"gpu_per_gpu_hour", a.rates.gpu_rate},
                {"node_per_gpu_hour", a.rates.node_rate},
                {"unattributed_per_gpu_hour", a.rates.unattributed_rate}}},
              {"concentration",
               {{"devices", d.devices},
                {"gpus", d.gpus},
                {"fleet_share", d.fleet_share},
                {"failed_runs", d.failed_runs},
                {"failed_runs_involving", d.failed_runs_involving},
                {"failed_share", d.failed_share},
                {"expected_involving", d.expected_involving},
                {"avoidable", d.avoidable},
                {"failed_gpu_hours_involving", report.drained_failed_gpu_hours}}},
              {"summary", reliability::ConcentrationSummary(d)},
              {"suspects", std::move(suspects)},
              {"runners_up", std::move(runners_up)}};
  out << doc.dump(2) << "\n";
}

}  // namespace gpufleet::sim
