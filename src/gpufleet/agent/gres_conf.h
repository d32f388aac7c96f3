// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "gpufleet/agent/gpu_probe.h"
#include "gpufleet/core/status.h"

// Slurm's gres.conf for a node's GPUs, from what the probe read (`gpufleet probe --gres-conf`):
//   Name=gpu Type=h100-80gb File=/dev/nvidia0 Cores=0-23 Links=-1,18,18,18
namespace gpufleet::agent {

// Logical CPU id -> Slurm's core index: cores numbered socket by socket in the order of their
// core ids, hyperthreads of one core sharing its index. gres.conf's Cores= takes these "logical
// core" indices, not the CPU ids NVML's affinity mask gives.
using CpuCoreMap = std::map<int, int>;

// Reads the map from `cpu_root` (/sys/devices/system/cpu): cpuN/topology/physical_package_id
// and core_id for every cpuN. kUnavailable naming the file when a CPU's topology is unreadable.
Result<CpuCoreMap> ReadCpuCoreMap(const std::string& cpu_root = "/sys/devices/system/cpu");

// The Type= of a GPU: its catalog model lower-cased ("H100-80GB" -> "h100-80gb", which
// `gpufleet sim replay` maps back), or else NVML's name as Slurm's AutoDetect=nvml writes it
// ("NVIDIA Foo 48GB" -> "nvidia_foo_48gb").
std::string GresType(const GpuStaticInfo& info);

// One line per GPU, by index, after a comment naming the source: Name=gpu, Type=, File=/dev/nvidiaN
// (the minor number), Cores= (the GPU's CPU affinity as core ranges, left out when NVML gives
// none) and Links= (per GPU, in the order of the lines: active NVLinks to that GPU's bus id, -1 for
// the GPU itself; left out when no GPU has an NVLink to another). Links to NVSwitches name no GPU
// and count 0, as in Slurm's own autodetection. kFailedPrecondition naming the GPU when its minor
// number is unknown (File= cannot be written) or a CPU is missing from `cores`; kInvalidArgument
// when `inventory` has no GPU. MIG-enabled GPUs are written whole, with a comment: Slurm's MIG
// support needs AutoDetect=nvml.
Result<std::string> RenderGresConf(const ProbeInventory& inventory, const CpuCoreMap& cores,
                                   std::string_view hostname);

}  // namespace gpufleet::agent
