// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/openb.h"

#include <fstream>

#include <fmt/format.h>

#include "gpufleet/sim/csv.h"

namespace gpufleet::sim {
namespace {

Result<std::vector<std::string>> ParseGpuSpec(const CsvReader& csv, int column,
                                              GpuCatalog& catalog) {
  std::vector<std::string> models;
  const std::string& spec = csv.Field(column);
  size_t begin = 0;
  while (begin <= spec.size() && !spec.empty()) {
    const size_t end = std::min(spec.find('|', begin), spec.size());
    const std::string name = spec.substr(begin, end - begin);
    if (!name.empty()) {
      if (!catalog.Contains(name)) {
        GPUFLEET_RETURN_IF_ERROR(catalog.RegisterTraceModel(name, 0));
      }
      models.push_back(catalog.Canonical(name));
    }
    begin = end + 1;
  }
  return models;
}

}  // namespace

Result<Cluster> ReadOpenbNodes(std::istream& in, const std::string& source, GpuCatalog& catalog) {
  CsvReader csv(in, source);
  GPUFLEET_RETURN_IF_ERROR(csv.Open());
  GPUFLEET_ASSIGN_OR_RETURN(const int sn, csv.Column("sn"));
  GPUFLEET_ASSIGN_OR_RETURN(const int cpu, csv.Column("cpu_milli"));
  GPUFLEET_ASSIGN_OR_RETURN(const int memory, csv.Column("memory_mib"));
  GPUFLEET_ASSIGN_OR_RETURN(const int gpus, csv.Column("gpu"));
  GPUFLEET_ASSIGN_OR_RETURN(const int model_column, csv.Column("model"));
  Cluster cluster;
  while (true) {
    GPUFLEET_ASSIGN_OR_RETURN(const bool more, csv.Next());
    if (!more) {
      break;
    }
    Node node;
    if (csv.Field(sn).empty()) {
      return InvalidArgumentError(csv.Where(sn) + ": empty node name");
    }
    node.id = NodeId(csv.Field(sn));
    GPUFLEET_ASSIGN_OR_RETURN(node.capacity.cpu_milli, csv.Int(cpu));
    GPUFLEET_ASSIGN_OR_RETURN(node.capacity.memory_mib, csv.Int(memory));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t gpu_count, csv.Int(gpus));
    const std::string& model_name = csv.Field(model_column);
    if (gpu_count > 0 && model_name.empty()) {
      return InvalidArgumentError(csv.Where(model_column) +
                                  fmt::format(": empty model for a node with {} GPUs", gpu_count));
    }
    if (gpu_count > 0 && !catalog.Contains(model_name)) {
      GPUFLEET_RETURN_IF_ERROR(catalog.RegisterTraceModel(model_name, 0));
    }
    for (int64_t g = 0; g < gpu_count; ++g) {
      Gpu gpu;
      gpu.uuid = GpuUuid(fmt::format("GPU-{}-{}", node.id.value(), g));
      gpu.index = static_cast<int>(g);
      gpu.model = catalog.Canonical(model_name);
      node.gpus.push_back(std::move(gpu));
    }
    cluster.nodes.push_back(std::move(node));
  }
  GPUFLEET_RETURN_IF_ERROR(cluster.Validate(catalog));
  return cluster;
}

Result<Cluster> LoadOpenbNodes(const std::string& path, GpuCatalog& catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(std::ifstream in, OpenInputFile(path));
  return ReadOpenbNodes(in, path, catalog);
}

Result<std::vector<Job>> ReadOpenbPods(std::istream& in, const std::string& source,
                                       GpuCatalog& catalog) {
  CsvReader csv(in, source);
  GPUFLEET_RETURN_IF_ERROR(csv.Open());
  GPUFLEET_ASSIGN_OR_RETURN(const int name, csv.Column("name"));
  GPUFLEET_ASSIGN_OR_RETURN(const int cpu, csv.Column("cpu_milli"));
  GPUFLEET_ASSIGN_OR_RETURN(const int memory, csv.Column("memory_mib"));
  GPUFLEET_ASSIGN_OR_RETURN(const int num_gpu, csv.Column("num_gpu"));
  GPUFLEET_ASSIGN_OR_RETURN(const int gpu_milli, csv.Column("gpu_milli"));
  const int gpu_spec = csv.HasColumn("gpu_spec") ? csv.Column("gpu_spec").value() : -1;
  std::vector<Job> jobs;
  while (true) {
    GPUFLEET_ASSIGN_OR_RETURN(const bool more, csv.Next());
    if (!more) {
      break;
    }
    Job job;
    if (csv.Field(name).empty()) {
      return InvalidArgumentError(csv.Where(name) + ": empty pod name");
    }
    job.id = JobId(csv.Field(name));
    TaskGroup group;
    group.name = "pod";
    GPUFLEET_ASSIGN_OR_RETURN(group.request.host.cpu_milli, csv.Int(cpu));
    GPUFLEET_ASSIGN_OR_RETURN(group.request.host.memory_mib, csv.Int(memory));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t gpus, csv.Int(num_gpu));
    GPUFLEET_ASSIGN_OR_RETURN(const int64_t milli, csv.Int(gpu_milli));
    if (gpus > 0) {
      if (milli == 0 || milli > kMilliPerUnit) {
        return InvalidArgumentError(fmt::format("{}: {} (must be 1..1000 when num_gpu is {})",
                                                csv.Where(gpu_milli), milli, gpus));
      }
      if (milli < kMilliPerUnit && gpus > 1) {
        return InvalidArgumentError(
            fmt::format("{}: {} milli-GPU on each of {} GPUs (a share is for one GPU only)",
                        csv.Where(gpu_milli), milli, gpus));
      }
      if (milli < kMilliPerUnit) {
        group.request.gpus = FractionalGpu{milli, 0};
      } else {
        group.request.gpus = WholeGpus{static_cast<int>(gpus)};
      }
      if (gpu_spec >= 0) {
        GPUFLEET_ASSIGN_OR_RETURN(job.allowed_gpu_models, ParseGpuSpec(csv, gpu_spec, catalog));
      }
    }
    job.groups.push_back(std::move(group));
    jobs.push_back(std::move(job));
  }
  return jobs;
}

Result<std::vector<Job>> LoadOpenbPods(const std::string& path, GpuCatalog& catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(std::ifstream in, OpenInputFile(path));
  return ReadOpenbPods(in, path, catalog);
}

}  // namespace gpufleet::sim
