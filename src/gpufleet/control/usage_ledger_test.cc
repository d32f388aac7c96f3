// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/usage_ledger.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::control {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kHour = 3600 * kSecond;
// 2026-12-01T00:00:00Z
constexpr int64_t kT0 = 1'796'083'200 * kSecond;
constexpr int64_t kUnitHour = kShareUnitsPerGpu * 3'600'000;  // one GPU-hour in unit-ms

Json Assignment(const std::string& model, int64_t milli, const std::string& mig = "") {
  return {{"milli", milli}, {"memory_mib", 0}, {"mig_profile", mig}, {"model", model}};
}

// A job of `team` placed on node n1 with `assignments` (GPU indices 0, 1, ...), stamped at
// `start_ns` as its attempt 1.
Json PlacedJob(const std::string& team, const std::string& name,
               const std::vector<Json>& assignments, int64_t start_ns,
               const std::string& user = "alice") {
  Json gpus = Json::array();
  for (size_t i = 0; i < assignments.size(); ++i) {
    gpus.push_back(static_cast<int64_t>(i));
  }
  Json job = {{"name", name},
              {"team", team},
              {"queue", team + "-q"},
              {"submitted_by", user},
              {"state", "Running"},
              {"attempt", 1},
              {"placements", Json::array({{{"task", "workers-0"},
                                           {"node", "n1"},
                                           {"phase", "Running"},
                                           {"gpus", gpus},
                                           {"assignments", assignments}}})}};
  StampRunStart(job, start_ns);
  return job;
}

RunUsage OpenRun(const Json& job, int64_t end_ns, int64_t busy = 0) {
  std::optional<RunUsage> run = RunUsageOfJob(job, end_ns, busy);
  EXPECT_TRUE(run.has_value());
  return run.value_or(RunUsage{});
}

const UsageRow* FindRow(const UsageReport& report, const std::string& key) {
  for (const UsageRow& row : report.rows) {
    if (row.key == key) {
      return &row;
    }
  }
  return nullptr;
}

TEST(AssignmentShareUnits, SharesAndMigSlicesAreExactFractionsOfAGpu) {
  EXPECT_EQ(AssignmentShareUnits(Assignment("H100-80GB", 1000)), kShareUnitsPerGpu);
  EXPECT_EQ(AssignmentShareUnits(Assignment("H100-80GB", 250)), kShareUnitsPerGpu / 4);
  EXPECT_EQ(AssignmentShareUnits(Assignment("A100-80GB", 0, "3g.40gb")), 3 * kShareUnitsPerGpu / 7);
  EXPECT_EQ(AssignmentShareUnits(Assignment("A100-80GB", 0, "1g.10gb+me")), kShareUnitsPerGpu / 7);
  EXPECT_EQ(AssignmentShareUnits(Assignment("A100-80GB", 0, "7g.80gb")), kShareUnitsPerGpu);
  // Hostile or unknown: nothing, never more than a GPU.
  EXPECT_EQ(AssignmentShareUnits(Assignment("A100-80GB", 0, "9g.80gb")), 0);
  EXPECT_EQ(AssignmentShareUnits(Assignment("A100-80GB", 0, "g.80gb")), 0);
  EXPECT_EQ(AssignmentShareUnits(Assignment("A100-80GB", 0, "99999999999g")), 0);
  EXPECT_EQ(AssignmentShareUnits(Assignment("H100-80GB", 5000)), kShareUnitsPerGpu);
  EXPECT_EQ(AssignmentShareUnits(Assignment("H100-80GB", -5)), 0);
}

// The scripted timeline: a fleet of 4 GPUs over [T0, T0+4h).
//   a/train:   2 whole H100s, T0 .. T0+2h, busy half the time       -> 4 GPU-h, 2 busy
//   a/notebook: a 250-milli H100 share, T0+1h .. T0+3h (open at 3h)  -> 0.5 GPU-h
//   b/infer:   one 3g.40gb A100 slice, T0-1h .. T0+7h               -> 4 x 3/7 GPU-h inside
//   b/sweep:   one H100, placed at T0+30m, preempted at T0+1h, its task gone at T0+1h30
//              -> 1 GPU-h: it counts until the task is known gone, not until the preemption
// `gpus` GPUs over the whole of `query`'s period, in unit-ms.
int64_t WholePeriodCapacity(int64_t gpus, const UsageQuery& query) {
  return gpus * kShareUnitsPerGpu * ((query.to_ns - query.from_ns) / 1'000'000);
}

TEST(ComputeUsage, ScriptedTimelineWithSharesMigAndPreemption) {
  std::vector<RunUsage> runs;
  // a/train ends at T0+2h through a job write that drops its placements.
  {
    const Json before = PlacedJob(
        "a", "train", {Assignment("H100-80GB", 1000), Assignment("H100-80GB", 1000)}, kT0);
    Json after = before;
    after["state"] = "Succeeded";
    after["placements"] = Json::array();
    std::optional<RunUsage> run = NoteUsageChange(before, after, kT0 + 2 * kHour, 2 * kUnitHour);
    ASSERT_TRUE(run.has_value());
    EXPECT_FALSE(run->open);
    EXPECT_FALSE(after.contains("usage_run"));
    // The stored form round-trips.
    const Result<RunUsage> stored = RunUsageFromJson(RunUsageToJson(*run));
    ASSERT_OK(stored);
    EXPECT_EQ(*stored, *run);
    runs.push_back(*stored);
  }
  runs.push_back(OpenRun(PlacedJob("a", "notebook", {Assignment("H100-80GB", 250)}, kT0 + kHour),
                         kT0 + 3 * kHour));
  runs.push_back(
      OpenRun(PlacedJob("b", "infer", {Assignment("A100-80GB", 0, "3g.40gb")}, kT0 - kHour, "bob"),
              kT0 + 7 * kHour));
  // b/sweep: preempted at T0+1h, Stopping with its placements until its task is gone.
  {
    Json running = PlacedJob("b", "sweep", {Assignment("H100-80GB", 1000)}, kT0 + kHour / 2, "bob");
    Json stopping = running;
    ASSERT_OK(EndRun(stopping, JobState::kPreempted, "preempted by a/train", "").status());
    ASSERT_EQ(StoredJobState(stopping), JobState::kStopping);
    EXPECT_EQ(NoteUsageChange(running, stopping, kT0 + kHour, 0), std::nullopt);
    Json gone = stopping;
    MarkPlacementGone(gone["placements"][0], "exited");
    ASSERT_TRUE(FinishStoppingIfDone(gone).has_value());
    ASSERT_EQ(StoredJobState(gone), JobState::kPreempted);
    std::optional<RunUsage> run = NoteUsageChange(stopping, gone, kT0 + 3 * kHour / 2, 0);
    ASSERT_TRUE(run.has_value());
    EXPECT_EQ(run->end_ns, kT0 + 3 * kHour / 2);
    runs.push_back(*run);
  }

  UsageQuery query;
  query.from_ns = kT0;
  query.to_ns = kT0 + 4 * kHour;
  const UsageReport report = ComputeUsage(runs, WholePeriodCapacity(4, query), query);
  ASSERT_EQ(report.rows.size(), 2u);
  const UsageRow* a = FindRow(report, "a");
  const UsageRow* b = FindRow(report, "b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->totals.allocated, 4 * kUnitHour + kUnitHour / 2);
  EXPECT_EQ(a->totals.busy, 2 * kUnitHour);
  EXPECT_EQ(b->totals.allocated, 4 * 3 * kUnitHour / 7 + kUnitHour);
  EXPECT_EQ(b->totals.busy, 0);
  EXPECT_EQ(b->by_model.at("A100-80GB").allocated, 12 * kUnitHour / 7);
  EXPECT_EQ(b->by_model.at("H100-80GB").allocated, kUnitHour);
  EXPECT_EQ(report.unallocated,
            16 * kUnitHour - (4 * kUnitHour + kUnitHour / 2 + 12 * kUnitHour / 7 + kUnitHour));

  const Json json = UsageReportToJson(report, /*with_fleet=*/true);
  EXPECT_EQ(json["from"], "2026-12-01T00:00:00Z");
  EXPECT_EQ(json["to"], "2026-12-01T04:00:00Z");
  EXPECT_EQ(json["by"], "team");
  EXPECT_DOUBLE_EQ(json["rows"][0]["allocatedGpuHours"].get<double>(), 4.5);
  EXPECT_DOUBLE_EQ(json["rows"][0]["busyGpuHours"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(json["rows"][0]["idleGpuHours"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(json["rows"][1]["allocatedGpuHours"].get<double>(), 2.714286);
  EXPECT_DOUBLE_EQ(json["unallocatedGpuHours"].get<double>(), 8.785714);
  EXPECT_EQ(json["rows"][1]["models"].size(), 2u);

  // A member of team a: its rows only, the fleet's unallocated time left out of the JSON.
  query.team = "a";
  const UsageReport member = ComputeUsage(runs, WholePeriodCapacity(4, query), query);
  ASSERT_EQ(member.rows.size(), 1u);
  EXPECT_EQ(member.rows[0].key, "a");
  EXPECT_TRUE(UsageReportToJson(member, /*with_fleet=*/false)["unallocatedGpuHours"].is_null());

  // By model and by user.
  query.team.reset();
  query.by = UsageGrouping::kModel;
  const UsageReport models = ComputeUsage(runs, WholePeriodCapacity(4, query), query);
  ASSERT_EQ(models.rows.size(), 2u);
  EXPECT_EQ(FindRow(models, "H100-80GB")->totals.allocated, 5 * kUnitHour + kUnitHour / 2);
  EXPECT_EQ(FindRow(models, "A100-80GB")->totals.allocated, 12 * kUnitHour / 7);
  query.by = UsageGrouping::kUser;
  const UsageReport users = ComputeUsage(runs, WholePeriodCapacity(4, query), query);
  EXPECT_EQ(FindRow(users, "bob")->totals.allocated, 12 * kUnitHour / 7 + kUnitHour);

  // A period inside a run: its part, and its busy time in proportion.
  query.by = UsageGrouping::kTeam;
  query.from_ns = kT0 + kHour;
  query.to_ns = kT0 + 3 * kHour / 2;
  const UsageReport half = ComputeUsage(runs, WholePeriodCapacity(4, query), query);
  EXPECT_EQ(FindRow(half, "a")->totals.allocated, kUnitHour + kUnitHour / 8);
  EXPECT_EQ(FindRow(half, "a")->totals.busy, kUnitHour / 2);
}

TEST(ComputeUsage, BusyIsCappedAtAllocatedAndOutsideRunsCountNothing) {
  std::vector<RunUsage> runs = {
      OpenRun(PlacedJob("a", "j", {Assignment("T4", 500)}, kT0), kT0 + kHour, 100 * kUnitHour)};
  UsageQuery query;
  query.from_ns = kT0;
  query.to_ns = kT0 + kHour;
  UsageReport report = ComputeUsage(runs, WholePeriodCapacity(1, query), query);
  ASSERT_EQ(report.rows.size(), 1u);
  EXPECT_EQ(report.rows[0].totals.busy, kUnitHour / 2);
  EXPECT_EQ(report.unallocated, kUnitHour / 2);
  query.from_ns = kT0 + 2 * kHour;
  query.to_ns = kT0 + 3 * kHour;
  report = ComputeUsage(runs, WholePeriodCapacity(1, query), query);
  EXPECT_TRUE(report.rows.empty());
  EXPECT_EQ(report.unallocated, kUnitHour);
}

TEST(NoteUsageChange, WritesTheKnownBusyTimeIntoAJobThatKeepsRunning) {
  const Json before = PlacedJob("a", "j", {Assignment("H100-80GB", 1000)}, kT0);
  Json after = before;
  after["placements"][0]["phase"] = "Running";
  EXPECT_EQ(NoteUsageChange(before, after, kT0 + kHour, 42), std::nullopt);
  EXPECT_EQ(after["usage_run"]["busy"], 42);
  // Never backwards.
  Json again = after;
  EXPECT_EQ(NoteUsageChange(after, again, kT0 + kHour, 7), std::nullopt);
  EXPECT_EQ(again["usage_run"]["busy"], 42);
  ASSERT_TRUE(StampedRunOf(again).has_value());
  EXPECT_EQ(StampedRunOf(again)->name, "a/j/1");
  EXPECT_EQ(StampedRunOf(again)->busy, 42);
  // A job never stamped (placed before the ledger existed) has no run.
  Json old = before;
  old.erase("usage_run");
  EXPECT_EQ(RunUsageOfJob(old, kT0 + kHour), std::nullopt);
  EXPECT_EQ(StampedRunOf(old), std::nullopt);
}

TEST(BusyCredit, CreditsUtilizationTimesShareTimesInterval) {
  const Json job =
      PlacedJob("a", "j", {Assignment("H100-80GB", 1000), Assignment("H100-80GB", 250)}, kT0);
  // GPU 0 at 50 %, GPU 1 at 100 %, 10 s since the node's last report.
  EXPECT_EQ(BusyCredit(job, "n1", {{0, 50}, {1, 100}}, 10'000),
            kShareUnitsPerGpu / 2 * 10'000 + kShareUnitsPerGpu / 4 * 10'000);
  EXPECT_EQ(BusyCredit(job, "n2", {{0, 50}}, 10'000), 0);
  EXPECT_EQ(BusyCredit(job, "n1", {{0, 500}}, 1000), kShareUnitsPerGpu * 1000);  // clamped
  EXPECT_EQ(BusyCredit(job, "n1", {{0, 50}}, -5), 0);

  UsageMeter meter;
  meter.Credit("a/j/1", 100, 50);
  EXPECT_EQ(meter.Busy("a/j/1", 100), 150);
  // A later write stored more (another server's count): the meter never goes below it.
  EXPECT_EQ(meter.Busy("a/j/1", 500), 500);
  meter.Credit("a/j/1", 500, 10);
  EXPECT_EQ(meter.Busy("a/j/1", 0), 510);
  meter.Forget("a/j/1");
  EXPECT_EQ(meter.Busy("a/j/1", 3), 3);
}

TEST(ParseUsageQuery, BadInputNamesTheFieldAndTheValue) {
  const Result<UsageQuery> parsed =
      ParseUsageQuery("2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z", "queue");
  ASSERT_OK(parsed);
  const UsageQuery& query = *parsed;
  EXPECT_EQ(query.from_ns, kT0);
  EXPECT_EQ(query.to_ns, kT0 + 24 * kHour);
  EXPECT_EQ(query.by, UsageGrouping::kQueue);
  EXPECT_EQ(ParseUsageQuery("2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z", std::nullopt)->by,
            UsageGrouping::kTeam);
  struct Case {
    std::optional<std::string_view> from, to, by;
    std::string message;
  };
  const std::vector<Case> cases = {
      {std::nullopt, "2026-12-02T00:00:00Z", std::nullopt, "from: missing"},
      {"yesterday", "2026-12-02T00:00:00Z", std::nullopt, "from: \"yesterday\""},
      {"2026-12-01T25:00:00Z", "2026-12-02T00:00:00Z", std::nullopt, "from: \"2026-12-01T25"},
      {"2026-12-01T00:00:00Zjunk", "2026-12-02T00:00:00Z", std::nullopt, "from: "},
      {"2026-12-01T00:00:00Z", std::nullopt, std::nullopt, "to: missing"},
      {"2026-12-01T00:00:00Z", "2026-12-01T00:00:00Z", std::nullopt,
       "to: \"2026-12-01T00:00:00Z\" is not after"},
      {"2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z", "project", "by: \"project\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(ParseUsageQuery(c.from, c.to, c.by),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(RunUsageFromJson, RefusesMalformedRecordsNamingTheField) {
  const Json good =
      RunUsageToJson(OpenRun(PlacedJob("a", "j", {Assignment("T4", 1000)}, kT0), kT0));
  Json bad = good;
  bad.erase("start_ns");
  EXPECT_THAT(RunUsageFromJson(bad), StatusIs(StatusCode::kInvalidArgument, HasSubstr("start_ns")));
  bad = good;
  bad["gpus"]["T4"] = "lots";
  EXPECT_THAT(RunUsageFromJson(bad), StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpus.T4")));
  bad = good;
  bad["end_ns"] = 0;
  EXPECT_THAT(RunUsageFromJson(bad), StatusIs(StatusCode::kInvalidArgument, HasSubstr("end_ns")));
  EXPECT_THAT(RunUsageFromJson(Json::array()), StatusIs(StatusCode::kInvalidArgument));
}

TEST(FleetCapacity, CountsEachNodeFromItsRegistrationUntilNow) {
  UsageQuery query;
  query.from_ns = kT0;
  query.to_ns = kT0 + 24 * kHour;
  const Json gpus2 = Json::array({Json::object(), Json::object()});
  const std::vector<Json> nodes = {
      Json{{"gpus", gpus2}, {"registered_ns", kT0 + 10 * kHour}},  // 2 GPUs, from 10:00
      Json{{"gpus", gpus2}, {"registered_ns", kT0 - kHour}},       // from before the period
      Json{{"gpus", gpus2}},                                       // stored without a stamp
      Json{{"gpus", gpus2}, {"registered_ns", kT0 + 13 * kHour}},  // after now
  };
  // Now is 12:00: 2 GPUs x 2 h + 2 x 12 h + 2 x 12 h; nothing of the 12 h still to come.
  EXPECT_EQ(FleetCapacity(nodes, query, kT0 + 12 * kHour), 52 * kUnitHour);
  // A fleet 90 s old has 90 s of capacity in a day's report, not 24 h.
  const std::vector<Json> young = {Json{{"gpus", gpus2}, {"registered_ns", kT0 + 12 * kHour}}};
  EXPECT_EQ(FleetCapacity(young, query, kT0 + 12 * kHour + 90 * kSecond),
            2 * 90 * kShareUnitsPerGpu * 1000);
  // A period wholly in the future has none.
  query.from_ns = kT0 + 20 * kHour;
  EXPECT_EQ(FleetCapacity(nodes, query, kT0 + 12 * kHour), 0);
}

}  // namespace
}  // namespace gpufleet::control
