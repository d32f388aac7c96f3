// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

namespace gpufleet {

// One whole GPU in milli-GPU, and one CPU core in milli-CPU.
inline constexpr int64_t kMilliPerUnit = 1000;

// Host resources of a node or a task, in integer units: milli-CPU and MiB. GPUs are counted per
// device (see cluster.h), never folded into a scalar here. Thread-compatible value type.
struct HostResources {
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;

  HostResources& operator+=(const HostResources& other) {
    cpu_milli += other.cpu_milli;
    memory_mib += other.memory_mib;
    return *this;
  }
  HostResources& operator-=(const HostResources& other) {
    cpu_milli -= other.cpu_milli;
    memory_mib -= other.memory_mib;
    return *this;
  }
  friend HostResources operator+(HostResources a, const HostResources& b) { return a += b; }
  friend HostResources operator-(HostResources a, const HostResources& b) { return a -= b; }
  friend bool operator==(const HostResources&, const HostResources&) = default;

  // True when every component of `request` is at most the one here.
  bool Covers(const HostResources& request) const {
    return request.cpu_milli <= cpu_milli && request.memory_mib <= memory_mib;
  }
  bool IsNonNegative() const { return cpu_milli >= 0 && memory_mib >= 0; }
  std::string ToString() const;
};

}  // namespace gpufleet
