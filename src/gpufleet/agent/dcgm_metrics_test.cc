// SPDX-License-Identifier: Apache-2.0
// Golden text derived from dcgm-exporter's format (telemetry.md §1): its text template, label
// order, help texts from default-counters.csv / dcp-metrics-included.csv, "%d" for INT64 fields
// and "%f" for DOUBLE ones.
#include "gpufleet/agent/dcgm_metrics.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpufleet::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

GpuReading H100Reading() {
  GpuReading reading;
  reading.info.index = 0;
  reading.info.uuid = "GPU-5e1c0c41-2c1c-9a45-7b0e-2d7e1f2a3b4c";
  reading.info.pci_bus_id = "00000000:18:00.0";
  reading.info.nvml_name = "NVIDIA H100 80GB HBM3";
  reading.info.model = "H100-80GB";
  reading.info.memory_mib = 81559;
  GpuSample& sample = reading.sample;
  sample.gpu_util_percent = 87;
  sample.memory_copy_util_percent = 41;
  sample.fb_used_mib = 40961;
  sample.fb_free_mib = 40086;
  sample.fb_reserved_mib = 512;
  sample.temperature_c = 64;
  sample.power_milliwatts = 612500;
  sample.sm_clock_mhz = 1980;
  sample.memory_clock_mhz = 2619;
  sample.xid_events_supported = true;
  sample.ecc_dbe_volatile_total = 0;
  sample.correctable_remapped_rows = 0;
  sample.uncorrectable_remapped_rows = 0;
  sample.row_remap_failure = false;
  sample.pcie_replay_count = 3;
  sample.sm_active = 0.783;
  sample.dram_active = 0.25;
  sample.tensor_active = 0.5;
  reading.last_xid = 0;
  return reading;
}

constexpr char kGpu0[] =
    R"(gpu="0",UUID="GPU-5e1c0c41-2c1c-9a45-7b0e-2d7e1f2a3b4c",pci_bus_id="00000000:18:00.0",)"
    R"(device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-7",)"
    R"(DCGM_FI_DRIVER_VERSION="550.54.15")";

TEST(DcgmMetrics, MatchesDcgmExporterText) {
  const std::string text =
      RenderDcgmMetrics({H100Reading()}, {.hostname = "node-7", .driver_version = "550.54.15"});
  const std::string g = kGpu0;
  const std::string expected =
      "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).\n"
      "# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n"
      "DCGM_FI_DEV_SM_CLOCK{" +
      g +
      "} 1980\n"
      "# HELP DCGM_FI_DEV_MEM_CLOCK Memory clock frequency (in MHz).\n"
      "# TYPE DCGM_FI_DEV_MEM_CLOCK gauge\n"
      "DCGM_FI_DEV_MEM_CLOCK{" +
      g +
      "} 2619\n"
      "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n"
      "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
      "DCGM_FI_DEV_GPU_TEMP{" +
      g +
      "} 64\n"
      "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n"
      "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
      "DCGM_FI_DEV_POWER_USAGE{" +
      g +
      "} 612.500000\n"
      "# HELP DCGM_FI_DEV_PCIE_REPLAY_COUNTER Total number of PCIe retries.\n"
      "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n"
      "DCGM_FI_DEV_PCIE_REPLAY_COUNTER{" +
      g +
      "} 3\n"
      "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
      "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
      "DCGM_FI_DEV_GPU_UTIL{" +
      g +
      "} 87\n"
      "# HELP DCGM_FI_DEV_MEM_COPY_UTIL Memory utilization (in %).\n"
      "# TYPE DCGM_FI_DEV_MEM_COPY_UTIL gauge\n"
      "DCGM_FI_DEV_MEM_COPY_UTIL{" +
      g +
      "} 41\n"
      "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n"
      "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"
      "DCGM_FI_DEV_XID_ERRORS{" +
      g +
      ",err_code=\"0\",err_msg=\"No Error\"} 0\n"
      "# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).\n"
      "# TYPE DCGM_FI_DEV_FB_FREE gauge\n"
      "DCGM_FI_DEV_FB_FREE{" +
      g +
      "} 40086\n"
      "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n"
      "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
      "DCGM_FI_DEV_FB_USED{" +
      g +
      "} 40961\n"
      "# HELP DCGM_FI_DEV_FB_RESERVED Framebuffer memory reserved (in MiB).\n"
      "# TYPE DCGM_FI_DEV_FB_RESERVED gauge\n"
      "DCGM_FI_DEV_FB_RESERVED{" +
      g +
      "} 512\n"
      "# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL Total number of double-bit volatile ECC errors.\n"
      "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n"
      "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{" +
      g +
      "} 0\n"
      "# HELP DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS Number of remapped rows for uncorrectable "
      "errors\n"
      "# TYPE DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS counter\n"
      "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{" +
      g +
      "} 0\n"
      "# HELP DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS Number of remapped rows for correctable "
      "errors\n"
      "# TYPE DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS counter\n"
      "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{" +
      g +
      "} 0\n"
      "# HELP DCGM_FI_DEV_ROW_REMAP_FAILURE Whether remapping of rows has failed\n"
      "# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge\n"
      "DCGM_FI_DEV_ROW_REMAP_FAILURE{" +
      g +
      "} 0\n"
      "# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.\n"
      "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n"
      "DCGM_FI_PROF_SM_ACTIVE{" +
      g +
      "} 0.783000\n"
      "# HELP DCGM_FI_PROF_PIPE_TENSOR_ACTIVE Ratio of cycles the tensor (HMMA) pipe is active.\n"
      "# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge\n"
      "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{" +
      g +
      "} 0.500000\n"
      "# HELP DCGM_FI_PROF_DRAM_ACTIVE Ratio of cycles the device memory interface is active "
      "sending or receiving data.\n"
      "# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge\n"
      "DCGM_FI_PROF_DRAM_ACTIVE{" +
      g + "} 0.250000\n";
  EXPECT_EQ(text, expected);
}

// The rest of dcgm-exporter's default counters, each in its place of the CSV order.
TEST(DcgmMetrics, TheOtherDefaultCountersFollowDcgmExportersOrderAndText) {
  GpuReading reading = H100Reading();
  GpuSample& sample = reading.sample;
  sample.memory_temperature_c = 52;
  sample.total_energy_millijoules = 123456789;
  sample.encoder_util_percent = 3;
  sample.decoder_util_percent = 7;
  sample.nvlink_data_kib = 3000;
  sample.graphics_engine_active = 0.8125;
  sample.pcie_tx_bytes_per_second = 104857600;
  sample.pcie_rx_bytes_per_second = 52428800;
  const std::string text = RenderDcgmMetrics({reading}, {});
  const std::string g =
      R"(gpu="0",UUID="GPU-5e1c0c41-2c1c-9a45-7b0e-2d7e1f2a3b4c",pci_bus_id="00000000:18:00.0",)"
      R"(device="nvidia0",modelName="NVIDIA H100 80GB HBM3")";
  const std::vector<std::string> in_order = {
      "DCGM_FI_DEV_MEM_CLOCK{",
      "# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).\n"
      "# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge\nDCGM_FI_DEV_MEMORY_TEMP{" +
          g + "} 52\n",
      "DCGM_FI_DEV_GPU_TEMP{",
      "DCGM_FI_DEV_POWER_USAGE{",
      "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n"
      "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
      "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" +
          g + "} 123456789\n",
      "DCGM_FI_DEV_MEM_COPY_UTIL{",
      "# HELP DCGM_FI_DEV_ENC_UTIL Encoder utilization (in %).\n# TYPE DCGM_FI_DEV_ENC_UTIL "
      "gauge\nDCGM_FI_DEV_ENC_UTIL{" +
          g + "} 3\n",
      "# HELP DCGM_FI_DEV_DEC_UTIL Decoder utilization (in %).\n# TYPE DCGM_FI_DEV_DEC_UTIL "
      "gauge\nDCGM_FI_DEV_DEC_UTIL{" +
          g + "} 7\n",
      "DCGM_FI_DEV_FB_RESERVED{",
      "# HELP DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL Total number of NVLink bandwidth counters for all "
      "lanes.\n# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter\n"
      "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{" +
          g + "} 3000\n",
      "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.\n"
      "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{" +
          g + "} 0.812500\n",
      "DCGM_FI_PROF_SM_ACTIVE{",
      "DCGM_FI_PROF_DRAM_ACTIVE{",
      "# HELP DCGM_FI_PROF_PCIE_TX_BYTES The rate of data transmitted over the PCIe bus - "
      "including both protocol headers and data payloads - in bytes per second.\n"
      "# TYPE DCGM_FI_PROF_PCIE_TX_BYTES gauge\nDCGM_FI_PROF_PCIE_TX_BYTES{" +
          g + "} 104857600\n",
      "# HELP DCGM_FI_PROF_PCIE_RX_BYTES The rate of data received over the PCIe bus - including "
      "both protocol headers and data payloads - in bytes per second.\n"
      "# TYPE DCGM_FI_PROF_PCIE_RX_BYTES gauge\nDCGM_FI_PROF_PCIE_RX_BYTES{" +
          g + "} 52428800\n",
  };
  size_t at = 0;
  for (const std::string& piece : in_order) {
    const size_t found = text.find(piece, at);
    ASSERT_NE(found, std::string::npos) << "missing or out of order: " << piece << "\n" << text;
    at = found + piece.size();
  }
}

TEST(DcgmMetrics, AGpusSeriesNameTheJobsOnIt) {
  GpuReading first = H100Reading();
  GpuReading second = H100Reading();
  second.info.index = 1;
  second.info.uuid = "GPU-2";
  GpuReading idle = H100Reading();
  idle.info.index = 2;
  idle.info.uuid = "GPU-3";
  DcgmRenderOptions options;
  options.tasks = {{first.info.uuid, "vision/train", "workers-0", "vision", "research/vision"},
                   // Two tasks share the second GPU: one series with both.
                   {"GPU-2", "nlp/chat", "main-0", "nlp", "serving"},
                   {"GPU-2", "nlp/eval\"x", "main-0", "nlp", "serving"}};
  const std::string text = RenderDcgmMetrics({first, second, idle}, options);
  EXPECT_THAT(text,
              HasSubstr("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"," + std::string() +
                        "UUID=\"GPU-5e1c0c41-2c1c-9a45-7b0e-2d7e1f2a3b4c\","
                        "pci_bus_id=\"00000000:18:00.0\",device=\"nvidia0\","
                        "modelName=\"NVIDIA H100 80GB HBM3\",hpc_job=\"vision/train\","
                        "queue=\"research/vision\",task=\"workers-0\",team=\"vision\"} 64\n"));
  EXPECT_THAT(text, HasSubstr("hpc_job=\"nlp/chat,nlp/eval\\\"x\",queue=\"serving\","
                              "task=\"main-0\",team=\"nlp\"} 64\n"));
  EXPECT_THAT(text,
              HasSubstr("DCGM_FI_DEV_GPU_TEMP{gpu=\"2\",UUID=\"GPU-3\",pci_bus_id=\"00000000:"
                        "18:00.0\",device=\"nvidia2\",modelName=\"NVIDIA H100 80GB HBM3\"} 64\n"))
      << "an idle GPU has no job labels";
  // The XID gauge keeps its own labels last.
  EXPECT_THAT(text, HasSubstr("team=\"vision\",err_code=\"0\",err_msg=\"No Error\"} 0\n"));
}

TEST(DcgmMetrics, ManyTasksOnOneGpuAreCappedSoTheSeriesStayFew) {
  DcgmRenderOptions options;
  const GpuReading reading = H100Reading();
  for (int i = 0; i < 7; ++i) {
    options.tasks.push_back({reading.info.uuid, fmt::format("t/job-{}", i), "main-0", "t", "q"});
  }
  const std::string text = RenderDcgmMetrics({reading}, options);
  EXPECT_THAT(text, HasSubstr("hpc_job=\"t/job-0,t/job-1,t/job-2,t/job-3,+3\""));
  const std::string without_tasks = RenderDcgmMetrics({reading}, {});
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'),
            std::count(without_tasks.begin(), without_tasks.end(), '\n'))
      << "one series per GPU, with or without tasks";
}

TEST(DcgmMetrics, UnsupportedValuesAreLeftOutNotZeroed) {
  GpuReading reading = H100Reading();
  reading.sample.power_milliwatts.reset();
  reading.sample.sm_active.reset();
  reading.sample.dram_active.reset();
  reading.sample.tensor_active.reset();
  reading.last_xid.reset();
  const std::string text = RenderDcgmMetrics({reading}, {});
  EXPECT_THAT(text, Not(HasSubstr("POWER_USAGE")));
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_PROF_")));
  EXPECT_THAT(text, Not(HasSubstr("XID_ERRORS")));
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_GPU_TEMP{"));
}

TEST(DcgmMetrics, WithoutHostnameOrDriverTheLabelsEndAtModelName) {
  const std::string text = RenderDcgmMetrics({H100Reading()}, {});
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-5e1c0c41-2c1c-9a45-"
                              "7b0e-2d7e1f2a3b4c\",pci_bus_id=\"00000000:18:00.0\",device="
                              "\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\"} 64\n"));
}

TEST(DcgmMetrics, ALostGpuHasNoSeries) {
  GpuReading lost = H100Reading();
  lost.info.index = 1;
  lost.sample = GpuSample{};
  lost.sample.index = 1;
  lost.sample.lost = true;
  lost.last_xid = 79;
  const std::string text = RenderDcgmMetrics({H100Reading(), lost}, {});
  EXPECT_THAT(text, HasSubstr("gpu=\"0\""));
  EXPECT_THAT(text, Not(HasSubstr("gpu=\"1\"")));
}

TEST(DcgmMetrics, TheXidGaugeCarriesItsCodeAndNvidiasMessage) {
  GpuReading reading = H100Reading();
  reading.last_xid = 79;
  EXPECT_THAT(RenderDcgmMetrics({reading}, {}),
              HasSubstr(",err_code=\"79\",err_msg=\"GPU has fallen off the bus\"} 79\n"));
  reading.last_xid = 54;
  EXPECT_THAT(RenderDcgmMetrics({reading}, {}),
              HasSubstr(",err_code=\"54\",err_msg=\"Unknown Error\"} 54\n"));
}

TEST(DcgmMetrics, MigInstancesGetTheirOwnSeries) {
  GpuReading reading = H100Reading();
  reading.info.mig_enabled = true;
  reading.info.mig_devices = {{"MIG-a", "3g.40gb", 1, 0, 40192}, {"MIG-b", "3g.40gb", 2, 0, 40192}};
  reading.sample.gpu_util_percent.reset();
  reading.sample.mig_devices = {{1, 100, 40092}, {2, 30000, 10192}};
  const std::string text = RenderDcgmMetrics({reading}, {.hostname = "node-7"});
  const std::string parent =
      R"(gpu="0",UUID="GPU-5e1c0c41-2c1c-9a45-7b0e-2d7e1f2a3b4c",pci_bus_id="00000000:18:00.0",)"
      R"(device="nvidia0",modelName="NVIDIA H100 80GB HBM3",)";
  // Framebuffer per instance; the parent's UUID on every series.
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_FB_USED{" + parent +
                              R"(GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="node-7"} 100)"));
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_FB_USED{" + parent +
                              R"(GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-7"} 30000)"));
  // Device-wide values repeat on each instance.
  EXPECT_THAT(text, HasSubstr("DCGM_FI_DEV_GPU_TEMP{" + parent +
                              R"(GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="node-7"} 64)"));
  // No series without MIG labels, and nothing NVML cannot give per instance.
  EXPECT_THAT(text, Not(HasSubstr(R"(modelName="NVIDIA H100 80GB HBM3",Hostname)")));
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_PROF_SM_ACTIVE")));
  EXPECT_THAT(text, Not(HasSubstr("DCGM_FI_DEV_FB_RESERVED")));
}

TEST(DcgmMetrics, LabelValuesAreEscaped) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  GpuReading reading = H100Reading();
  reading.info.nvml_name = "Odd \"Name\"";
  EXPECT_THAT(RenderDcgmMetrics({reading}, {}), HasSubstr(R"(modelName="Odd \"Name\"")"));
}

}  // namespace
}  // namespace gpufleet::agent
