// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/lifecycle_controller.h"

#include <chrono>
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/control/job_lifecycle.h"

namespace gpufleet::control {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ViewJob InView(const Json& doc, int64_t version) {
  ViewJob job;
  job.version = version;
  job.data = doc.dump();
  job.state = *StoredJobState(doc);
  job.placements.resize(doc["placements"].size());
  for (const Json& placement : doc["placements"]) {
    job.nodes.insert(placement["node"].get<std::string>());
  }
  return job;
}

// Jobs as the view holds them, every one in the index a controller is given (JobsIn); the
// controllers leave alone those of other states.
struct IndexedJobs {
  explicit IndexedJobs(std::map<std::string, ViewJob> held) : map(std::move(held)) {
    for (ViewJobEntry& entry : map) {
      entries.insert(&entry);
    }
  }
  IndexedJobs(const IndexedJobs&) = delete;
  IndexedJobs& operator=(const IndexedJobs&) = delete;

  std::map<std::string, ViewJob> map;
  JobEntries entries;
};

Json Gang(std::string_view state, const std::vector<std::string>& nodes) {
  Json job = {{"name", "train"},
              {"team", "nlp"},
              {"state", state},
              {"attempt", 1},
              {"placements", Json::array()}};
  for (size_t i = 0; i < nodes.size(); ++i) {
    job["placements"].push_back({{"task", "w-" + std::to_string(i)}, {"node", nodes[i]}});
  }
  return job;
}

constexpr int64_t kOneSecondNs = 1'000'000'000;

// What `controller` writes for one job "nlp/train" held as `doc` at `version`, at `seconds`.
std::vector<JobWrite> StepOne(const GangStartController& controller, const Json& doc,
                              int64_t version, int64_t seconds) {
  const IndexedJobs jobs({{"nlp/train", InView(doc, version)}});
  return controller.Step(jobs.entries, seconds * kOneSecondNs, "");
}

TEST(GangStartController, RequeuesAGangPartlyStartedForTheTimeoutAndNoSooner) {
  const GangStartController controller(std::chrono::seconds(300));
  Json doc = Gang("Scheduled", {"node-a", "node-b"});
  doc["placements"][0]["phase"] = "Running";
  StampTaskStarted(doc["placements"][0], 1000 * kOneSecondNs);
  const IndexedJobs jobs({{"nlp/train", InView(doc, 7)}});

  EXPECT_TRUE(controller.Step(jobs.entries, 1000 * kOneSecondNs, "t0").empty())
      << "just partly started";
  EXPECT_TRUE(controller.Step(jobs.entries, 1299 * kOneSecondNs, "t1").empty());

  // The window is in the document: another controller (a new leader) counts from where this
  // one was.
  const GangStartController next_leader(std::chrono::seconds(300));
  const std::vector<JobWrite> writes = next_leader.Step(jobs.entries, 1300 * kOneSecondNs, "t2");
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0].name, "nlp/train");
  EXPECT_EQ(writes[0].version, 7) << "the compare-and-set is at the version read";
  EXPECT_EQ(writes[0].before, doc);
  EXPECT_EQ(writes[0].after["state"], "Stopping") << "its started task must stop first";
  EXPECT_EQ(writes[0].after["stopping"]["then"], "Pending");
  ASSERT_EQ(writes[0].events.size(), 1u);
  EXPECT_THAT(writes[0].events[0], HasSubstr("did not start together within 300s"));
}

TEST(GangStartController, TheWindowCountsFromTheFirstStartOrTheLastPullWhicheverIsLater) {
  const GangStartController controller(std::chrono::seconds(10));
  Json doc = Gang("Scheduled", {"node-a", "node-b", "node-c"});
  doc["usage_run"] = {{"attempt", 1}, {"start_ns", 0}};
  doc["placements"][0]["phase"] = "Running";
  StampTaskStarted(doc["placements"][0], 30 * kOneSecondNs);
  doc["placements"][1]["phase"] = "Running";
  StampTaskStarted(doc["placements"][1], 20 * kOneSecondNs);
  StampTaskStarted(doc["placements"][1], 25 * kOneSecondNs);  // the first report's stamp stays
  EXPECT_EQ(GangWindowStart(doc), 20 * kOneSecondNs);
  EXPECT_TRUE(StepOne(controller, doc, 1, 29).empty());
  EXPECT_EQ(StepOne(controller, doc, 1, 30).size(), 1u);

  StampImagePulled(doc["placements"][2], 40 * kOneSecondNs);
  EXPECT_EQ(GangWindowStart(doc), 40 * kOneSecondNs) << "node-c's pull ended after the first start";
  EXPECT_TRUE(StepOne(controller, doc, 2, 49).empty());
  EXPECT_EQ(StepOne(controller, doc, 2, 50).size(), 1u);

  Json unstamped = Gang("Scheduled", {"node-a", "node-b"});
  unstamped["usage_run"] = {{"attempt", 1}, {"start_ns", 5 * kOneSecondNs}};
  unstamped["placements"][0]["phase"] = "Running";
  EXPECT_EQ(GangWindowStart(unstamped), 5 * kOneSecondNs) << "a start without its stamp: the run's";

  Json whole = doc;
  whole["placements"][2]["phase"] = "Running";
  EXPECT_TRUE(StepOne(controller, whole, 3, 100).empty()) << "every task has started";
}

// A node that must first pull a large image is not a gang that failed to start: the window
// counts from the end of the last pull.
TEST(GangStartController, ATaskPullingItsImageHoldsTheWindowOpen) {
  const GangStartController controller(std::chrono::seconds(10));
  Json doc = Gang("Scheduled", {"node-a", "node-b"});
  doc["placements"][0]["phase"] = "Running";
  StampTaskStarted(doc["placements"][0], 0);
  doc["placements"][1]["phase"] = "Pulling";
  for (int seconds = 0; seconds <= 600; seconds += 60) {
    EXPECT_TRUE(StepOne(controller, doc, 1, seconds).empty())
        << "still pulling after " << seconds << " s";
  }
  Json pulled = doc;
  pulled["placements"][1]["phase"] = "Waiting";
  StampImagePulled(pulled["placements"][1], 600 * kOneSecondNs);
  EXPECT_TRUE(StepOne(controller, pulled, 2, 609).empty()) << "9 s after the pull ended";
  EXPECT_EQ(StepOne(controller, pulled, 2, 610).size(), 1u);
}

TEST(EndGoneTasksOfStoppingRuns, EndsTasksOnLostOrRemovedNodesAndFinishesTheRun) {
  Json doc = Gang("Running", {"node-a", "node-b"});
  ASSERT_TRUE(EndRun(doc, JobState::kCancelled, "cancelled by alice", "t0").ok());
  Json running = Gang("Running", {"node-a"});
  const std::map<std::string, ViewJob> jobs = {{"nlp/train", InView(doc, 3)},
                                               {"nlp/other", InView(running, 1)}};
  std::map<std::string, ViewNode> nodes;
  nodes["node-a"].agent = true;

  EXPECT_TRUE(EndGoneTasksOfStoppingRuns(jobs, {{"node-a", {}}, {"node-b", {}}}, {}).empty())
      << "nothing is known to be gone";

  const std::vector<JobWrite> partly =
      EndGoneTasksOfStoppingRuns(jobs, nodes, {});  // node-b is no longer in the view
  ASSERT_EQ(partly.size(), 1u);
  EXPECT_THAT(partly[0].events, ElementsAre("task w-1: node node-b is gone"));
  EXPECT_EQ(partly[0].after["state"], "Stopping") << "w-0 may still run on node-a";

  const std::vector<JobWrite> done = EndGoneTasksOfStoppingRuns(
      jobs, nodes, {{"node-a", "node node-a lost: no heartbeat for 70s"}});
  ASSERT_EQ(done.size(), 1u) << "a running job is not the controller's";
  EXPECT_EQ(done[0].version, 3);
  ASSERT_EQ(done[0].events.size(), 3u);
  EXPECT_EQ(done[0].events[0], "task w-0: node node-a lost: no heartbeat for 70s");
  EXPECT_EQ(done[0].after["state"], "Cancelled");
}

TEST(EndRunsOnNotReadyNodes, EndsTheRunsWithATaskThereAsEachJobAsks) {
  Json requeue = Gang("Running", {"node-a", "node-b"});
  requeue["placements"][0]["phase"] = "Running";
  Json fail = Gang("Scheduled", {"node-b"});
  fail["spec"] = {{"spec", {{"onNodeFailure", "fail"}}}};
  const std::map<std::string, ViewJob> jobs = {
      {"nlp/elsewhere", InView(Gang("Running", {"node-c"}), 1)},
      {"nlp/fail", InView(fail, 2)},
      {"nlp/requeue", InView(requeue, 3)}};
  const std::vector<JobWrite> writes = EndRunsOnNotReadyNodes(jobs, {"node-b"}, "t0");
  ASSERT_EQ(writes.size(), 2u) << "the job on Ready node-c keeps running";
  EXPECT_EQ(writes[0].name, "nlp/fail");
  EXPECT_EQ(writes[0].after["state"], "Stopping") << "its agent may have started w-0 unreported";
  EXPECT_EQ(writes[0].after["stopping"]["then"], "Failed") << "onNodeFailure: fail";
  EXPECT_THAT(writes[0].events[0], HasSubstr("node node-b is NotReady (task w-0 ran there)"));
  EXPECT_EQ(writes[1].name, "nlp/requeue");
  EXPECT_EQ(writes[1].version, 3);
  EXPECT_EQ(writes[1].after["state"], "Stopping") << "w-0 may still run on node-a";
  EXPECT_EQ(writes[1].after["stopping"]["then"], "Pending");
  EXPECT_THAT(writes[1].events[0], HasSubstr("requeued: node node-b is NotReady (task w-1"));

  EXPECT_TRUE(EndRunsOnNotReadyNodes(jobs, {}, "t1").empty());
}

TEST(RequeuePreemptedJobs, NamesTheSameTeamsPreemptorOnly) {
  Json ours = Gang("Preempted", {});
  ours["preempted_by"] = "nlp/urgent";
  ours["preempted_by_team"] = "nlp";
  Json theirs = ours;
  theirs["name"] = "other";
  theirs["preempted_by"] = "vision/secret";
  theirs["preempted_by_team"] = "vision";
  const IndexedJobs jobs({{"nlp/other", InView(theirs, 2)},
                          {"nlp/train", InView(ours, 5)},
                          {"nlp/running", InView(Gang("Running", {}), 1)}});
  const std::vector<JobWrite> writes = RequeuePreemptedJobs(jobs.entries);
  ASSERT_EQ(writes.size(), 2u);
  EXPECT_EQ(writes[0].name, "nlp/other");
  EXPECT_EQ(writes[0].after["state"], "Pending");
  EXPECT_THAT(writes[0].events[0], HasSubstr("by a job of another team"));
  EXPECT_THAT(writes[0].events[0], ::testing::Not(HasSubstr("secret")));
  EXPECT_EQ(writes[1].name, "nlp/train");
  EXPECT_EQ(writes[1].version, 5);
  EXPECT_THAT(writes[1].events[0], HasSubstr("by job urgent"));
}

}  // namespace
// Issue 37 item 4: a notice only for a Running victim that asks for a grace, cut to the
// server's most.
TEST(PreemptionNotice, GivesTheJobsGraceCutToTheServersMostToARunningVictim) {
  Job spec;
  spec.checkpoint_grace_seconds = 120;
  spec.notice_signal = "SIGUSR2";
  const std::optional<wire::NoticeRecord> notice = PreemptionNotice(
      spec, JobState::kRunning, std::chrono::seconds(60), 1000 * kOneSecondNs, "preempted by x");
  ASSERT_TRUE(notice.has_value());
  EXPECT_EQ(notice->signal, "SIGUSR2");
  EXPECT_EQ(notice->since_ns, 1000 * kOneSecondNs);
  EXPECT_EQ(notice->deadline_ns, 1060 * kOneSecondNs);
  EXPECT_EQ(notice->reason, "preempted by x");
  EXPECT_THAT(NoticeEvent(*notice), HasSubstr("preemption notice (SIGUSR2)"));
  EXPECT_THAT(NoticeEvent(*notice), HasSubstr("at the latest in 60s; preempted by x"));

  EXPECT_FALSE(
      PreemptionNotice(spec, JobState::kScheduled, std::chrono::seconds(60), 0, "").has_value())
      << "no task of the run has started: nothing to save";
  EXPECT_FALSE(
      PreemptionNotice(spec, JobState::kRunning, std::chrono::seconds(0), 0, "").has_value())
      << "the server gives no notices";
  spec.checkpoint_grace_seconds = 0;
  EXPECT_FALSE(
      PreemptionNotice(spec, JobState::kRunning, std::chrono::seconds(60), 0, "").has_value())
      << "the job asks for none";
}

// The run under a notice ends as preempted, through Stopping, at its deadline, or sooner once a
// task reported a checkpoint from the notice's second on; an older checkpoint does not count.
TEST(EndNoticedRuns, EndsTheRunAtItsDeadlineOrOnceACheckpointAfterTheNoticeIsReported) {
  Json doc = Gang("Running", {"node-a"});
  doc["placements"][0]["phase"] = "Running";
  const wire::NoticeRecord notice{.signal = "SIGUSR1",
                                  .since_ns = 1000 * kOneSecondNs + 400'000'000,
                                  .deadline_ns = 1060 * kOneSecondNs,
                                  .reason = "preempted by job urgent"};
  doc["notice"] = wire::NoticeRecordToJson(notice);
  ViewJob held = InView(doc, 3);
  held.notice = notice;
  held.last_checkpoint_ns = 999 * kOneSecondNs;  // before the notice
  {
    const IndexedJobs jobs({{"nlp/train", held}});
    EXPECT_TRUE(EndNoticedRuns(jobs.entries, 1059 * kOneSecondNs, "t0").empty());
    const std::vector<JobWrite> writes = EndNoticedRuns(jobs.entries, 1060 * kOneSecondNs, "t1");
    ASSERT_EQ(writes.size(), 1u);
    EXPECT_EQ(writes[0].version, 3);
    EXPECT_EQ(writes[0].after["state"], "Stopping") << "its task must stop first, with its grace";
    EXPECT_EQ(writes[0].after["stopping"]["then"], "Preempted");
    EXPECT_FALSE(writes[0].after.contains("notice"));
    ASSERT_EQ(writes[0].events.size(), 1u);
    EXPECT_THAT(writes[0].events[0], HasSubstr("checkpoint grace ran out"));
  }
  held.last_checkpoint_ns = 1000 * kOneSecondNs;  // the notice's own second, reported in seconds
  {
    const IndexedJobs jobs({{"nlp/train", held}});
    const std::vector<JobWrite> writes = EndNoticedRuns(jobs.entries, 1005 * kOneSecondNs, "t2");
    ASSERT_EQ(writes.size(), 1u);
    EXPECT_THAT(writes[0].events[0], HasSubstr("a checkpoint was reported after its notice"));
    EXPECT_THAT(writes[0].events[0], HasSubstr("preempted by job urgent"));
  }
  held.notice.reset();
  const IndexedJobs without({{"nlp/train", held}});
  EXPECT_TRUE(EndNoticedRuns(without.entries, 2000 * kOneSecondNs, "t3").empty())
      << "no notice: nothing to end";
}

}  // namespace gpufleet::control
