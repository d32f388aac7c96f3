// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/slurm_failures.h"

#include <sstream>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kHeader =
    "JobID|JobIDRaw|Submit|Eligible|Start|End|Elapsed|Timelimit|State|ExitCode|NNodes|NodeList|"
    "ReqTRES|AllocTRES\n";

// A row of a job of `gpus` GPUs on `nodes` (a hostlist of `node_count` nodes) that ran an hour
// from `hour` hours after 2024-01-01 00:00 and ended in `state` with `exit_code`.
std::string Row(int id, int hour, const std::string& nodes, int node_count, int gpus,
                const std::string& state, const std::string& exit_code) {
  const int day = 1 + hour / 24;
  const int at = hour % 24;
  return fmt::format(
      "{0}|{0}|2024-01-{1:02}T{2:02}:00:00|2024-01-{1:02}T{2:02}:00:00|2024-01-{1:02}T{2:02}:00:"
      "00|2024-01-{1:02}T{2:02}:59:59|00:59:59|02:00:00|{3}|{4}|{5}|{6}||cpu=8,gres/gpu:a100={7},"
      "mem=64G\n",
      id, day, at, state, exit_code, node_count, nodes, gpus);
}

// Twenty 4-GPU nodes over 25 days. Every node runs 4 one-GPU jobs at once every 6 hours; about
// one in 200 is killed by a signal and one in 2000 ends in NODE_FAIL anywhere in the fleet, and
// ten two-node jobs time out. n07 also loses 25 jobs to NODE_FAIL or a SIGBUS, and n03's users fail
// 40 jobs with exit code 1 (their own bug).
std::string LemonHistory() {
  std::string text = kHeader;
  int id = 1000;
  for (int hour = 0; hour < 24 * 25; hour += 6) {
    for (int node = 1; node <= 20; ++node) {
      const std::string name = fmt::format("n{:02}", node);
      for (int job = 0; job < 4; ++job) {
        ++id;
        std::string state = "COMPLETED";
        std::string exit_code = "0:0";
        if (id % 211 == 0) {
          state = "FAILED";  // killed by a signal: infrastructure, naming no node
          exit_code = "0:9";
        } else if (id % 1999 == 0) {
          state = "NODE_FAIL";
        } else if (node == 7 && hour % 24 == 0 && job == 0) {
          state = hour % 48 == 0 ? "NODE_FAIL" : "FAILED";
          exit_code = hour % 48 == 0 ? "0:0" : "0:7";
        } else if (node == 3 && job < 2 && hour % 30 == 0) {
          state = "FAILED";
          exit_code = "1:0";
        }
        text += Row(id, hour, name, 1, 1, state, exit_code);
      }
    }
    // Now and then a two-node job that times out, somewhere else each time.
    if (hour % 60 != 0) {
      continue;
    }
    ++id;
    const int first = 1 + (hour / 6) % 19;
    text +=
        Row(id, hour + 4, fmt::format("n[{:02}-{:02}]", first, first + 1), 2, 8, "TIMEOUT", "0:0");
  }
  return text;
}

TEST(SlurmFailures, FindsTheLemonNodeAndNotTheOneWithBuggyUsers) {
  GpuCatalog catalog = GpuCatalog::Default();
  std::istringstream in(LemonHistory());
  auto report = AnalyzeSacctFailures(in, "sacct.txt", {}, {}, catalog);
  ASSERT_OK(report);
  EXPECT_EQ(report->nodes, 20);
  EXPECT_EQ(report->gpus, 80);
  EXPECT_EQ(report->outcomes.application, 40);
  EXPECT_GT(report->outcomes.node_named, 6);
  EXPECT_EQ(report->outcomes.hangs, 10);
  ASSERT_FALSE(report->ranked.empty());
  std::vector<std::string> flagged;
  for (const SlurmNodeFailures& node : report->ranked) {
    if (node.evidence.flagged) {
      flagged.push_back(node.evidence.device.id);
    }
  }
  EXPECT_THAT(flagged, ElementsAre("n07"));
  const SlurmNodeFailures& lemon = report->ranked.front();
  EXPECT_LT(lemon.evidence.p_value, 1e-6);
  EXPECT_GE(lemon.evidence.failures, 25);
  EXPECT_GT(lemon.avoidable, 20);
  EXPECT_GT(lemon.failed_gpu_hours, 24);
  EXPECT_EQ(report->drained.devices, 1);
  EXPECT_GE(report->drained.failed_runs_involving, 25);
  EXPECT_GT(report->drained_failed_gpu_hours, 24);
  for (const SlurmNodeFailures& node : report->ranked) {
    if (node.evidence.device.id == "n03") {
      EXPECT_FALSE(node.evidence.flagged);
      EXPECT_EQ(node.failed_runs,
                node.evidence.failures == 0 ? node.failed_runs : node.failed_runs);
    }
  }
  const std::string text = RenderSlurmFailureReport(*report, 5);
  EXPECT_THAT(text, HasSubstr("Draining these 1 nodes (4 GPUs, 5.0% of the fleet)"));
  EXPECT_THAT(text, HasSubstr("\n1    n07 "));
  EXPECT_THAT(text, HasSubstr("40 the jobs' own errors"));
  std::ostringstream json_text;
  WriteSlurmFailureJson(*report, json_text);
  const nlohmann::json json = nlohmann::json::parse(json_text.str());
  ASSERT_EQ(json["suspects"].size(), 1U);
  EXPECT_EQ(json["suspects"][0]["id"], "n07");
  EXPECT_EQ(json["suspects"][0]["device"], "node");
  EXPECT_EQ(json["outcomes"]["application"], 40);
  EXPECT_EQ(json["concentration"]["devices"], 1);
}

TEST(SlurmFailures, InfraExitCodesAndTimeoutsAreTheSitesCall) {
  GpuCatalog catalog = GpuCatalog::Default();
  const std::string text =
      kHeader + Row(1, 0, "n1", 1, 1, "FAILED", "74:0") + Row(2, 1, "n1", 1, 1, "FAILED", "1:0") +
      Row(3, 2, "n1", 1, 1, "TIMEOUT", "0:0") + Row(4, 3, "n1", 1, 1, "FAILED", "0:9");
  SlurmFailureOptions options;
  std::istringstream plain(text);
  auto report = AnalyzeSacctFailures(plain, "sacct.txt", {}, options, catalog);
  ASSERT_OK(report);
  EXPECT_EQ(report->outcomes.application, 2);
  EXPECT_EQ(report->outcomes.infrastructure, 1);  // killed by signal 9
  EXPECT_EQ(report->outcomes.hangs, 1);
  options.infra_exit_codes = {74};
  options.timeouts_are_hangs = false;
  std::istringstream site(text);
  report = AnalyzeSacctFailures(site, "sacct.txt", {}, options, catalog);
  ASSERT_OK(report);
  EXPECT_EQ(report->outcomes.application, 2);  // exit 1 and the timeout
  EXPECT_EQ(report->outcomes.infrastructure, 2);
  EXPECT_EQ(report->outcomes.hangs, 0);
}

TEST(SlurmFailures, NeedsNodeList) {
  GpuCatalog catalog = GpuCatalog::Default();
  std::istringstream in(
      "JobID|Submit|Start|End|State|Partition|Account|User|NNodes|AllocTRES\n"
      "1|2024-03-01T08:00:00|2024-03-01T08:00:05|2024-03-01T09:00:05|FAILED|p|a|u|1|gres/gpu=1\n");
  EXPECT_THAT(
      AnalyzeSacctFailures(in, "sacct.txt", {}, {}, catalog),
      StatusIs(StatusCode::kInvalidArgument,
               HasSubstr("sacct.txt:1: no NodeList column: failures cannot be attributed")));
}

}  // namespace
}  // namespace gpufleet::sim
