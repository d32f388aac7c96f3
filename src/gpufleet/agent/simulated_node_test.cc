// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/simulated_node.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpufleet::agent {
namespace {

TEST(MergeMetricTextsTest, EachFamilyHeaderOnceWithEverySeries) {
  const std::string a =
      "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
      "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
      "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",Hostname=\"a\"} 10\n"
      "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n"
      "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
      "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",Hostname=\"a\"} 40\n";
  const std::string b =
      "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
      "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
      "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",Hostname=\"b\"} 90\n"
      "# HELP lat Latency.\n"
      "# TYPE lat histogram\n"
      "lat_bucket{le=\"1\"} 3\n"
      "lat_count 3\n";
  EXPECT_EQ(MergeMetricTexts({a, b}),
            "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
            "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",Hostname=\"a\"} 10\n"
            "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",Hostname=\"b\"} 90\n"
            "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n"
            "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
            "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",Hostname=\"a\"} 40\n"
            "# HELP lat Latency.\n"
            "# TYPE lat histogram\n"
            "lat_bucket{le=\"1\"} 3\n"
            "lat_count 3\n");
  EXPECT_EQ(MergeMetricTexts({}), "");
}

}  // namespace
}  // namespace gpufleet::agent
