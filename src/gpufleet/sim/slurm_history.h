// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/fabric/fabric.h"
#include "gpufleet/sim/csv.h"
#include "gpufleet/sim/trace.h"

// A Slurm site's own history (`sacct --parsable2`) and machines (`scontrol show nodes`), read as
// they are: the jobs to replay, what was left out and why, and the cluster they ran on
// (docs/slurm.md).
namespace gpufleet::sim {

// The catalog model of each `gres/gpu:TYPE` a site is likely to configure, lower-case TYPE ->
// model ("a100" -> A100-40GB, "a100_80g" -> A100-80GB, "h100" -> H100-80GB, ...). A TYPE not in
// the table is looked up in the catalog as written, then upper-cased.
const std::map<std::string, std::string, std::less<>>& DefaultGresTypeModels();

// "TYPE=MODEL,TYPE=MODEL" (`--gres-map`) as TYPE -> canonical model. kInvalidArgument naming the
// entry for one that is not TYPE=MODEL or a MODEL the catalog does not know.
Result<std::map<std::string, std::string, std::less<>>> ParseGresMap(std::string_view text,
                                                                     const GpuCatalog& catalog);

struct SacctOptions {
  // TYPE -> catalog model; wins over DefaultGresTypeModels().
  std::map<std::string, std::string, std::less<>> gres_map;
  // Model of the GPUs of untyped `gres/gpu=N` allocations when the cluster is inferred.
  std::string untyped_gpu_model = "H100-80GB";
};

// One job of the history that ran (a Start and an End) and held GPUs: a row that is not a step,
// with its components folded when it is a heterogeneous job. Times are Unix seconds, Slurm's
// local time read as UTC.
struct SacctJob {
  std::string id;  // JobID: "1234", "1234_7" (array task), "1234" for het job "1234+K"
  int line = 0;    // of its first row
  int64_t submit = 0;
  int64_t arrival = 0;  // Eligible when it is a time, else Submit
  int64_t start = 0;
  int64_t end = 0;
  std::string state;  // first word of State: "CANCELLED by 42" is CANCELLED
  bool has_exit_code = false;
  int exit_code = 0;    // ExitCode "N:S": N
  int exit_signal = 0;  // S
  std::string partition;
  std::string user;
  int64_t time_limit_seconds = 0;  // Timelimit; 0 when absent, UNLIMITED or Partition_Limit
  // One per component (one for a job that is not heterogeneous).
  struct Component {
    int nodes = 1;                        // NNodes
    std::vector<std::string> node_names;  // NodeList expanded; empty without the column
    int64_t gpus = 0;                     // whole job component, all nodes
    std::vector<std::string> gpu_models;  // of its typed entries; empty: any model
    int64_t cpus = 0;
    int64_t memory_mib = 0;
  };
  std::vector<Component> components;

  int64_t Gpus() const;
};

// What the reader left out, by reason, and what it folded.
struct SacctSkipCounts {
  int steps = 0;                   // "ID.0", "ID.N"
  int batch_extern = 0;            // "ID.batch", "ID.extern", "ID.interactive"
  int cpu_only = 0;                // jobs without GPUs
  int cancelled_before_start = 0;  // CANCELLED with Start Unknown/None
  int not_started = 0;             // other jobs without a Start: BOOT_FAIL, ...
  int not_ended = 0;               // PENDING, RUNNING, SUSPENDED, REQUEUED, ... (no End yet)
  int zero_length = 0;             // End = Start: ran under a second (replay only)
  int het_components_folded = 0;   // rows "ID+K", K > 0, joined to their job's gang
  int array_tasks = 0;             // rows "ID_K": replayed each as a job (counted, not skipped)
  int Skipped() const;             // all but the last two
  // "12 steps, 10 .batch/.extern, ..." of the non-zero counts; "nothing" when all are 0.
  std::string ToString() const;
};

// Streams sacct output (`--parsable2` or `--parsable`), header required, one job at a time:
// never holds more than one line and the het job being folded. Columns are read by header name;
// JobID, Submit, Start, End, State, NNodes and AllocTRES are required, Partition, User, Eligible,
// ExitCode, NodeList and Timelimit used when present (docs/slurm.md). A GPU type neither in
// `options.gres_map`, DefaultGresTypeModels() nor the catalog is registered in `catalog` as a
// model of its own, counted in unmapped_gpu_types() (TYPE -> jobs), never silently dropped.
// kInvalidArgument "file:line: column \"X\": ..." for a bad row: a missing column, a truncated
// line (too few fields), an unknown state, a malformed time, End before Start, Start before
// Submit or Eligible, a GPU count that does not split over NNodes. Not thread-safe.
class SacctReader {
 public:
  // REQUIRES: `in` and `catalog` outlive the reader.
  SacctReader(std::istream& in, std::string source, SacctOptions options, GpuCatalog& catalog);

  Status Open();
  // The next job; nullopt at the end of the input.
  Result<std::optional<SacctJob>> Next();

  const SacctSkipCounts& skipped() const { return skipped_; }
  const std::map<std::string, int>& unmapped_gpu_types() const { return unmapped_; }
  bool has_node_list() const { return node_list_ >= 0; }
  int rows() const { return rows_; }
  int line() const { return reader_.line(); }
  const std::string& source() const { return reader_.source(); }

 private:
  // The current row as a job; nullopt when skipped.
  Result<std::optional<SacctJob>> ReadRow();
  Result<std::string> GpuTypeModel(std::string_view type);
  Status ParseAllocTres(SacctJob::Component& component, std::vector<std::string>& types);

  DelimitedReader reader_;
  SacctOptions options_;
  GpuCatalog& catalog_;
  int job_id_ = -1, submit_ = -1, start_ = -1, end_ = -1, state_ = -1, nnodes_ = -1;
  int alloc_tres_ = -1, partition_ = -1, user_ = -1, eligible_ = -1, exit_code_ = -1;
  int node_list_ = -1, time_limit_ = -1;
  SacctSkipCounts skipped_;
  std::map<std::string, int> unmapped_;
  std::optional<SacctJob> pending_;  // a job whose het components may follow
  std::string pending_het_;          // its het leader id, empty when not a het job
  std::string row_het_leader_;       // of the row just read
  std::set<std::string, std::less<>> registered_types_;  // GPU types this reader registered
  int rows_ = 0;
  bool done_ = false;
};

// One node as Slurm knows it. `gpu_models` has one entry per GPU.
struct SlurmNodeShape {
  std::string name;
  std::vector<std::string> gpu_models;
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
};

// A history loaded for replay.
struct SacctHistory {
  Trace trace;
  SacctSkipCounts skipped;
  std::map<std::string, int> unmapped_gpu_types;  // TYPE -> jobs
  // The cluster the history implies (InferSlurmNodes); sorted by name.
  std::vector<SlurmNodeShape> nodes;
  bool nodes_named = false;  // from NodeList; false: anonymous nodes sized from the allocations
  int rows = 0;
};

// Reads the whole history: each job becomes a trace job arriving at its `arrival`, running
// End - Start, with Timelimit as its runtime estimate (else its duration), one task group per
// component of NNodes tasks of GPUs / NNodes whole GPUs with cpu and mem split likewise, queue =
// Partition. Jobs of 0 s are skipped (counted). kInvalidArgument as SacctReader, or "no jobs to
// replay" with the skip counts.
Result<SacctHistory> ReadSacctHistory(std::istream& in, const std::string& source,
                                      const SacctOptions& options, GpuCatalog& catalog);
Result<SacctHistory> LoadSacctHistory(const std::string& path, const SacctOptions& options,
                                      GpuCatalog& catalog);

// The nodes a set of jobs ran on. With node names: each node gets, over time, the most GPUs,
// CPUs and memory its jobs held at once (a multi-node component's share per node), and the GPU
// model its typed jobs used most (`untyped_gpu_model` when none was typed). Without: for each
// GPU model, nodes of the most GPUs one job held on one node, as many as the most GPUs held at
// once need (at least the most nodes one job used), named "<model>-NNN", with CPUs and memory
// for the hungriest job per GPU on a full node.
class SlurmNodeInference {
 public:
  explicit SlurmNodeInference(std::string untyped_gpu_model);
  void Add(const SacctJob& job);
  std::vector<SlurmNodeShape> Nodes() const;
  bool named() const { return named_; }

 private:
  struct Usage {
    std::vector<std::pair<int64_t, int64_t>> gpus;  // (time, +/- GPUs)
    std::vector<std::pair<int64_t, int64_t>> cpus;
    std::vector<std::pair<int64_t, int64_t>> memory;
    std::map<std::string, int> models;  // model -> jobs
  };
  std::string untyped_gpu_model_;
  bool named_ = true;
  std::map<std::string, Usage> by_node_;   // node name -> usage
  std::map<std::string, Usage> by_model_;  // anonymous: model -> usage of all its jobs
  std::map<std::string, int64_t> widest_;  // anonymous: model -> most GPUs per node of one job
  std::map<std::string, int> most_nodes_;  // anonymous: model -> most nodes of one job
  struct HostNeed {
    int64_t cpu_milli = 0;  // most of one job on one node
    int64_t memory_mib = 0;
    int64_t cpu_milli_per_gpu = 0;  // most per GPU of one job
    int64_t memory_mib_per_gpu = 0;
  };
  std::map<std::string, HostNeed> host_need_;  // anonymous: by model
};

// `scontrol show nodes` output: records start at NodeName=; CPUTot, RealMemory (MiB) and Gres
// (gpu:TYPE:N, gpu:N, several comma-separated, "(S:0-1)" socket suffixes) are read, other keys
// ignored. GPU types map as in SacctReader (unknown ones registered in `catalog`); untyped GPUs
// are `options.untyped_gpu_model`. kInvalidArgument "file:line: ..." for a malformed Gres or
// number, or a file without nodes.
Result<std::vector<SlurmNodeShape>> ParseScontrolNodes(std::string_view text,
                                                       const std::string& source,
                                                       const SacctOptions& options,
                                                       GpuCatalog& catalog);

// A flat cluster (no network levels) of `nodes`; GPUs named "<node>-gpuI". kInvalidArgument for
// a node without GPUs only when every node has none.
Result<Cluster> BuildSlurmCluster(const std::vector<SlurmNodeShape>& nodes,
                                  const GpuCatalog& catalog);

// Gives every node of `spec` (imported from topology.conf) the GPUs, CPUs and memory of its
// namesake in `nodes`; a node of the file that is not in `nodes` gets no GPUs (it ran no GPU
// job); nodes of `nodes` that the file lacks join uncabled. Returns the names of both kinds
// for warnings: {not_in_nodes, not_in_file}.
struct FabricShapeMismatch {
  std::vector<std::string> not_in_nodes;
  std::vector<std::string> not_in_file;
};
Result<FabricShapeMismatch> ApplySlurmNodeShapes(fabric::FabricSpec& spec,
                                                 const std::vector<SlurmNodeShape>& nodes);

}  // namespace gpufleet::sim
