// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/resources.h"

#include <fmt/format.h>

namespace gpufleet {

std::string HostResources::ToString() const {
  return fmt::format("cpu_milli={} memory_mib={}", cpu_milli, memory_mib);
}

}  // namespace gpufleet
