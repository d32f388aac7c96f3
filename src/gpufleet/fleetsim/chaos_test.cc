// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/chaos.h"

#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::fleetsim {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::IsEmpty;
using ::testing::Not;

std::string Describe(const SeedOutcome& outcome) {
  return fmt::format("seed {}: {}\n{}", outcome.seed, fmt::join(outcome.violations, "\n"),
                     outcome.events);
}

TEST(ChaosTest, SeedsRunCleanWithFaults) {
  Result<ChaosReport> report = RunChaos(1, 6, ChaosOptions{}, 1);
  ASSERT_OK(report);
  for (const SeedOutcome& outcome : report->failing) {
    ADD_FAILURE() << Describe(outcome);
  }
  EXPECT_EQ(report->violations, 0);
  EXPECT_GT(report->jobs, 60);
  EXPECT_GT(report->task_runs, 60);
  EXPECT_THAT(report->faults, Not(IsEmpty()));
}

TEST(ChaosTest, SameSeedSameRun) {
  Result<SeedOutcome> first = RunChaosSeed(7, ChaosOptions{});
  Result<SeedOutcome> second = RunChaosSeed(7, ChaosOptions{});
  ASSERT_OK(first);
  ASSERT_OK(second);
  EXPECT_EQ(first->digest, second->digest);
  EXPECT_EQ(first->task_runs, second->task_runs);
  Result<SeedOutcome> other = RunChaosSeed(8, ChaosOptions{});
  ASSERT_OK(other);
  EXPECT_NE(first->digest, other->digest);
}

TEST(ChaosTest, ParsesPlantedBugNames) {
  Result<PlantedBug> bug = ParsePlantedBug("skipped-fence");
  ASSERT_OK(bug);
  EXPECT_EQ(*bug, PlantedBug::kSkippedFence);
  EXPECT_THAT(ParsePlantedBug("sometimes"),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("\"sometimes\"")));
}

// Each planted bug is caught by some seed of the first ones the CI run covers, with a violation
// of the kind it causes.
class PlantedBugTest : public ::testing::TestWithParam<std::pair<PlantedBug, std::string>> {};

TEST_P(PlantedBugTest, SomeSeedCatchesIt) {
  ChaosOptions options;
  options.planted = GetParam().first;
  Result<ChaosReport> report = RunChaos(1, 20, options, 2);
  ASSERT_OK(report);
  ASSERT_THAT(report->failing, Not(IsEmpty()));
  bool named = false;
  for (const SeedOutcome& outcome : report->failing) {
    for (const std::string& violation : outcome.violations) {
      named = named || violation.find(GetParam().second) != std::string::npos;
    }
  }
  EXPECT_TRUE(named) << Describe(report->failing.front());
  EXPECT_THAT(report->failing.front().replay, ::testing::HasSubstr("--plant"));
}

INSTANTIATE_TEST_SUITE_P(
    Bugs, PlantedBugTest,
    ::testing::Values(std::make_pair(PlantedBug::kEarlyRelease, std::string("GPU ")),
                      std::make_pair(PlantedBug::kSkippedFence, std::string(" started on ")),
                      std::make_pair(PlantedBug::kLostWrite, std::string("is lost")),
                      std::make_pair(PlantedBug::kUnfencedCommits, std::string("GPU ")),
                      std::make_pair(PlantedBug::kShortFenceGrace,
                                     std::string("less than the documented"))));

}  // namespace
}  // namespace gpufleet::fleetsim
