// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <istream>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/reliability/attribution.h"
#include "gpufleet/sim/slurm_history.h"

// Lemon nodes from a Slurm history (`gpufleet report failures --sacct FILE`): the server's
// exposure-adjusted failure attribution (reliability/attribution.h) over the jobs of sacct
// output, ranking the nodes behind most failures and what draining them would have saved.
namespace gpufleet::sim {

struct SlurmFailureOptions {
  // Window 0 (the whole history), GPUs never flagged and node spread 1 by default: sacct names
  // a job's nodes and GPU count, not which GPUs it held.
  reliability::AttributionOptions attribution = DefaultAttribution();
  // FAILED jobs whose exit code is one of these are infrastructure failures (a site's wrapper
  // that exits 74 on an NCCL or CUDA error, say), not the job's own.
  std::set<int> infra_exit_codes;
  // TIMEOUT as a hang (true: a run that stopped making progress, as NCCL hangs on a bad link
  // do) or as the job's own fault (false: its time limit was too short).
  bool timeouts_are_hangs = true;
  // The nodes and their GPUs (`scontrol show nodes`); empty: inferred from the history.
  std::vector<SlurmNodeShape> nodes;

  static reliability::AttributionOptions DefaultAttribution();
};

// How each job that ran was read.
struct SlurmOutcomeCounts {
  int succeeded = 0;       // COMPLETED
  int cancelled = 0;       // CANCELLED, DEADLINE
  int preempted = 0;       // PREEMPTED
  int application = 0;     // FAILED with an exit code, OUT_OF_MEMORY (TIMEOUT when not hangs)
  int infrastructure = 0;  // NODE_FAIL, BOOT_FAIL, FAILED by a signal or an infra exit code
  int hangs = 0;           // TIMEOUT
  int node_named = 0;      // of the infrastructure failures: one-node NODE_FAIL/BOOT_FAIL
  int without_nodes = 0;   // jobs without NodeList: left out, nothing to attribute them to
};

// One node's evidence with what draining it would have saved.
struct SlurmNodeFailures {
  reliability::DeviceEvidence evidence;  // device kind node
  // Failed runs (not the jobs' own errors) that ran on the node, and their GPU-hours.
  int failed_runs = 0;
  double failed_gpu_hours = 0;
  // Failures above what the node's exposure explains: max(0, failures - expected).
  double avoidable = 0;
};

struct SlurmFailureReport {
  std::string source;
  int rows = 0;
  int jobs = 0;  // runs given to the attribution
  SacctSkipCounts skipped;
  SlurmOutcomeCounts outcomes;
  int nodes = 0;
  int gpus = 0;
  reliability::AttributionReport attribution;
  // Nodes, best ranked first: the flagged ones, then the runners-up.
  std::vector<SlurmNodeFailures> ranked;
  // Draining the flagged nodes: the concentration of failures on them, and the GPU-hours of
  // the failed runs they were part of.
  reliability::FailureConcentration drained;
  double drained_failed_gpu_hours = 0;
};

// Reads the whole history (streaming) and analyses it. kInvalidArgument as SacctReader, or when
// no job names its nodes (no NodeList column: nothing to attribute failures to).
Result<SlurmFailureReport> AnalyzeSacctFailures(std::istream& in, const std::string& source,
                                                const SacctOptions& sacct,
                                                const SlurmFailureOptions& options,
                                                GpuCatalog& catalog);

// Text for people: what was read, how outcomes were classified, the ranked nodes with their
// p-values, q-values and savings, and the drain sentence.
std::string RenderSlurmFailureReport(const SlurmFailureReport& report, int top);

// JSON in the shape of the server's GET /v1/reports/failures (docs/api.md) where the two
// overlap ("runs", "failed_runs", "rates", "concentration", "summary", "suspects",
// "runners_up" with node entries only), plus "source", "skipped", "outcomes" and per node
// "failed_runs", "failed_gpu_hours", "avoidable"; pretty-printed.
void WriteSlurmFailureJson(const SlurmFailureReport& report, std::ostream& out);

}  // namespace gpufleet::sim
