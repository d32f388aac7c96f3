// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

namespace gpufleet::api_testing {

// The JSON spec of a job `name` of one task asking for 1 CPU, 1 GiB and `gpus` whole GPUs.
std::string OneTaskJobJson(const std::string& name, int gpus = 1);
// The same with `replicas` such tasks in its one task group.
std::string GangJobJson(const std::string& name, int replicas, int gpus);

}  // namespace gpufleet::api_testing
