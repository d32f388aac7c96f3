// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/idle_reclaim_controller.h"

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/snapshot.h"
#include "gpufleet/wire/job_spec.h"

namespace gpufleet::control {
namespace {

using ::testing::HasSubstr;

constexpr char kNotebook[] = "team-a/nb";
constexpr char kWaiting[] = "team-b/train";

// A node whose GPUs have the NVML indices `indices` (in snapshot order).
Node NodeWithGpus(const std::string& id, const std::vector<int>& indices) {
  Node node;
  node.id = NodeId(id);
  node.capacity = {96000, 1048576};
  for (const int index : indices) {
    Gpu gpu;
    gpu.uuid = GpuUuid(fmt::format("GPU-{}-{}", id, index));
    gpu.index = index;
    gpu.model = "H100-80GB";
    node.gpus.push_back(gpu);
  }
  return node;
}

// The stored spec of a one-task job of `kind` ("batch", "interactive").
Json SpecJson(const std::string& kind, const GpuCatalog& catalog) {
  const Result<Job> job = wire::ParseJobSpec(fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: nb}}
spec:
  kind: {}
  tasks:
    - name: main
      command: [sleep, infinity]
      resources: {{cpu: "1", memory: 1Gi, gpus: {{count: 1}}}}
)",
                                                         kind),
                                             catalog);
  EXPECT_TRUE(job.ok()) << job.status().ToString();
  return job.ok() ? wire::JobSpecToJson(*job) : Json();
}

MonoTime AtMinute(int minute) {
  return MonoTime{} + std::chrono::minutes(minute);
}

// A reclaim under 10% for 30 min, after a 15 min warning, samples at most 5 min apart: the
// server test's settings (server_reclaim_test.cc).
policy::IdleReclaimOptions Options(policy::ReclaimAction action) {
  policy::IdleReclaimOptions options;
  options.threshold_milli = 100;
  options.idle_seconds = 30 * 60;
  options.warning_seconds = 15 * 60;
  options.max_sample_gap_seconds = 5 * 60;
  options.action = action;
  return options;
}

// The view a controller sees: a notebook running on GPU index 5 of node-a (its second GPU),
// whatever else the test adds, and heartbeats every minute carrying each GPU's utilization. The
// test plays the server: it commits a write into the view (Commit) or drops it.
class IdleReclaimControllerTest : public ::testing::Test {
 protected:
  IdleReclaimControllerTest() {
    Cluster cluster;
    cluster.nodes.push_back(NodeWithGpus("node-a", {4, 5}));
    cluster.nodes.push_back(NodeWithGpus("node-b", {0}));
    Result<scheduler::ClusterSnapshot> snapshot =
        scheduler::ClusterSnapshot::Build(std::move(cluster), catalog_);
    EXPECT_TRUE(snapshot.ok()) << snapshot.status().ToString();
    snapshot_.emplace(std::move(*snapshot));
  }

  void Make(policy::ReclaimAction action = policy::ReclaimAction::kSuspend) {
    Result<IdleReclaimController> made = IdleReclaimController::Create(Options(action), catalog_);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    controller_.emplace(std::move(*made));
  }

  // `name` Running (attempt `attempt`) on node-a's GPU at snapshot position 1 (index 5).
  void Run(const std::string& name, const std::string& kind, int attempt = 1) {
    const Json doc = {{"name", name.substr(name.find('/') + 1)},
                      {"team", name.substr(0, name.find('/'))},
                      {"state", "Running"},
                      {"attempt", attempt},
                      {"spec", SpecJson(kind, catalog_)},
                      {"placements", Json::array({{{"task", "main-0"},
                                                   {"node", "node-a"},
                                                   {"gpus", Json::array({5})},
                                                   {"phase", "Running"}}})}};
    ViewJob job;
    job.version = jobs_.count(name) > 0 ? jobs_[name].version + 1 : 1;
    job.data = doc.dump();
    job.state = JobState::kRunning;
    job.nodes = {"node-a"};
    job.placements = {{.node = 0, .gpus = {{.gpu = 1, .milli = 1000}}}};
    job.applied = true;
    jobs_[name] = std::move(job);
  }

  void Wait(const std::string& name) {
    const Json doc = {{"name", name.substr(name.find('/') + 1)},
                      {"team", name.substr(0, name.find('/'))},
                      {"state", "Pending"},
                      {"spec", SpecJson("batch", catalog_)}};
    ViewJob job;
    job.version = 1;
    job.data = doc.dump();
    job.state = JobState::kPending;
    jobs_[name] = std::move(job);
  }

  // What the server does with a write that the store accepts: the view reads the job again.
  void Commit(const JobWrite& write) {
    ViewJob& job = jobs_.at(write.name);
    job.version = write.version + 1;
    job.data = write.after.dump();
    job.state = *StoredJobState(write.after);
  }

  // One step at `minute`: every GPU of node-a (index 4 and 5) reported at `percent`, heartbeats
  // of this minute.
  Result<IdleReclaimStep> StepAt(int minute, int percent, int pending_jobs,
                                 const std::string& first_pending = "") {
    IdleReclaimInputs inputs{.pending_jobs = pending_jobs,
                             .first_pending = first_pending,
                             .now = AtMinute(minute),
                             .now_seconds = minute * 60,
                             .now_text = "1970-01-01T00:00:00Z"};
    inputs.reports.heartbeat_at = {{"node-a", AtMinute(minute)}, {"node-b", AtMinute(minute)}};
    inputs.reports.percent = {{{"node-a", 4}, 90}, {{"node-a", 5}, percent}, {{"node-b", 0}, 90}};
    return controller_->Step(jobs_, *snapshot_, inputs);
  }

  // Steps through minutes [from, to) at `percent`, committing every write; returns them all.
  std::vector<JobWrite> Steps(int from, int to, int percent, int pending_jobs,
                              const std::string& first_pending = "") {
    std::vector<JobWrite> all;
    for (int minute = from; minute < to; ++minute) {
      Result<IdleReclaimStep> step = StepAt(minute, percent, pending_jobs, first_pending);
      EXPECT_TRUE(step.ok()) << step.status().ToString();
      if (!step.ok()) {
        break;
      }
      for (JobWrite& write : step->writes) {
        Commit(write);
        all.push_back(std::move(write));
      }
    }
    return all;
  }

  const GpuCatalog catalog_ = GpuCatalog::Default();
  std::optional<scheduler::ClusterSnapshot> snapshot_;
  std::optional<IdleReclaimController> controller_;
  std::map<std::string, ViewJob> jobs_;
};

TEST_F(IdleReclaimControllerTest, IdleNotebookIsWarnedThenSuspendedWhileAJobWaits) {
  Make();
  Run(kNotebook, "interactive");
  Wait(kWaiting);
  EXPECT_TRUE(Steps(0, 30, 3, 1).empty()) << "idle for less than 30 minutes";

  Result<IdleReclaimStep> warned = StepAt(30, 3, 1);
  ASSERT_OK(warned);
  ASSERT_EQ(warned->writes.size(), 1U);
  const JobWrite& warning = warned->writes[0];
  EXPECT_EQ(warning.name, kNotebook);
  EXPECT_EQ(warning.version, 1) << "the compare-and-set is at the version read";
  EXPECT_EQ(warning.before, Json::parse(jobs_.at(kNotebook).data));
  EXPECT_EQ(warning.after["state"], "Running");
  EXPECT_EQ(warning.after["warning"],
            "GPUs under 10% for 30m while 1 job waits; will be suspended at 00:45 unless used");
  EXPECT_THAT(warning.events,
              ::testing::ElementsAre(HasSubstr("idle warning: GPUs under 10% for 30m")));
  EXPECT_FALSE(warned->reclaimed);
  Commit(warning);

  EXPECT_TRUE(Steps(31, 45, 3, 1).empty()) << "warned once, reclaimed at 00:45";
  Result<IdleReclaimStep> reclaimed = StepAt(45, 3, 1);
  ASSERT_OK(reclaimed);
  ASSERT_EQ(reclaimed->writes.size(), 1U);
  const JobWrite& reclaim = reclaimed->writes[0];
  EXPECT_TRUE(reclaimed->reclaimed);
  EXPECT_EQ(reclaim.version, 2);
  EXPECT_EQ(reclaim.after["state"], "Stopping") << "its task must stop first";
  EXPECT_EQ(reclaim.after["stopping"]["then"], "Suspended");
  EXPECT_EQ(reclaim.after["stopping"]["since"], "1970-01-01T00:00:00Z");
  EXPECT_EQ(reclaim.after["reason"],
            "reclaimed: GPUs under 10% for 45m while 1 job waited; suspended until its owner "
            "resumes it");
  EXPECT_FALSE(reclaim.after.contains("warning"));
  EXPECT_FALSE(reclaim.after.contains("preempted_by"));
  ASSERT_EQ(reclaim.events.size(), 1U);
  EXPECT_THAT(reclaim.events[0], HasSubstr("reclaimed: GPUs under 10% for 45m"));
}

TEST_F(IdleReclaimControllerTest, PreemptActionNamesTheFirstWaitingJobAsThePreemptor) {
  Make(policy::ReclaimAction::kPreempt);
  EXPECT_TRUE(controller_->preempts());
  Run(kNotebook, "interactive");
  Wait(kWaiting);
  const std::vector<JobWrite> writes = Steps(0, 46, 0, 1, kWaiting);
  ASSERT_EQ(writes.size(), 2U);
  EXPECT_THAT(writes[0].after["warning"].get<std::string>(),
              HasSubstr("will be preempted at 00:45"));
  const Json& reclaimed = writes[1].after;
  EXPECT_EQ(reclaimed["stopping"]["then"], "Preempted");
  EXPECT_EQ(reclaimed["reason"], "reclaimed: GPUs under 10% for 45m while 1 job waited; preempted");
  EXPECT_EQ(reclaimed["preempted_by"], kWaiting);
  EXPECT_EQ(reclaimed["preempted_by_team"], "team-b");
}

TEST_F(IdleReclaimControllerTest, SuspendActionNeedsNoPreemptor) {
  Make(policy::ReclaimAction::kSuspend);
  EXPECT_FALSE(controller_->preempts());
}

TEST_F(IdleReclaimControllerTest, IdleNotebookIsLeftAloneWhileNothingWaits) {
  Make();
  Run(kNotebook, "interactive");
  EXPECT_TRUE(Steps(0, 120, 0, 0).empty());
  EXPECT_EQ(jobs_.at(kNotebook).state, JobState::kRunning);
}

TEST_F(IdleReclaimControllerTest, IdleBatchJobIsNeverWarned) {
  Make();
  Run("team-a/batch-1", "batch");
  Wait(kWaiting);
  EXPECT_TRUE(Steps(0, 120, 0, 1).empty());
}

TEST_F(IdleReclaimControllerTest, NotebookWithoutAReportedUtilizationIsNeverIdle) {
  Make();
  Run(kNotebook, "interactive");
  Wait(kWaiting);
  for (int minute = 0; minute < 120; ++minute) {
    IdleReclaimInputs inputs{
        .pending_jobs = 1, .now = AtMinute(minute), .now_seconds = minute * 60};
    inputs.reports.heartbeat_at = {{"node-a", AtMinute(minute)}};
    // Only node-a's other GPU reported: the notebook's GPU has no figure.
    inputs.reports.percent = {{{"node-a", 4}, 0}};
    Result<IdleReclaimStep> step = controller_->Step(jobs_, *snapshot_, inputs);
    ASSERT_OK(step);
    EXPECT_TRUE(step->writes.empty()) << "minute " << minute;
  }
}

TEST_F(IdleReclaimControllerTest, BusyAgainDuringTheWarningWithdrawsIt) {
  Make();
  Run(kNotebook, "interactive");
  Wait(kWaiting);
  ASSERT_EQ(Steps(0, 31, 0, 1).size(), 1U);
  ASSERT_TRUE(Json::parse(jobs_.at(kNotebook).data).contains("warning"));

  const std::vector<JobWrite> withdrawn = Steps(31, 32, 50, 1);
  ASSERT_EQ(withdrawn.size(), 1U);
  EXPECT_FALSE(withdrawn[0].after.contains("warning"));
  EXPECT_EQ(withdrawn[0].after["state"], "Running");
  EXPECT_THAT(withdrawn[0].events,
              ::testing::ElementsAre("GPUs busy again (50% at 00:31); warning withdrawn"));
  EXPECT_TRUE(Steps(32, 90, 50, 1).empty()) << "busy past the old deadline: never reclaimed";
}

TEST_F(IdleReclaimControllerTest, AWriteTheStoreRefusedIsMadeAgainByTheNextStep) {
  Make();
  Run(kNotebook, "interactive");
  Wait(kWaiting);
  ASSERT_TRUE(Steps(0, 30, 0, 1).empty());
  Result<IdleReclaimStep> lost = StepAt(30, 0, 1);  // not committed: a version conflict
  ASSERT_OK(lost);
  ASSERT_EQ(lost->writes.size(), 1U);

  Result<IdleReclaimStep> again = StepAt(31, 0, 1);
  ASSERT_OK(again);
  ASSERT_EQ(again->writes.size(), 1U) << "the document follows the reclaimer's state";
  EXPECT_EQ(again->writes[0].after["warning"], lost->writes[0].after["warning"]);
  Commit(again->writes[0]);
  EXPECT_TRUE(Steps(32, 45, 0, 1).empty()) << "the stored warning is not written again";
}

TEST_F(IdleReclaimControllerTest, ARunThatLeftRunningStartsAfreshWhenItRunsAgain) {
  Make();
  Run(kNotebook, "interactive");
  Wait(kWaiting);
  ASSERT_EQ(Steps(0, 31, 0, 1).size(), 1U) << "warned at 00:30";

  // Requeued (say its node failed; its document still says it was warned): no longer watched,
  // so neither withdrawn nor reclaimed while it waits.
  jobs_.at(kNotebook).state = JobState::kPending;
  jobs_.at(kNotebook).applied = false;
  ++jobs_.at(kNotebook).version;
  EXPECT_TRUE(Steps(31, 51, 0, 1).empty());

  // Its next run: the idle time counts from its own first sample (00:51), not from 00:00.
  Run(kNotebook, "interactive", 2);
  EXPECT_TRUE(Steps(51, 81, 0, 1).empty());
  const std::vector<JobWrite> warned = Steps(81, 82, 0, 1);
  ASSERT_EQ(warned.size(), 1U);
  EXPECT_EQ(warned[0].after["warning"],
            "GPUs under 10% for 30m while 1 job waits; will be suspended at 01:36 unless used");
}

TEST_F(IdleReclaimControllerTest, ANewAttemptIsWatchedAfreshEvenIfNoStepSawTheOneEnd) {
  Make();
  Run(kNotebook, "interactive");
  Wait(kWaiting);
  ASSERT_EQ(Steps(0, 31, 0, 1).size(), 1U) << "warned at 00:30";

  // Between two steps the run ended, was requeued and placed, and its next attempt runs: the
  // idle time counts from the new run's first sample (00:31), and its warning is not the old one.
  Run(kNotebook, "interactive", 2);
  const std::vector<JobWrite> writes = Steps(31, 62, 0, 1);
  ASSERT_EQ(writes.size(), 1U);
  EXPECT_EQ(writes[0].after["warning"],
            "GPUs under 10% for 30m while 1 job waits; will be suspended at 01:16 unless used");
  EXPECT_EQ(writes[0].version, jobs_.at(kNotebook).version - 1);
}

TEST_F(IdleReclaimControllerTest, TimeGoingBackwardsIsAnError) {
  Make();
  Run(kNotebook, "interactive");
  ASSERT_OK(StepAt(10, 0, 1));
  EXPECT_EQ(StepAt(9, 0, 1).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(IdleReclaimControllerTest, TheTimeLineStartsWhereTheFirstStepSaysItIs) {
  Make();
  Run(kNotebook, "interactive");
  Wait(kWaiting);
  // The first step says 00:00 on the server's clock is 10:00 on the reclaimer's time line.
  for (int minute = 0; minute <= 30; ++minute) {
    IdleReclaimInputs inputs{
        .pending_jobs = 1, .now = AtMinute(minute), .now_seconds = 10 * 3600 + minute * 60};
    if (minute > 0) {
      inputs.now_seconds = 0;  // read only once: the time line stays monotonic
    }
    inputs.reports.heartbeat_at = {{"node-a", AtMinute(minute)}};
    inputs.reports.percent = {{{"node-a", 5}, 0}};
    Result<IdleReclaimStep> step = controller_->Step(jobs_, *snapshot_, inputs);
    ASSERT_OK(step);
    if (minute < 30) {
      EXPECT_TRUE(step->writes.empty());
    } else {
      ASSERT_EQ(step->writes.size(), 1U);
      EXPECT_THAT(step->writes[0].after["warning"].get<std::string>(),
                  HasSubstr("will be suspended at 10:45 unless used"));
    }
  }
}

TEST_F(IdleReclaimControllerTest, MeasureAveragesTheJobsGpusAsOfItsOldestHeartbeat) {
  ViewJob job;
  // Two tasks: node-a's GPUs at snapshot positions 0 and 1 (indices 4, 5), node-b's only GPU.
  job.placements = {{.node = 0, .gpus = {{.gpu = 0}, {.gpu = 1}}},
                    {.node = 1, .gpus = {{.gpu = 0}}}};
  const std::map<std::string, MonoTime> beats = {{"node-a", AtMinute(7)}, {"node-b", AtMinute(5)}};
  const std::map<std::pair<std::string, int>, int> percent = {
      {{"node-a", 4}, 10}, {{"node-a", 5}, 20}, {{"node-b", 0}, 61}};
  const std::optional<JobUtilization> measured =
      MeasureJobUtilization(job, *snapshot_, beats, percent);
  ASSERT_TRUE(measured.has_value());
  EXPECT_EQ(measured->milli, 303) << "(10 + 20 + 61) / 3 percent, in milli";
  EXPECT_EQ(measured->as_of, AtMinute(5));

  EXPECT_FALSE(MeasureJobUtilization(job, *snapshot_, {{"node-a", AtMinute(7)}}, percent))
      << "node-b has not reported";
  EXPECT_FALSE(
      MeasureJobUtilization(job, *snapshot_, beats, {{{"node-a", 4}, 10}, {{"node-b", 0}, 61}}))
      << "GPU index 5 has not reported";
  // Reports are by NVML index, not by position in the snapshot.
  EXPECT_FALSE(MeasureJobUtilization(
      job, *snapshot_, beats, {{{"node-a", 0}, 10}, {{"node-a", 1}, 20}, {{"node-b", 0}, 61}}));
  EXPECT_FALSE(MeasureJobUtilization(ViewJob{}, *snapshot_, beats, percent)) << "holds no GPU";
}

}  // namespace
}  // namespace gpufleet::control
