// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <istream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/sim/trace.h"

// Loaders of time-based traces for the simulator's replay mode (formats in docs/traces.md):
//   philly  the Pollux artifact's compact Philly job list (timestamp,duration,num_gpus,...)
//   gavel   Gavel's per-virtual-cluster Philly traces (7 tab-separated fields, no header)
//   pollux  Pollux and Sia workloads (name,time,application,num_replicas,batch_size)
//   native  gpufleet's own CSV (submit_time,duration,tasks,gpus_per_task,...)
//   sacct   Slurm `sacct --parsable2` output
//
// Every loader returns the whole trace or an error: a bad row fails the load, and the message
// names the file and line ("philly.csv:12: column \"duration\": ..."), the column where there is
// one, and the bad value. Jobs come out stably sorted by submit time, rebased so that the first
// job arrives at 0; each has one task group, its duration as runtime estimate and kind batch
// unless the format says otherwise. A file without jobs is an error. kNotFound when the file
// cannot be opened, kInvalidArgument otherwise. The catalog is only read: GPU model names a trace
// does not know are errors, never registered.
namespace gpufleet::sim {

// GPUs on one node assumed when a trace gives only a job's GPU count.
inline constexpr int kTraceGpusPerNode = 8;

// How a job of `gpus` whole GPUs becomes tasks: `tasks` tasks of `gpus_per_task` GPUs, where
// `gpus_per_task` is the largest divisor of `gpus` that is at most kTraceGpusPerNode. So 1..8 GPUs
// are one task, a multiple of 8 is gpus / 8 tasks of 8, 12 is 2 x 6, and a prime above 8 (11) is
// 11 x 1. REQUIRES: gpus >= 1.
struct TaskSplit {
  int tasks = 1;
  int gpus_per_task = 1;
};
TaskSplit SplitGpus(int gpus);

// Run time in seconds of a Pollux/Sia job alone with a fixed configuration on Pollux's testbed
// (derived from the artifact's throughput and validation profiles, see docs/traces.md); nullopt
// for a configuration that no shipped workload uses.
std::optional<int64_t> PolluxDurationSeconds(std::string_view application, int num_replicas,
                                             int batch_size);

// Training steps per second that turn a Gavel job's total_steps back into its Philly run time
// (see docs/traces.md); nullopt for an unknown job type.
std::optional<double> GavelStepsPerSecond(std::string_view job_type);

// `timestamp,duration,num_gpus,gpu_time,cluster`; queue = cluster, ids "philly-<row>".
Result<Trace> ReadPhilly(std::istream& in, const std::string& source, const GpuCatalog& catalog);
Result<Trace> LoadPhilly(const std::string& path, const GpuCatalog& catalog);

// `job_type \t command \t num_steps_arg \t needs_data_dir \t total_steps \t arrival_time \t
// scale_factor`; queue = the file's stem (the Philly virtual cluster), ids "<stem>-<row>".
Result<Trace> ReadGavel(std::istream& in, const std::string& source, const GpuCatalog& catalog);
Result<Trace> LoadGavel(const std::string& path, const GpuCatalog& catalog);

// `name,time,application,num_replicas,batch_size`; ids = name, queue "default".
Result<Trace> ReadPollux(std::istream& in, const std::string& source, const GpuCatalog& catalog);
Result<Trace> LoadPollux(const std::string& path, const GpuCatalog& catalog);

// `[id,]submit_time,duration,tasks,gpus_per_task,gpu_milli,allowed_models,queue,priority,kind,
// user` in any column order.
Result<Trace> ReadNative(std::istream& in, const std::string& source, const GpuCatalog& catalog);
Result<Trace> LoadNative(const std::string& path, const GpuCatalog& catalog);

// `sacct --parsable2` output read by ReadSacctHistory (slurm_history.h) with default options:
// the trace only. GPU types no table or catalog knows join the catalog (and are counted there).
Result<Trace> ReadSacct(std::istream& in, const std::string& source, GpuCatalog& catalog);
Result<Trace> LoadSacct(const std::string& path, GpuCatalog& catalog);

// An openb pod list replayed over time: each pod that ever started arrives at its creation_time
// and runs for deletion_time - scheduled_time; pods without a scheduled_time are left out. GPU
// models first seen in the file join the catalog.
Result<Trace> ReadOpenbTrace(std::istream& in, const std::string& source, GpuCatalog& catalog);
Result<Trace> LoadOpenbTrace(const std::string& path, GpuCatalog& catalog);

// "philly", "openb", "native", "sacct", "gavel", "pollux".
const std::vector<std::string>& TraceFormatNames();

// Loads `path` as `format` (one of TraceFormatNames()); any other name is kInvalidArgument
// listing the formats. `catalog` gains the GPU models an openb file names first.
Result<Trace> LoadTrace(const std::string& path, std::string_view format, GpuCatalog& catalog);

}  // namespace gpufleet::sim
