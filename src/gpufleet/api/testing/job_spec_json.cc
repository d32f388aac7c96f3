// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/testing/job_spec_json.h"

#include <nlohmann/json.hpp>

namespace gpufleet::api_testing {

std::string OneTaskJobJson(const std::string& name, int gpus) {
  return GangJobJson(name, 1, gpus);
}

std::string GangJobJson(const std::string& name, int replicas, int gpus) {
  return nlohmann::json{
      {"apiVersion", "gpufleet.io/v1"},
      {"kind", "Job"},
      {"metadata", {{"name", name}}},
      {"spec",
       {{"tasks",
         {{{"name", "main"},
           {"command", {"train"}},
           {"replicas", replicas},
           {"resources", {{"cpu", "1"}, {"memory", "1Gi"}, {"gpus", {{"count", gpus}}}}}}}}}}}
      .dump();
}

}  // namespace gpufleet::api_testing
