// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/openb.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

const std::string kDataDir = GPUFLEET_TEST_DATA_DIR;

TEST(Openb, LoadsTheBundledNodeList) {
  GpuCatalog catalog = GpuCatalog::Default();
  auto cluster = LoadOpenbNodes(kDataDir + "/openb/openb_node_list_gpu_node.csv", catalog);
  ASSERT_OK(cluster);
  EXPECT_EQ(cluster->nodes.size(), 1213U);
  std::map<std::string, int> gpus;
  for (const Node& node : cluster->nodes) {
    for (const Gpu& gpu : node.gpus) {
      ++gpus[gpu.model];
    }
  }
  EXPECT_EQ(gpus["G2"], 4392);
  EXPECT_EQ(gpus["T4"], 842);
  EXPECT_EQ(gpus["V100-32GB"], 204);
  EXPECT_EQ(gpus["V100-16GB"], 195);
  EXPECT_TRUE(catalog.Find("G3").value()->from_trace);
}

TEST(Openb, LoadsTheBundledDefaultPodList) {
  GpuCatalog catalog = GpuCatalog::Default();
  auto pods = LoadOpenbPods(kDataDir + "/openb/openb_pod_list_default.csv", catalog);
  ASSERT_OK(pods);
  EXPECT_EQ(pods->size(), 8152U);
  int cpu_only = 0;
  int fractional = 0;
  int64_t requested = 0;
  for (const Job& pod : *pods) {
    cpu_only += std::holds_alternative<NoGpu>(pod.groups[0].request.gpus) ? 1 : 0;
    fractional += std::holds_alternative<FractionalGpu>(pod.groups[0].request.gpus) ? 1 : 0;
    requested += pod.RequestedGpuMilliTotal();
  }
  EXPECT_EQ(cpu_only, 1088);
  EXPECT_EQ(fractional, 3078);
  EXPECT_EQ(requested, 6086800);
}

TEST(Openb, BadRowsNameFileLineAndColumn) {
  struct Case {
    const char* text;
    const char* expected;
  };
  const std::string header =
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
      "deletion_time,scheduled_time\n";
  const Case cases[] = {
      {"p1,1000,10,1,abc,,LS,Running,0,1,0\n", "pods.csv:2: column \"gpu_milli\": \"abc\""},
      {"p1,1000,10,2,500,,LS,Running,0,1,0\n", "a share is for one GPU only"},
      {"p1,1000,10,1,1500,,LS,Running,0,1,0\n", "1500 (must be 1..1000 when num_gpu is 1)"},
      {"p1,1000,10\n", "pods.csv:2: 3 fields, the header has 11"},
      {",1000,10,1,500,,LS,Running,0,1,0\n", "empty pod name"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    GpuCatalog catalog = GpuCatalog::Default();
    std::istringstream in(header + c.text);
    EXPECT_THAT(ReadOpenbPods(in, "pods.csv", catalog),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.expected)));
  }
  GpuCatalog catalog = GpuCatalog::Default();
  std::istringstream missing("name,cpu_milli,memory_mib,num_gpu\np,1,1,0\n");
  EXPECT_THAT(ReadOpenbPods(missing, "pods.csv", catalog),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("missing column \"gpu_milli\"")));
  std::istringstream nodes("sn,cpu_milli,memory_mib,gpu,model\nn1,1000,10,2,\n");
  EXPECT_THAT(ReadOpenbNodes(nodes, "nodes.csv", catalog),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("nodes.csv:2: column \"model\": empty model for a node with 2")));
}

TEST(Openb, GpuSpecBecomesAllowedModels) {
  GpuCatalog catalog = GpuCatalog::Default();
  std::istringstream in(
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
      "a,1000,10,0,0\n");
  auto plain = ReadOpenbPods(in, "p.csv", catalog);
  ASSERT_OK(plain);
  EXPECT_TRUE(std::holds_alternative<NoGpu>((*plain)[0].groups[0].request.gpus));
  std::istringstream spec(
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
      "b,1000,10,2,1000,V100M16|G9\n");
  auto pods = ReadOpenbPods(spec, "p.csv", catalog);
  ASSERT_OK(pods);
  EXPECT_EQ((*pods)[0].allowed_gpu_models, (std::vector<std::string>{"V100-16GB", "G9"}));
  EXPECT_EQ(std::get<WholeGpus>((*pods)[0].groups[0].request.gpus).count, 2);
}

}  // namespace
}  // namespace gpufleet::sim
