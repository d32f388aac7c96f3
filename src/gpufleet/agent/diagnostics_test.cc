// SPDX-License-Identifier: Apache-2.0
// Diagnostics against the fake NVML (the built-in check's NVML sanity), the real CUDA exercise
// where no libcuda.so.1 loads, site commands run by /bin/sh, and the simulated probe's fault
// model.
#include "gpufleet/agent/diagnostics.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/agent/cuda_exercise.h"
#include "gpufleet/agent/nvml_probe.h"
#include "gpufleet/agent/simulated_probe.h"
#include "gpufleet/agent/telemetry.h"
#include "gpufleet/agent/testing/fake_nvml.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::agent {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;

// One scripted fake-NVML H100; `extra` adds or overrides readings.
nlohmann::json DiagnosedGpuScript(int index, const nlohmann::json& extra) {
  nlohmann::json device = {
      {"name", "NVIDIA H100 80GB HBM3"},
      {"uuid", "GPU-d1a60000-0000-0000-0000-00000000000" + std::to_string(index)},
      {"pci_bus_id", "00000000:1" + std::to_string(index) + ":00.0"},
      {"memory", {{"total_mib", 81559}, {"used_mib", 0}}},
      {"temperature_c", 40},
      {"slowdown_temperature_c", 87},
      {"power_mw", 90000},
      {"ecc_dbe_volatile", 0},
      {"xid_events", true}};
  if (extra.is_object()) {
    device.update(extra);
  }
  return device;
}

class DiagnosticsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<testing::FakeNvml>> fake =
        testing::FakeNvml::Open(GPUFLEET_FAKE_NVML_PATH);
    ASSERT_OK(fake);
    fake_ = std::move(fake).value();
  }

  // The sampler over the fake NVML scripted with `devices`.
  void OpenNvml(const std::vector<nlohmann::json>& devices) {
    const nlohmann::json script = {
        {"driver_version", "550.54.15"}, {"cuda_driver_version", 12040}, {"devices", devices}};
    ASSERT_OK(fake_->LoadScript(script.dump()));
    Result<std::unique_ptr<NvmlProbe>> probe =
        NvmlProbe::Open({.library_path = GPUFLEET_FAKE_NVML_PATH});
    ASSERT_OK(probe);
    probe_ = std::move(probe).value();
    Result<std::unique_ptr<TelemetrySampler>> sampler =
        TelemetrySampler::Create({.probe = *probe_, .clock = clock_});
    ASSERT_OK(sampler);
    sampler_ = std::move(sampler).value();
  }

  FakeClock clock_;
  std::unique_ptr<testing::FakeNvml> fake_;
  std::unique_ptr<NvmlProbe> probe_;
  std::unique_ptr<TelemetrySampler> sampler_;
  CudaExercise no_cuda_{{.library = "/nonexistent/libcuda.so.1"}};
};

TEST_F(DiagnosticsTest, BuiltInPassesAHealthyGpuAndFailsOneWithUncorrectableErrors) {
  OpenNvml(
      {DiagnosedGpuScript(0, {}),
       DiagnosedGpuScript(
           1, {{"ecc_dbe_volatile", 2},
               {"remapped_rows",
                {{"correctable", 0}, {"uncorrectable", 3}, {"pending", 0}, {"failure", 1}}}})});
  DiagnosticRunner runner({}, *sampler_, &no_cuda_, clock_);

  Result<DiagnosticReport> healthy = runner.Run(0, DiagnosticKind::kBuiltIn);
  ASSERT_OK(healthy);
  EXPECT_EQ(healthy->verdict, DiagnosticVerdict::kPassed) << healthy->Summary();
  EXPECT_EQ(healthy->gpu_uuid, "GPU-d1a60000-0000-0000-0000-000000000000");
  EXPECT_THAT(healthy->checks,
              Contains(AllOf(Field(&DiagnosticCheck::name, "nvml.responds"),
                             Field(&DiagnosticCheck::detail, "temperature 40 C"))));
  // No driver here: the exercise says so and does not decide the verdict.
  EXPECT_THAT(healthy->checks,
              Contains(AllOf(Field(&DiagnosticCheck::name, "cuda"),
                             Field(&DiagnosticCheck::verdict, DiagnosticVerdict::kUnavailable),
                             Field(&DiagnosticCheck::detail,
                                   HasSubstr("/nonexistent/libcuda.so.1 not found")))));

  Result<DiagnosticReport> faulty = runner.Run(1, DiagnosticKind::kBuiltIn);
  ASSERT_OK(faulty);
  EXPECT_EQ(faulty->verdict, DiagnosticVerdict::kFailed);
  EXPECT_THAT(faulty->checks,
              Contains(AllOf(Field(&DiagnosticCheck::name, "nvml.ecc"),
                             Field(&DiagnosticCheck::verdict, DiagnosticVerdict::kFailed))));
  EXPECT_THAT(faulty->Summary(), AllOf(HasSubstr("failed: "), HasSubstr("nvml.row_remap")));
  EXPECT_THAT(faulty->Summary(), Not(HasSubstr("nvml.responds")));
}

TEST_F(DiagnosticsTest, ALostGpuFailsAndIsNotExercised) {
  OpenNvml({DiagnosedGpuScript(0, {{"lost", true}})});
  DiagnosticRunner runner({}, *sampler_, &no_cuda_, clock_);
  Result<DiagnosticReport> report = runner.Run(0, DiagnosticKind::kBuiltIn);
  ASSERT_OK(report);
  EXPECT_EQ(report->verdict, DiagnosticVerdict::kFailed);
  EXPECT_THAT(report->checks, ElementsAre(Field(&DiagnosticCheck::name, "nvml.responds")));
}

TEST_F(DiagnosticsTest, AnUnknownGpuIsRefused) {
  OpenNvml({DiagnosedGpuScript(0, {})});
  DiagnosticRunner runner({}, *sampler_, &no_cuda_, clock_);
  EXPECT_THAT(runner.Run(3, DiagnosticKind::kBuiltIn),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpu_index: 3")));
}

TEST(CudaExerciseTest, WithoutLibcudaItIsUnavailable) {
  CudaExercise exercise({.library = "/nonexistent/libcuda.so.1"});
  EXPECT_THAT(exercise.Exercise(GpuStaticInfo{}),
              ElementsAre(AllOf(Field(&DiagnosticCheck::verdict, DiagnosticVerdict::kUnavailable),
                                Field(&DiagnosticCheck::detail,
                                      HasSubstr("/nonexistent/libcuda.so.1 not found")))));
}

TEST(CudaExerciseTest, ThePatternIsTheHashTheKernelsCompute) {
  // Values worked out by hand (in Python) from the hash's definition.
  EXPECT_EQ(CudaPatternWord(0, 0x5eed1234u), 0x898dc880u);
  EXPECT_EQ(CudaPatternWord(1, 0x5eed1234u), 0x820fb71bu);
  EXPECT_EQ(CudaPatternWord(12345, 7), 0x958f2675u);
}

TEST(CudaExerciseTest, ThePtxHasBothKernelsEachWithItsOwnLabels) {
  const std::string ptx = CudaPatternPtx();
  EXPECT_THAT(ptx, AllOf(HasSubstr(".visible .entry gpufleet_fill("),
                         HasSubstr(".visible .entry gpufleet_check("), HasSubstr("\nFILL_LOOP:"),
                         HasSubstr("bra FILL_DONE;"), HasSubstr("\nCHECK_LOOP:"),
                         HasSubstr("bra CHECK_DONE;"), Not(HasSubstr("LABEL_"))));
  EXPECT_EQ(std::count(ptx.begin(), ptx.end(), '{'), 2);
  EXPECT_EQ(std::count(ptx.begin(), ptx.end(), '}'), 2);
}

TEST(DiagnosticVerdictTest, AFailureDecidesThenAPass) {
  using V = DiagnosticVerdict;
  EXPECT_EQ(CombinedVerdict({}), V::kUnavailable);
  EXPECT_EQ(CombinedVerdict({{"a", V::kUnavailable, ""}, {"b", V::kPassed, ""}}), V::kPassed);
  EXPECT_EQ(CombinedVerdict({{"a", V::kPassed, ""}, {"b", V::kFailed, ""}}), V::kFailed);
  EXPECT_THAT(ParseDiagnosticKind("memtest", "diagnostics[0].kind"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("diagnostics[0].kind: unknown \"memtest\"")));
}

class CommandDiagnosticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<SimulatedProbe>> probe =
        SimulatedProbe::Create(fake_clock_, catalog_, {.gpu_count = 2});
    ASSERT_OK(probe);
    probe_ = std::move(probe).value();
    Result<std::unique_ptr<TelemetrySampler>> sampler =
        TelemetrySampler::Create({.probe = *probe_, .clock = fake_clock_});
    ASSERT_OK(sampler);
    sampler_ = std::move(sampler).value();
  }

  Result<DiagnosticReport> RunCommand(std::string script,
                                      Duration timeout = std::chrono::seconds(20)) {
    DiagnosticOptions options{.command = {"/bin/sh", "-c", std::move(script)},
                              .command_timeout = timeout};
    EXPECT_OK(options.Validate());
    DiagnosticRunner runner(options, *sampler_, probe_.get(), system_clock_);
    return runner.Run(1, DiagnosticKind::kCommand);
  }

  const GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock fake_clock_;
  SystemClock system_clock_;
  std::unique_ptr<SimulatedProbe> probe_;
  std::unique_ptr<TelemetrySampler> sampler_;
};

TEST_F(CommandDiagnosticTest, TheExitCodeIsTheVerdictWithTheDeviceSubstituted) {
  Result<DiagnosticReport> passed = RunCommand(
      "echo gpu {gpu_index} $CUDA_VISIBLE_DEVICES {pci_bus_id} | awk '{print $1, $2, "
      "$3, $4}'");
  ASSERT_OK(passed);
  EXPECT_EQ(passed->verdict, DiagnosticVerdict::kPassed);
  EXPECT_EQ(passed->exit_code, 0);
  const std::string uuid = passed->gpu_uuid;
  EXPECT_EQ(passed->output, "gpu 1 " + uuid + " 00000000:2A:00.0\n");

  Result<DiagnosticReport> failed = RunCommand("echo 'Memory test: Fail' >&2; exit 3");
  ASSERT_OK(failed);
  EXPECT_EQ(failed->verdict, DiagnosticVerdict::kFailed);
  EXPECT_EQ(failed->exit_code, 3);
  EXPECT_THAT(failed->Summary(), HasSubstr("exit 3: Memory test: Fail"));
}

TEST_F(CommandDiagnosticTest, OutputIsBoundedAndATimeoutFails) {
  Result<DiagnosticReport> chatty = RunCommand("head -c 10000 /dev/zero | tr '\\0' x; echo END");
  ASSERT_OK(chatty);
  EXPECT_THAT(chatty->output, SizeIs(kMaxDiagnosticOutputBytes));
  EXPECT_TRUE(chatty->output.ends_with("xEND\n"));

  Result<DiagnosticReport> slow = RunCommand("sleep 5", std::chrono::milliseconds(200));
  ASSERT_OK(slow);
  EXPECT_EQ(slow->verdict, DiagnosticVerdict::kFailed);
  EXPECT_THAT(slow->Summary(), HasSubstr("timed out"));
}

TEST_F(CommandDiagnosticTest, AMissingOrUnconfiguredCommandIsUnavailable) {
  DiagnosticRunner unconfigured({}, *sampler_, probe_.get(), system_clock_);
  Result<DiagnosticReport> none = unconfigured.Run(0, DiagnosticKind::kCommand);
  ASSERT_OK(none);
  EXPECT_EQ(none->verdict, DiagnosticVerdict::kUnavailable);
  EXPECT_THAT(none->Summary(), HasSubstr("no diagnostic command configured"));

  DiagnosticRunner missing({.command = {"/nonexistent/dcgmi", "diag"}}, *sampler_, probe_.get(),
                           system_clock_);
  Result<DiagnosticReport> absent = missing.Run(0, DiagnosticKind::kCommand);
  ASSERT_OK(absent);
  EXPECT_EQ(absent->verdict, DiagnosticVerdict::kUnavailable);

  EXPECT_THAT((DiagnosticOptions{.command = {"dcgmi", "-i", "{gpu}"}}.Validate()),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("diagnostic_command: \"{gpu}\": unknown placeholder")));
}

class SimulatedDiagnosticTest : public ::testing::Test {
 protected:
  std::unique_ptr<SimulatedProbe> Probe(double sensitivity, double false_positives,
                                        uint64_t seed = 1) {
    Result<std::unique_ptr<SimulatedProbe>> probe =
        SimulatedProbe::Create(clock_, catalog_,
                               {.gpu_count = 2,
                                .seed = seed,
                                .diagnostic_sensitivity = sensitivity,
                                .diagnostic_false_positive_rate = false_positives});
    EXPECT_OK(probe);
    return probe.ok() ? std::move(probe).value() : nullptr;
  }

  // How many of `runs` exercises of GPU `index` failed.
  static int Failures(SimulatedProbe& probe, int index, int runs) {
    GpuStaticInfo gpu;
    gpu.index = index;
    int failed = 0;
    for (int i = 0; i < runs; ++i) {
      failed += CombinedVerdict(probe.Exercise(gpu)) == DiagnosticVerdict::kFailed ? 1 : 0;
    }
    return failed;
  }

  const GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_;
};

TEST_F(SimulatedDiagnosticTest, AFaultyGpuFailsAtTheSensitivityAHealthyOneAtTheFalsePositiveRate) {
  std::unique_ptr<SimulatedProbe> certain = Probe(1.0, 0.0);
  ASSERT_OK(certain->SetLatentFault(0, true));
  EXPECT_EQ(Failures(*certain, 0, 20), 20);
  EXPECT_EQ(Failures(*certain, 1, 20), 0);
  ASSERT_OK(certain->InjectDoubleBitEcc(1));  // a visible fault counts too
  EXPECT_EQ(Failures(*certain, 1, 5), 5);

  std::unique_ptr<SimulatedProbe> model = Probe(0.8, 0.05);
  ASSERT_OK(model->SetLatentFault(0, true));
  const int found = Failures(*model, 0, 1000);
  const int false_alarms = Failures(*model, 1, 1000);
  EXPECT_NEAR(found, 800, 50);
  EXPECT_NEAR(false_alarms, 50, 25);

  // Seeded: the same seed draws the same verdicts.
  std::unique_ptr<SimulatedProbe> again = Probe(0.8, 0.05);
  ASSERT_OK(again->SetLatentFault(0, true));
  EXPECT_EQ(Failures(*again, 0, 1000), found);
}

TEST_F(SimulatedDiagnosticTest, RatesOutsideZeroToOneAreRefused) {
  EXPECT_THAT(SimulatedProbe::Create(clock_, catalog_, {.diagnostic_sensitivity = 1.5}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("diagnostic_sensitivity: 1.5")));
}

}  // namespace
}  // namespace gpufleet::agent
