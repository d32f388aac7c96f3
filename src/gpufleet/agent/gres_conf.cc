// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/gres_conf.h"

#include <dirent.h>

#include <cctype>
#include <fstream>
#include <set>
#include <tuple>
#include <vector>

#include <fmt/format.h>

namespace gpufleet::agent {
namespace {

// "0-3,8,10-11" for an ascending set.
std::string Ranges(const std::set<int>& values) {
  std::vector<std::string> parts;
  for (auto it = values.begin(); it != values.end();) {
    const int first = *it;
    int last = first;
    for (++it; it != values.end() && *it == last + 1; ++it) {
      last = *it;
    }
    parts.push_back(first == last ? fmt::format("{}", first) : fmt::format("{}-{}", first, last));
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

Result<int> ReadInt(const std::string& path) {
  std::ifstream in(path);
  int value = 0;
  if (!(in >> value)) {
    return UnavailableError(fmt::format("{}: cannot read a number", path));
  }
  return value;
}

}  // namespace

Result<CpuCoreMap> ReadCpuCoreMap(const std::string& cpu_root) {
  DIR* dir = opendir(cpu_root.c_str());
  if (dir == nullptr) {
    return UnavailableError(fmt::format("{}: cannot open", cpu_root));
  }
  std::vector<int> cpus;
  while (const dirent* entry = readdir(dir)) {
    const std::string_view name = entry->d_name;
    if (name.size() > 3 && name.starts_with("cpu") &&
        std::isdigit(static_cast<unsigned char>(name[3])) != 0 &&
        name.find_first_not_of("0123456789", 3) == std::string_view::npos) {
      cpus.push_back(std::stoi(std::string(name.substr(3))));
    }
  }
  closedir(dir);
  // (socket, core id) -> the CPUs of that core.
  std::map<std::pair<int, int>, std::vector<int>> cores;
  for (int cpu : cpus) {
    const std::string topology = fmt::format("{}/cpu{}/topology/", cpu_root, cpu);
    GPUFLEET_ASSIGN_OR_RETURN(const int socket, ReadInt(topology + "physical_package_id"));
    GPUFLEET_ASSIGN_OR_RETURN(const int core, ReadInt(topology + "core_id"));
    cores[{socket, core}].push_back(cpu);
  }
  CpuCoreMap map;
  int index = 0;
  for (const auto& [key, members] : cores) {
    for (int cpu : members) {
      map[cpu] = index;
    }
    ++index;
  }
  if (map.empty()) {
    return UnavailableError(fmt::format("{}: no cpuN directories", cpu_root));
  }
  return map;
}

std::string GresType(const GpuStaticInfo& info) {
  std::string type;
  if (!info.model.empty()) {
    for (char c : info.model) {
      type += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return type;
  }
  for (char c : info.nvml_name) {
    type += c == ' ' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return type;
}

Result<std::string> RenderGresConf(const ProbeInventory& inventory, const CpuCoreMap& cores,
                                   std::string_view hostname) {
  if (inventory.gpus.empty()) {
    return InvalidArgumentError("gres.conf: the node has no GPU");
  }
  std::map<std::string, size_t> position;  // bus id -> line
  for (size_t g = 0; g < inventory.gpus.size(); ++g) {
    position[inventory.gpus[g].pci_bus_id] = g;
  }
  std::vector<std::vector<int>> links(inventory.gpus.size(),
                                      std::vector<int>(inventory.gpus.size(), 0));
  bool any_link = false;
  for (size_t g = 0; g < inventory.gpus.size(); ++g) {
    links[g][g] = -1;
    for (const std::string& remote : inventory.gpus[g].nvlink_remote_bus_ids) {
      auto it = position.find(remote);
      if (it != position.end() && it->second != g) {
        ++links[g][it->second];
        any_link = true;
      }
    }
  }
  std::string out = fmt::format(
      "# gres.conf for {}: {} GPU(s), driver {}, written by gpufleet probe --gres-conf\n",
      hostname.empty() ? "this node" : hostname, inventory.gpus.size(), inventory.driver_version);
  for (size_t g = 0; g < inventory.gpus.size(); ++g) {
    const GpuStaticInfo& gpu = inventory.gpus[g];
    if (!gpu.minor_number.has_value()) {
      return FailedPreconditionError(
          fmt::format("GPU {} ({}): NVML gives no minor number (nvmlDeviceGetMinorNumber), so "
                      "its File=/dev/nvidiaN is unknown",
                      gpu.index, gpu.pci_bus_id));
    }
    if (gpu.mig_enabled) {
      out += fmt::format(
          "# GPU {} is in MIG mode: Slurm schedules MIG devices only with AutoDetect=nvml\n",
          gpu.index);
    }
    std::string line =
        fmt::format("Name=gpu Type={} File=/dev/nvidia{}", GresType(gpu), *gpu.minor_number);
    if (!gpu.cpu_affinity.empty()) {
      std::set<int> core_set;
      for (int cpu : gpu.cpu_affinity) {
        auto it = cores.find(cpu);
        if (it == cores.end()) {
          return FailedPreconditionError(fmt::format(
              "GPU {}: CPU {} of its affinity is not among the node's CPUs", gpu.index, cpu));
        }
        core_set.insert(it->second);
      }
      line += " Cores=" + Ranges(core_set);
    }
    if (any_link) {
      line += fmt::format(" Links={}", fmt::join(links[g], ","));
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace gpufleet::agent
